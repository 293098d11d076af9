"""Loading a model's earlier params into the same model with mask priors added.

A checkpoint saved before a mask prior was added lacks the `mask_logits` leaves, so a plain
Orbax restore into the new tree fails. `merge_params` puts every stored leaf into a fresh
init by path and keeps the fresh init only where the stored tree has nothing: the masks.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from mpx.attention import MASK_LEAF

PyTree = Any


def _children(tree) -> list[tuple[Any, Any]] | None:
  """(key, child) of a dict, or of a list / tuple by index; None for a leaf."""
  if isinstance(tree, Mapping):
    return list(tree.items())
  if isinstance(tree, (list, tuple)):
    return list(enumerate(tree))
  return None


def _flatten(tree, prefix: tuple = ()) -> dict[tuple, Any]:
  flat = {}
  for name, value in _children(tree):
    if _children(value) is None:
      flat[prefix + (name,)] = value
    else:
      flat.update(_flatten(value, prefix + (name,)))
  return flat


def _without_nnx_value(flat: dict[tuple, Any]) -> dict[tuple, Any]:
  """Raw NNX state, as Orbax restores it without a target, ends every path in its
  Variables' "value": dropped, so it merges like `nnx.to_pure_dict` output."""
  if flat and all(len(p) > 1 and p[-1] == "value" for p in flat):
    return {p[:-1]: leaf for p, leaf in flat.items()}
  return flat


def _by_name(flat: dict[tuple, Any], which: str) -> dict[tuple, tuple]:
  """Each path spelled in strings → the path. A layer list's index is the int 0 in
  `nnx.to_pure_dict` and in a Linen / NNX list, the string '0' once Orbax restored it
  without a target: both name one layer."""
  named = {}
  for path in flat:
    name = tuple(map(str, path))
    if name in named:
      raise ValueError(f"the {which} params hold both {named[name]} and {path}, keys that "
                       "differ only in type (int or str); rename one.")
    named[name] = path
  return named


def _rebuild(tree, flat: Mapping[tuple, Any], prefix: tuple = ()):
  children = _children(tree)
  if children is None:
    return flat[prefix]
  rebuilt = {name: _rebuild(value, flat, prefix + (name,)) for name, value in children}
  return rebuilt if isinstance(tree, Mapping) else type(tree)(rebuilt.values())


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
      pure dict). Keys are matched by name: a layer list's index loads whether it is the
      int 0 (`nnx.to_pure_dict`) or the string '0' (Orbax, restored without a target),
      and lists load like dicts by index.
    may_be_missing: which paths (tuples of names) of `fresh` may be absent from `loaded`
      and keep their fresh init; by default only `mask_logits` leaves.

  Returns:
    A nested dict shaped like `fresh`. Raises ValueError, naming the paths, when `loaded`
    holds a leaf `fresh` lacks, a leaf's shape differs, or `fresh` has a leaf that
    `loaded` lacks and `may_be_missing` does not allow: a silent partial load would train
    a model that is not the one saved.
  """
  new, old = _flatten(fresh), _without_nnx_value(_flatten(loaded))
  # Matched by name: where only a key's type differs (a restored list's '0' for 0), the
  # loaded leaf goes to the fresh tree's key.
  new_names, old_names = _by_name(new, "new"), _by_name(old, "loaded")
  show = lambda names: ", ".join("/".join(n) for n in sorted(names))
  unknown = set(old_names) - set(new_names)
  if unknown:
    raise ValueError(f"the loaded params hold {show(unknown)}, which the new model lacks; "
                     "is it the same model with the same module names?")
  missing = {n for n in set(new_names) - set(old_names) if not may_be_missing(new_names[n])}
  if missing:
    raise ValueError(f"the loaded params lack {show(missing)}; only mask leaves "
                     f"({MASK_LEAF}) are kept from the fresh init (pass may_be_missing= "
                     "to allow others).")
  shape = lambda leaf: getattr(leaf, "shape", None)
  reshaped = [n for n, p in old_names.items() if shape(old[p]) != shape(new[new_names[n]])]
  if reshaped:
    raise ValueError("shapes differ at " + ", ".join(
        f"{'/'.join(n)} (loaded {shape(old[old_names[n]])}, new {shape(new[new_names[n]])})"
        for n in sorted(reshaped)) + ".")
  return _rebuild(fresh, {**new, **{new_names[n]: old[p] for n, p in old_names.items()}})
