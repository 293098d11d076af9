"""experiments/*.py are records: short, importing the library and no other experiment, and
the presets that say they are another experiment's model are that model."""

import ast
import pathlib

import pytest

from mpx.sweep import config as config_lib

ROOT = pathlib.Path(__file__).parents[1]
RECORDS = sorted(p for p in (ROOT / "experiments").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_a_record_is_short_and_imports_no_experiment(path):
  assert len(path.read_text().splitlines()) <= 120, path.name
  imported = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom):
      imported.append(node.module or "")
    elif isinstance(node, ast.Import):
      imported += [alias.name for alias in node.names]
  assert not [m for m in imported if m.startswith("mpx.experiments")], path.name


def _preset(name, preset):
  return config_lib.load_experiment(name).PRESETS[preset]


MODEL = ("width", "depth", "num_heads", "head_dim", "mlp_dim", "learning_rate", "epochs")


@pytest.mark.parametrize("preset", ["quick", "cpu"])
def test_the_boolean_studies_train_boolean_gotus_model(preset):
  """discover_boolean and boolean_coverage say their default / mask arms are boolean_gotu's
  members of the same preset: the same model, learning rate and epochs."""
  gotu = _preset("boolean_gotu", preset)
  for name in ("discover_boolean", "boolean_coverage"):
    assert {k: _preset(name, preset)[k] for k in MODEL} == {k: gotu[k] for k in MODEL}, name
  coverage = _preset("boolean_coverage", preset)
  assert {k: v for k, v in coverage.items() if k not in ("schemes", "tasks")} == gotu


def test_discover_planted_cpu_is_discover_booleans_cpu_model():
  """discover_planted's cpu preset is boolean_gotu's cpu model (as discover_boolean's),
  with at least 2 seeds."""
  planted = _preset("discover_planted", "cpu")
  assert {k: planted[k] for k in MODEL} == {k: _preset("boolean_gotu", "cpu")[k] for k in MODEL}
  assert planted["seeds"] >= 2


def test_discover_arithmetic_quick_is_arithmetics_quick():
  theirs = {k: v for k, v in _preset("arithmetic", "quick").items() if k != "schemes"}
  assert _preset("discover_arithmetic", "quick") == theirs


def test_every_metric_a_summary_or_a_figure_shows_has_its_description():
  """Every column of a built-in experiment's summary.md (its METRICS, the persistence
  table's, the validation metrics selection reads) and every metric a figure draws has
  the one description that the table's legend and the figure's title print."""
  from mpx import plotting, report
  from mpx.sweep import run
  shown = {"persistence table": run.PERSISTENCE_METRICS, "curves": plotting.CURVE_METRICS,
           "layer curves": plotting.LAYER_METRICS}
  for name in config_lib.available_experiments():
    experiment = config_lib.load_experiment(name)
    shown[name] = (*experiment.METRICS, *(n for n, _ in getattr(experiment, "VALIDATION", ())))
  undescribed = {where: missing for where, names in shown.items()
                 if (missing := [m for m in names if report.metric_description(m) is None])}
  assert not undescribed
