"""Where a training chunk's time goes, op by op (jax profiler), as a Markdown table.

    python benchmarks/profile_step.py --scale quick --members 1 --steps 16
    XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=-reduce \
        python benchmarks/profile_step.py --scale quick --members 1 --steps 16
    python benchmarks/profile_step.py --scale paper --members 1 --steps 2

Compiles `run.py`'s chunk (the Boolean GOTU 2Parity group, mask scheme), runs it once to
warm up, times one chunk, then traces one more with `jax.profiler.trace` and sums the
executed XLA ops of the trace, with how many run per step (counts hold on a loaded
machine, where times do not): first by what they do (the engine's named scopes:
NaN isolation, epoch redraw, batch gather, optimizer; then matmuls, i.e. any fusion with
a dot, reductions, copies and transposes, the rest), then by kind: YNNPACK fusions
(matmuls or reductions and what XLA fused into them), plain dots, and XLA's own loop
fusions by their root ops. The top ops are listed with the jax operation they came from
(HLO metadata), which is what points at a fix.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
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

OP = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w-]+)\(')
OP_NAME = re.compile(r'op_name="([^"]*)"')
CALLS = re.compile(r'calls=%?([\w.\-]+)')
COMPUTATION = re.compile(r'^%?([\w.\-]+) .*\{$')
# The engine's named scopes (`mpx.sweep.engine`): work around the model's own.
SCOPES = ("nan_isolation", "epoch_redraw", "batch", "optimizer")


@dataclasses.dataclass(frozen=True)
class Op:
  """One instruction of the compiled program: its shape, opcode, the jax op it came from
  (HLO metadata) and the opcodes of the computation it calls (a fusion's body)."""
  shape: str
  opcode: str
  source: str
  inner: frozenset = frozenset()


def hlo_ops(compiled) -> dict[str, Op]:
  """Instruction name → `Op`, for the compiled entry and every body."""
  lines, opcodes, computation = compiled.as_text().splitlines(), {}, None
  for line in lines:  # Each computation's opcodes, for what a fusion calls.
    head = COMPUTATION.match(line)  # Headers start at the line's start, ops indented.
    if head:
      computation = head.group(1)
    m = OP.match(line)
    if m and computation is not None:
      opcodes.setdefault(computation, set()).add(m.group(3))
  ops = {}
  for line in lines:
    m = OP.match(line)
    if m:
      source, calls = OP_NAME.search(line), CALLS.search(line)
      ops[m.group(1)] = Op(m.group(2), m.group(3), source.group(1) if source else "",
                           frozenset(opcodes.get(calls.group(1), ())) if calls else frozenset())
  return ops


def category(name: str, op: Op) -> str:
  """What an op does for the step: the engine's scopes first, then the kind of work."""
  for scope in SCOPES:  # A scope under vmap reads "vmap(optimizer)/...".
    if re.search(rf"(?:^|[/(]){scope}(?:[)/]|$)", op.source):
      return scope
  kinds = op.inner | {op.opcode}
  if kinds & {"dot", "convolution"}:
    return "matmul"
  if kinds & {"reduce", "reduce-window"}:
    return "reduction"
  if op.opcode in ("copy", "transpose") or kind(name).startswith(("copy", "transpose")):
    return "copy / transpose"
  return "elementwise and other"


def traced_ops(trace_dir: str, ops) -> tuple[collections.Counter, collections.Counter]:
  """(seconds, executions) per HLO instruction in a profiler trace."""
  [path] = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
  seconds, counts = collections.Counter(), collections.Counter()
  for event in json.load(gzip.open(path))["traceEvents"]:
    if event.get("ph") == "X" and event.get("name") in ops:
      seconds[event["name"]] += event["dur"] / 1e6
      counts[event["name"]] += 1
  return seconds, counts


def kind(name: str) -> str:
  return re.sub(r"\.\d+$", "", name)


def share_table(title: str, key, seconds, counts, steps: int, member_steps: int,
                top: int) -> list[str]:
  """Seconds and executions summed by `key(name)`: ops per step and time shares."""
  total = sum(seconds.values())
  by, runs = collections.Counter(), collections.Counter()
  for name, s in seconds.items():
    by[key(name)] += s
    runs[key(name)] += counts[name]
  lines = [f"| {title} | ops per step | ms per member-step | share |", "|---|---|---|---|"]
  for name, s in by.most_common(top):
    lines.append(f"| {name} | {runs[name] / steps:.1f} | {s / member_steps * 1e3:.3f} | "
                 f"{s / total:.1%} |")
  return lines


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
    seconds, counts = traced_ops(trace_dir, ops)

  member_steps = args.members * args.steps
  total = sum(seconds.values())
  print(f"`python benchmarks/profile_step.py {' '.join(argv or sys.argv[1:])}`; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}\n")
  print(f"{args.scale} scale, K = {args.members}, {args.steps} steps: chunk {wall:.3f} s "
        f"untraced ({wall / member_steps * 1e3:.2f} ms per member-step); op time in the "
        f"traced chunk {total:.3f} s (ops overlap on several threads, and tracing slows "
        "them: read the shares)\n")
  print("\n".join(share_table("what it does", lambda n: category(n, ops[n]), seconds,
                              counts, args.steps, member_steps, args.top)) + "\n")
  print("\n".join(share_table("op kind", kind, seconds, counts, args.steps, member_steps,
                              args.top)))
  print("\n| op | shape | from | ms per member-step |\n|---|---|---|---|")
  for name, s in seconds.most_common(args.top):
    source = "/".join(ops[name].source.split("/")[-3:])
    print(f"| {name} | `{ops[name].shape}` | {source} | {s / member_steps * 1e3:.3f} |")


if __name__ == "__main__":
  main()
