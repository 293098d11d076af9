"""The interaction graph of a Boolean task when it is not known: read it from what training
on the seen data produced, then turn it into a mask prior.

A graph (`InteractionGraph`) names the bits the target depends on (its support) and the
pairs of bits that interact. The hand-written priors encode the true graph; here it is
discovered by one of two routes, each reading only the inputs of the cube and a model
trained on the seen points (never a label of an unseen point):

  (a) the mask discovers (`graph_from_masks`): a model trained from the learnable neutral
      mask `M = 0` (standard attention, gradient 1/2) under a sparsity pressure on σ(M).
      The pressure closes every entry alike; an entry the task needs is pushed open against
      it. An entry that ends above its initial value σ(0) = 1/2 (`MASK_THRESHOLD`) is read
      as used: a bit that CLS reads is in the support, two bits of which either reads the
      other interact (and so are in the support too, though CLS may not read them: a
      relay). Per layer and head, and pooled (any layer, any head).
  (b) the function reveals (`graph_from_function`): the trained model's output on the
      whole cube (inputs only), its Fourier coefficients, and every coefficient at least
      `FOURIER_THRESHOLD` of the largest non-constant one: its bits are in the support, and
      every two of them interact. The cut is relative, so any function that is not
      constant gives a graph: a model that learned nothing gives its noise's graph.

`true_graph` is the same reading of the target's own spectrum (every non-zero
coefficient), so a route that recovers the target's function recovers the true graph.
`score` gives precision and recall of support bits and pairs; `random_like` is the
control, a random graph of the same size, and `support_like` the true support with random
pairs of the same count. `InteractionGraph.prior` builds the mask prior
(`mpx.priors.from_interactions`).

What no route can find: a bit that the seen data holds fixed carries no information about
the target there, so neither a mask nor the learned function has a reason to use it; and a
model that interpolates the seen data by the min-degree interpolator shows the MDI's
interactions, not the target's (2Parity's MDI x0 + x1 − 1 has the bits but no pair).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Iterable, Sequence

import jax
import numpy as np

from mpx import priors
from mpx.tasks import discovery
from mpx.tasks.boolean import BooleanTask, check_n_bits, cube_data
from mpx.tasks.boolean.fourier import ZERO_TOL, fourier_coefficients

# Fixed before any unseen accuracy was measured (on a planted synthetic function, not on the
# tasks reported): an entry is open when σ(M) ended above its initial value σ(0) = 1/2
# (`discovery.MASK_THRESHOLD`) ...
MASK_THRESHOLD = discovery.MASK_THRESHOLD
# ... and a coefficient counts when |c_S| >= 0.1 max_{S != ∅} |c_S|.
FOURIER_THRESHOLD = 0.1


@dataclasses.dataclass(frozen=True)
class InteractionGraph:
  """The support bits of a Boolean function on `n_bits` bits and its interacting pairs.

  Attributes:
    n_bits: the input length n.
    bits: the support, sorted; every bit of a pair is in it.
    pairs: interacting pairs (i, j) with i < j, sorted.
  """
  n_bits: int
  bits: tuple[int, ...] = ()
  pairs: tuple[tuple[int, int], ...] = ()

  def __post_init__(self):
    n = check_n_bits(self.n_bits)
    pairs = sorted({(min(int(i), int(j)), max(int(i), int(j))) for i, j in self.pairs})
    bits = sorted({int(b) for b in self.bits} | {b for pair in pairs for b in pair})
    if any(i == j for i, j in pairs):
      raise ValueError(f"a pair joins two different bits; got {self.pairs!r}.")
    if any(not 0 <= b < n for b in bits):
      raise ValueError(f"bits must lie in 0..{n - 1}; got bits {self.bits!r}, pairs "
                       f"{self.pairs!r}.")
    object.__setattr__(self, "n_bits", n)
    object.__setattr__(self, "bits", tuple(bits))
    object.__setattr__(self, "pairs", tuple(pairs))

  @classmethod
  def from_adjacency(cls, graph_NN: np.ndarray) -> "InteractionGraph":
    """The graph of a boolean `[n, n]` adjacency: diagonal = support, the rest = pairs
    (either direction)."""
    graph_NN = np.asarray(graph_NN)
    if graph_NN.dtype != np.bool_ or graph_NN.ndim != 2 or graph_NN.shape[0] != graph_NN.shape[1]:
      raise ValueError(f"expected a boolean [n, n] adjacency; got {graph_NN.dtype} "
                       f"{graph_NN.shape}.")
    sym = graph_NN | graph_NN.T
    pairs = [(int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(sym, 1)))]
    return cls(graph_NN.shape[0], tuple(np.flatnonzero(np.diag(sym)).tolist()), tuple(pairs))

  def adjacency(self) -> np.ndarray:
    """Boolean `[n, n]`: the support on the diagonal, each pair in both directions."""
    graph = np.zeros((self.n_bits, self.n_bits), bool)
    graph[list(self.bits), list(self.bits)] = True
    for i, j in self.pairs:
      graph[i, j] = graph[j, i] = True
    return graph

  @property
  def empty(self) -> bool:
    """No support bit: nothing to build a prior from."""
    return not self.bits

  def prior(self, strength: float = 4.0, **options) -> jax.Array:
    """The `[n + 1, n + 1]` mask prior of this graph (`priors.from_interactions`: CLS reads
    the support, paired bits read each other); an empty graph raises (no structure)."""
    return priors.from_interactions(self.adjacency(), strength, **options)

  def to_json(self) -> dict:
    """{"bits": [...], "pairs": [[i, j], ...]} (n_bits is the task's)."""
    return {"bits": list(self.bits), "pairs": [list(p) for p in self.pairs]}

  @classmethod
  def from_json(cls, n_bits: int, data: dict) -> "InteractionGraph":
    """Inverse of `to_json`."""
    return cls(n_bits, tuple(data["bits"]), tuple(tuple(p) for p in data["pairs"]))


# ----------------------------------------------------------------------------------------------
# Route (b) and the truth: the Fourier spectrum.


def graph_from_coefficients(coeffs_S: np.ndarray, n_bits: int,
                            threshold: float = FOURIER_THRESHOLD, *,
                            relative: bool = True) -> InteractionGraph:
  """The graph of a spectrum `c_S` (`fourier.fourier_coefficients` order): every
  coefficient with |c_S| >= threshold (times the largest non-constant |c_S| when
  `relative`) puts its bits in the support and makes each two of them a pair."""
  n_bits = check_n_bits(n_bits)
  coeffs_S = np.asarray(coeffs_S, np.float64)
  if coeffs_S.shape != (2**n_bits,):
    raise ValueError(f"expected the 2^{n_bits} Fourier coefficients of one function; got "
                     f"shape {coeffs_S.shape}.")
  if not threshold > 0:
    raise ValueError(f"threshold must be > 0; got {threshold}.")
  size = np.abs(coeffs_S)
  size[0] = 0.0  # The constant term involves no bit.
  scale = size.max() if relative else 1.0
  if scale == 0.0:
    return InteractionGraph(n_bits)
  masks = np.flatnonzero(size >= threshold * scale)
  bits, pairs = set(), set()
  for mask in masks.tolist():
    members = [i for i in range(n_bits) if mask >> i & 1]
    bits.update(members)
    pairs.update(itertools.combinations(members, 2))
  return InteractionGraph(n_bits, tuple(bits), tuple(pairs))


def graph_from_function(values_P: np.ndarray, n_bits: int,
                        threshold: float = FOURIER_THRESHOLD) -> InteractionGraph:
  """Route (b): the graph of a function given on the whole cube (a trained model's
  output in `boolean.cube` order), from its coefficients above `threshold` of the largest
  non-constant one."""
  return graph_from_coefficients(fourier_coefficients(values_P, n_bits), n_bits, threshold)


def true_graph(task: BooleanTask) -> InteractionGraph:
  """The task's interaction graph: every non-zero coefficient of its target (|c_S| above
  1e-9) joins its bits. Cyclic3's windows give each bit its two neighbours on each side;
  a clique target (parity, majority) its support clique."""
  _, y_P, _ = cube_data(task)
  return graph_from_coefficients(fourier_coefficients(y_P, task.n_bits), task.n_bits,
                                 ZERO_TOL, relative=False)


def pair_weights(coeffs_S: np.ndarray, n_bits: int) -> np.ndarray:
  """`[n, n]` Fourier weight sum_{S ∋ i, j} c_S^2 of each pair (each bit's influence
  sum_{S ∋ i} c_S^2 on the diagonal): how much of the function each interaction carries,
  for figures."""
  n_bits = check_n_bits(n_bits)
  weight_S = np.asarray(coeffs_S, np.float64)**2
  masks_S = np.arange(2**n_bits)
  has_NS = np.stack([(masks_S >> i & 1).astype(bool) for i in range(n_bits)])
  return np.einsum("is,js,s->ij", has_NS, has_NS, weight_S)


# ----------------------------------------------------------------------------------------------
# Route (a): the learned mask.


def _check_masks(mask_logits, cls_token: bool) -> np.ndarray:
  m = np.asarray(mask_logits, np.float64)
  if m.ndim < 2 or m.shape[-1] != m.shape[-2] or m.shape[-1] < 1 + cls_token:
    raise ValueError(f"mask logits must be [..., N, N] (layers and heads leading, N tokens "
                     f"with CLS first); got shape {m.shape}.")
  return m


def graph_from_open(open_NN: np.ndarray, *, cls_token: bool = True) -> InteractionGraph:
  """The graph of one boolean `[N, N]` "query reads key" pattern over CLS and the bit
  tokens: bits CLS reads are in the support, two bits where one reads the other
  interact (a token reading itself says nothing)."""
  open_NN = np.asarray(open_NN, bool)
  offset = 1 if cls_token else 0
  n_bits = open_NN.shape[-1] - offset
  bits_NN = open_NN[offset:, offset:] & ~np.eye(n_bits, dtype=bool)
  support = np.flatnonzero(open_NN[0, offset:]).tolist() if cls_token else []
  pairs = [(int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(bits_NN | bits_NN.T, 1)))]
  return InteractionGraph(n_bits, tuple(support), tuple(pairs))


def mask_graphs(mask_logits, threshold: float = MASK_THRESHOLD, *,
                cls_token: bool = True) -> list:
  """Route (a) per layer and head: the graph of each `[N, N]` mask of `mask_logits`
  (`[..., N, N]`, e.g. `[L, H, N, N]`), nested as its leading axes (a list of lists)."""
  m = _check_masks(mask_logits, cls_token)
  open_ = 1.0 / (1.0 + np.exp(-m)) > threshold

  def nest(a):
    if a.ndim == 2:
      return graph_from_open(a, cls_token=cls_token)
    return [nest(x) for x in a]
  return nest(open_)


def graph_from_masks(mask_logits, threshold: float = MASK_THRESHOLD, *,
                     cls_token: bool = True) -> InteractionGraph:
  """Route (a) pooled: an entry open (σ(M) > threshold) in any layer and head of
  `mask_logits` (`[..., N, N]`); the union of `mask_graphs`."""
  m = _check_masks(mask_logits, cls_token)
  pooled_NN = m.reshape((-1,) + m.shape[-2:]).max(0)
  return graph_from_open(1.0 / (1.0 + np.exp(-pooled_NN)) > threshold, cls_token=cls_token)


# ----------------------------------------------------------------------------------------------
# Scores and the control.


def _precision_recall(found: set, true: set) -> tuple[float | None, float | None]:
  """(precision, recall); None where undefined (nothing found / nothing to find)."""
  hit = len(found & true)
  return (hit / len(found) if found else None, hit / len(true) if true else None)


def score(found: InteractionGraph, truth: InteractionGraph) -> dict[str, float | None]:
  """Precision and recall of the support bits and of the pairs of `found` against
  `truth`, fractions; None where undefined (an empty graph has no precision, a target
  without pairs no pair recall)."""
  if found.n_bits != truth.n_bits:
    raise ValueError(f"graphs of {found.n_bits} and {truth.n_bits} bits do not compare.")
  bit_p, bit_r = _precision_recall(set(found.bits), set(truth.bits))
  pair_p, pair_r = _precision_recall(set(found.pairs), set(truth.pairs))
  return {"bit_precision": bit_p, "bit_recall": bit_r, "pair_precision": pair_p,
          "pair_recall": pair_r}


def _pairs_among(rng: np.random.Generator, bits, count: int) -> tuple:
  """`count` distinct pairs drawn at random among `bits` (all of them where fewer exist)."""
  candidates = list(itertools.combinations(bits, 2))
  count = min(count, len(candidates))
  picked = rng.choice(len(candidates), size=count, replace=False) if candidates else []
  return tuple(candidates[i] for i in picked)


def random_like(graph: InteractionGraph, seed: int | Sequence[int]) -> InteractionGraph:
  """The control: as many support bits, drawn at random among all n, and as many pairs,
  drawn at random among them (`np.random.default_rng(seed)`)."""
  rng = np.random.default_rng(seed)
  bits = sorted(rng.choice(graph.n_bits, size=len(graph.bits), replace=False).tolist())
  return InteractionGraph(graph.n_bits, tuple(bits), _pairs_among(rng, bits, len(graph.pairs)))


def support_like(graph: InteractionGraph, truth: InteractionGraph,
                 seed: int | Sequence[int]) -> InteractionGraph:
  """The control of "which pairs" alone: `truth`'s support bits, with as many pairs drawn
  at random among them as `graph` has (all of them where it has more), seeded as
  `random_like` (`np.random.default_rng(seed)`). Against `random_like` (random bits too)
  it separates finding the bits from finding the pairs."""
  if graph.n_bits != truth.n_bits:
    raise ValueError(f"graphs of {graph.n_bits} and {truth.n_bits} bits do not compare.")
  if truth.empty:
    raise ValueError("the true graph has no support bit to draw pairs among; this control "
                     "needs a task whose target depends on some bit.")
  return InteractionGraph(truth.n_bits, truth.bits, _pairs_among(
      np.random.default_rng(seed), truth.bits, len(graph.pairs)))


def graphs_to_json(graphs: Iterable) -> list:
  """Nested graphs (`mask_graphs`) as nested `to_json` dicts."""
  return [g.to_json() if isinstance(g, InteractionGraph) else graphs_to_json(g)
          for g in graphs]
