"""Where a training chunk's time goes, op by op (jax profiler), as Markdown tables.

    python benchmarks/profile_step.py --scale quick --members 1 --steps 16
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=-reduce \
        python benchmarks/profile_step.py --scale quick --members 1 --steps 16
    python benchmarks/profile_step.py --scale paper --members 1 --steps 2

Compiles `run.py`'s chunk (the Boolean GOTU 2Parity group, mask scheme), runs it once to
warm up, times one chunk, then traces one more with `jax.profiler.trace` and splits the
traced span by kind with `xla_trace.py` (the accelerator check's profile stage does the
same on a GPU): matmuls (dots and the fusions that hold one, YNNPACK's included),
mpx's attention core, copies and transposes, XLA's other fusions by their root op, the
gaps between ops and where ops overlap (several threads). A second table sorts the same
ops by what they do for the step, with how many run per step (counts hold on a loaded
machine, where times do not): the engine's named scopes (NaN isolation, epoch redraw,
batch gather, optimizer) first, the rest by that kind. The top ops are listed with the
jax operation they came from (HLO metadata), which is what points at a fix.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import time

import jax

import run as bench  # benchmarks/run.py (puts the repository on sys.path).
import xla_trace

# The engine's named scopes (`mpx.sweep.engine`): its own work around the model's.
SCOPES = ("nan_isolation", "epoch_redraw", "batch", "optimizer")


def what_it_does(instruction: xla_trace.Instruction | None) -> str:
  """An op's part of the step: the engine scope it lies in (under vmap the name stack
  reads "vmap(optimizer)/..."), else its kind (`xla_trace.classify`)."""
  if instruction is None:
    return "no HLO instruction of the program"
  for scope in SCOPES:
    if re.search(rf"(?:^|[/(]){scope}(?:[)/]|$)", instruction.op_name):
      return scope
  return instruction.kind


def scope_rows(result: xla_trace.Profile, steps: int, member_steps: int) -> list[dict]:
  """Own time and executions by `what_it_does`, largest first: ops per step, ms per
  member-step and the share of the span."""
  seconds, runs = collections.Counter(), collections.Counter()
  for t, count, _, instruction in result.ops:
    seconds[what_it_does(instruction)] += t
    runs[what_it_does(instruction)] += count
  return [{"what it does": k, "ops per step": f"{runs[k] / steps:.1f}",
           "ms": t / 1e3 / member_steps, "share": t / result.span}
          for k, t in seconds.most_common()]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scale", choices=tuple(bench.STEPS), default="quick")
  parser.add_argument("--members", type=int, default=1)
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--top", type=int, default=12)
  args = parser.parse_args(argv)
  chunk, state, hparams, data, _ = bench.compiled_chunk(args.scale, args.members,
                                                         args.steps)
  state, loss = chunk(state, hparams, data)
  jax.block_until_ready(loss)
  start = time.perf_counter()
  state, loss = chunk(state, hparams, data)
  jax.block_until_ready(loss)
  wall = time.perf_counter() - start
  with tempfile.TemporaryDirectory() as trace_dir:
    result, state, traced = xla_trace.trace_chunk(chunk, state, hparams, data, trace_dir)

  member_steps = args.members * args.steps
  print(f"`python benchmarks/profile_step.py {' '.join(argv or sys.argv[1:])}`; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}\n")
  print(f"{args.scale} scale, K = {args.members}, {args.steps} steps: chunk {wall:.3f} s "
        f"untraced ({wall / member_steps * 1e3:.2f} ms per member-step), {traced:.3f} s "
        f"traced; the traced ops span {result.span / 1e6:.3f} s (tracing slows them: read "
        "the shares)\n")
  headers = {"ms": "ms per member-step", "share": "share of the span"}
  print("\n".join(xla_trace.markdown(
      ["kind", "ms", "share"], xla_trace.kind_rows(result, member_steps), headers)) + "\n")
  print("\n".join(xla_trace.markdown(
      ["what it does", "ops per step", "ms", "share"],
      scope_rows(result, args.steps, member_steps), headers)) + "\n")
  print("\n".join(xla_trace.markdown(
      ["op", "kind", "shape", "from", "calls", "ms", "share"],
      xla_trace.op_rows(result, member_steps, args.top), headers)))


if __name__ == "__main__":
  main()
