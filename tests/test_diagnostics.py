"""Persistence diagnostics: drift, fidelity, gradient norms, steps-to-half."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpx import diagnostics, priors
from mpx.attention import attention_weights
from mpx.nn import TokenTransformer
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
  assert metrics["block_1"]["grad_norm_mask"] == pytest.approx(norms["block_1"]["mask"])
  assert 0.0 < metrics["block_0"]["fidelity"] <= 1.0


def test_steps_to_half():
  assert diagnostics.steps_to_half([0, 10, 20, 30], [0.9, 0.7, 0.44, 0.2]) == 20
  assert diagnostics.steps_to_half([0, 10], [0.9, 0.5]) is None
  assert diagnostics.steps_to_half([], []) is None


def test_mean_attention_map_averages_batch_and_heads():
  weights = jax.nn.softmax(jax.random.normal(jax.random.key(4), (3, 2, 5, 5)), axis=-1)
  mean = np.asarray(diagnostics.mean_attention_map(weights, decimals=6))
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
