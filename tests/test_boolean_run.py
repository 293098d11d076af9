"""The Boolean experiment end to end at the `tiny` preset: records, summary and plots."""

import matplotlib.image
import numpy as np
import pytest

from mpx import cli, report


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("tiny")
  assert cli.main(["run", "boolean_gotu", "--preset", "tiny", "--out", str(out)]) == 0
  return out


def test_evaluations_start_at_init_with_attention_maps(tiny_run):
  records = report.read_metrics(tiny_run)
  assert sorted({r["step"] for r in records}) == [0, 48, 96]
  for r in records:
    attention = np.asarray(r["layers"]["block_0"]["attention_map"])
    assert attention.shape == (16, 16)
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=2e-3)  # 4-decimal rounding.
    assert np.asarray(r["prior_pattern"]).shape == (16, 16)
    assert len(r["degree_profile"]) == 16
  at_init = {r["scheme"]: r for r in records if r["step"] == 0}
  # The probe holds both domains, so fidelity is reported on each; the prior holds at init
  # (strength 4) on both, while the default init spreads its attention.
  for scheme in ("default", "mask"):
    assert {"fidelity_seen", "fidelity_unseen"} <= set(at_init[scheme])
  assert min(at_init["mask"]["fidelity_seen"], at_init["mask"]["fidelity_unseen"]) > 0.7
  assert at_init["default"]["fidelity"] < 0.5 * at_init["mask"]["fidelity"]
  end = {r["scheme"]: r for r in records if r["step"] == 96}
  assert end["mask"]["drift_mask"] > 0                      # The mask trained ...
  assert end["default"]["drift_qk"] > end["mask"]["drift_mask"]  # ... and moved least.


def test_fit_returns_the_diagnostics_without_the_heatmaps_arrays():
  """`run.fit`'s metrics (what a user prints) hold the probe's diagnostics but none of the
  heatmaps' [N, N] lists (each member's prior pattern, the mapped layers' attention),
  which `mpx run`'s records keep for its figures (above)."""
  import dataclasses
  import mpx.experiments.boolean_gotu as gotu
  from mpx.sweep import config as config_lib
  from mpx.sweep import run

  def lists_of_lists(tree):
    if isinstance(tree, dict):
      return [k for key, value in tree.items() for k in
              ([key] if isinstance(value, list) and value and isinstance(value[0], list)
               else lists_of_lists(value))]
    return []

  _, config = config_lib.make_config(gotu, "tiny")
  group, = gotu.build_groups(config)
  assert group.probe.map_layers  # The family records attention maps for its heatmaps.
  _, metrics = run.fit(dataclasses.replace(group, steps=2), chunk_steps=2)
  for m in metrics:
    assert {"fidelity", "fidelity_init", "drift_mask"} <= set(m)
    assert {"fidelity", "drift_query"} <= set(m["layers"]["block_0"])
    assert lists_of_lists(m) == [], lists_of_lists(m)


def test_summary_has_the_persistence_table(tiny_run):
  md = (tiny_run / "summary.md").read_text()
  assert "## Persistence of the prior" in md
  assert "- 2parity / mask: " in md
  # Both tables open with what their columns mean; every metric of them is described.
  assert md.count("Columns:\n") == 2 and report.UNDESCRIBED not in md
  unseen = report.METRIC_DESCRIPTIONS["accuracy_unseen"]
  assert f"- `accuracy_unseen (%)`: {unseen}; {report.PERCENT_NOTE}\n" in md
  assert "- `paper accuracy (%)`: the paper's number for accuracy" in md


def test_plots_include_heatmaps_and_degree_profiles(tiny_run):
  names = {p.name for p in (tiny_run / "plots").glob("*.png")}
  assert {"2parity_block_0_attention.png", "2parity_degree_profile.png",
          "2parity_block_0_fidelity.png", "2parity_block_0_drift_query.png",
          "2parity_block_0_grad_norm_mask.png", "2parity_accuracy.png",
          "2parity_accuracy_seen.png", "2parity_accuracy_unseen.png",
          "2parity_loss_seen.png"} <= names
  for name in ("2parity_block_0_attention.png", "2parity_degree_profile.png"):
    image = matplotlib.image.imread(tiny_run / "plots" / name)
    assert image.shape[0] > 200 and image.shape[1] > 400 and image.std() > 0


def test_cudnn_attention_is_refused_until_measured_right(monkeypatch):
  """cuDNN attention under the engine's vmap gave NaN losses on an H200 (jax 0.11.2):
  a run asking for it stops before any compile, naming the measurement and the fix."""
  from mpx.tasks.boolean import gotu as boolean_gotu
  monkeypatch.delenv("MPX_MEASURE_CUDNN", raising=False)
  with pytest.raises(ValueError, match=r"accelerator_check_h200.*attention=reference"):
    boolean_gotu.Config(attention="cudnn")
  assert boolean_gotu.Config(attention="jax").attention == "jax"
  monkeypatch.setenv("MPX_MEASURE_CUDNN", "1")  # The accelerator check's way to measure it.
  assert boolean_gotu.Config(attention="cudnn").attention == "cudnn"
