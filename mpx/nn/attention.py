"""`MaskedSelfAttention`: multi-head self-attention whose params hold the prior `M`."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import linen as nn

from mpx import attention as attention_lib
from mpx import priors
from mpx.nn import initializers


class MaskedSelfAttention(nn.Module):
  """Self-attention with logits `q·kᵀ/√d + log σ(M)`; `M` is the param `mask_logits`.

  The mask is an ordinary param leaf, so priors are values written into the tree and
  schemes with different priors share one pytree structure (and one compiled program).

  Attributes:
    num_heads: H.
    head_dim: R, independent of the width (the GOTU model is 6 × 64 at width 256).
    use_mask: whether this layer has a `mask_logits` param at all.
    per_head_mask: `[H, N, N]` if True, `[N, N]` shared by heads if False.
    mask_init: Flax initializer for `M` (`priors.as_initializer(prior)`); the default
      neutral prior gives exactly standard attention.
    learnable_mask: False freezes `M` (its gradient is stopped).
    causal: hard causal mask, composed with the prior.
    qkv_bias / out_bias: biases of the projections.
    init_style: "torch" (PyTorch nn.Linear defaults) or "flax" (lecun normal, zeros).
    implementation: passed to `mpx.masked_attention`.

  Applied with `mutable=["intermediates"]`, it also records its attention probabilities
  `[B, H, N, N]` as `intermediates/.../attention_weights` (see `mpx.diagnostics`).
  """
  num_heads: int
  head_dim: int | None = None
  out_features: int | None = None
  use_mask: bool = True
  per_head_mask: bool = True
  mask_init: Callable = priors.neutral_init
  learnable_mask: bool = True
  causal: bool = False
  qkv_bias: bool = False
  out_bias: bool = True
  init_style: str = "torch"
  implementation: str = "reference"
  dtype: jnp.dtype | None = None
  param_dtype: jnp.dtype = jnp.float32

  def _dense(self, features, axis, use_bias, fan_in, name):
    return nn.DenseGeneral(features, axis=axis, use_bias=use_bias, dtype=self.dtype,
                           param_dtype=self.param_dtype, name=name,
                           **initializers.dense_inits(self.init_style, fan_in))

  @nn.compact
  def __call__(self, x_BND: jax.Array, padding_mask_BN: jax.Array | None = None) -> jax.Array:
    if x_BND.ndim < 2:
      raise ValueError(f"MaskedSelfAttention expects [..., N, D] inputs; got {x_BND.shape}.")
    n_tokens, width = x_BND.shape[-2], x_BND.shape[-1]
    head_dim = self.head_dim or width // self.num_heads
    if head_dim < 1:
      raise ValueError(f"head_dim must be >= 1; width {width} / {self.num_heads} heads gives "
                       f"{head_dim}; set head_dim explicitly.")
    qkv = lambda name: self._dense((self.num_heads, head_dim), -1, self.qkv_bias, width, name)
    q_BNHR, k_BNHR, v_BNHR = (qkv("query")(x_BND), qkv("key")(x_BND), qkv("value")(x_BND))

    mask = None
    if self.use_mask:
      shape = (n_tokens, n_tokens)
      if self.per_head_mask:
        shape = (self.num_heads,) + shape
      mask = self.param(attention_lib.MASK_LEAF, self.mask_init, shape, jnp.float32)
      if not self.learnable_mask:
        mask = jax.lax.stop_gradient(mask)

    if self.is_mutable_collection("intermediates"):  # Only when asked: diagnostics.
      self.sow("intermediates", "attention_weights", attention_lib.attention_weights(
          q_BNHR, k_BNHR, mask, causal=self.causal, padding_mask=padding_mask_BN))
    out_BNHR = attention_lib.masked_attention(
        q_BNHR, k_BNHR, v_BNHR, mask, causal=self.causal, padding_mask=padding_mask_BN,
        implementation=self.implementation)
    out = self._dense(self.out_features or width, (-2, -1), self.out_bias,
                      self.num_heads * head_dim, "out")
    return out(out_BNHR)
