"""The member axis: vmapped == alone, NaN isolation, no recompiles, sampling, devices."""

import json
import os
import pathlib
import re
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sweep_fixtures as fx
from mpx.sweep import engine, optim

sys.path.insert(0, str(pathlib.Path(__file__).parent))


def test_member_in_sweep_matches_member_alone():
  members = [fx.member(0, "mask"), fx.member(1, "default", lr=3e-3), fx.member(2, "qk_svd"),
             fx.member(3, "mask", lr=5e-3)]
  swept = fx.train(fx.group(members))
  for i in (0, 2):
    alone = fx.train(fx.group([members[i]]))
    chex.assert_trees_all_close(engine.unstack(swept.params, i),
                                engine.unstack(alone.params, 0), atol=1e-5, rtol=1e-5)
    metrics_swept = fx.evaluate(swept.params, members)[i]
    metrics_alone = fx.evaluate(alone.params, [members[i]])[0]
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
  data = {"x": jnp.asarray(np.stack([x] * len(scales)), jnp.float32),
          "scale": jnp.asarray(np.repeat(np.asarray(scales, np.float32)[:, None], 8, 1))}
  init = lambda m: {"w": jnp.full(3, 0.5), "attention": {"mask_logits": jnp.zeros(2)}}
  loss = lambda params, batch: jnp.mean(batch["scale"] * (batch["x"] @ params["w"]))
  return engine.Group(name="linear", members=members, init_params=init, loss_fn=loss,
                      train_data=data, evaluate=lambda p, ms: [{} for _ in ms], steps=steps,
                      batch_size=4, optim=optim.OptimConfig(total_steps=steps))


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

  def counting_loss(params, batch):
    traces.append(1)
    return fx.loss_fn(params, batch)

  members = [fx.member(0), fx.member(1)]
  g = fx.group(members)
  g.loss_fn = counting_loss
  chunk = engine.make_train_chunk(g, 4)
  hp = optim.stack_hparams([m.hparams for m in members])
  state = engine.init_state(g)
  state, _ = chunk(state, hp, g.train_data)
  after_first = len(traces)
  assert after_first > 0
  state, _ = chunk(state, hp, g.train_data)
  hp_new = {k: v * 0.5 for k, v in hp.items()}                     # New member values.
  state, _ = chunk(state, hp_new, g.train_data)
  state = engine.init_state(fx.group([fx.member(5, "default"), fx.member(6, "qk_svd")]))
  state, _ = chunk(state, hp_new, g.train_data)                     # New schemes, same tree.
  assert len(traces) == after_first


def test_finiteness_check_is_not_fused_into_every_update():
  # NaN isolation selects every leaf on "all params finite". Built as one check per leaf
  # ANDed together, XLA fused that chain into each leaf's select: operands and compile
  # time grew with leaves² (the paper-scale chunk compiled in 30 s instead of 11 s).
  g = fx.group([fx.member(0), fx.member(1)])
  state = engine.init_state(g)
  hp = optim.stack_hparams([m.hparams for m in g.members])
  hlo = engine.make_train_chunk(g, 2).lower(state, hp, g.train_data).compile().as_text()
  operands = [len(args.split(",")) for args in re.findall(r" fusion\((.*?)\), kind=", hlo)]
  assert operands and max(operands) < len(jax.tree_util.tree_leaves(state.params))


def test_chunk_size_does_not_change_results():
  g = fx.group([fx.member(0), fx.member(1, "default")], steps=12)
  a, b = fx.train(g, chunk_steps=3), fx.train(g, chunk_steps=5)   # 5: last chunk padded.
  chex.assert_trees_all_close(a.params, b.params, atol=1e-6)
  assert int(a.step) == int(b.step) == 12


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
  g = fx.group([fx.member()])
  with pytest.raises(ValueError, match="train_data"):
    engine.Group(g.name, [fx.member(), fx.member(1)], g.init_params, g.loss_fn, g.train_data,
                 g.evaluate, g.steps, g.batch_size)


_MULTI_DEVICE_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
import jax, numpy as np
import sweep_fixtures as fx
from mpx.sweep import engine
assert jax.device_count() == 4, jax.devices()
members = [fx.member(i, s) for i, s in enumerate(["mask", "default", "qk_svd"])]
mesh = engine.member_mesh()
state = fx.train(fx.group(members), mesh=mesh)
sharding = state.params["head"]["kernel"].sharding
print(json.dumps({{"leaves": [np.asarray(x)[:3].tolist() for x in
                             jax.tree_util.tree_leaves(state.params)],
                  "sharded": len(sharding.device_set)}}))
"""


def test_multi_device_sweep_matches_single_device():
  tests = str(pathlib.Path(__file__).parent)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu")
  out = subprocess.run([sys.executable, "-c", _MULTI_DEVICE_SCRIPT.format(tests=tests)],
                       env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["sharded"] == 4          # 3 members padded to 4, one per device.
  members = [fx.member(i, s) for i, s in enumerate(["mask", "default", "qk_svd"])]
  single = fx.train(fx.group(members))
  for multi, leaf in zip(result["leaves"], jax.tree_util.tree_leaves(single.params)):
    np.testing.assert_allclose(np.asarray(multi), np.asarray(leaf), atol=1e-6, rtol=1e-6)
