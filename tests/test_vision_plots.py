"""`mpx plot` draws every figure of a vision run (so `mpx run vision` ends with its plots):
the fraction curve takes vision's headline metric (accuracy), the heatmaps name the
patches. The `tiny` preset (one group, 8 steps) evaluated at steps 0, 4 and 8, so that it has
curves to draw (a run evaluated once has none: its final values are in the overview)."""

import pytest

pytest.importorskip("tensorflow_datasets")
pytest.importorskip("grain")
pytest.importorskip("sklearn")

from mpx import cli  # noqa: E402
from mpx.sweep import config as config_lib  # noqa: E402
from mpx.sweep import run  # noqa: E402
from test_plotting import _record_figures  # noqa: E402


def test_mpx_plot_draws_every_figure_of_a_vision_run(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("MPX_CACHE_DIR", str(tmp_path / "mpx-cache"))
  run_dir = tmp_path / "run"
  run.run_experiment(config_lib.load_experiment("vision"), preset="tiny", out_dir=run_dir,
                     overrides=["eval_every=4"])
  drawn = _record_figures(monkeypatch)
  assert cli.main(["plot", str(run_dir)]) == 0
  assert f"wrote {len(drawn)} PNG files in {run_dir}/plots" in capsys.readouterr().out
  assert {"overview.png", "fraction_curve.png", "digits_accuracy.png", "digits_loss.png",
          "digits_block_0_fidelity.png", "digits_block_0_attention.png"} <= set(drawn)
  assert drawn["fraction_curve.png"].axes[0].get_ylabel() == "accuracy (%)"
  heatmap = next(ax for ax in drawn["digits_block_0_attention.png"].axes if ax.images)
  # tiny: 8-px digits in 2-px patches, a 4x4 grid behind a CLS token.
  assert [t.get_text() for t in heatmap.get_xticklabels()][:6] == [
      "CLS", "0,0", "0,1", "0,2", "0,3", "1,0"]
