"""The sweep stage: how many member-steps a second the Boolean model trains at.

The 2Parity mask model of the `boolean_gotu` presets, K members in one compiled chunk, at
paper scale with K = 1, 16 and the most that fit, at quick scale with K = 1 and 64, and
in bf16 with fused attention beside float32 with the reference attention; the rates feed
the ETA, and the chunk builders here serve the profile stage and the engine probe (cuDNN).
"""

from __future__ import annotations

import dataclasses
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from accelerator_check import context, environment, report
import chunk_timing
from mpx.sweep import config as config_lib
from mpx.sweep import engine, flops, memory
from mpx.tasks import boolean

SWEEP_COLUMNS = ["preset", "precision, attention", "K", "member-steps/s", "compile s",
                 "GFLOP / member-step (model)", "GFLOP / member-step (XLA)",
                 "achieved TFLOP/s", "of the peak", "program memory", "note"]


def boolean_group(ctx: context.Context, preset: str, **overrides):
  """The 2Parity mask group of a Boolean preset with one member (`compile_tiled` makes K),
  built once per settings."""
  key = (preset,) + tuple(sorted(overrides.items()))
  if key not in ctx.groups:
    _, cfg = config_lib.make_config(ctx.boolean, preset)
    cfg = dataclasses.replace(cfg, tasks=("2parity",), schemes=("mask",), seeds=1,
                              **overrides)
    ctx.groups[key] = ctx.boolean.build_groups(cfg)[0], cfg
  return ctx.groups[key]


def jitted_init(task: engine.Task) -> engine.Task:
  """The task with its init compiled as one program where it traces (a mask member's
  does): run eagerly, the model's init compiles each of its ops on its own."""
  def init(member):
    try:
      return jax.jit(lambda: task.init(member))()
    except Exception:  # noqa: BLE001 (an init with host steps, e.g. QK-Opt's, runs eagerly)
      return task.init(member)
  return dataclasses.replace(task, init=init)


def compile_tiled(ctx: context.Context, preset: str, group: engine.Group, k: int,
                  steps: int):
  """K copies of the group's first member, compiled for `steps` steps: a program and cost
  identical to K distinct members' (values do not change either) without K host inits;
  the member is initialised once per preset (precision and attention do not change the
  params), the program compiled once per check (the profile stage's serves the sweep).
  Returns `(chunk, state, hparams, data, compile seconds)` like `chunk_timing`."""
  if preset not in ctx.inits:
    group_jit = dataclasses.replace(group, task=jitted_init(group.task))
    ctx.inits[preset] = engine.place(group_jit, engine.init_state(group_jit), None)
  state, hparams, data = ctx.inits[preset]
  rows = np.zeros(k, int)
  state, hparams = engine.take_rows(state, rows), engine.take_rows(hparams, rows)
  # The chunk donates the state: its scalars (kept, not gathered, by take_rows) are copied.
  state = jax.tree_util.tree_map(lambda x: jnp.copy(x) if jnp.ndim(x) == 0 else x, state)
  key = (id(group), k, steps)  # Groups live in ctx.groups: their ids stay theirs.
  if key not in ctx.compiled:
    ctx.compiled[key] = chunk_timing.compile_timed(group, steps, state, hparams, data)
  chunk, compile_s = ctx.compiled[key]
  return chunk, state, hparams, data, compile_s


def measure_boolean(ctx: context.Context, slot: str, k: int, dtype: str = "float32",
                    attention: str = "reference") -> dict:
  """One row: K members of the 2Parity mask model, one warm-up chunk then `repeats`."""
  preset, steps = ctx.sizes.presets[slot], ctx.sizes.steps[slot]
  row = {"preset": preset, "precision, attention": f"{dtype}, {attention}", "K": k}
  group, cfg = boolean_group(ctx, preset, compute_dtype=dtype, attention=attention)
  chunk, state, hparams, data, compile_s = compile_tiled(ctx, preset, group, k, steps)
  for key in (preset, (preset, dtype, attention)):  # For the budget; for the ETA.
    ctx.compile_s[key] = max(ctx.compile_s.get(key, 0.0), compile_s)
  program = memory.program_bytes(chunk)
  row["program"] = program.total if program else None
  row |= {"compile s": f"{compile_s:.1f}", "program memory": report.size_text(row["program"])}
  note = environment.does_not_fit(program)
  if note:
    return row | {"note": note}
  seconds = chunk_timing.time_chunk(chunk, state, hparams, data, ctx.sizes.repeats)
  rate = k * steps * ctx.sizes.repeats / seconds
  model = flops.transformer_matmul_flops(cfg, boolean.get_task("2parity").n_bits + 1)
  xla = chunk_timing.xla_flops(chunk) / k
  achieved = model * rate / 1e12
  peak = ctx.peaks.get(dtype)
  ctx.rates[(preset, dtype, attention, k)] = rate
  row |= {"rate": rate, "member-steps/s": f"{rate:.4g}",
          "GFLOP / member-step (model)": f"{model / 1e9:.4g}",
          "GFLOP / member-step (XLA)": f"{xla / 1e9:.4g}", "achieved TFLOP/s": f"{achieved:.3g}",
          "of the peak": "–" if not peak else f"{achieved / peak:.0%} of {dtype}"}
  if mark := chunk_timing.flops_mark(model, xla):
    row["note"] = mark
  return row


def most_members(rows: list[dict], cap: int) -> tuple[int | None, str]:
  """The most members that fit, from the program sizes of two measured K: memory grows by
  one member's state and activations per member on top of what all share."""
  sized = [(r["K"], r["program"]) for r in rows if r.get("program")]
  if len({k for k, _ in sized}) < 2:
    return None, "needs XLA's memory analysis at two K"
  (k1, b1), (k2, b2) = min(sized), max(sized)
  per_member = (b2 - b1) / (k2 - k1)
  fixed = b1 - k1 * per_member
  limit, source = environment.memory_limit()
  if limit is None or per_member <= 0:
    return None, "no memory limit or no per-member growth known"
  k = int((limit - fixed) // per_member)
  return max(1, min(cap, k)), (f"{report.size_text(per_member)} per member + "
                               f"{report.size_text(fixed)} shared, "
                               f"{report.size_text(limit)} usable ({source})"
                               f"{f'; capped at {cap}' if k > cap else ''}")


def stage_sweep(ctx: context.Context, st: dict) -> None:
  st["columns"] = SWEEP_COLUMNS
  sizes = ctx.sizes
  paper, quick = sizes.presets["paper"], sizes.presets["quick"]
  plan = [("paper", k, "float32", "reference") for k in sizes.members["paper"]]
  plan += [("paper", "most", "float32", "reference")]
  if not ctx.args.no_cudnn:
    plan += [("paper", max(sizes.members["paper"]), "bfloat16", ctx.fused)]
  plan += [("quick", k, "float32", "reference") for k in sizes.members["quick"]]
  measured = []
  for slot, k, dtype, attention in plan:
    preset, is_most = sizes.presets[slot], k == "most"
    if is_most:
      k, how = most_members([r for r in measured if r["preset"] == paper
                             and r["precision, attention"] == "float32, reference"],
                            sizes.max_members)
      ctx.most = k
      st["facts"][f"most members that fit ({paper})"] = f"{k} ({how})"
      if k is None or k in sizes.members["paper"]:
        continue
    short = ctx.budget.short(ctx.need(preset))
    if short:
      st["rows"].append({"preset": preset, "precision, attention": f"{dtype}, {attention}",
                         "K": k, "note": short})
      st["partial"] = True
      ctx.report.write()
      continue
    try:
      row = measure_boolean(ctx, slot, k, dtype, attention)
      if is_most and row.get("note", "").startswith("not run"):
        # The estimate was linear in K; XLA's plan of that K is what counts: scale once.
        limit, _ = environment.memory_limit()
        ctx.most = max(1, int(k * limit / row["program"]))
        st["facts"][f"most members that fit ({paper})"] += (
            f"; {k} needed {report.size_text(row['program'])}, so {ctx.most}")
        st["rows"].append(row)
        row = measure_boolean(ctx, slot, ctx.most, dtype, attention)
    except Exception as e:  # noqa: BLE001 (one failed row must not lose the others)
      traceback.print_exc()
      row = {"preset": preset, "precision, attention": f"{dtype}, {attention}", "K": k,
             "note": f"failed: {report.one_line(e)}"}
      st["partial"] = True
    measured.append(row)
    st["rows"].append(row)
    ctx.report.write()
  st["notes"].append(
      f"The Boolean 2Parity mask group (`experiments/boolean_gotu.py` presets {paper} and "
      f"{quick}), K copies of one member in one compiled chunk of "
      f"{' / '.join(str(sizes.steps[s]) for s in ('paper', 'quick'))} steps; rates "
      f"exclude compilation (one warm-up chunk, then {sizes.repeats} timed). GFLOP / "
      "member-step (model): the model's matmuls, forward and backward "
      "(`mpx.sweep.flops.transformer_matmul_flops`: 6·P·N·B for the dense weights P, N tokens, batch "
      "B, plus attention's 12·L·H·N²·R·B), which the achieved TFLOP/s and the fraction of "
      "the measured matmul peak of the row's dtype divide by; (XLA): XLA's cost analysis of "
      "the chunk / K (a scan's body counts once), beside it as a check, and a row where it "
      f"is off by more than {chunk_timing.FLOPS_DISAGREE:g}× is marked ⚠. Program memory: "
      "XLA's memory_analysis (arguments + temporaries + outputs − donated + code).")
  if jax.default_backend() != "gpu":
    st["notes"].append('cuDNN needs an NVIDIA GPU: the bf16 row here uses attention="jax", '
                       "the XLA path of the same fused function.")
