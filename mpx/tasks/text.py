"""The language-modelling data layer: documents, tokenizers, token streams, windows.

    documents = read_documents("wikitext2", "train", data_dir="~/data/wikitext")
    tokenizer = make_tokenizer("bpe", documents, vocab_size=8192, directory=run_dir)
    ids_T = encode_documents(tokenizer, documents, separator=False)
    windows_SN1 = pack(ids_T, seq_len=256)         # inputs w[:, :-1], targets w[:, 1:]

Datasets (`DATASETS`):
- kjv: the King James Bible, embedded (`data/kjv.txt.xz`), so a language run needs no
  download. One document per chapter; chapter i (0-based, 1,189 in all) goes to validation
  if i % 20 == 19, to test if i % 20 == 9, else to train: every book is in all three
  splits, about 90 / 5 / 5. The text is Debian's `bible-kjv-text` 4.38 (the BRS data file
  by Chip Chapin, 1989, "provided for unrestricted use provided that this legend is
  included"); the KJV (1611) is public domain except in the UK, where the Crown's letters
  patent apply.
- wikitext2: wikitext-2-raw-v1, from `data_dir`. Documents are the raw lines, each with
  its "\\n" (empty and ` = Heading = ` lines too), so joining them gives the file back;
  encode them with `separator=False`, as one stream.
- tinystories: TinyStories, from `data_dir`. Documents are the stories (stripped); it has
  no test split.

Nothing is downloaded: a dataset that is not in `data_dir` raises `DatasetUnavailable`,
whose message says which files are accepted and how to get them. `tokenizers` (BPE) and
`pyarrow` (Hugging Face parquet) are imported on first use, so this module imports
without them.
"""

from __future__ import annotations

import functools
import importlib.resources
import json
import lzma
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

DATASETS = ("kjv", "wikitext2", "tinystories")
SPLITS = ("train", "validation", "test")
TOKENIZERS = ("bytes", "bpe")

KJV_CHAPTERS = 1189
EOS_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"
_ENCODE_BATCH = 8192  # documents per `encode_batch` call: bounds the encodings held at once
_READ_CHUNK = 1 << 24  # characters per read of a TinyStories text file

_DATASET_SPLITS = {"kjv": SPLITS, "wikitext2": SPLITS, "tinystories": SPLITS[:2]}
_PASS = "mpx run language --preset {preset} --set data_dir=DIR"


class DatasetUnavailable(FileNotFoundError):
  """The dataset is not in `data_dir`; the message says which files and how to get them."""


# --------------------------------------------------------------------------- documents


def read_documents(dataset: str, split: str, data_dir: str | os.PathLike | None = None
                   ) -> list[str]:
  """The documents of `split` ("train", "validation", "test") of `dataset` (`DATASETS`).

  data_dir: where wikitext2 / tinystories lie (required for them; ignored for kjv). The
  accepted layouts, tried in order, are in `_wikitext2` and `_tinystories`.
  """
  if dataset not in _DATASET_SPLITS:
    raise ValueError(f"unknown text dataset {dataset!r}; choose one of {DATASETS}.")
  if split not in _DATASET_SPLITS[dataset]:
    raise ValueError(f"{dataset} has no split {split!r}; choose one of "
                     f"{_DATASET_SPLITS[dataset]}.")
  if dataset == "kjv":
    return _kjv(split)
  reader = _wikitext2 if dataset == "wikitext2" else _tinystories
  root = None if data_dir is None else Path(os.path.expanduser(os.fspath(data_dir)))
  documents = reader(split, root) if root is not None and root.is_dir() else None
  if documents is None:
    raise DatasetUnavailable(_unavailable_message(dataset, split, root)) from None
  return documents


def _kjv_split(i: int) -> str:
  """The split of chapter i (0-based): every 20th, offset 19 / 9, to validation / test."""
  return {19: "validation", 9: "test"}.get(i % 20, "train")


def _kjv(split: str) -> list[str]:
  return [chapter for i, chapter in enumerate(_kjv_chapters()) if _kjv_split(i) == split]


# A chapter heading: "Genesis 1", "Song of Solomon 3", "1 Kings 2". The embedded file has
# no blank line before some headings (those of the numbered books), so chapters are found
# by their headings; blank lines are only separators.
_HEADING = re.compile(r"(?:[1-3] )?[A-Z][A-Za-z ]*[a-z] \d+")


@functools.cache
def _kjv_chapters() -> tuple[str, ...]:
  """Every chapter, heading line first, each line ending in "\\n", in the file's order."""
  data = (importlib.resources.files("mpx.tasks") / "data" / "kjv.txt.xz").read_bytes()
  chapters: list[list[str]] = []
  for line in lzma.decompress(data).decode("utf-8").split("\n"):
    if _HEADING.fullmatch(line):
      chapters.append([])
    if line.strip():
      if not chapters:
        raise ValueError(f"kjv.txt.xz: text before the first chapter heading: {line!r}")
      chapters[-1].append(line + "\n")
  assert len(chapters) == KJV_CHAPTERS, len(chapters)
  return tuple("".join(lines) for lines in chapters)


_WIKITEXT_FILE = {"train": "wiki.train.raw", "validation": "wiki.valid.raw",
                  "test": "wiki.test.raw"}


def _wikitext2(split: str, root: Path) -> list[str] | None:
  """wikitext-2-raw-v1 lines, from (in order) the published zip extracted,
  `wiki.{train,valid,test}.raw` in `root` or `root/wikitext-2-raw/`, or a Hugging Face
  snapshot's `wikitext-2-raw-v1/{split}-*.parquet` anywhere under `root`."""
  for folder in (root, root / "wikitext-2-raw"):
    path = folder / _WIKITEXT_FILE[split]
    if path.is_file():
      # newline="\n": lines end at "\n" only, untranslated, so they join back to the file
      # (str.splitlines would also cut at the U+2028, \x1c… that the text may hold).
      with open(path, encoding="utf-8", newline="\n") as f:
        return list(f)
  shards = _parquet_shards(root, "wikitext-2-raw-v1", split)
  if shards is None:
    return None
  # The hub's rows carry their "\n", except the empty lines, which are "" there: give
  # them theirs, so the lines still join into text with its paragraph breaks.
  return [line if line.endswith("\n") else line + "\n" for line in _parquet_text(shards)]


_TINYSTORIES_TEXT = (("TinyStoriesV2-GPT4-train.txt", "TinyStoriesV2-GPT4-valid.txt"),
                     ("TinyStories-train.txt", "TinyStories-valid.txt"))


def _tinystories(split: str, root: Path) -> list[str] | None:
  """TinyStories stories, from (in order) the published text files (V2 first), the
  published JSON shards (`data00.json` is validation, `data01.json`… train, as in
  llama2.c) in `root` or `root/TinyStories_all_data/`, or a Hugging Face snapshot's
  `data/{split}-*.parquet` anywhere under `root`."""
  column = 0 if split == "train" else 1
  for names in _TINYSTORIES_TEXT:
    path = root / names[column]
    if path.is_file():
      return _split_stories(path)
  for folder in (root, root / "TinyStories_all_data"):
    shards = sorted(folder.glob("data[0-9][0-9].json"))
    shards = [p for p in shards if (p.name == "data00.json") == (split == "validation")]
    if shards:
      stories = []
      for path in shards:
        with open(path, encoding="utf-8") as f:
          stories.extend(_keep_stories(record["story"] for record in json.load(f)))
      return stories
  shards = _parquet_shards(root, "data", split)
  return None if shards is None else _keep_stories(_parquet_text(shards))


def _split_stories(path: Path) -> list[str]:
  """The stories of a text file that separates them by `<|endoftext|>` lines, read in
  chunks (the V2 train file is 2 GB)."""
  stories: list[str] = []
  carry = ""
  with open(path, encoding="utf-8") as f:
    while chunk := f.read(_READ_CHUNK):
      *done, carry = (carry + chunk).split(EOS_TOKEN)
      stories.extend(_keep_stories(done))
  stories.extend(_keep_stories([carry]))
  return stories


def _keep_stories(stories: Iterable[str]) -> list[str]:
  return [s for s in (story.strip() for story in stories) if s]


def _parquet_shards(root: Path, folder: str, split: str) -> list[Path] | None:
  """The `{split}-*.parquet` files of the one folder named `folder` under `root`, sorted.

  A hub cache may hold several snapshots (`snapshots/<revision>/…`): then the one that
  `refs/main` names, or ValueError if none is named (reading all would repeat the data).
  """
  shards = sorted(p for p in root.glob(f"**/{folder}/{split}-*.parquet") if p.is_file())
  if not shards:
    return None
  folders = sorted({p.parent for p in shards})
  if len(folders) > 1:
    ref = root / "refs" / "main"
    revision = ref.read_text().strip() if ref.is_file() else None
    named = [d for d in folders if revision and revision in d.relative_to(root).parts]
    if len(named) != 1:
      raise ValueError(f"{len(folders)} folders under {root} hold {split}-*.parquet of "
                       f"{folder!r}: {[str(d) for d in folders]}; pass one of them (or "
                       "a folder above only one) as data_dir.")
    folders = named
  return [p for p in shards if p.parent == folders[0]]


def _parquet_text(paths: Sequence[Path]) -> list[str]:
  """The `text` column of the parquet files, in order."""
  try:
    import pyarrow.parquet as pq
  except ImportError:
    raise ImportError("reading the Hugging Face parquet files needs pyarrow: "
                      "pip install pyarrow") from None
  rows: list[str] = []
  for path in paths:
    rows.extend(pq.read_table(path, columns=["text"]).column("text").to_pylist())
  return rows


def _unavailable_message(dataset: str, split: str, root: Path | None) -> str:
  use = "Then pass it: " + _PASS.format(preset=dataset)
  if dataset == "wikitext2":
    name = _WIKITEXT_FILE[split]
    accepted = (f"{name} (the published wikitext-2-raw-v1.zip extracted: in DIR or "
                f"DIR/wikitext-2-raw/), or the Hugging Face parquet files "
                f"wikitext-2-raw-v1/{split}-*.parquet anywhere under DIR")
    get = ("unzip wikitext-2-raw-v1.zip from the WikiText page (Salesforce Research / "
           "Stephen Merity; it was at https://s3.amazonaws.com/research.metamind.io/"
           "wikitext/wikitext-2-raw-v1.zip) into DIR, or: huggingface-cli download "
           "--repo-type dataset Salesforce/wikitext --include 'wikitext-2-raw-v1/*' "
           "--local-dir DIR (without --local-dir it lands in the hub cache: then "
           "DIR=~/.cache/huggingface/hub/datasets--Salesforce--wikitext)")
    title = "wikitext2 (wikitext-2-raw-v1)"
  else:
    column = 0 if split == "train" else 1
    v2, v1 = (names[column] for names in _TINYSTORIES_TEXT)
    shards = "data00.json" if split == "validation" else "data01.json … data49.json"
    accepted = (f"{v2}, else {v1} (stories separated by {EOS_TOKEN} lines) in DIR; or "
                f"the JSON shards of TinyStories_all_data.tar.gz extracted ({shards}; "
                f"data00.json is validation) in DIR or DIR/TinyStories_all_data/; or the "
                f"Hugging Face parquet files data/{split}-*.parquet anywhere under DIR")
    get = ("huggingface-cli download --repo-type dataset roneneldan/TinyStories "
           "TinyStoriesV2-GPT4-train.txt TinyStoriesV2-GPT4-valid.txt --local-dir DIR")
    title = "tinystories"
  where = ("no data_dir was given" if root is None else
           f"data_dir {root} is not a folder" if not root.is_dir() else
           f"its files are not in data_dir {root}")
  return (f"{title} {split}: {where}. mpx reads it from {accepted}. Get it: {get}. {use}")


# --------------------------------------------------------------------------- tokenizers


class ByteTokenizer:
  """UTF-8 bytes 0..255 and EOS = 256: no training, exact for any text, and a model's
  loss per token is its loss per byte."""
  name = "bytes"
  vocab_size = 257
  eos_id = 256

  def encode(self, text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-8"), np.uint8).astype(np.int32)

  def decode(self, ids) -> str:
    """The text of `ids`, EOS skipped; bytes that are not UTF-8 become U+FFFD."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    if ids.size and not (0 <= ids.min() and ids.max() < self.vocab_size):
      raise ValueError(f"token ids must lie in [0, {self.vocab_size}); got "
                       f"[{ids.min()}, {ids.max()}].")
    return ids[ids != self.eos_id].astype(np.uint8).tobytes().decode("utf-8", "replace")

  def byte_lengths(self) -> np.ndarray:
    return np.ones(self.vocab_size, np.int32)

  def save(self, directory: str | os.PathLike) -> None:
    """Writes `tokenizer.json` (`{"type": "bytes"}`), so `load_tokenizer` finds it."""
    path = Path(directory) / TOKENIZER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, json.dumps({"type": "bytes", "vocab_size": self.vocab_size}))


def _tokenizers():
  try:
    import tokenizers
  except ImportError:
    raise ImportError("the BPE tokenizer needs the tokenizers library: "
                      "pip install 'mpx[text]'") from None
  return tokenizers


class BpeTokenizer:
  """Byte-level BPE (GPT-2's pre-tokenization, no prefix space) with `<|endoftext|>`
  as EOS; wraps a `tokenizers.Tokenizer`. Exact round trip for any text: every byte
  is in the initial alphabet, and an `<|endoftext|>` inside a text is encoded as text."""

  def __init__(self, tokenizer):
    self._tokenizer = tokenizer
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    if eos_id is None:
      raise ValueError(f"the tokenizer has no {EOS_TOKEN} token; train it with train_bpe.")
    self.eos_id = int(eos_id)
    self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
    self.name = f"bpe{self.vocab_size}"
    self._byte_lengths: np.ndarray | None = None
    tokenizer.encode_special_tokens = True

  def encode(self, text: str) -> np.ndarray:
    return np.asarray(self._tokenizer.encode(text, add_special_tokens=False).ids, np.int32)

  def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
    """`[encode(t) for t in texts]`, in parallel threads (the library's)."""
    encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return [np.asarray(e.ids, np.int32) for e in encodings]

  def decode(self, ids) -> str:
    """The text of `ids`, EOS skipped; bytes that are not UTF-8 become U+FFFD."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    if ids.size and not (0 <= ids.min() and ids.max() < self.vocab_size):
      raise ValueError(f"token ids must lie in [0, {self.vocab_size}); got "
                       f"[{ids.min()}, {ids.max()}].")
    return self._tokenizer.decode(ids.tolist(), skip_special_tokens=True)

  def byte_lengths(self) -> np.ndarray:
    """Bytes per token: a byte-level token is a string over the 256-character alphabet,
    one character per byte; EOS counts 1."""
    if self._byte_lengths is not None:
      return self._byte_lengths
    alphabet = set(_tokenizers().pre_tokenizers.ByteLevel.alphabet())
    lengths = np.empty(self.vocab_size, np.int32)
    for i in range(self.vocab_size):
      token = self._tokenizer.id_to_token(i)
      if i == self.eos_id:
        lengths[i] = 1
      elif token and set(token) <= alphabet:
        lengths[i] = len(token)
      else:  # Not a byte-level token (a foreign tokenizer): count its decoded bytes.
        lengths[i] = len(self._tokenizer.decode([i]).encode("utf-8"))
    lengths.flags.writeable = False
    self._byte_lengths = lengths
    return lengths

  def save(self, directory: str | os.PathLike) -> None:
    path = Path(directory) / TOKENIZER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(path, self._tokenizer.to_str())

  @classmethod
  def load(cls, path: str | os.PathLike) -> BpeTokenizer:
    """From a `tokenizer.json`, or a directory that holds one."""
    path = Path(path)
    if path.is_dir():
      path = path / TOKENIZER_FILE
    return cls(_tokenizers().Tokenizer.from_file(str(path)))


def train_bpe(documents: Iterable[str], vocab_size: int) -> BpeTokenizer:
  """A byte-level BPE of (at most) `vocab_size` tokens trained on `documents`:
  256 bytes, `<|endoftext|>` (id 0) and the merges. Deterministic for the same input."""
  if vocab_size < 258:
    raise ValueError(f"a BPE vocab_size must be >= 258 (256 bytes, EOS and a merge); got "
                     f"{vocab_size}. Use tokenizer=bytes for a byte vocabulary.")
  tk = _tokenizers()
  tokenizer = tk.Tokenizer(tk.models.BPE())
  tokenizer.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = tk.decoders.ByteLevel()
  trainer = tk.trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
      initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
  tokenizer.train_from_iterator(documents, trainer)
  return BpeTokenizer(tokenizer)


def load_tokenizer(directory: str | os.PathLike) -> ByteTokenizer | BpeTokenizer:
  """The tokenizer `save(directory)` wrote (either kind)."""
  path = Path(directory) / TOKENIZER_FILE
  if not path.is_file():
    raise FileNotFoundError(f"no {TOKENIZER_FILE} in {directory}.")
  text = path.read_text(encoding="utf-8")
  if json.loads(text).get("type") == "bytes":
    return ByteTokenizer()
  return BpeTokenizer(_tokenizers().Tokenizer.from_str(text))


def make_tokenizer(kind: str, train_documents: Iterable[str], vocab_size: int | None,
                   directory: str | os.PathLike | None = None
                   ) -> ByteTokenizer | BpeTokenizer:
  """The run's tokenizer: `kind` "bytes", or "bpe" of `vocab_size` trained on
  `train_documents`. With `directory`, a tokenizer saved there is loaded instead (a resumed
  run must reuse its tokenizer; retraining on other data would change the ids), and a new
  one is saved there. A saved one of another kind, or of more than `vocab_size` tokens, is
  refused (ValueError); fewer is expected (a small corpus ends training early)."""
  if kind not in TOKENIZERS:
    raise ValueError(f"unknown tokenizer {kind!r}; choose one of {TOKENIZERS}.")
  if kind == "bytes" and vocab_size not in (None, ByteTokenizer.vocab_size):
    raise ValueError(f"the bytes tokenizer has vocab_size {ByteTokenizer.vocab_size}; got "
                     f"vocab_size={vocab_size}. Leave it unset, or use tokenizer=bpe.")
  if kind == "bpe" and vocab_size is None:
    raise ValueError("tokenizer=bpe needs a vocab_size (e.g. 8192).")
  if directory is not None and (Path(directory) / TOKENIZER_FILE).is_file():
    tokenizer = load_tokenizer(directory)
    if not isinstance(tokenizer, ByteTokenizer if kind == "bytes" else BpeTokenizer):
      raise ValueError(f"{directory} holds a {tokenizer.name} tokenizer, not {kind}; use "
                       "the run's tokenizer or a new run directory.")
    if tokenizer.vocab_size > (vocab_size or ByteTokenizer.vocab_size):
      raise ValueError(f"{directory} holds a tokenizer of {tokenizer.vocab_size} tokens, "
                       f"more than vocab_size={vocab_size}; use the run's vocab_size or a "
                       "new run directory.")
    return tokenizer
  tokenizer = ByteTokenizer() if kind == "bytes" else train_bpe(train_documents, vocab_size)
  if directory is not None:
    tokenizer.save(directory)
  return tokenizer


def _write_atomic(path: Path, text: str) -> None:
  partial = path.with_name(path.name + f".{os.getpid()}.tmp")
  partial.write_text(text, encoding="utf-8")
  os.replace(partial, path)


# --------------------------------------------------------------------------- streams


def encode_documents(tokenizer, documents: Iterable[str], separator: bool = True
                     ) -> np.ndarray:
  """One stream of the documents' ids, each followed by EOS if `separator` (stories,
  chapters), else simply joined (WikiText lines: one running text). Each document is
  encoded on its own, so the ids do not depend on how they are batched. uint16 when the
  vocabulary fits, else int32."""
  dtype = np.uint16 if tokenizer.vocab_size <= 1 << 16 else np.int32
  eos = np.array([tokenizer.eos_id], dtype)
  batch_encode = getattr(tokenizer, "encode_batch", None)
  pieces: list[np.ndarray] = []
  batch: list[str] = []

  def flush():  # One array per batch: millions of small arrays would cost more than ids.
    encoded = (batch_encode(batch) if batch_encode is not None else
               [tokenizer.encode(d) for d in batch])
    if separator:
      encoded = [part for ids in encoded for part in (ids, eos)]
    pieces.append(np.concatenate(encoded).astype(dtype, copy=False))
    batch.clear()

  for document in documents:
    batch.append(document)
    if len(batch) == _ENCODE_BATCH:
      flush()
  if batch:
    flush()
  return np.concatenate(pieces) if pieces else np.zeros(0, dtype)


def pack(ids_T: np.ndarray, seq_len: int) -> np.ndarray:
  """Training windows `[S, seq_len + 1]`: window s is `ids[s*seq_len : s*seq_len +
  seq_len + 1]`, so consecutive windows share one token and inputs `w[:, :-1]` / targets
  `w[:, 1:]` hold every transition once; the tail that fills no window is dropped. A
  read-only view of `ids_T` (no copy), in its dtype."""
  ids_T = np.asarray(ids_T)
  if ids_T.ndim != 1:
    raise ValueError(f"pack takes a 1-D token stream; got shape {ids_T.shape}.")
  if seq_len < 1:
    raise ValueError(f"seq_len must be >= 1; got {seq_len}.")
  if ids_T.size < seq_len + 1:
    raise ValueError(f"{ids_T.size} tokens fill no window of seq_len + 1 = {seq_len + 1}; "
                     "use a shorter seq_len or more text.")
  windows = (ids_T.size - 1) // seq_len
  return np.lib.stride_tricks.sliding_window_view(ids_T, seq_len + 1)[::seq_len][:windows]


def unpack(windows_SN1: np.ndarray) -> np.ndarray:
  """The stream `pack` cut (up to its dropped tail): `ids[:S * seq_len + 1]`."""
  windows_SN1 = np.asarray(windows_SN1)
  if windows_SN1.ndim != 2 or windows_SN1.shape[0] < 1 or windows_SN1.shape[1] < 2:
    raise ValueError(f"unpack takes windows [S >= 1, seq_len + 1 >= 2]; got shape "
                     f"{windows_SN1.shape}.")
  if not np.array_equal(windows_SN1[1:, 0], windows_SN1[:-1, -1]):
    raise ValueError("consecutive windows do not share their boundary token; these are "
                     "not windows of pack.")
  return np.concatenate([windows_SN1[0], windows_SN1[1:, 1:].reshape(-1)])
