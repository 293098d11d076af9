"""Each scheme's hyperparameter chosen on validation only; the Boolean validation split."""

import json
import pathlib

import numpy as np
import pytest

import mpx.experiments.boolean_gotu as gotu
from mpx import cli
from mpx.sweep import config as config_lib
from mpx.sweep import select
from mpx.tasks import boolean
from mpx.tasks.boolean import gotu as boolean_gotu

CRITERIA = (("val_accuracy", "max"), ("val_loss", "min"))


def _member(scheme, lr, seed, val_acc, val_loss, test, diverged=False):
  return {"task": "t", "scheme": scheme, "seed": seed, "diverged": diverged,
          "hparams": {"learning_rate": lr, "weight_decay": 0.0},
          "metrics": {"val_accuracy": val_acc, "val_loss": val_loss, "accuracy": test}}


MEMBERS = [
    _member("mask", 1e-3, 0, 1.0, 0.02, 0.50), _member("mask", 1e-3, 1, 1.0, 0.02, 0.60),
    _member("mask", 1e-2, 0, 1.0, 0.01, 0.10), _member("mask", 1e-2, 1, 1.0, 0.01, 0.20),
    _member("default", 1e-3, 0, 0.9, 0.01, 0.90), _member("default", 1e-3, 1, 0.9, 0.01, 0.95),
    _member("default", 1e-2, 0, 1.0, 0.50, 0.10),
    _member("default", 1e-2, 1, 1.0, 0.50, 0.10, diverged=True),
]


def _chosen(members):
  return {line[1]: value for line, value in select.choose(members, "learning_rate",
                                                           CRITERIA).items()}


def test_the_best_validation_score_wins_ties_go_to_the_loss_and_divergence_is_worst():
  # mask: accuracies tie at 100%, the loss picks 1e-2; default: 1e-2 has a diverged seed.
  assert _chosen(MEMBERS) == {"mask": 1e-2, "default": 1e-3}


def test_selection_cannot_see_the_reported_metrics():
  flipped = [dict(m, metrics=dict(m["metrics"], accuracy=1.0 - m["metrics"]["accuracy"]))
             for m in MEMBERS]
  assert _chosen(flipped) == _chosen(MEMBERS)
  for criteria in ((("accuracy", "max"),), (("val_accuracy", "best"),)):
    with pytest.raises(ValueError, match="validation metrics only"):
      select.choose(MEMBERS, "learning_rate", criteria)


def test_the_table_reports_the_members_at_the_chosen_value():
  table, rows = select.selection_table(MEMBERS, "learning_rate", CRITERIA, ["accuracy"])
  mask = next(r for r in rows if r["scheme"] == "mask")
  assert mask["learning_rate"] == 1e-2 and mask["accuracy"]["mean"] == pytest.approx(0.15)
  assert "| t | mask | 0.01 | 2/2 | 100.00 ± 0.00 |" in table


def test_boolean_validation_points_are_held_out_of_training():
  for name in ("2parity", "majority3"):             # The enumerate and iid protocols.
    spec = boolean.get_task(name)
    held_out = boolean_gotu.validation_points(spec)
    x_cube = boolean.cube(spec.n_bits)
    seen = spec.seen(x_cube)
    assert held_out.sum() == int(0.1 * seen.sum()) and not (held_out & ~seen).any()
    x, _ = boolean_gotu.training_split(spec, 0, held_out)
    rows = set(map(bytes, x_cube[held_out].astype(np.int8)))
    assert not rows & set(map(bytes, x.astype(np.int8)))
    plain = boolean_gotu.training_split(spec, 0, None)
    np.testing.assert_array_equal(plain[0], boolean.make_splits(spec, 0)["train"][0])


@pytest.fixture(scope="module")
def selected_run(tmp_path_factory):
  """A tiny Boolean run at two learning rates, chosen on validation (read, never written)."""
  out = tmp_path_factory.mktemp("select") / "selected"
  assert cli.main(["run", "boolean_gotu", "--preset", "tiny", "--out", str(out),
                   "--set", "learning_rate=1e-3,1e-2", "--select", "learning_rate"]) == 0
  return out


def test_a_selected_boolean_run_reports_each_scheme_at_its_best_validation_value(selected_run):
  out = selected_run
  summary = json.loads((out / "summary.json").read_text())
  assert all("val_accuracy" in m["metrics"] for m in summary["members"])
  chosen = {r["scheme"]: r["learning_rate"] for r in summary["selection"]["rows"]}
  # The choice recomputed by hand from the members' validation metrics, not by `select`:
  # per scheme, the value with the highest mean val_accuracy over seeds, ties broken by
  # the lowest mean val_loss (none diverges here).
  by_value = {}
  for m in summary["members"]:
    assert not m["diverged"], m
    by_value.setdefault(m["scheme"], {}).setdefault(m["hparams"]["learning_rate"], []).append(
        (m["metrics"]["val_accuracy"], m["metrics"]["val_loss"]))
  expected = {}
  for scheme, values in by_value.items():
    means = {lr: tuple(np.mean(x) for x in zip(*v)) for lr, v in values.items()}
    assert sorted(means) == [1e-3, 1e-2] and means[1e-3] != means[1e-2], (scheme, means)
    best_accuracy = max(a for a, _ in means.values())
    tied = {lr: loss for lr, (a, loss) in means.items() if a == best_accuracy}
    expected[scheme] = min(tied, key=tied.get)
  # Not trivially the first value listed: some scheme's best is learning_rate=1e-2.
  assert 1e-2 in expected.values(), by_value
  assert set(chosen) == {"default", "mask"} and chosen == expected, (chosen, by_value)
  for row in summary["selection"]["rows"]:  # The rows report the members at the choice.
    accuracy, loss = (np.mean(x) for x in zip(*by_value[row["scheme"]][row["learning_rate"]]))
    assert row["val_accuracy"]["mean"] == pytest.approx(accuracy)
    assert row["val_loss"]["mean"] == pytest.approx(loss)
  assert "chosen on validation" in (out / "summary.md").read_text()


def test_a_choice_on_the_edge_of_the_values_tried_says_so():
  three = MEMBERS + [_member("mask", 1e-1, seed, 1.0, 0.5, 0.0) for seed in (0, 1)]
  _, rows = select.selection_table(MEMBERS, "learning_rate", CRITERIA, ["accuracy"])
  assert {r["scheme"]: r["edge"] for r in rows} == {"mask": "largest", "default": "smallest"}
  table, rows = select.selection_table(three, "learning_rate", CRITERIA, ["accuracy"])
  assert {r["scheme"]: r["edge"] for r in rows} == {"mask": None, "default": "smallest"}
  assert "t / default: 0.001 is the smallest learning_rate tried" in table
  assert "t / mask" not in table


def test_a_line_where_every_value_diverged_or_ties_is_chosen_alike_in_any_order():
  lost = [_member("qk", lr, s, 0.5, 0.1, 0.5, diverged=True) for lr in (1e-3, 1e-2) for s in (0, 1)]
  tied = [_member("qk_svd", lr, 0, 0.5, 0.1, 0.5) for lr in (1e-2, 1e-3, 3e-3)]
  for members in (lost + tied, (lost + tied)[::-1]):
    _, rows = select.selection_table(members, "learning_rate", CRITERIA, ["accuracy"])
    # Nothing to extend where every value lost; a full tie goes to the smallest value.
    assert {r["scheme"]: (r["learning_rate"], r["edge"]) for r in rows} == {
        "qk": (1e-3, None), "qk_svd": (1e-3, "smallest")}
  grid = select.grid_table(lost + tied[:1], "learning_rate", "val_accuracy", "accuracy")
  assert "| t / qk | diverged (2/2) | diverged (2/2) |" in grid
  assert "| t / qk_svd | — | 50.00 / 50.00 |" in grid


def _at_other_values(run: pathlib.Path, out: pathlib.Path, scale: float, edit=None):
  """A copy of `run`'s records as if its command had run at `scale` × its values (what a
  second run folder extending the grid holds), worse on validation, with `edit(config)`."""
  config = json.loads((run / "config.json").read_text())
  summary = json.loads((run / "summary.json").read_text())
  config["traced"]["learning_rate"] = [v * scale for v in config["traced"]["learning_rate"]]
  for m in summary["members"]:
    m["hparams"]["learning_rate"] *= scale
    m["metrics"]["val_accuracy"] = 0.5 * m["metrics"]["val_accuracy"]
  if edit:
    edit(config)
  out.mkdir()
  (out / "config.json").write_text(json.dumps(config))
  (out / "summary.json").write_text(json.dumps(summary))
  return out


def _more_tasks(config):  # Another task (its data fingerprinted) and other bookkeeping.
  config["config"] |= {"tasks": ["2parity", "majority3"], "keep_checkpoints": 5}
  config["fingerprint"]["majority3"] = {"definition": "another task's"}


def test_select_chooses_over_run_folders_that_are_one_grid(selected_run, tmp_path, capsys):
  more = _at_other_values(selected_run, tmp_path / "more", 100.0, _more_tasks)
  assert cli.main(["select", str(selected_run), str(more)]) == 0
  text = capsys.readouterr().out
  summary = json.loads((selected_run / "summary.json").read_text())
  alone = {r["scheme"]: r["learning_rate"] for r in summary["selection"]["rows"]}
  for scheme, lr in alone.items():  # The extra values validate worse: the same choice.
    assert f"| {scheme} | {lr:g} |" in text
  assert "| line | 0.001 | 0.01 | 0.1 | 1 |" in text  # Every value of both folders.
  assert len(select.combine([selected_run, more])[1]) == 2 * len(summary["members"])
  better = _at_other_values(selected_run, tmp_path / "better", 100.0)
  data = json.loads((better / "summary.json").read_text())
  for m in data["members"]:  # Best at the largest value: the choice moves there.
    m["metrics"]["val_accuracy"] = 2.0 if m["hparams"]["learning_rate"] == 1.0 else 0.0
  (better / "summary.json").write_text(json.dumps(data))
  _, rows = select.selection_table(select.combine([selected_run, better])[1], "learning_rate",
                                   gotu.VALIDATION, gotu.METRICS)
  assert [(r["learning_rate"], r["edge"]) for r in rows] == [(1.0, "largest")] * len(alone)


def test_a_scheme_the_swept_value_does_not_reach_is_taken_once(selected_run, tmp_path):
  """--select mask_lr_multiplier: the default trains at multiplier 0 in every folder."""
  members = json.loads((selected_run / "summary.json").read_text())["members"]
  at_1e3 = [m for m in members if m["hparams"]["learning_rate"] == 1e-3]
  folders = []
  for name, values in (("a", [1.0, 2.0]), ("b", [4.0, 8.0])):
    config = json.loads((selected_run / "config.json").read_text())
    config["config"] |= {"select": "mask_lr_multiplier", "learning_rate": 1e-3}
    config["traced"] = {"mask_lr_multiplier": values}
    trained = [dict(m, hparams=dict(m["hparams"], mask_lr_multiplier=0.0))
               for m in at_1e3 if m["scheme"] == "default"]
    trained += [dict(m, hparams=dict(m["hparams"], mask_lr_multiplier=v))
                for m in at_1e3 if m["scheme"] == "mask" for v in values]
    folders.append(tmp_path / name)
    folders[-1].mkdir()
    (folders[-1] / "config.json").write_text(json.dumps(config))
    (folders[-1] / "summary.json").write_text(json.dumps({"members": trained}))
  notes = []
  _, combined = select.combine(folders, notes)
  values = lambda scheme: sorted(m["hparams"]["mask_lr_multiplier"] for m in combined
                                 if m["scheme"] == scheme)
  assert values("default") == [0.0] and values("mask") == [1.0, 2.0, 4.0, 8.0]
  assert notes == [f"default: mask_lr_multiplier does not reach it, so every folder trained "
                   f"it alike; the rows use {folders[0]}'s members."]


def _with_validation(monkeypatch, criteria):
  """`mpx select` loading an experiment file whose VALIDATION now says `criteria`."""
  load = config_lib.load_experiment
  def changed(name):
    experiment = load(name)
    monkeypatch.setattr(experiment, "VALIDATION", criteria)
    return experiment
  monkeypatch.setattr(config_lib, "load_experiment", changed)


def test_select_scores_with_the_criteria_the_runs_recorded(selected_run, tmp_path, capsys,
                                                          monkeypatch):
  """The experiment file's VALIDATION renamed since the run: the choice is still made on
  what the run recorded; a run that recorded none, with names that match nothing, is
  refused in one line (every value would score −inf, the smallest winning silently)."""
  summary = json.loads((selected_run / "summary.json").read_text())
  assert summary["selection"]["criteria"] == [list(c) for c in gotu.VALIDATION]
  _with_validation(monkeypatch, (("val_renamed", "max"),))
  more = _at_other_values(selected_run, tmp_path / "more", 100.0)
  assert cli.main(["select", str(selected_run), str(more)]) == 0
  text = capsys.readouterr().out
  for row in summary["selection"]["rows"]:
    assert f"| {row['scheme']} | {row['learning_rate']:g} |" in text
  assert select.criteria_sentence(gotu.VALIDATION) .split(" (")[0] in text
  for folder in (selected_run, more):  # As written before runs recorded their criteria.
    old = tmp_path / f"old-{folder.name}"
    old.mkdir()
    (old / "config.json").write_text((folder / "config.json").read_text())
    data = json.loads((folder / "summary.json").read_text())
    data.get("selection", {}).pop("criteria", None)
    (old / "summary.json").write_text(json.dumps(data))
  with pytest.raises(SystemExit):
    cli.main(["select", str(tmp_path / "old-selected"), str(tmp_path / "old-more")])
  err = capsys.readouterr().err
  assert err.startswith("mpx select: error: no value could be scored: the criteria (the "
                        "experiment file's VALIDATION) name ['val_renamed']"), err
  assert err.count("\n") == 1


def test_select_refuses_folders_that_are_not_one_grid(selected_run, tmp_path, capsys):
  def changed(name, **config):
    def edit(record):
      record["config"] |= config
    return _at_other_values(selected_run, tmp_path / name, 100.0, edit)

  def new_task_definition(record):
    record["fingerprint"]["2parity"] = {"definition": "changed"}

  unfinished = tmp_path / "unfinished"
  unfinished.mkdir()
  (unfinished / "config.json").write_text((selected_run / "config.json").read_text())
  for folders, message in (
      ([changed("epochs", epochs=99)], "differ in ['epochs']"),
      ([changed("seeds", seeds=2)], "differ in ['seeds']"),
      ([_at_other_values(selected_run, tmp_path / "data", 100.0, new_task_definition)],
       "differ in ['fingerprint.2parity']"),
      ([_at_other_values(selected_run, tmp_path / "same", 1.0)], "both trained"),
      ([selected_run], "given twice"),
      ([unfinished], "has no summary.json"),
      ([tmp_path / "missing"], "does not exist")):
    with pytest.raises(SystemExit):
      cli.main(["select", str(selected_run), *map(str, folders)])
    assert message in capsys.readouterr().err


def test_selection_needs_a_list_and_a_validation_split(tmp_path, capsys):
  with pytest.raises(SystemExit):
    cli.main(["run", "boolean_gotu", "--preset", "tiny", "--out", str(tmp_path / "a"),
              "--select", "learning_rate"])
  assert "needs a list of values" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    cli.main(["run", "vision", "--preset", "tiny", "--out", str(tmp_path / "b"),
              "--set", "learning_rate=1e-3,1e-2", "--select", "learning_rate"])
  assert "no validation split" in capsys.readouterr().err


def test_boolean_validation_accuracy_is_sign_accuracy_on_the_held_out_points():
  """Cyclic3's target is a sum of windows (odd values up to ±15): a prediction of the right
  sign is right, as in the reported accuracy."""
  _, config = config_lib.make_config(gotu, "tiny", ["tasks=cyclic3", "learning_rate=1e-3",
                                                     "epochs=1", "select=learning_rate"])
  task = boolean_gotu.make_task(config, "cyclic3")
  spec = boolean.get_task("cyclic3")
  target = boolean.make_splits(spec, 0)["test"][1]
  held_out = boolean_gotu.validation_points(spec)
  member = next(iter(gotu.build_groups(config)[0].members))
  metrics = task.summarize({"pred": 0.5 * target}, member)
  assert metrics["val_accuracy"] == 1.0 and len(set(np.abs(target[held_out]))) > 1
  assert metrics["val_loss"] == pytest.approx(np.mean((0.5 * target[held_out]) ** 2))
