"""The overview figure: a synthetic run folder written through mpx.report, read back."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mpx import plotting, report  # noqa: E402

HP = {"learning_rate": 1e-3, "weight_decay": 0.0}
# final accuracy per (task, scheme), one value per seed. Seed 2 of 2parity / mask diverged
# (frozen with a finite value, which the statistics leave out all the same).
DIVERGED = ("2parity", "mask", 2)
FINAL = {("2parity", "default"): [0.70, 0.75, 0.80], ("2parity", "mask"): [1.0, 0.5, 0.25],
         ("cyclic3", "default"): [0.6, 0.6, 0.9], ("cyclic3", "mask"): [0.95, 1.0, 0.9]}
PAPER = {"2parity": {"default": {"accuracy": 0.75}, "mask": {"accuracy": 1.0}},
         "cyclic3": {"mask": {"accuracy": 0.9998}}}
STEPS = (10, 20, 30)  # No evaluation at step 0: the curves start at fidelity_init.


def _fidelity(scheme, seed, step):
  """The mask's fidelity decays half as fast; later seeds faster."""
  start, rate = (0.9, 1 / 400) if scheme == "mask" else (0.3, 1 / 200)
  return start * (1 - rate * step * (1 + seed))


def _members():
  return [{"task": task, "scheme": scheme, "seed": seed, "hparams": HP,
           "metrics": {"loss": 0.1, "accuracy": acc}, "diverged": (task, scheme, seed) == DIVERGED}
          for (task, scheme), accs in FINAL.items() for seed, acc in enumerate(accs)]


def _write_run(run_dir, *, fidelity=True, summary=True):
  with report.MetricsWriter(run_dir) as w:
    for step in STEPS:
      records = []
      for m in _members():
        extra = {}
        if fidelity:
          extra = {"fidelity": _fidelity(m["scheme"], m["seed"], step),
                   "fidelity_init": _fidelity(m["scheme"], m["seed"], 0)}
        records.append(report.member_record(m, step, {"accuracy": 0.5, **extra},
                                            diverged=m["diverged"]))
      w.write(records)
  if summary:
    report.write_summary(run_dir, experiment="boolean", preset="quick", members=_members(),
                         paper=PAPER, metric_names=["accuracy", "loss"])
  return run_dir


def test_overview_png_has_both_panels(tmp_path):
  path = plotting.plot_overview(_write_run(tmp_path / "run"))
  assert path == str(tmp_path / "run" / "plots" / "overview.png")
  image = matplotlib.image.imread(path)
  # 2 tasks x 2 panels of 6.4 x 3.8 inches at 110 dpi.
  assert image.shape[:2] == (round(2 * 3.8 * 110), round(2 * 6.4 * 110))
  assert image.std() > 0


def test_overview_without_fidelity_has_the_left_panel_only(tmp_path):
  path = plotting.plot_overview(_write_run(tmp_path, fidelity=False))
  assert matplotlib.image.imread(path).shape[:2] == (round(2 * 3.8 * 110), round(6.4 * 110))
  (tmp_path / "metrics.jsonl").unlink()  # A summary alone is enough.
  assert matplotlib.image.imread(plotting.plot_overview(tmp_path)).shape[1] == 704


def test_overview_needs_the_summary(tmp_path):
  _write_run(tmp_path, summary=False)
  with pytest.raises(ValueError, match=r"summary\.json is missing"):
    plotting.plot_overview(tmp_path)
  assert not (tmp_path / "plots" / "overview.png").exists()


def test_plot_run_draws_the_overview_first(tmp_path):
  written = plotting.plot_run(_write_run(tmp_path))
  assert written[0] == str(tmp_path / "plots" / "overview.png") and len(written) > 1
  assert (tmp_path / "plots" / "overview.png").stat().st_size > 0
  (tmp_path / "summary.json").unlink()  # Still training: the curves, no overview.
  assert all(not p.endswith("overview.png") for p in plotting.plot_run(tmp_path))


def test_summary_md_links_the_overview(tmp_path):
  _write_run(tmp_path)
  lines = (tmp_path / "summary.md").read_text().splitlines()
  assert lines[:3] == ["# boolean (preset quick)", "", "![overview](plots/overview.png)"]
  assert set(json.loads((tmp_path / "summary.json").read_text())) == set(report.SUMMARY_KEYS)


def test_headline_metric():
  summary = {"members": _members(), "paper": PAPER}
  assert plotting.headline_metric(summary) == "accuracy"  # in the paper, though after loss.
  assert plotting.headline_metric({"members": _members(), "paper": {}}) == "loss"
  with pytest.raises(ValueError, match="no metrics"):
    plotting.headline_metric({"members": [{"metrics": {}}], "paper": {}})


def test_overview_metric_argument(tmp_path):
  _write_run(tmp_path)
  assert plotting.plot_overview(tmp_path, "loss").endswith("overview.png")
  with pytest.raises(ValueError, match=r"'sequence_accuracy'.*\['accuracy', 'loss'\]"):
    plotting.plot_overview(tmp_path, "sequence_accuracy")


def test_strip_panel_points_means_and_paper_ticks():
  fig, ax = plt.subplots()
  plotting._strip_panel(ax, _members(), [], "2parity", "accuracy", PAPER,
                        {"default": "C0", "mask": "C1"})
  bars = [p.get_height() for p in ax.patches]
  assert bars == pytest.approx([75.0, 75.0])  # percent; the diverged seed left out.
  seeds = [c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)]
  assert [len(p) for p in seeds] == [3, 2]
  assert sorted(seeds[1][:, 1]) == pytest.approx([50.0, 100.0])
  assert np.ptp(seeds[0][:, 0]) > 0  # jittered.
  paper = [seg for c in ax.collections if isinstance(c, LineCollection)
           for seg in c.get_segments()]
  assert [seg[:, 1].tolist() for seg in paper] == [[75.0, 75.0], [100.0, 100.0]]
  assert [c.get_color().tolist() for c in ax.collections
          if isinstance(c, LineCollection)] == [[[1.0, 0.0, 0.0, 1.0]]] * 2  # red.
  labels = [t.get_text() for t in ax.get_xticklabels()]
  assert labels == ["default\nn=3", "mask\nn=3 (1 diverged)"]
  plt.close(fig)


def test_fidelity_curves_mean_over_live_seeds_from_init(tmp_path):
  records = report.read_metrics(_write_run(tmp_path))
  curves = plotting._fidelity_curves(records, _members(), [], "2parity")
  steps, fidelity = curves[("mask",)]
  assert steps.tolist() == [0, *STEPS]
  assert fidelity.shape == (2, 4)  # seeds 0 and 1: seed 2 diverged.
  expected = [np.mean([_fidelity("mask", s, t) for s in (0, 1)]) for t in (0, *STEPS)]
  assert fidelity.mean(0) == pytest.approx(expected)
  assert curves[("default",)][1].shape == (3, 4)


def test_cells_split_by_varying_hparams():
  members = [{"task": "addition", "scheme": scheme, "seed": 0,
              "hparams": {"data_fraction": f, "mask_lr": float(scheme == "mask")}}
             for f in (0.01, 0.1) for scheme in ("default", "mask")]
  varying = plotting._varying_hparams(members)
  assert varying == {"addition": ["data_fraction"]}  # mask_lr: one per scheme.
  cells = [plotting._cell(m, varying["addition"]) for m in members]
  assert len(set(cells)) == 4
  assert plotting._cell_name(cells[1], varying["addition"]) == "mask\ndata_fraction=0.01"
