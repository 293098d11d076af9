"""The library side of mpx imports only jax and flax: a user who puts a mask prior into a
model of their own pays for no optimizer, checkpointing, plotting or dataset package."""

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
