"""Which unseen points of a Boolean task a symmetric mask prior can carry over: the
sum-class hypothesis, a hypothesis and not a theorem (measured by the `boolean_coverage`
experiment: an upper bound of what a support mask buys, not a prediction).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mpx.tasks.boolean import BooleanTask, cube_data
from mpx.tasks.boolean.fourier import mdi_values

COVERAGE_KINDS = ("sum", "window")


@dataclasses.dataclass(frozen=True)
class Coverage:
  """What `class_coverage` predicts for one task and one set of support groups.

  Attributes:
    covered_U: per unseen point (cube order), whether its class occurs among seen points.
    predicted_U: the predicted output on each unseen point: the class model fitted on the
      seen data where covered, the MDI elsewhere.
    covered_fraction: share of the unseen points that are covered.
    predicted_accuracy_unseen: sign accuracy of `predicted_U` on the unseen part.
    mdi_accuracy_unseen: the MDI's own unseen sign accuracy, for comparison.
  """
  covered_U: np.ndarray
  predicted_U: np.ndarray
  covered_fraction: float
  predicted_accuracy_unseen: float
  mdi_accuracy_unseen: float


def _check_groups(groups, n_bits: int) -> tuple[tuple[int, ...], ...]:
  groups = tuple(tuple(int(b) for b in g) for g in groups)
  if not groups or any(not g for g in groups):
    raise ValueError(f"groups must be non-empty tuples of bit indices; got {groups!r}.")
  if any(not 0 <= b < n_bits for g in groups for b in g):
    raise ValueError(f"group bits must lie in 0..{n_bits - 1}; got {groups!r}.")
  return groups


def _sum_class_fit(x_PN, y_P, seen_P, groups):
  """Class = the tuple of group sums; the prediction of a class is its mean seen target."""
  classes_P = np.stack([x_PN[:, list(g)].sum(1) for g in groups], axis=1)
  _, class_id_P = np.unique(classes_P, axis=0, return_inverse=True)
  class_id_P = class_id_P.ravel()
  n = class_id_P.max() + 1
  count_C = np.bincount(class_id_P[seen_P], minlength=n)
  total_C = np.bincount(class_id_P[seen_P], weights=y_P[seen_P], minlength=n)
  covered_P = count_C[class_id_P] > 0
  return covered_P, np.where(covered_P, total_C[class_id_P] / np.maximum(
      count_C[class_id_P], 1), 0.0)


def _window_fit(x_PN, y_P, seen_P, groups):
  """Every group is a window of one length; a window's pattern (its ±1 values, wherever it
  sits) gets one value, the output is the sum over windows, fitted to the seen data by
  least squares. Covered = every window pattern of the point occurs in the seen data."""
  if len({len(g) for g in groups}) != 1:
    raise ValueError("kind='window' needs windows of one length; got lengths "
                     f"{sorted({len(g) for g in groups})}.")
  k = len(groups[0])
  code_PG = np.stack([((x_PN[:, list(g)] > 0) * (1 << np.arange(k))).sum(1) for g in groups],
                     axis=1)
  counts_PK = np.stack([(code_PG == c).sum(1) for c in range(1 << k)], axis=1).astype(float)
  seen_patterns = counts_PK[seen_P].sum(0) > 0
  coef_K, *_ = np.linalg.lstsq(counts_PK[seen_P][:, seen_patterns], y_P[seen_P], rcond=None)
  covered_P = ~(counts_PK[:, ~seen_patterns] > 0).any(1)
  return covered_P, counts_PK[:, seen_patterns] @ coef_K


def class_coverage(task: BooleanTask, groups, kind: str = "sum") -> Coverage:
  """Which unseen points fall into a class that the seen data also holds, and the unseen
  accuracy that predicts if the model answers covered points as the seen data does.

  The hypothesis (from the prototypes measured before mpx, to be tested): a mask that makes each group's
  tokens interact symmetrically lets the model compute a function of the group's *sum*
  (`kind="sum"`; several groups: of the tuple of sums), or, for windowed supports such as
  Cyclic3's, a sum over windows of a function of each window's pattern (`kind="window"`).
  Such a model extrapolates exactly to the unseen points whose class (every window
  pattern) occurs among the seen points; on the others it has nothing to carry over, and
  the prediction is the min-degree interpolator's.
  """
  if kind not in COVERAGE_KINDS:
    raise ValueError(f"kind={kind!r}; choose one of {COVERAGE_KINDS}.")
  groups = _check_groups(groups, task.n_bits)
  x_PN, y_P, seen_P = cube_data(task)
  y_P = y_P.astype(np.float64)
  fit = _sum_class_fit if kind == "sum" else _window_fit
  covered_P, class_pred_P = fit(x_PN, y_P, seen_P, groups)
  mdi_P = mdi_values(task).astype(np.float64)
  unseen_P = ~seen_P
  predicted_P = np.where(covered_P, class_pred_P, mdi_P)
  correct = lambda pred_P: float(np.mean(np.sign(pred_P[unseen_P]) == np.sign(y_P[unseen_P])))
  return Coverage(covered_U=covered_P[unseen_P], predicted_U=predicted_P[unseen_P],
                  covered_fraction=float(covered_P[unseen_P].mean()),
                  predicted_accuracy_unseen=correct(predicted_P),
                  mdi_accuracy_unseen=correct(mdi_P))
