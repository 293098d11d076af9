"""The profile stage: where a paper-scale training step's time goes on this device.

One chunk of the 2Parity mask group (the sweep stage's program, compiled once: the sweep
reuses it) at K = 1 and K = 16 members, traced with `jax.profiler` into DIR/profile/k{K}/
and split by `xla_trace.py` (the same classification as `profile_step.py` on a CPU):
matmul kernels, mpx's attention core, copies and transposes, the other fusions by root
op, the time between kernels (launches, the host's while-loop condition) and where
kernels overlap; then the top kernels, each with the jax op it came from. Each K's
tables go into the report as they come, and into DIR/profile/k{K}.md.
"""

from __future__ import annotations

import shutil
import time
import traceback

import jax

from accelerator_check import context, environment, report, sweep
import xla_trace
from mpx.sweep import memory

OP_COLUMNS = ["op", "kind", "shape", "from", "calls", "ms", "share"]
HEADERS = {"ms": "ms per step", "share": "share of the span"}


def profile_members(ctx: context.Context, k: int, st: dict) -> None:
  """Traces one chunk of K members, adds its rows, facts and top-op table to `st`."""
  preset, steps = ctx.sizes.presets["paper"], ctx.sizes.steps["paper"]
  group, _ = sweep.boolean_group(ctx, preset, compute_dtype="float32", attention="reference")
  chunk, state, hparams, data, compile_s = sweep.compile_tiled(ctx, preset, group, k, steps)
  ctx.compile_s[preset] = max(ctx.compile_s.get(preset, 0.0), compile_s)  # For the budget.
  note = environment.does_not_fit(memory.program_bytes(chunk))
  if note:
    st["facts"][f"K = {k}"] = note
    return
  state, out = chunk(state, hparams, data)  # Warm-up: the traced call runs warm.
  jax.block_until_ready(out)
  start = time.perf_counter()
  state, out = chunk(state, hparams, data)
  jax.block_until_ready(out)
  untraced = time.perf_counter() - start
  trace_dir = ctx.report.out / "profile" / f"k{k}"
  shutil.rmtree(trace_dir, ignore_errors=True)  # A rerun's trace replaces the last one.
  result, _, traced = xla_trace.trace_chunk(chunk, state, hparams, data, trace_dir)
  kinds = xla_trace.kind_rows(result, steps)
  ops = xla_trace.op_rows(result, steps, ctx.sizes.profile["top"])
  st["rows"] += [{"K": k, "kind": r["kind"], HEADERS["ms"]: f"{r['ms']:.3f}",
                  HEADERS["share"]: f"{r['share']:.1%}", "ms": r["ms"]} for r in kinds]
  st["facts"][f"K = {k}"] = (
      f"{preset} scale, {steps} steps (compile {compile_s:.1f} s): the traced ops span "
      f"{result.span / 1e3 / steps:.3f} ms per step, {result.span / 1e3 / steps / k:.3f} ms "
      f"per member-step; the chunk took {untraced / steps * 1e3:.3f} ms per step untraced, "
      f"{traced / steps * 1e3:.3f} traced (host clock); trace in "
      f"{trace_dir.relative_to(ctx.report.out)}/")
  st["span_ms"] = st.get("span_ms", {}) | {str(k): result.span / 1e3 / steps}
  table = xla_trace.markdown(OP_COLUMNS, ops, HEADERS)
  st.setdefault("tables", []).append(
      {"title": f"Top {len(ops)} ops at K = {k}, by their own time", "markdown": table})
  lines = [f"# Profile at K = {k}", "", st["facts"][f"K = {k}"], "",
           *xla_trace.markdown(["kind", "ms", "share"], kinds, HEADERS), "",
           *table, ""]
  (ctx.report.out / "profile" / f"k{k}.md").write_text("\n".join(lines))


def stage_profile(ctx: context.Context, st: dict) -> None:
  st["columns"] = ["K", "kind", HEADERS["ms"], HEADERS["share"]]
  for k in ctx.sizes.profile["members"]:
    short = ctx.budget.short(ctx.need(ctx.sizes.presets["paper"]))
    if short:
      st["facts"][f"K = {k}"] = short
      st["partial"] = True
      continue
    try:
      profile_members(ctx, k, st)
    except Exception as e:  # noqa: BLE001 (K = 16 still runs if K = 1 fails)
      traceback.print_exc()
      st["facts"][f"K = {k}"] = f"failed: {report.one_line(e)}"
      st["partial"] = True
    ctx.report.write()
  st["notes"].append(
      "Each kind is the own time of the ops of that kind (an op's duration less the ops "
      "nested in it) per step of all K members; with the gaps between ops and less the "
      "time ops overlap, the rows add up to the span from the first op's start to the "
      "last one's end. Matmul: dots, GEMM custom calls and the fusions that hold a dot; "
      "attention: mpx's attention core (`masked_attention`: logits, prior, softmax, "
      "weighted sum) or a fused attention kernel; a fusion's other kind is its root op. "
      "From: the op's jax name stack and source line (HLO metadata). The traces open in "
      "TensorBoard's or Perfetto's trace viewer.")
