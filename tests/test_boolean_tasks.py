"""Tests for mpx.tasks.boolean: GOTU domains, splits, Fourier analysis, min-degree interpolator."""

import itertools
import subprocess
import sys

import chex
import numpy as np
import pytest

from mpx.tasks import boolean
from mpx.tasks.boolean import coverage as boolean_coverage
from mpx.tasks.boolean import fourier as boolean_fourier
from mpx.tasks.boolean import planted

N = 15
CUBE = 2**N


def _chi(x_PN, subset):
  return np.prod(np.asarray(x_PN, np.float64)[:, list(subset)], axis=1)


def _assert_coeffs_close(got, want, atol=1e-6):
  keys = set(got) | set(want)
  for k in keys:
    assert abs(got.get(k, 0.0) - want.get(k, 0.0)) < atol, (k, got.get(k), want.get(k))


# ---------------------------------------------------------------------------------------------
# Cube, tasks, splits.


def test_cube_order_and_dtype():
  x = boolean.cube(3)
  assert x.shape == (8, 3) and x.dtype == np.float32
  np.testing.assert_array_equal(x[0], [-1, -1, -1])
  np.testing.assert_array_equal(x[1], [1, -1, -1])  # bit 0 of the row index is x0.
  np.testing.assert_array_equal(x[6], [-1, 1, 1])
  assert len(np.unique(boolean.cube(N), axis=0)) == CUBE


def test_task_names():
  assert boolean.TASKS == ("2parity", "majority3", "cyclic3")
  for name in boolean.TASKS:
    task = boolean.get_task(name)
    assert task.name == name and task.n_bits == N
    assert boolean.get_task(name) is task
  assert boolean.get_task("majority3").protocol == "iid"
  assert boolean.get_task("cyclic3").integer_valued
  assert boolean.get_task("cyclic3").support == tuple(range(N))
  assert boolean.get_task("2parity").support == (0, 1)


@pytest.mark.parametrize("name,n_seen", [("2parity", 24_576), ("majority3", 24_576),
                                         ("cyclic3", 28_672)])
def test_domain_sizes_and_splits(name, n_seen):
  task = boolean.get_task(name)
  splits = boolean.make_splits(task, seed=0)
  assert set(splits) == {"train", "test", "seen", "unseen"}
  for x, y in splits.values():
    assert x.dtype == np.float32 and y.dtype == np.float32
    assert x.ndim == 2 and x.shape[1] == N and y.shape == (len(x),)
    assert set(np.unique(x)) == {-1.0, 1.0}
    np.testing.assert_array_equal(y, task.target(x))
  assert len(splits["seen"][0]) == n_seen
  assert len(splits["unseen"][0]) == CUBE - n_seen
  assert len(splits["test"][0]) == CUBE
  np.testing.assert_array_equal(splits["test"][0], boolean.cube(N))
  assert task.seen(splits["seen"][0]).all() and not task.seen(splits["unseen"][0]).any()
  assert task.seen(splits["train"][0]).all()
  if task.protocol == "enumerate":
    np.testing.assert_array_equal(splits["train"][0], splits["seen"][0])


def test_unseen_domains():
  x, _ = boolean.make_splits(boolean.get_task("2parity"), 0)["unseen"]
  assert len(x) == 8_192 and (x[:, :2] == -1).all()
  x, _ = boolean.make_splits(boolean.get_task("cyclic3"), 0)["unseen"]
  assert len(x) == 4_096 and (x[:, :3] == -1).all()


def test_majority_iid_train():
  task = boolean.get_task("majority3")
  x0, y0 = boolean.make_splits(task, seed=0)["train"]
  x0b, y0b = boolean.make_splits(task, seed=0)["train"]
  x1, _ = boolean.make_splits(task, seed=1)["train"]
  assert x0.shape == (32_768, N) and y0.shape == (32_768,)
  assert task.seen(x0).all()
  np.testing.assert_array_equal(x0, x0b)
  np.testing.assert_array_equal(y0, y0b)
  assert not np.array_equal(x0, x1)
  # With replacement: 2^15 draws from 24,576 points repeat some (expected ~ 24,576 * e^{-4/3}).
  n_distinct = len(np.unique(x0, axis=0))
  assert n_distinct < 32_768
  assert abs(n_distinct - 24_576 * (1 - np.exp(-32_768 / 24_576))) < 300


def test_enumerate_ignores_seed():
  task = boolean.get_task("2parity")
  np.testing.assert_array_equal(boolean.make_splits(task, 0)["train"][0],
                                boolean.make_splits(task, 7)["train"][0])


def test_target_values():
  def point(ones):
    x = -np.ones((1, N), np.float32)
    x[0, list(ones)] = 1
    return x

  parity = boolean.get_task("2parity").target
  majority = boolean.get_task("majority3").target
  cyclic = boolean.get_task("cyclic3").target
  assert parity(point([]))[0] == 1 and parity(point([0]))[0] == -1
  assert parity(point([0, 1, 5]))[0] == 1
  assert majority(point([0]))[0] == -1 and majority(point([0, 2]))[0] == 1
  assert majority(point([3, 4, 5, 6]))[0] == -1 and majority(point([0, 1, 2]))[0] == 1
  assert cyclic(point(range(N)))[0] == 15
  assert cyclic(point([]))[0] == -15  # 15 products of three -1s.
  # Only x0 = +1: the three triples containing bit 0 ((13,14,0), (14,0,1), (0,1,2)) flip to +1.
  assert cyclic(point([0]))[0] == -15 + 2 * 3
  # Wrap-around: x13 = x14 = x0 = +1, rest -1 -> triples with an odd number of +1s stay -1.
  x = point([13, 14, 0])
  want = sum(np.prod(x[0, [i, (i + 1) % N, (i + 2) % N]]) for i in range(N))
  assert cyclic(x)[0] == want
  for f in (parity, majority, cyclic):
    assert f(boolean.cube(N)).dtype == np.float32


# ---------------------------------------------------------------------------------------------
# Fourier analysis.

_HAND = {(): 2.0, (1, 4): -3.0, (0, 2, 3): 0.5}


def _hand_values():
  x = boolean.cube(5)
  return 2.0 - 3.0 * _chi(x, (1, 4)) + 0.5 * _chi(x, (0, 2, 3))


def test_fourier_recovers_hand_made_function():
  c = boolean_fourier.fourier_coefficients(_hand_values(), 5)
  want = np.zeros(32)
  want[0] = 2.0
  want[0b10010] = -3.0
  want[0b01101] = 0.5
  np.testing.assert_array_equal(c, want)  # dyadic arithmetic: exact.
  assert boolean_fourier.monomial_coefficient(_hand_values(), 5, (4, 1)) == -3.0
  assert boolean_fourier.monomial_coefficient(_hand_values(), 5, (0, 2, 3)) == 0.5
  assert boolean_fourier.monomial_coefficient(_hand_values(), 5, (0,)) == 0.0


def test_fourier_matches_definition_and_roundtrip():
  rng = np.random.default_rng(0)
  n = 6
  f = rng.normal(size=2**n)
  c = boolean_fourier.fourier_coefficients(f, n)
  x = boolean.cube(n)
  for s in range(2**n):
    subset = tuple(i for i in range(n) if (s >> i) & 1)
    assert abs(c[s] - np.mean(f * _chi(x, subset))) < 1e-12
  np.testing.assert_allclose(boolean_fourier.values_from_coefficients(c, n), f, atol=1e-12)
  # Parseval: E[f^2] = sum_S c_S^2.
  assert abs(np.mean(f**2) - np.sum(c**2)) < 1e-12
  assert abs(np.sum(boolean_fourier.degree_profile(c, n)) - np.mean(f**2)) < 1e-12


def test_degree_profile_and_evaluate_monomials():
  c = boolean_fourier.fourier_coefficients(_hand_values(), 5)
  np.testing.assert_array_equal(boolean_fourier.degree_profile(c, 5),
                                [4.0, 0.0, 9.0, 0.25, 0.0, 0.0])
  got = boolean_fourier.evaluate_monomials(_HAND, boolean.cube(5))
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got, _hand_values())


def test_fourier_rejects_wrong_length():
  with pytest.raises(ValueError, match="one value per cube point"):
    boolean_fourier.fourier_coefficients(np.zeros(31), 5)
  with pytest.raises(ValueError, match="distinct bit indices"):
    boolean_fourier.monomial_coefficient(np.zeros(32), 5, (1, 1))


# ---------------------------------------------------------------------------------------------
# Min-degree interpolator.


def _interpolates_seen(task, coeffs):
  x, y = boolean.make_splits(task, 0)["seen"]
  got = boolean_fourier.evaluate_monomials(coeffs, x).astype(np.float64)
  return np.max(np.abs(got - y))


def test_mdi_2parity():
  task = boolean.get_task("2parity")
  mdi = boolean_fourier.min_degree_interpolator(task)
  _assert_coeffs_close(mdi, {(0,): 1.0, (1,): 1.0, (): -1.0})
  assert _interpolates_seen(task, mdi) < 1e-6
  m = boolean_fourier.function_metrics(boolean_fourier.mdi_values(task), task)
  assert m["accuracy"] == 0.75 and m["accuracy_unseen"] == 0.0
  assert m["loss"] == 4.0 and m["loss_unseen"] == 16.0  # MDI = -3 where the target is +1.


def test_mdi_majority3():
  task = boolean.get_task("majority3")
  mdi = boolean_fourier.min_degree_interpolator(task)
  _assert_coeffs_close(mdi, {(0,): 0.5, (1,): 0.5, (2,): 1.0, (0, 2): -0.5, (1, 2): -0.5})
  assert _interpolates_seen(task, mdi) < 1e-6
  m = boolean_fourier.function_metrics(boolean_fourier.mdi_values(task), task)
  assert m["accuracy"] == 0.875 and m["accuracy_unseen"] == 0.5


def test_mdi_cyclic3():
  task = boolean.get_task("cyclic3")
  mdi = boolean_fourier.min_degree_interpolator(task)
  assert _interpolates_seen(task, mdi) < 1e-6
  # Only the triple x0 x1 x2 is lowered: x0x1x2 + 8 * 1[x0=x1=x2=-1] has no degree-3 part.
  want = {tuple(sorted((i, (i + 1) % N, (i + 2) % N))): 1.0 for i in range(1, N)}
  want.update({(): 1.0, (0,): -1.0, (1,): -1.0, (2,): -1.0,
               (0, 1): 1.0, (0, 2): 1.0, (1, 2): 1.0})
  _assert_coeffs_close(mdi, want)
  _, y = boolean.make_splits(task, 0)["test"]
  seen = task.seen(boolean.cube(N))
  diff = boolean_fourier.mdi_values(task) - y
  assert (diff[seen] == 0).all() and (diff[~seen] == 8).all()  # f on seen, f + 8 on unseen.
  m = boolean_fourier.function_metrics(boolean_fourier.mdi_values(task), task)
  # Wrong sign exactly where f in {-7, -5, -3, -1} on the unseen part: 231+500+780+840 points.
  assert np.sum(np.isin(y[~seen], [-7, -5, -3, -1])) == 2_351
  assert m["accuracy"] == (CUBE - 2_351) / CUBE  # 0.92825
  assert m["accuracy_unseen"] == (4_096 - 2_351) / 4_096
  assert m["accuracy_exact"] == 0.875 and m["accuracy_exact_unseen"] == 0.0
  assert m["loss_unseen"] == 64.0


def test_mdi_values_cached_and_read_only():
  task = boolean.get_task("2parity")
  v = boolean_fourier.mdi_values(task)
  assert v is boolean_fourier.mdi_values(task)
  assert v.dtype == np.float32 and v.shape == (CUBE,)
  with pytest.raises(ValueError):
    v[0] = 1.0


def test_mdi_weighted_penalty_approaches_exact_limit():
  task = boolean.get_task("majority3")
  exact = boolean_fourier.min_degree_interpolator(task)
  for w in (1e2, 1e4):
    approx = boolean_fourier.min_degree_interpolator(task, weight=w)
    assert _interpolates_seen(task, approx) < 1e-6
    _assert_coeffs_close(approx, exact, atol=10.0 / w)
    assert max(abs(approx.get(k, 0.0) - exact.get(k, 0.0)) for k in exact) > 0.01 / w


def test_mdi_max_degree():
  task = boolean.get_task("2parity")
  _assert_coeffs_close(boolean_fourier.min_degree_interpolator(task, max_degree=1),
                       {(0,): 1.0, (1,): 1.0, (): -1.0})
  with pytest.raises(ValueError, match="no interpolant .* degree <= 0"):
    boolean_fourier.min_degree_interpolator(task, max_degree=0)
  with pytest.raises(ValueError, match="degree <= 2"):
    boolean_fourier.min_degree_interpolator(boolean.get_task("cyclic3"), max_degree=2)


def test_mdi_reduction_matches_full_basis_penalty():
  """The per-group reduction agrees with a brute-force weighted solve over all 2^n monomials.

  Seen domain on non-adjacent bits {1, 3}, target mixing monomials inside and outside them.
  """
  n = 6
  coeffs = {(1, 3): 1.0, (0, 1, 3): -2.0, (3, 5): 0.5, (2,): 1.5, (0, 1, 2, 3, 4): 0.25}
  task = boolean.make_task("toy", lambda x: boolean_fourier.evaluate_monomials(coeffs, x),
                           lambda x: (x[:, 1] > 0) | (x[:, 3] > 0), n)
  exact = boolean_fourier.min_degree_interpolator(task)
  assert _interpolates_seen(task, exact) < 1e-6

  x = boolean.cube(n).astype(np.float64)
  seen = task.seen(boolean.cube(n))
  subsets = [s for d in range(n + 1) for s in itertools.combinations(range(n), d)]
  phi = np.stack([_chi(x[seen], s) for s in subsets], axis=1)
  w = 1e5
  scale = np.array([w**(-0.5 * len(s)) for s in subsets])
  u, *_ = np.linalg.lstsq(phi * scale, task.target(x[seen]).astype(np.float64), rcond=None)
  brute = {s: c for s, c in zip(subsets, u * scale) if abs(c) > 1e-9}
  _assert_coeffs_close(brute, exact, atol=1e-3)
  # x1 x3 equals x1 + x3 - 1 on the seen domain (as 2parity), so each monomial holding both
  # bits 1 and 3 is lowered by one degree; x3 x5 and x2 are already minimal.
  want = {(): -1.0, (1,): 1.0, (3,): 1.0,                      # from x1 x3
          (0,): 2.0, (0, 1): -2.0, (0, 3): -2.0,              # from -2 x0 x1 x3
          (0, 2, 4): -0.25, (0, 1, 2, 4): 0.25, (0, 2, 3, 4): 0.25,  # from 0.25 x0..x4
          (3, 5): 0.5, (2,): 1.5}
  _assert_coeffs_close(exact, want)


# ---------------------------------------------------------------------------------------------
# Metrics.


@pytest.mark.parametrize("name", boolean.TASKS)
def test_metrics_of_exact_target(name):
  task = boolean.get_task(name)
  _, y = boolean.make_splits(task, 0)["test"]
  m = boolean_fourier.function_metrics(y, task, mdi_values_P=boolean_fourier.mdi_values(task))
  assert m["accuracy"] == 1.0 and m["accuracy_unseen"] == 1.0
  assert m["loss"] == 0.0 and m["loss_unseen"] == 0.0
  assert m["target_distance_unseen"] == 0.0
  # Distance to the MDI on the unseen part = RMS(target - MDI) there.
  want = {"2parity": 4.0, "majority3": 2.0, "cyclic3": 8.0}[name]
  assert m["mdi_distance_unseen"] == pytest.approx(want)
  assert ("accuracy_exact" in m) == task.integer_valued
  if task.integer_valued:
    assert m["accuracy_exact"] == 1.0


def test_metrics_zero_prediction_is_wrong_and_shapes_checked():
  task = boolean.get_task("2parity")
  m = boolean_fourier.function_metrics(np.zeros(CUBE), task)
  assert m["accuracy"] == 0.0 and m["loss"] == 1.0
  # A [P, 1] readout is fine.
  m = boolean_fourier.function_metrics(np.ones((CUBE, 1), np.float32), task)
  assert m["accuracy"] == 0.5
  with pytest.raises(ValueError, match="one value per cube point"):
    boolean_fourier.function_metrics(np.zeros(100), task)


def test_distance_to():
  a = np.array([0.0, 1.0, 2.0, 3.0])
  b = np.array([0.0, 0.0, 0.0, 7.0])
  assert boolean_fourier.distance_to(a, b, np.array([False, True, True, False])) == pytest.approx(
      np.sqrt(2.5))
  assert boolean_fourier.distance_to(a, b) == pytest.approx(np.sqrt((1 + 4 + 16) / 4))
  with pytest.raises(ValueError, match="selects no points"):
    boolean_fourier.distance_to(a, b, np.zeros(4, bool))


# ---------------------------------------------------------------------------------------------
# Validation.


def _target(x):
  return x[:, 0]


def _seen(x):
  return x[:, 1] > 0


_NAMES_ALONE = """
import sys
from mpx.tasks import boolean
names = boolean.task_names()
boolean.register_task(boolean.make_task("mine", lambda x: x[:, 0], lambda x: x[:, 1] > 0, 4))
assert boolean.get_task("2parity").name == "2parity" and "mine" in boolean.task_names()
print(len(names), *sorted(m for m in sys.modules if m.startswith("mpx.")))
"""


def test_task_names_import_no_module_above_the_registry():
  """The registry lists every built-in name and registers a task without importing the
  modules that define tasks on top of it (coverage, planted: the discovery stack, the
  planted generator); a lookup imports the one module that defines the task."""
  out = subprocess.run([sys.executable, "-c", _NAMES_ALONE], capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  count, *modules = out.stdout.split()
  assert int(count) == 3 + len(boolean_coverage.TASK_NAMES) + len(planted.TASK_NAMES)
  above = [m for m in modules if m.split(".")[-1] in ("coverage", "planted", "discover",
                                                      "graphs", "gotu", "discovery")]
  assert not above, above


def test_the_registry_names_the_tasks_its_modules_define():
  assert boolean.task_names()[:3] == boolean.TASKS
  assert boolean.task_names()[3:] == boolean_coverage.TASK_NAMES + planted.TASK_NAMES
  for name in (boolean_coverage.TASK_NAMES[0], planted.TASK_NAMES[-1]):
    assert boolean.get_task(name) is boolean.get_task(name) and boolean.get_task(name).name == name


def test_get_task_unknown_name():
  with pytest.raises(ValueError, match="unknown Boolean task 'parity'.*2parity, majority3, "
                     "cyclic3"):
    boolean.get_task("parity")


def test_make_task_valid_custom():
  task = boolean.make_task("t", _target, _seen, 4, protocol="iid", train_size=10,
                           support=(2, 0))
  assert task.support == (0, 2)
  x, y = boolean.make_splits(task, 3)["train"]
  assert x.shape == (10, 4) and (x[:, 1] == 1).all()
  np.testing.assert_array_equal(y, x[:, 0])


@pytest.mark.parametrize("kwargs,match", [
    (dict(n_bits=0), r"n_bits must be in 1\.\.20"),
    (dict(n_bits=21), r"n_bits must be in 1\.\.20"),
    (dict(n_bits=3.0), "n_bits must be an int"),
    (dict(target=None), "target must be a callable"),
    (dict(seen="x0"), "seen must be a callable"),
    (dict(seen=lambda x: x[:, 0] > 2), "seen domain is empty"),
    (dict(seen=lambda x: x[:, 0] > -2), "whole cube"),
    (dict(seen=lambda x: (x[:, 0] > 0).astype(np.float32)), "bool array"),
    (dict(target=lambda x: x), r"target must map x_PN"),
    (dict(target=lambda x: np.full(len(x), np.nan)), "finite"),
    (dict(protocol="random"), "protocol must be one of"),
    (dict(protocol="iid"), "needs train_size"),
    (dict(train_size=100), "only used with protocol='iid'"),
    (dict(support=(0, 9)), "distinct bit indices in 0..3"),
    (dict(name=""), "name must be a non-empty string"),
])
def test_make_task_errors(kwargs, match):
  args = dict(name="t", target=_target, seen=_seen, n_bits=4) | kwargs
  name, target, seen, n_bits = (args.pop(k) for k in ("name", "target", "seen", "n_bits"))
  with pytest.raises(ValueError, match=match):
    boolean.make_task(name, target, seen, n_bits, **args)


def test_make_splits_bad_seed():
  with pytest.raises(ValueError, match="seed must be an int"):
    boolean.make_splits(boolean.get_task("2parity"), seed=0.5)


def test_task_monomials_cover_target_and_mdi():
  parity = boolean.get_task("2parity")
  assert boolean_fourier.task_monomials(parity) == ((), (0,), (1,), (0, 1))
  assert [boolean_fourier.monomial_label(s) for s in boolean_fourier.task_monomials(parity)] == [
      "1", "x0", "x1", "x0x1"]
  majority = boolean_fourier.task_monomials(boolean.get_task("majority3"))
  assert {(0,), (1,), (2,), (0, 2), (1, 2), (0, 1, 2)} <= set(majority)
  cyclic = boolean_fourier.task_monomials(boolean.get_task("cyclic3"))
  assert len([s for s in cyclic if len(s) == 3]) == 15 and () in cyclic


@pytest.mark.parametrize("name", ["2parity", "majority3", "cyclic3"])
def test_probe_points_cover_both_domains_in_proportion(name):
  task = boolean.get_task(name)
  x, y, seen = boolean.probe_points(task, 128, seed=0)
  chex.assert_shape(x, (128, 15))
  np.testing.assert_array_equal(seen, task.seen(x))
  share = task.seen(boolean.cube(15)).mean()
  assert seen.sum() == round(128 * share) and (~seen).sum() > 0
  assert len(np.unique(y)) > 1                     # The target varies on the probe.
  for bit in range(15):                            # Every bit varies, support included.
    assert 0 < (x[:, bit] > 0).sum() < 128, bit
  assert len({tuple(r) for r in x[:, :3]}) >= 7    # The support tokens differ across rows.
  again = boolean.probe_points(task, 128, seed=0)
  np.testing.assert_array_equal(again[0], x)       # Seeded: the same probe every evaluation.
  assert not np.array_equal(boolean.probe_points(task, 128, seed=1)[0], x)


# Sum-class coverage: hand-checked cases of the hypothesis in ../shared/FINDINGS.md.


def test_coverage_2parity_has_no_seen_class_for_its_unseen_sum():
  # Unseen x0 = x1 = −1 has sum −2; every seen point has x0 + x1 ∈ {0, 2}.
  cov = boolean_coverage.class_coverage(boolean.get_task("2parity"), [(0, 1)])
  assert cov.covered_fraction == 0.0 and not cov.covered_U.any()
  assert cov.predicted_accuracy_unseen == cov.mdi_accuracy_unseen == 0.0
  np.testing.assert_allclose(cov.predicted_U, -3.0, atol=1e-5)  # The MDI x0 + x1 − 1.
  # As one window, its unseen pattern (−1, −1) never occurs among the seen points either.
  window = boolean_coverage.class_coverage(boolean.get_task("2parity"), [(0, 1)], kind="window")
  assert window.covered_fraction == 0.0 and window.predicted_accuracy_unseen == 0.0


def test_coverage_majority_covers_the_half_with_sum_minus_one():
  # Unseen x0 = x1 = −1: x2 = +1 gives sum −1, seen as (+1, −1, −1) with target −1;
  # x2 = −1 gives sum −3, never seen, where the MDI (−1 + 2·x2 = −3) is right anyway.
  task = boolean.get_task("majority3")
  cov = boolean_coverage.class_coverage(task, [(0, 1, 2)])
  x_unseen = boolean.cube(15)[~task.seen(boolean.cube(15))]
  np.testing.assert_array_equal(cov.covered_U, x_unseen[:, 2] > 0)
  np.testing.assert_allclose(cov.predicted_U[cov.covered_U], -1.0)
  assert cov.covered_fraction == 0.5
  assert cov.mdi_accuracy_unseen == 0.5 and cov.predicted_accuracy_unseen == 1.0


def test_coverage_three_bit_parity_is_half_covered():
  task = boolean.make_task("parity3", lambda x: x[:, 0] * x[:, 1] * x[:, 2],
                           lambda x: (x[:, 0] > 0) | (x[:, 1] > 0), 15, support=(0, 1, 2))
  cov = boolean_coverage.class_coverage(task, [task.support])
  x = boolean.cube(15)[~task.seen(boolean.cube(15))]
  # x2 = +1: sum −1, seen only at targets +1 → predicted +1, right; x2 = −1: sum −3, unseen.
  np.testing.assert_array_equal(cov.covered_U, x[:, 2] > 0)
  np.testing.assert_allclose(cov.predicted_U[cov.covered_U], 1.0)
  mdi = boolean_fourier.mdi_values(task)[~task.seen(boolean.cube(15))]
  np.testing.assert_allclose(cov.predicted_U[~cov.covered_U], mdi[~cov.covered_U])
  expected = 0.5 + 0.5 * np.mean(np.sign(mdi[x[:, 2] < 0]) == -1.0)
  assert cov.predicted_accuracy_unseen == pytest.approx(expected)


def test_coverage_cyclic3_windows_all_occur_in_the_seen_data():
  # The unseen point's windows (−1, −1, −1) at 0..2 occur elsewhere in seen points, and a
  # per-pattern value summed over windows represents Σ x_i x_{i+1} x_{i+2} exactly.
  task = boolean.get_task("cyclic3")
  windows = [tuple((i + j) % 15 for j in range(3)) for i in range(15)]
  cov = boolean_coverage.class_coverage(task, windows, kind="window")
  assert cov.covered_fraction == 1.0 and cov.predicted_accuracy_unseen == 1.0
  y = boolean.make_splits(task, 0)["test"][1][~task.seen(boolean.cube(15))]
  np.testing.assert_allclose(cov.predicted_U, y, atol=1e-6)
  # As sums instead, the joint tuple of 15 window sums is the point itself: nothing seen.
  assert boolean_coverage.class_coverage(task, windows, kind="sum").covered_fraction == 0.0


def test_coverage_rejects_bad_groups():
  task = boolean.get_task("2parity")
  for groups, kind, match in (([], "sum", "non-empty"), ([(0, 15)], "sum", "0..14"),
                              ([(0, 1)], "product", "kind"),
                              ([(0, 1), (2,)], "window", "one length")):
    with pytest.raises(ValueError, match=match):
      boolean_coverage.class_coverage(task, groups, kind=kind)


def test_interaction_groups_must_cover_the_support():
  target = lambda x: x[:, 0] * x[:, 1] * x[:, 2]
  seen = lambda x: x[:, 0] > 0
  task = boolean.make_task("grouped", target, seen, 4, support=(0, 1, 2),
                           interaction_groups=[(1, 0), (2, 1)])
  assert task.interaction_groups == ((0, 1), (1, 2))
  for groups in ([(0, 1)], [(0, 1), (2,)], [(0, 1), (1, 2), (2, 3)]):
    with pytest.raises(ValueError, match="interaction_groups"):
      boolean.make_task("grouped", target, seen, 4, support=(0, 1, 2),
                        interaction_groups=groups)
