"""The `mpx` command and the README's promises."""

import pathlib
import re
import subprocess
import sys

import matplotlib.image
import pytest

import mpx
from mpx import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOY = str(ROOT / "tests" / "toy_experiment.py")


def test_version_and_help(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["--version"])
  assert exit_info.value.code == 0
  assert mpx.__version__ in capsys.readouterr().out
  assert cli.main([]) == 0
  assert "prior" in capsys.readouterr().out


def test_console_script_is_installed():
  script = pathlib.Path(sys.executable).parent / "mpx"
  out = subprocess.run([str(script), "--help"], capture_output=True, text=True,
                       check=True).stdout
  assert "run" in out and "prior" in out


@pytest.mark.parametrize("name, args, heads", [
    ("parity", [], 1),
    ("impulse", ["--grid", "4", "4", "--heads", "3"], 3),
    ("alibi", ["--tokens", "8", "--heads", "4"], 4),
    ("addition", [], 1),
])
def test_prior_command_writes_png(tmp_path, name, args, heads, capsys):
  out = tmp_path / f"{name}.png"
  assert cli.main(["prior", name, "--out", str(out)] + args) == 0
  image = matplotlib.image.imread(out)
  assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100 * min(heads, 3)
  assert str(out) in capsys.readouterr().out


def test_prior_command_bad_option_is_a_clear_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["prior", "parity", "--strength", "0", "--out", str(tmp_path / "p.png")])
  assert exit_info.value.code == 2
  assert "strength must be" in capsys.readouterr().err


@pytest.mark.parametrize("out, named", [("blocker.txt/run", "blocker.txt is a file"),
                                        ("blocker.txt", "blocker.txt is a file"),
                                        ("", "--out is empty")])
def test_run_with_an_unusable_out_is_a_one_line_error(tmp_path, out, named, capsys):
  blocker = tmp_path / "blocker.txt"
  blocker.write_text("keep")
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", TOY, "--out", str(tmp_path / out) if out else ""])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("mpx run: error: --out") and named in err
  assert len(err.strip().splitlines()) == 1
  assert blocker.read_text() == "keep" and sorted(tmp_path.iterdir()) == [blocker]


def test_run_help_lists_experiments_and_presets_marking_tiny(tmp_path, monkeypatch, capsys):
  """Your own ./experiments are listed beside mpx's; a broken file is named, not fatal."""
  monkeypatch.chdir(tmp_path)
  (tmp_path / "experiments").mkdir()
  (tmp_path / "experiments" / "mine.py").write_text(
      '"""My experiment: parity on 6 bits."""\n'
      "from mpx.sweep.config import SweepConfig as Config\n"
      "PAPER = METRICS = build_groups = None\n"
      'PRESETS = {"small": {}, "tiny": {}}\n')
  (tmp_path / "experiments" / "broken.py").write_text('raise RuntimeError("half-written")\n')
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", "--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  assert out.startswith("usage: mpx run") and "--preset" in out
  listing = out[out.index("experiments ("):]
  for name in ("arithmetic", "boolean_coverage", "boolean_gotu", "language", "vision"):
    entry = re.split(r"\n  (?! )", listing[listing.index(f"  {name}: "):])[0]
    assert "--preset quick (default)," in entry, entry
    assert "tiny (runs in under a minute)" in " ".join(entry.split()), entry
  assert ("  mine: My experiment: parity on 6 bits.\n"
          "      --preset small (default), tiny (runs in under a minute)\n") in out
  assert "  broken: cannot be loaded: RuntimeError: half-written" in out


def test_importing_the_cli_loads_no_experiment():
  """`mpx --help` and `mpx prior` must not pay for the sweep, tasks and experiments."""
  code = ("import sys, mpx.cli; mpx.cli.make_parser(); print(sorted(m for m in sys.modules if "
          "m.startswith(('mpx.sweep', 'mpx.tasks', 'mpx.experiments', 'mpx_experiment'))))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True).stdout
  assert out.strip() == "[]"


@pytest.mark.parametrize("kind, named", [
    ("file", "is a file, not a run folder"),
    ("folder", "is not a run folder (no metrics.jsonl or config.json)"),
    ("missing", "does not exist"),
    ("run without records", "has no metrics.jsonl yet"),
])
def test_plot_on_what_is_not_a_run_is_a_one_line_error(tmp_path, kind, named, capsys):
  path = tmp_path / "thing"
  if kind == "file":
    path.write_text("not a run")
  elif kind != "missing":
    path.mkdir()
  if kind == "run without records":
    (path / "config.json").write_text("{}")
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["plot", str(path)])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith(f"mpx plot: error: {path} ") and named in err
  assert len(err.strip().splitlines()) == 1


def test_prior_out_creates_missing_folders_and_names_a_file_in_the_way(tmp_path, capsys):
  out = tmp_path / "a" / "b" / "c.png"
  assert cli.main(["prior", "neutral", "--tokens", "4", "--out", str(out)]) == 0
  assert matplotlib.image.imread(out).ndim == 3
  (tmp_path / "blocker").write_text("keep")
  for bad, named in [(tmp_path / "blocker" / "d" / "p.png", "blocker is a file, not a folder"),
                     (tmp_path / "a", "is a folder; give the PNG file")]:
    with pytest.raises(SystemExit) as exit_info:
      cli.main(["prior", "neutral", "--tokens", "4", "--out", str(bad)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("mpx prior: error: --out") and named in err
    assert len(err.strip().splitlines()) == 1
  assert (tmp_path / "blocker").read_text() == "keep"


def test_ci_runs_the_readme_test_command():
  readme = (ROOT / "README.md").read_text().splitlines()
  i = next(i for i, line in enumerate(readme) if line.startswith("# 2. install and run the tests"))
  assert "pytest" in readme[i + 1] and '".[test]"' in readme[i + 1]
  assert "# 2. install and run the tests" in (ROOT / ".ci" / "run").read_text()


def test_experiments_come_from_the_installed_package(tmp_path, monkeypatch):
  """`mpx run NAME` must not depend on the working directory or a source checkout: the
  experiments install as `mpx.experiments` (setup.cfg's package_dir)."""
  import mpx.experiments
  from mpx.sweep import config as config_lib
  monkeypatch.chdir(tmp_path)
  package_dir = pathlib.Path(mpx.experiments.__path__[0]).resolve()
  assert package_dir in config_lib.experiment_dirs()
  experiment = config_lib.load_experiment("boolean_gotu")
  assert pathlib.Path(experiment.__file__).resolve().parent == package_dir


_SOURCE_CHECKOUT = """
import sys
# No installer's finder: mpx comes from the checkout on sys.path alone (PYTHONPATH=.).
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
sys.path_hooks[:] = [h for h in sys.path_hooks if "editable" not in repr(h)]
sys.path.insert(0, sys.argv[1])
from mpx.sweep import config
experiment = config.load_experiment("boolean_coverage")  # imports mpx.experiments.boolean_gotu
print(sys.modules["mpx.experiments"].__spec__.origin)
"""


def test_experiments_load_from_a_source_checkout_that_is_not_installed(tmp_path):
  """The benchmarks run as `PYTHONPATH=. python benchmarks/...` on machines where mpx is not
  installed: mpx.experiments is then the checkout's experiments/ folder."""
  root = pathlib.Path(__file__).resolve().parents[1]
  out = subprocess.run([sys.executable, "-c", _SOURCE_CHECKOUT, str(root)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert pathlib.Path(out.stdout.strip()) == root / "experiments" / "__init__.py"


def test_setup_cfg_ships_every_package():
  """setup.cfg lists its packages by hand (to map experiments/ to mpx.experiments): a new
  subpackage left off the list would be missing from a plain `pip install .`."""
  import configparser
  import setuptools
  root = pathlib.Path(__file__).parents[1]
  cfg = configparser.ConfigParser()
  cfg.read(root / "setup.cfg")
  listed = set(cfg["options"]["packages"].split())
  found = set(setuptools.find_packages(str(root), include=["mpx", "mpx.*"]))
  assert listed == found | {"mpx.experiments"}
  assert "mpx.experiments = experiments" in cfg["options"]["package_dir"]


@pytest.mark.parametrize("experiment", ["boolean_gotu", "arithmetic", "vision", "language"])
@pytest.mark.parametrize("setting, named", [
    ("mask_strength=-1", "mask_strength=-1.0 must be a finite number > 0"),
    ("weight_decay=-1", "weight_decay=-1.0 must be a finite number >= 0"),
    ("mask_lr_multiplier=nan", "mask_lr_multiplier=nan must be a finite number >= 0")])
def test_a_bad_shared_value_names_its_config_key_in_every_family(experiment, setting, named,
                                                                 tmp_path, capsys):
  """Checked when the config is built, before any scheme code would fail on it."""
  out = tmp_path / "run"
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", experiment, "--preset", "tiny", "--out", str(out), "--set", setting])
  assert exit_info.value.code == 2
  assert named in capsys.readouterr().err
  assert not out.exists()


def _block(monkeypatch, modules) -> None:
  """`import module` (and of its submodules) now raises ModuleNotFoundError, also where
  an earlier test imported them (vision's digits)."""
  for module in modules:
    for name in [m for m in sys.modules if m.startswith(module + ".")] + [module]:
      monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize("blocked, command, install", [
    (("sklearn",), ["run", "vision", "--preset", "tiny"], "pip install 'mpx[vision]'"),
    # grain batches the digits too, in the feeder thread once training has begun.
    (("grain",), ["run", "vision", "--preset", "tiny"], "pip install 'mpx[vision]'"),
    (("tokenizers",), ["run", "language", "--preset", "tiny", "--set", "tokenizer=bpe",
                       "--set", "vocab_size=300"],
     "pip install 'mpx[text]'"),
    (("matplotlib", "matplotlib.pyplot"), ["plot"], "pip install matplotlib")])
def test_a_missing_extra_is_one_line_naming_its_install(blocked, command, install, tmp_path,
                                                        monkeypatch, capsys):
  """Exit 2, one line, nothing written: the same for every family and for `mpx plot`."""
  _block(monkeypatch, blocked)
  out = tmp_path / "run"
  if command == ["plot"]:  # A finished run to draw: the toy experiment's, without figures.
    assert cli.main(["run", TOY, "--out", str(out), "--no-plots"]) == 0
    capsys.readouterr()
    command = ["plot", str(out)]
  else:
    command = [*command, "--out", str(out)]
  before = sorted(out.rglob("*")) if out.exists() else None
  with pytest.raises(SystemExit) as exit_info:
    cli.main(command)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and install in err, err
  assert (sorted(out.rglob("*")) if out.exists() else None) == before


class _Built(Exception):
  """Raised where a run builds its groups (after its checks, before anything is written)."""


def test_every_preset_names_a_missing_install_before_its_data(tmp_path, monkeypatch, capsys):
  """Every optional package missing, each preset of each built-in experiment stops before
  it reads a data path or writes a file: in one line naming the install of the packages
  its config needs (`SweepConfig.optional_modules`), or, needing none, where it builds its
  groups (a data path read before that, e.g. a fingerprint's, would fail here)."""
  from mpx.sweep import config as config_lib
  from mpx.sweep import run as run_lib
  _block(monkeypatch, config_lib.EXTRAS)
  monkeypatch.setattr(run_lib, "_built", lambda *args, **kwargs: (_ for _ in ()).throw(_Built))
  checked = []
  for name in config_lib.available_experiments():
    experiment = config_lib.load_experiment(name)
    for preset in experiment.PRESETS:
      needed = config_lib.make_config(experiment, preset)[1].optional_modules()
      out = tmp_path / f"{name}-{preset}"
      try:
        cli.main(["run", name, "--preset", preset, "--out", str(out)])
      except _Built:
        assert not needed, (name, preset)
      except SystemExit as e:
        err = capsys.readouterr().err
        assert e.code == 2 and err.count("\n") == 1, (name, preset, err)
        assert needed and all(m in err for m in needed), (name, preset, err)
        assert "pip install 'mpx[" in err, (name, preset, err)
      assert not out.exists(), (name, preset)
      checked.append((name, preset, needed))
  needing = {(n, p) for n, p, needed in checked if needed}
  assert {("language", "wikitext2"), ("vision", "cifar10"), ("vision", "tiny")} <= needing


def test_an_import_error_of_mpx_itself_keeps_its_traceback(monkeypatch):
  def broken(args):
    raise ImportError("cannot import name 'x' from 'mpx.priors'", name="mpx.priors")
  monkeypatch.setattr(cli, "_plot_command", broken)
  with pytest.raises(ImportError, match="cannot import name"):
    cli.main(["plot", "somewhere"])


def test_run_experiment_help_names_every_key_default_and_preset(capsys):
  """`mpx run EXPERIMENT --help`: that experiment's presets and every config key with its
  type, default and description, the traced keys marked; not the generic help."""
  import dataclasses
  from mpx.sweep import config as config_lib
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", "boolean_gotu", "--help"])
  assert exit_info.value.code == 0
  out = capsys.readouterr().out
  experiment = config_lib.load_experiment("boolean_gotu")
  for preset in experiment.PRESETS:
    assert re.search(rf"^  {preset}( \(.*?\))?: ", out, re.M), preset
  assert "  tiny (runs in under a minute): tasks=2parity schemes=default,mask seeds=1" in out
  for field in dataclasses.fields(experiment.Config):
    mark = r"\*" if field.name in config_lib.TRACED else ""
    assert re.search(rf"^  {field.name}{mark} \(", out, re.M), field.name
  assert "  learning_rate* (float | None) = None\n      None = the GOTU protocol's" in out
  assert "  seeds (int) = 10\n      members per (task, scheme, hparams) cell" in out
  assert "experiments (NAME" not in out  # The generic list is `mpx run --help`'s.


@pytest.mark.parametrize("name", ["arithmetic", "boolean_coverage", "boolean_gotu",
                                  "discover_arithmetic", "discover_boolean",
                                  "discover_planted", "language", "vision"])
def test_every_config_key_has_a_description(name):
  """The help reads the descriptions from the Config docstrings: a new field without one
  would be listed bare."""
  import dataclasses
  from mpx.sweep import config as config_lib
  config = config_lib.load_experiment(name).Config
  docs = cli.field_docs(config)
  assert not [f.name for f in dataclasses.fields(config) if not docs.get(f.name)]


def test_field_docs_reads_shared_continued_and_inline_entries():
  import dataclasses

  @dataclasses.dataclass
  class Base:
    """Base.

    Attributes:
      a / b: both, continued
        on the next line; c: inline.
      d, e: listed. f: after a period.
    """
    a: int = 0

  @dataclasses.dataclass
  class Child(Base):
    """Child. a: the child's own."""

  assert cli.field_docs(Child) == {
      "a": "the child's own.", "b": "both, continued on the next line", "c": "inline.",
      "d": "listed.", "e": "listed.", "f": "after a period."}


def test_run_help_of_an_unknown_experiment_is_a_one_line_error(capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", "no_such_experiment", "--help"])
  assert exit_info.value.code == 2
  assert "unknown experiment 'no_such_experiment'" in capsys.readouterr().err
