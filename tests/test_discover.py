"""Discovering a Boolean task's interaction graph (`mpx.tasks.boolean.graphs`) and the
prior built from it (`mpx.priors.from_interactions`).

The learnable neutral init the mask route starts from is standard attention to float
rounding: tests/test_priors.py::test_both_neutral_priors_are_standard_attention (the
function) and test_frozen_neutral_never_moves_and_learnable_neutral_does (its gradient);
tests/test_discover_boolean.py checks it in the experiment's model.
"""

import chex
import jax
import numpy as np
import pytest

from mpx import priors, report
from mpx.sweep import engine, evaluate, run
from mpx.tasks import boolean
from mpx.tasks.boolean import fourier as boolean_fourier
from mpx.tasks import discovery
from mpx.tasks.boolean import discover as dp
from mpx.tasks.boolean import graphs as bd
from mpx.tasks.boolean import gotu as boolean_gotu

G = bd.InteractionGraph


def _cyclic_pairs(n, window=3):
  return {(i, j) for i in range(n) for j in range(i + 1, n)
          if min(j - i, n - (j - i)) < window}


# ----------------------------------------------------------------------------- graphs


def test_graph_normalises_and_round_trips():
  g = G(6, bits=(4,), pairs=((3, 1), (1, 3), (0, 2)))
  assert g.bits == (0, 1, 2, 3, 4) and g.pairs == ((0, 2), (1, 3))  # Pair bits join.
  adjacency = g.adjacency()
  chex.assert_shape(adjacency, (6, 6))
  assert adjacency.dtype == bool and (adjacency == adjacency.T).all()
  np.testing.assert_array_equal(np.diag(adjacency), [1, 1, 1, 1, 1, 0])
  assert G.from_adjacency(adjacency) == g
  assert G.from_json(6, g.to_json()) == g
  assert G(6).empty and not g.empty
  for bad in (dict(bits=(6,)), dict(pairs=((2, 2),))):
    with pytest.raises(ValueError):
      G(6, **bad)


# The tasks' graphs written from their definitions: 2Parity x0·x1; Majority sign(x0 + x1 +
# x2) (degree-1 and degree-3 terms: the clique); Cyclic3 a sum of x_i·x_(i+1)·x_(i+2) over
# the cyclic windows (each bit: two neighbours a side).
CLIQUE3 = G(15, (0, 1, 2), ((0, 1), (0, 2), (1, 2)))
KNOWN = {"2parity": G(15, (0, 1), ((0, 1),)), "majority3": CLIQUE3,
         "cov_parity3": CLIQUE3, "cov_majority3_hole": CLIQUE3,
         "cyclic3": G(15, tuple(range(15)), tuple(sorted(_cyclic_pairs(15))))}


def test_true_graphs_of_the_tasks():
  truth = {t: bd.true_graph(boolean.get_task(t)) for t in dp.TASKS}
  assert truth == KNOWN
  assert len(KNOWN["cyclic3"].pairs) == 30


def test_a_perfectly_discovered_graph_is_the_true_graph():
  """Route (b) on the target itself, route (a) on a mask that holds the hand-written
  prior: both read the task's graph, written by hand (`KNOWN`, not `true_graph`, which
  reads the same spectrum as route (b)). The prior built from it is the hand-written one
  where the designs agree (2Parity's clique, Cyclic3's windows); Majority's hand-written
  prior also stops the support bits from reading themselves, a choice of its design."""
  for name in ("2parity", "majority3", "cyclic3"):
    task = boolean.get_task(name)
    truth = KNOWN[name]
    _, y_P, _ = boolean.cube_data(task)
    assert bd.graph_from_function(y_P, task.n_bits) == truth, name
    hand_NN = np.asarray(boolean_gotu.task_prior(name, 4.0))
    assert bd.graph_from_masks(hand_NN[None, None]) == truth, name
    built = np.asarray(truth.prior(4.0))
    if name == "majority3":
      differs = np.argwhere(built != hand_NN)
      assert {tuple(d) for d in differs} == {(t, t) for t in (1, 2, 3)}
    else:
      np.testing.assert_array_equal(built, hand_NN)


def test_fourier_route_recovers_a_planted_graph_and_ignores_small_terms():
  n = 8
  x = boolean.cube(n).astype(np.float64)
  f = x[:, 0] * x[:, 1] + 0.5 * x[:, 2] * x[:, 3] * x[:, 4] - 0.3 * x[:, 5]
  f += 0.05 * x[:, 6] * x[:, 7]  # Below 0.1 of the largest coefficient: noise.
  got = bd.graph_from_function(f, n)
  assert got == G(n, (0, 1, 2, 3, 4, 5), ((0, 1), (2, 3), (2, 4), (3, 4)))
  assert bd.graph_from_function(f, n, threshold=0.04).pairs[-1] == (6, 7)
  assert bd.graph_from_function(np.ones(2**n), n).empty  # A constant has no support.
  weights = bd.pair_weights(boolean_fourier.fourier_coefficients(f, n), n)
  assert weights[0, 1] == pytest.approx(1.0) and weights[0, 2] == pytest.approx(0.0)
  assert weights[5, 5] == pytest.approx(0.09)


def test_mask_route_reads_cls_row_and_pairs_per_layer_and_pooled():
  n_bits, n = 5, 6
  closed = np.full((2, 3, n, n), -3.0)  # [L, H, N, N], σ ≈ 0.05 everywhere.
  closed[0, 1, 2, 3] = 2.0          # layer 0, head 1: x1 reads x2.
  closed[1, 0, 0, 5] = 2.0          # layer 1, head 0: CLS reads x4.
  closed[1, 2, 4, 4] = 5.0          # a bit reading itself is no interaction.
  per_layer = bd.mask_graphs(closed)
  assert [len(layer) for layer in per_layer] == [3, 3]
  assert per_layer[0][1] == G(n_bits, (), ((1, 2),)) and per_layer[1][2].empty
  assert bd.graph_from_masks(closed) == G(n_bits, (4,), ((1, 2),))
  assert bd.graph_from_masks(closed, threshold=0.95).empty  # σ(2) = 0.88.
  assert bd.graph_from_masks(closed[0, 1]) == per_layer[0][1]  # One [N, N] mask.
  with pytest.raises(ValueError, match=r"\[\.\.\., N, N\]"):
    bd.graph_from_masks(np.zeros((3, 4)))


def test_scores_and_random_control():
  truth = G(6, (0, 1, 2), ((0, 1), (0, 2), (1, 2)))
  found = G(6, (0, 1, 4), ((0, 1), (1, 4)))
  assert bd.score(found, truth) == {"bit_precision": 2 / 3, "bit_recall": 2 / 3,
                                    "pair_precision": 1 / 2, "pair_recall": 1 / 3}
  assert bd.score(truth, truth) == dict.fromkeys(dp.SCORES, 1.0)
  empty = bd.score(G(6), truth)
  assert empty["bit_precision"] is None and empty["bit_recall"] == 0.0
  assert bd.score(G(6, (0,)), G(6, (0,)))["pair_recall"] is None  # Nothing to find.
  control = bd.random_like(found, 3)
  assert (len(control.bits), len(control.pairs)) == (3, 2)
  assert control == bd.random_like(found, 3)  # Seeded.
  draws = [bd.random_like(found, seed) for seed in range(30)]
  assert {g.bits for g in draws} != {found.bits}  # Random bits, not the graph's ...
  assert set().union(*(g.bits for g in draws)) == set(range(6))  # ... among all of them.
  assert bd.random_like(G(6), 0).empty


def test_a_mean_over_fewer_seeds_says_so():
  """A pair precision is undefined in a seed that found no pair: the table's mean leaves
  that seed out and must say over how many seeds it is."""
  members = [{"task": "t", "scheme": "s", "seed": s, "hparams": {}, "diverged": False,
              "metrics": {"pair_precision": p}} for s, p in enumerate([None, 1.0, 1.0, 0.25])]
  row, = report.summarize(members, ["pair_precision"])
  assert discovery.fmt_stats(row["pair_precision"], False, row["n_seeds"]) == (
      "0.75 ± 0.35 (3 of 4)")
  members[0]["metrics"]["pair_precision"] = 0.5
  row, = report.summarize(members, ["pair_precision"])
  assert discovery.fmt_stats(row["pair_precision"], True, 4) == "68.75 ± 32.48"


# ----------------------------------------------------------------------------- the prior


def test_from_interactions_shapes_and_values():
  graph = np.zeros((5, 5), bool)
  graph[3, 1] = True  # One direction suffices.
  graph[4, 4] = True  # Bit 4 in the support, in no pair.
  prior = priors.from_interactions(graph, 2.5)
  chex.assert_shape(prior, (6, 6))
  chex.assert_type(prior, np.float32)
  allowed = np.asarray(prior) > 0
  assert set(np.unique(np.asarray(prior))) == {-2.5, 2.5}
  np.testing.assert_array_equal(allowed[0], [1, 0, 1, 0, 1, 1])   # CLS reads the support.
  np.testing.assert_array_equal(allowed[2], [1, 0, 1, 0, 1, 0])   # x1 reads x3 ...
  np.testing.assert_array_equal(allowed[4], [1, 0, 1, 0, 1, 0])   # ... and x3 reads x1.
  np.testing.assert_array_equal(allowed[5], [1, 0, 0, 0, 0, 1])   # x4: itself and CLS.
  np.testing.assert_array_equal(allowed[1], [0, 1, 0, 0, 0, 0])   # x0 is not in it.
  chex.assert_shape(priors.from_interactions(graph, cls_token=False), (5, 5))
  np.testing.assert_array_equal(
      priors.from_interactions(graph, suppressed_strength=1.0).min(), -1.0)
  scores = np.where(graph, 0.9, 0.2)  # E.g. a pooled σ(M) over the bits.
  np.testing.assert_array_equal(priors.from_interactions(scores, 2.5, threshold=0.5), prior)
  # The Boolean priors are special cases: 2Parity's clique.
  pair = np.zeros((15, 15), bool)
  pair[0, 1] = True
  np.testing.assert_array_equal(priors.from_interactions(pair), priors.parity_prior(15))


@pytest.mark.parametrize("bad, match", [
    (np.zeros((3, 4), bool), r"square \[U, U\]"),
    (np.zeros((4, 4), bool), "empty"),
    (np.zeros((4, 4)), "threshold"),
])
def test_from_interactions_errors_name_the_fix(bad, match):
  with pytest.raises(ValueError, match=match):
    priors.from_interactions(bad)


# ----------------------------------------------------------------------------- both routes


N_PLANTED = 10
PLANTED = G(N_PLANTED, (0, 1, 2, 3), ((0, 1), (2, 3)))


@pytest.fixture(scope="module")
def planted_stage1():
  """Stage 1 of the experiment on x0x1 + x2x3 over 10 bits (seen: all but x7 = x8 = x9 =
  −1), trained to convergence: the default and the learned member, one seed."""
  boolean.register_task(boolean.make_task(
      "planted_pairs", lambda x: x[:, 0] * x[:, 1] + x[:, 2] * x[:, 3],
      lambda x: ~np.all(x[:, 7:] < 0, axis=1), N_PLANTED, support=(0, 1, 2, 3)))
  config = dp.Config(tasks=("planted_pairs",), schemes=dp.STAGE_1, seeds=1, width=16,
                     depth=2, num_heads=2, head_dim=8, mlp_dim=16, learning_rate=3e-3,
                     epochs=40, batch_size=64, chunk_steps=56, persistence=False)
  group = dp.stage1_group(config, "planted_pairs")
  state, metrics = run.fit(group, config.chunk_steps)
  return group, state, metrics


def test_both_routes_recover_a_planted_graph(planted_stage1):
  group, state, metrics = planted_stage1
  assert [m.scheme for m in group.members] == ["default", "learned"]
  assert all(m["loss_seen"] < 0.05 for m in metrics)  # Both fit the seen data.
  pred = evaluate.eval_values(group, state.params)["pred"]
  assert bd.graph_from_function(pred[0], N_PLANTED) == PLANTED        # (b): the default.
  masks = discovery.mask_logits_LHNN(engine.unstack(state.params, 1))
  chex.assert_shape(masks, (2, 2, N_PLANTED + 1, N_PLANTED + 1))
  assert bd.graph_from_masks(masks) == PLANTED                         # (a): the mask.
  # The pressure closed what the task does not use: irrelevant bits (x4.., tokens 5..)
  # read nothing.
  sigma = jax.nn.sigmoid(masks)
  assert float(sigma[:, :, 1 + 4:, 1:].max()) < 0.5
