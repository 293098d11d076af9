"""Golden one-step values per experiment (nanodo's `test_train_step`): each member's
training loss in the first two steps of the `tiny` preset, init to optimizer update.

Recorded on the engine before the Task / DeviceData reshape (commit 382fb94) and
reproduced to the last bit after it: a change in init, batching, loss or optimizer
moves them. The tolerance allows other XLA versions' float reassociation only."""

import dataclasses

import chex
import numpy as np
import pytest

from mpx.sweep import config as config_lib
from mpx.sweep import engine

GOLDEN = {  # experiment: (step 0 losses, step 1 losses), members [default, mask].
    "boolean_gotu": ([1.640396237373352, 1.8000431060791016],
                     [1.7336400747299194, 1.905909776687622]),
    "arithmetic": ([3.2372095584869385, 3.196768283843994],
                   [3.0946247577667236, 3.0709848403930664]),
}


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_first_steps_match_the_golden_losses(name):
  experiment = config_lib.load_experiment(name)
  _, config = config_lib.make_config(experiment, "tiny")
  group = experiment.build_groups(config)[0]
  assert [m.scheme for m in group.members] == ["default", "mask"]
  state, hparams, data = engine.place(group, engine.init_state(group), None)
  chunk = engine.make_train_chunk(group, 1)
  losses = []
  for _ in range(2):
    state, out = chunk(state, hparams, data)
    chex.assert_shape(out["train_loss"], (2,))
    losses.append(np.asarray(out["train_loss"]))
  np.testing.assert_allclose(losses, GOLDEN[name], rtol=2e-6)
  assert int(state.step) == 2


def test_the_jitted_boolean_init_is_the_eager_init():
  """The Boolean task compiles `model.init` once for all members; its params are the
  eager init's to the last bit (the quick preset's numbers were measured on those)."""
  import jax
  import jax.numpy as jnp
  from mpx.tasks import boolean
  from mpx.tasks.boolean import gotu as boolean_gotu
  experiment = config_lib.load_experiment("boolean_gotu")
  _, config = config_lib.make_config(experiment, "tiny")
  (member,) = [m for m in boolean_gotu.members(config, "2parity") if m.scheme == "default"]
  params = boolean_gotu.make_task(config, "2parity").init(member)
  eager = boolean_gotu.make_model(config).init(jax.random.key(member.seed),
                                               boolean.tokens(jnp.ones((1, 15))))["params"]
  chex.assert_trees_all_equal(params, eager)
  # One compiled init per model, shared by every group that builds it (the discovery
  # stages' too), and never another model's: a wider config gets wider params.
  assert boolean_gotu.make_model_init(config, 15) is boolean_gotu.make_model_init(config, 15)
  wide = boolean_gotu.make_model_init(dataclasses.replace(config, width=2 * config.width), 15)
  chex.assert_trees_all_equal_shapes(
      wide(jax.random.key(0)), boolean_gotu.make_model(dataclasses.replace(
          config, width=2 * config.width)).init(jax.random.key(0), boolean.tokens(
              jnp.ones((1, 15))))["params"])
