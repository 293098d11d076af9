"""Experiment configs: a typed dataclass per experiment, presets, `--set key=value`."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import itertools
import pathlib
import re
import shlex
import sys
import types
import typing
from typing import Any, Sequence

import numpy as np


def _experiments_package() -> types.ModuleType:
  """`mpx.experiments`: installed from the repository's experiments/ folder by pip, or that
  folder itself when mpx runs from a source checkout on PYTHONPATH (the benchmarks' way),
  where no installer mapped it (`experiment_dirs` finds the experiment files through it, and
  their reports run as `python -m mpx.experiments.NAME`)."""
  try:
    import mpx.experiments  # noqa: PLC0415
    return mpx.experiments
  except ModuleNotFoundError as e:
    if e.name != "mpx.experiments":
      raise
    folder = pathlib.Path(__file__).resolve().parents[2] / "experiments"
    if not (folder / "__init__.py").exists():
      raise ModuleNotFoundError(
          f"mpx.experiments is neither installed nor at {folder}: reinstall mpx "
          "(pip install -e . in the repository)", name="mpx.experiments") from e
    spec = importlib.util.spec_from_file_location(
        "mpx.experiments", folder / "__init__.py", submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["mpx.experiments"] = module
    spec.loader.exec_module(module)
    return module


EXPERIMENTS = _experiments_package()

EXPERIMENT_ATTRIBUTES = ("Config", "PRESETS", "PAPER", "METRICS", "build_groups")

# Optional dependencies → the extra of setup.cfg that installs them.
EXTRAS = {"tensorflow_datasets": "vision", "grain": "vision", "sklearn": "vision",
          "tokenizers": "text", "gcsfs": "gcs", "tensorboardX": "tensorboard", "torch": "bench"}


@dataclasses.dataclass(frozen=True)
class SweepConfig:
  """Fields every experiment has; experiments subclass it with their own.

  Attributes:
    seeds: members per (task, scheme, hparams) cell, seeds 0..seeds−1.
    chunk_steps: steps per compiled chunk (lax.scan length) between host work.
    eval_every: steps between evaluations, a multiple of chunk_steps; 0 = only at the end.
    checkpoint_every: steps between checkpoints, a multiple of chunk_steps; 0 = only at
      the end of each group (a SIGTERM still saves first).
    keep_checkpoints: how many checkpoints to keep per group.
    select: a traced hyperparameter (`TRACED`) swept with a list: each scheme's value of it
      is chosen on the family's validation split (`mpx.sweep.select`), which the family
      holds out of training only then; None trains and reports every value as it is.
  """
  seeds: int = 2
  chunk_steps: int = 50
  eval_every: int = 0
  checkpoint_every: int = 0
  keep_checkpoints: int = 2
  select: str | None = None

  def optional_modules(self) -> tuple[str, ...]:
    """The optional packages (`EXTRAS`) a run of this config imports: `mpx run` checks
    them first, so a missing install is named before any data path is read. A family
    whose data needs one overrides this."""
    return ()

  def __post_init__(self):
    if self.seeds < 1:
      raise ValueError(f"seeds must be >= 1; got {self.seeds}.")
    if self.chunk_steps < 1:
      raise ValueError(f"chunk_steps must be >= 1; got {self.chunk_steps}.")
    if self.select is not None and self.select not in TRACED:
      raise ValueError(f"select={self.select!r}: choose one of the traced hyperparameters "
                       f"{TRACED} and give it a list of values.")
    for name in ("eval_every", "checkpoint_every"):
      value = getattr(self, name)
      if value < 0 or value % self.chunk_steps:
        raise ValueError(f"{name}={value} must be 0 or a positive multiple of "
                         f"chunk_steps={self.chunk_steps}.")


def check_installed(configs: Sequence[SweepConfig]) -> None:
  """Raises ModuleNotFoundError, one line naming the install, when an optional package
  that a run of `configs` imports (`SweepConfig.optional_modules`) is missing."""
  needed = dict.fromkeys(m for config in configs for m in config.optional_modules())
  missing = [m for m in needed if importlib.util.find_spec(m) is None]
  if missing:
    extras = ",".join(dict.fromkeys(EXTRAS[m] for m in missing))
    raise ModuleNotFoundError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                              f"not installed: pip install 'mpx[{extras}]'", name=missing[0])


def _parse(key: str, raw: str, annotation) -> Any:
  """Parses `raw` as `annotation` (int, float, bool, str, X | None, tuple[X, ...])."""
  origin, args = typing.get_origin(annotation), typing.get_args(annotation)
  if origin in (typing.Union, types.UnionType):
    if raw.strip().lower() == "none" and type(None) in args:
      return None
    inner = [a for a in args if a is not type(None)]
    return _parse(key, raw, inner[0])
  if origin is tuple:
    items = [s.strip() for s in raw.split(",")]
    if not all(items):  # `fractions=` or `a,,b`: a typo, not a request for no values.
      raise ValueError(f"--set {key}={raw}: empty item; give a comma-separated list of "
                       "values without empty items, or none where the field allows it.")
    item_type = args[0] if args else str
    return tuple(_parse(key, s, item_type) for s in items)
  if annotation is bool:
    if raw.lower() in ("true", "1", "yes"):
      return True
    if raw.lower() in ("false", "0", "no"):
      return False
    raise ValueError(f"--set {key}={raw}: expected true or false.")
  try:
    return annotation(raw)
  except (TypeError, ValueError):
    name = getattr(annotation, "__name__", str(annotation))
    raise ValueError(f"--set {key}={raw}: expected a value of type {name}.") from None


def apply_overrides(config, assignments: Sequence[str]):
  """`["key=value", ...]` → a new config, type-checked against the dataclass fields."""
  hints = typing.get_type_hints(type(config))
  names = [f.name for f in dataclasses.fields(config)]
  changes = {}
  for assignment in assignments:
    key, sep, raw = assignment.partition("=")
    key = key.strip()
    if not sep:
      raise ValueError(f"--set {assignment!r}: expected key=value.")
    if key not in names:
      near = difflib.get_close_matches(key, names, n=1)
      guess = f" did you mean {near[0]}?" if near else ""
      raise ValueError(f"--set {key}: unknown config key;{guess} valid keys: "
                       f"{', '.join(names)}.")
    changes[key] = _parse(key, raw.strip(), hints[key])
  return dataclasses.replace(config, **changes)


def _preset_config(experiment: types.ModuleType, preset: str | None):
  if preset is None:
    preset = next(iter(experiment.PRESETS))
  if preset not in experiment.PRESETS:
    raise ValueError(f"unknown preset {preset!r} for {experiment.NAME}; choose one of "
                     f"{sorted(experiment.PRESETS)}.")
  return preset, experiment.Config(**experiment.PRESETS[preset])


def make_config(experiment: types.ModuleType, preset: str | None,
                assignments: Sequence[str] = ()):
  """The experiment's Config with the preset applied, then the `--set` overrides."""
  preset, config = _preset_config(experiment, preset)
  return preset, apply_overrides(config, assignments)


def _is_tuple_field(annotation) -> bool:
  args = typing.get_args(annotation)
  if typing.get_origin(annotation) in (typing.Union, types.UnionType):
    return any(_is_tuple_field(a) for a in args if a is not type(None))
  return typing.get_origin(annotation) is tuple


# The fields every family reads only into its members' hparams (the optimizer's traced
# values, `optim.HPARAMS`): a list of values for one of them adds a member axis inside
# each group, trained in the same program; a list for any other field that holds one
# value (width, depth, a dtype, mask_strength) trains one group per value.
TRACED = ("learning_rate", "weight_decay", "mask_lr_multiplier")
_RANGES = {"logspace": np.geomspace, "linspace": np.linspace}
_RANGE = re.compile(r"(logspace|linspace)\(\s*([^,()]+),([^,()]+),\s*(\d+)\s*\)")


def sweep_values(key: str, raw: str) -> list[str]:
  """`a,b,c`, `logspace(1e-4,1e-2,5)` (geometric: both ends included) or
  `linspace(0,1,5)` → the raw values, one per item."""
  match = _RANGE.fullmatch(raw.strip())
  if match is None:
    if raw.strip().startswith(tuple(_RANGES)):
      raise ValueError(f"--set {key}={raw}: write logspace(START,STOP,COUNT) or "
                       "linspace(START,STOP,COUNT), e.g. logspace(1e-4,1e-2,5).")
    return [v.strip() for v in raw.split(",")]
  kind, start, stop, count = match.groups()
  try:
    start, stop = float(start), float(stop)
  except ValueError:
    raise ValueError(f"--set {key}={raw}: START and STOP must be numbers.") from None
  if int(count) < 2 or (kind == "logspace" and not (start > 0 and stop > 0)):
    raise ValueError(f"--set {key}={raw}: COUNT must be >= 2 (and logspace's ends > 0).")
  return [f"{float(v):.6g}" for v in _RANGES[kind](start, stop, int(count))]


def split_sweeps(config_type: type, assignments: Sequence[str]
                 ) -> tuple[list[str], dict[str, list[str]], dict[str, list[str]]]:
  """`--set` assignments → (plain ones, {key: [raw values]} of static fields: one group
  per value, {key: [raw values]} of `TRACED` fields: members of each group)."""
  hints = typing.get_type_hints(config_type)
  plain, sweeps, traced = [], {}, {}
  for assignment in assignments:
    key, sep, raw = assignment.partition("=")
    key = key.strip()
    if sep and key in hints and not _is_tuple_field(hints[key]) and (
        "," in raw or _RANGE.fullmatch(raw.strip()) or raw.strip().startswith(tuple(_RANGES))):
      if key in {f.name for f in dataclasses.fields(SweepConfig)}:
        raise ValueError(f"--set {assignment}: {key} is one value per run (the run loop's "
                         "cadence and seed count); sweep model or optimizer fields.")
      (traced if key in TRACED else sweeps)[key] = sweep_values(key, raw)
    else:
      plain.append(assignment)
  return plain, sweeps, traced


def make_configs(experiment: types.ModuleType, preset: str | None,
                 assignments: Sequence[str] = ()):
  """(preset, [(labels, [config, ...])]): per combination of static swept values, labels
  {key: value} naming it (empty without a sweep) and one config per combination of the
  traced values (one config without them): the groups they build are one group each."""
  preset, base = _preset_config(experiment, preset)
  plain, sweeps, traced = split_sweeps(type(base), assignments)
  variants = []
  for values in itertools.product(*sweeps.values()):
    swept = [f"{k}={v}" for k, v in zip(sweeps, values)]
    configs = [apply_overrides(base, plain + swept + [f"{k}={v}" for k, v in zip(traced, t)])
               for t in itertools.product(*traced.values())]
    variants.append(({k: getattr(configs[0], k) for k in sweeps}, configs))
  return preset, variants


def traced_values(variants) -> dict[str, list]:
  """{traced field: its values} of a `make_configs` result (empty without a traced list)."""
  configs = variants[0][1]
  return {k: list(dict.fromkeys(getattr(c, k) for c in configs)) for k in TRACED
          if len({getattr(c, k, None) for c in configs}) > 1}


def experiment_dirs() -> list[pathlib.Path]:
  """Where experiment names are looked up: ./experiments (a user's own), then the
  installed `mpx.experiments` package (the repository's experiments/ folder)."""
  dirs = [pathlib.Path.cwd() / "experiments"]
  dirs += [pathlib.Path(p) for p in EXPERIMENTS.__path__]
  return list(dict.fromkeys(d.resolve() for d in dirs))


def available_experiments() -> list[str]:
  """The experiment names `mpx run NAME` accepts, from every experiment folder."""
  names = set()
  for directory in experiment_dirs():
    names.update(p.stem for p in directory.glob("*.py") if not p.stem.startswith("_"))
  return sorted(names)


# Experiments that were renamed: the old name still runs the experiment, and says so.
RENAMED = {"discover_prior": "discover_boolean"}


def load_experiment(name_or_path: str) -> types.ModuleType:
  """An experiment by name (`boolean_gotu`) or by path to its file."""
  if name_or_path in RENAMED:
    print(f"{name_or_path} is now called {RENAMED[name_or_path]}; running that.",
          file=sys.stderr)
    name_or_path = RENAMED[name_or_path]
  path = pathlib.Path(name_or_path)
  if path.suffix != ".py":
    candidates = [d / f"{name_or_path}.py" for d in experiment_dirs()]
    path = next((c for c in candidates if c.exists()), None)
    if path is None:
      raise ValueError(f"unknown experiment {name_or_path!r}; available: "
                       f"{', '.join(available_experiments()) or 'none found'} (or pass a "
                       "path to an experiment file).")
  elif not path.exists():
    raise ValueError(f"experiment file {path} does not exist.")
  spec = importlib.util.spec_from_file_location(f"mpx_experiment_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules.
  try:
    spec.loader.exec_module(module)
  except TypeError as e:
    if "non-frozen dataclass from a frozen one" not in str(e):
      raise
    raise ValueError(f"{path}: its Config must be a frozen dataclass, as SweepConfig is: "
                     "@dataclasses.dataclass(frozen=True) class Config(SweepConfig).") from None
  missing = [a for a in EXPERIMENT_ATTRIBUTES if not hasattr(module, a)]
  if missing:
    raise ValueError(f"{path} is not an mpx experiment: it lacks {missing}.")
  if not (isinstance(module.Config, type) and issubclass(module.Config, SweepConfig)):
    raise ValueError(f"{path}: its Config must subclass mpx.sweep.config.SweepConfig (the "
                     "fields every run reads: seeds, chunk_steps, eval_every, ...): "
                     "@dataclasses.dataclass(frozen=True) class Config(SweepConfig).")
  module.NAME = getattr(module, "NAME", path.stem)
  return module


def experiment_stem(experiment: types.ModuleType) -> str:
  """The experiment's file name without `.py` (its NAME for one not loaded from a file):
  a user's file that star-imports a built-in experiment keeps a name of its own."""
  file = getattr(experiment, "__file__", None)
  return pathlib.Path(file).stem if file else experiment.NAME


def _experiment_argument(experiment: types.ModuleType) -> str:
  """What `mpx run` needs to load this experiment again: its name where the name finds
  this very file, else the file's path."""
  file = getattr(experiment, "__file__", None)
  if file is None:
    return experiment.NAME
  path = pathlib.Path(file).resolve()
  found = next((c for d in experiment_dirs() if (c := d / f"{path.stem}.py").exists()), None)
  return path.stem if found is not None and found.resolve() == path else str(path)


def command_line(experiment: types.ModuleType, preset: str, overrides: Sequence[str],
                 out: str, *, distributed: bool = False) -> str:
  """The `mpx run` command that reproduces a run, its defaults spelled out."""
  words = ["mpx", "run", _experiment_argument(experiment), "--preset", preset]
  for assignment in overrides:
    words += ["--set", assignment]
  return shlex.join(words + ["--out", out] + (["--distributed"] if distributed else []))
