"""Member-steps/s of the sweep engine: K members vmapped vs a loop of single-member steps.

    python benchmarks/sweep_throughput.py                      # quick scale, K = 1, 4, 16, 64
    python benchmarks/sweep_throughput.py --scale paper --members 1 4 --steps 2

The model and data are the Boolean GOTU experiment's (2Parity, epoch protocol, batch 256).
Compile time is excluded from the rates and printed separately.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import platform
import sys
import time

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpx.sweep import config as config_lib  # noqa: E402
from mpx.sweep import engine, optim  # noqa: E402

SCALES = {"quick": "quick", "paper": "paper"}


def make_group(scale: str, members: int):
  experiment = config_lib.load_experiment(str(ROOT / "experiments" / "boolean_gotu.py"))
  _, cfg = config_lib.make_config(experiment, scale)
  cfg = dataclasses.replace(cfg, tasks=("2parity",), schemes=("mask",), seeds=members)
  return experiment.build_group(cfg, "2parity")


def time_chunks(group, chunk_steps: int, repeats: int):
  """(compile seconds, seconds per chunk) for the whole group."""
  hparams = optim.stack_hparams([m.hparams for m in group.members])
  state = engine.init_state(group)
  chunk = engine.make_train_chunk(group, chunk_steps)
  start = time.perf_counter()
  state, loss = chunk(state, hparams, group.train_data)
  jax.block_until_ready(loss)
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  for _ in range(repeats):
    state, loss = chunk(state, hparams, group.train_data)
  jax.block_until_ready(loss)
  return compile_s, (time.perf_counter() - start) / repeats


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scale", choices=SCALES, default="quick")
  parser.add_argument("--members", type=int, nargs="+", default=[1, 4, 16, 64])
  parser.add_argument("--steps", type=int, default=10, help="steps per timed chunk")
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args(argv)

  print(f"# sweep throughput, {args.scale} scale, {jax.device_count()} "
        f"{jax.default_backend()} device(s), {platform.processor() or platform.machine()}, "
        f"jax {jax.__version__}")
  single_compile, single_s = time_chunks(make_group(args.scale, 1), args.steps, args.repeats)
  single_rate = args.steps / single_s
  print(f"loop of single-member jitted chunks: {single_rate:.2f} member-steps/s "
        f"(compile {single_compile:.1f}s)")
  print("| K | member-steps/s vmapped | loop | vmapped / loop | compile (s) |")
  print("|---|---|---|---|---|")
  for k in args.members:
    compile_s, chunk_s = time_chunks(make_group(args.scale, k), args.steps, args.repeats)
    rate = k * args.steps / chunk_s
    print(f"| {k} | {rate:.2f} | {single_rate:.2f} | {rate / single_rate:.2f}x | "
          f"{compile_s:.1f} |", flush=True)


if __name__ == "__main__":
  main()
