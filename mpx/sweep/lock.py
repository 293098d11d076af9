"""One writer per run folder: the lock a run holds on its folder while it writes it.

Two processes writing one folder lose history without a word: the second resumes from
checkpoints the first rotates away, and rewrites metrics.jsonl under it. So the job that
writes a folder holds its lock, `.mpx-lock` in the folder: a JSON record of who holds it
(host, pid, command, processes of the job), since when, and a heartbeat that a daemon
thread refreshes every `heartbeat_s` seconds (MPX_LOCK_HEARTBEAT, default 30). A second
writer is refused (`Locked`) before it reads the folder. In a multi-process job process 0
holds the lock for the job; the others never touch it and refuse with it (`job_lock`).

A lock whose holder died is stale, and the next writer takes it over (`Hold.took_over`
says why):
- on the holder's machine (same host name, boot and pid namespace) once its process is
  gone: no process of that pid, a zombie, or another process under a reused pid (another
  start time);
- from another machine once its last heartbeat is more than STALE_BEATS of the holder's
  heartbeat intervals old (120 s by default), by the store's own clock: the lock file's
  mtime against that of a file made beside it now, the lock object's `updated` time
  against the bucket's Date. No host's clock judges another's lock, so a clock that runs
  ahead cannot take a live lock, nor one that runs behind lose its own.

Local (or mounted) folders: the lock file is read, judged and written under flock(2), which
keeps two processes of one machine (and NFS clients) from both taking it; the kernel drops
the flock of a process that ends, SIGKILL included. gs:// folders: the lock object is
created with `ifGenerationMatch=0`, and refreshed or taken over with `ifGenerationMatch`
of the generation read, so the bucket lets one writer win. A holder that finds its lock
taken over (its heartbeat had stopped, e.g. the process was suspended) exits at once with
EXIT_CODE, without saving, rather than write beside the new holder.
"""

from __future__ import annotations

import contextlib
import datetime
import email.utils
import errno
import fcntl
import json
import os
import pathlib
import socket
import sys
import tempfile
import threading
import time
import uuid
from typing import Callable

from mpx.sweep import run_folder

LOCK_FILE = ".mpx-lock"
HEARTBEAT_ENV = "MPX_LOCK_HEARTBEAT"  # Seconds between heartbeats.
DEFAULT_HEARTBEAT_S = 30.0
STALE_BEATS = 4  # A lock from another machine is stale after this many missed heartbeats.
EXIT_CODE = 75  # `mpx run`: the folder is locked (EX_TEMPFAIL: try again later).
_TRIES = 5  # Rounds of read, judge, take before a contended lock counts as held.


def _clock() -> float:
  """This host's clock: what a record says (its start, its heartbeats), never what judges
  a lock (the store's clock does: `_LocalLock.age`, `_BucketLock.age`)."""
  return time.time()


class Locked(Exception):
  """Another live process writes the run folder; nothing was read or written."""


class Lost(Exception):
  """The lock was taken over by another writer while this one held it."""


def heartbeat_seconds() -> float:
  """MPX_LOCK_HEARTBEAT, or DEFAULT_HEARTBEAT_S."""
  text = os.environ.get(HEARTBEAT_ENV, "").strip()
  try:
    seconds = float(text) if text else DEFAULT_HEARTBEAT_S
  except ValueError:
    seconds = -1.0
  if not 0 < seconds < float("inf"):
    raise ValueError(f"{HEARTBEAT_ENV}={text!r}: give the seconds between the run folder "
                     f"lock's heartbeats, e.g. {HEARTBEAT_ENV}={DEFAULT_HEARTBEAT_S:g}.")
  return seconds


def _read(path: str) -> str | None:
  try:
    with open(path, encoding="utf-8") as f:
      return f.read()
  except OSError:
    return None


def _machine() -> dict:
  """What makes a pid meaningful: the host, its boot and the pid namespace."""
  try:
    namespace = os.readlink("/proc/self/ns/pid")
  except OSError:
    namespace = None
  boot = _read("/proc/sys/kernel/random/boot_id")
  return {"host": socket.gethostname(), "boot_id": boot and boot.strip(),
          "pid_namespace": namespace}


def _process_start(pid: int) -> tuple[str, str] | None:
  """(state, start time in clock ticks since boot) of `pid` from /proc; None without it."""
  text = _read(f"/proc/{pid}/stat")
  if text is None:
    return None
  fields = text.rpartition(")")[2].split()  # After the command name, which may hold spaces.
  return fields[0], fields[19]


def _process_gone(pid: int, start: str | None) -> bool:
  """Whether the process `pid` that started at `start` (on this machine) has ended."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  except PermissionError:  # Another user's process of that pid.
    pass
  now = _process_start(pid)
  if now is None:  # No /proc (macOS): the pid exists; take it as the holder.
    return False
  state, started = now
  return state in ("Z", "X") or (start is not None and started != start)


def record(command: str, processes: int = 1) -> dict:
  """This process's lock record (its heartbeat is now)."""
  now = _clock()
  process = _process_start(os.getpid())
  return _machine() | {
      "pid": os.getpid(), "pid_start": process and process[1], "command": command,
      "processes": processes, "started": now, "heartbeat": now,
      "heartbeat_every": heartbeat_seconds(), "token": uuid.uuid4().hex}


def _when(seconds: float) -> str:
  return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime(
      "%Y-%m-%d %H:%M:%S UTC")


def holder(held: dict) -> str:
  """Who holds a lock, for a one-line message."""
  job = f", {held['processes']} processes" if held.get("processes", 1) > 1 else ""
  return (f"pid {held.get('pid')} on {held.get('host')}{job} since "
          f"{_when(held.get('started', 0))} ({held.get('command')})")


def _same_machine(held: dict, machine: dict) -> bool:
  return all(held.get(k) == v for k, v in machine.items())


def stale_reason(held: dict, age: float, flock_free: bool = False) -> str | None:
  """Why the lock `held` is stale (its holder is gone), or None while it is live. `age`:
  seconds since the record was last written, by the store's clock. `flock_free`: this
  process took the lock file's flock, which a live holder of this machine keeps (so a
  reused pid cannot look like the holder)."""
  if not held:
    return "its record is unreadable"
  if _same_machine(held, _machine()):
    if _process_gone(held["pid"], held.get("pid_start")):
      return f"process {held['pid']} on this machine is gone"
    if flock_free:  # E.g. its pid now another process's, where pids have no start time.
      return f"process {held['pid']} on this machine no longer holds its flock"
    return None
  bound = STALE_BEATS * held["heartbeat_every"]
  if age > bound:
    return (f"its last heartbeat is {age:.0f} s old by the storage's clock (stale after "
            f"{bound:.0f} s)")
  return None


def _locked(where: str, held: dict | None, age: float | None = None) -> Locked:
  """The refusal; `age`: of the holder's last heartbeat, by the store's clock, if read."""
  if not held:  # A holder of this machine that has not written its record (yet).
    return Locked(f"{where} is being written by another process (its lock record is "
                  f"unreadable: {where}/{LOCK_FILE}); wait for it to end, or choose another "
                  "--out.")
  beat = "" if age is None else f", last heartbeat {age:.0f} s ago"
  return Locked(f"{where} is being written by {holder(held)}{beat}; wait for it to end, "
                f"stop it (kill {held['pid']} on {held['host']}: SIGTERM saves first), or "
                f"choose another --out (if that process is not an mpx run of this folder, "
                f"remove {where}/{LOCK_FILE}).")


def _locked_elsewhere(where: str, held: dict, age: float) -> Locked:
  """The refusal where another host holds the flock through a shared filesystem (NFS):
  the flock of a host that died outlives it until the file server drops it, and no
  process here can tell a dead host from a live one."""
  return Locked(f"{where} is being written by {holder(held)}, last heartbeat {age:.0f} s "
                f"ago, whose flock the shared filesystem holds; if {held['host']} is down, "
                "its flock lasts until the file server drops it (NFSv4: when the host's "
                "lease expires, about 90 s; NFSv3: when the host boots again): start again "
                "then, or choose another --out.")


def _encode(mine: dict) -> bytes:
  return (json.dumps(mine, sort_keys=True) + "\n").encode()


def _decode(data: bytes) -> dict | None:
  """A lock's record; None for an empty file, {} for one that is not a record."""
  if not data.strip():
    return None
  try:
    held = json.loads(data)
  except (json.JSONDecodeError, UnicodeDecodeError):
    return {}
  needed = ("pid", "host", "heartbeat", "heartbeat_every", "token")
  return held if isinstance(held, dict) and all(k in held for k in needed) else {}


# --- a local (or mounted) folder ----------------------------------------------------------

_HELD_FDS: set[int] = set()  # Lock files held open (and flocked) by this process.


def _close_in_child() -> None:
  """A forked child (e.g. a data loader's worker) must not keep the flock after its parent
  ended: it closes its copies of the lock files."""
  for fd in _HELD_FDS:
    with contextlib.suppress(OSError):
      os.close(fd)
  _HELD_FDS.clear()


os.register_at_fork(after_in_child=_close_in_child)


def _made(folder: pathlib.Path) -> list[pathlib.Path]:
  """Makes `folder` and its missing parents; returns the ones it made, deepest first."""
  missing = [p for p in (folder, *folder.parents) if not p.exists()]
  folder.mkdir(parents=True, exist_ok=True)
  return missing


def _same_file(fd: int, path: pathlib.Path) -> bool:
  try:
    return os.path.samestat(os.fstat(fd), os.stat(path))
  except FileNotFoundError:
    return False


class _LocalLock:
  """The lock file of a local folder, held open (and flocked) while the lock is held."""

  def __init__(self, folder: pathlib.Path):
    self.path = folder / LOCK_FILE
    self.made: list[pathlib.Path] = []
    self.fd = -1
    self.no_flock: str | None = None  # Why the lock holds without a flock, if it does.

  def take(self, mine: dict) -> tuple[dict | None, str | None]:
    """Takes the lock for `mine`: (the stale record it took over, why), or (None, None)."""
    self.made = _made(self.path.parent)
    try:
      for _ in range(_TRIES):
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        flocked = True
        try:
          fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # A live process of this machine holds it.
          held, age = self._wait_for_record(fd), self.age(fd)
          os.close(fd)
          if held and not _same_machine(held, _machine()):
            raise _locked_elsewhere(str(self.path.parent), held, age) from None
          raise _locked(str(self.path.parent), held, age) from None
        except OSError as e:  # A filesystem without flock: the record alone decides.
          if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            os.close(fd)
            raise
          flocked = False
          self.no_flock = (f"{self.path.parent} has no flock ({os.strerror(e.errno)}): "
                           "the lock rests on its record and heartbeat alone, so two "
                           "starts at the same moment could both take it")
        if not _same_file(fd, self.path):  # Released (unlinked) after we opened it.
          os.close(fd)
          continue
        held = _decode(os.pread(fd, 1 << 16, 0))
        age = self.age(fd)
        reason = None if held is None else stale_reason(held, age, flock_free=flocked)
        if held is not None and reason is None:
          os.close(fd)
          raise _locked(str(self.path.parent), held, age)
        self.fd = fd
        _HELD_FDS.add(fd)
        self.write(mine)
        return held, reason
      raise Locked(f"{self.path.parent}: its lock changed hands {_TRIES} times while it "
                   "was read; another process is starting there, try again.")
    except BaseException:
      if self.fd >= 0:  # Taken, but its record could not be written (e.g. a full disk).
        with contextlib.suppress(OSError):
          self.path.unlink()
        self._close()
      self._remove_made()
      raise

  def age(self, fd: int) -> float:
    """Seconds since the lock file was last written, by its filesystem's clock (an NFS
    server's, not this host's): its mtime against that of a file made beside it now."""
    probe, name = tempfile.mkstemp(prefix=f"{LOCK_FILE}.clock-", dir=self.path.parent)
    try:
      return max(0.0, os.fstat(probe).st_mtime - os.fstat(fd).st_mtime)
    finally:
      os.close(probe)
      with contextlib.suppress(OSError):
        os.unlink(name)

  @staticmethod
  def _wait_for_record(fd: int) -> dict | None:
    """The record of a holder that may be writing it right now (up to a second)."""
    held = None
    for _ in range(20):
      held = _decode(os.pread(fd, 1 << 16, 0))
      if held:
        break
      time.sleep(0.05)
    return held

  def write(self, mine: dict) -> None:
    """Rewrites the record in place (the flock is on this file), padded with spaces over
    a longer previous one; JSON ignores them."""
    data = _encode(mine)
    size = os.fstat(self.fd).st_size
    os.pwrite(self.fd, data + b" " * max(0, size - len(data)), 0)
    os.fsync(self.fd)

  def _taken_by(self, mine: dict) -> str | None:
    """Who holds the lock file now where it is not ours any more (else None)."""
    held = _decode(os.pread(self.fd, 1 << 16, 0))
    if not _same_file(self.fd, self.path):
      return "another file (this one was removed)"
    if not held or held["token"] != mine["token"]:
      return holder(held) if held else "another record"
    return None

  def check(self, mine: dict) -> None:
    """Raises `Lost` where the lock file is not ours any more."""
    if (other := self._taken_by(mine)) is not None:
      raise Lost(f"{self.path} now holds {other}")

  def beat(self, mine: dict) -> None:
    self.check(mine)
    self.write(mine)

  def release(self, mine: dict) -> None:
    """Removes the lock file (if still ours) and the folders `take` made, if empty."""
    if self.fd < 0:  # Released already.
      return
    with contextlib.suppress(OSError):
      if self._taken_by(mine) is None:
        self.path.unlink()
    self._close()
    self._remove_made()

  def _close(self) -> None:
    _HELD_FDS.discard(self.fd)
    os.close(self.fd)
    self.fd = -1

  def _remove_made(self) -> None:
    for folder in self.made:  # Deepest first; a folder the run wrote into stays.
      with contextlib.suppress(OSError):
        folder.rmdir()


# --- a gs:// folder ------------------------------------------------------------------------

class _BucketLock:
  """The lock object of a gs:// folder, written with generation preconditions."""

  def __init__(self, url: str):
    import fsspec  # gcsfs registers gs:// with fsspec (mpx[gcs]).
    self.fs = fsspec.filesystem("gs")
    self.bucket, _, path = url.partition("://")[2].partition("/")
    self.key = f"{path.strip('/')}/{LOCK_FILE}"
    self.where = url
    self.generation = None

  def _upload(self, mine: dict, generation: str) -> str:
    """Writes the record if the object's generation is `generation` ("0": absent); its
    new generation. FileExistsError (HTTP 412) where the precondition fails."""
    reply = self.fs.call(
        "POST", f"{self.fs._location}/upload/storage/v1/b/{self.bucket}/o",
        uploadType="media", name=self.key, ifGenerationMatch=generation,
        headers={"Content-Type": "text/plain"}, data=_encode(mine), json_out=True)
    return str(reply["generation"])

  def _download(self) -> tuple[dict, str]:
    headers, data = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, alt="media")
    if "x-goog-generation" not in headers:
      raise OSError(f"{self.where}/{LOCK_FILE}: the bucket's reply names no generation "
                    "(x-goog-generation); mpx needs it to lock the run folder.")
    return _decode(data) or {}, headers["x-goog-generation"]

  def age(self, generation: str) -> float | None:
    """Seconds since the lock object was last written (its generation `generation`), by
    the bucket's clock: the object's `updated` time against the reply's Date. None where
    the object changed (or went) since it was read: what was read is no longer the record."""
    try:
      headers, body = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key)
    except FileNotFoundError:
      return None
    meta = json.loads(body)
    if str(meta.get("generation")) != generation:
      return None
    if "Date" not in headers and "date" not in headers:
      raise OSError(f"{self.where}/{LOCK_FILE}: the bucket's reply has no Date; mpx needs "
                    "the bucket's clock to tell a stale lock from a live one.")
    now = email.utils.parsedate_to_datetime(headers.get("Date") or headers["date"])
    updated = datetime.datetime.fromisoformat(meta["updated"].replace("Z", "+00:00"))
    return max(0.0, (now - updated).total_seconds())

  def take(self, mine: dict) -> tuple[dict | None, str | None]:
    """As `_LocalLock.take`; the create, and the takeover of a stale record, succeed
    only where the object is still what was read."""
    held = {}
    for _ in range(_TRIES):
      try:
        self.generation = self._upload(mine, "0")
        return None, None
      except FileExistsError:
        pass
      try:
        held, generation = self._download()
      except FileNotFoundError:  # Released meanwhile: create it again.
        continue
      if held.get("token") == mine["token"]:  # Our create, whose reply was lost and retried.
        self.generation = generation
        return None, None
      age = self.age(generation)
      if age is None:  # Written (a heartbeat, a takeover) or removed since: read it again.
        continue
      reason = stale_reason(held, age)
      if reason is None:
        raise _locked(self.where, held, age)
      try:
        self.generation = self._upload(mine, generation)
        return held, reason
      except FileExistsError:  # Another writer changed it first: read it again.
        continue
    raise _locked(self.where, held)

  def beat(self, mine: dict) -> None:
    try:
      self.generation = self._upload(mine, self.generation)
    except FileExistsError:
      try:
        held, generation = self._download()
      except FileNotFoundError:
        raise Lost(f"{self.where}/{LOCK_FILE} was removed") from None
      if held.get("token") != mine["token"]:
        raise Lost(f"{self.where}/{LOCK_FILE} now holds "
                   f"{holder(held) if held else 'another record'}") from None
      self.generation = generation  # Our write, whose reply was lost and retried.

  def check(self, mine: dict) -> None:
    """Raises `Lost` where the lock object is not ours any more (read from the bucket)."""
    try:
      held, _ = self._download()
    except FileNotFoundError:
      raise Lost(f"{self.where}/{LOCK_FILE} was removed") from None
    if held.get("token") != mine["token"]:
      raise Lost(f"{self.where}/{LOCK_FILE} now holds "
                 f"{holder(held) if held else 'another record'}")

  def release(self, mine: dict) -> None:
    del mine
    with contextlib.suppress(FileNotFoundError, FileExistsError):
      self.fs.call("DELETE", "b/{}/o/{}", self.bucket, self.key,
                   ifGenerationMatch=self.generation)


# --- holding it ----------------------------------------------------------------------------

def _exit_lost(where: str, why: str) -> None:
  """A holder whose lock was taken over stops at once: saving would write beside the new
  holder, and its last checkpoint is where the new holder resumed."""
  print(f"mpx run: lost the lock on {where} ({why}): its heartbeat had stopped for too "
        "long, and another writer took the folder over; stopping now, without saving.",
        file=sys.stderr, flush=True)
  sys.stdout.flush()
  os._exit(EXIT_CODE)


class Hold:
  """A held lock and its heartbeat thread; `release()` (or the `with` block's end) ends
  both. `took_over`: a line saying whose stale lock was taken over and why, or None."""

  def __init__(self, out: str, command: str, processes: int = 1,
               on_lost: Callable[[str, str], None] = _exit_lost):
    self.where, self.mine, self.on_lost = out, record(command, processes), on_lost
    self._lock = (_BucketLock(out) if run_folder.is_url(out)
                  else _LocalLock(pathlib.Path(out).absolute()))
    stale, reason = self._lock.take(self.mine)
    self.warning = getattr(self._lock, "no_flock", None)  # A lock weaker than it looks.
    self.took_over = None if reason is None else (
        f"took over the lock of {out} from {holder(stale) if stale else 'an earlier run'}: "
        f"{reason}.")
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._beat, name="mpx-lock-heartbeat",
                                    daemon=True)
    self._thread.start()

  def _beat(self) -> None:
    failing = False
    while not self._stop.wait(self.mine["heartbeat_every"]):
      self.mine["heartbeat"] = _clock()
      try:
        self._lock.beat(self.mine)
        failing = False
      except Lost as e:
        if not self._stop.is_set():
          self.on_lost(self.where, str(e))
        return
      except Exception as e:  # E.g. a bucket out of reach: try again at the next beat.
        if not failing:
          print(f"mpx run: the heartbeat of the lock on {self.where} failed ({e}); "
                "trying again", file=sys.stderr, flush=True)
        failing = True

  def lost(self) -> str | None:
    """Why the lock is not this run's any more (another writer took it over: its
    heartbeat was stuck, its process suspended, a clock elsewhere ran ahead), or None:
    read now from the lock file or object, not from the last heartbeat."""
    try:
      self._lock.check(self.mine)
    except Lost as e:
      return str(e)
    return None

  def fence(self, why: str | None = None) -> None:
    """Before a write into the folder: a run whose lock was taken over (`lost()`, or
    `why` where the caller asked already) stops here (`on_lost`: exit 75), before it
    writes beside the new holder, not at its next heartbeat."""
    why = why or self.lost()
    if why is not None:
      self.on_lost(self.where, why)
      raise Lost(why)

  def release(self) -> None:
    """Stops the heartbeat and removes the lock; one that cannot be removed (a bucket out
    of reach) is left to go stale, without failing the run that ends here. A heartbeat
    stuck in a storage call is not waited for past one interval (it is a daemon)."""
    self._stop.set()
    self._thread.join(timeout=self.mine["heartbeat_every"])
    try:
      self._lock.release(self.mine)
    except Exception as e:
      print(f"mpx run: could not remove the lock of {self.where} ({e}); the next start "
            "takes it over once it is stale.", file=sys.stderr)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.release()


@contextlib.contextmanager
def job_lock(out: str, command: str):
  """The run folder's lock for a job of one or many processes (a collective: every process
  enters it): process 0 holds it, with the job's process count in its record; every
  process raises `Locked` where process 0 could not take it, so all refuse alike."""
  from mpx.sweep import distributed  # JAX: only a run needs it.
  import jax
  hold, failure = None, None
  if distributed.is_primary():
    try:
      hold = Hold(out, command, jax.process_count())
    except Exception as e:  # Raised on every process, after they all know.
      failure = e
  try:
    if distributed.any_process(failure is not None):
      raise failure or Locked(f"{out}: process 0 found the run folder locked, or could not "
                              "take its lock (its output says why).")
    if hold is not None and hold.took_over:
      print(f"mpx run: {hold.took_over}", file=sys.stderr)
    if hold is not None and hold.warning:
      print(f"mpx run: warning: {hold.warning}.", file=sys.stderr)
    yield hold
  finally:
    if hold is not None:
      hold.release()
