"""ViT with a mask prior in chosen layers: the model of the vision family.

Images `[B, H, W, C]` → non-overlapping patches (a Conv with kernel = stride = patch) in
row-major order, an optional learned CLS token in front (token 0, the layout
`priors.window_prior` / `priors.impulse_prior` assume), learned or fixed 2-D sin-cos
positions, pre-LN blocks with stochastic depth, a final LayerNorm, then the CLS token
or the mean patch token → Linear. `vit_tiny_224` and `vit_tiny_32` are the paper's two
ViT-Tiny recipes; `grid_size` and `n_tokens` give what a mask prior must be built for.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from mpx import priors
from mpx.nn import initializers
from mpx.nn.attention import MaskedSelfAttention
from mpx.nn.transformer import Block, _layer_norm, mask_layer_set

POOLS = ("cls", "gap")
POS_EMBEDS = ("learned", "sincos2d")


def _pair(size) -> tuple[int, int]:
  return (size, size) if isinstance(size, int) else tuple(size)


def drop_path_rates(rate: float, depth: int) -> list[float]:
  """Per-layer drop-path rates rising linearly from 0 to `rate` (DeiT's schedule)."""
  return [float(r) for r in np.linspace(0.0, rate, depth)]


def posemb_sincos_2d(grid_h: int, grid_w: int, width: int,
                     temperature: float = 10_000.0) -> jax.Array:
  """Fixed `[grid_h · grid_w, width]` positions (MAE / big_vision): a quarter of the
  channels each for sin and cos of the column and of the row, at geometric frequencies
  `temperature^(−k / (width/4))`. Row-major patches, no CLS row."""
  if width % 4:
    raise ValueError(f"pos_embed='sincos2d' needs width divisible by 4; got {width}.")
  omega_F = 1.0 / temperature ** (np.arange(width // 4) / (width // 4))
  rows, cols = np.divmod(np.arange(grid_h * grid_w), grid_w)
  row_PF, col_PF = rows[:, None] * omega_F, cols[:, None] * omega_F
  pos_PD = np.concatenate([np.sin(col_PF), np.cos(col_PF), np.sin(row_PF), np.cos(row_PF)],
                          axis=1)
  return jnp.asarray(pos_PD, jnp.float32)


class ViT(nn.Module):
  """Vision transformer, images `[B, H, W, C]` (float) → logits `[B, num_classes]`.

  Attributes:
    image_size, patch_size: int or (h, w); the image must tile exactly into patches.
    channels: C of the input.
    width, depth, num_heads, head_dim, mlp_dim: ViT-Tiny is 192, 12, 3, 64, 768.
    num_classes: width of the linear head.
    pool: "cls" (a learned CLS token at position 0 is read out) or "gap" (the mean of
      the patch tokens; no CLS token).
    pos_embed: "learned" (a `pos_embed` param `[N, width]`, CLS included, the tree the
      QK schemes expect) or "sincos2d" (fixed, no param; CLS gets none).
    drop_path: stochastic-depth rate of the last block, linear from 0 in the first;
      drawn per example from the "drop_path" rng when `deterministic=False`.
    qkv_bias: biases on the Q, K, V projections (timm's ViT has them; GOTU does not).
    mask_layers, per_head_mask, mask_init, learnable_mask, implementation: as in
      `TokenTransformer`; `mask_init` sees N = `n_tokens(model)` (CLS included).
    init_style: "torch" or "flax" for the patch embedding, projections, MLP and head.
      CLS and learned positions are N(0, 0.02) in both (the ViT recipes' scale; N(0, 1)
      is the GOTU code's choice for its token model).
    dtype: compute dtype of the patch embedding, projection and MLP matmuls; params, the
      residual stream, LayerNorm, attention softmax and head stay float32.
  """
  image_size: int | Sequence[int] = 224
  patch_size: int | Sequence[int] = 16
  channels: int = 3
  width: int = 192
  depth: int = 12
  num_heads: int = 3
  head_dim: int = 64
  mlp_dim: int = 768
  num_classes: int = 1000
  pool: str = "cls"
  pos_embed: str = "learned"
  drop_path: float = 0.0
  qkv_bias: bool = True
  mask_layers: Sequence[int] | None = None
  per_head_mask: bool = True
  mask_init: Callable = priors.neutral_init
  learnable_mask: bool = True
  init_style: str = "torch"
  implementation: str = "reference"
  dtype: Any = None

  def _check_config(self) -> set[int]:
    if self.pool not in POOLS:
      raise ValueError(f"pool={self.pool!r}; choose one of {POOLS}.")
    if self.pos_embed not in POS_EMBEDS:
      raise ValueError(f"pos_embed={self.pos_embed!r}; choose one of {POS_EMBEDS}.")
    if not 0.0 <= self.drop_path < 1.0:
      raise ValueError(f"drop_path must be in [0, 1); got {self.drop_path}.")
    grid_size(self)
    return mask_layer_set(self.mask_layers, self.depth)

  def _check_images(self, images_BHWC):
    expected = _pair(self.image_size) + (self.channels,)
    if images_BHWC.ndim != 4 or tuple(images_BHWC.shape[1:]) != expected:
      raise ValueError(f"ViT takes images [B, H, W, C] = [B, {', '.join(map(str, expected))}]"
                       f"; got shape {tuple(images_BHWC.shape)}.")
    if not jnp.issubdtype(images_BHWC.dtype, jnp.floating):
      raise ValueError(f"ViT takes float images; got {images_BHWC.dtype} (convert and "
                       "normalise uint8 pixels first).")

  @nn.compact
  def __call__(self, images_BHWC: jax.Array, deterministic: bool = True) -> jax.Array:
    masked_layers = self._check_config()
    self._check_images(images_BHWC)
    grid_h, grid_w = grid_size(self)
    patch = _pair(self.patch_size)
    x_BhwD = nn.Conv(self.width, patch, strides=patch, padding="VALID", dtype=self.dtype,
                     name="patch_embed",
                     **initializers.dense_inits(self.init_style,
                                                patch[0] * patch[1] * self.channels))(
        images_BHWC)
    x_BND = x_BhwD.reshape(x_BhwD.shape[0], grid_h * grid_w, self.width)
    x_BND = x_BND.astype(jnp.float32)  # Row-major patches; the residual stream is f32.

    embed_init = nn.initializers.normal(0.02)
    if self.pool == "cls":
      cls = self.param("cls", embed_init, (1, 1, self.width))
      x_BND = jnp.concatenate([jnp.broadcast_to(cls, (x_BND.shape[0], 1, self.width)),
                               x_BND], axis=1)
    if self.pos_embed == "learned":
      x_BND = x_BND + self.param("pos_embed", embed_init, (n_tokens(self), self.width))
    else:
      x_BND = x_BND + position_embedding(self)

    for i, rate in enumerate(drop_path_rates(self.drop_path, self.depth)):
      make_attention = functools.partial(
          MaskedSelfAttention, self.num_heads, self.head_dim, use_mask=i in masked_layers,
          per_head_mask=self.per_head_mask, mask_init=self.mask_init,
          learnable_mask=self.learnable_mask, qkv_bias=self.qkv_bias,
          init_style=self.init_style, implementation=self.implementation, dtype=self.dtype)
      x_BND = Block(make_attention, self.mlp_dim, self.init_style, self.dtype, rate,
                    name=f"block_{i}")(x_BND, None, deterministic)

    x_BND = _layer_norm("final_norm")(x_BND)
    x_BD = x_BND[:, 0] if self.pool == "cls" else jnp.mean(x_BND, axis=1)
    return nn.Dense(self.num_classes, name="head",
                    **initializers.dense_inits(self.init_style, self.width))(x_BD)


def grid_size(model: ViT) -> tuple[int, int]:
  """`(grid_h, grid_w)`: the patch grid, what `priors.window_prior` and
  `priors.impulse_prior` take."""
  (h, w), (ph, pw) = _pair(model.image_size), _pair(model.patch_size)
  if min(h, w, ph, pw) < 1 or h % ph or w % pw:
    raise ValueError(f"image_size {h}x{w} must be a positive multiple of patch_size "
                     f"{ph}x{pw}.")
  return h // ph, w // pw


def n_tokens(model: ViT) -> int:
  """N of the attention (and of its mask): the patches, plus CLS when pool="cls"."""
  grid_h, grid_w = grid_size(model)
  return grid_h * grid_w + int(model.pool == "cls")


def position_embedding(model: ViT, params=None) -> jax.Array:
  """`[N, D]` float32: the positions the first block's input carries (CLS included).

  The `pos_embed` param for pos_embed="learned" (`params` required), else the fixed
  sin-cos grid with a zero row in front for a CLS token. The QK schemes fit their
  pseudo-input on this, so none of them assumes a param the model may lack.
  """
  if model.pos_embed == "learned":
    if params is None or "pos_embed" not in params:
      raise ValueError("pos_embed='learned' positions live in the params; pass the "
                       "model's params (with a top-level 'pos_embed').")
    return jnp.asarray(params["pos_embed"], jnp.float32)
  pos_ND = posemb_sincos_2d(*grid_size(model), model.width)
  return jnp.pad(pos_ND, ((1, 0), (0, 0))) if model.pool == "cls" else pos_ND


def vit_tiny_224(num_classes: int, **overrides) -> ViT:
  """Recipe (a): 224 px, patch 16 (14×14 = 196 patches + CLS), CLS readout, learned
  positions, drop-path 0.1; ViT-Tiny widths."""
  config = dict(image_size=224, patch_size=16, width=192, depth=12, num_heads=3,
                head_dim=64, mlp_dim=768, pool="cls", pos_embed="learned", drop_path=0.1)
  return ViT(num_classes=num_classes, **{**config, **overrides})


def vit_tiny_32(num_classes: int, **overrides) -> ViT:
  """Recipe (b): 32 px, patch 2 (16×16 = 256 tokens), global average pooling, fixed 2-D
  sin-cos positions; ViT-Tiny widths."""
  config = dict(image_size=32, patch_size=2, width=192, depth=12, num_heads=3,
                head_dim=64, mlp_dim=768, pool="gap", pos_embed="sincos2d")
  return ViT(num_classes=num_classes, **{**config, **overrides})
