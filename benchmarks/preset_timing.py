"""The Boolean GOTU preset end to end against a time budget, with the chip's matmul rate.

    python benchmarks/preset_timing.py --preset paper --budget-s 540      # on the GPU machine
    python benchmarks/preset_timing.py --preset paper --budget-s 540 --set compute_dtype=bfloat16
    python benchmarks/preset_timing.py --preset tiny --budget-s 120 --matmul-size 1024  # CPU dry run

What the performance issue's GPU target asks for, in one process: the float32 (default
precision: TF32 on NVIDIA tensor cores) and bfloat16 rates of an n³ `jnp.dot`, then
`mpx run boolean_gotu --preset P` in-process, timed from the first group's init to the last
report. At `--budget-s` the run gets SIGTERM: it finishes its chunk, checkpoints and stops
(`--resume` continues it), and this script reports how far it got. Achieved FLOP/s =
member-steps trained × the model's matmul FLOPs per member-step
(`mpx.sweep.flops.transformer_matmul_flops`) / wall time, so init, compilation and evaluation count
against it; XLA's count (cost analysis of the compiled chunk) is printed beside it, marked
where the two differ by more than 2×.
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp

import run as bench  # benchmarks/run.py (puts the repository on sys.path).
from mpx import report  # noqa: E402
from mpx.sweep import config as config_lib  # noqa: E402
from mpx.sweep import flops  # noqa: E402
from mpx.sweep import run as run_lib  # noqa: E402
from mpx.tasks import boolean  # noqa: E402

TARGET_S = 600  # The issue: the whole paper preset in under 10 minutes on one H200.


def progress(run_dir: pathlib.Path) -> dict[str, tuple[int, int]]:
  """Group → (members, steps checkpointed). Members come from the step-0 evaluation."""
  members = collections.defaultdict(set)
  if (run_dir / report.METRICS_FILE).exists():
    for r in report.read_metrics(run_dir):
      members[r["group"]].add(r["member"])
  steps = run_lib.completed_steps(run_dir / "checkpoints")
  return {g: (len(members[g]), steps.get(g, 0)) for g in sorted(set(members) | set(steps))}


def model_gflop(cfg, group: str) -> float:
  """The model's matmul GFLOP per member-step of a group (a task) of the run's config."""
  return flops.transformer_matmul_flops(cfg, boolean.get_task(group).n_bits + 1) / 1e9


def flops_line(preset: str, cfg) -> str:
  """The model's GFLOP per member-step (what the achieved rate divides) and XLA's count of
  the preset's compiled 2Parity chunk beside it, marked where they disagree."""
  chunk = bench.compiled_chunk(preset, 1, 1)[0]
  xla = bench.chunk_timing.xla_flops(chunk) / 1e9
  model = model_gflop(cfg, "2parity")
  mark = bench.chunk_timing.flops_mark(model, xla)
  return (f"{model:.4g} GFLOP per member-step (the model's matmuls); XLA's cost analysis "
          f"{xla:.4g}{f' {mark}' if mark else ''}")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="paper")
  parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
  parser.add_argument("--budget-s", type=float, default=540.0)
  parser.add_argument("--matmul-size", type=int, default=8192)
  parser.add_argument("--out", default="runs/preset_timing")
  args = parser.parse_args(argv)

  print(f"jax {jax.__version__}, devices: {', '.join(str(d) for d in jax.devices())}; "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}", flush=True)
  peak = lambda dtype: bench.chunk_timing.matmul_peak((args.matmul_size,), 5, dtype)
  rates = {name: peak(dtype)[args.matmul_size] / 1e3
           for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16))}
  print(f"matmul {args.matmul_size}³ TFLOP/s: " +
        ", ".join(f"{k} {v:.1f}" for k, v in rates.items()), flush=True)
  experiment = config_lib.load_experiment(str(bench.EXPERIMENT))
  _, cfg = config_lib.make_config(experiment, args.preset, args.set)
  print(flops_line(args.preset, cfg), flush=True)
  run_dir = pathlib.Path(args.out)
  timer = threading.Timer(args.budget_s, os.kill, (os.getpid(), signal.SIGTERM))
  start = time.perf_counter()
  timer.start()
  try:
    run_lib.run_experiment(experiment, preset=args.preset, overrides=args.set,
                           out_dir=str(run_dir), resume=False)
    finished = True
  except run_lib.Preempted as e:
    print(e, flush=True)
    finished = False
  finally:
    timer.cancel()
  wall = time.perf_counter() - start

  done = progress(run_dir)
  member_steps = sum(k * s for k, s in done.values())
  gflop = sum(k * s * model_gflop(cfg, g) for g, (k, s) in done.items())
  achieved = gflop / wall / 1e3
  print(f"\n`python benchmarks/preset_timing.py {' '.join(sys.argv[1:] if argv is None else argv)}`\n")
  print("| group | members | steps done |\n|---|---|---|")
  for g, (k, s) in done.items():
    print(f"| {g} | {k} | {s} |")
  print(f"\n- {'finished' if finished else 'stopped at the budget'} after {wall:.0f} s "
        f"(target: the whole preset in < {TARGET_S} s: "
        f"{'PASS' if finished and wall < TARGET_S else 'FAIL'})")
  print(f"- {member_steps:,} member-steps, {gflop:.4g} GFLOP of the model's matmuls / "
        f"{wall:.0f} s = {achieved:.3g} TFLOP/s end to end, " +
        ", ".join(f"{achieved / r:.0%} of the {k} matmul rate" for k, r in rates.items()))


if __name__ == "__main__":
  main()
