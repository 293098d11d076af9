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
  (the first value on a full tie)."""
  by_line: dict = {}
  for m in members:
    by_line.setdefault(_line(m, hparam), {}).setdefault(m["hparams"][hparam], []).append(
        validation_view(m, criteria))
  return {line: max(values, key=lambda v: _score(values[v], criteria))
          for line, values in by_line.items()}


def _edge(value: Any, tried: Sequence[Any]) -> str | None:
  """"largest" / "smallest" when `value` is that end of the values tried: the grid may not
  bracket the best value."""
  if len(tried) < 2:
    return None
  return "largest" if value == max(tried) else "smallest" if value == min(tried) else None


def edge_notes(rows: Sequence[Mapping[str, Any]], hparam: str) -> str:
  """One line per row chosen on the edge of its values, naming the next step."""
  lines = [f"- {r['task']} / {r['scheme']}: {r[hparam]:g} is the {r['edge']} {hparam} tried, "
           "so the values may not bracket its best. To extend them, run the same command "
           f"at {'larger' if r['edge'] == 'largest' else 'smaller'} values into a new run "
           "folder, then choose over both: `mpx select RUN_DIR NEW_RUN_DIR`."
           for r in rows if r.get("edge")]
  return "\n".join(lines) + "\n" if lines else ""


def selection_table(members: Sequence[Mapping[str, Any]], hparam: str, criteria,
                    metric_names: Sequence[str]) -> tuple[str, list[dict]]:
  """The Markdown table and JSON rows of the run at each scheme's chosen value: the
  validation score that chose it, then every reported metric, mean ± std over seeds; below
  it, a line for each value chosen on the edge of those tried (`edge_notes`)."""
  chosen = choose(members, hparam, criteria)
  names = [n for n, _ in criteria] + list(metric_names)
  columns = [("task", "the task"), ("scheme", "the init scheme"),
             (f"{hparam} (chosen)", f"the {hparam} chosen for the row on validation"),
             ("seeds", "the seeds that did not diverge / all, at that value"),
             *report.metric_columns(names, filter(report.is_percent_metric, names))]
  rows = []
  lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
  for (task, scheme, others), value in sorted(chosen.items(), key=str):
    on_line = [m for m in members if _line(m, hparam) == (task, scheme, others)]
    at_value = [m for m in on_line if m["hparams"][hparam] == value]
    alive = [m for m in at_value if not m["diverged"]]
    cells, row = [], {"task": task, "scheme": scheme, hparam: value,
                      "seeds": len(at_value), "diverged": len(at_value) - len(alive),
                      "edge": _edge(value, sorted({m["hparams"][hparam] for m in on_line}))}
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


# config.json keys that pick members or set bookkeeping, not how a member trains: run
# folders that differ in these (and in the chosen hparam) are one grid.
MAY_DIFFER = ("tasks", "schemes", "seeds", "eval_every", "checkpoint_every",
              "keep_checkpoints")


def _read_run(run_dir: pathlib.Path) -> tuple[dict, list[dict]]:
  """(config.json, summary.json's members) of a finished run folder run with select."""
  for name in ("config.json", report.SUMMARY_JSON):
    if not (run_dir / name).exists():
      raise ValueError(f"{run_dir} has no {name}: give run folders whose runs finished "
                       "(`mpx run ... --resume=auto` finishes one).")
  config = json.loads((run_dir / "config.json").read_text())
  if not config["config"].get("select"):
    raise ValueError(f"{run_dir} ran without --select, so its members have no validation "
                     "metrics (and trained on the validation problems): run it with --select.")
  return config, json.loads((run_dir / report.SUMMARY_JSON).read_text())["members"]


def _comparable(config: Mapping[str, Any]) -> dict:
  """What must match for two run folders' members to be one grid, flat."""
  hparam = config["config"]["select"]
  return ({k: v for k, v in config.items() if k not in ("config", "traced", "run")}
          | {k: v for k, v in config["config"].items() if k not in (hparam, *MAY_DIFFER)})


def combine(run_dirs: Sequence[str | pathlib.Path]) -> tuple[dict, list[dict]]:
  """(the first folder's config.json, every folder's members): run folders of one
  experiment and preset that differ only in the values of the selected hparam (and in
  `MAY_DIFFER`), e.g. a grid extended past the value chosen on its edge. Each member's
  training does not depend on the others', so the folders are one grid."""
  runs = [(pathlib.Path(d), *_read_run(pathlib.Path(d))) for d in run_dirs]
  first_dir, first, _ = runs[0]
  hparam = first["config"]["select"]
  for run_dir, config, _ in runs[1:]:
    a, b = _comparable(first), _comparable(config)
    keys = sorted(k for k in {*a, *b} if a.get(k) != b.get(k))
    if keys:
      raise ValueError(f"{run_dir} is not the run of {first_dir} at other {hparam} values: "
                       f"they differ in {keys}. Choose over folders of one "
                       "command that differ in the values only.")
  members, seen = [], {}
  for run_dir, _, run_members in runs:
    for m in run_members:
      key = (*_line(m, hparam), m["hparams"][hparam], m["seed"])
      if key in seen:
        raise ValueError(f"{run_dir} and {seen[key]} both trained {m['task']} / "
                         f"{m['scheme']} at {hparam}={m['hparams'][hparam]:g}, seed "
                         f"{m['seed']}: give each value in one folder only.")
      seen[key] = run_dir
      members.append(m)
  return first, members


def grid_table(members: Sequence[Mapping[str, Any]], hparam: str, criterion: str,
               metric: str) -> str:
  """Each scheme's validation `criterion` and test `metric` at every value tried (mean
  over the seeds that did not diverge): the curve the choice was made on."""
  values = sorted({m["hparams"][hparam] for m in members})
  percent = report.is_percent_metric(criterion), report.is_percent_metric(metric)

  def cell(at_value):
    alive = [m["metrics"] for m in at_value if not m["diverged"]]
    if not alive:
      return f"diverged ({len(at_value)})" if at_value else report.MISSING
    return " / ".join(report._fmt_number(float(np.mean([a[n] for a in alive])), p)
                      for n, p in zip((criterion, metric), percent))

  lines = [f"`{criterion}` / `{metric}` at each {hparam} (mean over the seeds that did not "
           "diverge; — where that value was not tried):\n",
           f"| task | scheme | {' | '.join(f'{v:g}' for v in values)} |",
           "|---|---|" + "---|" * len(values)]
  for task, scheme, others in sorted({_line(m, hparam) for m in members}):
    on_line = [m for m in members if _line(m, hparam) == (task, scheme, others)]
    lines.append(f"| {task} | {scheme} | " + " | ".join(
        cell([m for m in on_line if m["hparams"][hparam] == v]) for v in values) + " |")
  return "\n".join(lines) + "\n"


def combined_report(run_dirs: Sequence[str | pathlib.Path]) -> str:
  """The Markdown `mpx select` prints: the choice over every folder's values, then the
  values themselves."""
  from mpx.sweep import config as config_lib  # Imports jax: only when reporting.
  config, members = combine(run_dirs)
  file = config.get("run", {}).get("experiment_file")  # A user's experiment has no name.
  experiment = config_lib.load_experiment(
      file if file and pathlib.Path(file).exists() else config["experiment"])
  hparam, criteria = config["config"]["select"], experiment.VALIDATION
  table, _ = selection_table(members, hparam, criteria, experiment.METRICS)
  folders = "".join(f"- {d}\n" for d in run_dirs)
  return (f"# {config['experiment']} ({config['preset']}): each scheme at its {hparam} "
          f"chosen on validation\n\nOver the members of:\n{folders}\nChosen by "
          f"{', then '.join(f'{d} {n}' for n, d in criteria)} (mean over seeds; a diverged "
          f"seed makes a value the worst).\n\n{table}\n"
          + grid_table(members, hparam, criteria[0][0], experiment.METRICS[0]))
