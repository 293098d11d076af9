"""XLA:CPU settings that mpx's entry points run with, and the profile behind them.

jax's CPU backend hands reductions to YNNPACK fusions by default. In a training step
those are the LayerNorm backward and the mask gradient (a sum over the batch of
`[B, H, N, N]`): at the `quick` Boolean scale one such fusion took 3.4 ms of a 25 ms step
on one core (jax profiler, jax 0.10.2). With reductions left to XLA's own loop emitter
the single-member step runs 1.3–1.5× faster and the paper-scale step ≈1.1× faster
(benchmarks/README.md). Matmuls and elementwise fusions stay with YNNPACK.
"""

from __future__ import annotations

import os
from typing import MutableMapping

YNN_FUSION_FLAG = "--xla_cpu_experimental_ynn_fusion_type"
CPU_FLAGS = (f"{YNN_FUSION_FLAG}=-reduce",)


def set_cpu_flags(environ: MutableMapping[str, str] = os.environ) -> str:
  """Adds `CPU_FLAGS` to `XLA_FLAGS` unless the user already chose a YNN fusion setting;
  returns the resulting `XLA_FLAGS`.

  XLA reads the variable when jax creates its CPU client (the first computation), so
  call this before any; later calls have no effect on the running process. Harmless on
  GPU and TPU hosts: the flag only concerns the CPU backend (and is known to jax 0.10–0.12).
  """
  current = environ.get("XLA_FLAGS", "")
  if YNN_FUSION_FLAG not in current:
    environ["XLA_FLAGS"] = " ".join(filter(None, [current, *CPU_FLAGS]))
  return environ["XLA_FLAGS"]
