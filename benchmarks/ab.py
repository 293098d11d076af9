"""Old engine vs new, side by side in one run: member-steps/s of the vmapped chunk.

    python benchmarks/ab.py --old /tmp/old                 # a worktree of the old commit
    git worktree add /tmp/old <commit> && python benchmarks/ab.py --old /tmp/old --rounds 3

Each measurement is one subprocess running `time_vmapped` of that tree's
`benchmarks/run.py` (its own mpx is first on sys.path), old and new alternating, so drift
of the machine's load hits both alike. Prints a table per (scale, K): each round's rate
and the new / old ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SNIPPET = """
import json, sys
sys.argv = ["run.py"]
sys.path.insert(0, {bench!r})
import run
row = run.time_vmapped({scale!r}, {members}, {steps}, {repeats})
print("RESULT " + json.dumps({{"rate": row.rate, "compile_s": row.compile_s}}))
"""


def measure(tree: pathlib.Path, scale: str, members: int, steps: int, repeats: int,
            cpu: str | None) -> dict:
  code = SNIPPET.format(bench=str(tree / "benchmarks"), scale=scale, members=members,
                        steps=steps, repeats=repeats)
  command = [sys.executable, "-c", code]
  if cpu is not None:
    command = ["taskset", "-c", cpu] + command
  out = subprocess.run(command, capture_output=True, text=True, cwd=tree, check=False)
  lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  if out.returncode or not lines:
    raise RuntimeError(f"{tree}: {scale} K={members} failed:\n{out.stderr[-2000:]}")
  return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--old", type=pathlib.Path, required=True, help="old worktree")
  parser.add_argument("--new", type=pathlib.Path, default=ROOT)
  parser.add_argument("--cases", nargs="+", default=["quick:16:32", "paper:1:4", "paper:4:4"],
                      help="scale:K:steps per chunk")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--cpu", default=None, help="taskset CPU list, e.g. 0")
  args = parser.parse_args(argv)
  lines = ["| scale | K | old member-steps/s | new member-steps/s | new / old (medians) |",
           "|---|---|---|---|---|"]
  for case in args.cases:
    scale, members, steps = case.split(":")
    rates = {"old": [], "new": []}
    for _ in range(args.rounds):
      for name, tree in (("old", args.old), ("new", args.new)):
        rates[name].append(measure(tree, scale, int(members), int(steps), args.repeats,
                                   args.cpu)["rate"])
        print(f"{scale} K={members} {name}: {rates[name][-1]:.3f}", file=sys.stderr)
    ratio = statistics.median(rates["new"]) / statistics.median(rates["old"])
    fmt = lambda xs: ", ".join(f"{x:.3f}" for x in xs)
    lines.append(f"| {scale} | {members} | {fmt(rates['old'])} | {fmt(rates['new'])} | "
                 f"{ratio:.3f} |")
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
