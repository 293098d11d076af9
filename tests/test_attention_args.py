"""`masked_attention`'s mask, bias, dropout and query_offset against a plain reference
and against Flax; the one-line errors for bad shapes and arguments."""

import itertools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mpx
from mpx import priors

B, N, H, D = 2, 6, 3, 4
NQ = 2  # Queries of a KV-cached decoding step.
IMPLEMENTATIONS = ("reference", "jax")


def _normal(seed, shape, scale=1.0):
  return jax.random.normal(jax.random.key(seed), shape) * scale


def _qkv(seed=0, n_q=N):
  return _normal(seed, (B, n_q, H, D)), _normal(seed + 1, (B, N, H, D)), _normal(
      seed + 2, (B, N, H, D))


def _args(n_q=N):
  """A prior, a mask with one fully hidden row, a bias and a padding mask."""
  m_HNN = _normal(10, (H, N, N), 3.0)
  mask_B1QK = np.array(jax.random.bernoulli(jax.random.key(11), 0.7, (B, 1, n_q, N)))
  mask_B1QK[0, 0, 1] = False
  bias_HQK = _normal(12, (H, n_q, N))
  pad_BN = np.ones((B, N), bool)
  pad_BN[1, -2:] = False
  return m_HNN, jnp.asarray(mask_B1QK), bias_HQK, jnp.asarray(pad_BN)


def _causal_QK(n_q, offset=0):
  return np.arange(N)[None, :] <= (offset + np.arange(n_q))[:, None]


def _reference(q, k, v, bias_BHQK=None, allowed_BHQK=None):
  """einsum + where + softmax, written independently of mpx; hidden rows give zeros."""
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  if bias_BHQK is not None:
    logits = logits + bias_BHQK
  allowed = np.broadcast_to(True if allowed_BHQK is None else allowed_BHQK, logits.shape)
  probs = jax.nn.softmax(jnp.where(allowed, logits, -jnp.inf), -1)
  probs = jnp.where(allowed.any(-1, keepdims=True), probs, 0.0)
  return jnp.einsum("bhqk,bkhd->bqhd", probs, v), probs


def _expected(q, k, v, use, m_HNN, mask, bias, pad, n_q=N, offset=0):
  """The reference for the arguments switched on in `use` (a set of names)."""
  total = jax.nn.log_sigmoid(m_HNN[:, offset:offset + n_q])[None]
  allowed = np.ones((B, 1, n_q, N), bool)
  if "mask" in use:
    allowed = allowed & np.asarray(mask)
  if "bias" in use:
    total = total + bias
  if "causal" in use:
    allowed = allowed & _causal_QK(n_q, offset)
  if "padding" in use:
    allowed = allowed & np.asarray(pad)[:, None, None, :]
  return _reference(q, k, v, total, allowed)


def _kwargs(use, mask, bias, pad):
  return {"mask": mask if "mask" in use else None,
          "bias": bias if "bias" in use else None,
          "causal": "causal" in use,
          "padding_mask": pad if "padding" in use else None}


NAMES = ("mask", "bias", "causal", "padding")
SUBSETS = [set(c) for r in range(len(NAMES) + 1) for c in itertools.combinations(NAMES, r)]


class CombinationsTest(chex.TestCase):

  def test_every_combination_matches_reference(self):
    q, k, v = _qkv()
    m_HNN, mask, bias, pad = _args()
    for use in SUBSETS:
      want, want_probs = _expected(q, k, v, use, m_HNN, mask, bias, pad)
      kwargs = _kwargs(use, mask, bias, pad)
      chex.assert_trees_all_close(mpx.attention_weights(q, k, m_HNN, **kwargs), want_probs,
                                  atol=1e-6)
      for implementation in IMPLEMENTATIONS:
        out = mpx.masked_attention(q, k, v, m_HNN, implementation=implementation, **kwargs)
        chex.assert_trees_all_close(out, want, atol=1e-5)

  def test_traced_query_offset_serves_a_kv_cache(self):
    """Nq = 2 queries at a traced offset see the prior's rows and keys <= their position,
    and equal those rows of the full sequence's attention."""
    q_full, k, v = _qkv(20)
    m_HNN, mask_full, bias_full, pad = _args()
    use = set(NAMES)
    full = mpx.masked_attention(q_full, k, v, m_HNN, **_kwargs(use, mask_full, bias_full,
                                                                 pad))
    traces = []
    for implementation in IMPLEMENTATIONS:

      @jax.jit
      def step(q, mask, bias, offset, implementation=implementation):
        traces.append(offset)
        return mpx.masked_attention(q, k, v, m_HNN, mask=mask, bias=bias, causal=True,
                                    padding_mask=pad, query_offset=offset,
                                    implementation=implementation)

      for offset in (0, 1, N - NQ):
        rows = slice(offset, offset + NQ)
        q, mask, bias = q_full[:, rows], mask_full[:, :, rows], bias_full[:, rows]
        out = step(q, mask, bias, jnp.int32(offset))
        want, _ = _expected(q, k, v, use, m_HNN, mask, bias, pad, NQ, offset)
        chex.assert_trees_all_close(out, want, atol=1e-5)
        chex.assert_trees_all_close(out, full[:, rows], atol=1e-5)
    assert len(traces) == len(IMPLEMENTATIONS)  # One trace each: the offset is traced.

  def test_rectangular_prior_for_cross_attention(self):
    q, k, v = _qkv(30, n_q=NQ)
    m_QK = _normal(31, (NQ, N), 2.0)
    want, _ = _reference(q, k, v, jax.nn.log_sigmoid(m_QK)[None, None])
    for implementation in IMPLEMENTATIONS:
      chex.assert_trees_all_close(
          mpx.masked_attention(q, k, v, m_QK, implementation=implementation), want,
          atol=1e-5)

  def test_bias_stays_float32_for_bfloat16_inputs(self):
    q, k, v = (x.astype(jnp.bfloat16) for x in _qkv(35))
    bias = _normal(36, (H, N, N), 30.0)
    assert mpx.attention.attention_logits(q, k, bias=bias).dtype == jnp.float32
    want, _ = _reference(*(x.astype(jnp.float32) for x in (q, k, v)), bias)
    for implementation in IMPLEMENTATIONS:
      out = mpx.masked_attention(q, k, v, bias=bias, implementation=implementation)
      assert out.dtype == jnp.bfloat16
      chex.assert_trees_all_close(out.astype(jnp.float32), want, atol=2e-2)


def test_fully_hidden_rows_give_zeros_and_finite_gradients():
  """Row 1 of batch 0 is hidden by `mask`, every row of batch 1 by `padding_mask`."""
  q, k, v = _qkv(40)
  m_HNN, mask, bias, _ = _args()
  pad = jnp.ones((B, N), bool).at[1].set(False)
  for implementation in IMPLEMENTATIONS:

    def loss(q, m, bias, implementation=implementation):
      out = mpx.masked_attention(q, k, v, m, mask=mask, bias=bias, causal=True,
                                 padding_mask=pad, implementation=implementation)
      return jnp.sum(out ** 2), out

    (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
        q, m_HNN, bias)
    np.testing.assert_array_equal(out[0, 1], 0.0)
    np.testing.assert_array_equal(out[1], 0.0)
    assert float(jnp.max(jnp.abs(out[0, 0]))) > 0
    for grad in grads:
      assert bool(jnp.all(jnp.isfinite(grad)))


class DropoutTest(chex.TestCase):

  def test_same_rng_drops_the_same_entries_as_flax(self):
    q, k, v = _qkv(50)
    m_HNN, mask, bias, _ = _args()
    rng = jax.random.key(51)
    flax_bias = jax.nn.log_sigmoid(m_HNN)[None] + bias
    for broadcast in (True, False):
      dropout = dict(dropout_rng=rng, dropout_rate=0.4, deterministic=False,
                     broadcast_dropout=broadcast)
      ours = mpx.attention_weights(q, k, m_HNN, mask=mask, bias=bias, **dropout)
      theirs = nn.dot_product_attention_weights(q, k, bias=flax_bias, mask=mask, **dropout)
      hidden_BHQ1 = ~jnp.any(mask, -1, keepdims=True)  # Flax spreads these rows evenly.
      theirs = jnp.where(hidden_BHQ1, 0.0, theirs)
      np.testing.assert_array_equal(ours == 0, theirs == 0)
      chex.assert_trees_all_close(ours, theirs, atol=1e-6)
      assert 0.2 < float(jnp.mean(ours[0, 0, 0] == 0)) < 0.7
      out = mpx.masked_attention(q, k, v, m_HNN, mask=mask, bias=bias, **dropout)
      want = nn.dot_product_attention(q, k, v, bias=flax_bias, mask=mask, **dropout)
      row_visible_BQ11 = jnp.any(mask, -1).transpose(0, 2, 1)[..., None]
      chex.assert_trees_all_close(out, jnp.where(row_visible_BQ11, want, 0.0), atol=1e-5)

  def test_inactive_dropout_changes_nothing(self):
    q, k, v = _qkv(52)
    plain = mpx.masked_attention(q, k, v)
    np.testing.assert_array_equal(
        mpx.masked_attention(q, k, v, dropout_rate=0.5, dropout_rng=jax.random.key(0)),
        plain)
    np.testing.assert_array_equal(mpx.masked_attention(q, k, v, dropout_rate=0.5), plain)
    np.testing.assert_array_equal(
        mpx.masked_attention(q, k, v, dropout_rng=jax.random.key(0), deterministic=False),
        plain)

  def test_bad_dropout_raises_naming_the_fix(self):
    q, k, v = _qkv(53)
    active = dict(dropout_rate=0.1, deterministic=False)
    with pytest.raises(ValueError, match="dropout_rng is None; pass dropout_rng="):
      mpx.masked_attention(q, k, v, **active)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
      mpx.masked_attention(q, k, v, dropout_rate=1.0)
    for implementation in ("jax", "cudnn"):
      with pytest.raises(ValueError, match='no attention dropout.*implementation="reference"'):
        mpx.masked_attention(q, k, v, dropout_rng=jax.random.key(0),
                             implementation=implementation, **active)


def _raises(match, *args, **kwargs):
  """Calls masked_attention; the ValueError must match and fit on one line."""
  with pytest.raises(ValueError, match=match) as error:
    mpx.masked_attention(*args, **kwargs)
  assert "\n" not in str(error.value)


def test_pytorch_layout_is_recognised():
  q, k, v = (jnp.swapaxes(x, 1, 2) for x in _qkv(60))  # [B, H, N, D].
  m_HNN, _, _, pad = _args()
  swap = r"PyTorch.*jnp\.swapaxes\(q, -3, -2\)"
  _raises(swap, q, k, v, m_HNN)
  _raises(swap, q, k, v, padding_mask=pad)
  _raises(swap, q[:, :, :NQ], k, v)  # Cross-attention: Nq != Nk.
  _raises(swap, q, k, v, mask=jnp.ones((B, 1, N, N), bool))
  mpx.masked_attention(jnp.swapaxes(q, -3, -2), jnp.swapaxes(k, -3, -2),
                       jnp.swapaxes(v, -3, -2), m_HNN, padding_mask=pad)


def test_mismatched_shapes_raise_one_line_naming_the_argument():
  q, k, v = _qkv(61)
  m_HNN = priors.neutral(N, H)
  _raises(r"batch dims", q, k[:1], v[:1])
  _raises(r"batch dims", q, k, v, jnp.zeros((3, H, N, N)))
  _raises(r"^mask has shape \(2, 3, 6, 5\).*= \(2, 3, 6, 6\)", q, k, v,
          mask=jnp.ones((B, H, N, N - 1), bool))
  _raises(r"^bias has shape \(4, 1, 1\).*= \(2, 3, 6, 6\)", q, k, v, bias=jnp.zeros((4, 1, 1)))
  _raises(r"^bias has shape", q, k, v, bias=jnp.zeros((1, B, H, N, N)))
  _raises(r"^padding_mask has shape \(3, 6\).*\(2, 6\)", q, k, v,
          padding_mask=jnp.ones((3, N), bool))
  _raises(r"astype\(bool\).*bias=", q, k, v, mask=jnp.ones((N, N)))
  _raises(r"mask=", q, k, v, bias=jnp.ones((N, N), bool))
  _raises(r"^mask_logits has 2 heads", q, k, v, jnp.zeros((2, N, N)))
  mpx.masked_attention(q, k, v, m_HNN, bias=jnp.zeros(()), mask=jnp.ones((N, 1), bool))


def test_query_positions_are_never_guessed():
  q, k, v = _qkv(62, n_q=NQ)
  m_HNN = priors.neutral(N, H)
  _raises(r"causal.*pass query_offset=", q, k, v, causal=True)
  _raises(r"prior over 6 tokens.*pass query_offset=", q, k, v, m_HNN)
  _raises(r"query_offset=5 .*\[0, 4\]", q, k, v, m_HNN, query_offset=5)
  _raises(r"query_offset=-1 ", q, k, v, causal=True, query_offset=-1)
  _raises(r"integer scalar", q, k, v, causal=True, query_offset=1.0)
  _raises(r"integer scalar", q, k, v, causal=True, query_offset=jnp.zeros(B, jnp.int32))
  _raises(r"with query_offset.*square prior", q, k, v, jnp.zeros((NQ, N)), query_offset=0)
  full = mpx.masked_attention(q, k, v, m_HNN, causal=True, query_offset=np.int64(4))
  chex.assert_shape(full, q.shape)
