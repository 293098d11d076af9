"""mpx.tasks.vision.data: TFDS sources (mocked, no TensorFlow), the ImageNet-100 subset and
its index cache, seeded resumable batches, and the messages for a missing dataset.

ImageNet-100 runs on `mock_data(as_data_source_fn=...)`: the test picks every record's
synset, and the fake honours `decoders` (the label scan asks for undecoded images; the
default mock would need TensorFlow to encode them).
"""

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

tfds = pytest.importorskip("tensorflow_datasets")
pytest.importorskip("grain")

from mpx.sweep.data import ChunkFeeder, Stream  # noqa: E402
from mpx.tasks.vision import data as image_data  # noqa: E402

CMC_FILE = Path(image_data.__file__).parents[1] / "data" / "imagenet100_cmc.txt"


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
  path = tmp_path / "mpx-cache"
  monkeypatch.setenv("MPX_CACHE_DIR", str(path))
  return path


def _cmc() -> list[str]:
  """The CMC synsets, read here independently of the module."""
  return [s.strip() for s in CMC_FILE.read_text().splitlines()
          if s.strip() and not s.startswith("#")]


def test_imagenet100_synsets():
  synsets = image_data.imagenet100_synsets()
  assert len(synsets) == len(set(synsets)) == 100
  assert synsets[:3] == ("n02869837", "n01749939", "n02488291")
  assert list(synsets) == _cmc()


def test_unknown_dataset_name_lists_the_names():
  with pytest.raises(ValueError, match="cifar10.*cifar100.*imagenet100"):
    image_data.open_split("mnist", "train")


# --------------------------------------------------------------------------- CIFAR


@pytest.mark.parametrize("name,classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar_records(name, classes):
  spec = image_data.DATASETS[name]
  assert spec.num_classes == classes and spec.channels == 3
  with tfds.testing.mock_data(num_examples=12):
    for split in (spec.train_split, spec.eval_split):
      source = image_data.open_split(name, split)
      raw = tfds.data_source(spec.tfds_name, split=split)
      assert len(source) == 12
      for i in range(len(source)):
        example = source[i]
        assert set(example) == {"image", "label"}
        assert example["image"].dtype == np.uint8 and example["image"].shape == (32, 32, 3)
        assert type(example["label"]) is int and 0 <= example["label"] < classes
        np.testing.assert_array_equal(example["image"], raw[i]["image"])
        assert example["label"] == int(raw[i]["label"])  # CIFAR-100: the fine label


# --------------------------------------------------------------------------- ImageNet-100


def _records(n_other=3):
  """Record synsets: CMC ones (both ends of the sorted order, a duplicate) and others."""
  cmc = _cmc()
  names = tfds.builder("imagenet2012").info.features["label"].names
  other = [s for s in names if s not in set(cmc)][:n_other]
  return [cmc[3], other[0], min(cmc), cmc[50], other[1], cmc[3], max(cmc)] + other[2:]


def _fake_imagenet(synsets, calls):
  def as_data_source(self, split, decoders=None, deserialize_method=None, **kwargs):
    calls.append(decoders)
    names = self.info.features["label"].names
    skip = decoders is not None
    if skip:
      assert isinstance(decoders["image"], tfds.decode.SkipDecoding)
    return [{"image": b"\xff\xd8 jpeg" if skip else
             np.full((5 + i % 7, 9 + i % 4, 3), i, np.uint8),
             "label": np.int64(names.index(s)), "file_name": f"{s}_{i}.JPEG"}
            for i, s in enumerate(synsets)]
  return as_data_source


def test_imagenet100_keeps_cmc_records_relabelled_in_sorted_order():
  synsets = _records()
  order = sorted(_cmc())
  kept = [i for i, s in enumerate(synsets) if s in set(order)]
  with tfds.testing.mock_data(as_data_source_fn=_fake_imagenet(synsets, [])):
    source = image_data.open_split("imagenet100", "train")
  assert len(source) == len(kept) < len(synsets)
  labels = []
  for j, i in enumerate(kept):
    example = source[j]
    assert example["image"].dtype == np.uint8 and example["image"].ndim == 3
    np.testing.assert_array_equal(example["image"],
                                  np.full((5 + i % 7, 9 + i % 4, 3), i, np.uint8))
    assert type(example["label"]) is int and 0 <= example["label"] < 100
    assert example["label"] == order.index(synsets[i])
    labels.append(example["label"])
  assert 0 in labels and 99 in labels


def test_imagenet100_index_cache_is_reused_until_the_length_changes(cache_dir):
  calls = []
  scans = lambda: sum(d is not None for d in calls)  # noqa: E731
  synsets = _records()
  with tfds.testing.mock_data(as_data_source_fn=_fake_imagenet(synsets, calls)):
    first = image_data.open_split("imagenet100", "train")
    assert scans() == 1 and len(list(cache_dir.rglob("*.npy"))) == 1
    again = image_data.open_split("imagenet100", "train")
    assert scans() == 1
    assert [again[i]["label"] for i in range(len(again))] == \
        [first[i]["label"] for i in range(len(first))]
  longer = synsets + [_cmc()[7]]
  with tfds.testing.mock_data(as_data_source_fn=_fake_imagenet(longer, calls)):
    source = image_data.open_split("imagenet100", "train")
  assert scans() == 2 and len(source) == len(first) + 1
  assert source[len(source) - 1]["label"] == sorted(_cmc()).index(_cmc()[7])


# --------------------------------------------------------------------------- batches

N = 10


def _source():
  return [{"image": np.full((3, 2, 1), i, np.uint8), "label": i} for i in range(N)]


def _augment(example, rng):
  return {"image": example["image"] + np.uint8(rng.integers(0, 100)), "label": example["label"],
          "draw": rng.integers(1 << 40)}


def _take(seed, steps, start_step=0, num_threads=0, batch_size=4):
  batches = image_data.train_batches(_source(), seed=seed, batch_size=batch_size,
                                     preprocess=_augment, start_step=start_step,
                                     num_threads=num_threads)
  return [next(batches) for _ in range(steps)]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_batches_are_a_function_of_seed_and_step():
  batches = _take(seed=7, steps=6)
  assert batches[0]["image"].shape == (4, 3, 2, 1) and batches[0]["image"].dtype == np.uint8
  assert batches[0]["label"].shape == (4,) and batches[0]["label"].dtype == np.int32
  _assert_same(batches, _take(seed=7, steps=6))
  other = _take(seed=8, steps=6)
  assert any(not np.array_equal(a["label"], b["label"]) for a, b in zip(batches, other))
  assert all(not np.array_equal(a["draw"], b["draw"]) for a, b in zip(batches, other))


@pytest.mark.parametrize("start", [1, 3, 7])  # 7: past two epoch boundaries
def test_resume_reads_the_batches_of_an_uninterrupted_run(start):
  _assert_same(_take(seed=3, steps=4, start_step=start), _take(seed=3, steps=start + 4)[start:])


def test_each_epoch_is_a_fresh_permutation():
  epochs = np.concatenate([b["label"] for b in _take(seed=5, steps=10)]).reshape(4, N)
  for epoch in epochs:
    assert sorted(epoch) == list(range(N))
  assert len({tuple(e) for e in epochs}) == 4
  # grain's per-epoch seed is seed + epoch; seed 6's first epoch must not be seed 5's second.
  first_of_6 = np.concatenate([b["label"] for b in _take(seed=6, steps=5)])[:N]
  assert not np.array_equal(first_of_6, epochs[1])
  # One example's draws differ between epochs (the rng follows the position).
  draws = np.concatenate([b["draw"] for b in _take(seed=5, steps=10)]).reshape(4, N)
  per_example = [draws[e][np.argsort(epochs[e])] for e in range(4)]
  assert not np.array_equal(per_example[0], per_example[1])


def test_threaded_reads_equal_unthreaded():
  _assert_same(_take(seed=2, steps=6, start_step=2, num_threads=3),
               _take(seed=2, steps=6, start_step=2))


def test_stream_fn_feeds_the_engine_from_a_tfds_source():
  def crop(example, rng):
    y, x = rng.integers(0, 9, size=2)
    return {"image": example["image"][y:y + 24, x:x + 24], "label": example["label"]}

  with tfds.testing.mock_data(num_examples=20):
    source = image_data.open_split("cifar10", "train")
    fn = image_data.make_stream_fn(source, batch_size=8, preprocess=crop, num_threads=2)
    feeder = ChunkFeeder(Stream(batches=fn, seed=4), start_step=1, total_steps=5,
                         chunk_steps=2, put=lambda chunk: chunk)
    try:
      chunk = feeder.next()
    finally:
      feeder.close()
    direct = image_data.train_batches(source, seed=4, batch_size=8, preprocess=crop,
                                      start_step=1)
    expected = [next(direct), next(direct)]
  assert chunk["image"].shape == (2, 8, 24, 24, 3) and chunk["image"].dtype == np.uint8
  assert chunk["label"].dtype == np.int32 and chunk["label"].max() < 10
  _assert_same([{k: v[t] for k, v in chunk.items()} for t in range(2)], expected)


def test_per_seed_stream_stacks_each_seeds_pipeline():
  """Seeds 4 and 5: chunks [T, S, B, ...], row s is seed s's own pipeline (its order and
  crops), and the last chunk is padded with its last step."""
  def crop(example, rng):
    y, x = rng.integers(0, 9, size=2)
    return {"image": example["image"][y:y + 24, x:x + 24], "label": example["label"]}

  with tfds.testing.mock_data(num_examples=20):
    source = image_data.open_split("cifar10", "train")
    fn = image_data.make_stream_fn(source, batch_size=8, preprocess=crop)
    feeder = ChunkFeeder(Stream(batches=fn, seeds=(4, 5)), start_step=1, total_steps=4,
                         chunk_steps=2, put=lambda chunk: chunk)
    try:
      chunks = [feeder.next(), feeder.next()]
    finally:
      feeder.close()
    expected = {seed: list(itertools.islice(image_data.train_batches(
        source, seed=seed, batch_size=8, preprocess=crop, start_step=1), 3))
        for seed in (4, 5)}
  assert chunks[0]["image"].shape == (2, 2, 8, 24, 24, 3)
  assert chunks[0]["image"].dtype == np.uint8 and chunks[0]["label"].dtype == np.int32
  for s, seed in enumerate((4, 5)):
    steps = [{k: v[t, s] for k, v in chunk.items()} for chunk in chunks for t in range(2)]
    _assert_same(steps, expected[seed] + expected[seed][-1:])  # Step 4 pads step 3.
  assert not np.array_equal(chunks[0]["image"][:, 0], chunks[0]["image"][:, 1])


def test_eval_arrays_in_record_order():
  def center(example):
    return {"image": example["image"][1:2], "label": example["label"]}

  arrays = image_data.eval_arrays(_source(), center)
  assert arrays["image"].shape == (N, 1, 2, 1) and arrays["image"].dtype == np.uint8
  assert arrays["label"].dtype == np.int32
  np.testing.assert_array_equal(arrays["label"], np.arange(N))
  np.testing.assert_array_equal(arrays["image"][:, 0, 0, 0], np.arange(N))
  assert len(image_data.eval_arrays(_source(), center, limit=3)["label"]) == 3


# --------------------------------------------------------------------------- unavailable


def _assert_unavailable(error, *needles):
  assert isinstance(error, image_data.DatasetUnavailable)
  assert isinstance(error, FileNotFoundError)
  assert error.__cause__ is None and error.__suppress_context__
  message = str(error)
  for needle in needles:
    assert needle in message, (needle, message)


@pytest.mark.parametrize("name", ["cifar10", "imagenet100"])
def test_missing_dataset_says_how_to_build_it(name, tmp_path):
  data_dir = tmp_path / "tfds"
  tfds_name = image_data.DATASETS[name].tfds_name
  with pytest.raises(image_data.DatasetUnavailable) as caught:
    image_data.open_split(name, "train", data_dir=str(data_dir))
  _assert_unavailable(
      caught.value, str(data_dir), "pip install tensorflow tensorflow-datasets",
      f"tfds build {tfds_name} --file_format=array_record --data_dir={data_dir}",
      f"export TFDS_DATA_DIR={data_dir}", f"--set data_dir={data_dir}")
  manual = ["ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar", "image-net.org",
            f"{data_dir}/downloads/manual/"]
  assert all((m in str(caught.value)) == (name == "imagenet100") for m in manual)


def _tfrecord_dataset(data_dir):
  """What `tfds build cifar10` (default format) leaves: metadata saying tfrecord."""
  builder = tfds.builder("cifar10", data_dir=str(data_dir), file_format="tfrecord")
  path = Path(builder.data_dir)
  path.mkdir(parents=True)
  builder.info.write_to_directory(path)
  assert json.loads((path / "dataset_info.json").read_text())["fileFormat"] == "tfrecord"
  return path


@pytest.mark.parametrize("default_dir", [False, True])
def test_tfrecord_dataset_says_rebuild_as_array_record(tmp_path, monkeypatch, default_dir):
  data_dir = tmp_path / "tfds"
  found = _tfrecord_dataset(data_dir)
  if default_dir:  # data_dir=None: TFDS raises differently there.
    monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(data_dir))
  with pytest.raises(image_data.DatasetUnavailable) as caught:
    image_data.open_split("cifar10", "test", data_dir=None if default_dir else data_dir)
  _assert_unavailable(caught.value, str(found), "tfrecord",
                      f"tfds build cifar10 --file_format=array_record --data_dir={data_dir}",
                      "tfds convert_format", "--out_file_format=array_record")


def test_missing_in_the_default_data_dir(tmp_path, monkeypatch):
  monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(tmp_path / "default"))
  with pytest.raises(image_data.DatasetUnavailable) as caught:
    image_data.open_split("cifar100", "train")
  _assert_unavailable(caught.value, f"default data_dir {tmp_path / 'default'}",
                      "tfds build cifar100 --file_format=array_record")
