"""The GPU step variants compared from their compiled programs, without a GPU.

    python benchmarks/compile_variants.py                      # H100, K = 1, 16, 64: ~1 h of one core
    python benchmarks/compile_variants.py --members 1 --variants plain graphs   # a quick look

Compiles the Boolean 2Parity mask group at the paper preset (`mpx compile`'s own path:
the run's group, its member axis on one device) for each step variant (`--set
step_variant=`, and bfloat16 matmuls) and member count K, and prints per row: kernels per
step and the bytes they move per member-step (the chunk's loop body in the optimised HLO,
`aot.loop_body_stats`), fusions, temporary memory, compile time, and the roofline
estimate (`aot.GroupReport.step_seconds`). Then the plain variant on an H200 at the K of
the one measured H200 point (experiments/results/accelerator_check_h200.md: 164, 400 and
425 member-steps/s at K = 1, 16, 129), its estimate beside the measurement and their ratio.
Nothing here is a measured time.
"""

from __future__ import annotations

import argparse
import datetime
import pathlib
import subprocess
import sys

import jax

from mpx.sweep import aot
from mpx.sweep import config as config_lib

VARIANTS = {"plain": ["step_variant=plain"], "unroll2": ["step_variant=unroll2"],
            "unroll4": ["step_variant=unroll4"], "graphs": ["step_variant=graphs"],
            "bf16": ["step_variant=plain", "compute_dtype=bfloat16"]}
# The one measured H200 point: member-steps/s at K members, float32, reference attention.
MEASURED_H200 = {1: 164.0, 16: 400.4, 129: 425.3}


def compile_row(target: str, k: int, settings: list[str]) -> aot.GroupReport:
  experiment = config_lib.load_experiment("boolean_gotu")
  _, (report,) = aot.compile_experiment(
      experiment, target, preset="paper", evaluation=False,
      overrides=["tasks=2parity", "schemes=mask", f"seeds={k}", *settings])
  return report


def row(name: str, k: int, r: aot.GroupReport) -> str:
  p = r.train
  rate = k / r.step_seconds
  return (f"| {name} | {k} | {p.loop_kernels // r.unroll} | {p.fusions} | {p.custom_calls} | "
          f"{r.step_bytes[0] / k / 1e9:.3g} | {p.memory.temporaries / 1e9:.3g} | "
          f"{p.seconds:.0f} | {r.step_seconds * 1e3:.3g} | {rate:.4g} |")


HEADER = ("| variant | K | kernels per step (loop body / unroll) | fusions | custom calls | GB moved per "
          "member-step | temporaries GB | compile s | estimated ms per step | estimated "
          "member-steps/s |\n|---|---|---|---|---|---|---|---|---|---|")


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--target", default="h100:1")
  parser.add_argument("--members", type=int, nargs="+", default=[1, 16, 64])
  parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
  parser.add_argument("--no-measured", dest="measured", action="store_false",
                      help="skip the H200 rows beside the measured point")
  args = parser.parse_args(argv)
  jax.config.update("jax_platforms", "cpu")
  lines = [f"## Step variants on {args.target} (paper 2Parity mask group, training chunk of "
           "32 steps)", "", HEADER]
  print("\n".join(lines), flush=True)
  for k in args.members:
    for name in args.variants:
      lines.append(row(name, k, compile_row(args.target, k, VARIANTS[name])))
      print(lines[-1], flush=True)
  if args.measured:
    lines += ["", "## The estimate against the measured H200 point (plain, float32)", "",
              "| K | kernels per step | GB moved per member-step | estimated member-steps/s | "
              "measured member-steps/s | measured / estimated |", "|---|---|---|---|---|---|"]
    print("\n".join(lines[-4:]), flush=True)
    for k, measured in MEASURED_H200.items():
      r = compile_row("h200:1", k, VARIANTS["plain"])
      estimate = k / r.step_seconds
      lines.append(f"| {k} | {r.train.loop_kernels} | {r.step_bytes[0] / k / 1e9:.3g} | "
                   f"{estimate:.4g} | {measured} | {measured / estimate:.3g} |")
      print(lines[-1], flush=True)
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=pathlib.Path(__file__).parent).stdout.strip()
  print(f"\n`python benchmarks/compile_variants.py {' '.join(sys.argv[1:] if argv is None else argv)}`"
        f" at {commit}, {datetime.date.today()}, jax {jax.__version__}")


if __name__ == "__main__":
  main()
