"""Tests for mpx.inits: QK-SVD, QK-Opt, mimetic, impulse, set_qk.

Sizes are small (N = 8 tokens, D = 32, H = 2, R = 8) so the file runs in
seconds on CPU. "Realises the pattern" means every head puts >= 0.9 of its
attention on allowed keys (`attention_mass_on_pattern`); the uniform share is
0.125 (one-hot rows) or 0.34 (band of 3), and random inits measure 0.08-0.42,
so 0.9 separates a realised prior from chance by a wide margin while leaving
room below the measured ~0.98-1.0 of the inits.
"""

import flax
import flax.linen as nn
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpx import inits

N, D, H, R = 8, 32, 2, 8
REALISED = 0.9


def _pseudo(n=N, d=D, seed=1):
  # GOTU-style learned position embedding at init: N(0, 1).
  return inits.pseudo_input(jax.random.normal(jax.random.PRNGKey(seed), (n, d)))


def _patterns():
  band_NN = (np.abs(np.arange(N)[:, None] - np.arange(N)[None]) <= 1)
  return {
      # One-hot shifts on a 2x4 grid; head 1 ("up") has 4 all-zero rows.
      "impulse_2x4": inits.impulse_patterns(2, 4, H, cls_token=False),
      # Three allowed keys per row.
      "band": jnp.asarray(np.stack([band_NN] * H), jnp.float32),
  }


def _realises(mass_H):
  return bool(jnp.all(mass_H >= REALISED))


def _random_controls(seeds=(100, 101, 102)):
  """Structureless kernels: PyTorch-default U(±1/√D) and QK-Opt's start."""
  out = []
  for s in seeds:
    k1, k2 = jax.random.split(jax.random.PRNGKey(s))
    b = 1.0 / np.sqrt(D)
    out.append(("torch_default",
                jax.random.uniform(k1, (D, H, R), minval=-b, maxval=b),
                jax.random.uniform(k2, (D, H, R), minval=-b, maxval=b)))
    out.append(("qk_opt_init",) + inits.qk_opt_init(jax.random.PRNGKey(s), D, H, R))
  return out


# ----------------------------------------------------------------------------
# pseudo_input and helpers.


def test_pseudo_input_is_affine_free_layernorm():
  pos = 3.0 + 5.0 * jax.random.normal(jax.random.PRNGKey(0), (N, D))
  p = inits.pseudo_input(pos)
  chex.assert_shape(p, (N, D))
  assert p.dtype == jnp.float32
  np.testing.assert_allclose(p.mean(-1), 0.0, atol=1e-5)
  np.testing.assert_allclose(p.var(-1), 1.0, atol=1e-3)
  with pytest.raises(ValueError, match="pos_ND"):
    inits.pseudo_input(jnp.ones((2, N, D)))


def test_truncated_pinv_rank_and_rank_deficient_input():
  p = _pseudo()
  for r in (3, 8, 32):
    pinv = inits.truncated_pinv(p, r)
    chex.assert_shape(pinv, (D, N))
    assert np.linalg.matrix_rank(np.asarray(pinv)) == min(r, N)
  np.testing.assert_allclose(inits.truncated_pinv(p, N), np.linalg.pinv(p),
                             rtol=1e-3, atol=1e-4)
  # Rank 4 < r: the tiny singular values are dropped, not inverted.
  p4 = jnp.concatenate([p[:4], p[:4]])
  pinv = inits.truncated_pinv(p4, 8)
  assert bool(jnp.all(jnp.isfinite(pinv)))
  assert np.linalg.matrix_rank(np.asarray(pinv)) == 4


def test_uniform_kernels_give_uniform_mass():
  zeros = jnp.zeros((D, H, R))
  for pattern in _patterns().values():
    np.testing.assert_allclose(
        inits.attention_mass_on_pattern(zeros, zeros, _pseudo(), pattern),
        inits.uniform_mass_on_pattern(pattern), rtol=1e-6)
  empty = jnp.zeros((1, N, N))
  assert np.isnan(inits.uniform_mass_on_pattern(empty)[0])
  with pytest.raises(ValueError, match="heads"):
    inits.attention_mass_on_pattern(zeros, zeros, _pseudo(), empty)


# ----------------------------------------------------------------------------
# QK-SVD.


def test_qk_svd_shapes_norms_determinism():
  pattern, p = _patterns()["band"], _pseudo()
  wq, wk = inits.qk_svd(pattern, p, R, jax.random.PRNGKey(0))
  chex.assert_shape([wq, wk], (D, H, R))
  assert wq.dtype == wk.dtype == jnp.float32
  np.testing.assert_allclose(jnp.sqrt(jnp.sum(wq**2, axis=(0, 2))), 7.0, rtol=1e-4)
  np.testing.assert_allclose(jnp.sqrt(jnp.sum(wk**2, axis=(0, 2))), 7.0, rtol=1e-4)
  wq2, wk2 = inits.qk_svd(pattern, p, R, jax.random.PRNGKey(0))
  np.testing.assert_array_equal(wq, wq2)
  np.testing.assert_array_equal(wk, wk2)
  wq3, _ = inits.qk_svd(pattern, p, R, jax.random.PRNGKey(1))
  assert not np.allclose(wq, wq3)


def test_qk_svd_logits_are_a_multiple_of_the_target():
  # N <= R and P full row rank: Π = I, so logits = c·W_h exactly: every
  # allowed entry gets the same logit, blocked ones are ~noise/1000 of it.
  pattern, p = _patterns()["impulse_2x4"], _pseudo()
  wq, wk = inits.qk_svd(pattern, p, R, jax.random.PRNGKey(0))
  logits = inits.qk_logits(wq, wk, p)
  for h in range(H):
    on = logits[h][pattern[h] > 0]
    off = logits[h][pattern[h] == 0]
    print(f"head {h}: allowed logit {float(on.mean()):.2f}, "
          f"max |blocked| {float(jnp.abs(off).max()):.3f}")
    assert float(on.std() / on.mean()) < 1e-3
    assert float(jnp.abs(off).max()) < 0.01 * float(on.mean())


@pytest.mark.parametrize("name", ["impulse_2x4", "band"])
def test_qk_svd_realises_pattern_random_init_does_not(name):
  pattern, p = _patterns()[name], _pseudo()
  uniform = inits.uniform_mass_on_pattern(pattern)
  wq, wk = inits.qk_svd(pattern, p, R, jax.random.PRNGKey(0))
  mass = inits.attention_mass_on_pattern(wq, wk, p, pattern)
  print(f"{name}: uniform {np.asarray(uniform)}, qk_svd {np.asarray(mass)}")
  assert _realises(mass)
  for label, cq, ck in _random_controls():
    control = inits.attention_mass_on_pattern(cq, ck, p, pattern)
    print(f"{name}: random control ({label}) {np.asarray(control)}")
    assert not _realises(control)


def test_qk_svd_bad_input():
  pattern, p = _patterns()["band"], _pseudo()
  key = jax.random.PRNGKey(0)
  with pytest.raises(ValueError, match="tokens"):
    inits.qk_svd(pattern[:, :4, :4], p, R, key)
  with pytest.raises(ValueError, match="exceeds the width"):
    inits.qk_svd(pattern, p, D + 1, key)
  with pytest.raises(ValueError, match="pattern_HNN"):
    inits.qk_svd(pattern[0], p, R, key)


def test_qk_svd_fewer_dims_than_tokens():
  # r < N: the pattern is realised through a rank-r projection; still finite
  # and far above chance for the centre (identity) head.
  pattern = inits.impulse_patterns(4, 4, 3)  # N = 17 with CLS
  p = _pseudo(n=17)
  wq, wk = inits.qk_svd(pattern, p, R, jax.random.PRNGKey(0))
  mass = inits.attention_mass_on_pattern(wq, wk, p, pattern)
  uniform = inits.uniform_mass_on_pattern(pattern)
  print(f"4x4+CLS, R={R}: uniform {np.asarray(uniform)}, qk_svd {np.asarray(mass)}")
  assert bool(jnp.all(jnp.isfinite(wq)))
  assert bool(jnp.all(mass > 3 * uniform))


# ----------------------------------------------------------------------------
# QK-Opt (the paper's defaults: 10,000 Adam steps at lr 1e-4; ~1 s on CPU).


@pytest.mark.parametrize("name", ["impulse_2x4", "band"])
def test_qk_opt_realises_pattern_and_lowers_mse(name):
  pattern, p = _patterns()[name], _pseudo()
  key = jax.random.PRNGKey(0)
  wq, wk = inits.qk_opt(pattern, p, R, key)
  chex.assert_shape([wq, wk], (D, H, R))
  assert wq.dtype == jnp.float32
  mass = inits.attention_mass_on_pattern(wq, wk, p, pattern)
  mse0 = inits.qk_mse(*inits.qk_opt_init(key, D, H, R), p, pattern)
  mse1 = inits.qk_mse(wq, wk, p, pattern)
  print(f"{name}: qk_opt mass {np.asarray(mass)}, "
        f"mse {np.asarray(mse0)} -> {np.asarray(mse1)}")
  assert _realises(mass)
  assert bool(jnp.all(mse1 < 0.2 * mse0))
  # The start point itself is a structureless control.
  assert not _realises(
      inits.attention_mass_on_pattern(*inits.qk_opt_init(key, D, H, R), p, pattern))


def test_qk_opt_determinism_renorm_and_short_run():
  pattern, p = _patterns()["band"], _pseudo()
  key = jax.random.PRNGKey(3)
  run = lambda: inits.qk_opt(pattern, p, R, key, steps=300, learning_rate=1e-2)
  (wq, wk), (wq2, wk2) = run(), run()
  np.testing.assert_array_equal(wq, wq2)
  np.testing.assert_array_equal(wk, wk2)
  # The reference renormalises the columns of W_q ([D, R] per head, length D) and of
  # W_k ([R, D] per head, length R) to W_q's initial mean column norm, before
  # iterations 0, 100, 200, ...; with a zero learning rate the result is that reset.
  wq0, wk0 = inits.qk_opt_init(key, D, H, R)
  target = jnp.linalg.norm(wq0, axis=0).mean()
  for steps in (1, 100):
    wq_r, wk_r = inits.qk_opt(pattern, p, R, key, steps=steps, learning_rate=0.0)
    np.testing.assert_allclose(jnp.linalg.norm(wq_r, axis=0), target, rtol=1e-5)
    np.testing.assert_allclose(jnp.linalg.norm(wk_r, axis=-1), target, rtol=1e-5)
  # steps = 0 returns the start point.
  np.testing.assert_array_equal(
      inits.qk_opt(pattern, p, R, key, steps=0)[0], wq0)
  with pytest.raises(ValueError, match="renorm_every"):
    inits.qk_opt(pattern, p, R, key, renorm_every=0)


def test_qk_target_row_normalisation():
  pattern = _patterns()["impulse_2x4"]
  t = inits.qk_target(pattern)
  sums = t.sum(-1)
  assert bool(jnp.all((jnp.abs(sums - 1) < 1e-6) | (sums == 0)))
  np.testing.assert_array_equal(inits.qk_target(pattern, normalize_rows=False), pattern)


# ----------------------------------------------------------------------------
# Mimetic.


def test_mimetic_shapes_and_determinism():
  key = jax.random.PRNGKey(0)
  out = inits.mimetic(key, D, H, R)
  chex.assert_shape(out[:3], (D, H, R))
  chex.assert_shape(out[3], (H, R, D))
  assert all(w.dtype == jnp.float32 for w in out)
  for a, b in zip(out, inits.mimetic(key, D, H, R)):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="num_heads\\*head_dim"):
    inits.mimetic(key, D, 6, 8)
  with pytest.raises(ValueError, match="exceeds the width"):
    inits.mimetic(key, D, 1, D + 1)


def test_mimetic_full_rank_recovers_identity_structure():
  # R = D: W_q W_kᵀ is exactly 0.7 Z + 0.7 I; H·R = D: W_v W_o = 0.4 Z - 0.4 I.
  key, d = jax.random.PRNGKey(0), 16
  wq, wk, _, _ = inits.mimetic(key, d, 1, d)
  qk_HDD, _ = inits.mimetic_targets(key, d, 1)
  np.testing.assert_allclose(wq[:, 0] @ wk[:, 0].T, qk_HDD[0], atol=1e-4)
  _, _, wv, wo = inits.mimetic(key, d, 2, d // 2)
  _, vo_DD = inits.mimetic_targets(key, d, 2)
  vo = wv.reshape(d, d) @ wo.reshape(d, d)
  np.testing.assert_allclose(vo, vo_DD, atol=1e-4)
  qk = wq[:, 0] @ wk[:, 0].T
  print(f"diag mean qk {float(jnp.diag(qk).mean()):.3f} (beta 0.7), "
        f"vo {float(jnp.diag(vo).mean()):.3f} (-beta_v -0.4)")
  assert abs(float(jnp.diag(qk).mean()) - 0.7) < 0.1
  assert abs(float(jnp.diag(vo).mean()) + 0.4) < 0.1


def test_mimetic_is_best_rank_r_approximation():
  key = jax.random.PRNGKey(1)
  wq, wk, wv, wo = inits.mimetic(key, D, H, R)
  qk_HDD, vo_DD = inits.mimetic_targets(key, D, H)
  for h in range(H):
    m, q, k = qk_HDD[h], wq[:, h], wk[:, h]
    qk = q @ k.T
    s = jnp.linalg.svd(m, compute_uv=False)
    # Eckart-Young: residual energy is the dropped singular values' energy.
    np.testing.assert_allclose(jnp.sum((m - qk) ** 2), jnp.sum(s[R:] ** 2), rtol=1e-3)
    # Top-R subspace: qk = Π_q m with Π_q the projector onto span(W_q).
    proj = q @ jnp.linalg.solve(q.T @ q, q.T)
    np.testing.assert_allclose(proj @ m, qk, atol=1e-4)
    assert float(jnp.trace(qk)) > 0  # the +βI part dominates the diagonal
  vo = wv.reshape(D, H * R) @ wo.reshape(H * R, D)
  s = jnp.linalg.svd(vo_DD, compute_uv=False)
  np.testing.assert_allclose(jnp.sum((vo_DD - vo) ** 2), jnp.sum(s[H * R:] ** 2),
                             rtol=1e-3)
  assert float(jnp.trace(vo)) < 0  # the −β_v I part


# ----------------------------------------------------------------------------
# Impulse.


def test_impulse_shifts():
  assert inits.impulse_shifts(3) == [(0, 0), (-1, 0), (0, 1)]
  nine = inits.impulse_shifts(9)
  assert sorted(nine) == [(m, n) for m in (-1, 0, 1) for n in (-1, 0, 1)]
  assert inits.impulse_shifts(10)[9] == (0, 0)


def test_impulse_patterns_14x14():
  gh = gw = 14
  pattern = inits.impulse_patterns(gh, gw, 3)
  chex.assert_shape(pattern, (3, 197, 197))
  pat = np.asarray(pattern)
  for h, (m, n) in enumerate(inits.impulse_shifts(3)):
    for r in range(gh):
      for c in range(gw):
        row = pat[h, 1 + r * gw + c]
        if 0 <= r + m < gh and 0 <= c + n < gw:
          assert row.sum() == 1
          assert row[1 + (r + m) * gw + (c + n)] == 1
        else:
          assert row.sum() == 0  # shifted partner off the grid: no target
    assert pat[h, 0].sum() == 197  # CLS attends everywhere
    assert pat[h, :, 0].sum() == 1  # only CLS attends to CLS
  assert inits.impulse_patterns(4, 5, 2, cls_token=False).shape == (2, 20, 20)


# ----------------------------------------------------------------------------
# set_qk / set_attention_kernels.


def _params(num_blocks=2):
  k = lambda *s: jnp.zeros(s)
  block = lambda: {
      "attention": {"query": {"kernel": k(D, H, R), "bias": k(H, R)},
                    "key": {"kernel": k(D, H, R), "bias": k(H, R)},
                    "value": {"kernel": k(D, H, R)},
                    "out": {"kernel": k(H, R, D)}},
      "mlp": {"kernel": k(D, D)}}
  return {"params": {"embed": {"embedding": k(2, D)},
                     **{f"block_{i}": block() for i in range(num_blocks)}}}


def test_set_qk_all_and_listed_layers():
  params = _params()
  wq, wk = jnp.ones((D, H, R)), 2 * jnp.ones((D, H, R))
  new = inits.set_qk(params, wq, wk)
  for b in ("block_0", "block_1"):
    att = new["params"][b]["attention"]
    np.testing.assert_array_equal(att["query"]["kernel"], wq)
    np.testing.assert_array_equal(att["key"]["kernel"], wk)
    np.testing.assert_array_equal(att["value"]["kernel"], 0)
    np.testing.assert_array_equal(att["query"]["bias"], 0)
  # The input is not modified.
  np.testing.assert_array_equal(params["params"]["block_0"]["attention"]["query"]["kernel"], 0)
  only0 = inits.set_qk(params, wq, wk, layers=["block_0"])
  np.testing.assert_array_equal(only0["params"]["block_0"]["attention"]["key"]["kernel"], wk)
  np.testing.assert_array_equal(only0["params"]["block_1"]["attention"]["key"]["kernel"], 0)
  frozen = inits.set_qk(flax.core.freeze(params), wq, wk)
  assert isinstance(frozen, flax.core.FrozenDict)


def test_set_qk_errors():
  params = _params()
  good = jnp.ones((D, H, R))
  with pytest.raises(ValueError, match=r"block_0/attention/query/kernel.*\(32, 2, 8\).*\(32, 4, 4\)"):
    inits.set_qk(params, jnp.ones((D, 4, 4)), good)
  with pytest.raises(ValueError, match="block_7"):
    inits.set_qk(params, good, good, layers=["block_0", "block_7"])
  with pytest.raises(ValueError, match="no '.../attn/query/kernel'"):
    inits.set_qk(params, good, good, attention_name="attn")


class _Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x + nn.MultiHeadDotProductAttention(
        num_heads=H, qkv_features=H * R, name="attention")(x, sow_weights=True)


class _Model(nn.Module):
  @nn.compact
  def __call__(self, x):
    for i in range(2):
      x = _Block(name=f"block_{i}")(x)
    return x


def test_set_qk_into_flax_attention_matches_diagnostic():
  """Layout check: kernels written into Flax MHA give the attention the
  diagnostic computes (same [D,H,R] layout and 1/√R scaling)."""
  pattern, p = _patterns()["impulse_2x4"], _pseudo()
  model = _Model()
  params = model.init(jax.random.PRNGKey(0), p[None])
  wq, wk = inits.qk_svd(pattern, p, R, jax.random.PRNGKey(0))
  params = inits.set_qk(params, wq, wk, layers=["block_0"])
  wq_m, wk_m, wv_m, wo_m = inits.mimetic(jax.random.PRNGKey(0), D, H, R)
  params = inits.set_attention_kernels(
      params, {"query": wq_m, "key": wk_m, "value": wv_m, "out": wo_m},
      layers=["block_1"])
  _, state = model.apply(params, p[None], mutable=["intermediates"])
  weights = state["intermediates"]["block_0"]["attention"]["attention_weights"][0][0]
  expected = jax.nn.softmax(inits.qk_logits(wq, wk, p), axis=-1)
  np.testing.assert_allclose(weights, expected, atol=1e-5)
