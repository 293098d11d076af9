"""What discovering a prior shares across task families: the `learned` arm and the
reports' cells.

Stage 1 trains, next to the plain model, a `learned` arm: the learnable neutral mask
`M = 0` in every masked layer (standard attention, gradient 1/2) and a sparsity pressure
`sparsity · mean σ(M)` in the loss. Stage 2 reads stage 1's final checkpoint from the run
folder (`mpx.sweep.stages`) and trains fresh models with what it found. What the masks
are read into (a Boolean interaction graph, an arithmetic attention pattern) is the
family's (`boolean.discover`, `arithmetic.discover`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mpx import priors, report as report_lib, schemes
from mpx.attention import is_mask_path
from mpx.sweep import engine

# Route (a) reads an entry as open when σ(M) ends above its init σ(0) = 1/2; fixed on a
# planted Boolean function before any task's unseen accuracy was looked at.
MASK_THRESHOLD = 0.5


@dataclasses.dataclass(frozen=True)
class DiscoveryConfig:
  """The fields of a discovery experiment's `learned` arm and its readout; a family's
  Config lists it before its own base (`class Config(DiscoveryConfig, gotu.Config)`).

  sparsity: weight of the pressure mean σ(M) (over every mask entry of every layer) in the
    `learned` arm's loss; it closes what the task does not hold open.
  discover_mask_lr_multiplier: the `learned` arm's mask learning rate, × the rest's.
  mask_threshold: an entry is read as open when σ(M) > it (1/2: above its init).
  persistence: the persistence diagnostics at each evaluation (False: a faster smoke test).
  """
  sparsity: float = 0.1
  discover_mask_lr_multiplier: float = 10.0
  mask_threshold: float = MASK_THRESHOLD
  persistence: bool = True

  def __post_init__(self):
    super().__post_init__()
    if not (self.sparsity >= 0 and self.discover_mask_lr_multiplier > 0):
      raise ValueError(f"sparsity={self.sparsity} must be >= 0 and discover_mask_lr_"
                       f"multiplier={self.discover_mask_lr_multiplier} > 0 (the mask learns).")
    if not 0 < self.mask_threshold < 1:
      raise ValueError(f"mask_threshold={self.mask_threshold} must be in (0, 1) (a σ(M)).")


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
