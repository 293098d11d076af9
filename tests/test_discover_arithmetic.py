"""Discovering the digit alignment of addition: the readout, the rows rule, the score and
the control on planted patterns (`mpx.tasks.arithmetic.patterns`), and the
discover_arithmetic experiment end to end at the `tiny` preset (stage 2 reads stage 1's
checkpoint, fresh and on a resume). `tiny` learns nothing: it checks the plumbing."""

import dataclasses
import json

import jax
import numpy as np
import pytest

import mpx.experiments.discover_arithmetic as da
from mpx import checkpoint
from mpx.sweep import config as config_lib
from mpx.sweep import engine, run
from mpx.tasks import arithmetic, discovery
from mpx.tasks.arithmetic import discover as study
from mpx.tasks.arithmetic import patterns as ad

SPEC = arithmetic.get_task("addition", 3, reverse_answer=False)  # The quick run's format.
N = SPEC.n_tokens
# Tokens BOS a2 a1 a0 + b2 b1 b0 = c3 c2 c1 c0 (0..12); rows 8..11 predict c3..c0. The
# alignment by hand: `=`→a2,b2; c3→a2,a1,b2,b1; c2→a1,a0,b1,b0; c1→a0,b0.
ANSWER_ROWS = (8, 9, 10, 11)
HAND_ENTRIES = [[8, 1], [8, 5], [9, 1], [9, 2], [9, 5], [9, 6], [10, 2], [10, 3],
                [10, 6], [10, 7], [11, 3], [11, 7]]


def _planted_LHNN(open_NN, spread=True):
  """Logits [2, 2, N, N] at −3 (closed) with each open entry at +2 in one layer and head
  (spread over all four), and +5 on every future key (the causal mask hides them)."""
  masks = np.full((2, 2, N, N), -3.0)
  masks[:, :, ~np.tri(N, dtype=bool)] = 5.0
  for k, (i, j) in enumerate(zip(*np.nonzero(open_NN))):
    layer, head = divmod(k % 4, 2) if spread else (0, 0)
    masks[layer, head, i, j] = 2.0
  return masks


def test_the_readout_recovers_a_planted_alignment_and_scores_it():
  hand_NN = ad.alignment_NN(SPEC)
  planted_NN = hand_NN & ad.candidates_NN(SPEC)
  assert planted_NN.sum() == 12  # `=`→a2,b2; c3→a2,a1,b2,b1; c2→a1,a0,b1,b0; c1→a0,b0.
  found_NN = ad.open_from_masks(_planted_LHNN(planted_NN))
  np.testing.assert_array_equal(found_NN, planted_NN)
  assert ad.score(found_NN, SPEC) == {"precision": 1.0, "recall": 1.0, "n_open": 12}
  # [L, N, N] (a mask shared by the heads) reads alike; each layer holds part of it.
  shared = _planted_LHNN(planted_NN).max(1)
  np.testing.assert_array_equal(ad.open_from_masks(shared), planted_NN)
  per_layer = ad.open_per_mask(_planted_LHNN(planted_NN)).any(1)
  assert 0 < per_layer[0].sum() < 12 and (per_layer[0] | per_layer[1]).sum() == 12
  # One aligned entry missed, two spurious ones (one a prompt row's, which is not scored).
  wrong_NN = planted_NN.copy()
  wrong_NN[8, 1] = False
  wrong_NN[11, 0] = wrong_NN[3, 1] = True
  wrong = ad.score(ad.open_from_masks(_planted_LHNN(wrong_NN)), SPEC)
  assert wrong == {"precision": 11 / 12, "recall": 11 / 12, "n_open": 12}
  assert ad.score(np.zeros((N, N), bool), SPEC) == {"precision": None, "recall": 0.0,
                                                    "n_open": 0}
  # At σ(M) = 1/2 exactly (the init) an entry is not open.
  assert not ad.open_from_masks(np.zeros((1, 1, N, N))).any()
  with pytest.raises(ValueError, match=r"\[\.\.\., N, N\]"):
    ad.open_from_masks(np.zeros((N, N + 1)))
  with pytest.raises(ValueError, match="boolean"):
    ad.score(np.ones((N - 1, N - 1), bool), SPEC)


def test_a_perfect_discovery_gives_the_hand_written_prior():
  hand_NN = ad.alignment_NN(SPEC)
  rows_N = arithmetic.answer_rows_N(SPEC)
  np.testing.assert_array_equal(np.flatnonzero(rows_N), [8, 9, 10, 11])
  for found_NN in (hand_NN & ad.candidates_NN(SPEC), hand_NN):  # With or without self.
    prior_NN = np.asarray(ad.discovered_prior(SPEC, found_NN, 4.0))
    hand_prior_NN = np.asarray(arithmetic.prior(SPEC, 4.0))
    np.testing.assert_array_equal(prior_NN[rows_N], hand_prior_NN[rows_N])
    np.testing.assert_array_equal(prior_NN, hand_prior_NN)  # Other rows: open, causal.
  # Nothing found: each scored row reads only itself; the others stay open.
  empty_NN = ad.prior_pattern_NN(SPEC, np.zeros((N, N), bool))
  np.testing.assert_array_equal(empty_NN[rows_N], np.eye(N, dtype=bool)[rows_N])
  np.testing.assert_array_equal(empty_NN[~rows_N], np.tri(N, dtype=bool)[~rows_N])
  # A future key found stays closed.
  future_NN = np.zeros((N, N), bool)
  future_NN[8, 12] = True
  assert not ad.prior_pattern_NN(SPEC, future_NN)[8, 12]


def test_the_random_control_keeps_each_rows_count_and_stays_causal():
  rng = np.random.default_rng(0)
  found_NN = (rng.random((N, N)) < 0.5) & ad.candidates_NN(SPEC)
  found_NN[9] = ad.candidates_NN(SPEC)[9]  # A full row: the control must take all of it.
  found_NN[10] = False  # An empty row stays empty.
  drawn_NN = ad.random_like(found_NN, SPEC, [0, 1])
  np.testing.assert_array_equal(drawn_NN.sum(1), found_NN.sum(1))
  assert not (drawn_NN & ~ad.candidates_NN(SPEC)).any()  # Causal, no self, scored rows.
  np.testing.assert_array_equal(drawn_NN[9], found_NN[9])
  np.testing.assert_array_equal(ad.random_like(found_NN, SPEC, [0, 1]), drawn_NN)
  assert not np.array_equal(ad.random_like(found_NN, SPEC, [1, 1]), drawn_NN)
  assert ad.score(drawn_NN, SPEC)["n_open"] == int(found_NN.sum())


def test_stage_inits_are_arithmetics_and_the_learned_arm_starts_at_m0():
  """default and mask are arithmetic's members (the same init); learned is default's
  params with the learnable neutral mask."""
  config = config_lib.make_config(da, "tiny")[1]
  stage1, stage2 = da.build_groups(config)
  assert (stage1.name, stage2.name) == ("addition-stage1", "addition-stage2")
  reference = arithmetic.make_task(config, arithmetic.get_task(
      "addition", config.digits, reverse_answer=config.reverse_answer))
  by_arm = {m.scheme: m for g in (stage1, stage2) for m in g.members}
  # The same members as `mpx run arithmetic` trains (hparams, labels, seeds).
  theirs = arithmetic.members(config, "addition", study.fraction(config, "addition"))
  for arm in ("default", "mask"):
    assert [m for m in stage1.members + stage2.members if m.scheme == arm] == [
        m for m in theirs if m.scheme == arm]
  assert by_arm["default"].hparams["mask_lr_multiplier"] == 0.0
  assert by_arm["learned"].hparams["mask_lr_multiplier"] == config.discover_mask_lr_multiplier
  for arm, group in (("default", stage1), ("mask", stage2)):
    got, want = group.task.init(by_arm[arm]), reference.init(by_arm[arm])
    for a, b in zip(*(jax.tree_util.tree_leaves(t) for t in (got, want))):
      np.testing.assert_array_equal(a, b)
  learned = stage1.task.init(by_arm["learned"])
  np.testing.assert_array_equal(discovery.mask_logits_LHNN(learned), 0.0)
  assert float(discovery.sparsity_pressure(learned)) == 0.5



def test_persistence_false_trains_both_stages_without_the_probe():
  """tiny's smoke test skips the persistence diagnostics; the default keeps them."""
  for setting, probed in (("persistence=False", False), ("persistence=True", True)):
    groups = da.build_groups(config_lib.make_config(da, "tiny", [setting])[1])
    assert [g.probe is not None for g in groups] == [probed, probed], setting


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("discover_arith_tiny")
  return out, run.run_experiment(da, preset="tiny", out_dir=str(out))


def test_the_tiny_run_trains_both_stages_from_the_discovered_pattern(tiny_run):
  out, summary = tiny_run
  assert [(m["group"], m["scheme"]) for m in summary["members"]] == [
      ("addition-stage1", "default"), ("addition-stage1", "learned"),
      ("addition-stage2", "mask"), ("addition-stage2", "discovered_mask"),
      ("addition-stage2", "random_mask")]
  discovered = json.loads((out / da.DISCOVERED_FILE).read_text())
  record = discovered["tasks"]["addition"]
  seed = record["seeds"]["0"]
  assert seed["found"]["n_open"] > 0  # Else the equalities below hold vacuously.
  assert np.asarray(seed["sigma"]).shape == (1, 2, N, N)  # [L, H, N, N] of tiny.
  # The expected patterns, known without the code that made them: the hand-written
  # alignment by hand, and the discovered one read here from stage 1's final checkpoint
  # (σ(M) > 1/2 in any layer and head, on the answer rows' past keys).
  assert HAND_ENTRIES == [[i, j] for i in ANSWER_ROWS for j in range(i)
                          if np.asarray(arithmetic.prior(SPEC, 4.0))[i, j] > 0]
  config = config_lib.make_config(da, "tiny")[1]
  stage1, stage2 = da.build_groups(config)
  with checkpoint.Checkpointer(out / "checkpoints" / stage1.name, max_to_keep=None) as ckpt:
    assert ckpt.latest_step() == stage1.steps
    state, _ = ckpt.restore_host(engine.init_state(stage1))
  assert [m.scheme for m in stage1.members] == ["default", "learned"]
  masks = discovery.mask_logits_LHNN(engine.unstack(state.params, 1))
  assert np.abs(masks).max() > 0.01  # Trained away from M = 0.
  open_NN = (1 / (1 + np.exp(-np.asarray(masks, np.float64))) > 0.5).any((0, 1))
  found = [[i, j] for i in ANSWER_ROWS for j in range(i) if open_NN[i, j]]
  assert found and found != HAND_ENTRIES  # Else swapping the two patterns would pass.
  records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
  trained = {r["scheme"]: r["pattern"] for r in records if "pattern" in r}
  assert trained["mask"] == record["hand_written"]["entries"] == HAND_ENTRIES
  assert trained["discovered_mask"] == seed["found"]["entries"] == found
  assert trained["random_mask"] == seed["random"]["entries"]
  assert ad.entries(ad.open_from_masks(masks), SPEC) == found
  # The control: as many entries per answer row as found there, among its past keys.
  random = trained["random_mask"]
  assert all(i in ANSWER_ROWS and 0 <= j < i for i, j in random), random
  assert len({tuple(e) for e in random}) == len(random)
  row_count = lambda pattern: [sum(i == row for i, _ in pattern) for row in ANSWER_ROWS]
  assert row_count(random) == row_count(found)
  final = {m["scheme"]: m["metrics"] for m in summary["members"]}
  hand = {tuple(e) for e in HAND_ENTRIES}
  for arm, pattern in (("mask", HAND_ENTRIES), ("discovered_mask", found),
                       ("random_mask", random)):
    hits = len(hand & {tuple(e) for e in pattern})
    assert final[arm]["n_open"] == len(pattern), arm
    assert final[arm]["recall"] == pytest.approx(hits / len(HAND_ENTRIES)), arm
    assert final[arm]["precision"] == pytest.approx(hits / len(pattern)), arm
  assert final["mask"]["precision"] == final["mask"]["recall"] == 1.0
  assert "precision" not in final["default"]
  # What each stage-2 member trained with: its final masks (±4 at init, 20 small steps
  # since) are positive, in every layer and head, exactly on its pattern's entries.
  default_init = stage1.task.init  # Only the param tree: stage 2's init rederives patterns.
  template = dataclasses.replace(stage2, task=dataclasses.replace(
      stage2.task, init=lambda m: default_init(dataclasses.replace(m, scheme="default"))))
  with checkpoint.Checkpointer(out / "checkpoints" / stage2.name, max_to_keep=None) as ckpt:
    state2, _ = ckpt.restore_host(engine.init_state(template))
  expected = {"mask": HAND_ENTRIES, "discovered_mask": found, "random_mask": random}
  for i, member in enumerate(stage2.members):
    masks2 = discovery.mask_logits_LHNN(engine.unstack(state2.params, i))
    positive_NN = (np.asarray(masks2) > 0).all((0, 1))
    assert [[r, k] for r in ANSWER_ROWS for k in range(r) if positive_NN[r, k]] == expected[
        member.scheme], member.scheme
  assert (out / "plots" / "discovered_addition.png").stat().st_size > 10_000
  recorded = (out / da.DISCOVERED_FILE).stat().st_mtime_ns
  written = da.report(out)
  assert (out / da.DISCOVERED_FILE).stat().st_mtime_ns == recorded  # Only read.
  text = (out / da.REPORT_FILE).read_text()
  assert written[0] == str(out / da.REPORT_FILE)
  assert "| discovered_mask |" in text and "- seed 0, pooled: precision" in text
  assert "Accuracy per answer digit" in text and "| random_mask | 0 |" in text


def test_a_resume_derives_the_pattern_again_from_the_stage1_checkpoint(tiny_run):
  out, summary = tiny_run
  path = out / da.DISCOVERED_FILE
  before = json.loads(path.read_text())
  path.unlink()  # Nothing of stage 1 is kept but its checkpoint.
  again = run.run_experiment(da, preset="tiny", out_dir=str(out), resume=True)
  assert json.loads(path.read_text()) == before
  assert again["members"] == summary["members"]
  data = json.loads(path.read_text())
  data["tasks"]["addition"]["seeds"]["0"]["random"]["entries"] = [[1, 0]]  # Not trained with.
  path.write_text(json.dumps(data))
  try:
    with pytest.raises(RuntimeError, match="differs from what stage 2 started with"):
      run.run_experiment(da, preset="tiny", out_dir=str(out), resume=True)
  finally:
    path.write_text(json.dumps(before))


def test_refusals_name_the_fix(tmp_path):
  with pytest.raises(ValueError, match="add learned to schemes"):
    config_lib.make_config(da, "tiny", ["schemes=default,mask,discovered_mask"])
  with pytest.raises(ValueError, match="one data fraction per run folder"):
    config_lib.make_config(da, "tiny", ["fractions=0.002,0.004"])
  with pytest.raises(ValueError, match=r"mask_threshold=1.0 must be in \(0, 1\)"):
    config_lib.make_config(da, "tiny", ["mask_threshold=1"])
  config = config_lib.make_config(da, "tiny")[1]
  for run_dir, match in ((None, "run folder"), (tmp_path, "no final checkpoint")):
    stage2 = da.build_groups(config, run_dir=run_dir)[1]  # Its inits read stage 1.
    derived = next(m for m in stage2.members if m.scheme == "discovered_mask")
    with pytest.raises(RuntimeError, match=match):
      stage2.task.init(derived)
