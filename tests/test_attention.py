"""`masked_attention` against references, the Theorem 1 gradient identity, bad input."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mpx
from mpx import priors

B, N, H, D = 2, 6, 3, 4


def _qkv(seed=0, dtype=jnp.float32):
  kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
  shape = (B, N, H, D)
  return tuple(jax.random.normal(k, shape).astype(dtype) for k in (kq, kk, kv))


def _reference(q, k, v, bias_BHNN=None, allowed_BHNN=None):
  """Plain einsum softmax attention, written independently of mpx."""
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  if bias_BHNN is not None:
    logits = logits + bias_BHNN
  if allowed_BHNN is not None:
    logits = jnp.where(allowed_BHNN, logits, -1e30)
  return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v)


def _padding():
  pad = np.ones((B, N), bool)
  pad[0, -2:] = False
  return jnp.asarray(pad)


class NeutralPriorTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_equals_references(self):
    q, k, v = _qkv()
    for mask in (None, priors.neutral(N), priors.neutral(N, H)):
      out = self.variant(lambda q, k, v, m=mask: mpx.masked_attention(q, k, v, m))(q, k, v)
      chex.assert_trees_all_close(out, _reference(q, k, v), atol=1e-6, rtol=1e-6)
      chex.assert_trees_all_close(out, nn.dot_product_attention(q, k, v), atol=1e-6,
                                  rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_causal_and_padding_equal_references(self):
    q, k, v = _qkv(1)
    pad = _padding()
    causal_NN = jnp.tril(jnp.ones((N, N), bool))
    allowed = causal_NN[None, None] & pad[:, None, None, :]
    for mask in (priors.neutral(N), priors.neutral(N, H)):
      f = lambda q, k, v, m=mask: mpx.masked_attention(q, k, v, m, causal=True,
                                                         padding_mask=pad)
      out = self.variant(f)(q, k, v)
      chex.assert_trees_all_close(out, _reference(q, k, v, None, allowed), atol=1e-6)
      flax_mask = nn.combine_masks(nn.make_causal_mask(jnp.zeros((B, N))),
                                   nn.make_attention_mask(jnp.ones((B, N), bool), pad))
      chex.assert_trees_all_close(out, nn.dot_product_attention(q, k, v, mask=flax_mask),
                                  atol=1e-6)

  def test_neutral_prior_is_bitwise_standard_attention(self):
    q, k, v = _qkv(2)
    np.testing.assert_array_equal(mpx.mask_bias(priors.neutral(N, H)), 0.0)
    np.testing.assert_array_equal(mpx.masked_attention(q, k, v, priors.neutral(N, H)),
                                  mpx.masked_attention(q, k, v, None))


class PriorTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_shared_and_per_head_match_reference(self):
    q, k, v = _qkv(3)
    m_HNN = jax.random.normal(jax.random.key(4), (H, N, N)) * 3
    pad = _padding()
    causal_NN = jnp.tril(jnp.ones((N, N), bool))
    for mask, bias in ((m_HNN[0], jax.nn.log_sigmoid(m_HNN[0])[None, None]),
                       (m_HNN, jax.nn.log_sigmoid(m_HNN)[None])):
      out = self.variant(lambda q, k, v, m=mask: mpx.masked_attention(q, k, v, m))(q, k, v)
      chex.assert_trees_all_close(out, _reference(q, k, v, bias), atol=1e-6)
      out = self.variant(lambda q, k, v, m=mask: mpx.masked_attention(
          q, k, v, m, causal=True, padding_mask=pad))(q, k, v)
      allowed = causal_NN[None, None] & pad[:, None, None, :]
      chex.assert_trees_all_close(out, _reference(q, k, v, bias, allowed), atol=1e-6)

  def test_batched_mask(self):
    q, k, v = _qkv(5)
    m_BHNN = jax.random.normal(jax.random.key(6), (B, H, N, N))
    out = mpx.masked_attention(q, k, v, m_BHNN)
    for b in range(B):
      chex.assert_trees_all_close(out[b], mpx.masked_attention(q[b], k[b], v[b], m_BHNN[b]),
                                  atol=1e-6)

  def test_logits_in_float32_for_bfloat16_inputs(self):
    q, k, _ = _qkv(7, jnp.bfloat16)
    logits = mpx.attention.attention_logits(q, k, priors.neutral(N))
    assert logits.dtype == jnp.float32
    out = mpx.masked_attention(*_qkv(7, jnp.bfloat16), priors.neutral(N))
    assert out.dtype == jnp.bfloat16

  def test_fully_masked_row_gives_zeros_not_nan(self):
    q, k, v = _qkv(8)
    pad = jnp.zeros((B, N), bool)
    out, grads = jax.value_and_grad(
        lambda q: mpx.masked_attention(q, k, v, priors.neutral(N), padding_mask=pad).sum())(q)
    assert out == 0.0
    assert bool(jnp.all(jnp.isfinite(grads)))

  @chex.variants(with_jit=True, without_jit=True)
  def test_jax_implementation_matches_reference(self):
    q, k, v = _qkv(9)
    m_HNN = jax.random.normal(jax.random.key(10), (H, N, N)) * 2
    pad = _padding().at[1].set(False)  # Batch row 1: every key padded.
    for mask in (m_HNN, m_HNN[0], None):
      for kwargs in ({}, {"causal": True}, {"padding_mask": pad},
                     {"causal": True, "padding_mask": pad}):
        ref = mpx.masked_attention(q, k, v, mask, **kwargs)
        fast = self.variant(lambda q, k, v, m=mask, kw=kwargs: mpx.masked_attention(
            q, k, v, m, implementation="jax", **kw))(q, k, v)
        chex.assert_trees_all_close(fast, ref, atol=1e-5)


@pytest.mark.parametrize("implementation", ["reference", "jax"])
def test_bfloat16_inputs_keep_the_bias_in_float32(implementation):
  """Near -100 bf16 steps by 0.5, so a bf16 bias would move each logit by up to 0.25."""
  q, k, v = _qkv(16, jnp.bfloat16)
  m_HNN = -100.0 - jax.random.uniform(jax.random.key(17), (H, N, N))
  bias_HNN = jax.nn.log_sigmoid(m_HNN)
  upcast = lambda x: x.astype(jnp.float32)
  want = _reference(upcast(q), upcast(k), upcast(v), bias_HNN[None])
  rounded = _reference(upcast(q), upcast(k), upcast(v),
                       upcast(bias_HNN.astype(jnp.bfloat16))[None])
  assert float(jnp.max(jnp.abs(rounded - want))) > 0.1  # The case can tell them apart.
  out = mpx.masked_attention(q, k, v, m_HNN, implementation=implementation)
  assert out.dtype == jnp.bfloat16
  chex.assert_trees_all_close(upcast(out), want, atol=1e-2)  # bf16 output rounding.


class CudnnTest(chex.TestCase):

  def test_listed(self):
    assert "cudnn" in mpx.attention.IMPLEMENTATIONS

  def test_float32_inputs_raise_naming_the_fix(self):
    q, k, v = _qkv(18)
    with pytest.raises(ValueError, match='float16 or all bfloat16.*implementation="jax"'):
      mpx.masked_attention(q, k, v, implementation="cudnn")
    with pytest.raises(ValueError, match="float16 or all bfloat16"):
      mpx.masked_attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v,
                           implementation="cudnn")

  @pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the non-GPU error")
  def test_non_gpu_backend_raises_naming_the_fix(self):
    q, k, v = _qkv(19, jnp.bfloat16)
    with pytest.raises(ValueError, match='NVIDIA GPU.*implementation="jax" or "reference"'):
      mpx.masked_attention(q, k, v, priors.neutral(N), implementation="cudnn")
    with pytest.raises(ValueError, match="NVIDIA GPU"):
      jax.jit(lambda q: mpx.masked_attention(q, k, v, implementation="cudnn"))(q)

  @pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN needs an NVIDIA GPU")
  def test_matches_reference_on_gpu(self):
    """Forward and mask gradient in bf16; N = 16 and head dim 16 fit cuDNN's limits."""
    kq, kk, kv, km = jax.random.split(jax.random.key(20), 4)
    q, k, v = (jax.random.normal(key, (2, 16, 2, 16), jnp.bfloat16) for key in (kq, kk, kv))
    m_HNN = jax.random.normal(km, (2, 16, 16)) * 3
    pad = jnp.ones((2, 16), bool).at[0, -3:].set(False)

    def loss(m, implementation):
      out = mpx.masked_attention(q, k, v, m, padding_mask=pad,
                                 implementation=implementation)
      return jnp.sum(out.astype(jnp.float32) ** 2), out

    (_, ref), grad_ref = jax.value_and_grad(loss, has_aux=True)(m_HNN, "reference")
    (_, out), grad = jax.jit(jax.value_and_grad(loss, has_aux=True),
                             static_argnums=1)(m_HNN, "cudnn")
    chex.assert_trees_all_close(out.astype(jnp.float32), ref.astype(jnp.float32),
                                atol=2e-2)
    assert bool(jnp.all(jnp.isfinite(grad)))
    chex.assert_trees_all_close(grad, grad_ref, atol=5e-2, rtol=5e-2)


class MaskBiasTest(chex.TestCase):

  def test_nonpositive_and_stable(self):
    m = jnp.array([-1e4, -50.0, -1.0, 0.0, 1.0, 50.0, 1e4, priors.NEUTRAL_LOGIT])
    bias = mpx.mask_bias(m)
    assert bool(jnp.all(bias <= 0)) and bool(jnp.all(jnp.isfinite(bias)))
    np.testing.assert_allclose(bias[:3], [-1e4, -50.0, -1.3132616], rtol=1e-6)
    assert bias[3] == pytest.approx(-np.log(2.0))
    m_random = jax.random.normal(jax.random.key(0), (1000,)) * 30
    assert bool(jnp.all(mpx.mask_bias(m_random) <= 0))

  def test_theorem1_gradient_identity(self):
    """dL/dM = dL/d(logits) · σ(−M), elementwise, for a per-head mask."""
    q, k, v = _qkv(11)
    m_HNN = jax.random.normal(jax.random.key(12), (H, N, N)) * 3
    w = jax.random.normal(jax.random.key(13), (B, N, H, D))

    def loss_from_bias(bias_HNN):
      logits = mpx.attention.attention_logits(q, k) + bias_HNN
      out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v)
      return jnp.sum(out * w)

    grad_m = jax.grad(lambda m: jnp.sum(mpx.masked_attention(q, k, v, m) * w))(m_HNN)
    grad_logits = jax.grad(loss_from_bias)(mpx.mask_bias(m_HNN))
    chex.assert_trees_all_close(grad_m, grad_logits * jax.nn.sigmoid(-m_HNN), atol=1e-6)
    # The bound of Corollary 1: |dL/dM| <= |dL/dlogits|, and neutral entries get nothing.
    assert bool(jnp.all(jnp.abs(grad_m) <= jnp.abs(grad_logits) + 1e-7))
    grad_neutral = jax.grad(lambda m: jnp.sum(mpx.masked_attention(q, k, v, m) * w))(
        priors.neutral(N, H))
    np.testing.assert_array_equal(grad_neutral, 0.0)


def test_vmap_over_priors_equals_loop():
  q, k, v = _qkv(14)
  stack_PHNN = jnp.stack([priors.neutral(N, H),
                          priors.repeat_heads(priors.parity_prior(N - 1, (0, 1), 4.0), H),
                          jax.random.normal(jax.random.key(15), (H, N, N)) * 5])
  vmapped = jax.vmap(lambda m: mpx.masked_attention(q, k, v, m))(stack_PHNN)
  for p in range(stack_PHNN.shape[0]):
    chex.assert_trees_all_close(vmapped[p], mpx.masked_attention(q, k, v, stack_PHNN[p]),
                                atol=1e-6)


@pytest.mark.parametrize("mask_shape, match", [
    ((N + 1, N + 1), "queries"),
    ((N, N + 1), "queries"),
    ((H + 1, N, N), "heads"),
    ((N,), "rank"),
])
def test_bad_mask_shapes_raise(mask_shape, match):
  q, k, v = _qkv()
  with pytest.raises(ValueError, match=match):
    mpx.masked_attention(q, k, v, jnp.zeros(mask_shape))


def test_bad_qkv_and_options_raise():
  q, k, v = _qkv()
  with pytest.raises(ValueError, match="rank"):
    mpx.masked_attention(q[0, 0], k[0, 0], v[0, 0])
  with pytest.raises(ValueError, match="heads, head_dim"):
    mpx.masked_attention(q, k[..., :2], v)
  with pytest.raises(ValueError, match="boolean"):
    mpx.masked_attention(q, k, v, padding_mask=jnp.ones((B, N)))
  with pytest.raises(ValueError, match="padding_mask"):
    mpx.masked_attention(q, k, v, padding_mask=jnp.ones((B, N + 1), bool))
  with pytest.raises(ValueError, match="implementation"):
    mpx.masked_attention(q, k, v, implementation="flash")


def _attention_grads(q, k, v, m_HNN, w):
  """Gradients of a weighted sum of the output in q, k, v and M: the training step's."""
  loss = lambda q, k, v, m: jnp.sum(mpx.masked_attention(q, k, v, m, causal=True) * w)
  return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, m_HNN)


_ON_CPU = pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's products")


def _takes_cpu_products(q, k, v, m_HNN) -> bool:
  jaxpr = str(jax.make_jaxpr(lambda *args: mpx.masked_attention(*args))(q, k, v, m_HNN))
  return "_qk_cpu" in jaxpr and "_pv_cpu" in jaxpr


@_ON_CPU
def test_cpu_products_match_the_einsums(monkeypatch):
  """On XLA:CPU the attention products carry their own JVP (so that the backward pass
  contracts row-major operands): the output is the einsum's bit for bit, the gradients
  (reverse mode) and a JVP (forward mode) agree with the einsum's own to 1e-6 of their
  largest entry (the dots sum in another order)."""
  q, k, v = _qkv(16)
  m_HNN = jax.random.normal(jax.random.key(17), (H, N, N)) * 2
  w = jax.random.normal(jax.random.key(18), (B, N, H, D))
  dk = jax.random.normal(jax.random.key(19), k.shape)
  jvp = lambda: jax.jvp(lambda q, k, v: mpx.masked_attention(q, k, v, m_HNN), (q, k, v),
                        (k, dk, w))  # A tangent for each operand: q·dkᵀ is a product too.
  assert _takes_cpu_products(q, k, v, m_HNN)
  fast = (mpx.masked_attention(q, k, v, m_HNN), _attention_grads(q, k, v, m_HNN, w), jvp())
  monkeypatch.setattr(mpx.attention, "_cpu_products", lambda *args: False)
  assert not _takes_cpu_products(q, k, v, m_HNN)
  einsum = (mpx.masked_attention(q, k, v, m_HNN), _attention_grads(q, k, v, m_HNN, w), jvp())
  np.testing.assert_array_equal(fast[0], einsum[0])
  for got, want in zip(jax.tree_util.tree_leaves(fast[1:]),
                       jax.tree_util.tree_leaves(einsum[1:])):
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * float(jnp.max(jnp.abs(want))))


def test_long_sequences_and_other_dtypes_keep_the_einsums():
  """Past `CPU_PRODUCTS_MAX_TOKENS` the swaps cost more than they save (1.9x slower at
  128 tokens), and the products are float32's only."""
  n = mpx.attention.CPU_PRODUCTS_MAX_TOKENS + 1
  q = jax.random.normal(jax.random.key(22), (B, n, H, D))
  assert not _takes_cpu_products(q, q, q, jnp.zeros((H, n, n)))
  q, k, v = _qkv(23, jnp.bfloat16)
  assert not _takes_cpu_products(q, k, v, jnp.zeros((H, N, N)))


@_ON_CPU
@pytest.mark.parametrize("members", [None, 3])
def test_no_attention_dot_takes_a_transposed_left_operand_on_cpu(members):
  """XLA:CPU sends a dot whose left operand contracts its second-to-last axis to Eigen,
  at half YNNPACK's speed at these shapes; every batched dot of the attention's backward
  pass contracts the left operand's last axis (alone and vmapped over members)."""
  q, k, v = _qkv(19)
  m_HNN = jax.random.normal(jax.random.key(20), (H, N, N))
  w = jax.random.normal(jax.random.key(21), (B, N, H, D))
  args = (q, k, v, m_HNN, w)
  grads = lambda args: _attention_grads(*args)
  if members is not None:
    args = jax.tree_util.tree_map(lambda x: jnp.stack([x] * members), args)
  fn = jax.jit(grads if members is None else jax.vmap(grads))
  dots = [line for line in fn.lower(args).compile().as_text().splitlines()
          if " dot(" in line and "lhs_batch_dims" in line]
  assert dots, "no batched dot in the compiled program: the check reads nothing"
  for line in dots:
    rank = line.split(" = ")[1].split("]")[0].count(",") + 1
    assert f"lhs_contracting_dims={{{rank - 1}}}" in line, line
