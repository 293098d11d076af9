"""The sweep engine: many members (seeds × schemes × hparams) in one compiled program."""

from mpx.sweep.engine import (Group, Member, SweepState, init_state, make_train_chunk, stack,
                              unstack)
from mpx.sweep.optim import OptimConfig, make_optimizer

__all__ = ["Group", "Member", "SweepState", "OptimConfig", "init_state", "make_optimizer",
           "make_train_chunk", "stack", "unstack"]
