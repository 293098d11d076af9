"""The Boolean mask-design search: design registry, per-layer writer, config checks."""

import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpx import attention, priors, schemes
from mpx.nn import TokenTransformer
from mpx.sweep import config as config_lib
from mpx.sweep import engine
from mpx.tasks.boolean import gotu as family
from mpx.tasks import boolean

EXPERIMENT = config_lib.load_experiment(
    str(pathlib.Path(__file__).parents[1] / "experiments" / "boolean_gotu.py"))
DEPTH, HEADS, N = 3, 4, 16


def _bias(prior):
  return np.asarray(attention.mask_bias(jnp.asarray(prior)))


@pytest.mark.parametrize("task", ["2parity", "majority3", "cyclic3"])
@pytest.mark.parametrize("name", sorted(family.MASK_DESIGNS))
def test_every_design_gives_one_prior_per_layer(name, task):
  layers = family.mask_design(name, task, 4.0, DEPTH, HEADS)
  assert len(layers) == DEPTH
  for prior in layers:
    assert tuple(prior.shape) in ((N, N), (HEADS, N, N))
    assert np.all(np.isfinite(np.asarray(prior)))


@pytest.mark.parametrize("name, prior_layer", [("first_layer_only", 0),
                                               ("last_layer_only", DEPTH - 1)])
def test_layer_only_designs_are_neutral_elsewhere(name, prior_layer):
  layers = family.mask_design(name, "2parity", 4.0, DEPTH, HEADS)
  for i, prior in enumerate(layers):
    if i == prior_layer:
      assert _bias(prior).min() < -1.0
    else:
      assert np.all(_bias(prior) == 0.0)


def test_clique_design_is_the_task_prior():
  layers = family.mask_design("clique", "2parity", 4.0, 2, HEADS)
  for prior in layers:
    np.testing.assert_array_equal(prior, family.task_prior("2parity", 4.0))


def test_per_layer_writer_puts_each_prior_in_its_block():
  model = TokenTransformer(width=16, depth=2, num_heads=2, head_dim=8, mlp_dim=16)
  params = model.init(jax.random.key(0), boolean.tokens(jnp.ones((1, 15))))["params"]
  clique = priors.parity_prior(15, (0, 1), 4.0)
  per_head = priors.stack_heads([clique, priors.neutral(N)])
  out = schemes.set_masks_per_layer(params, {"block_0": clique, "block_1": per_head})
  np.testing.assert_array_equal(out["block_0"]["attention"]["mask_logits"],
                                np.broadcast_to(clique, (2, N, N)))
  np.testing.assert_array_equal(out["block_1"]["attention"]["mask_logits"], per_head)
  np.testing.assert_array_equal(out["pos_embed"], params["pos_embed"])
  only_first = schemes.set_masks_per_layer(params, {"block_0": clique})
  np.testing.assert_array_equal(only_first["block_1"]["attention"]["mask_logits"],
                                params["block_1"]["attention"]["mask_logits"])
  with pytest.raises(ValueError, match="block_7"):
    schemes.set_masks_per_layer(params, {"block_7": clique})


def test_unknown_design_lists_valid_names():
  with pytest.raises(ValueError, match="clique"):
    family.mask_design("nope", "2parity", 4.0, 2, HEADS)
  with pytest.raises(ValueError, match="partner_only"):
    EXPERIMENT.Config(designs=("nope",))


def test_designs_expand_mask_into_one_scheme_per_design():
  cfg = EXPERIMENT.Config(schemes=("default", "mask"), designs=("clique", "two_hop"))
  assert family.scheme_labels(cfg) == [("default", None), ("mask:clique", "clique"),
                                           ("mask:two_hop", "two_hop")]
  assert [l for l, _ in family.scheme_labels(EXPERIMENT.Config())] == [
      "default", "qk_svd", "qk_opt", "mask"]


def test_search_group_members_share_one_tree():
  _, cfg = config_lib.make_config(EXPERIMENT, "search", ["width=16", "num_heads=2",
                                                         "head_dim=8", "mlp_dim=16"])
  group = EXPERIMENT.build_groups(cfg)[0]
  assert len(group.members) == 1 + len(family.MASK_DESIGNS)
  trees = [group.task.init(m) for m in group.members[:4]]
  assert len({jax.tree_util.tree_structure(t) for t in trees}) == 1


def test_compute_dtype_and_attention_options():
  with pytest.raises(ValueError, match="bfloat16"):
    EXPERIMENT.Config(compute_dtype="float16")
  with pytest.raises(ValueError, match="reference"):
    EXPERIMENT.Config(attention="flash")
  _, cfg = config_lib.make_config(EXPERIMENT, "tiny", [
      "tasks=2parity", "schemes=mask", "seeds=1", "compute_dtype=bfloat16",
      "attention=jax"])
  group = EXPERIMENT.build_groups(cfg)[0]
  state, hparams, data = engine.place(group, engine.init_state(group), None)
  chex.assert_trees_all_equal_dtypes(state.params, jax.tree_util.tree_map(
      lambda x: x.astype(jnp.float32), state.params))  # Params stay float32.
  state, out = engine.make_train_chunk(group, 2)(state, hparams, data)
  assert np.all(np.isfinite(np.asarray(out["train_loss"])))


@pytest.mark.parametrize("design", ["partner_only", "first_layer_only", "half_heads"])
def test_members_are_scored_on_their_own_design(design):
  """A design's fidelity counts the pairs *its* prior allows, layer by layer and head by
  head, not the clique's."""
  config = EXPERIMENT.Config(**EXPERIMENT.PRESETS["search"])
  label = f"mask:{design}"
  patterns = family.member_patterns(config, "2parity", label, design)
  layers = family.mask_design(design, "2parity", config.mask_strength, config.depth,
                                  config.num_heads)
  assert sorted(patterns) == [f"block_{i}" for i in range(config.depth)]
  clique = np.asarray(family.task_prior("2parity", 4.0)) > 0
  for i, prior in enumerate(layers):
    allowed = patterns[f"block_{i}"]
    chex.assert_shape(allowed, (config.num_heads, N, N))
    np.testing.assert_array_equal(allowed, np.broadcast_to(np.asarray(prior) > 0,
                                                           allowed.shape))
  assert any(not np.array_equal(p, np.broadcast_to(clique, p.shape))
             for p in patterns.values())
  qk = family.member_patterns(config, "2parity", "qk_opt", None)
  assert all(np.array_equal(p, np.broadcast_to(clique, p.shape)) for p in qk.values())
