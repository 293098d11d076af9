"""Masked attention as pure functions: logits = q·kᵀ/√d + log σ(M).

Layout follows Flax: queries `[..., N, H, D]` (batch dims, tokens, heads, head dim).
The mask parameter `M` ("mask logits") is `[N, N]` (shared by heads) or `[..., H, N, N]`
(per head, optionally with leading batch dims; `H = 1` broadcasts over heads).

`log σ(M) ≤ 0`, so a mask prior can only suppress. Causal, padding and Flax-style boolean
masks are *hard* (−inf) and compose with the soft prior and any extra float bias; a query
row with no allowed key returns zeros rather than NaN. `docs/functional.md` is the guide.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Callable

import jax
import jax.numpy as jnp

Array = jax.Array

# The param name of the mask logits M in every module and tree: the one place it is named
# (optimizer groups, schemes and diagnostics all ask `is_mask_path`).
MASK_LEAF = "mask_logits"


def leaf_name(path) -> str | None:
  """The param name a pytree key path ends at: `DictKey("kernel")` → "kernel".

  NNX state paths end one step further, at the Variable's `.value`, which is skipped, so
  Linen params and NNX state name their leaves alike.
  """
  path = tuple(path)
  if path and getattr(path[-1], "name", None) == "value":
    path = path[:-1]
  if not path:
    return None
  last = path[-1]
  for attribute in ("key", "name"):  # DictKey / FlattenedIndexKey, GetAttrKey.
    if isinstance(getattr(last, attribute, None), str):
      return getattr(last, attribute)
  return last if isinstance(last, str) else None


def is_mask_path(path) -> bool:
  """Whether a pytree key path (`tree_map_with_path`) ends at a mask-logits leaf, in
  Linen params and NNX state alike."""
  return leaf_name(path) == MASK_LEAF


def not_masks(params):
  """True at every leaf but the mask priors: the `mask=` of optax's weight decay.

  Decay pulls every leaf it reaches towards 0, and `M = 0` is σ(M) = 1/2 on every pair:
  half suppression everywhere, which erases the prior's structure. It does so even to a
  frozen prior (`learnable_mask=False` only stops the gradient). Pass
  `optax.adamw(..., mask=mpx.not_masks)` or `optax.add_decayed_weights(wd,
  mask=mpx.not_masks)`; works on Linen params and NNX state alike.
  """
  return jax.tree_util.tree_map_with_path(lambda path, _: not is_mask_path(path), params)


IMPLEMENTATIONS = ("reference", "jax", "cudnn")

# mpx's names for the `implementation=` values of `jax.nn.dot_product_attention`.
_FUSED_BACKENDS = {"jax": "xla", "cudnn": "cudnn"}
_CUDNN_DTYPES = (jnp.float16, jnp.bfloat16)



@dataclasses.dataclass(frozen=True)
class CudnnForm:
  """How the fused path hands the attention to `jax.nn.dot_product_attention`: the
  conditions jax's and cuDNN's trackers name for cuDNN's kernel with a bias under vmap.
  Every form computes the same attention (the XLA backend takes them all).

  bias_dtype: "float32" (the prior unrounded) or "inputs": q's dtype, the bf16 bias cuDNN
    computes with (an f32 bias with bf16 q, k, v gave NaN on some XLA versions).
  finite: the hard masks folded into the bias as `FINITE_NEGATIVE`, and the bias clipped
    there: no boolean mask and no −inf reaches the kernel.
  full_bias: the bias materialised per example and head, `[B, H, Nq, Nk]` (jax's batching
    rule reshapes a vmapped bias to that size); False hands `[1, H, Nq, Nk]` where it does
    not vary over the batch.
  seq_lengths: full-length `query_seq_lengths` / `key_value_seq_lengths` (keywords of
    `jax.nn.dot_product_attention` in jax 0.10 and 0.11 alike) passed: NaN key and value
    gradients with very negative log-sum-exps were avoided so. Shaped from q, so that they
    carry a vmapped member axis as every other operand does (jax 0.10's batching rule
    reshapes each to the flattened batch).
  """
  bias_dtype: str = "float32"
  finite: bool = False
  full_bias: bool = True
  seq_lengths: bool = False


CUDNN_FORMS = {
    "plain": CudnnForm(),
    "bf16_bias": CudnnForm(bias_dtype="inputs"),
    "finite": CudnnForm(finite=True),
    "broadcast_bias": CudnnForm(full_bias=False),
    "seq_lengths": CudnnForm(seq_lengths=True),
    "all": CudnnForm(bias_dtype="inputs", finite=True, seq_lengths=True),
}
# The form implementation="cudnn" uses. The device probes (benchmarks/accelerator_check,
# stage cudnn) compare each form with the reference attention under the engine's
# jit(vmap(value_and_grad)); once one matches, name it here (and the experiments may lift
# their refusal of attention="cudnn").
CUDNN_FORM = CUDNN_FORMS["plain"]
# What `finite` puts where a hard mask hides a key: exp(−1e4) is 0 in float32, and the
# sum of two such values stays finite in bf16 (jax's own value, −2⁴¹, overflows there).
FINITE_NEGATIVE = -1e4

_TORCH_LAYOUT = (
    "q, k, v look like PyTorch's [batch, heads, tokens, head_dim] (heads and tokens "
    "swapped); mpx takes [..., tokens, heads, head_dim]: pass jnp.swapaxes(q, -3, -2) "
    "(and the same for k and v).")


def mask_bias(mask_logits: Array) -> Array:
  """`log σ(M)` in float32, computed stably as `-softplus(-M)`.

  The gradient is `σ(−M)` (the paper's Theorem 1): bounded by 1 and independent of
  feature norms, which is why a mask prior moves slowly and persists.
  """
  return jax.nn.log_sigmoid(jnp.asarray(mask_logits, jnp.float32))


# --------------------------------------------------------------------------- checks


def _shape(x) -> tuple[int, ...] | None:
  return None if x is None else tuple(jnp.shape(x))


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
  """Whether `shape` broadcasts to `target` without growing it (numpy rules)."""
  return len(shape) <= len(target) and all(
      s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def _qkv_problem(q, k, v) -> str | None:
  """What is wrong with the shapes of q, k, v (`[..., N, H, D]`), or None."""
  if len(q) < 3 or len(k) != len(q) or len(v) != len(q):
    return ("masked_attention expects q, k, v of the same rank >= 3 laid out "
            f"[..., tokens, heads, head_dim]; got q{q}, k{k}, v{v}.")
  if not q[:-3] == k[:-3] == v[:-3]:
    return (f"q, k, v must share their batch dims; got q{q}, k{k}, v{v} (batch dims "
            f"{q[:-3]}, {k[:-3]}, {v[:-3]}): broadcast or repeat them to one batch.")
  if k[-2:] != q[-2:]:
    return f"q and k must agree on (heads, head_dim); got q{q} and k{k}."
  if v[-3:-1] != k[-3:-1]:
    return f"k and v must agree on (tokens, heads); got k{k} and v{v}."
  return None


def _prior_problem(m, num_heads, n_q, n_k, batch, has_offset) -> str | None:
  """What is wrong with the shape of the mask logits M, or None."""
  if len(m) < 2:
    return f"mask_logits must be [N, N] or [..., H, N, N]; got rank {len(m)} {m}."
  if has_offset and m[-2:] != (n_k, n_k):
    return (f"with query_offset, mask_logits must be the square prior over the {n_k} keys "
            f"(its rows are absolute query positions); got shape {m}.")
  if not has_offset and m[-2:] != (n_q, n_k):
    if m[-2:] == (n_k, n_k) and n_q < n_k:
      return (f"mask_logits is a prior over {n_k} tokens but there are {n_q} queries; pass "
              f"query_offset= (the first query's position) to use its rows "
              f"[query_offset, query_offset + {n_q}).")
    return (f"mask_logits ends in {m[-2:]} but the attention is {n_q} queries x {n_k} "
            f"keys; build the prior for N = {n_k} tokens (CLS included).")
  if len(m) >= 3 and m[-3] not in (1, num_heads):
    return (f"mask_logits has {m[-3]} heads (shape {m}) but q has {num_heads}; use "
            "[N, N] for a mask shared by heads or stack one per head.")
  if not _broadcasts_to(m[:-3], batch):
    return (f"mask_logits has shape {m} but its batch dims {m[:-3]} must broadcast to "
            f"q's batch dims {batch}.")
  return None


def _shape_problem(q, k, v, mask_logits, mask, bias, padding_mask, causal,
                   has_offset) -> str | None:
  """The first shape error (a one-line message naming the fix), or None; shapes only."""
  problem = _qkv_problem(q, k, v)
  if problem:
    return problem
  batch, num_heads, n_q, n_k = q[:-3], q[-2], q[-3], k[-3]
  target = batch + (num_heads, n_q, n_k)
  if causal and not has_offset and n_q != n_k:
    return (f"causal attention with {n_q} queries and {n_k} keys needs their positions: "
            "pass query_offset= (the first query's position among the keys).")
  if mask_logits is not None:
    problem = _prior_problem(mask_logits, num_heads, n_q, n_k, batch, has_offset)
    if problem:
      return problem
  for name, shape in (("mask", mask), ("bias", bias)):
    if shape is not None and not _broadcasts_to(shape, target):
      return (f"{name} has shape {shape} but must broadcast to [batch..., heads, queries, "
              f"keys] = {target}.")
  if padding_mask is not None and not (
      padding_mask and padding_mask[-1] == n_k and _broadcasts_to(padding_mask[:-1], batch)):
    return (f"padding_mask has shape {padding_mask} but must be [batch..., keys] = "
            f"{batch + (n_k,)} (True = a real key token).")
  return None


def _check_shapes(q, k, v, mask_logits=None, mask=None, bias=None, padding_mask=None,
                  causal=False, query_offset=None) -> None:
  """Raises the first shape error; recognises PyTorch's `[B, H, N, D]` layout."""
  shapes = [_shape(x) for x in (q, k, v, mask_logits, mask, bias, padding_mask)]
  has_offset = query_offset is not None
  problem = _shape_problem(*shapes, causal, has_offset)
  if problem is None:
    return
  swap = lambda s: s[:-3] + (s[-2], s[-3], s[-1]) if len(s) >= 3 else s
  swapped = [swap(s) for s in shapes[:3]] + shapes[3:]
  if _shape_problem(*swapped, causal, has_offset) is None:
    raise ValueError(_TORCH_LAYOUT)
  raise ValueError(problem)


def _check_dtypes(mask, bias, padding_mask) -> None:
  if mask is not None and jnp.result_type(mask) != jnp.bool_:
    raise ValueError(
        f"mask must be boolean (True = attend); got {jnp.result_type(mask)}. Flax's "
        "make_attention_mask / make_causal_mask default to float32: pass mask.astype(bool); "
        "an additive float mask belongs in bias=.")
  if bias is not None and not jnp.issubdtype(jnp.result_type(bias), jnp.floating):
    raise ValueError(f"bias must be a float array added to the logits; got "
                     f"{jnp.result_type(bias)}. A boolean mask belongs in mask=.")
  if padding_mask is not None and jnp.result_type(padding_mask) != jnp.bool_:
    raise ValueError(f"padding_mask must be boolean (True = real token); got "
                     f"{jnp.result_type(padding_mask)}.")


def _check_offset(query_offset, n_q: int, n_k: int) -> None:
  """An integer scalar; a concrete one must keep the queries inside the keys.

  A traced offset cannot be checked: like any `dynamic_slice`, the prior's rows are then
  clamped into range.
  """
  if query_offset is None:
    return
  if jnp.ndim(query_offset) != 0 or not jnp.issubdtype(jnp.result_type(query_offset),
                                                        jnp.integer):
    raise ValueError(f"query_offset must be an integer scalar (the first query's position); "
                     f"got {query_offset!r}.")
  try:
    offset = operator.index(query_offset)
  except TypeError:  # Traced under jit: no value to check.
    return
  if not 0 <= offset <= n_k - n_q:
    raise ValueError(f"query_offset={offset} puts the {n_q} queries outside the {n_k} keys; "
                     f"it must lie in [0, {n_k - n_q}].")


def _dropout_active(dropout_rate: float, dropout_rng, deterministic: bool) -> bool:
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must lie in [0, 1); got {dropout_rate}.")
  active = not deterministic and dropout_rate > 0.0
  if active and dropout_rng is None:
    raise ValueError(f"dropout is active (dropout_rate={dropout_rate}, deterministic=False) "
                     "but dropout_rng is None; pass dropout_rng= or deterministic=True.")
  return active


# --------------------------------------------------------------------------- pieces


def _logit_bias(mask_logits, bias, n_q: int, query_offset) -> Array | None:
  """`log σ(M)` (rows sliced at the query offset) plus `bias`, float32; None if neither."""
  total = None
  if mask_logits is not None:
    m = jnp.asarray(mask_logits)
    if query_offset is not None:
      m = jax.lax.dynamic_slice_in_dim(m, query_offset, n_q, axis=m.ndim - 2)
    total = mask_bias(m)
  if bias is not None:
    bias = jnp.asarray(bias, jnp.float32)
    total = bias if total is None else total + bias
  return total


def _allowed_BHQK(n_q: int, n_k: int, causal: bool, query_offset, padding_mask,
                  mask) -> Array | None:
  """The hard masks ANDed, as booleans broadcastable to `[..., H, Nq, Nk]`, or None."""
  hard = []
  if causal:  # Query i sits at position query_offset + i and sees the keys j <= it.
    q_pos_Q = jnp.arange(n_q) + (0 if query_offset is None else query_offset)
    hard.append(jnp.arange(n_k)[None, :] <= q_pos_Q[:, None])
  if padding_mask is not None:
    hard.append(jnp.asarray(padding_mask)[..., None, None, :])
  if mask is not None:
    hard.append(jnp.asarray(mask))
  return functools.reduce(jnp.logical_and, hard) if hard else None


def attention_logits(q: Array, k: Array, mask_logits: Array | None = None, *,
                     bias: Array | None = None, query_offset=None) -> Array:
  """`q·kᵀ/√d + log σ(M) + bias` in float32, shaped `[..., H, Nq, Nk]`."""
  _check_shapes(q, k, k, mask_logits, None, bias, query_offset=query_offset)
  _check_dtypes(None, bias, None)
  _check_offset(query_offset, q.shape[-3], k.shape[-3])
  return _logits(q, k, mask_logits, bias, query_offset)


def _logits(q, k, mask_logits, bias, query_offset) -> Array:
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  # Heads-first operands: XLA:CPU runs this batched dot ~2.5x faster forward than the
  # tokens-first einsum (`benchmarks/README.md`).
  q_h, k_h = jnp.swapaxes(q, -2, -3), jnp.swapaxes(k, -2, -3)
  qk = lambda q_h, k_h: jnp.einsum("...hqd,...hkd->...hqk", q_h, k_h,
                                   preferred_element_type=jnp.float32)
  logits = (_on_cpu(_qk_cpu, qk, q_h, k_h) if _cpu_products(q.shape[-3], k.shape[-3], q, k)
            else qk(q_h, k_h))
  total_bias = _logit_bias(mask_logits, bias, q.shape[-3], query_offset)
  return logits if total_bias is None else logits + total_bias


# The most queries or keys for which `_qk_cpu` / `_pv_cpu` are used. Attention alone,
# jit(grad), 2 idle cores of an AMD EPYC, their time over the einsums': N = 16, 17, 24, 32:
# 0.65-0.73; N = 64: 1.01; N = 128: 1.87; N = 197: 1.07 (swapping [N, N] costs more there).
CPU_PRODUCTS_MAX_TOKENS = 32


def _cpu_products(n_q: int, n_k: int, *operands) -> bool:
  """Whether an attention product takes `_qk_cpu` / `_pv_cpu` where the program runs on
  XLA:CPU (`_on_cpu`): float32 operands at short sequences."""
  return (max(n_q, n_k) <= CPU_PRODUCTS_MAX_TOKENS
          and all(x.dtype == jnp.float32 for x in operands))


def _on_cpu(cpu_product: Callable, product: Callable, a: Array, b: Array) -> Array:
  """`cpu_product(a, b)` in a program lowered for XLA:CPU, `product(a, b)` elsewhere,
  chosen by the platform the program is lowered for, not the host's backend: a program
  compiled on a CPU host for a TPU or a GPU (`mpx compile`) holds the target's path and
  none of the CPU's barriers. Both compute the same values."""
  return jax.lax.platform_dependent(a, b, cpu=cpu_product, default=product)


def _transposed(x_IJ: Array) -> Array:
  """`x` with its last two axes swapped in memory. Without the barrier XLA folds the swap
  back into the dot, and XLA:CPU hands a dot whose left operand is transposed to Eigen,
  not YNNPACK: at attention shapes (`[256, 2, 16, 16]`) that dot ran 0.32 ms against
  0.15 ms for this swap and a YNNPACK dot (`benchmarks/README.md`)."""
  return jax.lax.optimization_barrier(jnp.swapaxes(x_IJ, -1, -2))


def _swapped_behind_barrier(x_IJ: Array) -> Array:
  """`x` with its last two axes swapped after a barrier: in a JVP's tangent, so that the
  transpose JAX derives swaps the cotangent in memory (`_transposed`) before its dot."""
  return jnp.swapaxes(jax.lax.optimization_barrier(x_IJ), -1, -2)


# The attention products on XLA:CPU. Their values are the einsums'; their JVPs are written
# so that the transposes JAX derives for the backward pass (the key and value gradients,
# `dSᵀ·q` and `pᵀ·dO`) contract a swapped operand that XLA keeps (`_transposed`).
# A custom JVP, not a custom VJP, so forward-mode autodiff (jax.jvp, jacfwd) still works.


@jax.custom_jvp
def _qk_cpu(q_HQD: Array, k_HKD: Array) -> Array:
  """`q·kᵀ` heads-first."""
  return jnp.einsum("...qd,...kd->...qk", q_HQD, k_HKD)


@_qk_cpu.defjvp
def _qk_cpu_jvp(primals, tangents):
  q_HQD, k_HKD = primals
  dq_HQD, dk_HKD = tangents
  # q·dkᵀ as (dk·qᵀ)ᵀ with the swap behind a barrier: its transpose is g ↦ [gᵀ]·q.
  dk_term = _swapped_behind_barrier(jnp.einsum("...kd,...qd->...kq", dk_HKD, q_HQD))
  return _qk_cpu(q_HQD, k_HKD), jnp.einsum("...qd,...kd->...qk", dq_HQD, k_HKD) + dk_term


@jax.custom_jvp
def _pv_cpu(p_HQK: Array, v_HKD: Array) -> Array:
  """`p·v` heads-first."""
  return jnp.einsum("...qk,...kd->...qd", p_HQK, v_HKD)


@_pv_cpu.defjvp
def _pv_cpu_jvp(primals, tangents):
  p_HQK, v_HKD = primals
  dp_HQK, dv_HKD = tangents
  # p·dv as (dvᵀ·pᵀ)ᵀ with pᵀ and the swap behind barriers: its transpose is
  # g ↦ [pᵀ]·[gᵀ]ᵀ, a dot of two row-major operands.
  dv_term = _swapped_behind_barrier(
      jnp.einsum("...kd,...kq->...dq", dv_HKD, _transposed(p_HQK)))
  return _pv_cpu(p_HQK, v_HKD), jnp.einsum("...qk,...kd->...qd", dp_HQK, v_HKD) + dv_term


def masked_softmax(logits: Array, allowed: Array | None) -> Array:
  """Softmax over the last axis with disallowed entries at −inf.

  A row with no allowed entry gives all-zero probabilities (and zero gradients) instead
  of NaN, so padded queries cannot poison a batch.
  """
  if allowed is None:
    return jax.nn.softmax(logits, axis=-1)
  logits = jnp.where(allowed, logits, -jnp.inf)
  row_max = jnp.max(logits, axis=-1, keepdims=True)
  row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
  unnormalized = jnp.exp(logits - row_max)
  total = jnp.sum(unnormalized, axis=-1, keepdims=True)
  return unnormalized / jnp.where(total > 0, total, 1.0)


def _dropout(probs: Array, rate: float, rng, broadcast: bool) -> Array:
  """Flax's attention dropout (`dot_product_attention_weights`), draw for draw."""
  keep_prob = 1.0 - rate
  shape = (1,) * (probs.ndim - 2) + probs.shape[-2:] if broadcast else probs.shape
  keep = jax.random.bernoulli(rng, keep_prob, shape)
  return probs * (keep.astype(probs.dtype) / jnp.asarray(keep_prob, probs.dtype))


def _check_all(q, k, v, mask_logits, mask, bias, padding_mask, causal, query_offset):
  _check_shapes(q, k, v, mask_logits, mask, bias, padding_mask, causal, query_offset)
  _check_dtypes(mask, bias, padding_mask)
  _check_offset(query_offset, q.shape[-3], k.shape[-3])


def _weights(q, k, mask_logits, mask, bias, causal, padding_mask, dropout, query_offset):
  """Probabilities after the checks; `dropout` is None or (rate, rng, broadcast)."""
  logits = _logits(q, k, mask_logits, bias, query_offset)
  allowed = _allowed_BHQK(q.shape[-3], k.shape[-3], causal, query_offset, padding_mask, mask)
  probs = masked_softmax(logits, allowed)
  return probs if dropout is None else _dropout(probs, *dropout)


def attention_weights(q: Array, k: Array, mask_logits: Array | None = None, *,
                      mask: Array | None = None, bias: Array | None = None,
                      causal: bool = False, padding_mask: Array | None = None,
                      dropout_rate: float = 0.0, dropout_rng: Array | None = None,
                      deterministic: bool = True, broadcast_dropout: bool = True,
                      query_offset=None) -> Array:
  """Attention probabilities `[..., H, Nq, Nk]` (float32): what the prior is shaping.

  The arguments are `masked_attention`'s; with dropout active the weights are the
  dropped and rescaled ones that multiply v.
  """
  _check_all(q, k, k, mask_logits, mask, bias, padding_mask, causal, query_offset)
  active = _dropout_active(dropout_rate, dropout_rng, deterministic)
  dropout = (dropout_rate, dropout_rng, broadcast_dropout) if active else None
  return _weights(q, k, mask_logits, mask, bias, causal, padding_mask, dropout,
                  query_offset)


@jax.named_scope("masked_attention")  # Names its ops in profiles (benchmarks/xla_trace.py).
def masked_attention(q: Array, k: Array, v: Array, mask_logits: Array | None = None, *,
                     mask: Array | None = None, bias: Array | None = None,
                     causal: bool = False, padding_mask: Array | None = None,
                     dropout_rate: float = 0.0, dropout_rng: Array | None = None,
                     deterministic: bool = True, broadcast_dropout: bool = True,
                     query_offset=None, implementation: str = "reference") -> Array:
  """Attention with an additive mask prior: softmax(q·kᵀ/√d + log σ(M) + bias) v.

  Hard masks (causal, padding_mask, mask) compose by AND; a query row with no visible
  key returns zeros. `docs/functional.md` walks through every argument.

  Args:
    q, k, v: `[..., Nq, H, D]`, `[..., Nk, H, D]`, `[..., Nk, H, Dv]` with one batch
      shape; any dtype, logits and softmax are float32.
    mask_logits: the prior's parameter M, `[N, N]` or `[..., H|1, N, N]`; None = no prior.
      `[Nq, Nk]` serves cross-attention.
    mask: Flax's boolean mask (True = attend), broadcastable to `[..., H, Nq, Nk]`.
    bias: a float bias broadcastable to `[..., H, Nq, Nk]`, added in float32.
    causal: key j is visible to query i only if j <= query_offset + i.
    padding_mask: `[..., Nk]` booleans, True for real key tokens.
    dropout_rate, dropout_rng, deterministic, broadcast_dropout: dropout on the attention
      weights, as `flax.linen.dot_product_attention` does it (the same rng drops the same
      entries); active when `dropout_rate > 0` and not `deterministic`.
    query_offset: the first query's position among the keys (an int, or a traced int
      under jit), for Nq < Nk queries (decoding with a KV cache): M is the square prior
      over the Nk keys and its rows `[query_offset, query_offset + Nq)` are used; mask
      and bias cover only the Nq queries. A traced offset out of range is clamped, as
      `jax.lax.dynamic_slice` does.
    implementation: where the attention runs. All three compute the same function with
      the bias `log σ(M)` in float32 (a bf16 bias would move a logit near -100 by up to
      0.25) and float32 logits and softmax.
      "reference": einsum + float32 softmax, every backend and dtype; the only one with
        dropout. On XLA:CPU, up to 32 queries and keys, each product whose operands
        are float32 carries a JVP of its own whose backward pass contracts row-major
        operands (1.04-1.2x faster training steps at 16 tokens): the same output bit
        for bit, gradients that differ from the einsum's by float rounding (within
        1e-6 of the largest entry); forward mode works as before. The same holds for
        `attention_logits` and `attention_weights`.
      "jax": `jax.nn.dot_product_attention(..., implementation="xla")`, every backend
        and dtype; it accepts a bias of any dtype and adds it to float32 logits.
      "cudnn": `jax.nn.dot_product_attention(..., implementation="cudnn")`, cuDNN's
        fused flash-attention kernel: NVIDIA GPU and float16/bfloat16 q, k, v only;
        anything else raises ValueError (never a silent fallback). XLA declares the
        float32 bias to cuDNN as float32 (openxla/xla#32985; jaxlib 0.8.0 gave NaN
        gradients, jax-ml/jax#32242). cuDNN trains with a prior or hard mask only at
        an even token count: an odd one (ViT-Tiny at 224 px has 197 tokens) gets one
        more key, hidden by the mask, and one more query, dropped; the result is the
        same. How the bias reaches cuDNN is `CUDNN_FORM` (a `CudnnForm`). cuDNN's
        head-dim limits (a multiple of 8, <= 128 before Hopper and <= 256
        from it) raise jax's NotImplementedError.

  Returns:
    `[..., Nq, H, Dv]` in v's dtype.
  """
  _check_all(q, k, v, mask_logits, mask, bias, padding_mask, causal, query_offset)
  active = _dropout_active(dropout_rate, dropout_rng, deterministic)
  if implementation in _FUSED_BACKENDS:
    if active:
      raise ValueError(
          f'implementation="{implementation}" has no attention dropout (jax\'s fused '
          'attention lacks it); use implementation="reference" or deterministic=True.')
    if implementation == "cudnn":
      _check_cudnn(q, k, v)
    return _masked_attention_fused(q, k, v, mask_logits, mask, bias, causal, padding_mask,
                                   query_offset, _FUSED_BACKENDS[implementation])
  if implementation != "reference":
    raise ValueError(
        f"unknown implementation {implementation!r}; choose one of {IMPLEMENTATIONS}.")
  dropout = (dropout_rate, dropout_rng, broadcast_dropout) if active else None
  probs = _weights(q, k, mask_logits, mask, bias, causal, padding_mask, dropout,
                   query_offset)
  probs, v_h = probs.astype(v.dtype), jnp.swapaxes(v, -2, -3)
  pv = lambda p_h, v_h: jnp.einsum("...hqk,...hkd->...hqd", p_h, v_h,
                                   preferred_element_type=jnp.float32)
  out = (_on_cpu(_pv_cpu, pv, probs, v_h) if _cpu_products(*probs.shape[-2:], v)
         else pv(probs, v_h))
  return jnp.swapaxes(out, -2, -3).astype(v.dtype)


def _check_cudnn(q: Array, k: Array, v: Array) -> None:
  """Raises before jax does: its cuDNN errors (`cuDNN is not detected`) hide the fix."""
  dtypes = {jnp.dtype(x.dtype) for x in (q, k, v)}
  if len(dtypes) != 1 or dtypes.pop() not in _CUDNN_DTYPES:
    raise ValueError(
        'implementation="cudnn" needs q, k, v all float16 or all bfloat16; got '
        f"{q.dtype}, {k.dtype}, {v.dtype}. Compute in bf16 (the models' "
        'dtype=jnp.bfloat16) or use implementation="jax" or "reference".')
  backend = jax.default_backend()
  if backend != "gpu":
    raise ValueError(
        f'implementation="cudnn" runs only on an NVIDIA GPU; the backend is {backend!r}. '
        'Use implementation="jax" or "reference" here.')


def _masked_attention_fused(q, k, v, mask_logits, mask, bias, causal, padding_mask,
                            query_offset, backend, pad_odd=None, form=None):
  """Routes through `jax.nn.dot_product_attention(implementation=backend)`, its operands
  prepared by `_fused_operands`; `form` defaults to `CUDNN_FORM` for cuDNN, the plain form
  otherwise; `pad_odd` (default: for cuDNN) evens out odd token counts (`_pad_to_even`)."""
  if form is None:
    form = CUDNN_FORM if backend == "cudnn" else CUDNN_FORMS["plain"]
  if pad_odd is None:
    pad_odd = backend == "cudnn"
  (q_BQHD, k_BKHD, v_BKHD, bias_BHQK, allowed_BHQK, lengths,
   visible_BHQ) = _fused_operands(q, k, v, mask_logits, mask, bias, causal, padding_mask,
                                  query_offset, pad_odd, form)
  out_BQHD = jax.nn.dot_product_attention(q_BQHD, k_BKHD, v_BKHD, bias=bias_BHQK,
                                          mask=allowed_BHQK, implementation=backend,
                                          **lengths)[:, :q.shape[-3]]
  if visible_BHQ is not None:  # Match the reference: rows with no visible key give zeros.
    out_BQHD = jnp.where(visible_BHQ.transpose(0, 2, 1)[..., None], out_BQHD, 0)
  return out_BQHD.reshape(q.shape[:-1] + v.shape[-1:])


def _fused_operands(q, k, v, mask_logits, mask, bias, causal, padding_mask, query_offset,
                    pad_odd: bool, form: CudnnForm):
  """`(q, k, v, bias, mask, seq lengths, visible)` as `jax.nn.dot_product_attention`
  takes them in `form`: one batch dim, 4-D bias and mask, `{}` or the keyword seq lengths;
  `visible` `[B, H, Nq]` marks the query rows with a visible key (None: all)."""
  n_q, num_heads, n_k = q.shape[-3], q.shape[-2], k.shape[-3]
  shape_BHQK = q.shape[:-3] + (num_heads, n_q, n_k)
  flat = lambda x: x.reshape((-1,) + x.shape[-3:])
  full = lambda x: jnp.broadcast_to(x, shape_BHQK).reshape((-1, num_heads, n_q, n_k))
  one = lambda x: jnp.broadcast_to(x.reshape(x.shape[-min(x.ndim, 3):]),
                                   shape_BHQK[-3:])[None]  # [1, H, Nq, Nk].
  total_bias = _logit_bias(mask_logits, bias, n_q, query_offset)
  if total_bias is not None:
    per_example = any(d != 1 for d in total_bias.shape[:-3])
    total_bias = full(total_bias) if form.full_bias or per_example else one(total_bias)
  allowed = _allowed_BHQK(n_q, n_k, causal, query_offset, padding_mask, mask)
  allowed = None if allowed is None else full(allowed)
  visible = None if allowed is None else jnp.any(allowed, axis=-1)
  args = flat(q), flat(k), flat(v), total_bias, allowed
  if pad_odd:
    args = _pad_to_even(*args)
  q_BQHD, k_BKHD, v_BKHD, total_bias, allowed = args
  if form.finite and (total_bias is not None or allowed is not None):
    total_bias = jnp.maximum(0.0 if total_bias is None else total_bias, FINITE_NEGATIVE)
    if allowed is not None:
      total_bias = jnp.where(allowed, total_bias, FINITE_NEGATIVE)
    allowed = None
  if total_bias is not None and form.bias_dtype == "inputs":
    total_bias = total_bias.astype(q.dtype)
  lengths = {}
  if form.seq_lengths:  # From q: under vmap they carry the member axis too.
    zero_B = jax.lax.stop_gradient(q_BQHD[:, 0, 0, 0]).astype(jnp.int32) * 0
    lengths = dict(query_seq_lengths=zero_B + q_BQHD.shape[1],
                   key_value_seq_lengths=zero_B + k_BKHD.shape[1])
  return q_BQHD, k_BKHD, v_BKHD, total_bias, allowed, lengths, visible


def _pad_to_even(q_BQHD, k_BKHD, v_BKHD, bias_BHQK, allowed_BHQK):
  """(q, k, v, bias, allowed) with even token counts, for cuDNN: it trains with a bias
  (a prior, or a hard mask, which jax turns into one) only when the query and key counts
  are even, and ViT-Tiny at 224 px has 197 tokens.

  An odd count gets one zero token more: the extra key is hidden by the mask, so every
  real query's softmax and output are unchanged and the key gets no gradient; the extra
  query sees the real keys and its output is dropped (`[:, :n_q]`), so it gets no
  gradient either. Without a bias or mask there is nothing to pad for.
  """
  if bias_BHQK is None and allowed_BHQK is None:
    return q_BQHD, k_BKHD, v_BKHD, bias_BHQK, allowed_BHQK
  n_q, n_k = q_BQHD.shape[1], k_BKHD.shape[1]
  pad_q, pad_k = n_q % 2, n_k % 2
  if not pad_q and not pad_k:
    return q_BQHD, k_BKHD, v_BKHD, bias_BHQK, allowed_BHQK
  tokens = lambda x, extra: jnp.pad(x, ((0, 0), (0, extra), (0, 0), (0, 0)))
  logits = ((0, 0), (0, 0), (0, pad_q), (0, pad_k))
  real_key_K = jnp.arange(n_k + pad_k) < n_k
  if allowed_BHQK is None:
    allowed_BHQK = jnp.broadcast_to(real_key_K, (1, 1, n_q + pad_q, n_k + pad_k))
  else:
    allowed_BHQK = jnp.pad(allowed_BHQK, logits, constant_values=True) & real_key_K
  if bias_BHQK is not None:
    bias_BHQK = jnp.pad(bias_BHQK, logits)
  return (tokens(q_BQHD, pad_q), tokens(k_BKHD, pad_k), tokens(v_BKHD, pad_k), bias_BHQK,
          allowed_BHQK)
