"""The GOTU TokenTransformer (Abbe et al. 2023) with a mask prior in chosen layers.

One token per input symbol, a learned CLS token in front, learned absolute position
embeddings, pre-LayerNorm blocks, readout LayerNorm(CLS) → Linear. With
`init_style="torch"` every parameter is drawn as PyTorch draws it in the GOTU code,
because the baselines' collapse onto the min-degree interpolator depends on init scales.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import linen as nn

from mpx import priors
from mpx.nn import initializers
from mpx.nn.attention import MaskedSelfAttention

READOUTS = ("cls", "tokens")
POSITIONS = ("learned", "none")


class Mlp(nn.Module):
  hidden: int
  init_style: str = "torch"
  dtype: Any = None  # Matmul compute dtype; params stay float32.

  @nn.compact
  def __call__(self, x):
    width = x.shape[-1]
    kw = lambda fan_in: initializers.dense_inits(self.init_style, fan_in)
    x = nn.Dense(self.hidden, dtype=self.dtype, name="fc1", **kw(width))(x)
    x = nn.gelu(x, approximate=False)  # PyTorch nn.GELU() is the exact erf form.
    return nn.Dense(width, dtype=self.dtype, name="fc2", **kw(self.hidden))(x)


def _layer_norm(name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=1e-5, name=name)  # PyTorch's default eps.


def drop_path(x_BND: jax.Array, rate: float, key: jax.Array) -> jax.Array:
  """Stochastic depth: zero a residual branch for a `rate` share of the examples and
  scale the rest by 1 / (1 − rate), so its expectation is unchanged."""
  keep = 1.0 - rate
  keep_B11 = jax.random.bernoulli(key, keep, (x_BND.shape[0],) + (1,) * (x_BND.ndim - 1))
  return jnp.where(keep_B11, x_BND / keep, jnp.zeros_like(x_BND))


def mask_layer_set(mask_layers: Sequence[int] | None, depth: int) -> set[int]:
  """The layers that carry a `mask_logits` leaf (None = all), checked against `depth`."""
  layers = range(depth) if mask_layers is None else mask_layers
  bad = [i for i in layers if not 0 <= i < depth]
  if bad:
    raise ValueError(f"mask_layers {bad} are outside the {depth} layers.")
  return set(layers)


class Block(nn.Module):
  """Pre-LN block: x + Attn(LN(x)), then x + MLP(LN(x)).

  `make_attention` is a configured constructor (`functools.partial(MaskedSelfAttention,
  ...)`) so a model can give each layer its own mask settings. `drop_path` > 0 drops each
  residual branch per example (the "drop_path" rng) unless `deterministic`.
  """
  make_attention: Callable[..., MaskedSelfAttention]
  mlp_dim: int
  init_style: str = "torch"
  dtype: Any = None
  drop_path: float = 0.0

  def _branch(self, branch_BND, deterministic: bool):
    if deterministic or self.drop_path == 0.0:
      return branch_BND
    return drop_path(branch_BND, self.drop_path, self.make_rng("drop_path"))

  @nn.compact
  def __call__(self, x_BND, padding_mask_BN=None, deterministic: bool = True):
    attention = self.make_attention(name="attention")
    x_BND = x_BND + self._branch(
        attention(_layer_norm("attention_norm")(x_BND), padding_mask_BN), deterministic)
    mlp = Mlp(self.mlp_dim, self.init_style, self.dtype, name="mlp")
    return x_BND + self._branch(mlp(_layer_norm("mlp_norm")(x_BND)), deterministic)


class TokenTransformer(nn.Module):
  """Transformer over token ids `[B, n]` → `[B, out_features]` (CLS readout) or
  `[B, N, out_features]` (per-token readout, e.g. a causal LM).

  Attributes:
    vocab_size: 2 for Boolean inputs (see `mpx.tasks.boolean.tokens`).
    width, depth, num_heads, head_dim, mlp_dim: the GOTU model is 256, 12, 6, 64, 256.
    out_features: 1 for the Boolean regression.
    cls_token: prepend a learned CLS token (token 0).
    readout: "cls" or "tokens".
    mask_layers: indices of the layers that carry a `mask_logits` param; None = all.
    per_head_mask, mask_init, learnable_mask: see `MaskedSelfAttention`. `mask_init`
      sees the full sequence length N (CLS included).
    causal: hard causal attention (LM use).
    positions: "learned" (a `pos_embed` param `[N, D]`) or "none" (no absolute positions:
      order comes only from the causal mask and a prior, as with ALiBi).
    tie_embeddings: the per-token readout is the token embedding transposed (no `head`
      param); readout="tokens" with out_features = vocab_size only.
    dtype: compute dtype of the projection and MLP matmuls (e.g. `jnp.bfloat16` on GPU);
      None = float32. Params, the residual stream, LayerNorm, the attention logits and
      softmax, and the readout stay float32.
  """
  vocab_size: int = 2
  width: int = 256
  depth: int = 12
  num_heads: int = 6
  head_dim: int = 64
  mlp_dim: int = 256
  out_features: int = 1
  cls_token: bool = True
  readout: str = "cls"
  mask_layers: Sequence[int] | None = None
  per_head_mask: bool = True
  mask_init: Callable = priors.neutral_init
  learnable_mask: bool = True
  causal: bool = False
  positions: str = "learned"
  tie_embeddings: bool = False
  init_style: str = "torch"
  implementation: str = "reference"
  dtype: Any = None

  def _check_config(self):
    if self.readout not in READOUTS:
      raise ValueError(f"readout={self.readout!r}; choose one of {READOUTS}.")
    if self.readout == "cls" and not self.cls_token:
      raise ValueError("readout='cls' needs cls_token=True.")
    if self.positions not in POSITIONS:
      raise ValueError(f"positions={self.positions!r}; choose one of {POSITIONS}.")
    if self.tie_embeddings and (self.readout != "tokens"
                                or self.out_features != self.vocab_size):
      raise ValueError("tie_embeddings reads tokens out through the token embedding: it "
                       "needs readout='tokens' and out_features == vocab_size.")
    return mask_layer_set(self.mask_layers, self.depth)

  @nn.compact
  def __call__(self, tokens_BN: jax.Array, padding_mask_BN: jax.Array | None = None):
    masked_layers = self._check_config()
    if tokens_BN.ndim != 2 or not jnp.issubdtype(tokens_BN.dtype, jnp.integer):
      raise ValueError(f"TokenTransformer takes integer token ids [B, n]; got "
                       f"{tokens_BN.dtype}{tokens_BN.shape} (Boolean ±1 inputs: use "
                       "mpx.tasks.boolean.tokens).")
    embed_init = (initializers.torch_embedding if self.init_style == "torch"
                  else nn.initializers.normal(0.02))
    token_embed = nn.Embed(self.vocab_size, self.width, embedding_init=embed_init,
                           name="token_embed")
    x_BND = token_embed(tokens_BN)
    if self.cls_token:
      cls = self.param("cls", embed_init, (1, 1, self.width))
      x_BND = jnp.concatenate([jnp.broadcast_to(cls, (x_BND.shape[0], 1, self.width)),
                               x_BND], axis=1)
      if padding_mask_BN is not None:
        padding_mask_BN = jnp.pad(padding_mask_BN, ((0, 0), (1, 0)), constant_values=True)
    if self.positions == "learned":
      x_BND = x_BND + self.param("pos_embed", embed_init, (x_BND.shape[1], self.width))

    for i in range(self.depth):
      make_attention = functools.partial(
          MaskedSelfAttention, self.num_heads, self.head_dim, use_mask=i in masked_layers,
          per_head_mask=self.per_head_mask, mask_init=self.mask_init,
          learnable_mask=self.learnable_mask, causal=self.causal,
          init_style=self.init_style, implementation=self.implementation, dtype=self.dtype)
      x_BND = Block(make_attention, self.mlp_dim, self.init_style, self.dtype,
                    name=f"block_{i}")(
          x_BND, padding_mask_BN)

    x_BND = _layer_norm("final_norm")(x_BND)
    if self.readout == "cls":
      x_BND = x_BND[:, 0]
    if self.tie_embeddings:
      return token_embed.attend(x_BND)
    return nn.Dense(self.out_features, name="head",
                    **initializers.dense_inits(self.init_style, self.width))(x_BND)
