"""Augmentations: host ops keep uint8 shapes and are seeded; RandAugment's timm levels;
erasing's box; mixup / cutmix mix images and targets with one exact λ, under jit and vmap."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpx.tasks.vision import augment

H, W = 10, 25  # non-square, as TFDS's mock ImageNet images


def _image(channels, seed=0, shape=(H, W)):
  return np.random.default_rng(seed).integers(0, 256, (*shape, channels), dtype=np.uint8)


def _rng(seed=0):
  return np.random.default_rng(seed)


# Each random host op as f(image, rng) → image, at settings where it does something.
RANDOM_OPS = {
    "random_resized_crop": lambda x, rng: augment.random_resized_crop(x, rng, 8),
    "random_crop_with_padding": augment.random_crop_with_padding,
    "random_flip": augment.random_flip,
    "rand_augment": augment.rand_augment,
    "random_erasing": lambda x, rng: augment.random_erasing(x, rng, prob=1.0),
}


@pytest.mark.parametrize("channels", [3, 1])
def test_host_ops_keep_uint8_and_shape(channels):
  x = _image(channels)
  outputs = {
      "resize": (augment.resize(x, (7, 12)), (7, 12)),
      "resize_int": (augment.resize(x, 6), (6, 6)),
      "center_crop": (augment.center_crop(x, 8), (8, 8)),
      "rrc_bilinear": (augment.random_resized_crop(x, _rng(), 9, interpolation="bilinear"),
                       (9, 9)),
      **{name: (op(x, _rng()), (8, 8) if name == "random_resized_crop" else (H, W))
         for name, op in RANDOM_OPS.items()},
      "rand_augment_m10": (augment.rand_augment(x, _rng(), num_ops=4, magnitude=10, prob=1.0),
                           (H, W)),
  }
  for op in augment.RAND_AUGMENT_OPS:
    for m in (0.0, 9.0, 10.0):
      outputs[f"{op}@{m}"] = (augment.apply_op(x, op, m, _rng()), (H, W))
  for name, (y, hw) in outputs.items():
    assert y.dtype == np.uint8, name
    assert y.shape == (*hw, channels), name
    assert y.min() >= 0 and y.max() <= 255, name
  assert augment.normalize(x).shape == x.shape


@pytest.mark.parametrize("name", list(RANDOM_OPS))
def test_random_ops_are_functions_of_the_seed(name):
  op, x = RANDOM_OPS[name], _image(3)
  global_state = np.random.get_state()[1].copy()
  outputs = [op(x, _rng(seed)) for seed in range(8)]
  for seed, y in enumerate(outputs):
    np.testing.assert_array_equal(op(x, _rng(seed)), y)
  np.testing.assert_array_equal(np.random.get_state()[1], global_state)  # only `rng` is used
  assert any(not np.array_equal(outputs[0], y) for y in outputs[1:])


def test_rand_augment_levels_are_timms():
  """inc1 maps at m9 and the ends (a sign is drawn for the signed ops only)."""
  def arg(name, m, seed=0):
    return augment._level_to_arg(name, m, _rng(seed))

  signed = {"Rotate": 27.0, "ShearX": 0.27, "ShearY": 0.27, "TranslateXRel": 0.405,
            "TranslateYRel": 0.405}
  for name, value in signed.items():
    values = {round(arg(name, 9.0, seed), 6) for seed in range(8)}
    assert values == {value, -value}, name
  for name in ("Color", "Contrast", "Brightness", "Sharpness"):
    assert {round(arg(name, 9.0, seed), 6) for seed in range(8)} == {0.19, 1.81}
    assert {round(arg(name, 10.0, seed), 6) for seed in range(8)} == {0.1, 1.9}
  assert [arg("Posterize", m) for m in (0, 5, 9, 10)] == [4, 2, 1, 0]  # bits kept
  assert [arg("Solarize", m) for m in (0, 5, 9, 10)] == [256, 128, 26, 0]  # threshold
  assert [arg("SolarizeAdd", m) for m in (0, 5, 9, 10)] == [0, 55, 99, 110]


@pytest.mark.parametrize("channels", [3, 1])
def test_rand_augment_identity_at_magnitude_zero(channels):
  """All ops but AutoContrast, Equalize, Invert and Posterize are the identity at m0."""
  x = _image(channels)
  identity_ops = [op for op in augment.RAND_AUGMENT_OPS
                  if op not in ("AutoContrast", "Equalize", "Invert", "Posterize")]
  for seed in range(4):
    y = augment.rand_augment(x, _rng(seed), num_ops=6, magnitude=0, magnitude_std=0,
                             ops=identity_ops, prob=1.0)
    np.testing.assert_array_equal(y, x)
  np.testing.assert_array_equal(augment.rand_augment(x, _rng(), prob=0.0), x)
  assert not np.array_equal(augment.rand_augment(x, _rng(), num_ops=2, prob=1.0), x)


def test_rand_augment_clips_the_magnitude():
  """N(m, mstd) draws are clipped to [0, 10]: Posterize keeps 0–4 bits, never more."""
  x = _image(3)
  for seed in range(8):
    y = augment.rand_augment(x, _rng(seed), num_ops=1, magnitude=5, magnitude_std=100.0,
                             ops=("Posterize",), prob=1.0)
    assert not (y & 0x0F).any()


def test_pixel_ops_exact():
  x = _image(3)
  invert = augment.apply_op(x, "Invert", 9.0, _rng())
  np.testing.assert_array_equal(invert, 255 - x)
  np.testing.assert_array_equal(augment.apply_op(invert, "Invert", 9.0, _rng()), x)
  np.testing.assert_array_equal(augment.apply_op(x, "Posterize", 0.0, _rng()), x & 0xF0)
  np.testing.assert_array_equal(augment.apply_op(x, "Posterize", 10.0, _rng()), 0 * x)
  np.testing.assert_array_equal(augment.apply_op(x, "Solarize", 10.0, _rng()), 255 - x)
  add = augment.apply_op(x, "SolarizeAdd", 9.0, _rng())
  np.testing.assert_array_equal(add, np.where(x < 128, np.minimum(x.astype(int) + 99, 255), x))


@pytest.mark.parametrize("channels", [3, 1])
def test_geometric_ops_fill_with_128(channels):
  x = np.zeros((H, W, channels), np.uint8)
  for op in ("TranslateXRel", "TranslateYRel", "Rotate", "ShearX"):
    y = augment.apply_op(x, op, 10.0, _rng())
    assert set(np.unique(y)) <= {0, 128} and (y == 128).any(), op
    assert (y == 128).all(-1).sum() == (y == 128).any(-1).sum(), op  # gray fill, all channels
  for op, axis, size in (("TranslateXRel", 0, W), ("TranslateYRel", 1, H)):
    for seed in range(2):  # 0.45 of the width (height) is shifted out at m10
      filled = (augment.apply_op(x, op, 10.0, _rng(seed)) == 128).all((axis, 2)).mean()
      assert abs(filled - 0.45) <= 1 / size + 1e-9, op


def test_random_crop_with_padding():
  x = _image(3)
  np.testing.assert_array_equal(augment.random_crop_with_padding(x, _rng(), pad=0), x)
  padded = np.pad(x, ((4, 4), (4, 4), (0, 0)))
  offsets = set()
  for seed in range(16):
    y = augment.random_crop_with_padding(x, _rng(seed), pad=4)
    matches = [(t, l) for t in range(9) for l in range(9)
               if np.array_equal(y, padded[t:t + H, l:l + W])]
    assert matches
    offsets.add(matches[0])
  assert len(offsets) > 4


def test_random_flip():
  x = _image(3)
  outputs = [augment.random_flip(x, _rng(seed)) for seed in range(8)]
  assert all(np.array_equal(y, x) or np.array_equal(y, x[:, ::-1]) for y in outputs)
  assert any(np.array_equal(y, x) for y in outputs)
  assert any(np.array_equal(y, x[:, ::-1]) for y in outputs)
  for seed in range(4):  # the same draw flips back
    np.testing.assert_array_equal(
        augment.random_flip(augment.random_flip(x, _rng(seed)), _rng(seed)), x)


def test_random_resized_crop_boxes():
  x = _image(3)
  whole = augment.random_resized_crop(x, _rng(), 8, scale=(1.0, 1.0), ratio=(W / H, W / H))
  np.testing.assert_array_equal(whole, augment.resize(x, 8, "bicubic"))
  # A 10×25 image has no full-area box of ratio ≤ 4/3: the fallback's central 10×13 crop.
  fallback = augment.random_resized_crop(x, _rng(), 8, scale=(1.0, 1.0))
  np.testing.assert_array_equal(fallback, augment.resize(x[:, 6:19], 8, "bicubic"))


def test_center_crop():
  x = _image(3, shape=(16, 20))  # short side already 14 / 0.875: a pure centre crop
  np.testing.assert_array_equal(augment.center_crop(x, 14), x[1:15, 3:17])
  with pytest.raises(ValueError):
    augment.center_crop(x, 14, crop_fraction=1.5)


def test_random_erasing():
  x = _image(3)
  np.testing.assert_array_equal(augment.random_erasing(x, _rng(), prob=0.0), x)
  height, width, scale = 40, 50, (0.02, 1 / 3)
  zeros = np.zeros((height, width, 3), np.uint8)
  erased = 0
  for seed in range(20):
    y = augment.random_erasing(zeros, _rng(seed), prob=1.0, scale=scale)
    changed = (y != 0).any(-1)
    if not changed.any():
      continue
    erased += 1
    rows, cols = np.flatnonzero(changed.any(1)), np.flatnonzero(changed.any(0))
    h, w = rows[-1] - rows[0] + 1, cols[-1] - cols[0] + 1
    assert h < height and w < width
    slack = (0.5 * (h + w) + 1) / (height * width)  # h, w are rounded
    assert scale[0] - slack <= h * w / (height * width) <= scale[1] + slack
    fill = y[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].astype(float)
    assert abs(fill.mean() - 255 * np.mean(augment.IMAGENET_MEAN)) < 25  # mean + std·N(0,1)
    assert fill.std() > 20
  assert erased >= 15


def test_normalize():
  mean = np.round(255 * np.asarray(augment.IMAGENET_MEAN))
  x = np.broadcast_to(mean.astype(np.uint8), (2, H, W, 3))
  y = augment.normalize(x)
  assert y.dtype == np.float32 and isinstance(y, np.ndarray)
  np.testing.assert_allclose(y, 0.0, atol=0.01)
  z = augment.normalize(jnp.asarray(_image(3)))
  assert isinstance(z, jax.Array) and z.dtype == jnp.float32
  np.testing.assert_allclose(z, augment.normalize(_image(3)), rtol=1e-6)
  gray = augment.normalize(np.full((H, W, 1), 255, np.uint8))
  np.testing.assert_allclose(gray, (1 - 0.449) / 0.226, rtol=1e-3)  # channel averages


def test_smooth_labels_golden():
  t = augment.smooth_labels(jnp.array([3, 0]), 10, 0.1)
  chex.assert_shape(t, (2, 10))
  assert t.dtype == jnp.float32
  np.testing.assert_allclose(t.sum(-1), 1.0, rtol=1e-6)
  expected = np.full((2, 10), 0.01, np.float32)
  expected[0, 3] = expected[1, 0] = 0.91
  np.testing.assert_allclose(t, expected, rtol=1e-6)


B, HM, WM, C, K = 4, 8, 12, 2, 16
OWN = np.arange(1.0, B + 1)  # example b is the constant b + 1 and has label b,
PARTNER = OWN[::-1]  # so a pixel names its source; the flipped batch holds B − b


def _batch():
  images = np.broadcast_to(OWN[:, None, None, None], (B, HM, WM, C)).astype(np.float32)
  return images, np.eye(B, dtype=np.float32)


# One compile for every test: alphas and switch_prob are traced, keys vmapped as a sweep's.
_MIX = jax.jit(jax.vmap(augment.mixup_cutmix, in_axes=(None, None, 0, None, None, None)))


def _sweep(mixup_alpha=0.8, cutmix_alpha=1.0, switch_prob=0.5, same_key=False):
  """K mixes of `_batch()`, one per key (all one key if `same_key`), as numpy."""
  keys = jax.random.split(jax.random.key(0), K)
  if same_key:
    keys = jax.random.wrap_key_data(np.repeat(np.asarray(jax.random.key_data(keys))[:1], K, 0))
  out = _MIX(*_batch(), keys, np.float32(mixup_alpha), np.float32(cutmix_alpha),
             np.float32(switch_prob))
  return jax.tree.map(np.asarray, out)


def test_cutmix_lambda_is_the_pasted_area():
  images, targets = _sweep(mixup_alpha=0.0, cutmix_alpha=1.0)
  chex.assert_shape(images, (K, B, HM, WM, C))
  np.testing.assert_allclose(targets.sum(-1), 1.0, rtol=1e-6)
  from_partner = (images == PARTNER[None, :, None, None, None]).all(-1)
  own = (images == OWN[None, :, None, None, None]).all(-1)
  assert (from_partner | own).all()  # cutmix pastes, never blends
  pasted = from_partner.mean((2, 3))  # [K, B]
  b = np.arange(B)
  np.testing.assert_allclose(targets[:, b, B - 1 - b], pasted, atol=1e-6)
  np.testing.assert_allclose(targets[:, b, b], 1 - pasted, atol=1e-6)
  assert len(set(np.round(pasted[:, 0], 6))) > K // 2  # a box per key


def test_mixup_blends_with_the_target_lambda():
  images, targets = _sweep(mixup_alpha=0.8, cutmix_alpha=0.0)
  np.testing.assert_allclose(targets.sum(-1), 1.0, rtol=1e-6)
  lam = targets[:, 0, 0]  # [K]
  np.testing.assert_allclose(targets[:, 0, B - 1], 1 - lam, atol=1e-6)
  expected = lam[:, None] * OWN[None] + (1 - lam[:, None]) * PARTNER[None]  # [K, B]
  np.testing.assert_allclose(images, np.broadcast_to(expected[..., None, None, None],
                                                     images.shape), rtol=1e-5)
  assert len(set(np.round(lam, 6))) == K  # a λ per member


def test_switch_picks_one_branch_per_key():
  def blended(images):  # [K]: mixup blends values; cutmix only moves them
    return ~np.isin(images, OWN).all((1, 2, 3, 4))

  assert 0 < blended(_sweep()[0]).sum() < K  # both alphas on, switch_prob 0.5
  assert blended(_sweep(switch_prob=0.0)[0]).all()
  assert not blended(_sweep(switch_prob=1.0)[0]).any()


def test_mixup_cutmix_identity_and_same_key():
  images, targets = _batch()
  same = augment.mixup_cutmix(images, targets, jax.random.key(1), 0.0, 0.0)  # static off
  chex.assert_trees_all_equal(same, (images, targets))
  off_images, off_targets = _sweep(0.0, 0.0)  # traced off
  np.testing.assert_array_equal(off_images, np.broadcast_to(images, off_images.shape))
  np.testing.assert_array_equal(off_targets, np.broadcast_to(targets, off_targets.shape))
  mixed_images, mixed_targets = _sweep(same_key=True)
  for k in range(1, K):
    np.testing.assert_array_equal(mixed_images[k], mixed_images[0])
    np.testing.assert_array_equal(mixed_targets[k], mixed_targets[0])
  assert not math.isclose(mixed_targets[0, 0, 0], 1.0)
