"""Masked attention as pure functions: logits = q·kᵀ/√d + log σ(M).

Layout follows Flax: queries `[..., N, H, D]` (batch dims, tokens, heads, head dim).
The mask parameter `M` ("mask logits") is `[N, N]` (shared by heads) or `[..., H, N, N]`
(per head, optionally with leading batch dims; `H = 1` broadcasts over heads).

`log σ(M) ≤ 0`, so a mask prior can only suppress. Causal and padding masks are *hard*
(−inf) and compose with the soft prior; a query row with no allowed key returns zeros
rather than NaN.
"""

from __future__ import annotations

import math

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


IMPLEMENTATIONS = ("reference", "jax", "cudnn")

# mpx's names for the `implementation=` values of `jax.nn.dot_product_attention`.
_FUSED_BACKENDS = {"jax": "xla", "cudnn": "cudnn"}
_CUDNN_DTYPES = (jnp.float16, jnp.bfloat16)


def mask_bias(mask_logits: Array) -> Array:
  """`log σ(M)` in float32, computed stably as `-softplus(-M)`.

  The gradient is `σ(−M)` (the paper's Theorem 1): bounded by 1 and independent of
  feature norms, which is why a mask prior moves slowly and persists.
  """
  return jax.nn.log_sigmoid(jnp.asarray(mask_logits, jnp.float32))


def _check_qkv(q: Array, k: Array, v: Array) -> None:
  if q.ndim < 3 or k.ndim != q.ndim or v.ndim != q.ndim:
    raise ValueError(
        "masked_attention expects q, k, v of the same rank >= 3 laid out "
        f"[..., tokens, heads, head_dim]; got q{q.shape}, k{k.shape}, v{v.shape}.")
  if k.shape[-2:] != q.shape[-2:]:
    raise ValueError(
        f"q and k must agree on (heads, head_dim); got q{q.shape} and k{k.shape}.")
  if v.shape[-3:-1] != k.shape[-3:-1]:
    raise ValueError(
        f"k and v must agree on (tokens, heads); got k{k.shape} and v{v.shape}.")


def _bias_BHNN(mask_logits: Array, num_heads: int, n_q: int, n_k: int) -> Array:
  """Validates the mask's shape and returns `log σ(M)` shaped `[..., H or 1, Nq, Nk]`."""
  m = jnp.asarray(mask_logits)
  if m.ndim < 2:
    raise ValueError(
        f"mask_logits must be [N, N] or [..., H, N, N]; got rank {m.ndim} {m.shape}.")
  if m.shape[-2:] != (n_q, n_k):
    raise ValueError(
        f"mask_logits ends in {m.shape[-2:]} but the attention is {n_q} queries x "
        f"{n_k} keys; build the prior for N = {n_k} tokens (CLS included).")
  if m.ndim == 2:
    m = m[None]
  elif m.shape[-3] not in (1, num_heads):
    raise ValueError(
        f"mask_logits has {m.shape[-3]} heads (shape {m.shape}) but q has "
        f"{num_heads}; use [N, N] for a mask shared by heads or stack one per head.")
  return mask_bias(m)


def _allowed_BHNN(n_q: int, n_k: int, causal: bool,
                  padding_mask: Array | None) -> Array | None:
  """The hard mask as booleans broadcastable to `[..., H, Nq, Nk]`, or None."""
  allowed = None
  if causal:
    # Query i sees keys j <= i, aligned at the end when Nq < Nk (decoding with a cache).
    q_pos = jnp.arange(n_q)[:, None] + (n_k - n_q)
    allowed = jnp.arange(n_k)[None, :] <= q_pos
  if padding_mask is not None:
    pad = jnp.asarray(padding_mask)
    if pad.dtype != jnp.bool_:
      raise ValueError(f"padding_mask must be boolean (True = real token); got {pad.dtype}.")
    if pad.ndim < 1 or pad.shape[-1] != n_k:
      raise ValueError(
          f"padding_mask must be [..., N] with N = {n_k} keys; got {pad.shape}.")
    pad = pad[..., None, None, :]
    allowed = pad if allowed is None else jnp.logical_and(allowed, pad)
  return allowed


def attention_logits(q: Array, k: Array, mask_logits: Array | None = None) -> Array:
  """`q·kᵀ/√d + log σ(M)` in float32, shaped `[..., H, Nq, Nk]`."""
  _check_qkv(q, k, k)
  q = q / jnp.sqrt(q.shape[-1]).astype(q.dtype)
  # Heads-first operands: XLA:CPU runs this batched dot ~2.5x faster forward than the
  # tokens-first einsum (`benchmarks/README.md`).
  logits = jnp.einsum("...hqd,...hkd->...hqk", jnp.swapaxes(q, -2, -3),
                      jnp.swapaxes(k, -2, -3), preferred_element_type=jnp.float32)
  if mask_logits is not None:
    logits = logits + _bias_BHNN(mask_logits, q.shape[-2], q.shape[-3], k.shape[-3])
  return logits


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


def attention_weights(q: Array, k: Array, mask_logits: Array | None = None, *,
                      causal: bool = False, padding_mask: Array | None = None) -> Array:
  """Attention probabilities `[..., H, Nq, Nk]` (float32): what the prior is shaping."""
  logits = attention_logits(q, k, mask_logits)
  allowed = _allowed_BHNN(q.shape[-3], k.shape[-3], causal, padding_mask)
  return masked_softmax(logits, allowed)


def masked_attention(q: Array, k: Array, v: Array, mask_logits: Array | None = None, *,
                     causal: bool = False, padding_mask: Array | None = None,
                     implementation: str = "reference") -> Array:
  """Attention with an additive mask prior: softmax(q·kᵀ/√d + log σ(M)) v.

  Args:
    q, k, v: `[..., N, H, D]`; any dtype, logits and softmax are float32.
    mask_logits: the prior's parameter M, `[N, N]` or `[..., H, N, N]`; None = no prior.
    causal: key j is visible to query i only if j <= i.
    padding_mask: `[..., N]` booleans, True for real key tokens.
    implementation: where the attention runs. All three compute the same function with
      the bias `log σ(M)` in float32 (a bf16 bias would move a logit near -100 by up to
      0.25) and float32 logits and softmax.
      "reference": einsum + float32 softmax, every backend and dtype.
      "jax": `jax.nn.dot_product_attention(..., implementation="xla")`, every backend
        and dtype; it accepts a bias of any dtype and adds it to float32 logits.
      "cudnn": `jax.nn.dot_product_attention(..., implementation="cudnn")`, cuDNN's
        fused flash-attention kernel: NVIDIA GPU and float16/bfloat16 q, k, v only;
        anything else raises ValueError (never a silent fallback). XLA declares the
        float32 bias to cuDNN as float32 (openxla/xla#32985; jaxlib 0.8.0 gave NaN
        gradients, jax-ml/jax#32242). cuDNN's own limits (head dim a multiple of 8,
        <= 128 before Hopper and <= 256 from it; even N when differentiated with a
        prior or hard mask) raise jax's NotImplementedError.

  Returns:
    `[..., N, H, D]` in v's dtype.
  """
  _check_qkv(q, k, v)
  if implementation in _FUSED_BACKENDS:
    if implementation == "cudnn":
      _check_cudnn(q, k, v)
    return _masked_attention_fused(q, k, v, mask_logits, causal, padding_mask,
                                   _FUSED_BACKENDS[implementation])
  if implementation != "reference":
    raise ValueError(
        f"unknown implementation {implementation!r}; choose one of {IMPLEMENTATIONS}.")
  probs = attention_weights(q, k, mask_logits, causal=causal, padding_mask=padding_mask)
  out = jnp.einsum("...hqk,...hkd->...hqd", probs.astype(v.dtype), jnp.swapaxes(v, -2, -3),
                   preferred_element_type=jnp.float32)
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


def _masked_attention_fused(q, k, v, mask_logits, causal, padding_mask, backend):
  """Routes through `jax.nn.dot_product_attention(implementation=backend)`.

  The bias stays float32: both backends take a bias of any dtype, and a bf16 bias
  would round the prior (the old behaviour of this path).
  """
  n_q, num_heads, n_k = q.shape[-3], q.shape[-2], k.shape[-3]
  batch_shape = q.shape[:-3]
  flat = lambda x: x.reshape((math.prod(batch_shape),) + x.shape[-3:])
  bias = None
  if mask_logits is not None:
    bias_BHNN = _bias_BHNN(mask_logits, num_heads, n_q, n_k)
    bias_BHNN = jnp.broadcast_to(bias_BHNN, batch_shape + (num_heads, n_q, n_k))
    bias = bias_BHNN.reshape((-1, num_heads, n_q, n_k))
  allowed = _allowed_BHNN(n_q, n_k, causal, padding_mask)
  mask = None
  if allowed is not None:
    allowed = jnp.broadcast_to(allowed, batch_shape + (num_heads, n_q, n_k))
    mask = allowed.reshape((-1, num_heads, n_q, n_k))
  out = jax.nn.dot_product_attention(flat(q), flat(k), flat(v), bias=bias, mask=mask,
                                     implementation=backend)
  if mask is not None:  # Match the reference: rows with no visible key give zeros.
    out = jnp.where(jnp.any(mask, axis=-1).transpose(0, 2, 1)[..., None], out, 0)
  return out.reshape(q.shape[:-1] + v.shape[-1:])
