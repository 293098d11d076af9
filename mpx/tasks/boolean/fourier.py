"""Fourier analysis of Boolean functions on the cube, the min-degree interpolator (MDI) of a
task's seen data, and the metrics of a learned function (the Boolean family's analysis;
the tasks are `mpx.tasks.boolean`'s).

Fourier coefficients are indexed by a bitmask S (bit i of S set <=> i in S) and normalised so
that f(x) = sum_S c_S prod_{i in S} x_i, with x in the cube order of `boolean.cube`. The
analysis runs in float64 on the host.
"""

from __future__ import annotations

import functools

import numpy as np

from mpx.tasks.boolean import BooleanTask, check_n_bits, cube, cube_data

_MAX_SEEN_BITS = 12  # the MDI solves a dense problem over the bits the seen domain depends on.
ZERO_TOL = 1e-9  # coefficients below this are reported as absent.
_INTERP_TOL = 1e-6  # the MDI must reproduce the seen data to this accuracy.


def popcount(masks: np.ndarray) -> np.ndarray:
  """The number of bits set in each mask (the degree |S| of coefficient index S), int64."""
  return np.bitwise_count(np.asarray(masks, dtype=np.uint64)).astype(np.int64)


# ----------------------------------------------------------------------------------------------
# Coefficients.


def _check_cube_values(values_P, n_bits) -> np.ndarray:
  n_bits = check_n_bits(n_bits)
  values_P = np.asarray(values_P, np.float64)
  if values_P.shape != (2**n_bits,):
    raise ValueError(f"expected one value per cube point, shape [{2**n_bits}] in cube(n_bits) "
                     f"order, got {values_P.shape}.")
  return values_P


def fourier_coefficients(values_P: np.ndarray, n_bits: int) -> np.ndarray:
  """All 2^n coefficients c_S (index = bitmask of S) of f given on cube(n_bits), float64.

  Fast Walsh-Hadamard transform, O(n 2^n). Per bit, the character x_i is -1 at bit 0 and +1 at
  bit 1, so the butterfly is (sum, difference high - low); dividing by 2^n gives
  c_S = E_x[f(x) prod_{i in S} x_i].
  """
  h = _check_cube_values(values_P, n_bits).copy()
  for i in range(n_bits):
    h = h.reshape(-1, 2, 2**i)  # axis 1 is bit i of the index.
    h = np.stack([h[:, 0] + h[:, 1], h[:, 1] - h[:, 0]], axis=1)
  return h.reshape(-1) / 2**n_bits


def values_from_coefficients(coeffs: np.ndarray, n_bits: int) -> np.ndarray:
  """Inverse of `fourier_coefficients`: f on cube(n_bits) from c_S (float64)."""
  h = _check_cube_values(coeffs, n_bits).copy()
  for i in range(n_bits):
    h = h.reshape(-1, 2, 2**i)  # axis 1 is bit i of S on input, of the point on output.
    h = np.stack([h[:, 0] - h[:, 1], h[:, 0] + h[:, 1]], axis=1)
  return h.reshape(-1)


def _check_subset(subset, n_bits) -> tuple[int, ...]:
  subset = tuple(int(i) for i in subset)
  if len(set(subset)) != len(subset) or any(not 0 <= i < n_bits for i in subset):
    raise ValueError(f"a monomial is a set of distinct bit indices in 0..{n_bits - 1}, "
                     f"got {subset!r}.")
  return tuple(sorted(subset))


def monomial_coefficient(values_P: np.ndarray, n_bits: int, subset) -> float:
  """c_S of f given on cube(n_bits) for one S = subset of bit indices (E[f chi_S])."""
  values_P = _check_cube_values(values_P, n_bits)
  subset = _check_subset(subset, n_bits)
  chi_P = np.prod(cube(n_bits)[:, list(subset)].astype(np.float64), axis=1)
  return float(np.mean(values_P * chi_P))


def evaluate_monomials(coeffs_by_subset: dict[tuple[int, ...], float],
                       x_PN: np.ndarray) -> np.ndarray:
  """sum_S c_S prod_{i in S} x_i at the points x_PN (accumulated in float64, returned float32)."""
  x_PN = np.asarray(x_PN, np.float64)
  if x_PN.ndim != 2:
    raise ValueError(f"x_PN must be [points, bits], got shape {x_PN.shape}.")
  out_P = np.zeros(len(x_PN))
  for subset, c in coeffs_by_subset.items():
    subset = _check_subset(subset, x_PN.shape[1])
    out_P += c * np.prod(x_PN[:, list(subset)], axis=1)
  return out_P.astype(np.float32)


def degree_profile(coeffs: np.ndarray, n_bits: int) -> np.ndarray:
  """Fourier weight sum_{|S| = d} c_S^2 for d = 0..n (float64 [n + 1]); sums to E[f^2]."""
  coeffs = _check_cube_values(coeffs, n_bits)
  deg = popcount(np.arange(2**n_bits))
  return np.bincount(deg, weights=coeffs**2, minlength=n_bits + 1)


# ----------------------------------------------------------------------------------------------
# The min-degree interpolator.


def _svd_null(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(pinv(a), orthonormal basis of the null space of a), by one SVD."""
  m = a.shape[1]
  if a.size == 0:
    return np.zeros((m, a.shape[0])), np.eye(m)
  u, s, vt = np.linalg.svd(a, full_matrices=True)
  rank = int(np.sum(s > 1e-10 * max(1.0, s[0])))
  pinv = vt[:rank].T @ np.diag(1.0 / s[:rank]) @ u[:, :rank].T
  return pinv, vt[rank:].T


def _lexicographic_solver(phi_KM: np.ndarray, deg_M: np.ndarray) -> np.ndarray:
  """Linear map L_MK: y_K -> the interpolant c_M with the lexicographically least degree profile.

  Among all c with phi c = y, first minimise the weight of the highest degree, then, among those
  minimisers, the next degree, and so on. This is the w -> inf limit of
  argmin sum_m w^deg_m c_m^2 s.t. phi c = y, computed exactly rather than with a huge w.
  Each stage is a least-squares problem over the remaining affine set c = L y + N z, so the
  result is linear in y.
  """
  l_MK, n_MQ = _svd_null(phi_KM)
  for d in sorted(set(deg_M.tolist()), reverse=True):
    if n_MQ.shape[1] == 0:
      break
    rows = deg_M == d
    b_pinv, b_null = _svd_null(n_MQ[rows])
    l_MK = l_MK - n_MQ @ (b_pinv @ l_MK[rows])
    n_MQ = n_MQ @ b_null
  return l_MK


def _weighted_solver(phi_KM: np.ndarray, deg_M: np.ndarray, weight: float) -> np.ndarray:
  """Linear map y -> argmin sum_m weight^deg_m c_m^2 s.t. phi c = y (c = D^-1/2 pinv(phi D^-1/2))."""
  scale_M = float(weight) ** (-0.5 * deg_M)
  pinv, _ = _svd_null(phi_KM * scale_M)
  return scale_M[:, None] * pinv


def _seen_bits(seen_P: np.ndarray, n_bits: int) -> tuple[int, ...]:
  """Bits the seen predicate depends on: flipping any other bit never changes it."""
  r_P = np.arange(2**n_bits)
  return tuple(i for i in range(n_bits) if np.any(seen_P != seen_P[r_P ^ (1 << i)]))


def min_degree_interpolator(task: BooleanTask,
                            max_degree: int | None = None,
                            *,
                            weight: float | None = None) -> dict[tuple[int, ...], float]:
  """The min-degree interpolator of the task's seen data (Abbe et al. 2023), as {S: c_S}.

  Among functions equal to the target on the seen domain, the one whose degree profile is
  lexicographically least from the top degree down; i.e. the w -> inf limit of the weighted
  least squares  min sum_S w^|S| c_S^2  s.t. interpolation (`weight=None`, exact). A finite
  `weight` solves that penalised problem instead (float64), which approaches the limit as O(1/w).

  Why it is feasible for n = 15: let V be the bits the seen predicate depends on and R the rest,
  so the seen domain is D x {-1,+1}^R with D a subset of {-1,+1}^V. Write any g as
  sum_{T subset R} g_T(x_V) chi_T(x_R). Since the characters chi_T are orthogonal over the free
  bits R, g interpolates f on the seen domain iff g_T = f_T on D for every T separately, and the
  objective sum_T w^|T| sum_{A subset V} w^|A| (g_T)^_A^2 separates over T too. So the problem
  splits exactly into one problem per T, all with the same 2^|V|-unknown, |D|-constraint matrix,
  and g_T = 0 wherever f_T = 0. For 2parity and majority3 V = {0, 1}; for cyclic3 V = {0, 1, 2}
  and only the 15 groups T hit by its monomials are non-zero. No basis truncation is needed.

  `max_degree` restricts the basis to monomials of degree <= max_degree (|A| + |T|); a
  ValueError says when no interpolant of that degree exists. Coefficients with |c| <= 1e-9 are
  dropped; the others are returned unrounded. The result is checked to reproduce the seen data
  to 1e-6.
  """
  n = task.n_bits
  _, y_P, seen_P = cube_data(task)
  v_bits = _seen_bits(seen_P, n)
  if len(v_bits) > _MAX_SEEN_BITS:
    raise ValueError(f"the seen domain of {task.name!r} depends on {len(v_bits)} bits; the "
                     f"min-degree interpolator is solved over those bits, so at most "
                     f"{_MAX_SEEN_BITS} are supported. Use a seen domain defined by fewer bits.")
  if max_degree is not None and (isinstance(max_degree, bool)
                                 or not isinstance(max_degree, (int, np.integer))
                                 or max_degree < 0):
    raise ValueError(f"max_degree must be a non-negative int or None, got {max_degree!r}.")
  if weight is not None and not weight > 1:
    raise ValueError(f"weight must be > 1 (it penalises high degrees) or None, got {weight!r}.")

  # Local monomials A over V, as masks of the full cube, and the seen patterns D of x_V.
  v_mask = sum(1 << i for i in v_bits)
  local_A = np.array([sum(1 << v_bits[j] for j in range(len(v_bits)) if (a >> j) & 1)
                      for a in range(2**len(v_bits))], dtype=np.int64)
  seen_points = local_A[seen_P[local_A]]  # cube index of a D pattern with the R bits at -1.
  # chi_A(x_p) = (-1)^(|A| - |p & A|): each bit of A that is 0 in p contributes x_i = -1.
  deg_A = popcount(local_A)
  chi_KA = (-1.0)**(deg_A[None, :] - popcount(seen_points[:, None] & local_A[None, :]))

  # Target coefficients grouped by their R part T: f_T = sum_A c_{A u T} chi_A.
  c_S = fourier_coefficients(y_P, n)
  s_nz = np.flatnonzero(np.abs(c_S) > 1e-12)
  groups = np.unique(s_nz & ~v_mask)
  f_AT = np.zeros((len(local_A), len(groups)))  # local_A and groups are both sorted.
  f_AT[np.searchsorted(local_A, s_nz & v_mask), np.searchsorted(groups, s_nz & ~v_mask)] = (
      c_S[s_nz])
  y_KT = chi_KA @ f_AT  # f_T on the seen patterns D.

  g_S = np.zeros(2**n)
  deg_T = popcount(groups)
  for dt in np.unique(deg_T):
    cols = np.ones(len(local_A), bool) if max_degree is None else deg_A + dt <= max_degree
    tt = deg_T == dt
    phi_KM = chi_KA[:, cols]
    if weight is None:
      solve_MK = _lexicographic_solver(phi_KM, deg_A[cols])
    else:
      solve_MK = _weighted_solver(phi_KM, deg_A[cols], weight)
    g_MT = solve_MK @ y_KT[:, tt]
    if np.max(np.abs(phi_KM @ g_MT - y_KT[:, tt]), initial=0.0) > _INTERP_TOL:
      raise ValueError(f"no interpolant of the seen data of {task.name!r} has degree <= "
                       f"{max_degree}; raise max_degree or pass None.")
    g_S[local_A[cols][:, None] | groups[tt][None, :]] = g_MT

  g_P = values_from_coefficients(g_S, n)
  err = np.max(np.abs(g_P[seen_P] - y_P[seen_P].astype(np.float64)))
  if err > _INTERP_TOL:
    raise RuntimeError(f"min-degree interpolator of {task.name!r} misses the seen data by "
                       f"{err:.3g}; this is a bug.")
  keep = np.flatnonzero(np.abs(g_S) > ZERO_TOL)
  return {tuple(i for i in range(n) if (s >> i) & 1): float(g_S[s]) for s in keep}


@functools.lru_cache(maxsize=None)
def task_monomials(task: BooleanTask) -> tuple[tuple[int, ...], ...]:
  """The monomials of the target and of its MDI, lowest degree first: the coefficients a
  learned function has on them tell which of the two it learned."""
  _, y_P, _ = cube_data(task)
  target = fourier_coefficients(y_P, task.n_bits)
  subsets = {tuple(i for i in range(task.n_bits) if mask >> i & 1)
             for mask in np.flatnonzero(np.abs(target) > ZERO_TOL)}
  subsets |= set(min_degree_interpolator(task))
  return tuple(sorted(subsets, key=lambda s: (len(s), s)))


def monomial_label(subset: tuple[int, ...]) -> str:
  """`(0, 2)` → "x0x2"; the constant monomial is "1"."""
  return "".join(f"x{i}" for i in subset) or "1"


@functools.lru_cache(maxsize=None)
def mdi_values(task: BooleanTask) -> np.ndarray:
  """The MDI on cube(task.n_bits), float32 [2^n], cached per task and read-only."""
  coeffs = min_degree_interpolator(task)
  g_S = np.zeros(2**task.n_bits)
  for subset, c in coeffs.items():
    g_S[sum(1 << i for i in subset)] = c
  out = values_from_coefficients(g_S, task.n_bits).astype(np.float32)
  out.flags.writeable = False
  return out


# ----------------------------------------------------------------------------------------------
# Metrics of a learned function.


def distance_to(pred_P: np.ndarray, ref_P: np.ndarray, mask: np.ndarray | None = None) -> float:
  """RMS of pred - ref over the points where mask is True (all points if mask is None)."""
  pred_P = np.asarray(pred_P, np.float64)
  ref_P = np.asarray(ref_P, np.float64)
  if pred_P.shape != ref_P.shape or pred_P.ndim != 1:
    raise ValueError(f"pred and ref must be 1-D of the same shape, got {pred_P.shape} and "
                     f"{ref_P.shape}.")
  mask = np.ones(pred_P.shape, bool) if mask is None else np.asarray(mask, bool)
  if mask.shape != pred_P.shape:
    raise ValueError(f"mask must have shape {pred_P.shape}, got {mask.shape}.")
  if not mask.any():
    raise ValueError("mask selects no points; the distance is undefined.")
  return float(np.sqrt(np.mean((pred_P[mask] - ref_P[mask])**2)))


def function_metrics(pred_P: np.ndarray,
                     task: BooleanTask,
                     mdi_values_P: np.ndarray | None = None) -> dict[str, float]:
  """Scores of a prediction given on the whole cube, in cube(task.n_bits) order.

  accuracy*: np.sign(pred) == np.sign(target), so a prediction of exactly 0 is wrong for a
  non-zero target (the GOTU targets are never 0). Integer targets are scored by sign too;
  `accuracy_exact` (only for task.integer_valued) compares np.rint(pred) with the target.
  loss*: mean squared error. `mdi_distance_unseen` / `target_distance_unseen` (RMS on the
  unseen part) are added when `mdi_values_P` is given.
  """
  _, y_P, seen_P = cube_data(task)
  pred_P = np.asarray(pred_P, np.float64)
  if pred_P.ndim == 2 and pred_P.shape[1] == 1:  # a model's [P, 1] readout.
    pred_P = pred_P[:, 0]
  if pred_P.shape != y_P.shape:
    raise ValueError(f"pred must hold one value per cube point, shape {y_P.shape} in "
                     f"cube({task.n_bits}) order, got {pred_P.shape}.")
  y_P = y_P.astype(np.float64)
  unseen_P = ~seen_P
  correct_P = np.sign(pred_P) == np.sign(y_P)
  sq_P = (pred_P - y_P)**2
  out = {
      "accuracy": float(np.mean(correct_P)),
      "accuracy_seen": float(np.mean(correct_P[seen_P])),
      "accuracy_unseen": float(np.mean(correct_P[unseen_P])),
      "loss": float(np.mean(sq_P)),
      "loss_seen": float(np.mean(sq_P[seen_P])),
      "loss_unseen": float(np.mean(sq_P[unseen_P])),
  }
  if task.integer_valued:
    exact_P = np.rint(pred_P) == y_P
    out["accuracy_exact"] = float(np.mean(exact_P))
    out["accuracy_exact_unseen"] = float(np.mean(exact_P[unseen_P]))
  if mdi_values_P is not None:
    mdi_values_P = np.asarray(mdi_values_P, np.float64)
    if mdi_values_P.shape != y_P.shape:
      raise ValueError(f"mdi_values_P must have shape {y_P.shape} (use mdi_values(task)), got "
                       f"{mdi_values_P.shape}.")
    out["mdi_distance_unseen"] = distance_to(pred_P, mdi_values_P, unseen_P)
    out["target_distance_unseen"] = distance_to(pred_P, y_P, unseen_P)
  return out
