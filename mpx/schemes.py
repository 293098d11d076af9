"""Init schemes: the values a scheme writes into a model's param tree.

Every scheme keeps the same tree (a `mask_logits` leaf in each masked layer), so
members with different schemes stack and train in one compiled program:
  default: the model's own init, neutral mask (exactly standard attention).
  mask:    the prior written into every `mask_logits` leaf.
  qk_svd / qk_opt: the prior's allowed pattern realised in W_Q, W_K of every layer on
           the pseudo-input LayerNorm(position embedding); neutral mask.
Schemes without a mask prior should train with `mask_lr_multiplier = 0` so the neutral
mask stays frozen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mpx import inits, priors
from mpx.sweep.optim import MASK_LEAF

SCHEMES = ("default", "mask", "qk_svd", "qk_opt")


def set_masks(params, mask_logits):
  """Writes `mask_logits` (`[N, N]` or `[H, N, N]`) into every mask leaf, broadcasting a
  shared prior over heads when the leaf is per head."""
  def write(path, leaf):
    if getattr(path[-1], "key", None) != MASK_LEAF:
      return leaf
    if mask_logits.ndim == 2 and leaf.ndim == 3:
      return jnp.broadcast_to(mask_logits, leaf.shape).astype(leaf.dtype)
    if mask_logits.shape != leaf.shape:
      raise ValueError(f"the prior has shape {mask_logits.shape} but "
                       f"{jax.tree_util.keystr(path)} is {leaf.shape}; rebuild the prior "
                       "for this model (N counts CLS; per-head priors need H heads).")
    return mask_logits.astype(leaf.dtype)
  return jax.tree_util.tree_map_with_path(write, params)


def pattern_from_prior(prior, num_heads: int) -> jax.Array:
  """The prior's allowed pairs (`M > 0`) as a 0/1 target pattern `[H, N, N]`."""
  allowed = (jnp.asarray(prior) > 0).astype(jnp.float32)
  return jnp.broadcast_to(allowed, (num_heads,) + allowed.shape[-2:])


def apply_scheme(scheme: str, params, prior, key, *, num_heads: int, head_dim: int,
                 qk_opt_steps: int = 10_000):
  """Returns `params` initialised by `scheme`; `prior` is the task's mask prior."""
  if scheme not in SCHEMES:
    raise ValueError(f"unknown scheme {scheme!r}; choose one of {SCHEMES}.")
  if scheme == "mask":
    return set_masks(params, jnp.asarray(prior))
  params = set_masks(params, priors.neutral(prior.shape[-1]))
  if scheme == "default":
    return params
  pseudo_ND = inits.pseudo_input(params["pos_embed"])
  pattern_HNN = pattern_from_prior(prior, num_heads)
  if scheme == "qk_svd":
    wq, wk = inits.qk_svd(pattern_HNN, pseudo_ND, head_dim, key)
  else:
    wq, wk = inits.qk_opt(pattern_HNN, pseudo_ND, head_dim, key, steps=qk_opt_steps)
  return inits.set_qk(params, wq, wk)
