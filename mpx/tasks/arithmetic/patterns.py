"""The attention pattern of an arithmetic task when it is not known: read it from learned
masks (route (a), "the mask discovers"), then turn it into a mask prior.

A pattern is a boolean `[N, N]` "query reads key" array over the model's input tokens
(`open_NN[i, j]`: row i may read token j), always inside the causal mask. The hand-written
prior (`arithmetic.prior`) is one: the rows that predict an answer digit read themselves
and their aligned operand digits (place p and p − 1), every other row reads its whole
causal past. Here it is discovered instead:

  readout (`open_from_masks`): a model trained from the learnable neutral mask `M = 0`
    under a sparsity pressure on σ(M) (`mpx.tasks.discovery`); an entry whose σ(M) ends above
    its initial value σ(0) = 1/2 in any layer and head is open. 1/2 is the Boolean
    discovery's `MASK_THRESHOLD`, fixed on a planted Boolean function before any arithmetic accuracy
    was measured; nothing here is tuned on test accuracy.
  prior (`prior_pattern_NN`): the rows rule of the hand-written prior. The rows that
    predict an answer digit (`arithmetic.answer_rows_N`) read what was found on them, and
    always themselves; every other row (the prompt, the row predicting END) reads its
    causal past as in the hand-written prior. Which rows predict the answer is the format (the loss
    weights), not the structure; keeping the other rows as the hand-written prior keeps
    them makes a perfect discovery give exactly the hand-written prior, so stage 2
    compares the found alignment and nothing else. Self stays open because a row with
    every entry at −a is a constant shift, i.e. fully open.
  score (`score`): precision and recall of the open (query, key) entries on the rows that
    predict an answer digit, against the hand-written pattern there. Self entries do not
    count: both patterns hold them open by construction (`candidates_NN`).
  control (`random_like`): per scored row as many open entries, drawn at random (seeded)
    among that row's candidates (its causal keys but itself).

Shapes in names: L layers, H heads, N tokens (the model input, `spec.n_tokens`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mpx import priors
from mpx.tasks import arithmetic
from mpx.tasks.boolean.graphs import MASK_THRESHOLD




def causal_NN(n_tokens: int) -> np.ndarray:
  """`[N, N]` True where the key is not in the query's future."""
  return np.tri(n_tokens, dtype=bool)


def alignment_NN(spec: arithmetic.ArithmeticTask, *, carry: bool = True) -> np.ndarray:
  """The hand-written pattern: `arithmetic.prior`'s open entries (causal included)."""
  return np.asarray(arithmetic.prior(spec, 1.0, carry=carry)) > 0


def candidates_NN(spec: arithmetic.ArithmeticTask) -> np.ndarray:
  """The entries a score counts: scored rows × causal keys, self excluded."""
  n = spec.n_tokens
  return arithmetic.answer_rows_N(spec)[:, None] & causal_NN(n) & ~np.eye(n, dtype=bool)


def _check_pattern(spec: arithmetic.ArithmeticTask, open_NN) -> np.ndarray:
  open_NN = np.asarray(open_NN)
  n = spec.n_tokens
  if open_NN.dtype != np.bool_ or open_NN.shape != (n, n):
    raise ValueError(f"expected a boolean [{n}, {n}] query-reads-key pattern for "
                     f"{spec.name} ({n} input tokens); got {open_NN.dtype} {open_NN.shape}. "
                     "Read learned masks with open_from_masks.")
  return open_NN


def _sigma(mask_logits) -> np.ndarray:
  m = np.asarray(mask_logits, np.float64)
  if m.ndim < 2 or m.shape[-1] != m.shape[-2]:
    raise ValueError(f"mask logits must be [..., N, N] (e.g. [L, H, N, N] from "
                     f"discovery.mask_logits_LHNN); got shape {m.shape}.")
  return 1.0 / (1.0 + np.exp(-m))


def _check_threshold(threshold: float) -> float:
  if not 0 < threshold < 1:
    raise ValueError(f"threshold={threshold} must be in (0, 1): it is a σ(M).")
  return float(threshold)


def open_per_mask(mask_logits, threshold: float = MASK_THRESHOLD) -> np.ndarray:
  """Each `[N, N]` mask of `mask_logits` (`[..., N, N]`) read as a pattern: σ(M) >
  threshold, inside the causal mask (a future key is hidden whatever M says)."""
  sigma = _sigma(mask_logits)
  return (sigma > _check_threshold(threshold)) & causal_NN(sigma.shape[-1])


def open_from_masks(mask_logits, threshold: float = MASK_THRESHOLD) -> np.ndarray:
  """Route (a) pooled: `[N, N]`, open where σ(M) > threshold in any layer and head."""
  open_ = open_per_mask(mask_logits, threshold)
  return open_.reshape((-1,) + open_.shape[-2:]).any(0)


def prior_pattern_NN(spec: arithmetic.ArithmeticTask, found_NN) -> np.ndarray:
  """The pattern a prior trains with (the rows rule, see the module docstring): scored
  rows read `found_NN`'s causal entries and themselves, every other row its causal past."""
  found_NN = _check_pattern(spec, found_NN)
  n = spec.n_tokens
  rows_N = arithmetic.answer_rows_N(spec)
  scored_NN = (found_NN | np.eye(n, dtype=bool)) & causal_NN(n)
  return np.where(rows_N[:, None], scored_NN, causal_NN(n))


def discovered_prior(spec: arithmetic.ArithmeticTask, found_NN, strength: float = 4.0):
  """`[N, N]` ±strength logits of `prior_pattern_NN` (`priors.from_adjacency`)."""
  return priors.from_adjacency(prior_pattern_NN(spec, found_NN), strength)


def score(found_NN, spec: arithmetic.ArithmeticTask, *, carry: bool = True) -> dict:
  """Precision and recall of `found_NN`'s open candidate entries (`candidates_NN`) against
  the hand-written pattern; precision None where nothing was found. `n_open`: how many
  were found."""
  cand_NN = candidates_NN(spec)
  found_NN = _check_pattern(spec, found_NN) & cand_NN
  true_NN = alignment_NN(spec, carry=carry) & cand_NN
  hit = int((found_NN & true_NN).sum())
  n_found = int(found_NN.sum())
  return {"precision": hit / n_found if n_found else None,
          "recall": hit / int(true_NN.sum()), "n_open": n_found}


def random_like(found_NN, spec: arithmetic.ArithmeticTask, seed: int | Sequence[int]) -> np.ndarray:
  """The control: on each scored row as many open entries as `found_NN` has there, drawn
  without replacement among that row's candidates (`np.random.default_rng(seed)`); the
  other rows are empty (`prior_pattern_NN` opens them)."""
  cand_NN = candidates_NN(spec)
  counts_N = (_check_pattern(spec, found_NN) & cand_NN).sum(1)
  rng = np.random.default_rng(seed)
  drawn_NN = np.zeros_like(cand_NN)
  for row in np.flatnonzero(arithmetic.answer_rows_N(spec)):
    keys = np.flatnonzero(cand_NN[row])
    drawn_NN[row, rng.choice(keys, size=counts_N[row], replace=False)] = True
  return drawn_NN


def entries(open_NN, spec: arithmetic.ArithmeticTask) -> list[list[int]]:
  """The open candidate entries as `[[query, key], ...]` (row-major), for JSON."""
  found_NN = _check_pattern(spec, open_NN) & candidates_NN(spec)
  return [[int(i), int(j)] for i, j in zip(*np.nonzero(found_NN))]


def from_entries(pairs, spec: arithmetic.ArithmeticTask) -> np.ndarray:
  """Inverse of `entries`: a boolean `[N, N]` pattern."""
  return priors.adjacency_from_pairs(map(tuple, pairs), spec.n_tokens)
