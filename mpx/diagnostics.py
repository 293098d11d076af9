"""Persistence diagnostics: does the prior survive training?

The paper's claim is about persistence: a QK prior is overwritten, a mask prior stays.
These pure functions measure it per layer on one member's params, so every scheme is
compared on the same quantities:
  drift      ‖θ_t − θ_0‖ / ‖θ_0‖ of the mask (over its entries not at the frozen neutral
             logit; null when it has none) and of the query/key kernels;
  fidelity   attention mass on the prior's allowed pairs, on a fixed probe batch that
             represents the data (both GOTU domains, in proportion);
  grad norms of the mask and of the query/key kernels (Theorem 1: the mask's gradient is
             bounded by p·σ(−m), QK gradients scale with feature norms).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from mpx.attention import MASK_LEAF
from mpx.priors import NEUTRAL_LOGIT

PyTree = Any
TRACKED = {"mask": (MASK_LEAF,), "query": ("query", "kernel"), "key": ("key", "kernel")}


def _layer_leaves(params: PyTree) -> dict[str, dict[str, jax.Array]]:
  """{layer: {"mask" | "query" | "key": leaf}} for every attention layer."""
  flat = traverse_util.flatten_dict(params)
  layers: dict[str, dict[str, jax.Array]] = {}
  for path, leaf in flat.items():
    for name, suffix in TRACKED.items():
      if path[-len(suffix):] == suffix and "attention" in path:
        layers.setdefault(path[0], {})[name] = leaf
  return layers


def _relative_change(leaf: jax.Array, start: jax.Array) -> jax.Array:
  return jnp.linalg.norm(leaf - start) / jnp.maximum(jnp.linalg.norm(start), 1e-12)


def _mask_drift(leaf: jax.Array, start: jax.Array) -> jax.Array:
  """‖M − M₀‖ / ‖M₀‖ over the entries that can move: those not at the frozen neutral logit
  (their gradient is σ(−200) = 0, and at 200 each they would swamp ‖M₀‖). NaN (reported
  as null) when no entry can move."""
  movable = start != NEUTRAL_LOGIT
  change = jnp.linalg.norm(jnp.where(movable, leaf - start, 0.0))
  scale = jnp.maximum(jnp.linalg.norm(jnp.where(movable, start, 0.0)), 1e-12)
  return jnp.where(jnp.any(movable), change / scale, jnp.nan)


def _drift(params: PyTree, initial: PyTree) -> dict[str, dict[str, jax.Array]]:
  now, start = _layer_leaves(params), _layer_leaves(initial)
  return {layer: {name: (_mask_drift if name == "mask" else _relative_change)(
                      leaf, start[layer][name])
                  for name, leaf in leaves.items()}
          for layer, leaves in now.items()}


def _grad_norms(grads: PyTree) -> dict[str, dict[str, jax.Array]]:
  return {layer: {name: jnp.linalg.norm(g) for name, g in leaves.items()}
          for layer, leaves in _layer_leaves(grads).items()}


def _mass_on(weights_BHNN: jax.Array, allowed: jax.Array) -> jax.Array:
  return jnp.mean(_mass_per_example(weights_BHNN, allowed))


def _mass_per_example(weights_BHNN: jax.Array, allowed: jax.Array,
                      query_rows: jax.Array | None = None) -> jax.Array:
  """`[B]`: each example's attention mass on the allowed pairs, mean over heads and the
  query rows (all, or those where `query_rows` is True)."""
  allowed = jnp.broadcast_to(jnp.asarray(allowed, bool), weights_BHNN.shape[-3:])
  mass_BHN = jnp.sum(jnp.where(allowed, weights_BHNN, 0.0), axis=-1)
  if query_rows is None:
    return jnp.mean(mass_BHN, axis=(-2, -1))
  rows = jnp.broadcast_to(query_rows, mass_BHN.shape)
  return jnp.sum(jnp.where(rows, mass_BHN, 0.0), axis=(-2, -1)) / jnp.sum(rows, axis=(-2, -1))


def _float_or_none(x) -> float | None:
  """A host float; None for NaN, what a drift over no movable entry is."""
  x = float(x)
  return None if np.isnan(x) else x


def _to_floats(tree) -> Any:
  return jax.tree_util.tree_map(_float_or_none, jax.device_get(tree))


def relative_drift(params: PyTree, initial: PyTree) -> dict[str, dict[str, float]]:
  """Per layer: ‖θ − θ_0‖ / ‖θ_0‖ of the mask (its movable entries; None if none) and
  the query/key kernels."""
  return _to_floats(_drift(params, initial))


def gradient_norms(grads: PyTree) -> dict[str, dict[str, float]]:
  """Per layer: the global norm of the gradient of the mask and the query/key kernels."""
  return _to_floats(_grad_norms(grads))


def attention_maps(apply_fn: Callable, params: PyTree, *inputs) -> dict[str, jax.Array]:
  """{layer: attention probabilities [B, H, N, N]} recorded by `MaskedSelfAttention`."""
  _, state = apply_fn({"params": params}, *inputs, mutable=["intermediates"])
  flat = traverse_util.flatten_dict(state["intermediates"])
  return {path[0]: value[0] for path, value in flat.items()
          if path[-1] == "attention_weights"}


def prior_fidelity(weights_BHNN: jax.Array, allowed: jax.Array) -> float:
  """Attention mass on the allowed (query, key) pairs, averaged over queries, heads and the
  batch. `allowed` is `[N, N]` or `[H, N, N]`; a neutral (all-allowed) prior gives 1 and a
  uniform attention gives the allowed share of each row."""
  return float(_mass_on(weights_BHNN, allowed))


def steps_to_half(steps: Sequence[int], fidelity: Sequence[float]) -> int | None:
  """The first step at which fidelity fell below half its initial value (None = never)."""
  if not fidelity:
    return None
  for step, value in zip(steps, fidelity):
    if value < 0.5 * fidelity[0]:
      return int(step)
  return None


def mean_attention_map(weights_BHNN: jax.Array, decimals: int = 4) -> list[list[float]]:
  """The attention probabilities averaged over the batch and heads, `[N, N]` as nested
  lists small enough for a metrics line: what the heatmaps of `mpx plot` draw."""
  return np.round(np.asarray(jnp.mean(weights_BHNN, axis=(0, 1)), np.float64),
                  decimals).tolist()


@functools.partial(jax.jit, static_argnums=(0, 1))
def _persistence_arrays(apply_fn, loss_fn, params, initial, probe_inputs, probe_batch,
                        allowed, query_rows):
  """Everything `persistence_metrics` reports, as arrays, in one compiled program (eager
  Flax applies and grads cost seconds per member on CPU). `apply_fn` and `loss_fn` are
  static: pass the same callables every evaluation so it compiles once."""
  maps = attention_maps(apply_fn, params, *probe_inputs)
  pattern = lambda layer: allowed[layer] if isinstance(allowed, dict) else allowed
  return (_drift(params, initial), _grad_norms(jax.grad(loss_fn)(params, probe_batch)),
          {layer: _mass_per_example(w, pattern(layer), query_rows)
           for layer, w in maps.items()},
          {layer: jnp.mean(w, axis=(0, 1)) for layer, w in maps.items()})


def persistence_metrics(apply_fn: Callable, loss_fn: Callable, params: PyTree,
                        initial: PyTree, probe_inputs: Sequence, probe_batch: Mapping,
                        allowed: jax.Array | Mapping[str, jax.Array],
                        map_layers: Sequence[str] = (),
                        example_groups: Mapping[str, np.ndarray] | None = None,
                        query_rows: np.ndarray | None = None
                        ) -> dict[str, dict[str, Any]]:
  """All diagnostics of one member, per layer: drift, fidelity and gradient norms, and
  for the layers in `map_layers` the mean attention map (batch and heads, 4 decimals).

  The attention maps and fidelity come from `probe_inputs`, the gradients from the loss
  on `probe_batch` (e.g. only the probe's training-domain points). `allowed` is one
  pattern (`[N, N]` or `[H, N, N]`) or one per layer name, so a member is scored on its
  own prior. `example_groups` (name → bool mask over the probe examples) adds
  `fidelity_<name>`, the fidelity on that part of the probe. `query_rows` (bool `[N]`)
  restricts fidelity to those queries, e.g. the rows that predict an answer digit.
  """
  if query_rows is not None:
    query_rows = jnp.asarray(query_rows, bool)
    if query_rows.ndim != 1 or not bool(query_rows.any()):
      raise ValueError(f"query_rows must be a non-empty bool mask [N]; got "
                       f"{query_rows.shape} with {int(query_rows.sum())} rows set.")
  if isinstance(allowed, Mapping):
    allowed = {layer: jnp.asarray(a, bool) for layer, a in allowed.items()}
  else:
    allowed = jnp.asarray(allowed, bool)
  drift, grads, mass, maps = jax.device_get(_persistence_arrays(
      apply_fn, loss_fn, params, initial, tuple(probe_inputs), dict(probe_batch), allowed,
      query_rows))
  out = {}
  for layer in drift:
    out[layer] = {f"drift_{k}": _float_or_none(v) for k, v in drift[layer].items()}
    out[layer] |= {f"grad_norm_{k}": float(v) for k, v in grads.get(layer, {}).items()}
    if layer in mass:
      out[layer]["fidelity"] = float(mass[layer].mean())
      for name, rows in (example_groups or {}).items():
        rows = np.asarray(rows, bool)
        if rows.shape != mass[layer].shape or not rows.any():
          raise ValueError(f"example group {name!r} must be a non-empty bool mask over "
                           f"the {mass[layer].shape[0]} probe examples; got {rows.shape}.")
        out[layer][f"fidelity_{name}"] = float(mass[layer][rows].mean())
      if layer in map_layers:
        out[layer]["attention_map"] = np.round(maps[layer].astype(np.float64), 4).tolist()
  return out


def layer_means(layers: Mapping[str, Mapping[str, Any]],
                fidelity_keys: Sequence[str] = ("fidelity",)) -> dict[str, float]:
  """`persistence_metrics`' per-layer values as the flat metrics of a summary table: the
  mean over layers of each of `fidelity_keys`, `drift_qk` (of W_Q and W_K together) and,
  where the layers have a mask, `drift_mask` over the layers whose mask can move (None
  when none can)."""
  def mean(key):
    values = [v[key] for v in layers.values() if v.get(key) is not None]
    return float(np.mean(values)) if values else None
  out = {key: mean(key) for key in fidelity_keys}
  out["drift_qk"] = float(np.mean([mean("drift_query"), mean("drift_key")]))
  if any("drift_mask" in v for v in layers.values()):
    out["drift_mask"] = mean("drift_mask")
  return out
