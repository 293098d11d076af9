"""Flax NNX modules with a mask prior: the bias `log σ(M)` on the attention logits, with `M`
an `nnx.Param` named `mask_logits` (the name `mpx.attention.is_mask_path` recognises).

`MultiHeadAttention` is a drop-in subclass of `flax.nnx.MultiHeadAttention`: flax's own
projections, masking, dropout, dtype handling, decode cache and `sow_weights`, plus the
prior. `MaskedSelfAttention` is the NNX twin of `mpx.nn.MaskedSelfAttention` (Linen): the
same params by name and shape, so weights move between the two.

NNX creates params in `__init__`, so both take the token count(s) up front: `num_tokens`.

Imports only jax, flax and mpx's core (no optax, orbax or mpx.sweep).
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from mpx import attention as attention_lib
from mpx import priors
from mpx.nn import initializers
from mpx.nn.mha import _accepts, _bound_bias  # The Linen drop-in's tests of attention_fn.

__all__ = ["FrozenMask", "MaskedSelfAttention", "MultiHeadAttention"]


class FrozenMask(nnx.Variable):
  """A mask prior held fixed (`learnable_mask=False`).

  Not an `nnx.Param`, so `nnx.grad` and `nnx.Optimizer(..., wrt=nnx.Param)` leave it
  alone, yet `nnx.state(model)` and checkpoints still carry it under `mask_logits`. A type
  of its own, not `nnx.BatchStat`: batch statistics are state the model updates while
  training, which a frozen prior is not.
  """


def _token_counts(num_tokens) -> tuple[int, int]:
  """`N` → `(N, N)`; `(Nq, Nk)` stays; anything else raises."""
  counts = (num_tokens, num_tokens) if isinstance(num_tokens, int) else tuple(num_tokens)
  if len(counts) != 2 or not all(isinstance(n, int) and n >= 1 for n in counts):
    raise ValueError(f"num_tokens must be N (self-attention) or (Nq, Nk) (cross-attention), "
                     f"positive ints; got {num_tokens!r}.")
  return counts


# Folded into the mask's key: sets it apart from the key the `params` stream gives next.
_MASK_KEY_SALT = 0x6D7078  # "mpx"


def _mask_key(rngs: nnx.Rngs) -> jax.Array:
  """A key for `mask_init` that leaves `rngs` as it was: modules built after the attention
  then get the weights they get after flax's module, so a model with and without a prior
  can be compared from one seed.

  It is the `params` stream's next key (`fold_in(key, count)`, what `rngs.params()` would
  return) with `_MASK_KEY_SALT` folded in, read through `RngStream.key` / `.count` (flax
  0.12) without advancing the count. A flax laid out otherwise gets a fixed key: the
  built-in initialisers ignore it, but a random `mask_init` then draws one M for all seeds.
  """
  stream = rngs.params
  try:
    key = jax.random.fold_in(stream.key[...], stream.count[...])
  except (AttributeError, TypeError):
    return jax.random.key(_MASK_KEY_SALT)
  return jax.random.fold_in(key, _MASK_KEY_SALT)


def _init_mask(mask_init: Callable, key: jax.Array, shape: tuple[int, ...],
               learnable: bool) -> nnx.Variable:
  """`M` as an `nnx.Param` (learnable) or a `FrozenMask`, float32 whatever `param_dtype`:
  the prior's strengths (e.g. ±200 for neutral) must survive."""
  value = jnp.asarray(mask_init(key, shape, jnp.float32), jnp.float32)
  if value.shape != shape:
    raise ValueError(f"mask_init returned shape {value.shape}; the attention needs {shape} "
                     "([H, Nq, Nk] per head or [Nq, Nk] with per_head_mask=False).")
  return nnx.Param(value) if learnable else FrozenMask(value)


def _mask_value(mask: nnx.Variable) -> jax.Array:
  """`M`; a frozen prior also stops its gradient (as in Linen), for any `jax.grad`."""
  value = mask[...]
  return jax.lax.stop_gradient(value) if isinstance(mask, FrozenMask) else value


@dataclasses.dataclass
class _Prior:
  """The prior's bias for one attention call, and whether `PriorAttention` added it."""
  bias_HQK: jax.Array
  applied: bool = False


# The attention call in progress: set by `MultiHeadAttention.__call__` around flax's
# `__call__`, read by `PriorAttention`. A context, not a module attribute, so a call
# mutates no module (safe under nnx.jit, nnx.vmap, jax.lax.scan, threads).
_ACTIVE_PRIOR: contextvars.ContextVar[_Prior | None] = contextvars.ContextVar(
    "mpx_nnx_prior", default=None)


@dataclasses.dataclass(frozen=True)
class PriorAttention:
  """An `attention_fn` that adds the calling module's prior bias to the bias it is given.

  Internal to `MultiHeadAttention`, which wraps its `attention_fn` (flax's
  `dot_product_attention` by default) in this, so the softmax, masking, dropout and
  `sow_weights` stay that function's. Frozen and compared by value, so equal modules keep
  equal graph definitions (no recompiles).
  """
  attention_fn: Callable

  def __post_init__(self):
    if not _accepts(self.attention_fn, "bias"):  # Else the prior would be lost or misread.
      raise ValueError(
          f"attention_fn {self.attention_fn!r} takes no `bias`, which carries the prior "
          "log σ(M); give it a `bias` argument as flax.nnx.dot_product_attention has.")

  def __call__(self, query, key, value, bias=None, **kwargs):
    prior = _ACTIVE_PRIOR.get()
    if prior is None:
      raise RuntimeError("PriorAttention runs inside mpx.nnx.MultiHeadAttention.__call__; "
                         "call the module, or call its attention_fn.attention_fn directly.")
    prior.applied = True
    bias = _bound_bias(self.attention_fn) if bias is None else bias
    bias = prior.bias_HQK if bias is None else bias + prior.bias_HQK
    # By keyword: the fourth parameter of a custom function need not be `bias`.
    return self.attention_fn(query, key, value, bias=bias, **kwargs)


class MultiHeadAttention(nnx.MultiHeadAttention):
  """`flax.nnx.MultiHeadAttention` with logits `q·kᵀ/√d + log σ(M)`.

  Takes every argument of the installed `nnx.MultiHeadAttention` (`num_kv_heads` included
  where flax has it) and keeps its param names, so its checkpoints load (the mask keeps
  its init: `mpx.merge_params`). The default neutral prior computes exactly flax's
  attention. Built from the same `rngs` it draws flax's weights and leaves `rngs` as
  flax's module does, so the modules built after it get the same weights too.

  Args:
    *args, **kwargs: `nnx.MultiHeadAttention`'s.
    num_tokens: the prior's size, fixed at construction since NNX creates params eagerly:
      N for self-attention over N tokens, `(Nq, Nk)` for Nq queries over Nk keys: the
      longest inputs. A shorter call (or decoding cache) uses the prior's top-left block,
      its first positions; a longer one raises.
    mask_init: initializer `(key, shape, dtype)` for `M`, e.g.
      `mpx.priors.as_initializer(prior)`. The default `priors.neutral_init` (M = 200) is
      exactly flax's attention but has a gradient of exactly 0, so it never moves;
      `priors.learnable_neutral_init` (M = 0) is the neutral prior that learns.
    learnable_mask: False stores `M` as a `FrozenMask` instead of an `nnx.Param`.
    per_head_mask: `M` is `[num_heads, Nq, Nk]` if True, `[Nq, Nk]` shared by heads if not.
    rngs: as for flax; the mask's key is derived from `rngs.params` without drawing from it
      (`_mask_key`).

  `attention_fn` (given or flax's default; it must take `bias`, which carries the prior) is
  wrapped in `PriorAttention`, and a call that flax made without it raises. In decode mode
  the prior's row at the cache index is sliced in (traced). With `sow_weights=True` the
  attention probabilities land where flax puts them: `nnx.Intermediate`
  `attention_weights`.
  """

  def __init__(self, *args, num_tokens: int | tuple[int, int],
               mask_init: Callable = priors.neutral_init, learnable_mask: bool = True,
               per_head_mask: bool = True, rngs: nnx.Rngs, **kwargs):
    counts = _token_counts(num_tokens)  # Before flax builds anything: fail fast.
    super().__init__(*args, rngs=rngs, **kwargs)
    # What this relies on beyond flax's documented arguments: `__init__` stores the
    # attention function as `self.attention_fn` and `__call__` calls it by keyword
    # (mask=, dropout_rng=, ..., module=); `num_heads`, `decode`, and `init_cache`'s
    # `cached_key` / `cache_index` attributes.
    self.attention_fn = PriorAttention(self.attention_fn)
    self.num_tokens = counts
    self.per_head_mask = per_head_mask
    shape = ((self.num_heads,) if per_head_mask else ()) + counts
    self.mask_logits = _init_mask(mask_init, _mask_key(rngs), shape, learnable_mask)

  def __call__(self, inputs_q: jax.Array, inputs_k: jax.Array | None = None,
               inputs_v: jax.Array | None = None, **kwargs) -> jax.Array:
    """flax's `__call__` (same arguments) with the prior's bias added to the logits."""
    decode = kwargs.get("decode")
    decode = self.decode if decode is None else decode
    prior = _Prior(self._prior_bias_HQK(inputs_q, inputs_k, bool(decode)))
    token = _ACTIVE_PRIOR.set(prior)
    try:
      out = super().__call__(inputs_q, inputs_k, inputs_v, **kwargs)
    finally:
      _ACTIVE_PRIOR.reset(token)
    if not prior.applied:  # As the Linen drop-in: never a silent loss of the prior.
      raise RuntimeError(
          "flax.nnx.MultiHeadAttention did not call this module's attention_fn, so the mask "
          "prior was not applied; pass a custom attention_fn at construction, not later.")
    return out

  def _prior_bias_HQK(self, inputs_q, inputs_k, decode: bool) -> jax.Array:
    """`log σ(M)` as `[H or 1, Nq, Nk]`; in decode, the row of the current cache index."""
    bias_HQK = attention_lib.mask_bias(_mask_value(self.mask_logits))
    if not self.per_head_mask:
      bias_HQK = bias_HQK[None]
    if decode:
      if getattr(self, "cache_index", None) is None:
        return bias_HQK  # flax raises its own "cache not initialized" error first.
      # flax's cache (`init_cache`): `cached_key` [batch..., max_length, kv_heads, head_dim]
      # and `cache_index`, the position this step writes (flax increments it later).
      max_length = self.cached_key.shape[-3]
      bias_HQK = self._top_left(bias_HQK, max_length, max_length, "a decoding cache of")
      return jax.lax.dynamic_slice_in_dim(bias_HQK, self.cache_index[...], 1, axis=-2)
    n_q = inputs_q.shape[-2]
    n_k = (inputs_q if inputs_k is None else inputs_k).shape[-2]
    return self._top_left(bias_HQK, n_q, n_k, "a call with")

  def _top_left(self, bias_HQK, n_q: int, n_k: int, what: str) -> jax.Array:
    """The prior's top-left `[n_q, n_k]` block: positions 0..n−1, as a shorter sequence (or
    decoding) sees them; more positions than `num_tokens` raise."""
    if n_q > self.num_tokens[0] or n_k > self.num_tokens[1]:
      raise ValueError(
          f"num_tokens={self.num_tokens} (queries, keys) is the most this prior covers, but "
          f"{what} {n_q} queries and {n_k} keys; build the module with num_tokens="
          f"{n_q if n_q == n_k else (n_q, n_k)} or more (shorter inputs use the prior's "
          "top-left block).")
    return bias_HQK[..., :n_q, :n_k]


class MaskedSelfAttention(nnx.Module):
  """The NNX twin of `mpx.nn.MaskedSelfAttention`: the same params by name and shape
  (`query`/`key`/`value` kernels `[D, H, R]`, `out` kernel `[H, R, D]`, biases,
  `mask_logits`) and the same function, so Linen weights transplant as they are.

  Args:
    num_heads: H.
    in_features: D, the width of the tokens (Linen infers it from the input).
    num_tokens: N, the tokens the prior covers (CLS included); needed with `use_mask`.
    head_dim: R; default D // H.
    The rest: as in Linen (`mpx.nn.MaskedSelfAttention`); `learnable_mask=False` stores
    `M` as a `FrozenMask`. The mask's key does not advance `rngs` (`_mask_key`), so
    `use_mask=False` builds the same other weights from the same seed.

  `__call__(x_BND, padding_mask_BN=None, *, sow_weights=False)`; `sow_weights=True`
  records the probabilities `[B, H, N, N]` as `nnx.Intermediate` `attention_weights`.
  """

  def __init__(self, num_heads: int, in_features: int, *, num_tokens: int | None = None,
               head_dim: int | None = None, out_features: int | None = None,
               use_mask: bool = True, per_head_mask: bool = True,
               mask_init: Callable = priors.neutral_init, learnable_mask: bool = True,
               causal: bool = False, qkv_bias: bool = False, out_bias: bool = True,
               init_style: str = "torch", implementation: str = "reference",
               dtype: jnp.dtype | None = None, param_dtype: jnp.dtype = jnp.float32,
               rngs: nnx.Rngs):
    head_dim = head_dim or in_features // num_heads
    if head_dim < 1:
      raise ValueError(f"head_dim must be >= 1; width {in_features} / {num_heads} heads "
                       f"gives {head_dim}; set head_dim explicitly.")
    if use_mask and num_tokens is None:
      raise ValueError("MaskedSelfAttention needs num_tokens=N (CLS included) to create "
                       "its mask_logits; or pass use_mask=False.")
    self.in_features, self.num_tokens = in_features, num_tokens
    self.causal, self.implementation = causal, implementation

    def dense(features_in, features_out, axis, use_bias, fan_in):
      return nnx.LinearGeneral(features_in, features_out, axis=axis, use_bias=use_bias,
                               dtype=dtype, param_dtype=param_dtype, rngs=rngs,
                               **initializers.dense_inits(init_style, fan_in))

    heads = (num_heads, head_dim)
    self.query = dense(in_features, heads, -1, qkv_bias, in_features)
    self.key = dense(in_features, heads, -1, qkv_bias, in_features)
    self.value = dense(in_features, heads, -1, qkv_bias, in_features)
    shape = ((num_heads,) if per_head_mask else ()) + (num_tokens, num_tokens)
    self.mask_logits = (_init_mask(mask_init, _mask_key(rngs), shape, learnable_mask)
                        if use_mask else None)
    self.out = dense(heads, out_features or in_features, (-2, -1), out_bias,
                     num_heads * head_dim)

  def __call__(self, x_BND: jax.Array, padding_mask_BN: jax.Array | None = None, *,
               sow_weights: bool = False) -> jax.Array:
    if x_BND.ndim < 2 or x_BND.shape[-1] != self.in_features:
      raise ValueError(f"MaskedSelfAttention expects [..., N, {self.in_features}] inputs; "
                       f"got {x_BND.shape}.")
    mask = None
    if self.mask_logits is not None:
      if x_BND.shape[-2] != self.num_tokens:
        raise ValueError(f"num_tokens={self.num_tokens} but the input has "
                         f"{x_BND.shape[-2]} tokens; build with num_tokens="
                         f"{x_BND.shape[-2]}.")
      mask = _mask_value(self.mask_logits)
    q_BNHR, k_BNHR, v_BNHR = self.query(x_BND), self.key(x_BND), self.value(x_BND)
    if sow_weights:
      self.sow(nnx.Intermediate, "attention_weights", attention_lib.attention_weights(
          q_BNHR, k_BNHR, mask, causal=self.causal, padding_mask=padding_mask_BN))
    out_BNHR = attention_lib.masked_attention(
        q_BNHR, k_BNHR, v_BNHR, mask, causal=self.causal, padding_mask=padding_mask_BN,
        implementation=self.implementation)
    return self.out(out_BNHR)
