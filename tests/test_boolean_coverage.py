"""The coverage experiment (issue #19): hand-checked predictions, the join with a run's
summary.json, and the report it writes. No training: the `tiny` preset takes about a
minute on one core (compiling), too slow here; the summary below has its format."""

import json

import matplotlib.image
import numpy as np
import pytest

import mpx.experiments.boolean_coverage as cov
import mpx.experiments.boolean_gotu as gotu
from mpx.sweep import config as config_lib
from mpx.tasks import boolean
from mpx.tasks.boolean import coverage
from mpx.tasks.boolean import gotu as family


def _prediction(name):
  p = coverage.prediction(name)
  return p["covered_fraction"], p["predicted_accuracy_unseen"], p["mdi_accuracy_unseen"]


def test_hand_checked_predictions():
  # 2Parity: unseen x0 = x1 = −1 has sum −2, never seen; the MDI x0 + x1 − 1 = −3 is wrong.
  assert _prediction("cov_parity2") == (0.0, 0.0, 0.0)
  # x0 AND NOT x1: unseen (−1, +1) has the sum 0 of the seen (+1, −1), target +1 there,
  # −1 here: covered and wrong, while the MDI −1 + x0 − x1 = −3 is right.
  assert _prediction("cov_andnot") == (1.0, 0.0, 1.0)
  # Parity3: x2 = +1 (sum −1, seen with target +1) right; x2 = −1 (sum −3) at the MDI
  # x2 (x0 + x1 − 1) = −3 x2, whose sign is always wrong: 1/2.
  assert _prediction("cov_parity3") == (0.5, 0.5, 0.0)
  # Majority, seen x0 = 1 or x1 = 1: sum −1 covered, sum −3 not, where the MDI is right.
  assert _prediction("cov_majority3") == (0.5, 1.0, 0.5)
  # Majority with the hole (−1, −1, +1): sum −1 is seen at (+1, −1, −1), target −1; the
  # MDI ½ + ½x0x1 + x2 − ½x0x2 − ½x1x2 is 3 there.
  assert _prediction("cov_majority3_hole") == (1.0, 1.0, 0.0)
  # Majority of 5, seen x3 = x4 = 1 (sums of x0..x2 + 2: −1..5): unseen (±1, ∓1) covered
  # unless x0 = x1 = x2 = −1 (7/8), (−1, −1) covered when x0 + x1 + x2 ≥ 1 (1/2).
  covered, predicted, _ = _prediction("cov_majority5")
  assert covered == pytest.approx(2 / 3 * 7 / 8 + 1 / 3 * 1 / 2) == 0.75
  assert predicted >= covered  # A covered point's class has one target: answered right.


def test_predictions_span_zero_to_one_and_part_from_the_mdi():
  rows = coverage.predictions()
  assert [r["task"] for r in rows] == list(coverage.TASK_NAMES) and 6 <= len(rows) <= 8
  predicted = [r["predicted_accuracy_unseen"] for r in rows]
  assert min(predicted) == 0.0 and max(predicted) == 1.0
  assert sum(0.0 < p < 1.0 for p in predicted) >= 3
  gaps = [r["predicted_accuracy_unseen"] - r["mdi_accuracy_unseen"] for r in rows]
  assert min(gaps) <= -0.5 and max(gaps) >= 0.5  # The mask must hurt once, help once.


def test_the_classes_are_the_prior_the_mask_trains_with():
  # The mask joins exactly the bits that share a class group: the clique over the
  # support for the sum tasks, the bits of each window for the windowed one.
  for spec in coverage.SPECS:
    allowed = np.asarray(family.task_prior(spec.name, 4.0)) > 0
    joined = np.eye(16, dtype=bool)
    for group in spec.class_groups:
      joined[np.ix_([b + 1 for b in group], [b + 1 for b in group])] = True
    np.testing.assert_array_equal(allowed[1:, 1:], joined[1:, 1:], err_msg=spec.name)
    assert set().union(*spec.class_groups) == set(spec.support)
    if spec.kind == "sum":
      assert spec.class_groups == (spec.support,)
  p = coverage.prediction("cov_window3")
  assert p["kind"] == "window" and p["groups"] == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
  assert p["clique_predicted_accuracy_unseen"] != p["predicted_accuracy_unseen"]


def test_presets_reuse_boolean_gotu():
  experiment = config_lib.load_experiment("boolean_coverage")
  assert experiment.NAME == "boolean_coverage" and experiment.PAPER == {}
  assert experiment.build_groups is gotu.build_groups
  assert coverage.MEASURED in experiment.METRICS and coverage.PREDICTED in experiment.METRICS
  for preset in ("quick", "cpu", "tiny"):
    _, cfg = config_lib.make_config(experiment, preset)
    assert cfg.schemes == ("default", "mask")
    assert set(cfg.tasks) <= set(coverage.TASK_NAMES)
    if preset != "tiny":
      assert cfg.tasks == coverage.TASK_NAMES
      _, ref = config_lib.make_config(gotu, preset)
      for key in ("width", "depth", "num_heads", "head_dim", "mlp_dim", "learning_rate",
                  "epochs", "seeds"):
        assert getattr(cfg, key) == getattr(ref, key), key
  assert config_lib.make_config(experiment, "cpu")[1].seeds >= 4


def _member(task, scheme, seed, unseen, diverged=False):
  """A member as summary.json holds it (keys of a real `--preset tiny` run)."""
  mask = scheme.startswith("mask")
  return {"diverged": diverged, "scheme": scheme, "seed": seed, "task": task,
          "hparams": {"learning_rate": 0.001, "mask_lr_multiplier": 1.0 if mask else 0.0,
                      "mask_strength": 4.0, "weight_decay": 0.001},
          "metrics": {"accuracy": 0.9, "accuracy_unseen": unseen, "loss": 0.5,
                      "unseen_mean_output": -0.4, "fidelity": 0.8, "drift_mask": 0.0}}


SUMMARY = {
    "experiment": "boolean_coverage", "preset": "handwritten", "paper": {},
    "members": [
        _member("cov_andnot", "default", 0, 1.0), _member("cov_andnot", "default", 1, 1.0),
        _member("cov_andnot", "mask", 0, 0.5), _member("cov_andnot", "mask", 1, 0.0),
        _member("cov_majority3_hole", "default", 0, 0.0),
        _member("cov_majority3_hole", "default", 1, 0.25),
        _member("cov_majority3_hole", "mask", 0, 1.0),
        _member("cov_majority3_hole", "mask", 1, 0.0, diverged=True),
        _member("2parity", "mask", 0, 0.0),  # Another experiment's task: left out.
    ],
}


def test_predicted_vs_measured_joins_by_task_and_scheme():
  rows = coverage.predicted_vs_measured(SUMMARY)
  got = {(r["task"], r["scheme"]): r for r in rows}
  assert list(got) == [("cov_andnot", "default"), ("cov_andnot", "mask"),
                       ("cov_majority3_hole", "default"), ("cov_majority3_hole", "mask")]
  expect = {("cov_andnot", "default"): (1.0, 0.0, 2), ("cov_andnot", "mask"): (0.25, 0.25, 2),
            ("cov_majority3_hole", "default"): (0.125, 0.125, 2),
            ("cov_majority3_hole", "mask"): (1.0, 0.0, 1)}  # The diverged seed left out.
  for key, (mean, std, n) in expect.items():
    r = got[key]
    assert (r["measured_mean"], r["measured_std"], r["n"]) == (mean, std, n), key
    assert r["n_seeds"] == 2
    assert r["predicted_accuracy_unseen"] == coverage.prediction(key[0])["predicted_accuracy_unseen"]
  assert got[("cov_andnot", "mask")]["predicted_accuracy_unseen"] == 0.0
  assert got[("cov_andnot", "mask")]["mdi_accuracy_unseen"] == 1.0
  assert got[("cov_majority3_hole", "mask")]["predicted_accuracy_unseen"] == 1.0
  assert got[("cov_majority3_hole", "mask")]["n_diverged"] == 1


def test_report_writes_the_table_and_the_plot(tmp_path):
  (tmp_path / "summary.json").write_text(json.dumps(SUMMARY))
  table, plot = cov.report(tmp_path)
  assert table == str(tmp_path / "coverage.md")
  assert plot == str(tmp_path / "plots" / "coverage.png")
  md = (tmp_path / "coverage.md").read_text()
  assert "| cov_andnot | mask | 2/2 | 100.00 | 0.00 | 100.00 | 25.00 ± 25.00 | +25.00 |" in md
  assert ("| cov_majority3_hole | mask | 1/2 (1 diverged) | 100.00 | 100.00 | 0.00 | "
          "100.00 ± 0.00 | +0.00 |") in md
  assert "mask_lr_multiplier" not in md  # Fixed by the scheme, not a swept value.
  assert "Left out (no prediction): 2parity." in md
  assert "| cov_andnot | x0 AND NOT x1 (±1) | not (x0 = −1 and x1 = +1) |" in md
  image = matplotlib.image.imread(plot)
  assert image.ndim == 3 and image.shape[0] > 100 and image[..., :3].std() > 0


def test_report_joins_runs_of_task_subsets(tmp_path):
  """Two runs of one preset, each of some tasks, give the table of one run of all."""
  whole, a, b = (tmp_path / n for n in ("whole", "a", "b"))
  for folder, keep in ((whole, lambda m: True), (a, lambda m: m["task"] == "cov_andnot"),
                       (b, lambda m: m["task"] != "cov_andnot")):
    folder.mkdir()
    members = [m for m in SUMMARY["members"] if keep(m)]
    (folder / "summary.json").write_text(json.dumps(dict(SUMMARY, members=members)))
  cov.report(whole)
  cov.report(a, b)
  table = lambda d: (d / "coverage.md").read_text().split("## The tasks")[0]
  assert table(a) == table(whole) and "cov_majority3_hole | mask" in table(a)
  (b / "summary.json").write_text(json.dumps(dict(SUMMARY, preset="cpu")))
  with pytest.raises(ValueError, match="different experiments or presets"):
    cov.report(a, b)


def test_report_refuses_a_folder_without_its_tasks(tmp_path):
  with pytest.raises(ValueError, match="summary.json is missing"):
    cov.report(tmp_path)
  other = dict(SUMMARY, members=SUMMARY["members"][-1:])
  (tmp_path / "summary.json").write_text(json.dumps(other))
  with pytest.raises(ValueError, match="no member of this experiment's tasks"):
    cov.report(tmp_path)


def test_run_hooks_record_the_prediction(tmp_path):
  _, cfg = config_lib.make_config(cov, "quick")
  history = [{"task": "cov_parity3", "step": s, "accuracy_unseen": 0.1} for s in (0, 96)]
  assert cov.history_metrics(cfg, history) == {coverage.PREDICTED: 0.5}
  assert cov.history_metrics(cfg, [{"task": "2parity"}]) == {}
  cov.save_run_files(cfg, tmp_path)
  md = (tmp_path / coverage.PREDICTED_FILE).read_text()
  for name in coverage.TASK_NAMES:
    assert f"| {name} |" in md
  assert ("| cov_window3 | x0x1x2 + x1x2x3 + x2x3x4 | x0 = 1 or x1 = 1, and no window is "
          "(+1, +1, +1) | windows 012, 123, 234 |") in md


def test_tasks_are_registered_with_their_definitions():
  for spec in coverage.SPECS:
    task = boolean.get_task(spec.name)
    x = boolean.cube(15)
    np.testing.assert_array_equal(task.target(x), np.asarray(spec.target(x), np.float32))
    assert task.support == spec.support and task.protocol == "enumerate"
    assert set(np.unique(task.target(x))) <= ({-3.0, -1.0, 1.0, 3.0} if spec.integer_valued
                                               else {-1.0, 1.0})  # Never 0: signs score.
