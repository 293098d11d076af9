"""The two-stage plumbing that discovering a prior shares across task families.

Stage 1 trains, next to the plain model, a `learned` arm: the learnable neutral mask
`M = 0` in every masked layer (standard attention, gradient 1/2) and a sparsity pressure
`sparsity · mean σ(M)` in the loss. Stage 2 reads stage 1's final checkpoint from the run
folder and trains fresh models with what it found. What the masks are read into (a
Boolean interaction graph, an arithmetic attention pattern) is the family's
(`boolean.discover`, `arithmetic.discover`); the pieces here are what both experiments
(experiments/discover_prior.py, experiments/discover_arithmetic.py) need alike.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mpx import checkpoint, priors, report as report_lib, schemes
from mpx.attention import is_mask_path
from mpx.sweep import engine


def mask_logits_LHNN(params) -> np.ndarray:
  """The mask leaves of one member's params, `[L, H, N, N]` in layer order (a mask shared
  by the heads as H = 1)."""
  found = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    if is_mask_path(path):
      layer = next(name for name in map(str, (getattr(k, "key", k) for k in path))
                   if name.startswith("block_"))
      found[int(layer.rpartition("_")[2])] = np.asarray(leaf, np.float32)
  if not found:
    raise ValueError("these params hold no mask_logits leaf: the learned arm needs masks.")
  return np.stack([found[i] if found[i].ndim == 3 else found[i][None] for i in sorted(found)])


def sparsity_pressure(params) -> jax.Array:
  """mean σ(M) over every mask entry of every layer: 1 for the frozen neutral mask (whose
  gradient σ(M)σ(−M) is exactly 0 there), 1/2 at the learnable neutral init."""
  leaves = [leaf for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
            if is_mask_path(path)]
  return (sum(jnp.sum(jax.nn.sigmoid(leaf)) for leaf in leaves)
          / sum(leaf.size for leaf in leaves))


def learnable_masks(params, n_tokens: int, layers) -> Any:
  """`params` with the learnable neutral mask `M = 0` in `block_i` for each i of `layers`."""
  neutral = priors.neutral(n_tokens, learnable=True)
  return schemes.set_masks_per_layer(params, {f"block_{i}": neutral for i in layers})


def with_sparsity(task: engine.Task, sparsity: float) -> engine.Task:
  """`task` whose loss adds `sparsity` · `sparsity_pressure` (reported as aux `sparsity`).
  It moves only a learnable mask: a frozen neutral one has zero gradient and a constant
  pressure of 1, so the other members of the group train exactly as without it."""
  base_loss = task.loss

  def loss(params, batch, key):
    value, aux = base_loss(params, batch, key)
    pressure = sparsity_pressure(params)
    return value + sparsity * pressure, dict(aux, sparsity=pressure)

  return dataclasses.replace(task, loss=loss)


def restore_final(experiment: str, label: str, group: engine.Group,
                  run_dir: pathlib.Path | None) -> engine.SweepState:
  """Stage 1's final state (host arrays) from `run_dir`/checkpoints/`group.name`; refuses
  a run without a run folder, a stage 1 that has not reached its last step, and a
  checkpoint of another member count."""
  if run_dir is None:
    raise RuntimeError(f"{experiment}: stage 2 reads stage 1's checkpoint from the run "
                       "folder; run the experiment with `mpx run` (or run.run_experiment).")
  directory = pathlib.Path(run_dir) / "checkpoints" / group.name
  if checkpoint.latest_step(directory) != group.steps:
    raise RuntimeError(f"{experiment}: stage 1 of {label} has no final checkpoint (step "
                       f"{group.steps}) in {directory}; stage 2 starts after it. A gs:// "
                       "run folder is not supported (its checkpoints are not local).")
  with checkpoint.Checkpointer(directory, max_to_keep=None) as ckpt:
    state, _ = ckpt.restore_host(engine.init_state(group))
  rows = jax.tree_util.tree_leaves(state.params)[0].shape[0]
  if rows != len(group.members):
    raise RuntimeError(f"{experiment}: {directory} holds {rows} members, stage 1 has "
                       f"{len(group.members)}; resume with the config it was run with.")
  return state


class Stage1:
  """Stage 1 of one task as stage 2 reads it: its group's final checkpoint in the run
  folder, handed to `derive(state)` once per process, on first use (fresh or resumed
  alike: nothing of stage 1 is kept elsewhere). `run_dir` is set by the experiment's
  `save_run_files` hook (`attach_run_dir`)."""

  def __init__(self, experiment: str, label: str, group: engine.Group, derive):
    self.experiment, self.label, self.group = experiment, label, group
    self.run_dir: pathlib.Path | None = None
    self._derive_fn, self._derived = derive, None

  def derived(self):
    """`derive(state)` of stage 1's final state, computed once."""
    if self._derived is None:
      state = restore_final(self.experiment, self.label, self.group, self.run_dir)
      self._derived = self._derive_fn(state)
    return self._derived


def record_discovered(path: pathlib.Path, task: str, entry: dict, header: dict,
                      trained_with) -> dict:
  """Writes `task`'s `entry` into `path` (RUN_DIR/discovered.json; the other tasks' kept,
  `header`'s keys set where absent) and returns the file's data.

  A resume derives stage 1's findings again from its checkpoint, while stage 2's members
  resume from theirs, which started from the findings recorded before. Where the file
  already holds `task`, `trained_with(entry)` (what stage 2 trains with: graphs, patterns)
  must therefore equal the recorded one, or this refuses rather than report findings that
  no member trained with (float32 readouts near a threshold can flip on another backend).
  """
  data = json.loads(path.read_text()) if path.is_file() else {}
  recorded = data.get("tasks", {}).get(task)
  canonical = lambda e: json.loads(json.dumps(trained_with(e)))
  if recorded is not None and canonical(recorded) != canonical(entry):
    raise RuntimeError(
        f"{path}: stage 1 of {task!r} derived again from its checkpoint differs from what "
        "stage 2 started with (recorded here), so the resumed stage 2 would be reported "
        "under findings it was not trained with. Resume with the software it was started "
        "with, or run the experiment again in a new --out.")
  for key, value in header.items():
    data.setdefault(key, value)
  data.setdefault("tasks", {})[task] = entry
  report_lib.atomic_write(str(path), json.dumps(data, indent=1) + "\n")
  return data


def check_single_process(experiment: str) -> None:
  """Stage 2 reads stage 1's checkpoint where process 0 wrote it: one process only."""
  if jax.process_count() > 1:
    raise ValueError(f"{experiment} runs in one process (stage 2 reads stage 1's checkpoint "
                     "from the local run folder); run it without --distributed.")


def two_stages(experiment: str, config, stage1_arms, stages: dict, stage1_group, stage1_cls,
               stage2_group) -> list[engine.Group]:
  """Per task of `config`: stage 1 (`stage1_group(config, task)`, the arms `stage1_arms`
  of `config.schemes`), recorded in `stages` as `stage1_cls(config, task, group)`, then
  stage 2 (`stage2_group(config, task, stage1)`, the other arms), in that order."""
  check_single_process(experiment)
  groups = []
  for task in config.tasks:
    stage1 = None
    if any(a in config.schemes for a in stage1_arms):
      group = stage1_group(config, task)
      stage1 = stages[(config, task)] = stage1_cls(config, task, group)
      groups.append(group)
    if any(a not in stage1_arms for a in config.schemes):
      groups.append(stage2_group(config, task, stage1))
  return groups


def attach_run_dir(experiment: str, stages: dict, config, run_dir) -> None:
  """The run loop's hook before training: tells the `stages` of `config` ({(config, task):
  Stage1}) where stage 1's checkpoints are, and refuses a run folder of several
  configurations (stage 2 reads stage 1's members by their order in one group)."""
  run_dir = pathlib.Path(run_dir)
  saved = json.loads((run_dir / "config.json").read_text())
  if "traced" in saved or "sweep" in saved:
    raise ValueError(f"{experiment} trains one configuration per run folder; run each value "
                     f"of {sorted(saved.get('traced', {}) | saved.get('sweep', {}))} in its "
                     "own --out.")
  for (cfg, _), stage in stages.items():
    if cfg == config:
      stage.run_dir = run_dir


# The reports' cells (discovery.md of both experiments).


def fmt_stats(stats: dict, percent: bool, n_seeds: int) -> str:
  """`report.summarize` stats as "mean ± std": accuracies in %, scores as fractions; "(n of
  n_seeds)" after it when some seeds have no value (a score undefined there, a divergence),
  so a mean over fewer seeds than the per-seed column lists says so."""
  if not stats or stats["mean"] is None:
    return report_lib.MISSING
  scale = 100 if percent else 1
  text = f"{scale * stats['mean']:.2f} ± {scale * stats['std']:.2f}"
  return text if stats["n"] == n_seeds else f"{text} ({stats['n']} of {n_seeds})"


def fmt_score(x) -> str:
  """A precision or recall with 2 decimals; "—" where undefined (None)."""
  return report_lib.MISSING if x is None else f"{x:.2f}"


def per_seed(members, task: str, arm: str, metric: str, percent: bool) -> str:
  """One arm's `metric` per seed, in seed order, comma-separated."""
  values = []
  for m in sorted((m for m in members if m["task"] == task and m["scheme"] == arm),
                  key=lambda m: m["seed"]):
    v = m["metrics"].get(metric)
    values.append(report_lib.MISSING if v is None else
                  f"{100 * v:.2f}" if percent else f"{v:.2f}")
  return ", ".join(values)
