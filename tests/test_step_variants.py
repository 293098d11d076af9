"""The step variants compute what the plain step does: 32 training steps of a small Boolean
group, each variant's chunk losses against the plain step's.

The device A/B (`benchmarks/accelerator_check`, stage "ab") makes the same comparison
before it times a variant; here, on a CPU, the engine's variants (scan unroll; XLA:GPU
command buffers, whose option names and values XLA checks here too) must agree within
1e-5 relative, bf16 compute within the tolerance measured for it. XLA:CPU ignores the
command buffers, so for them this compares the plain step with itself: that their option
reaches XLA:GPU is tests/test_compile.py's check, what they change only a device shows.
"""

import dataclasses
import pathlib
import sys

import numpy as np
import pytest

import mpx.experiments.boolean_gotu as gotu_experiment
from mpx.sweep import config as config_lib
from mpx.sweep import engine

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from accelerator_check import ab  # noqa: E402

CHUNK_STEPS, CHUNKS = 8, 4  # 32 steps.


def _group(**overrides) -> engine.Group:
  """The tiny preset's 2Parity group of 2 mask members (seeds 0 and 1)."""
  _, config = config_lib.make_config(gotu_experiment, "tiny", [
      "schemes=mask", "seeds=2", *(f"{k}={v}" for k, v in overrides.items())])
  (group,) = gotu_experiment.build_groups(config)
  return group


def _losses(group: engine.Group, lr_scale: float = 1.0) -> np.ndarray:
  """[4, K] chunk losses of 32 steps from the members' init; `lr_scale` scales their
  (traced) learning rate: the same program."""
  state, hparams, data = engine.place(group, engine.init_state(group), None)
  hparams = dict(hparams, learning_rate=hparams["learning_rate"] * lr_scale)
  chunk = engine.make_train_chunk(group, CHUNK_STEPS)
  return ab.train_losses(chunk, state, hparams, data, CHUNKS)[1]


@pytest.fixture(scope="module")
def plain_group():
  return _group()


@pytest.fixture(scope="module")
def plain(plain_group):
  return _losses(plain_group)


def _check_same(got, plain):
  assert got.shape == plain.shape == (CHUNKS, 2) and np.all(np.isfinite(got))
  assert ab.relative_difference(got, plain) <= ab.FLOAT32_TOLERANCE


def test_the_step_variants_options_together_train_as_the_plain_step(plain_group, plain):
  """Every option of the variants in one program (one compile): the scan unrolled by 2
  and XLA:GPU's command buffers taking in loops, spelt as this XLA accepts them."""
  options = engine.ChunkOptions(
      scan_unroll=2, compiler_options=engine.STEP_VARIANTS["graphs"].compiler_options)
  _check_same(_losses(dataclasses.replace(plain_group, chunk_options=options)), plain)


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(set(engine.STEP_VARIANTS) - {"plain"}))
def test_each_step_variant_trains_as_the_plain_step(plain, variant):
  _check_same(_losses(_group(step_variant=variant)), plain)


def test_bf16_compute_trains_within_its_measured_tolerance(plain):
  error = ab.relative_difference(_losses(_group(compute_dtype="bfloat16")), plain)
  assert 0 < error <= ab.BF16_TOLERANCE  # Not 0: the matmuls did run in bf16.


def test_the_comparison_tells_a_step_that_computes_something_else(plain_group, plain):
  """A 1% larger learning rate moves the 32 steps' losses past the float32 tolerance: a
  variant that changed what a step computes by that much would be caught."""
  error = ab.relative_difference(_losses(plain_group, lr_scale=1.01), plain)
  assert error > 10 * ab.FLOAT32_TOLERANCE
  assert ab.relative_difference(plain, plain) == 0.0
  assert ab.relative_difference(plain * np.nan, plain) == float("inf")
