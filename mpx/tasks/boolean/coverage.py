"""Which unseen points of a Boolean task a symmetric mask prior can carry over: the
sum-class hypothesis, a hypothesis and not a theorem (measured by the `boolean_coverage`
experiment: an upper bound of what a support mask buys, not a prediction).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from typing import Callable

import numpy as np

from mpx import report as report_lib
from mpx.tasks import boolean
from mpx.tasks.boolean import BooleanTask, cube_data, make_task
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


# ----------------------------------------------------------------------------- the tasks
# The coverage study's tasks (experiments/boolean_coverage.py), known to the registry by
# name like the paper's (`boolean.get_task("cov_parity3")`).

N_BITS = 15


@dataclasses.dataclass(frozen=True)
class CoverageTask:
  """A task of this experiment: its definition and the classes the hypothesis uses.

  groups / kind: the arguments of `class_coverage`; None groups = (support,), the
    clique the mask scheme trains with (boolean_gotu's prior of a registered task).
  """
  name: str
  target: Callable[[np.ndarray], np.ndarray]
  seen: Callable[[np.ndarray], np.ndarray]
  support: tuple[int, ...]
  target_text: str
  seen_text: str
  groups: tuple[tuple[int, ...], ...] | None = None
  kind: str = "sum"
  integer_valued: bool = False

  @property
  def class_groups(self) -> tuple[tuple[int, ...], ...]:
    return self.groups if self.groups is not None else (self.support,)


def _sum(x, bits):
  return x[:, list(bits)].sum(1)


def _pm1(condition):
  return np.where(condition, 1.0, -1.0).astype(np.float32)


def _x0_or_x1(x):
  return (x[:, 0] > 0) | (x[:, 1] > 0)


WINDOWS = ((0, 1, 2), (1, 2, 3), (2, 3, 4))  # cov_window3: non-cyclic windows of x0..x4.


def _window3_target(x):
  return sum(x[:, a] * x[:, b] * x[:, c] for a, b, c in WINDOWS).astype(np.float32)


def _window3_seen(x):
  all_plus = np.any([np.all(x[:, list(w)] > 0, axis=1) for w in WINDOWS], axis=0)
  return _x0_or_x1(x) & ~all_plus


SPECS = (
    CoverageTask("cov_parity2", lambda x: x[:, 0] * x[:, 1], _x0_or_x1, (0, 1),
                 "x0·x1", "x0 = 1 or x1 = 1"),
    CoverageTask("cov_andnot", lambda x: _pm1((x[:, 0] > 0) & (x[:, 1] < 0)),
                 lambda x: ~((x[:, 0] < 0) & (x[:, 1] > 0)), (0, 1),
                 "x0 AND NOT x1 (±1)", "not (x0 = −1 and x1 = +1)"),
    CoverageTask("cov_parity3", lambda x: x[:, 0] * x[:, 1] * x[:, 2], _x0_or_x1, (0, 1, 2),
                 "x0·x1·x2", "x0 = 1 or x1 = 1"),
    CoverageTask("cov_window3", _window3_target, _window3_seen, (0, 1, 2, 3, 4),
                 "x0x1x2 + x1x2x3 + x2x3x4",
                 "x0 = 1 or x1 = 1, and no window is (+1, +1, +1)",
                 groups=WINDOWS, kind="window", integer_valued=True),
    CoverageTask("cov_majority5", lambda x: np.sign(_sum(x, range(5))),
                 lambda x: (x[:, 3] > 0) & (x[:, 4] > 0), (0, 1, 2, 3, 4),
                 "sign(x0 + … + x4)", "x3 = x4 = 1"),
    CoverageTask("cov_threshold4", lambda x: _pm1(_sum(x, range(4)) > 1.5), _x0_or_x1,
                 (0, 1, 2, 3), "sign(x0 + x1 + x2 + x3 − 1.5)", "x0 = 1 or x1 = 1"),
    CoverageTask("cov_majority3", lambda x: np.sign(_sum(x, range(3))), _x0_or_x1, (0, 1, 2),
                 "sign(x0 + x1 + x2)", "x0 = 1 or x1 = 1"),
    CoverageTask("cov_majority3_hole", lambda x: np.sign(_sum(x, range(3))),
                 lambda x: ~((x[:, 0] < 0) & (x[:, 1] < 0) & (x[:, 2] > 0)), (0, 1, 2),
                 "sign(x0 + x1 + x2)", "not (x0 = x1 = −1 and x2 = +1)"),
)
TASKS = {spec.name: spec for spec in SPECS}
TASK_NAMES = tuple(TASKS)


@functools.lru_cache(maxsize=None)
def boolean_task(name: str) -> BooleanTask:
  """The coverage task `name` as a BooleanTask (one shared instance per name); a windowed
  task carries its windows as `interaction_groups`, so its mask joins each window."""
  spec = TASKS[name]
  return make_task(spec.name, lambda x, f=spec.target: np.asarray(f(x), np.float32),
                   spec.seen, N_BITS, support=spec.support,
                   integer_valued=spec.integer_valued,
                   interaction_groups=spec.class_groups if spec.kind == "window" else ())


# The study (experiments/boolean_coverage.py): the prediction before training, joined with
# each scheme's measured unseen accuracy.

MEASURED = "accuracy_unseen"  # gotu's sign accuracy on the unseen part.
PREDICTED = "accuracy_unseen_predicted"  # Added to every member by the record's hook.
COVERAGE_FILE = "coverage.md"
PREDICTED_FILE = "coverage_predicted.md"
PLOT_FILE = "coverage.png"


# ----------------------------------------------------------------------------- predictions


@functools.cache
def prediction(name: str) -> dict:
  """What `class_coverage` predicts for task `name` before training: covered
  fraction, predicted and MDI unseen accuracy (fractions) with the task's classes, and
  `clique_predicted_accuracy_unseen`, the sum-over-support prediction (the prior the mask
  scheme trains with; the same as the prediction unless the task is judged on windows)."""
  if name not in TASKS:
    raise ValueError(f"no coverage prediction for task {name!r}; this experiment's tasks "
                     f"are {TASK_NAMES}.")
  spec, task = TASKS[name], boolean.get_task(name)
  cov = class_coverage(task, spec.class_groups, spec.kind)
  clique = (cov if (spec.class_groups, spec.kind) == ((spec.support,), "sum")
            else class_coverage(task, [spec.support], "sum"))
  return {"task": name, "target": spec.target_text, "seen": spec.seen_text,
          "kind": spec.kind, "groups": [list(g) for g in spec.class_groups],
          "seen_fraction": float(np.mean(task.seen(boolean.cube(N_BITS)))),
          "covered_fraction": cov.covered_fraction,
          "predicted_accuracy_unseen": cov.predicted_accuracy_unseen,
          "mdi_accuracy_unseen": cov.mdi_accuracy_unseen,
          "clique_predicted_accuracy_unseen": clique.predicted_accuracy_unseen}


def predictions(names=TASK_NAMES) -> list[dict]:
  """`prediction` of each task of `names`, in order."""
  return [prediction(n) for n in names]


# ----------------------------------------------------------------------------- the join


def predicted_vs_measured(summary: dict) -> list[dict]:
  """One row per (task, scheme, hparams) of a run's summary.json whose task has a
  prediction: the prediction's fields and the measured `accuracy_unseen` over the
  non-diverged seeds (`measured_mean`, `_std` (ddof = 0), `_min`, `_max`, `n`), fractions.
  Tasks of other experiments are left out."""
  members = [m for m in summary["members"] if m["task"] in TASKS]
  rows = []
  for r in report_lib.summarize(members, [MEASURED]):
    s = r[MEASURED]
    rows.append(prediction(r["task"]) | {
        "scheme": r["scheme"], "hparams": r["hparams"], "n_seeds": r["n_seeds"],
        "n_diverged": r["n_diverged"], "n": s["n"], "measured_mean": s["mean"],
        "measured_std": s["std"], "measured_min": s["min"], "measured_max": s["max"]})
  return rows


def _pct(x) -> str:
  return report_lib.MISSING if x is None else f"{100 * x:.2f}"


def _classes(row) -> str:
  if row["kind"] == "window":
    return "windows " + ", ".join("".join(map(str, g)) for g in row["groups"])
  return "sum of " + " | ".join("x" + ",".join(map(str, g)) for g in row["groups"])


def prediction_table(rows) -> str:
  """Markdown: per task its target, seen set, classes and the predictions (%)."""
  lines = ["| task | target | seen | classes | seen (%) | covered (%) | predicted (%) | "
           "MDI (%) | clique sum (%) |", "|" + "---|" * 9]
  for r in rows:
    lines.append(f"| {r['task']} | {r['target']} | {r['seen']} | {_classes(r)} | "
                 f"{_pct(r['seen_fraction'])} | {_pct(r['covered_fraction'])} | "
                 f"{_pct(r['predicted_accuracy_unseen'])} | {_pct(r['mdi_accuracy_unseen'])} | "
                 f"{_pct(r['clique_predicted_accuracy_unseen'])} |")
  return "\n".join(lines) + "\n"


def coverage_table(rows) -> str:
  """Markdown of `predicted_vs_measured` rows: prediction, MDI and measured unseen
  accuracy (%) per task and scheme, and measured − predicted."""
  # Hparams that split a task's scheme (a swept value), not those a scheme fixes (the
  # mask's learning-rate factor is 0 for the default by construction).
  values: dict = {}
  for r in rows:
    for k in r["hparams"]:
      values.setdefault((r["task"], r["scheme"], k), set()).add(json.dumps(r["hparams"][k]))
  varying = sorted({k for (_, _, k), v in values.items() if len(v) > 1})
  header = ["task", "scheme", *varying, "seeds", "covered (%)", "predicted (%)", "MDI (%)",
            "measured unseen (%)", "measured − predicted"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for r in rows:
    seeds = f"{r['n']}/{r['n_seeds']}" + (f" ({r['n_diverged']} diverged)"
                                          if r["n_diverged"] else "")
    if r["measured_mean"] is None:
      measured = gap = report_lib.MISSING
    else:
      measured = f"{_pct(r['measured_mean'])} ± {_pct(r['measured_std'])}"
      gap = f"{100 * (r['measured_mean'] - r['predicted_accuracy_unseen']):+.2f}"
    cells = [r["task"], r["scheme"], *(str(r["hparams"].get(k)) for k in varying), seeds,
             _pct(r["covered_fraction"]), _pct(r["predicted_accuracy_unseen"]),
             _pct(r["mdi_accuracy_unseen"]), measured, gap]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot_coverage(rows, path) -> str:
  """Predicted (x) against measured (y) unseen accuracy, %, one marker and colour per
  scheme (mean over seeds, min–max bar), each point labelled with its task, the diagonal
  y = x. Schemes are nudged apart in x so coinciding points stay visible."""
  from mpx import plotting
  schemes = list(dict.fromkeys(r["scheme"] for r in rows))
  markers = ("o", "s", "^", "D", "v", "P", "X", "*")
  fig, ((ax,),) = plotting.subplots(1, 1, (6.4, 6.0), right=0.2, bottom=1.1, top=0.4)
  ax.plot([0, 100], [0, 100], color="0.6", linestyle="--", linewidth=1, label="y = x")
  for i, scheme in enumerate(schemes):
    mine = [r for r in rows if r["scheme"] == scheme and r["measured_mean"] is not None]
    if not mine:
      continue
    nudge = (i - (len(schemes) - 1) / 2) * 1.2
    x = np.array([100 * r["predicted_accuracy_unseen"] for r in mine]) + nudge
    y = np.array([100 * r["measured_mean"] for r in mine])
    err = np.array([[100 * (r["measured_mean"] - r["measured_min"]) for r in mine],
                    [100 * (r["measured_max"] - r["measured_mean"]) for r in mine]])
    ax.errorbar(x, y, yerr=err, fmt=markers[i % len(markers)], color=f"C{i % 10}",
                markersize=7, capsize=3, label=f"{scheme} (n={max(r['n'] for r in mine)})")
    for xi, yi, r in zip(x, y, mine):
      ax.annotate(r["task"].removeprefix("cov_"), (xi, yi), textcoords="offset points",
                  xytext=(4, 3), fontsize="x-small", color=f"C{i % 10}")
  ax.set_xlim(-5, 105)
  ax.set_ylim(-5, 105)
  ax.set_xlabel("predicted unseen accuracy (%), class_coverage")
  ax.set_ylabel("measured unseen accuracy (%), mean over seeds, min–max")
  ax.set_title("symmetric-mask hypothesis: predicted vs measured", fontsize="medium")
  fig.legend(fontsize="small", loc="lower center", ncols=len(schemes) + 1)
  return plotting._save(fig, path)


def _read_summaries(run_dirs) -> dict:
  """The runs' summary.json files as one: their members joined (runs of task subsets,
  e.g. the halves of a sweep run on two cores); experiment and preset must agree."""
  summaries = []
  for run_dir in map(pathlib.Path, run_dirs):
    path = run_dir / report_lib.SUMMARY_JSON
    if not path.is_file():
      raise ValueError(f"{path} is missing: run `mpx run boolean_coverage --preset ... "
                       f"--out {run_dir}` "
                       "to the end first (it writes summary.json last).")
    summaries.append(json.loads(path.read_text(encoding="utf-8")))
  kinds = {(s["experiment"], s["preset"]) for s in summaries}
  if len(kinds) > 1:
    raise ValueError(f"{list(map(str, run_dirs))} are runs of different experiments or presets "
                     f"{sorted(kinds)}; report runs of one preset together.")
  return dict(summaries[0], members=[m for s in summaries for m in s["members"]])


def report(run_dir, *more_run_dirs) -> tuple[str, str]:
  """Reads the summary.json of RUN_DIR (and of more runs of the same preset, their members
  joined), writes RUN_DIR/coverage.md and RUN_DIR/plots/coverage.png; returns their paths."""
  run_dir = pathlib.Path(run_dir)
  summary = _read_summaries([run_dir, *more_run_dirs])
  rows = predicted_vs_measured(summary)
  if not rows:
    raise ValueError(f"{run_dir / report_lib.SUMMARY_JSON} has no member of this "
                     f"experiment's tasks {TASK_NAMES}.")
  others = sorted({m["task"] for m in summary["members"]} - set(TASKS))
  names = list(dict.fromkeys(r["task"] for r in rows))
  parts = [f"# Coverage: predicted vs measured unseen accuracy ({summary['experiment']}, "
           f"preset {summary['preset']})\n",
           f"![coverage](plots/{PLOT_FILE})\n",
           "Predicted: `mpx.tasks.boolean.coverage.class_coverage` (covered unseen points "
           "answered as the seen data answers their class, the rest at the MDI). Measured: "
           "`accuracy_unseen`, "
           "mean ± population std over the non-diverged seeds; seeds = with a value / all.\n",
           coverage_table(rows), "## The tasks\n", prediction_table(predictions(names))]
  if others:
    parts.append(f"Left out (no prediction): {', '.join(others)}.\n")
  table_path = run_dir / COVERAGE_FILE
  table_path.write_text("\n".join(parts))
  return str(table_path), plot_coverage(rows, run_dir / "plots" / PLOT_FILE)
