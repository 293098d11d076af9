"""mpx.tasks.language.text: the embedded KJV splits, WikiText-2 and TinyStories from generated files
in each published layout, the messages for a missing dataset, the byte and BPE tokenizers,
token streams and training windows."""

import json
import lzma
from pathlib import Path

import numpy as np
import pytest

from mpx.tasks.language import text

KJV_FILE = Path(text.__file__).parents[1] / "data" / "kjv.txt.xz"

WIKI_LINES = {
    "train": [" \n", " = Valkyria Chronicles III = \n", " \n",
              " Senjō no Valkyria 3 : Unrecorded Chronicles ( Japanese : 戦場のヴァルキュリア3 )"
              " , commonly referred to as Valkyria Chronicles III outside Japan . \n",
              "\n", " = = Gameplay = = \n", "\n",
              " As with previous Valkyira Chronicles games , the game is a tactical role @-@ "
              "playing game . \n"],
    "validation": [" \n", " = Homarus gammarus = \n", " \n",
                   " Homarus gammarus , known as the European lobster or common lobster . \n"],
    "test": [" \n", " = Robert Boulter = \n", " \n",
             " Robert Boulter is an English film , television and theatre actor . \n"],
}
WIKI_FILES = {"train": "wiki.train.raw", "validation": "wiki.valid.raw",
              "test": "wiki.test.raw"}

STORIES = {
    "train": ["Once upon a time, there was a little girl named Lily.\nShe liked to play.",
              "Tom had a red ball. He threw it high — très haut! 🎈",
              "The sun was hot. Ben and Sue went to the park."],
    "validation": ["Spot was a good dog. He ran and ran.", "Mia found a shiny stone."],
}


def _write_parquet(path: Path, rows: list[str]) -> None:
  pa = pytest.importorskip("pyarrow")
  import pyarrow.parquet as pq
  path.parent.mkdir(parents=True, exist_ok=True)
  pq.write_table(pa.table({"text": rows}), path)


# --------------------------------------------------------------------------- kjv


def test_kjv_splits():
  splits = {s: text.read_documents("kjv", s) for s in text.SPLITS}
  assert sum(len(d) for d in splits.values()) == 1189
  assert [len(splits[s]) for s in text.SPLITS] == [1071, 59, 59]
  everything = [doc for docs in splits.values() for doc in docs]
  assert len(set(everything)) == 1189  # disjoint (and no chapter repeats)
  for docs in splits.values():
    assert all(doc.endswith("\n") and not doc.endswith("\n\n") for doc in docs)
  assert splits["train"][0].startswith("Genesis 1\nIn the beginning God created")
  assert splits["train"][-1].startswith("Revelation 22\n")
  assert splits["test"][0].startswith("Genesis 10\n")           # chapter 9
  assert splits["validation"][0].startswith("Genesis 20\n")     # chapter 19
  assert splits["validation"][1].startswith("Genesis 40\n")     # chapter 39
  assert text.read_documents("kjv", "train", data_dir="/nowhere") == splits["train"]


def test_kjv_chapters_are_the_file():
  """Every chapter's text as in the file: the chapters hold every line but the blanks."""
  raw = lzma.decompress(KJV_FILE.read_bytes()).decode("utf-8")
  lines = [line + "\n" for line in raw.split("\n") if line.strip()]
  chapters = [text.read_documents("kjv", s) for s in text.SPLITS]
  order = {}
  for split, docs in zip(text.SPLITS, chapters):
    for doc in docs:
      order[raw.index(doc)] = doc
  assert "".join(order[k] for k in sorted(order)) == "".join(lines)


# --------------------------------------------------------------------------- wikitext2


def _write_wikitext(folder: Path) -> None:
  folder.mkdir(parents=True, exist_ok=True)
  for split, name in WIKI_FILES.items():
    (folder / name).write_bytes("".join(WIKI_LINES[split]).encode("utf-8"))


@pytest.mark.parametrize("layout", ["flat", "wikitext-2-raw"])
def test_wikitext2_raw_files(tmp_path, layout):
  _write_wikitext(tmp_path if layout == "flat" else tmp_path / "wikitext-2-raw")
  for split in text.SPLITS:
    lines = text.read_documents("wikitext2", split, data_dir=tmp_path)
    assert lines == WIKI_LINES[split]
    assert "".join(lines) == (tmp_path if layout == "flat" else tmp_path / "wikitext-2-raw"
                              ).joinpath(WIKI_FILES[split]).read_text(encoding="utf-8")


def test_wikitext2_lines_end_only_at_newlines(tmp_path):
  """A line separator inside a line (U+2028, \\x1c, \\r) does not cut it."""
  lines = [" a\u2028b \n", " c\x1cd\r \n", " e \n"]
  (tmp_path / "wiki.test.raw").write_bytes("".join(lines).encode("utf-8"))
  assert text.read_documents("wikitext2", "test", data_dir=str(tmp_path)) == lines


def test_wikitext2_parquet_snapshot(tmp_path):
  root = tmp_path / "datasets--Salesforce--wikitext"
  snapshot = root / "snapshots" / "abc" / "wikitext-2-raw-v1"
  for split in text.SPLITS:
    _write_parquet(snapshot / f"{split}-00000-of-00001.parquet", WIKI_LINES[split])
  # The non-raw config beside it must not be read.
  _write_parquet(root / "snapshots" / "abc" / "wikitext-2-v1" /
                 "train-00000-of-00001.parquet", [" <unk> \n"])
  for split in text.SPLITS:
    assert text.read_documents("wikitext2", split, data_dir=root) == WIKI_LINES[split]


def test_wikitext2_parquet_shards_in_order_and_empty_rows(tmp_path):
  """Shards are read in name order; the hub's empty rows ("") get their "\\n"."""
  folder = tmp_path / "wikitext-2-raw-v1"
  _write_parquet(folder / "train-00001-of-00002.parquet", [" c \n"])
  _write_parquet(folder / "train-00000-of-00002.parquet", ["", " = A = \n", "", " b \n"])
  assert text.read_documents("wikitext2", "train", data_dir=tmp_path) == [
      "\n", " = A = \n", "\n", " b \n", " c \n"]


def test_wikitext2_several_snapshots(tmp_path):
  """Two hub snapshots: `refs/main` picks one; without it, a ValueError (not both)."""
  for revision, line in (("old", " old \n"), ("new", " new \n")):
    _write_parquet(tmp_path / "snapshots" / revision / "wikitext-2-raw-v1" /
                   "test-00000-of-00001.parquet", [line])
  with pytest.raises(ValueError, match="pass one of them"):
    text.read_documents("wikitext2", "test", data_dir=tmp_path)
  (tmp_path / "refs").mkdir()
  (tmp_path / "refs" / "main").write_text("new")
  assert text.read_documents("wikitext2", "test", data_dir=tmp_path) == [" new \n"]


def test_wikitext2_raw_files_come_before_parquet(tmp_path):
  _write_wikitext(tmp_path)
  _write_parquet(tmp_path / "wikitext-2-raw-v1" / "test-00000-of-00001.parquet", [" x \n"])
  assert text.read_documents("wikitext2", "test", data_dir=tmp_path) == WIKI_LINES["test"]


# --------------------------------------------------------------------------- tinystories


def _story_file(stories: list[str]) -> str:
  return "".join(f"{story}\n<|endoftext|>\n" for story in stories)


V1 = ("TinyStories-train.txt", "TinyStories-valid.txt")
V2 = ("TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt")


def _write_stories(folder: Path, names, stories=STORIES) -> None:
  for name, split in zip(names, ("train", "validation")):
    (folder / name).write_text(_story_file(stories[split]), encoding="utf-8")


@pytest.mark.parametrize("dataset, names", [("tinystories", V1), ("tinystories_v2", V2)])
def test_tinystories_text_files(tmp_path, dataset, names):
  (tmp_path / names[0]).write_text(_story_file(STORIES["train"]), encoding="utf-8")
  # Blank padding and an empty story between separators: stripped and dropped.
  (tmp_path / names[1]).write_text(
      "\n" + _story_file(STORIES["validation"][:1]) + "\n<|endoftext|>\n  " +
      STORIES["validation"][1] + "\n\n", encoding="utf-8")
  assert text.read_documents(dataset, "train", data_dir=tmp_path) == STORIES["train"]
  assert (text.read_documents(dataset, "validation", data_dir=tmp_path) ==
          STORIES["validation"])


def test_tinystories_text_file_read_in_chunks(tmp_path, monkeypatch):
  """A separator cut by a chunk boundary still separates."""
  monkeypatch.setattr(text, "_READ_CHUNK", 7)
  (tmp_path / "TinyStories-valid.txt").write_text(_story_file(STORIES["train"]),
                                                  encoding="utf-8")
  assert (text.read_documents("tinystories", "validation", data_dir=tmp_path) ==
          STORIES["train"])


def test_tinystories_is_the_papers_v1_where_v2_is_also_there(tmp_path):
  """V1 and V2 side by side: `tinystories` reads V1, and records those files; V2 only
  when named."""
  v2 = {split: [f"{story} (V2)" for story in stories] for split, stories in STORIES.items()}
  _write_stories(tmp_path, V1)
  _write_stories(tmp_path, V2, v2)
  for split in ("train", "validation"):
    assert text.read_documents("tinystories", split, data_dir=tmp_path) == STORIES[split]
    assert text.read_documents("tinystories_v2", split, data_dir=tmp_path) == v2[split]
  size = lambda name: (tmp_path / name).stat().st_size
  assert text.data_files("tinystories", ("train", "validation"), tmp_path) == {
      "train": {V1[0]: size(V1[0])}, "validation": {V1[1]: size(V1[1])}}
  assert text.data_files("tinystories_v2", ("validation",), tmp_path) == {
      "validation": {V2[1]: size(V2[1])}}


@pytest.mark.parametrize("dataset", ["tinystories", "tinystories_v2"])
def test_tinystories_mixed_versions_are_refused(tmp_path, dataset):
  """V2's train file beside V1's validation file: whichever version is asked for, and
  whichever split, one line that names both files."""
  (tmp_path / V2[0]).write_text(_story_file(STORIES["train"]), encoding="utf-8")
  (tmp_path / V1[1]).write_text(_story_file(STORIES["validation"]), encoding="utf-8")
  for split in ("train", "validation"):
    with pytest.raises(ValueError) as raised:
      text.read_documents(dataset, split, data_dir=tmp_path)
    message = str(raised.value)
    assert "\n" not in message and not isinstance(raised.value, text.DatasetUnavailable)
    assert V2[0] in message and V1[1] in message and "--set dataset=" in message


def test_tinystories_missing_version_names_the_one_there(tmp_path):
  _write_stories(tmp_path, V2)
  with pytest.raises(text.DatasetUnavailable, match="which holds tinystories_v2's "
                     "TinyStoriesV2-GPT4-train.txt.*--preset tinystories --set data_dir"):
    text.read_documents("tinystories", "train", data_dir=tmp_path)


@pytest.mark.parametrize("sub", ["", "TinyStories_all_data"])
def test_tinystories_json_shards(tmp_path, sub):
  folder = tmp_path / sub
  folder.mkdir(exist_ok=True)
  shards = {"data00.json": STORIES["validation"], "data01.json": STORIES["train"][:2],
            "data02.json": STORIES["train"][2:]}
  for name, stories in shards.items():
    records = [{"story": s + "\n", "instruction": {}, "source": "GPT-4"} for s in stories]
    (folder / name).write_text(json.dumps(records), encoding="utf-8")
  dataset = "tinystories_all"
  assert text.read_documents(dataset, "train", data_dir=tmp_path) == STORIES["train"]
  assert (text.read_documents(dataset, "validation", data_dir=tmp_path) ==
          STORIES["validation"])
  assert list(text.data_files(dataset, ("train",), tmp_path)["train"]) == [
      str(Path(sub) / "data01.json"), str(Path(sub) / "data02.json")]
  with pytest.raises(text.DatasetUnavailable):  # The shards are not V1.
    text.read_documents("tinystories", "train", data_dir=tmp_path)


def test_tinystories_parquet(tmp_path):
  data = tmp_path / "snapshots" / "f54c09" / "data"
  _write_parquet(data / "train-00000-of-00002-aa.parquet", STORIES["train"][:1])
  _write_parquet(data / "train-00001-of-00002-bb.parquet", STORIES["train"][1:])
  _write_parquet(data / "validation-00000-of-00001-cc.parquet", STORIES["validation"])
  assert text.read_documents("tinystories", "train", data_dir=tmp_path) == STORIES["train"]
  assert (text.read_documents("tinystories", "validation", data_dir=tmp_path) ==
          STORIES["validation"])
  assert list(text.data_files("tinystories", ("train",), tmp_path)["train"]) == [
      "snapshots/f54c09/data/train-00000-of-00002-aa.parquet",
      "snapshots/f54c09/data/train-00001-of-00002-bb.parquet"]


def test_data_files_of_the_embedded_kjv():
  assert text.data_files("kjv", ("train", "test")) == {
      split: {"kjv.txt.xz": KJV_FILE.stat().st_size} for split in ("train", "test")}


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize("dataset,split,names", [
    ("wikitext2", "validation", ["wiki.valid.raw", "wikitext-2-raw/",
                                 "wikitext-2-raw-v1/validation-*.parquet",
                                 "Salesforce/wikitext", "--preset wikitext2"]),
    ("tinystories", "train", ["TinyStories-train.txt", "data/train-*.parquet",
                              "roneneldan/TinyStories", "--preset tinystories",
                              "tinystories_v2 or tinystories_all"]),
    ("tinystories_v2", "validation", ["TinyStoriesV2-GPT4-valid.txt",
                                      "--set dataset=tinystories_v2"]),
    ("tinystories_all", "train", ["data01.json", "TinyStories_all_data.tar.gz",
                                  "--set dataset=tinystories_all"]),
])
def test_missing_dataset_says_what_and_where(tmp_path, dataset, split, names):
  with pytest.raises(text.DatasetUnavailable) as raised:
    text.read_documents(dataset, split, data_dir=tmp_path)
  assert isinstance(raised.value, FileNotFoundError)
  message = str(raised.value)
  for name in names + [dataset, f"data_dir {tmp_path}", "--set data_dir=DIR",
                       "huggingface-cli download"]:
    assert name in message, name
  with pytest.raises(text.DatasetUnavailable, match="no data_dir was given"):
    text.read_documents(dataset, split)
  with pytest.raises(text.DatasetUnavailable, match="is not a folder"):
    text.read_documents(dataset, split, data_dir=tmp_path / "absent")


def test_one_split_present_is_not_another(tmp_path):
  (tmp_path / "wiki.train.raw").write_text(" x \n")
  (tmp_path / "data00.json").write_text(json.dumps([{"story": "a"}]))
  with pytest.raises(text.DatasetUnavailable, match="wiki.test.raw"):
    text.read_documents("wikitext2", "test", data_dir=tmp_path)
  with pytest.raises(text.DatasetUnavailable, match="data01.json"):
    text.read_documents("tinystories_all", "train", data_dir=tmp_path)


def test_unknown_dataset_or_split():
  with pytest.raises(ValueError, match="kjv.*wikitext2.*tinystories"):
    text.read_documents("ptb", "train")
  with pytest.raises(ValueError, match="train.*validation.*test"):
    text.read_documents("kjv", "valid")
  with pytest.raises(ValueError, match=r"tinystories has no split 'test'.*'train', "
                                       r"'validation'"):
    text.read_documents("tinystories", "test", data_dir="/nowhere")


# --------------------------------------------------------------------------- tokenizers

SAMPLE = "Hello, world!\n Héllo — naïve café; 戦場のヴァルキュリア 😀🎈 <|endoftext|> end."


def test_byte_tokenizer():
  tok = text.ByteTokenizer()
  assert (tok.name, tok.vocab_size, tok.eos_id) == ("bytes", 257, 256)
  ids = tok.encode(SAMPLE)
  assert ids.dtype == np.int32 and ids.ndim == 1
  assert ids.tolist() == list(SAMPLE.encode("utf-8"))
  assert tok.decode(ids) == SAMPLE
  assert tok.decode(np.concatenate([ids[:5], [256], ids[5:], [256]])) == SAMPLE
  assert tok.byte_lengths().shape == (257,) and tok.byte_lengths().dtype == np.int32
  assert tok.byte_lengths()[ids].sum() == len(SAMPLE.encode("utf-8"))
  assert tok.decode([0xE6, 0x88]) == "\ufffd"  # a cut character: replaced, no error
  with pytest.raises(ValueError, match="257"):
    tok.decode([257])


def _corpus(n: int = 300, seed: int = 0) -> list[str]:
  """Short sentences over a small vocabulary, some with non-ASCII words."""
  rng = np.random.default_rng(seed)
  words = ("the cat dog sat ran on a mat big small red café naïve über 東京 and then "
           "quickly slowly garden house").split()
  return [" ".join(rng.choice(words, rng.integers(3, 9))).capitalize() + ".\n"
          for _ in range(n)]


@pytest.fixture(scope="module")
def bpe():
  return text.train_bpe(_corpus(), 300)


def test_bpe_round_trip(bpe):
  assert bpe.name == f"bpe{bpe.vocab_size}" and bpe.vocab_size <= 300
  assert bpe.vocab_size > 257  # it learnt merges
  for sample in [SAMPLE, "".join(_corpus(20, seed=1)), "", " ", "\n\n", "\x00\x7f"]:
    ids = bpe.encode(sample)
    assert ids.dtype == np.int32 and ids.ndim == 1
    assert bpe.decode(ids) == sample
    assert bpe.byte_lengths()[ids].sum() == len(sample.encode("utf-8"))
  assert bpe.eos_id not in bpe.encode(SAMPLE)  # "<|endoftext|>" in a text is text
  assert bpe.decode([bpe.eos_id]) == ""
  lengths = bpe.byte_lengths()
  assert lengths.shape == (bpe.vocab_size,) and lengths.dtype == np.int32
  assert lengths[bpe.eos_id] == 1 and lengths.max() > 2
  whole = [i for i in range(bpe.vocab_size)
           if i != bpe.eos_id and "\ufffd" not in bpe.decode([i])]
  assert len(whole) > 100  # (the rest hold part of a character)
  for i in whole:
    assert lengths[i] == len(bpe.decode([i]).encode("utf-8"))


def test_bpe_compresses_its_training_text(bpe):
  corpus = "".join(_corpus())
  assert len(bpe.encode(corpus)) < 0.6 * len(corpus.encode("utf-8"))


def test_bpe_is_deterministic_and_saves(bpe, tmp_path):
  again = text.train_bpe(_corpus(), 300)
  assert again._tokenizer.get_vocab() == bpe._tokenizer.get_vocab()
  assert again._tokenizer.to_str() == bpe._tokenizer.to_str()
  bpe.save(tmp_path)
  assert (tmp_path / "tokenizer.json").is_file()
  for loaded in (text.BpeTokenizer.load(tmp_path),
                 text.BpeTokenizer.load(tmp_path / "tokenizer.json"),
                 text.load_tokenizer(tmp_path)):
    assert isinstance(loaded, text.BpeTokenizer)
    assert (loaded.name, loaded.vocab_size, loaded.eos_id) == (bpe.name, bpe.vocab_size,
                                                               bpe.eos_id)
    np.testing.assert_array_equal(loaded.encode(SAMPLE), bpe.encode(SAMPLE))
    np.testing.assert_array_equal(loaded.byte_lengths(), bpe.byte_lengths())


def test_make_tokenizer_reuses_the_saved_one(tmp_path):
  first = text.make_tokenizer("bpe", _corpus(), 300, directory=tmp_path / "run")
  assert (tmp_path / "run" / "tokenizer.json").is_file()
  other = ["Zebras yodel over quartz.\n"] * 50
  fresh = text.make_tokenizer("bpe", other, 300)
  assert fresh.encode("".join(_corpus())).tolist() != first.encode("".join(_corpus())).tolist()
  resumed = text.make_tokenizer("bpe", other, 300, directory=tmp_path / "run")
  np.testing.assert_array_equal(resumed.encode("".join(_corpus())),
                                first.encode("".join(_corpus())))
  with pytest.raises(ValueError, match="holds a bpe.*not bytes"):
    text.make_tokenizer("bytes", other, None, directory=tmp_path / "run")
  with pytest.raises(ValueError, match="more than vocab_size=280"):
    text.make_tokenizer("bpe", other, 280, directory=tmp_path / "run")


def test_make_tokenizer_bytes_and_errors(tmp_path):
  tok = text.make_tokenizer("bytes", [], None, directory=tmp_path)
  assert isinstance(tok, text.ByteTokenizer)
  assert isinstance(text.load_tokenizer(tmp_path), text.ByteTokenizer)
  assert text.make_tokenizer("bytes", [], 257).vocab_size == 257
  with pytest.raises(ValueError, match="vocab_size 257"):
    text.make_tokenizer("bytes", [], 300)
  with pytest.raises(ValueError, match="holds a bytes.*not bpe"):
    text.make_tokenizer("bpe", _corpus(), 300, directory=tmp_path)
  with pytest.raises(ValueError, match="needs a vocab_size"):
    text.make_tokenizer("bpe", _corpus(), None)
  with pytest.raises(ValueError, match="bytes.*bpe"):
    text.make_tokenizer("sentencepiece", [], None)
  with pytest.raises(ValueError, match=">= 258"):
    text.train_bpe(_corpus(), 257)


# --------------------------------------------------------------------------- streams


@pytest.mark.parametrize("kind", ["bytes", "bpe"])
def test_encode_documents(kind, bpe, monkeypatch):
  tok = text.ByteTokenizer() if kind == "bytes" else bpe
  documents = ["Héllo world.", "", "戦場 😀\n", "The cat sat."]
  monkeypatch.setattr(text, "_ENCODE_BATCH", 3)  # the batches change nothing
  stream = text.encode_documents(tok, documents)
  assert stream.dtype == np.uint16 and stream.ndim == 1
  expected = np.concatenate([part for d in documents
                             for part in (tok.encode(d), [tok.eos_id])])
  np.testing.assert_array_equal(stream, expected)
  assert (stream == tok.eos_id).sum() == len(documents)
  ends = np.flatnonzero(stream == tok.eos_id)
  pieces = np.split(stream, ends + 1)[:-1]
  assert [tok.decode(p[:-1]) for p in pieces] == documents
  flat = text.encode_documents(tok, documents, separator=False)
  assert flat.dtype == np.uint16 and tok.eos_id not in flat
  assert tok.decode(flat) == "".join(documents)
  assert tok.byte_lengths()[flat].sum() == len("".join(documents).encode("utf-8"))
  if kind == "bytes":
    assert flat.tolist() == list("".join(documents).encode("utf-8"))
  assert text.encode_documents(tok, []).shape == (0,)


def test_encode_documents_int32_for_a_large_vocabulary():
  class Big(text.ByteTokenizer):
    vocab_size = 70_000
    eos_id = 69_999
  stream = text.encode_documents(Big(), ["ab", "c"])
  assert stream.dtype == np.int32
  assert stream.tolist() == [97, 98, 69_999, 99, 69_999]


def test_pack_and_unpack():
  ids = np.arange(23, dtype=np.uint16)
  windows = text.pack(ids, 5)
  assert windows.shape == (4, 6) and windows.dtype == np.uint16
  np.testing.assert_array_equal(windows[0], [0, 1, 2, 3, 4, 5])
  np.testing.assert_array_equal(windows[1], [5, 6, 7, 8, 9, 10])
  np.testing.assert_array_equal(windows[-1], [15, 16, 17, 18, 19, 20])
  np.testing.assert_array_equal(windows[1:, 0], windows[:-1, -1])  # one shared token
  inputs, targets = windows[:, :-1], windows[:, 1:]
  transitions = {(int(a), int(b)) for a, b in zip(inputs.ravel(), targets.ravel())}
  assert transitions == {(i, i + 1) for i in range(20)}  # each once: 4 * 5 = 20
  np.testing.assert_array_equal(text.unpack(windows), ids[:21])
  for n in (21, 25, 26):  # exactly full, tail dropped, one token more
    stream = np.arange(n, dtype=np.int32)
    packed = text.pack(stream, 5)
    assert packed.shape == ((n - 1) // 5, 6) and packed.dtype == np.int32
    np.testing.assert_array_equal(text.unpack(packed), stream[:packed.shape[0] * 5 + 1])
  assert text.pack(np.arange(6), 5).shape == (1, 6)


def test_pack_errors():
  with pytest.raises(ValueError, match="5 tokens.*seq_len \\+ 1 = 6"):
    text.pack(np.arange(5), 5)
  with pytest.raises(ValueError, match="1-D"):
    text.pack(np.zeros((2, 8)), 3)
  with pytest.raises(ValueError, match="seq_len must be >= 1"):
    text.pack(np.arange(8), 0)
  with pytest.raises(ValueError, match="boundary token"):
    text.unpack(np.arange(12).reshape(2, 6))
