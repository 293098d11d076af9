"""Init schemes: the values a scheme writes into a model's param tree.

Every scheme keeps the same tree (a `mask_logits` leaf in each masked layer), so
members with different schemes stack and train in one compiled program:
  default: the model's own init, neutral mask (exactly standard attention).
  mask:    the prior written into every `mask_logits` leaf (`set_masks_per_layer` writes
           one prior per layer).
  qk_svd / qk_opt: the prior's allowed pattern realised in W_Q, W_K of every layer on
           the pseudo-input LayerNorm(position embedding); neutral mask. As in the
           recipe (PAPER.md), the position embedding is scaled (×18) with them: the
           layers see LayerNorm(token + pos), and only a dominant position term makes
           that input look like the pseudo-input the pattern was fitted on.
Schemes without a mask prior should train with `mask_lr_multiplier = 0` so the neutral
mask stays frozen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mpx import inits, priors
from mpx.attention import is_mask_path

SCHEMES = ("default", "mask", "qk_svd", "qk_opt")


def _fit_prior(mask_logits, leaf, path):
  """`mask_logits` in the leaf's shape and dtype (a shared prior broadcast over heads)."""
  if mask_logits.ndim == 2 and leaf.ndim == 3:
    return jnp.broadcast_to(mask_logits, leaf.shape).astype(leaf.dtype)
  if mask_logits.shape != leaf.shape:
    raise ValueError(f"the prior has shape {mask_logits.shape} but "
                     f"{jax.tree_util.keystr(path)} is {leaf.shape}; rebuild the prior "
                     "for this model (N counts CLS; per-head priors need H heads).")
  return mask_logits.astype(leaf.dtype)


def _layer_name(path) -> str | None:
  """The block a mask leaf belongs to (`block_i` of `block_i/attention/mask_logits`)."""
  keys = [getattr(k, "key", None) for k in path]
  return keys[-3] if len(keys) >= 3 else None


def set_masks(params, mask_logits):
  """Writes `mask_logits` (`[N, N]` or `[H, N, N]`) into every mask leaf, broadcasting a
  shared prior over heads when the leaf is per head."""
  def write(path, leaf):
    return _fit_prior(mask_logits, leaf, path) if is_mask_path(path) else leaf
  return jax.tree_util.tree_map_with_path(write, params)


def set_masks_per_layer(params, priors_by_layer):
  """Writes `priors_by_layer[name]` into `name/attention/mask_logits`; layers not named
  keep their leaf. Per-layer priors make *where* the mask sits a value, so designs that
  differ in it still share one param tree (one compiled program)."""
  found = set()

  def write(path, leaf):
    name = _layer_name(path) if is_mask_path(path) else None
    if name not in priors_by_layer:
      return leaf
    found.add(name)
    return _fit_prior(jnp.asarray(priors_by_layer[name]), leaf, path)

  params = jax.tree_util.tree_map_with_path(write, params)
  missing = sorted(set(priors_by_layer) - found)
  if missing:
    raise ValueError(f"layers {missing} have no mask_logits leaf (check the model's "
                     "mask_layers).")
  return params


def pattern_from_prior(prior, num_heads: int) -> jax.Array:
  """The prior's allowed pairs (`M > 0`) as a 0/1 target pattern `[H, N, N]`."""
  allowed = (jnp.asarray(prior) > 0).astype(jnp.float32)
  return jnp.broadcast_to(allowed, (num_heads,) + allowed.shape[-2:])


QK_POS_SCALE = 18.0  # The recipe's position-embedding scale for the QK schemes.


def apply_scheme(scheme: str, params, prior, key, *, num_heads: int, head_dim: int,
                 qk_opt_steps: int = 10_000, pos_scale: float = QK_POS_SCALE):
  """Returns `params` initialised by `scheme`; `prior` is the task's mask prior.

  `pos_scale` multiplies the `pos_embed` param of the QK schemes (1 = leave it); the
  pseudo-input LayerNorm(pos) does not depend on it, the model's real input does.
  """
  if scheme not in SCHEMES:
    raise ValueError(f"unknown scheme {scheme!r}; choose one of {SCHEMES}.")
  if scheme == "mask":
    return set_masks(params, jnp.asarray(prior))
  params = set_masks(params, priors.neutral(prior.shape[-1]))
  if scheme == "default":
    return params
  if "pos_embed" not in params:
    raise ValueError(f"scheme {scheme!r} fits W_Q, W_K on LayerNorm(pos_embed), but the "
                     f"model has no top-level 'pos_embed' param (it has {sorted(params)}).")
  if not pos_scale > 0:
    raise ValueError(f"pos_scale must be > 0; got {pos_scale}.")
  params = dict(params, pos_embed=params["pos_embed"] * pos_scale)
  pseudo_ND = inits.pseudo_input(params["pos_embed"])
  pattern_HNN = pattern_from_prior(prior, num_heads)
  if scheme == "qk_svd":
    wq, wk = inits.qk_svd(pattern_HNN, pseudo_ND, head_dim, key)
  else:
    wq, wk = inits.qk_opt(pattern_HNN, pseudo_ND, head_dim, key, steps=qk_opt_steps)
  return inits.set_qk(params, wq, wk)
