"""Stage 5, the ETA of the Boolean paper table: does it fit one call, from the rates measured.

Per task of the table its member-steps over the float32 rate stage 2 measured at that K,
plus a compile per group; with time left, 2Parity's default and mask members train to the
end, so the ETA is checked against a real run (evaluation, init and checkpoints included).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import tempfile
import threading
import time
import traceback

import numpy as np

from accelerator_check import context, report
import chunk_timing
from mpx import report as mpx_report
from mpx.sweep import config as config_lib
from mpx.sweep import run as run_lib
from mpx.tasks import boolean
from mpx.tasks.boolean import gotu as boolean_gotu

CALL_LIMIT_S = 600  # One device command's limit: what "fits one call" means.


def table_plan(ctx: context.Context, preset: str, overrides=()) -> list[dict]:
  """Per task of the preset's table: its members and steps (one group each)."""
  _, cfg = config_lib.make_config(ctx.boolean, preset, list(overrides))
  plan = []
  for task in cfg.tasks:
    spec = boolean.get_task(task)
    x, _ = boolean_gotu.training_split(spec, 0, None)
    epochs = cfg.epochs or boolean_gotu.TASK_PROTOCOL[task][1]
    plan.append({"task": task, "members": len(boolean_gotu.members(cfg, task)),
                 "steps": epochs * (len(x) // cfg.batch_size)})
  return plan


def rate_for(ctx: context.Context, preset: str, members: int) -> tuple[float | None, str]:
  """Member-steps/s of `members` members (float32, reference attention): interpolated
  linearly in K between the measured K around it, the nearest one outside them."""
  measured = sorted((k, r) for (p, dtype, attention, k), r in ctx.rates.items()
                    if p == preset and dtype == "float32" and attention == "reference")
  if not measured:
    return None, "none measured"
  below = [(k, r) for k, r in measured if k <= members]
  above = [(k, r) for k, r in measured if k >= members]
  if not below or not above:
    k, rate = (above or below)[0] if not below else below[-1]
    return rate, f"K = {k}"
  (k1, r1), (k2, r2) = below[-1], above[0]
  if k1 == k2:
    return r1, f"K = {k1}"
  return r1 + (members - k1) / (k2 - k1) * (r2 - r1), f"between K = {k1} and {k2}"


def train_2parity(ctx: context.Context, preset: str, overrides: list[str],
                  seconds: float) -> dict:
  """2Parity's default and mask members of the preset, trained to the end (or stopped by
  SIGTERM at `seconds`, checkpointed), in a temporary run folder."""
  run_dir = pathlib.Path(tempfile.mkdtemp(prefix="accelerator_check_run_"))
  stop = threading.Event()

  def stopper():  # Repeated: a SIGTERM before the run installed its handler is ignored.
    if stop.wait(seconds):
      return
    while not stop.is_set():
      os.kill(os.getpid(), signal.SIGTERM)
      stop.wait(2.0)

  previous = signal.signal(signal.SIGTERM, lambda *_: None)
  thread = threading.Thread(target=stopper, daemon=True)
  start = time.perf_counter()
  thread.start()
  try:
    run_lib.run_experiment(ctx.boolean, preset=preset, overrides=overrides,
                           out_dir=str(run_dir / "run"), resume=False)
    finished = True
  except run_lib.Preempted:
    finished = False
  finally:
    stop.set()
    signal.signal(signal.SIGTERM, previous)
  wall = time.perf_counter() - start
  metrics = run_dir / "run" / mpx_report.METRICS_FILE
  records = mpx_report.read_metrics(run_dir / "run") if metrics.exists() else []
  summary = (run_dir / "run" / "summary.md")
  if summary.exists():
    shutil.copy(summary, ctx.report.out / "boolean_2parity_summary.md")
  shutil.rmtree(run_dir, ignore_errors=True)
  last = {}
  for r in records:
    key = (r["scheme"], r["seed"])
    if r.get("accuracy") is not None and r["step"] >= last.get(key, {}).get("step", -1):
      last[key] = r
  by_scheme = {}
  for (scheme, _), r in sorted(last.items()):
    by_scheme.setdefault(scheme, []).append(r)
  return {"finished": finished, "wall": wall, "schemes": by_scheme}


def stage_eta(ctx: context.Context, st: dict) -> None:
  preset = ctx.sizes.presets["paper"]
  st["columns"] = ["task", "members", "steps", "member-steps", "rate used", "training s"]
  compile_s = ctx.compile_s.get((preset, "float32", "reference"))
  total = 0.0
  plan = table_plan(ctx, preset)
  for group in plan:
    rate, how = rate_for(ctx, preset, group["members"])
    if rate is None:
      st["notes"].append(f"No {preset}-scale rate was measured (stage 2): no ETA.")
      return
    seconds = group["members"] * group["steps"] / rate
    total += seconds + (compile_s or 0.0)
    st["rows"].append({"task": group["task"], "members": group["members"],
                       "steps": group["steps"],
                       "member-steps": f"{group['members'] * group['steps']:,}",
                       "rate used": f"{rate:.4g} member-steps/s ({how})",
                       "training s": f"{seconds:.0f}"})
  fits = total <= CALL_LIMIT_S
  st["eta_s"] = {"total": total, "compile": compile_s or 0.0, "groups": len(plan)}  # Unrounded.
  largest = max(g["members"] for g in plan)
  if ctx.most is not None and largest > ctx.most:
    st["notes"].append(f"A group of {largest} members exceeds the {ctx.most} that fit at "
                       "once: set members_per_call (the rate then drops).")
  st["facts"][f"ETA of the {preset} table"] = (
      f"{total:.0f} s = training + {len(plan)} × {chunk_timing.fmt(compile_s, '.0f')} s "
      f"compile; {'fits' if fits else 'does not fit'} one {CALL_LIMIT_S} s call (evaluation, "
      "host init and checkpoints not counted)")
  ctx.report.write()
  subset = ["tasks=2parity", "schemes=default,mask", "checkpoint_every=0"]
  sub_plan = table_plan(ctx, preset, subset)[0]
  rate, _ = rate_for(ctx, preset, sub_plan["members"])
  expected = sub_plan["members"] * sub_plan["steps"] / rate + (compile_s or 0.0)
  short = ctx.budget.short(2 * expected + ctx.sizes.row_s)
  if not fits or short:
    st["notes"].append("2Parity default and mask to the end: not run ("
                       f"{'the table does not fit one call' if not fits else short}).")
    return
  try:
    run = train_2parity(ctx, preset, subset, max(1.0, ctx.budget.left() - 10))
  except Exception as e:  # noqa: BLE001 (the ETA above stands)
    traceback.print_exc()
    st["notes"].append("2Parity default and mask to the end: failed: "
                       f"{report.one_line(e)}")
    st["partial"] = True
    return
  accuracy = {scheme: [r["accuracy"] for r in rs] for scheme, rs in run["schemes"].items()}
  st["facts"]["2Parity default and mask, trained"] = (
      f"{'to the end' if run['finished'] else 'stopped at the budget'} in {run['wall']:.0f} s "
      f"({sub_plan['members']} members × {sub_plan['steps']} steps; expected "
      f"{expected:.0f} s of training and compile, so evaluation, init and the end "
      f"checkpoint cost × {run['wall'] / expected:.2f})")
  st["facts"]["their accuracy (mean over seeds, last evaluation)"] = ", ".join(
      f"{scheme} {100 * np.mean(a):.2f}% ({len(a)} seed{'s' if len(a) > 1 else ''})"
      for scheme, a in accuracy.items())
  st["facts"]["ETA of the table with that overhead"] = (
      f"{total * run['wall'] / expected:.0f} s (QK-Opt's init, 10,000 steps per member, "
      "not counted)")
