"""A learning-rate sweep as members of one program vs one program per value.

    python benchmarks/traced_sweep.py [--preset quick] [--values 4] [--steps 16]

Builds the Boolean GOTU groups of a preset (every scheme × `seeds`) at `--values`
learning rates and times one chunk of the merged group (K·L members, `engine.merge_groups`,
what `--set learning_rate=a,b,...` trains), the same mapped K members per call
(`members_per_call=K`), and the L groups of K members trained one after another (what a
comma list did before it was traced). Prints member-steps per second of each and the
ratios (> 1: faster per member-step than L groups).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import chunk_timing  # noqa: E402
import numpy as np  # noqa: E402

from mpx.sweep import config as config_lib  # noqa: E402
from mpx.sweep import engine, run  # noqa: E402


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="quick")
  parser.add_argument("--task", default="2parity")
  parser.add_argument("--values", type=int, default=4)
  parser.add_argument("--steps", type=int, default=16, help="steps per timed chunk")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args(argv)
  experiment = config_lib.load_experiment("boolean_gotu")
  lrs = ",".join(f"{v:g}" for v in np.geomspace(3e-4, 3e-3, args.values))
  _, variants = config_lib.make_configs(experiment, args.preset, [
      f"learning_rate={lrs}", f"tasks={args.task}"])
  [per_value] = run._built(experiment, variants[0][1])
  merged = engine.merge_groups(per_value)
  k = len(per_value[0].members)
  sliced = dataclasses.replace(merged, members_per_call=k)
  rate = {}
  for name, groups in (("one group of K·L", [merged]), (f"same, {k} per call", [sliced]),
                       ("L groups of K", per_value)):
    seconds = member_steps = 0
    for group in groups:
      *compiled, _ = chunk_timing.compile_chunk(group, args.steps)
      seconds += chunk_timing.time_chunk(*compiled, args.repeats)
      member_steps += len(group.members) * args.steps * args.repeats
    rate[name] = member_steps / seconds
    print(f"{name:18s} {len(groups)} program(s), {member_steps // args.repeats // args.steps:3d}"
          f" members: {rate[name]:8.1f} member-steps/s")
  for name in list(rate)[:2]:
    print(f"ratio ({name} / L groups of K): {rate[name] / rate['L groups of K']:.2f}")


if __name__ == "__main__":
  main()
