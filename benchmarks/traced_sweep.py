"""A learning-rate sweep as members of one program vs one program per value.

    python benchmarks/traced_sweep.py [--preset quick] [--values 4] [--steps 16]

Builds the Boolean GOTU groups of a preset (every scheme × `seeds`) at `--values`
learning rates and times one chunk of: the group of K·L members that `--set
learning_rate=a,b,...` trains on one CPU device (one program, its members in slices of
K), the same group vmapped whole (`members_per_call=None`: what it trains on an
accelerator), and the L groups of K members trained one after another (what a comma list
did before it was traced). Prints member-steps per
second of each and the ratios (> 1: faster per member-step than L groups). The setups are
timed in interleaved rounds and each keeps its best.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import chunk_timing  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from mpx.sweep import config as config_lib  # noqa: E402
from mpx.sweep import run  # noqa: E402


def _copy(state):
  """A fresh copy of a state for each round: a chunk donates (consumes) its state."""
  return jax.tree_util.tree_map(jnp.copy, state)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="quick")
  parser.add_argument("--task", default="2parity")
  parser.add_argument("--values", type=int, default=4)
  parser.add_argument("--steps", type=int, default=16, help="steps per timed chunk")
  parser.add_argument("--repeats", type=int, default=2, help="chunks per timed round")
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args(argv)
  experiment = config_lib.load_experiment("boolean_gotu")
  lrs = ",".join(f"{v:g}" for v in np.geomspace(3e-4, 3e-3, args.values))
  _, variants = config_lib.make_configs(experiment, args.preset, [
      f"learning_rate={lrs}", f"tasks={args.task}"])
  [per_value] = run._built(experiment, variants[0][1])
  k = len(per_value[0].members)
  traced = dataclasses.replace(run._merged(per_value, mesh=None, platform="cpu"), members_per_call=k)
  vmapped = dataclasses.replace(traced, members_per_call=None)
  setups = {f"one group, slices of {k}": [traced], "one group, one vmap": [vmapped],
            "L groups of K": per_value}
  compiled = {name: [chunk_timing.compile_chunk(g, args.steps)[:-1] for g in groups]
              for name, groups in setups.items()}
  # Interleaved rounds, best round kept: a job on another core shares the memory bus,
  # and timing one setup after the other would charge its load to whichever ran then.
  rate = {name: 0.0 for name in setups}
  for _ in range(args.rounds):
    for name, groups in setups.items():
      seconds = sum(chunk_timing.time_chunk(chunk, _copy(state), hparams, data, args.repeats)
                    for chunk, state, hparams, data in compiled[name])
      member_steps = sum(len(g.members) for g in groups) * args.steps * args.repeats
      rate[name] = max(rate[name], member_steps / seconds)
  for name, groups in setups.items():
    print(f"{name:22s} {len(groups)} program(s), {sum(len(g.members) for g in groups):3d}"
          f" members: {rate[name]:8.1f} member-steps/s (best of {args.rounds} rounds)")
  for name in list(rate)[:2]:
    print(f"ratio ({name} / L groups of K): {rate[name] / rate['L groups of K']:.2f}")


if __name__ == "__main__":
  main()
