"""Choosing each scheme's hyperparameter on a validation split, and reporting the run as
it is at the chosen value: the fair comparison of schemes at their own best values.

Selection sees validation metrics only, by construction: `validation_view` keeps a
member's metrics whose names start with `val_` (a family computes them on data that
neither trains nor is reported), and `choose` reads nothing else. A member that diverged
(or lacks a validation metric) counts as the worst value.
"""

from __future__ import annotations

import json
import math
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


def selection_table(members: Sequence[Mapping[str, Any]], hparam: str, criteria,
                    metric_names: Sequence[str]) -> tuple[str, list[dict]]:
  """The Markdown table and JSON rows of the run at each scheme's chosen value: the
  validation score that chose it, then every reported metric, mean ± std over seeds."""
  chosen = choose(members, hparam, criteria)
  names = [n for n, _ in criteria] + list(metric_names)
  columns = [("task", "the task"), ("scheme", "the init scheme"),
             (f"{hparam} (chosen)", f"the {hparam} chosen for the row on validation"),
             ("seeds", "the seeds that did not diverge / all, at that value"),
             *report.metric_columns(names, filter(report.is_percent_metric, names))]
  rows = []
  lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
  for (task, scheme, others), value in sorted(chosen.items(), key=str):
    at_value = [m for m in members if _line(m, hparam) == (task, scheme, others)
                and m["hparams"][hparam] == value]
    alive = [m for m in at_value if not m["diverged"]]
    cells, row = [], {"task": task, "scheme": scheme, hparam: value,
                      "seeds": len(at_value), "diverged": len(at_value) - len(alive)}
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
  return report.legend(columns) + "\n" + "\n".join(lines) + "\n", rows
