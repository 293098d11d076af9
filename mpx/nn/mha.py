"""`MultiHeadDotProductAttention`: Flax's attention module with a mask prior `M`.

A drop-in for `flax.linen.MultiHeadDotProductAttention`: the same constructor, call
signature and param names, plus the param `mask_logits`. The attention itself is Flax's
(its masking, dropout, dtype handling, decoding cache and `sow_weights`); the prior
reaches it as the additive `bias = log σ(M)` of its `attention_fn`.

Flax's public API used: subclassing, `dataclasses.fields` of its module (to forward
every constructor argument, whatever the version), `nn.share_scope` (so the wrapped Flax
module's params sit at our path), and the `attention_fn` protocol (keyword arguments
filtered by its signature, `module=` with `sow_weights=True`). Flax internals relied on:
the names of the decoding cache, `cache/cached_key` (its length is the cache length) and
`cache/cache_index` (read before Flax advances it), and that the module calls its
`attention_fn` (checked on every call: a Flax that bypassed it raises, never a silent
loss of the prior).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from mpx import attention as attention_lib
from mpx import priors

Array = jax.Array


def _accepts(fn: Callable, name: str) -> bool:
  """Whether `fn` takes a keyword `name` (by name or through `**kwargs`)."""
  params = inspect.signature(fn).parameters
  return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _bound_bias(fn: Callable) -> Array | None:
  """The default of `fn`'s `bias` (`functools.partial(fn, bias=b)` binds one), or None: a
  prior passed as `bias=` would otherwise replace it."""
  bound = inspect.signature(fn).parameters.get("bias")
  return None if bound is None or bound.default is bound.empty else bound.default


def _with_prior(attention_fn: Callable, bias_HQK: Array, calls: list) -> Callable:
  """`attention_fn` with `log σ(M)` (float32) added to whatever bias it receives.

  That includes a bias bound as its default (`_bound_bias`). `functools.wraps` keeps
  `attention_fn`'s signature visible, so Flax passes it the keyword arguments it would pass
  it unwrapped. Each call is appended to `calls`.
  """
  bound = _bound_bias(attention_fn)

  @functools.wraps(attention_fn)
  def attend(query, key, value, bias=bound, **kwargs):
    shape_BHQK = query.shape[:-3] + (query.shape[-2], query.shape[-3], key.shape[-3])
    prior_BHQK = jnp.broadcast_to(bias_HQK, shape_BHQK)
    bias = prior_BHQK if bias is None else bias + prior_BHQK
    calls.append(attention_fn)
    return attention_fn(query, key, value, bias=bias, **kwargs)

  return attend


def _flax_fields(module: nn.MultiHeadDotProductAttention) -> dict[str, Any]:
  """The values of every constructor argument Flax's module has, whatever its version."""
  names = (f.name for f in dataclasses.fields(nn.MultiHeadDotProductAttention)
           if f.init and f.name not in ("parent", "name"))
  return {name: getattr(module, name) for name in names}


class MultiHeadDotProductAttention(nn.MultiHeadDotProductAttention):
  """`flax.linen.MultiHeadDotProductAttention` with logits `q·kᵀ/√d + log σ(M)`.

  Swap it in for Flax's module to give an existing model a mask prior: every
  argument of Flax's module works, the params keep their names (`query`, `key`,
  `value`, `out`, and `query_ln` / `key_ln` with `normalize_qk`) and gain `mask_logits`
  at the module's top level, so `mpx.merge_params` loads checkpoints of the Flax model.
  With the default neutral prior (`log σ(200) = 0`) it computes Flax's attention, and
  never learns (see `mask_init`).

  The prior is positional: `M` is shaped from the inputs at init, `[H, Nq, Nk]` (or
  `[Nq, Nk]`): init with the longest inputs. A shorter input uses the prior's top-left
  block (its first positions); a longer one raises. With `decode=True`, init with the
  full-length input (as Flax's cache is built); each one-token step then uses the prior's
  row at the cache index.

  Attributes (besides all of Flax's):
    mask_init: Flax initializer of `M`, e.g. `mpx.priors.as_initializer(prior)`. The
      default `priors.neutral_init` (M = 200) gives exactly Flax's attention logits but a
      gradient of exactly 0, so it never moves; `priors.learnable_neutral_init` (M = 0) is
      the neutral prior that learns. `M` is float32 whatever `param_dtype` is: a bf16 `M`
      would round the prior.
    learnable_mask: False freezes `M` (its gradient is stopped). Weight decay still reaches
      it: give the optimizer's decay `mask=mpx.not_masks`.
    per_head_mask: `[H, Nq, Nk]`, one prior per head, if True; one `[Nq, Nk]` shared by
      the heads if False.

  As in Flax, the attention probabilities are recorded, as `intermediates/.../
  attention_weights`, only when called with `sow_weights=True` (and applied with a mutable
  `intermediates`); `mpx.diagnostics.attention_maps` does both for a model left unedited.
  """
  mask_init: Callable = priors.neutral_init
  learnable_mask: bool = True
  per_head_mask: bool = True

  @nn.compact
  def __call__(self, inputs_q: Array, inputs_k: Array | None = None,
               inputs_v: Array | None = None, *, inputs_kv: Array | None = None,
               mask: Array | None = None, deterministic: bool | None = None,
               dropout_rng: Array | None = None, sow_weights: bool = False,
               **flax_kwargs):
    """Flax's `__call__` (same arguments; newer ones pass through `flax_kwargs`)."""
    if not _accepts(self.attention_fn, "bias"):
      raise ValueError(
          f"attention_fn {self.attention_fn!r} takes no `bias`, which carries the prior "
          "log σ(M); give it a `bias` argument as flax.linen.dot_product_attention has.")
    keys = inputs_kv if inputs_kv is not None else inputs_k
    bias_HQK = self._prior_bias(inputs_q.shape[-2],
                                (inputs_q if keys is None else keys).shape[-2])
    calls = []  # Filled by the wrapped attention_fn: proof that the prior was applied.
    fields = _flax_fields(self)
    fields["attention_fn"] = _with_prior(self.attention_fn, bias_HQK, calls)
    flax_attention = nn.MultiHeadDotProductAttention(**fields)
    nn.share_scope(self, flax_attention)  # Its params are ours: Flax's names, our path.
    if inputs_kv is not None:  # Only then: Flax deprecates it, a later one may drop it.
      flax_kwargs["inputs_kv"] = inputs_kv
    out = flax_attention(inputs_q, inputs_k, inputs_v, mask=mask,
                         deterministic=deterministic, dropout_rng=dropout_rng,
                         sow_weights=sow_weights, **flax_kwargs)
    if not calls:
      raise RuntimeError(
          "flax.linen.MultiHeadDotProductAttention did not call its attention_fn, so the "
          "mask prior was not applied; turn off the Flax option that bypasses attention_fn.")
    return out

  def _prior_bias(self, n_q: int, n_k: int) -> Array:
    """`log σ(M)` for this call: `[H or 1, Nq, Nk]`, or its cache-index row when decoding."""
    decoding_step = self.decode and self.has_variable("cache", "cached_key")
    if decoding_step:  # A one-token step: M was built for the cache length N.
      n_q = n_k = self.get_variable("cache", "cached_key").shape[-3]
    elif self.decode and n_q != n_k:
      raise ValueError(
          f"decode=True caches self-attention; init with one length for queries and keys "
          f"(the cache length), not {n_q} queries and {n_k} keys.")
    shape = (n_q, n_k)
    if self.per_head_mask:
      shape = (self.num_heads,) + shape
    stored = self._stored_mask_shape(shape)
    mask_logits = self.param(attention_lib.MASK_LEAF, self.mask_init, stored, jnp.float32)
    if not self.learnable_mask:
      mask_logits = jax.lax.stop_gradient(mask_logits)
    mask_logits = mask_logits[..., :n_q, :n_k]  # A shorter input: the top-left block.
    if decoding_step:
      index = self.get_variable("cache", "cache_index")  # Before Flax advances it.
      mask_logits = jax.lax.dynamic_slice_in_dim(mask_logits, index, 1, axis=-2)
    bias = attention_lib.mask_bias(mask_logits)
    return bias if self.per_head_mask else bias[None]

  def _stored_mask_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of `M`: the stored one when applying (a shorter input reads its top-left
    block), else `shape`. Longer inputs, or another `per_head_mask`, raise plainly."""
    if not self.has_variable("params", attention_lib.MASK_LEAF):
      return shape
    stored = tuple(self.get_variable("params", attention_lib.MASK_LEAF).shape)
    if len(stored) != len(shape) or (len(shape) == 3 and stored[0] != shape[0]):
      raise ValueError(
          f"mask_logits is {stored} but per_head_mask={self.per_head_mask} with "
          f"{self.num_heads} heads needs {shape}; set per_head_mask as at init.")
    if shape[-2] > stored[-2] or shape[-1] > stored[-1]:
      raise ValueError(
          f"mask_logits is {stored}: the prior covers at most {stored[-2]} queries x "
          f"{stored[-1]} keys, but these inputs have {shape[-2]} x {shape[-1]}; init the "
          "model with the longest inputs (shorter ones use the prior's top-left block).")
    return stored
