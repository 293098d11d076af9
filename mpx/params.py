"""Loading a model's earlier params into the same model with mask priors added.

A checkpoint saved before a mask prior was added lacks the `mask_logits` leaves, so a plain
Orbax restore into the new tree fails. `merge_params` puts every stored leaf into a fresh
init by path and keeps the fresh init only where the stored tree has nothing: the masks.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mpx.attention import MASK_LEAF

PyTree = Any


def _flatten(tree: Mapping, prefix: tuple = ()) -> dict[tuple, Any]:
  flat = {}
  for name, value in tree.items():
    if isinstance(value, Mapping):
      flat.update(_flatten(value, prefix + (name,)))
    else:
      flat[prefix + (name,)] = value
  return flat


def _without_nnx_value(flat: dict[tuple, Any]) -> dict[tuple, Any]:
  """Raw NNX state, as Orbax restores it without a target, ends every path in its
  Variables' "value": dropped, so it merges like `nnx.to_pure_dict` output."""
  if flat and all(len(p) > 1 and p[-1] == "value" for p in flat):
    return {p[:-1]: leaf for p, leaf in flat.items()}
  return flat


def _rebuild(tree: Mapping, flat: Mapping[tuple, Any], prefix: tuple = ()) -> dict:
  return {name: _rebuild(value, flat, prefix + (name,)) if isinstance(value, Mapping)
          else flat[prefix + (name,)] for name, value in tree.items()}


def _mask_only(path: tuple) -> bool:
  return path[-1] == MASK_LEAF


def merge_params(fresh: Mapping, loaded: Mapping, *,
                 may_be_missing: Callable[[tuple], bool] = _mask_only) -> dict:
  """`fresh` (a nested dict of the new model's init) with every leaf of `loaded` in place.

  Args:
    fresh: the new model's params, e.g. `model.init(...)["params"]` (Linen) or
      `nnx.to_pure_dict(nnx.state(model, nnx.Param))` (NNX).
    loaded: the earlier model's params as stored (a nested dict, e.g. an Orbax restore
      without a target; raw NNX state, whose every path ends in "value", is read as its
      pure dict).
    may_be_missing: which paths (tuples of names) of `fresh` may be absent from `loaded`
      and keep their fresh init; by default only `mask_logits` leaves.

  Returns:
    A nested dict shaped like `fresh`. Raises ValueError, naming the paths, when `loaded`
    holds a leaf `fresh` lacks, a leaf's shape differs, or `fresh` has a leaf that
    `loaded` lacks and `may_be_missing` does not allow: a silent partial load would train
    a model that is not the one saved.
  """
  new, old = _flatten(fresh), _without_nnx_value(_flatten(loaded))
  show = lambda paths: ", ".join("/".join(map(str, p)) for p in sorted(paths, key=str))
  unknown = set(old) - set(new)
  if unknown:
    raise ValueError(f"the loaded params hold {show(unknown)}, which the new model lacks; "
                     "is it the same model with the same module names?")
  missing = {p for p in set(new) - set(old) if not may_be_missing(p)}
  if missing:
    raise ValueError(f"the loaded params lack {show(missing)}; only mask leaves "
                     f"({MASK_LEAF}) are kept from the fresh init (pass may_be_missing= "
                     "to allow others).")
  reshaped = [p for p in old if getattr(old[p], "shape", None) != getattr(new[p], "shape", None)]
  if reshaped:
    raise ValueError("shapes differ at " + ", ".join(
        f"{'/'.join(map(str, p))} (loaded {old[p].shape}, new {new[p].shape})"
        for p in reshaped) + ".")
  return _rebuild(fresh, {**new, **old})
