"""`mpx run --resume=auto`: one command for the first start and every restart.

A run killed at a fixed point (while the first group's state is built, while a chunk
runs, while a checkpoint is being saved, between two groups; and while config.json is
written, before mpx handles SIGTERM), by SIGKILL or by SIGTERM, then given the identical
command again, ends with the metrics.jsonl, summary and params of an uninterrupted run,
bit for bit. The kill points are test hooks (`_arm`): a function of mpx or of the
standard library is wrapped so that the process sends itself the signal at that point.
SIGKILL runs in a subprocess (`_driver`); SIGTERM runs in this process, where mpx's
handler turns it into a flag. The killed run's lock on its folder is taken over by the
restart; a second start while a run is stopped half way (SIGSTOP) is refused, and that run
then ends as if alone (the lock itself: tests/test_run_lock.py).
"""

import contextlib
import io
import itertools
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import types

import jax
import numpy as np
import pytest
from etils import epath

from mpx import cli
from mpx.sweep import config as config_lib
from mpx.sweep import engine, lock, memory, run

import sweep_fixtures as fx

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
TOY = str(TESTS / "toy_experiment.py")
# 2 groups (toy_a, toy_b) of 2 members, 8 steps in chunks of 2, evaluations at 0, 4 and 8,
# checkpoints at 4 and 8.
OVERRIDES = ["steps=8", "seeds=1", "checkpoint_every=4"]
SETS = [a for o in OVERRIDES for a in ("--set", o)]
# The subprocesses share one persistent compilation cache (they compile the same programs).
_CACHE = {"JAX_COMPILATION_CACHE_DIR": tempfile.mkdtemp(prefix="mpx-test-resume-auto-"),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _argv(out, *extra):
  """The one command: the same for the first start and every restart."""
  return ["run", TOY, "--no-plots", "--out", str(out), "--resume=auto", *SETS, *extra]


# --- the kill points (test hooks) ----------------------------------------------------------

def _arm(point: str, signum: int, setattr_) -> None:
  """Makes this process send itself `signum` at `point` (once), by wrapping one function
  with `setattr_` (pytest's monkeypatch.setattr here, plain setattr in a subprocess)."""
  fired = []

  def kill():
    if not fired:
      fired.append(True)
      os.kill(os.getpid(), signum)

  if point == "init":  # config.json is written; the first group's state is being built.
    init_state = engine.init_state

    def init_state_then_kill(*args, **kwargs):
      kill()
      return init_state(*args, **kwargs)
    setattr_(engine, "init_state", init_state_then_kill)
  elif point == "mid-chunk":  # toy_a's third chunk (steps 4 to 6) is dispatched, running.
    planned = memory.planned
    calls = itertools.count(1)

    def planned_with_kill(*args, **kwargs):
      chunk = planned(*args, **kwargs)

      def call(*chunk_args):
        out = chunk(*chunk_args)  # Asynchronous dispatch: the chunk is in flight.
        if next(calls) == 3:
          kill()
        return out
      return call
    setattr_(memory, "planned", planned_with_kill)
  elif point == "save":  # toy_a's step-4 checkpoint is written, not yet renamed final.
    rename = os.rename

    def rename_with_kill(src, dst, *args, **kwargs):
      if os.path.basename(dst) == "4" and os.path.basename(os.path.dirname(dst)) == "toy_a":
        kill()
      return rename(src, dst, *args, **kwargs)
    setattr_(os, "rename", rename_with_kill)
  elif point == "between-groups":  # toy_a is finished, toy_b has not started.
    train_group = run.train_group

    def train_group_then_kill(group, *args, **kwargs):
      records = train_group(group, *args, **kwargs)
      if group.name == "toy_a":
        kill()
      return records
    setattr_(run, "train_group", train_group_then_kill)
  elif point == "config-write":  # config.json's temporary file is written, not renamed.
    replace = os.replace

    def replace_with_kill(src, dst, *args, **kwargs):
      if os.fspath(dst).endswith("config.json"):
        kill()
      return replace(src, dst, *args, **kwargs)
    setattr_(os, "replace", replace_with_kill)
  else:
    raise ValueError(f"unknown kill point {point!r}")


def _driver() -> None:
  """`python -c '...; _driver()' POINT SIGNAL MPX-ARGS...`: mpx's command, with a kill."""
  point, name, *argv = sys.argv[1:]
  _arm(point, getattr(signal, name), setattr)
  sys.exit(cli.main(argv))


def _killed_subprocess(point: str, name: str, argv: list[str]) -> subprocess.CompletedProcess:
  code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
          "import test_resume_auto; test_resume_auto._driver()")
  env = {k: v for k, v in os.environ.items() if not k.startswith(("MPX_", "SLURM_"))}
  return subprocess.run([sys.executable, "-c", code, point, name, *argv], cwd=ROOT,
                        env=env | _CACHE | {"JAX_PLATFORMS": "cpu"}, capture_output=True,
                        text=True, timeout=600)


# --- comparing runs -----------------------------------------------------------------------

def _assert_same_run(reference, out):
  """Bit for bit: the final params (the whole state) of both groups, metrics.jsonl, the
  summaries; and nothing a killed save left behind (`out` may be a gs:// URL)."""
  out = epath.Path(out)
  for name in ("toy_a", "toy_b"):
    a, b = fx.final_state(reference, name, OVERRIDES), fx.final_state(out, name, OVERRIDES)
    assert int(a.step) == int(b.step) == 8
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
      np.testing.assert_array_equal(x, y)
  for name in ("metrics.jsonl", "summary.json", "summary.md"):
    assert (out / name).read_bytes() == (reference / name).read_bytes(), name
  if not str(out).startswith("gs://"):  # epath walks no bucket recursively.
    local = pathlib.Path(out)
    assert not [p for p in local.rglob("*") if "tmp" in p.name], "temporary files left"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted run: the same command into an empty folder (a fresh start)."""
  out = tmp_path_factory.mktemp("reference") / "run"
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    assert cli.main(_argv(out)) == 0
  return out, err.getvalue()


def test_auto_starts_fresh_and_prints_the_plan(reference):
  out, err = reference
  lines = err.splitlines()
  assert lines[0].endswith(f"--out {out} --resume=auto  (1 cpu device(s))"), lines[0]
  assert lines[1:4] == [
      f"run folder: {out} (starting fresh)",
      "members: 4 in 2 group(s) (toy_a 2, toy_b 2)",
      "devices: 1 cpu, 1 process(es) x 1 per host; padding rows (copies filling each group "
      "to a multiple of 1 devices, never reported): toy_a 0, toy_b 0"]
  assert json.loads((out / "config.json").read_text())["config"]["steps"] == 8


def test_plan_counts_padding_rows():
  """6 members on 4 devices: 2 padding rows (the members are padded to 8)."""
  experiment = config_lib.load_experiment(TOY)
  _, cfg = config_lib.make_config(experiment, None, ["seeds=3"])
  groups = experiment.build_groups(cfg)
  mesh = types.SimpleNamespace(size=4)  # A mesh of 4 devices: only its size is read.
  text = run.plan(groups, mesh, "runs/x", {"toy_a": 8})
  assert text.splitlines() == [
      "run folder: runs/x (resuming: toy_a from step 8, toy_b from the start)",
      "members: 12 in 2 group(s) (toy_a 6, toy_b 6)",
      f"devices: 4 cpu, 1 process(es) x {jax.local_device_count()} per host; padding rows "
      "(copies filling each group to a multiple of 4 devices, never reported): "
      "toy_a 2, toy_b 2"]


# What each kill leaves: the completed checkpoint steps (and for SIGTERM, which saves
# first, its exit status 143).
SIGKILL_POINTS = {
    "init": {},                        # config.json only (and empty folders).
    "mid-chunk": {"toy_a": 4},         # The chunk from 4 to 6 is lost.
    "save": {},                        # Step 4's checkpoint half done: metrics past 0 only.
    "between-groups": {"toy_a": 8},
}
SIGTERM_POINTS = {
    "init": {},                        # Stops before the group compiles: nothing to save.
    "mid-chunk": {"toy_a": 6},         # SIGTERM saves after the chunk it arrived in.
    "save": {"toy_a": 6},              # The save finishes; the next chunk saves and stops.
    "between-groups": {"toy_a": 8},    # Stops before toy_b is built.
}
UNSTARTED = ("init", "between-groups")  # The points that stop before a group starts.


@pytest.mark.parametrize("point", list(SIGKILL_POINTS))
def test_sigkill_then_the_same_command_ends_equal(reference, tmp_path, capsys, point):
  """The killed run's lock stays behind, and the same command takes it over (its process
  is gone) with one line, then resumes."""
  out = tmp_path / "run"
  killed = _killed_subprocess(point, "SIGKILL", _argv(out))
  assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
  assert run.completed_steps(epath.Path(out) / "checkpoints") == SIGKILL_POINTS[point]
  if point == "save":  # Orbax's temporary folder, and metrics of step 4 to drop.
    assert list((out / "checkpoints" / "toy_a").glob("4.orbax-checkpoint-tmp*"))
    assert 4 in {json.loads(line)["step"] for line in (out / "metrics.jsonl").open()}
  if point == "init":
    json.loads((out / "config.json").read_text())  # Whole, never half written.
  assert not (out / "summary.json").exists()
  held = json.loads((out / lock.LOCK_FILE).read_text())
  assert cli.main(_argv(out)) == 0
  took_over = (f"mpx run: took over the lock of {out} from pid {held['pid']} on "
               f"{held['host']} since ")
  err = capsys.readouterr().err
  assert err.startswith(took_over), err[:500]
  assert err.splitlines()[0].endswith(f"process {held['pid']} on this machine is gone.")
  _assert_same_run(reference[0], out)
  assert not (out / lock.LOCK_FILE).exists()


def test_a_second_start_while_the_first_runs_is_refused_and_the_first_ends_whole(
    reference, tmp_path, capsys):
  """The first run stops itself (SIGSTOP) while toy_a's chunk from step 4 runs, its lock
  held; a second start of the same command is refused (75) with one line, reading and
  writing nothing; the first, continued, ends equal to an uninterrupted run."""
  out = tmp_path / "run"
  code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
          "import test_resume_auto; test_resume_auto._driver()")
  env = {k: v for k, v in os.environ.items() if not k.startswith(("MPX_", "SLURM_"))}
  first = subprocess.Popen([sys.executable, "-c", code, "mid-chunk", "SIGSTOP", *_argv(out)],
                           cwd=ROOT, env=env | _CACHE | {"JAX_PLATFORMS": "cpu"},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    _, status = os.waitpid(first.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(status), first.communicate()
    before = _files(out)
    assert cli.main(_argv(out)) == run.LOCKED_EXIT_CODE == 75
    err = capsys.readouterr().err
    assert err.startswith(f"mpx run: locked: {out} is being written by pid {first.pid} on "
                          f"{socket.gethostname()} since "), err
    assert err.count("\n") == 1 and "choose another --out" in err
    assert _files(out) == before
  finally:
    os.kill(first.pid, signal.SIGCONT)
  _, stderr = first.communicate(timeout=600)
  assert first.returncode == 0, stderr[-3000:]
  _assert_same_run(reference[0], out)  # Its metrics.jsonl whole, as if it ran alone.
  assert not (out / lock.LOCK_FILE).exists()


@pytest.mark.parametrize("point", list(SIGTERM_POINTS))
def test_sigterm_then_the_same_command_ends_equal(reference, tmp_path, monkeypatch, capsys,
                                                  point):
  out = tmp_path / "run"
  with monkeypatch.context() as patch:
    _arm(point, signal.SIGTERM, patch.setattr)
    assert cli.main(_argv(out)) == run.PREEMPTED_EXIT_CODE == 143
  assert run.completed_steps(epath.Path(out) / "checkpoints") == SIGTERM_POINTS[point]
  err = capsys.readouterr().err
  saved = "which had not started" if point in UNSTARTED else "SIGTERM: saved group"
  assert saved in err and "Continue with the same command." in err
  assert cli.main(_argv(out)) == 0
  resumed = "(starting fresh)" if point == "init" else "(resuming: toy_a from step"
  assert resumed in capsys.readouterr().err
  _assert_same_run(reference[0], out)


def test_sigterm_while_config_json_is_written_then_the_same_command_ends_equal(reference,
                                                                              tmp_path):
  """A SIGTERM during the start, before training's own handler, here half way through
  writing config.json: the run unwinds (143, one line; its lock released on the way), the
  file is written whole or not at all, and the identical command then starts the run
  afresh."""
  out = tmp_path / "run"
  killed = _killed_subprocess("config-write", "SIGTERM", _argv(out))
  assert killed.returncode == run.PREEMPTED_EXIT_CODE, killed.stderr[-3000:]
  assert killed.stderr.splitlines()[-1].startswith("mpx run: stopped by SIGTERM outside "
                                                   "training"), killed.stderr[-3000:]
  assert not (out / "config.json").exists() and not (out / lock.LOCK_FILE).exists()
  assert cli.main(_argv(out)) == 0
  _assert_same_run(reference[0], out)


def _files(run_dir):
  return {p.relative_to(run_dir): p.read_bytes() for p in sorted(run_dir.rglob("*"))
          if p.is_file()}


def test_auto_refuses_another_run_and_resumes_a_finished_one(reference, tmp_path, capsys):
  out = tmp_path / "copy"
  shutil.copytree(reference[0], out)
  before = _files(out)
  with pytest.raises(SystemExit) as exit_info:
    cli.main(_argv(out, "--set", "learning_rate=0.5"))
  assert exit_info.value.code == run.REFUSED_EXIT_CODE == 3
  err = capsys.readouterr().err
  assert err.startswith("mpx run: refused: --resume=auto: the config differs")
  assert "['learning_rate']" in err and "another --out" in err
  assert _files(out) == before                      # Nothing written.
  # The finished run, given again: resumed at its end, the same summary.
  assert cli.main(_argv(out)) == 0
  assert "(resuming: toy_a from step 8, toy_b from step 8)" in capsys.readouterr().err
  _assert_same_run(reference[0], out)


def test_auto_replaces_a_start_that_never_trained(reference, tmp_path, capsys):
  """A folder whose run failed before training (another config) holds nothing to lose:
  --resume=auto starts afresh there, as a plain start does."""
  out = tmp_path / "failed"
  with pytest.raises(SystemExit) as exit_info:
    cli.main(_argv(out, "--set", "fail_to_train=true"))
  assert exit_info.value.code == run.ERROR_EXIT_CODE == 2
  assert json.loads((out / "config.json").read_text())["config"]["fail_to_train"] is True
  capsys.readouterr()
  assert cli.main(_argv(out)) == 0
  assert f"run folder: {out} (starting fresh)" in capsys.readouterr().err
  _assert_same_run(reference[0], out)


def test_resume_values(tmp_path, capsys):
  """--resume alone keeps its meaning (nothing to resume: refused, exit 3); another value
  is a usage error that names the fix."""
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", TOY, "--out", str(tmp_path / "none"), "--resume"])
  assert exit_info.value.code == 3
  assert "nothing to resume" in capsys.readouterr().err
  assert not (tmp_path / "none").exists()
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", "--resume", TOY, "--out", str(tmp_path / "x")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "expected --resume or --resume=auto" in err and "put the experiment before" in err
  args = cli.make_parser().parse_args(["run", TOY, "--resume"])
  assert args.resume is True
  assert cli.make_parser().parse_args(["run", TOY, "--resume=auto"]).resume == "auto"
  assert cli.make_parser().parse_args(["run", TOY]).resume is False
  assert cli.RESUME_AUTO == run.RESUME_AUTO


def test_run_help_lists_the_exit_codes(capsys):
  with pytest.raises(SystemExit):
    cli.main(["run", "--help"])
  out = capsys.readouterr().out
  assert "exit status:" in out and "--resume=auto" in out
  for code in (0, run.FAILED_EXIT_CODE, run.ERROR_EXIT_CODE, run.REFUSED_EXIT_CODE,
               run.STORAGE_EXIT_CODE, run.LOCKED_EXIT_CODE, run.PREEMPTED_EXIT_CODE):
    assert f"\n  {code} " in out, code
