"""`mpx run`: outputs, exact resume (also after SIGKILL), SIGTERM, divergence, --set."""

import dataclasses
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from etils import epath

from mpx import checkpoint, cli, report
from mpx.sweep import config as config_lib
from mpx.sweep import engine, run, run_folder

import sweep_fixtures as fx

TESTS = pathlib.Path(__file__).parent
TOY = str(TESTS / "toy_experiment.py")


def _assert_same_run(dir_a, dir_b, overrides=()):
  """Same final params, metrics and summary; a run folder may be a gs:// URL."""
  for name in ("toy_a", "toy_b"):
    a, b = fx.final_state(dir_a, name, overrides), fx.final_state(dir_b, name, overrides)
    assert int(a.step) == int(b.step) == 24
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
      np.testing.assert_array_equal(x, y)
  metrics = lambda d: (epath.Path(d) / "metrics.jsonl").read_bytes()
  assert metrics(dir_a) == metrics(dir_b)
  summary = lambda d: json.loads((epath.Path(d) / "summary.json").read_text())
  assert summary(dir_a) == summary(dir_b)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  out = tmp_path_factory.mktemp("uninterrupted")
  assert cli.main(["run", TOY, "--out", str(out)]) == 0
  return out


def test_run_writes_outputs(uninterrupted, capsys):
  records = report.read_metrics(uninterrupted)
  assert len(records) == 2 * 4 * (24 // 4 + 1)   # groups × members × evaluations (+ init)
  assert sorted({r["step"] for r in records}) == list(range(0, 25, 4))
  assert {r["group"] for r in records} == {"toy_a", "toy_b"}
  assert {"mean_output", "train_loss", "step", "scheme", "seed", "hparams"} <= set(records[0])
  summary = json.loads((uninterrupted / "summary.json").read_text())
  assert set(summary) == {"experiment", "preset", "members", "paper"}
  assert len(summary["members"]) == 8 and not any(m["diverged"] for m in summary["members"])
  assert "mean_output" in summary["members"][0]["metrics"]
  assert "| toy | mask |" in (uninterrupted / "summary.md").read_text()
  saved = json.loads((uninterrupted / "config.json").read_text())
  assert saved["config"]["steps"] == 24 and saved["preset"] == "default"


def test_rerun_into_same_dir_without_resume_is_an_error(uninterrupted, capsys):
  with pytest.raises(SystemExit):
    cli.main(["run", TOY, "--no-plots", "--out", str(uninterrupted)])
  err = capsys.readouterr().err
  assert "pass --resume" in err and "differs" not in err  # The same config: it continues.


def _files(run_dir):
  return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
          if p.is_file()}


def test_refused_fresh_run_leaves_the_run_folder_unchanged(uninterrupted, tmp_path, capsys):
  out = tmp_path / "copy"
  shutil.copytree(uninterrupted, out)
  before = _files(out)
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", TOY, "--no-plots", "--out", str(out), "--set", "learning_rate=0.5"])
  assert exit_info.value.code == run.REFUSED_EXIT_CODE == 3
  assert _files(out) == before                       # config.json and metrics included.
  err = capsys.readouterr().err
  assert "already holds checkpoints" in err and "another --out" in err
  assert "differs in ['learning_rate']" in err     # What makes --resume refuse it too.
  assert len(err.strip().splitlines()) == 1
  # The kept config still guards the run: resuming it with the new settings is refused.
  with pytest.raises(SystemExit):
    cli.main(["run", TOY, "--no-plots", "--out", str(out), "--resume", "--set", "learning_rate=0.5"])
  assert "learning_rate" in capsys.readouterr().err
  assert _files(out) == before
  # Metrics past step 0 without a checkpoint (killed before its first save) are refused
  # too: that run trained.
  shutil.rmtree(out / "checkpoints")
  with pytest.raises(SystemExit):
    cli.main(["run", TOY, "--no-plots", "--out", str(out), "--set", "learning_rate=0.5"])
  assert "already holds metrics" in capsys.readouterr().err
  assert json.loads((out / "config.json").read_bytes()) == json.loads(before[
      pathlib.Path("config.json")])


def test_a_run_that_fails_at_start_does_not_block_its_corrected_rerun(uninterrupted,
                                                                      tmp_path, capsys):
  out = tmp_path / "failed"
  with pytest.raises(SystemExit):
    cli.main(["run", TOY, "--no-plots", "--out", str(out), "--set", "fail_to_train=true"])
  assert "cannot be traced" in capsys.readouterr().err
  # What it left: its config, the step-0 evaluation and the groups' checkpoint folders.
  assert {r["step"] for r in report.read_metrics(out)} == {0}
  assert (out / "checkpoints" / "toy_a").is_dir()
  with pytest.raises(SystemExit):  # --resume is refused, naming the way out.
    cli.main(["run", TOY, "--no-plots", "--out", str(out), "--resume"])
  err = capsys.readouterr().err
  assert "fail_to_train" in err and "never completed a step" in err and "without --resume" in err
  assert cli.main(["run", TOY, "--no-plots", "--out", str(out)]) == 0
  assert (out / "metrics.jsonl").read_bytes() == (uninterrupted / "metrics.jsonl").read_bytes()
  saved = json.loads((out / "config.json").read_text())
  assert saved["config"]["fail_to_train"] is False


def test_config_records_the_command_but_resume_compares_only_the_config(uninterrupted,
                                                                        tmp_path, capsys):
  saved = json.loads((uninterrupted / "config.json").read_text())
  assert saved["run"] == {"command": f"mpx run {TOY} --preset default --out {uninterrupted}",
                          "experiment_file": TOY}
  out = tmp_path / "older"
  shutil.copytree(uninterrupted, out)
  # A folder written before the command was recorded, resumed from another spelling of it.
  del saved["run"]
  (out / "config.json").write_text(json.dumps(saved))
  assert cli.main(["run", TOY, "--no-plots", "--out", str(out) + "/", "--resume"]) == 0
  assert "--resume" in capsys.readouterr().err.splitlines()[0]


def test_resume_checks_the_config_stored_with_the_checkpoints(uninterrupted, tmp_path,
                                                              capsys):
  out = tmp_path / "tampered"
  shutil.copytree(uninterrupted, out)
  experiment = config_lib.load_experiment(TOY)
  preset, cfg = config_lib.make_config(experiment, None, ["learning_rate=0.5"])
  tampered = {"experiment": experiment.NAME, "preset": preset,
              "config": json.loads(json.dumps(dataclasses.asdict(cfg)))}
  (out / "config.json").write_text(json.dumps(tampered, indent=2) + "\n")
  before = _files(out)
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", TOY, "--no-plots", "--out", str(out), "--resume", "--set", "learning_rate=0.5"])
  assert exit_info.value.code == run.REFUSED_EXIT_CODE == 3
  err = capsys.readouterr().err
  assert "checkpoints" in err and "another config" in err and "['learning_rate']" in err
  assert _files(out) == before


def _signalled_toy(signals=(signal.SIGTERM,), values=1):
  """The toy experiment, sending itself `signals` at the first evaluation after the
  init's. `values`: how many values of a traced list the overrides give (members ×)."""
  calls = []
  experiment = config_lib.load_experiment(TOY)
  original = experiment.build_groups

  def build_groups_with_preemption(cfg):
    groups = original(cfg)
    task = groups[0].task
    size = len(groups[0].members) * values

    def summarize_then_signal(values, member):
      calls.append(True)
      if len(calls) == size + 1:
        for signum in signals:
          os.kill(os.getpid(), signum)
      return task.summarize(values, member)

    groups[0] = dataclasses.replace(
        groups[0], task=dataclasses.replace(task, summarize=summarize_then_signal))
    return groups

  experiment.build_groups = build_groups_with_preemption
  return experiment


def _run_preempted_then_resume(out, overrides=(), before_resume=lambda: None, values=1):
  """Runs the toy with a SIGTERM at the first evaluation after the init's, checks the
  checkpoint it left, calls `before_resume()`, then resumes it from the command line."""
  experiment = _signalled_toy(values=values)
  with pytest.raises(run.Preempted):
    run.run_experiment(experiment, out_dir=str(out), overrides=overrides)
  out = epath.Path(out)
  with checkpoint.Checkpointer(out / "checkpoints" / "toy_a") as ckpt:
    assert ckpt.latest_step() == 4
  assert not (out / "summary.json").exists()
  before_resume()
  sets = [a for o in overrides for a in ("--set", o)]
  assert cli.main(["run", TOY, "--out", str(out), "--resume", *sets]) == 0


def test_sigterm_checkpoints_then_resume_is_exact(uninterrupted, tmp_path):
  out = tmp_path / "sigterm"
  _run_preempted_then_resume(out)
  _assert_same_run(uninterrupted, out)


@pytest.mark.parametrize("when", ["toy_a's final evaluation", "toy_b's init"])
def test_a_signal_between_groups_stops_before_the_next_compile(uninterrupted, tmp_path,
                                                               monkeypatch, when):
  """A SIGTERM during a group's final evaluation stops before the next group is built (a
  stage 2 reads stage 1's graphs in its init); one during a group's init stops before its
  compile and first chunk. The same command then ends as if uninterrupted."""
  from mpx.sweep import evaluate
  out, started = tmp_path / "stopped", []
  train_group, init_state = run.train_group, engine.init_state
  evaluator = evaluate.Evaluator.__call__

  def evaluate_then_signal(self, state):
    if (when == "toy_a's final evaluation" and self.group.name == "toy_a"
        and int(state.step) == self.group.steps):
      os.kill(os.getpid(), signal.SIGTERM)
    return evaluator(self, state)

  def init_then_signal(group, *args):
    if when == "toy_b's init" and group.name == "toy_b":
      os.kill(os.getpid(), signal.SIGTERM)
    return init_state(group, *args)

  monkeypatch.setattr(evaluate.Evaluator, "__call__", evaluate_then_signal)
  monkeypatch.setattr(engine, "init_state", init_then_signal)
  monkeypatch.setattr(run, "train_group", lambda group, *a, **k: started.append(group.name)
                      or train_group(group, *a, **k))
  with pytest.raises(run.Preempted, match="saved the run up to group toy_b, which had not"):
    run.run_experiment(config_lib.load_experiment(TOY), out_dir=str(out))
  assert started == (["toy_a"] if when == "toy_a's final evaluation" else ["toy_a", "toy_b"])
  with checkpoint.Checkpointer(epath.Path(out) / "checkpoints" / "toy_a") as ckpt:
    assert ckpt.latest_step() == 24
  with checkpoint.Checkpointer(epath.Path(out) / "checkpoints" / "toy_b") as ckpt:
    assert ckpt.latest_step() is None  # Not a chunk of toy_b ran.
  monkeypatch.undo()
  assert cli.main(["run", TOY, "--out", str(out), "--resume"]) == 0
  _assert_same_run(uninterrupted, out)


def test_ctrl_c_saves_like_sigterm_in_one_line(uninterrupted, tmp_path, monkeypatch, capsys):
  """Ctrl-C (SIGINT) checkpoints at the end of the chunk, says so in one line and exits
  130; the same command with --resume ends equal to the uninterrupted run."""
  from mpx.sweep import config as config_module
  sets = ["--set", "checkpoint_every=8"]  # Step 4 (the signal's step) is saved for Ctrl-C only.
  before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN in a background job.
  out = tmp_path / "sigint"
  experiment = _signalled_toy((signal.SIGINT,))
  monkeypatch.setattr(config_module, "load_experiment", lambda name: experiment)
  assert cli.main(["run", TOY, "--no-plots", "--out", str(out), *sets]) == 130
  err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("mpx run:")]
  assert len(err) == 1 and "Ctrl-C: saved group toy_a at step 4" in err[0], err
  with checkpoint.Checkpointer(epath.Path(out) / "checkpoints" / "toy_a") as ckpt:
    assert ckpt.latest_step() == 4
  assert signal.getsignal(signal.SIGINT) is before  # Restored.
  monkeypatch.undo()
  assert cli.main(["run", TOY, "--no-plots", "--out", str(out), *sets, "--resume"]) == 0
  _assert_same_run(uninterrupted, out)


# The toy run, sending itself two Ctrl-C at its first evaluation after the init's, then
# keeping the main thread busy there (as a long chunk on the device would).
_TWO_CTRL_C = """
import dataclasses, os, signal, sys, time
sys.path.insert(0, {tests!r})
import toy_experiment
from mpx import cli
from mpx.sweep import config as config_lib

build_groups, calls = toy_experiment.build_groups, []

def build_groups_with_two_ctrl_c(cfg):
  first, *others = build_groups(cfg)

  def summarize(values, member):
    calls.append(member)
    if len(calls) == len(first.members) + 1:
      os.kill(os.getpid(), signal.SIGINT)
      print(f"sending the second Ctrl-C at {{time.time()}}", file=sys.stderr, flush=True)
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(60)
    return first.task.summarize(values, member)

  task = dataclasses.replace(first.task, summarize=summarize)
  return [dataclasses.replace(first, task=task), *others]

toy_experiment.build_groups = build_groups_with_two_ctrl_c
toy_experiment.NAME = "toy_experiment"
config_lib.load_experiment = lambda name: toy_experiment
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_second_ctrl_c_stops_at_once_and_says_what_is_on_disk(tmp_path):
  """Two Ctrl-C while the main thread is busy: the process exits 130 within a second of
  the second (an unwinding exit took 3.2–3.7 s here: JAX's and Orbax's threads joined at
  shutdown), in one line naming each group's checkpoint on disk and --resume."""
  script = tmp_path / "two_ctrl_c.py"
  script.write_text(_TWO_CTRL_C.format(tests=str(TESTS)))
  out = tmp_path / "run"
  proc = subprocess.Popen([sys.executable, str(script), "run", TOY, "--no-plots", "--out",
                           str(out), "--set", "checkpoint_every=2"],  # Signalled at step 4.
                          stderr=subprocess.PIPE, text=True)
  sent, lines = None, []
  for line in proc.stderr:  # Read as written, so the exit is timed when it happens.
    if line.startswith("sending the second Ctrl-C at "):
      sent = float(line.split()[-1])
    elif line.startswith("mpx run:"):
      lines.append(line.strip())
  proc.wait()
  assert proc.returncode == 130 and sent is not None, (proc.returncode, lines)
  assert time.time() - sent < 1.0, f"exited {time.time() - sent:.2f} s after the second Ctrl-C"
  with checkpoint.Checkpointer(epath.Path(out) / "checkpoints" / "toy_a") as ckpt:
    assert ckpt.latest_step() == 2
  assert lines == [
      f"mpx run: stopped by a second Ctrl-C, without saving; checkpoints in {out}/checkpoints:"
      " toy_a at step 2 of 24, toy_b none yet. Continue from them with the same command with "
      "--resume=auto; the steps after them are lost."]
  assert {r["step"] for r in report.read_metrics(out)} == {0}  # Whole lines, as written.


def test_a_second_ctrl_c_before_any_checkpoint_points_to_none(tmp_path):
  """The line of a stop with no checkpoint yet names none and says how to start again."""
  experiment = config_lib.load_experiment(TOY)
  groups = experiment.build_groups(config_lib.make_config(experiment, None)[1])
  (tmp_path / "checkpoints" / "toy_a").mkdir(parents=True)  # Created, nothing finalised.
  for resume, start in ((False, "the same command with --resume=auto"),
                        ("auto", "the same command")):
    assert run._stopped(epath.Path(tmp_path / "checkpoints"), groups, resume) == (
        "stopped by a second Ctrl-C, without saving: no checkpoint was written yet, so "
        f"there is nothing to continue from; {start} starts the run again.")


def test_gs_run_resumed_elsewhere_equals_the_local_run(uninterrupted, bucket):
  """A gs:// run folder (a GCS emulator): checkpoints written by Orbax into the bucket, the
  other files uploaded from staging, the metrics there reaching the checkpoint a SIGTERM
  left; resumed without that staging folder (another machine), it equals the local run."""
  out = f"{bucket}/runs/toy"
  sets = ["checkpoint_every=8"]  # Fewer saves than the toy's 2 (each is many requests).

  def uploaded_up_to_the_checkpoint():
    lines = (epath.Path(out) / "metrics.jsonl").read_text().splitlines()
    assert {json.loads(line)["step"] for line in lines} == {0, 4}
    assert not pathlib.Path(out).exists() and not pathlib.Path("gs:").exists()
    shutil.rmtree(run_folder.staging_dir(out))

  _run_preempted_then_resume(out, sets, before_resume=uploaded_up_to_the_checkpoint)
  _assert_same_run(uninterrupted, out)
  root = epath.Path(out)
  assert (root / "summary.md").read_text() == (uninterrupted / "summary.md").read_text()
  assert (root / "plots" / "overview.png").exists()
  with pytest.raises(SystemExit):                     # A fresh run into it is refused.
    cli.main(["run", TOY, "--no-plots", "--out", out, "--set", sets[0]])


def test_stream_run_trains_and_resumes_exactly_after_sigterm(tmp_path):
  """A host stream trains through the same loop, and resumes bit-exact (the stream is a
  function of (seed, step))."""
  whole = tmp_path / "whole"
  assert cli.main(["run", TOY, "--no-plots", "--out", str(whole), "--set", "data=stream"]) == 0
  records = report.read_metrics(whole)
  assert len(records) == 2 * 4 * (24 // 4 + 1)
  first = [r["train_loss"] for r in records if r["step"] == 4]
  last = [r["train_loss"] for r in records if r["step"] == 24]
  assert np.mean(last) < np.mean(first)                    # It learns the regression.
  out = tmp_path / "sigterm"
  _run_preempted_then_resume(out, ["data=stream"])
  _assert_same_run(whole, out, overrides=["data=stream"])


def test_sigkill_after_checkpoint_then_resume_is_exact(uninterrupted, tmp_path):
  out = tmp_path / "killed"
  mpx = pathlib.Path(sys.executable).parent / "mpx"
  proc = subprocess.Popen([str(mpx), "run", TOY, "--out", str(out)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  ckpt_dir = out / "checkpoints" / "toy_a"
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    steps = [p.name for p in ckpt_dir.glob("*") if p.name.isdigit()] if ckpt_dir.exists() else []
    if any(int(s) >= 6 for s in steps):
      break
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
  assert not (out / "summary.json").exists()
  assert cli.main(["run", TOY, "--no-plots", "--out", str(out), "--resume"]) == 0
  _assert_same_run(uninterrupted, out)


def test_resume_with_another_config_is_an_error(uninterrupted, capsys):
  with pytest.raises(SystemExit):
    cli.main(["run", TOY, "--no-plots", "--out", str(uninterrupted), "--resume", "--set", "steps=8"])
  assert "steps" in capsys.readouterr().err


def test_diverged_member_is_reported_and_others_unchanged(uninterrupted, tmp_path):
  out = tmp_path / "diverged"
  assert cli.main(["run", TOY, "--no-plots", "--out", str(out), "--set", "bad_learning_rate=1e30"]) == 0
  summary = json.loads((out / "summary.json").read_text())
  flags = [(m["scheme"], m["seed"], m["diverged"]) for m in summary["members"]]
  assert ("mask", 1, True) in flags and ("mask", 11, True) in flags
  assert sum(d for _, _, d in flags) == 2
  records = [r for r in report.read_metrics(out) if r["diverged"]]
  assert records and all("diverged_step" in r for r in records)
  healthy = lambda d: [(r["group"], r["member"], r["step"], r["mean_output"])
                       for r in report.read_metrics(d) if not (r["scheme"] == "mask" and
                                                               r["seed"] % 10 == 1)]
  assert healthy(out) == healthy(uninterrupted)


@pytest.mark.parametrize("assignment, message", [
    ("stepz=3", "unknown config key; did you mean steps\\? valid keys: .*steps"),
    ("zzz=3", "unknown config key; valid keys: "),  # Nothing near: no guess.
    ("steps=three", "steps=three: expected a value of type int"),
    ("schemes", "expected key=value"),
    ("schemes=", "schemes=: empty item; give a comma-separated list"),
    ("schemes=mask,,default", "empty item"),
    ("schemes=mask,", "empty item"),
])
def test_set_errors_name_the_key(assignment, message):
  experiment = config_lib.load_experiment(TOY)
  with pytest.raises(ValueError, match=message):
    config_lib.make_config(experiment, None, [assignment])


def test_set_parses_types():
  experiment = config_lib.load_experiment(TOY)
  _, cfg = config_lib.make_config(experiment, "default", [
      "steps=8", "learning_rate=0.5", "bad_learning_rate=none", "schemes=mask, default"])
  assert (cfg.steps, cfg.learning_rate, cfg.bad_learning_rate) == (8, 0.5, None)
  assert cfg.schemes == ("mask", "default")
  with pytest.raises(ValueError, match="multiple of chunk_steps"):
    config_lib.make_config(experiment, "default", ["eval_every=3"])


def test_unknown_experiment_and_preset():
  with pytest.raises(ValueError, match="available: .*boolean_gotu"):
    config_lib.load_experiment("boolean_gotoo")
  with pytest.raises(ValueError, match="unknown preset"):
    config_lib.make_config(config_lib.load_experiment(TOY), "paper")
  with pytest.raises(ValueError, match="unknown preset ''"):   # Not the default preset.
    config_lib.make_config(config_lib.load_experiment(TOY), "")


def test_plot_command_writes_decodable_pngs(uninterrupted):
  import matplotlib.image
  assert cli.main(["plot", str(uninterrupted)]) == 0
  pngs = sorted((uninterrupted / "plots").glob("*.png"))
  assert {p.name for p in pngs} >= {"toy_mean_output.png", "toy_train_loss.png"}
  for png in pngs:
    image = matplotlib.image.imread(png)
    assert image.shape[0] > 100 and image.shape[1] > 100 and image.std() > 0


def test_a_comma_list_for_a_one_value_field_is_a_sweep():
  experiment = config_lib.load_experiment("boolean_gotu")
  preset, variants = config_lib.make_configs(experiment, "tiny", [
      "width=8,16", "schemes=default,mask", "depth=1,2"])
  assert preset == "tiny"
  assert [labels for labels, _ in variants] == [
      {"width": 8, "depth": 1}, {"width": 8, "depth": 2}, {"width": 16, "depth": 1},
      {"width": 16, "depth": 2}]
  assert all(c.schemes == ("default", "mask") for _, [c] in variants)  # A tuple field: a list.
  assert [c.width for _, [c] in variants] == [8, 8, 16, 16]
  _, [(labels, _)] = config_lib.make_configs(experiment, "tiny", ["width=8"])
  assert labels == {}
  with pytest.raises(ValueError, match="seeds is one value per run"):
    config_lib.make_configs(experiment, "tiny", ["seeds=1,2"])
  with pytest.raises(ValueError, match="width=8x: expected a value of type int"):
    config_lib.make_configs(experiment, "tiny", ["width=8,8x"])


def test_architecture_sweep_trains_one_group_per_value_in_one_run(tmp_path):
  experiment = config_lib.load_experiment("boolean_gotu")
  out = tmp_path / "widths"
  summary = run.run_experiment(experiment, preset="tiny", out_dir=str(out), overrides=[
      "width=8,16", "schemes=mask", "eval_every=0", "checkpoint_every=0"])
  assert sorted((m["hparams"]["width"], m["scheme"]) for m in summary["members"]) == [
      (8, "mask"), (16, "mask")]
  assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
      "2parity-width16", "2parity-width8"]
  saved = json.loads((out / "config.json").read_text())
  assert saved["sweep"] == {"width": [8, 16]} and saved["config"]["width"] == 8
  assert "| task | scheme | width | seeds |" in (out / "summary.md").read_text()
  group8, group16 = (run.labelled(g, {"width": w}) for w, g in (
      (8, experiment.build_groups(config_lib.make_config(experiment, "tiny", [
          "width=8", "schemes=mask"])[1])[0]),
      (16, experiment.build_groups(config_lib.make_config(experiment, "tiny", [
          "width=16", "schemes=mask"])[1])[0])))
  for group, width in ((group8, 8), (group16, 16)):
    with checkpoint.Checkpointer(out / "checkpoints" / group.name) as ckpt:
      state, _ = ckpt.restore(engine.init_state(group))
    assert state.params["head"]["kernel"].shape[1] == width


@pytest.mark.parametrize("name", ["boolean_gotu", "arithmetic"])
def test_shared_config_fields_are_checked_for_every_experiment(name):
  experiment = config_lib.load_experiment(name)
  with pytest.raises(ValueError, match=r"mask_layers \[2\] are not layers of a depth-1 model"):
    config_lib.make_config(experiment, "tiny", ["mask_layers=0,2"])
  with pytest.raises(ValueError, match=r"unknown schemes \['qk'\]"):
    config_lib.make_config(experiment, "tiny", ["schemes=mask,qk"])
  with pytest.raises(ValueError, match="width=0 must be >= 1"):
    config_lib.make_config(experiment, "tiny", ["width=0"])
  with pytest.raises(ValueError, match=r"step_variant='unroll3'; choose from \('auto', 'plain'"):
    config_lib.make_config(experiment, "tiny", ["step_variant=unroll3"])


@pytest.mark.parametrize("name", ["boolean_gotu", "arithmetic", "vision", "language"])
def test_the_step_variant_reaches_every_familys_groups(name):
  """`step_variant` names how the engine compiles a group's chunk; "auto" is "plain" off a
  GPU."""
  experiment = config_lib.load_experiment(name)
  for variant in ("unroll2", "auto"):
    _, config = config_lib.make_config(experiment, "tiny", [f"step_variant={variant}"])
    groups = experiment.build_groups(config)
    assert groups and all(g.chunk_options == variant for g in groups), variant
  assert engine.chunk_options("auto", "cpu") == engine.ChunkOptions()
  assert engine.chunk_options("auto", "gpu") == engine.STEP_VARIANTS[engine.GPU_STEP_VARIANT]


def test_a_folder_written_before_fingerprints_still_resumes():
  """A config.json without a fingerprint (mpx before fingerprints) is compared on its
  config alone; one with a fingerprint is compared on it too."""
  saved = {"experiment": "boolean_gotu", "preset": "tiny", "config": {"steps": 8},
           "fingerprint": {"2parity": {"support": [0, 1]}}}
  before_fingerprints = {k: v for k, v in saved.items() if k != "fingerprint"}
  assert run._config_differences(before_fingerprints, saved) == []
  changed = saved | {"fingerprint": {"2parity": {"support": [0, 2]}}}
  assert run._config_differences(changed, saved) == ["fingerprint.2parity"]
  assert run._config_differences(before_fingerprints | {"config": {"steps": 9}}, saved) == [
      "steps"]


def test_a_folder_written_before_a_config_key_existed_resumes_at_its_default():
  """A run recorded before `step_variant` existed trained as "auto" does: it resumes with
  that value, and is refused with any other; a config without the key compares as it was."""
  before = {"experiment": "boolean_gotu", "preset": "tiny", "config": {"steps": 8}}
  now = lambda variant: before | {"config": {"steps": 8, "step_variant": variant}}
  assert run._config_differences(before, now("auto")) == []
  assert run._config_differences(before, now("unroll2")) == ["step_variant"]
  assert run._config_differences(now("unroll2"), now("auto")) == ["step_variant"]
  assert run._config_differences(before, before) == []
