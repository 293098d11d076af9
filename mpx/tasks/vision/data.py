"""The host image pipeline of the vision experiments: CIFAR-10, CIFAR-100, ImageNet-100.

Design. Records come from `tfds.data_source` (random-access ArrayRecord reads; no
TensorFlow at run time) and batches from a grain `MapDataset`, so every batch is a pure
function of (seed, step): each epoch is a permutation drawn from the seed (and the epoch),
each example's augmentation draws from `np.random.default_rng([seed', position])`, where
`position = step * batch_size + row` is the example's place in the endless stream. Resuming
at step s therefore reads exactly the batches an uninterrupted run reads at s, s+1, …, and
skipping to s costs O(1) (an index offset, no replay). Multi-host sharding, when it comes,
is a slice of that index space. The epochs run back to back, so a batch may hold the end
of one epoch and the start of the next; every example is still seen exactly once per
epoch. The cost: TFDS must have built the dataset with `--file_format=array_record` (its
default is tfrecord, which has no random access); `DatasetUnavailable` says how.

    source = open_split("cifar10", "train")            # {"image": uint8 [H, W, C], "label": int}
    batches = train_batches(source, seed=0, batch_size=256, preprocess=augment)
    evaluation = eval_arrays(open_split("cifar10", "test"), center_crop)

ImageNet-100 is the CMC subset (Tian, Krishnan, Isola 2019; `data/imagenet100_cmc.txt`)
of imagenet2012: the records of those 100 synsets, relabelled 0..99 in *sorted* synset
order, the order torchvision's `ImageFolder` gives the CMC class folders. Finding them
reads every record's label once (images left undecoded); the kept indices are cached as
`.npy` under `MPX_CACHE_DIR` (default `~/.cache/mpx`), keyed by the dataset's version,
split and length.

tensorflow-datasets and grain are imported on first use, so this module imports without
them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import itertools
import operator
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np

PROGRESS_EVERY = 20_000  # records between progress lines of a label scan / eval pass
_SCAN_CHUNK = 1024       # records per batched read of a label scan


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """An image set as mpx uses it: the TFDS dataset, its splits, its classes.

  The label is the TFDS feature "label" (CIFAR-100: the 100 fine labels).
  `cmc_subset`: keep only the CMC ImageNet-100 synsets, relabelled 0..99.
  """
  tfds_name: str
  train_split: str
  eval_split: str
  num_classes: int
  channels: int = 3
  cmc_subset: bool = False


DATASETS: dict[str, DatasetSpec] = {
    "cifar10": DatasetSpec("cifar10", "train", "test", 10),
    "cifar100": DatasetSpec("cifar100", "train", "test", 100),
    "imagenet100": DatasetSpec("imagenet2012", "train", "validation", 100, cmc_subset=True),
}


class DatasetUnavailable(FileNotFoundError):
  """The dataset is not prepared (or not as ArrayRecord); the message says how to."""


def dataset_spec(name: str) -> DatasetSpec:
  if name not in DATASETS:
    raise ValueError(f"unknown image dataset {name!r}; choose one of {tuple(DATASETS)}.")
  return DATASETS[name]


def imagenet100_synsets() -> tuple[str, ...]:
  """The 100 CMC synsets, in the data file's order (not sorted)."""
  text = (importlib.resources.files("mpx.tasks") / "data" / "imagenet100_cmc.txt").read_text()
  synsets = tuple(s for s in (line.strip() for line in text.splitlines())
                  if s and not s.startswith("#"))
  assert len(synsets) == len(set(synsets)) == 100, len(synsets)
  return synsets


# --------------------------------------------------------------------------- sources


class LabelledSource:
  """Random access `{"image": uint8 [H, W, C], "label": int}` over a TFDS data source:
  all its records, or those at `index` (ascending) relabelled by `relabel[label]`."""

  def __init__(self, base, index: np.ndarray | None = None,
               relabel: np.ndarray | None = None):
    self._base, self._index, self._relabel = base, index, relabel

  def __len__(self) -> int:
    return len(self._base) if self._index is None else len(self._index)

  def __getitem__(self, i) -> dict[str, Any]:
    i = operator.index(i)
    n = len(self)
    if not -n <= i < n:
      raise IndexError(f"record {i} of a source of {n}")
    i %= n
    example = self._base[i if self._index is None else int(self._index[i])]
    label = int(example["label"])
    if self._relabel is not None:
      label = int(self._relabel[label])
    return {"image": np.asarray(example["image"]), "label": label}


def open_split(name: str, split: str, data_dir: str | os.PathLike | None = None
               ) -> LabelledSource:
  """The records of `split` (a TFDS split string) of dataset `name` (`DATASETS`).

  data_dir: the TFDS data dir; None is TFDS's default (`TFDS_DATA_DIR`, read when
  tensorflow_datasets is imported, else ~/tensorflow_datasets). Raises
  `DatasetUnavailable` if the dataset is not there as ArrayRecord.
  """
  spec = dataset_spec(name)
  base = _tfds_source(name, spec, split, data_dir)
  if not spec.cmc_subset:
    return LabelledSource(base)
  import tensorflow_datasets as tfds
  info = tfds.builder(spec.tfds_name, data_dir=data_dir).info
  names = list(info.features["label"].names)
  synsets = sorted(imagenet100_synsets())
  missing = sorted(set(synsets) - set(names))
  if missing:
    raise ValueError(f"{spec.tfds_name} has no classes {missing[:5]}…; it is not ImageNet.")
  relabel = np.full(len(names), -1, np.int64)
  relabel[[names.index(s) for s in synsets]] = np.arange(len(synsets))
  index = _cmc_index(name, spec, split, data_dir, str(info.version), len(base), relabel)
  return LabelledSource(base, index, relabel)


def _cmc_index(name, spec, split, data_dir, version, length, relabel) -> np.ndarray:
  """Ascending indices of the records whose label has `relabel >= 0`, cached."""
  digest = hashlib.sha1(relabel.tobytes()).hexdigest()[:8]
  safe_split = re.sub(r"[^A-Za-z0-9_.-]+", "_", split)
  path = (_cache_dir() / name /
          f"{spec.tfds_name}-{version}-{safe_split}-{length}-{digest}.npy")
  if path.exists():
    try:
      index = np.load(path)
      if index.ndim == 1 and (not index.size or 0 <= index[0] <= index[-1] < length):
        return index
    except (OSError, ValueError):
      pass  # A truncated or foreign file: scan again.
  labels = _scan_labels(name, spec, split, data_dir, length)
  index = np.flatnonzero(relabel[labels] >= 0)
  if not index.size:
    raise ValueError(f"{spec.tfds_name} {split} has no record of the CMC synsets.")
  path.parent.mkdir(parents=True, exist_ok=True)
  partial = path.with_name(path.name + f".{os.getpid()}.tmp")
  with open(partial, "wb") as f:
    np.save(f, index)
  os.replace(partial, path)
  return index


def _cache_dir() -> Path:
  return Path(os.environ.get("MPX_CACHE_DIR") or Path.home() / ".cache" / "mpx")


def _scan_labels(name, spec, split, data_dir, length) -> np.ndarray:
  """Every record's label, read with the images left encoded (no image decoding)."""
  import tensorflow_datasets as tfds
  source = _tfds_source(name, spec, split, data_dir,
                        decoders={"image": tfds.decode.SkipDecoding()})
  if len(source) != length:
    raise ValueError(f"{spec.tfds_name} {split} changed while opened ({length} → "
                     f"{len(source)} records).")
  read = getattr(source, "__getitems__", None) or (lambda keys: [source[k] for k in keys])
  labels = np.empty(length, np.int64)
  for start in range(0, length, _SCAN_CHUNK):
    keys = list(range(start, min(start + _SCAN_CHUNK, length)))
    labels[start:keys[-1] + 1] = [int(r["label"]) for r in read(keys)]
    if (keys[-1] + 1) // PROGRESS_EVERY > start // PROGRESS_EVERY:
      print(f"mpx: {name} {split}: labels of {keys[-1] + 1:,}/{length:,} records read "
            "(once; the kept indices are cached)", file=sys.stderr, flush=True)
  return labels


# What `tfds.data_source(..., download=False)` raises for a dataset that is absent or
# only in tfrecord format (tensorflow-datasets 4.9): NotImplementedError ("Random access
# data source for file format tfrecord …", data_dir given, absent or tfrecord), KeyError
# ("splits is empty", data_dir None, absent), ValueError ("File format is already set to
# tfrecord", data_dir None, tfrecord). They are turned into `DatasetUnavailable` only when
# the builder confirms the cause; anything else is re-raised as it is.
_TFDS_UNAVAILABLE = (NotImplementedError, KeyError, ValueError)


def _tfds_source(name, spec, split, data_dir, decoders=None):
  import tensorflow_datasets as tfds
  try:
    return tfds.data_source(spec.tfds_name, split=split, data_dir=data_dir,
                            download=False, decoders=decoders)
  except _TFDS_UNAVAILABLE:
    message = _unavailable_message(name, spec, data_dir)
    if message is None:
      raise
  raise DatasetUnavailable(message) from None


def _unavailable_message(name, spec, data_dir) -> str | None:
  """How to prepare the dataset, or None if it is there as ArrayRecord."""
  import tensorflow_datasets as tfds
  builder = tfds.builder(spec.tfds_name, data_dir=data_dir)
  found = Path(os.fspath(builder.data_dir))  # DIR/<tfds name>/<version>
  root = found.parent.parent
  searched = (f"data_dir {root}" if data_dir is not None else
              f"TFDS's default data_dir {root} (TFDS_DATA_DIR, else ~/tensorflow_datasets)")
  build = f"tfds build {spec.tfds_name} --file_format=array_record --data_dir={root}"
  use = (f"Then point mpx at it: export TFDS_DATA_DIR={root} (before Python starts) "
         f"or --set data_dir={root}.")
  if builder.is_prepared():
    formats = {f.value for f in builder.info.available_file_formats()}
    if "array_record" in formats:
      return None
    return (f"{name}: {spec.tfds_name} is prepared at {found} but as "
            f"{', '.join(sorted(formats)) or 'an unknown format'}, and tfds.data_source "
            "needs array_record (TensorFlow is needed only for this step). Convert it in "
            f"place: tfds convert_format --dataset_version_dir={found} "
            f"--out_file_format=array_record; or delete {found} and rebuild: {build}. {use}")
  steps = ["pip install tensorflow tensorflow-datasets   (TensorFlow is needed only to "
           "build; mpx reads the files without it)", build]
  if spec.cmc_subset:
    steps.insert(0, "download ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar from "
                 f"https://image-net.org (manual download, needs an account) into "
                 f"{root / 'downloads' / 'manual'}/")
  listed = "\n".join(f"  {i}. {s}" for i, s in enumerate(steps, 1))
  return (f"{name}: {spec.tfds_name} is not prepared in {searched} (looked for {found}). "
          f"Prepare it once as ArrayRecord:\n{listed}\n{use}")


# --------------------------------------------------------------------------- batches


def train_batches(source, *, seed: int, batch_size: int,
                  preprocess: Callable[[Mapping[str, Any], np.random.Generator], Mapping],
                  start_step: int = 0, num_threads: int = 0
                  ) -> Iterator[dict[str, np.ndarray]]:
  """The batches of steps `start_step`, `start_step + 1`, … (endless), each
  `{"image": [B, h, w, C], "label": int32 [B]}` (any other key `preprocess` returns too).

  Epoch e is a permutation of `source` drawn from (seed, e); the epochs run back to back
  and the batches cut that stream in `batch_size` slices (one may straddle two epochs).
  `preprocess(example, rng)` augments one example; its `rng` is
  `np.random.default_rng([seed', position])`, position = step * batch_size + row, so the
  batch of a step never depends on where the iterator started. `num_threads > 0` reads
  and preprocesses examples in that many threads (grain); the batches are the same.
  """
  import grain
  if batch_size < 1 or start_step < 0 or num_threads < 0:
    raise ValueError(f"batch_size={batch_size} must be >= 1, start_step={start_step} and "
                     f"num_threads={num_threads} >= 0.")
  if len(source) < 1:
    raise ValueError("the training source has no records.")
  # Two unrelated 32-bit seeds: grain's per-epoch shuffle seed is `seed + epoch`, so the raw
  # seed would give seed s in epoch 1 the order of seed s + 1 in epoch 0.
  shuffle_seed, map_seed = (int(s) for s in np.random.SeedSequence(seed).generate_state(2))

  def augment(position, example):
    return preprocess(example, np.random.default_rng([map_seed, position]))

  examples = (grain.MapDataset.source(source).shuffle(seed=shuffle_seed).repeat(None)
              .map_with_index(augment))[start_step * batch_size:]
  if num_threads:
    batches = examples.to_iter_dataset(grain.ReadOptions(
        num_threads=num_threads, prefetch_buffer_size=max(2 * batch_size, 2 * num_threads)))
    batches = iter(batches.batch(batch_size, drop_remainder=True))
  else:
    batched = examples.batch(batch_size, drop_remainder=True)
    batches = (batched[i] for i in itertools.count())
  return ({**batch, "label": np.asarray(batch["label"], np.int32)} for batch in batches)


def make_stream_fn(source, *, batch_size: int, preprocess: Callable, num_threads: int = 0
                   ) -> Callable[[int, int], Iterator[dict[str, np.ndarray]]]:
  """`batches(seed, start_step)` for `mpx.sweep.data.Stream(batches=..., seed=...)`."""
  def batches(seed: int, start_step: int) -> Iterator[dict[str, np.ndarray]]:
    return train_batches(source, seed=seed, batch_size=batch_size, preprocess=preprocess,
                         start_step=start_step, num_threads=num_threads)
  return batches


def eval_arrays(source, preprocess: Callable[[Mapping[str, Any]], Mapping],
                limit: int | None = None) -> dict[str, np.ndarray]:
  """The first `limit` (default all) records of `source`, in record order, through the
  deterministic `preprocess(example)`: `{"image": [E, h, w, C], "label": int32 [E]}`."""
  total = len(source) if limit is None else min(limit, len(source))
  if total < 1:
    raise ValueError(f"no evaluation records (source of {len(source)}, limit={limit}).")
  arrays: dict[str, np.ndarray] = {}
  for i in range(total):
    example = preprocess(source[i])
    if not arrays:
      arrays = {k: np.empty((total,) + np.shape(v), np.asarray(v).dtype)
                for k, v in example.items()}
    for k, v in example.items():
      arrays[k][i] = v
    if (i + 1) % PROGRESS_EVERY == 0:
      print(f"mpx: evaluation set: {i + 1:,}/{total:,} records", file=sys.stderr,
            flush=True)
  arrays["label"] = arrays["label"].astype(np.int32, copy=False)
  return arrays
