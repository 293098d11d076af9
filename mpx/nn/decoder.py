"""`causal_decoder`: a GPT-style pre-LN decoder whose attention carries the mask prior.

The param tree matches what `schemes.apply_scheme` writes: `pos_embed` `[N, D]` at the
top level (the QK schemes' pseudo-input), blocks `block_i/attention/{query,key}` and
`block_i/attention/mask_logits`. The prior composes with the hard causal mask, so a
prior only needs to say which *past* tokens a row should read.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from mpx import priors
from mpx.nn.transformer import TokenTransformer

DECODER_POSITIONS = ("learned", "none", "alibi")


def causal_decoder(vocab_size: int, *, width: int = 128, depth: int = 2, num_heads: int = 4,
                   head_dim: int | None = None, mlp_dim: int | None = None,
                   positions: str = "learned", tie_embeddings: bool = False,
                   init_style: str = "flax", **kwargs) -> TokenTransformer:
  """Token ids `[B, N]` → next-token logits `[B, N, V]`: the `TokenTransformer` with no
  CLS token, a per-token readout over the vocabulary and causal attention.

  Token embedding, `depth` pre-LN blocks, a final LayerNorm and a vocabulary head (the
  embedding transposed with `tie_embeddings`). positions: "learned" absolute embeddings,
  "none", or "alibi": no absolute positions and the ALiBi bias as a *frozen* mask prior in
  every layer (`priors.alibi_prior`; a learnable ALiBi-initialised prior is
  `positions="none", mask_init=priors.alibi_init`). N is fixed by the params (the
  position embedding and the mask are `[N, ...]`): apply it to inputs of the length it
  was initialised with. head_dim defaults to width // num_heads and mlp_dim to 4 · width
  (GPT); init_style "flax" is GPT-like (N(0, 0.02) embeddings, lecun normal). Other
  keyword arguments (mask_layers, per_head_mask, mask_init, learnable_mask, dtype,
  implementation) go to `TokenTransformer`.
  """
  if positions not in DECODER_POSITIONS:
    raise ValueError(f"positions={positions!r}; choose one of {DECODER_POSITIONS}.")
  if positions == "alibi":
    if "mask_init" in kwargs or kwargs.get("learnable_mask"):
      raise ValueError("positions='alibi' fixes the mask to ALiBi; for a learnable prior "
                       "use positions='none' with mask_init=priors.alibi_init.")
    kwargs.update(mask_init=priors.alibi_init, learnable_mask=False, per_head_mask=True)
    positions = "none"
  return TokenTransformer(
      vocab_size=vocab_size, width=width, depth=depth, num_heads=num_heads,
      head_dim=head_dim or width // num_heads, mlp_dim=mlp_dim or 4 * width,
      out_features=vocab_size, cls_token=False, readout="tokens", causal=True,
      positions=positions, tie_embeddings=tie_embeddings, init_style=init_style, **kwargs)


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
