"""The overview figure: a synthetic run folder written through mpx.report, read back."""

import json
import pathlib
import re
import warnings

import matplotlib

matplotlib.use("Agg")
import matplotlib.figure  # noqa: E402
import matplotlib.image  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import LineCollection, PathCollection  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mpx import cli, plotting, priors, report  # noqa: E402

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


def _write_run(run_dir, *, fidelity=True, summary=True, steps=STEPS):
  with report.MetricsWriter(run_dir) as w:
    for step in steps:
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


def test_a_run_evaluated_once_has_no_curves(tmp_path):
  names = {pathlib.Path(p).name for p in plotting.plot_run(_write_run(tmp_path, steps=(30,)))}
  assert names == {"overview.png"}
  _boolean_run(tmp_path / "once", steps=(20,))  # Layers, maps and degree profiles too.
  names = {pathlib.Path(p).name for p in plotting.plot_run(tmp_path / "once")}
  assert names == {"overview.png", "2parity_block_0_attention.png"}, names
  names = {pathlib.Path(p).name
           for p in plotting.plot_run(_write_run(tmp_path / "twice", steps=(20, 30)))}
  assert {"2parity_accuracy.png", "cyclic3_accuracy.png"} <= names


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
          if isinstance(c, LineCollection)] == [[[0.0, 0.0, 0.0, 1.0]]] * 2  # black.
  labels = [t.get_text() for t in ax.get_xticklabels()]
  assert labels == ["default\nn=3", "mask\nn=3\n1 diverged"]
  plt.close(fig)


@pytest.mark.parametrize("values", [3, 8])
def test_the_overview_s_tick_labels_do_not_overlap(values):
  """A learning-rate sweep of up to 8 values and 2 schemes (16 strips, one with a diverged
  seed): each tick label clear of its neighbours, the swept key named once on the axis."""
  rates = np.logspace(-4, -1.5, values)
  members = [{"task": "2parity", "scheme": scheme, "seed": seed,
              "hparams": dict(HP, learning_rate=float(lr)), "diverged": seed == 2 and i == 0,
              "metrics": {"accuracy": 0.5 + 0.05 * seed}}
             for i, lr in enumerate(rates) for scheme in ("default", "mask")
             for seed in range(3)]
  summary = {"experiment": "boolean", "preset": "quick", "members": members, "paper": {}}
  fig = plotting.overview_figure(summary, [], "accuracy", {"default": "C0", "mask": "C1"})
  renderer = fig.canvas.get_renderer()
  ax = fig.axes[0]
  boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
  assert len(boxes) == 2 * values
  gaps = [b.x0 - a.x1 for a, b in zip(boxes, boxes[1:])]
  assert min(gaps) > 0, gaps
  assert ax.get_xlabel() == "scheme / learning_rate / seeds"
  assert ax.get_xticklabels()[2].get_text() == f"default\n{rates[1]:.3g}\nn=3"
  assert ax.get_xticklabels()[0].get_text() == "default\n0.0001\nn=3\n1 diverged"
  figure = fig.get_window_extent(renderer)  # Every label inside the figure.
  assert boxes[0].x0 >= figure.x0 and boxes[-1].x1 <= figure.x1
  assert min(b.y0 for b in boxes) >= figure.y0
  plt.close(fig)


def test_strip_panel_names_the_paper_only_where_it_drew_its_number():
  """A task without the paper's numbers (an experiment with PAPER = {}, or a task the
  paper leaves out) has no "paper (black)" in its title: there is no black tick."""
  for task, paper, named in (("2parity", PAPER, True), ("2parity", {}, False),
                             ("2parity", {"cyclic3": PAPER["cyclic3"]}, False)):
    fig, ax = plt.subplots()
    plotting._strip_panel(ax, _members(), [], task, "accuracy", paper,
                          {"default": "C0", "mask": "C1"})
    assert ("paper (black)" in ax.get_title()) == named, (paper, ax.get_title())
    assert ax.get_title().startswith("2parity: final accuracy: seeds (points), mean (bar)")
    plt.close(fig)


def test_fidelity_curves_mean_over_live_seeds_from_init(tmp_path):
  records = report.read_metrics(_write_run(tmp_path))
  curves = plotting._fidelity_curves(records, _members(), "2parity")
  steps, fidelity = curves[report.cell_key(_members()[3])]
  assert report.cell_key(_members()[3])[1] == "mask"
  assert steps.tolist() == [0, *STEPS]
  assert fidelity.shape == (2, 4)  # seeds 0 and 1: seed 2 diverged.
  expected = [np.mean([_fidelity("mask", s, t) for s in (0, 1)]) for t in (0, *STEPS)]
  assert fidelity.mean(0) == pytest.approx(expected)
  assert curves[report.cell_key(_members()[0])][1].shape == (3, 4)


def test_cells_split_by_varying_hparams():
  members = [{"task": "addition", "scheme": scheme, "seed": 0,
              "hparams": {"data_fraction": f, "mask_lr": float(scheme == "mask")}}
             for f in (0.01, 0.1) for scheme in ("default", "mask")]
  varying = plotting._varying(members)
  assert varying == {"addition": ["data_fraction"]}  # mask_lr: one per scheme.
  cells = [report.cell_key(m) for m in members]
  assert len(set(cells)) == 4
  assert report.cell_label(cells[1], varying["addition"], "\n") == "mask\ndata_fraction=0.01"


# ----------------------------------------------------------------------------- every figure


def _record_figures(monkeypatch) -> dict:
  """{file name: figure} of every figure saved from now on (until `monkeypatch` undoes)."""
  figures = {}
  save = matplotlib.figure.Figure.savefig

  def record(fig, path, *args, **kwargs):
    figures[pathlib.Path(path).name] = fig
    return save(fig, path, *args, **kwargs)

  monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
  return figures


@pytest.fixture
def drawn(monkeypatch):
  """{file name: figure} of every figure saved while the test runs."""
  return _record_figures(monkeypatch)


SCHEMES = ("default", "qk_svd", "qk_opt", "mask")  # A Boolean run's order: not sorted.


def _boolean_run(run_dir, steps=(0, 10, 20)):
  """A run of 4 schemes whose records hold everything plot_run draws (curves, fidelity,
  attention maps over CLS and 3 bits, degree profiles), all schemes alike: their curves
  coincide."""
  members = [{"task": "2parity", "scheme": scheme, "seed": seed, "hparams": HP,
              "metrics": {"accuracy": 0.75}, "diverged": False}
             for scheme in SCHEMES for seed in (0, 1)]
  values = {"accuracy": 0.75, "fidelity": 0.5, "fidelity_init": 0.6,
            "prior_pattern": np.eye(4).tolist(), "degree_profile": [0.1, 0.5, 0.4, 0.0],
            "layers": {"block_0": {"fidelity": 0.5,
                                   "attention_map": np.full((4, 4), 0.25).tolist()}}}
  with report.MetricsWriter(run_dir) as w:
    for step in steps:
      w.write([report.member_record(m, step, values, diverged=False) for m in members])
  report.write_summary(run_dir, experiment="boolean_gotu", preset="test", members=members,
                       paper=PAPER, metric_names=["accuracy"])
  (run_dir / "config.json").write_text(json.dumps({"experiment": "boolean_gotu",
                                                   "preset": "test", "config": {}}))
  return run_dir


@pytest.fixture(scope="module")
def boolean_plots(tmp_path_factory):
  """(run folder, {file name: figure}, warnings) of `plot_run` on `_boolean_run`."""
  run_dir = _boolean_run(tmp_path_factory.mktemp("boolean"))
  with pytest.MonkeyPatch.context() as monkeypatch, \
       warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    figures = _record_figures(monkeypatch)
    plotting.plot_run(run_dir)
  return run_dir, figures, caught


def _scheme_colours(fig) -> dict[str, set[str]]:
  """{scheme: colours} a figure gives each scheme: its labelled lines, its bars (named by
  their tick) and the titles and axis labels that name a scheme (heatmap rows, panels)."""
  seen: dict = {}
  add = lambda text, color: seen.setdefault(re.split(r"[ ,\n]", text)[0], set()).add(
      to_hex(color))
  for ax in fig.axes:
    for line in ax.get_lines():
      if not line.get_label().startswith(("_", "degree")):
        add(line.get_label(), line.get_color())
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    for bar in ax.patches:
      add(ticks[round(bar.get_x() + bar.get_width() / 2)], bar.get_facecolor())
    for text in (ax.title, ax.yaxis.label):
      if re.split(r"[ ,\n]", text.get_text())[0] in SCHEMES:
        add(text.get_text(), text.get_color())
  return seen


def test_every_figure_gives_a_scheme_one_colour(boolean_plots):
  _, drawn, _ = boolean_plots
  seen: dict = {}
  for name, fig in drawn.items():
    for scheme, colours in _scheme_colours(fig).items():
      seen.setdefault(scheme, {})[name] = colours
  assert {"overview.png", "2parity_accuracy.png", "2parity_block_0_attention.png",
          "2parity_degree_profile.png"} <= set(seen["mask"])
  one = {scheme: set().union(*by_figure.values()) for scheme, by_figure in seen.items()}
  assert all(len(colours) == 1 for colours in one.values()), seen
  assert one == {s: {to_hex(c)} for s, c in plotting.scheme_colors(SCHEMES).items()}


def test_scheme_colors_are_fixed_and_spare_the_paper():
  mine = plotting.scheme_colors(SCHEMES)
  assert mine == plotting.scheme_colors(reversed(SCHEMES)) == {
      s: plotting.scheme_colors(SCHEMES + ("mimetic",))[s] for s in SCHEMES}
  other = plotting.scheme_colors(["mask:window", "mask:impulse", "default"])
  assert other["default"] == mine["default"]
  assert other["mask:impulse"] == plotting.SPARE_COLORS[0]  # Name order.
  every = plotting.scheme_colors([*plotting.SCHEME_COLORS, "mine", "yours"])
  hexes = [to_hex(c) for c in every.values()]
  assert len(set(hexes)) == len(hexes) and to_hex(plotting.PAPER_COLOR) not in hexes


def test_accuracy_is_in_percent_as_in_the_tables(boolean_plots):
  run_dir, drawn, _ = boolean_plots
  ax = drawn["2parity_accuracy.png"].axes[0]
  assert ax.get_ylabel() == "accuracy (%)"
  assert all(np.asarray(line.get_ydata()).tolist() == [75.0] * 3 for line in ax.get_lines())
  assert "| accuracy (%) |" in (run_dir / "summary.md").read_text()
  assert drawn["overview.png"].axes[0].get_ylabel() == "accuracy (%)"


def test_a_metric_s_figures_say_what_the_summary_s_legend_says(boolean_plots):
  """The overview's strip, a curve and the fidelity panel carry, below their heading, the
  one description of their metric that summary.md's legend prints."""
  run_dir, drawn, _ = boolean_plots
  legend = (run_dir / "summary.md").read_text()
  for ax, metric in ((drawn["overview.png"].axes[0], "accuracy"),
                     (drawn["overview.png"].axes[1], "fidelity"),
                     (drawn["2parity_accuracy.png"].axes[0], "accuracy"),
                     (drawn["2parity_block_0_fidelity.png"].axes[0], "fidelity")):
    description = " ".join(ax.get_title().splitlines()[1:])
    assert description == report.METRIC_DESCRIPTIONS[metric], metric
  accuracy = report.METRIC_DESCRIPTIONS["accuracy"]
  assert f"- `accuracy (%)`: {accuracy}; {report.PERCENT_NOTE}\n" in legend


def test_coinciding_curves_stay_visible(boolean_plots):
  _, drawn, _ = boolean_plots
  for name in ("2parity_accuracy.png", "2parity_block_0_fidelity.png", "overview.png"):
    lines = [line for ax in drawn[name].axes for line in ax.get_lines()
             if not line.get_label().startswith("_")]
    assert len(lines) == 4  # On top of each other ...
    assert len({line.get_marker() for line in lines}) == 4  # ... in four hollow shapes.
    assert {line.get_markerfacecolor() for line in lines} == {"none"}


def test_attention_heatmaps_name_their_tokens(boolean_plots):
  _, drawn, _ = boolean_plots
  axes = [ax for ax in drawn["2parity_block_0_attention.png"].axes if ax.images]
  assert len(axes) == 4 * len(SCHEMES)
  for ax in axes:
    for ticks, labels in ((ax.get_xticks(), ax.get_xticklabels()),
                          (ax.get_yticks(), ax.get_yticklabels())):
      assert ticks.tolist() == [0, 1, 2, 3]
      assert [t.get_text() for t in labels] == ["CLS", "x0", "x1", "x2"]


def test_token_labels_by_family():
  plain = {"experiment": "arithmetic", "config": {"digits": 3, "reverse_answer": False}}
  assert plotting.token_labels(plain, "addition", 13) == [
      "BOS", "a2", "a1", "a0", "+", "b2", "b1", "b0", "=", "c3", "c2", "c1", "c0"]
  reverse = {"experiment": "arithmetic", "config": {"digits": 2, "reverse_answer": True}}
  assert plotting.token_labels(reverse, "multiplication", 11)[3:] == [
      "*", "b1", "b0", "=", "c0", "c1", "c2", "c3"]
  vit = {"experiment": "vision", "config": {"image_size": 8, "patch_size": 2, "pool": "cls"}}
  assert plotting.token_labels(vit, "digits", 17)[:6] == ["CLS", "0,0", "0,1", "0,2", "0,3",
                                                          "1,0"]
  vit["config"]["pool"] = "gap"
  assert plotting.token_labels(vit, "digits", 16)[-1] == "3,3"
  gotu = {"experiment": "boolean_gotu", "config": {}}
  assert plotting.token_labels(gotu, "2parity", 16) == ["CLS", *(f"x{i}" for i in range(15))]
  discover = {"experiment": "discover_prior", "config": {}}
  assert plotting.token_labels(discover, "2parity", 16) == ["CLS", *(f"x{i}" for i in range(15))]
  positions = [str(i) for i in range(5)]
  assert plotting.token_labels({"experiment": "language"}, "kjv-bytes", 5) == positions
  assert plotting.token_labels(vit, "digits", 5) == positions  # Not its layout: positions.
  assert plotting.token_labels({}, "2parity", 5) == positions  # No config.json.


def test_prior_command_names_tokens_and_impulse_shifts(tmp_path, drawn):
  assert cli.main(["prior", "impulse", "--grid", "3", "3", "--heads", "3",
                   "--out", str(tmp_path / "impulse.png")]) == 0
  axes = [ax for ax in drawn["impulse.png"].axes if ax.images]
  assert [ax.get_title() for ax in axes] == ["head 0: reads (r+0, c+0)",
                                             "head 1: reads (r-1, c+0)",
                                             "head 2: reads (r+0, c+1)"]
  assert priors.impulse_shifts(3) == [(0, 0), (-1, 0), (0, 1)]
  assert [t.get_text() for t in axes[0].get_xticklabels()][:3] == ["CLS", "0,0", "0,1"]
  assert cli.main(["prior", "multiplication", "--digits", "2",
                   "--out", str(tmp_path / "times.png")]) == 0
  (ax,) = [ax for ax in drawn["times.png"].axes if ax.images]
  assert [t.get_text() for t in ax.get_yticklabels()] == [
      "BOS", "a1", "a0", "*", "b1", "b0", "=", "c0", "c1", "c2", "c3"]


def test_many_tokens_get_every_kth_integer_tick():
  fig = plotting.prior_figure(priors.neutral(50))
  ax = fig.axes[0]
  assert ax.get_xticks().tolist() == list(range(0, 50, 3))
  assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["0", "3"]
  plt.close(fig)


def test_degree_profile_label_renders(boolean_plots):
  _, drawn, caught = boolean_plots
  assert not [w for w in caught if "missing from" in str(w.message)]  # No glyph lacks.
  label = drawn["2parity_degree_profile.png"].axes[0].get_ylabel()
  plain = label.split("$")[::2]  # Outside mathtext, TeX syntax would print as it is.
  assert len(plain) == 2 and not re.search(r"[_^{}\\]", "".join(plain)), label
