"""Boolean "generalisation on the unseen" (GOTU) tasks: definitions, the cube and the data.

Tasks follow Abbe, Bengio, Lotfi, Rizk (ICML 2023): inputs x in {-1, +1}^n, a target f, and a
*seen* part of the cube that is the only part trained on; the test set is the whole cube. What a
model does on the *unseen* part tells whether it learned f or collapsed to the min-degree
interpolator (MDI), the interpolant of the seen data with the least high-degree Fourier mass.

The Boolean family (`mpx.tasks.boolean`, which re-exports this module) is one module per
concern: this one (tasks of the paper and of your own, the cube, splits), `fourier`
(Fourier analysis, the MDI, function metrics), `gotu` (the experiments' model and groups),
`coverage` (which unseen points a symmetric mask can carry over, a hypothesis), `graphs`
(the interaction graph of a task, read from a learned mask or a learned function, when it
is not known), `discover` (training with it: the two stages) and `planted` (a benchmark
of generated tasks for discovery).

Everything here is host-side numpy. Shapes are in the names: `x_PN` is points x bits, `y_P` one
value per point. Inputs and targets are float32.

The cube order used everywhere (`cube`): row r has bit i = +1 if (r >> i) & 1 else -1.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
from typing import Callable, Sequence

import jax.numpy as jnp
import numpy as np

MAX_BITS = 20  # 2^20 points x 20 bits x 4 bytes = 80 MiB for the cube; beyond that, not a toy.
PROTOCOLS = ("enumerate", "iid")


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


def check_n_bits(n_bits) -> int:
  """`n_bits` as an int, or a ValueError naming the range the whole cube can hold."""
  if isinstance(n_bits, bool) or not isinstance(n_bits, (int, np.integer)):
    raise ValueError(f"n_bits must be an int in 1..{MAX_BITS}, got {n_bits!r}.")
  if not 1 <= n_bits <= MAX_BITS:
    raise ValueError(
        f"n_bits must be in 1..{MAX_BITS} (the whole cube is enumerated), got {n_bits}.")
  return int(n_bits)


def tokens(x_BN) -> jnp.ndarray:
  """±1 inputs → the model's token ids {0, 1}, as the GOTU code's `(x + 1) / 2`."""
  return ((jnp.asarray(x_BN) + 1) // 2).astype(jnp.int32)


def cube(n_bits: int) -> np.ndarray:
  """All 2^n points of {-1, +1}^n as float32 [2^n, n]; row r: bit i = +1 iff (r >> i) & 1."""
  n_bits = check_n_bits(n_bits)
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
  n_bits = check_n_bits(n_bits)
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


# The built-in tasks that modules built on this one define, by name: listing names and
# registering a task import none of them (they load the discovery stack and run the
# planted generator); a lookup imports the one module that defines the task.
# tests/test_boolean_tasks.py checks each list against its module's TASK_NAMES.
_DEFINED_ABOVE = {
    "coverage": ("cov_parity2", "cov_andnot", "cov_parity3", "cov_window3", "cov_majority5",
                 "cov_threshold4", "cov_majority3", "cov_majority3_hole"),
    "planted": ("p00_sparse17", "p01_chain15", "p02_window17", "p03_junta17", "p04_sparse15",
                "p05_chain17", "p06_window15", "p07_junta16", "p08_sparse17", "p09_chain15",
                "p10_window16", "p11_junta17", "p12_sparse16", "p13_chain16", "p14_window16",
                "p15_junta16", "p16_sparse17", "p17_chain15", "p18_window15", "p19_junta15"),
}
_BUILTIN_NAMES = TASKS + sum(_DEFINED_ABOVE.values(), ())

_REGISTERED: dict[str, BooleanTask] = {}


def register_task(task: BooleanTask) -> BooleanTask:
  """Makes a task of yours (`make_task`) known by its name, so experiments train it like
  the built-in ones (`mpx run boolean_gotu --set tasks=NAME` from a file that registers
  it). Registering a name again replaces the earlier task; built-in names are reserved."""
  if not isinstance(task, BooleanTask):
    raise ValueError(f"register_task takes a BooleanTask (from make_task); got "
                     f"{type(task).__name__}.")
  if task.name in _BUILTIN_NAMES:
    raise ValueError(f"{task.name!r} is a built-in task; give yours another name.")
  _REGISTERED[task.name] = task
  return task


def task_names() -> tuple[str, ...]:
  """The built-in tasks (the paper's, the coverage study's, the planted benchmark's),
  then the registered ones."""
  return _BUILTIN_NAMES + tuple(_REGISTERED)


def get_task(name: str) -> BooleanTask:
  """A task by name: the GOTU tasks of PAPER.md, the coverage study's and the planted
  benchmark's (one shared instance per name, so caches hit) or one registered with
  `register_task`."""
  if name in _REGISTERED:
    return _REGISTERED[name]
  if name in _BUILTIN:
    return _builtin_task(name)
  for module, names in _DEFINED_ABOVE.items():
    if name in names:
      return importlib.import_module(f"mpx.tasks.boolean.{module}").boolean_task(name)
  raise ValueError(f"unknown Boolean task {name!r}; valid names: "
                   f"{', '.join(task_names())} (define yours with make_task and "
                   "register_task).")


def fingerprint(task: BooleanTask) -> dict:
  """What a run of `task` depends on, comparable across sessions: its bits, support,
  protocol, seen count and a hash of the target and the seen domain on the whole cube (a
  registered task whose definition changed must not resume a run of the old one)."""
  _, y_P, seen_P = cube_data(task)
  digest = hashlib.sha256(y_P.tobytes() + seen_P.tobytes()).hexdigest()[:16]
  return {"n_bits": task.n_bits, "support": list(task.support),
          "interaction_groups": [list(g) for g in task.interaction_groups],
          "protocol": task.protocol, "train_size": task.train_size,
          "seen": int(seen_P.sum()), "cube_sha256": digest}


# ----------------------------------------------------------------------------------------------
# Data.


@functools.lru_cache(maxsize=None)
def cube_data(task: BooleanTask) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(x_PN, y_P, seen_P) on the whole cube in cube order, cached per task: read-only, since
  every caller shares them."""
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
  x_PN, y_P, seen_P = cube_data(task)
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


def probe_points(task: BooleanTask, size: int = 128, seed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """A seeded random probe of the cube, `(x_PN, y_P, seen_P)`, for diagnostics.

  Seen and unseen points are drawn in the cube's proportion (stratified, so every probe
  holds both domains), in random order. A strided slice of the cube order is *not* a
  probe: every 2^k-th row has the low k bits at −1, i.e. the same support bits in every
  row, all unseen for the GOTU tasks.
  """
  x_PN, y_P, seen_P = cube_data(task)
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
