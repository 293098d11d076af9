"""`mpx.nn.MultiHeadDotProductAttention` against `flax.linen.MultiHeadDotProductAttention`.

Every comparison runs Flax's module and the drop-in on the same params. With the neutral
prior the drop-in adds a float32 zero to Flax's float32 logits, so float32 outputs are
bit for bit Flax's; in bfloat16 the float32 bias promotes the logits and softmax to
float32, so outputs agree to bfloat16 rounding.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from flax import linen as nn

import mpx
from mpx import diagnostics, priors
from mpx.nn import MultiHeadDotProductAttention, mha

B, N, NK, D, H = 2, 5, 7, 8, 2


def _x(seed, n=N):
  return jax.random.normal(jax.random.key(seed), (B, n, D))


def _prior(shape, seed=7):
  """A non-saturated prior: log σ(M) between about −3 and 0, with a gradient."""
  return jax.random.normal(jax.random.key(seed), shape) * 2.0


def _pair(prior=None, *, per_head_mask=True, learnable_mask=True, **kwargs):
  """Flax's module and the drop-in, same Flax arguments (the drop-in with a prior)."""
  extra = {} if prior is None else {"mask_init": priors.as_initializer(prior)}
  return (nn.MultiHeadDotProductAttention(num_heads=H, **kwargs),
          MultiHeadDotProductAttention(num_heads=H, per_head_mask=per_head_mask,
                                       learnable_mask=learnable_mask, **kwargs, **extra))


def _both_params(flax_mha, drop_in, *args, **kwargs):
  """Flax's init, and the drop-in's fresh init with Flax's params merged in."""
  flax_params = flax_mha.init(jax.random.key(0), *args, **kwargs)["params"]
  fresh = drop_in.init(jax.random.key(0), *args, **kwargs)["params"]
  return flax_params, mpx.merge_params(fresh, flax_params)


_PADDING_BN = jnp.array([[True] * N, [True] * (N - 2) + [False] * 2])
CASES = {
    "self": ({}, (_x(1),), {}),
    "cross": ({}, (_x(1), _x(2, NK), _x(3, NK)), {}),
    "causal_and_padding": ({}, (_x(1),), {"mask": nn.combine_masks(
        nn.make_causal_mask(jnp.ones((B, N))), nn.make_attention_mask(_PADDING_BN,
                                                                      _PADDING_BN))}),
    "dropout": ({"dropout_rate": 0.5, "deterministic": False}, (_x(1),),
                {"dropout_rng": jax.random.key(5)}),
    "normalize_qk": ({"normalize_qk": True, "qkv_features": 12, "out_features": 6},
                     (_x(1),), {}),
    "bias_bound_in_attention_fn": ({"attention_fn": functools.partial(
        nn.dot_product_attention, bias=-jnp.arange(N, dtype=jnp.float32))}, (_x(1),), {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_neutral_prior_is_flax_bit_for_bit(case):
  module_kwargs, args, call_kwargs = CASES[case]
  flax_mha, drop_in = _pair(**module_kwargs)
  flax_params, params = _both_params(flax_mha, drop_in, *args, **call_kwargs)
  n_q, n_k = args[0].shape[-2], args[-1].shape[-2]
  assert params["mask_logits"].shape == (H, n_q, n_k)
  # Fresh inits agree too: the drop-in's other params are Flax's, same names, same values.
  fresh = drop_in.init(jax.random.key(0), *args, **call_kwargs)["params"]
  jax.tree.map(np.testing.assert_array_equal, flax_params,
               {k: v for k, v in fresh.items() if k != "mask_logits"})
  expected = flax_mha.apply({"params": flax_params}, *args, **call_kwargs)
  out = drop_in.apply({"params": params}, *args, **call_kwargs)
  np.testing.assert_array_equal(out, expected)


def test_dropout_rng_from_rngs_matches_flax():
  flax_mha, drop_in = _pair(dropout_rate=0.5)
  flax_params, params = _both_params(flax_mha, drop_in, _x(1), deterministic=True)
  rngs = {"dropout": jax.random.key(9)}
  out = drop_in.apply({"params": params}, _x(1), deterministic=False, rngs=rngs)
  expected = flax_mha.apply({"params": flax_params}, _x(1), deterministic=False, rngs=rngs)
  np.testing.assert_array_equal(out, expected)
  assert not np.array_equal(out, drop_in.apply({"params": params}, _x(1),
                                               deterministic=True))


def test_bfloat16_matches_flax_to_bf16_rounding():
  flax_mha, drop_in = _pair(dtype=jnp.bfloat16)
  flax_params, params = _both_params(flax_mha, drop_in, _x(1))
  assert params["mask_logits"].dtype == jnp.float32
  out = drop_in.apply({"params": params}, _x(1))
  expected = flax_mha.apply({"params": flax_params}, _x(1))
  assert out.dtype == expected.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.float32(out), np.float32(expected), atol=3e-2, rtol=3e-2)


def test_bfloat16_keeps_a_non_neutral_prior():
  """bf16 against the same prior in float32, at bf16 rounding; dropping the prior would
  move the output by far more than that."""
  flax_mha, drop_in = _pair(_prior((H, N, N)), dtype=jnp.bfloat16)
  flax_params, params = _both_params(flax_mha, drop_in, _x(1))
  out = np.float32(drop_in.apply({"params": params}, _x(1)))
  expected = drop_in.clone(dtype=jnp.float32).apply({"params": params}, _x(1))
  np.testing.assert_allclose(out, expected, atol=3e-2, rtol=3e-2)
  without_prior = np.float32(flax_mha.apply({"params": flax_params}, _x(1)))
  assert np.abs(without_prior - expected).max() > 0.2


def _reference(params, x_q, x_k, mask_logits):
  """`softmax(q·kᵀ/√d + log σ(M)) v`, projected, in float64 numpy."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  proj = lambda x, name: np.einsum("bnd,dhr->bnhr", x, p[name]["kernel"]) + p[name]["bias"]
  q, k, v = proj(x_q, "query"), proj(x_k, "key"), proj(x_k, "value")
  logits = np.einsum("bqhr,bkhr->bhqk", q, k) / np.sqrt(q.shape[-1])
  logits = logits - np.logaddexp(0.0, -np.asarray(mask_logits, np.float64))  # + log σ(M)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("bhqk,bkhr,hrd->bqd", probs, v, p["out"]["kernel"]) + p["out"]["bias"]


@pytest.mark.parametrize("per_head_mask", [True, False])
def test_prior_shapes_the_logits_as_the_reference_says(per_head_mask):
  shape = (H, N, NK) if per_head_mask else (N, NK)
  flax_mha, drop_in = _pair(_prior(shape), per_head_mask=per_head_mask)
  x_q, x_k = np.asarray(_x(1)), np.asarray(_x(2, NK))
  flax_params, params = _both_params(flax_mha, drop_in, x_q, x_k)
  assert params["mask_logits"].shape == shape
  out = drop_in.apply({"params": params}, x_q, x_k)
  np.testing.assert_allclose(out, _reference(params, x_q, x_k, params["mask_logits"]),
                             atol=1e-5)
  assert np.abs(out - flax_mha.apply({"params": flax_params}, x_q, x_k)).max() > 1e-2


def test_decoding_steps_equal_the_causal_pass():
  prior = _prior((H, N, N))
  flax_mha, drop_in = _pair(prior)
  decoder = drop_in.clone(decode=True)
  x = _x(1)
  variables = decoder.init(jax.random.key(0), x)  # Full length: builds M and the cache.
  params, cache = variables["params"], variables["cache"]
  np.testing.assert_array_equal(params["mask_logits"], prior)
  full = drop_in.apply({"params": params}, x, mask=nn.make_causal_mask(jnp.ones((B, N))))

  @jax.jit
  def step(cache, x_t):
    return decoder.apply({"params": params, "cache": cache}, x_t, mutable=["cache"])

  steps = []
  for t in range(N):
    out_t, state = step(cache, x[:, t:t + 1])
    cache = state["cache"]
    steps.append(out_t)
  assert int(cache["cache_index"]) == N
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-6)
  # Row t of the prior shaped step t: a neutral prior decodes to Flax's outputs instead.
  assert np.abs(full - flax_mha.apply({"params": params}, x, mask=nn.make_causal_mask(
      jnp.ones((B, N))))).max() > 1e-2


def test_neutral_prior_decodes_as_flax_bit_for_bit():
  """decode=True with a KV cache, step by step: the neutral drop-in's every step is
  Flax's decoder's, on the same params and cache."""
  flax_mha, drop_in = _pair()
  flax_dec, mpx_dec = flax_mha.clone(decode=True), drop_in.clone(decode=True)
  x = _x(1)
  flax_vars = flax_dec.init(jax.random.key(0), x)
  params = mpx.merge_params(mpx_dec.init(jax.random.key(0), x)["params"],
                            flax_vars["params"])
  caches = {"flax": flax_vars["cache"], "mpx": flax_vars["cache"]}
  for t in range(N):
    outs = {}
    for name, module, p in (("flax", flax_dec, flax_vars["params"]), ("mpx", mpx_dec, params)):
      outs[name], state = module.apply({"params": p, "cache": caches[name]}, x[:, t:t + 1],
                                       mutable=["cache"])
      caches[name] = state["cache"]
    np.testing.assert_array_equal(outs["mpx"], outs["flax"])
  jax.tree.map(np.testing.assert_array_equal, caches["mpx"], caches["flax"])


def test_flax_checkpoint_loads_through_merge_params(tmp_path):
  flax_mha, drop_in = _pair()
  x = _x(1)
  flax_params = flax_mha.init(jax.random.key(3), x)["params"]
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "flax", flax_params)
  checkpointer.wait_until_finished()
  fresh = drop_in.init(jax.random.key(0), x)["params"]
  # A plain restore into the drop-in's tree fails: the checkpoint has no mask_logits.
  with pytest.raises(ValueError, match="mask_logits"):
    checkpointer.restore(tmp_path / "flax", fresh)
  restored = checkpointer.restore(tmp_path / "flax")  # No target: the stored tree.
  params = mpx.merge_params(fresh, restored)
  np.testing.assert_array_equal(params["mask_logits"], fresh["mask_logits"])
  np.testing.assert_array_equal(drop_in.apply({"params": params}, x),
                                flax_mha.apply({"params": flax_params}, x))


@pytest.mark.parametrize("learnable", [True, False])
def test_mask_gradient_flows_unless_frozen(learnable):
  _, drop_in = _pair(_prior((N, N)), per_head_mask=False, learnable_mask=learnable)
  params = drop_in.init(jax.random.key(0), _x(1))["params"]
  grads = jax.grad(lambda p: jnp.sum(drop_in.apply({"params": p}, _x(1)) ** 2))(params)
  norm = float(jnp.linalg.norm(grads["mask_logits"]))
  assert (norm > 1e-3) if learnable else (norm == 0.0)
  assert float(jnp.linalg.norm(grads["query"]["kernel"])) > 0


class _TwoLayers(nn.Module):
  """A Linen model where the swap happened: Flax's own module names, one prior each, and
  `sow_weights` passed down as a Flax model passes it."""

  @nn.compact
  def __call__(self, x, sow_weights=False):
    x = x + MultiHeadDotProductAttention(num_heads=H, mask_init=priors.as_initializer(
        _prior((H, N, N))), name="attention_0")(x, sow_weights=sow_weights)
    return x + MultiHeadDotProductAttention(num_heads=H, name="attention_1")(
        x, sow_weights=sow_weights)


def test_attention_weights_recorded_where_and_when_flax_records_them():
  flax_mha, drop_in = _pair(_prior((H, N, N)))
  x = _x(1)
  flax_params, params = _both_params(flax_mha, drop_in, x)
  for sow_weights in (True, False):  # A mutable `intermediates` alone records nothing.
    _, flax_state = flax_mha.apply({"params": flax_params}, x, sow_weights=sow_weights,
                                   mutable=["intermediates"])
    _, state = drop_in.apply({"params": params}, x, sow_weights=sow_weights,
                             mutable=["intermediates"])
    assert jax.tree.structure(state) == jax.tree.structure(flax_state)
    assert bool(jax.tree.leaves(state)) == sow_weights
  _, state = drop_in.apply({"params": params}, x, sow_weights=True,
                           mutable=["intermediates"])
  (weights_BHQK,) = state["intermediates"]["attention_weights"]
  np.testing.assert_allclose(weights_BHQK.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(weights_BHQK, mpx.attention_weights(
      *(jnp.einsum("bnd,dhr->bnhr", x, params[n]["kernel"]) + params[n]["bias"]
        for n in ("query", "key")), params["mask_logits"]), atol=1e-5)
  model = _TwoLayers()
  model_params = model.init(jax.random.key(0), x)["params"]
  assert not jax.tree.leaves(model.apply({"params": model_params}, x,
                                         mutable=["intermediates"])[1])
  maps = diagnostics.attention_maps(functools.partial(model.apply, sow_weights=True),
                                    model_params, x)
  assert sorted(maps) == ["attention_0", "attention_1"]
  assert maps["attention_0"].shape == (B, H, N, N)


def test_not_masks_keeps_a_frozen_prior_out_of_weight_decay():
  """Why `mpx.not_masks` exists: `learnable_mask=False` stops the gradient, but adamw's
  decay still pulls the prior towards M = 0 unless its mask exempts it."""
  prior = jnp.where(jax.random.bernoulli(jax.random.key(8), 0.5, (H, N, N)), 4.0, -4.0)
  _, drop_in = _pair(prior, learnable_mask=False)
  x = _x(1)
  params = drop_in.init(jax.random.key(0), x)["params"]
  loss_fn = lambda p: jnp.sum(drop_in.apply({"params": p}, x) ** 2)
  for mask in (mpx.not_masks, None):
    tx = optax.adamw(1e-2, weight_decay=0.1, mask=mask)
    trained, opt_state = params, tx.init(params)
    for _ in range(3):
      updates, opt_state = tx.update(jax.grad(loss_fn)(trained), opt_state, trained)
      trained = optax.apply_updates(trained, updates)
    assert not np.allclose(trained["query"]["kernel"], params["query"]["kernel"])
    if mask is None:
      assert np.abs(trained["mask_logits"] - prior).max() > 1e-3
    else:
      np.testing.assert_array_equal(trained["mask_logits"], prior)


@pytest.mark.parametrize("per_head_mask", [True, False])
def test_a_shorter_input_uses_the_priors_top_left_block(per_head_mask):
  """Initialised on N tokens, applied to N' < N: positions 0..N'−1 see M[..., :N', :N'],
  exactly as params holding only that block do (a prior sliced elsewhere would differ)."""
  prior = _prior((H, N, N) if per_head_mask else (N, N))
  _, drop_in = _pair(prior, per_head_mask=per_head_mask)
  params = drop_in.init(jax.random.key(0), _x(1))["params"]
  n = N - 2
  block = params | {"mask_logits": params["mask_logits"][..., :n, :n]}
  x = _x(2, n)
  module_of_block = drop_in.clone(mask_init=priors.neutral_init)  # Its M is `block`'s.
  np.testing.assert_array_equal(drop_in.apply({"params": params}, x),
                                module_of_block.apply({"params": block}, x))
  grads = jax.grad(lambda p: jnp.sum(drop_in.apply({"params": p}, x) ** 2))(params)
  assert grads["mask_logits"].shape == params["mask_logits"].shape
  assert np.all(grads["mask_logits"][..., n:, :] == 0)  # Unused positions get no gradient.
  assert np.any(grads["mask_logits"][..., :n, :n] != 0)


def test_errors_name_the_fix(monkeypatch):
  _, drop_in = _pair()
  params = drop_in.init(jax.random.key(0), _x(1))["params"]
  with pytest.raises(ValueError, match=r"covers at most \d+ queries.*init the model with "
                                       "the longest"):
    drop_in.apply({"params": params}, _x(1, N + 1))
  with pytest.raises(ValueError, match="set per_head_mask as at init"):
    drop_in.clone(per_head_mask=False).apply({"params": params}, _x(1))
  with pytest.raises(ValueError, match="give it a `bias` argument"):
    drop_in.clone(attention_fn=lambda query, key, value: value).init(
        jax.random.key(0), _x(1))
  with pytest.raises(ValueError, match="caches self-attention"):
    drop_in.clone(decode=True).init(jax.random.key(0), _x(1), _x(2, NK))
  wrong = drop_in.clone(mask_init=priors.as_initializer(_prior((N, N))))
  with pytest.raises(ValueError, match="repeat_heads"):
    wrong.init(jax.random.key(0), _x(1))
  # Were Flax ever to bypass attention_fn, the prior would be lost: that raises.
  monkeypatch.setattr(mha, "_with_prior", lambda attention_fn, bias, calls: attention_fn)
  with pytest.raises(RuntimeError, match="did not call its attention_fn"):
    drop_in.init(jax.random.key(0), _x(1))


def test_inputs_kv_reaches_flax_only_when_given(monkeypatch):
  """Flax deprecates `inputs_kv`: a Flax whose call lacks it must still work."""
  _, drop_in = _pair()
  q, kv = _x(1), _x(2, NK)
  params = drop_in.init(jax.random.key(0), q, kv)["params"]
  with pytest.warns(DeprecationWarning):  # Flax's own warning: the argument still works.
    np.testing.assert_array_equal(drop_in.apply({"params": params}, q, inputs_kv=kv),
                                  drop_in.apply({"params": params}, q, kv))

  class FlaxWithoutInputsKv(nn.MultiHeadDotProductAttention):
    def __call__(self, inputs_q, inputs_k=None, inputs_v=None, *, mask=None,
                 deterministic=None, dropout_rng=None, sow_weights=False):
      return super().__call__(inputs_q, inputs_k, inputs_v, mask=mask,
                              deterministic=deterministic, dropout_rng=dropout_rng,
                              sow_weights=sow_weights)

  expected = drop_in.apply({"params": params}, q, kv)
  monkeypatch.setattr(nn, "MultiHeadDotProductAttention", FlaxWithoutInputsKv)
  np.testing.assert_array_equal(drop_in.apply({"params": params}, q, kv), expected)


def test_is_a_flax_module_with_every_flax_argument():
  names = lambda cls: {f.name for f in dataclasses.fields(cls)}
  assert issubclass(MultiHeadDotProductAttention, nn.MultiHeadDotProductAttention)
  assert names(MultiHeadDotProductAttention) - names(nn.MultiHeadDotProductAttention) == {
      "mask_init", "learnable_mask", "per_head_mask"}


class _Block(nn.Module):
  """attention and an MLP, as a transformer block nests them."""
  attention: type

  @nn.compact
  def __call__(self, x, _=None):
    x = x + self.attention(num_heads=H, name="attn")(x)
    return x + nn.Dense(D, name="mlp")(nn.relu(nn.Dense(2 * D, name="fc")(x))), None


class _Stack(nn.Module):
  """Two blocks, as two named submodules (nested dicts) or one `nn.scan` (every leaf
  with a leading layer axis)."""
  attention: type
  scanned: bool

  @nn.compact
  def __call__(self, x):
    if self.scanned:
      scan = nn.scan(_Block, variable_axes={"params": 0}, split_rngs={"params": True},
                     length=2)
      return scan(self.attention, name="layers")(x, None)[0]
    for i in range(2):
      x = _Block(self.attention, name=f"block_{i}")(x)[0]
    return x


@pytest.mark.parametrize("scanned", [False, True], ids=["nested", "scanned"])
def test_a_checkpoint_of_a_flax_model_loads_into_the_swapped_model(tmp_path, scanned):
  """A Linen model saved by Orbax with Flax's attention, restored without a target, loads
  into the same model with the drop-in: every weight in place (a scanned stack's leading
  layer axis too), each layer's mask its fresh neutral init, the outputs Flax's bit for
  bit."""
  x = _x(1)
  flax_model = _Stack(nn.MultiHeadDotProductAttention, scanned)
  flax_params = flax_model.init(jax.random.key(3), x)["params"]
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(tmp_path / "ckpt", flax_params)
  with ocp.StandardCheckpointer() as checkpointer:
    restored = checkpointer.restore(tmp_path / "ckpt")
  ours = _Stack(MultiHeadDotProductAttention, scanned)
  fresh = ours.init(jax.random.key(0), x)["params"]
  params = mpx.merge_params(fresh, restored)
  masks = ([params["layers"]["attn"]["mask_logits"]] if scanned else
           [params[f"block_{i}"]["attn"]["mask_logits"] for i in range(2)])
  for mask in masks:
    assert mask.shape == ((2, H, N, N) if scanned else (H, N, N))
    np.testing.assert_array_equal(mask, np.broadcast_to(priors.neutral(N, H), mask.shape))
  assert not np.allclose(ours.apply({"params": fresh}, x), flax_model.apply(
      {"params": flax_params}, x))
  np.testing.assert_array_equal(ours.apply({"params": params}, x),
                                flax_model.apply({"params": flax_params}, x))
