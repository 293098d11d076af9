"""Checkpoints of a whole sweep: the stacked train state, its step and the run config.

A thin wrapper over Orbax's `CheckpointManager` (the stable, documented v0 API; `ocp.v1`
is still experimental). One checkpoint is one step directory holding two items:

  <directory>/<step>/state    the state pytree (`StandardCheckpointHandler`, tensorstore)
  <directory>/<step>/config   the run config (`JsonCheckpointHandler`)

Why it is safe to resume from:
  * `save` is synchronous: it returns only once the step directory is finalised, so a
    SIGKILL right after it cannot lose that checkpoint. A synchronous save also means the
    sweep may donate the state buffers to the next chunk as soon as `save` returns.
  * Orbax writes into `<step>.orbax-checkpoint-tmp-*` and renames it when complete; steps
    are only ever listed from finalised directories, so a save killed half way is never
    picked. A new `Checkpointer` removes a killed writer's temporary directories (in the
    background, finished before its first save), so there must be a single writing
    process per directory; other processes read with `restore_config`.
  * `restore` checks every leaf's shape and dtype against the checkpoint first, because
    Orbax would silently cast dtypes: resuming with a changed config fails loudly.

Leaves may be jax arrays (sharded ones included: each restores into the target's
sharding), numpy arrays, numpy scalars and Python scalars. Typed PRNG key arrays are
refused: store `jax.random.key_data(key)` (uint32) and rewrap it with
`jax.random.wrap_key_data` after `restore`.

Storage faults come as one `StorageError` naming the path and the cause (a full disk, a
denied permission, a bucket refusing a write), never as Orbax's or tensorstore's own
exceptions; a finalised checkpoint that does not restore completely (damaged, partial or
undecodable bytes) as a `DamagedCheckpoint` naming its step: `check_intact` finds one
before a run resumes, `set_aside` moves it out of the steps Orbax lists, kept to inspect.

Every byte of a checkpoint is summed (`SUMS_FILE`, see `_Summed`): Orbax's array data has
no checksum of its own, so a flipped byte there restored other numbers without a word.
`check_intact` verifies the sums before it reads the state; a step written before sums
existed has none and still restores (`verify_sums` says so).

A SIGTERM handler should set a flag that the training loop checks between chunks, not
call `save` itself: a signal arriving during a save would otherwise start a second one.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import sys
import time
from typing import Any, Callable, TypeVar

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

PyTree = Any

_STATE = "state"
_CONFIG = "config"


class StorageError(OSError):
  """Checkpoints could not be written or read because of the storage: `path` names where,
  `cause` why (one line), `fix` what to do where the message says more than "fix the
  storage"."""

  def __init__(self, message: str, *, path: str, cause: str, fix: str | None = None):
    super().__init__(message)
    self.path, self.cause, self.fix = path, cause, fix


class DamagedCheckpoint(StorageError):
  """Finalised checkpoint `step` does not restore completely: damaged, partial or
  undecodable bytes (an older step may still restore)."""

  def __init__(self, directory: str | os.PathLike, step: int, cause: str):
    directory = _absolute(directory)
    path = os.path.join(directory, str(step))  # os.path.join keeps a gs:// URL whole.
    super().__init__(f"checkpoint step {step} in {directory} does not restore: {cause}",
                     path=path, cause=cause)
    self.directory, self.step = directory, step


class StorageUnavailable(StorageError):
  """The storage failed in a way that passes (`transient_cause`) for longer than mpx
  retries it: the same command later continues the run (`mpx run` exits 69, which the
  launchers retry); nothing about the storage needs fixing."""


# Errors of the storage itself, by errno (Python's own file writes and reads).
STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM,
                            errno.EROFS, errno.EIO, errno.EFBIG})
# tensorstore's errors are ValueErrors whose message starts with an absl status code.
_STATUS = re.compile(r"^([A-Z_]{5,}): ")
# Reading a finalised step: what says its bytes are wrong (damaged, partial, undecodable).
_DAMAGE_STATUS = frozenset({"DATA_LOSS", "NOT_FOUND", "OUT_OF_RANGE", "FAILED_PRECONDITION"})
# What else says the storage failed (full, refused, unreachable), not the caller.
_STORAGE_STATUS = _DAMAGE_STATUS | {"RESOURCE_EXHAUSTED", "PERMISSION_DENIED",
                                    "UNAUTHENTICATED", "UNAVAILABLE", "DEADLINE_EXCEEDED",
                                    "ABORTED", "INTERNAL", "UNKNOWN"}
# What passes: a store out of reach for a while, not one that refuses or is full.
_TRANSIENT_STATUS = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "ABORTED", "INTERNAL",
                               "UNKNOWN"})
_TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})  # gcsfs's HttpError codes.
RETRY_ENV = "MPX_STORAGE_RETRY_S"  # How long a passing storage fault is retried (seconds).
RETRY_S = 600.0  # Its default: past a bucket's usual outages, short of a lost job.
T = TypeVar("T")
_PAYLOAD = re.compile(r"\s*\[\w+='[^']*'\]")  # tensorstore's [tensorstore_spec='...'] etc.


def _status(error: BaseException) -> str | None:
  match = _STATUS.match(str(error)) if isinstance(error, ValueError) else None
  return match.group(1) if match else None


def storage_cause(error: BaseException) -> str | None:
  """One line saying why the storage failed, or None where `error` is no storage fault:
  an OSError of the storage (no space, permission denied, read-only, I/O error; or one
  without an errno, as gcsfs raises for a refused request), or a tensorstore status."""
  if isinstance(error, OSError) and not isinstance(error, (FileNotFoundError,
                                                            FileExistsError)):
    if error.errno in STORAGE_ERRNOS:
      return os.strerror(error.errno)
    if error.errno is None and type(error) is OSError:  # gcsfs: "Forbidden: PATH\n..."
      return str(error).strip().splitlines()[0] if str(error).strip() else "OSError"
    return None
  status = _status(error)
  if status not in _STORAGE_STATUS:
    return None
  message = _PAYLOAD.sub("", str(error))
  code = re.search(r"\[os_error_code='?(\d+)'?\]", str(error))
  if code:
    return os.strerror(int(code.group(1)))
  detail = message.rpartition('": ')[2]  # What the innermost file's error says.
  files = re.findall(r'"([^"]+)"', message)
  where = f" in {files[-1]}" if files and files[-1] not in detail else ""
  return f"{status}: {detail.removeprefix(status + ': ')}{where}"


def transient_cause(error: BaseException) -> str | None:
  """One line saying why the storage failed in a way a later try may not, or None: a
  bucket's 408/429/5xx answer or dropped connection (after the client library's own
  retries), a timeout, an I/O error (what gcsfuse reports for a network failure), or a
  tensorstore status of the same kind."""
  if isinstance(error, TimeoutError):
    return f"timed out{f' ({error})' if str(error) else ''}"
  if isinstance(error, OSError) and error.errno == errno.EIO:
    return os.strerror(errno.EIO) + (f": {error.filename}" if error.filename else "")
  module, name = type(error).__module__, type(error).__name__
  if module.startswith("gcsfs") and name == "HttpError":
    code = getattr(error, "code", None)
    return f"HTTP {code} {str(error).removesuffix(f', {code}')}" if code in _TRANSIENT_HTTP else None
  if module.startswith("aiohttp") and any(c.__name__ == "ClientConnectionError"
                                          for c in type(error).__mro__):
    return f"{name}: {error}" if str(error) else name
  if _status(error) in _TRANSIENT_STATUS or "[os_error_code='5']" in str(error):
    return storage_cause(error) or _status(error)
  return None


def retry_budget() -> float:
  """MPX_STORAGE_RETRY_S (default RETRY_S), checked."""
  value = os.environ.get(RETRY_ENV, str(RETRY_S))
  try:
    budget = float(value)
  except ValueError:
    budget = -1.0
  if not budget >= 0:
    raise ValueError(f"{RETRY_ENV}={value!r}: give the seconds a passing storage fault is "
                     f"retried for, a number >= 0 (default {RETRY_S:.0f}).")
  return budget


def retrying(what: str, call: Callable[[], T], where: str) -> T:
  """`call()`, tried again with backoff (1, 2, 4 ... 30 s) while it fails in a way that
  passes (`transient_cause`), for up to `retry_budget()` seconds; then
  `StorageUnavailable`. `what` (e.g. "uploading the run's files") and `where`
  (its path or URL) go into the one line said when it first fails and the one said when
  it is through. `call` must be safe to repeat."""
  budget, start, delay, said = retry_budget(), time.monotonic(), 1.0, None
  while True:
    try:
      result = call()
    except Exception as e:
      cause = transient_cause(e)
      if cause is None:
        raise
      waited = time.monotonic() - start
      if waited + delay > budget:
        raise StorageUnavailable(
            f"{what} {where} failed for {waited:.0f} s, retried ({cause})", path=where,
            cause=cause) from e
      if said is None:
        said = cause
        print(f"mpx: {what} {where} failed ({cause}); trying again for up to "
              f"{budget:.0f} s ({RETRY_ENV})", file=sys.stderr, flush=True)
      time.sleep(delay)
      delay = min(2 * delay, 30.0)
      continue
    if said is not None:
      print(f"mpx: {what} {where} went through after {time.monotonic() - start:.0f} s",
            file=sys.stderr, flush=True)
    return result


def _damage_cause(error: BaseException) -> str | None:
  """Why a finalised step's bytes do not restore, or None where `error` is no damage: a
  file of it missing, undecodable (bad UTF-8, JSON), or a tensorstore read saying so. An
  I/O error is no damage: it may pass (`transient_cause`)."""
  if isinstance(error, (UnicodeDecodeError, json.JSONDecodeError)):
    return f"{type(error).__name__}: {error}"
  if isinstance(error, KeyError):  # Orbax: an item folder of the step is missing.
    return f"an item is missing: {error.args[0] if error.args else error}"
  if isinstance(error, FileNotFoundError):
    return f"a file is missing: {error.filename or error}"
  if _status(error) in _DAMAGE_STATUS and transient_cause(error) is None:
    return storage_cause(error)
  if isinstance(error, ValueError) and "Error decoding" in str(error):
    # tensorstore's decoding of a damaged b-tree node or manifest, without a status code
    # (where zstd rejects the bytes before the node's CRC-32C is checked).
    message = _PAYLOAD.sub("", str(error))
    files = re.findall(r'"([^"]+)"', message)
    detail = message[message.index("Error decoding"):]
    return detail + (f" in {files[-1]}" if files else "")
  return None


def _reading(directory: str, step: int, read: Callable[[], Any]) -> Any:
  """`read()` of finalised `step`, its failures as DamagedCheckpoint (the step's bytes)
  or StorageError (the storage); one that may pass (`transient_cause`: for the caller to
  retry) and any other error are raised as they are."""
  try:
    return read()
  except StorageError:  # Sorted already (a sum that differs).
    raise
  except Exception as error:  # Orbax and tensorstore raise many types: sorted here.
    if transient_cause(error) is not None:
      raise
    damage = _damage_cause(error)
    if damage is not None:  # Its files named within the step's folder.
      damage = damage.replace(os.path.join(directory, str(step), ""), "")
      raise DamagedCheckpoint(directory, step, damage) from error
    cause = storage_cause(error)
    if cause is None:
      raise
    raise StorageError(f"reading checkpoint step {step} in {directory} failed: {cause}",
                       path=os.path.join(directory, str(step)), cause=cause) from error


# --- sums over every file of a checkpoint ---------------------------------------------------

SUMS_FILE = "mpx-sums.json"  # In each item's folder: the sums of the item's other files.
_SUMS_FORMAT = 1
_ALGORITHM = "sha256"
# Orbax's own record that an item or a step was committed, written after `finalize`: it
# holds no number and nothing a restore reads, so it is the one file left out of the sums.
_COMMIT_FILE = "commit_success.txt"
_BLOCK = 1 << 24  # Bytes hashed per read.


def _file_sum(path: epath.Path) -> tuple[int, str]:
  """(size, hex digest) of one file, read in blocks (a state may not fit twice in memory)."""
  digest, size = hashlib.new(_ALGORITHM), 0
  with path.open("rb") as f:
    while block := f.read(_BLOCK):
      digest.update(block)
      size += len(block)
  return size, digest.hexdigest()


def _relative_files(folder: epath.Path) -> list[str]:
  """The files under `folder`, as '/'-joined paths relative to it, sorted."""
  found, todo = [], [(folder, "")]
  while todo:
    parent, prefix = todo.pop()
    for child in parent.iterdir():
      name = prefix + child.name
      if child.is_dir():
        todo.append((child, name + "/"))
      else:
        found.append(name)
  return sorted(found)


def _sums_digest(files: dict) -> str:
  """The sum file's own sum, over its listing: a flip in a sum it holds is named as the
  sum file's damage, not as the data file's."""
  return hashlib.new(_ALGORITHM, json.dumps(files, sort_keys=True).encode()).hexdigest()


def write_sums(item: epath.Path) -> None:
  """Writes `item`/SUMS_FILE: the size and sum of every other file under the item folder."""
  files = {rel: list(_file_sum(item / rel)) for rel in _relative_files(item)
           if rel not in (SUMS_FILE, _COMMIT_FILE)}
  (item / SUMS_FILE).write_text(json.dumps(
      {"format": _SUMS_FORMAT, "algorithm": _ALGORITHM, "files": files,
       "sum": _sums_digest(files)}, sort_keys=True))


class _Summed:
  """Mixin for an item's handler: `finalize` writes the item's sums once its files are
  final. Orbax calls `finalize` (a public hook of every CheckpointHandler, on one process
  after all have written) before it commits the item and the step, so a step without
  its sums never counts as finished: a kill before the sums leaves a temporary folder,
  which is never listed.

  Why a manifest of sums, not tensorstore's `crc32c` codec: Orbax builds the array specs
  itself and takes no codec for chunk data. Its zarr3 layout checksums only the shard
  index (`index_codecs`), and its default, zarr2 with zstd, none at all; OCDBT checksums
  its b-tree nodes and manifests but not the values. The JSON files (_METADATA, _sharding,
  array_metadatas, the config) have no checksum either. The sums cover them all, on
  every Orbax line, with the standard library's sha256."""

  def finalize(self, directory: epath.Path) -> None:
    super().finalize(directory)
    write_sums(epath.Path(directory))


class SummedStandardHandler(_Summed, ocp.StandardCheckpointHandler):
  """The state's handler: Orbax's StandardCheckpointHandler, and the item's sums. Its
  name is recorded in each step's metadata: plain Orbax restores the step with
  `ocp.args.StandardRestore`."""


class SummedJsonHandler(_Summed, ocp.JsonCheckpointHandler):
  """The config's handler: Orbax's JsonCheckpointHandler, and the item's sums."""


# Orbax finds an item's handler by the type of its args (`register_with_handler`): these
# are Orbax's own, bound to the handlers above.
@ocp.args.register_with_handler(SummedStandardHandler, for_save=True)
class _StateSave(ocp.args.StandardSave):
  pass


@ocp.args.register_with_handler(SummedStandardHandler, for_restore=True)
class _StateRestore(ocp.args.StandardRestore):
  pass


@ocp.args.register_with_handler(SummedJsonHandler, for_save=True)
class _ConfigSave(ocp.args.JsonSave):
  pass


@ocp.args.register_with_handler(SummedJsonHandler, for_restore=True)
class _ConfigRestore(ocp.args.JsonRestore):
  pass


def _item_handlers() -> dict[str, Any]:
  return {_STATE: SummedStandardHandler(), _CONFIG: SummedJsonHandler()}


def _retention(max_to_keep: int | None) -> dict[str, Any]:
  """Options that keep the newest `max_to_keep` checkpoints (all of them when None)."""
  try:
    from orbax.checkpoint.checkpoint_managers import preservation_policy
  except ImportError:  # Older Orbax: only the (now deprecated) `max_to_keep` option.
    return {"max_to_keep": max_to_keep}
  if max_to_keep is None:
    return {"preservation_policy": preservation_policy.PreserveAll()}
  return {"preservation_policy": preservation_policy.LatestN(max_to_keep)}


def _manager(directory: str, *, read_only: bool, max_to_keep: int | None = None
             ) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      create=not read_only,
      read_only=read_only,
      # Removes the temporary directories of a killed writer; a reader must not.
      cleanup_tmp_directories=not read_only,
      enable_async_checkpointing=False,
      **({"save_interval_steps": 0} if read_only else {}),  # what read_only implies anyway
      **_retention(max_to_keep))
  with _without_read_only_notice() if read_only else contextlib.nullcontext():
    return ocp.CheckpointManager(directory, options=options, item_handlers=_item_handlers())


class _ReadOnlyNotice(logging.Filter):
  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Given directory is read only")


@contextlib.contextmanager
def _without_read_only_notice():
  """Orbax warns "Given directory is read only" for every read-only manager: mpx reads a
  run's checkpoints read-only on purpose (each resume, each check of a folder), so the
  warning says nothing to act on. Only that record is dropped, only meanwhile."""
  notice, absl_logger = _ReadOnlyNotice(), logging.getLogger("absl")
  absl_logger.addFilter(notice)
  try:
    yield
  finally:
    absl_logger.removeFilter(notice)


def _path_names(path) -> tuple[str, ...]:
  """A key path as plain names, so that `.mu` (NamedTuple) matches Orbax's `['mu']`."""
  names = []
  for key in path:
    for attribute in ("key", "name", "idx"):
      if hasattr(key, attribute):
        names.append(str(getattr(key, attribute)))
        break
    else:
      names.append(str(key))
  return tuple(names)


def _is_typed_key(leaf) -> bool:
  dtype = getattr(leaf, "dtype", None)
  return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _check_leaf_types(tree: PyTree, what: str) -> None:
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    name = jax.tree_util.keystr(path)
    if _is_typed_key(leaf):
      raise ValueError(
          f"{what} leaf {name} is a typed PRNG key array, which is not checkpointed: "
          "store jax.random.key_data(key) instead and rewrap it with "
          "jax.random.wrap_key_data after restore.")
    if not isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct, np.ndarray, np.generic,
                             bool, int, float)):
      raise ValueError(
          f"{what} leaf {name} has type {type(leaf).__name__}; a checkpointed state may only "
          "hold jax/numpy arrays and numpy/Python scalars. Keep other values in the config "
          "or mark them static (flax.struct.field(pytree_node=False)).")


def _for_orbax(leaf):
  """Numpy scalars as 0-d arrays, the form Orbax accepts."""
  return np.asarray(leaf) if isinstance(leaf, np.generic) else leaf


def _restore_target(leaf):
  """The abstract leaf Orbax restores into: jax arrays keep their sharding."""
  if isinstance(leaf, (jax.Array, jax.ShapeDtypeStruct)):
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:  # e.g. from jax.eval_shape; without it Orbax returns numpy.
      sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
  return _for_orbax(leaf)  # numpy stays numpy, Python scalars stay Python scalars.


def _check_against_checkpoint(target: PyTree, stored: PyTree, where: str) -> None:
  """Raises a ValueError naming the first leaf whose shape or dtype differs."""
  stored_leaves = {_path_names(path): leaf
                   for path, leaf in jax.tree_util.tree_flatten_with_path(stored)[0]}
  target_names = set()
  for path, leaf in jax.tree_util.tree_flatten_with_path(target)[0]:
    names = _path_names(path)
    target_names.add(names)
    name = jax.tree_util.keystr(path)
    if names not in stored_leaves:
      raise ValueError(
          f"Leaf {name} of the restore target is not in {where}. The state's structure "
          "changed since the checkpoint was written: resume with the same config, or start "
          "a fresh run in another directory.")
    saved = stored_leaves[names]
    shape = tuple(np.shape(leaf))
    saved_shape = tuple(getattr(saved, "shape", ()))
    dtype = None if isinstance(leaf, (bool, int, float)) else np.dtype(leaf.dtype)
    saved_dtype = getattr(saved, "dtype", None)
    if shape != saved_shape or (dtype is not None and saved_dtype is not None
                                and dtype != np.dtype(saved_dtype)):
      raise ValueError(
          f"Leaf {name}: the restore target has shape {shape} dtype {dtype}, {where} has "
          f"shape {saved_shape} dtype {saved_dtype}. Resume with the config the checkpoint "
          "was written with (see restore_config), or start a fresh run in another "
          "directory.")
  extra = sorted(set(stored_leaves) - target_names)
  if extra:
    raise ValueError(
        f"{where} holds {len(extra)} leaves that the restore target lacks, e.g. "
        f"{'/'.join(extra[0])}. Resume with the same config, or start a fresh run in "
        "another directory.")


class Checkpointer:
  """Saves and restores (state, config) at integer steps in one directory.

  `max_to_keep` newest checkpoints are kept (None keeps all). Use as a context manager,
  or call `close()`, so Orbax's resources are released.
  """

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3):
    if max_to_keep is not None and (isinstance(max_to_keep, bool)
                                    or not isinstance(max_to_keep, int) or max_to_keep < 1):
      raise ValueError(f"max_to_keep must be an int >= 1 or None (keep all); got {max_to_keep!r}.")
    self.directory = _absolute(directory)
    self._max_to_keep = max_to_keep
    self._manager = _manager(self.directory, read_only=False, max_to_keep=max_to_keep)
    self._failed = False  # A save failed: closing re-raises its error, already raised.

  def save(self, step: int, state: PyTree, config: dict) -> None:
    """Writes a checkpoint and returns once it is finalised on disk.

    Saving a step that already exists is a no-op: the finalised checkpoint is kept (a
    resumed run reproduces it bit for bit, and a SIGTERM right after a chunk's save then
    costs nothing). The config goes through JSON: tuples come back as lists.
    """
    step = _check_step(step)
    if not isinstance(config, dict):
      raise ValueError(f"config must be a dict; got {type(config).__name__}.")
    try:
      json.dumps(config, allow_nan=True)
    except TypeError as error:
      raise ValueError(
          f"config must be JSON-serialisable (convert numpy values with .item() or "
          f".tolist()): {error}") from error
    _check_leaf_types(state, "state")
    if step in self._manager.all_steps():
      return
    state = jax.tree.map(_for_orbax, state)
    path = os.path.join(self.directory, str(step))
    tries = []

    def write():
      if tries:  # A failed try leaves Orbax's manager mid-save: a fresh one tries again.
        with contextlib.suppress(Exception):
          self._manager.close()
        self._manager = _manager(self.directory, read_only=False,
                                 max_to_keep=self._max_to_keep)
      tries.append(step)
      self._manager.save(step, args=ocp.args.Composite(
          **{_STATE: _StateSave(state), _CONFIG: _ConfigSave(config)}), force=True)
      self._manager.wait_until_finished()

    try:
      if jax.process_count() == 1:
        retrying(f"writing checkpoint step {step} to", write, path)
      else:  # Every process writes its part: one alone cannot try again.
        write()
    except StorageUnavailable:
      self._failed = True
      raise
    except Exception as error:  # Orbax and tensorstore raise many types: sorted here.
      transient = transient_cause(error)  # After tensorstore's own retries.
      cause = transient or storage_cause(error)
      if cause is None:
        raise
      self._failed = True
      raise (StorageUnavailable if transient else StorageError)(
          f"writing checkpoint step {step} to {path} failed: {cause}", path=path,
          cause=cause) from error

  def all_steps(self) -> list[int]:
    """The finalised steps, oldest first."""
    return sorted(self._manager.all_steps())

  def latest_step(self) -> int | None:
    """The newest finalised step, or None before the first save."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def restore(self, target: PyTree, step: int | None = None) -> tuple[PyTree, dict]:
    """Returns `(state, config)` at `step` (the latest when None).

    `target` fixes the structure, shapes, dtypes, and for jax arrays (or
    `jax.ShapeDtypeStruct`s, e.g. from `jax.eval_shape`) the sharding of the result.
    The state has exactly the target's tree structure; numpy leaves come back as numpy
    arrays and Python scalars as Python scalars (so a Python scalar leaf needs a Python
    scalar in the target, not a struct from `jax.eval_shape`). Jax leaves may be donated
    (deleted) arrays: only their shape, dtype and sharding are read.
    """
    step = self._resolve_step(step)
    _check_leaf_types(target, "target")
    where = f"checkpoint step {step} in {self.directory}"
    _check_against_checkpoint(target, _state_metadata(self._manager, self.directory, step),
                              where)
    restored = _reading(self.directory, step, lambda: self._manager.restore(
        step, args=ocp.args.Composite(
            **{_STATE: _StateRestore(jax.tree.map(_restore_target, target)),
               _CONFIG: _ConfigRestore()})))
    # Rebuild on the target's own treedef, matching leaves by path, so the result has the
    # target's containers (NamedTuples, optax states, flax structs) whatever Orbax returns.
    by_path = {_path_names(path): leaf for path, leaf
               in jax.tree_util.tree_flatten_with_path(restored[_STATE])[0]}
    paths, treedef = jax.tree_util.tree_flatten_with_path(target)
    leaves = []
    for path, leaf in paths:
      value = by_path[_path_names(path)]
      if isinstance(leaf, np.generic):
        value = np.asarray(value, leaf.dtype)[()]
      leaves.append(value)
    return jax.tree.unflatten(treedef, leaves), dict(restored[_CONFIG])

  def restore_host(self, target: PyTree, step: int | None = None) -> tuple[PyTree, dict]:
    """Like `restore`, but every leaf comes back as a whole numpy array with the leading
    (member) axis the checkpoint has, whatever the target's: a sweep saved on 8 devices
    (members padded to 8) restores on 1 or on 3 hosts, which then take their own rows.
    Every process reads the whole state."""
    step = self._resolve_step(step)
    stored = {_path_names(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(
        _state_metadata(self._manager, self.directory, step))[0]}

    def as_stored(path, leaf):
      if isinstance(leaf, (bool, int, float)) or not np.ndim(leaf):
        return np.asarray(leaf) if isinstance(leaf, (jax.Array, np.generic)) else leaf
      saved = stored.get(_path_names(path))
      rows = saved.shape[0] if getattr(saved, "shape", None) else np.shape(leaf)[0]
      return np.zeros((rows,) + tuple(np.shape(leaf)[1:]), np.dtype(leaf.dtype))
    return self.restore(jax.tree_util.tree_map_with_path(as_stored, target), step)

  def _resolve_step(self, step: int | None) -> int:
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(f"No finalised checkpoint in {self.directory}.")
    if step is None:
      return steps[-1]
    if _check_step(step) not in steps:
      raise FileNotFoundError(
          f"No checkpoint for step {step} in {self.directory}; it holds steps {steps}.")
    return step

  def close(self) -> None:
    """Waits for Orbax's background work and releases the manager."""
    try:
      self._manager.close()
    except Exception:  # After a failed save: its error again, raised once already.
      if not self._failed:
        raise

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


def _absolute(directory: str | os.PathLike) -> str:
  """A local directory made absolute; a URL (gs://...) as it is: Orbax writes it."""
  directory = os.fspath(directory)
  return directory if "://" in directory else os.path.abspath(directory)


def _check_step(step) -> int:
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
    raise ValueError(f"step must be an int >= 0; got {step!r}.")
  return int(step)


def all_steps(directory: str | os.PathLike) -> list[int]:
  """The finalised steps in `directory`, oldest first (none where there is no such
  folder), read-only: checking a run folder writes nothing into it."""
  directory = _absolute(directory)
  if not epath.Path(directory).is_dir():
    return []
  manager = _manager(directory, read_only=True)
  try:
    return sorted(manager.all_steps())
  finally:
    manager.close()


def latest_step(directory: str | os.PathLike) -> int | None:
  """The latest finalised step in `directory` (None: none, or no such folder), read-only."""
  steps = all_steps(directory)
  return steps[-1] if steps else None


def _state_metadata(manager: ocp.CheckpointManager, directory: str, step: int) -> PyTree:
  """The stored state's tree of array metadata; a step without it is damaged."""
  stored = _reading(directory, step, lambda: manager.item_metadata(step)[_STATE])
  if stored is None or not jax.tree_util.tree_leaves(stored):
    raise DamagedCheckpoint(directory, step, f"its {_STATE} has no metadata (missing or "
                            "unreadable _METADATA)")
  return stored


def _read_sums(directory: str, step: int, item: str, path: epath.Path) -> dict[str, list]:
  """The listing of an item's sum file; one that is not what `write_sums` wrote is damage."""
  def damaged(why: str) -> DamagedCheckpoint:
    return DamagedCheckpoint(directory, step, f"{item}/{SUMS_FILE} is damaged ({why})")
  try:
    sums = json.loads(path.read_bytes().decode())
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
    raise damaged(f"{type(error).__name__}: {error}") from None
  files = sums.get("files") if isinstance(sums, dict) else None
  if (not isinstance(files, dict) or sums.get("format") != _SUMS_FORMAT
      or sums.get("algorithm") != _ALGORITHM):
    raise damaged("not a sum file of this format")
  if sums.get("sum") != _sums_digest(files):
    raise damaged("its own sum differs")
  if not all(isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)
             and isinstance(v[1], str) for v in files.values()):
    raise damaged("not a sum file of this format")
  return files


def verify_sums(directory: str | os.PathLike, step: int) -> bool:
  """Checks every file of finalised checkpoint `step` against the sums written with it:
  True where all match, False where the step has no sums (written before they existed:
  nothing to check, not damage). A changed, missing or unreadable file, or a sum file
  missing from one item while another has its own, raises DamagedCheckpoint naming the
  file and, for a changed one, both sums. A file added since is not read (a restore reads
  only what was written). Read-only; reads every byte of the step."""
  directory = _absolute(directory)
  step_dir = epath.Path(directory) / str(step)

  def check() -> bool:
    items = {item: step_dir / item for item in (_STATE, _CONFIG)}
    for item, folder in items.items():
      if not folder.is_dir():
        raise DamagedCheckpoint(directory, step, f"an item is missing: {item}")
    summed = {item: (folder / SUMS_FILE).exists() for item, folder in items.items()}
    if not any(summed.values()):
      return False
    for item, folder in items.items():
      if not summed[item]:
        raise DamagedCheckpoint(directory, step, f"{item}/{SUMS_FILE} is missing")
      for rel, (size, expected) in _read_sums(directory, step, item,
                                              folder / SUMS_FILE).items():
        found_size, found = _file_sum(folder / rel)
        if (found_size, found) != (size, expected):
          raise DamagedCheckpoint(directory, step, (
              f"{item}/{rel}: {_ALGORITHM} {expected} expected, {found} found"
              + (f" ({size} bytes expected, {found_size} found)" if found_size != size
                 else "")))
    return True
  return _reading(directory, step, check)


def check_intact(directory: str | os.PathLike, step: int, *, verify: bool = True) -> dict:
  """Reads finalised checkpoint `step` whole (its config and every array, onto the host,
  as the checkpoint stores them) and returns its config: a step that does not restore
  completely raises DamagedCheckpoint before anything depends on it. With `verify`, its
  sums are checked first (`verify_sums`; False: the caller did). Read-only, and through
  Orbax's item handlers rather than a manager, which would wait for the other processes
  at its barriers: one process reads alone and decides for all."""
  directory = _absolute(directory)
  if verify:
    verify_sums(directory, step)
  step_dir = epath.Path(directory) / str(step)
  state, config = SummedStandardHandler(), SummedJsonHandler()

  def read() -> dict:
    for item in (_STATE, _CONFIG):
      if not (step_dir / item).is_dir():
        raise KeyError(item)  # Sorted as "an item is missing", as Orbax's own.
    stored = state.metadata(step_dir / _STATE)
    if stored is None or not jax.tree_util.tree_leaves(stored):
      raise DamagedCheckpoint(directory, step, f"its {_STATE} has no metadata (missing or "
                              "unreadable _METADATA)")
    target = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), stored)
    state.restore(step_dir / _STATE, args=_StateRestore(target))
    return dict(config.restore(step_dir / _CONFIG, args=_ConfigRestore()))
  try:
    return _reading(directory, step, read)
  finally:
    state.close()
    config.close()


def set_aside(directory: str | os.PathLike, step: int) -> str:
  """Renames finalised checkpoint `step` to `<step>.damaged-<UTC time>` in the same
  folder, where Orbax lists no step (and removes nothing): kept to inspect, never
  restored (in a bucket, which has no rename, a copy then a delete). Returns its new
  path."""
  source = epath.Path(_absolute(directory)) / str(step)
  target = source.parent / f"{step}.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
  source.rename(target)
  return os.fspath(target)


def restore_config(directory: str | os.PathLike, step: int | None = None) -> dict:
  """The config saved at `step` (the latest when None), without touching the state.

  Read-only: safe while another process is writing checkpoints into `directory`.
  """
  directory = _absolute(directory)
  if not epath.Path(directory).is_dir():
    raise FileNotFoundError(f"No checkpoint directory {directory}.")
  manager = _manager(directory, read_only=True)
  try:
    steps = sorted(manager.all_steps())
    if not steps:
      raise FileNotFoundError(f"No finalised checkpoint in {directory}.")
    if step is None:
      step = steps[-1]
    elif _check_step(step) not in steps:
      raise FileNotFoundError(
          f"No checkpoint for step {step} in {directory}; it holds steps {steps}.")
    restored = _reading(directory, step, lambda: manager.restore(
        step, args=ocp.args.Composite(**{_CONFIG: _ConfigRestore()})))
    return dict(restored[_CONFIG])
  finally:
    manager.close()
