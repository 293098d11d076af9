"""The discover_boolean experiment (`mpx.tasks.boolean.discover`): its two stages end to end at the `tiny` preset (stage 2
reads stage 1's checkpoint, fresh and on a resume), the files it writes, and the refusals.
`tiny` (12 steps of a one-head width-8 model) discovers nothing worth training with: it checks the
plumbing, not the method (tests/test_discover.py does)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mpx.experiments.discover_boolean as dp
from mpx import checkpoint, priors
from mpx.sweep import config as config_lib
from mpx.sweep import engine, run, stages
from mpx.tasks import boolean
from mpx.tasks.boolean import graphs as bd
from mpx.tasks.boolean import discover as study
from mpx.tasks.boolean import gotu
from mpx.tasks import discovery


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
      ("2parity", arm) for arm in study.ARMS]
  groups = {m["scheme"]: m["group"] for m in summary["members"]}
  assert groups["default"] == groups["learned"] == "2parity-stage1"
  assert {groups[a] for a in study.ARMS[2:]} == {"2parity-stage2"}
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
  assert len(seed["mask_layers"]) == 1 and len(seed["mask_layers"][0]) == 1  # [L][H].
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
  masks = discovery.mask_logits_LHNN(engine.unstack(state.params, 1))
  assert np.abs(masks).max() > 0.01  # Trained away from M = 0.
  assert bd.graph_from_masks(masks).to_json() == trained["discovered_mask"]
  # Route (b) recomputed here, not by boolean_fourier / boolean_discover: the default
  # member's output on the cube, its Walsh-Hadamard spectrum, every coefficient at least
  # 0.1 of the largest non-constant one.
  config = config_lib.make_config(dp, "tiny")[1]
  x_PN = 2 * ((np.arange(2**15)[:, None] >> np.arange(15)) & 1) - 1  # Row r: bit i of r.
  model = gotu.make_model(config)
  apply = jax.jit(lambda p, t: model.apply({"params": p}, t)[:, 0])
  pred = np.asarray(apply(engine.unstack(state.params, 0), jnp.asarray((x_PN + 1) // 2)),
                    np.float64)
  c = pred.reshape([2] * 15)
  for axis in range(15):
    c = np.stack([np.take(c, 0, axis) + np.take(c, 1, axis),
                  np.take(c, 0, axis) - np.take(c, 1, axis)], axis)
  size = np.abs(c.reshape(-1))
  size[0] = 0.0
  relative = size / size.max()
  assert np.abs(relative - 0.1).min() > 1e-3  # No coefficient on the cut: a clear reading.
  subsets = [[i for i in range(15) if s >> i & 1] for s in np.flatnonzero(relative >= 0.1)]
  assert trained["discovered_fourier"] == {
      "bits": sorted({b for subset in subsets for b in subset}),
      "pairs": [[i, j] for i, j in sorted(
          {(i, j) for subset in subsets for i in subset for j in subset if i < j})]}


def _open_pattern(bits, pairs):
  """The sign pattern of a graph's prior over CLS + 15 bit tokens, by hand: CLS and each
  support bit read each other, paired bits read each other, every token itself."""
  open_NN = np.eye(16, dtype=bool)
  for b in bits:
    open_NN[0, b + 1] = open_NN[b + 1, 0] = True
  for i, j in pairs:
    open_NN[i + 1, j + 1] = open_NN[j + 1, i + 1] = True
  return open_NN


def test_stage2_reads_the_graphs_planted_in_stage1(tmp_path, monkeypatch):
  """Stage 1's final state planted with known graphs (with pairs): the learned member's
  mask opens CLS→x1, x3 in head 0 and x1→x3 in head 1 (route (a): bits {1, 3}, pair
  (1, 3)); the default member's output is x0·x1 + 0.3·x5 (route (b): bits {0, 1, 5}, pair
  (0, 1)). 2Parity's true graph is bits {0, 1}, pair (0, 1). Stage 2 reads the planted
  checkpoint as a run does, records and scores the graphs, and starts from their priors.
  Two heads, so that route (a) reads their union (tiny has one)."""
  config = config_lib.make_config(dp, "tiny", ["num_heads=2", "head_dim=4"])[1]
  planted_fn = lambda params, batch: {"pred": batch["x"][:, 0] * batch["x"][:, 1]
                                      + 0.3 * batch["x"][:, 5]}
  real = study.stage1_group
  monkeypatch.setattr(study, "stage1_group", lambda *a: (lambda g: dataclasses.replace(
      g, task=dataclasses.replace(g.task, eval_step=planted_fn)))(real(*a)))
  stage1, stage2 = dp.build_groups(config, run_dir=tmp_path)
  assert [m.scheme for m in stage1.members] == ["default", "learned"]
  state = engine.init_state(stage1)
  planted_HNN = np.full((2, 16, 16), -6.0, np.float32)  # Token 0 is CLS, token b + 1 bit b.
  planted_HNN[0, 0, [2, 4]] = 3.0
  planted_HNN[1, 2, 4] = 3.0

  def plant(path, leaf):
    if "mask_logits" not in jax.tree_util.keystr(path):
      return leaf
    leaf = np.array(leaf)
    leaf[1] = planted_HNN
    return leaf

  state = state._replace(params=jax.tree_util.tree_map_with_path(plant, state.params))
  with checkpoint.Checkpointer(tmp_path / "checkpoints" / stage1.name, max_to_keep=None) as ckpt:
    ckpt.save(stage1.steps, state, {})
  state2 = engine.init_state(stage2)  # Stage 2's init derives the graphs.

  record = json.loads((tmp_path / dp.DISCOVERED_FILE).read_text())["tasks"]["2parity"]
  assert record["truth"] == {"bits": [0, 1], "pairs": [[0, 1]]}
  seed = record["seeds"]["0"]
  assert seed["mask_layers"] == [[{"bits": [1, 3], "pairs": []},
                                  {"bits": [1, 3], "pairs": [[1, 3]]}]]
  assert seed["mask"] == {"bits": [1, 3], "pairs": [[1, 3]], "bit_precision": 0.5,
                          "bit_recall": 0.5, "pair_precision": 0.0, "pair_recall": 0.0}
  assert seed["fourier"] == {"bits": [0, 1, 5], "pairs": [[0, 1]],
                             "bit_precision": pytest.approx(2 / 3), "bit_recall": 1.0,
                             "pair_precision": 1.0, "pair_recall": 1.0}
  for route, (n_bits, n_pairs) in (("mask", (2, 1)), ("fourier", (3, 1))):
    control = seed[f"random_{route}"]
    assert (len(control["bits"]), len(control["pairs"])) == (n_bits, n_pairs), control
    assert {b for p in control["pairs"] for b in p} <= set(control["bits"])
  expected = {"mask": ([0, 1], [[0, 1]]), "discovered_mask": ([1, 3], [[1, 3]]),
              "discovered_fourier": ([0, 1, 5], [[0, 1]]),
              "random_mask": (seed["random_mask"]["bits"], seed["random_mask"]["pairs"]),
              "random_fourier": (seed["random_fourier"]["bits"],
                                 seed["random_fourier"]["pairs"])}
  for k, member in enumerate(stage2.members):
    masks = discovery.mask_logits_LHNN(engine.unstack(state2.params, k))
    want_NN = _open_pattern(*expected[member.scheme])
    np.testing.assert_array_equal(masks > 0, np.broadcast_to(want_NN, masks.shape),
                                  err_msg=member.scheme)


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


def test_stage2_starts_from_each_graph_prior_in_every_masked_layer(monkeypatch):
  """Graphs with pairs (the tiny run finds none): each derived arm's masks at init are
  its graph's ±strength prior, an empty graph's the neutral mask."""
  config = config_lib.make_config(dp, "tiny", ["depth=2"])[1]
  planted = {"mask": bd.InteractionGraph(15, (4,), ((0, 1), (1, 7))),
             "random_mask": bd.InteractionGraph(15, (2,), ((3, 9),)),
             "fourier": bd.InteractionGraph(15, (0, 1), ((0, 1),)),
             "random_fourier": bd.InteractionGraph(15)}
  # Stage 1's reading planted: no checkpoint is restored, these graphs are read.
  monkeypatch.setattr(stages, "restore_final", lambda *a: None)
  monkeypatch.setattr(study, "read_graphs",
                      lambda *a: {seed: planted for seed in range(config.seeds)})
  stage2 = dp.build_groups(config)[1]
  state = engine.init_state(stage2)
  derived = [(k, m) for k, m in enumerate(stage2.members) if m.scheme in study.DERIVED]
  assert len(derived) == len(study.DERIVED) * config.seeds
  for k, member in derived:
    graph = planted[study.DERIVED[member.scheme][1]]
    expected = (priors.neutral(16) if graph.empty
                else graph.prior(member.labels["mask_strength"]))
    masks = discovery.mask_logits_LHNN(engine.unstack(state.params, k))
    assert masks.shape[0] == config.depth == 2
    np.testing.assert_array_equal(masks, np.broadcast_to(expected, masks.shape))
  np.testing.assert_array_equal(  # Pairs open both ways; (0, 7) is not a pair.
      np.asarray(planted["mask"].prior(4.0))[[1, 2, 2, 8, 1], [2, 1, 8, 2, 8]],
      [4, 4, 4, 4, -4])


def test_the_learned_arm_starts_as_standard_attention():
  """Its init is the default's with M = 0 instead of 200: the same function to float
  rounding (log σ(0) shifts every logit of a row alike), and a mask with a gradient."""
  config = config_lib.make_config(dp, "tiny", ["sparsity=0"])[1]  # The task's gradient alone.
  group = study.stage1_group(config, "2parity")
  default, learned = (group.task.init(m) for m in group.members)
  x = jnp.asarray(boolean.cube(15)[::97])
  batch = {"x": x, "y": jnp.ones(len(x))}
  predict = jax.jit(lambda p: group.task.eval_step(p, batch)["pred"])
  np.testing.assert_allclose(predict(learned), predict(default), atol=1e-5, rtol=1e-5)
  masks = discovery.mask_logits_LHNN(learned)
  np.testing.assert_array_equal(masks, 0.0)
  np.testing.assert_array_equal(discovery.mask_logits_LHNN(default), 200.0)
  gradient = jax.jit(jax.grad(lambda p: group.task.loss(p, batch, None)[0]))
  grads = [gradient(p) for p in (default, learned)]
  assert float(np.abs(discovery.mask_logits_LHNN(grads[0])).max()) == 0.0
  assert float(np.abs(discovery.mask_logits_LHNN(grads[1])).max()) > 0.0
  assert float(discovery.sparsity_pressure(learned)) == 0.5


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
  config = config_lib.make_config(dp, "tiny")[1]
  for run_dir, match in ((None, "run folder"), (tmp_path, "no final checkpoint")):
    stage2 = dp.build_groups(config, run_dir=run_dir)[1]  # Its inits read stage 1.
    derived = next(m for m in stage2.members if m.scheme == "discovered_mask")
    with pytest.raises(RuntimeError, match=match):
      stage2.task.init(derived)


def test_the_old_name_runs_the_experiment_and_its_folders_resume(capsys):
  """discover_prior (the name before) loads discover_boolean and says so in one line; a
  run folder written under the old name is the same run."""
  assert config_lib.load_experiment("discover_prior").NAME == "discover_boolean"
  assert capsys.readouterr().err == (
      "discover_prior is now called discover_boolean; running that.\n")
  saved = {"experiment": "discover_boolean", "preset": "tiny", "config": {"seeds": 1}}
  assert run._config_differences(dict(saved, experiment="discover_prior"), saved) == []
  assert run._config_differences(dict(saved, experiment="boolean_gotu"), saved) == [
      "experiment"]


def test_report_writes_a_table_per_task(tiny_run):
  """Each arm's row and each route's line hold the graph it trained with, its precision /
  recall against 2Parity's true graph (bits {0, 1}, pair (0, 1)) computed here, and the
  seen accuracy of the stage-1 model it was read from."""
  out, summary = tiny_run
  written = dp.report(out)
  lines = (out / dp.REPORT_FILE).read_text().splitlines()
  assert written[0] == str(out / dp.REPORT_FILE)
  assert "## 2parity" in lines and "True graph: bits [0, 1], 1 pairs." in lines
  seed = json.loads((out / dp.DISCOVERED_FILE).read_text())["tasks"]["2parity"]["seeds"]["0"]
  final = {m["scheme"]: m["metrics"] for m in summary["members"]}
  cell = lambda x: "—" if x is None else f"{x:.2f}"

  def scores(graph):
    bits, pairs = set(graph["bits"]), {tuple(p) for p in graph["pairs"]}
    bit_hits, pair_hits = len(bits & {0, 1}), len(pairs & {(0, 1)})
    return [bit_hits / len(bits) if bits else None, bit_hits / 2,
            pair_hits / len(pairs) if pairs else None, pair_hits / 1]

  graphs = {"mask": {"bits": [0, 1], "pairs": [[0, 1]]}, "discovered_mask": seed["mask"],
            "random_mask": seed["random_mask"], "discovered_fourier": seed["fourier"],
            "random_fourier": seed["random_fourier"]}
  for arm, graph in graphs.items():
    unseen = 100 * final[arm]["accuracy_unseen"]
    row = " | ".join([arm, f"{unseen:.2f} ± 0.00",
                      *("—" if x is None else f"{x:.2f} ± 0.00" for x in scores(graph)),
                      f"{unseen:.2f}"])
    assert f"| {row} |" in lines, (row, lines)
  for route, arm in (("mask", "learned"), ("fourier", "default")):
    graph = seed[route]
    names = ("bit precision", "bit recall", "pair precision", "pair recall")
    line = (f"- seed 0, route {route}: bits {graph['bits']}, pairs "
            f"{[tuple(p) for p in graph['pairs']]} ("
            + "; ".join(f"{n} {cell(x)}" for n, x in zip(names, scores(graph)))
            + f"; read from a model at {100 * final[arm]['accuracy_seen']:.2f}% seen accuracy)")
    assert line in lines, (line, lines)


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
