"""A list of values for a traced hyperparameter is a member axis inside each group: one
program, the same results as each value trained alone, exact resume."""

import dataclasses
import json
import pathlib

import jax
import matplotlib.collections
import numpy as np
import pytest

import sweep_fixtures as fx
import test_sweep_run
from mpx import cli, plotting, report
from mpx.sweep import config as config_lib
from mpx.sweep import engine, run

TOY = str(pathlib.Path(__file__).parent / "toy_experiment.py")
LRS = ["learning_rate=0.01,0.03"]


def _records(out):
  """{(group, scheme, seed, lr, step): record} of a run folder."""
  return {(r["group"], r["scheme"], r["seed"], r["hparams"]["learning_rate"], r["step"]): r
          for r in report.read_metrics(out)}


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
  """The toy (2 groups of 4 members) at 2 learning rates, and the training programs built:
  (group, members, members per call) per `make_train_chunk` call (one compile each)."""
  out = tmp_path_factory.mktemp("swept")
  programs, make = [], engine.make_train_chunk
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(run.jax, "default_backend", lambda: "cpu")  # Whatever runs the tests.
    patch.setattr(engine, "make_train_chunk", lambda group, steps: (
        programs.append((group.name, len(group.members), group.members_per_call)),
        make(group, steps))[1])
    assert cli.main(["run", TOY, "--out", str(out), "--set", LRS[0]]) == 0
  return out, programs


def test_sweep_values_parse_lists_and_ranges():
  assert config_lib.sweep_values("lr", "1e-3, 3e-3") == ["1e-3", "3e-3"]
  assert config_lib.sweep_values("lr", "logspace(1e-4,1e-2,3)") == ["0.0001", "0.001", "0.01"]
  assert config_lib.sweep_values("wd", "linspace(0,1,3)") == ["0", "0.5", "1"]
  for bad, named in [("logspace(0,1,3)", "ends > 0"), ("logspace(1e-4,1e-2)", "COUNT"),
                     ("linspace(a,1,3)", "numbers"), ("linspace(0,1,1)", "COUNT")]:
    with pytest.raises(ValueError, match=named):
      config_lib.sweep_values("lr", bad)


def test_traced_lists_are_members_and_static_lists_are_groups():
  experiment = config_lib.load_experiment("boolean_gotu")
  _, variants = config_lib.make_configs(experiment, "tiny", [
      "learning_rate=logspace(1e-3,1e-2,3)", "mask_lr_multiplier=0.5,1", "width=8,16",
      "seeds=2"])
  assert [labels for labels, _ in variants] == [{"width": 8}, {"width": 16}]
  assert config_lib.traced_values(variants) == {
      "learning_rate": [0.001, 0.00316228, 0.01], "mask_lr_multiplier": [0.5, 1.0]}
  group, = run._built(experiment, variants[0][1])[0:1]
  merged = run._merged(group, mesh=None, platform="cpu")
  by_scheme = {s: [m for m in merged.members if m.scheme == s] for s in ("default", "mask")}
  # The default scheme ignores the mask multiplier (0): its members are not repeated.
  assert len(by_scheme["default"]) == 3 * 2 and len(by_scheme["mask"]) == 3 * 2 * 2
  assert len(merged.probe.patterns) == len(merged.members)
  # One program in slices of one value's group (as fast per member-step as L programs on
  # a CPU, where one vmap of all is slower), and the plan printed before training says so.
  k = len(group[0].members)
  assert merged.members_per_call == k < len(merged.members)
  assert f"{merged.name} {len(merged.members)} in slices of {k}" in run.plan(
      [merged], None, "out", None)
  # One vmap on a mesh (slices would serialise members sharded over devices) and on an
  # accelerator.
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), (engine.MEMBER_AXIS,))  # Any mesh.
  assert run._merged(group, mesh, platform="cpu").members_per_call is None
  assert run._merged(group, mesh=None, platform="gpu").members_per_call is None


def test_per_member_rows_follow_their_members():
  """Each member's own data rows (and probe pattern) go where the member goes."""
  groups = []
  for lr in (0.01, 0.03):
    g = fx.group([fx.member(0, "default", lr=lr), fx.member(1, "mask", lr=lr)],
                 per_member=True)
    rows = {k: v + np.arange(2).reshape((2,) + (1,) * (v.ndim - 1)) * (1 + lr)
            for k, v in g.data.arrays.items()}
    groups.append(dataclasses.replace(g, data=dataclasses.replace(g.data, arrays=rows)))
  merged = engine.merge_groups(groups)
  assert [(m.seed, m.hparams["learning_rate"]) for m in merged.members] == [
      (0, 0.01), (1, 0.01), (0, 0.03), (1, 0.03)]
  for k, (g, i) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
    np.testing.assert_array_equal(merged.data.arrays["x"][k], groups[g].data.arrays["x"][i])
  with pytest.raises(ValueError, match="one group built at several values"):
    engine.merge_groups([groups[0], dataclasses.replace(groups[1], name="other")])


def test_one_program_for_every_value_and_each_value_as_if_alone(swept, tmp_path):
  out, programs = swept
  # Not one program per value; its members mapped in slices of one value's 4 (on a CPU a
  # vmap of all 8 is slower per member-step than 2 programs of 4).
  assert programs == [("toy_a", 8, 4), ("toy_b", 8, 4)]
  assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["toy_a", "toy_b"]
  summary = json.loads((out / "summary.json").read_text())
  assert {m["group"] for m in summary["members"]} == {"toy_a", "toy_b"}
  assert json.loads((out / "config.json").read_text())["traced"] == {
      "learning_rate": [0.01, 0.03]}
  records = _records(out)
  numbers = lambda r: np.array([v for _, v in sorted(r.items()) if isinstance(v, float)])
  # Bit-exact with jax 0.10 (slices of 4 as the groups of 4 alone); a tolerance because XLA
  # may compile a vmap inside the slice loop differently (jax 0.12 moved the last of 3
  # metrics by 8e-6 relative when all 8 were vmapped). The other learning rate's numbers
  # differ by far more than this tolerance (checked below).
  close = lambda a, b: np.allclose(a, b, rtol=2e-5, atol=1e-6)
  for lr in ("0.01", "0.03"):
    alone = tmp_path / lr
    assert cli.main(["run", TOY, "--no-plots", "--out", str(alone), "--set", f"learning_rate={lr}"]) == 0
    for key, record in _records(alone).items():
      assert sorted(records[key]) == sorted(record)
      assert close(numbers(records[key]), numbers(record)), (key, records[key], record)
  assert len(records) == 2 * len(_records(alone))
  trained = [k for k in records if k[-1] > 0 and k[3] == 0.01]
  assert trained and not any(close(numbers(records[k]), numbers(records[k[:3] + (0.03,) + k[4:]]))
                             for k in trained)


def test_a_swept_run_resumes_exactly_after_sigterm(swept, tmp_path):
  out, _ = swept
  resumed = tmp_path / "resumed"
  test_sweep_run._run_preempted_then_resume(resumed, LRS, values=2)
  assert (resumed / "metrics.jsonl").read_bytes() == (out / "metrics.jsonl").read_bytes()
  summary = lambda d: json.loads((d / "summary.json").read_text())
  assert summary(resumed)["members"] == summary(out)["members"]


def test_a_folder_of_an_earlier_meaning_is_not_resumed():
  """Before, a comma list of learning rates trained one group per value (`sweep`)."""
  earlier = {"experiment": "toy", "preset": "default", "config": {"learning_rate": 0.01},
             "sweep": {"learning_rate": [0.01, 0.03]}}
  now = {"experiment": "toy", "preset": "default", "config": {"learning_rate": 0.01},
         "traced": {"learning_rate": [0.01, 0.03]}}
  assert run._config_differences(earlier, now) == ["sweep", "traced"]


def test_the_sensitivity_figure_has_a_line_per_scheme_and_a_point_per_seed(swept):
  out, _ = swept
  assert (out / "plots" / "sensitivity_learning_rate.png").exists()
  summary = json.loads((out / "summary.json").read_text())
  assert plotting.swept_hparams(summary) == ["learning_rate"]
  colors = plotting.scheme_colors(m["scheme"] for m in summary["members"])
  fig = plotting.sensitivity_figure(summary, "learning_rate", "mean_output", colors)
  for ax, task in zip(fig.axes, ("toy",)):
    mine = [m for m in summary["members"] if m["task"] == task]
    points = np.concatenate([c.get_offsets() for c in ax.collections
                             if isinstance(c, matplotlib.collections.PathCollection)])
    assert len(points) == len(mine)                       # Every seed, every value.
    np.testing.assert_allclose(sorted(points[:, 1]), sorted(m["metrics"]["mean_output"]
                                                            for m in mine), rtol=1e-6)
    assert {line.get_label().split(" (")[0] for line in ax.get_lines()} >= {"mask", "default"}


def test_run_help_names_the_traced_fields(capsys):
  with pytest.raises(SystemExit):
    cli.main(["run", "--help"])
  text = " ".join(capsys.readouterr().out.split())
  assert all(name in text for name in config_lib.TRACED) and "logspace(" in text
