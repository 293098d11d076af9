"""Mask priors: the initial values of the mask logits `M` (`[N, N]` or `[H, N, N]`).

Every prior is a plain float32 array. Allowed (query, key) pairs get `M = +a` (bias
`log σ(a) ≈ −e^{−a}`, i.e. almost no suppression), suppressed pairs get `M = −a` (bias
`≈ −a`). Row i is the query, column j the key: `M[i, j]` shapes how much token i may read
token j.

Token layouts used by the task families:
  Boolean / arithmetic token models: token 0 is CLS (when present), then one token per
    input bit / character, in order.
  Vision: token 0 is CLS (when present), then patches in row-major order.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# `log σ(200)` underflows to exactly 0 in float32 (and bfloat16): a neutral prior adds
# nothing to the logits, bit for bit, and `σ(−200) = 0` so it also receives no gradient.
NEUTRAL_LOGIT = 200.0
# `M = 0` adds `log σ(0) = −log 2` to every logit: a constant shift of each row, which the
# softmax ignores (standard attention up to float rounding), with gradient `σ(0) = 1/2`.
LEARNABLE_NEUTRAL_LOGIT = 0.0

IMPULSE_ORDER = (4, 1, 5, 3, 7, 0, 2, 6, 8)


def _check_strength(name: str, value: float) -> float:
  if not np.isfinite(value) or value <= 0:
    raise ValueError(f"{name} must be a finite number > 0; got {value}.")
  return float(value)


# --------------------------------------------------------------------------- generic


def neutral(n_tokens: int, num_heads: int | None = None, *,
            learnable: bool = False) -> jax.Array:
  """No prior: standard attention. Two kinds, since a constant `M` only shifts each row.

  `learnable=False` (`M = NEUTRAL_LOGIT`): `log σ(M) = 0` exactly, so attention is
  standard attention bit for bit, but the gradient `σ(−M)` is exactly 0: the mask never
  moves. Right for a frozen baseline that must equal standard attention.
  `learnable=True` (`M = 0`): every logit shifts by `−log 2`, standard attention up to
  float rounding, and the gradient is `σ(0) = 1/2`: right when the mask should learn
  from no prior (to discover structure).
  """
  shape = (n_tokens, n_tokens) if num_heads is None else (num_heads, n_tokens, n_tokens)
  value = LEARNABLE_NEUTRAL_LOGIT if learnable else NEUTRAL_LOGIT
  return jnp.full(shape, value, jnp.float32)


def from_adjacency(allowed: np.ndarray | jax.Array, strength: float = 4.0,
                   suppressed_strength: float | None = None) -> jax.Array:
  """Logits from a boolean adjacency: allowed → `+strength`, others → `−suppressed_strength`.

  `allowed` is `[N, N]` or `[H, N, N]`. `suppressed_strength` defaults to `strength`;
  an asymmetric pair (e.g. +8 / −2) keeps allowed pairs nearly free while making the
  suppression soft.
  """
  allowed = np.asarray(allowed)
  if allowed.dtype != np.bool_:
    raise ValueError(f"allowed must be a boolean array; got dtype {allowed.dtype}.")
  if allowed.ndim not in (2, 3) or allowed.shape[-1] != allowed.shape[-2]:
    raise ValueError(f"allowed must be [N, N] or [H, N, N]; got shape {allowed.shape}.")
  strength = _check_strength("strength", strength)
  suppressed = strength if suppressed_strength is None else _check_strength(
      "suppressed_strength", suppressed_strength)
  return jnp.asarray(np.where(allowed, strength, -suppressed), jnp.float32)


def adjacency_from_pairs(pairs: Iterable[tuple[int, int]], n_tokens: int, *,
                         symmetric: bool = False) -> np.ndarray:
  """A boolean `[N, N]` adjacency with True at each (query, key) pair."""
  allowed = np.zeros((n_tokens, n_tokens), bool)
  for i, j in pairs:
    if not (0 <= i < n_tokens and 0 <= j < n_tokens):
      raise ValueError(f"pair ({i}, {j}) is outside the {n_tokens} tokens.")
    allowed[i, j] = True
    if symmetric:
      allowed[j, i] = True
  return allowed


def from_pairs(pairs: Iterable[tuple[int, int]], n_tokens: int, strength: float = 4.0, *,
               symmetric: bool = False, suppressed_strength: float | None = None) -> jax.Array:
  """Logits where exactly the listed (query, key) pairs are allowed."""
  allowed = adjacency_from_pairs(pairs, n_tokens, symmetric=symmetric)
  return from_adjacency(allowed, strength, suppressed_strength)


def stack_heads(priors: Sequence[jax.Array]) -> jax.Array:
  """Per-head priors `[N, N]` each → `[H, N, N]`."""
  shapes = {tuple(p.shape) for p in priors}
  if len(shapes) != 1 or len(next(iter(shapes))) != 2:
    raise ValueError(f"stack_heads needs [N, N] priors of one shape; got {sorted(shapes)}.")
  return jnp.stack([jnp.asarray(p, jnp.float32) for p in priors])


def repeat_heads(prior_NN: jax.Array, num_heads: int) -> jax.Array:
  """The same `[N, N]` prior for every head → `[H, N, N]`."""
  if prior_NN.ndim != 2:
    raise ValueError(f"repeat_heads takes an [N, N] prior; got shape {prior_NN.shape}.")
  return jnp.broadcast_to(prior_NN, (num_heads,) + prior_NN.shape).astype(jnp.float32)


def bias_to_logits(bias: np.ndarray | jax.Array) -> jax.Array:
  """The mask logits `M = logit(e^b)` whose bias `log σ(M)` equals a target `b ≤ 0`.

  `b = 0` (no suppression) maps to `NEUTRAL_LOGIT` rather than +inf, so the result is
  finite and its bias is still exactly 0.
  """
  b = jnp.asarray(bias, jnp.float32)
  if bool(jnp.any(b > 0)):
    raise ValueError("bias_to_logits needs b <= 0: log σ(M) can only suppress.")
  logits = b - jnp.log(-jnp.expm1(b))  # log(e^b / (1 - e^b)), stable for small |b|.
  return jnp.where(b == 0, NEUTRAL_LOGIT, jnp.minimum(logits, NEUTRAL_LOGIT))


def as_initializer(prior: jax.Array) -> Callable:
  """Wraps a fixed prior as a Flax initializer `(key, shape, dtype) -> prior`.

  The shape check turns a prior built for the wrong N or H into a clear error at init.
  """
  prior = jnp.asarray(prior, jnp.float32)

  def init(key, shape, dtype=jnp.float32):
    del key
    if tuple(shape) != prior.shape:
      hint = "rebuild the prior for these tokens (N counts CLS)"
      if len(shape) == 3 and tuple(shape[1:]) == prior.shape:
        hint = (f"give every head a copy (priors.repeat_heads(prior, {shape[0]})) or "
                "share one prior across the heads (per_head_mask=False)")
      elif len(shape) == 2 and prior.ndim == 3 and prior.shape[1:] == tuple(shape):
        hint = "the attention shares one prior (per_head_mask=False): pass one [N, N] prior"
      raise ValueError(f"the mask prior has shape {prior.shape} but the attention needs "
                       f"{tuple(shape)} ([H, N, N] per head or [N, N] shared); {hint}.")
    return prior.astype(dtype)

  return init


def neutral_init(key, shape, dtype=jnp.float32):
  """Flax initializer for the frozen neutral prior: standard attention bit for bit, and a
  mask that never moves (zero gradient). See `neutral`."""
  del key
  return jnp.full(shape, NEUTRAL_LOGIT, dtype)


def learnable_neutral_init(key, shape, dtype=jnp.float32):
  """Flax initializer for the learnable neutral prior `M = 0`: standard attention up to
  rounding, with gradient 1/2, so the mask can learn from no prior. See `neutral`."""
  del key
  return jnp.full(shape, LEARNABLE_NEUTRAL_LOGIT, dtype)


# --------------------------------------------------------------------------- Boolean

CLS_ROW_POLICIES = ("support", "all", "self")
CLS_COLUMN_POLICIES = ("support", "all", "none")
OTHER_BIT_POLICIES = ("self", "support", "all")


def boolean_adjacency(n_bits: int, support: Sequence[int], *, cls_token: bool = True,
                      cls_row: str = "support", cls_column: str = "support",
                      self_attention: bool = True, others: str = "self",
                      support_edges: Iterable[tuple[int, int]] | None = None) -> np.ndarray:
  """Which tokens may read which for a Boolean function of the `support` bits.

  The support bits form a clique (every relevant bit reads every other), so the
  interactions the target needs (x0·x1 for parity) are a single attention hop.
  `support_edges` (pairs of bit indices, symmetric) replaces the clique by a sparser
  graph, e.g. the cyclic windows. Options:
    cls_row: what CLS reads: "support" (CLS and the support bits), "all", "self".
    cls_column: who reads CLS: "support" (CLS and the support bits), "all", "none".
    self_attention: whether a support bit may read itself.
    others: what the non-support bits read: "self", "support" (themselves and the
      support bits) or "all".
  """
  for name, value, options in (("cls_row", cls_row, CLS_ROW_POLICIES),
                               ("cls_column", cls_column, CLS_COLUMN_POLICIES),
                               ("others", others, OTHER_BIT_POLICIES)):
    if value not in options:
      raise ValueError(f"{name}={value!r}; choose one of {options}.")
  support = sorted(set(int(s) for s in support))
  if not support or support[0] < 0 or support[-1] >= n_bits:
    raise ValueError(f"support must be non-empty bit indices in [0, {n_bits}); got {support}.")
  offset = 1 if cls_token else 0
  n_tokens = n_bits + offset
  tok = lambda bits: [b + offset for b in bits]
  allowed = np.zeros((n_tokens, n_tokens), bool)
  support_tokens = tok(support)
  if support_edges is None:
    allowed[np.ix_(support_tokens, support_tokens)] = True
  else:
    for i, j in support_edges:
      allowed[i + offset, j + offset] = allowed[j + offset, i + offset] = True
  for t in support_tokens:
    allowed[t, t] = self_attention
  other_tokens = [t for t in tok(range(n_bits)) if t not in support_tokens]
  for t in other_tokens:
    allowed[t, t] = True
    if others == "support":
      allowed[t, support_tokens] = True
    elif others == "all":
      allowed[t, :] = True
  if cls_token:
    allowed[0, 0] = True
    if cls_row == "support":
      allowed[0, support_tokens] = True
    elif cls_row == "all":
      allowed[0, :] = True
    if cls_column == "support":
      allowed[support_tokens, 0] = True
    elif cls_column == "all":
      allowed[:, 0] = True
  return allowed


def boolean_prior(n_bits: int, support: Sequence[int], strength: float = 4.0, *,
                  suppressed_strength: float | None = None, **adjacency_options) -> jax.Array:
  """`[N, N]` logits (N = n_bits + 1 with CLS) for a function of the `support` bits.

  See `boolean_adjacency` for the CLS, self-attention and non-support-bit policies.
  """
  allowed = boolean_adjacency(n_bits, support, **adjacency_options)
  return from_adjacency(allowed, strength, suppressed_strength)


def parity_prior(n_bits: int = 15, support: Sequence[int] = (0, 1), strength: float = 4.0,
                 **options) -> jax.Array:
  """Parity of the support bits: every relevant bit reads every other (pairwise
  interaction), CLS reads the relevant bits, irrelevant bits are kept to themselves."""
  return boolean_prior(n_bits, support, strength, **options)


def majority_prior(n_bits: int = 15, support: Sequence[int] = (0, 1, 2),
                   strength: float = 4.0, *, suppress_shortcut: bool = True,
                   **options) -> jax.Array:
  """Majority of the support bits, optionally suppressing the per-bit shortcut.

  The min-degree solution of majority, ½x0 + ½x1 + x2 − ½x0x2 − ½x1x2, is built from each
  bit's own value. With `suppress_shortcut` no support token reads itself: after one hop
  each support token holds a function of the *other* support bits only, so a bit's value
  reaches the output only through its partners. CLS reads itself and the support tokens
  (never the irrelevant bits), so the readout has a path from every support bit. (The
  paper states the principle, not the exact mask; this is mpx's reading of it. An earlier
  version also let CLS read only itself, which left the readout nothing to read: CLS put
  ≈ 0.78 of its attention on itself and 0.014 on each support bit at init.)
  """
  if suppress_shortcut:
    options.setdefault("self_attention", False)
  return boolean_prior(n_bits, support, strength, **options)


def cyclic_prior(n_bits: int = 15, window: int = 3, strength: float = 4.0,
                 **options) -> jax.Array:
  """Cyclic windows `x_i x_{i+1} … x_{i+window−1}` (indices mod n): bit i reads the bits
  that share a window with it (cyclic distance < window); CLS reads every bit."""
  if not 1 <= window <= n_bits:
    raise ValueError(f"window must be in [1, n_bits={n_bits}]; got {window}.")
  edges = [(i, j) for i in range(n_bits) for j in range(n_bits)
           if i != j and min((i - j) % n_bits, (j - i) % n_bits) < window]
  options.setdefault("cls_row", "all")
  options.setdefault("cls_column", "all")
  return boolean_prior(n_bits, range(n_bits), strength, support_edges=edges, **options)


def from_interactions(interactions_UU: np.ndarray | jax.Array, strength: float = 4.0, *,
                      threshold: float | None = None, **options) -> jax.Array:
  """A prior from an interaction graph over the `U` input units (bits), in the form of the
  hand-written Boolean priors: the units that interact read each other, CLS reads them.

  For a structure that was discovered rather than known (a learned mask read out, a
  learned function's Fourier coefficients; see `mpx.tasks.boolean.graphs`).
  `interactions_UU[i, j]` says that units i and j interact (either direction counts: the
  graph is symmetrised); the diagonal marks the units the target depends on at all (the
  support), and a unit in any pair is in the support too. Boolean, or scores (a pooled
  σ(M), a pair's Fourier weight) with `threshold`: a score ≥ threshold interacts.
  `options` are `boolean_adjacency`'s (CLS token and policies; by default CLS reads CLS
  and the support, support units read each other's pairs, themselves and CLS, other units
  only themselves). Returns `[U + 1, U + 1]` logits with CLS, `[U, U]` without.
  """
  scores = np.asarray(interactions_UU)
  if scores.ndim != 2 or scores.shape[0] != scores.shape[1] or scores.shape[0] < 1:
    raise ValueError(f"interactions_UU must be a square [U, U] array over the input units; "
                     f"got shape {scores.shape}.")
  if scores.dtype == np.bool_:
    if threshold is not None:
      raise ValueError("threshold applies to scores; a boolean graph takes none.")
    graph = scores
  elif threshold is None:
    raise ValueError(f"interactions_UU holds {scores.dtype} scores: give a threshold (a "
                     "score >= threshold interacts), or pass a boolean graph.")
  else:
    graph = scores >= threshold
  graph = graph | graph.T
  pairs = [(int(i), int(j)) for i, j in zip(*np.nonzero(np.triu(graph, 1)))]
  support = sorted(set(np.flatnonzero(np.diag(graph)).tolist())
                   | {u for pair in pairs for u in pair})
  if not support:
    raise ValueError("the interaction graph is empty (no unit in the support, no pair): "
                     "there is no structure to build a prior from; use priors.neutral(...) "
                     "for standard attention.")
  return boolean_prior(scores.shape[0], support, strength, support_edges=pairs, **options)


# --------------------------------------------------------------------------- arithmetic


@dataclasses.dataclass(frozen=True)
class ArithmeticLayout:
  """Token positions of an arithmetic problem; index p of each tuple is place value 10^p.

  `answer` holds the positions of the answer digits. In a causal LM the digit at
  position t is *predicted* by the token at t − 1; `query_offset=-1` puts the alignment
  on those predicting rows.
  """
  n_tokens: int
  a: tuple[int, ...]
  b: tuple[int, ...]
  answer: tuple[int, ...]
  query_offset: int = -1


def arithmetic_layout(a_digits: int = 3, b_digits: int = 3, answer_digits: int = 4, *,
                      reverse_answer: bool = True, bos: bool = True,
                      query_offset: int = -1) -> ArithmeticLayout:
  """Layout of `[BOS] a_{k}..a_0 op b_{k}..b_0 = c...` with operands most significant
  first and the answer reversed (least significant first, the format that makes
  addition learnable left to right) unless `reverse_answer=False`."""
  pos = 1 if bos else 0
  a = tuple(reversed(range(pos, pos + a_digits)))
  pos += a_digits + 1  # operator token
  b = tuple(reversed(range(pos, pos + b_digits)))
  pos += b_digits + 1  # '=' token
  answer_positions = list(range(pos, pos + answer_digits))
  answer = tuple(answer_positions if reverse_answer else reversed(answer_positions))
  return ArithmeticLayout(pos + answer_digits, a, b, answer, query_offset)


def _digit_alignment(layout: ArithmeticLayout,
                     depends: Callable[[int, int, int], bool]) -> np.ndarray:
  allowed = np.ones((layout.n_tokens, layout.n_tokens), bool)
  for p, answer_pos in enumerate(layout.answer):
    row = answer_pos + layout.query_offset
    if not 0 <= row < layout.n_tokens:
      raise ValueError(f"answer place {p} at position {answer_pos} has query row {row} "
                       f"outside the {layout.n_tokens} tokens; check query_offset.")
    allowed[row, :] = False
    allowed[row, row] = True
    for i, pos in enumerate(layout.a):
      allowed[row, pos] = any(depends(p, i, j) for j in range(len(layout.b)))
    for j, pos in enumerate(layout.b):
      allowed[row, pos] = any(depends(p, i, j) for i in range(len(layout.a)))
  return allowed


def addition_prior(layout: ArithmeticLayout, strength: float = 4.0, *, carry: bool = True,
                   suppressed_strength: float | None = None) -> jax.Array:
  """Answer digit p reads operand digits at place p (and p − 1, the carry in).

  Rows that predict an answer digit read only themselves and their aligned operand
  digits; all other rows are left open (the causal mask still applies in an LM).
  """
  places = (0, 1) if carry else (0,)
  allowed = _digit_alignment(layout, lambda p, i, j: i == j and p - i in places)
  return from_adjacency(allowed, strength, suppressed_strength)


def multiplication_prior(layout: ArithmeticLayout, strength: float = 4.0, *,
                         carry: bool = True,
                         suppressed_strength: float | None = None) -> jax.Array:
  """Answer digit p reads the operand digit pairs (i, j) whose product lands on place
  p (i + j = p) and, with `carry`, on the place below (i + j = p − 1)."""
  places = (0, 1) if carry else (0,)
  allowed = _digit_alignment(layout, lambda p, i, j: p - (i + j) in places)
  return from_adjacency(allowed, strength, suppressed_strength)


# --------------------------------------------------------------------------- vision


def _grid_adjacency(grid_h: int, grid_w: int, cls_token: bool,
                    allowed_shift: Callable[[int, int], bool]) -> np.ndarray:
  if grid_h < 1 or grid_w < 1:
    raise ValueError(f"the patch grid must be at least 1x1; got {grid_h}x{grid_w}.")
  rows, cols = np.divmod(np.arange(grid_h * grid_w), grid_w)
  d_row = rows[None, :] - rows[:, None]  # key row − query row
  d_col = cols[None, :] - cols[:, None]
  patches = np.vectorize(allowed_shift)(d_row, d_col).astype(bool)
  if not cls_token:
    return patches
  n = grid_h * grid_w + 1
  allowed = np.ones((n, n), bool)  # CLS row and column open.
  allowed[1:, 1:] = patches
  return allowed


def window_prior(grid_h: int, grid_w: int, window: int = 3, strength: float = 4.0, *,
                 cls_token: bool = True,
                 suppressed_strength: float | None = None) -> jax.Array:
  """Local attention: patch (r, c) reads patches within a `window`×`window` square
  centred on it (a convolution-like locality prior). CLS reads and is read by all."""
  if window < 1 or window % 2 == 0:
    raise ValueError(f"window must be a positive odd size; got {window}.")
  half = window // 2
  allowed = _grid_adjacency(grid_h, grid_w, cls_token,
                            lambda dr, dc: abs(dr) <= half and abs(dc) <= half)
  return from_adjacency(allowed, strength, suppressed_strength)


def impulse_shifts(num_heads: int) -> list[tuple[int, int]]:
  """Head h reads the patch shifted by (m, n) = divmod(k, 3) − 1 with
  k = [4, 1, 5, 3, 7, 0, 2, 6, 8][h mod 9]: centre first, then the 4-neighbours."""
  return [(k // 3 - 1, k % 3 - 1) for k in (IMPULSE_ORDER[h % 9] for h in range(num_heads))]


def impulse_prior(grid_h: int, grid_w: int, num_heads: int, strength: float = 4.0, *,
                  cls_token: bool = True,
                  suppressed_strength: float | None = None) -> jax.Array:
  """`[H, N, N]`: head h lets patch (r, c) read only patch (r + m, c + n), its impulse
  shift (no wrap-around; a patch whose target is off the grid reads nothing strongly).
  This is the impulse init of the vision structured-init papers, placed in the mask."""
  heads = [_grid_adjacency(grid_h, grid_w, cls_token,
                           lambda dr, dc, s=shift: (dr, dc) == s)
           for shift in impulse_shifts(num_heads)]
  return from_adjacency(np.stack(heads), strength, suppressed_strength)


# --------------------------------------------------------------------------- language


def alibi_slopes(num_heads: int) -> np.ndarray:
  """ALiBi slopes `2^(−8h/H)` for heads h = 1..H (steepest first: head 1 has 2^(−8/H))."""
  h = np.arange(1, num_heads + 1)
  return (2.0 ** (-8.0 * h / num_heads)).astype(np.float32)


def alibi_prior(n_tokens: int, num_heads: int) -> jax.Array:
  """`[H, N, N]` causal relative-distance prior: `log σ(M_hij) = −m_h (i − j)` for j ≤ i.

  Future keys (j > i) get the neutral value: the causal mask, not the prior, hides them.
  """
  if n_tokens < 1 or num_heads < 1:
    raise ValueError(f"need n_tokens >= 1 and num_heads >= 1; got {n_tokens}, {num_heads}.")
  distance = np.arange(n_tokens)[:, None] - np.arange(n_tokens)[None, :]
  bias = -alibi_slopes(num_heads)[:, None, None] * np.maximum(distance, 0)[None]
  return bias_to_logits(bias)


def alibi_init(key, shape, dtype=jnp.float32):
  """Flax initializer of the ALiBi prior for an `[H, N, N]` mask leaf (N from the shape)."""
  del key
  if len(shape) != 3 or shape[1] != shape[2]:
    raise ValueError(f"the ALiBi prior is per head, [H, N, N]; the mask leaf is {tuple(shape)} "
                     "(set per_head_mask=True).")
  with jax.ensure_compile_time_eval():  # A constant, also when init is jitted.
    return alibi_prior(shape[1], shape[0]).astype(dtype)

