"""Linen modules: where `mask_logits` lives, neutral = standard attention, freezing."""

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mpx import priors
from mpx.nn import MaskedSelfAttention, TokenTransformer
from mpx.tasks import boolean

B, N, WIDTH, H, R = 2, 5, 12, 3, 8


def _x(seed=0):
  return jax.random.normal(jax.random.key(seed), (B, N, WIDTH))


def _mask_paths(params):
  flat = flax.traverse_util.flatten_dict(params)
  return sorted("/".join(k) for k in flat if k[-1] == "mask_logits")


def test_attention_param_tree_and_shapes():
  attn = MaskedSelfAttention(H, head_dim=R)
  params = attn.init(jax.random.key(0), _x())["params"]
  chex.assert_shape(params["mask_logits"], (H, N, N))
  chex.assert_shape(params["query"]["kernel"], (WIDTH, H, R))
  chex.assert_shape(params["out"]["kernel"], (H, R, WIDTH))
  assert "bias" not in params["query"]            # GOTU: qkv without bias.
  shared = MaskedSelfAttention(H, head_dim=R, per_head_mask=False, qkv_bias=True)
  params = shared.init(jax.random.key(0), _x())["params"]
  chex.assert_shape(params["mask_logits"], (N, N))
  chex.assert_shape(params["key"]["bias"], (H, R))
  unmasked = MaskedSelfAttention(H, head_dim=R, use_mask=False)
  assert _mask_paths(unmasked.init(jax.random.key(0), _x())["params"]) == []
  chex.assert_shape(attn.apply({"params": attn.init(jax.random.key(0), _x())["params"]},
                               _x(1)), (B, N, WIDTH))


def test_neutral_prior_is_exactly_standard_attention():
  masked = MaskedSelfAttention(H, head_dim=R)
  plain = MaskedSelfAttention(H, head_dim=R, use_mask=False)
  params = masked.init(jax.random.key(0), _x())["params"]
  plain_params = {k: v for k, v in params.items() if k != "mask_logits"}
  x = _x(1)
  out = masked.apply({"params": params}, x)
  np.testing.assert_array_equal(out, plain.apply({"params": plain_params}, x))
  # ... and standard attention written out by hand.
  q, k, v = (jnp.einsum("bnd,dhr->bnhr", x, params[n]["kernel"])
             for n in ("query", "key", "value"))
  probs = jax.nn.softmax(jnp.einsum("bqhr,bkhr->bhqk", q, k) / np.sqrt(R), -1)
  ref = jnp.einsum("bhqk,bkhr,hrd->bqd", probs, v, params["out"]["kernel"])
  chex.assert_trees_all_close(out, ref + params["out"]["bias"], atol=1e-5)


def test_prior_initializer_and_wrong_shape():
  prior = priors.repeat_heads(priors.from_pairs([(0, 1)], N, 6.0), H)
  attn = MaskedSelfAttention(H, head_dim=R, mask_init=priors.as_initializer(prior))
  params = attn.init(jax.random.key(0), _x())["params"]
  np.testing.assert_array_equal(params["mask_logits"], prior)
  wrong = MaskedSelfAttention(H, head_dim=R, mask_init=priors.as_initializer(prior[:, :4, :4]))
  with pytest.raises(ValueError, match="rebuild the prior"):
    wrong.init(jax.random.key(0), _x())
  shared = priors.from_pairs([(0, 1)], N, 6.0)                     # [N, N] for every head.
  one = MaskedSelfAttention(H, head_dim=R, mask_init=priors.as_initializer(shared),
                            per_head_mask=False)
  np.testing.assert_array_equal(one.init(jax.random.key(0), _x())["params"]["mask_logits"],
                                shared)
  per_head = MaskedSelfAttention(H, head_dim=R, mask_init=priors.as_initializer(shared))
  with pytest.raises(ValueError, match=rf"repeat_heads\(prior, {H}\).*per_head_mask=False"):
    per_head.init(jax.random.key(0), _x())


@pytest.mark.parametrize("learnable", [True, False])
def test_frozen_mask_receives_no_update(learnable):
  prior = jax.random.normal(jax.random.key(3), (H, N, N))
  attn = MaskedSelfAttention(H, head_dim=R, mask_init=priors.as_initializer(prior),
                             learnable_mask=learnable)
  params = attn.init(jax.random.key(0), _x())["params"]
  loss = lambda p: jnp.sum(attn.apply({"params": p}, _x(1)) ** 2)
  grads = jax.grad(loss)(params)
  optimizer = optax.adam(1e-2)
  updates, _ = optimizer.update(grads, optimizer.init(params), params)
  new = optax.apply_updates(params, updates)
  assert not np.array_equal(new["query"]["kernel"], params["query"]["kernel"])
  if learnable:
    assert float(jnp.abs(grads["mask_logits"]).max()) > 0
    assert not np.array_equal(new["mask_logits"], params["mask_logits"])
  else:
    np.testing.assert_array_equal(grads["mask_logits"], 0.0)
    np.testing.assert_array_equal(new["mask_logits"], params["mask_logits"])


def _small_model(**kw):
  return TokenTransformer(width=32, depth=3, num_heads=2, head_dim=16, mlp_dim=32, **kw)


def test_token_transformer_mask_only_where_expected():
  x = boolean.tokens(jnp.ones((B, 15)))
  everywhere = _small_model().init(jax.random.key(0), x)["params"]
  assert _mask_paths(everywhere) == [f"block_{i}/attention/mask_logits" for i in range(3)]
  chex.assert_shape(everywhere["block_0"]["attention"]["mask_logits"], (2, 16, 16))
  chosen = _small_model(mask_layers=(0, 2), per_head_mask=False).init(
      jax.random.key(0), x)["params"]
  assert _mask_paths(chosen) == ["block_0/attention/mask_logits",
                                 "block_2/attention/mask_logits"]
  chex.assert_shape(chosen["block_2"]["attention"]["mask_logits"], (16, 16))
  assert _mask_paths(_small_model(mask_layers=()).init(jax.random.key(0), x)["params"]) == []


def test_token_transformer_outputs_and_neutral_equivalence():
  x = boolean.tokens(jax.random.rademacher(jax.random.key(1), (B, 15)))
  model = _small_model()
  params = model.init(jax.random.key(0), x)
  chex.assert_shape(model.apply(params, x), (B, 1))
  unmasked = _small_model(mask_layers=())
  stripped = flax.traverse_util.unflatten_dict(
      {k: v for k, v in flax.traverse_util.flatten_dict(params).items()
       if k[-1] != "mask_logits"})
  np.testing.assert_array_equal(model.apply(params, x), unmasked.apply(stripped, x))
  lm = _small_model(vocab_size=10, readout="tokens", out_features=10, causal=True,
                    cls_token=False)
  tokens = jnp.arange(12).reshape(2, 6) % 10
  chex.assert_shape(lm.apply(lm.init(jax.random.key(0), tokens), tokens), (2, 6, 10))


def test_torch_style_init_scales():
  model = TokenTransformer()   # The GOTU paper-scale model.
  params = model.init(jax.random.key(0), boolean.tokens(jnp.ones((1, 15))))["params"]
  assert abs(float(jnp.std(params["pos_embed"])) - 1.0) < 0.05      # N(0, 1)
  assert abs(float(jnp.std(params["token_embed"]["embedding"])) - 1.0) < 0.2
  q = params["block_0"]["attention"]["query"]["kernel"]
  chex.assert_shape(q, (256, 6, 64))
  bound = 1 / np.sqrt(256)
  assert float(jnp.abs(q).max()) <= bound and float(jnp.abs(q).max()) > 0.95 * bound
  out = params["block_0"]["attention"]["out"]
  assert float(jnp.abs(out["kernel"]).max()) <= 1 / np.sqrt(384)
  assert float(jnp.abs(out["bias"]).max()) <= 1 / np.sqrt(384)
  n_params = sum(p.size for p in jax.tree_util.tree_leaves(params))
  per_block = (3 * 256 * 384 + 384 * 256 + 256      # qkv (no bias), out projection
               + 2 * (256 * 256 + 256) + 2 * 512     # MLP, two LayerNorms
               + 6 * 16 * 16)                        # mask_logits
  assert n_params == 12 * per_block + 2 * 256 + 256 + 16 * 256 + 512 + 257


def test_token_transformer_bad_config_and_inputs():
  x = boolean.tokens(jnp.ones((B, 15)))
  with pytest.raises(ValueError, match="mask_layers"):
    _small_model(mask_layers=(5,)).init(jax.random.key(0), x)
  with pytest.raises(ValueError, match="integer token ids"):
    _small_model().init(jax.random.key(0), jnp.ones((B, 15)))
  with pytest.raises(ValueError, match="readout"):
    _small_model(readout="mean").init(jax.random.key(0), x)


def test_bfloat16_compute_keeps_float32_params_and_readout():
  """`dtype=bfloat16` runs the projection and MLP matmuls in bf16 on the same float32
  params; the output stays float32 and close to the float32 model's."""
  tokens = boolean.tokens(jax.random.choice(jax.random.key(0), jnp.array([-1, 1]), (8, 6)))
  f32 = TokenTransformer(width=32, depth=2, num_heads=2, head_dim=16, mlp_dim=32)
  bf16 = f32.clone(dtype=jnp.bfloat16)
  params = f32.init(jax.random.key(1), tokens)["params"]
  chex.assert_trees_all_equal_shapes_and_dtypes(
      params, bf16.init(jax.random.key(1), tokens)["params"])
  out_f32, out_bf16 = f32.apply({"params": params}, tokens), bf16.apply({"params": params},
                                                                        tokens)
  assert out_bf16.dtype == jnp.float32
  assert not np.array_equal(out_f32, out_bf16)  # The matmuls did run in bf16.
  np.testing.assert_allclose(out_bf16, out_f32, atol=0.05 * float(jnp.abs(out_f32).max()))


def _equations(jaxpr):
  for e in jaxpr.eqns:
    yield e
    for param in e.params.values():
      inner = getattr(param, "jaxpr", param)
      if hasattr(inner, "eqns"):
        yield from _equations(inner)


def test_bfloat16_compute_keeps_logits_softmax_prior_and_readout_in_float32():
  """In the traced bf16 model: the projections and MLP are bf16 matmuls, but q·kᵀ comes
  out float32, log σ(M) is computed and added to it in float32 (never rounded to bf16),
  every exp (the softmax's, the prior's softplus) and row max is float32, and the readout
  matmul takes float32."""
  tokens = boolean.tokens(jnp.ones((4, 6)))
  model = TokenTransformer(width=32, depth=1, num_heads=2, head_dim=16, mlp_dim=32,
                           dtype=jnp.bfloat16)
  params = model.init(jax.random.key(0), tokens)["params"]
  jaxpr = jax.make_jaxpr(lambda p: model.apply({"params": p}, tokens))(params).jaxpr
  eqns = list(_equations(jaxpr))
  dtypes = lambda vs: {str(v.aval.dtype) for v in vs if hasattr(v, "aval")}
  shape = lambda v: tuple(v.aval.shape)
  logits_shape = (4, 2, 7, 7)  # [B, H, N, N]: CLS and 6 tokens.
  dots = [e for e in eqns if e.primitive.name == "dot_general"]
  assert {"bfloat16"} in [dtypes(e.invars) for e in dots]  # The compute did run in bf16.
  (logits,) = [e for e in dots if shape(e.outvars[0]) == logits_shape]
  assert dtypes(logits.outvars) == {"float32"}
  (prior,) = [e for e in eqns if e.primitive.name == "add"
              and shape(e.outvars[0]) == logits_shape]
  assert dtypes(prior.invars) == dtypes(prior.outvars) == {"float32"}
  # Nothing shaped like the prior or the logits is rounded to bf16 on the way, but the
  # probabilities the P·V matmul takes.
  rounded = [shape(e.outvars[0]) for e in eqns if e.primitive.name == "convert_element_type"
             and dtypes(e.outvars) == {"bfloat16"}]
  assert (2, 7, 7) not in rounded and rounded.count(logits_shape) == 1, rounded
  for name in ("exp", "log1p", "reduce_max"):
    found = [e for e in eqns if e.primitive.name == name]
    assert found and all(dtypes(e.outvars) == {"float32"} for e in found), name
  assert dtypes(dots[-1].invars) == {"float32"} and shape(dots[-1].outvars[0]) == (4, 1)
