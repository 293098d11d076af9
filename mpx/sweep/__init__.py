"""The sweep engine: many members (seeds × schemes × hparams) in one compiled program."""

from mpx.sweep.data import DeviceData, EvalData, Stream
from mpx.sweep.engine import (Group, Member, Probe, SweepState, Task, init_state,
                              make_train_chunk, stack, unstack)
from mpx.sweep.optim import OptimConfig, make_optimizer

__all__ = ["DeviceData", "EvalData", "Group", "Member", "OptimConfig", "Probe", "Stream",
           "SweepState", "Task", "init_state", "make_optimizer", "make_train_chunk", "stack",
           "unstack"]
