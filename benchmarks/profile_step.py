"""Where a training chunk's time goes, op by op (jax profiler), as a Markdown table.

    python benchmarks/profile_step.py --scale quick --members 1 --steps 16
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=-reduce \
        python benchmarks/profile_step.py --scale quick --members 1 --steps 16
    python benchmarks/profile_step.py --scale paper --members 1 --steps 2

Compiles `run.py`'s chunk (the Boolean GOTU 2Parity group, mask scheme), runs it once to
warm up, times one chunk, then traces one more with `jax.profiler.trace` and sums the
executed XLA ops of the trace by kind: YNNPACK fusions (matmuls and what XLA fused into
them), plain dots, and XLA's own loop fusions by their root ops. The top ops are listed
with the jax operation they came from (HLO metadata), which is what points at a fix.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time

import jax

import run as bench  # benchmarks/run.py (puts the repository on sys.path).

OP = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) [\w-]+\(')
OP_NAME = re.compile(r'op_name="([^"]*)"')


def hlo_ops(compiled) -> dict[str, tuple[str, str]]:
  """Instruction name → (shape, jax op_name) of the compiled entry and bodies."""
  ops = {}
  for line in compiled.as_text().splitlines():
    m = OP.match(line)
    if m:
      source = OP_NAME.search(line)
      ops[m.group(1)] = (m.group(2), source.group(1) if source else "")
  return ops


def traced_op_seconds(trace_dir: str, ops) -> collections.Counter:
  """Seconds per executed HLO instruction in a profiler trace."""
  [path] = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
  seconds = collections.Counter()
  for event in json.load(gzip.open(path))["traceEvents"]:
    if event.get("ph") == "X" and event.get("name") in ops:
      seconds[event["name"]] += event["dur"] / 1e6
  return seconds


def kind(name: str) -> str:
  return re.sub(r"\.\d+$", "", name)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scale", choices=tuple(bench.STEPS), default="quick")
  parser.add_argument("--members", type=int, default=1)
  parser.add_argument("--steps", type=int, default=8)
  parser.add_argument("--top", type=int, default=12)
  args = parser.parse_args(argv)
  chunk, state, hparams, data, _ = bench.compiled_chunk(args.scale, args.members,
                                                         args.steps)
  ops = hlo_ops(chunk)
  state, loss = chunk(state, hparams, data)
  jax.block_until_ready(loss)
  start = time.perf_counter()
  state, loss = chunk(state, hparams, data)
  jax.block_until_ready(loss)
  wall = time.perf_counter() - start
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      state, loss = chunk(state, hparams, data)
      jax.block_until_ready(loss)
    seconds = traced_op_seconds(trace_dir, ops)

  member_steps = args.members * args.steps
  total = sum(seconds.values())
  by_kind = collections.Counter()
  for name, s in seconds.items():
    by_kind[kind(name)] += s
  print(f"`python benchmarks/profile_step.py {' '.join(argv or sys.argv[1:])}`; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}\n")
  print(f"{args.scale} scale, K = {args.members}, {args.steps} steps: chunk {wall:.3f} s "
        f"untraced ({wall / member_steps * 1e3:.2f} ms per member-step); op time in the "
        f"traced chunk {total:.3f} s (ops overlap on several threads, and tracing slows "
        "them: read the shares)\n")
  print("| op kind | ms per member-step | share |\n|---|---|---|")
  for name, s in by_kind.most_common(args.top):
    print(f"| {name} | {s / member_steps * 1e3:.3f} | {s / total:.1%} |")
  print("\n| op | shape | from | ms per member-step |\n|---|---|---|---|")
  for name, s in seconds.most_common(args.top):
    shape, op_name = ops[name]
    source = "/".join(op_name.split("/")[-3:])
    print(f"| {name} | `{shape}` | {source} | {s / member_steps * 1e3:.3f} |")


if __name__ == "__main__":
  main()
