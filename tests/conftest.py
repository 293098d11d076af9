"""CPU compile options for the test session, set before jax starts its backend.

The tests run many small programs once each, so XLA's compile time dominates: LLVM at -O0
compiles them about a third faster (measured on tests/test_language.py: 95 s vs 140 s)
and computes the same functions (the golden and equivalence tests hold). The tests that
start processes pass this XLA_FLAGS on, with their device counts appended.

mpx's per-CPU XLA defaults (`mpx.sweep.cpu_flags`) are off for the session and the
processes it starts, so that the tests' expected values hold on every kind of CPU;
tests/test_cpu_flags.py turns them on where it tests them.
"""

import os

TEST_XLA_FLAGS = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = f"{TEST_XLA_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()
os.environ["MPX_CPU_DEFAULTS"] = "0"
# The tests run on the CPU. The `aot` extra's CUDA plugin (for `mpx compile --target h100:N`)
# would otherwise try to start on every jax import and log that CUDA is missing.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

pytest_plugins = ("gcs_emulator",)  # The `bucket` fixture: a GCS emulator, gs://mpx-test.


# The files that take longest (their seconds in a whole run's --durations), first: with
# `-n auto --dist loadfile` each worker takes the next file when it is free, so the long
# ones must not come last and leave one worker running alone.
LONGEST_FIRST = ("test_sweep_engine.py", "test_sweep_run.py", "test_discover_boolean.py",
                 "test_resume_auto.py", "test_scheme_realisation.py", "test_language.py",
                 "test_vision.py", "test_discover_arithmetic.py", "test_vit_schemes.py",
                 "test_select.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # Stable: file order kept.


def pytest_configure(config):
  """A crashed xdist worker fails the run at once instead of being replaced.

  With `--dist loadfile` and one worker (CI's lines, pinned to one core each), the
  replacement of a worker that died in XLA's compile sat idle and the run hung until CI's
  limit (seen once on Python 3.11). `--max-worker-restart N` on the command line still
  wins.
  """
  if config.pluginmanager.hasplugin("xdist") and config.option.maxworkerrestart is None:
    config.option.maxworkerrestart = 0


def pytest_xdist_auto_num_workers(config):
  """`-n auto`: one worker per core this process may run on.

  xdist counts the machine's cores (psutil), so a run pinned to one core (CI's two Python
  lines, `taskset`, a cgroup's cpuset) started two workers on it, whose XLA thread pools
  then spun against each other: ≈ 2× the CPU time measured. PYTEST_XDIST_AUTO_NUM_WORKERS
  still overrides this.
  """
  del config
  if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or not hasattr(os, "sched_getaffinity"):
    return None  # xdist's own count.
  return len(os.sched_getaffinity(0))
