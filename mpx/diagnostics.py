"""Persistence diagnostics: does the prior survive training?

The paper's claim is about persistence: a QK prior is overwritten, a mask prior stays.
These pure functions measure it per layer on one member's params, so every scheme is
compared on the same quantities:
  drift      ‖θ_t − θ_0‖ / ‖θ_0‖ of the mask (over its entries not at the frozen neutral
             logit; null when it has none, or when they all start at 0: then the RMS
             change ‖M − M₀‖/√n is the measure) and of the query/key kernels;
  fidelity   attention mass on the prior's allowed pairs, on a fixed probe batch that
             represents the data (both GOTU domains, in proportion);
  grad norms of the mask and of the query/key kernels (Theorem 1: the mask's gradient is
             bounded by p·σ(−m), QK gradients scale with feature norms).

A layer is a module holding a mask (`mask_logits`) or query and key kernels, found at any
depth of any param pytree (Linen params, `nnx.State`, `nnx.to_pure_dict`) and named by its
path, "/"-joined, with a final "attention" dropped: mpx's `block_i/attention` is
"block_i", a user's `Encoder_0/layers_3/attn` is itself. docs/diagnostics.md shows them on
a model of your own.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mpx.attention import MASK_LEAF
from mpx.priors import NEUTRAL_LOGIT

PyTree = Any
# Per layer, the leaves tracked: the mask and the query/key kernels (Flax's attention
# modules, Linen and NNX, name their projections query/key/value/out, each with a kernel).
TRACKED = {"mask": (MASK_LEAF,), "query": ("query", "kernel"), "key": ("key", "kernel")}
SOWN = "attention_weights"  # What attention modules sow into `intermediates`.


def _key_name(key) -> str:
  """One step of a pytree key path as a name: DictKey, GetAttrKey, SequenceKey alike."""
  for attribute in ("key", "name", "idx"):
    value = getattr(key, attribute, None)
    if value is not None:
      return str(value)
  return str(key)


def _names(path) -> tuple[str, ...]:
  """A pytree key path as names, without NNX's `.value` steps into a Variable, so Linen
  params, `nnx.State` and `nnx.to_pure_dict` name a leaf alike."""
  return tuple(_key_name(k) for k in path
               if not (isinstance(k, jax.tree_util.GetAttrKey) and k.name == "value"))


def _layer_name(module: tuple[str, ...]) -> str:
  """The module's path joined by "/", a final "attention" dropped (mpx's blocks hold
  theirs as `block_i/attention`: reported as "block_i"); "attention" if nothing is left."""
  if module and module[-1] == "attention":
    module = module[:-1]
  return "/".join(module) or "attention"


def _by_layer(found: Mapping[tuple[str, ...], Any]) -> dict[str, Any]:
  """{module path: value} → {layer name: value}; two modules may not share a name."""
  out, seen = {}, {}
  for module, value in found.items():
    name = _layer_name(module)
    if name in out:
      raise ValueError(f"modules {'/'.join(seen[name])!r} and {'/'.join(module)!r} both "
                       f"report as layer {name!r}; rename one of them.")
    out[name], seen[name] = value, module
  return out


def _layer_leaves(params: PyTree) -> dict[str, dict[str, jax.Array]]:
  """{layer: {"mask" | "query" | "key": leaf}}: a layer is a module holding a mask, or
  query and key kernels, at any depth of any pytree (Linen params, NNX state)."""
  found: dict[tuple[str, ...], dict[str, jax.Array]] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    names = _names(path)
    for kind, suffix in TRACKED.items():
      if names[-len(suffix):] == suffix:
        found.setdefault(names[:-len(suffix)], {})[kind] = leaf
  return _by_layer({module: leaves for module, leaves in found.items()
                    if "mask" in leaves or {"query", "key"} <= leaves.keys()})


def _relative_change(leaf: jax.Array, start: jax.Array) -> jax.Array:
  return jnp.linalg.norm(leaf - start) / jnp.maximum(jnp.linalg.norm(start), 1e-12)


def _movable_change(leaf: jax.Array, start: jax.Array):
  """(‖M − M₀‖, ‖M₀‖, n) over the entries that can move: those not at the frozen neutral
  logit (their gradient is σ(−200) = 0, and at 200 each they would swamp ‖M₀‖)."""
  movable = start != NEUTRAL_LOGIT
  return (jnp.linalg.norm(jnp.where(movable, leaf - start, 0.0)),
          jnp.linalg.norm(jnp.where(movable, start, 0.0)), jnp.sum(movable))


def _mask_drift(leaf: jax.Array, start: jax.Array) -> jax.Array:
  """‖M − M₀‖ / ‖M₀‖ over the movable entries. NaN (reported as null) when none can move,
  or when they all start at 0 (a learnable neutral prior): no scale to be relative to;
  `_mask_rms` measures those."""
  change, scale, _ = _movable_change(leaf, start)
  return jnp.where(scale > 0, change / jnp.maximum(scale, 1e-12), jnp.nan)


def _mask_rms(leaf: jax.Array, start: jax.Array) -> jax.Array:
  """‖M − M₀‖ / √n over the n movable entries, in logits; NaN when none can move."""
  change, _, n = _movable_change(leaf, start)
  return jnp.where(n > 0, change / jnp.sqrt(jnp.maximum(n, 1)), jnp.nan)


def _paired(params: PyTree, initial: PyTree):
  """Both trees' layers, which must be the same."""
  now, start = _layer_leaves(params), _layer_leaves(initial)
  if {k: set(v) for k, v in now.items()} != {k: set(v) for k, v in start.items()}:
    raise ValueError(f"params and initial hold different attention layers ({sorted(now)} "
                     f"vs {sorted(start)}); pass one model's params at two times.")
  return now, start


def _drift(params: PyTree, initial: PyTree) -> dict[str, dict[str, jax.Array]]:
  now, start = _paired(params, initial)
  return {layer: {name: (_mask_drift if name == "mask" else _relative_change)(
                      leaf, start[layer][name])
                  for name, leaf in leaves.items()}
          for layer, leaves in now.items()}


def _rms(params: PyTree, initial: PyTree) -> dict[str, jax.Array]:
  now, start = _paired(params, initial)
  return {layer: _mask_rms(leaves["mask"], start[layer]["mask"])
          for layer, leaves in now.items() if "mask" in leaves}


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
  """A host float; None for NaN, what a drift with nothing to measure is."""
  x = float(x)
  return None if np.isnan(x) else x


def _to_floats(tree) -> Any:
  return jax.tree_util.tree_map(_float_or_none, jax.device_get(tree))


def relative_drift(params: PyTree, initial: PyTree) -> dict[str, dict[str, float | None]]:
  """Per layer: ‖θ − θ_0‖ / ‖θ_0‖ of the mask and the query/key kernels.

  The mask's is over its movable entries (not at the frozen neutral logit); None when it
  has none, or when they all start at 0 (`mask_rms_change` measures those). `params` and
  `initial` are any pytrees holding the layers: Linen params, `nnx.State`, pure dicts.
  """
  return _to_floats(_drift(params, initial))


def mask_rms_change(params: PyTree, initial: PyTree) -> dict[str, float | None]:
  """Per layer with a mask: ‖M − M₀‖ / √n over its n movable entries, in logits (None if
  none can move). An absolute measure: what drift is for a prior that starts at M₀ = 0."""
  return _to_floats(_rms(params, initial))


def gradient_norms(grads: PyTree) -> dict[str, dict[str, float]]:
  """Per layer: the global norm of the gradient of the mask and the query/key kernels."""
  return _to_floats(_grad_norms(grads))


def attention_maps_from(intermediates: PyTree) -> dict[str, jax.Array]:
  """{layer: attention probabilities [B, H, N, N]} from what attention modules sowed as
  `attention_weights`: Linen's `intermediates` collection or NNX's `nnx.Intermediate`
  state (`nnx.pop(model, nnx.Intermediate)`). Layers are named as in `relative_drift`; a
  module called more than once reports its first call."""
  found: dict[tuple[str, ...], jax.Array] = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(intermediates)[0]:
    names = _names(path)
    if names[:1] == ("intermediates",):  # The whole Linen state: {"intermediates": ...}.
      names = names[1:]
    if SOWN in names:
      found.setdefault(names[:names.index(SOWN)], leaf)
  return _by_layer(found)


def _sow_every_attention(next_fun, args, kwargs, context):
  """A Linen method interceptor: every `nn.MultiHeadDotProductAttention` (Flax's, mpx's
  drop-in, any subclass) is called with `sow_weights=True`, so a model need not pass it
  down from its own call."""
  from flax import linen as nn
  if (isinstance(context.module, nn.MultiHeadDotProductAttention)
      and context.method_name == "__call__"):
    kwargs = {**kwargs, "sow_weights": True}
  return next_fun(*args, **kwargs)


def attention_maps(apply_fn: Callable, params: PyTree, *inputs) -> dict[str, jax.Array]:
  """{layer: attention probabilities [B, H, N, N]} of a Linen model applied to `inputs`,
  the model unedited: Flax's attention modules (and mpx's drop-in) are made to sow their
  weights for this call (`flax.linen.intercept_methods`), mpx's `MaskedSelfAttention`
  always does. Works under jit and vmap."""
  from flax import linen as nn
  with nn.intercept_methods(_sow_every_attention):
    _, state = apply_fn({"params": params}, *inputs, mutable=["intermediates"])
  maps = attention_maps_from(state.get("intermediates", {}))
  if not maps:
    raise ValueError("the model recorded no attention_weights: it has no Flax or mpx "
                     "attention module (a hand-written attention can sow its probabilities "
                     f"as {SOWN!r} with self.sow('intermediates', ...)).")
  return maps


def nnx_attention_maps(model, *inputs, **kwargs) -> dict[str, jax.Array]:
  """{layer: attention probabilities [B, H, N, N]} of an NNX model called on `inputs`,
  the model unedited: for this call every `nnx.MultiHeadAttention` in it (Flax's, mpx's
  drop-in) hands its weights to the attention function's `module=` argument, which sows
  them, as `sow_weights=True` would; the model is left as it was."""
  from flax import nnx
  modules = [m for _, m in nnx.iter_graph(model) if isinstance(m, nnx.MultiHeadAttention)]
  if not modules:
    raise ValueError("the model holds no nnx.MultiHeadAttention (mpx.nnx's drop-in is one); "
                     "for mpx.nnx.MaskedSelfAttention pass sow_weights=True and read "
                     "attention_maps_from(nnx.pop(model, nnx.Intermediate)).")
  originals = [m.attention_fn for m in modules]
  try:
    for m, fn in zip(modules, originals):
      m.attention_fn = functools.partial(_sowing, fn, m)
    _, sown = nnx.capture(model, nnx.Intermediate)(*inputs, **kwargs)
  finally:
    for m, fn in zip(modules, originals):
      m.attention_fn = fn
  return attention_maps_from(sown)


def _sowing(attention_fn, owner, /, *args, **kwargs):
  """`attention_fn` told to sow into `owner` (flax passes `module=None` unless sowing)."""
  return attention_fn(*args, **{**kwargs, "module": owner})


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


def mean_attention_map(weights_BHNN: jax.Array, decimals: int = 4) -> np.ndarray:
  """The attention probabilities averaged over the batch and heads, `[N, N]` float64,
  rounded to `decimals` (`.tolist()` for a metrics line): what `mpx plot`'s heatmaps
  draw."""
  return np.round(np.asarray(jnp.mean(weights_BHNN, axis=(0, 1)), np.float64), decimals)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _persistence_arrays(apply_fn, loss_fn, params, initial, probe_inputs, probe_batch,
                        allowed, query_rows):
  """Everything `persistence_metrics` reports, as arrays, in one compiled program (eager
  Flax applies and grads cost seconds per member on CPU). `apply_fn` and `loss_fn` are
  static: pass the same callables every evaluation so it compiles once."""
  maps = attention_maps(apply_fn, params, *probe_inputs)
  pattern = lambda layer: allowed[layer] if isinstance(allowed, dict) else allowed
  return (_drift(params, initial), _rms(params, initial),
          _grad_norms(jax.grad(loss_fn)(params, probe_batch)),
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
  restricts fidelity to those queries, e.g. the rows that predict an answer digit. Where
  a mask's movable entries all start at 0, its `drift_mask` is None and `drift_mask_rms`
  (`mask_rms_change`) says how far it moved.
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
  drift, rms, grads, mass, maps = jax.device_get(_persistence_arrays(
      apply_fn, loss_fn, params, initial, tuple(probe_inputs), dict(probe_batch), allowed,
      query_rows))
  out = {}
  for layer in drift:
    out[layer] = {f"drift_{k}": _float_or_none(v) for k, v in drift[layer].items()}
    if out[layer].get("drift_mask", 0.0) is None and not np.isnan(rms[layer]):
      out[layer]["drift_mask_rms"] = float(rms[layer])  # M₀ = 0 where M can move.
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
