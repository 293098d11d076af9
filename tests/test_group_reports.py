"""A run of several groups (two data fractions, as vision and arithmetic train them)
reports each group on its own: the summary's persistence lines, history metrics, the
curves and the fraction curve. Synthetic records written through mpx.report, no training."""

import numpy as np
import pytest

from mpx import plotting, report
from mpx.sweep import run
from test_plotting import _record_figures

STEPS = (0, 10, 20, 30)
# Fidelity at STEPS per (scheme, data fraction): on a tenth of the data the prior fades
# (below half its initial value at step 10 for default, 20 for mask); on all of it, never.
FIDELITY = {("default", 0.1): (0.4, 0.1, 0.1, 0.1), ("mask", 0.1): (0.9, 0.8, 0.3, 0.2),
            ("default", 1.0): (0.4, 0.4, 0.4, 0.4), ("mask", 1.0): (0.9, 0.9, 0.9, 0.9)}
FINAL_ACCURACY = {0.1: 0.3, 1.0: 0.9}  # Seed s adds s / 100.


def _members():
  return [{"task": "digits", "scheme": scheme, "seed": seed, "diverged": False,
           "hparams": {"learning_rate": 1e-3, "mask_lr_multiplier": float(scheme == "mask"),
                       "data_fraction": fraction}}
          for fraction in (0.1, 1.0) for scheme in ("default", "mask") for seed in (0, 1)]


def _metrics(member, t):
  key = (member["scheme"], member["hparams"]["data_fraction"])
  accuracy = FINAL_ACCURACY[key[1]] * STEPS[t] / STEPS[-1] + member["seed"] / 100
  return {"accuracy": accuracy, "fidelity": FIDELITY[key][t], "fidelity_init": FIDELITY[key][0]}


@pytest.fixture(scope="module")
def fraction_run(tmp_path_factory):
  """A run folder as `mpx run` leaves it: the groups' records one group after the other,
  then the summary of the final ones."""
  tmp_path = tmp_path_factory.mktemp("fractions")
  with report.MetricsWriter(tmp_path) as writer:
    for fraction in (0.1, 1.0):
      for t, step in enumerate(STEPS):
        writer.write([report.member_record(m, step, _metrics(m, t), diverged=False)
                      | {"group": f"digits-f{fraction:g}"}
                      for m in _members() if m["hparams"]["data_fraction"] == fraction])
  members = [m | {"metrics": _metrics(m, len(STEPS) - 1)} for m in _members()]
  report.write_summary(tmp_path, experiment="vision", preset="test", members=members,
                       paper={}, metric_names=["accuracy"])
  return tmp_path, members


def test_persistence_lines_keep_each_group(fraction_run):
  run_dir, members = fraction_run
  table = run.persistence_table(run_dir, members)
  lines = table.split("\n\n")[-1].splitlines()  # Below the table and its legend.
  assert lines == ["- digits / default, data_fraction=0.1: 10, 10",
                   "- digits / mask, data_fraction=0.1: 20, 20",
                   "- digits / default, data_fraction=1: never, never",
                   "- digits / mask, data_fraction=1: never, never"]


def test_history_metrics_see_their_own_group(fraction_run):
  run_dir, members = fraction_run
  out = run.with_history_metrics(members, run_dir, lambda history: {
      "evaluations": len(history), "last": history[-1]["accuracy"]})
  assert [m["metrics"]["evaluations"] for m in out] == [len(STEPS)] * len(members)
  assert [m["metrics"]["last"] for m in out] == [m["metrics"]["accuracy"] for m in members]


def test_member_key_tells_groups_apart(fraction_run):
  run_dir, members = fraction_run
  records = report.read_metrics(run_dir)
  assert len({report.member_key(r) for r in records}) == len(members) == 8
  assert {report.member_key(m) for m in members} == {report.member_key(r) for r in records}
  assert report.cell_key(members[0]) == report.member_key(members[0])[:-1]


@pytest.fixture(scope="module")
def plotted(fraction_run):
  """(the files `plot_run` wrote, {file name: figure})."""
  with pytest.MonkeyPatch.context() as monkeypatch:
    figures = _record_figures(monkeypatch)
    return plotting.plot_run(fraction_run[0]), figures


def _lines(fig):
  """{legend label: (x, y)} of a figure's labelled lines."""
  return {line.get_label(): (np.asarray(line.get_xdata()), np.asarray(line.get_ydata()))
          for ax in fig.axes for line in ax.get_lines() if not line.get_label().startswith("_")}


def test_curves_draw_every_group(plotted):
  _, drawn = plotted
  lines = _lines(drawn["digits_accuracy.png"])
  assert sorted(lines) == ["default, data_fraction=0.1 (n=2)", "default, data_fraction=1 (n=2)",
                           "mask, data_fraction=0.1 (n=2)", "mask, data_fraction=1 (n=2)"]
  steps, accuracy = lines["mask, data_fraction=0.1 (n=2)"]
  assert steps.tolist() == list(STEPS)
  assert accuracy[-1] == pytest.approx(100 * (0.3 + 0.005))  # %, mean over seeds 0 and 1.
  assert lines["mask, data_fraction=1 (n=2)"][1][-1] == pytest.approx(100 * (0.9 + 0.005))
  fidelity = _lines(drawn["overview.png"])
  assert fidelity["mask, data_fraction=0.1 (n=2)"][1].tolist() == pytest.approx(
      FIDELITY[("mask", 0.1)])


def test_fraction_curve_takes_the_headline_metric(fraction_run, plotted):
  written, drawn = plotted
  run_dir, _ = fraction_run
  assert str(run_dir / "plots" / "fraction_curve.png") in written
  fig = drawn["fraction_curve.png"]
  assert fig.axes[0].get_ylabel() == "accuracy (%)"  # vision's headline, not arithmetic's.
  lines = _lines(fig)
  assert sorted(lines) == ["default (n=2)", "mask (n=2)"]
  fractions, accuracy = lines["mask (n=2)"]
  assert fractions.tolist() == [0.1, 1.0]
  assert accuracy == pytest.approx([100 * 0.305, 100 * 0.905])


def test_fraction_curve_without_the_metric_names_it(fraction_run):
  run_dir, _ = fraction_run
  summary = plotting._load_summary(run_dir)
  with pytest.raises(ValueError, match=r"hparams\['data_fraction'\] and a finite "
                                       "sequence_accuracy"):
    plotting.plot_sensitivity(summary, run_dir / "f.png", "data_fraction", "sequence_accuracy")
