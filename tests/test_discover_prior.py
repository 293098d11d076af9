"""The discover_prior experiment: its two stages end to end at the `tiny` preset (stage 2
reads stage 1's checkpoint, fresh and on a resume), the files it writes, and the refusals.
`tiny` (24 steps of a width-16 model) discovers nothing worth training with: it checks the
plumbing, not the method (tests/test_discover.py does)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mpx.experiments.discover_prior as dp
from mpx import checkpoint, priors
from mpx.sweep import config as config_lib
from mpx.sweep import engine, run
from mpx.tasks import boolean, boolean_discover as bd, discover_stages


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("discover_tiny")
  summary = run.run_experiment(dp, preset="tiny", out_dir=str(out))
  return out, summary


def _final(summary, scheme):
  return next(m for m in summary["members"] if m["scheme"] == scheme)


def test_both_stages_train_every_arm(tiny_run):
  out, summary = tiny_run
  assert [(m["task"], m["scheme"]) for m in summary["members"]] == [
      ("2parity", arm) for arm in dp.ARMS]
  groups = {m["scheme"]: m["group"] for m in summary["members"]}
  assert groups["default"] == groups["learned"] == "2parity-stage1"
  assert {groups[a] for a in dp.ARMS[2:]} == {"2parity-stage2"}
  assert (out / "checkpoints" / "2parity-stage1").is_dir()
  # The hand-written prior is the true graph; stage-1 arms train with no graph.
  assert _final(summary, "mask")["metrics"]["pair_recall"] == 1.0
  assert "bit_precision" not in _final(summary, "default")["metrics"]


def test_stage2_trains_with_the_graphs_derived_from_stage1(tiny_run):
  out, summary = tiny_run
  discovered = json.loads((out / dp.DISCOVERED_FILE).read_text())
  assert discovered["thresholds"] == {"mask": bd.MASK_THRESHOLD,
                                      "fourier": bd.FOURIER_THRESHOLD}
  record = discovered["tasks"]["2parity"]
  assert record["truth"] == {"bits": [0, 1], "pairs": [[0, 1]]}
  seed = record["seeds"]["0"]
  assert len(seed["mask_layers"]) == 1 and len(seed["mask_layers"][0]) == 2  # [L][H].
  assert np.asarray(seed["mask_sigma_max"]).shape == (16, 16)
  records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
  trained = {r["scheme"]: r["graph"] for r in records if "graph" in r}
  for arm, key in (("discovered_mask", "mask"), ("discovered_fourier", "fourier"),
                   ("random_mask", "random_mask"), ("random_fourier", "random_fourier")):
    assert trained[arm] == {k: seed[key][k] for k in ("bits", "pairs")}, arm
    metrics = _final(summary, arm)["metrics"]
    assert metrics["graph_bits"] == len(seed[key]["bits"])
    assert metrics["bit_recall"] == seed[key]["bit_recall"]
  assert (out / "plots" / "discovered_2parity.png").stat().st_size > 10_000
  # The graphs are stage 1's trained state, read back from its final checkpoint.
  stage1 = dp.build_groups(config_lib.make_config(dp, "tiny")[1])[0]
  with checkpoint.Checkpointer(out / "checkpoints" / stage1.name, max_to_keep=None) as ckpt:
    assert ckpt.latest_step() == stage1.steps
    state, _ = ckpt.restore_host(engine.init_state(stage1))
  masks = discover_stages.mask_logits_LHNN(engine.unstack(state.params, 1))
  assert np.abs(masks).max() > 0.01  # Trained away from M = 0.
  assert bd.graph_from_masks(masks).to_json() == trained["discovered_mask"]


def test_a_resume_derives_the_graphs_again_from_the_stage1_checkpoint(tiny_run):
  out, summary = tiny_run
  path = out / dp.DISCOVERED_FILE
  before = json.loads(path.read_text())
  path.unlink()  # Nothing of stage 1 is kept but its checkpoint.
  again = run.run_experiment(dp, preset="tiny", out_dir=str(out), resume=True)
  assert json.loads(path.read_text()) == before
  assert again["members"] == summary["members"]


def test_a_resume_refuses_graphs_other_than_stage2_started_with(tiny_run):
  out, _ = tiny_run
  path = out / dp.DISCOVERED_FILE
  before = path.read_text()
  data = json.loads(before)
  fourier = data["tasks"]["2parity"]["seeds"]["0"]["fourier"]
  fourier["bits"] = [] if fourier["bits"] else [3]  # As if recorded by another readout.
  path.write_text(json.dumps(data))
  try:
    with pytest.raises(RuntimeError, match="differs from what stage 2 started with"):
      run.run_experiment(dp, preset="tiny", out_dir=str(out), resume=True)
  finally:
    path.write_text(before)


def test_stage2_starts_from_each_graph_prior_in_every_masked_layer():
  """Graphs with pairs (the tiny run finds none): each derived arm's masks at init are
  its graph's ±strength prior, an empty graph's the neutral mask."""
  config = config_lib.make_config(dp, "tiny", ["depth=2"])[1]
  stage2 = dp.build_groups(config)[1]
  planted = {"mask": bd.InteractionGraph(15, (4,), ((0, 1), (1, 7))),
             "random_mask": bd.InteractionGraph(15, (2,), ((3, 9),)),
             "fourier": bd.InteractionGraph(15, (0, 1), ((0, 1),)),
             "random_fourier": bd.InteractionGraph(15)}
  dp._STAGE1[(config, "2parity")]._derived = {seed: planted for seed in range(config.seeds)}
  state = engine.init_state(stage2)
  derived = [(k, m) for k, m in enumerate(stage2.members) if m.scheme in dp.DERIVED]
  assert len(derived) == len(dp.DERIVED) * config.seeds
  for k, member in derived:
    graph = planted[dp.DERIVED[member.scheme][1]]
    expected = (priors.neutral(16) if graph.empty
                else graph.prior(member.labels["mask_strength"]))
    masks = discover_stages.mask_logits_LHNN(engine.unstack(state.params, k))
    assert masks.shape[0] == config.depth == 2
    np.testing.assert_array_equal(masks, np.broadcast_to(expected, masks.shape))
  np.testing.assert_array_equal(  # Pairs open both ways; (0, 7) is not a pair.
      np.asarray(planted["mask"].prior(4.0))[[1, 2, 2, 8, 1], [2, 1, 8, 2, 8]],
      [4, 4, 4, 4, -4])


def test_the_learned_arm_starts_as_standard_attention():
  """Its init is the default's with M = 0 instead of 200: the same function to float
  rounding (log σ(0) shifts every logit of a row alike), and a mask with a gradient."""
  config = config_lib.make_config(dp, "tiny", ["sparsity=0"])[1]  # The task's gradient alone.
  group = dp._stage1_group(config, "2parity")
  default, learned = (group.task.init(m) for m in group.members)
  x = jnp.asarray(boolean.cube(15)[::97])
  batch = {"x": x, "y": jnp.ones(len(x))}
  predict = jax.jit(lambda p: group.task.eval_step(p, batch)["pred"])
  np.testing.assert_allclose(predict(learned), predict(default), atol=1e-5, rtol=1e-5)
  masks = discover_stages.mask_logits_LHNN(learned)
  np.testing.assert_array_equal(masks, 0.0)
  np.testing.assert_array_equal(discover_stages.mask_logits_LHNN(default), 200.0)
  gradient = jax.jit(jax.grad(lambda p: group.task.loss(p, batch, None)[0]))
  grads = [gradient(p) for p in (default, learned)]
  assert float(np.abs(discover_stages.mask_logits_LHNN(grads[0])).max()) == 0.0
  assert float(np.abs(discover_stages.mask_logits_LHNN(grads[1])).max()) > 0.0
  assert float(discover_stages.sparsity_pressure(learned)) == 0.5


def test_refusals_name_the_fix(tmp_path):
  with pytest.raises(ValueError, match=r"read stage 1's \['learned'\]"):
    config_lib.make_config(dp, "tiny", ["schemes=default,discovered_mask"])
  with pytest.raises(ValueError, match="design clique"):
    config_lib.make_config(dp, "tiny", ["designs=two_hop"])
  boolean.register_task(boolean.make_task(  # No support: no hand-written prior.
      "nothing_known", lambda x: x[:, 0] * x[:, 1], lambda x: x[:, 2] > 0, 15))
  with pytest.raises(ValueError, match="no support"):
    config_lib.make_config(dp, "tiny", ["tasks=nothing_known"])
  config_lib.make_config(dp, "tiny", ["tasks=nothing_known", "schemes=default,learned"])
  with pytest.raises(ValueError, match="one configuration per run folder"):
    run.run_experiment(dp, preset="tiny", out_dir=str(tmp_path / "lr"),
                       overrides=["learning_rate=1e-3,3e-3"])
  group = dp.build_groups(config_lib.make_config(dp, "tiny")[1])[1]
  stage1 = dp.Stage1(config_lib.make_config(dp, "tiny")[1], "2parity", group)
  with pytest.raises(RuntimeError, match="run folder"):
    stage1.graphs()
  stage1.run_dir = tmp_path
  with pytest.raises(RuntimeError, match="no final checkpoint"):
    stage1.graphs()


def test_report_writes_a_table_per_task(tiny_run):
  out, _ = tiny_run
  written = dp.report(out)
  text = (out / dp.REPORT_FILE).read_text()
  assert written[0] == str(out / dp.REPORT_FILE)
  assert "## 2parity" in text and "| discovered_fourier |" in text
  assert "- seed 0, route mask: bits" in text


def test_report_prints_the_fit_each_graph_was_read_from(tiny_run, tmp_path):
  """Route (a) reads the learned model, route (b) the default: their seen accuracies, told
  apart here (the tiny run's are equal), stand beside the graphs."""
  out, _ = tiny_run
  summary = json.loads((out / "summary.json").read_text())
  for m in summary["members"]:
    m["metrics"]["accuracy_seen"] = {"learned": 0.25, "default": 0.75}.get(m["scheme"])
  (tmp_path / "summary.json").write_text(json.dumps(summary))
  (tmp_path / dp.DISCOVERED_FILE).write_text((out / dp.DISCOVERED_FILE).read_text())
  dp.report(tmp_path)
  lines = (tmp_path / dp.REPORT_FILE).read_text().splitlines()
  for route, seen in (("mask", "25.00"), ("fourier", "75.00")):
    line = next(x for x in lines if x.startswith(f"- seed 0, route {route}:"))
    assert line.endswith(f"; read from a model at {seen}% seen accuracy)"), line
