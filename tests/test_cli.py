"""The `mpx` command and the README's promises."""

import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import matplotlib.image
import numpy as np
import pytest

import mpx
from mpx import cli
from mpx.nn import MaskedSelfAttention

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


def test_readme_functional_example_runs():
  readme = (ROOT / "README.md").read_text()
  blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
  block = next(b for b in blocks if "mpx.masked_attention" in b)
  namespace = {}
  exec(compile(block, "README.md", "exec"), namespace)
  grads = namespace["grads"]
  assert grads["mask_logits"].shape == (17, 17)
  assert float(abs(grads["mask_logits"]).max()) > 0


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


def test_readme_linen_recipe_runs_and_a_shape_mismatch_names_the_fixes():
  readme = (ROOT / "README.md").read_text()
  call = re.search(r"With Linen, `(MaskedSelfAttention\(.*?\))`", readme, re.S).group(1)
  prior = mpx.priors.window_prior(4, 4, window=3, strength=4.0)   # [17, 17], as above.
  names = {"MaskedSelfAttention": MaskedSelfAttention, "mpx": mpx, "prior": prior}
  module = eval(call.replace("\n", " "), names)
  x = jnp.ones((2, 17, 32))
  params = module.init(jax.random.key(0), x)["params"]
  np.testing.assert_array_equal(params["mask_logits"], prior)
  per_head = MaskedSelfAttention(4, 8, mask_init=mpx.priors.as_initializer(prior))
  with pytest.raises(ValueError, match=r"repeat_heads\(prior, 4\).*per_head_mask=False"):
    per_head.init(jax.random.key(0), x)
