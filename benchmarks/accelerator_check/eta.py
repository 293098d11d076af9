"""The ETA of the Boolean paper table: does it fit one call, from the rates measured.

Per task of the table its member-steps over the float32 rate the sweep stage measured at
that K, plus a compile per group; the headline stage's run, trained to the end in the same
call, says what evaluation, init and checkpoints add to that (the next --plan reads it).
"""

from __future__ import annotations

from accelerator_check import context
import chunk_timing
from mpx.sweep import config as config_lib
from mpx.tasks import boolean
from mpx.tasks.boolean import gotu as boolean_gotu

CALL_LIMIT_S = 600  # One device command's limit: what "fits one call" means.


def table_plan(experiment, preset: str, overrides=()) -> list[dict]:
  """Per task of the Boolean experiment's preset table: its members and steps (one group
  each); numpy only, nothing compiled."""
  _, cfg = config_lib.make_config(experiment, preset, list(overrides))
  plan = []
  for task in cfg.tasks:
    spec = boolean.get_task(task)
    x, _ = boolean_gotu.training_split(spec, 0, None)
    epochs = cfg.epochs or boolean_gotu.TASK_PROTOCOL[task][1]
    plan.append({"task": task, "members": len(boolean_gotu.members(cfg, task)),
                 "steps": epochs * (len(x) // cfg.batch_size)})
  return plan


def rate_for(ctx: context.Context, preset: str, members: int) -> tuple[float | None, str]:
  """Member-steps/s of `members` members (float32, reference attention) from the rates
  the sweep stage measured (`interpolate`)."""
  return interpolate({k: r for (p, dtype, attention, k), r in ctx.rates.items()
                      if p == preset and dtype == "float32" and attention == "reference"},
                     members)


def interpolate(rates: dict, members: int) -> tuple[float | None, str]:
  """The rate of `members` members from rates by K: linear in K between the K around it,
  the nearest one outside them; `(rate, which K)`."""
  measured = sorted(rates.items())
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


def stage_eta(ctx: context.Context, st: dict) -> None:
  preset = ctx.sizes.presets["paper"]
  st["columns"] = ["task", "members", "steps", "member-steps", "rate used", "training s"]
  compile_s = ctx.compile_s.get((preset, "float32", "reference"))
  training = 0.0
  plan = table_plan(ctx.boolean, preset)
  for group in plan:
    rate, how = rate_for(ctx, preset, group["members"])
    if rate is None:
      st["notes"].append(f"No {preset}-scale rate was measured (sweep stage): no ETA.")
      return
    seconds = group["members"] * group["steps"] / rate
    training += seconds
    st["rows"].append({"task": group["task"], "members": group["members"],
                       "steps": group["steps"],
                       "member-steps": f"{group['members'] * group['steps']:,}",
                       "rate used": f"{rate:.4g} member-steps/s ({how})",
                       "training s": f"{seconds:.0f}"})
  compiles = len(plan) * (compile_s or 0.0)
  total = training + compiles
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
  run = ctx.headline
  if not run or not run["finished"]:
    st["notes"].append("No Boolean row was trained to the end in this call (headline "
                       "stage): what evaluation and init add is not measured.")
    return
  rate, _ = rate_for(ctx, preset, run["members"])
  trained = run["members"] * run["steps"] / rate
  st["overhead"] = (run["wall"] - (compile_s or 0.0)) / trained  # Read by the next --plan.
  st["eta_s"]["headline"] = {"wall": run["wall"], "training": trained}  # Unrounded.
  st["facts"][f"the {run['task']} run (headline) against this ETA"] = (
      f"{run['wall']:.0f} s for {run['members']} members × {run['steps']:,} steps: "
      f"{trained:.0f} s of training at the rate measured here and "
      f"{chunk_timing.fmt(compile_s, '.0f')} s compile, so evaluation, init (QK-Opt's "
      f"included) and checkpoints cost × {st['overhead']:.2f} over training")
  st["facts"]["ETA of the table with that overhead"] = (
      f"{training * st['overhead'] + compiles:.0f} s")
