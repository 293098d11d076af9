"""The headline stage: the paper preset's 2Parity row trained to the end, right away.

What `mpx run boolean_gotu --preset paper --set tasks=2parity --resume=auto` does, in this
process: every scheme × as many of the preset's 10 seeds as the plan says fit the stage's
time, with the whole-cube evaluation, into the run folder DIR/boolean_gotu-paper-2parity
(metrics.jsonl and checkpoints as it goes, summary.json and summary.md at the end). At
its deadline the run gets SIGTERM, checkpoints and stops; the same command with the same
--out continues it with the seeds it started with. The report shows per scheme the mean
± std over seeds of the whole-cube and unseen accuracy and the test loss beside the
paper's number, rewritten at every evaluation. Majority and Cyclic3 are the stages
`majority3` and `cyclic3` (run only when --stages names them), each planned to fit one
call.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import threading
import time

from accelerator_check import context, eta
from mpx import report as mpx_report
from mpx.sweep import run as run_lib

METRICS = ("accuracy", "accuracy_unseen", "loss")
COLUMNS = ["scheme", "seeds", "step", "whole-cube accuracy (%)", "paper (%)",
           "unseen accuracy (%)", "test loss (cube)"]
RESERVE_S = 10.0  # Left at the deadline for the final checkpoint and the report.


def seconds_for(task: str, left: float, sizes: context.Sizes) -> float:
  """The seconds a row may take of the `left` in the budget: the 2Parity row shares its
  call with the stages after it (at most `most_s`), a row of its own call takes it all."""
  seconds = left - RESERVE_S
  return min(seconds, sizes.headline["most_s"]) if task == "2parity" else seconds


def run_folder(ctx: context.Context, task: str) -> pathlib.Path:
  return ctx.report.out / f"boolean_gotu-{ctx.sizes.headline['preset']}-{task}"


def expected_seconds(experiment, preset: str, task: str, seeds: int, expect: dict) -> float:
  """Seconds the task's group of `seeds` seeds × every scheme should take to train, from
  the rates by K in `expect` (paper scale, float32), its compile and overhead factor."""
  group = eta.table_plan(experiment, preset, [f"tasks={task}", f"seeds={seeds}"])[0]
  rate, _ = eta.interpolate(expect["rates"], group["members"])
  return expect["compile_s"] + expect["overhead"] * group["members"] * group["steps"] / rate


def plan_seeds(experiment, preset: str, task: str, most: int, seconds: float,
               expect: dict) -> tuple[int, float]:
  """`(seeds, expected seconds)`: the most seeds (at most `most`) whose run is expected to
  fit `seconds`; 0 seeds where not even one does."""
  fits = [(s, expected_seconds(experiment, preset, task, s, expect))
          for s in range(1, most + 1)]
  fits = [(s, t) for s, t in fits if t <= seconds]
  return fits[-1] if fits else (0, expected_seconds(experiment, preset, task, 1, expect))


def started_seeds(folder: pathlib.Path) -> int | None:
  """The seeds of a run an earlier call started in `folder` (which it must keep to
  resume), None where there is none."""
  config = folder / "config.json"
  return json.loads(config.read_text())["config"]["seeds"] if config.exists() else None


def scheme_rows(members: list[dict], paper: dict, steps: dict) -> list[dict]:
  """Per scheme, mean ± std over seeds (`mpx.report.summarize`) of METRICS and the
  paper's accuracy; `steps` maps a scheme to the step its numbers are from."""
  rows = []
  for row in mpx_report.summarize(members, METRICS):
    cell = lambda name, scale: (
        "–" if row[name]["mean"] is None else
        f"{scale * row[name]['mean']:.{2 if scale == 100 else 4}f} ± "
        f"{scale * row[name]['std']:.{2 if scale == 100 else 4}f}")
    accuracy = paper.get(row["scheme"], {}).get("accuracy")
    rows.append({"scheme": row["scheme"], "seeds": row["n_seeds"],
                 "step": steps[row["scheme"]],
                 "whole-cube accuracy (%)": cell("accuracy", 100),
                 "paper (%)": "–" if accuracy is None else f"{100 * accuracy:g}",
                 "unseen accuracy (%)": cell("accuracy_unseen", 100),
                 "test loss (cube)": cell("loss", 1),
                 "mean": {m: row[m]["mean"] for m in METRICS},
                 "std": {m: row[m]["std"] for m in METRICS}})
  return rows


def evaluated_members(folder: pathlib.Path) -> tuple[list[dict], dict]:
  """`(members, step per scheme)` from the run's log so far: each member's last
  evaluation, as `summarize` takes them; the step is the scheme's least."""
  if not (folder / mpx_report.METRICS_FILE).exists():
    return [], {}
  last = {}
  for r in mpx_report.read_metrics(folder):
    if r.get("accuracy") is not None and r["step"] >= last.get((r["scheme"], r["seed"]),
                                                              {}).get("step", -1):
      last[(r["scheme"], r["seed"])] = r
  members = [{k: r[k] for k in ("task", "scheme", "seed", "hparams", "diverged")}
             | {"metrics": {m: r.get(m) for m in METRICS}} for r in last.values()]
  steps = {}
  for r in last.values():
    steps[r["scheme"]] = min(steps.get(r["scheme"], r["step"]), r["step"])
  return members, steps


def train(experiment, preset: str, overrides: list[str], folder: pathlib.Path,
          seconds: float, on_progress, every: float) -> tuple[bool, float]:
  """Runs the experiment into `folder` (--resume=auto), stopped by SIGTERM at `seconds`
  (it checkpoints first), calling `on_progress()` every `every` seconds from a thread;
  `(finished, wall seconds)`."""
  stop = threading.Event()

  def stopper():  # Repeated: a SIGTERM before the run installed its handler is ignored.
    if stop.wait(seconds):
      return
    while not stop.is_set():
      os.kill(os.getpid(), signal.SIGTERM)
      stop.wait(2.0)

  def poller():
    while not stop.wait(every):
      on_progress()

  previous = signal.signal(signal.SIGTERM, lambda *_: None)
  threads = [threading.Thread(target=f, daemon=True) for f in (stopper, poller)]
  start = time.perf_counter()
  for thread in threads:
    thread.start()
  try:
    run_lib.run_experiment(experiment, preset=preset, overrides=overrides,
                           out_dir=str(folder), resume=run_lib.RESUME_AUTO)
    finished = True
  except run_lib.Preempted:
    finished = False
  finally:
    stop.set()
    for thread in threads:
      thread.join()
    signal.signal(signal.SIGTERM, previous)
  return finished, time.perf_counter() - start


def stage_headline(ctx: context.Context, st: dict, task: str = "2parity") -> None:
  sizes = ctx.sizes.headline
  preset, folder = sizes["preset"], run_folder(ctx, task)
  paper = ctx.boolean.PAPER.get(task, {})
  st["columns"] = COLUMNS
  seconds = seconds_for(task, ctx.budget.left(), ctx.sizes)
  expect = ctx.expect
  seeds = started_seeds(folder)
  resumed = seeds is not None
  if not resumed:
    seeds, expected = plan_seeds(ctx.boolean, preset, task, sizes["seeds"], seconds, expect)
    st["facts"]["seeds"] = (
        f"{seeds} of {sizes['seeds']}: expected {expected:.0f} s of the {seconds:.0f} s "
        f"this stage has (rates by K {expect['rates']}, compile {expect['compile_s']:.0f} s, "
        f"× {expect['overhead']:g} for evaluation and init; from {expect['source']})")
    if seeds == 0:
      st["notes"].append("Not run: not even one seed fits; give it more --budget-s.")
      st["partial"] = True
      return
  else:
    expected = expected_seconds(ctx.boolean, preset, task, seeds, expect)
    st["facts"]["seeds"] = f"{seeds}, as the run an earlier call started (resumed)"
  overrides = [f"tasks={task}", f"seeds={seeds}"]
  st["facts"]["run"] = (f"`mpx run boolean_gotu --preset {preset} --set "
                        f"{' --set '.join(overrides)} --out {folder.name} --resume=auto` in "
                        f"DIR/{folder.name}/")
  group = eta.table_plan(ctx.boolean, preset, overrides)[0]
  summary = folder / mpx_report.SUMMARY_JSON

  def show(final: bool):
    if final and summary.exists():
      members = json.loads(summary.read_text())["members"]
      steps = {m["scheme"]: f"{group['steps']:,} (end)" for m in members}
    else:
      members, steps = evaluated_members(folder)
    st["rows"] = scheme_rows(members, paper, steps) if members else []
    ctx.report.write()

  finished, wall = summary.exists(), 0.0
  if finished:
    st["notes"].append("Trained to the end by an earlier call: its summary.")
  else:
    finished, wall = train(ctx.boolean, preset, overrides, folder, seconds,
                           lambda: show(False), sizes["poll_s"])
    st["facts"]["trained"] = (
        f"{'to the end' if finished else 'stopped at the deadline'} in {wall:.0f} s "
        f"({group['members']} members × {group['steps']:,} steps; expected "
        f"{expected:.0f} s){'' if finished else '; the same command continues it'}")
    if not resumed:  # A whole run's wall time: what the ETA stage compares.
      ctx.headline = {"task": task, "members": group["members"], "steps": group["steps"],
                      "wall": wall, "finished": finished}
  show(final=True)
  if not finished:
    st["partial"] = True
  st["notes"].append(
      f"Mean ± std (population, over seeds) of each member's last evaluation on the whole "
      f"cube, {'at the end' if finished else 'so far'}; paper: the paper's whole-cube "
      f"accuracy. Run folder: summary.json, summary.md (the run's own table, every metric), "
      f"metrics.jsonl; `mpx plot {folder.name}` draws its figures.")
