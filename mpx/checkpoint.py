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

A SIGTERM handler should set a flag that the training loop checks between chunks, not
call `save` itself: a signal arriving during a save would otherwise start a second one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import time
from typing import Any, Callable

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

  def __init__(self, directory: str, step: int, cause: str):
    path = os.path.join(directory, str(step))  # os.path.join keeps a gs:// URL whole.
    super().__init__(f"checkpoint step {step} in {directory} does not restore: {cause}",
                     path=path, cause=cause)
    self.directory, self.step = directory, step


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


def _damage_cause(error: BaseException) -> str | None:
  """Why a finalised step's bytes do not restore, or None where `error` is no damage: a
  file of it missing, undecodable (bad UTF-8, JSON), a tensorstore read saying so, or an
  I/O error reading it."""
  if isinstance(error, (UnicodeDecodeError, json.JSONDecodeError)):
    return f"{type(error).__name__}: {error}"
  if isinstance(error, KeyError):  # Orbax: an item folder of the step is missing.
    return f"an item is missing: {error.args[0] if error.args else error}"
  if isinstance(error, FileNotFoundError):
    return f"a file is missing: {error.filename or error}"
  if isinstance(error, OSError) and error.errno == errno.EIO:
    return storage_cause(error)
  if _status(error) in _DAMAGE_STATUS or "[os_error_code='5']" in str(error):
    return storage_cause(error)
  return None


def _reading(directory: str, step: int, read: Callable[[], Any]) -> Any:
  """`read()` of finalised `step`, its failures as DamagedCheckpoint (the step's bytes)
  or StorageError (the storage); any other error is raised as it is."""
  try:
    return read()
  except Exception as error:  # Orbax and tensorstore raise many types: sorted here.
    damage = _damage_cause(error)
    if damage is not None:  # Its files named within the step's folder.
      damage = damage.replace(os.path.join(directory, str(step), ""), "")
      raise DamagedCheckpoint(directory, step, damage) from error
    cause = storage_cause(error)
    if cause is None:
      raise
    raise StorageError(f"reading checkpoint step {step} in {directory} failed: {cause}",
                       path=os.path.join(directory, str(step)), cause=cause) from error


def _item_handlers() -> dict[str, Any]:
  return {_STATE: ocp.StandardCheckpointHandler(), _CONFIG: ocp.JsonCheckpointHandler()}


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
    try:
      self._manager.save(step, args=ocp.args.Composite(
          **{_STATE: ocp.args.StandardSave(state), _CONFIG: ocp.args.JsonSave(config)}),
                         force=True)
      self._manager.wait_until_finished()
    except Exception as error:  # Orbax and tensorstore raise many types: sorted here.
      cause = storage_cause(error)
      if cause is None:
        raise
      self._failed = True
      path = os.path.join(self.directory, str(step))
      raise StorageError(f"writing checkpoint step {step} to {path} failed: {cause}",
                         path=path, cause=cause) from error

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
            **{_STATE: ocp.args.StandardRestore(jax.tree.map(_restore_target, target)),
               _CONFIG: ocp.args.JsonRestore()})))
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


def check_intact(directory: str | os.PathLike, step: int) -> dict:
  """Reads finalised checkpoint `step` whole (its config and every array, onto the host,
  as the checkpoint stores them) and returns its config: a step that does not restore
  completely raises DamagedCheckpoint before anything depends on it. Read-only."""
  directory = _absolute(directory)
  manager = _manager(directory, read_only=True)
  try:
    stored = _state_metadata(manager, directory, step)
    target = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), stored)
    restored = _reading(directory, step, lambda: manager.restore(step, args=ocp.args.Composite(
        **{_STATE: ocp.args.StandardRestore(target), _CONFIG: ocp.args.JsonRestore()})))
    return dict(restored[_CONFIG])
  finally:
    manager.close()


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
        step, args=ocp.args.Composite(**{_CONFIG: ocp.args.JsonRestore()})))
    return dict(restored[_CONFIG])
  finally:
    manager.close()
