"""One evaluator for every group: the task's `eval_step` mapped over members on the
evaluation set, then its `summarize` per member, plus the persistence diagnostics where
the group has a probe (drift from the initial params the state keeps)."""

from __future__ import annotations

import functools
from typing import Callable

import jax
import numpy as np

from jax.sharding import NamedSharding, PartitionSpec

from mpx import diagnostics
from mpx.sweep import distributed, engine

_PROBE_KEY = 0  # The loss's key for the probe gradients: fixed, so evaluations compare.


@functools.lru_cache(maxsize=64)
def _eval_fn(eval_step: Callable, members_per_call: int | None) -> Callable:
  """`(params_K, batch) → {name: [K, B]}`, jitted once per task and set of shapes."""
  mapped = engine.map_members(lambda params, batch: eval_step(params, batch),
                              members_per_call)
  return jax.jit(mapped)


def eval_values(group: engine.Group, params_K) -> dict[str, np.ndarray]:
  """`{name: [K', E]}` over the whole evaluation set (K' = padded members), one device
  call per evaluation batch, gathered once at the end."""
  fn = _eval_fn(group.task.eval_step, group.members_per_call)
  outputs = [fn(params_K, _like(params_K, batch)) for batch in group.eval_data.batches()]
  outputs = distributed.to_host(outputs)
  size = group.eval_data.size
  return {name: np.concatenate([o[name] for o in outputs], axis=1)[:, :size]
          for name in outputs[0]}


def _like(params_K, batch):
  """The batch replicated over the params' mesh when they span several processes (a jit
  over global arrays takes global arrays); as is otherwise."""
  leaf = jax.tree_util.tree_leaves(params_K)[0]
  if leaf.is_fully_addressable:
    return batch
  return jax.device_put(batch, NamedSharding(leaf.sharding.mesh, PartitionSpec()))


class Evaluator:
  """`evaluate(state) → [metrics per member]`: padding members dropped here, once.

  The probe's loss (the task's loss at a fixed key) is built once, so the persistence
  program compiles once per group; each member's fidelity at init is measured once from
  `state.initial` and kept.
  """

  def __init__(self, group: engine.Group):
    self.group = group
    task = group.task
    self._probe_loss = lambda params, batch: task.loss(
        params, batch, jax.random.key(_PROBE_KEY))[0]
    self._fidelity_init: dict[int, float] = {}

  def __call__(self, state: engine.SweepState) -> list[dict]:
    group = self.group
    values = eval_values(group, state.params)
    if group.probe is not None:  # Whole member trees on every host (a gather).
      params, initial = distributed.to_host((state.params, state.initial))
    results = []
    for i, member in enumerate(group.members):
      metrics = group.task.summarize({k: v[i] for k, v in values.items()}, member)
      if group.probe is not None:
        metrics |= self._persistence(i, engine.unstack(params, i),
                                     engine.unstack(initial, i))
      results.append(metrics)
    return results

  def _layers(self, i, params, initial) -> dict:
    probe = self.group.probe
    return diagnostics.persistence_metrics(
        probe.apply, self._probe_loss, params, initial, probe.inputs, probe.batch,
        probe.patterns[i], map_layers=probe.map_layers,
        example_groups=probe.example_groups, query_rows=probe.query_rows)

  def _persistence(self, i, params, initial) -> dict:
    """Per-layer drift, fidelity and gradient norms, their means over layers as flat
    metrics (the summary's persistence table), the fidelity at init, and the last
    layer's pattern as the share of heads allowing each pair (the heatmaps)."""
    probe = self.group.probe
    keys = ("fidelity",) + tuple(f"fidelity_{name}" for name in probe.example_groups or {})
    if i not in self._fidelity_init:
      self._fidelity_init[i] = diagnostics.layer_means(
          self._layers(i, initial, initial), keys)["fidelity"]
    layers = self._layers(i, params, initial)
    last = sorted(probe.patterns[i], key=_layer_index)[-1]
    pattern = np.asarray(probe.patterns[i][last], float)
    if pattern.ndim == 3:
      pattern = pattern.mean(0)
    return {"layers": layers, "fidelity_init": self._fidelity_init[i],
            "prior_pattern": pattern.round(4).tolist(),
            **diagnostics.layer_means(layers, keys)}


def _layer_index(name: str) -> int:
  return int(name.rsplit("_", 1)[-1]) if name.rsplit("_", 1)[-1].isdigit() else 0
