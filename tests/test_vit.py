"""The ViT: shapes, where `mask_logits` lives, positions, stochastic depth, priors that fit."""

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from mpx import diagnostics, inits, priors, schemes
from mpx.nn import Block, MaskedSelfAttention, ViT, grid_size, n_tokens, vit_tiny_32, vit_tiny_224
from mpx.nn import transformer
from mpx.nn import vit as vit_lib

B, PX, C, CLASSES = 3, 8, 3, 5


def _small(**kw):
  config = dict(image_size=PX, patch_size=2, channels=C, width=16, depth=2, num_heads=2,
                head_dim=8, mlp_dim=32, num_classes=CLASSES)
  return ViT(**{**config, **kw})


def _images(seed=0, batch=B):
  return jax.random.normal(jax.random.key(seed), (batch, PX, PX, C))


def _init(model, images=None):
  return model.init(jax.random.key(0), _images() if images is None else images)["params"]


def _mask_paths(params):
  flat = flax.traverse_util.flatten_dict(params)
  return sorted("/".join(k) for k in flat if k[-1] == "mask_logits")


def _n_params(tree):
  return sum(int(np.prod(p.shape)) for p in jax.tree_util.tree_leaves(tree))


@pytest.mark.parametrize("pool,pos_embed", [("cls", "learned"), ("gap", "sincos2d"),
                                            ("cls", "sincos2d")])
def test_output_shape_both_pools(pool, pos_embed):
  model = _small(pool=pool, pos_embed=pos_embed)
  params = _init(model)
  chex.assert_shape(model.apply({"params": params}, _images(1)), (B, CLASSES))
  assert grid_size(model) == (4, 4)
  assert n_tokens(model) == 16 + (pool == "cls")
  assert ("cls" in params) == (pool == "cls")
  chex.assert_shape(params["patch_embed"]["kernel"], (2, 2, C, 16))


def test_patches_are_row_major_tokens_after_cls():
  """Token 1 + r·grid_w + c is patch (r, c): the layout the vision priors assume."""
  model = _small()
  params = _init(model)
  params = dict(params, pos_embed=jnp.zeros_like(params["pos_embed"]))
  images = _images(1)
  _, state = model.apply({"params": params}, images, capture_intermediates=True,
                         mutable=["intermediates"])
  normed_BND = state["intermediates"]["block_0"]["attention_norm"]["__call__"][0]
  kernel, bias = params["patch_embed"]["kernel"], params["patch_embed"]["bias"]
  for r, c in ((0, 1), (1, 0), (3, 2)):
    token_BD = jnp.einsum("bhwc,hwcd->bd", images[:, 2 * r:2 * r + 2, 2 * c:2 * c + 2],
                          kernel) + bias
    mean, var = token_BD.mean(-1, keepdims=True), token_BD.var(-1, keepdims=True)
    np.testing.assert_allclose(normed_BND[:, 1 + 4 * r + c],
                               (token_BD - mean) / np.sqrt(var + 1e-5), atol=1e-4)
  cls_D = params["cls"][0, 0]
  np.testing.assert_allclose(normed_BND[0, 0], (cls_D - cls_D.mean()) /
                             np.sqrt(cls_D.var() + 1e-5), atol=1e-4)


def test_mask_leaf_in_every_masked_layer_and_nowhere_else():
  everywhere = _init(_small())
  assert _mask_paths(everywhere) == ["block_0/attention/mask_logits",
                                     "block_1/attention/mask_logits"]
  chex.assert_shape(everywhere["block_0"]["attention"]["mask_logits"], (2, 17, 17))
  chosen = _init(_small(mask_layers=(1,), per_head_mask=False, pool="gap"))
  assert _mask_paths(chosen) == ["block_1/attention/mask_logits"]
  chex.assert_shape(chosen["block_1"]["attention"]["mask_logits"], (16, 16))
  assert _mask_paths(_init(_small(mask_layers=()))) == []


def test_sincos2d_is_fixed_and_varies_over_positions():
  learned = _init(_small(pos_embed="learned"))
  chex.assert_shape(learned["pos_embed"], (17, 16))
  fixed = _small(pos_embed="sincos2d", pool="gap")
  assert "pos_embed" not in _init(fixed)
  pos_PD = np.asarray(vit_lib.posemb_sincos_2d(4, 4, 16))
  chex.assert_shape(pos_PD, (16, 16))
  distances = np.linalg.norm(pos_PD[:, None] - pos_PD[None], axis=-1)
  assert distances[~np.eye(16, dtype=bool)].min() > 0.1   # every position is distinct.
  # A constant image gives identical patch tokens, so only the positions can make the
  # first layer's attention anything but uniform.
  flat = jnp.ones((1, PX, PX, C))
  maps = diagnostics.attention_maps(fixed.apply, _init(fixed, flat), flat)
  assert float(jnp.abs(maps["block_0"] - 1 / 16).max()) > 1e-3


def test_recipe_param_counts():
  D, H, R, MLP, DEPTH = 192, 3, 64, 768, 12
  block = (2 * 2 * D                                  # attention_norm, mlp_norm
           + 3 * (D * H * R + H * R)                  # query, key, value (with bias)
           + H * R * D + D                            # out projection
           + D * MLP + MLP + MLP * D + D)             # fc1, fc2
  tail = 2 * D                                        # final_norm

  def count(model, px):
    shapes = jax.eval_shape(model.init, jax.random.key(0),
                            jax.ShapeDtypeStruct((1, px, px, 3), jnp.float32))["params"]
    flat = flax.traverse_util.flatten_dict(shapes)
    mask = sum(int(np.prod(v.shape)) for k, v in flat.items() if k[-1] == "mask_logits")
    return _n_params(shapes) - mask, mask

  n = 14 * 14 + 1
  weights, mask = count(vit_tiny_224(1000), 224)
  assert weights == (16 * 16 * 3 * D + D         # patch_embed
                     + n * D + D                 # pos_embed (CLS included), cls
                     + DEPTH * block + tail
                     + D * 1000 + 1000)          # head
  assert weights == 5_717_416                    # timm's vit_tiny_patch16_224.
  assert mask == DEPTH * H * n * n

  n = 16 * 16
  weights, mask = count(vit_tiny_32(10), 32)
  assert weights == (2 * 2 * 3 * D + D           # patch_embed; no pos_embed, no cls
                     + DEPTH * block + tail + D * 10 + 10)
  assert mask == DEPTH * H * n * n


def test_drop_path_is_per_example_and_only_when_not_deterministic():
  model = _small(drop_path=0.5)
  params = {"params": _init(model)}
  same = jnp.broadcast_to(_images(1, batch=1), (8, PX, PX, C))
  apply = jax.jit(lambda x, key, deterministic: model.apply(
      params, x, deterministic, rngs={"drop_path": key}), static_argnums=2)
  key0, key1 = jax.random.key(0), jax.random.key(1)
  np.testing.assert_array_equal(apply(same, key0, True), apply(same, key1, True))
  out0 = apply(same, key0, False)
  np.testing.assert_array_equal(out0, apply(same, key0, False))
  assert not np.allclose(out0, apply(same, key1, False))
  distinct = {tuple(np.round(np.asarray(row), 4)) for row in out0}
  assert len(distinct) > 1   # per example: one batch of equal images, mixed draws.
  assert not np.allclose(out0, apply(same, key0, True))
  # Rate 0 draws nothing: identical to deterministic.
  plain = _small(drop_path=0.0)
  np.testing.assert_array_equal(
      plain.apply(params, same, False, rngs={"drop_path": key1}), plain.apply(params, same))
  # Kept branches are scaled by 1 / (1 - rate): the expectation is unchanged.
  kept = transformer.drop_path(jnp.ones((4000, 1, 1)), 0.25, key0)
  np.testing.assert_allclose(np.unique(kept), [0.0, 1 / 0.75], rtol=1e-6)
  assert abs(float(kept.mean()) - 1.0) < 0.05
  assert vit_lib.drop_path_rates(0.1, 3) == pytest.approx([0.0, 0.05, 0.1])


def test_block_without_drop_path_is_unchanged():
  """Rate 0, or deterministic, is the plain pre-LN block: x + Attn(LN x), + MLP(LN x)."""
  make_attention = lambda **kw: MaskedSelfAttention(2, 8, qkv_bias=True, **kw)
  x_BND = jax.random.normal(jax.random.key(0), (B, 5, 16))
  params = Block(make_attention, 32).init(jax.random.key(1), x_BND)
  dropping = Block(make_attention, 32, drop_path=0.3)
  by_hand = lambda p, x: x + make_attention().apply(
      {"params": p["attention"]}, nn.LayerNorm(1e-5).apply(
          {"params": p["attention_norm"]}, x))
  h_BND = by_hand(params["params"], x_BND)
  mlp = transformer.Mlp(32).apply({"params": params["params"]["mlp"]},
                                  nn.LayerNorm(1e-5).apply(
                                      {"params": params["params"]["mlp_norm"]}, h_BND))
  np.testing.assert_allclose(dropping.apply(params, x_BND), h_BND + mlp, atol=1e-6)


@pytest.mark.parametrize("pool", ["cls", "gap"])
def test_vision_priors_fit_the_mask_leaf_and_steer_attention(pool):
  model = _small(pool=pool)
  grid_h, grid_w = grid_size(model)
  cls_token = pool == "cls"
  window_NN = priors.window_prior(grid_h, grid_w, 3, 4.0, cls_token=cls_token)
  impulse_HNN = priors.impulse_prior(grid_h, grid_w, 2, cls_token=cls_token)
  n = n_tokens(model)
  chex.assert_shape(window_NN, (n, n))
  chex.assert_shape(inits.impulse_patterns(grid_h, grid_w, 2, cls_token=cls_token), (2, n, n))
  # As initializers (their shape check raises on a mismatch) per head and shared:
  for prior, per_head in ((priors.repeat_heads(window_NN, 2), True), (impulse_HNN, True),
                          (window_NN, False)):
    params = _init(model.clone(mask_init=priors.as_initializer(prior),
                               per_head_mask=per_head))
    np.testing.assert_array_equal(params["block_1"]["attention"]["mask_logits"], prior)
  wrong = priors.window_prior(grid_h, grid_w, cls_token=not cls_token)
  with pytest.raises(ValueError, match="rebuild the prior"):
    _init(model.clone(mask_init=priors.as_initializer(wrong), per_head_mask=False))
  # Written into the neutral model's leaves, the window prior moves attention into it.
  neutral = _init(model)
  windowed = schemes.set_masks(neutral, window_NN)
  allowed = np.asarray(window_NN) > 0
  images = _images(2)
  mass = {name: diagnostics.prior_fidelity(
              diagnostics.attention_maps(model.apply, p, images)["block_0"], allowed)
          for name, p in (("neutral", neutral), ("window", windowed))}
  assert mass["window"] > mass["neutral"] + 0.2, mass


def test_bad_config_and_inputs():
  images = _images()
  with pytest.raises(ValueError, match="multiple of patch_size"):
    grid_size(_small(patch_size=3))
  with pytest.raises(ValueError, match="multiple of patch_size"):
    _init(_small(patch_size=3))
  with pytest.raises(ValueError, match="pool="):
    _init(_small(pool="mean"))
  with pytest.raises(ValueError, match="pos_embed="):
    _init(_small(pos_embed="rope"))
  with pytest.raises(ValueError, match="divisible by 4"):
    _init(_small(pos_embed="sincos2d", width=18))
  with pytest.raises(ValueError, match="drop_path"):
    _init(_small(drop_path=1.0))
  with pytest.raises(ValueError, match="mask_layers"):
    _init(_small(mask_layers=(2,)))
  with pytest.raises(ValueError, match=r"\[B, 8, 8, 3\]"):
    _init(_small(), images[0])                          # no batch axis
  with pytest.raises(ValueError, match=r"\[B, 8, 8, 3\]"):
    _init(_small(), images[..., :1])                    # one channel
  with pytest.raises(ValueError, match=r"\[B, 8, 8, 3\]"):
    _init(_small(), jnp.zeros((B, 16, 16, C)))          # another image size
  with pytest.raises(ValueError, match="float images"):
    _init(_small(), jnp.zeros((B, PX, PX, C), jnp.uint8))
