"""Image augmentations of the ViT-Tiny small-data recipe (DeiT / timm style).

What runs where, and why:
  * Host (numpy + Pillow, one image at a time): crops, flips, RandAugment
    (`rand-m9-mstd0.5-inc1`) and random erasing. They work on `uint8 [H, W, C]` images
    (C = 3 or 1) and return uint8, so the host→device transfer is 4× smaller than a
    float32 batch; `normalize` then runs on the device. Every random op takes a
    `numpy.random.Generator`, so its output is a pure function of the generator's state
    (a data loader seeds one per example and is reproducible across workers).
    The training order is timm's: `random_resized_crop` → `random_flip` →
    `rand_augment` → `random_erasing`; evaluation is `center_crop` alone.
  * Device (jax.numpy, per batch): `smooth_labels` and `mixup_cutmix`. Mixing pairs
    the examples of a batch, so it needs the whole batch; it takes a `jax.random` key and
    has no Python control flow on traced values, so under `jax.vmap` over keys each
    member of a sweep mixes with its own key.

Random erasing runs on the uint8 image rather than (as timm) on the normalised one: the
fill is the same `mean + std·N(0, 1)`, in pixel units, up to rounding and clipping to
[0, 255].
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image, ImageEnhance, ImageOps

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_INTERPOLATION = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
                  "nearest": Image.Resampling.NEAREST}


# ----------------------------------------------------------------------------------------
# Host: Pillow round trip and geometry.


def _to_pil(image_HWC: np.ndarray) -> Image.Image:
  image_HWC = np.asarray(image_HWC)
  if image_HWC.dtype != np.uint8 or image_HWC.ndim != 3 or image_HWC.shape[-1] not in (1, 3):
    raise ValueError(f"expected a uint8 [H, W, 1|3] image, got {image_HWC.dtype} "
                     f"{image_HWC.shape}")
  return Image.fromarray(image_HWC[..., 0] if image_HWC.shape[-1] == 1 else image_HWC)


def _from_pil(pil: Image.Image) -> np.ndarray:
  array = np.asarray(pil, dtype=np.uint8)
  return array[..., None] if array.ndim == 2 else array


def _hw(size: int | Sequence[int]) -> tuple[int, int]:
  return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def resize(image_HWC: np.ndarray, size: int | Sequence[int],
           interpolation: str = "bilinear") -> np.ndarray:
  """Resizes to `size` (an int is square; else (h, w)) → uint8 `[h, w, C]`."""
  h, w = _hw(size)
  return _from_pil(_to_pil(image_HWC).resize((w, h), _INTERPOLATION[interpolation]))


def random_resized_crop(image_HWC: np.ndarray, rng: np.random.Generator, size: int,
                        scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3),
                        interpolation: str = "bicubic") -> np.ndarray:
  """torchvision's RandomResizedCrop → `[size, size, C]`.

  Up to 10 tries for a box of area fraction ~U(scale) and log-uniform aspect ratio
  (w/h) that fits; else the whole image centre-cropped to the nearest ratio in range.
  """
  height, width = image_HWC.shape[:2]
  area = height * width
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target_area = area * rng.uniform(scale[0], scale[1])
    aspect = math.exp(rng.uniform(*log_ratio))
    w = int(round(math.sqrt(target_area * aspect)))
    h = int(round(math.sqrt(target_area / aspect)))
    if 0 < w <= width and 0 < h <= height:
      top = int(rng.integers(0, height - h + 1))
      left = int(rng.integers(0, width - w + 1))
      break
  else:
    in_ratio = width / height
    if in_ratio < min(ratio):
      w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
      w, h = int(round(height * max(ratio))), height
    else:
      w, h = width, height
    top, left = (height - h) // 2, (width - w) // 2
  return resize(image_HWC[top:top + h, left:left + w], size, interpolation)


def center_crop(image_HWC: np.ndarray, size: int, crop_fraction: float = 0.875,
                interpolation: str = "bicubic") -> np.ndarray:
  """Evaluation view (timm's crop_pct): short side to ⌊size/crop_fraction⌋, centre crop."""
  if not 0 < crop_fraction <= 1:
    raise ValueError(f"crop_fraction must be in (0, 1], got {crop_fraction}")
  height, width = image_HWC.shape[:2]
  short = math.floor(size / crop_fraction)
  if height <= width:
    new_h, new_w = short, int(short * width / height)
  else:
    new_h, new_w = int(short * height / width), short
  image_HWC = resize(image_HWC, (new_h, new_w), interpolation)
  top = int(round((new_h - size) / 2))
  left = int(round((new_w - size) / 2))
  return image_HWC[top:top + size, left:left + size]


def random_crop_with_padding(image_HWC: np.ndarray, rng: np.random.Generator,
                             pad: int = 4) -> np.ndarray:
  """The CIFAR crop: zero-pad `pad` on each side, crop a random H×W window back."""
  height, width = image_HWC.shape[:2]
  padded = np.pad(image_HWC, ((pad, pad), (pad, pad), (0, 0)))
  top, left = rng.integers(0, 2 * pad + 1, size=2)
  return padded[top:top + height, left:left + width]


def random_flip(image_HWC: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """Horizontal flip with probability 0.5."""
  return np.ascontiguousarray(image_HWC[:, ::-1]) if rng.random() < 0.5 else image_HWC


# ----------------------------------------------------------------------------------------
# Host: RandAugment, timm's `rand-m9-mstd0.5-inc1` (the "increasing" op set: every op
# gets more severe as the magnitude grows, and magnitude 0 is the identity for all but
# AutoContrast, Equalize, Invert and Posterize).

RAND_AUGMENT_OPS = ("AutoContrast", "Equalize", "Invert", "Rotate", "Posterize", "Solarize",
                    "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness", "ShearX",
                    "ShearY", "TranslateXRel", "TranslateYRel")
_ENHANCE = {"Color": ImageEnhance.Color, "Contrast": ImageEnhance.Contrast,
            "Brightness": ImageEnhance.Brightness, "Sharpness": ImageEnhance.Sharpness}
_MAX_LEVEL = 10.0


def _level_to_arg(name: str, magnitude: float, rng: np.random.Generator):
  """timm's level→argument maps (inc variants); signed ops draw their sign from `rng`."""
  level = magnitude / _MAX_LEVEL
  sign = -1.0 if rng.random() < 0.5 else 1.0
  if name == "Rotate":
    return sign * 30.0 * level  # degrees
  if name in ("ShearX", "ShearY"):
    return sign * 0.3 * level
  if name in ("TranslateXRel", "TranslateYRel"):
    return sign * 0.45 * level  # fraction of the image's width / height
  if name in _ENHANCE:
    return max(0.1, 1.0 + sign * 0.9 * level)  # enhance factor, 1 = identity
  if name == "Posterize":
    return 4 - int(level * 4)  # bits kept: 4 at m0 down to 0 at m10
  if name == "Solarize":
    return 256 - int(level * 256)  # threshold: 256 (no pixel) at m0 down to 0 (all)
  if name == "SolarizeAdd":
    return int(level * 110)  # added to the pixels below 128
  return None


def apply_op(image_HWC: np.ndarray, name: str, magnitude: float, rng: np.random.Generator,
             fill: int = 128, interpolation: str = "bicubic") -> np.ndarray:
  """One RandAugment op at `magnitude` ∈ [0, 10] (always applied); uint8 in and out.

  Geometric ops fill uncovered pixels with `fill` (timm's `img_mean` hparam).
  """
  arg = _level_to_arg(name, magnitude, rng)
  if name == "Posterize":  # numpy: Pillow ≥ 11 refuses 0 bits, which timm's m10 asks for
    return image_HWC & np.uint8((0xFF << (8 - arg)) & 0xFF)
  if name == "SolarizeAdd":
    shifted = np.minimum(image_HWC.astype(np.int32) + arg, 255).astype(np.uint8)
    return np.where(image_HWC < 128, shifted, image_HWC)
  pil = _to_pil(image_HWC)
  fill_color = fill if pil.mode == "L" else (fill,) * 3
  geometry = dict(resample=_INTERPOLATION[interpolation], fillcolor=fill_color)
  width, height = pil.size
  if name == "AutoContrast":
    out = ImageOps.autocontrast(pil)
  elif name == "Equalize":
    out = ImageOps.equalize(pil)
  elif name == "Invert":
    out = ImageOps.invert(pil)
  elif name == "Solarize":
    out = ImageOps.solarize(pil, arg)
  elif name in _ENHANCE:
    out = _ENHANCE[name](pil).enhance(arg)
  elif name == "Rotate":
    out = pil.rotate(arg, **geometry)
  else:  # affine maps output (x, y) to input (a x + b y + c, d x + e y + f)
    affine = {"ShearX": (1, arg, 0, 0, 1, 0), "ShearY": (1, 0, 0, arg, 1, 0),
              "TranslateXRel": (1, 0, arg * width, 0, 1, 0),
              "TranslateYRel": (1, 0, 0, 0, 1, arg * height)}[name]
    out = pil.transform(pil.size, Image.Transform.AFFINE, affine, **geometry)
  return _from_pil(out)


def rand_augment(image_HWC: np.ndarray, rng: np.random.Generator, num_ops: int = 2,
                 magnitude: float = 9, magnitude_std: float = 0.5,
                 ops: Sequence[str] = RAND_AUGMENT_OPS, prob: float = 0.5,
                 fill: int = 128, interpolation: str = "bicubic") -> np.ndarray:
  """timm's RandAugment: `num_ops` ops drawn with replacement, each applied with `prob`.

  Each applied op draws its magnitude from N(magnitude, magnitude_std) clipped to [0, 10]
  (magnitude_std 0: fixed), the noise that timm's `mstd0.5` adds to DeiT's m9.
  """
  for index in rng.integers(0, len(ops), size=num_ops):
    if rng.random() >= prob:
      continue
    m = rng.normal(magnitude, magnitude_std) if magnitude_std > 0 else magnitude
    image_HWC = apply_op(image_HWC, ops[index], float(np.clip(m, 0.0, _MAX_LEVEL)), rng,
                         fill, interpolation)
  return image_HWC


# ----------------------------------------------------------------------------------------
# Host: random erasing; normalisation (host or device).


def _per_channel(values: Sequence[float], channels: int) -> np.ndarray:
  """`values` for `channels` channels; RGB statistics on a grayscale image average."""
  values = np.asarray(values, np.float64).reshape(-1)
  if values.size == channels or values.size == 1:
    return np.broadcast_to(values, (channels,))
  if channels == 1:
    return values.mean(keepdims=True)
  raise ValueError(f"{values.size} channel statistics for a {channels}-channel image")


def random_erasing(image_HWC: np.ndarray, rng: np.random.Generator, prob: float = 0.25,
                   scale: tuple[float, float] = (0.02, 1 / 3),
                   ratio: tuple[float, float] = (0.3, 3.3),
                   mean: Sequence[float] = IMAGENET_MEAN,
                   std: Sequence[float] = IMAGENET_STD) -> np.ndarray:
  """timm's RandomErasing (mode "pixel", one box) on the uint8 image.

  With `prob`, up to 10 tries for a box of area fraction ~U(scale) and log-uniform aspect
  ratio (h/w) strictly inside the image; the first that fits is filled per pixel with
  255·(mean + std·N(0, 1)) (`mean`/`std` as fractions, as for `normalize`), the image of
  timm's N(0, 1) fill on the normalised image.
  """
  if rng.random() >= prob:
    return image_HWC
  height, width, channels = image_HWC.shape
  log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
  for _ in range(10):
    target_area = rng.uniform(scale[0], scale[1]) * height * width
    aspect = math.exp(rng.uniform(*log_ratio))
    h = int(round(math.sqrt(target_area * aspect)))
    w = int(round(math.sqrt(target_area / aspect)))
    if w < width and h < height:
      top = int(rng.integers(0, height - h + 1))
      left = int(rng.integers(0, width - w + 1))
      noise = rng.standard_normal((h, w, channels))
      fill = 255.0 * (_per_channel(mean, channels) + _per_channel(std, channels) * noise)
      out = image_HWC.copy()
      out[top:top + h, left:left + w] = np.clip(np.round(fill), 0, 255).astype(np.uint8)
      return out
  return image_HWC


def normalize(images_uint8, mean: Sequence[float] = IMAGENET_MEAN,
              std: Sequence[float] = IMAGENET_STD):
  """`[..., H, W, C]` uint8 → float32 (x/255 − mean)/std; jnp for a jax array, else numpy.

  Meant for the device, right after the uint8 transfer.
  """
  xp = jnp if isinstance(images_uint8, jax.Array) else np
  channels = images_uint8.shape[-1]
  mean_C = (255.0 * _per_channel(mean, channels)).astype(np.float32)
  std_C = (255.0 * _per_channel(std, channels)).astype(np.float32)
  return (xp.asarray(images_uint8, dtype=xp.float32) - mean_C) / std_C


# ----------------------------------------------------------------------------------------
# Device: label smoothing, mixup / cutmix.


def smooth_labels(labels_B, num_classes: int, smoothing: float = 0.1) -> jax.Array:
  """Integer labels → float32 `[B, num_classes]` (timm: smoothing/num_classes off-class)."""
  off = smoothing / num_classes
  return jax.nn.one_hot(labels_B, num_classes, dtype=jnp.float32) * (1.0 - smoothing) + off


def _cutmix_box(key, lam, height: int, width: int):
  """timm's rand_bbox: a box of side √(1−λ) of each dimension at a uniform centre, clipped
  to the image → (mask_HW, exact area fraction)."""
  key_y, key_x = jax.random.split(key)
  cut = jnp.sqrt(1.0 - lam)
  cut_h = jnp.floor(height * cut).astype(jnp.int32)
  cut_w = jnp.floor(width * cut).astype(jnp.int32)
  cy = jax.random.randint(key_y, (), 0, height)
  cx = jax.random.randint(key_x, (), 0, width)
  y0, y1 = jnp.clip(cy - cut_h // 2, 0, height), jnp.clip(cy + cut_h // 2, 0, height)
  x0, x1 = jnp.clip(cx - cut_w // 2, 0, width), jnp.clip(cx + cut_w // 2, 0, width)
  rows, cols = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
  mask_HW = (rows >= y0) & (rows < y1) & (cols >= x0) & (cols < x1)
  return mask_HW, ((y1 - y0) * (x1 - x0)) / (height * width)


def _is_zero(alpha) -> bool:
  return isinstance(alpha, (int, float, np.number)) and alpha == 0


def mixup_cutmix(images_BHWC, targets_BC, key, mixup_alpha=0.8, cutmix_alpha=1.0,
                 switch_prob=0.5):
  """timm's Mixup in "batch" mode → (images_BHWC, targets_BC).

  One λ for the batch, each example mixed with its partner in the batch reversed along
  axis 0. With `switch_prob` (when both alphas are > 0) cutmix: λ ~ Beta(cutmix_alpha,
  cutmix_alpha), a box of area ≈ 1 − λ pasted from the partner and λ corrected to the
  exact kept area; otherwise mixup: λ ~ Beta(mixup_alpha, mixup_alpha), λ·x + (1 − λ)·x'.
  Targets (e.g. `smooth_labels`) mix with the same λ. An alpha of 0 disables its branch
  (both 0: identity). Alphas and switch_prob may be traced (a sweep can vmap them); the
  branch is a `lax.cond`. One Beta draw serves both branches: jax's Beta sampler is slow
  to compile. Integer images are mixed as float32.
  """
  if _is_zero(mixup_alpha) and _is_zero(cutmix_alpha):
    return images_BHWC, targets_BC
  images_BHWC = jnp.asarray(images_BHWC)
  if not jnp.issubdtype(images_BHWC.dtype, jnp.floating):
    images_BHWC = images_BHWC.astype(jnp.float32)
  targets_BC = jnp.asarray(targets_BC)
  height, width = images_BHWC.shape[1:3]
  mixup_alpha = jnp.asarray(mixup_alpha, jnp.float32)
  cutmix_alpha = jnp.asarray(cutmix_alpha, jnp.float32)
  key_switch, key_lam, key_box = jax.random.split(key, 3)
  mixup_on, cutmix_on = mixup_alpha > 0, cutmix_alpha > 0
  use_cutmix = jnp.where(mixup_on & cutmix_on,
                         jax.random.uniform(key_switch) < switch_prob, cutmix_on)
  alpha = jnp.where(use_cutmix, cutmix_alpha, mixup_alpha)
  safe_alpha = jnp.where(alpha > 0, alpha, 1.0)  # alpha 0 (both off): λ = 1, no mixing
  lam = jnp.where(alpha > 0, jax.random.beta(key_lam, safe_alpha, safe_alpha), 1.0)
  partner_BHWC = images_BHWC[::-1]

  def cutmix(lam):
    mask_HW, area = _cutmix_box(key_box, lam, height, width)
    mixed = jnp.where(mask_HW[None, :, :, None], partner_BHWC, images_BHWC)
    return mixed, (1.0 - area).astype(jnp.float32)

  def mixup(lam):
    lam_x = lam.astype(images_BHWC.dtype)
    return lam_x * images_BHWC + (1 - lam_x) * partner_BHWC, lam

  images_BHWC, lam = jax.lax.cond(use_cutmix, cutmix, mixup, lam.astype(jnp.float32))
  lam_t = lam.astype(targets_BC.dtype)
  return images_BHWC, lam_t * targets_BC + (1 - lam_t) * targets_BC[::-1]
