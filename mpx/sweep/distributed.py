"""Many processes, one sweep: JAX's multi-controller runtime, nothing home-made.

Every process runs the same program on its own devices; the member axis is sharded over
`jax.devices()` (all processes' devices), each process builds only the members whose rows
its devices hold, and host reads of member-sharded values go through `to_host` (an
all-gather across processes). Process 0 alone writes files and prints progress.

`initialize` must run before any other JAX call: `mpx run --distributed` (or
`MPX_DISTRIBUTED=1`) calls it first. With `MPX_COORDINATOR=host:port`,
`MPX_NUM_PROCESSES=N` and `MPX_PROCESS_ID=i` the cluster is explicit (`launch/local.sh`
sets them); otherwise JAX detects it (Cloud TPU VMs, SLURM).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np

ENV_FLAG = "MPX_DISTRIBUTED"
EXPLICIT = ("MPX_COORDINATOR", "MPX_NUM_PROCESSES", "MPX_PROCESS_ID")


def requested(flag: bool = False) -> bool:
  """Whether to start jax.distributed: `--distributed` or MPX_DISTRIBUTED=1."""
  return flag or os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true", "yes")


def initialize() -> None:
  """`jax.distributed.initialize` from the MPX_* variables, or JAX's auto-detection. On
  CPU the cross-process collectives go through gloo."""
  given = [name for name in EXPLICIT if os.environ.get(name)]
  if given and len(given) != len(EXPLICIT):
    missing = sorted(set(EXPLICIT) - set(given))
    raise ValueError(f"{', '.join(given)} set but {', '.join(missing)} not: set all three "
                     "(e.g. MPX_COORDINATOR=localhost:12355 MPX_NUM_PROCESSES=2 "
                     "MPX_PROCESS_ID=0), or none to let JAX detect the cluster.")
  if os.environ.get("JAX_PLATFORMS", "").strip() == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if given:
    jax.distributed.initialize(os.environ["MPX_COORDINATOR"],
                               num_processes=int(os.environ["MPX_NUM_PROCESSES"]),
                               process_id=int(os.environ["MPX_PROCESS_ID"]))
  else:
    jax.distributed.initialize()


def is_primary() -> bool:
  """Process 0: the one that writes files and prints."""
  return jax.process_index() == 0


def to_host(tree: Any) -> Any:
  """Numpy copies of every leaf, member-sharded arrays gathered from all processes (a
  collective: every process must call it at the same point)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils

  def gather(leaf):
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
    return np.asarray(leaf)
  return jax.tree_util.tree_map(gather, tree)


def any_process(flag: bool) -> bool:
  """True on every process if it is True on any (e.g. a SIGTERM one host saw), so all
  enter the collective checkpoint save together."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils
  return bool(np.any(multihost_utils.process_allgather(np.asarray([flag]))))


def from_primary(value: Any) -> Any:
  """Process 0's `value` (JSON-serialisable) on every process (a collective: every
  process must call it at the same point): one decision for all, where each process
  could see the storage differently."""
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils
  data = json.dumps(value).encode() if is_primary() else b""
  size = int(multihost_utils.broadcast_one_to_all(np.asarray(len(data), np.int32)))
  padded = np.zeros(size, np.uint8)
  padded[:len(data)] = np.frombuffer(data, np.uint8)
  return json.loads(bytes(np.asarray(multihost_utils.broadcast_one_to_all(padded))))


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier `name` (no-op on one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)
