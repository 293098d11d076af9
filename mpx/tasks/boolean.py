"""Boolean "generalisation on the unseen" (GOTU) tasks and their Fourier analysis.

Tasks follow Abbe, Bengio, Lotfi, Rizk (ICML 2023): inputs x in {-1, +1}^n, a target f, and a
*seen* part of the cube that is the only part trained on; the test set is the whole cube. What a
model does on the *unseen* part tells whether it learned f or collapsed to the min-degree
interpolator (MDI), the interpolant of the seen data with the least high-degree Fourier mass.

Everything here is host-side numpy. Shapes are in the names: `x_PN` is points x bits, `y_P` one
value per point. Inputs and targets are float32; the analysis (Fourier, MDI) runs in float64.

The cube order used everywhere (`cube`): row r has bit i = +1 if (r >> i) & 1 else -1. Fourier
coefficients are indexed by a bitmask S (bit i of S set <=> i in S) and normalised so that
f(x) = sum_S c_S prod_{i in S} x_i.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

MAX_BITS = 20  # 2^20 points x 20 bits x 4 bytes = 80 MiB for the cube; beyond that, not a toy.
PROTOCOLS = ("enumerate", "iid")
_MAX_SEEN_BITS = 12  # the MDI solves a dense problem over the bits the seen domain depends on.
_ZERO_TOL = 1e-9  # coefficients below this are reported as absent.
_INTERP_TOL = 1e-6  # the MDI must reproduce the seen data to this accuracy.


@dataclasses.dataclass(frozen=True)
class BooleanTask:
  """A target on {-1, +1}^n_bits and the part of the cube seen during training.

  Attributes:
    name: identifier, used in reports.
    n_bits: input length n.
    target: x_PN (+-1 float32) -> y_P float32.
    seen: x_PN -> bool_P, True on the training domain.
    protocol: "enumerate" trains on every seen point (cube order); "iid" on `train_size`
      uniform draws (with replacement) from the seen points.
    train_size: number of iid samples; only for protocol "iid".
    integer_valued: the target takes integer values (cyclic3), so exact (rounded) accuracy is
      meaningful besides sign accuracy.
    support: bits the target depends on (used to build interaction priors).
    interaction_groups: the groups of support bits that interact, e.g. the windows of a
      windowed target; the mask prior joins the bits of each group. () = one group, the
      whole support (a clique).
  """

  name: str
  n_bits: int
  target: Callable[[np.ndarray], np.ndarray]
  seen: Callable[[np.ndarray], np.ndarray]
  protocol: str = "enumerate"
  train_size: int | None = None
  integer_valued: bool = False
  support: tuple[int, ...] = ()
  interaction_groups: tuple[tuple[int, ...], ...] = ()


# ----------------------------------------------------------------------------------------------
# The cube.


def _check_n_bits(n_bits) -> int:
  if isinstance(n_bits, bool) or not isinstance(n_bits, (int, np.integer)):
    raise ValueError(f"n_bits must be an int in 1..{MAX_BITS}, got {n_bits!r}.")
  if not 1 <= n_bits <= MAX_BITS:
    raise ValueError(
        f"n_bits must be in 1..{MAX_BITS} (the whole cube is enumerated), got {n_bits}.")
  return int(n_bits)


def _popcount(masks: np.ndarray) -> np.ndarray:
  return np.bitwise_count(np.asarray(masks, dtype=np.uint64)).astype(np.int64)


def tokens(x_BN) -> jnp.ndarray:
  """±1 inputs → the model's token ids {0, 1}, as the GOTU code's `(x + 1) / 2`."""
  return ((jnp.asarray(x_BN) + 1) // 2).astype(jnp.int32)


def cube(n_bits: int) -> np.ndarray:
  """All 2^n points of {-1, +1}^n as float32 [2^n, n]; row r: bit i = +1 iff (r >> i) & 1."""
  n_bits = _check_n_bits(n_bits)
  r_P = np.arange(2**n_bits, dtype=np.int64)
  bits_PN = (r_P[:, None] >> np.arange(n_bits)) & 1
  return (2 * bits_PN - 1).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Task definitions.


def _parity2_target(x_PN):
  x_PN = np.asarray(x_PN, np.float32)
  return x_PN[:, 0] * x_PN[:, 1]


def _majority3_target(x_PN):
  x_PN = np.asarray(x_PN, np.float32)
  return np.sign(x_PN[:, 0] + x_PN[:, 1] + x_PN[:, 2])  # a sum of 3 odd terms is never 0.


def _cyclic3_target(x_PN):
  """sum_i x_i x_{i+1} x_{i+2}, indices mod n; integer-valued, deliberately not normalised."""
  x_PN = np.asarray(x_PN, np.float32)
  return np.sum(x_PN * np.roll(x_PN, -1, axis=1) * np.roll(x_PN, -2, axis=1), axis=1)


def _seen_x0_or_x1(x_PN):
  return np.any(np.asarray(x_PN)[:, :2] > 0, axis=1)


def _seen_x0_or_x1_or_x2(x_PN):
  return np.any(np.asarray(x_PN)[:, :3] > 0, axis=1)


def make_task(name: str,
              target: Callable[[np.ndarray], np.ndarray],
              seen: Callable[[np.ndarray], np.ndarray],
              n_bits: int,
              *,
              protocol: str = "enumerate",
              train_size: int | None = None,
              integer_valued: bool = False,
              support: tuple[int, ...] = (),
              interaction_groups: Sequence[Sequence[int]] = ()) -> BooleanTask:
  """Defines a task, checking it on the whole cube so a bad definition fails here, not mid-run."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"name must be a non-empty string, got {name!r}.")
  n_bits = _check_n_bits(n_bits)
  if not callable(target):
    raise ValueError(f"target must be a callable x_PN -> y_P, got {type(target).__name__}.")
  if not callable(seen):
    raise ValueError(f"seen must be a callable x_PN -> bool_P, got {type(seen).__name__}.")
  if protocol not in PROTOCOLS:
    raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}.")
  if protocol == "iid":
    if (isinstance(train_size, bool) or not isinstance(train_size, (int, np.integer))
        or train_size < 1):
      raise ValueError(
          f"protocol 'iid' needs train_size, a positive int of samples; got {train_size!r}.")
    train_size = int(train_size)
  elif train_size is not None:
    raise ValueError("train_size is only used with protocol='iid'; pass train_size=None for "
                     "'enumerate' (which trains on every seen point).")
  support = tuple(support)
  if any(isinstance(i, bool) or not isinstance(i, (int, np.integer)) for i in support):
    raise ValueError(f"support must be a tuple of int bit indices, got {support!r}.")
  if any(not 0 <= i < n_bits for i in support) or len(set(support)) != len(support):
    raise ValueError(f"support must hold distinct bit indices in 0..{n_bits - 1}, "
                     f"got {support!r}.")
  support = tuple(sorted(int(i) for i in support))
  interaction_groups = tuple(tuple(sorted(int(i) for i in g)) for g in interaction_groups)
  if interaction_groups and (set().union(*interaction_groups) != set(support)
                             or any(len(g) < 2 for g in interaction_groups)):
    raise ValueError(f"interaction_groups {interaction_groups} must be groups of >= 2 "
                     f"support bits that together cover the support {support}.")

  x_PN = cube(n_bits)
  y_P = np.asarray(target(x_PN))
  if y_P.shape != (len(x_PN),):
    raise ValueError(f"target must map x_PN [{len(x_PN)}, {n_bits}] to y_P [{len(x_PN)}], "
                     f"got shape {y_P.shape}.")
  if not np.issubdtype(y_P.dtype, np.number) or not np.all(np.isfinite(y_P)):
    raise ValueError("target must return finite numbers on every point of the cube.")
  seen_P = np.asarray(seen(x_PN))
  if seen_P.shape != (len(x_PN),) or seen_P.dtype != np.bool_:
    raise ValueError(f"seen must map x_PN to a bool array of shape [{len(x_PN)}] "
                     f"(e.g. `x_PN[:, 0] > 0`), got {seen_P.dtype} {seen_P.shape}.")
  if not seen_P.any():
    raise ValueError("the seen domain is empty: there would be nothing to train on.")
  if seen_P.all():
    raise ValueError("the seen domain is the whole cube: nothing would be left unseen, so the "
                     "task does not test generalisation on the unseen.")
  return BooleanTask(name=name, n_bits=n_bits, target=target, seen=seen, protocol=protocol,
                     train_size=train_size, integer_valued=bool(integer_valued),
                     support=support, interaction_groups=interaction_groups)


_BUILTIN = {
    "2parity": lambda: make_task("2parity", _parity2_target, _seen_x0_or_x1, 15,
                                 support=(0, 1)),
    "majority3": lambda: make_task("majority3", _majority3_target, _seen_x0_or_x1, 15,
                                   protocol="iid", train_size=2**15, support=(0, 1, 2)),
    "cyclic3": lambda: make_task("cyclic3", _cyclic3_target, _seen_x0_or_x1_or_x2, 15,
                                 integer_valued=True, support=tuple(range(15))),
}
TASKS = tuple(_BUILTIN)


@functools.lru_cache(maxsize=None)
def _builtin_task(name: str) -> BooleanTask:
  return _BUILTIN[name]()


_REGISTERED: dict[str, BooleanTask] = {}


def register_task(task: BooleanTask) -> BooleanTask:
  """Makes a task of yours (`make_task`) known by its name, so experiments train it like
  the built-in ones (`mpx run boolean_gotu --set tasks=NAME` from a file that registers
  it). Registering a name again replaces the earlier task; built-in names are reserved."""
  if not isinstance(task, BooleanTask):
    raise ValueError(f"register_task takes a BooleanTask (from make_task); got "
                     f"{type(task).__name__}.")
  if task.name in _BUILTIN:
    raise ValueError(f"{task.name!r} is a built-in task; give yours another name.")
  _REGISTERED[task.name] = task
  return task


def task_names() -> tuple[str, ...]:
  """The built-in tasks, then the registered ones."""
  return TASKS + tuple(n for n in _REGISTERED if n not in TASKS)


def get_task(name: str) -> BooleanTask:
  """A task by name: the GOTU tasks of PAPER.md (one shared instance per name, so caches
  hit) or one registered with `register_task`."""
  if name in _REGISTERED:
    return _REGISTERED[name]
  if name not in _BUILTIN:
    raise ValueError(f"unknown Boolean task {name!r}; valid names: "
                     f"{', '.join(task_names())} (define yours with make_task and "
                     "register_task).")
  return _builtin_task(name)


def fingerprint(task: BooleanTask) -> dict:
  """What a run of `task` depends on, comparable across sessions: its bits, support,
  protocol, seen count and a hash of the target and the seen domain on the whole cube (a
  registered task whose definition changed must not resume a run of the old one)."""
  _, y_P, seen_P = _cube_data(task)
  digest = hashlib.sha256(y_P.tobytes() + seen_P.tobytes()).hexdigest()[:16]
  return {"n_bits": task.n_bits, "support": list(task.support),
          "interaction_groups": [list(g) for g in task.interaction_groups],
          "protocol": task.protocol, "train_size": task.train_size,
          "seen": int(seen_P.sum()), "cube_sha256": digest}


# ----------------------------------------------------------------------------------------------
# Data.


@functools.lru_cache(maxsize=None)
def _cube_data(task: BooleanTask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(x_PN, y_P, seen_P) on the whole cube; read-only since they are shared through the cache."""
  x_PN = cube(task.n_bits)
  y_P = np.asarray(task.target(x_PN), np.float32)
  seen_P = np.asarray(task.seen(x_PN), bool)
  for a in (x_PN, y_P, seen_P):
    a.flags.writeable = False
  return x_PN, y_P, seen_P


def make_splits(task: BooleanTask, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Train / test / seen / unseen sets as (x_PN float32, y_P float32).

  'train' follows the task's protocol: every seen point in cube order ("enumerate", the seed is
  unused) or `task.train_size` uniform draws with replacement from the seen points using
  np.random.default_rng(seed) ("iid"). 'test' is the whole cube, in cube order.
  """
  if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
    raise ValueError(f"seed must be an int, got {seed!r}.")
  x_PN, y_P, seen_P = _cube_data(task)
  x_seen, y_seen = x_PN[seen_P], y_P[seen_P]
  if task.protocol == "enumerate":
    train = (x_seen, y_seen)
  elif task.protocol == "iid":
    idx = np.random.default_rng(seed).integers(0, len(x_seen), size=task.train_size)
    train = (x_seen[idx], y_seen[idx])
  else:
    raise ValueError(f"task.protocol must be one of {PROTOCOLS}, got {task.protocol!r}; "
                     "build tasks with make_task.")
  return {
      "train": train,
      "test": (x_PN.copy(), y_P.copy()),
      "seen": (x_seen, y_seen),
      "unseen": (x_PN[~seen_P], y_P[~seen_P]),
  }


# ----------------------------------------------------------------------------------------------
# Fourier analysis on the cube.


def probe_points(task: BooleanTask, size: int = 128, seed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A seeded random probe of the cube, `(x_PN, y_P, seen_P)`, for diagnostics.

  Seen and unseen points are drawn in the cube's proportion (stratified, so every probe
  holds both domains), in random order. A strided slice of the cube order is *not* a
  probe: every 2^k-th row has the low k bits at −1, i.e. the same support bits in every
  row, all unseen for the GOTU tasks.
  """
  x_PN, y_P, seen_P = _cube_data(task)
  n_seen = int(round(size * seen_P.mean()))
  if not 0 < n_seen < size or n_seen > seen_P.sum() or size - n_seen > (~seen_P).sum():
    raise ValueError(f"a probe of {size} points cannot hold both domains of {task.name} "
                     f"({int(seen_P.sum())} seen, {int((~seen_P).sum())} unseen points); "
                     "choose another size (the config's probe_size).")
  rng = np.random.default_rng(seed)
  rows = np.concatenate([rng.choice(np.flatnonzero(seen_P), n_seen, replace=False),
                         rng.choice(np.flatnonzero(~seen_P), size - n_seen, replace=False)])
  rows = rng.permutation(rows)
  return x_PN[rows], y_P[rows], seen_P[rows]


def _check_cube_values(values_P, n_bits) -> np.ndarray:
  n_bits = _check_n_bits(n_bits)
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
  deg = _popcount(np.arange(2**n_bits))
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
  _, y_P, seen_P = _cube_data(task)
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
  deg_A = _popcount(local_A)
  chi_KA = (-1.0)**(deg_A[None, :] - _popcount(seen_points[:, None] & local_A[None, :]))

  # Target coefficients grouped by their R part T: f_T = sum_A c_{A u T} chi_A.
  c_S = fourier_coefficients(y_P, n)
  s_nz = np.flatnonzero(np.abs(c_S) > 1e-12)
  groups = np.unique(s_nz & ~v_mask)
  f_AT = np.zeros((len(local_A), len(groups)))  # local_A and groups are both sorted.
  f_AT[np.searchsorted(local_A, s_nz & v_mask), np.searchsorted(groups, s_nz & ~v_mask)] = (
      c_S[s_nz])
  y_KT = chi_KA @ f_AT  # f_T on the seen patterns D.

  g_S = np.zeros(2**n)
  deg_T = _popcount(groups)
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
  keep = np.flatnonzero(np.abs(g_S) > _ZERO_TOL)
  return {tuple(i for i in range(n) if (s >> i) & 1): float(g_S[s]) for s in keep}


@functools.lru_cache(maxsize=None)
def task_monomials(task: BooleanTask) -> tuple[tuple[int, ...], ...]:
  """The monomials of the target and of its MDI, lowest degree first: the coefficients a
  learned function has on them tell which of the two it learned."""
  _, y_P, _ = _cube_data(task)
  target = fourier_coefficients(y_P, task.n_bits)
  subsets = {tuple(i for i in range(task.n_bits) if mask >> i & 1)
             for mask in np.flatnonzero(np.abs(target) > _ZERO_TOL)}
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
# Metrics.


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
  _, y_P, seen_P = _cube_data(task)
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


# ----------------------------------------------------------------------------------------------
# Which unseen points a symmetric mask prior can carry over (a hypothesis, not a theorem).

COVERAGE_KINDS = ("sum", "window")


@dataclasses.dataclass(frozen=True)
class Coverage:
  """What `class_coverage` predicts for one task and one set of support groups.

  Attributes:
    covered_U: per unseen point (cube order), whether its class occurs among seen points.
    predicted_U: the predicted output on each unseen point: the class model fitted on the
      seen data where covered, the MDI elsewhere.
    covered_fraction: share of the unseen points that are covered.
    predicted_accuracy_unseen: sign accuracy of `predicted_U` on the unseen part.
    mdi_accuracy_unseen: the MDI's own unseen sign accuracy, for comparison.
  """
  covered_U: np.ndarray
  predicted_U: np.ndarray
  covered_fraction: float
  predicted_accuracy_unseen: float
  mdi_accuracy_unseen: float


def _check_groups(groups, n_bits: int) -> tuple[tuple[int, ...], ...]:
  groups = tuple(tuple(int(b) for b in g) for g in groups)
  if not groups or any(not g for g in groups):
    raise ValueError(f"groups must be non-empty tuples of bit indices; got {groups!r}.")
  if any(not 0 <= b < n_bits for g in groups for b in g):
    raise ValueError(f"group bits must lie in 0..{n_bits - 1}; got {groups!r}.")
  return groups


def _sum_class_fit(x_PN, y_P, seen_P, groups):
  """Class = the tuple of group sums; the prediction of a class is its mean seen target."""
  classes_P = np.stack([x_PN[:, list(g)].sum(1) for g in groups], axis=1)
  _, class_id_P = np.unique(classes_P, axis=0, return_inverse=True)
  class_id_P = class_id_P.ravel()
  n = class_id_P.max() + 1
  count_C = np.bincount(class_id_P[seen_P], minlength=n)
  total_C = np.bincount(class_id_P[seen_P], weights=y_P[seen_P], minlength=n)
  covered_P = count_C[class_id_P] > 0
  return covered_P, np.where(covered_P, total_C[class_id_P] / np.maximum(
      count_C[class_id_P], 1), 0.0)


def _window_fit(x_PN, y_P, seen_P, groups):
  """Every group is a window of one length; a window's pattern (its ±1 values, wherever it
  sits) gets one value, the output is the sum over windows, fitted to the seen data by
  least squares. Covered = every window pattern of the point occurs in the seen data."""
  if len({len(g) for g in groups}) != 1:
    raise ValueError("kind='window' needs windows of one length; got lengths "
                     f"{sorted({len(g) for g in groups})}.")
  k = len(groups[0])
  code_PG = np.stack([((x_PN[:, list(g)] > 0) * (1 << np.arange(k))).sum(1) for g in groups],
                     axis=1)
  counts_PK = np.stack([(code_PG == c).sum(1) for c in range(1 << k)], axis=1).astype(float)
  seen_patterns = counts_PK[seen_P].sum(0) > 0
  coef_K, *_ = np.linalg.lstsq(counts_PK[seen_P][:, seen_patterns], y_P[seen_P], rcond=None)
  covered_P = ~(counts_PK[:, ~seen_patterns] > 0).any(1)
  return covered_P, counts_PK[:, seen_patterns] @ coef_K


def class_coverage(task: BooleanTask, groups, kind: str = "sum") -> Coverage:
  """Which unseen points fall into a class that the seen data also holds, and the unseen
  accuracy that predicts if the model answers covered points as the seen data does.

  The hypothesis (from the prototypes measured before mpx, to be tested): a mask that makes each group's
  tokens interact symmetrically lets the model compute a function of the group's *sum*
  (`kind="sum"`; several groups: of the tuple of sums), or, for windowed supports such as
  Cyclic3's, a sum over windows of a function of each window's pattern (`kind="window"`).
  Such a model extrapolates exactly to the unseen points whose class (every window
  pattern) occurs among the seen points; on the others it has nothing to carry over, and
  the prediction is the min-degree interpolator's.
  """
  if kind not in COVERAGE_KINDS:
    raise ValueError(f"kind={kind!r}; choose one of {COVERAGE_KINDS}.")
  groups = _check_groups(groups, task.n_bits)
  x_PN, y_P, seen_P = _cube_data(task)
  y_P = y_P.astype(np.float64)
  fit = _sum_class_fit if kind == "sum" else _window_fit
  covered_P, class_pred_P = fit(x_PN, y_P, seen_P, groups)
  mdi_P = mdi_values(task).astype(np.float64)
  unseen_P = ~seen_P
  predicted_P = np.where(covered_P, class_pred_P, mdi_P)
  correct = lambda pred_P: float(np.mean(np.sign(pred_P[unseen_P]) == np.sign(y_P[unseen_P])))
  return Coverage(covered_U=covered_P[unseen_P], predicted_U=predicted_P[unseen_P],
                  covered_fraction=float(covered_P[unseen_P].mean()),
                  predicted_accuracy_unseen=correct(predicted_P),
                  mdi_accuracy_unseen=correct(mdi_P))
