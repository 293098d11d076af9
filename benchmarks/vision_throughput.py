"""ViT-Tiny sweep throughput on CIFAR-shaped synthetic batches, and members per accelerator.

    python benchmarks/vision_throughput.py                           # ViT-Tiny 32 px, batch 512 (GPU)
    python benchmarks/vision_throughput.py --width 64 --depth 2 --batch 32 --members 1 4
                                                                     # a size a CPU finishes
    python benchmarks/vision_throughput.py --memory-only             # members per 80 / 141 GB

Throughput: K members of the vision family's real training step (`mpx.tasks.vision`:
mixup/cutmix, label smoothing, drop-path, AdamW), one compiled chunk of `--steps` steps fed
the same `[T, B, 32, 32, 3]` uint8 batches a Stream feeds; images/s per member for each K
(K = 1 is one member alone), compile time apart. Host augmentation is not in the loop.

Memory: XLA's memory analysis of the compiled chunk (arguments + temporaries + outputs −
donated aliases) at K = 1 and K = 2, both ViT-Tiny recipes at batch 512; the difference is
one member's share, the rest is fixed (the shared batch), so members that fit in C bytes
= ⌊(C − fixed) / per member⌋. Compiled for this machine's backend: a GPU's program
(other fusions, cuDNN attention) differs, so treat the CPU figure as an estimate.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import chunk_timing  # noqa: E402
from mpx.sweep import engine  # noqa: E402
from mpx.sweep.data import EvalData, Stream  # noqa: E402
from mpx.tasks import vision  # noqa: E402
from mpx.sweep import optim  # noqa: E402

RECIPE_32 = dict(image_size=32, patch_size=2, pool="gap", pos_embed="sincos2d")
RECIPE_224 = dict(image_size=224, patch_size=16, pool="cls", pos_embed="learned")
GB = 1e9


def make_group(config: vision.Config, members: int) -> engine.Group:
  """K members of the real vision Task (default scheme: the schemes differ in values
  only), a Stream the chunk is fed by hand."""
  grid = vision.members(dataclasses.replace(config, seeds=members), 1.0)
  dummy = {"image": np.zeros((1, config.image_size, config.image_size, 3), np.uint8),
           "label": np.zeros((1,), np.int32)}
  return engine.Group(name="bench", members=grid, task=vision.make_task(config),
                      data=Stream(lambda seed, step: iter(())), eval_data=EvalData(dummy, 1),
                      steps=10 ** 6, batch_size=config.batch_size,
                      optim=optim.OptimConfig(optimizer="adamw", schedule="warmup_cosine",
                                              total_steps=10 ** 6, warmup_steps=10))


def batches(config: vision.Config, steps: int) -> dict:
  rng = np.random.default_rng(0)
  size, b = config.image_size, config.batch_size
  return {"image": rng.integers(0, 256, (steps, b, size, size, 3), np.uint8),
          "label": rng.integers(0, vision.num_classes(config), (steps, b)).astype(np.int32)}


def compiled(config, members, steps):
  return chunk_timing.compile_chunk(make_group(config, members), steps,
                                    data=engine.replicate(batches(config, steps), None))


def program_bytes(chunk) -> float:
  m = chunk.memory_analysis()
  return float(m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
               - m.alias_size_in_bytes)


def throughput(config, members, steps, repeats):
  chunk, state, hparams, data, compile_s = compiled(config, members, steps)
  seconds = chunk_timing.time_chunk(chunk, state, hparams, data, repeats)
  return steps * repeats * config.batch_size / seconds, compile_s


def memory_rows(width, depth, batch):
  rows = []
  for name, recipe in (("32 px / patch 2", RECIPE_32), ("224 px / patch 16", RECIPE_224)):
    config = vision.Config(dataset="cifar10", schemes=("default",), width=width, depth=depth,
                           batch_size=batch, **recipe)
    k1, k2 = (program_bytes(compiled(config, k, 1)[0]) for k in (1, 2))
    per_member, fixed = k2 - k1, 2 * k1 - k2
    fits = {cap: int((cap * GB - fixed) // per_member) for cap in (80, 141)}
    rows.append(f"| {name} | {batch} | {per_member / GB:.2f} GB | {fixed / GB:.2f} GB | "
                f"{fits[80]} | {fits[141]} |")
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--width", type=int, default=192)
  parser.add_argument("--depth", type=int, default=12)
  parser.add_argument("--batch", type=int, default=512)
  parser.add_argument("--members", type=int, nargs="+", default=[1, 4, 16])
  parser.add_argument("--steps", type=int, default=4, help="steps per compiled chunk")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--memory-only", action="store_true")
  args = parser.parse_args()
  heads = max(1, args.width // 64)
  print(f"backend {jax.default_backend()}, {jax.devices()[0].device_kind}; ViT width "
        f"{args.width}, depth {args.depth}, {heads} heads × 64\n")
  if not args.memory_only:
    config = vision.Config(dataset="cifar10", schemes=("default",), width=args.width,
                           depth=args.depth, num_heads=heads, mlp_dim=4 * args.width,
                           batch_size=args.batch, **RECIPE_32)
    print("| members K | images/s per member | images/s, all members | vs K = 1 "
          "| compile s |\n|---|---|---|---|---|")
    base = None
    for k in args.members:
      rate, compile_s = throughput(config, k, args.steps, args.repeats)
      base = base or rate
      print(f"| {k} | {rate:.1f} | {rate * k:.1f} | {rate * k / base:.2f}× | "
            f"{compile_s:.1f} |", flush=True)
    print()
  print("| recipe | batch | per member | fixed | members in 80 GB | in 141 GB |\n"
        "|---|---|---|---|---|---|")
  print("\n".join(memory_rows(192, 12, 512)))


if __name__ == "__main__":
  main()
