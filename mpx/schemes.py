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
The ViT (`apply_vision_scheme`, the vision family's baselines; all with a neutral mask
except `mask`):
  default / mask: as above.
  mimetic: per layer W_Q W_Kᵀ ≈ 0.7 Z + 0.7 I per head and W_V W_O ≈ 0.4 Z − 0.4 I
           (fresh Z per layer), the structure pretrained ViTs show.
  impulse_svd / impulse_opt: each head's one-hot 2-D impulse shift fitted into W_Q, W_K
           of every layer by QK-SVD / QK-Opt on LayerNorm(positions); a learned
           `pos_embed` is scaled ×18 as above, fixed sin-cos positions are not (the fit
           holds on that pseudo-input; on real images much less of it survives).
The causal decoder (`apply_language_scheme`, the language family; the prior is ALiBi's
causal distance bias `priors.alibi_prior` in every layer):
  default:    learned absolute positions, neutral mask.
  alibi:      ALiBi as a fixed bias: the prior, frozen, and no absolute positions.
  mask:       the prior, learnable, with learned absolute positions.
  mask_nopos: the prior, learnable, and no absolute positions.
"No absolute positions" zeroes `pos_embed`; the member freezes it
(`position_lr_multiplier = 0`), so all four keep one param tree.
Schemes without a mask prior should train with `mask_lr_multiplier = 0` so the neutral
mask stays frozen.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mpx import inits, priors
from mpx.attention import is_mask_path
from mpx.nn import vit as vit_lib

SCHEMES = ("default", "mask", "qk_svd", "qk_opt")
VISION_SCHEMES = ("default", "mimetic", "impulse_svd", "impulse_opt", "mask")
LANGUAGE_SCHEMES = ("default", "alibi", "mask", "mask_nopos")


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
  params = _scale_pos_embed(params, pos_scale)
  return _write_qk_fit(params, "svd" if scheme == "qk_svd" else "opt",
                       pattern_from_prior(prior, num_heads),
                       inits.pseudo_input(params["pos_embed"]), head_dim, key, qk_opt_steps)


def _scale_pos_embed(params, pos_scale: float):
  """`params` with the `pos_embed` param ×`pos_scale`: the QK schemes need the position
  term to dominate the real input LayerNorm(token + pos) for their fit to carry over."""
  if not pos_scale > 0:
    raise ValueError(f"pos_scale must be > 0; got {pos_scale}.")
  return dict(params, pos_embed=params["pos_embed"] * pos_scale)


def _write_qk_fit(params, method: str, pattern_HNN, pseudo_ND, head_dim: int, key,
                  qk_opt_steps: int):
  """`params` with W_Q, W_K of every layer fitted to the pattern on the pseudo-input by
  QK-SVD (`method="svd"`) or QK-Opt (`"opt"`)."""
  if method == "svd":
    wq, wk = inits.qk_svd(pattern_HNN, pseudo_ND, head_dim, key)
  else:
    wq, wk = inits.qk_opt(pattern_HNN, pseudo_ND, head_dim, key, steps=qk_opt_steps)
  return inits.set_qk(params, wq, wk)


def apply_vision_scheme(scheme: str, params, model: vit_lib.ViT, key, *, mask_prior=None,
                        qk_opt_steps: int = 10_000, pos_scale: float = QK_POS_SCALE):
  """Returns the ViT `params` (of `model`) initialised by `scheme` (`VISION_SCHEMES`).

  `mask_prior` (`[N, N]` or `[H, N, N]`) is what scheme "mask" writes into every mask
  leaf; the others write the neutral mask, so every scheme keeps one param tree.
  mimetic draws a fresh Z per layer (`fold_in(key, layer)`): layers are not copies.
  impulse_svd / impulse_opt fit W_Q, W_K to `inits.impulse_patterns` on
  `pseudo_input(position_embedding(model, params))`. With learned positions the
  `pos_embed` param is first multiplied by `pos_scale`, as `apply_scheme` does, so the
  real first-block input looks like the pseudo-input. Fixed sin-cos positions have no
  param to scale, so `pos_scale` is not applied: the real input is then less dominated
  by positions and the realised shift at init is weaker than on the pseudo-input.
  """
  if scheme not in VISION_SCHEMES:
    raise ValueError(f"unknown scheme {scheme!r}; choose one of {VISION_SCHEMES}.")
  if scheme == "mask":
    if mask_prior is None:
      raise ValueError("scheme 'mask' needs mask_prior ([N, N] or [H, N, N], N = "
                       f"{vit_lib.n_tokens(model)}), e.g. priors.window_prior(...).")
    return set_masks(params, jnp.asarray(mask_prior))
  params = set_masks(params, priors.neutral(vit_lib.n_tokens(model)))
  if scheme == "default":
    return params
  if scheme == "mimetic":
    for layer in range(model.depth):
      name = f"block_{layer}"
      factors = inits.mimetic(jax.random.fold_in(key, layer), model.width,
                              model.num_heads, model.head_dim)
      kernels = {sub: _as_kernel(w, params[name]["attention"][sub]["kernel"], name, sub)
                 for sub, w in zip(("query", "key", "value", "out"), factors)}
      params = inits.set_attention_kernels(params, kernels, layers=[name])
    return params
  if model.pos_embed == "learned":
    params = _scale_pos_embed(params, pos_scale)
  grid_h, grid_w = vit_lib.grid_size(model)
  pattern_HNN = inits.impulse_patterns(grid_h, grid_w, model.num_heads,
                                       cls_token=model.pool == "cls")
  pseudo_ND = inits.pseudo_input(vit_lib.position_embedding(model, params))
  return _write_qk_fit(params, scheme.removeprefix("impulse_"), pattern_HNN, pseudo_ND,
                       model.head_dim, key, qk_opt_steps)


def _as_kernel(w, leaf, layer: str, sub: str):
  """`w` in the kernel's shape (`[D, H, R]` / `[H, R, D]`, or a model's fused `[D, H·R]`
  / `[H·R, D]`); the same layout is assumed, so only the head axes may be merged."""
  if w.size != leaf.size or (w.shape[0] != leaf.shape[0] and w.shape[-1] != leaf.shape[-1]):
    raise ValueError(f"mimetic's {sub} kernel has shape {w.shape} but {layer}/attention/"
                     f"{sub}/kernel is {leaf.shape}.")
  return w.reshape(leaf.shape)


def language_scheme_trains(scheme: str) -> dict[str, bool]:
  """What a language scheme trains: {"mask": learnable prior, "positions": pos_embed}."""
  if scheme not in LANGUAGE_SCHEMES:
    raise ValueError(f"unknown scheme {scheme!r}; choose one of {LANGUAGE_SCHEMES}.")
  return {"mask": scheme.startswith("mask"), "positions": scheme in ("default", "mask")}


def apply_language_scheme(scheme: str, params, num_heads: int):
  """The decoder's `params` (learned positions, per-head masks) initialised by `scheme`
  (`LANGUAGE_SCHEMES`); train them with the multipliers `language_scheme_trains` gives."""
  trains = language_scheme_trains(scheme)
  if "pos_embed" not in params:
    raise ValueError("the language schemes need a decoder with positions='learned' (the "
                     "no-position schemes zero and freeze its pos_embed).")
  n_tokens = params["pos_embed"].shape[0]
  prior = (priors.neutral(n_tokens) if scheme == "default"
           else priors.alibi_prior(n_tokens, num_heads))
  params = set_masks(params, prior)
  if not trains["positions"]:
    params = dict(params, pos_embed=jnp.zeros_like(params["pos_embed"]))
  return params
