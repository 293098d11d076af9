"""Persistence diagnostics: drift, fidelity, gradient norms, steps-to-half."""

import functools

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx

from mpx import diagnostics, priors
from mpx.attention import attention_weights
from mpx.nn import MaskedSelfAttention, TokenTransformer
from mpx.tasks import boolean

MODEL_KW = dict(width=16, depth=2, num_heads=2, head_dim=8, mlp_dim=16)
N_BITS = 6


def _model(strength=None, learnable=True):
  init = (priors.neutral_init if strength is None else
          priors.as_initializer(priors.repeat_heads(priors.parity_prior(N_BITS, (0, 1),
                                                                        strength), 2)))
  return TokenTransformer(mask_init=init, learnable_mask=learnable, **MODEL_KW)


def _tokens():
  return boolean.tokens(jax.random.rademacher(jax.random.key(0), (32, N_BITS)))


def test_drift_is_zero_at_init_and_for_frozen_masks():
  model = _model(4.0, learnable=False)
  params = model.init(jax.random.key(1), _tokens())["params"]
  drift = diagnostics.relative_drift(params, params)
  assert set(drift) == {"block_0", "block_1"}
  assert all(v == 0.0 for layer in drift.values() for v in layer.values())
  loss = lambda p: jnp.mean(model.apply({"params": p}, _tokens()) ** 2)
  trained = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, jax.grad(loss)(params))
  drift = diagnostics.relative_drift(trained, params)
  assert drift["block_0"]["mask"] == 0.0          # Frozen: stop_gradient, zero gradient.
  assert drift["block_0"]["query"] > 0.0


def test_fidelity_of_hard_and_neutral_priors():
  hard = _model(20.0)
  params = hard.init(jax.random.key(2), _tokens())["params"]
  allowed = priors.parity_prior(N_BITS, (0, 1)) > 0
  maps = diagnostics.attention_maps(hard.apply, params, _tokens())
  chex.assert_shape(maps["block_0"], (32, 2, N_BITS + 1, N_BITS + 1))
  assert all(diagnostics.prior_fidelity(w, allowed) > 0.99 for w in maps.values())
  uniform_q = jnp.zeros((1, N_BITS + 1, 1, 4))   # Equal logits: uniform attention.
  uniform = attention_weights(uniform_q, uniform_q)
  share = float(np.mean(np.asarray(allowed).sum(-1) / (N_BITS + 1)))
  assert diagnostics.prior_fidelity(uniform, allowed) == pytest.approx(share, rel=1e-6)
  assert diagnostics.prior_fidelity(uniform, np.ones_like(allowed)) == pytest.approx(1.0)


def test_gradient_norms_match_jax_grad():
  model = _model(3.0)
  params = model.init(jax.random.key(3), _tokens())["params"]
  loss = lambda p, batch: jnp.mean((model.apply({"params": p}, batch["t"])[:, 0] - 1) ** 2)
  batch = {"t": _tokens()}
  grads = jax.grad(loss)(params, batch)
  norms = diagnostics.gradient_norms(grads)
  g = grads["block_1"]["attention"]
  assert norms["block_1"]["mask"] == pytest.approx(float(jnp.sqrt(jnp.sum(
      g["mask_logits"] ** 2))), rel=1e-6)
  assert norms["block_1"]["key"] == pytest.approx(float(jnp.sqrt(jnp.sum(
      g["key"]["kernel"] ** 2))), rel=1e-6)
  metrics = diagnostics.persistence_metrics(model.apply, loss, params, params, (_tokens(),),
                                            batch, priors.parity_prior(N_BITS) > 0)
  assert metrics["block_0"]["drift_mask"] == 0.0  # ±3 everywhere: every entry can move.
  assert set(metrics) == {"block_0", "block_1"} and "drift_mask_rms" not in metrics["block_0"]
  assert metrics["block_1"]["grad_norm_mask"] == pytest.approx(norms["block_1"]["mask"])
  assert 0.0 < metrics["block_0"]["fidelity"] <= 1.0


def test_steps_to_half():
  assert diagnostics.steps_to_half([0, 10, 20, 30], [0.9, 0.7, 0.44, 0.2]) == 20
  assert diagnostics.steps_to_half([0, 10], [0.9, 0.5]) is None
  assert diagnostics.steps_to_half([], []) is None


def test_mean_attention_map_averages_batch_and_heads():
  weights = jax.nn.softmax(jax.random.normal(jax.random.key(4), (3, 2, 5, 5)), axis=-1)
  mean = diagnostics.mean_attention_map(weights, decimals=6)
  assert isinstance(mean, np.ndarray) and mean.dtype == np.float64
  chex.assert_shape(mean, (5, 5))
  np.testing.assert_allclose(mean, np.asarray(weights).mean((0, 1)), atol=1e-6)
  np.testing.assert_allclose(mean.sum(-1), 1.0, atol=1e-5)


def test_mask_drift_counts_only_entries_off_the_neutral_logit():
  """An ALiBi-like causal prior stores the diagonal and the future at the neutral logit
  (zero gradient); they must not enter ‖M₀‖, or the drift is understated many times."""
  model = _model(None)
  params = model.init(jax.random.key(5), _tokens())["params"]
  n = N_BITS + 1
  prior = jnp.where(jnp.tril(jnp.ones((n, n), bool), -1),
                    -jnp.arange(n)[:, None] + jnp.arange(n)[None, :] - 1.0,
                    priors.NEUTRAL_LOGIT)
  prior = priors.repeat_heads(prior, 2)
  start = jax.tree_util.tree_map_with_path(
      lambda path, p: prior if path[-1].key == "mask_logits" else p, params)
  moved = jax.tree_util.tree_map_with_path(   # Every movable entry shifted by 0.5.
      lambda path, p: jnp.where(p != priors.NEUTRAL_LOGIT, p + 0.5, p)
      if path[-1].key == "mask_logits" else p, start)
  below = np.asarray(prior)[np.asarray(prior) != priors.NEUTRAL_LOGIT]
  expected = 0.5 * np.sqrt(below.size) / np.linalg.norm(below)
  drift = diagnostics.relative_drift(moved, start)
  assert drift["block_0"]["mask"] == pytest.approx(expected, rel=1e-5)
  # Neutral everywhere: nothing can move, so no drift is reported (None, not 0).
  neutral = diagnostics.relative_drift(params, params)
  assert neutral["block_0"]["mask"] is None and neutral["block_0"]["query"] == 0.0
  means = diagnostics.layer_means({"block_0": {"fidelity": 1.0, "drift_mask": None,
                                               "drift_query": 0.1, "drift_key": 0.3},
                                   "block_1": {"fidelity": 0.5, "drift_mask": 0.4,
                                               "drift_query": 0.1, "drift_key": 0.3}})
  assert means["drift_mask"] == pytest.approx(0.4) and means["drift_qk"] == pytest.approx(0.2)
  assert diagnostics.layer_means({"b": {"fidelity": 1.0, "drift_mask": None,
                                        "drift_query": 0.1, "drift_key": 0.1}}
                                 )["drift_mask"] is None


# ----------------------------------------------------------------- any model's param tree

def _attn_leaves(mask, scale=1.0):
  """One attention module's params as Flax names them: mask, query/key/value/out."""
  kernel = scale * jnp.arange(12.0).reshape(4, 3) / 10 + 0.1
  return {"mask_logits": mask, "query": {"kernel": kernel, "bias": jnp.ones(3)},
          "key": {"kernel": 2 * kernel}, "value": {"kernel": kernel}, "out": {"kernel": kernel}}


def test_layers_are_the_modules_holding_masks_at_any_depth():
  """A layer is named by its full path: two layers deep in an encoder stay two layers."""
  m0 = jnp.array([[2.0, -2.0], [-2.0, 2.0]])
  start = {"Encoder_0": {"layers_0": {"attn": _attn_leaves(m0)},
                         "layers_1": {"attn": _attn_leaves(m0)}},
           "head": {"kernel": jnp.ones((3, 2))}}
  moved = {"Encoder_0": {"layers_0": {"attn": _attn_leaves(m0 + 0.5)},
                         "layers_1": {"attn": _attn_leaves(m0, scale=1.1)}},
           "head": {"kernel": jnp.zeros((3, 2))}}
  drift = diagnostics.relative_drift(moved, start)
  assert set(drift) == {"Encoder_0/layers_0/attn", "Encoder_0/layers_1/attn"}
  first, second = drift["Encoder_0/layers_0/attn"], drift["Encoder_0/layers_1/attn"]
  assert first["mask"] == pytest.approx(0.5 * 2 / np.linalg.norm(m0), rel=1e-6)
  assert first["query"] == first["key"] == 0.0 and second["mask"] == 0.0
  kernel = np.asarray(start["Encoder_0"]["layers_1"]["attn"]["query"]["kernel"])
  expected = 0.1 * np.linalg.norm(np.arange(12.0) / 10) / np.linalg.norm(kernel)
  assert second["query"] == pytest.approx(expected, rel=1e-5)
  assert diagnostics.relative_drift(flax.core.freeze(moved), flax.core.freeze(start)) == drift
  norms = diagnostics.gradient_norms(moved)
  assert norms["Encoder_0/layers_0/attn"]["mask"] == pytest.approx(
      float(jnp.linalg.norm(m0 + 0.5)), rel=1e-6)


def test_a_module_named_attention_reports_as_its_parent_and_names_must_not_collide():
  m0 = jnp.full((2, 2), 3.0)
  tree = {"block_0": {"attention": _attn_leaves(m0)}, "attention": _attn_leaves(m0)}
  assert set(diagnostics.relative_drift(tree, tree)) == {"block_0", "attention"}
  clash = {"a": {"attention": _attn_leaves(m0), **_attn_leaves(m0)}}
  with pytest.raises(ValueError, match="both report as layer 'a'; rename"):
    diagnostics.relative_drift(clash, clash)
  with pytest.raises(ValueError, match="different attention layers"):
    diagnostics.relative_drift(tree, {"block_0": tree["block_0"]})


class _NnxAttention(nnx.Module):
  """A user's NNX attention: the mask beside query/key projections; sows its weights."""

  def __init__(self, mask, rngs):
    self.query, self.key = nnx.Linear(4, 4, rngs=rngs), nnx.Linear(4, 4, rngs=rngs)
    self.mask_logits = nnx.Param(mask)

  def __call__(self, x_BND):
    logits = jnp.einsum("bnd,bmd->bnm", self.query(x_BND), self.key(x_BND))
    weights_BHNN = jax.nn.softmax(logits + jax.nn.log_sigmoid(self.mask_logits[...]))[:, None]
    self.sow(nnx.Intermediate, "attention_weights", weights_BHNN)
    return jnp.einsum("bhnm,bmd->bnd", weights_BHNN, x_BND)


class _NnxModel(nnx.Module):
  def __init__(self, mask, rngs):
    self.layers = nnx.List([_NnxAttention(mask, rngs), _NnxAttention(mask, rngs)])

  def __call__(self, x_BND):
    for layer in self.layers:
      x_BND = layer(x_BND)
    return x_BND


def _as_dict(model: _NnxModel) -> dict:
  """The NNX model's params as a plain Linen-style dict, string keys."""
  return {"layers": {str(i): {"mask_logits": layer.mask_logits[...],
                              "query": {"kernel": layer.query.kernel[...]},
                              "key": {"kernel": layer.key.kernel[...]}}
                     for i, layer in enumerate(model.layers)}}


def test_nnx_state_gives_the_numbers_of_the_equivalent_dict():
  prior = jnp.array([[20.0, -20.0, 20.0]] * 3)
  model = _NnxModel(prior, nnx.Rngs(0))
  start = nnx.state(model, nnx.Param)
  moved = jax.tree_util.tree_map(lambda x: 1.2 * x, start)
  drift = diagnostics.relative_drift(moved, start)
  assert set(drift) == {"layers/0", "layers/1"}
  assert drift["layers/0"]["mask"] == pytest.approx(0.2, rel=1e-5)
  as_dicts = [jax.tree_util.tree_map(lambda x: 1.2 * x, _as_dict(model)), _as_dict(model)]
  assert diagnostics.relative_drift(*as_dicts) == drift
  assert diagnostics.relative_drift(nnx.to_pure_dict(moved),
                                    nnx.to_pure_dict(start)) == drift
  assert diagnostics.gradient_norms(moved) == diagnostics.gradient_norms(as_dicts[0])
  x_BND = jax.random.normal(jax.random.key(0), (2, 3, 4))
  _, intermediates = nnx.capture(model, nnx.Intermediate)(x_BND)
  maps = diagnostics.attention_maps_from(intermediates)
  assert set(maps) == set(drift)
  chex.assert_shape(maps["layers/1"], (2, 1, 3, 3))
  assert diagnostics.prior_fidelity(maps["layers/0"], prior > 0) > 0.99


class Layer(nn.Module):
  @nn.compact
  def __call__(self, x_BND):
    return x_BND + MaskedSelfAttention(2, 4, per_head_mask=False, name="attn")(x_BND)


class Encoder(nn.Module):
  @nn.compact
  def __call__(self, x_BND):
    return Layer(name="layers_1")(Layer(name="layers_0")(x_BND))


class Model(nn.Module):
  @nn.compact
  def __call__(self, x_BND):
    return Encoder()(x_BND)


def test_linen_attention_maps_are_keyed_like_drift_on_a_nested_model():
  x_BND = jnp.ones((3, 5, 8))
  model = Model()
  params = model.init(jax.random.key(0), x_BND)["params"]
  maps = diagnostics.attention_maps(model.apply, params, x_BND)
  assert set(maps) == set(diagnostics.relative_drift(params, params)) == {
      "Encoder_0/layers_0/attn", "Encoder_0/layers_1/attn"}
  chex.assert_shape(maps["Encoder_0/layers_1/attn"], (3, 2, 5, 5))
  _, state = model.apply({"params": params}, x_BND, mutable=["intermediates"])
  assert set(diagnostics.attention_maps_from(state)) == set(maps)  # The whole state too.


def test_a_mask_starting_at_zero_reports_its_rms_change_not_a_relative_drift():
  """M₀ = 0 (a learnable neutral prior) has no scale for ‖M − M₀‖/‖M₀‖: drift_mask is
  None and drift_mask_rms = ‖M − M₀‖/√n; masks that start elsewhere report as before."""
  model = TokenTransformer(mask_init=jax.nn.initializers.zeros, **MODEL_KW)
  params = model.init(jax.random.key(6), _tokens())["params"]
  moved = jax.tree_util.tree_map_with_path(
      lambda path, p: p + jnp.where(jnp.eye(N_BITS + 1, dtype=bool), 0.3, 0.0)
      if path[-1].key == "mask_logits" else p, params)
  assert diagnostics.relative_drift(moved, params)["block_0"]["mask"] is None
  rms = 0.3 * np.sqrt(2 * (N_BITS + 1) / (2 * (N_BITS + 1) ** 2))  # 2 heads' diagonals.
  assert diagnostics.mask_rms_change(moved, params)["block_1"] == pytest.approx(rms, rel=1e-5)
  loss = lambda p, batch: jnp.mean(model.apply({"params": p}, batch["t"]) ** 2)
  metrics = diagnostics.persistence_metrics(model.apply, loss, moved, params, (_tokens(),),
                                            {"t": _tokens()}, priors.parity_prior(N_BITS) > 0)
  assert metrics["block_0"]["drift_mask"] is None
  assert metrics["block_0"]["drift_mask_rms"] == pytest.approx(rms, rel=1e-5)
  assert diagnostics.layer_means(metrics)["drift_mask"] is None
  assert diagnostics.mask_rms_change(params, params)["block_0"] == 0.0
  neutral = _model(None).init(jax.random.key(5), _tokens())["params"]  # Nothing can move.
  assert diagnostics.mask_rms_change(neutral, neutral)["block_0"] is None


def test_attention_maps_of_flax_attention_alone_need_no_sow_weights():
  model = nn.MultiHeadDotProductAttention(num_heads=2)
  x = jnp.ones((1, 3, 4))
  params = model.init(jax.random.key(0), x)["params"]
  maps = diagnostics.attention_maps(model.apply, params, x)
  chex.assert_trees_all_close(maps, diagnostics.attention_maps(
      functools.partial(model.apply, sow_weights=True), params, x), atol=0, rtol=0)
  assert [m.shape for m in maps.values()] == [(1, 2, 3, 3)]


class _UneditedEncoder(nn.Module):
  """A user's Linen model: Flax's attention and mpx's drop-in, `sow_weights` nowhere."""
  sow: bool = False  # Only the reference below passes it down.

  @nn.compact
  def __call__(self, x_BND):
    import mpx.nn
    prior = priors.as_initializer(2.0 * jax.random.normal(jax.random.key(3), (2, 5, 5)))
    x_BND = x_BND + nn.MultiHeadDotProductAttention(num_heads=2, name="flax_attn")(
        x_BND, sow_weights=self.sow)
    return x_BND + mpx.nn.MultiHeadDotProductAttention(
        num_heads=2, mask_init=prior, name="mpx_attn")(x_BND, sow_weights=self.sow)


def test_attention_maps_of_an_unedited_linen_model_equal_the_sown_ones():
  x = jax.random.normal(jax.random.key(1), (3, 5, 8))
  model = _UneditedEncoder()
  params = model.init(jax.random.key(0), x)["params"]
  maps = jax.jit(lambda p, x: diagnostics.attention_maps(model.apply, p, x))(params, x)
  _, state = _UneditedEncoder(sow=True).apply({"params": params}, x,
                                              mutable=["intermediates"])
  sown = diagnostics.attention_maps_from(state["intermediates"])
  assert set(maps) == set(sown) == {"flax_attn", "mpx_attn"}
  chex.assert_trees_all_close(maps, sown, atol=0, rtol=0)
  chex.assert_shape(maps["mpx_attn"], (3, 2, 5, 5))
  assert not np.allclose(maps["mpx_attn"], maps["flax_attn"])  # The prior shows.
  with pytest.raises(ValueError, match="no Flax or mpx attention module"):
    diagnostics.attention_maps(nn.Dense(3).apply, nn.Dense(3).init(jax.random.key(0), x)
                               ["params"], x)


class _NnxEncoder(nnx.Module):
  def __init__(self, rngs):
    import mpx.nnx
    prior = priors.as_initializer(2.0 * jax.random.normal(jax.random.key(3), (2, 5, 5)))
    self.flax_attn = nnx.MultiHeadAttention(2, 8, decode=False, rngs=rngs)
    self.mpx_attn = mpx.nnx.MultiHeadAttention(2, 8, decode=False, num_tokens=5,
                                               mask_init=prior, rngs=rngs)

  def __call__(self, x_BND, sow_weights=False):
    x_BND = x_BND + self.flax_attn(x_BND, sow_weights=sow_weights)
    return x_BND + self.mpx_attn(x_BND, sow_weights=sow_weights)


def test_nnx_attention_maps_of_an_unedited_model_equal_the_sown_ones():
  x = jax.random.normal(jax.random.key(1), (3, 5, 8))
  model = _NnxEncoder(nnx.Rngs(0))
  out_before = model(x)
  maps = diagnostics.nnx_attention_maps(model, x)
  _, sown = nnx.capture(model, nnx.Intermediate)(x, sow_weights=True)
  assert set(maps) == {"flax_attn", "mpx_attn"}
  chex.assert_trees_all_close(maps, diagnostics.attention_maps_from(sown), atol=0, rtol=0)
  assert not np.allclose(maps["mpx_attn"], maps["flax_attn"])
  # The model is left as it was: the same output, and a plain call sows nothing.
  np.testing.assert_array_equal(model(x), out_before)
  _, after = nnx.capture(model, nnx.Intermediate)(x)
  assert not diagnostics.attention_maps_from(after)
