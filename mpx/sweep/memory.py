"""A group's memory plan, printed by `mpx run` before its first chunk runs, so a job can
be sized before it fails.

Device, per device: XLA's own accounting of the compiled chunk
(`Compiled.memory_analysis()`: arguments, i.e. the member states and one chunk's data,
temporaries, outputs, generated code, less the outputs written into donated arguments),
plus the stream chunks held beside it. Host: the evaluation set, the training arrays or
the chunks the feeder is filling. Not counted: the evaluation's own program and the data
pipeline's buffers.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Callable

import jax
import numpy as np

from mpx.sweep.data import Stream

# A stream's chunks a device holds at most, beyond its `prefetch` queued ones: the one the
# feeder has placed and waits to queue, and two the run loop has dispatched (the chunk
# running and the next, queued before the previous scalars are read).
FEEDER_PLACED, DISPATCHED = 1, 2
# On the host: the chunk the feeder fills while the one it placed last is still referenced.
FEEDER_HOST_CHUNKS = 2


@dataclasses.dataclass(frozen=True)
class Program:
  """XLA's memory analysis of a compiled program: bytes per device."""
  arguments: int
  temporaries: int
  outputs: int
  aliased: int  # outputs written into donated arguments, counted once
  code: int

  @property
  def total(self) -> int:
    return self.arguments + self.temporaries + self.outputs - self.aliased + self.code


@dataclasses.dataclass(frozen=True)
class Plan:
  """Bytes a group holds. `data`: the training data of one chunk on one device (a stream
  chunk, all its streams; or the device arrays); `chunks`: stream chunks a device holds
  at most (0 for device data, which the arguments hold once); `host_data`: the training
  arrays, or the chunks the feeder fills."""
  group: str
  members: int  # on one device
  members_per_call: int | None
  program: Program | None  # None: the backend gives no analysis
  data: int
  chunks: int
  eval_set: int
  host_data: int

  @property
  def device(self) -> int:
    """The program (which holds one chunk in its arguments) and the other chunks held;
    without an analysis, the data alone."""
    base = self.program.total if self.program is not None else self.data
    return base + self.data * max(self.chunks - 1, 0)

  @property
  def host(self) -> int:
    return self.eval_set + self.host_data


def program_bytes(compiled) -> Program | None:
  """The compiled program's memory analysis; None where the backend has none (it returns
  None or raises)."""
  try:
    stats = compiled.memory_analysis()
  except (NotImplementedError, RuntimeError):
    return None
  if stats is None:
    return None
  return Program(stats.argument_size_in_bytes, stats.temp_size_in_bytes,
                 stats.output_size_in_bytes, stats.alias_size_in_bytes,
                 stats.generated_code_size_in_bytes)


def _shard_shape(x) -> tuple[int, ...]:
  """What one device holds of `x`: a sharded array's shard, a replicated or host array."""
  return x.sharding.shard_shape(x.shape) if isinstance(x, jax.Array) else np.shape(x)


def device_bytes(tree: Any) -> int:
  """Bytes one device holds of `tree`'s arrays."""
  return sum(math.prod(_shard_shape(x)) * np.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(tree))


def device_chunks(prefetch: int) -> int:
  """Stream chunks a device holds at most with `prefetch` (the feeder queues at least 1)."""
  return max(1, prefetch) + FEEDER_PLACED + DISPATCHED


def plan(group, compiled, state, data) -> Plan:
  """The plan of `group` whose chunk `compiled` was compiled for `(state, ..., data)`."""
  stream = isinstance(group.data, Stream)
  data_bytes = device_bytes(data)
  return Plan(group=group.name, members=_shard_shape(state.alive)[0],
              members_per_call=group.members_per_call, program=program_bytes(compiled),
              data=data_bytes, chunks=device_chunks(group.data.prefetch) if stream else 0,
              eval_set=_host_bytes(group.eval_data.arrays),
              host_data=(FEEDER_HOST_CHUNKS * data_bytes if stream else
                         _host_bytes(group.data.arrays)))


def _host_bytes(arrays) -> int:
  return sum(np.asarray(v).nbytes for v in arrays.values())


def size(n: int) -> str:
  """Bytes in decimal units (GB = 10⁹ B, as accelerators are sold)."""
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if abs(n) >= scale:
      return f"{n / scale:.3g} {unit}"
  return f"{n} B"


def format_plan(p: Plan) -> str:
  """The plan as the lines `mpx run` prints."""
  calls = (f"{p.members_per_call} per call" if p.members_per_call else "vmapped together")
  lines = [f"memory plan, group {p.group}: {p.members} members per device, {calls}"]
  if p.program is None:
    lines.append("  compiled chunk: XLA gives no memory analysis on this backend "
                 f"({jax.default_backend()}); the device total below counts the data only")
  else:
    q = p.program
    held = (f"one slice of members_per_call={p.members_per_call} at a time"
            if p.members_per_call else
            f"all at once, ≈ {size(q.temporaries // p.members)} per member")
    lines.append(f"  compiled chunk (XLA memory_analysis): {size(q.total)} = temporaries "
                 f"{size(q.temporaries)} ({held}) + arguments {size(q.arguments)} + "
                 f"outputs {size(q.outputs)} - donated {size(q.aliased)} + code "
                 f"{size(q.code)}")
  if p.chunks:
    lines.append(f"  stream chunks: {size(p.data)} each, up to {p.chunks} held ("
                 f"{p.chunks - FEEDER_PLACED - DISPATCHED} prefetched + {FEEDER_PLACED} "
                 f"placed by the feeder + {DISPATCHED} dispatched), 1 of them in the "
                 "arguments")
  else:
    lines.append(f"  device data: {size(p.data)}, in the arguments")
  training = (f"{FEEDER_HOST_CHUNKS} chunks the feeder fills" if p.chunks else
              "training arrays")
  lines.append(f"  device total {size(p.device)}; host {size(p.host)} = evaluation set "
               f"{size(p.eval_set)} + {training} {size(p.host_data)}")
  return "\n".join(lines)


def planned(train_chunk: Callable, group, *, show: bool) -> Callable:
  """`train_chunk` (a jitted chunk) that, called first, prints the group's plan to stderr
  when `show`: compiled with the call's own arguments, so jax's cache serves the call
  (one compile)."""
  if not show:
    return train_chunk
  shown = False

  def call(state, hparams, data):
    nonlocal shown
    if not shown:
      shown = True
      compiled = train_chunk.lower(state, hparams, data).compile()
      print(format_plan(plan(group, compiled, state, data)), file=sys.stderr, flush=True)
    return train_chunk(state, hparams, data)
  return call
