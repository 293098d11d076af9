"""The planted benchmark (`mpx.tasks.boolean.planted`, experiment discover_planted): the
task list is fixed and recorded, each task's hand-written prior is its true graph, the
support control, the report's definitions, and one tiny run of both stages (shared by
the module) in which no unseen label reaches stage 1 or the reading of a graph."""

import dataclasses
import hashlib
import itertools
import json
import pathlib
import re

import numpy as np
import pytest

from mpx.sweep import config as config_lib
from mpx.sweep import run
from mpx.tasks import boolean
from mpx.tasks.boolean import discover, gotu, graphs, planted

EXPERIMENT = config_lib.load_experiment("discover_planted")
TASK = "p01_chain15"
SCRAMBLED = TASK + "_unseen_scrambled"


def test_the_benchmark_is_fixed_in_code():
  """≥ 20 tasks of the generator's seed, every kind, n in range; the golden digest of the
  definitions changes with any task (then every recorded result is void)."""
  assert len(planted.SPECS) >= 20 and len(set(planted.TASK_NAMES)) == len(planted.SPECS)
  assert {s.kind for s in planted.SPECS} == set(planted.KINDS)
  assert all(planted.N_BITS[0] <= s.n_bits <= planted.N_BITS[1] for s in planted.SPECS)
  assert planted.generate() == planted.SPECS  # Reproducible from the seed.
  assert planted.generate(planted.GENERATOR_SEED + 1) != planted.SPECS
  digest = hashlib.sha256(json.dumps({s.name: s.to_json() for s in planted.SPECS},
                                     sort_keys=True).encode()).hexdigest()[:16]
  assert digest == planted.digest() == "adf9bc8e9aaaa383"
  names = boolean.task_names()  # Known by name, after the coverage study's.
  start = names.index(planted.TASK_NAMES[0])
  assert names[start:start + len(planted.SPECS)] == planted.TASK_NAMES
  with pytest.raises(ValueError, match="built-in"):
    boolean.register_task(dataclasses.replace(boolean.get_task(TASK)))


def test_the_repository_names_only_the_benchmark_s_tasks():
  """A task's name holds its index, kind and bit count (`p00_sparse17`): one typed into a
  docstring, a docs page or a results file must be a task of the benchmark."""
  root = pathlib.Path(__file__).parents[1]
  files = [*root.glob("*.md"), *root.glob("docs/*.md"), *root.glob("experiments/**/*.py"),
           *root.glob("experiments/**/*.md"), *root.glob("mpx/**/*.py")]
  named = {(str(f.relative_to(root)), name) for f in files
           for name in re.findall(r"\bp\d\d_[a-z]+\d\d\b", f.read_text())}
  assert len(named) > 20  # The pattern finds the names.
  assert {(f, name) for f, name in named if name not in planted.TASK_NAMES} == set()


@pytest.mark.parametrize("name", planted.TASK_NAMES)
def test_each_task_s_hand_written_prior_is_its_true_graph(name):
  spec, task = planted.TASKS[name], boolean.get_task(name)
  truth = graphs.true_graph(task)
  hand = graphs.graph_from_open(np.asarray(gotu.task_prior(task, 1.0)) > 0)
  assert hand == truth == graphs.InteractionGraph(spec.n_bits, spec.support, spec.pairs)
  _, y_P, seen_P = boolean.cube_data(task)
  assert not np.any(y_P == 0)  # Sign accuracy is defined on every point.
  assert seen_P.mean() == spec.seen_share and set(spec.seen_bits) <= set(spec.support)
  assert len(spec.support) >= 4 and len(spec.pairs) >= 3  # Not a small clique.
  if spec.kind == "sparse":
    assert len(spec.terms) == 3 and 2 <= len(spec.pairs) <= 6
  elif spec.kind == "chain":  # A path: two ends, every other bit in two pairs.
    degree = np.bincount(np.ravel(spec.pairs), minlength=spec.n_bits)[list(spec.support)]
    assert sorted(degree) == [1, 1] + [2] * (len(spec.support) - 2)
  elif spec.kind == "junta":
    assert spec.threshold and len(spec.pairs) == len(spec.support) * (len(spec.support) - 1) // 2


def test_support_like_keeps_the_true_bits_and_draws_pairs_among_them():
  truth = graphs.InteractionGraph(16, (1, 4, 7, 9), ((1, 4), (7, 9)))
  found = graphs.InteractionGraph(16, (0, 1, 2, 3, 5), ((0, 1), (2, 3), (3, 5)))
  control = graphs.support_like(found, truth, [3, 7])
  assert control.bits == truth.bits and len(control.pairs) == 3
  assert set(control.pairs) <= set(itertools.combinations(truth.bits, 2))
  assert control == graphs.support_like(found, truth, [3, 7])  # Seeded.
  assert {graphs.support_like(found, truth, [s, 7]) for s in range(10)} != {control}
  many = graphs.InteractionGraph(16, (), tuple(itertools.combinations(range(8), 2)))
  assert len(graphs.support_like(many, truth, 0).pairs) == 6  # Capped at what exists.
  with pytest.raises(ValueError, match="no support bit"):
    graphs.support_like(found, graphs.InteractionGraph(16), 0)


def test_recovery_is_the_stated_share_of_the_true_gain():
  assert planted.recovered(0.9, 0.0, 1.0) is True  # (route − default) >= 0.9 (true − default)
  assert planted.recovered(0.89, 0.0, 1.0) is False
  assert planted.recovered(0.9, 0.0, planted.GAIN_MARGIN) is None  # Gain <= margin: not counted.
  assert planted.recovered(0.9, 0.0, 0.06) is True
  member = lambda task, arm, seed, acc, **s: {"task": task, "scheme": arm, "seed": seed,
                                               "metrics": {"accuracy_unseen": acc, **s}}
  scores = dict(bit_precision=1.0, bit_recall=1.0, pair_precision=0.5, pair_recall=1.0)
  summary = {"members": [
      member("a", "default", 0, 0.2), member("a", "mask", 0, 1.0),
      member("a", "discovered_fourier", 0, 0.95, **scores),
      member("b", "default", 0, 0.9), member("b", "mask", 0, 0.92),
      member("b", "discovered_fourier", 0, 0.5, **scores)]}
  (row,) = planted.route_rows(summary)
  assert (row["arm"], row["n"], row["eligible"], row["recovered"]) == (
      "discovered_fourier", 2, 1, 1)
  assert row["pair_precision"] == 0.5 and row["exact"] == 0
  assert row["minus_default"] == pytest.approx((0.75 - 0.4) / 2)
  assert [r["default_extrapolates"] for r in planted.task_rows(summary)] == [False, True]


def _scrambled(task: boolean.BooleanTask) -> boolean.BooleanTask:
  """`task` with the labels of its unseen points permuted among them and negated."""
  _, y_P, seen_P = boolean.cube_data(task)
  unseen = np.flatnonzero(~seen_P)
  y2_P = y_P.copy()
  y2_P[unseen] = -y_P[np.random.default_rng(0).permutation(unseen)]
  weights_N = 1 << np.arange(task.n_bits)
  return boolean.make_task(
      SCRAMBLED, lambda x_PN: y2_P[((np.asarray(x_PN) > 0) * weights_N).sum(1)], task.seen,
      task.n_bits, protocol=task.protocol, train_size=task.train_size,
      integer_valued=task.integer_valued, support=task.support,
      interaction_groups=task.interaction_groups)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """The tiny preset on one planted task and its twin with scrambled unseen labels."""
  boolean.register_task(_scrambled(boolean.get_task(TASK)))
  out = tmp_path_factory.mktemp("planted_tiny")
  summary = run.run_experiment(EXPERIMENT, preset="tiny", out_dir=str(out),
                               overrides=[f"tasks={TASK},{SCRAMBLED}"])
  return out, summary


def test_no_unseen_label_reaches_stage_1_or_a_graph(tiny_run):
  out, _ = tiny_run
  record = json.loads((out / discover.DISCOVERED_FILE).read_text())["tasks"]
  assert record[TASK]["truth"] != record[SCRAMBLED]["truth"]  # The labels do differ.
  for key in ("mask", "fourier", "mask_layers", "mask_sigma_max", "fourier_pair_weight"):
    strip = lambda v: ({k: v[k] for k in ("bits", "pairs")} if isinstance(v, dict) else v)
    mine, twin = record[TASK]["seeds"]["0"][key], record[SCRAMBLED]["seeds"]["0"][key]
    assert strip(mine) == strip(twin), key


def test_tiny_trains_every_arm_with_its_graph_and_reports(tiny_run):
  out, summary = tiny_run
  assert [m["scheme"] for m in summary["members"] if m["task"] == TASK] == list(
      discover.ALL_ARMS)
  seed = json.loads((out / discover.DISCOVERED_FILE).read_text())["tasks"][TASK]["seeds"]["0"]
  truth = planted.TASKS[TASK].support
  trained = {r["scheme"]: r["graph"] for r in map(json.loads, (out / "metrics.jsonl").open())
             if "graph" in r and r["task"] == TASK}
  for route in ("mask", "fourier"):
    control = seed[f"support_{route}"]
    assert trained[f"support_{route}"] == {k: control[k] for k in ("bits", "pairs")}
    assert control["bits"] == list(truth) and control["bit_recall"] == 1.0
    assert len(control["pairs"]) == min(len(seed[route]["pairs"]),
                                        len(truth) * (len(truth) - 1) // 2)
  written = planted.report(out)
  text = (out / planted.REPORT_FILE).read_text()
  assert all(f"| {arm} |" in text for arm in planted.ROUTES + planted.CONTROLS)
  assert f"--preset tiny --set tasks={TASK},{SCRAMBLED}" in text  # The run's command ...
  provenance = [json.loads(l) for l in (out / planted.PROVENANCE_FILE).read_text().splitlines()]
  assert [p["task"] for p in provenance] == [TASK, SCRAMBLED]
  assert provenance[0]["commit"] in text  # ... and commit.
  assert (out / "plots" / planted.PLOT_FILE).stat().st_size > 10_000 and len(written) == 5


def test_a_resume_refuses_a_changed_task(tiny_run, monkeypatch):
  out, _ = tiny_run
  spec = planted.TASKS[TASK]
  monkeypatch.setitem(planted.TASKS, TASK, dataclasses.replace(spec, seen_bits=(0, 6)))
  with pytest.raises(Exception, match=f"fingerprint.planted"):
    run.run_experiment(EXPERIMENT, preset="tiny", out_dir=str(out),
                       overrides=[f"tasks={TASK},{SCRAMBLED}"], resume=True)


def test_presets():
  """tiny runs 1 task; quick every task; cpu boolean_gotu's cpu model with ≥ 2 seeds."""
  tiny = config_lib.make_config(EXPERIMENT, "tiny")[1]
  assert len(tiny.tasks) == 1 and set(tiny.tasks) <= set(planted.TASK_NAMES)
  assert config_lib.make_config(EXPERIMENT, "quick")[1].tasks == planted.TASK_NAMES
  cpu = config_lib.make_config(EXPERIMENT, "cpu", ["tasks=p05_chain17,p09_chain15"])[1]
  assert cpu.tasks == ("p05_chain17", "p09_chain15") and cpu.seeds >= 2
  assert cpu.schemes == discover.ALL_ARMS
