"""QK-side baseline initialisations: QK-SVD, QK-Opt, mimetic, impulse.

These are the baselines the mask prior is compared against: they write the
interaction structure into W_Q, W_K instead of into a mask, so training is free
to overwrite it (the paper's point). All functions are pure and return float32.

Conventions (Flax Linen `MultiHeadDotProductAttention`):
  * kernels `wq_DHR`, `wk_DHR`, `wv_DHR` are `[width D, heads H, head dim R]`,
    `q_BNHR = einsum('BND,DHR->BNHR', x, wq)`; the output kernel is `wo_HRD`.
  * logits per head are `q·kᵀ/√R`, softmax over keys (last axis).
  * pseudo-input `P = LayerNorm(pos_ND)` (no affine): what a token looks like to
    the first attention layer before content matters.
  * `pattern_HNN ∈ {0,1}`: row i = query, column j = key; 1 = should attend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import functools
import math

import flax
from flax import traverse_util
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np
import optax

from mpx.priors import impulse_shifts  # One definition of the head → shift order.

Array = jax.Array

# Inits run once; exact float32 matmuls matter more than speed (accelerators
# default to reduced-precision matmuls for float32 einsums).
_HI = lax.Precision.HIGHEST


# ----------------------------------------------------------------------------
# Validation helpers.


def _check_pattern_pseudo(pattern_HNN: Array, pseudo_ND: Array) -> None:
  if pattern_HNN.ndim != 3 or pattern_HNN.shape[1] != pattern_HNN.shape[2]:
    raise ValueError(
        f"pattern_HNN must be [heads, N, N]; got shape {pattern_HNN.shape}.")
  if pseudo_ND.ndim != 2:
    raise ValueError(f"pseudo_ND must be [N, D]; got shape {pseudo_ND.shape}.")
  if pattern_HNN.shape[1] != pseudo_ND.shape[0]:
    raise ValueError(
        f"pattern_HNN is over {pattern_HNN.shape[1]} tokens but pseudo_ND has "
        f"{pseudo_ND.shape[0]} rows (shapes {pattern_HNN.shape} vs "
        f"{pseudo_ND.shape}); build both for the same N (CLS included).")


def _check_head_dim(head_dim: int, width: int, what: str) -> None:
  if head_dim < 1:
    raise ValueError(f"{what}: head_dim must be >= 1; got {head_dim}.")
  if head_dim > width:
    raise ValueError(
        f"{what}: head_dim {head_dim} exceeds the width {width}; a rank-"
        f"{head_dim} factor of a {width}x{width} matrix is not available.")


def _check_qk(wq_DHR: Array, wk_DHR: Array, pseudo_ND: Array) -> None:
  if wq_DHR.ndim != 3 or wq_DHR.shape != wk_DHR.shape:
    raise ValueError(
        f"wq_DHR and wk_DHR must both be [D, H, R] with equal shapes; got "
        f"{wq_DHR.shape} and {wk_DHR.shape}.")
  if pseudo_ND.ndim != 2 or pseudo_ND.shape[1] != wq_DHR.shape[0]:
    raise ValueError(
        f"pseudo_ND {pseudo_ND.shape} must be [N, D] with D = {wq_DHR.shape[0]} "
        f"(the kernels' width).")


# ----------------------------------------------------------------------------
# Shared pieces.


def pseudo_input(pos_ND: Array, eps: float = 1e-5) -> Array:
  """LayerNorm (no scale/offset) of the position embedding: the pseudo-input P.

  The first block sees LayerNorm(token + pos); with the content left out this is
  the input the QK inits shape their pattern on.
  """
  pos_ND = jnp.asarray(pos_ND, jnp.float32)
  if pos_ND.ndim != 2:
    raise ValueError(f"pos_ND must be [N, D]; got shape {pos_ND.shape}.")
  mean_N1 = pos_ND.mean(-1, keepdims=True)
  var_N1 = jnp.square(pos_ND - mean_N1).mean(-1, keepdims=True)
  return (pos_ND - mean_N1) * lax.rsqrt(var_N1 + eps)


def qk_logits(wq_DHR: Array, wk_DHR: Array, pseudo_ND: Array) -> Array:
  """Per-head logits `P wq (P wk)ᵀ / √R` on the pseudo-input, `[H, N, N]`."""
  _check_qk(wq_DHR, wk_DHR, pseudo_ND)
  q_NHR = jnp.einsum("ND,DHR->NHR", pseudo_ND, wq_DHR, precision=_HI)
  k_NHR = jnp.einsum("ND,DHR->NHR", pseudo_ND, wk_DHR, precision=_HI)
  return jnp.einsum("NHR,MHR->HNM", q_NHR, k_NHR,
                    precision=_HI) / math.sqrt(wq_DHR.shape[-1])


def low_rank_factors(m_XDE: Array, rank: int) -> tuple[Array, Array]:
  """Balanced rank-k factors of (a batch of) matrices: `m ≈ left @ rightᵀ`.

  Truncated SVD `U_k S_k V_kᵀ`, split as `left = U_k S_k^{1/2}`,
  `right = V_k S_k^{1/2}` so neither factor dominates the other's gradients.
  Works on leading batch dims; returns `[..., D, k]` and `[..., E, k]`.
  """
  m_XDE = jnp.asarray(m_XDE, jnp.float32)
  if m_XDE.ndim < 2:
    raise ValueError(f"low_rank_factors needs a matrix; got shape {m_XDE.shape}.")
  if not 1 <= rank <= min(m_XDE.shape[-2:]):
    raise ValueError(
        f"rank {rank} not available for matrices of shape {m_XDE.shape[-2:]} "
        f"(need 1 <= rank <= {min(m_XDE.shape[-2:])}).")
  u_XDK, s_XK, vt_XKE = jnp.linalg.svd(m_XDE, full_matrices=False)
  sqrt_s_X1K = jnp.sqrt(s_XK[..., None, :rank])
  left = u_XDK[..., :, :rank] * sqrt_s_X1K
  right = jnp.swapaxes(vt_XKE[..., :rank, :], -1, -2) * sqrt_s_X1K
  return left, right


def truncated_pinv(pseudo_ND: Array, rank: int) -> Array:
  """Rank-min(rank, rank(P)) pseudo-inverse `P⁺`, `[D, N]`.

  Singular values below numpy's `matrix_rank` tolerance are dropped, so a
  LayerNormed P (rows are zero-mean, hence rank <= D-1) does not blow up.
  """
  u_NK, s_K, vt_KD = jnp.linalg.svd(jnp.asarray(pseudo_ND, jnp.float32),
                                    full_matrices=False)
  tol = s_K[0] * max(pseudo_ND.shape) * jnp.finfo(jnp.float32).eps
  keep_K = (jnp.arange(s_K.shape[0]) < rank) & (s_K > tol)
  inv_s_K = jnp.where(keep_K, 1.0 / jnp.where(keep_K, s_K, 1.0), 0.0)
  return jnp.einsum("KD,K,NK->DN", vt_KD, inv_s_K, u_NK, precision=_HI)


def _to_DHR(w_HDR: Array) -> Array:
  return jnp.transpose(w_HDR, (1, 0, 2))


# ----------------------------------------------------------------------------
# QK-SVD.


def qk_svd(pattern_HNN: Array, pseudo_ND: Array, head_dim: int, key: Array, *,
           scale: float = 7.0, allowed_logit: float = 1000.0,
           noise_scale: float = 3.0,
           noise_std: float = 0.6) -> tuple[Array, Array]:
  """QK-SVD: closed-form W_q, W_k whose logits on P reproduce the pattern.

  Per head: target logits `W_h = allowed_logit·T_h + noise_scale·ε·[T_h = 0]`
  (ε ~ N(0, noise_std) truncated at ±2 std, so blocked entries are not all
  tied); `A_h = P⁺ W_h P⁺ᵀ` with the rank-r pseudo-inverse (r = head_dim);
  `A_h ≈ U_r S_r V_rᵀ`; `Q_h = U_r S_r^{1/2}`, `K_h = V_r S_r^{1/2}`, each
  rescaled to Frobenius norm `scale`.

  How the logits relate to W_h: rank(A_h) <= k = min(r, rank P), so the rank-r
  SVD is exact, and with Π_k = P P⁺ (projector onto P's top-k left singular
  vectors; Π = I when P has full row rank N <= r),

      P Q_h K_hᵀ Pᵀ / √R = scale² / (√R · ‖A_h‖_*) · Π_k W_h Π_k,

  because ‖Q_h‖_F² = ‖K_h‖_F² = tr S_r = ‖A_h‖_* (nuclear norm). The logits are
  a positive multiple of (the projection of) W_h: `allowed_logit` only sets the
  pattern-to-noise ratio; how sharp the attention is comes from `scale` (and
  shrinks with √R, which is not compensated, as in the reference recipe).
  When k < r the trailing head dims get S ≈ 0, i.e. near-zero columns.

  Returns `(wq_DHR, wk_DHR)`.
  """
  pattern_HNN = jnp.asarray(pattern_HNN, jnp.float32)
  pseudo_ND = jnp.asarray(pseudo_ND, jnp.float32)
  _check_pattern_pseudo(pattern_HNN, pseudo_ND)
  _check_head_dim(head_dim, pseudo_ND.shape[1], "qk_svd")
  return _qk_svd_run(pattern_HNN, pseudo_ND, key, head_dim=int(head_dim),
                     scale=scale, allowed_logit=allowed_logit,
                     noise_scale=noise_scale, noise_std=noise_std)


@functools.partial(jax.jit, static_argnames=("head_dim",))
def _qk_svd_run(pattern_HNN, pseudo_ND, key, *, head_dim, scale, allowed_logit,
                noise_scale, noise_std):
  eps_HNN = noise_std * jax.random.truncated_normal(
      key, -2.0, 2.0, pattern_HNN.shape, jnp.float32)
  w_HNN = jnp.where(pattern_HNN > 0, allowed_logit * pattern_HNN,
                    noise_scale * eps_HNN)
  pinv_DN = truncated_pinv(pseudo_ND, head_dim)
  a_HDD = jnp.einsum("DN,HNM,EM->HDE", pinv_DN, w_HNN, pinv_DN, precision=_HI)
  q_HDR, k_HDR = low_rank_factors(a_HDD, head_dim)

  def _rescale(w_HDR):
    norm_H11 = jnp.sqrt(jnp.sum(jnp.square(w_HDR), axis=(1, 2), keepdims=True))
    return w_HDR * (scale / jnp.maximum(norm_H11, 1e-30))

  return _to_DHR(_rescale(q_HDR)), _to_DHR(_rescale(k_HDR))


# ----------------------------------------------------------------------------
# QK-Opt.


def qk_opt_init(key: Array, width: int, num_heads: int,
                head_dim: int) -> tuple[Array, Array]:
  """QK-Opt's starting point: U(−1, 1)·√(1/(r·H)) for W_q and W_k, `[D, H, R]`.

  `qk_opt(..., key)` starts exactly here, so callers can measure the init loss.
  """
  kq, kk = jax.random.split(key)
  bound = math.sqrt(1.0 / (head_dim * num_heads))
  shape = (width, num_heads, head_dim)
  wq = jax.random.uniform(kq, shape, jnp.float32, -1.0, 1.0) * bound
  wk = jax.random.uniform(kk, shape, jnp.float32, -1.0, 1.0) * bound
  return wq, wk


def qk_target(pattern_HNN: Array, normalize_rows: bool = True) -> Array:
  """The attention QK-Opt regresses to: T_h, rows scaled to sum 1 if asked.

  Softmax rows sum to 1, so a row with k ones can at best reach 1/k on each;
  the MSE minimiser is the same either way (the simplex projection of a 0/1 row
  is that row / k) but with normalised rows the loss can reach 0 and reads as a
  distance. All-zero rows stay zero (they then pull towards uniform).
  """
  t_HNN = jnp.asarray(pattern_HNN, jnp.float32)
  if not normalize_rows:
    return t_HNN
  return t_HNN / jnp.maximum(t_HNN.sum(-1, keepdims=True), 1.0)


def qk_mse(wq_DHR: Array, wk_DHR: Array, pseudo_ND: Array, pattern_HNN: Array,
           *, normalize_rows: bool = True) -> Array:
  """Per-head MSE(softmax(P wq (P wk)ᵀ/√R), target), `[H]`: QK-Opt's loss."""
  _check_pattern_pseudo(jnp.asarray(pattern_HNN), jnp.asarray(pseudo_ND))
  return _qk_mse_H(wq_DHR, wk_DHR, pseudo_ND,
                   qk_target(pattern_HNN, normalize_rows))


def _qk_mse_H(wq_DHR, wk_DHR, pseudo_ND, target_HNN):
  probs_HNN = jax.nn.softmax(qk_logits(wq_DHR, wk_DHR, pseudo_ND), axis=-1)
  return jnp.mean(jnp.square(probs_HNN - target_HNN), axis=(1, 2))


def _column_norms(w_DHR: Array, axis: int) -> Array:
  return jnp.sqrt(jnp.sum(jnp.square(w_DHR), axis=axis, keepdims=True))


def _renorm_qk(wq_DHR: Array, wk_DHR: Array, norm: Array) -> tuple[Array, Array]:
  """Every column of W_q (`[D, R]` per head: length D) and of W_k (`[R, D]` per head:
  length R) set to `norm`. In mpx's `[D, H, R]` layout that is the D axis for W_q and
  the R axis for W_k, as the reference renormalises `Q.norm(dim=1)`, `K.norm(dim=1)` of
  its `[H, D, R]` and `[H, R, D]` tensors."""
  wq_DHR = wq_DHR * (norm / jnp.maximum(_column_norms(wq_DHR, 0), 1e-30))
  wk_DHR = wk_DHR * (norm / jnp.maximum(_column_norms(wk_DHR, -1), 1e-30))
  return wq_DHR, wk_DHR


@functools.partial(jax.jit, static_argnames=("steps", "renorm_every"))
def _qk_opt_run(wq_DHR, wk_DHR, pseudo_ND, target_HNN, learning_rate, *,
                steps: int, renorm_every: int):
  opt = optax.adam(learning_rate)
  params = (wq_DHR, wk_DHR)
  norm = jnp.mean(_column_norms(wq_DHR, 0))  # W_q's initial mean column norm.

  def loss_fn(params):
    # Heads are independent and Adam is elementwise, so summing the per-head
    # losses optimises every head exactly as if it were alone.
    return jnp.sum(_qk_mse_H(*params, pseudo_ND, target_HNN))

  def body(i, carry):
    params, opt_state = carry
    params = jax.lax.cond(i % renorm_every == 0, lambda p: _renorm_qk(*p, norm),
                          lambda p: p, params)
    grads = jax.grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  params, _ = lax.fori_loop(0, steps, body, (params, opt.init(params)))
  return params


def qk_opt(pattern_HNN: Array, pseudo_ND: Array, head_dim: int, key: Array, *,
           steps: int = 10_000, learning_rate: float = 1e-4,
           renorm_every: int = 100,
           normalize_rows: bool = True) -> tuple[Array, Array]:
  """QK-Opt: fit W_q, W_k so softmax(P W_q W_kᵀ Pᵀ/√r) matches the pattern.

  Starts from `qk_opt_init(key, ...)`, minimises the per-head MSE (`qk_mse`,
  target from `qk_target`) with Adam for `steps` iterations, all heads at once
  in one jitted `fori_loop`. Before iterations 0, `renorm_every`, 2·`renorm_every`, …
  (as the public reference does) every column of W_q (length D) and of W_k (length R,
  W_k being `[R, D]` per head) is reset to W_q's initial mean column norm: the fit has
  to come from directions, not from growing weights, which keeps the logits at a
  trainable scale. The iterations after the last reset are not renormalised.

  Returns `(wq_DHR, wk_DHR)`.
  """
  pattern_HNN = jnp.asarray(pattern_HNN, jnp.float32)
  pseudo_ND = jnp.asarray(pseudo_ND, jnp.float32)
  _check_pattern_pseudo(pattern_HNN, pseudo_ND)
  _check_head_dim(head_dim, pseudo_ND.shape[1], "qk_opt")
  if steps < 0:
    raise ValueError(f"qk_opt: steps must be >= 0; got {steps}.")
  if renorm_every < 1:
    raise ValueError(f"qk_opt: renorm_every must be >= 1; got {renorm_every}.")
  wq_DHR, wk_DHR = qk_opt_init(key, pseudo_ND.shape[1], pattern_HNN.shape[0],
                               head_dim)
  return _qk_opt_run(wq_DHR, wk_DHR, pseudo_ND,
                     qk_target(pattern_HNN, normalize_rows),
                     jnp.float32(learning_rate), steps=int(steps),
                     renorm_every=int(renorm_every))


# ----------------------------------------------------------------------------
# Mimetic (Trockman & Kolter, 2023).


@functools.partial(jax.jit, static_argnames=("width", "num_heads"))
def mimetic_targets(key: Array, width: int, num_heads: int, *,
                    alpha: float = 0.7, beta: float = 0.7,
                    alpha_v: float = 0.4,
                    beta_v: float = 0.4) -> tuple[Array, Array]:
  """The products mimetic init factors: `(qk_HDD, vo_DD)`.

  `qk_h = alpha·Z_h + beta·I` (fresh Z_h per head), `vo = alpha_v·Z − beta_v·I`
  (one per layer); Z entries ~ N(0, 1/D). Pretrained ViTs show W_q W_kᵀ ≈ +I
  (tokens attend to similar tokens, i.e. locally through the position
  embedding) and W_v W_o ≈ −I.
  """
  kq, kv = jax.random.split(key)
  eye_DD = jnp.eye(width, dtype=jnp.float32)
  z_HDD = jax.random.normal(kq, (num_heads, width, width), jnp.float32)
  z_DD = jax.random.normal(kv, (width, width), jnp.float32)
  qk_HDD = alpha * z_HDD / math.sqrt(width) + beta * eye_DD
  vo_DD = alpha_v * z_DD / math.sqrt(width) - beta_v * eye_DD
  return qk_HDD, vo_DD


def mimetic(key: Array, width: int, num_heads: int, head_dim: int, *,
            alpha: float = 0.7, beta: float = 0.7, alpha_v: float = 0.4,
            beta_v: float = 0.4) -> tuple[Array, Array, Array, Array]:
  """Mimetic init: W_q W_kᵀ ≈ αZ + βI per head, W_v W_o ≈ α_v Z − β_v I.

  Per head, `W_q = U_R S_R^{1/2}`, `W_k = V_R S_R^{1/2}` of the targets from
  `mimetic_targets(key, ...)` (best rank-R approximation). The layer's V/O
  product is factored through its inner dim H·R (which must not exceed D):
  `wv_DHR` is `[D, H, R]` and `wo_HRD` is `[H, R, D]` (Flax's `out` kernel),
  flattened to `D×HR` / `HR×D` in the same head-major order.

  The logits' 1/√R is *not* compensated: the recipe (and α, β) come from timm
  ViTs, whose attention also divides by √R, so compensating would be a
  different baseline. Scale α, β yourself to sharpen.

  Returns `(wq_DHR, wk_DHR, wv_DHR, wo_HRD)`.
  """
  _check_head_dim(head_dim, width, "mimetic")
  if num_heads < 1:
    raise ValueError(f"mimetic: num_heads must be >= 1; got {num_heads}.")
  inner = num_heads * head_dim
  if inner > width:
    raise ValueError(
        f"mimetic: W_v W_o is {width}x{width}, so its rank is at most {width}, "
        f"but num_heads*head_dim = {num_heads}*{head_dim} = {inner} > {width}; "
        "the V/O factorisation through the inner dim is not available.")
  return _mimetic_run(key, width=int(width), num_heads=int(num_heads),
                      head_dim=int(head_dim), alpha=alpha, beta=beta,
                      alpha_v=alpha_v, beta_v=beta_v)


@functools.partial(jax.jit, static_argnames=("width", "num_heads", "head_dim"))
def _mimetic_run(key, *, width, num_heads, head_dim, alpha, beta, alpha_v,
                 beta_v):
  inner = num_heads * head_dim
  qk_HDD, vo_DD = mimetic_targets(key, width, num_heads, alpha=alpha, beta=beta,
                                  alpha_v=alpha_v, beta_v=beta_v)
  q_HDR, k_HDR = low_rank_factors(qk_HDD, head_dim)
  v_DI, o_DI = low_rank_factors(vo_DD, inner)
  wv_DHR = v_DI.reshape(width, num_heads, head_dim)
  wo_HRD = o_DI.T.reshape(num_heads, head_dim, width)
  return _to_DHR(q_HDR), _to_DHR(k_HDR), wv_DHR, wo_HRD


# ----------------------------------------------------------------------------
# Impulse (vision).


def impulse_patterns(grid_h: int, grid_w: int, num_heads: int, *,
                     cls_token: bool = True) -> Array:
  """Impulse targets `[H, N, N]`: patch (r, c) attends to patch (r+m, c+n).

  Patches are row-major after an optional CLS at token 0. No wrap-around:
  a patch whose shifted partner falls off the grid gets an all-zero row (no
  target; SVD leaves it near-uniform, Opt with normalised rows pulls it to
  uniform; `attention_mass_on_pattern` skips it). CLS (a QK target, so we pick
  the summary role): its row is all ones (attend uniformly everywhere) and its
  column is zero except for CLS itself, so patches keep their one-hot shift.
  """
  if grid_h < 1 or grid_w < 1:
    raise ValueError(f"grid must be at least 1x1; got {grid_h}x{grid_w}.")
  off = int(cls_token)
  n = off + grid_h * grid_w
  pattern_HNN = np.zeros((num_heads, n, n), np.float32)
  rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
  rows, cols = rows.ravel(), cols.ravel()
  for h, (m, dn) in enumerate(impulse_shifts(num_heads)):
    tr, tc = rows + m, cols + dn
    ok = (tr >= 0) & (tr < grid_h) & (tc >= 0) & (tc < grid_w)
    q_idx = off + rows[ok] * grid_w + cols[ok]
    k_idx = off + tr[ok] * grid_w + tc[ok]
    pattern_HNN[h, q_idx, k_idx] = 1.0
  if cls_token:
    pattern_HNN[:, 0, :] = 1.0
  return jnp.asarray(pattern_HNN)


# ----------------------------------------------------------------------------
# Diagnostics.


def attention_mass_on_pattern(wq_DHR: Array, wk_DHR: Array, pseudo_ND: Array,
                              pattern_HNN: Array) -> Array:
  """Per-head attention mass on allowed keys, `[H]`: did the init realise T?

  softmax(P wq (P wk)ᵀ/√R) summed over the pattern's ones, averaged over query
  rows with at least one allowed key (NaN for a head with none). Compare with
  `uniform_mass_on_pattern`, what structureless attention scores.
  """
  pattern_HNN = jnp.asarray(pattern_HNN, jnp.float32)
  pseudo_ND = jnp.asarray(pseudo_ND, jnp.float32)
  _check_pattern_pseudo(pattern_HNN, pseudo_ND)
  if wq_DHR.shape[1] != pattern_HNN.shape[0]:
    raise ValueError(
        f"kernels have {wq_DHR.shape[1]} heads ({wq_DHR.shape}) but pattern_HNN "
        f"has {pattern_HNN.shape[0]} ({pattern_HNN.shape}).")
  probs_HNN = jax.nn.softmax(qk_logits(wq_DHR, wk_DHR, pseudo_ND), axis=-1)
  mass_HN = jnp.sum(probs_HNN * (pattern_HNN > 0), axis=-1)
  return _mean_over_valid_rows(mass_HN, pattern_HNN)


def uniform_mass_on_pattern(pattern_HNN: Array) -> Array:
  """Mass uniform attention puts on the pattern, `[H]`: the chance baseline."""
  pattern_HNN = jnp.asarray(pattern_HNN, jnp.float32)
  mass_HN = jnp.sum(pattern_HNN > 0, axis=-1) / pattern_HNN.shape[-1]
  return _mean_over_valid_rows(mass_HN, pattern_HNN)


def _mean_over_valid_rows(mass_HN: Array, pattern_HNN: Array) -> Array:
  valid_HN = jnp.any(pattern_HNN > 0, axis=-1)
  count_H = valid_HN.sum(-1)
  total_H = jnp.sum(jnp.where(valid_HN, mass_HN, 0.0), axis=-1)
  return jnp.where(count_H > 0, total_H / jnp.maximum(count_H, 1), jnp.nan)


# ----------------------------------------------------------------------------
# Writing kernels into a Flax params tree.


def set_attention_kernels(params: Mapping, kernels: Mapping[str, Array],
                          layers: Sequence[str] | None = None, *,
                          attention_name: str = "attention") -> dict:
  """Copy of `params` with `.../{attention_name}/{sub}/kernel` replaced.

  `kernels` maps a submodule name ('query', 'key', 'value', 'out') to the new
  kernel, written to every layer, or only to paths through one of `layers`
  (module names such as 'block_0'). The depth is discovered from the tree.
  Shapes must match exactly; the stored dtype is kept.
  """
  is_frozen = isinstance(params, flax.core.FrozenDict)
  flat = traverse_util.flatten_dict(flax.core.unfreeze(params) if is_frozen
                                    else params)
  wanted = None if layers is None else set(layers)
  if wanted is not None and not wanted:
    raise ValueError("layers is empty; pass None to write every layer.")
  hits = {sub: set() for sub in kernels}
  out = dict(flat)
  for path, leaf in flat.items():
    if (len(path) < 3 or path[-1] != "kernel" or path[-3] != attention_name
        or path[-2] not in kernels):
      continue
    on_path = {None} if wanted is None else wanted.intersection(path[:-3])
    if not on_path:
      continue
    sub = path[-2]
    new = jnp.asarray(kernels[sub])
    if new.shape != leaf.shape:
      raise ValueError(
          f"{'/'.join(map(str, path))}: params kernel has shape {leaf.shape} "
          f"but the new {sub} kernel has shape {new.shape}.")
    out[path] = new.astype(leaf.dtype)
    hits[sub].update(on_path)
  for sub, found in hits.items():
    if not found:
      raise ValueError(
          f"no '.../{attention_name}/{sub}/kernel' in params"
          + ("" if wanted is None else f" under layers {sorted(wanted)}") + ".")
    if wanted is not None and wanted - found:
      raise ValueError(
          f"layers {sorted(wanted - found)} have no "
          f"'{attention_name}/{sub}/kernel' in params.")
  tree = traverse_util.unflatten_dict(out)
  return flax.core.freeze(tree) if is_frozen else tree


def set_qk(params: Mapping, wq_DHR: Array, wk_DHR: Array,
           layers: Sequence[str] | None = None, *,
           attention_name: str = "attention") -> dict:
  """Copy of `params` with the query/key kernels of all (or the listed) layers
  set to `wq_DHR`, `wk_DHR`; ValueError on a shape mismatch or no match."""
  return set_attention_kernels(params, {"query": wq_DHR, "key": wk_DHR},
                               layers, attention_name=attention_name)
