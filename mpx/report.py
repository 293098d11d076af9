"""Run outputs: the metrics log, the summary tables and a progress bar.

A run directory holds

  metrics.jsonl  one JSON object per member per evaluation, appended and fsynced as
                 training goes, so a SIGKILL loses nothing already written;
  summary.json   {"experiment", "preset", "members", "paper"}: the final numbers;
  summary.md     the same as Markdown tables, mpx's numbers beside the paper's, each below
                 a legend of its columns (`METRIC_DESCRIPTIONS`), after a link to
                 plots/overview.png;
  tensorboard/   when tensorboardX is installed (pip install mpx[tensorboard]): the
                 numeric metrics of metrics.jsonl as TensorBoard scalars.

Conventions, chosen once here so every experiment reports alike:

* Non-finite floats (NaN, ±inf) are written as JSON `null`: the files stay strict JSON
  that any tool reads, and the record's `diverged` flag says why a value is missing.
* Spread over seeds is the population standard deviation (ddof=0): it describes the seeds
  that were run rather than estimating a larger population, and is 0 for a single seed.
* Diverged seeds are counted but left out of the statistics; a table says how many.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

import numpy as np
from etils import epath

METRICS_FILE = "metrics.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
TENSORBOARD_DIR = "tensorboard"
OVERVIEW_LINK = "![overview](plots/overview.png)"

# Keys a member record sets itself; a metric may not reuse them.
RECORD_KEYS = ("step", "task", "scheme", "seed", "hparams", "diverged", "member")
SUMMARY_KEYS = ("experiment", "preset", "members", "paper")
MEMBER_KEYS = ("task", "scheme", "seed", "hparams", "metrics", "diverged")
MISSING = "—"


# ----------------------------------------------------------------------------- JSON


def to_jsonable(x: Any) -> Any:
  """Plain-Python copy of `x` for strict JSON: non-finite floats become None.

  Accepts numpy (and jax, via `__array__`) scalars and arrays so callers can pass
  device metrics straight through.
  """
  if isinstance(x, Mapping):
    return {k: to_jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [to_jsonable(v) for v in x]
  if isinstance(x, (bool, int, str)) or x is None:
    return x
  if isinstance(x, float):
    return x if math.isfinite(x) else None
  if isinstance(x, np.generic) or hasattr(x, "__array__"):
    a = np.asarray(x)
    return to_jsonable(a.item() if a.ndim == 0 else a.tolist())
  return x  # json.dumps raises TypeError naming the type.


def _dumps(x: Any) -> str:
  return json.dumps(to_jsonable(x), sort_keys=True, allow_nan=False)


def _fsync_dir(path: str) -> None:
  """Makes a rename durable; best effort where directories cannot be opened."""
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def atomic_write(path: str, text: str) -> None:
  """Writes via a temp file and `os.replace`, so a kill leaves the old or the new file."""
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8", newline="\n") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  _fsync_dir(os.path.dirname(os.path.abspath(path)))


def _parse_lines(path: str, text: str) -> list[tuple[str, dict]]:
  """`(raw line with its newline, record)` pairs.

  A torn last line (no newline, not valid JSON) is what a kill mid-write leaves: it is
  dropped. Any other bad line is corruption and raises.
  """
  lines = text.splitlines(keepends=True)
  out = []
  for i, line in enumerate(lines):
    last = i == len(lines) - 1
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      if last and not line.endswith("\n"):
        break
      raise ValueError(f"{path}:{i + 1} is not valid JSON ({e}); the metrics log is "
                       "corrupt: restore it or start a fresh run with another --out.") from e
    if not isinstance(record, dict) or "step" not in record:
      raise ValueError(f"{path}:{i + 1} is not a metrics record (a JSON object with a "
                       "'step'); is this an mpx run directory?")
    out.append((line if line.endswith("\n") else line + "\n", record))
  return out


def _check_step(step: Any, what: str) -> int:
  if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
    raise ValueError(f"{what} must be an int >= 0; got {step!r}.")
  return int(step)


# ----------------------------------------------------------------------------- TensorBoard

# The characters TensorBoard allows in a tag; tensorboardX replaces others by "_" (and logs
# it), so tags are cleaned here to be known in advance.
_TAG_CHARS = re.compile(r"[^-/\w.]")
TENSORBOARD_NOTE = ("mpx: TensorBoard event files are off; pip install mpx[tensorboard] "
                    "(tensorboardX) would add them under RUN_DIR/tensorboard/.")


def tensorboard_scalars(record: Mapping[str, Any]) -> list[tuple[str, float]]:
  """`(tag, value)` for each finite int or float at the top level of a record.

  The tag is "{group or task}/{scheme}/seed{seed}/{metric}" (parts a record lacks are left
  out): one event file for the whole sweep, however many members, and TensorBoard shows
  one section per group. The group (sweep records carry it, unique in a run) stands
  before the task because it tells apart members that only differ in hparams, e.g. the
  data fractions of an arithmetic sweep ("addition-f0.01"); a GOTU group is the task.
  Identity keys (step, seed, member, ...), bools and non-finite values are skipped.
  """
  r = to_jsonable(record)
  head = [str(v) for v in (r.get("group", r.get("task")), r.get("scheme")) if v is not None]
  if r.get("seed") is not None:
    head.append(f"seed{r['seed']}")
  out = []
  for name, value in r.items():  # to_jsonable has made non-finite floats None.
    if name in RECORD_KEYS or isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    out.append((_TAG_CHARS.sub("_", "/".join([*head, name])), float(value)))
  return out


def _summary_writer_class():
  """tensorboardX's SummaryWriter, or None when it is not installed."""
  try:
    from tensorboardX import SummaryWriter
  except ImportError:
    return None
  return SummaryWriter


def _add_scalars(writer, records: Iterable[Mapping[str, Any]]) -> None:
  for r in records:
    for tag, value in tensorboard_scalars(r):
      writer.add_scalar(tag, value, global_step=r["step"])


def _open_tensorboard(run_dir: str, replay: Sequence[Mapping[str, Any]]):
  """A SummaryWriter on RUN_DIR/tensorboard holding `replay`, or None (and one note on
  stderr) without tensorboardX. Earlier event files are removed: they mirror a log that
  the caller has just truncated or found empty."""
  writer_class = _summary_writer_class()
  if writer_class is None:
    print(TENSORBOARD_NOTE, file=sys.stderr)
    return None
  log_dir = os.path.join(run_dir, TENSORBOARD_DIR)
  if os.path.isdir(log_dir):
    for name in os.listdir(log_dir):
      if name.startswith("events.out.tfevents."):
        os.remove(os.path.join(log_dir, name))
  # A large queue keeps add_scalar from blocking training; a flush every 10 s keeps a
  # running TensorBoard current. close() writes whatever is still queued.
  writer = writer_class(log_dir, max_queue=1000, flush_secs=10)
  _add_scalars(writer, replay)
  return writer


# ----------------------------------------------------------------------------- metrics.jsonl


class MetricsWriter:
  """Appends member records to RUN_DIR/metrics.jsonl, durable after every `write`.

  `resume_step=None` starts a fresh run and refuses to mix with an existing log.
  `resume_step=S` continues from a checkpoint at step S: records with `step > S` were
  written after that checkpoint and will be written again, so they are dropped first
  (atomically). The kept lines are copied byte for byte, which makes a resumed log
  identical to an uninterrupted one. `keep` generalises this for runs of several
  groups, each checkpointed at its own step: a record survives iff `keep(record)`.

  With tensorboardX installed, the numeric metrics also go to RUN_DIR/tensorboard/ (see
  `tensorboard_scalars`). Those event files are derived from metrics.jsonl: on opening,
  old ones are removed and the kept records replayed, so after a resume they hold exactly
  what the log holds (TensorBoard cannot un-write the dropped steps of several groups).
  """

  def __init__(self, run_dir: str | os.PathLike, *, resume_step: int | None = None,
               keep: Callable[[dict], bool] | None = None):
    self.run_dir = os.fspath(run_dir)
    self.path = os.path.join(self.run_dir, METRICS_FILE)
    os.makedirs(self.run_dir, exist_ok=True)
    if resume_step is not None:
      resume_step = _check_step(resume_step, "resume_step")
      keep = lambda record: record["step"] <= resume_step
    if keep is None:
      if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
        raise FileExistsError(
            f"{self.path} already holds metrics of an earlier run; pass --resume to "
            "continue it, or choose another --out.")
    kept: list[dict] = []
    if keep is not None and os.path.exists(self.path):
      kept = self._truncate(keep)
    self._file: TextIO | None = open(self.path, "a", encoding="utf-8", newline="\n")
    self._tensorboard = _open_tensorboard(self.run_dir, kept)

  def _truncate(self, keep: Callable[[dict], bool]) -> list[dict]:
    """Drops the records `keep` rejects; returns the kept ones."""
    with open(self.path, encoding="utf-8", newline="") as f:
      text = f.read()
    kept = [(line, r) for line, r in _parse_lines(self.path, text) if keep(r)]
    atomic_write(self.path, "".join(line for line, _ in kept))
    return [r for _, r in kept]

  def write(self, records: Iterable[Mapping[str, Any]]) -> None:
    """One sorted-key JSON line per record, then flush and fsync (then the scalars)."""
    if self._file is None:
      raise ValueError(f"MetricsWriter for {self.path} is closed; open a new one.")
    rows = []
    for r in records:
      if not isinstance(r, Mapping) or "step" not in r:
        raise ValueError(f"a metrics record must be a dict with a 'step'; got {r!r}. "
                         "Build records with member_record().")
      _check_step(r["step"], "record['step']")
      rows.append(to_jsonable(r))
    self._file.write("".join(json.dumps(row, sort_keys=True, allow_nan=False) + "\n"
                             for row in rows))
    self._file.flush()
    os.fsync(self._file.fileno())
    if self._tensorboard is not None:
      _add_scalars(self._tensorboard, rows)

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tensorboard is not None:
      self._tensorboard.close()  # Drains the writer's queue into the event file.
      self._tensorboard = None

  def __enter__(self) -> MetricsWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def read_metrics(run_dir: str | os.PathLike) -> list[dict]:
  """All records of RUN_DIR/metrics.jsonl in file order (non-finite values read as None);
  RUN_DIR may be a gs:// URL."""
  path = epath.Path(run_dir) / METRICS_FILE
  return [r for _, r in _parse_lines(str(path), path.read_bytes().decode("utf-8"))]


def member_record(member: Mapping[str, Any], step: int, metrics: Mapping[str, Any], *,
                  diverged: bool) -> dict:
  """One flat log record: the member's identity, the step, and its metrics.

  `member` needs task, scheme, seed and hparams (`Member.describe()`); a `member` key
  (its index in the sweep) is copied when present. Metrics sit at the top level so a
  record reads as one row of a table.
  """
  missing = [k for k in ("task", "scheme", "seed", "hparams") if k not in member]
  if missing:
    raise ValueError(f"member {dict(member)!r} lacks {missing}; pass Member.describe().")
  clash = sorted(set(metrics) & set(RECORD_KEYS))
  if clash:
    raise ValueError(f"metric names {clash} clash with record keys {RECORD_KEYS}; "
                     "rename the metrics.")
  record = {"step": _check_step(step, "step"), "task": member["task"],
            "scheme": member["scheme"], "seed": member["seed"],
            "hparams": dict(member["hparams"]), "diverged": bool(diverged)}
  if "member" in member:
    record["member"] = member["member"]
  record.update(metrics)
  return record


# ----------------------------------------------------------------------------- metrics

# What each metric of mpx's families measures: one description per name, read by the
# legend above every summary table and by every figure's title, so a metric keeps one
# meaning everywhere. Test points are the whole cube (Boolean; seen points: the training
# domain, unseen: the rest), the test problems (arithmetic), the held-out images (vision),
# the evaluation windows (language). `val_NAME` is NAME on the validation split.
METRIC_DESCRIPTIONS: dict[str, str] = {
    # Every family.
    "accuracy": "share of test points right: Boolean, the output's sign over the whole "
                "cube, seen and unseen points (the paper's Boolean accuracy); vision, top-1",
    "loss": "test loss: Boolean, squared error over the whole cube; arithmetic, the answer "
            "tokens' cross-entropy; vision, cross-entropy; language, nats per token",
    "mean_output": "the model's mean output over the evaluation set",
    "train_loss": "training loss, mean over the steps since the previous evaluation",
    # Boolean.
    "accuracy_seen": "sign accuracy on the seen points (the training domain)",
    "accuracy_unseen": "sign accuracy on the unseen points alone: extrapolation",
    "accuracy_exact": "integer targets (Cyclic3): the rounded output is the target, whole cube",
    "accuracy_exact_unseen": "integer targets (Cyclic3): the rounded output is the target, "
                             "unseen points",
    "loss_seen": "squared error on the seen points",
    "loss_unseen": "squared error on the unseen points",
    "unseen_mean_output": "mean output on the unseen points (2Parity: target +1, the "
                          "min-degree interpolator -3)",
    "mdi_distance_unseen": "RMS distance on the unseen points to the min-degree "
                           "interpolator, what a model that does not extrapolate computes",
    "target_distance_unseen": "RMS distance to the target on the unseen points",
    "accuracy_unseen_predicted": "accuracy_unseen as the coverage hypothesis predicts it "
                                 "before training (coverage.class_coverage)",
    "degree_profile": "share of the learned function's Fourier weight at each degree",
    # Arithmetic.
    "sequence_accuracy": "share of test problems whose whole answer is right, greedy "
                         "decoding (the paper's arithmetic accuracy)",
    "digit_accuracy": "share of answer digits right, place by place, greedy decoding",
    # Language.
    "perplexity": "exp of the cross-entropy per token of the run's tokenizer, evaluation "
                  "windows",
    "bits_per_byte": "cross-entropy in bits per byte of text: compares tokenizers",
    "steps_to_target": "the first evaluated step at which perplexity reached "
                       "target_perplexity (empty where never)",
    "reached_target": "1 where perplexity reached target_perplexity, else 0: the mean is "
                      "the share of seeds",
    # Persistence of the prior (every family's probe), means over layers.
    "fidelity": "attention mass on the prior's allowed pairs, on the probe batch",
    "fidelity_init": "fidelity at initialisation",
    "fidelity_seen": "fidelity on the probe's seen points",
    "fidelity_unseen": "fidelity on the probe's unseen points",
    "drift_mask": "relative change of the mask since init, |M - M0| / |M0|",
    "drift_mask_rms": "RMS change of the mask since init, where it starts at 0",
    "drift_qk": "relative change of the query and key kernels since init (their mean)",
    "drift_query": "relative change of the query kernel since init",
    "drift_key": "relative change of the key kernel since init",
    "grad_norm_mask": "norm of the loss's gradient in the mask, probe's seen points",
    "grad_norm_query": "norm of the loss's gradient in the query kernel",
    "grad_norm_key": "norm of the loss's gradient in the key kernel",
    # Discovery: the graph or pattern stage 2 trained with, against the true one.
    "bit_precision": "share of the discovered graph's support bits that the target reads",
    "bit_recall": "share of the target's support bits the discovered graph holds",
    "pair_precision": "share of the discovered graph's pairs that the true graph holds",
    "pair_recall": "share of the true graph's pairs the discovered graph holds",
    "graph_bits": "support bits of the graph the member trained with",
    "graph_pairs": "pairs of bits of the graph the member trained with",
    "graph_empty": "1 where the graph is empty (a neutral prior), else 0",
    "precision": "share of the discovered pattern's open entries the hand-written one opens",
    "recall": "share of the hand-written pattern's entries the discovered one opens",
    "n_open": "entries the discovered pattern opens",
}
VALIDATION_PREFIX = "val_"
UNDESCRIBED = ("not described (an experiment file says what its metrics mean in its "
               "METRIC_DESCRIPTIONS)")
PERCENT_NOTE = "in % (the fraction × 100)"
_DESCRIBED: list[dict[str, str]] = []  # `described`'s, innermost last.


def check_descriptions(descriptions: Mapping[str, str]) -> dict[str, str]:
  """`descriptions` as a dict, each a non-empty string (else a ValueError naming it)."""
  if not isinstance(descriptions, Mapping):
    raise ValueError("METRIC_DESCRIPTIONS must map each metric's name to what it measures, "
                     "e.g. {'accuracy': 'share of test sequences whose every token is right'}.")
  for name, text in descriptions.items():
    if not isinstance(text, str) or not text.strip():
      raise ValueError(f"the description of metric {name!r} must be a non-empty string.")
  return dict(descriptions)


@contextlib.contextmanager
def described(descriptions: Mapping[str, str]):
  """Tables and figures made meanwhile say what `descriptions` says a metric means, over
  `METRIC_DESCRIPTIONS`: one experiment's `accuracy` need not be another's. `mpx run`
  applies an experiment file's METRIC_DESCRIPTIONS and keeps them in summary.json, where
  `mpx plot` finds them."""
  _DESCRIBED.append(check_descriptions(descriptions))
  try:
    yield
  finally:
    _DESCRIBED.pop()


def describe_metrics(descriptions: Mapping[str, str]) -> None:
  """Adds descriptions of new metric names to `METRIC_DESCRIPTIONS`, for every run of this
  process. A name mpx describes already (`accuracy`, `loss`, ...) keeps its meaning here:
  to say what it means in your run, give your experiment file `METRIC_DESCRIPTIONS =
  {name: description}`, which applies to its runs alone (`described`)."""
  for name, text in check_descriptions(descriptions).items():
    if METRIC_DESCRIPTIONS.get(name, text) != text:
      raise ValueError(f"metric {name!r} already means {METRIC_DESCRIPTIONS[name]!r} in "
                       "mpx; to say what it means in your run, put it in your experiment "
                       "file's METRIC_DESCRIPTIONS instead.")
  METRIC_DESCRIPTIONS.update(descriptions)


def metric_description(name: str) -> str | None:
  """What metric `name` measures (`METRIC_DESCRIPTIONS`; `val_NAME`, NAME on the
  validation split); an experiment's own (`described`) first; None where nothing
  describes it."""
  def lookup(key):
    for descriptions in (*reversed(_DESCRIBED), METRIC_DESCRIPTIONS):
      if key in descriptions:
        return descriptions[key]
    return None
  if (text := lookup(name)) is not None:
    return text
  base = name.removeprefix(VALIDATION_PREFIX)
  if base != name and lookup(base) is not None:
    return (f"{base} on the validation split, which is held out of training and read only "
            "by selection")
  return None


# ----------------------------------------------------------------------------- summaries


def _hparams_key(hparams: Mapping[str, Any]) -> str:
  return _dumps({k: v for k, v in hparams.items() if k != "seed"})


def cell_key(entry: Mapping[str, Any]) -> tuple[str, str, str]:
  """(task, scheme, hparams but the seed, as JSON): the seeds of one configuration, which
  a table row and a plotted line gather. A record's hparams hold its group's labels (a
  data fraction, an architecture sweep's values), so two groups never share a cell."""
  return (entry["task"], entry["scheme"], _hparams_key(entry["hparams"]))


def member_key(entry: Mapping[str, Any]) -> tuple[str, str, str, int]:
  """One trained member, alike in metrics.jsonl records and summary.json members: its
  `cell_key` and seed. Histories are keyed by it: (task, scheme, seed) alone would merge
  the groups of a run (the data fractions of one scheme)."""
  return (*cell_key(entry), entry["seed"])


def distinguishing_hparams(entries: Iterable[Mapping[str, Any]]) -> list[str]:
  """The hparams (not the seed) whose value differs between entries of one task and
  scheme: what tells a scheme's groups apart (a data fraction, a width). One value per
  scheme (the mask's own learning rate) is left out: the scheme's name says it."""
  values: dict = {}
  for e in entries:
    for k, v in e["hparams"].items():
      if k != "seed":
        values.setdefault((e["task"], e["scheme"], k), set()).add(_dumps(v))
  return sorted({k for (_, _, k), vs in values.items() if len(vs) > 1})


def cell_label(cell: tuple[str, str, str], keys: Sequence[str], sep: str = ", ") -> str:
  """How figures and lists name a `cell_key`: its scheme and its values of `keys`
  (`distinguishing_hparams`), e.g. "mask, data_fraction=0.1"."""
  hparams = json.loads(cell[2])
  return sep.join([cell[1], *(f"{k}={_fmt_hparam(hparams.get(k))}" for k in keys)])


def _finite(x: Any) -> float | None:
  x = to_jsonable(x)
  if isinstance(x, bool) or not isinstance(x, (int, float)):
    return None
  return float(x)


def _stats(values: Sequence[float]) -> dict:
  """mean, population std (ddof=0), min, max and count; None values when empty."""
  n = len(values)
  if n == 0:
    return {"mean": None, "std": None, "min": None, "max": None, "n": 0}
  mean = math.fsum(values) / n
  std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n)
  return {"mean": mean, "std": std, "min": min(values), "max": max(values), "n": n}


def summarize(members: Sequence[Mapping[str, Any]], metric_names: Sequence[str]) -> list[dict]:
  """Groups members by (task, scheme, hparams) and aggregates each metric over seeds.

  Returns one row per group, in first-appearance order:
  `{"task", "scheme", "hparams", "n_seeds", "n_diverged", metric: {"mean", "std", "min",
  "max", "n"}}`. Statistics use the non-diverged seeds with a finite value (`n` of them);
  all None when there are none.
  """
  groups: dict[tuple, list[Mapping[str, Any]]] = {}
  for i, m in enumerate(members):
    missing = [k for k in MEMBER_KEYS if k not in m]
    if missing:
      raise ValueError(f"member {i} lacks {missing}; summarize needs {MEMBER_KEYS}.")
    key = cell_key(m)
    group = groups.setdefault(key, [])
    if any(g["seed"] == m["seed"] for g in group):
      raise ValueError(f"member {i} repeats seed {m['seed']} of task {m['task']!r}, scheme "
                       f"{m['scheme']!r}, hparams {key[2]}; give each member its own seed.")
    group.append(m)
  rows = []
  for (task, scheme, _), group in groups.items():
    alive = [m for m in group if not m["diverged"]]
    row = {"task": task, "scheme": scheme,
           "hparams": {k: v for k, v in group[0]["hparams"].items() if k != "seed"},
           "n_seeds": len(group), "n_diverged": len(group) - len(alive)}
    for name in metric_names:
      values = [_finite(m["metrics"].get(name)) for m in alive]
      row[name] = _stats([v for v in values if v is not None])
    rows.append(row)
  return rows


def is_percent_metric(name: str) -> bool:
  """Accuracies are fractions in the logs and percentages in tables."""
  return name.startswith("accuracy") or name.endswith("_accuracy")


def _fmt_number(x: float, percent: bool, *, exact_digits: bool = True) -> str:
  """2 decimals of percent, or 4 significant digits (kept, unless quoting the paper)."""
  if percent:
    return f"{100 * x:.2f}"
  return f"{x:#.4g}" if exact_digits else f"{x:.4g}"


def _fmt_hparam(v: Any) -> str:
  if v is None:
    return MISSING
  return f"{v:g}" if isinstance(v, float) else str(v)


def _cell(text: str) -> str:
  return text.replace("|", "\\|")


def _paper_value(paper: Mapping, task: str, scheme: str, metric: str) -> float | None:
  return paper.get(task, {}).get(scheme, {}).get(metric)


def column_label(metric: str, percent: bool) -> str:
  """A metric's column header: its name, and its unit where it is a percentage."""
  return f"{metric} (%)" if percent else metric


def metric_columns(metric_names: Sequence[str], percent: Iterable[str],
                   with_paper: Iterable[str] = ()) -> list[tuple[str, str]]:
  """(header, meaning) of each metric's column (`metric_description`) and, for those in
  `with_paper`, of the paper's column beside it."""
  percent, with_paper = set(percent), set(with_paper)
  out = []
  for m in metric_names:
    label, text = column_label(m, m in percent), metric_description(m) or UNDESCRIBED
    if m in percent:  # Said once, whether or not the description says it too.
      text = f"{text.removesuffix('(%)').rstrip().rstrip(',;')}; {PERCENT_NOTE}"
    out.append((label, text))
    if m in with_paper:
      out.append((f"paper {label}", f"the paper's number for {m} ({MISSING} where it "
                                    "gives none)"))
  return out


def legend(columns: Sequence[tuple[str, str]]) -> str:
  """The lines above a table that say what each of its columns holds."""
  return "Columns:\n" + "".join(f"- `{_cell(h)}`: {text}\n" for h, text in columns)


def format_table(rows: Sequence[Mapping[str, Any]], metric_names: Sequence[str],
                 paper: Mapping[str, Mapping[str, Mapping[str, float]]], *,
                 percent_metrics: Iterable[str] | None = None) -> str:
  """A Markdown table of `summarize` rows, the paper's number beside each metric, below a
  `legend` of its columns.

  Columns: task | scheme | each hparam whose value differs between rows (constant ones
  would only add noise) | seeds | per metric "mean ± std" and, when the paper reports that
  metric for any row, a "paper METRIC" column ("—" where it gives no number). Percentage
  metrics (`percent_metrics`, by default names `is_percent_metric` accepts) show 2 decimals
  of percent; the rest 4 significant digits (the paper's numbers as given).
  """
  percent = (set(percent_metrics) if percent_metrics is not None
             else {m for m in metric_names if is_percent_metric(m)})
  keys = sorted({k for r in rows for k in r["hparams"]})
  varying = [k for k in keys
             if len({_dumps(r["hparams"].get(k)) for r in rows}) > 1]
  with_paper = [m for m in metric_names
                if any(_paper_value(paper, r["task"], r["scheme"], m) is not None for r in rows)]

  columns = [("task", "the task"), ("scheme", "the init scheme"),
             *((k, f"the {k} the row's members trained with") for k in varying),
             ("seeds", "the row's members, one per seed; those that diverged (in brackets) "
                       "are left out of the means"),
             *metric_columns(metric_names, percent, with_paper)]
  header = [h for h, _ in columns]
  lines = ["| " + " | ".join(_cell(h) for h in header) + " |",
           "|" + "---|" * len(header)]
  for r in rows:
    seeds = str(r["n_seeds"])
    if r["n_diverged"]:
      seeds += f" ({r['n_diverged']} diverged)"
    cells = [str(r["task"]), str(r["scheme"]),
             *(_fmt_hparam(r["hparams"].get(k)) for k in varying), seeds]
    for m in metric_names:
      s, pct = r.get(m), m in percent
      if not s or s["mean"] is None:
        cells.append(MISSING)
      else:
        cells.append(f"{_fmt_number(s['mean'], pct)} ± {_fmt_number(s['std'], pct)}")
      if m in with_paper:
        value = _paper_value(paper, r["task"], r["scheme"], m)
        cells.append(MISSING if value is None else _fmt_number(value, pct, exact_digits=False))
    lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
  return legend(columns) + "\n" + "\n".join(lines) + "\n"


def write_summary(run_dir: str | os.PathLike, *, experiment: str, preset: str,
                  members: Sequence[Mapping[str, Any]],
                  paper: Mapping[str, Mapping[str, Mapping[str, float]]],
                  metric_names: Sequence[str],
                  extra_tables: Mapping[str, str] | None = None,
                  extra_json: Mapping[str, Any] | None = None) -> dict:
  """Writes RUN_DIR/summary.json and RUN_DIR/summary.md (each atomically); returns the dict.

  summary.json holds exactly {"experiment", "preset", "members", "paper"}: the per-seed
  final numbers and the paper's, from which any table can be recomputed. `paper` is
  `{task: {scheme: {metric: value}}}`, accuracies as fractions. `extra_tables` maps a
  heading to a ready Markdown table appended to summary.md; `extra_json` adds keys to
  summary.json (e.g. "selection"). summary.md links
  plots/overview.png right below its heading.
  """
  run_dir = os.fspath(run_dir)
  os.makedirs(run_dir, exist_ok=True)
  summary = to_jsonable({"experiment": experiment, "preset": preset,
                         "members": list(members), "paper": dict(paper)}
                        | dict(extra_json or {}))
  rows = summarize(members, metric_names)
  n_diverged = sum(bool(m["diverged"]) for m in members)
  parts = [f"# {experiment} (preset {preset})\n",
           # Drawn after this file by `mpx run` (mpx.plotting.plot_overview): linked always.
           f"{OVERVIEW_LINK}\n",
           f"{len(members)} members, {n_diverged} diverged. Mean ± population std (ddof=0) "
           f"over the seeds that did not diverge; \"{MISSING}\" where a value is missing.\n",
           format_table(rows, metric_names, paper)]
  for heading, table in (extra_tables or {}).items():
    parts.append(f"## {heading}\n")
    parts.append(table if table.endswith("\n") else table + "\n")
  atomic_write(os.path.join(run_dir, SUMMARY_JSON),
                json.dumps(summary, sort_keys=True, indent=2, allow_nan=False) + "\n")
  atomic_write(os.path.join(run_dir, SUMMARY_MD), "\n".join(parts))
  return summary


# ----------------------------------------------------------------------------- progress


def format_duration(seconds: float) -> str:
  """Compact duration: "45s", "1m05s", "2h03m", "1d02h"."""
  if not math.isfinite(seconds) or seconds < 0:
    raise ValueError(f"format_duration needs a finite duration >= 0; got {seconds!r}.")
  s = int(round(seconds))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  if s < 86400:
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
  return f"{s // 86400}d{s % 86400 // 3600:02d}h"


class Progress:
  """A progress line: "label [#####.....] step/total  pct%  12.3 steps/s  ETA 1m05s  info".

  On a TTY the line is redrawn in place (`\\r`) at most every `min_interval_s`; on a log
  file a full line is printed at most every `min_interval_s`, and at least once per 10% of
  progress. The final step always prints. The rate is measured from the first update on,
  so the first chunk's compile time does not distort it; until a second update there is
  no rate and no ETA. `clock` is injectable for tests.

  Why not tqdm or rich: runs are read mostly in log files (Slurm, TPU VMs, `tee`), and
  there neither gives lines. Measured (tqdm 4.70.1, rich, 10 updates into a file): tqdm
  writes its redraws as one line of 22 `\r`s, which `tail -n` and `grep` see as one
  line, its rate timed from construction (compile included); rich prints only the final
  state, nothing while the run goes.
  """

  BAR_WIDTH = 20

  def __init__(self, total_steps: int, *, start_step: int = 0, stream: TextIO | None = None,
               min_interval_s: float = 1.0, label: str = "",
               clock: Callable[[], float] = time.monotonic):
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
      raise ValueError(f"total_steps must be an int >= 1; got {total_steps!r}.")
    if not 0 <= start_step <= total_steps:
      raise ValueError(f"start_step must lie in [0, total_steps={total_steps}]; "
                       f"got {start_step!r}.")
    self.total = total_steps
    # Looked up per instance, not bound at import: a replaced sys.stderr (pytest's capture)
    # may be closed by the time a later run reports progress.
    self.stream = sys.stderr if stream is None else stream
    self.min_interval_s = min_interval_s
    self.label = label
    self.clock = clock
    isatty = getattr(self.stream, "isatty", None)
    self.tty = bool(isatty and isatty())
    self._first: tuple[float, int] | None = None  # (time, step) of the first update.
    self._last_print: float | None = None
    self._last_decile = start_step * 10 // total_steps
    self._open_line = False  # a TTY line awaits its newline.
    self._width = 0

  def rate(self, step: int, now: float) -> float | None:
    """Steps per second since the first update; None before there are two."""
    if self._first is None or now <= self._first[0] or step <= self._first[1]:
      return None
    return (step - self._first[1]) / (now - self._first[0])

  def line(self, step: int, now: float, info: str = "") -> str:
    frac = step / self.total
    filled = int(self.BAR_WIDTH * frac)
    bar = f"[{'#' * filled}{'.' * (self.BAR_WIDTH - filled)}] {step}/{self.total}"
    parts = [f"{self.label} {bar}" if self.label else bar, f"{100 * frac:3.0f}%"]
    rate = self.rate(step, now)
    if rate is None:
      parts += ["-- steps/s", "ETA --"]
    else:
      parts += [f"{rate:.1f} steps/s" if rate >= 1 else f"{rate:.3f} steps/s",
                f"ETA {format_duration((self.total - step) / rate)}"]
    if info:
      parts.append(info)
    return "  ".join(parts)

  def update(self, step: int, info: str = "") -> None:
    if not 0 <= step <= self.total:
      raise ValueError(f"step must lie in [0, total_steps={self.total}]; got {step!r}.")
    now = self.clock()
    if self._first is None:
      self._first = (now, step)
    done = step == self.total
    due = self._last_print is None or now - self._last_print >= self.min_interval_s
    decile = step * 10 // self.total
    if not (done or due or (not self.tty and decile > self._last_decile)):
      return
    self._last_print, self._last_decile = now, decile
    text = self.line(step, now, info)
    if self.tty:
      pad = " " * max(0, self._width - len(text))
      self._width = len(text)
      self.stream.write("\r" + text + pad + ("\n" if done else ""))
      self._open_line = not done
    else:
      self.stream.write(text + "\n")
    self.stream.flush()

  def close(self) -> None:
    """Ends an in-place TTY line so later output starts on a fresh line."""
    if self._open_line:
      self.stream.write("\n")
      self.stream.flush()
      self._open_line = False

  def __enter__(self) -> Progress:
    return self

  def __exit__(self, *exc) -> None:
    self.close()
