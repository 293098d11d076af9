"""The test session's own settings (tests/conftest.py) hold in a pytest run of their own."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

CRASHING = """
import os, signal

def test_crashes():
  os.kill(os.getpid(), signal.SIGSEGV)

def test_after_the_crash():
  pass
"""


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs Linux's affinity")
def test_a_crashed_worker_fails_the_run_instead_of_hanging(tmp_path):
  # One worker, a file per worker, as each CI line runs: xdist's replacement worker used to
  # sit idle after a crash, so the run never ended.
  shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
  (tmp_path / "test_crash.py").write_text(CRASHING)
  (tmp_path / "gcs_emulator.py").write_text("")  # conftest's plugin, not needed here.
  done = subprocess.run(
      [sys.executable, "-m", "pytest", "-q", "-n", "1", "--dist", "loadfile",
       "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
      cwd=tmp_path, capture_output=True, text=True, timeout=60,
      env={**os.environ, "PYTHONPATH": str(tmp_path)})
  out = done.stdout + done.stderr
  assert done.returncode == 1, out
  assert "worker 'gw0' crashed while running 'test_crash.py::test_crashes'" in out, out
  assert "1 failed in" in out and "passed" not in out, out  # Stopped there: no replacement.
