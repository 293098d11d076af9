"""A group's data: training arrays on device or a host stream, and the evaluation set.

`DeviceData` suits data that fits on the accelerator (the Boolean cube, arithmetic
problems): batches are drawn inside the compiled step, so chunking and resuming cannot
change them. `Stream` suits data that does not (images from a tf.data or grain pipeline):
a host iterator feeds each chunk's `[T, B, ...]` batches (`[T, S, B, ...]` with one stream
per member seed), prepared by a background thread while the device trains on the
previous chunk.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any, Callable, Iterator, Mapping, Sequence

import jax
import numpy as np

SAMPLING = ("iid", "epoch")


@dataclasses.dataclass(frozen=True)
class DeviceData:
  """Training arrays sampled on device from `fold_in(member_key, step)`.

  arrays: `[P, ...]` shared by every member (one copy per device), or `[K, P, ...]` with
    `per_member=True` when each member trains on its own sample (e.g. its seed's subset).
  sampling: "iid" (uniform with replacement) or "epoch" (a fresh permutation per epoch,
    batches in order, the last partial batch dropped).
  """
  arrays: Mapping[str, Any]
  per_member: bool = False
  sampling: str = "iid"

  def __post_init__(self):
    if self.sampling not in SAMPLING:
      raise ValueError(f"sampling={self.sampling!r}; choose one of {SAMPLING}.")
    if not self.arrays:
      raise ValueError("DeviceData has no arrays; give {name: array} with at least one.")
    axis = 1 if self.per_member else 0
    sizes = {k: np.shape(v)[:axis + 1] for k, v in self.arrays.items()}
    if any(len(s) <= axis for s in sizes.values()) or len(set(sizes.values())) != 1:
      layout = "[K, P, ...]" if self.per_member else "[P, ...]"
      raise ValueError(f"DeviceData arrays must be {layout} with one P"
                       f"{' and one K' if self.per_member else ''}; got leading shapes "
                       f"{sizes}.")

  @property
  def num_examples(self) -> int:
    return np.shape(next(iter(self.arrays.values())))[1 if self.per_member else 0]

  def check(self, num_members: int, batch_size: int) -> None:
    """Raises if the arrays cannot serve `num_members` members at this batch size."""
    if self.per_member and np.shape(next(iter(self.arrays.values())))[0] != num_members:
      raise ValueError(f"per-member DeviceData must have K={num_members} rows, one per "
                       f"member; got {np.shape(next(iter(self.arrays.values())))[0]}.")
    if batch_size > self.num_examples:
      raise ValueError(f"batch_size {batch_size} exceeds the {self.num_examples} training "
                       "examples.")


@dataclasses.dataclass(frozen=True)
class Stream:
  """Host batches: `batches(seed, start_step)` yields the batch of step `start_step`,
  then of each following step, as `{name: [B, ...]}` numpy arrays.

  seed: the one stream every member shares (chunks `[T, B, ...]`).
  seeds: instead, one stream per member seed, `batches(s, step)` for each s in `seeds`;
    a member reads its own seed's stream, so the schemes of a seed stay paired on the
    same batches while the seeds see independent ones (chunks `[T, S, B, ...]`, the
    member's row gathered on device; S = 1 is the shared layout). Every member's seed
    must be in `seeds`.

  Resume guarantee: a resumed run calls `batches(seed, step)` at the checkpoint's step,
  so it is bit-exact exactly when the iterator is a function of (seed, step) — e.g. a
  pipeline whose shuffle is seeded per epoch and skips to the step's position. An
  iterator with its own hidden state (an unseeded shuffle buffer) resumes on different
  batches; nothing here can detect that.
  """
  batches: Callable[[int, int], Iterator[Mapping[str, np.ndarray]]]
  seed: int = 0
  prefetch: int = 2  # chunks prepared ahead of the device
  seeds: tuple[int, ...] | None = None

  def __post_init__(self):
    if self.seeds is not None:
      seeds = tuple(int(s) for s in self.seeds)
      if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"Stream seeds={self.seeds} must be distinct and not empty; give "
                         "each member seed once (or seed=… for one shared stream).")
      object.__setattr__(self, "seeds", seeds)

  @property
  def stream_seeds(self) -> tuple[int, ...]:
    """The seed of each stream, in the order of a chunk's S axis."""
    return (self.seed,) if self.seeds is None else self.seeds

  @property
  def num_streams(self) -> int:
    """S: the chunk holds S batches per step (1: the shared `[T, B, ...]` layout)."""
    return len(self.stream_seeds)

  @property
  def stacked(self) -> bool:
    """Whether chunks carry the stream axis S (more than one stream)."""
    return self.num_streams > 1

  def stream_of(self, member_seeds: Sequence[int]) -> tuple[int, ...]:
    """The stream (S index) each member reads, from the members' seeds."""
    if self.seeds is None:
      return (0,) * len(member_seeds)
    missing = sorted(set(member_seeds) - set(self.seeds))
    if missing:
      raise ValueError(f"members of seeds {missing} have no stream; give the Stream every "
                       f"member seed: seeds={tuple(sorted(set(member_seeds)))}.")
    return tuple(self.seeds.index(s) for s in member_seeds)


@dataclasses.dataclass(frozen=True)
class EvalData:
  """A finite evaluation set `{name: [E, ...]}` (host arrays), fed in batches of
  `batch_size`; the last batch is padded and the padding dropped."""
  arrays: Mapping[str, np.ndarray]
  batch_size: int

  def __post_init__(self):
    sizes = {k: np.shape(v)[0] for k, v in self.arrays.items()}
    if not sizes or len(set(sizes.values())) != 1 or not next(iter(sizes.values())):
      raise ValueError(f"EvalData arrays must be [E, ...] with one E > 0; got {sizes}.")
    if self.batch_size < 1:
      raise ValueError(f"EvalData batch_size={self.batch_size} must be >= 1.")

  @property
  def size(self) -> int:
    return np.shape(next(iter(self.arrays.values())))[0]

  def batches(self) -> Iterator[dict[str, np.ndarray]]:
    """Batches of exactly `batch_size` (one compiled shape); the last one padded."""
    n = self.size
    padded = -(-n // self.batch_size) * self.batch_size
    index = np.minimum(np.arange(padded), n - 1)
    for i in range(0, padded, self.batch_size):
      yield {k: np.asarray(v)[index[i:i + self.batch_size]] for k, v in self.arrays.items()}


class ChunkFeeder:
  """Stacks a stream's batches into chunks `{name: [T, B, ...]}` (`[T, S, B, ...]` when
  `stream.stacked`: the step axis leads, so the scan slices a step without a transpose) on
  a background thread, `stream.prefetch` chunks ahead, placed with `put` (e.g. replicated
  over the mesh: every device holds every stream, whichever members it trains).

  The chunk holding the last step is padded by repeating its last batch: the engine
  treats steps past the end as no-ops. An exception in the thread is raised by `next`.
  """

  def __init__(self, stream: Stream, start_step: int, total_steps: int, chunk_steps: int,
               put: Callable = jax.device_put):
    self._queue: queue.Queue = queue.Queue(maxsize=max(1, stream.prefetch))
    self._stop = threading.Event()
    self._thread = threading.Thread(
        target=self._fill, args=(stream, start_step, total_steps, chunk_steps, put),
        daemon=True)
    self._thread.start()

  def _fill(self, stream, start_step, total_steps, chunk_steps, put):
    try:
      iterators = {seed: iter(stream.batches(seed, start_step))
                   for seed in stream.stream_seeds}
      for first in range(start_step, total_steps, chunk_steps):
        real = min(chunk_steps, total_steps - first)
        chunk = _read_chunk(iterators, first, real, chunk_steps, total_steps,
                            stream.stacked)
        if not self._put(put(chunk)):
          return
    except BaseException as error:  # Raised in the training thread by `next`.
      self._put(error)

  def _put(self, item) -> bool:
    while not self._stop.is_set():
      try:
        self._queue.put(item, timeout=0.1)
        return True
      except queue.Full:
        continue
    return False

  def next(self) -> dict:
    """The next chunk, in order; re-raises an error of the filling thread here."""
    item = self._queue.get()
    if isinstance(item, BaseException):
      raise item
    return item

  def close(self) -> None:
    """Stops the filling thread (call it in a `finally`)."""
    self._stop.set()
    self._thread.join(timeout=5)


def _read_chunk(iterators: Mapping[int, Iterator], first: int, real: int, chunk_steps: int,
                total_steps: int, stacked: bool) -> dict[str, np.ndarray]:
  """Steps `first … first + real − 1` of every stream, written once into the chunk's
  arrays `[chunk_steps, (S,) B, ...]` (no intermediate stack); padding repeats the last."""
  chunk_TSB: dict[str, np.ndarray] = {}
  for t, step in enumerate(range(first, first + real)):
    for s, (seed, iterator) in enumerate(iterators.items()):
      batch = next(iterator, None)
      if batch is None:
        raise ValueError(f"the stream ended at step {step}, before the group's "
                         f"{total_steps} steps (seed {seed}); make it yield at least that "
                         "many batches (e.g. repeat its epochs).")
      if not chunk_TSB:
        lead = (chunk_steps, len(iterators)) if stacked else (chunk_steps,)
        chunk_TSB = {k: np.empty(lead + np.shape(v), np.asarray(v).dtype)
                     for k, v in batch.items()}
      if batch.keys() != chunk_TSB.keys():
        raise ValueError(f"the stream's batch of step {step} (seed {seed}) has keys "
                         f"{sorted(batch)}, the chunk's first {sorted(chunk_TSB)}; yield "
                         "the same names every step.")
      for k, v in batch.items():
        chunk_TSB[k][(t, s) if stacked else t] = v
  for array in chunk_TSB.values():
    array[real:] = array[real - 1]
  return chunk_TSB
