"""The vision family: ViT-Tiny on an image set × {default, mimetic, impulse_svd,
impulse_opt, mask}, and the member-level `Task` the sweep engine trains.

Data is a host `Stream` (`mpx.tasks.vision.data`: tfds.data_source + grain, every batch a
function of (seed, step)), one per seed: a seed's schemes train on the same batches (paired
comparisons), the seeds on independent orders and augmentations. Augmentations that need
no per-member randomness run on the host (crop, flip, RandAugment, random erasing:
`mpx.tasks.vision.augment`), mixup/cutmix and label smoothing run inside the member's loss from
its own key, so the members of one vmapped program mix differently. `digits` is the
embedded set: the 8×8 handwritten digits scikit-learn ships (no download).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mpx import priors, schemes
from mpx.nn.vit import ViT, grid_size, n_tokens
from mpx.sweep import engine, optim
from mpx.sweep.data import EvalData, Stream
from mpx.tasks import common
from mpx.tasks.vision import augment
from mpx.tasks.vision import data as image_data
from mpx.tasks.common import PriorConfig

DATASETS = ("digits",) + tuple(image_data.DATASETS)
CROPS = ("random_resized", "pad")
MASK_DESIGNS = ("window", "impulse")

# Per-channel pixel statistics (0..1 scale) the images are normalised with on device.
PIXEL_STATS = {
    "digits": ((0.5,), (0.5,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "imagenet100": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
}
# Evaluation crop: CIFAR and digits are resized whole; ImageNet keeps the central 87.5%.
EVAL_CROP_FRACTION = {"digits": 1.0, "cifar10": 1.0, "cifar100": 1.0, "imagenet100": 0.875}
DIGITS_TEST = 450  # The embedded set's held-out images (1,797 in all, fixed split).
# The leaves DeiT's AdamW (timm) does not decay: the model's `no_weight_decay()` names
# (positions, CLS token) and every bias and LayerNorm scale (timm's "1-D or .bias" rule;
# mpx's Q/K/V biases are [H, head_dim], hence by name). `optim.OptimConfig.no_decay`.
NO_WEIGHT_DECAY = (r"pos_embed", r"cls", r"(.*/)?bias", r"(.*/)?scale")


@dataclasses.dataclass(frozen=True)
class Config(PriorConfig):
  """Shared fields: `mpx.tasks.common.PriorConfig` (ViT-Tiny widths by default).

  dataset: `DATASETS`; data_dir: a TFDS data dir with the dataset built in array_record
    format (None: TFDS's default, which honours TFDS_DATA_DIR). digits needs none.
  fractions: training-set fractions, one group each; a fraction keeps a fixed subset
    (seed 0), the same for every member.
  image_size, patch_size, pool, pos_embed, drop_path: the ViT (`mpx.nn.vit.ViT`).
  designs: the mask scheme's priors, "window" (`window`×`window` around each patch) and/or
    "impulse" (head h reads its 3×3 shift); CLS row and column stay open.
  epochs / steps: training length (steps, when set, wins); warmup_epochs: linear warmup,
    then cosine decay to 0 (AdamW; no decay on the mask and `NO_WEIGHT_DECAY`).
  crop: "random_resized" (scale 0.08–1, the 224-px recipe; CIFAR is upsampled) or "pad"
    (a random crop of the image padded by image_size / 8, the 32-px recipe).
  flip, randaugment_ops / randaugment_magnitude, random_erasing: host augmentations
    (0 = off); mixup, cutmix, label_smoothing: on device, per member (mixup and cutmix are
    alphas; 0 = off).
  data_threads: grain read threads (0 = in the prefetch thread; results are identical).
  window: the window prior's side, in patches.
  learning_rate: AdamW's peak rate; grad_clip: global-norm clip (None = off).
  eval_batch: test images per compiled evaluation call.
  """
  SCHEME_NAMES: ClassVar[tuple[str, ...]] = schemes.VISION_SCHEMES
  schemes: tuple[str, ...] = schemes.VISION_SCHEMES
  dataset: str = "cifar10"
  data_dir: str | None = None
  fractions: tuple[float, ...] = (1.0,)
  seeds: int = 3
  image_size: int = 224
  patch_size: int = 16
  pool: str = "cls"
  pos_embed: str = "learned"
  drop_path: float = 0.1
  width: int = 192
  depth: int = 12
  num_heads: int = 3
  head_dim: int = 64
  mlp_dim: int = 768
  designs: tuple[str, ...] = ("window",)
  window: int = 3
  batch_size: int = 512
  learning_rate: float = 2e-3
  weight_decay: float = 0.05
  grad_clip: float | None = None
  epochs: int = 300
  warmup_epochs: int = 50
  steps: int | None = None
  crop: str = "random_resized"
  flip: bool = True
  randaugment_ops: int = 2
  randaugment_magnitude: float = 9.0
  random_erasing: float = 0.25
  mixup: float = 0.8
  cutmix: float = 1.0
  label_smoothing: float = 0.1
  data_threads: int = 0
  eval_batch: int = 500
  probe_size: int = 64

  def optional_modules(self) -> tuple[str, ...]:
    """grain batches every dataset; digits come from scikit-learn, the others from TFDS."""
    return ("grain", "sklearn" if self.dataset == "digits" else "tensorflow_datasets")

  def __post_init__(self):
    super().__post_init__()
    if self.dataset not in DATASETS:
      raise ValueError(f"dataset={self.dataset!r}; choose from {DATASETS}.")
    if self.crop not in CROPS:
      raise ValueError(f"crop={self.crop!r}; choose from {CROPS}.")
    unknown = [d for d in self.designs if d not in MASK_DESIGNS]
    if unknown or not self.designs:
      raise ValueError(f"unknown mask designs {unknown or '()'}; choose from {MASK_DESIGNS}.")
    if not (self.fractions and all(0 < f <= 1 for f in self.fractions)):
      raise ValueError(f"fractions must lie in (0, 1]; got {self.fractions}.")
    if self.epochs < 1 or not 0 <= self.warmup_epochs < self.epochs:
      raise ValueError(f"need epochs >= 1 and 0 <= warmup_epochs < epochs; got "
                       f"{self.epochs}, {self.warmup_epochs}.")
    if self.steps is not None and self.steps < 1:
      raise ValueError(f"steps={self.steps} must be >= 1 (or none for epochs × steps per "
                       "epoch).")
    for name in ("random_erasing", "label_smoothing"):
      if not 0 <= getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be in [0, 1).")
    if min(self.mixup, self.cutmix, self.randaugment_magnitude, self.randaugment_ops,
           self.data_threads) < 0:
      raise ValueError("mixup, cutmix, randaugment_ops, randaugment_magnitude and "
                       "data_threads must be >= 0.")
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate={self.learning_rate} must be > 0.")
    make_model(self, 10)._check_config()  # Grid, pool, positions, drop-path, mask layers.


# --------------------------------------------------------------------------- model


def num_classes(config: Config) -> int:
  return 10 if config.dataset == "digits" else image_data.DATASETS[config.dataset].num_classes


def channels(config: Config) -> int:
  return 1 if config.dataset == "digits" else 3


def make_model(config: Config, classes: int | None = None) -> ViT:
  return ViT(image_size=config.image_size, patch_size=config.patch_size,
             channels=channels(config), **config.model_shape(),
             num_classes=classes or num_classes(config), pool=config.pool,
             pos_embed=config.pos_embed, drop_path=config.drop_path)


def design_prior(config: Config, design: str, strength: float) -> jax.Array:
  """The mask prior of a design over the model's tokens (`[N, N]` or `[H, N, N]`)."""
  grid_h, grid_w = grid_size(make_model(config))
  cls_token = config.pool == "cls"
  if design == "window":
    return priors.window_prior(grid_h, grid_w, config.window, strength, cls_token=cls_token)
  if design == "impulse":
    return priors.impulse_prior(grid_h, grid_w, config.num_heads, strength,
                                cls_token=cls_token)
  raise ValueError(f"unknown mask design {design!r}; choose from {MASK_DESIGNS}.")


def member_pattern(config: Config, member: engine.Member) -> dict[str, np.ndarray]:
  """{layer: allowed [H, N, N]} a member's fidelity is scored on: a mask member on its
  design, the impulse schemes on the impulse shifts they realise, default and mimetic on
  the window (the mask's default design), which they carry no prior for."""
  if member.design is not None:
    design = member.design
  else:
    design = "impulse" if member.scheme.startswith("impulse") else "window"
  n = n_tokens(make_model(config))
  allowed = np.broadcast_to(np.asarray(design_prior(config, design, 1.0)) > 0,
                            (config.num_heads, n, n))
  masked = config.masked_layers
  return {f"block_{i}": allowed for i in masked}


# --------------------------------------------------------------------------- data


def _digits() -> dict[str, dict[str, np.ndarray]]:
  """scikit-learn's copy of the UCI optical-recognition digits (1,797 8×8 images, 0..16
  grey levels; BSD-3 package, CC BY 4.0 data), scaled to uint8, split once (seed 0)."""
  try:
    from sklearn.datasets import load_digits
  except ImportError:
    raise ImportError("dataset=digits reads the digits scikit-learn ships: "
                      "pip install 'mpx[vision]' (or scikit-learn).") from None
  digits = load_digits()
  images = np.round(digits.images * (255 / 16)).astype(np.uint8)[..., None]
  order = np.random.default_rng(0).permutation(len(images))
  test, train = order[:DIGITS_TEST], order[DIGITS_TEST:]
  return {split: {"image": images[i], "label": digits.target[i].astype(np.int32)}
          for split, i in (("train", train), ("test", test))}


class ArraySource:
  """Random-access records over in-memory arrays (what `tfds.data_source` gives)."""

  def __init__(self, arrays, index=None):
    self._arrays = arrays
    self._index = np.arange(len(arrays["label"])) if index is None else np.asarray(index)

  def __len__(self) -> int:
    return len(self._index)

  def __getitem__(self, i):
    j = self._index[i]
    return {"image": self._arrays["image"][j], "label": int(self._arrays["label"][j])}


def open_splits(config: Config):
  """(train source, eval source) of the dataset."""
  if config.dataset == "digits":
    splits = _digits()
    return ArraySource(splits["train"]), ArraySource(splits["test"])
  spec = image_data.DATASETS[config.dataset]
  return (image_data.open_split(config.dataset, spec.train_split, config.data_dir),
          image_data.open_split(config.dataset, spec.eval_split, config.data_dir))


def subset(source, fraction: float, batch_size: int):
  """A fixed `fraction` of `source` (seed 0), at least one batch."""
  if fraction == 1.0:
    return source
  keep = max(batch_size, int(round(fraction * len(source))))
  if keep > len(source):
    raise ValueError(f"fraction {fraction} keeps fewer than batch_size={batch_size} of the "
                     f"{len(source)} training images; raise the fraction or lower the batch.")
  index = np.sort(np.random.default_rng(0).permutation(len(source))[:keep])
  return _Subset(source, index)


class _Subset:
  def __init__(self, source, index):
    self._source, self._index = source, index

  def __len__(self) -> int:
    return len(self._index)

  def __getitem__(self, i):
    return self._source[int(self._index[i])]


def train_preprocess(config: Config) -> Callable:
  """`(example, rng) → example`: the host augmentations of the recipe, uint8 out."""
  size = config.image_size

  def preprocess(example, rng):
    image = np.asarray(example["image"])
    if config.crop == "random_resized":
      image = augment.random_resized_crop(image, rng, size)
    else:
      if image.shape[:2] != (size, size):
        image = augment.resize(image, size)
      image = augment.random_crop_with_padding(image, rng, pad=max(1, size // 8))
    if config.flip:
      image = augment.random_flip(image, rng)
    if config.randaugment_ops and config.randaugment_magnitude:
      image = augment.rand_augment(image, rng, num_ops=config.randaugment_ops,
                                   magnitude=config.randaugment_magnitude)
    if config.random_erasing:
      image = augment.random_erasing(image, rng, prob=config.random_erasing)
    return {"image": image, "label": np.int32(example["label"])}
  return preprocess


def eval_preprocess(config: Config) -> Callable:
  def preprocess(example):
    image = augment.center_crop(np.asarray(example["image"]), config.image_size,
                                EVAL_CROP_FRACTION[config.dataset])
    return {"image": image, "label": np.int32(example["label"])}
  return preprocess


def normalize(config: Config, images_BHWC) -> jax.Array:
  mean, std = PIXEL_STATS[config.dataset]
  return augment.normalize(images_BHWC, mean, std)


# --------------------------------------------------------------------------- task


def make_model_init(config: Config) -> Callable:
  """key → the model's params, in one compile (eager, each random op compiles on its own:
  ~20 s for a ViT on CPU)."""
  model = make_model(config)
  images = jnp.zeros((1, config.image_size, config.image_size, channels(config)))
  return engine.jit_once(lambda key: model.init(key, images)["params"])


def make_task(config: Config) -> engine.Task:
  """Init by scheme; soft-target cross-entropy after per-member mixup/cutmix and label
  smoothing, drop-path from the member's key; top-1 on the evaluation split."""
  model = make_model(config)
  classes = num_classes(config)
  init_params = make_model_init(config)

  def init(member: engine.Member):
    key = jax.random.key(member.seed)
    params = init_params(key)
    scheme = member.scheme.partition(":")[0]
    prior = (design_prior(config, member.design, member.labels["mask_strength"])
             if scheme == "mask" else None)
    return schemes.apply_vision_scheme(scheme, params, model, jax.random.fold_in(key, 2),
                                       mask_prior=prior, qk_opt_steps=config.qk_opt_steps,
                                       pos_scale=config.qk_pos_scale)

  def loss(params, batch, key):
    mix_key, drop_key = jax.random.split(key)
    images = normalize(config, batch["image"])
    targets = augment.smooth_labels(batch["label"], classes, config.label_smoothing)
    if config.mixup or config.cutmix:
      images, targets = augment.mixup_cutmix(images, targets, mix_key,
                                             mixup_alpha=config.mixup,
                                             cutmix_alpha=config.cutmix)
    logits = model.apply({"params": params}, images, deterministic=False,
                         rngs={"drop_path": drop_key})
    return optax.softmax_cross_entropy(logits, targets).mean(), {}

  def eval_step(params, batch):
    logits = model.apply({"params": params}, normalize(config, batch["image"]))
    labels = batch["label"]
    return {"correct": (jnp.argmax(logits, -1) == labels).astype(jnp.float32),
            "loss": optax.softmax_cross_entropy_with_integer_labels(logits, labels)}

  def summarize(values, member):
    del member
    return {"accuracy": float(np.mean(values["correct"])),
            "loss": float(np.mean(values["loss"]))}

  return engine.Task(init=init, loss=loss, eval_step=eval_step, summarize=summarize)


def scheme_labels(config: Config) -> list[tuple[str, str | None]]:
  return common.scheme_labels(config.schemes, config.designs, "window")


def members(config: Config, fraction: float) -> list[engine.Member]:
  """Every scheme label (mask designs expanded) × seed; the mask learns at
  `mask_lr_multiplier`, the others' neutral mask is frozen."""
  grid = []
  for label, design in scheme_labels(config):
    mask = label.partition(":")[0] == "mask"
    hparams = {"learning_rate": config.learning_rate, "weight_decay": config.weight_decay,
               "mask_lr_multiplier": config.mask_lr_multiplier if mask else 0.0}
    grid += [engine.Member(config.dataset, label, seed, hparams, design=design,
                           labels={"mask_strength": config.mask_strength,
                                   "data_fraction": fraction})
             for seed in range(config.seeds)]
  return grid


def make_group(config: Config, fraction: float,
               group_members: Sequence[engine.Member], sources=None) -> engine.Group:
  """One (dataset, fraction): each seed's members train on that seed's host stream (the
  same subset for all); top-1 on the whole evaluation split; the probe is its first
  `probe_size` images."""
  train, test = sources or open_splits(config)
  train = subset(train, fraction, config.batch_size)
  evaluation = image_data.eval_arrays(test, eval_preprocess(config))
  steps_per_epoch = len(train) // config.batch_size
  if steps_per_epoch < 1:
    raise ValueError(f"batch_size={config.batch_size} exceeds the {len(train)} training "
                     "images.")
  steps = config.steps or config.epochs * steps_per_epoch
  warmup = min(config.warmup_epochs * steps_per_epoch, steps - 1)
  probe_images = evaluation["image"][:config.probe_size]
  probe = engine.Probe(
      apply=make_model(config).apply, inputs=(normalize(config, probe_images),),
      batch={"image": probe_images, "label": evaluation["label"][:config.probe_size]},
      patterns=[member_pattern(config, m) for m in group_members],
      map_layers=("block_0", f"block_{config.depth - 1}"))
  stream = Stream(image_data.make_stream_fn(train, batch_size=config.batch_size,
                                            preprocess=train_preprocess(config),
                                            num_threads=config.data_threads),
                  seeds=tuple(sorted({m.seed for m in group_members})))
  name = config.dataset if config.fractions == (1.0,) else f"{config.dataset}-f{fraction:g}"
  return engine.Group(
      name=name, members=list(group_members), task=make_task(config), data=stream,
      eval_data=EvalData(evaluation, config.eval_batch), steps=steps,
      batch_size=config.batch_size, probe=probe, members_per_call=config.members_per_call,
      chunk_options=config.step_variant,
      optim=optim.OptimConfig(optimizer="adamw", schedule="warmup_cosine",
                              total_steps=steps, warmup_steps=warmup,
                              grad_clip=config.grad_clip, no_decay=NO_WEIGHT_DECAY))
