"""What a call is expected to do: the stages in order with their seconds (`--plan`).

The seconds come from the newest results JSON committed under experiments/results/
(`accelerator_check*.json`, written by an earlier call on the same kind of machine: a
--tiny run's for --tiny), else from the estimates in context.py; the plan says which.
It reads files and builds configs only: no device, nothing compiled.
"""

from __future__ import annotations

import json
import os
import pathlib

from accelerator_check import context, headline

RESULTS = context.EXPERIMENTS / "results"
TRAINED = {"headline": "2parity", "majority3": "majority3", "cyclic3": "cyclic3"}  # Tasks.


def last_results(tiny: bool, folder: pathlib.Path = RESULTS) -> tuple[dict | None, str]:
  """`(report, its path)` of the newest committed results JSON of this kind of run."""
  found = []
  for path in sorted(folder.glob("accelerator_check*.json")):
    data = json.loads(path.read_text())
    if bool(data["header"].get("tiny")) == tiny:
      found.append((data["header"]["started"],
                    os.path.relpath(path, context.EXPERIMENTS.parent), data))
  if not found:
    return None, ""
  _, path, data = max(found, key=lambda f: f[0])
  return data, path


def expectations(sizes: context.Sizes, tiny: bool,
                 folder: pathlib.Path = RESULTS) -> dict:
  """What this call should take: `sizes.expect` with what the last results JSON measured
  in its place (each stage's seconds, the paper-scale float32 rates and compile, the
  overhead of a trained run over its training time)."""
  expect = dict(sizes.expect, stage_s=dict(sizes.expect["stage_s"]))
  data, path = last_results(tiny, folder)
  if data is None:
    return expect
  expect["source"] = f"{path} ({data['header']['started']})"
  stages = data["stages"]
  for key, stage in stages.items():
    if stage.get("status") == "done" and stage.get("seconds") is not None:
      expect["stage_s"][key] = stage["seconds"]
  rows = [r for r in stages.get("sweep", {}).get("rows", [])
          if r.get("rate") and r.get("preset") == sizes.presets["paper"]
          and r.get("precision, attention") == "float32, reference"]
  if rows:
    expect["rates"] = {r["K"]: r["rate"] for r in rows}
    expect["compile_s"] = max(float(r["compile s"]) for r in rows)
  if stages.get("eta", {}).get("overhead"):
    expect["overhead"] = stages["eta"]["overhead"]
  return expect


def stage_seconds(key: str, sizes: context.Sizes, expect: dict, experiment,
                  budget_left: float) -> tuple[float | None, str]:
  """`(seconds, how)` a stage is expected to take: a Boolean row's from its seeds plan
  (`headline.plan_seeds`), the others' from `expect`."""
  if key in TRAINED:
    left = headline.seconds_for(TRAINED[key], budget_left, sizes)
    seeds, seconds = headline.plan_seeds(experiment, sizes.headline["preset"], TRAINED[key],
                                         sizes.headline["seeds"], left, expect)
    return seconds, f"{seeds} of {sizes.headline['seeds']} seeds, every scheme"
  seconds = expect["stage_s"].get(key)
  return seconds, "" if seconds is not None else "no estimate"


def render(stages: list[str], titles: dict, sizes: context.Sizes, expect: dict, experiment,
           budget: float) -> str:
  """The plan as Markdown: per stage its expected and cumulative seconds, whether the
  budget still has them, and where the figures come from."""
  lines = [f"Plan: budget {budget:.0f} s; seconds from {expect['source']}.", "",
           "| stage | expected s | from the start | within the budget | |",
           "|---|---|---|---|---|"]
  total = 0.0
  for key in stages:
    seconds, how = stage_seconds(key, sizes, expect, experiment, budget - total)
    total += seconds or 0.0
    fits = "yes" if total <= budget else "no: skipped or cut"
    lines.append(f"| {key}: {titles[key]} | {'?' if seconds is None else f'{seconds:.0f}'} | "
                 f"{total:.0f} | {fits} | {how} |")
  return "\n".join(lines)
