"""A tiny two-group experiment for the `mpx run` tests.

    mpx run tests/toy_experiment.py --out /tmp/toy
"""

import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import sweep_fixtures as fx  # noqa: E402
from mpx.sweep import Stream  # noqa: E402
from mpx.sweep.config import SweepConfig  # noqa: E402

METRICS = ("mean_output",)
PAPER = {"toy": {"mask": {"mean_output": 0.0}}}


@dataclasses.dataclass(frozen=True)
class Config(SweepConfig):
  steps: int = 24
  learning_rate: float = 1e-2
  bad_learning_rate: float | None = None   # Gives seed 1's mask member this lr.
  schemes: tuple[str, ...] = ("mask", "default")
  data: str = "device"   # Or "stream": a generated regression stream fed from the host.
  fail_to_train: bool = False  # The loss raises when traced: a run that fails at start.


PRESETS = {"default": dict(seeds=2, chunk_steps=2, eval_every=4, checkpoint_every=2),
           "slow": dict(seeds=2, chunk_steps=2, eval_every=4, checkpoint_every=2, steps=200)}


def _unusable_loss(params, batch, key):
  raise ValueError("this loss cannot be traced (fail_to_train=true)")


def build_groups(config):
  groups = []
  for name in ("toy_a", "toy_b"):
    members = []
    for scheme in config.schemes:
      for seed in range(config.seeds):
        lr = config.learning_rate
        if config.bad_learning_rate is not None and scheme == "mask" and seed == 1:
          lr = config.bad_learning_rate
        members.append(fx.member(seed + (name == "toy_b") * 10, scheme, lr=lr))
    data = Stream(fx.regression_stream, seed=len(groups)) if config.data == "stream" else None
    task = dataclasses.replace(fx.TASK, loss=_unusable_loss) if config.fail_to_train else fx.TASK
    groups.append(fx.group(members, steps=config.steps, sampling="epoch", name=name,
                           data=data, task=task))
  return groups
