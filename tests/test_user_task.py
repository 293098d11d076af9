"""A user-defined Boolean task trains through the public API, as the README shows."""

import json

import numpy as np
import pytest

import mpx.experiments.boolean_gotu as gotu
from mpx import cli, priors
from mpx.sweep import config as config_lib
from mpx.tasks import boolean


@pytest.fixture(scope="module")
def parity3():
  return boolean.register_task(boolean.make_task(
      "parity3", target=lambda x: x[:, 0] * x[:, 1] * x[:, 2],
      seen=lambda x: (x[:, 0] > 0) | (x[:, 1] > 0), n_bits=15, support=(0, 1, 2)))


def test_the_mask_prior_comes_from_the_support(parity3):
  _, config = config_lib.make_config(gotu, "tiny", ["tasks=parity3"])
  group, = gotu.build_groups(config)
  mask = next(m for m in group.members if m.scheme == "mask")
  leaf = group.task.init(mask)["block_0"]["attention"]["mask_logits"]
  np.testing.assert_array_equal(leaf, np.broadcast_to(priors.parity_prior(15, (0, 1, 2)),
                                                      leaf.shape))
  assert group.data.num_examples == int(parity3.seen(boolean.cube(15)).sum())


def test_unknown_and_unprotocolled_tasks_are_errors(parity3):
  with pytest.raises(ValueError, match="register_task"):
    config_lib.make_config(gotu, "tiny", ["tasks=parity4"])
  with pytest.raises(ValueError, match="no GOTU protocol"):
    config_lib.make_config(gotu, "paper", ["tasks=parity3"])
  with pytest.raises(ValueError, match="built-in"):
    boolean.register_task(boolean.get_task("2parity"))
  no_support = boolean.make_task("nosupport", parity3.target, parity3.seen, 15)
  boolean.register_task(no_support)
  _, config = config_lib.make_config(gotu, "tiny", ["tasks=nosupport"])
  with pytest.raises(ValueError, match="support"):
    gotu.build_groups(config)


def test_an_experiment_file_of_ones_own_loads(tmp_path):
  """The README's command-line route: a file that registers a task and star-imports the
  Boolean experiment is an experiment `mpx run` accepts."""
  path = tmp_path / "my_tasks.py"
  path.write_text(
      "from mpx.experiments.boolean_gotu import *\n"
      "from mpx.tasks import boolean\n"
      "boolean.register_task(boolean.make_task(\n"
      "    'parity3b', target=lambda x: x[:, 0] * x[:, 1] * x[:, 2],\n"
      "    seen=lambda x: (x[:, 0] > 0) | (x[:, 1] > 0), n_bits=15, support=(0, 1, 2)))\n")
  experiment = config_lib.load_experiment(str(path))
  _, config = config_lib.make_config(experiment, "quick", ["tasks=parity3b"])
  assert config.tasks == ("parity3b",)
  assert [g.name for g in experiment.build_groups(config)] == ["parity3b"]


def test_a_run_of_ones_own_file_records_it_and_refuses_a_changed_task(tmp_path, monkeypatch,
                                                                     capsys):
  """Its folder is named after the file, not the star-imported experiment; config.json
  holds the command that reproduces it and each task's fingerprint, so a resume after
  the task's definition changed is refused."""
  source = ("from mpx.experiments.boolean_gotu import *\n"
            "from mpx.tasks import boolean\n"
            "boolean.register_task(boolean.make_task(\n"
            "    'mine', target=lambda x: {target}, seen=lambda x: x[:, 0] > 0, n_bits=6,\n"
            "    support=(0, 1)))\n")
  path = tmp_path / "my_tasks.py"
  path.write_text(source.format(target="x[:, 0] * x[:, 1]"))
  monkeypatch.chdir(tmp_path)
  args = ["run", str(path), "--preset", "tiny", "--set", "tasks=mine", "--set", "batch_size=8",
          "--set", "probe_size=16"]
  assert cli.main(args) == 0
  out = tmp_path / "runs" / "my_tasks-tiny"
  saved = json.loads((out / "config.json").read_text())
  assert saved["experiment"] == "boolean_gotu"
  assert saved["run"] == {"experiment_file": str(path), "command": (
      f"mpx run {path} --preset tiny --set tasks=mine --set batch_size=8 --set probe_size=16 "
      "--out "
      "runs/my_tasks-tiny")}
  assert capsys.readouterr().err.startswith(saved["run"]["command"])
  assert saved["fingerprint"]["mine"]["support"] == [0, 1]
  assert saved["fingerprint"]["mine"]["seen"] == 32
  assert saved["fingerprint"]["mine"]["cube_sha256"] in (out / "summary.md").read_text()
  # Unchanged, the file loaded again gives the same fingerprint (a resume goes on).
  reloaded = config_lib.load_experiment(str(path))
  assert reloaded.fingerprint(config_lib.make_config(reloaded, "tiny", ["tasks=mine"])[1]) == (
      saved["fingerprint"])
  path.write_text(source.format(target="x[:, 1]"))
  with pytest.raises(SystemExit):
    cli.main(args + ["--resume"])
  assert "fingerprint.mine" in capsys.readouterr().err


def test_a_file_whose_config_is_no_sweep_config_is_one_line_naming_the_base(tmp_path, capsys):
  """A plain dataclass passes the attribute check but lacks the fields the run reads:
  exit 2 in one line naming SweepConfig, before anything is written (not a traceback)."""
  path = tmp_path / "plain.py"
  path.write_text("import dataclasses\n"
                  "@dataclasses.dataclass(frozen=True)\n"
                  "class Config:\n"
                  "  steps: int = 10\n"
                  "PRESETS = {'tiny': {}}\n"
                  "METRICS = ('loss',)\n"
                  "PAPER = {}\n"
                  "def build_groups(config):\n"
                  "  return []\n")
  out = tmp_path / "run"
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", str(path), "--preset", "tiny", "--out", str(out)])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "must subclass mpx.sweep.config.SweepConfig" in err, err
  assert not out.exists()


def test_a_config_subclass_that_is_not_frozen_is_one_line(tmp_path, capsys):
  """`class Config(SweepConfig)` under a plain `@dataclass`: Python refuses it with a
  traceback; mpx says it in one line with the decorator to use, exit 2."""
  path = tmp_path / "thawed.py"
  path.write_text("import dataclasses\n"
                  "from mpx.sweep.config import SweepConfig\n"
                  "@dataclasses.dataclass\n"
                  "class Config(SweepConfig):\n"
                  "  width: int = 4\n")
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", str(path), "--preset", "tiny", "--out", str(tmp_path / "run")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err == (f"mpx run: error: {path}: its Config must be a frozen dataclass, as "
                 "SweepConfig is: @dataclasses.dataclass(frozen=True) class "
                 "Config(SweepConfig).\n"), err
