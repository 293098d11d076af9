"""What every stage is handed: the sizes it measures at, and what earlier stages measured.

The sizes come in two sets, DEVICE for an accelerator and TINY (every stage at toy
sizes) for a CPU run of the whole check; the Context carries the budget, the report and
the measurements a later stage builds on (the peaks, the rates, the compile times).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import jax

from accelerator_check import report as report_lib
from mpx.sweep import config as config_lib

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[2] / "experiments"


@dataclasses.dataclass(frozen=True)
class Sizes:
  """What each stage measures: DEVICE on an accelerator, TINY (every stage at toy sizes)
  for a CPU check of the whole script."""
  matmul_n: int
  matmul_repeats: int
  presets: dict        # Boolean slot ("paper", "quick") → preset of experiments/boolean_gotu.py.
  members: dict        # Slot → the K measured; "paper" adds the most that fit.
  max_members: int     # Cap on the most that fit.
  steps: dict          # Slot → steps per compiled chunk.
  repeats: int         # Timed chunks after a warm-up one.
  vit: dict            # vision.Config overrides (none: ViT-Tiny).
  vit_rows: tuple      # (image size, members_per_call) measured.
  vit_batch: int
  vit_steps: int
  language_preset: str
  probe: dict          # Stage 3: attention shapes, the probe ViT, the engine probe's slot.
  ab: dict             # The A/B: the Boolean slot, K, its variants, steps checked, rounds.
  stage_s: dict        # Least seconds a stage needs to start.
  row_s: float         # Least seconds a measurement needs before its compile time is known.


DEVICE = Sizes(
    matmul_n=8192, matmul_repeats=5, presets={"paper": "paper", "quick": "quick"},
    members={"paper": (1, 16), "quick": (1, 64)}, max_members=1024,
    steps={"paper": 8, "quick": 32}, repeats=2, vit={},
    vit_rows=((32, 1), (32, 2), (224, 1), (224, 2)), vit_batch=512, vit_steps=5,
    language_preset="wikitext2",
    probe=dict(batch=32, tokens=16, odd_tokens=197, heads=6, head_dim=64, vit_batch=8,
               vit=dict(width=192, depth=2, num_heads=3, head_dim=64, mlp_dim=768),
               engine_slot="quick", engine_steps=4),
    ab=dict(slot="paper", members=16, check_steps=32, rounds=5,
            variants=("plain", "bf16", "graphs", "unroll2", "unroll4")),
    # The environment always runs (0): every rate is a fraction of its peaks. The A/B: a
    # compile of ≈ 20 s per variant (unrolled ones longer), 4 + 2 chunks of ≈ 0.3 s each.
    stage_s={"environment": 0, "ab": 120, "sweep": 60, "cudnn": 45, "models": 60, "eta": 5},
    row_s=20.0)
TINY = Sizes(
    matmul_n=256, matmul_repeats=3, presets={"paper": "tiny", "quick": "quick"},
    members={"paper": (1, 2), "quick": ()}, max_members=2,
    steps={"paper": 8, "quick": 4}, repeats=1,
    vit=dict(width=16, depth=1, num_heads=2, head_dim=8, mlp_dim=32, mixup=0.0, cutmix=0.0,
             drop_path=0.0),
    vit_rows=((32, 1), (224, 2)), vit_batch=2,
    vit_steps=2, language_preset="tiny",
    probe=dict(batch=2, tokens=16, odd_tokens=197, heads=2, head_dim=8, vit_batch=2,
               vit=dict(width=16, depth=1, num_heads=2, head_dim=8, mlp_dim=32),
               engine_slot="paper", engine_steps=8),
    ab=dict(slot="paper", members=2, check_steps=32, rounds=2,
            variants=("plain", "bf16", "graphs", "unroll2")),
    stage_s={"environment": 0, "ab": 5, "sweep": 5, "cudnn": 5, "models": 5, "eta": 1},
    row_s=1.0)


@dataclasses.dataclass
class Context:
  """What the stages share: sizes, budget, report, and earlier stages' measurements."""
  sizes: Sizes
  budget: report_lib.Budget
  report: report_lib.Report
  args: argparse.Namespace
  fused: str                                   # "cudnn" on a GPU, else "jax".
  peaks: dict = dataclasses.field(default_factory=dict)       # dtype → TFLOP/s.
  rates: dict = dataclasses.field(default_factory=dict)       # (preset, dtype, attention,
                                                               #  K) → member-steps/s.
  compile_s: dict = dataclasses.field(default_factory=dict)   # key → seconds.
  boolean: object = None                       # The boolean_gotu experiment module.
  groups: dict = dataclasses.field(default_factory=dict)      # Built Boolean groups.
  inits: dict = dataclasses.field(default_factory=dict)       # Model → initial state.
  most: int | None = None                      # The most paper-scale members that fit.

  def need(self, kind: str) -> float:
    """Seconds a measurement of `kind` needs: its last compile time and a margin."""
    return max(self.sizes.row_s, 1.5 * self.compile_s.get(kind, 0.0))


def new_context(sizes: Sizes, budget: report_lib.Budget, report: report_lib.Report | None,
                args: argparse.Namespace | None) -> Context:
  """A Context on this backend with the Boolean experiment loaded: the check's and the
  probe process's."""
  return Context(sizes, budget, report, args,
                 "cudnn" if jax.default_backend() == "gpu" else "jax",
                 boolean=config_lib.load_experiment(str(EXPERIMENTS / "boolean_gotu.py")))
