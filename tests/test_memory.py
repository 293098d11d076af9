"""mpx.sweep.memory: a group's memory plan adds up (XLA's analysis, the chunk's bytes),
`mpx run` prints it per group with one compile of the chunk, and the paper-scale vision
presets fit one 80 GB accelerator."""

import dataclasses
import logging
import math
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sweep_fixtures as fx
from mpx import cli
from mpx.sweep import Stream, engine, memory
from mpx.sweep import config as config_lib
from mpx.sweep import data as data_lib
from mpx.tasks import vision

TOY = str(pathlib.Path(__file__).parent / "toy_experiment.py")


def _stream_group(steps=6):
  return fx.group([fx.member(0), fx.member(1, "default")], steps=steps,
                  data=Stream(fx.regression_stream))


def _first_chunk(group, chunk_steps):
  feeder = data_lib.ChunkFeeder(group.data, 0, group.steps, chunk_steps)
  try:
    return feeder.next()
  finally:
    feeder.close()


def test_a_sliced_program_still_updates_the_donated_state_in_place():
  group = dataclasses.replace(_stream_group(), members_per_call=1)
  state, hparams, _ = engine.place(group, engine.init_state(group), None)
  chunk = _first_chunk(group, 3)
  compiled = engine.make_train_chunk(group, 3).lower(state, hparams, chunk).compile()
  assert memory.program_bytes(compiled).aliased == memory.device_bytes(state)


def test_plan_of_a_stream_group_adds_up():
  group = _stream_group()
  state, hparams, _ = engine.place(group, engine.init_state(group), None)
  chunk = _first_chunk(group, 3)
  compiled = engine.make_train_chunk(group, 3).lower(state, hparams, chunk).compile()
  plan = memory.plan(group, compiled, state, chunk)
  assert plan.data == sum(a.nbytes for a in chunk.values()) == 3 * 16 * (6 + 1) * 4
  assert (plan.members, plan.members_per_call) == (2, None)
  assert plan.chunks == group.data.prefetch + 3 == 5
  program = plan.program  # XLA:CPU has the analysis.
  assert program.temporaries > 0 and program.total > 0
  assert program.arguments == memory.device_bytes((state, hparams, chunk))
  assert program.aliased == memory.device_bytes(state)  # The donated state.
  assert plan.device == program.total + 4 * plan.data
  assert plan.eval_set == group.eval_data.arrays["x"].nbytes
  assert plan.host == plan.eval_set + 2 * plan.data
  text = memory.format_plan(plan)
  for part in ("group toy: 2 members per device, vmapped together",
               f"temporaries {memory.size(program.temporaries)}",
               f"stream chunks: {memory.size(plan.data)} each, up to 5 held",
               f"device total {memory.size(plan.device)}"):
    assert part in text, part


@pytest.mark.parametrize("analysis", [lambda: None, NotImplementedError])
def test_a_backend_without_memory_analysis(analysis):
  def memory_analysis():
    if isinstance(analysis, type):
      raise analysis("not on this backend")
    return analysis()
  compiled = types.SimpleNamespace(memory_analysis=memory_analysis)
  assert memory.program_bytes(compiled) is None
  plan = memory.Plan(group="g", members=4, members_per_call=1, program=None, data=100,
                     chunks=5, eval_set=10, host_data=200)
  assert plan.device == 500 and plan.host == 210
  assert "no memory analysis" in memory.format_plan(plan)


def test_run_prints_each_groups_plan_and_compiles_the_chunk_once(tmp_path, capsys, caplog):
  """The plan's compile is the chunk's own: the two toy groups share one program (steps=4:
  one no other test compiles)."""
  with jax.log_compiles(True), caplog.at_level(logging.WARNING):
    assert cli.main(["run", TOY, "--set", "data=stream", "--set", "steps=4", "--set",
                     "eval_every=0", "--set", "checkpoint_every=0",
                     "--out", str(tmp_path)]) == 0
  err = capsys.readouterr().err
  for name in ("toy_a", "toy_b"):
    assert f"memory plan, group {name}: 4 members per device, vmapped together" in err
  assert err.count("stream chunks: 896 B each, up to 5 held") == 2  # [2, 16, 7] float32
  compiles = [r for r in caplog.records
              if r.getMessage().startswith("Finished XLA compilation of jit(chunk)")]
  assert len(compiles) == 1


# The budget the paper-scale presets are sized for (experiments/vision.py): jax's default
# 75% of an 80 GB accelerator; one ViT-Tiny member's temporaries at batch 512, XLA's
# estimate (benchmarks/README.md, vision_throughput.py).
BUDGET = 0.75 * 80e9
MEMBER_TEMPORARIES = {224: 37.48e9, 32: 51.64e9}


@pytest.mark.parametrize("preset", ["cifar10", "cifar10_32", "cifar100", "imagenet100"])
def test_paper_scale_vision_presets_fit_one_80gb_accelerator(preset):
  """Members one at a time; the member states (params, AdamW moments, initial params,
  twice for the update) and every chunk a device holds, one stream per seed (the most a
  chunk carries), fit beside one member's temporaries."""
  experiment = config_lib.load_experiment("vision")
  config = vision.Config(**experiment.PRESETS[preset])
  assert config.members_per_call == 1
  model = vision.make_model(config)
  images = jnp.zeros((1, config.image_size, config.image_size, 3))
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), images)["params"])
  params = sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))
  states = 2 * len(vision.members(config, 1.0)) * 4 * params * 4
  example = config.image_size ** 2 * 3 + np.dtype(np.int32).itemsize  # uint8 image, label
  chunk = config.seeds * config.chunk_steps * config.batch_size * example
  held = chunk * memory.device_chunks(Stream(lambda seed, step: iter(())).prefetch)
  assert MEMBER_TEMPORARIES[config.image_size] + states + held < BUDGET
