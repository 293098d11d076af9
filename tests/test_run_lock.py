"""One writer per run folder (`mpx.sweep.lock`): a live holder refuses a second writer, a
dead one's lock is taken over (its process gone on this machine, its heartbeat stale from
another), a holder whose lock was taken over stops; a gs:// folder's lock (the GCS
emulator, which checks `ifGenerationMatch` as GCS does) refuses a holder on another host
and is taken over by exactly one of several writers once stale; the processes of one
jax.distributed job share one lock and refuse together. `mpx run` refused while another
run writes the folder, and resumed after a SIGKILL took its lock down with it:
tests/test_resume_auto.py.
"""

import errno
import fcntl
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from etils import epath

from mpx import cli
from mpx.sweep import lock, run, run_folder

import test_resume_auto as ra  # The toy run's command line and helpers.

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _write_record(folder, **changes) -> dict:
  """A lock record as another process would have left it in `folder` (a path or URL)."""
  held = lock.record("mpx run elsewhere") | changes
  (epath.Path(folder) / lock.LOCK_FILE).write_text(json.dumps(held))
  return held


def _eventually(check, timeout=30.0):
  deadline = time.monotonic() + timeout
  while not check():
    assert time.monotonic() < deadline, "timed out"
    time.sleep(0.02)


# --- the lock on its own -------------------------------------------------------------------

def test_a_live_holder_refuses_a_second_writer_and_its_release_leaves_nothing(tmp_path):
  out = tmp_path / "new" / "run"
  with lock.Hold(str(out), "mpx run first") as first:
    assert first.took_over is None
    held = json.loads((out / lock.LOCK_FILE).read_text())
    assert (held["pid"], held["host"], held["command"]) == (
        os.getpid(), socket.gethostname(), "mpx run first")
    with pytest.raises(lock.Locked) as refused:
      lock.Hold(str(out), "mpx run second")
    message = str(refused.value)
    assert message.startswith(f"{out} is being written by pid {os.getpid()} on "
                              f"{socket.gethostname()} since ")
    assert "(mpx run first)" in message and "choose another --out" in message
    assert json.loads((out / lock.LOCK_FILE).read_text()) == held  # The second wrote nothing.
  assert not (tmp_path / "new").exists()  # The lock file and the folders made for it: gone.


def _dead_pid() -> int:
  done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True, check=True)
  return int(done.stdout)


def _age(path, seconds):
  """Makes the file at `path` look last written `seconds` ago (by the filesystem's clock)."""
  then = time.time() - seconds
  os.utime(path, (then, then))


# (the record's changes, seconds since the lock file was written, why it is stale or None)
@pytest.mark.parametrize("changes, age, stale", [
    (lambda: {"pid": _dead_pid(), "pid_start": None}, 0,
     "process {pid} on this machine is gone"),
    (lambda: {"pid_start": "1"}, 0, "process {pid} on this machine is gone"),  # Pid reused.
    # A live pid without a start time (no /proc): the free flock says it is not the holder.
    (lambda: {"pid": os.getppid(), "pid_start": None}, 0,
     "process {pid} on this machine no longer holds its flock"),
    (lambda: {"host": "elsewhere"}, 125,
     "its last heartbeat is 125 s old by the storage's clock (stale after 120 s)"),
    (lambda: {"host": "elsewhere"}, 100, None),
    (lambda: {"boot_id": "another boot"}, 100, None),
    # The holder's clock says nothing: a record dated 10 minutes back, written just now.
    (lambda: {"host": "elsewhere", "heartbeat": time.time() - 600}, 0, None),
])
def test_a_dead_holder_is_taken_over_and_a_live_one_elsewhere_refuses(tmp_path, changes,
                                                                      age, stale):
  """Stale: the holder's process is gone on this machine (no such pid, or another process
  under its pid), or, from another machine, the lock file was last written more than 4 of
  its 30 s beats ago by the filesystem's clock."""
  held = _write_record(tmp_path, heartbeat_every=30.0, **changes())
  _age(tmp_path / lock.LOCK_FILE, age)
  if stale is None:
    with pytest.raises(lock.Locked, match=f"by pid {held['pid']} on {held['host']} since"):
      lock.Hold(str(tmp_path), "mpx run new")
    assert json.loads((tmp_path / lock.LOCK_FILE).read_text()) == held
    return
  with lock.Hold(str(tmp_path), "mpx run new") as hold:
    assert hold.took_over == (f"took over the lock of {tmp_path} from pid {held['pid']} on "
                              f"{held['host']} since {lock._when(held['started'])} (mpx run "
                              f"elsewhere): {stale.format(pid=held['pid'])}.")
    assert json.loads((tmp_path / lock.LOCK_FILE).read_text())["command"] == "mpx run new"


def test_a_lock_whose_record_cannot_be_written_is_let_go(tmp_path, monkeypatch):
  """A full disk at the first write: no lock file, flock or folder stays behind, and the
  next start takes the lock."""
  out = tmp_path / "new" / "run"
  def full(self, mine):
    raise OSError(errno.ENOSPC, "No space left on device")
  with monkeypatch.context() as patch:
    patch.setattr(lock._LocalLock, "write", full)
    with pytest.raises(OSError, match="No space"):
      lock.Hold(str(out), "mpx run")
  assert not (tmp_path / "new").exists() and not lock._HELD_FDS
  with lock.Hold(str(out), "mpx run") as hold:
    assert hold.took_over is None


def test_a_second_release_touches_nothing(tmp_path):
  hold = lock.Hold(str(tmp_path / "run"), "mpx run")
  hold.release()
  with open(tmp_path / "other", "w") as other:  # May reuse the lock file's descriptor.
    hold.release()
    other.write("still open")
  assert (tmp_path / "other").read_text() == "still open"  # Its descriptor left alone.
  assert not (tmp_path / "run").exists()


def test_the_heartbeat_refreshes_and_a_lost_lock_stops_its_holder(tmp_path, monkeypatch):
  monkeypatch.setenv(lock.HEARTBEAT_ENV, "0.05")
  lost = []
  hold = lock.Hold(str(tmp_path), "mpx run", on_lost=lambda where, why: lost.append(why))
  read = lambda: json.loads((tmp_path / lock.LOCK_FILE).read_text())
  first = read()["heartbeat"]
  _eventually(lambda: read()["heartbeat"] > first)
  other = _write_record(tmp_path, host="elsewhere")  # Taken over after a long stop.
  _eventually(lambda: lost)
  assert lost == [f"{tmp_path / lock.LOCK_FILE} now holds {lock.holder(other)}"]
  hold.release()
  assert read() == other  # Not removed: it is the other writer's.


def test_a_lost_lock_exits_at_once_with_the_locked_status(tmp_path):
  done = subprocess.run([sys.executable, "-c", "from mpx.sweep import lock; "
                         "lock._exit_lost('RUN', 'taken'); print('went on')"],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert done.returncode == lock.EXIT_CODE == run.LOCKED_EXIT_CODE == 75
  assert done.stdout == ""
  assert done.stderr.startswith("mpx run: lost the lock on RUN (taken): ")


# A run whose heartbeat is stuck in a storage call (it never returns) and whose lock another
# host takes over right after the run's first metrics line (the step-0 evaluation).
_STUCK_AND_TAKEN_OVER = """
import json, sys, time
from mpx import cli, report
from mpx.sweep import lock
lock._LocalLock.beat = lambda self, mine: time.sleep(3600)
write = report.MetricsWriter.write
def write_then_lose(self, records):
  write(self, records)
  path = sys.argv[1] + "/" + lock.LOCK_FILE
  held = json.loads(open(path).read()) | {"token": "theirs", "host": "elsewhere"}
  open(path, "w").write(json.dumps(held))
report.MetricsWriter.write = write_then_lose
sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_holder_whose_heartbeat_hangs_writes_nothing_once_taken_over(tmp_path):
  """The fence: before each checkpoint save, metrics append and the summary, the run reads
  its lock. Taken over while its heartbeat hangs, it stops with 75 before its next write:
  metrics.jsonl keeps the lines written before the takeover, no checkpoint is saved, and
  the other writer's lock stays. (Without the fence only the heartbeat would notice.)"""
  out = tmp_path / "run"
  done = subprocess.run([sys.executable, "-c", _STUCK_AND_TAKEN_OVER, str(out),
                         *ra._argv(out)], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, env=os.environ | ra._CACHE)
  assert done.returncode == lock.EXIT_CODE, done.stderr[-3000:]
  assert "lost the lock" in done.stderr and "now holds" in done.stderr
  steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert steps and set(steps) == {0}, steps  # The first group's step-0 records only.
  assert not list((out / "checkpoints").glob("*/[0-9]*")), "a checkpoint after the takeover"
  assert json.loads((out / lock.LOCK_FILE).read_text())["token"] == "theirs"


# SIGTERM while the run is set up, its lock held (here while the run folder is pulled, as
# from a bucket), before training's own handler: a preemption's notice at a bad moment.
_TERMINATED_IN_SETUP = """
import os, signal, sys, time
from mpx import cli
from mpx.sweep import run_folder
def pull(out, run_dir):
  os.kill(os.getpid(), signal.SIGTERM)
  time.sleep(30)
run_folder.pull = pull
sys.exit(cli.main(sys.argv[2:]))
"""


def test_a_sigterm_before_training_releases_the_lock(tmp_path):
  """Exit 143 with one line, and the lock gone at once (not left to go stale, as another
  host would have to wait for): the same command starts again right away."""
  out = tmp_path / "run"
  done = subprocess.run([sys.executable, "-c", _TERMINATED_IN_SETUP, str(out),
                         *ra._argv(out)], cwd=ROOT, capture_output=True, text=True,
                        timeout=300, env=os.environ | ra._CACHE)
  assert done.returncode == run.PREEMPTED_EXIT_CODE == 143, done.stderr[-3000:]
  assert done.stderr.splitlines()[-1].startswith(
      "mpx run: stopped by SIGTERM outside training (while the run was set up"), done.stderr
  assert not (out / lock.LOCK_FILE).exists()


def test_a_forked_child_does_not_keep_the_lock_of_its_dead_parent(tmp_path):
  """A data loader's forked worker holds a copy of every open file; the lock's is closed in
  it, so the lock of a parent that died is free while the worker lingers."""
  code = ("import os, sys, time\nfrom mpx.sweep import lock\n"
          "lock.Hold(sys.argv[1], 'parent')\n"
          "child = os.fork()\n"
          "if child == 0:\n  [os.dup2(os.open(os.devnull, os.O_WRONLY), fd) for fd in (1, 2)]\n"
          "  time.sleep(120)\n  os._exit(0)\n"
          "print(child, flush=True)\nos._exit(0)\n")  # Dies holding it, as SIGKILL would.
  done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
  child = int(done.stdout)
  try:
    with lock.Hold(str(tmp_path), "mpx run again") as hold:
      assert "is gone" in hold.took_over
  finally:
    os.kill(child, signal.SIGKILL)


# --- gs:// folders -------------------------------------------------------------------------

def _objects(url):
  """The names of the objects under `url`."""
  found, todo = [], [epath.Path(url)] if epath.Path(url).exists() else []
  while todo:
    for child in todo.pop().iterdir():
      todo.append(child) if child.is_dir() else found.append(str(child)[len(url) + 1:])
  return sorted(found)


def test_a_gs_folder_held_from_another_host_refuses_the_run(bucket, capsys):
  url = f"{bucket}/held"
  held = _write_record(url, host="other-host", boot_id="its boot")
  before = _objects(url)
  assert cli.main(ra._argv(url)) == run.LOCKED_EXIT_CODE
  err = capsys.readouterr().err
  assert err.startswith(f"mpx run: locked: {url} is being written by pid {held['pid']} on "
                        "other-host since "), err
  assert err.count("\n") == 1
  assert _objects(url) == before == [lock.LOCK_FILE]  # Nothing read into staging, nothing
  assert not run_folder.staging_dir(url).exists()    # written.


def test_a_stale_gs_lock_is_taken_over_by_exactly_one_of_several_writers(bucket):
  """Stale by the bucket's clock: the object's update time is more than 4 beats of 0.25 s
  before the bucket's Date (whole seconds), whatever the record says."""
  url = f"{bucket}/stale"
  _write_record(url, host="other-host", heartbeat=time.time() + 600, heartbeat_every=0.25)
  time.sleep(2.5)
  start, holds, refused = threading.Barrier(4), [], []

  def writer(i):
    start.wait()
    try:
      holds.append(lock.Hold(url, f"writer {i}"))
    except lock.Locked as e:
      refused.append(str(e))

  threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(holds) == 1 and len(refused) == 3, refused
  winner = holds[0]
  assert re.search(r"its last heartbeat is \d+ s old by the storage's clock \(stale after "
                   r"1 s\)\.$", winner.took_over), winner.took_over
  assert all(f"({winner.mine['command']})" in message for message in refused)
  stored = json.loads((epath.Path(url) / lock.LOCK_FILE).read_text())
  assert stored["token"] == winner.mine["token"]
  winner.release()
  assert _objects(url) == []


def test_a_gs_lock_taken_over_between_its_read_and_its_age_is_read_again(bucket, monkeypatch):
  """The interleaving the writers above can meet: the stale record is read, then another
  writer takes it over before its age is asked. The refusal names the new holder, with
  its heartbeat's age, not the stale record read before."""
  url = f"{bucket}/raced"
  _write_record(url, host="other-host", heartbeat=time.time() + 600, heartbeat_every=0.25)
  time.sleep(2.5)
  age, newer = lock._BucketLock.age, []

  def taken_over_first(self, generation):
    if not newer:
      newer.append(_write_record(url, host="newer-host"))
    return age(self, generation)

  monkeypatch.setattr(lock._BucketLock, "age", taken_over_first)
  with pytest.raises(lock.Locked) as refused:
    lock.Hold(url, "writer")
  assert re.match(rf"{url} is being written by pid {newer[0]['pid']} on newer-host .*, "
                  r"last heartbeat [01] s ago;", str(refused.value)), refused.value
  (epath.Path(url) / lock.LOCK_FILE).unlink()


def test_a_flock_held_from_another_host_says_what_outlives_a_dead_one(tmp_path):
  """Through NFS the flock of another host is held here too, and a dead host's outlives
  it: the line names the host and when the file server lets go, not a pid to kill."""
  held = _write_record(tmp_path, host="node7", boot_id="its boot")
  with open(tmp_path / lock.LOCK_FILE) as theirs:  # The shared filesystem's flock.
    fcntl.flock(theirs, fcntl.LOCK_EX)
    with pytest.raises(lock.Locked) as refused:
      lock.Hold(str(tmp_path), "mpx run here")
  message = str(refused.value)
  assert message.startswith(f"{tmp_path} is being written by pid {held['pid']} on node7 "), message
  assert "if node7 is down, its flock lasts until the file server drops it" in message
  assert "kill" not in message
  assert json.loads((tmp_path / lock.LOCK_FILE).read_text()) == held


@pytest.mark.parametrize("skew", [600.0, -600.0])
@pytest.mark.parametrize("where", ["local", "gs"])
def test_a_clock_ahead_or_behind_takes_no_live_lock(where, skew, tmp_path, request,
                                                   monkeypatch):
  """A live lock from another host, written just now, is refused whether that host's
  clock or this one's runs 10 minutes ahead or behind: its age is the storage's."""
  folder = str(tmp_path) if where == "local" else f"{request.getfixturevalue('bucket')}/skew"
  # The holder's clock off: its record's times are 10 minutes off.
  held = _write_record(folder, host="other-host", started=time.time() + skew,
                       heartbeat=time.time() + skew)
  with pytest.raises(lock.Locked, match=r"by pid \d+ on other-host .*, last heartbeat \d s ago"):
    lock.Hold(folder, "mpx run here")
  # This host's clock off.
  monkeypatch.setattr(lock, "_clock", lambda: time.time() + skew)
  with pytest.raises(lock.Locked, match="on other-host"):
    lock.Hold(folder, "mpx run here")
  assert json.loads((epath.Path(folder) / lock.LOCK_FILE).read_text()) == held
  (epath.Path(folder) / lock.LOCK_FILE).unlink()


# --- one job, many processes ---------------------------------------------------------------

JOB = """
import json, sys
from mpx.sweep import distributed, lock
distributed.initialize()
import jax
with lock.job_lock(sys.argv[1], "the job") as hold:
  held = json.load(open(sys.argv[1] + "/.mpx-lock"))
  print("held", jax.process_index(), hold is not None, held["processes"], held["pid"])
  distributed.barrier("read")
"""


def _job(out, argv, processes=2):
  """`processes` processes joined by jax.distributed on CPU, each running `argv` (after
  python); their (exit status, output)."""
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = {k: v for k, v in os.environ.items() if not k.startswith(("MPX_", "SLURM_"))}
  procs = [subprocess.Popen(
      [sys.executable, *argv], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, env=env | ra._CACHE | {
          "JAX_PLATFORMS": "cpu", "MPX_DISTRIBUTED": "1",
          "MPX_COORDINATOR": f"localhost:{port}", "MPX_NUM_PROCESSES": str(processes),
          "MPX_PROCESS_ID": str(i)}) for i in range(processes)]
  return [(p.wait(timeout=300), p.stdout.read()) for p in procs]


def test_the_processes_of_one_job_share_its_lock_and_refuse_together(tmp_path):
  out = tmp_path / "run"
  (zero, said0), (one, said1) = _job(out, ["-c", JOB, str(out)])
  assert zero == one == 0, said0 + said1
  pid = json.loads(said0.split("held 0 True 2 ")[1].split()[0])  # Process 0 holds it,
  assert f"held 1 False 2 {pid}\n" in said1                     # for both.
  assert not (out / lock.LOCK_FILE).exists()
  # Another process holds the folder: both processes of an `mpx run` refuse, at once.
  with lock.Hold(str(out), "another job") as other:
    (zero, said0), (one, said1) = _job(out, ["-m", "mpx.cli", *ra._argv(out)])
    assert zero == one == run.LOCKED_EXIT_CODE, said0 + said1
    assert f"mpx run: locked: {out} is being written by pid {os.getpid()} on " in said0
    assert "mpx run: locked: " in said1 and "process 0 found the run folder locked" in said1
    assert list(ra._files(out)) == [pathlib.Path(lock.LOCK_FILE)]  # Nothing written but
    held = json.loads((out / lock.LOCK_FILE).read_text())          # the other's lock.
    assert held["token"] == other.mine["token"]


def test_a_filesystem_without_flock_is_named_and_the_record_still_refuses(tmp_path,
                                                                           monkeypatch):
  out = tmp_path / "run"
  with lock.Hold(str(out), "mpx run flocked") as flocked:
    assert flocked.warning is None

  def no_flock(fd, operation):
    raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

  monkeypatch.setattr(lock.fcntl, "flock", no_flock)
  with lock.Hold(str(out), "mpx run first") as first:
    assert first.warning.startswith(f"{out} has no flock (")
    with pytest.raises(lock.Locked):  # The live record alone refuses a second writer.
      lock.Hold(str(out), "mpx run second")
