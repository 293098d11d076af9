"""Compiling and timing one training chunk, and what a report states beside it (the matmul
peak, the host's free memory, a table cell): shared by `run.py`, the accelerator check and
the other benchmarks, so that they all measure and print alike. Importing it applies
mpx's per-CPU XLA flags (`mpx.sweep.cpu_flags`), so import it before any jax computation."""

from __future__ import annotations

import pathlib
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from mpx.sweep import cpu_flags, engine

# mpx's XLA flags for this kind of CPU, as `mpx run` adds them, before jax starts its
# backend (XLA reads them then): every benchmark measures what a run runs.
CPU_FLAGS_ADDED = cpu_flags.apply()


def compile_chunk(group: engine.Group, steps: int, data=None):
  """K members × `steps` steps compiled, with its inputs: `(chunk, state, hparams, data,
  compile seconds)`; `data` replaces the group's (e.g. a stream's batches, placed)."""
  state, hparams, group_data = engine.place(group, engine.init_state(group), None)
  data = group_data if data is None else data
  chunk, seconds = compile_timed(group, steps, state, hparams, data)
  return chunk, state, hparams, data, seconds


def compile_timed(group: engine.Group, steps: int, state, hparams, data):
  """`(chunk, compile seconds)`: the group's chunk of `steps` steps compiled for inputs
  already placed (e.g. a state initialised once and reused)."""
  start = time.perf_counter()
  chunk = engine.make_train_chunk(group, steps).lower(state, hparams, data).compile()
  return chunk, time.perf_counter() - start


def time_chunk(chunk, state, hparams, data, repeats: int) -> float:
  """Seconds for `repeats` chunks after one warm-up chunk (the loss checked finite)."""
  state, out = chunk(state, hparams, data)
  jax.block_until_ready(out)
  start = time.perf_counter()
  for _ in range(repeats):
    state, out = chunk(state, hparams, data)
  jax.block_until_ready(out)
  seconds = time.perf_counter() - start
  assert np.all(np.isfinite(np.asarray(out["train_loss"]))), "non-finite loss"
  return seconds


def xla_flops(compiled) -> float:
  """FLOPs of a compiled program; `cost_analysis()` is a dict or a list of dicts."""
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    return float(sum(c.get("flops", 0.0) for c in cost))
  return float(cost.get("flops", 0.0))


FLOPS_DISAGREE = 2.0  # XLA's count outside [1/2, 2]× the model's: the row is marked.


def flops_mark(model_flops: float, xla_flops: float | None) -> str:
  """The mark of a row whose XLA FLOP count disagrees with the model's by more than
  FLOPS_DISAGREE×, e.g. "⚠ XLA counts 0.20× the model's FLOPs"; "" where they agree."""
  if not xla_flops or not model_flops:
    return ""
  ratio = xla_flops / model_flops
  if 1 / FLOPS_DISAGREE <= ratio <= FLOPS_DISAGREE:
    return ""
  return f"⚠ XLA counts {ratio:.2f}× the model's FLOPs"


def matmul_peak(sizes: tuple[int, ...], repeats: int,
                dtype=jnp.float32) -> dict[int, float]:
  """GFLOP/s of a jitted n³ `jnp.dot` (default precision), best of `repeats`, per size."""
  peaks = {}
  for n in sizes:
    a, b = (jax.random.normal(jax.random.key(i), (n, n), dtype) for i in (0, 1))
    dot = jax.jit(jnp.dot)
    jax.block_until_ready(dot(a, b))
    best = float("inf")
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(dot(a, b))
      best = min(best, time.perf_counter() - start)
    peaks[n] = 2 * n ** 3 / best / 1e9
  return peaks


def host_memory_available() -> int | None:
  """Bytes the host can still allocate (MemAvailable of /proc/meminfo); None where unknown:
  what a program compiled for the CPU is checked against before it runs."""
  try:
    match = re.search(r"^MemAvailable:\s+(\d+) kB", pathlib.Path("/proc/meminfo").read_text(),
                      re.M)
  except OSError:
    match = None
  return int(match.group(1)) * 1024 if match else None


def fmt(value, spec: str, missing: str = "–") -> str:
  """A table cell: `value` formatted, `missing` where there is none."""
  return missing if value is None else format(value, spec)
