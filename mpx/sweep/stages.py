"""Two-stage experiments: stage 2's members are built from what stage 1 trained.

Both stages are groups of one run folder, built up front (the run plans, pads and
fingerprints every group before it trains one). Stage 2's inits read stage 1 lazily
(`Reading.value`): stage 2 initialises after stage 1 has trained, and its value comes from
stage 1's final checkpoint in the run folder, fresh or resumed alike, so nothing of stage
1 is kept anywhere else. An experiment takes part by giving its `build_groups` a `run_dir`
parameter; the run loop then passes the run folder and refuses, before writing anything,
a traced or architecture sweep (stage 2 reads stage 1's members by their order in one
group of one configuration) and several processes (stage 1's checkpoint is read where
process 0 wrote it).
"""

from __future__ import annotations

import inspect
import json
import pathlib
from typing import Any, Callable

import jax

from mpx import checkpoint, report
from mpx.sweep import engine


def reads_run_dir(build_groups: Callable) -> bool:
  """Whether an experiment's `build_groups` takes the run folder (two stages)."""
  return "run_dir" in inspect.signature(build_groups).parameters


def check_one_configuration(experiment: str, sweep: list[str], traced: list[str]) -> None:
  """Refuses a two-stage experiment's run of several configurations in one folder."""
  if sweep or traced:
    raise ValueError(f"{experiment} trains one configuration per run folder (stage 2 reads "
                     f"stage 1's members by their order in one group); run each value of "
                     f"{sorted(sweep + traced)} in its own --out.")
  if jax.process_count() > 1:
    raise ValueError(f"{experiment} runs in one process (stage 2 reads stage 1's checkpoint "
                     "from the local run folder); run it without --distributed.")


def restore_final(experiment: str, group: engine.Group,
                  run_dir: pathlib.Path | None) -> engine.SweepState:
  """`group`'s final state (host arrays) from `run_dir`/checkpoints/`group.name`; refuses
  a run without a run folder, a group that has not reached its last step, and a
  checkpoint of another member count."""
  if run_dir is None:
    raise RuntimeError(f"{experiment}: stage 2 reads stage 1's checkpoint from the run "
                       "folder; run the experiment with `mpx run` (or run.run_experiment).")
  directory = pathlib.Path(run_dir) / "checkpoints" / group.name
  if checkpoint.latest_step(directory) != group.steps:
    raise RuntimeError(f"{experiment}: {group.name} has no final checkpoint (step "
                       f"{group.steps}) in {directory}; stage 2 starts after it. A gs:// "
                       "run folder is not supported (its checkpoints are not local).")
  with checkpoint.Checkpointer(directory, max_to_keep=None) as ckpt:
    state, _ = ckpt.restore_host(engine.init_state(group))
  rows = jax.tree_util.tree_leaves(state.params)[0].shape[0]
  if rows != len(group.members):
    raise RuntimeError(f"{experiment}: {directory} holds {rows} members, {group.name} has "
                       f"{len(group.members)}; resume with the config it was run with.")
  return state


class Reading:
  """Stage 1 as stage 2 reads it: `read(state)` of `group`'s final state in `run_dir`,
  computed once per process, on first use."""

  def __init__(self, experiment: str, group: engine.Group, run_dir: pathlib.Path | None,
               read: Callable[[engine.SweepState], Any]):
    self.experiment, self.group, self.run_dir = experiment, group, run_dir
    self._read, self._value, self._done = read, None, False

  def value(self) -> Any:
    """`read` of stage 1's final state (restored and read on the first call only)."""
    if not self._done:
      self._value = self._read(restore_final(self.experiment, self.group, self.run_dir))
      self._done = True
    return self._value


def two_stages(experiment: str, config, run_dir, stage1_arms, stage1_group: Callable,
               read: Callable, stage2_group: Callable) -> list[engine.Group]:
  """Per task of `config`: stage 1 (`stage1_group(config, task)`) where `config.schemes`
  holds one of `stage1_arms`, then stage 2 (`stage2_group(config, task, reading)`, with
  `reading.value()` = `read(config, task, group, state, run_dir)` of stage 1's final
  state; None without a stage 1) where it holds another arm."""
  run_dir = None if run_dir is None else pathlib.Path(run_dir)
  groups = []
  for task in config.tasks:
    reading = None
    if any(a in config.schemes for a in stage1_arms):
      group = stage1_group(config, task)
      reading = Reading(experiment, group, run_dir,
                        lambda state, t=task, g=group: read(config, t, g, state, run_dir))
      groups.append(group)
    if any(a not in stage1_arms for a in config.schemes):
      groups.append(stage2_group(config, task, reading))
  return groups


def record(path: pathlib.Path, key: str, entry: dict, header: dict,
           trained_with: Callable[[dict], Any]) -> dict:
  """Writes `entry` under "tasks"/`key` of the JSON file `path` (the other keys kept,
  `header`'s keys set where absent) and returns the file's data.

  A resume reads stage 1 again from its checkpoint while stage 2's members resume from
  theirs, which started from the reading recorded before. Where the file already holds
  `key`, `trained_with(entry)` (what stage 2 trains with) must equal the recorded one, or
  this refuses rather than report a reading that no member trained with (float32
  readouts near a threshold can flip on another backend).
  """
  data = json.loads(path.read_text()) if path.is_file() else {}
  recorded = data.get("tasks", {}).get(key)
  canonical = lambda e: json.loads(json.dumps(trained_with(e)))
  if recorded is not None and canonical(recorded) != canonical(entry):
    raise RuntimeError(
        f"{path}: stage 1 of {key!r} read again from its checkpoint differs from what "
        "stage 2 started with (recorded here), so the resumed stage 2 would be reported "
        "under a reading it was not trained with. Resume with the software it was started "
        "with, or run the experiment again in a new --out.")
  for name, value in header.items():
    data.setdefault(name, value)
  data.setdefault("tasks", {})[key] = entry
  report.atomic_write(str(path), json.dumps(data, indent=1) + "\n")
  return data
