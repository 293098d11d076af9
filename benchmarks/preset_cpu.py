"""Each experiment's `tiny` preset and the README's main job, timed as a user runs them.

    python benchmarks/preset_cpu.py                   # every tiny preset, then the quick main job
    python benchmarks/preset_cpu.py --skip-quick      # the tiny presets only (≈ 2 min)
    python benchmarks/preset_cpu.py --experiments boolean_gotu arithmetic

Each run is `mpx run EXP --preset P --out TMP` in a fresh process (imports, compilation,
figures and all), so the CPU seconds are what `mpx run --help` promises: a tiny preset
in at most TINY_CPU_S of CPU ("under a minute" on a busy core), the README's command 1
in at most QUICK_WALL_S of wall time on this machine. Prints a Markdown table with the
ratio of each measurement to its target (≤ 1 meets it).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

EXPERIMENTS = ("boolean_gotu", "boolean_coverage", "arithmetic", "vision", "language",
               "discover_boolean", "discover_arithmetic", "discover_planted")
TINY_CPU_S = 20.0  # CPU seconds (user + system) of one tiny preset.
QUICK_WALL_S = 180.0  # Wall seconds of `mpx run boolean_gotu --preset quick` on 2 cores.


def timed_run(experiment: str, preset: str, out: pathlib.Path) -> tuple[float, float]:
  """(wall s, CPU s of the process and its children) of one `mpx run`."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  start = time.perf_counter()
  done = subprocess.run([sys.executable, "-m", "mpx.cli", "run", experiment, "--preset", preset,
                         "--out", str(out)], capture_output=True, text=True)
  wall = time.perf_counter() - start
  if done.returncode:
    sys.exit(f"mpx run {experiment} --preset {preset} failed ({done.returncode}):\n"
             f"{done.stderr[-3000:]}")
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return wall, cpu


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experiments", nargs="+", default=EXPERIMENTS)
  parser.add_argument("--skip-quick", action="store_true")
  args = parser.parse_args(argv)
  print(f"{os.cpu_count()} cores; Python {sys.version.split()[0]}\n")
  print("| run | wall s | CPU s | target | ratio |")
  print("|---|---:|---:|---|---:|")
  with tempfile.TemporaryDirectory(prefix="mpx-preset-cpu-") as tmp:
    for name in args.experiments:
      wall, cpu = timed_run(name, "tiny", pathlib.Path(tmp) / name)
      print(f"| {name} tiny | {wall:.1f} | {cpu:.1f} | CPU ≤ {TINY_CPU_S:.0f} s | "
            f"{cpu / TINY_CPU_S:.2f} |", flush=True)
    if not args.skip_quick:
      wall, cpu = timed_run("boolean_gotu", "quick", pathlib.Path(tmp) / "quick")
      print(f"| boolean_gotu quick | {wall:.1f} | {cpu:.1f} | wall ≤ {QUICK_WALL_S:.0f} s | "
            f"{wall / QUICK_WALL_S:.2f} |", flush=True)


if __name__ == "__main__":
  main()
