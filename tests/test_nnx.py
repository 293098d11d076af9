"""Flax NNX: the drop-in `mpx.nnx.MultiHeadAttention` computes flax's attention plus the
prior, and the NNX `MaskedSelfAttention` is the Linen module with transplanted weights."""

import functools
import inspect
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import nnx

import mpx
import mpx.nn
import mpx.nnx
from mpx import priors
from mpx.sweep.optim import OptimConfig, make_optimizer

B, N, F, H = 2, 5, 8, 2
HAS_GQA = "num_kv_heads" in inspect.signature(nnx.MultiHeadAttention.__init__).parameters


def _x(seed, n=N, features=F):
  return jax.random.normal(jax.random.key(seed), (B, n, features))


def _prior(seed, shape):
  """A non-neutral prior: logits in (-4, 4), so every entry of log σ(M) matters."""
  return jax.random.uniform(jax.random.key(seed), shape, jnp.float32, -4.0, 4.0)


def _pair(num_tokens=N, **kwargs):
  """flax's module and the drop-in with the neutral prior, built from the same seed (so the
  same weights: the drop-in's mask draws nothing from `rngs`)."""
  args = dict(num_heads=H, in_features=F, decode=False) | kwargs
  return (nnx.MultiHeadAttention(**args, rngs=nnx.Rngs(0)),
          mpx.nnx.MultiHeadAttention(**args, num_tokens=num_tokens, rngs=nnx.Rngs(0)))


def _load(model, pure_dict):
  state = nnx.state(model)
  nnx.replace_by_pure_dict(state, mpx.merge_params(nnx.to_pure_dict(state), pure_dict))
  nnx.update(model, state)


def test_neutral_drop_in_is_flax_bit_for_bit():
  """Self-attention, a padding mask, cross-attention and dropout under fixed rngs: the
  neutral bias is exactly 0, so the outputs are equal bit for bit."""
  flax_mha, ours = _pair()
  chex.assert_trees_all_equal(nnx.to_pure_dict(nnx.state(flax_mha)),
                              {k: v for k, v in nnx.to_pure_dict(nnx.state(ours)).items()
                               if k != "mask_logits"})
  chex.assert_shape(ours.mask_logits[...], (H, N, N))
  x = _x(1)
  np.testing.assert_array_equal(ours(x), flax_mha(x))
  valid_BN = jnp.arange(N)[None] < jnp.array([[3], [5]])
  mask = nnx.make_attention_mask(valid_BN, valid_BN)
  np.testing.assert_array_equal(ours(x, mask=mask), flax_mha(x, mask=mask))

  flax_mha, ours = _pair((3, N), in_kv_features=6)
  q, kv = _x(2, n=3), _x(3, features=6)
  np.testing.assert_array_equal(ours(q, kv), flax_mha(q, kv))

  flax_mha, ours = _pair(dropout_rate=0.5, deterministic=False)
  dropped = ours(x, rngs=nnx.Rngs(dropout=7))
  np.testing.assert_array_equal(dropped, flax_mha(x, rngs=nnx.Rngs(dropout=7)))
  assert not np.allclose(dropped, ours(x, deterministic=True))


@pytest.mark.skipif(not HAS_GQA, reason="this flax has no num_kv_heads")
def test_grouped_query_drop_in_is_flax():
  flax_mha, ours = _pair(num_heads=4, num_kv_heads=2)
  chex.assert_shape(ours.key.kernel[...], (F, 2, 2))
  chex.assert_shape(ours.mask_logits[...], (4, N, N))  # One prior per *query* head.
  np.testing.assert_array_equal(ours(_x(1)), flax_mha(_x(1)))


@pytest.mark.skipif(not HAS_GQA, reason="this flax has no num_kv_heads")
def test_grouped_query_prior_is_per_query_head():
  """Query head h reads kv head h // (H / Hkv) under its own row of the prior: the reference
  repeats k and v per group, and a prior given to the wrong heads would not match it."""
  prior = _prior(9, (4, N, N))
  model = mpx.nnx.MultiHeadAttention(4, F, num_kv_heads=2, decode=False, num_tokens=N,
                                     mask_init=priors.as_initializer(prior),
                                     rngs=nnx.Rngs(0))
  x = _x(1)
  q = model.query(x)
  k, v = (jnp.repeat(proj(x), 2, axis=-2) for proj in (model.key, model.value))
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  probs = jax.nn.softmax(logits + jax.nn.log_sigmoid(prior), axis=-1)
  expected = model.out(jnp.einsum("bhqk,bkhd->bqhd", probs, v))
  chex.assert_trees_all_close(model(x), expected, atol=1e-6)


def test_bfloat16_keeps_a_non_neutral_prior():
  """bf16 against the same prior in float32, at bf16 rounding; dropping the prior would
  move the output by far more than that."""
  prior = _prior(10, (H, N, N))
  build = lambda dtype, **kw: mpx.nnx.MultiHeadAttention(
      H, F, decode=False, num_tokens=N, dtype=dtype, rngs=nnx.Rngs(0), **kw)
  ours = build(jnp.bfloat16, mask_init=priors.as_initializer(prior))
  expected = build(jnp.float32, mask_init=priors.as_initializer(prior))(_x(1))
  out = ours(_x(1))
  assert out.dtype == jnp.bfloat16 and ours.mask_logits[...].dtype == jnp.float32
  np.testing.assert_allclose(np.float32(out), expected, atol=3e-2, rtol=3e-2)
  assert np.abs(build(jnp.float32)(_x(1)) - expected).max() > 0.2  # The neutral prior.


def test_rngs_stream_is_left_as_flax_leaves_it():
  """Modules built after the attention get the same weights with or without the prior, so
  a model with a prior and one without can be compared from one seed."""
  def linear_after(attention, **kwargs):
    rngs = nnx.Rngs(0)
    attention(num_heads=H, in_features=F, decode=False, rngs=rngs, **kwargs)
    return nnx.Linear(F, 3, rngs=rngs).kernel[...]

  np.testing.assert_array_equal(
      linear_after(mpx.nnx.MultiHeadAttention, num_tokens=N,
                   mask_init=priors.as_initializer(_prior(0, (H, N, N)))),
      linear_after(nnx.MultiHeadAttention))
  twin = lambda use_mask: mpx.nnx.MaskedSelfAttention(H, F, num_tokens=N, use_mask=use_mask,
                                                      rngs=nnx.Rngs(0))
  np.testing.assert_array_equal(twin(True).out.kernel[...], twin(False).out.kernel[...])
  # A random mask_init still gets a key of the seed's own.
  noise = lambda key, shape, dtype: jax.random.normal(key, shape, dtype)
  masks = [mpx.nnx.MultiHeadAttention(H, F, num_tokens=N, mask_init=noise,
                                      rngs=nnx.Rngs(seed)).mask_logits[...]
           for seed in (0, 1)]
  assert not np.allclose(*masks)


def _call_sowing(model, *args, **kwargs):
  """(output, attention_weights) as recorded by `sow_weights=True`: through nnx.capture
  where flax has it (a sow outside it is deprecated there), else from the module."""
  if hasattr(nnx, "capture"):
    out, sown = nnx.capture(model, nnx.Intermediate)(*args, sow_weights=True, **kwargs)
  else:
    out, sown = model(*args, sow_weights=True, **kwargs), nnx.state(model, nnx.Intermediate)
  (weights,) = nnx.to_pure_dict(sown)["attention_weights"]
  return out, weights


def _reference_probs(model, x_BNF, prior):
  """softmax(q·kᵀ/√d + log σ(M)) from the module's own projections."""
  q, k = model.query(x_BNF), model.key(x_BNF)
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  return jax.nn.softmax(logits + jax.nn.log_sigmoid(prior), axis=-1)


@pytest.mark.parametrize("per_head", [True, False])
def test_prior_matches_the_reference_and_sows_its_weights(per_head):
  prior = _prior(3, (H, N, N) if per_head else (N, N))
  model = mpx.nnx.MultiHeadAttention(
      H, F, decode=False, num_tokens=N, per_head_mask=per_head,
      mask_init=priors.as_initializer(prior), rngs=nnx.Rngs(0))
  x = _x(1)
  out, sown = _call_sowing(model, x)
  probs = _reference_probs(model, x, prior)
  chex.assert_trees_all_close(sown, probs, atol=1e-6)
  expected = model.out(jnp.einsum("bhqk,bkhd->bqhd", probs, model.value(x)))
  chex.assert_trees_all_close(out, expected, atol=1e-6)


def test_decode_step_by_step_equals_a_causal_pass():
  prior = _prior(4, (H, N, N))
  model = mpx.nnx.MultiHeadAttention(H, F, decode=False, num_tokens=N,
                                     mask_init=priors.as_initializer(prior),
                                     rngs=nnx.Rngs(0))
  x = _x(1)
  full = model(x, mask=nnx.make_causal_mask(x[..., 0]))
  model.init_cache(x.shape)
  step = nnx.jit(lambda m, x_B1F: m(x_B1F, decode=True))  # The cache index is traced.
  steps = jnp.concatenate([step(model, x[:, i:i + 1]) for i in range(N)], axis=1)
  chex.assert_trees_all_close(steps, full, atol=1e-6)  # Other shapes: ~2e-7 apart.
  with pytest.raises(ValueError, match=r"most this prior covers.*num_tokens=6 or more"):
    model.init_cache((B, N + 1, F))
    model(x[:, :1], decode=True)


def test_a_shorter_input_uses_the_priors_top_left_block():
  """The prior is positional: N' < N tokens (or a cache of N' positions) are positions
  0..N'−1, so they see M[:, :N', :N'], as a module built for N' with that block does."""
  prior, n = _prior(4, (H, N, N)), N - 2
  model, short = (mpx.nnx.MultiHeadAttention(H, F, decode=False, num_tokens=t,
                                             mask_init=priors.as_initializer(m),
                                             rngs=nnx.Rngs(0))
                  for t, m in ((N, prior), (n, prior[:, :n, :n])))
  x = _x(1, n=n)
  chex.assert_trees_all_close(model(x), short(x), atol=0, rtol=0)
  model.init_cache(x.shape)
  steps = jnp.concatenate([model(x[:, i:i + 1], decode=True) for i in range(n)], axis=1)
  chex.assert_trees_all_close(steps, short(x, mask=nnx.make_causal_mask(x[..., 0])),
                              atol=1e-6)
  cross = mpx.nnx.MultiHeadAttention(H, F, decode=False, num_tokens=(N, N + 1),
                                     rngs=nnx.Rngs(0))
  assert cross(_x(1, n=2), _x(2, n=3)).shape == (B, 2, F)


def test_neutral_drop_in_decodes_as_flax_bit_for_bit():
  """decode=True with a KV cache, step by step, on the same weights: every step equals
  Flax's decoder's."""
  flax_mha, ours = _pair(decode=False)
  x = _x(1)
  for module in (flax_mha, ours):
    module.init_cache(x.shape)
  for t in range(N):
    np.testing.assert_array_equal(ours(x[:, t:t + 1], decode=True),
                                  flax_mha(x[:, t:t + 1], decode=True))


def test_wrong_token_counts_name_the_argument():
  model = mpx.nnx.MultiHeadAttention(H, F, decode=False, num_tokens=N, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"num_tokens=\(5, 5\).*6 queries.*num_tokens=6 or"):
    model(_x(1, n=6))
  with pytest.raises(ValueError, match=r"num_tokens=\(5, 7\) or more"):
    model(_x(1), _x(2, n=7))
  with pytest.raises(ValueError, match="num_tokens must be"):
    mpx.nnx.MultiHeadAttention(H, F, num_tokens=(N, N, N), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="repeat_heads"):
    mpx.nnx.MultiHeadAttention(H, F, num_tokens=N, rngs=nnx.Rngs(0),
                               mask_init=priors.as_initializer(_prior(0, (N, N))))


def _swapped_arguments(query, key, value, mask=None, bias=None, **kwargs):
  """flax's attention with `mask` before `bias`: a prior passed positionally lands in `mask`."""
  return nnx.dot_product_attention(query, key, value, bias=bias, mask=mask, **kwargs)


def test_attention_fn_gets_the_prior_as_bias_or_the_call_raises():
  prior = _prior(11, (H, N, N))
  x = _x(1)
  build = lambda **kw: mpx.nnx.MultiHeadAttention(
      H, F, decode=False, num_tokens=N, mask_init=priors.as_initializer(prior),
      rngs=nnx.Rngs(0), **kw)
  swapped = build(attention_fn=_swapped_arguments)
  _, weights = _call_sowing(swapped, x)
  chex.assert_trees_all_close(weights, _reference_probs(swapped, x, prior), atol=1e-6)
  # A bias bound into the function adds to the prior instead of being replaced by it.
  extra = -jnp.arange(N, dtype=jnp.float32)
  bound = build(attention_fn=functools.partial(nnx.dot_product_attention, bias=extra))
  _, weights = _call_sowing(bound, x)
  chex.assert_trees_all_close(weights, jax.nn.softmax(
      jnp.log(_reference_probs(bound, x, prior)) + extra, axis=-1), atol=1e-5)

  with pytest.raises(ValueError, match="give it a `bias` argument"):
    build(attention_fn=lambda query, key, value, *args: value)
  bypassed = build()
  bypassed.attention_fn = nnx.dot_product_attention  # flax never calls the wrapper now.
  with pytest.raises(RuntimeError, match="prior was not applied"):
    bypassed(x)
  assert "PriorAttention" not in mpx.nnx.__all__ and mpx.nnx.PriorAttention


def test_frozen_mask_is_not_updated_by_the_param_optimizer():
  prior = _prior(5, (H, N, N))
  x = _x(1)
  for learnable in (True, False):
    model = mpx.nnx.MultiHeadAttention(H, F, decode=False, num_tokens=N,
                                       learnable_mask=learnable,
                                       mask_init=priors.as_initializer(prior),
                                       rngs=nnx.Rngs(0))
    assert isinstance(model.mask_logits, nnx.Param if learnable else mpx.nnx.FrozenMask)
    kernel = model.query.kernel[...]
    optimizer = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)
    optimizer.update(model, nnx.grad(lambda m: jnp.sum(m(x) ** 2))(model))
    assert not np.allclose(model.query.kernel[...], kernel)
    assert np.allclose(model.mask_logits[...], prior) != learnable, learnable
    assert ("mask_logits" in nnx.to_pure_dict(nnx.state(model, nnx.Param))) == learnable


def test_mask_is_exempt_from_weight_decay_in_nnx_state():
  """adamw with zero gradients: only the decay moves the params. It must shrink every
  kernel and leave `mask_logits` alone, although NNX paths end at `.value`."""
  prior = _prior(6, (H, N, N))
  build = lambda: mpx.nnx.MultiHeadAttention(H, F, decode=False, num_tokens=N,
                                             mask_init=priors.as_initializer(prior),
                                             rngs=nnx.Rngs(0))
  model = build()
  tx = make_optimizer(OptimConfig(optimizer="adamw"), {
      "learning_rate": 0.1, "weight_decay": 0.5, "mask_lr_multiplier": 1.0})
  params = nnx.state(model, nnx.Param)
  zeros = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zeros, tx.init(params), params)
  new = nnx.to_pure_dict(optax.apply_updates(params, updates))
  old = nnx.to_pure_dict(params)
  for name in ("query", "key", "value", "out"):
    assert np.abs(new[name]["kernel"]).sum() < np.abs(old[name]["kernel"]).sum(), name
  np.testing.assert_array_equal(new["mask_logits"], prior)
  # A family's no_decay rules match NNX state paths as they match Linen params.
  no_bias_decay = make_optimizer(OptimConfig(optimizer="adamw", no_decay=(r"(.*/)?bias",)), {
      "learning_rate": 0.1, "weight_decay": 0.5, "mask_lr_multiplier": 1.0})
  biased = build()
  for name in ("query", "key", "value", "out"):  # Non-zero biases, which decay would move.
    getattr(biased, name).bias[...] = jnp.ones_like(getattr(biased, name).bias[...])
  params = nnx.state(biased, nnx.Param)
  updates, _ = no_bias_decay.update(zeros, no_bias_decay.init(params), params)
  kept = nnx.to_pure_dict(optax.apply_updates(params, updates))
  for name in ("query", "key", "value", "out"):
    assert np.abs(kept[name]["kernel"]).sum() < np.abs(old[name]["kernel"]).sum(), name
    np.testing.assert_array_equal(kept[name]["bias"], 1.0)
  # The same through nnx.Optimizer, which hands optax the arrays without `.value`, and
  # with plain optax given `mpx.not_masks`.
  for tx in (tx, optax.adamw(0.1, weight_decay=0.5, mask=mpx.not_masks)):
    model = build()
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    optimizer.update(model, zeros)
    np.testing.assert_array_equal(model.mask_logits[...], prior)
    assert not np.allclose(model.out.kernel[...], old["out"]["kernel"])


def test_flax_checkpoint_loads_into_the_drop_in(tmp_path):
  flax_mha = nnx.MultiHeadAttention(H, F, decode=False, rngs=nnx.Rngs(0))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "state", nnx.state(flax_mha))
  with ocp.StandardCheckpointer() as checkpointer:
    raw = checkpointer.restore(tmp_path / "state")
  ours = mpx.nnx.MultiHeadAttention(H, F, decode=False, num_tokens=N, rngs=nnx.Rngs(9))
  x = _x(1)
  assert not np.allclose(ours(x), flax_mha(x))
  _load(ours, raw)  # Raw NNX state: every path ends in `value`, which merge_params drops.
  np.testing.assert_array_equal(ours(x), flax_mha(x))
  np.testing.assert_array_equal(ours.mask_logits[...], priors.neutral(N, H))


def test_linen_weights_transplant_into_the_nnx_twin():
  prior = _prior(7, (H, N, N))
  kwargs = dict(causal=True, qkv_bias=True, mask_init=priors.as_initializer(prior))
  linen = mpx.nn.MaskedSelfAttention(H, head_dim=3, **kwargs)
  x, pad_BN = _x(1), jnp.arange(N)[None] < jnp.array([[4], [5]])
  variables = linen.init(jax.random.key(0), x, pad_BN)
  expected, inter = linen.apply(variables, x, pad_BN, mutable=["intermediates"])
  twin = mpx.nnx.MaskedSelfAttention(H, F, num_tokens=N, head_dim=3, **kwargs,
                                     rngs=nnx.Rngs(1))
  _load(twin, variables["params"])  # Raises unless every name and shape matches.
  out, sown = _call_sowing(twin, x, pad_BN)  # Bit-exact on XLA:CPU; the tolerance is slack.
  chex.assert_trees_all_close(out, expected, atol=1e-6)
  (expected_weights,) = inter["intermediates"]["attention_weights"]
  chex.assert_trees_all_close(sown, expected_weights, atol=1e-6)
  frozen = mpx.nnx.MaskedSelfAttention(H, F, num_tokens=N, learnable_mask=False,
                                       rngs=nnx.Rngs(1))
  assert isinstance(frozen.mask_logits, mpx.nnx.FrozenMask)
  bare = mpx.nnx.MaskedSelfAttention(H, F, use_mask=False, rngs=nnx.Rngs(1))
  assert "mask_logits" not in nnx.to_pure_dict(nnx.state(bare))
  chex.assert_shape(bare(x), (B, N, F))


def test_import_needs_only_jax_and_flax():
  """flax.nnx itself imports optax; mpx.nnx adds only mpx's core modules."""
  code = ("import sys, flax.nnx; before = set(sys.modules); import mpx.nnx; "
          "print(' '.join(sorted(set(sys.modules) - before)))")
  added = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
  assert "mpx.nnx" in added
  banned = ("optax", "orbax", "matplotlib", "mpx.sweep", "mpx.tasks", "mpx.checkpoint")
  assert [m for m in added if m.startswith(banned) or not m.startswith("mpx")] == []


# The seed ensemble of docs/nnx.md: members made and trained under nnx.vmap.
def _member(key):
  return mpx.nnx.MultiHeadAttention(H, F, decode=False, num_tokens=N, rngs=nnx.Rngs(key),
                                    mask_init=priors.as_initializer(_prior(8, (H, N, N))))


def _train_step(model, optimizer, x, y):
  loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
  optimizer.update(model, grads)
  return loss


def test_vmap_seed_ensemble_members_equal_models_trained_alone():
  # SGD, not Adam: the key bias has a zero gradient up to rounding (softmax ignores a shift
  # of all logits), which Adam would scale up to full steps of noise.
  keys, tx = jax.random.split(jax.random.key(0), 4), optax.sgd(0.5)
  models = nnx.vmap(_member)(keys)
  optimizers = nnx.vmap(lambda m: nnx.Optimizer(m, tx, wrt=nnx.Param))(models)
  ensemble_step = nnx.jit(nnx.vmap(_train_step, in_axes=(0, 0, None, None)))
  x, y = _x(1), _x(2)
  for _ in range(3):
    losses = ensemble_step(models, optimizers, x, y)
  chex.assert_shape(losses, (4,))
  stacked = nnx.to_pure_dict(nnx.state(models, nnx.Param))
  assert not np.allclose(stacked["query"]["kernel"][0], stacked["query"]["kernel"][1])

  alone, single_step = _member(keys[2]), nnx.jit(_train_step)
  optimizer = nnx.Optimizer(alone, tx, wrt=nnx.Param)
  for _ in range(3):
    single_step(alone, optimizer, x, y)
  member = jax.tree.map(lambda leaf: leaf[2], stacked)
  chex.assert_trees_all_close(member, nnx.to_pure_dict(nnx.state(alone, nnx.Param)),
                              atol=1e-6)
  assert not np.allclose(member["mask_logits"], _prior(8, (H, N, N)))  # It learned.



def _assert_loads(ours, flax_model, restored):
  """`restored` loaded into `ours` (other weights until then) computes Flax's outputs."""
  x = _x(1)
  assert not np.allclose(ours(x), flax_model(x))
  _load(ours, restored)
  np.testing.assert_array_equal(ours(x), flax_model(x))

class _Blocks(nnx.Module):
  """A transformer's usual shape: its attention blocks in an `nnx.List`."""

  def __init__(self, attention, depth=2, seed=0):
    self.blocks = nnx.List([attention(rngs=nnx.Rngs(seed + i)) for i in range(depth)])

  def __call__(self, x):
    for block in self.blocks:
      x = x + block(x)
    return x


@pytest.mark.parametrize("saved_as", ["state", "pure_dict"])
def test_a_checkpoint_with_a_layer_list_loads_into_the_drop_in(tmp_path, saved_as):
  """Orbax restores an `nnx.List`'s indices as the strings '0', '1' where the new model's
  pure dict has the ints 0, 1: both forms load, every weight in place, the masks fresh."""
  flax_model = _Blocks(functools.partial(nnx.MultiHeadAttention, H, F, decode=False))
  state = nnx.state(flax_model, nnx.Param)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "ckpt",
                      state if saved_as == "state" else nnx.to_pure_dict(state))
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / "ckpt")
  assert "0" in restored["blocks"] and 0 not in restored["blocks"]  # The trap: str keys.
  ours = _Blocks(functools.partial(mpx.nnx.MultiHeadAttention, H, F, decode=False,
                                   num_tokens=N), seed=9)
  _assert_loads(ours, flax_model, restored)
  for block in ours.blocks:
    np.testing.assert_array_equal(block.mask_logits[...], priors.neutral(N, H))



class _Scanned(nnx.Module):
  """Layers created under `nnx.vmap` (every leaf with a leading layer axis) and applied
  with `nnx.scan`: NNX's pattern for deep models."""

  def __init__(self, attention, depth=2, seed=0):
    @nnx.split_rngs(splits=depth)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
      return attention(rngs=rngs)
    self.layers = create(nnx.Rngs(seed))

  def __call__(self, x):
    @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
    def step(layer, x):
      return x + layer(x)
    return step(self.layers, x)


def test_a_checkpoint_of_scanned_layers_loads_into_the_drop_in(tmp_path):
  """A scanned stack's state, saved by Orbax and restored without a target, loads with
  its leading layer axis: every weight in place, each layer's mask its neutral init."""
  flax_model = _Scanned(functools.partial(nnx.MultiHeadAttention, H, F, decode=False))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "ckpt", nnx.state(flax_model, nnx.Param))
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / "ckpt")
  ours = _Scanned(functools.partial(mpx.nnx.MultiHeadAttention, H, F, decode=False,
                                    num_tokens=N), seed=9)
  _assert_loads(ours, flax_model, restored)
  np.testing.assert_array_equal(ours.layers.mask_logits[...],
                                np.broadcast_to(priors.neutral(N, H), (2, H, N, N)))

def test_keys_that_differ_only_in_type_are_named():
  fresh = {"blocks": {0: {"w": np.zeros(2)}, "0": {"w": np.zeros(2)}}}
  with pytest.raises(ValueError, match="differ only in type"):
    mpx.merge_params(fresh, fresh)
  with pytest.raises(ValueError, match="blocks/1/w, which the new model lacks"):
    mpx.merge_params({"blocks": {0: {"w": np.zeros(2)}}},
                     {"blocks": {"0": {"w": np.ones(2)}, "1": {"w": np.ones(2)}}})
  merged = mpx.merge_params({"blocks": [{"w": np.zeros(2)}]},
                            {"blocks": {"0": {"w": np.ones(2)}}})
  np.testing.assert_array_equal(merged["blocks"][0]["w"], np.ones(2))
