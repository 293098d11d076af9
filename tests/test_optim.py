"""Per-member optimizers against a hand-written numpy Adam, over several steps.

One step cannot tell coupled L2 apart from none: Adam's first update is −lr·sign(g')
whatever g' is. Over several steps, with leaves where g and wd·θ differ in size and sign,
the moments remember what was fed into them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mpx.sweep import optim

B1, B2, EPS = 0.9, 0.999, 1e-8
LR, WD, MULTIPLIER = 0.1, 0.5, 0.25
STEPS = 4
# wd·θ dominates g in "w", is comparable in "b" and negligible in "tiny".
PARAMS = {"w": np.array([3.0, -2.0, 0.5, 0.05]), "b": np.array([0.4, -1.0]),
          "tiny": np.array([1e-3, -2e-3]),
          "attention": {"mask_logits": np.array([2.0, -3.0, 0.5])}}
GRAD_SCALES = {"w": 0.1, "b": 0.5, "tiny": 1.0, "attention": {"mask_logits": 0.3}}


def _grads():
  """A fixed sequence of per-step gradients, independent of the params."""
  rng = np.random.default_rng(0)
  return [jax.tree_util.tree_map(lambda p, s: s * rng.normal(size=p.shape), PARAMS,
                                 GRAD_SCALES) for _ in range(STEPS)]


def _numpy_adam(theta, grads, *, coupled_wd=0.0, decoupled_wd=0.0, lr_scale=1.0):
  """Adam in float64: `coupled_wd` adds wd·θ to g before the moments (PyTorch's
  `Adam(weight_decay=…)`), `decoupled_wd` adds wd·θ to the normalised step (AdamW)."""
  theta = np.asarray(theta, np.float64)
  m = v = np.zeros_like(theta)
  for t, g in enumerate(grads, start=1):
    g = g + coupled_wd * theta
    m = B1 * m + (1 - B1) * g
    v = B2 * v + (1 - B2) * g * g
    step = (m / (1 - B1 ** t)) / (np.sqrt(v / (1 - B2 ** t)) + EPS) + decoupled_wd * theta
    theta = theta - LR * lr_scale * step
  return theta


def _train(optimizer: str, hparams: dict):
  """The params after STEPS updates of `optim.make_optimizer`."""
  tx = optim.make_optimizer(optim.OptimConfig(optimizer, b1=B1, b2=B2, eps=EPS), hparams)
  params = jax.tree_util.tree_map(lambda p: jnp.asarray(p, jnp.float32), PARAMS)
  state = tx.init(params)
  for g in _grads():
    updates, state = tx.update(jax.tree_util.tree_map(jnp.float32, g), state, params)
    params = optax.apply_updates(params, updates)
  return params


def _leaf_grads(name: str):
  """One leaf's gradient per step; `mask` names the `mask_logits` leaf."""
  get = (lambda g: g["attention"]["mask_logits"]) if name == "mask" else (lambda g: g[name])
  return [get(g) for g in _grads()]


def _check(optimizer: str, decay_kind: str):
  params = _train(optimizer, {"learning_rate": LR, "weight_decay": WD,
                              "mask_lr_multiplier": MULTIPLIER})
  for name in ("w", "b", "tiny"):
    expected = _numpy_adam(PARAMS[name], _leaf_grads(name), **{decay_kind: WD})
    np.testing.assert_allclose(params[name], expected, rtol=2e-5, atol=1e-6, err_msg=name)
  # The mask: plain Adam without decay, at the mask's learning rate.
  mask = PARAMS["attention"]["mask_logits"]
  expected = _numpy_adam(mask, _leaf_grads("mask"), lr_scale=MULTIPLIER)
  np.testing.assert_allclose(params["attention"]["mask_logits"], expected, rtol=2e-5,
                             atol=1e-6, err_msg="mask_logits")
  # The test can fail: without decay, or with decay on the mask, the numbers differ.
  for name in ("w", "b"):
    plain = _numpy_adam(PARAMS[name], _leaf_grads(name))
    assert np.abs(plain - _numpy_adam(PARAMS[name], _leaf_grads(name),
                                      **{decay_kind: WD})).max() > 1e-3
  decayed_mask = _numpy_adam(mask, _leaf_grads("mask"), lr_scale=MULTIPLIER,
                             **{decay_kind: WD})
  assert np.abs(decayed_mask - expected).max() > 1e-3


def test_adam_l2_feeds_the_decay_into_the_moments_but_not_the_mask():
  _check("adam_l2", "coupled_wd")


def test_adamw_decays_outside_the_moments_but_not_the_mask():
  _check("adamw", "decoupled_wd")


@pytest.mark.parametrize("optimizer", optim.OPTIMIZERS)
def test_zero_mask_lr_multiplier_freezes_the_mask(optimizer):
  params = _train(optimizer, {"learning_rate": LR, "weight_decay": WD,
                              "mask_lr_multiplier": 0.0})
  np.testing.assert_array_equal(params["attention"]["mask_logits"],
                                np.float32(PARAMS["attention"]["mask_logits"]))
  assert not np.array_equal(params["w"], np.float32(PARAMS["w"]))


@pytest.mark.parametrize("hparams, missing", [
    ({"learning_rate": LR, "mask_lr_multiplier": 1.0}, r"\['weight_decay'\]"),
    ({"learning_rate": LR, "weight_decay": 0.0}, r"\['mask_lr_multiplier'\]"),
    ({"learning_rate": LR}, r"\['weight_decay', 'mask_lr_multiplier'\]"),
])
def test_missing_hparams_are_an_error_not_a_default(hparams, missing):
  with pytest.raises(ValueError, match=missing + ".*every member must set"):
    optim.make_optimizer(optim.OptimConfig(), hparams)


def test_schedules_and_bad_configs():
  shape = optim.schedule_shape(optim.OptimConfig(schedule="warmup_cosine", total_steps=100,
                                                 warmup_steps=10))
  assert float(shape(0)) == 0.0 and float(shape(10)) == pytest.approx(1.0)
  assert float(shape(100)) == pytest.approx(0.0, abs=1e-6)
  with pytest.raises(ValueError, match="optimizer"):
    optim.OptimConfig("sgd")
  with pytest.raises(ValueError, match="same hparam names"):
    optim.stack_hparams([{"learning_rate": 1.0}, {"lr": 1.0}])


# --------------------------------------------------------------------------- decay groups


def _paths(tree) -> dict[str, bool]:
  return {optim.param_path(path): bool(leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _vit_params(preset: str):
  """The param tree (shapes only) of a vision preset's ViT."""
  from mpx.sweep import config as config_lib
  from mpx.tasks import vision
  _, config = config_lib.make_config(config_lib.load_experiment("vision"), preset)
  model = vision.make_model(config)
  images = jnp.zeros((1, config.image_size, config.image_size, vision.channels(config)))
  return jax.eval_shape(lambda: model.init(jax.random.key(0), images)["params"])


@pytest.mark.parametrize("preset", ["cifar10", "cifar10_32"])
def test_vit_recipe_decays_the_kernels_only(preset):
  """DeiT / timm: no decay on pos_embed, the CLS token, biases (the Q/K/V biases are
  [H, head_dim] here, not 1-D) and LayerNorm scales; the mask never decays."""
  from mpx.tasks import vision
  decays = _paths(optim.decay_tree(optim.OptimConfig("adamw",
                                                     no_decay=vision.NO_WEIGHT_DECAY),
                                   _vit_params(preset)))
  assert {p for p, d in decays.items() if d} == {p for p in decays if p.endswith("/kernel")}
  assert not decays["block_0/attention/query/bias"] and not decays["final_norm/scale"]
  assert not decays["block_0/attention/mask_logits"]
  learned = preset == "cifar10"  # 224 px: CLS and learned positions; 32 px: GAP, sin-cos.
  assert ("pos_embed" in decays) == ("cls" in decays) == learned
  if learned:
    assert not decays["pos_embed"] and not decays["cls"]


def test_exempt_leaves_keep_their_values_under_adamw():
  """One AdamW step with zero gradients: exactly the decayed leaves shrink by lr·wd."""
  from mpx.tasks import vision
  params = jax.tree_util.tree_map(lambda s: jnp.ones(s.shape, s.dtype),
                                  _vit_params("quick"))  # The recipe's names, small.
  assert {"pos_embed", "cls"} <= set(params)
  config = optim.OptimConfig("adamw", no_decay=vision.NO_WEIGHT_DECAY)
  tx = optim.make_optimizer(config, {"learning_rate": LR, "weight_decay": WD,
                                     "mask_lr_multiplier": 1.0})
  step = jax.jit(lambda p: optax.apply_updates(  # One compile, not one per eager op.
      p, tx.update(jax.tree_util.tree_map(jnp.zeros_like, p), tx.init(p), p)[0]))
  new = step(params)
  for path, leaf in jax.tree_util.tree_leaves_with_path(new):
    name = optim.param_path(path)
    expected = 1 - LR * WD if name.endswith("/kernel") else 1.0
    np.testing.assert_allclose(leaf, expected, rtol=1e-6, err_msg=name)


@pytest.mark.parametrize("name", ["boolean_gotu", "arithmetic", "language"])
def test_token_families_decay_every_weight_but_the_mask(name):
  """Boolean keeps the GOTU code's coupled L2 on every weight but the mask; arithmetic and
  language (AdamW) decay every weight but the mask too, unlike NanoGPT / llama2.c, which
  exempt biases and norms: kept as measured, so their results stand."""
  from mpx.sweep import config as config_lib
  experiment = config_lib.load_experiment(name)
  _, config = config_lib.make_config(experiment, "tiny")
  group = experiment.build_groups(config)[0]
  decays = _paths(optim.decay_tree(group.optim, group.task.init(group.members[0])))
  assert group.optim.no_decay == ()
  assert {p for p, d in decays.items() if not d} == {
      p for p in decays if p.endswith("/mask_logits")}
  assert len(decays) > 10


def test_bad_no_decay_rules_name_the_fix():
  with pytest.raises(ValueError, match=r"must be a tuple of patterns, e\.g\. \('pos_embed',\)"):
    optim.OptimConfig(no_decay="pos_embed")
  with pytest.raises(ValueError, match="not a regex"):
    optim.OptimConfig(no_decay=("(bias",))
  assert hash(optim.OptimConfig(no_decay=["bias"])) == hash(optim.OptimConfig(no_decay=("bias",)))
