"""Storage faults of `mpx run`: a damaged newest checkpoint, a disk that fills up.

A checkpoint whose bytes are damaged is found before the run resumes, said in one line,
set aside (renamed, never deleted) and the group resumes from its newest checkpoint that
restores, which then ends bit for bit as an uninterrupted run (locally and in a gs://
bucket). A disk that fills up during a checkpoint ends the command with one line naming
the path and the cause, exit status 4, no traceback; the same command afterwards ends
bit for bit as an uninterrupted run.
"""

import contextlib
import errno
import inspect
import io
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
from http import HTTPStatus

import pytest
from etils import epath

from mpx import checkpoint, cli
from mpx.sweep import run

from test_resume_auto import _CACHE, _argv, _assert_same_run

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted run (2 groups, checkpoints at steps 4 and 8 of each)."""
  out = tmp_path_factory.mktemp("reference") / "run"
  with contextlib.redirect_stderr(io.StringIO()):
    assert cli.main(_argv(out)) == 0
  return out


INDEX = "state/d"  # OCDBT's b-tree index (CRC-32C checked by tensorstore itself).
ARRAY_DATA = "state/ocdbt.process_0/d"  # The arrays' values (no checksum of their own).
# The cause of a damaged step's line: the first file whose sum differs, and both sums.
SUMS_DIFFER = r"(?P<file>\S+): sha256 [0-9a-f]{64} expected, [0-9a-f]{64} found"


def _damage(step_dir: epath.Path, folder: str = INDEX) -> dict[str, bytes]:
  """Flips 40 bytes in the middle of each file of `folder` in a checkpoint (what a bad
  disk or a torn copy leaves); returns the damaged files' bytes by relative path."""
  damaged = {}
  for path in (step_dir / folder).iterdir():
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 40] = bytes(b ^ 0xFF for b in data[middle:middle + 40])
    path.write_bytes(bytes(data))
    damaged[f"{folder}/{path.name}"] = bytes(data)
  assert damaged
  return damaged


def _set_aside_line(err: str, out, group: str, step: int, resumed: int,
                    damaged: dict[str, bytes]) -> epath.Path:
  """The one line saying which step did not restore and why (a file of `damaged`, its
  sums); the folder it names, holding the damaged files as they were."""
  lines = [line for line in err.splitlines() if "does not restore" in line]
  assert len(lines) == 1, err[-3000:]
  match = re.fullmatch(
      rf"checkpoint step {step} of group {group} does not restore \({SUMS_DIFFER}\): "
      rf"moved to (?P<moved>\S+); {group} resumes from step {resumed}", lines[0])
  assert match, lines[0]
  assert match.group("file") in damaged, (match.group("file"), list(damaged))
  moved = epath.Path(match.group("moved"))
  assert moved.parent == epath.Path(out) / "checkpoints" / group
  assert moved.name.startswith(f"{step}.damaged-")
  for rel, data in damaged.items():  # Kept as it was, to inspect.
    assert (moved / rel).read_bytes() == data
  return moved


def _event_files(out) -> list[str]:
  """The TensorBoard event files of a run folder, local or gs://."""
  folder = epath.Path(out) / "tensorboard"
  return sorted(p.name for p in folder.iterdir() if p.name.startswith("events.out.tfevents."))


@pytest.mark.parametrize("folder", [INDEX, ARRAY_DATA])
def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_ends_equal(reference,
                                                                         tmp_path, capsys,
                                                                         folder):
  """Bytes flipped in the newest checkpoint's index or array data (which restored
  silently, with other numbers, before sums): found by the sums, said in one line, set
  aside, and the run resumes from the older step and ends as the uninterrupted one."""
  out = tmp_path / "run"
  shutil.copytree(reference, out)
  damaged = _damage(epath.Path(out) / "checkpoints" / "toy_b" / "8", folder)
  assert cli.main(_argv(out)) == 0
  err = capsys.readouterr().err
  assert "(resuming: toy_a from step 8, toy_b from step 4)" in err
  _set_aside_line(err, out, "toy_b", 8, 4, damaged)
  assert "checksums" not in err  # Every step has its sums: nothing said about them.
  assert checkpoint.all_steps(out / "checkpoints" / "toy_b") == [4, 8]  # 8 trained again.
  _assert_same_run(reference, out)
  # The earlier run's event file is replaced by the resumed run's, as in a bucket (below).
  assert len(_event_files(out)) == 1 and _event_files(out) != _event_files(reference)


@pytest.mark.parametrize("first_read", [
    OSError(errno.EIO, os.strerror(errno.EIO)),  # What gcsfuse says for a network failure.
    "a file is missing: state/d/x",  # A read that found damage, as `_reading` says it.
])
def test_a_read_that_fails_once_sets_nothing_aside(reference, tmp_path, capsys, monkeypatch,
                                                   first_read):
  """The newest checkpoint's first read fails (an I/O error: retried as a fault that
  passes; a file not found: read again, since damage must fail twice); the second read
  restores it, so nothing is set aside and the run resumes from it."""
  out = tmp_path / "run"
  shutil.copytree(reference, out)
  check_intact, failed = checkpoint.check_intact, []

  def failing_once(directory, step, **kwargs):
    if not failed and epath.Path(directory).name == "toy_b" and step == 8:
      failed.append(step)
      if isinstance(first_read, str):
        raise checkpoint.DamagedCheckpoint(directory, step, first_read)
      raise first_read
    return check_intact(directory, step, **kwargs)

  monkeypatch.setattr(checkpoint, "check_intact", failing_once)
  assert cli.main(_argv(out)) == 0
  err = capsys.readouterr().err
  assert failed and "(resuming: toy_a from step 8, toy_b from step 8)" in err, err[-3000:]
  assert "does not restore" not in err
  if isinstance(first_read, str):
    assert "trying again" not in err
  else:
    assert re.search(r"^mpx: reading checkpoint \S+/toy_b/8 failed \(Input/output error\); "
                     r"trying again for up to 600 s", err, re.M), err[-3000:]
  for group in ("toy_a", "toy_b"):
    assert checkpoint.all_steps(out / "checkpoints" / group) == [4, 8]
  _assert_same_run(reference, out)


def test_checkpoints_without_sums_resume_and_say_so_once(reference, tmp_path, capsys):
  """Checkpoints written before sums existed (no sum file in any step of either group)
  are no damage: one line says they resume unverified, nothing is set aside, and the
  run ends as the uninterrupted one."""
  out = tmp_path / "run"
  shutil.copytree(reference, out)
  for sums in (out / "checkpoints").rglob(checkpoint.SUMS_FILE):
    sums.unlink()
  assert cli.main(_argv(out)) == 0
  err = capsys.readouterr().err
  said = [line for line in err.splitlines() if "checksums" in line]
  assert said == ["checkpoints written without checksums (by mpx before it summed them): "
                  "toy_a step 8, toy_b step 8 resume unverified, as before; the run's new "
                  "checkpoints carry them"], err[-3000:]
  assert "does not restore" not in err
  for group in ("toy_a", "toy_b"):
    assert checkpoint.all_steps(out / "checkpoints" / group) == [4, 8]
  _assert_same_run(reference, out)


def test_no_checkpoint_that_restores_ends_in_one_line_and_moves_nothing(reference, tmp_path,
                                                                         capsys):
  """Every checkpoint of a group damaged (here 8's data, and 4's missing metadata, which
  must not read as a changed config): one line naming the folder and what to do, exit
  status 4, and nothing moved or rewritten."""
  out = tmp_path / "run"
  shutil.copytree(reference, out)
  group = out / "checkpoints" / "toy_b"
  _damage(epath.Path(group) / "8")
  (group / "4" / "state" / "_METADATA").unlink()
  metrics = (out / "metrics.jsonl").read_bytes()
  assert cli.main(_argv(out)) == run.STORAGE_EXIT_CODE == 4
  err = capsys.readouterr().err
  assert "Traceback" not in err and err.count("\n") == 1, err
  assert re.match(rf"mpx run: storage fault: no checkpoint of group toy_b in {group} "
                  rf"restores \(step 8: {SUMS_DIFFER}; ", err), err
  assert "step 4: a file is missing: state/_METADATA" in err
  assert f"move the damaged step folders out of {group}" in err
  assert sorted(p.name for p in group.iterdir()) == ["4", "8"]
  assert (out / "metrics.jsonl").read_bytes() == metrics


# --- a disk that fills up during a checkpoint ---------------------------------------------

def _driver() -> None:
  """`python -c '...; _driver()' BALLAST MPX-ARGS...`: mpx's command, whose disk fills up
  as toy_b's step-4 checkpoint starts. BALLAST: a file on a small filesystem, filled until
  no space is left; "-" where none could be mounted: the checkpoint's write fails with
  ENOSPC instead (an OSError as Orbax's writer thread raises it)."""
  ballast, *argv = sys.argv[1:]
  save = checkpoint.Checkpointer.save

  def save_on_a_full_disk(self, step, *args, **kwargs):
    if os.path.basename(self.directory) == "toy_b" and step == 4:
      if ballast == "-":
        def write(*args, **kwargs):
          raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._manager.save = write
      else:
        with open(ballast, "wb", buffering=0) as f:
          with contextlib.suppress(OSError):
            while True:
              f.write(bytes(1 << 16))
    return save(self, step, *args, **kwargs)

  checkpoint.Checkpointer.save = save_on_a_full_disk
  sys.exit(cli.main(argv))


@pytest.fixture
def small_filesystem(tmp_path):
  """A 16 MB tmpfs (None where this process may not mount one: then the test makes the
  write fail with ENOSPC instead, see `_driver`)."""
  mount = tmp_path / "small"
  mount.mkdir()
  try:
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                             capture_output=True).returncode == 0
  except OSError:  # No mount command.
    mounted = False
  try:
    yield mount if mounted else None
  finally:
    if mounted:
      subprocess.run(["umount", str(mount)], check=True)


def test_a_disk_full_during_a_checkpoint_ends_in_one_line_then_the_run_ends_equal(
    reference, tmp_path, small_filesystem):
  mount = small_filesystem
  out = (mount or tmp_path) / "run"
  ballast = mount / "ballast" if mount else "-"
  code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
          "import test_storage_faults; test_storage_faults._driver()")
  env = {k: v for k, v in os.environ.items() if not k.startswith(("MPX_", "SLURM_"))}
  env |= _CACHE | {"JAX_PLATFORMS": "cpu", "TMPDIR": str(tmp_path)}
  failed = subprocess.run([sys.executable, "-c", code, str(ballast), *_argv(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
  assert failed.returncode == run.STORAGE_EXIT_CODE == 4, failed.stderr[-3000:]
  err = failed.stderr
  last = err.splitlines()[-1]
  assert re.fullmatch(
      # The checkpoint's write, or the run folder's lock record (its heartbeat may be the
      # first write to meet the full disk): either way the path and the cause.
      rf"mpx run: storage fault: (writing checkpoint step 4 to {out}/checkpoints/toy_b/4 "
      rf"failed|{out}): No space left on device; fix the storage \(free space, permissions\), then "
      r"continue with the same command \(it resumes from the last complete checkpoint\)\."
      r"( Background errors: (\S+))?", last), last
  # What Orbax's writer threads, asyncio and absl said (where the write failed in a
  # thread) is kept out of the terminal (test_background_errors_go_to_the_log).
  before = err[:err.rindex(last)]
  assert "Traceback" not in err and "ERROR" not in before and "mpx run:" not in before, err
  if mount:
    os.remove(ballast)  # Space freed.
  assert checkpoint.all_steps(out / "checkpoints" / "toy_b") == []
  with contextlib.redirect_stderr(io.StringIO()):
    assert cli.main(_argv(out)) == 0
  _assert_same_run(reference, out)


# --- a gs:// run folder -------------------------------------------------------------------

def _upload(local: pathlib.Path, url: str) -> None:
  for path in local.rglob("*"):
    if path.is_file():
      (epath.Path(url) / path.relative_to(local)).write_bytes(path.read_bytes())


@pytest.mark.parametrize("folder", [INDEX, pytest.param(ARRAY_DATA, marks=pytest.mark.slow)])
def test_a_damaged_newest_checkpoint_in_a_bucket_is_set_aside(reference, bucket, capsys,
                                                              folder):
  """The same fallback in a gs:// run folder (a GCS emulator): found, said, renamed in
  the bucket, and the run ends as the uninterrupted local one."""
  out = f"{bucket}/runs/damaged-{folder.replace('/', '-')}"
  _upload(reference, out)  # The finished run.
  damaged = _damage(epath.Path(out) / "checkpoints" / "toy_b" / "8", folder)
  capsys.readouterr()
  assert cli.main(_argv(out)) == 0
  _set_aside_line(capsys.readouterr().err, out, "toy_b", 8, 4, damaged)
  _assert_same_run(reference, out)
  # The bucket keeps the resumed run's event file only, as a local folder does (above).
  assert len(_event_files(out)) == 1 and _event_files(out) != _event_files(reference)


@contextlib.contextmanager
def _uploads_through(wrap):
  """The emulator's upload routes (gcsfs's and tensorstore's) replaced by `wrap(route)`
  meanwhile."""
  from gcp_storage_emulator import server as emulator
  from gcp_storage_emulator.handlers import objects
  replaced = [(handlers, method, handlers[method]) for _, handlers in emulator.HANDLERS
              for method in (emulator.POST, emulator.PUT)
              if inspect.unwrap(handlers.get(method, len)) in (objects.insert,
                                                               objects.xml_upload)]
  for handlers, method, upload in replaced:
    handlers[method] = wrap(upload)
  try:
    yield
  finally:
    for handlers, method, upload in replaced:
      handlers[method] = upload


def _refusing_checkpoint_writes():
  """The emulator answers 403 Forbidden to every upload into checkpoints/ (a bucket whose
  policy lets the run write its other files, not its checkpoints)."""
  def refusing(upload):
    def refuse_checkpoints(request, response, storage, *args, **kwargs):
      if any("/checkpoints/" in name for name in request.query.get("name", [])):
        response.status = HTTPStatus.FORBIDDEN
        response.json({"error": {"code": 403, "message": "the bucket refuses this write"}})
        return None
      return upload(request, response, storage, *args, **kwargs)
    return refuse_checkpoints
  return _uploads_through(refusing)


def test_a_bucket_refusing_a_checkpoint_ends_in_one_line(bucket, capfd):
  """A bucket that refuses Orbax's checkpoint writes (a 403 to gcsfs or tensorstore, as
  Orbax writes a file through either): one line naming the checkpoint and the cause, exit
  status 4, no traceback of Orbax's threads."""
  out = f"{bucket}/runs/refused"
  with _refusing_checkpoint_writes():
    assert cli.main(_argv(out)) == run.STORAGE_EXIT_CODE == 4
  err = capfd.readouterr().err
  last = err.splitlines()[-1]
  assert re.match(rf"mpx run: storage fault: writing checkpoint step 4 to {out}/checkpoints/"
                  r"toy_a/4 failed: (Forbidden|PERMISSION_DENIED): .*; fix the storage .*, "
                  r"then continue with the same command", last), last
  assert "Traceback" not in err and "mpx run:" not in err[:err.rindex(last)], err


@contextlib.contextmanager
def _outage(seconds: float, starts_at: str):
  """From the first upload whose object name contains `starts_at`, for `seconds`, the
  emulator answers 503 Service Unavailable to every upload (gcsfs's and tensorstore's);
  yields the list the window's [start, end] goes into."""
  window = []

  def failing(upload):
    def unavailable(request, response, storage, *args, **kwargs):
      names = request.query.get("name", []) + [request.path]
      if not window and any(starts_at in name for name in names):
        window.extend([time.monotonic(), time.monotonic() + seconds])
      if window and time.monotonic() < window[1]:
        response.status = HTTPStatus.SERVICE_UNAVAILABLE
        response.json({"error": {"code": 503, "message": "the bucket is unavailable"}})
        return None
      return upload(request, response, storage, *args, **kwargs)
    return unavailable

  with _uploads_through(failing):
    yield window


@pytest.mark.slow  # 90 s of outage each.
@pytest.mark.parametrize("starts_at", ["metrics.jsonl", "checkpoints/toy_a/4"])
def test_a_bucket_outage_longer_than_the_clients_retries_costs_nothing(reference, bucket,
                                                                      capsys, starts_at):
  """90 s of 503 to every upload, from the first push of metrics.jsonl (gcsfs gives up
  after ≈ 35 s, mpx retries on and says so in one line each way) or from the first
  checkpoint's first upload (tensorstore retries): the run ends bit for bit as the
  uninterrupted local one."""
  key = f"runs/outage-{starts_at.partition('.')[0].partition('/')[0]}"
  out = f"{bucket}/{key}"
  with _outage(90, f"{key}/{starts_at}") as window:
    assert cli.main(_argv(out)) == 0
  err = capsys.readouterr().err
  assert window and time.monotonic() > window[1], "the outage did not start or end"
  if starts_at == "metrics.jsonl":
    tried = [line for line in err.splitlines() if "trying again for up to" in line]
    assert tried and re.fullmatch(
        rf"mpx: uploading the run's files to {out} failed \(HTTP 503 .*\); trying "
        r"again for up to 600 s \(MPX_STORAGE_RETRY_S\)", tried[0]), err[-3000:]
    assert re.search(rf"mpx: uploading the run's files to {out} went through after "
                     r"\d+ s", err), err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  _assert_same_run(reference, out)


@contextlib.contextmanager
def _unanswered_once(key: str, seconds: float):
  """The first read of object `key` gets no answer for `seconds` (a bucket request that
  hangs); yields the list its start time goes into."""
  from gcp_storage_emulator import server as emulator
  hung = []

  def hanging(read):
    def unanswered(request, response, storage, *args, **kwargs):
      if not hung and request.params.get("object_id") == key:
        hung.append(time.monotonic())
        time.sleep(seconds)
      return read(request, response, storage, *args, **kwargs)
    return unanswered

  replaced = [(handlers, handlers[emulator.GET]) for _, handlers in emulator.HANDLERS
              if emulator.GET in handlers]
  for handlers, read in replaced:
    handlers[emulator.GET] = hanging(read)
  try:
    yield hung
  finally:
    for handlers, read in replaced:
      handlers[emulator.GET] = read


def test_a_bucket_read_that_hangs_times_out_and_is_retried(reference, bucket, capsys,
                                                           monkeypatch):
  """A resume whose first read of metrics.jsonl gets no answer: past gcsfs's request
  timeout (run_folder.REQUEST_TIMEOUT_S; 2 s here) it fails as a timeout, mpx reads again,
  and the run ends as the uninterrupted local one (without a timeout it waited for ever)."""
  import fsspec.config
  from mpx.sweep import run_folder
  assert fsspec.config.conf["gs"]["requests_timeout"] == run_folder.REQUEST_TIMEOUT_S
  key = "runs/hung-read"
  out = f"{bucket}/{key}"
  _upload(reference, out)  # The finished run.
  # epath keeps the filesystem it made first (with the default timeout): a new one, with
  # 2 s, for this run, and a new one again after it.
  fresh = epath.backend._FileSystemSpecBackend._get_filesystem.cache_clear
  monkeypatch.setitem(fsspec.config.conf["gs"], "requests_timeout", 2)
  fresh()
  try:
    with _unanswered_once(f"{key}/metrics.jsonl", 6) as hung:
      assert cli.main(_argv(out)) == 0
  finally:
    monkeypatch.undo()
    fresh()
  err = capsys.readouterr().err
  assert hung, "the read was not made"
  assert re.search(rf"^mpx: downloading the run's files from {out} failed \(timed out.*\); "
                   r"trying again for up to 600 s", err, re.M), err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  _assert_same_run(reference, out)


def test_an_outage_past_the_retries_ends_in_one_line_with_69(bucket, capsys, monkeypatch):
  """A fault that outlasts MPX_STORAGE_RETRY_S: one line, exit status 69 (the launchers run
  the same command again), no traceback."""
  out = f"{bucket}/runs/outage-past"
  monkeypatch.setenv("MPX_STORAGE_RETRY_S", "5")
  with _outage(3600, "runs/outage-past/metrics.jsonl"):
    assert cli.main(_argv(out)) == 69
  err = capsys.readouterr().err
  last = err.splitlines()[-1]
  assert re.fullmatch(
      rf"mpx run: storage unavailable: uploading the run's files to {out} failed for \d+ s, "
      r"retried \(HTTP 503 .*\); it may pass: the same command later continues the run from "
      r"its last complete checkpoint \(exit status 69: the launchers try again\)\."
      r"( Background errors: \S+)?", last), last
  assert "Traceback" not in err, err[-3000:]


# --- what the libraries' threads print -----------------------------------------------------

class _ClosedLoopCallback:
  """What tensorstore's callback into a closed asyncio loop does: an exception Python
  cannot raise anywhere (printed through sys.unraisablehook)."""

  def __del__(self):
    raise RuntimeError("Event loop is closed")


def test_background_errors_go_to_the_log_that_one_line_names(tmp_path, capfd):
  """While `mpx run` runs, absl (Orbax) ERROR records with their tracebacks, a thread's
  uncaught exception and an unraisable one go to RUN_DIR/background-errors.log, named in
  one line; a storage fault's line names it instead. The hooks are put back after."""
  from mpx.sweep import storage
  import logging
  import threading
  hooks = (sys.excepthook, sys.unraisablehook, threading.excepthook)

  def fail_in_threads():
    try:
      raise OSError(errno.ENOSPC, "No space left on device")
    except OSError:
      logging.getLogger("absl").exception("_SignalingThread.run() raised an exception")
    thread = threading.Thread(target=lambda: 1 / 0, name="array_type_handler")
    thread.start()
    thread.join()
    _ClosedLoopCallback()  # Collected at once: its __del__ raises.

  with storage.background_errors_to_log():
    storage.log_here(tmp_path, str(tmp_path))
    fail_in_threads()
  assert (sys.excepthook, sys.unraisablehook, threading.excepthook) == hooks
  log = tmp_path / storage.LOG_FILE
  assert capfd.readouterr().err == (f"mpx run: 3 error(s) of background threads (Orbax, "
                                    f"asyncio) logged to {log}\n")
  text = log.read_text()
  for said in ("No space left on device", "ZeroDivisionError", "Event loop is closed"):
    assert said in text, said
  assert text.count("Traceback") == 3

  with storage.background_errors_to_log() as errors:  # Under a fault: its line names it.
    storage.log_here(tmp_path, "gs://bucket/run")
    fail_in_threads()
    line = storage.fault_line(OSError(errno.ENOSPC, "No space left on device"), errors,
                              "the same command")
    late = _ClosedLoopCallback()
    late.cycle = late  # Collected by the block's end (gc), after the line was made.
    del late
  assert line == (f"mpx run: storage fault: gs://bucket/run: No space left on device; fix the "
                  "storage (free space, permissions), then continue with the same command "
                  f"(it resumes from the last complete checkpoint). Background errors: {log}")
  assert capfd.readouterr().err == ""
  assert log.read_text().count("Traceback") == 7  # Appended, the late one too.
  assert storage.fault_line(ValueError("a bad config"), errors, "x") is None


def test_nothing_goes_into_the_run_folder_once_its_lock_is_let_go(tmp_path, capfd):
  """`let_go` (the run, just before its lock is released): what was caught is in the run
  folder's log; what comes after goes to a temporary file that a line names, since
  another run may write the folder by then."""
  from mpx.sweep import storage
  import logging
  with storage.background_errors_to_log():
    storage.log_here(tmp_path, str(tmp_path))
    logging.getLogger("absl").error("before the release")
    storage.let_go()
    logging.getLogger("absl").error("after the release")
  text = (tmp_path / storage.LOG_FILE).read_text()
  assert "before the release" in text and "after the release" not in text
  elsewhere = capfd.readouterr().err.rpartition(" logged to ")[2].strip()
  assert pathlib.Path(elsewhere).parent != tmp_path, elsewhere
  assert "after the release" in pathlib.Path(elsewhere).read_text()
  os.remove(elsewhere)


# --- what is no storage fault: a half-installed package -------------------------------------

def test_a_half_installed_package_is_named_not_a_storage_fault(tmp_path, monkeypatch, capsys):
  """A package whose shared library is missing (as a half-installed torch, which
  tensorboardX imports, raises an OSError from ctypes) ends the run with one line naming
  the failing import and the package to reinstall, exit status 2: not a storage fault of
  the run folder (exit 4)."""
  site = tmp_path / "site-packages"
  (site / "torch").mkdir(parents=True)
  (site / "torch" / "__init__.py").write_text(
      "import ctypes\n"
      f"ctypes.CDLL({str(site / 'torch' / 'lib' / 'libtorch_global_deps.so')!r})\n")
  (site / "tensorboardX").mkdir()
  (site / "tensorboardX" / "__init__.py").write_text(
      "try:\n  import torch\nexcept ImportError:\n  pass\n"
      "class SummaryWriter:\n  pass\n")
  monkeypatch.syspath_prepend(str(site))
  for name in [m for m in sys.modules if m.split(".")[0] in ("torch", "tensorboardX")]:
    monkeypatch.delitem(sys.modules, name)
  out = tmp_path / "run"
  assert cli.main(_argv(out)) == run.ERROR_EXIT_CODE == 2
  err = capsys.readouterr().err
  last = err.splitlines()[-1]
  assert last == (
      f"mpx run: error: importing tensorboardX failed in torch, which is half-installed "
      f"(OSError: {site}/torch/lib/libtorch_global_deps.so: cannot open shared object file: "
      "No such file or directory): reinstall it (pip install --force-reinstall torch)"), err
  assert "storage fault" not in err and "Traceback" not in err


def test_a_half_installed_package_s_import_error_is_named(tmp_path, monkeypatch):
  """An ImportError raised inside an installed package's own import (its compiled part
  missing) names that package to reinstall; one raised by mpx's own import of a package
  that is not installed at all is no half-installed package (`mpx[...]` names it)."""
  site = tmp_path / "dist-packages"
  (site / "tokenizers").mkdir(parents=True)
  (site / "tokenizers" / "__init__.py").write_text("from .tokenizers import Tokenizer\n")
  monkeypatch.syspath_prepend(str(site))
  for name in [m for m in sys.modules if m == "tokenizers" or m.startswith("tokenizers.")]:
    monkeypatch.delitem(sys.modules, name)  # Imported by an earlier test: its parts too.
  with pytest.raises(ImportError) as info:
    import tokenizers  # noqa: F401
  assert cli._half_installed(info.value) == (
      "importing tokenizers failed in tokenizers, which is half-installed "
      "(ModuleNotFoundError: No module named 'tokenizers.tokenizers'): reinstall it (pip "
      "install --force-reinstall tokenizers)")
  with pytest.raises(ImportError) as info:
    import mpx_package_that_is_not_installed  # noqa: F401
  assert cli._half_installed(info.value) is None
