"""The library side of mpx imports only jax and flax: a user who puts a mask prior into a
model of their own pays for no optimizer, checkpointing, plotting or dataset package."""

import importlib
import pathlib
import re
import subprocess
import sys

import pytest

HEAVY = ("optax", "orbax", "matplotlib", "tensorflow", "tensorflow_datasets", "grain")
_SCRIPT = """
import sys
{baseline}
before = set(sys.modules)
import {modules}
print(" ".join(sorted({{m.split(".")[0] for m in set(sys.modules) - before}})))
"""


def _new_top_level_modules(modules: str, baseline: str = "") -> set[str]:
  out = subprocess.run([sys.executable, "-c", _SCRIPT.format(modules=modules,
                                                             baseline=baseline)],
                       capture_output=True, text=True, timeout=300, check=True)
  return set(out.stdout.split())


@pytest.mark.parametrize("modules", ["mpx", "mpx.nn, mpx.diagnostics, mpx.params"])
def test_the_library_loads_no_heavy_package(modules):
  assert not _new_top_level_modules(modules) & set(HEAVY)


@pytest.mark.parametrize("family", ["arithmetic", "boolean", "language", "vision"])
def test_a_familys_docstring_names_its_modules(family):
  """A family's docstring is its map: it names (in backticks) each of its modules and no
  other."""
  package = importlib.import_module(f"mpx.tasks.{family}")
  modules = {p.stem for p in pathlib.Path(package.__file__).parent.glob("*.py")} - {"__init__"}
  assert set(re.findall(r"`(\w+)`", package.__doc__)) == modules
