"""The member axis: vmapped == alone, NaN isolation, no recompiles, sampling, devices."""

import json
import os
import pathlib
import re
import subprocess
import sys

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sweep_fixtures as fx
from mpx.sweep import DeviceData, EvalData, Stream, engine, optim
from mpx.sweep.data import ChunkFeeder

sys.path.insert(0, str(pathlib.Path(__file__).parent))


def test_member_in_sweep_matches_member_alone():
  members = [fx.member(0, "mask"), fx.member(1, "default", lr=3e-3), fx.member(2, "qk_svd"),
             fx.member(3, "mask", lr=5e-3)]
  swept = fx.train(fx.group(members))
  for i in (0, 2):
    alone = fx.train(fx.group([members[i]]))
    chex.assert_trees_all_close(engine.unstack(swept.params, i),
                                engine.unstack(alone.params, 0), atol=1e-5, rtol=1e-5)
    metrics_swept = fx.evaluate(fx.group(members), swept)[i]
    metrics_alone = fx.evaluate(fx.group([members[i]]), alone)[0]
    assert metrics_swept["mean_output"] == pytest.approx(metrics_alone["mean_output"], abs=1e-5)


def test_training_moves_params_and_frozen_mask_stays():
  members = [fx.member(0, "mask"), fx.member(0, "default")]
  g = fx.group(members)
  start, end = engine.init_state(g), fx.train(g)
  mask = lambda s, i: s.params["block_0"]["attention"]["mask_logits"][i]
  assert not np.array_equal(mask(start, 0), mask(end, 0))          # Learnable prior moves.
  np.testing.assert_array_equal(mask(start, 1), mask(end, 1))      # Neutral, lr × 0: frozen.
  assert not np.array_equal(start.params["head"]["kernel"][1], end.params["head"]["kernel"][1])
  assert int(end.step) == g.steps


def test_members_with_different_param_trees_are_named():
  def init(m):
    params = fx.init_params(m)
    return params if m.seed == 0 else {**params, "extra": jnp.zeros(1)}
  g = fx.group([fx.member(0), fx.member(1)], task=dataclasses.replace(fx.TASK, init=init))
  with pytest.raises(ValueError, match="members have different param trees"):
    engine.init_state(g)


def test_diverging_member_is_frozen_and_isolated():
  healthy = [fx.member(0), fx.member(1), fx.member(2)]
  with_bad = healthy[:1] + [fx.member(1, lr=1e30)] + healthy[2:]
  reference = fx.train(fx.group(healthy))
  state = fx.train(fx.group(with_bad))
  np.testing.assert_array_equal(np.asarray(state.alive), [True, False, True])
  assert 0 <= int(state.diverged_step[1]) < 12
  assert int(reference.diverged_step.max()) == -1
  for i in (0, 2):
    for a, b in zip(jax.tree_util.tree_leaves(engine.unstack(state.params, i)),
                    jax.tree_util.tree_leaves(engine.unstack(reference.params, i))):
      np.testing.assert_array_equal(a, b)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(state.params))


def _scaled_linear_group(scales, steps=4):
  """Members minimise scale · mean(x·w): a scale of 1e20 gives gradients whose square
  overflows float32, so Adam's second moment turns inf while its update (mu / sqrt(inf))
  is 0 and params and loss stay finite."""
  members = [fx.member(i, "default") for i in range(len(scales))]
  x = np.asarray(jax.random.uniform(jax.random.key(0), (8, 3), minval=0.5, maxval=1.5))
  data = {"x": np.stack([x] * len(scales)).astype(np.float32),
          "scale": np.repeat(np.asarray(scales, np.float32)[:, None], 8, 1)}
  task = engine.Task(
      init=lambda m: {"w": jnp.full(3, 0.5), "attention": {"mask_logits": jnp.zeros(2)}},
      loss=lambda params, batch, key: (jnp.mean(batch["scale"] * (batch["x"] @ params["w"])),
                                       {}),
      eval_step=lambda params, batch: {"out": batch["x"] @ params["w"]},
      summarize=lambda values, member: {})
  return engine.Group(name="linear", members=members, task=task,
                      data=DeviceData(data, per_member=True),
                      eval_data=EvalData({"x": x}, 8), steps=steps, batch_size=4,
                      optim=optim.OptimConfig(total_steps=steps))


def test_non_finite_optimizer_state_freezes_the_member():
  state = fx.train(_scaled_linear_group([1.0, 1e20, 1.0]))
  reference = fx.train(_scaled_linear_group([1.0, 1.0, 1.0]))
  np.testing.assert_array_equal(np.asarray(state.alive), [True, False, True])
  assert int(state.diverged_step[1]) == 0
  np.testing.assert_array_equal(state.params["w"][1], np.full(3, 0.5))    # Frozen at init.
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(
      state.opt_state) if jnp.issubdtype(x.dtype, jnp.inexact))          # Last finite state.
  for i in (0, 2):
    trained = lambda s: jax.tree_util.tree_leaves(engine.unstack((s.params, s.opt_state), i))
    for a, b in zip(trained(state), trained(reference)):
      np.testing.assert_array_equal(a, b)
  assert not np.array_equal(state.params["w"][0], np.full(3, 0.5))       # Others trained.


def test_no_recompilation_across_chunks_or_member_values():
  traces = []

  def counting_loss(params, batch, key):
    traces.append(1)
    return fx.loss_fn(params, batch, key)

  members = [fx.member(0), fx.member(1)]
  task = dataclasses.replace(fx.TASK, loss=counting_loss)
  g = fx.group(members, task=task)
  chunk = engine.make_train_chunk(g, 4)
  state, hp, data = engine.place(g, engine.init_state(g), None)
  state, _ = chunk(state, hp, data)
  after_first = len(traces)
  assert after_first > 0
  state, _ = chunk(state, hp, data)
  hp_new = {k: v * 0.5 for k, v in hp.items()}                     # New member values.
  state, _ = chunk(state, hp_new, data)
  other = fx.group([fx.member(5, "default"), fx.member(6, "qk_svd")], task=task)
  state, _ = chunk(engine.init_state(other), hp_new, data)          # New schemes, same tree.
  # Another group with the same static settings and shapes shares the compiled chunk.
  assert engine.make_train_chunk(other, 4) is chunk
  assert len(traces) == after_first


def test_finiteness_check_is_not_fused_into_every_update():
  # NaN isolation selects every leaf on "all params finite". Built as one check per leaf
  # ANDed together, XLA fused that chain into each leaf's select: operands and compile
  # time grew with leaves² (the paper-scale chunk compiled in 30 s instead of 11 s).
  g = fx.group([fx.member(0), fx.member(1)])
  state, hp, data = engine.place(g, engine.init_state(g), None)
  hlo = engine.make_train_chunk(g, 2).lower(state, hp, data).compile().as_text()
  operands = [len(args.split(",")) for args in re.findall(r" fusion\((.*?)\), kind=", hlo)]
  # One fusion may read every leaf (jax >= 0.11 fuses the check's concatenation); the chain
  # made one such fusion per leaf.
  wide = [n for n in operands if n >= len(jax.tree_util.tree_leaves(state.params))]
  assert operands and len(wide) <= 1, wide


def test_chunk_size_does_not_change_results():
  g = fx.group([fx.member(0), fx.member(1, "default")], steps=12)
  a, b = fx.train(g, chunk_steps=3), fx.train(g, chunk_steps=5)   # 5: last chunk padded.
  chex.assert_trees_all_close(a.params, b.params, atol=1e-6)
  assert int(a.step) == int(b.step) == 12


def test_steps_past_the_end_change_nothing():
  """A chunk's steps past `group.steps` leave the state bit for bit: a live member stays
  alive, a dead one dead, and the order stays the last epoch's (the toy data: 4 steps per
  epoch, so steps 8 and 12, past the end, would redraw it)."""
  members = [fx.member(0), fx.member(1, lr=1e30), fx.member(2, "default")]
  g = fx.group(members, steps=6, sampling="epoch")
  chunk = engine.make_train_chunk(g, 5)  # Steps 0-4, then 5 and four past the end.
  state, hp, data = engine.place(g, engine.init_state(g), None)
  for _ in range(2):
    state, _ = chunk(state, hp, data)
  done = jax.device_get(state)
  state, out = chunk(state, hp, data)  # All five past the end.
  chex.assert_trees_all_equal(jax.device_get(state), done)
  np.testing.assert_array_equal(done.alive, [True, False, True])
  assert int(done.step) == 6 and 0 <= int(done.diverged_step[1]) < 6
  np.testing.assert_array_equal(done.order, engine._epoch_orders(done.key, 1, 64))  # Step 5's.
  np.testing.assert_array_equal(out["train_loss"], 0.0)


def test_epoch_sampling_visits_every_example_once_per_epoch():
  key = jax.random.key(3)
  per_epoch = 64 // 16
  orders = [engine.epoch_order(key, epoch, 64) for epoch in range(2)]
  for epoch, order in enumerate(orders):
    seen = np.concatenate([np.asarray(engine._batch_indices(
        key, epoch * per_epoch + s, order, 64, 16, "epoch")) for s in range(per_epoch)])
    np.testing.assert_array_equal(np.sort(seen), np.arange(64))
  assert not np.array_equal(orders[0], orders[1])


def test_empty_device_list_is_an_error_not_all_devices():
  with pytest.raises(ValueError, match="devices is empty; pass None"):
    engine.member_mesh([])


def test_bad_groups_raise():
  with pytest.raises(ValueError, match="sampling"):
    fx.group([fx.member()], sampling="shuffle")
  g = fx.group([fx.member()], per_member=True)
  with pytest.raises(ValueError, match="K=2 rows, one per member"):
    dataclasses.replace(g, members=[fx.member(), fx.member(1)])
  with pytest.raises(ValueError, match=r"\[P, \.\.\.\] with one P"):
    DeviceData({"x": np.zeros((4, 2)), "y": np.zeros(3)})
  with pytest.raises(ValueError, match="batch_size 16 exceeds the 8"):
    fx.group([fx.member()], data=DeviceData({"x": np.zeros((8, 6)), "y": np.zeros(8)}))
  with pytest.raises(TypeError, match="DeviceData or a Stream"):
    fx.group([fx.member()], data={"x": np.zeros((64, 6))})
  with pytest.raises(ValueError, match="members_per_call=0"):
    fx.group([fx.member()], members_per_call=0)


_MULTI_DEVICE_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import jax, numpy as np
import sweep_fixtures as fx
from mpx.sweep import engine
assert jax.device_count() == 8, jax.devices()
from test_sweep_engine import per_seed_group
members = [fx.member(i, s) for i, s in enumerate(["mask", "default", "qk_svd"])]
mesh = engine.member_mesh()
state = fx.train(fx.group(members), mesh=mesh)
streamed = fx.train(per_seed_group(), mesh=mesh)
sharding = state.params["head"]["kernel"].sharding
first = lambda tree, n: [np.asarray(x)[:n].tolist() for x in jax.tree_util.tree_leaves(tree)]
print(json.dumps({{"leaves": first(state.params, 3), "streamed": first(streamed.params, 5),
                  "sharded": len(sharding.device_set)}}))
"""


# Eight devices may fuse and order float32 reductions differently from one (jax 0.12 does
# for the gathered stream rows: 6e-6 on one entry of 320 after 12 steps); a member reading
# another member's stream moves every member's params by 9e-3 or more.
_DEVICE_COUNT_ATOL = 2e-5


@pytest.mark.slow  # A process of 8 devices.
def test_multi_device_sweep_matches_single_device():
  tests = str(pathlib.Path(__file__).parent)
  env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "  # conftest's
                                  "--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _MULTI_DEVICE_SCRIPT.format(tests=tests)],
                       env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["sharded"] == 8          # 3 members padded to 8, one per device.
  members = [fx.member(i, s) for i, s in enumerate(["mask", "default", "qk_svd"])]
  single = fx.train(fx.group(members))
  for multi, leaf in zip(result["leaves"], jax.tree_util.tree_leaves(single.params)):
    np.testing.assert_allclose(np.asarray(multi), np.asarray(leaf), atol=_DEVICE_COUNT_ATOL)
  # One stream per seed: each device gathers its members' rows of the replicated chunk.
  streamed = fx.train(per_seed_group())
  for multi, leaf in zip(result["streamed"], jax.tree_util.tree_leaves(streamed.params)):
    np.testing.assert_allclose(np.asarray(multi), np.asarray(leaf), atol=_DEVICE_COUNT_ATOL)


# --------------------------------------------------------------------------- data layouts


def _assert_same_params(a, b, atol=1e-6):
  chex.assert_trees_all_close(a.params, b.params, atol=atol, rtol=atol)


# Slices and one vmap are the same math at different batch shapes, which XLA may reduce in
# another order: 6e-6 apart after 12 steps (jax 0.12, CPU). A member reading another
# member's rows moves its params by ~1e-1 in the same test, so 1e-4 still tells them apart.
SLICE_ATOL = 1e-4


@pytest.mark.parametrize("sampling", ["iid", "epoch"])
def test_shared_data_equals_a_copy_per_member(sampling):
  members = [fx.member(0), fx.member(1, "default")]
  shared = fx.train(fx.group(members, sampling=sampling))
  copies = fx.train(fx.group(members, sampling=sampling, per_member=True))
  _assert_same_params(shared, copies, atol=0)


def test_members_in_slices_equal_one_vmap():
  members = [fx.member(i, s) for i, s in enumerate(["mask", "default", "qk_svd"])]
  vmapped = fx.train(fx.group(members, sampling="epoch"))
  sliced = fx.train(fx.group(members, sampling="epoch", members_per_call=2))  # 2 + 1.
  _assert_same_params(vmapped, sliced, atol=SLICE_ATOL)
  g = fx.group(members, members_per_call=2)
  np.testing.assert_allclose([m["mean_output"] for m in fx.evaluate(g, sliced)],
                             [m["mean_output"] for m in fx.evaluate(fx.group(members), vmapped)],
                             atol=SLICE_ATOL)


def test_members_in_slices_read_their_own_data_rows():
  """Per-member data (what a traced sweep of Boolean or arithmetic trains in slices on a
  CPU): each member's rows differ, so a slice reading another member's rows shows."""
  members = [fx.member(i, s) for i, s in enumerate(["mask", "default", "qk_svd"])]
  g = fx.group(members, sampling="epoch", per_member=True)
  rows = {name: np.asarray(a) * (1 + np.arange(3.0).reshape((3,) + (1,) * (a.ndim - 1)))
          for name, a in g.data.arrays.items()}
  g = dataclasses.replace(g, data=dataclasses.replace(g.data, arrays=rows))
  sliced = fx.train(dataclasses.replace(g, members_per_call=2))  # 2 + 1.
  _assert_same_params(fx.train(g), sliced, atol=SLICE_ATOL)


def test_members_in_slices_need_less_memory():
  """The valve's point: 8 members one at a time hold less scratch memory than 8 vmapped."""
  def scratch_bytes(members_per_call):
    g = fx.group([fx.member(i) for i in range(8)], members_per_call=members_per_call)
    state, hp, data = engine.place(g, engine.init_state(g), None)
    compiled = engine.make_train_chunk(g, 2).lower(state, hp, data).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  assert scratch_bytes(1) < 0.5 * scratch_bytes(None)


def test_epoch_sampling_is_independent_of_chunking_and_resume():
  # 12 steps = 3 epochs of 4 batches: the order is redrawn inside the compiled chunk at
  # steps 4 and 8; chunks of 3 and 5 cross those boundaries at different places.
  g = fx.group([fx.member(0), fx.member(1, "default")], sampling="epoch")
  whole = fx.train(g, chunk_steps=12)
  _assert_same_params(whole, fx.train(g, chunk_steps=5))
  half = fx.train(dataclasses.replace(g, steps=6), chunk_steps=3)      # Stopped mid-epoch,
  resumed = fx.train(g, chunk_steps=5, state=half)                     # resumed from there.
  _assert_same_params(whole, resumed)
  np.testing.assert_array_equal(np.asarray(whole.order), np.asarray(resumed.order))


def test_a_one_epoch_run_and_the_first_step_of_epoch_two_as_in_a_longer_run():
  # 4 batches per epoch. A 4-step run compiles no redraw, a 5-step run must redraw at
  # step 4: each equals the first steps of a 3-epoch run, bit for bit.
  members = [fx.member(0), fx.member(1, "default")]
  long = fx.group(members, steps=12, sampling="epoch")
  for steps in (4, 5):
    state, hparams, data = engine.place(long, engine.init_state(long), None, local=True)
    first, _ = engine.make_train_chunk(long, steps)(state, hparams, data)
    short = fx.train(fx.group(members, steps=steps, sampling="epoch"), chunk_steps=steps)
    chex.assert_trees_all_equal(short.params, first.params, custom_message=f"{steps} steps")


def test_programs_run_once_compile_at_level_1_on_cpu_unless_the_level_is_set(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/xla_backend_optimization_level")
  assert engine.once_options() == engine.ONCE_OPTIONS == {"xla_backend_optimization_level": 1}
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 "
                     "--xla_backend_optimization_level=0")
  assert engine.once_options() is None
  monkeypatch.delenv("XLA_FLAGS")
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    assert engine.once_options() is None
  finally:
    jax.config.update("jax_disable_most_optimizations", False)
  f = engine.jit_once(lambda x, y: x * y)
  assert f(3.0, y=2.0) == 6.0 and f.__wrapped__(3.0, 2.0) == 6.0


def _programs_run_once():
  """What jit_once compiles, unwrapped: each family's model init at its tiny presets'
  sizes (the discovery tinies' one-head width-8 model too) and the sweep's initial state;
  name → (program, its arguments)."""
  from mpx.sweep import config as config_lib
  from mpx.tasks import boolean
  from mpx.tasks.arithmetic import task as arithmetic
  from mpx.tasks.boolean import gotu
  from mpx.tasks.language import task as language
  from mpx.tasks.vision import task as vision
  cfg = lambda name: config_lib.make_config(config_lib.load_experiment(name), "tiny")[1]
  key = (jax.random.key(7),)
  add = cfg("arithmetic")
  n_tokens = arithmetic.get_task("addition", add.digits, reverse_answer=add.reverse_answer)
  g = fx.group([fx.member(0), fx.member(1, "default")], sampling="epoch")
  state_args = ([fx.init_params(m) for m in g.members],
                optim.stack_hparams([m.hparams for m in g.members]), engine.member_keys(g.members))
  return {"vision": (vision.make_model_init(cfg("vision")), key),
          "language": (language.make_model_init(cfg("language"), 257), key),
          "arithmetic": (arithmetic.make_model_init(add, n_tokens.n_tokens), key),
          "boolean_gotu": (gotu.make_model_init(cfg("boolean_gotu"), 15), key),
          "discover_boolean": (gotu.make_model_init(cfg("discover_boolean"),
                                                    boolean.get_task("2parity").n_bits), key),
          "initial state": (engine._initial_state(g.optim, 64), state_args)}


@pytest.mark.slow  # 12 compiles of programs that are not small.
def test_programs_run_once_give_the_default_levels_values_bit_for_bit():
  # jit_once compiles them at XLA's optimisation level 1 on CPU, cheaper than the default
  # level 2 and only safe while their values are the same. (The suite's XLA_FLAGS set
  # level 0, which gives other values, so both levels are named here.)
  for name, (program, args) in _programs_run_once().items():
    compiled = lambda options: jax.jit(program.__wrapped__).lower(*args).compile(
        compiler_options=options)
    chex.assert_trees_all_equal(compiled(engine.ONCE_OPTIONS)(*args),
                                compiled({"xla_backend_optimization_level": 2})(*args),
                                custom_message=name)


def test_loss_key_is_per_member_and_step():
  """A stochastic loss (noise keyed by the engine) still trains a member in a sweep as
  alone, and two seeds see different noise."""
  def noisy(params, batch, key):
    noise = jax.random.normal(key, batch["y"].shape)
    loss, aux = fx.loss_fn(params, {"x": batch["x"], "y": batch["y"] + noise}, key)
    return loss, aux | {"noise": noise[0]}

  task = dataclasses.replace(fx.TASK, loss=noisy)
  members = [fx.member(0), fx.member(1)]
  g = fx.group(members, task=task)
  state, hp, data = engine.place(g, engine.init_state(g), None)
  _, out = engine.make_train_chunk(g, 3)(state, hp, data)
  assert out["train_noise"][0] != out["train_noise"][1]
  assert set(out) == {"train_loss", "train_mean_pred", "train_noise", "alive"}
  alone = fx.train(fx.group(members[1:], task=task))
  swept = fx.train(g)
  chex.assert_trees_all_close(engine.unstack(swept.params, 1), engine.unstack(alone.params, 0),
                              atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- streams


def _stream_group(members, steps=12, stream=None):
  return fx.group(members, steps=steps, data=stream or Stream(fx.regression_stream, seed=3))


def test_stream_trains_members_as_alone_and_independent_of_chunking():
  members = [fx.member(0), fx.member(1, "default", lr=3e-3)]
  g = _stream_group(members)
  swept = fx.train(g, chunk_steps=4)
  alone = fx.train(_stream_group(members[1:]), chunk_steps=4)
  chex.assert_trees_all_close(engine.unstack(swept.params, 1), engine.unstack(alone.params, 0),
                              atol=1e-5, rtol=1e-5)
  _assert_same_params(swept, fx.train(g, chunk_steps=5))              # Last chunk padded.
  start = engine.init_state(g)
  assert not np.array_equal(np.asarray(start.params["head"]["kernel"]),
                            np.asarray(swept.params["head"]["kernel"]))


def test_stream_resume_is_bit_exact():
  g = _stream_group([fx.member(0), fx.member(1, "default")])
  whole = fx.train(g, chunk_steps=3)
  half = fx.train(dataclasses.replace(g, steps=6), chunk_steps=3)
  _assert_same_params(whole, fx.train(g, chunk_steps=3, state=half), atol=0)


def test_stream_that_ends_early_is_a_clear_error():
  short = Stream(lambda seed, start: iter([next(fx.regression_stream(seed, start))] * 5))
  with pytest.raises(ValueError, match="the stream ended at step 5, before the group's 12"):
    fx.train(_stream_group([fx.member(0)], stream=short))


# Seeds 0 and 1, two schemes each, and seed 2 once: 5 members on 3 streams.
PER_SEED_MEMBERS = [fx.member(0), fx.member(1), fx.member(0, "default", lr=3e-3),
                    fx.member(1, "default"), fx.member(2, "qk_svd")]


def per_seed_group(task=fx.TASK, steps=12):
  """The toy group on one regression stream per member seed."""
  return fx.group(PER_SEED_MEMBERS, steps=steps, task=task,
                  data=Stream(fx.regression_stream, seeds=(2, 0, 1)))


def _batch_fingerprint(x, y, xp=jnp):
  """A number that tells batches apart: position-weighted sums of x and y."""
  weights = 1 + xp.arange(x.size, dtype=xp.float32).reshape(x.shape)
  return xp.sum(x * weights) + xp.sum(y)


def test_each_seed_reads_its_own_stream_and_its_schemes_share_it():
  def loss(params, batch, key):
    value, aux = fx.loss_fn(params, batch, key)
    return value, aux | {"fingerprint": _batch_fingerprint(batch["x"], batch["y"])}

  g = per_seed_group(dataclasses.replace(fx.TASK, loss=loss))
  state, hp, _ = engine.place(g, engine.init_state(g), None)
  feeder = ChunkFeeder(g.data, 0, g.steps, 3, put=lambda chunk: chunk)
  try:
    chunk = feeder.next()
  finally:
    feeder.close()
  assert chunk["x"].shape == (3, 3, 16, fx.N_BITS)                  # [T, S, B, ...]
  _, out = engine.make_train_chunk(g, 3)(state, hp, chunk)
  printed = np.asarray(out["train_fingerprint"])
  for member, value in zip(g.members, printed):  # Member k read batches(its seed, step).
    batches = [next(fx.regression_stream(member.seed, step)) for step in range(3)]
    expected = np.mean([_batch_fingerprint(b["x"], b["y"], np) for b in batches])
    np.testing.assert_allclose(value, expected, rtol=1e-6)
  assert printed[0] == printed[2] and printed[1] == printed[3]      # A seed's schemes pair.
  assert len({printed[0], printed[1], printed[4]}) == 3             # Seeds differ.


def test_per_seed_streams_train_each_member_as_on_its_own_stream():
  g = per_seed_group()
  swept = fx.train(g, chunk_steps=4)
  for i in (0, 3, 4):
    member = g.members[i]
    alone = fx.train(_stream_group([member], stream=Stream(fx.regression_stream,
                                                           seed=member.seed)), chunk_steps=4)
    chex.assert_trees_all_close(engine.unstack(swept.params, i),
                                engine.unstack(alone.params, 0), atol=1e-5, rtol=1e-5)


def test_per_seed_streams_in_slices_equal_one_vmap():
  """Each slice runs the chunk's steps on its own members' stream rows."""
  g = per_seed_group()
  sliced = fx.train(dataclasses.replace(g, members_per_call=2), chunk_steps=4)  # 2 + 2 + 1.
  _assert_same_params(fx.train(g, chunk_steps=4), sliced, atol=SLICE_ATOL)


def test_per_seed_stream_resume_is_bit_exact_and_chunking_free():
  g = per_seed_group()
  whole = fx.train(g, chunk_steps=3)
  half = fx.train(dataclasses.replace(g, steps=6), chunk_steps=3)
  _assert_same_params(whole, fx.train(g, chunk_steps=3, state=half), atol=0)
  _assert_same_params(whole, fx.train(g, chunk_steps=5))            # Last chunk padded.


def test_stream_seeds_must_cover_the_members():
  with pytest.raises(ValueError, match=r"seeds \[1\] have no stream.*seeds=\(0, 1\)"):
    _stream_group([fx.member(0), fx.member(1)], stream=Stream(fx.regression_stream,
                                                              seeds=(0,)))
  with pytest.raises(ValueError, match="must be distinct and not empty"):
    Stream(fx.regression_stream, seeds=(0, 0))
  one = Stream(fx.regression_stream, seeds=(3,))                     # One seed: shared.
  assert not one.stacked and one.stream_of([3, 3]) == (0, 0)
  assert Stream(fx.regression_stream, seeds=(0, 1)).stream_of([1, 0, 1]) == (1, 0, 1)
