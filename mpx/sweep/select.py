"""Choosing each scheme's hyperparameter on a validation split, and reporting the run as
it is at the chosen value: the fair comparison of schemes at their own best values.

Selection sees validation metrics only, by construction: `validation_view` keeps a
member's metrics whose names start with `val_` (a family computes them on data that
neither trains nor is reported), and `choose` reads nothing else. A member that diverged
(or lacks a validation metric) counts as the worst value.

A value chosen on the edge of the values tried may not be the best: the row says so, and
`combine` lets a second run folder, the same command at more values, extend the grid
(`mpx select RUN_DIR MORE_RUN_DIRS...`).
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Mapping, Sequence

import numpy as np

from mpx import report

PREFIX = report.VALIDATION_PREFIX
DIRECTIONS = ("max", "min")


def validation_view(member: Mapping[str, Any], criteria) -> dict[str, float | None]:
  """The member's validation metrics named by `criteria` (None where it diverged or has
  none): all that selection may read."""
  for name, direction in criteria:
    if not name.startswith(PREFIX) or direction not in DIRECTIONS:
      raise ValueError(f"selection criterion ({name!r}, {direction!r}): a metric named "
                       f"{PREFIX}... and one of {DIRECTIONS}; selection reads validation "
                       "metrics only.")
  value = lambda name: (None if member["diverged"] else member["metrics"].get(name))
  return {name: value(name) for name, _ in criteria}


def _score(views: Sequence[Mapping[str, float | None]], criteria) -> tuple[float, ...]:
  """Higher is better, criterion by criterion (later ones break ties): the mean over seeds,
  −inf when any seed diverged or lacks the metric."""
  score = []
  for name, direction in criteria:
    values = [v[name] for v in views]
    if any(x is None or not math.isfinite(x) for x in values):
      score.append(-math.inf)
    else:
      mean = float(np.mean(values))
      score.append(mean if direction == "max" else -mean)
  return tuple(score)


def _line(member: Mapping[str, Any], hparam: str) -> tuple[str, str, str]:
  """(task, scheme, the other hparams as JSON): the members among which one value of
  `hparam` is chosen."""
  others = {k: v for k, v in member["hparams"].items() if k != hparam}
  return member["task"], member["scheme"], json.dumps(others, sort_keys=True, default=str)


def choose(members: Sequence[Mapping[str, Any]], hparam: str, criteria
           ) -> dict[tuple[str, str, str], Any]:
  """{(task, scheme, other hparams): the value of `hparam` with the best validation score}
  (the smallest on a full tie, whatever order the members come in)."""
  by_line: dict = {}
  for m in members:
    by_line.setdefault(_line(m, hparam), {}).setdefault(m["hparams"][hparam], []).append(
        validation_view(m, criteria))
  return {line: max(sorted(values), key=lambda v: _score(values[v], criteria))
          for line, values in by_line.items()}


def _edge(value: Any, tried: Sequence[Any], scored: bool) -> str | None:
  """"largest" / "smallest" when `value` is that end of the values tried (and won on a
  score, not because every value diverged): the grid may not bracket the best value."""
  if len(tried) < 2 or not scored:
    return None
  return "largest" if value == max(tried) else "smallest" if value == min(tried) else None


def _labeller(members: Sequence[Mapping[str, Any]], hparam: str):
  """line -> "task / scheme", plus the other hparams that tell its lines apart."""
  keys = [k for k in report.distinguishing_hparams(members) if k != hparam]
  return lambda line: f"{line[0]} / {report.cell_label(line, keys)}"


def edge_notes(rows: Sequence[Mapping[str, Any]], hparam: str) -> str:
  """One line per row chosen on the edge of its values, naming the next step."""
  lines = [f"- {r['label']}: {r[hparam]:g} is the {r['edge']} {hparam} tried, so the "
           "values may not bracket its best. To extend them, run the same command at two "
           f"or more {'larger' if r['edge'] == 'largest' else 'smaller'} values into a new "
           "run folder, then choose over all of them: `mpx select RUN_DIR... NEW_RUN_DIR`."
           for r in rows if r["edge"]]
  return "\n".join(lines) + "\n" if lines else ""


def criteria_sentence(criteria, note: str = "") -> str:
  """How the values were chosen, for the line above a selection table."""
  return (f"Chosen by {', then '.join(f'{d} {n}' for n, d in criteria)} (mean over seeds; "
          f"a diverged seed makes a value the worst). {note}").strip()


def _by_line(members: Sequence[Mapping[str, Any]], hparam: str) -> dict:
  """{line: {value: [members]}}, the lines and values sorted."""
  grouped: dict = {}
  for m in members:
    grouped.setdefault(_line(m, hparam), {}).setdefault(m["hparams"][hparam], []).append(m)
  return {line: dict(sorted(grouped[line].items())) for line in sorted(grouped)}


def selection_table(members: Sequence[Mapping[str, Any]], hparam: str, criteria,
                    metric_names: Sequence[str]) -> tuple[str, list[dict]]:
  """The Markdown table and JSON rows of the run at each scheme's chosen value: the
  validation score that chose it, then every reported metric, mean ± std over seeds; below
  it, a line for each value chosen on the edge of those tried (`edge_notes`)."""
  chosen, label = choose(members, hparam, criteria), _labeller(members, hparam)
  names = [n for n, _ in criteria] + list(metric_names)
  columns = [("task", "the task"), ("scheme", "the init scheme"),
             (f"{hparam} (chosen)", f"the {hparam} chosen for the row on validation"),
             ("seeds", "the seeds that did not diverge / all, at that value"),
             *report.metric_columns(names, filter(report.is_percent_metric, names))]
  rows = []
  lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
  for line, by_value in _by_line(members, hparam).items():
    (task, scheme, _), value = line, chosen[line]
    at_value = by_value[value]
    alive = [m for m in at_value if not m["diverged"]]
    scored = _score([validation_view(m, criteria) for m in at_value], criteria)[0] > -math.inf
    cells, row = [], {"task": task, "scheme": scheme, hparam: value,
                      "seeds": len(at_value), "diverged": len(at_value) - len(alive),
                      "edge": _edge(value, list(by_value), scored), "label": label(line)}
    for name in names:
      values = [m["metrics"][name] for m in alive if m["metrics"].get(name) is not None]
      if not values:
        cells.append(report.MISSING)
        continue
      mean, std = float(np.mean(values)), float(np.std(values))
      row[name] = {"mean": mean, "std": std}
      percent = report.is_percent_metric(name)
      cells.append(f"{report._fmt_number(mean, percent)} ± {report._fmt_number(std, percent)}")
    rows.append(row)
    lines.append(f"| {task} | {scheme} | {value:g} | {len(alive)}/{len(at_value)} | "
                 + " | ".join(cells) + " |")
  notes = edge_notes(rows, hparam)
  return (report.legend(columns) + "\n" + "\n".join(lines) + "\n"
          + (f"\n{notes}" if notes else ""), rows)


# config.json keys that pick which members a folder trains or set its bookkeeping, not how
# a member trains: run folders that differ in these (and in the chosen hparam's values)
# are one grid.
MAY_DIFFER = ("tasks", "schemes", "checkpoint_every", "keep_checkpoints")
_HINT = "give the folders that `mpx run ... --select HPARAM` wrote (their --out)"


def _read_json(path: pathlib.Path) -> dict:
  try:
    return json.loads(path.read_text())
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e}).") from None


def _read_run(run_dir: str | pathlib.Path) -> tuple[dict, list[dict]]:
  """(config.json, summary.json's members) of a finished run folder run with select."""
  if "://" in str(run_dir):
    raise ValueError(f"{run_dir} is a URL; `mpx select` reads local folders: copy it first "
                     f"(gcloud storage cp --recursive {run_dir} runs/).")
  path = pathlib.Path(run_dir)
  if not path.is_dir():
    raise ValueError(f"{path} {'is a file' if path.exists() else 'does not exist'}; {_HINT}.")
  if not (path / "config.json").exists():
    raise ValueError(f"{path} is not a run folder (no config.json); {_HINT}.")
  config = _read_json(path / "config.json")
  if not config.get("config", {}).get("select"):
    raise ValueError(f"{path} ran without --select, so its members have no validation "
                     "metrics (and trained on the validation data): run it with --select.")
  if not (path / report.SUMMARY_JSON).exists():
    raise ValueError(f"{path} has no {report.SUMMARY_JSON}: its run has not finished; the "
                     "same `mpx run` command with --resume=auto finishes it.")
  return config, _read_json(path / report.SUMMARY_JSON)["members"]


def _grid_differences(first: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
  """What tells `other`'s run from `first`'s, beyond the selected hparam's values and
  `MAY_DIFFER` (`mpx run --resume`'s comparison, data fingerprints of shared tasks)."""
  from mpx.sweep import run as run_lib  # It imports this module.
  fingerprint = run_lib.FINGERPRINT
  shared = set(first.get(fingerprint, {})) & set(other.get(fingerprint, {}))

  def grid(record):
    hparam = record["config"]["select"]
    out = {k: v for k, v in record.items() if k != run_lib.INFORMATIONAL}
    out["config"] = {k: v for k, v in record["config"].items() if k not in (hparam, *MAY_DIFFER)}
    out["traced"] = {k: v for k, v in record.get("traced", {}).items() if k != hparam}
    if fingerprint in record:
      out[fingerprint] = {k: v for k, v in record[fingerprint].items() if k in shared}
    return out
  return run_lib._config_differences(grid(first), grid(other))


def combine(run_dirs: Sequence[str | pathlib.Path], notes: list[str] | None = None
            ) -> tuple[dict, list[dict]]:
  """(the first folder's config.json, every folder's members): run folders of one
  experiment and preset that differ only in the values of the selected hparam (and in
  `MAY_DIFFER`), e.g. a grid extended past the value chosen on its edge. A member trains
  as it would in one folder with all the values when it shares its compiled call with as
  many members (a traced sweep on CPU maps one value's members at a time). A member the
  swept value does not reach is trained by every folder alike: the first folder's is
  taken, and `notes` gets a line saying so."""
  resolved = [pathlib.Path(d).resolve() for d in run_dirs if "://" not in str(d)]
  if len(set(resolved)) < len(resolved):
    raise ValueError(f"a run folder is given twice in {[str(d) for d in run_dirs]}; give "
                     "each once.")
  runs = [(d, *_read_run(d)) for d in run_dirs]
  first_dir, first, _ = runs[0]
  hparam = first["config"]["select"]
  for run_dir, config, _ in runs[1:]:
    if differences := _grid_differences(first, config):
      raise ValueError(f"{run_dir} is not the run of {first_dir} at other {hparam} values: "
                       f"they differ in {differences}. Choose over folders of one command "
                       "that differ in the values only.")
  members, seen, once = [], {}, set()
  for run_dir, config, run_members in runs:
    tried = config.get("traced", {}).get(hparam, ())
    for m in run_members:
      key = report.member_key(m)
      if key in seen and m["hparams"][hparam] not in tried:
        once.add(m["scheme"])  # A scheme the swept value does not reach (the default's
        continue               # multiplier 0): the same run in every folder.
      if key in seen:
        raise ValueError(f"{run_dir} and {seen[key]} both trained {m['task']} / "
                         f"{m['scheme']} at {hparam}={m['hparams'][hparam]:g}, seed "
                         f"{m['seed']}: give each value in one folder only.")
      seen[key] = run_dir
      members.append(m)
  if once and notes is not None:
    notes.append(f"{', '.join(sorted(once))}: {hparam} does not reach it, so every folder "
                 f"trained it alike; the rows use {first_dir}'s members.")
  return first, members


def recorded_criteria(run_dirs: Sequence[str | pathlib.Path]) -> tuple | None:
  """The validation criteria the runs chose by, as their summary.json records them (None
  where none does: written by an mpx that did not record them); folders that chose by
  different criteria are refused."""
  recorded = {}
  for run_dir in run_dirs:
    summary = _read_json(pathlib.Path(run_dir) / report.SUMMARY_JSON)
    if criteria := summary.get("selection", {}).get("criteria"):
      recorded[str(run_dir)] = tuple(tuple(c) for c in criteria)
  if len(set(recorded.values())) > 1:
    raise ValueError(f"the folders chose by different validation criteria ({recorded}); "
                     "choose over folders of one command.")
  return next(iter(recorded.values()), None)


def check_scored(members: Sequence[Mapping[str, Any]], criteria, source: str) -> None:
  """Refuses where no member holds any criterion's metric (the names changed since the
  runs): every value would score −inf and the smallest would win without a word."""
  names = [n for n, _ in criteria]
  if any(m["metrics"].get(n) is not None for m in members for n in names):
    return
  held = sorted({n for m in members for n in m["metrics"] if n.startswith(PREFIX)})
  raise ValueError(f"no value could be scored: the criteria ({source}) name {names}, and "
                   f"the members hold {held or 'no validation metric'}; choose with the "
                   "experiment file the runs were made with.")


def grid_table(members: Sequence[Mapping[str, Any]], hparam: str, criterion: str,
               metric: str) -> str:
  """Each line's first validation criterion and main test metric at every value tried
  (mean over seeds; a value where a seed diverged is marked, as selection counts it the
  worst): the curve the choice was made on."""
  values = sorted({m["hparams"][hparam] for m in members})
  label = _labeller(members, hparam)

  def cell(at_value):
    if not at_value:
      return report.MISSING
    if diverged := sum(m["diverged"] for m in at_value):
      return f"diverged ({diverged}/{len(at_value)})"
    means = []
    for name in (criterion, metric):
      found = [m["metrics"].get(name) for m in at_value]
      means.append(report.MISSING if None in found else
                   report._fmt_number(float(np.mean(found)), report.is_percent_metric(name)))
    return " / ".join(means)

  lines = [f"`{criterion}` / `{metric}` at each {hparam} (mean over seeds; — where that "
           "value was not tried):\n",
           f"| line | {' | '.join(f'{v:g}' for v in values)} |", "|---|" + "---|" * len(values)]
  for line, by_value in _by_line(members, hparam).items():
    lines.append(f"| {label(line)} | "
                 + " | ".join(cell(by_value.get(v, [])) for v in values) + " |")
  return "\n".join(lines) + "\n"


def combined_report(run_dirs: Sequence[str | pathlib.Path]) -> str:
  """The Markdown `mpx select` prints: the choice over every folder's values, then the
  values themselves."""
  from mpx.sweep import config as config_lib  # Imports jax: only when reporting.
  notes = []
  config, members = combine(run_dirs, notes)
  file = config.get("run", {}).get("experiment_file")  # A user's experiment has no name.
  experiment = config_lib.load_experiment(
      file if file and pathlib.Path(file).exists() else config["experiment"])
  hparam, criteria = config["config"]["select"], recorded_criteria(run_dirs)
  source = "recorded by the runs"
  if criteria is None:
    criteria, source = experiment.VALIDATION, "the experiment file's VALIDATION"
    notes.append("The runs record no criteria (written by an mpx that did not record "
                 "them): chosen by the experiment file's VALIDATION.")
  check_scored(members, criteria, source)
  with report.described(getattr(experiment, "METRIC_DESCRIPTIONS", {})):
    table, _ = selection_table(members, hparam, criteria, experiment.METRICS)
  folders = "".join(f"- {d}\n" for d in run_dirs)
  said = "".join(f"{n}\n\n" for n in notes)
  return (f"# {config['experiment']} ({config['preset']}): each scheme at its {hparam} "
          f"chosen on validation\n\nOver the members of:\n{folders}\n{said}"
          f"{criteria_sentence(criteria, getattr(experiment, 'SELECTION_NOTE', ''))}\n\n"
          f"{table}\n" + grid_table(members, hparam, criteria[0][0], experiment.METRICS[0]))
