"""A Flax model written without mpx, its attention swapped for mpx's drop-in by one line:
its earlier checkpoint loads, the neutral prior reproduces it exactly, and it trains with
a prior that moves. Linen and NNX alike."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import linen as nn
from flax import nnx

import mpx
import mpx.nn
import mpx.nnx
from mpx import priors

B, N, D, H = 4, 6, 16, 2
NEAR_NN = np.abs(np.arange(N)[:, None] - np.arange(N)[None, :]) <= 1
PRIOR = priors.from_adjacency(NEAR_NN, 2.0)          # [N, N], shared by the heads.


def _data():
  x = jax.random.normal(jax.random.key(0), (B, N, D))
  return x, jnp.sin(x[:, :, :2].sum(axis=1))          # [B, 2]


def _tx():
  """AdamW with the mask exempt from decay, as a user writes it with plain optax."""
  return optax.adamw(3e-2, weight_decay=1e-2, mask=mpx.not_masks)


def _save_and_restore(tmp_path, tree):
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "old", tree)
    checkpointer.wait_until_finished()
    return checkpointer.restore(tmp_path / "old")


class LinenModel(nn.Module):
  attention: type = nn.MultiHeadDotProductAttention   # The one line a user changes.
  prior_kwargs: tuple = ()

  @nn.compact
  def __call__(self, x_BND):
    x_BND = x_BND + self.attention(num_heads=H, **dict(self.prior_kwargs))(x_BND)
    return nn.Dense(2)(nn.LayerNorm()(x_BND).mean(axis=-2))


def _linen_train(model, params, steps):
  x, y = _data()
  tx = _tx()
  loss_fn = lambda p: jnp.mean((model.apply({"params": p}, x) - y) ** 2)

  @jax.jit
  def step(params, opt_state):
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = tx.init(params)
  losses = []
  for _ in range(steps):
    params, opt_state, loss = step(params, opt_state)
    losses.append(float(loss))
  return params, losses


def test_linen_model_swaps_loads_and_trains_with_the_prior(tmp_path):
  x, _ = _data()
  old = LinenModel()
  old_params, _ = _linen_train(old, old.init(jax.random.key(1), x)["params"], 3)
  restored = _save_and_restore(tmp_path, old_params)

  neutral = LinenModel(mpx.nn.MultiHeadDotProductAttention)
  loaded = mpx.merge_params(neutral.init(jax.random.key(2), x)["params"], restored)
  np.testing.assert_array_equal(neutral.apply({"params": loaded}, x),
                                old.apply({"params": old_params}, x))

  shaped = LinenModel(mpx.nn.MultiHeadDotProductAttention, (
      ("mask_init", priors.as_initializer(PRIOR)), ("per_head_mask", False)))
  params = mpx.merge_params(shaped.init(jax.random.key(2), x)["params"], restored)
  mask = lambda p: p["MultiHeadDotProductAttention_0"]["mask_logits"]
  np.testing.assert_array_equal(mask(params), PRIOR)
  trained, losses = _linen_train(shaped, params, 20)
  assert losses[-1] < 0.5 * losses[0]
  assert 0 < float(jnp.abs(mask(trained) - PRIOR).max()) < 1.0   # Moves, stays a prior.


class NnxModel(nnx.Module):
  def __init__(self, rngs, attention=nnx.MultiHeadAttention, **prior):
    self.attention = attention(num_heads=H, in_features=D, decode=False, rngs=rngs, **prior)
    self.norm = nnx.LayerNorm(D, rngs=rngs)
    self.head = nnx.Linear(D, 2, rngs=rngs)

  def __call__(self, x_BND):
    return self.head(self.norm(x_BND + self.attention(x_BND)).mean(axis=-2))


def _nnx_train(model, steps):
  x, y = _data()
  optimizer = nnx.Optimizer(model, _tx(), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads)
    return loss

  return [float(step(model, optimizer)) for _ in range(steps)]


def _load(model, restored):
  state = nnx.state(model)
  nnx.replace_by_pure_dict(state, mpx.merge_params(nnx.to_pure_dict(state), restored))
  nnx.update(model, state)


def test_nnx_model_swaps_loads_and_trains_with_the_prior(tmp_path):
  x, _ = _data()
  old = NnxModel(nnx.Rngs(1))
  _nnx_train(old, 3)
  restored = _save_and_restore(tmp_path, nnx.state(old))     # Raw state: paths end in value.

  neutral = NnxModel(nnx.Rngs(2), mpx.nnx.MultiHeadAttention, num_tokens=N)
  _load(neutral, restored)
  np.testing.assert_array_equal(neutral(x), old(x))

  shaped = NnxModel(nnx.Rngs(2), mpx.nnx.MultiHeadAttention, num_tokens=N,
                    per_head_mask=False, mask_init=priors.as_initializer(PRIOR))
  _load(shaped, restored)
  np.testing.assert_array_equal(shaped.attention.mask_logits[...], PRIOR)
  losses = _nnx_train(shaped, 20)
  assert losses[-1] < 0.5 * losses[0]
  moved = float(jnp.abs(shaped.attention.mask_logits[...] - PRIOR).max())
  assert 0 < moved < 1.0
