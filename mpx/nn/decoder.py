"""`CausalDecoder`: a GPT-style pre-LN decoder whose attention carries the mask prior.

The param tree matches what `schemes.apply_scheme` writes: `pos_embed` `[N, D]` at the
top level (the QK schemes' pseudo-input), blocks `block_i/attention/{query,key}` and
`block_i/attention/mask_logits`. The prior composes with the hard causal mask, so a
prior only needs to say which *past* tokens a row should read.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from mpx import priors
from mpx.nn import initializers
from mpx.nn.attention import MaskedSelfAttention
from mpx.nn.transformer import Block


class CausalDecoder(nn.Module):
  """Token ids `[B, N]` → next-token logits `[B, N, V]`.

  Token embedding + learned position embedding, `depth` pre-LN blocks with causal
  `MaskedSelfAttention`, a final LayerNorm and an untied vocabulary head. N is fixed by
  the params (the position embedding and the mask are `[N, ...]`): apply it to inputs of
  the length it was initialised with.

  Attributes:
    vocab_size: V.
    width, depth, num_heads, head_dim: D, layers, H, R (R defaults to D // H).
    mlp_dim: hidden size of the MLP; None = 4 · width (GPT).
    mask_layers: indices of the layers with a `mask_logits` param; None = all.
    per_head_mask, mask_init, learnable_mask: see `MaskedSelfAttention`.
    init_style: "flax" (GPT-like: N(0, 0.02) embeddings, lecun normal) or "torch".
  """
  vocab_size: int
  width: int = 128
  depth: int = 2
  num_heads: int = 4
  head_dim: int | None = None
  mlp_dim: int | None = None
  mask_layers: Sequence[int] | None = None
  per_head_mask: bool = True
  mask_init: Callable = priors.neutral_init
  learnable_mask: bool = True
  init_style: str = "flax"
  implementation: str = "reference"

  def _masked_layers(self) -> set[int]:
    layers = range(self.depth) if self.mask_layers is None else self.mask_layers
    bad = [i for i in layers if not 0 <= i < self.depth]
    if bad:
      raise ValueError(f"mask_layers {bad} are outside the {self.depth} layers.")
    return set(layers)

  @nn.compact
  def __call__(self, tokens_BN: jax.Array) -> jax.Array:
    masked = self._masked_layers()
    if tokens_BN.ndim != 2 or not jnp.issubdtype(tokens_BN.dtype, jnp.integer):
      raise ValueError(f"CausalDecoder takes integer token ids [B, N]; got "
                       f"{tokens_BN.dtype}{tokens_BN.shape}.")
    embed_init = (initializers.torch_embedding if self.init_style == "torch"
                  else nn.initializers.normal(0.02))
    x_BND = nn.Embed(self.vocab_size, self.width, embedding_init=embed_init,
                     name="token_embed")(tokens_BN)
    x_BND = x_BND + self.param("pos_embed", embed_init, (tokens_BN.shape[1], self.width))
    for i in range(self.depth):
      make_attention = functools.partial(
          MaskedSelfAttention, self.num_heads, self.head_dim, use_mask=i in masked,
          per_head_mask=self.per_head_mask, mask_init=self.mask_init,
          learnable_mask=self.learnable_mask, causal=True, init_style=self.init_style,
          implementation=self.implementation)
      x_BND = Block(make_attention, self.mlp_dim or 4 * self.width, self.init_style,
                    name=f"block_{i}")(x_BND)
    x_BND = nn.LayerNorm(epsilon=1e-5, name="final_norm")(x_BND)
    return nn.Dense(self.vocab_size, name="head",
                    **initializers.dense_inits(self.init_style, self.width))(x_BND)


def greedy_decode(apply_fn: Callable[[object, jax.Array], jax.Array], params,
                  prompt_tokens_BN: jax.Array, answer_len: int, *,
                  fill_token: int = 0) -> jax.Array:
  """The `answer_len` tokens `[B, A]` a causal model writes after the prompt, greedily.

  `apply_fn(params, tokens_BT) → logits_BTV` sees a fixed buffer of T = prompt + answer
  tokens at every step (future slots hold `fill_token`; the causal mask hides them), so
  the loop has static shapes: jit it, vmap it over members. No KV cache: the answers are
  a few tokens long and the full pass keeps the loop trivially correct.
  """
  if answer_len < 1:
    raise ValueError(f"answer_len must be >= 1; got {answer_len}.")
  batch, prompt_len = prompt_tokens_BN.shape
  buffer_BT = jnp.concatenate(
      [prompt_tokens_BN, jnp.full((batch, answer_len), fill_token, prompt_tokens_BN.dtype)],
      axis=1)

  def step(i, buffer_BT):
    logits_BTV = apply_fn(params, buffer_BT)
    logits_BV = jax.lax.dynamic_index_in_dim(logits_BTV, prompt_len - 1 + i, axis=1,
                                             keepdims=False)
    next_B1 = jnp.argmax(logits_BV, axis=-1).astype(buffer_BT.dtype)[:, None]
    return jax.lax.dynamic_update_slice_in_dim(buffer_BT, next_B1, prompt_len + i, axis=1)

  buffer_BT = jax.lax.fori_loop(0, answer_len, step, buffer_BT)
  return buffer_BT[:, prompt_len:]
