"""`mpx run`'s storage faults in one line, and its libraries' thread errors in a log file.

A full disk, a denied permission, a bucket refusing a write or checkpoints that do not
restore end `mpx run` with one line naming the path and the cause (exit status 4, see
`run.STORAGE_EXIT_CODE`). A fault that passes (a bucket's 503s, a timeout, an I/O error:
`checkpoint.transient_cause`) is retried with backoff for up to MPX_STORAGE_RETRY_S
seconds (`checkpoint.retrying`); one that outlasts it ends the run with exit status 69, which the
launchers retry. What Orbax's, tensorstore's and asyncio's background threads
print when a write or a read fails (their tracebacks, "Event loop is closed", absl and
asyncio ERROR records) says nothing more, and would bury that line: while the command
runs (`background_errors_to_log`) it is kept in memory and written, at the end, to
RUN_DIR/background-errors.log (a temporary file where the run folder cannot take it, e.g.
a full disk), which the command names. Library users keep their own logging.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import tempfile
import threading
import time
import traceback
from typing import Iterator

from mpx import checkpoint

LOG_FILE = "background-errors.log"
UNAVAILABLE_EXIT_CODE = 69  # sysexits' EX_UNAVAILABLE: try again later (launchers do).
UNAVAILABLE = "mpx run: storage unavailable: "  # How that exit's line starts.
_LOGGERS = ("absl", "asyncio", "gcsfs")  # Orbax logs through absl.


class BackgroundErrors(logging.Filter):
  """What the libraries' threads reported while `mpx run` ran: formatted lines, and the
  local run folder (`run_dir`) the log goes to once `log_here` names it."""

  def __init__(self):
    super().__init__()
    self.count = 0  # Errors caught.
    self.lines: list[str] = []
    self.run_dir: str | None = None
    self.out: str | None = None  # The run folder as named (a gs:// URL, or run_dir).
    self.written: str | None = None  # The log file, once written.
    self._flushed = 0  # How many of `lines` are in it (or on stderr).
    self.let_go = False  # The run folder's lock is released: write nothing more there.

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno < logging.ERROR:
      return True
    self.count += 1
    self.lines += [f"{record.levelname}:{record.name}: {record.getMessage()}\n"]
    if record.exc_info:
      self.lines += traceback.format_exception(*record.exc_info)
    return False  # Not shown.

  def add(self, where: str, error: BaseException | None) -> None:
    self.count += 1
    self.lines += [f"{where}:\n"] + traceback.format_exception(error)

  def write(self) -> str | None:
    """Appends the lines not written yet to the log: the file written before, else
    RUN_DIR/background-errors.log, else (the run folder unknown or unable to take them)
    a temporary file; returns its path (None: nothing caught). Where no file takes them,
    they go to stderr after all: never lost."""
    if len(self.lines) == self._flushed:
      return self.written
    text = (f"== mpx run, process {os.getpid()}, "
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
            + "".join(self.lines[self._flushed:]))
    self._flushed = len(self.lines)
    local = (os.path.join(self.run_dir, LOG_FILE)
             if self.run_dir and os.path.isdir(self.run_dir) else None)
    kept = (self.written, local) if not self.let_go else ()
    for path in dict.fromkeys(p for p in kept if p):
      size = os.path.getsize(path) if os.path.exists(path) else None
      try:
        with open(path, "a", encoding="utf-8") as f:
          f.write(text)
        self.written = path
        return path
      except OSError:  # E.g. the full disk the log is about: no half of it stays.
        with contextlib.suppress(OSError):
          os.truncate(path, size) if size is not None else os.remove(path)
    try:
      fd, path = tempfile.mkstemp(prefix="mpx-run-", suffix=".log")
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    except OSError:
      sys.stderr.write(text)
      return self.written
    self.written = path
    return path


_active: BackgroundErrors | None = None  # While `background_errors_to_log` runs.


def log_here(run_dir: str | os.PathLike | None, out: str) -> None:
  """Names the local folder the log goes to (None: a temporary file) and the run folder
  `out` a fault without a path of its own is said to be in (nothing outside `mpx run`)."""
  if _active is not None:
    _active.run_dir = None if run_dir is None else os.fspath(run_dir)
    _active.out = out


def let_go() -> None:
  """Before the run folder's lock is released: what was caught so far goes into the run
  folder's log now, and what comes later to a temporary file, never into a folder that
  another run may be writing by then."""
  if _active is not None:
    _active.write()
    _active.let_go = True


@contextlib.contextmanager
def background_errors_to_log() -> Iterator[BackgroundErrors]:
  """Keeps the libraries' background-thread errors out of the terminal meanwhile: absl
  (Orbax) and asyncio ERROR records, uncaught exceptions of threads, exceptions that
  cannot be raised (tensorstore's callbacks into a closed event loop). Each hook is put
  back after; what was caught is written to the log and named in one line, unless the
  command's own last line (`fault_line`) named that log already (what came after it is
  appended there). The main thread's own exceptions are the command's to report."""
  global _active
  errors = BackgroundErrors()
  hooks = (sys.unraisablehook, threading.excepthook)
  sys.unraisablehook = lambda u: errors.add(f"unraisable ({u.err_msg or 'ignored'})",
                                            u.exc_value)
  threading.excepthook = lambda a: errors.add(
      f"thread {a.thread.name if a.thread else '?'}", a.exc_value)
  for name in _LOGGERS:
    logging.getLogger(name).addFilter(errors)
  _active = errors
  try:
    yield errors
  finally:
    gc.collect()  # Futures whose exception nobody read log it when collected: now.
    _active = None
    for name in _LOGGERS:
      logging.getLogger(name).removeFilter(errors)
    sys.unraisablehook, threading.excepthook = hooks
    named = errors.written
    if (log := errors.write()) and log != named:
      print(f"mpx run: {errors.count} error(s) of background threads (Orbax, asyncio) "
            f"logged to {log}", file=sys.stderr)


def fault_line(error: BaseException, errors: BackgroundErrors, again: str) -> str | None:
  """The one line a storage fault ends `mpx run` with: the path, the cause, what to do,
  and the log of the background errors; None where `error` is no storage fault. A fault
  that may pass (`StorageUnavailable`, or one no retry caught) starts with UNAVAILABLE."""
  where = getattr(error, "filename", None) or errors.out or "the run folder"
  transient = (isinstance(error, checkpoint.StorageUnavailable)
               or not isinstance(error, checkpoint.StorageError)
               and checkpoint.transient_cause(error) is not None)
  if isinstance(error, checkpoint.StorageError):
    what, fix = str(error), error.fix
  else:
    cause = checkpoint.transient_cause(error) or checkpoint.storage_cause(error)
    if cause is None:
      return None
    what, fix = f"{where}: {cause}", None
  log = errors.write()
  log = f" Background errors: {log}" if log else ""
  if transient:
    return (f"{UNAVAILABLE}{what}; it may pass: {again} later continues the run from its last "
            f"complete checkpoint (exit status {UNAVAILABLE_EXIT_CODE}: the launchers try "
            f"again).{log}")
  fix = fix or "fix the storage (free space, permissions)"
  return (f"mpx run: storage fault: {what}; {fix}, then continue with {again} (it resumes "
          f"from the last complete checkpoint).{log}")
