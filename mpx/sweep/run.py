"""`mpx run`: train an experiment's groups, evaluate, checkpoint, report.

Host work happens between compiled chunks: evaluation (one `metrics.jsonl` line per
member), progress, checkpoints (Orbax, one per group holding the whole stacked state), and
a SIGTERM check (preemption saves a checkpoint, then exits; `--resume` continues
bit-for-bit).

`--resume=auto` makes one command serve the first start and every restart: a folder with
no run (or only what a start that never trained left) starts fresh, a folder holding the
same run resumes, a folder holding another run is refused. The exit codes a restart loop
acts on are the `*_EXIT_CODE` constants below (see `mpx run --help`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import sys
import threading
import types
from typing import Callable

import jax
import numpy as np
from etils import epath

from mpx import checkpoint, diagnostics, report
from mpx.sweep import config as config_lib
from mpx.sweep import data as data_lib
from mpx.sweep import distributed
from mpx.sweep import engine
from mpx.sweep import evaluate as evaluate_lib
from mpx.sweep import lock as lock_lib
from mpx.sweep import memory
from mpx.sweep import run_folder
from mpx.sweep import select as select_lib
from mpx.sweep import stages
from mpx.sweep import storage

# `mpx run`'s exit codes: 0 done; 1 failed (an unexpected error: a traceback); 2 error
# (a bad command line, a config refused when it is built or traced, or a package missing or
# half-installed: a one-line message);
# 3 refused (the run folder holds another run, or --resume found nothing to continue:
# nothing was written); 143 preempted (SIGTERM: the state is checkpointed, run the same
# command again); 130 interrupted (Ctrl-C, saved as for SIGTERM; a second Ctrl-C stops at
# once). A process killed by SIGKILL shows 137 in a shell; it too continues from its last
# checkpoint with the same command.
FAILED_EXIT_CODE = 1
ERROR_EXIT_CODE = 2
REFUSED_EXIT_CODE = 3
# 75 locked: another process is writing the run folder (`lock`): nothing was read or
# written; the same command succeeds once that process has ended (the launchers wait).
LOCKED_EXIT_CODE = lock_lib.EXIT_CODE
PREEMPTED_EXIT_CODE = 143
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports Ctrl-C.
# 4 storage: a full disk, a denied permission, a bucket refusing a write, or checkpoints of
# a group none of which restores (one line naming the path and the cause; nothing is
# retried: fix it, then run the same command again).
STORAGE_EXIT_CODE = 4
# 69 storage unavailable: a fault that may pass (a bucket's 503s, a timeout, an I/O error)
# outlasted MPX_STORAGE_RETRY_S seconds of retries (`checkpoint.retrying`); the same
# command later continues the run, and the launchers give it (`storage.UNAVAILABLE_EXIT_CODE`).
RESUME_AUTO = "auto"  # `--resume=auto`: start, or continue the same run.


class _NullWriter:
  """The metrics writer of processes other than 0: process 0 writes every record."""

  def write(self, records) -> None:
    del records

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return None


class _Fenced:
  """A metrics writer whose every write is preceded by `fence()` (the lock still ours)."""

  def __init__(self, writer, fence: Callable[[], None]):
    self.writer, self.fence = writer, fence

  def write(self, records) -> None:
    self.fence()
    self.writer.write(records)

  def __enter__(self):
    self.writer.__enter__()
    return self

  def __exit__(self, *exc):
    return self.writer.__exit__(*exc)


class _NullStream:
  """Where the progress of processes other than 0 goes."""

  def write(self, text: str) -> int:
    return len(text)

  def flush(self) -> None:
    pass


class Preempted(Exception):
  """Raised after a SIGTERM or a Ctrl-C once the state is safely checkpointed."""

  def __init__(self, message: str, exit_code: int = PREEMPTED_EXIT_CODE):
    super().__init__(message)
    self.exit_code = exit_code


class Refused(ValueError):
  """The run folder does not fit the command: it holds another run (another config, or
  progress a fresh start would overwrite), or `--resume` found nothing to continue.
  Raised before anything is written; `mpx run` exits with REFUSED_EXIT_CODE."""


class _RefusedFresh(Refused, FileExistsError):
  """A fresh start into a folder that holds an earlier run's progress."""


class _NothingToResume(Refused, FileNotFoundError):
  """`--resume` into a folder without a run."""


class _StopFlag:
  """Turns SIGTERM and a first Ctrl-C (SIGINT) into a flag checked between chunks (a chunk
  is never cut in half, the state is saved) and before each group compiles.

  A second Ctrl-C stops at once, as a SIGKILL would, after printing `stopped()` (what is
  on disk). A thread reads the signals from Python's wakeup fd, so it acts even while the
  main thread waits on the device, and ends the process with `os._exit`: an unwinding
  exit spends seconds joining JAX's and Orbax's threads. Nothing on disk needs the
  unwinding: checkpoints are finalised by a rename, metrics lines are durable as written.
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, stopped: Callable[[], str]):
    self.raised = False
    self.signum = None  # The first signal's.
    self._stopped = stopped
    self._previous = {}
    self._wakeup = None  # (write end of the pipe, the wakeup fd it replaced)

  def __enter__(self):
    self._previous = {signum: signal.signal(signum, self._handle) for signum in self.SIGNALS}
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)  # set_wakeup_fd's requirement.
    self._wakeup = (write_fd, signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False))
    threading.Thread(target=self._watch, args=(read_fd,), name="mpx-second-ctrl-c",
                     daemon=True).start()
    return self

  def _handle(self, signum, frame):
    del frame
    self.raised, self.signum = True, self.signum or signum

  def _watch(self, read_fd: int) -> None:
    """The signal numbers as they arrive, until `__exit__` closes the pipe."""
    seen = []
    with os.fdopen(read_fd, "rb", buffering=0) as wakeup:
      while data := wakeup.read(16):
        seen += data
        if seen[0] == signal.SIGINT and seen.count(signal.SIGINT) > 1:
          deadline = threading.Timer(2.0, os._exit, (INTERRUPTED_EXIT_CODE,))
          deadline.daemon = True  # Where listing the checkpoints hangs (a bucket).
          deadline.start()
          try:
            newline = "\n" if sys.stderr.isatty() else ""  # Below a progress bar's line.
            print(f"{newline}mpx run: {self._stopped()}", file=sys.stderr)
            sys.stdout.flush()
            sys.stderr.flush()
          finally:  # Stopped even where the streams are gone.
            os._exit(INTERRUPTED_EXIT_CODE)

  def preempted(self, where: str) -> Preempted:
    """The exception to raise once saved (another host's signal reads as SIGTERM here)."""
    if self.signum == signal.SIGINT:
      return Preempted(f"Ctrl-C: saved {where}.", INTERRUPTED_EXIT_CODE)
    return Preempted(f"SIGTERM: saved {where}.")

  def __exit__(self, *exc):
    write_fd, previous = self._wakeup
    signal.set_wakeup_fd(previous)
    os.close(write_fd)  # The watcher reads the end of the pipe and returns.
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)


def again(resume) -> str:
  """How to go on after a stop: the same command, with `--resume=auto` where it had none
  (right whether or not a checkpoint was written)."""
  return ("the same command" if resume == RESUME_AUTO
          else f"the same command with --resume={RESUME_AUTO}")


def _stopped(checkpoints: epath.Path, groups: list[engine.Group], resume) -> str:
  """What a second Ctrl-C leaves on disk (each group's latest checkpoint), and how to go
  on from it: from a checkpoint where there is one, else by starting again."""
  try:
    steps = completed_steps(checkpoints)
  except Exception as e:  # The process stops anyway: say why nothing could be listed.
    return (f"stopped by a second Ctrl-C, without saving; the checkpoints in {checkpoints} "
            f"could not be read ({type(e).__name__}: {e}).")
  if not steps:
    return (f"stopped by a second Ctrl-C, without saving: no checkpoint was written yet, so "
            f"there is nothing to continue from; {again(resume)} starts the run again.")
  saved = ", ".join(f"{g.name} at step {steps[g.name]} of {g.steps}" if g.name in steps
                    else f"{g.name} none yet" for g in groups)
  return (f"stopped by a second Ctrl-C, without saving; checkpoints in {checkpoints}: "
          f"{saved}. Continue from them with {again(resume)}; the steps after them are lost.")


def _stop_if_signalled(sigterm: _StopFlag, group: engine.Group, step: int) -> None:
  """Stops before `group` trains (at its checkpoint `step`, or before it started) once a
  signal came on any process: nothing of it is unsaved."""
  if distributed.any_process(sigterm.raised):
    raise sigterm.preempted(f"group {group.name} at step {step}" if step
                            else f"the run up to group {group.name}, which had not started")


def _is_due(step: int, every: int, last: int) -> bool:
  return step == last or (every > 0 and step % every == 0)


def _records(group, state, step, train, metrics):
  """One metrics record per member; `train` is the last chunk's output (or None)."""
  alive, diverged_step, train = distributed.to_host((state.alive, state.diverged_step, train))
  scalars = {name: np.asarray(v) for name, v in (train or {}).items() if name != "alive"}
  scalars.setdefault("train_loss", np.full((len(group.members),), np.nan))
  records = []
  for i, (member, m) in enumerate(zip(group.members, metrics)):
    values = dict(m) | {name: float(v[i]) for name, v in scalars.items()}
    record = report.member_record(member.describe() | {"member": i}, step, values,
                                  diverged=not bool(alive[i]))
    record["group"] = group.name
    if not alive[i]:
      record["diverged_step"] = int(diverged_step[i])
    records.append(record)
  return records


def _progress_info(train, k: int) -> str:
  loss, alive = distributed.to_host((train["train_loss"], train["alive"]))
  loss, alive = loss[:k], alive[:k]
  return f"loss {np.nanmean(loss):.4g}, diverged {int(k - alive.sum())}"


def _feeder(group: engine.Group, step: int, chunk_steps: int, mesh):
  """The background feeder of a streamed group from `step` on (None for device data)."""
  if not isinstance(group.data, data_lib.Stream):
    return None
  return data_lib.ChunkFeeder(group.data, step, group.steps, chunk_steps,
                              put=lambda chunk: engine.replicate(chunk, mesh))


def fit(group: engine.Group, chunk_steps: int = 50, *, mesh=None,
        state: engine.SweepState | None = None) -> tuple[engine.SweepState, list[dict]]:
  """Trains a group to the end in memory (no run folder, no checkpoints) and evaluates it:
  (final state, metrics per member). The library route for a group built in your own
  code; `mpx run` adds files, resume and progress around the same chunk. With a probe the
  metrics hold the persistence diagnostics but not the heatmaps' [N, N] lists (each
  member's `prior_pattern`, the attention maps of `map_layers`), which would flood a
  printout: `mpx run`'s records keep them for its figures."""
  state, hparams, data = engine.place(group, engine.init_state(group) if state is None
                                      else state, mesh)
  chunk = engine.make_train_chunk(group, chunk_steps)
  feeder = _feeder(group, int(state.step), chunk_steps, mesh)
  try:
    for _ in range(int(state.step), group.steps, chunk_steps):
      state, _ = chunk(state, hparams, feeder.next() if feeder else data)
  finally:
    if feeder is not None:
      feeder.close()
  return state, [_without_heatmaps(m) for m in evaluate_lib.Evaluator(group)(state)]


def _without_heatmaps(metrics: dict) -> dict:
  """A member's metrics without the [N, N] lists the heatmaps of `mpx run` read."""
  metrics = {k: v for k, v in metrics.items() if k != "prior_pattern"}
  if "layers" in metrics:
    metrics["layers"] = {layer: {k: v for k, v in values.items() if k != "attention_map"}
                         for layer, values in metrics["layers"].items()}
  return metrics


def train_group(group: engine.Group, cfg: config_lib.SweepConfig, checkpoints: epath.Path, *,
                writer, saved_config: dict, resume: bool, sigterm: _StopFlag,
                mesh=None, before_save=lambda: None) -> list[dict]:
  """Trains one group to the end (or to a preemption); returns final member records.

  Checkpoints go to `checkpoints`/group name; `before_save()` runs before each save (a URL
  run uploads its metrics there, so the bucket's records reach every checkpoint).

  Chunks are dispatched ahead: the next chunk is queued before the previous one's
  scalars are read for the progress line, so the device never waits on the host between
  evaluations and checkpoints (which need the state itself, and so wait for it).
  """
  k = len(group.members)
  rows = engine.member_rows(k, mesh)  # This process's members: it builds only those.
  evaluate = evaluate_lib.Evaluator(group)
  with checkpoint.Checkpointer(checkpoints / group.name,
                               max_to_keep=cfg.keep_checkpoints) as ckpt:
    state = engine.init_state(group, rows)
    if resume and ckpt.latest_step() is not None:
      # Whole arrays by member, then this process's rows: the checkpoint may come from
      # another number of devices or hosts (other padding, other rows per process).
      state, stored = ckpt.restore_host(state)
      _check_checkpoint_config(ckpt.directory, stored, saved_config)
      state = engine.take_rows(state, rows)
    state, hparams, data = engine.place(group, state, mesh, local=True)
    # Its first call prints the group's memory plan (process 0), before the chunk runs.
    train_chunk = memory.planned(engine.make_train_chunk(group, cfg.chunk_steps), group,
                                 show=distributed.is_primary())
    step = int(state.step)
    if step < group.steps:  # A signal during the init stops before the compile.
      _stop_if_signalled(sigterm, group, step)
    feeder = _feeder(group, step, cfg.chunk_steps, mesh)
    train = None  # The last chunk's scalars.
    metrics = None  # The last evaluation's; the final one is reused, not recomputed.
    progress = report.Progress(group.steps, start_step=step,
                               label=f"{group.name} ({k} members)",
                               stream=None if distributed.is_primary() else _NullStream())
    try:
      if step == 0 and cfg.eval_every:  # Curves and heatmaps start at the initialisation.
        writer.write(_records(group, state, 0, None, evaluate(state)))
      pending = None  # (step, scalars) of the chunk in flight, not yet read.
      while step < group.steps:
        state, out = train_chunk(state, hparams, feeder.next() if feeder else data)
        if pending is not None:  # Read while the chunk just dispatched runs.
          progress.update(pending[0], _progress_info(pending[1], k))
        step = min(step + cfg.chunk_steps, group.steps)
        pending, train = (step, out), out
        # One host's SIGTERM is every host's: all enter the collective save together.
        preempted = distributed.any_process(sigterm.raised)
        save = _is_due(step, cfg.checkpoint_every, group.steps) or preempted
        evaluate_now = _is_due(step, cfg.eval_every, group.steps)
        if evaluate_now or save:
          progress.update(step, _progress_info(out, k))
          pending = None
          if evaluate_now:
            metrics = evaluate(state)
            writer.write(_records(group, state, step, train, metrics))
            preempted = distributed.any_process(sigterm.raised)  # One during the evaluation.
          if save or preempted:
            before_save()
            ckpt.save(step, state, saved_config)
          if preempted and step < group.steps:
            raise sigterm.preempted(f"group {group.name} at step {step}")
    finally:
      progress.close()
      if feeder is not None:
        feeder.close()
  if metrics is None:  # Resumed at the end: the loop did not run (it evaluates the last step).
    metrics = evaluate(state)
  return _records(group, state, group.steps, train, metrics)


# What config.json records beside the config. `run` (the command, the experiment's file)
# is for the reader and is never compared; `fingerprint` (an experiment's definition of its
# data, e.g. each Boolean task's cube) is compared where the earlier run recorded one.
INFORMATIONAL = "run"
FINGERPRINT = "fingerprint"
# Config keys added after runs were recorded, at the value those runs trained with: a
# record without one (config.json, a checkpoint's) resumes a run that keeps that value.
ADDED_KEYS = {"step_variant": "auto"}


def _config_differences(previous: dict, saved: dict) -> list[str]:
  """The names that differ: `experiment`/`preset`, the config keys, then the fingerprinted
  names (e.g. `fingerprint.parity3`); empty when a resume may go on."""
  renamed = lambda record: dict(record, experiment=config_lib.RENAMED.get(
      record.get("experiment"), record.get("experiment")))  # A folder of the old name.
  previous, saved = renamed(previous), renamed(saved)
  keys = [k for k in ("experiment", "preset", "sweep", "traced")
          if previous.get(k) != saved.get(k)]
  old, new = previous.get("config", {}), saved.get("config", {})
  old = {k: v for k, v in ADDED_KEYS.items() if k in new} | old
  keys += sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
  if FINGERPRINT in previous:  # Folders written before fingerprints still resume.
    old, new = previous[FINGERPRINT], saved.get(FINGERPRINT, {})
    keys += sorted(f"{FINGERPRINT}.{k}" for k in set(old) | set(new)
                   if old.get(k) != new.get(k))
  return keys


def _read_config(path: epath.Path, flag: str) -> dict:
  """config.json as a dict; one that is not JSON (e.g. written by hand) is named."""
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise Refused(f"{flag}: {path} is not valid JSON ({e}); restore it from the run's "
                  "checkpoints' config, or start afresh with another --out.") from None


def _check_resume_config(run_dir: epath.Path, checkpoints: epath.Path, saved: dict,
                         flag: str = "--resume") -> None:
  path = run_dir / "config.json"
  if not path.exists():
    if flag != "--resume":  # --resume=auto resumes only a folder with progress.
      raise _NothingToResume(f"{flag}: {run_dir} holds {_has_progress(run_dir, checkpoints)}"
                             f" of a run but no config.json; restore it, or choose another "
                             "--out.")
    raise _NothingToResume(f"--resume: {path} does not exist; nothing to resume (--resume="
                           "auto starts a run there, or continues it).")
  previous = _read_config(path, flag)
  differences = _config_differences(previous, saved)
  if differences and not _has_progress(run_dir, checkpoints):
    raise Refused(f"--resume: the run in {run_dir} differs in {differences} and never "
                  "completed a step; run without --resume (or with --resume=auto) to start "
                  "afresh there.")
  if differences and all(d.startswith(FINGERPRINT + ".") for d in differences):
    raise Refused(f"{flag}: the run in {run_dir} was trained on other data or task "
                  f"definitions ({differences} changed since it started); restore them, "
                  "or start afresh with another --out.")
  if differences:
    raise Refused(f"{flag}: the config differs from the run in {run_dir} in "
                  f"{differences}; use the same --preset and --set to continue it, or "
                  "another --out for a new run.")


def _check_checkpoint_config(directory: str | pathlib.Path, stored: dict, saved: dict,
                             flag: str = "--resume") -> None:
  """The config saved with the checkpoint is what the state was trained with; config.json
  may have been overwritten since."""
  if _config_differences(stored, saved):
    raise Refused(f"{flag}: the checkpoints in {directory} were written with another "
                  f"config (differs in {_config_differences(stored, saved)}); use the "
                  "run's --preset and --set, or start a fresh run with another --out.")


def _intact_steps(root: epath.Path, saved: dict, flag: str = "--resume"
                  ) -> tuple[dict[str, int], list[checkpoint.DamagedCheckpoint], list[str]]:
  """Each group's newest checkpoint under `root` that restores completely (its sums
  verified, then read whole, read-only, before anything is written; its config checked),
  the newer ones that do not, which the run sets aside, and the steps it resumes from
  that carry no sums (written before mpx summed them, `_unsummed_line`): {group: step},
  [damaged], ["GROUP step STEP"]. Process 0 decides for all processes (`_verdict`). A
  group none of whose checkpoints restores is a StorageError naming its folder: nothing
  is moved then."""
  steps, damaged, unsummed = {}, [], []
  for directory in sorted(root.iterdir() if root.is_dir() else []):
    failed = []  # A group without a finalised step starts from scratch.
    for step in reversed(checkpoint.all_steps(directory)):
      cause, summed, stored = _verdict(directory, step)
      if cause is not None:
        failed.append(checkpoint.DamagedCheckpoint(directory, step, cause))
        continue
      _check_checkpoint_config(directory, stored, saved, flag)
      steps[directory.name] = step
      if not summed:
        unsummed.append(f"{directory.name} step {step}")
      break
    if failed and directory.name not in steps:
      causes = "; ".join(f"step {e.step}: {e.cause}" for e in failed)
      raise checkpoint.StorageError(
          f"no checkpoint of group {directory.name} in {directory} restores ({causes})",
          path=str(directory), cause=causes,
          fix=f"move the damaged step folders out of {directory} (group "
              f"{directory.name} then trains from step 0) or put back intact copies")
    damaged += failed
  return steps, damaged, unsummed


def _verdict(directory: epath.Path, step: int) -> tuple[str | None, bool, dict | None]:
  """Whether checkpoint `step` restores: (why not, or None; whether it has sums; its
  config). Process 0 alone verifies the sums and reads the state whole (reading every
  byte once is enough), and its verdict is every process's: one decision for all, even
  where another process would see the storage otherwise."""
  verdict = None
  if distributed.is_primary():
    def read() -> list:
      summed = checkpoint.verify_sums(directory, step)
      return [None, summed, checkpoint.check_intact(directory, step, verify=False)]
    read_passing = lambda: checkpoint.retrying("reading checkpoint", read, f"{directory}/{step}")
    try:
      try:
        verdict = read_passing()
      except checkpoint.DamagedCheckpoint:  # Damaged only where a second read agrees.
        verdict = read_passing()
    except checkpoint.DamagedCheckpoint as e:
      verdict = [e.cause, False, None]
    except Exception as e:  # The others must not wait for a verdict that never comes.
      storage_fault = ([type(e).__name__, e.path, e.cause, e.fix]
                       if isinstance(e, checkpoint.StorageError) else None)
      distributed.from_primary({"error": f"{type(e).__name__}: {e}", "storage": storage_fault})
      raise
  verdict = distributed.from_primary(verdict)
  if isinstance(verdict, dict):  # Process 0 raised: its error here too, in one line.
    if verdict["storage"]:
      kind, path, cause, fix = verdict["storage"]
      error = getattr(checkpoint, kind, checkpoint.StorageError)
      raise error(verdict["error"], path=path, cause=cause, fix=fix)
    raise RuntimeError(f"process 0 failed checking checkpoint step {step} in {directory}: "
                       f"{verdict['error']}")
  return tuple(verdict)


def _unsummed_line(unsummed: list[str]) -> str:
  """The one line for the steps a run resumes from unverified: written by an mpx that
  did not sum checkpoints yet, they restore as they always did."""
  return (f"checkpoints written without checksums (by mpx before it summed them): "
          f"{', '.join(unsummed)} resume unverified, as before; the run's new checkpoints "
          "carry them")


def _set_aside(damaged: checkpoint.DamagedCheckpoint, steps: dict[str, int]) -> str:
  """Moves a damaged checkpoint out of the steps Orbax lists; the line that says so."""
  moved = checkpoint.set_aside(damaged.directory, damaged.step)
  group = os.path.basename(damaged.directory)
  return (f"checkpoint step {damaged.step} of group {group} does not restore "
          f"({damaged.cause}): moved to {moved}; {group} resumes from step {steps[group]}")


def _check_run_dir(run_dir: pathlib.Path) -> None:
  """The run folder is, or can be made, a directory: the nearest existing path is one."""
  for path in (run_dir, *run_dir.parents):
    if path.exists():
      if not path.is_dir():
        raise ValueError(f"--out {run_dir}: {path} is a file, not a folder; choose another "
                         "--out.")
      return


def _trained_records(run_dir: epath.Path) -> bool:
  """Whether metrics.jsonl holds a record past step 0 (a run that trained); reads up to
  the first such line."""
  metrics = run_dir / report.METRICS_FILE
  if not metrics.exists():
    return False
  with metrics.open("r") as f:
    for line in f:
      try:
        if json.loads(line).get("step", 0) > 0:
          return True
      except json.JSONDecodeError:  # A torn last line (a kill mid-write).
        continue
  return False


def _has_progress(run_dir: epath.Path, checkpoints: epath.Path) -> str | None:
  """What the folder holds of an earlier run's training ("checkpoints" of a completed
  step, or "metrics" past step 0), or None: a run that failed before training (its
  config, its step-0 evaluation, an empty checkpoint folder) has nothing to lose."""
  if completed_steps(checkpoints):
    return "checkpoints"
  return "metrics" if _trained_records(run_dir) else None


def _check_fresh(run_dir: epath.Path, checkpoints: epath.Path, saved: dict) -> None:
  """A fresh run must not mix with (or overwrite the config of) an earlier one that
  trained; what a failed start left is replaced (so its corrected re-run needs no rm).
  Where the earlier run's config differs, --resume would be refused too: the message
  names the keys and points to another --out."""
  held = _has_progress(run_dir, checkpoints)
  if not held:
    return
  path = run_dir / "config.json"
  differences = _config_differences(_read_config(path, "--out"), saved) if path.exists() else []
  if differences:
    raise _RefusedFresh(f"{run_dir} already holds {held} of an earlier run whose config "
                        f"differs in {differences}, so --resume cannot continue it with "
                        "this one: choose another --out for this config, or drop the "
                        "changes and pass --resume to continue that run.")
  raise _RefusedFresh(f"{run_dir} already holds {held} of an earlier run; pass --resume "
                      "(or --resume=auto) to continue it, or choose another --out.")


def completed_steps(root: epath.Path) -> dict[str, int]:
  """Each group's latest checkpointed step under `root` (listed, not read: whether a
  folder holds progress; `_intact_steps` reads what a resume restores)."""
  steps = {}
  for directory in (root.iterdir() if root.exists() else []):
    latest = checkpoint.latest_step(directory)
    if latest is not None:
      steps[directory.name] = latest
  return steps


PERSISTENCE_METRICS = ("fidelity_init", "fidelity", "drift_mask", "drift_qk")


def persistence_table(run_dir: pathlib.Path, members: list[dict]) -> str | None:
  """Per scheme and group: prior fidelity at init and at the end, drift at the end, and
  the steps until fidelity fell below half its initial value, from each member's metric
  history (`report.member_key`, which keeps the groups of a run apart)."""
  if not any("fidelity" in m["metrics"] for m in members):
    return None
  rows = report.summarize(members, PERSISTENCE_METRICS)
  table = report.format_table(rows, PERSISTENCE_METRICS, paper={})
  history: dict = {}
  for r in report.read_metrics(run_dir):
    if r.get("fidelity") is not None:
      steps, fidelity = history.setdefault(report.member_key(r), ([], []))
      if not steps and r["step"] > 0:  # No evaluation at step 0: start at init.
        steps.append(0)
        fidelity.append(r["fidelity_init"])
      steps.append(r["step"])
      fidelity.append(r["fidelity"])
  halves: dict = {}  # Per cell (scheme and group), in the tables' order.
  for key, (steps, fidelity) in history.items():
    step = diagnostics.steps_to_half(steps, fidelity)
    halves.setdefault(key[:-1], []).append("never" if step is None else str(step))
  keys = report.distinguishing_hparams(members)
  lines = [f"- {cell[0]} / {report.cell_label(cell, keys)}: {', '.join(v)}"
           for cell, v in halves.items()]
  return (table + "\n\nSteps until the attention mass on the prior's pairs fell below half "
          "its initial value, per seed:\n\n" + "\n".join(lines))


def with_history_metrics(members: list[dict], run_dir: pathlib.Path, metrics_of) -> list[dict]:
  """Members with the metrics `metrics_of(history)` computes from their evaluation history
  (their metrics.jsonl records in step order), e.g. the steps to a target."""
  history: dict = {}
  for r in report.read_metrics(run_dir):
    history.setdefault(report.member_key(r), []).append(r)
  return [m | {"metrics": m["metrics"] | metrics_of(history.get(report.member_key(m), []))}
          for m in members]


def labelled(group: engine.Group, labels: dict) -> engine.Group:
  """A group of one variant of an architecture sweep: its name and its members' labels
  carry the swept values, so checkpoints and the summary's rows keep variants apart."""
  if not labels:
    return group
  suffix = "-".join(f"{k}{v}" for k, v in labels.items())
  members = [dataclasses.replace(m, labels=dict(m.labels) | labels) for m in group.members]
  return dataclasses.replace(group, name=f"{group.name}-{suffix}", members=members)


def _check_selection(experiment: types.ModuleType, hparam: str, traced: dict) -> None:
  if not hasattr(experiment, "VALIDATION"):
    raise ValueError(f"select={hparam}: {experiment.NAME} has no validation split to choose "
                     "on (its file declares no VALIDATION); run the sweep without select.")
  if len(traced.get(hparam, ())) < 2:
    raise ValueError(f"select={hparam} needs a list of values to choose from, e.g. --set "
                     f"{hparam}=logspace(1e-4,1e-2,4).")


def _built(experiment: types.ModuleType, configs, run_dir=None) -> list[list[engine.Group]]:
  """The experiment's groups, once per traced value: [[group at each value], ...]; a
  two-stage experiment's (`stages`) with the run folder."""
  extra = {"run_dir": run_dir} if stages.reads_run_dir(experiment.build_groups) else {}
  per_config = [experiment.build_groups(c, **extra) for c in configs]
  if len({tuple(g.name for g in groups) for groups in per_config}) != 1:
    raise ValueError(f"{experiment.NAME}: build_groups gives other groups at other values of "
                     f"{config_lib.TRACED}; a traced field must only set members' hparams.")
  return [list(same) for same in zip(*per_config)]


def build_run_groups(experiment: types.ModuleType, variants, mesh, platform: str,
                     run_dir=None) -> list[engine.Group]:
  """The groups a run trains, for a mesh of `platform` devices (None: one device): what
  `mpx run` trains and `mpx compile` compiles for the same arguments."""
  groups = [labelled(_merged(built, mesh, platform), labels) for labels, configs in variants
            for built in _built(experiment, configs, run_dir)]
  if len({g.name for g in groups}) != len(groups):
    raise ValueError(f"{experiment.NAME}: group names repeat ({[g.name for g in groups]}); "
                     "each group needs its own checkpoint folder.")
  return groups


def _merged(groups: list[engine.Group], mesh, platform: str) -> engine.Group:
  """The group at every value of the traced sweep, one program. On one CPU device, unless
  the config sets `members_per_call`, it maps its members in slices of one value's K:
  there a vmap of K·L members is slower per member-step than L programs of K, slices of K
  are not (`benchmarks/traced_sweep.py`; a remainder slice compiles once more). On an
  accelerator or a mesh it vmaps all K·L: the larger batch of members is the point there,
  and slices would serialise members sharded over devices."""
  if len(groups) == 1:
    return groups[0]
  merged = engine.merge_groups(groups)
  if merged.members_per_call is None and mesh is None and platform == "cpu":
    merged = dataclasses.replace(merged, members_per_call=len(groups[0].members))
  return merged


def plan(groups: list[engine.Group], mesh, out: str, completed: dict | None) -> str:
  """What a run is about to do, printed before it starts: the run folder (starting fresh,
  or resuming from which checkpoints), the members per group, the devices per host and
  the padding rows (members are padded with copies, never reported, to a multiple of the
  device count)."""
  if completed is None:
    state = "starting fresh"
  else:
    state = "resuming: " + ", ".join(
        f"{g.name} from step {completed[g.name]}" if g.name in completed
        else f"{g.name} from the start" for g in groups)
  sizes = [(g.name, len(g.members), engine.padded_size(len(g.members), mesh))
           for g in groups]
  devices = 1 if mesh is None else mesh.size
  return "\n".join([
      f"run folder: {out} ({state})",
      f"members: {sum(k for _, k, _ in sizes)} in {len(groups)} group(s) ("
      + ", ".join(f"{g.name} {k}" + (f" in slices of {g.members_per_call}"
                                      if g.members_per_call and g.members_per_call < k
                                      else "") for g, (_, k, _) in zip(groups, sizes)) + ")",
      f"devices: {devices} {jax.default_backend()}, {jax.process_count()} "
      f"process(es) x {jax.local_device_count()} per host; padding rows (copies filling each "
      f"group to a multiple of {devices} devices, never reported): "
      + ", ".join(f"{name} {size - k}" for name, k, size in sizes)])


def run_experiment(experiment: types.ModuleType, *, preset: str | None = None,
                   overrides=(), out_dir: str | None = None, resume: bool | str = False,
                   devices=None, finish=None) -> dict:
  """Builds, trains and reports one experiment; returns the summary dict plus `run_dir`
  (the run folder) and `local_dir`, where its files are written: `run_dir` itself, or for
  a gs:// URL the staging folder `run_folder.push` uploads.

  `resume`: False starts fresh (refused where the folder holds an earlier run's progress),
  True continues the folder's run (refused where it holds none, or another), "auto"
  (RESUME_AUTO) does either: it continues where the folder holds progress (a completed
  checkpoint, or metrics past step 0) and starts fresh where it holds none.

  The job holds the run folder's lock (`lock.job_lock`; `lock.Locked` where another
  process holds it) from before it reads the folder until it returns, `finish(result)`
  (e.g. drawing the plots into the folder) included."""
  with contextlib.ExitStack() as held:
    result = _run_experiment(experiment, preset=preset, overrides=overrides, out_dir=out_dir,
                             resume=resume, devices=devices, held=held)
    if finish is not None:
      finish(result)
    return result


def _run_experiment(experiment: types.ModuleType, *, preset, overrides, out_dir, resume,
                    devices, held: contextlib.ExitStack) -> dict:
  """`run_experiment`; `held` keeps the lock until it returns."""
  if resume not in (False, True, RESUME_AUTO):
    raise ValueError(f"resume must be False, True or {RESUME_AUTO!r}; got {resume!r}.")
  resume_arg = resume
  preset, variants = config_lib.make_configs(experiment, preset, overrides)
  # A missing install is named first: before a data path is read (the fingerprint, the
  # groups) or a file written.
  config_lib.check_installed([c for _, configs in variants for c in configs])
  # What its own metrics mean, for its tables and figures (and summary.json, for later).
  descriptions = report.check_descriptions(getattr(experiment, "METRIC_DESCRIPTIONS", {}))
  held.enter_context(report.described(descriptions))
  cfg = variants[0][1][0]
  default_out = f"runs/{config_lib.experiment_stem(experiment)}-{preset}"
  if out_dir is None:
    out_dir = default_out
  if not str(out_dir).strip():
    raise ValueError(f"--out is empty; give a run folder, or leave --out out for "
                     f"{default_out}.")
  out = os.fspath(out_dir)
  url = run_folder.is_url(out)
  if url:
    run_folder.check_url(out)
  root = epath.Path(out)  # The run folder as named; checks read it, checkpoints go there.
  checkpoints = run_folder.checkpoint_root(out)
  # Where process 0 writes the other files: the folder itself, or a URL's staging folder.
  run_dir = run_folder.staging_dir(out) if url else pathlib.Path(out)
  # Under `mpx run`: where its libraries' thread errors go (process 0 writes the folder).
  storage.log_here(run_dir if distributed.is_primary() else None, out)
  command = config_lib.command_line(experiment, preset, overrides, out,
                                    distributed=jax.process_count() > 1)
  saved_config = {"experiment": experiment.NAME, "preset": preset,
                  "config": json.loads(json.dumps(dataclasses.asdict(cfg)))}
  if variants[0][0]:  # An architecture sweep: the first variant's config and the values.
    saved_config["sweep"] = {k: [labels[k] for labels, _ in variants] for k in variants[0][0]}
  if traced := config_lib.traced_values(variants):  # Members of every group.
    saved_config["traced"] = traced
  if hasattr(experiment, "fingerprint"):  # E.g. each Boolean task's definition.
    saved_config[FINGERPRINT] = experiment.fingerprint(cfg)
  saved_config[INFORMATIONAL] = {"command": command,
                                 "experiment_file": getattr(experiment, "__file__", None)}
  if cfg.select is not None:
    _check_selection(experiment, cfg.select, traced)
  if stages.reads_run_dir(experiment.build_groups):
    stages.check_one_configuration(experiment.NAME, list(saved_config.get("sweep", {})),
                                   list(traced))
  # Built before anything is written: a config the family refuses leaves no folder.
  mesh = engine.member_mesh(devices)
  groups = build_run_groups(experiment, variants, mesh, jax.default_backend(), run_dir)
  # Every check comes before the first write: a refused run leaves the folder as it was.
  # All processes check (each must refuse alike); process 0 alone writes, then all wait.
  if not url:
    _check_run_dir(run_dir)
  lock = held.enter_context(lock_lib.job_lock(out, command))  # Before the folder is read.
  held.callback(storage.let_go)  # Unwound before the lock: nothing written after it.
  primary = distributed.is_primary()
  flag = "--resume" if resume is True else f"--resume={RESUME_AUTO}"
  if resume == RESUME_AUTO:  # The same run resumes; a folder without progress starts.
    resume = _has_progress(root, checkpoints) is not None
  completed, damaged, unsummed = {}, [], []
  if resume:
    _check_resume_config(root, checkpoints, saved_config, flag)
    # Every process reads them (Orbax's checkpoint manager synchronises the processes);
    # process 0 verifies their sums and decides.
    completed, damaged, unsummed = _intact_steps(checkpoints, saved_config, flag)
    keep = lambda r: r.get("step", 0) <= completed.get(r.get("group"), -1)
  else:
    _check_fresh(root, checkpoints, saved_config)
    keep = lambda r: False  # What a failed start wrote (its step-0 evaluation) goes.
  aside = []  # Process 0 moves the damaged checkpoints before any process restores.
  if primary:
    checkpoint.retrying("downloading the run's files from", lambda: run_folder.pull(out, run_dir),
                     out)
    aside = [_set_aside(d, completed) for d in damaged]
    if not resume:
      run_dir.mkdir(parents=True, exist_ok=True)
      # Atomic: a kill leaves the old file or the new one, never half of it.
      report.atomic_write(str(run_dir / "config.json"),
                           json.dumps(saved_config, indent=2) + "\n")
  distributed.barrier("mpx-run-checked")
  if primary:
    staged = f"; files staged in {run_dir}" if url else ""
    asked = {False: "", True: " --resume", RESUME_AUTO: f" --resume={RESUME_AUTO}"}
    print(f"{command}{asked[resume_arg]}  ({jax.device_count()} "
          f"{jax.default_backend()} device(s){staged})", file=sys.stderr)
    print(plan(groups, mesh, out, completed if resume else None), file=sys.stderr)
    for line in aside:
      print(line, file=sys.stderr)
    if unsummed:
      print(_unsummed_line(unsummed), file=sys.stderr)
  if primary and hasattr(experiment, "save_run_files"):  # E.g. the tokenizer a run trained.
    for _, (variant, *_) in variants:
      experiment.save_run_files(variant, run_dir)
  final = []
  fence = lock.fence if lock is not None else lambda: None  # Process 0's writes.
  writer = _Fenced(report.MetricsWriter(run_dir, keep=keep), fence) if primary else _NullWriter()
  push = (lambda: checkpoint.retrying("uploading the run's files to",
                                   lambda: run_folder.push(run_dir, out), out)
          ) if primary else (lambda: None)

  def before_save():  # Every process: a checkpoint is written by all of them together.
    why = lock.lost() if lock is not None else None
    if distributed.any_process(why is not None):
      if lock is not None:
        lock.fence(why or "another process's lock was taken over")
      raise lock_lib.Lost(why or "process 0's lock was taken over")
    push()

  dirs = {"run_dir": out if url else str(run_dir), "local_dir": str(run_dir)}
  stopped = lambda: _stopped(checkpoints, groups, resume_arg)
  with writer, _StopFlag(stopped) as sigterm:
    for group in groups:
      # A signal during the previous group's final evaluation and save stops here, before
      # this group's init (a stage 2 reads stage 1's graphs), compile and first chunk.
      _stop_if_signalled(sigterm, group, 0)
      final += train_group(group, cfg, checkpoints, writer=writer, saved_config=saved_config,
                           resume=resume, sigterm=sigterm, mesh=mesh,
                           before_save=before_save)
  if not primary:
    return dirs
  reported = tuple(experiment.METRICS) + PERSISTENCE_METRICS
  if cfg.select is not None:
    reported += tuple(name for name, _ in experiment.VALIDATION)
  members = [{k: r[k] for k in ("group", "task", "scheme", "seed", "hparams", "diverged")} |
             {"metrics": {m: r[m] for m in reported if m in r}} for r in final]
  if hasattr(experiment, "history_metrics"):
    members = with_history_metrics(members, run_dir, lambda h: experiment.history_metrics(cfg, h))
  extra = {}
  if persistence := persistence_table(run_dir, members):
    extra["Persistence of the prior"] = persistence
  selection = {}
  if cfg.select is not None:  # Each scheme at its value chosen on validation.
    table, rows = select_lib.selection_table(members, cfg.select, experiment.VALIDATION,
                                             experiment.METRICS)
    note = ("The other columns are this run's members at that value, not retrained. "
            + getattr(experiment, "SELECTION_NOTE", ""))
    extra[f"Each scheme at its {cfg.select} chosen on validation"] = (
        f"{select_lib.criteria_sentence(experiment.VALIDATION, note)}\n\n{table}")
    selection = {"selection": {"hparam": cfg.select, "rows": rows, "criteria": [
        list(criterion) for criterion in experiment.VALIDATION]}}
  if FINGERPRINT in saved_config:  # What the run trained on (config.json holds it too).
    extra["Data (fingerprint, compared on --resume)"] = (
        "```json\n" + json.dumps(saved_config[FINGERPRINT], indent=1) + "\n```")
  fence()
  summary = report.write_summary(
      run_dir, experiment=experiment.NAME, preset=preset, members=members,
      paper=experiment.PAPER, metric_names=list(experiment.METRICS),
      extra_tables=extra or None,
      extra_json=selection | ({"metric_descriptions": descriptions} if descriptions else {}))
  push()
  print((run_dir / "summary.md").read_text())
  return dict(summary, **dirs)
