"""Every prior: shape, dtype, known entries, symmetry; bad input raises."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mpx
from mpx import priors


def _allowed(mask):
  return np.asarray(mask) > 0


def test_generic_adjacency_and_pairs():
  allowed = np.eye(3, dtype=bool)
  m = priors.from_adjacency(allowed, 5.0)
  chex.assert_shape(m, (3, 3))
  assert m.dtype == jnp.float32
  np.testing.assert_array_equal(m, np.where(allowed, 5.0, -5.0))
  m = priors.from_adjacency(allowed, 8.0, suppressed_strength=2.0)
  np.testing.assert_array_equal(m, np.where(allowed, 8.0, -2.0))
  m = priors.from_pairs([(0, 2)], 3, 3.0, symmetric=True)
  np.testing.assert_array_equal(_allowed(m), [[0, 0, 1], [0, 0, 0], [1, 0, 0]])
  assert priors.from_pairs([(0, 2)], 3)[2, 0] == -4.0


def test_head_stacking():
  a, b = priors.neutral(4), priors.from_pairs([(1, 1)], 4)
  chex.assert_shape(priors.stack_heads([a, b]), (2, 4, 4))
  np.testing.assert_array_equal(priors.repeat_heads(b, 3)[2], b)
  with pytest.raises(ValueError, match="one shape"):
    priors.stack_heads([a, priors.neutral(5)])


def _neutral_case():
  """q, k, v `[B, N, H, D]`, a loss on the attention output, and N, H."""
  n, h = 5, 3
  q, k, v, w = (jax.random.normal(key, (2, n, h, 4))
                for key in jax.random.split(jax.random.key(0), 4))
  loss = lambda m: jnp.sum(mpx.masked_attention(q, k, v, m) * w)
  return (q, k, v), loss, n, h


def test_both_neutral_priors_are_standard_attention():
  (q, k, v), _, n, h = _neutral_case()
  standard = mpx.masked_attention(q, k, v, None)
  frozen, learnable = priors.neutral(n, h), priors.neutral(n, h, learnable=True)
  np.testing.assert_array_equal(frozen, priors.neutral_init(None, (h, n, n)))
  np.testing.assert_array_equal(learnable, priors.learnable_neutral_init(None, (h, n, n)))
  np.testing.assert_array_equal(learnable, 0.0)
  chex.assert_shape(priors.neutral(n, learnable=True), (n, n))
  np.testing.assert_array_equal(mpx.masked_attention(q, k, v, frozen), standard)
  np.testing.assert_allclose(mpx.masked_attention(q, k, v, learnable), standard, atol=1e-6)


def test_frozen_neutral_never_moves_and_learnable_neutral_does():
  """Plain SGD: the gradient σ(−M) is exactly 0 at M = 200 and 1/2 at M = 0."""
  _, loss, n, h = _neutral_case()
  for learnable in (False, True):
    m = priors.neutral(n, h, learnable=learnable)
    value, grad = jax.value_and_grad(loss)(m)
    stepped = m - 0.1 * grad
    if learnable:
      assert float(jnp.max(jnp.abs(grad))) > 1e-3
      assert float(loss(stepped)) < float(value)
    else:
      np.testing.assert_array_equal(grad, 0.0)
      np.testing.assert_array_equal(stepped, m)


def test_bias_to_logits_round_trip():
  b = jnp.array([-10.0, -2.0, -0.5, -1e-3, 0.0])
  m = priors.bias_to_logits(b)
  np.testing.assert_allclose(mpx.mask_bias(m), b, rtol=1e-4, atol=1e-6)
  assert m[-1] == priors.NEUTRAL_LOGIT and mpx.mask_bias(m)[-1] == 0.0
  with pytest.raises(ValueError, match="b <= 0"):
    priors.bias_to_logits(jnp.array([0.1]))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_strength_must_be_positive(bad):
  with pytest.raises(ValueError, match="strength"):
    priors.parity_prior(15, strength=bad)
  with pytest.raises(ValueError, match="strength"):
    priors.from_adjacency(np.eye(2, dtype=bool), 1.0, suppressed_strength=bad)


def test_parity_prior():
  m = priors.parity_prior(15, (0, 1), 4.0)
  chex.assert_shape(m, (16, 16))
  a = _allowed(m)
  # CLS = 0, x0 = token 1, x1 = token 2: a symmetric clique with CLS.
  np.testing.assert_array_equal(a[:3, :3], np.ones((3, 3)))
  np.testing.assert_array_equal(a, a.T)
  assert not a[0, 3:].any() and not a[1, 3:].any()
  np.testing.assert_array_equal(a[3:, 3:], np.eye(13, dtype=bool))  # Others: self only.
  assert m[1, 2] == 4.0 and m[1, 5] == -4.0
  no_self = _allowed(priors.parity_prior(15, self_attention=False))
  assert not no_self[1, 1] and no_self[1, 2] and no_self[0, 0]


def test_boolean_policies():
  a = priors.boolean_adjacency(4, (1,), cls_row="all", cls_column="none", others="support")
  assert a[0].all()            # CLS reads everything.
  assert not a[2:, 0].any()    # Nobody but CLS reads CLS.
  assert a[1, 2] and a[1, 1]   # Bit 0 (token 1) reads the support bit 1 (token 2).
  assert not a[1, 3]
  with pytest.raises(ValueError, match="cls_row"):
    priors.boolean_adjacency(4, (1,), cls_row="bits")
  with pytest.raises(ValueError, match="support"):
    priors.boolean_adjacency(4, (7,))


def test_majority_prior_suppresses_shortcut():
  a = _allowed(priors.majority_prior(15, (0, 1, 2), 4.0))
  support, irrelevant = [1, 2, 3], list(range(4, 16))
  assert a[0, support].all() and a[0, 0]          # CLS reads itself and the support.
  assert not a[0, irrelevant].any()               # ... never the irrelevant bits.
  assert not a[support, support].any()            # No bit reads itself.
  assert a[1, 2] and a[2, 3] and a[3, 1]          # Bits read each other.
  assert a[support, 0].all()                      # Bits may read CLS.
  plain = _allowed(priors.majority_prior(15, suppress_shortcut=False))
  assert plain[0, 1:4].all() and plain[1, 1]


def test_majority_prior_readout_reaches_every_support_bit():
  """With content-free logits (q·k = 0) the attention is softmax(log σ(M)): CLS must put
  its mass on the support tokens, each of them well above any irrelevant bit, and
  every support bit must reach CLS in one hop (directly) and in two (via a partner)."""
  m = priors.majority_prior(15, (0, 1, 2), 4.0)
  weights = np.asarray(jax.nn.softmax(mpx.mask_bias(m), axis=-1))
  support, irrelevant = [1, 2, 3], list(range(4, 16))
  # CLS's allowed keys are itself and the 3 support tokens: 3/4 of its mass, within 10%.
  assert weights[0, support].sum() > 0.9 * 3 / 4
  assert weights[0, support].min() > 20 * weights[0, irrelevant].max()
  a = _allowed(m).astype(int)
  two_hops = (a @ a) > 0
  for bit in support:
    assert a[0, bit] and two_hops[0, bit], bit


def test_cyclic_prior():
  m = priors.cyclic_prior(15, 3, 4.0)
  a = _allowed(m)
  chex.assert_shape(m, (16, 16))
  np.testing.assert_array_equal(a, a.T)
  bit = lambda i: i + 1
  assert a[bit(0), bit(2)] and a[bit(0), bit(13)] and a[bit(0), bit(14)]
  assert not a[bit(0), bit(3)] and not a[bit(0), bit(12)]
  assert a[0].all() and a[:, 0].all()
  assert a[1:, 1:].sum(1).tolist() == [5] * 15   # Self plus 2 on each side.


def test_arithmetic_priors():
  layout = priors.arithmetic_layout(3, 3, 4)
  # [BOS] a2 a1 a0 + b2 b1 b0 = c0 c1 c2 c3
  assert layout.n_tokens == 13
  assert layout.a == (3, 2, 1) and layout.b == (7, 6, 5) and layout.answer == (9, 10, 11, 12)
  add = _allowed(priors.addition_prior(layout, 4.0))
  chex.assert_shape(add, (13, 13))
  row = layout.answer[1] - 1      # The token that predicts c1.
  np.testing.assert_array_equal(np.nonzero(add[row])[0], sorted([row, 2, 3, 6, 7]))
  row0 = layout.answer[0] - 1
  np.testing.assert_array_equal(np.nonzero(add[row0])[0], sorted([row0, 3, 7]))
  assert add[0].all()             # Rows that predict no answer digit stay open.
  mul = _allowed(priors.multiplication_prior(priors.arithmetic_layout(3, 3, 6), 4.0,
                                             carry=False))
  row2 = 9 + 2 - 1                # Predicts place 2: pairs (0,2), (1,1), (2,0).
  np.testing.assert_array_equal(np.nonzero(mul[row2])[0], sorted([row2, 1, 2, 3, 5, 6, 7]))
  row0 = 9 - 1
  np.testing.assert_array_equal(np.nonzero(mul[row0])[0], sorted([3, row0, 7]))


def test_window_prior():
  m = priors.window_prior(4, 5, 3, 4.0)
  chex.assert_shape(m, (21, 21))
  a = _allowed(m)
  np.testing.assert_array_equal(a, a.T)
  assert a[0].all() and a[:, 0].all()           # CLS open.
  tok = lambda r, c: 1 + r * 5 + c
  assert a[tok(1, 1), tok(0, 0)] and a[tok(1, 1), tok(2, 2)]
  assert not a[tok(1, 1), tok(3, 1)] and not a[tok(0, 4), tok(1, 0)]   # No wrap.
  assert a[tok(1, 1)].sum() == 9 + 1
  with pytest.raises(ValueError, match="odd"):
    priors.window_prior(4, 4, 2)


def test_impulse_shifts_and_prior():
  assert priors.impulse_shifts(3) == [(0, 0), (-1, 0), (0, 1)]
  assert priors.impulse_shifts(10)[9] == (0, 0)
  assert len(set(priors.impulse_shifts(9))) == 9
  m = priors.impulse_prior(14, 14, 3, 4.0)
  chex.assert_shape(m, (3, 197, 197))
  a = _allowed(m)
  tok = lambda r, c: 1 + r * 14 + c
  assert a[:, 0].all() and a[:, :, 0].all()
  for h, (dr, dc) in enumerate(priors.impulse_shifts(3)):
    assert a[h, tok(5, 5), 1:].sum() == 1 and a[h, tok(5, 5), tok(5 + dr, 5 + dc)]
  assert not a[1, tok(0, 3), 1:].any()     # Shift (−1, 0) leaves the grid: no wrap.


def test_alibi_prior():
  m = priors.alibi_prior(6, 4)
  chex.assert_shape(m, (4, 6, 6))
  slopes = priors.alibi_slopes(4)
  np.testing.assert_allclose(slopes, 2.0 ** (-8.0 * np.arange(1, 5) / 4))
  bias = np.asarray(mpx.mask_bias(m))
  for h in range(4):
    np.testing.assert_allclose(bias[h, 5, 2], -3 * slopes[h], rtol=1e-4)
    assert bias[h, 3, 3] == 0.0 and bias[h, 1, 4] == 0.0   # Diagonal and future: no bias.


def test_as_initializer_checks_shape():
  init = priors.as_initializer(priors.neutral(4, 2))
  np.testing.assert_array_equal(init(None, (2, 4, 4)), priors.neutral(4, 2))
  with pytest.raises(ValueError, match="rebuild the prior"):
    init(None, (2, 5, 5))
