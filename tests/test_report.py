"""Run outputs: metrics log round trip and resume, summaries, tables, progress line."""

import io
import json
import math
import os
import struct
import sys

import numpy as np
import pytest

from mpx import report

HP = {"learning_rate": 1e-5, "weight_decay": 1e-3}


def _member(scheme, seed, **hp):
  return {"task": "2parity", "scheme": scheme, "seed": seed, "hparams": {**HP, **hp}}


def _records(step):
  return [report.member_record({**_member(s, 0), "member": i}, step,
                               {"loss": 1.0 / (step + 1), "accuracy": 0.75}, diverged=False)
          for i, s in enumerate(("default", "mask"))]


# ----------------------------------------------------------------------------- metrics.jsonl


def test_member_record_is_flat():
  r = report.member_record({**_member("mask", 3), "member": 7}, 40,
                           {"loss": 0.5, "accuracy": 1.0}, diverged=True)
  assert r == {"step": 40, "task": "2parity", "scheme": "mask", "seed": 3, "member": 7,
               "hparams": HP, "diverged": True, "loss": 0.5, "accuracy": 1.0}
  with pytest.raises(ValueError, match="clash"):
    report.member_record(_member("mask", 3), 0, {"seed": 1.0}, diverged=False)
  with pytest.raises(ValueError, match="describe"):
    report.member_record({"task": "2parity"}, 0, {}, diverged=False)


def test_jsonl_round_trip(tmp_path):
  with report.MetricsWriter(tmp_path / "run") as w:
    w.write(_records(0))
    w.write(_records(10))
  got = report.read_metrics(tmp_path / "run")
  assert got == _records(0) + _records(10)
  lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
  assert len(lines) == 4
  assert lines[0] == json.dumps(_records(0)[0], sort_keys=True)


def test_non_finite_floats_are_written_as_null(tmp_path):
  with report.MetricsWriter(tmp_path) as w:
    w.write([{"step": 5, "loss": float("nan"), "grad": float("-inf"),
              "acc": np.float32(np.inf), "ok": np.float64(0.5), "n": np.int32(3),
              "vec": np.array([1.0, np.nan])}])
  text = (tmp_path / "metrics.jsonl").read_text()
  assert "NaN" not in text and "Infinity" not in text
  json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
  assert report.read_metrics(tmp_path) == [
      {"step": 5, "loss": None, "grad": None, "acc": None, "ok": 0.5, "n": 3,
       "vec": [1.0, None]}]


def test_resume_truncates_to_an_uninterrupted_log(tmp_path):
  killed, clean = tmp_path / "killed", tmp_path / "clean"
  with report.MetricsWriter(killed) as w:  # checkpoint at 10, killed after logging 20, 30.
    for step in (0, 10, 20, 30):
      w.write(_records(step))
  with open(killed / "metrics.jsonl", "a") as f:
    f.write('{"step": 40, "lo')  # torn by the kill mid-write.
  with report.MetricsWriter(clean) as w:
    for step in (0, 10):
      w.write(_records(step))

  with report.MetricsWriter(killed, resume_step=10) as w:
    assert [r["step"] for r in report.read_metrics(killed)] == [0, 0, 10, 10]
    assert (killed / "metrics.jsonl").read_bytes() == (clean / "metrics.jsonl").read_bytes()
    w.write(_records(20))
  with report.MetricsWriter(clean, resume_step=10) as w:  # nothing after 10: unchanged.
    w.write(_records(20))
  assert (killed / "metrics.jsonl").read_bytes() == (clean / "metrics.jsonl").read_bytes()
  assert not os.path.exists(killed / "metrics.jsonl.tmp")

  with report.MetricsWriter(tmp_path / "new", resume_step=10) as w:  # no log yet: fine.
    w.write(_records(20))
  assert len(report.read_metrics(tmp_path / "new")) == 2


def test_fresh_run_refuses_an_existing_log(tmp_path):
  with report.MetricsWriter(tmp_path) as w:
    w.write(_records(0))
  with pytest.raises(FileExistsError, match="--resume.*--out"):
    report.MetricsWriter(tmp_path)
  (tmp_path / "metrics.jsonl").write_text("")
  report.MetricsWriter(tmp_path).close()  # an empty log is no earlier run.


def test_bad_records_and_corrupt_logs_raise(tmp_path):
  w = report.MetricsWriter(tmp_path)
  with pytest.raises(ValueError, match="'step'"):
    w.write([{"loss": 1.0}])
  with pytest.raises(ValueError, match="int >= 0"):
    w.write([{"step": 1.5}])
  w.close()
  with pytest.raises(ValueError, match="closed"):
    w.write(_records(0))
  (tmp_path / "metrics.jsonl").write_text('{"step": 0}\nnot json\n{"step": 1}\n')
  with pytest.raises(ValueError, match="metrics.jsonl:2"):
    report.read_metrics(tmp_path)
  with pytest.raises(ValueError, match="resume_step"):
    report.MetricsWriter(tmp_path, resume_step=-1)


# ----------------------------------------------------------------------------- TensorBoard


def _read_events(log_dir):
  """{tag: [(step, value)]} of every event file in `log_dir`, checking the TFRecord frame
  and CRCs TensorBoard checks."""
  from tensorboardX.proto import event_pb2
  from tensorboardX.record_writer import masked_crc32c
  out = {}
  for path in sorted(log_dir.glob("events.out.tfevents.*")):
    data, i = path.read_bytes(), 0
    while i < len(data):
      header = data[i:i + 8]
      (n,) = struct.unpack("<Q", header)
      assert struct.unpack("<I", data[i + 8:i + 12])[0] == masked_crc32c(header)
      body = data[i + 12:i + 12 + n]
      assert struct.unpack("<I", data[i + 12 + n:i + 16 + n])[0] == masked_crc32c(body)
      i += 16 + n
      event = event_pb2.Event.FromString(body)
      for value in event.summary.value:
        out.setdefault(value.tag, []).append((event.step, value.simple_value))
  return out


def test_tensorboard_scalars_tags_and_skips():
  record = report.member_record({**_member("mask:clique", 2), "member": 5}, 40,
                                {"accuracy": 0.75, "train_loss": np.float32(0.5),
                                 "fidelity": float("nan"), "n_bad": np.int64(3),
                                 "layers": {"block_0": {"fidelity": 0.9}},
                                 "degree_profile": [0.1, 0.9], "note": "x"}, diverged=True)
  assert sorted(report.tensorboard_scalars(record)) == [
      ("2parity/mask_clique/seed2/accuracy", 0.75), ("2parity/mask_clique/seed2/n_bad", 3.0),
      ("2parity/mask_clique/seed2/train_loss", 0.5)]
  fraction = {**record, "group": "addition-f0.01"}  # sweep records name their group.
  assert report.tensorboard_scalars(fraction)[0][0] == "addition-f0.01/mask_clique/seed2/accuracy"
  assert report.tensorboard_scalars({"step": 3, "loss": 1.5}) == [("loss", 1.5)]


def test_metrics_writer_writes_tensorboard_scalars(tmp_path):
  pytest.importorskip("tensorboardX")
  with report.MetricsWriter(tmp_path) as w:
    w.write(_records(0))
    w.write(_records(10) + [{**_records(20)[1], "accuracy": float("inf")}])
  events = _read_events(tmp_path / "tensorboard")
  assert sorted(events) == ["2parity/default/seed0/accuracy", "2parity/default/seed0/loss",
                            "2parity/mask/seed0/accuracy", "2parity/mask/seed0/loss"]
  assert events["2parity/mask/seed0/accuracy"] == [(0, 0.75), (10, 0.75)]  # inf skipped.
  steps, values = zip(*events["2parity/mask/seed0/loss"])
  assert steps == (0, 10, 20) and values == pytest.approx((1.0, 1 / 11, 1 / 21))
  lines = (tmp_path / "metrics.jsonl").read_text().splitlines()  # the log as without.
  assert lines[0] == json.dumps(_records(0)[0], sort_keys=True) and len(lines) == 5


def test_tensorboard_mirrors_a_resumed_log(tmp_path):
  pytest.importorskip("tensorboardX")
  with report.MetricsWriter(tmp_path) as w:  # killed after logging 20; checkpoint at 10.
    for step in (0, 10, 20):
      w.write(_records(step))
  (old,) = (tmp_path / "tensorboard").iterdir()  # Named by the second it was opened in:
  old.rename(old.with_name("events.out.tfevents.1000000000.earlier"))  # as if long ago.
  with report.MetricsWriter(tmp_path, resume_step=10):
    pass
  # The old event file is gone, the kept records replayed into a new one: 20 is dropped.
  assert len(list((tmp_path / "tensorboard").iterdir())) == 1
  steps, values = zip(*_read_events(tmp_path / "tensorboard")["2parity/mask/seed0/loss"])
  assert steps == (0, 10) and values == pytest.approx((1.0, 1 / 11))
  with report.MetricsWriter(tmp_path, resume_step=10) as w:
    w.write(_records(20))
  events = _read_events(tmp_path / "tensorboard")
  assert [s for s, _ in events["2parity/mask/seed0/loss"]] == [0, 10, 20]
  assert [s for s, _ in events["2parity/default/seed0/accuracy"]] == [0, 10, 20]


def test_no_tensorboard_without_the_library(tmp_path, monkeypatch, capsys):
  monkeypatch.setitem(sys.modules, "tensorboardX", None)  # import raises ImportError.
  with report.MetricsWriter(tmp_path) as w:
    for step in (0, 10, 20):
      w.write(_records(step))
  assert not (tmp_path / "tensorboard").exists()
  assert capsys.readouterr().err == report.TENSORBOARD_NOTE + "\n"
  assert "pip install mpx[tensorboard]" in report.TENSORBOARD_NOTE
  assert len(report.read_metrics(tmp_path)) == 6


# ----------------------------------------------------------------------------- summaries

NAN = float("nan")
# 3 seeds x 2 schemes; mask seed 2 diverged.
MEMBERS = [
    {**_member("default", 0), "metrics": {"accuracy": 0.70, "loss": 1.0}, "diverged": False},
    {**_member("default", 1), "metrics": {"accuracy": 0.75, "loss": 2.0}, "diverged": False},
    {**_member("default", 2), "metrics": {"accuracy": 0.80, "loss": 3.0}, "diverged": False},
    {**_member("mask", 0), "metrics": {"accuracy": 1.00, "loss": 0.5}, "diverged": False},
    {**_member("mask", 1), "metrics": {"accuracy": 0.50, "loss": 1.5}, "diverged": False},
    {**_member("mask", 2), "metrics": {"accuracy": NAN, "loss": NAN}, "diverged": True},
]
PAPER = {"2parity": {"default": {"accuracy": 0.75}, "mask": {"accuracy": 1.0, "loss": 0.0029}}}


def test_summarize_by_hand():
  default, mask = report.summarize(MEMBERS, ["accuracy", "loss"])
  assert (default["scheme"], default["n_seeds"], default["n_diverged"]) == ("default", 3, 0)
  assert (mask["scheme"], mask["n_seeds"], mask["n_diverged"]) == ("mask", 3, 1)
  assert default["hparams"] == HP and default["task"] == "2parity"
  # default accuracy: deviations ±0.05, 0 -> population variance 0.005 / 3.
  acc = default["accuracy"]
  assert acc["mean"] == pytest.approx(0.75) and acc["n"] == 3
  assert acc["std"] == pytest.approx(math.sqrt(0.005 / 3))
  assert (acc["min"], acc["max"]) == (0.70, 0.80)
  assert default["loss"] == pytest.approx(
      {"mean": 2.0, "std": math.sqrt(2 / 3), "min": 1.0, "max": 3.0, "n": 3})
  # mask: only seeds 0 and 1 count.
  assert mask["accuracy"] == pytest.approx(
      {"mean": 0.75, "std": 0.25, "min": 0.5, "max": 1.0, "n": 2})
  assert mask["loss"] == pytest.approx(
      {"mean": 1.0, "std": 0.5, "min": 0.5, "max": 1.5, "n": 2})


def test_summarize_groups_by_hparams_and_edge_cases():
  one = [{**_member("mask", 0), "metrics": {"loss": 2.0}, "diverged": False},
         {**_member("mask", 0, learning_rate=1e-4), "metrics": {"loss": 3.0},
          "diverged": True}]
  a, b = report.summarize(one, ["loss"])
  assert a["loss"] == {"mean": 2.0, "std": 0.0, "min": 2.0, "max": 2.0, "n": 1}
  assert b["hparams"]["learning_rate"] == 1e-4 and b["n_diverged"] == 1
  assert b["loss"] == {"mean": None, "std": None, "min": None, "max": None, "n": 0}
  with pytest.raises(ValueError, match="repeats seed 0"):
    report.summarize([one[0], one[0]], ["loss"])
  with pytest.raises(ValueError, match="lacks"):
    report.summarize([{"task": "t"}], ["loss"])


def test_member_key_is_one_for_records_and_members(tmp_path):
  members = [_member("mask", 0, data_fraction=f) | {"metrics": {}, "diverged": False}
             for f in (0.1, 1.0)]
  with report.MetricsWriter(tmp_path) as w:
    w.write([report.member_record(m, 10, {"loss": 1.0}, diverged=False) for m in members])
  records = report.read_metrics(tmp_path)
  assert [report.member_key(r) for r in records] == [report.member_key(m) for m in members]
  assert len({report.member_key(m) for m in members}) == 2  # Same seed, other group.
  assert [report.cell_key(m) for m in members] == [r[:-1] for r in map(report.member_key,
                                                                        members)]
  # Seeds of one cell share its key, as `summarize` gathers them into one row.
  assert report.cell_key(_member("mask", 0)) == report.cell_key(_member("mask", 3))


def test_cell_labels_name_what_tells_groups_apart():
  members = [_member(scheme, 0, data_fraction=f, mask_lr=float(scheme == "mask"))
             for f in (0.1, 1.0) for scheme in ("default", "mask")]
  keys = report.distinguishing_hparams(members)
  assert keys == ["data_fraction"]  # mask_lr is one value per scheme.
  assert [report.cell_label(report.cell_key(m), keys) for m in members] == [
      "default, data_fraction=0.1", "mask, data_fraction=0.1", "default, data_fraction=1",
      "mask, data_fraction=1"]
  assert report.cell_label(report.cell_key(_member("mask", 0)), ["width"], "\n") == (
      "mask\nwidth=—")
  assert report.distinguishing_hparams([_member("mask", s) for s in range(3)]) == []


def _table_lines(table):
  """The rows of a `format_table` table, below its legend."""
  legend, body = table.split("\n\n")
  assert legend.startswith("Columns:\n")
  return body.splitlines()


def test_format_table_formats_and_varying_columns():
  rows = report.summarize(MEMBERS, ["accuracy", "loss"])
  lines = _table_lines(report.format_table(rows, ["accuracy", "loss"], PAPER))
  assert lines[0] == ("| task | scheme | seeds | accuracy (%) | paper accuracy (%) | loss | "
                      "paper loss |")
  assert "| 2parity | default | 3 | 75.00 ± 4.08 | 75.00 | 2.000 ± 0.8165 | — |" in lines
  assert "| 2parity | mask | 3 (1 diverged) | 75.00 ± 25.00 | 100.00 | 1.000 ± 0.5000 | 0.0029 |" in lines

  # Only learning_rate differs; a metric the paper never reports has no paper column.
  members = [{**m, "hparams": {**m["hparams"], "learning_rate": 1e-3 * (1 + m["seed"])},
              "metrics": {**m["metrics"], "test_accuracy": 0.5}} for m in MEMBERS[:2]]
  rows = report.summarize(members, ["test_accuracy", "loss"])
  table = report.format_table(rows, ["test_accuracy", "loss"], {})
  lines = _table_lines(table)
  assert lines[0] == "| task | scheme | learning_rate | seeds | test_accuracy (%) | loss |"
  assert lines[2] == "| 2parity | default | 0.001 | 1 | 50.00 ± 0.00 | 1.000 ± 0.000 |"
  assert lines[3] == "| 2parity | default | 0.002 | 1 | 50.00 ± 0.00 | 2.000 ± 0.000 |"
  assert "weight_decay" not in table

  assert report.is_percent_metric("accuracy") and report.is_percent_metric("accuracy_unseen")
  assert report.is_percent_metric("seq_accuracy") and not report.is_percent_metric("loss")
  assert "| 0.5000 ± 0.000 |" in report.format_table(
      rows, ["test_accuracy"], {}, percent_metrics=())


def test_write_summary(tmp_path):
  summary = report.write_summary(
      tmp_path / "run", experiment="boolean", preset="quick", members=MEMBERS, paper=PAPER,
      metric_names=["accuracy", "loss"], extra_tables={"Unseen outputs": "| a |\n|---|\n| 1 |"})
  on_disk = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert set(on_disk) == {"experiment", "preset", "members", "paper"}
  assert on_disk == summary
  assert on_disk["experiment"] == "boolean" and on_disk["preset"] == "quick"
  assert on_disk["paper"] == PAPER and len(on_disk["members"]) == 6
  assert on_disk["members"][5]["metrics"] == {"accuracy": None, "loss": None}
  md = (tmp_path / "run" / "summary.md").read_text()
  assert md.startswith("# boolean (preset quick)\n\n![overview](plots/overview.png)\n\n")
  assert "6 members, 1 diverged" in md
  assert "Columns:\n- `task`: the task\n" in md
  assert "| 2parity | mask | 3 (1 diverged) | 75.00 ± 25.00 | 100.00 | 1.000 ± 0.5000 | 0.0029 |" in md
  assert "## Unseen outputs\n\n| a |\n|---|\n| 1 |\n" in md


def test_a_table_opens_with_what_each_column_means():
  """One line per column, a metric's from its one description, and each paper column
  names the metric it gives the paper's number of."""
  rows = report.summarize(MEMBERS, ["accuracy", "loss"])
  legend, body = report.format_table(rows, ["accuracy", "loss"], PAPER).split("\n\n")
  header = body.splitlines()[0].strip("| ").split(" | ")
  assert [line.split("`")[1] for line in legend.splitlines()[1:]] == header
  accuracy = report.METRIC_DESCRIPTIONS["accuracy"]
  assert f"- `accuracy (%)`: {accuracy}; {report.PERCENT_NOTE}\n" in legend
  assert "- `paper accuracy (%)`: the paper's number for accuracy (— where" in legend
  assert "- `paper loss`: the paper's number for loss (— where" in legend
  assert report.UNDESCRIBED not in legend


def test_a_metric_nobody_described_says_so_until_its_experiment_describes_it(monkeypatch):
  monkeypatch.setattr(report, "METRIC_DESCRIPTIONS", dict(report.METRIC_DESCRIPTIONS))
  members = [{**m, "metrics": {"r2": 0.5}} for m in MEMBERS[:2]]
  table = lambda: report.format_table(report.summarize(members, ["r2"]), ["r2"], {})
  assert f"- `r2`: {report.UNDESCRIBED}\n" in table()
  report.describe_metrics({"r2": "the coefficient of determination on the test set"})
  assert "- `r2`: the coefficient of determination on the test set\n" in table()
  with pytest.raises(ValueError, match="'accuracy' already means"):
    report.describe_metrics({"accuracy": "something else"})
  assert report.metric_description("val_r2").startswith("r2 on the validation split")
  assert report.metric_description("val_unknown") is None


def test_an_experiment_says_what_its_own_accuracy_means_for_its_run_alone():
  """`described` (an experiment file's METRIC_DESCRIPTIONS): its words over mpx's while
  its run reports, mpx's again after; a description that says "(%)" itself shows the
  legend's percent note once."""
  built_in = report.METRIC_DESCRIPTIONS["accuracy"]
  mine = "share of test sequences whose every token is right (%)"
  table = lambda: report.format_table(report.summarize(MEMBERS, ["accuracy"]),
                                      ["accuracy"], {})
  with report.described({"accuracy": mine}):
    assert report.metric_description("accuracy") == mine
    assert report.metric_description("val_accuracy").startswith("accuracy on the validation")
    assert (f"- `accuracy (%)`: share of test sequences whose every token is right; "
            f"{report.PERCENT_NOTE}\n") in table()
  assert report.metric_description("accuracy") == built_in
  assert f"- `accuracy (%)`: {built_in}; {report.PERCENT_NOTE}\n" in table()
  with pytest.raises(ValueError, match="metric 'loss' must be a non-empty string"):
    with report.described({"loss": ""}):
      pass


# ----------------------------------------------------------------------------- progress


class _Clock:

  def __init__(self):
    self.t = 0.0

  def __call__(self):
    return self.t


def test_progress_on_a_log_stream():
  out, clock = io.StringIO(), _Clock()
  p = report.Progress(100, stream=out, label="boolean", clock=clock)
  for t, step in [(0.0, 10), (0.1, 11), (2.0, 20), (2.1, 30), (2.2, 100)]:
    clock.t = t
    p.update(step, info="loss 0.5")
  p.close()
  lines = out.getvalue().splitlines()
  assert "\r" not in out.getvalue()
  assert len(lines) == 4  # step 11: too soon and same 10% bucket.
  assert lines[0].startswith("boolean [##..................] 10/100")
  assert "-- steps/s" in lines[0] and "ETA --" in lines[0]  # no rate from compile chunk.
  assert lines[1] == ("boolean [####................] 20/100   20%  5.0 steps/s  ETA 16s"
                      "  loss 0.5")  # 10 steps in 2 s, 80 to go.
  assert "30/100" in lines[2]  # printed within the interval: a new 10% bucket.
  assert lines[3].startswith("boolean [####################] 100/100  100%")
  assert "ETA 0s" in lines[3]


def test_progress_on_a_tty_redraws_in_place():

  class Tty(io.StringIO):

    def isatty(self):
      return True

  out, clock = Tty(), _Clock()
  with report.Progress(50, start_step=10, stream=out, min_interval_s=1.0, clock=clock) as p:
    clock.t = 0.0
    p.update(20)
    clock.t = 0.5
    p.update(30)  # too soon on a TTY, even in a new bucket.
    clock.t = 0.6
    p.update(50)
  text = out.getvalue()
  assert text.count("\r") == 2 and text.endswith("\n") and text.count("\n") == 1
  assert "50/50  100%" in text and "50.0 steps/s" in text  # 30 steps in 0.6 s since step 20.
  with pytest.raises(ValueError, match="step"):
    p.update(51)
  with pytest.raises(ValueError, match="total_steps"):
    report.Progress(0)


@pytest.mark.parametrize("seconds, text", [
    (0, "0s"), (45, "45s"), (45.4, "45s"), (59.6, "1m00s"), (65, "1m05s"),
    (3599, "59m59s"), (7380, "2h03m"), (7399, "2h03m"), (90000, "1d01h")])
def test_format_duration(seconds, text):
  assert report.format_duration(seconds) == text


@pytest.mark.parametrize("bad", [-1.0, float("inf"), float("nan")])
def test_format_duration_rejects(bad):
  with pytest.raises(ValueError, match="format_duration"):
    report.format_duration(bad)
