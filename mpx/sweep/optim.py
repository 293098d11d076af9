"""Optax optimizers whose hyperparameters are per-member *data*.

The optimizer is rebuilt inside the vmapped step from the member's traced scalars, so a
new learning rate or weight decay changes values, never the compiled program. Only the
*shape* of the schedule (warmup, total steps) is static.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

import jax
import jax.numpy as jnp
import optax

from mpx import attention

OPTIMIZERS = ("adam_l2", "adamw")
SCHEDULES = ("constant", "warmup_cosine")
HPARAMS = ("learning_rate", "weight_decay", "mask_lr_multiplier")
# Optional: a family that freezes absolute positions for some members (language's
# `mask_nopos`, `alibi`) gives every member this factor on the `pos_embed` leaf.
POSITION_MULTIPLIER = "position_lr_multiplier"
POSITION_LEAF = "pos_embed"


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """Static optimizer settings.

  adam_l2: Adam with coupled L2 (`g + wd·θ` before the moments), PyTorch's
    `Adam(weight_decay=…)`, which the GOTU code uses. adamw: decoupled decay.
  Per-member values live in hparams: `learning_rate`, `weight_decay` and
  `mask_lr_multiplier` (the mask's learning rate relative to the rest; 0 freezes it);
  optionally `position_lr_multiplier`, the same for the `pos_embed` leaf.
  no_decay: the parameter group without weight decay, declared once per family as
    regexes over the `/`-joined param path (`param_path`), full matches, e.g.
    `(r"pos_embed", r".*/bias")`; () decays every weight (the GOTU code's coupled L2).
    The mask never gets weight decay, whatever the rules: decay would pull the prior
    towards M = 0.
  """
  optimizer: str = "adam_l2"
  schedule: str = "constant"
  total_steps: int = 1
  warmup_steps: int = 0
  grad_clip: float | None = None
  b1: float = 0.9
  b2: float = 0.999
  eps: float = 1e-8
  no_decay: tuple[str, ...] = ()

  def __post_init__(self):
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f"optimizer={self.optimizer!r}; choose one of {OPTIMIZERS}.")
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule={self.schedule!r}; choose one of {SCHEDULES}.")
    if not 0 <= self.warmup_steps < max(self.total_steps, 1):
      raise ValueError(f"warmup_steps={self.warmup_steps} must be in [0, total_steps="
                       f"{self.total_steps}).")
    if isinstance(self.no_decay, str):
      raise ValueError(f"no_decay={self.no_decay!r} must be a tuple of patterns, e.g. "
                       f"({self.no_decay!r},).")
    object.__setattr__(self, "no_decay", tuple(self.no_decay))  # Hashable: compile keys.
    for pattern in self.no_decay:
      try:
        re.compile(pattern)
      except re.error as error:
        raise ValueError(f"no_decay pattern {pattern!r} is not a regex: {error}.") from None


def schedule_shape(config: OptimConfig) -> optax.Schedule:
  """The learning-rate multiplier over steps, built once and scaled per member."""
  if config.schedule == "constant":
    return optax.constant_schedule(1.0)
  return optax.warmup_cosine_decay_schedule(
      0.0, 1.0, config.warmup_steps, config.total_steps, end_value=0.0)


def param_path(path) -> str:
  """A pytree key path as the `no_decay` rules match it: "block_0/attention/query/bias",
  for Linen params and NNX state alike (the latter's trailing `.value` is dropped)."""
  path = tuple(path)
  if path and getattr(path[-1], "name", None) == "value":
    path = path[:-1]
  return jax.tree_util.keystr(path, simple=True, separator="/")


def decays(config: OptimConfig, path) -> bool:
  """Whether the leaf at `path` gets weight decay: not the mask, no `no_decay` match."""
  name = param_path(path)
  return not (attention.is_mask_path(path) or
              any(re.fullmatch(pattern, name) for pattern in config.no_decay))


def decay_tree(config: OptimConfig, params) -> "PyTree[bool]":
  """True at every leaf that gets weight decay (static: decided by path alone)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: decays(config, path), params)


def is_position_path(path) -> bool:
  """Whether a key path ends at the `pos_embed` leaf (Linen params or NNX state)."""
  return attention.leaf_name(path) == POSITION_LEAF


def _scale_group_updates(multiplier, in_group) -> optax.GradientTransformation:
  """Multiplies the updates of the leaves whose path is `in_group` by `multiplier`."""
  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(
        lambda path, u: u * multiplier if in_group(path) else u, updates), state
  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def _check_hparams(hparams: Mapping[str, jax.Array]) -> None:
  """No defaults: a member that forgot `weight_decay` must not silently train without it."""
  missing = [name for name in HPARAMS if name not in hparams]
  if missing:
    raise ValueError(f"hparams {sorted(hparams)} lack {missing}; every member must set "
                     f"{', '.join(HPARAMS)} (0 disables decay / freezes the mask).")


def make_optimizer(config: OptimConfig,
                   hparams: Mapping[str, jax.Array]) -> optax.GradientTransformation:
  """The member's optimizer; `hparams` may be traced scalars and must hold `HPARAMS`."""
  _check_hparams(hparams)
  lr = hparams["learning_rate"]
  wd = hparams["weight_decay"]
  decay = optax.add_decayed_weights(wd, mask=lambda params: decay_tree(config, params))
  shape = schedule_shape(config)
  parts = []
  if config.grad_clip is not None:
    parts.append(optax.clip_by_global_norm(config.grad_clip))
  if config.optimizer == "adam_l2":
    parts.append(decay)
  parts.append(optax.scale_by_adam(config.b1, config.b2, config.eps))
  if config.optimizer == "adamw":
    parts.append(decay)
  parts.append(optax.scale_by_schedule(lambda count: -lr * shape(count)))
  parts.append(_scale_group_updates(hparams["mask_lr_multiplier"], attention.is_mask_path))
  if POSITION_MULTIPLIER in hparams:  # 0 freezes the position embedding (and its decay).
    parts.append(_scale_group_updates(hparams[POSITION_MULTIPLIER], is_position_path))
  return optax.chain(*parts)


def stack_hparams(hparams: list[Mapping[str, float]]) -> dict[str, jax.Array]:
  """Per-member hparam dicts → `{name: float32[K]}`; every member must name the same keys."""
  names = sorted(hparams[0])
  for i, h in enumerate(hparams):
    if sorted(h) != names:
      raise ValueError(f"member {i} has hparams {sorted(h)} but member 0 has {names}; "
                       "every member of a sweep needs the same hparam names.")
  return {n: jnp.asarray([h[n] for h in hparams], jnp.float32) for n in names}
