"""Do the presets give the same results as at another commit? A guard for refactors.

    python benchmarks/preset_guard.py --ref 32a5315                      # every tiny preset + the main job
    python benchmarks/preset_guard.py --ref HEAD~3 --runs discover_boolean:tiny arithmetic:quick
    python benchmarks/preset_guard.py --ref 32a5315 --runs boolean_gotu:tiny --set width=8

Each run is `mpx run EXP --preset P --no-plots` (plus the `--set` overrides, given to both
sides), once in this checkout and once in a worktree of REF with a venv of its own (so
that REF's mpx and experiments are the ones imported), both pinned to the same core: XLA's
thread count changes the order of float reductions, so runs compare only when pinned
alike. summary.json (and discovered.json where written) must be equal byte for byte; an
experiment renamed since REF is run under its old name there and compared with the
"experiment" field set aside. Prints a Markdown table; exits 1 when any run differs.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The README's main job, then every experiment's smoke test.
DEFAULT_RUNS = ("boolean_gotu:quick", "boolean_gotu:tiny", "boolean_coverage:tiny",
                "arithmetic:tiny", "vision:tiny", "language:tiny", "discover_boolean:tiny",
                "discover_arithmetic:tiny", "discover_planted:tiny")
COMPARED = ("summary.json", "discovered.json")
OLD_NAMES = {"discover_boolean": "discover_prior"}  # Experiments renamed since.


def sh(*args, **kwargs) -> subprocess.CompletedProcess:
  return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs)


def checkout(ref: str, where: pathlib.Path) -> pathlib.Path:
  """A worktree of `ref` with its own venv holding its mpx (editable, with the extras the
  vision and language presets read): its python."""
  sh("git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref)
  sh(sys.executable, "-m", "venv", str(where / ".venv"))
  python = where / ".venv" / "bin" / "python"
  sh(str(python), "-m", "pip", "install", "-q", "-e", f"{where}[vision,text]")
  return python


def run(python: pathlib.Path, cwd: pathlib.Path, experiment: str, preset: str,
        overrides: list[str], out: pathlib.Path, core: int) -> None:
  sets = [a for s in overrides for a in ("--set", s)]
  done = subprocess.run(["taskset", "-c", str(core), str(python), "-m", "mpx.cli", "run",
                         experiment, "--preset", preset, "--out", str(out), "--no-plots",
                         *sets], cwd=cwd, capture_output=True, text=True)
  if done.returncode:
    sys.exit(f"mpx run {experiment} --preset {preset} failed in {cwd}:\n{done.stderr[-3000:]}")


def differences(here: pathlib.Path, there: pathlib.Path) -> list[str]:
  """The compared files that differ ("experiment" aside where a rename explains it)."""
  found = []
  for name in COMPARED:
    a, b = here / name, there / name
    if not (a.exists() or b.exists()):
      continue
    if not (a.exists() and b.exists()):
      found.append(f"{name} only {'here' if a.exists() else 'at the ref'}")
      continue
    if a.read_bytes() == b.read_bytes():
      continue
    ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
    for data in (ja, jb):
      data.pop("experiment", None)
    if json.dumps(ja) != json.dumps(jb):  # Key order too.
      found.append(name)
  return found


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--ref", required=True, help="the commit to compare with")
  parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, metavar="EXP:PRESET")
  parser.add_argument("--set", action="append", default=[], dest="overrides",
                      metavar="KEY=VALUE", help="given to every run on both sides")
  parser.add_argument("--core", type=int, default=0, help="the core both sides run on")
  args = parser.parse_args(argv)
  here_python = pathlib.Path(sys.executable)
  with tempfile.TemporaryDirectory(prefix="mpx-preset-guard-") as tmp:
    tmp = pathlib.Path(tmp)
    ref = sh("git", "-C", str(ROOT), "rev-parse", "--short", args.ref).stdout.strip()
    head = sh("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD").stdout.strip()
    dirty = " (with uncommitted changes)" if sh(
        "git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no").stdout else ""
    try:
      there_python = checkout(args.ref, tmp / "ref")
      print(f"{head}{dirty} against {ref}, both pinned to core {args.core}"
            f"{', --set ' + ' '.join(args.overrides) if args.overrides else ''}\n")
      print("| run | files compared | result |")
      print("|---|---|---|")
      failed = 0
      for item in args.runs:
        experiment, _, preset = item.partition(":")
        here, there = tmp / f"{item}-here", tmp / f"{item}-ref"
        old = (experiment if (tmp / "ref" / "experiments" / f"{experiment}.py").exists()
               else OLD_NAMES.get(experiment, experiment))
        run(here_python, ROOT, experiment, preset, args.overrides, here, args.core)
        run(there_python, tmp / "ref", old, preset, args.overrides, there, args.core)
        diff = differences(here, there)
        compared = ", ".join(n for n in COMPARED if (here / n).exists())
        print(f"| {item} | {compared} | {'differs: ' + ', '.join(diff) if diff else 'equal'} |",
              flush=True)
        failed += bool(diff)
    finally:
      subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                      str(tmp / "ref")], capture_output=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
