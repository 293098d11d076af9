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
  probe: dict          # cudnn: attention shapes, the probe ViT, the engine probe's slot.
  headline: dict       # The paper row: its preset, most seeds, longest run, report interval.
  profile: dict        # The members K traced, the top ops listed.
  ab: dict             # The A/B: the Boolean slot, K, its variants, steps checked, rounds.
  stage_s: dict        # Least seconds a stage needs to start.
  row_s: float         # Least seconds a measurement needs before its compile time is known.
  expect: dict         # What --plan and the headline's plan assume without a results JSON.


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
    headline=dict(preset="paper", seeds=10, most_s=300, poll_s=10),
    profile=dict(members=(1, 16), top=12),
    # The environment always runs (0): every rate is a fraction of its peaks.
    stage_s={"environment": 0, "headline": 60, "majority3": 60, "cyclic3": 60, "profile": 30,
             "ab": 120, "sweep": 60, "cudnn": 45, "models": 60, "eta": 5},
    row_s=20.0,
    # One H200 (experiments/results/accelerator_check_h200.md, 2026-12-04): the stages'
    # seconds where that call measured them (models: 236 and the two rows its budget cut),
    # the paper-scale float32 rates by K and compile; the rest estimates.
    expect=dict(
        source="experiments/results/accelerator_check_h200.md (one H200, 2026-12-04)",
        stage_s={"environment": 5, "profile": 60, "ab": 150, "sweep": 125, "cudnn": 55,
                 "models": 330, "eta": 5},
        rates={1: 163.6, 16: 400.4, 129: 425.3}, compile_s=21.0,
        # Evaluation, the persistence probes, checkpoints and QK-Opt's init over the
        # training time alone: an estimate until the eta stage measures it on a device.
        overhead=1.3))
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
    headline=dict(preset="tiny", seeds=2, most_s=240, poll_s=1),
    profile=dict(members=(1, 2), top=6),
    stage_s={"environment": 0, "headline": 5, "majority3": 5, "cyclic3": 5, "profile": 5,
             "ab": 5, "sweep": 5, "cudnn": 5, "models": 5, "eta": 1}, row_s=1.0,
    # This 2-core CPU, shared, under load: the test suite's run.
    expect=dict(source="estimates for a 2-core CPU (context.py)",
                stage_s={"environment": 2, "profile": 30, "ab": 60, "sweep": 70, "cudnn": 160,
                         "models": 100, "eta": 2},
                rates={1: 57.0, 2: 71.0}, compile_s=15.0, overhead=2.3))


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
  compiled: dict = dataclasses.field(default_factory=dict)    # (group, K, steps) → (chunk,
                                                               #  compile s): profile → sweep.
  headline: dict | None = None                 # The headline run: members, steps, wall.
  expect: dict = dataclasses.field(default_factory=dict)      # What the plan assumes
                                                               #  (plan.expectations).

  def need(self, kind: str) -> float:
    """Seconds a measurement of `kind` needs: its last compile time and a margin."""
    return max(self.sizes.row_s, 1.5 * self.compile_s.get(kind, 0.0))


def load_boolean():
  """The Boolean experiment module (experiments/boolean_gotu.py)."""
  return config_lib.load_experiment(str(EXPERIMENTS / "boolean_gotu.py"))


def new_context(sizes: Sizes, budget: report_lib.Budget, report: report_lib.Report | None,
                args: argparse.Namespace | None) -> Context:
  """A Context on this backend with the Boolean experiment loaded: the check's and the
  probe process's."""
  return Context(sizes, budget, report, args,
                 "cudnn" if jax.default_backend() == "gpu" else "jax", boolean=load_boolean())
