"""Stage "ab": the step variants against today's step, on one group, in one process.

Each variant is a config override of the Boolean 2Parity mask group the sweep stage times
(paper scale at K = 16; the tiny preset at K = 2 with --tiny): bf16 compute with the
reference attention (`compute_dtype`), and the engine's step variants (`step_variant`:
the chunk's scan unrolled, XLA:GPU command buffers that take in the loop). First the
numerics: every variant trains `check_steps` steps from the same initial state and its
chunk losses must agree with the plain step's, within 1e-5 relative in float32 and
`BF16_TOLERANCE` in bf16; the plain step runs twice, so the device's own run-to-run
difference is reported beside them. A variant that disagrees is "differs", never a winner:
only a device can check XLA:GPU's options. Then the timing: rounds of one chunk of each
variant in turn (interleaved: a drift of the machine falls on all alike), the median per
variant. The report names the fastest variant that computes what the plain step does.
"""

from __future__ import annotations

import statistics
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from accelerator_check import context, report, sweep

# Config overrides of each variant, timed in this order (the plain step first: the others
# are compared with it); a variant the budget cannot fit is skipped with a note. The order
# is what the programs compiled for an H100 predict at K = 16
# (experiments/results/compile_gpu_variants.md): bf16 moves a third fewer bytes, command
# buffers save launches (≈ 6%), an unrolled scan neither.
VARIANTS = {
    "plain": {},
    "bf16": {"compute_dtype": "bfloat16"},
    "graphs": {"step_variant": "graphs"},
    "unroll2": {"step_variant": "unroll2"},
    "unroll4": {"step_variant": "unroll4"},
}
FLOAT32_TOLERANCE = 1e-5
# bf16 against float32, the largest relative difference of a chunk loss over 32 steps
# (chunks of 8) measured on a CPU (jax 0.10.2): 2.9e-4 (tiny preset), 4.9e-3 (quick),
# 8.2e-3 (paper scale; the last chunk's loss 0.0348 vs 0.0351); ≈ 3.5× the largest.
BF16_TOLERANCE = 3e-2
COLUMNS = ["variant", "overrides", "losses vs plain", "verdict", "member-steps/s",
           "× plain", "compile s", "note"]


def relative_difference(got: np.ndarray, want: np.ndarray) -> float:
  """The largest |got − want| / |want| over the chunk losses (inf where one is not finite)."""
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if not (np.all(np.isfinite(got)) and np.all(np.isfinite(want))):
    return float("inf")
  return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-30)))


def train_losses(chunk, state, hparams, data, chunks: int):
  """`(state, [chunks, K] losses)`: each chunk's mean training loss per member."""
  losses = []
  for _ in range(chunks):
    state, out = chunk(state, hparams, data)
    losses.append(np.asarray(out["train_loss"]))
  return state, np.stack(losses)


def tolerance(overrides: dict) -> float:
  return BF16_TOLERANCE if overrides.get("compute_dtype") == "bfloat16" else FLOAT32_TOLERANCE


def fresh_state(state):
  """A copy of a state, for a second run from it: the chunk donates what it is given."""
  return jax.tree_util.tree_map(jnp.copy, state)


def stage_ab(ctx: context.Context, st: dict) -> None:
  sizes = ctx.sizes.ab
  slot, k, rounds = sizes["slot"], sizes["members"], sizes["rounds"]
  preset, steps = ctx.sizes.presets[slot], ctx.sizes.steps[slot]
  chunks = -(-sizes["check_steps"] // steps)
  st["columns"] = COLUMNS
  st["facts"]["group"] = (f"{preset} 2Parity mask group, K = {k}, {steps} steps per chunk; "
                          f"losses over {chunks * steps} steps, timing {rounds} rounds")
  live = {}  # Variant → [chunk, state, hparams, data, row, seconds per round].
  reference = None
  for name in sizes["variants"]:
    overrides = VARIANTS[name]
    row = {"variant": name, "overrides": ", ".join(f"{a}={b}" for a, b in overrides.items())
           or "(today's step)"}
    st["rows"].append(row)
    short = ctx.budget.short(ctx.need(("ab", preset)) + 2 * rounds)
    if short:
      row["note"] = short
      st["partial"] = True
      ctx.report.write()
      continue
    try:
      group, _ = sweep.boolean_group(ctx, preset, **overrides)
      chunk, state, hparams, data, compile_s = sweep.compile_tiled(ctx, preset, group, k,
                                                                   steps)
      ctx.compile_s[("ab", preset)] = max(ctx.compile_s.get(("ab", preset), 0.0), compile_s)
      row["compile s"] = f"{compile_s:.1f}"
      if name == "plain":  # Twice: the device's own run-to-run difference.
        again = fresh_state(state)
        state, losses = train_losses(chunk, state, hparams, data, chunks)
        _, repeat = train_losses(chunk, again, hparams, data, chunks)
        reference = losses
        st["facts"]["plain against itself"] = (
            f"{relative_difference(repeat, losses):.2g} (the largest relative difference "
            "of a chunk loss between two runs of the same program from the same state)")
        row["losses vs plain"], row["verdict"] = "–", "reference"
      elif reference is None:
        row["verdict"] = "unchecked: no plain step to compare with"
      else:
        state, losses = train_losses(chunk, state, hparams, data, chunks)
        error, limit = relative_difference(losses, reference), tolerance(overrides)
        row["losses vs plain"] = f"{error:.2g} (tolerance {limit:g})"
        row["verdict"] = "same" if error <= limit else "differs"
      live[name] = [chunk, state, hparams, data, row, []]
    except Exception as e:  # noqa: BLE001 (one failed variant must not lose the others)
      traceback.print_exc()
      row["verdict"], row["note"] = "failed", report.one_line(e)
      st["partial"] = True
    ctx.report.write()
  for _ in range(rounds):  # Interleaved: one chunk of each variant per round.
    for name, entry in list(live.items()):
      chunk, state, hparams, data, row, seconds = entry
      try:
        start = time.perf_counter()
        state, out = chunk(state, hparams, data)
        jax.block_until_ready(out)
        seconds.append(time.perf_counter() - start)
        entry[1] = state
      except Exception as e:  # noqa: BLE001 (the other variants keep their timing)
        traceback.print_exc()
        row["verdict"], row["note"] = "failed", report.one_line(e)
        st["partial"] = True
        del live[name]
  for name, (_, _, _, _, row, seconds) in live.items():
    row["rate"] = k * steps / statistics.median(seconds)
    row["member-steps/s"] = f"{row['rate']:.4g}"
  if "plain" in live:
    for _, _, _, _, row, _ in live.values():
      row["× plain"] = f"{row['rate'] / live['plain'][4]['rate']:.2f}"
  passing = [row for _, _, _, _, row, _ in live.values()
             if row["verdict"] in ("reference", "same")]
  if passing:
    best = max(passing, key=lambda row: row["rate"])
    st["facts"]["fastest that computes the same"] = (
        f"{best['variant']} ({best['member-steps/s']} member-steps/s, "
        f"{best.get('× plain', '–')}× plain)")
  st["notes"].append(
      "Each variant is a config override of the group (`--set KEY=VALUE` of `mpx run`); "
      "each trains from the same initial state and its chunk losses are compared with the "
      f"plain step's: within {FLOAT32_TOLERANCE:g} relative in float32, {BF16_TOLERANCE:g} "
      "in bf16 (≈ 3.5× the largest difference measured on a CPU), else 'differs'. Rates: the "
      f"median of {rounds} interleaved rounds of one chunk per variant, compilation "
      "excluded. To make a float32 winner the engine's GPU default, set "
      "`GPU_STEP_VARIANT` in mpx/sweep/engine.py to its name.")
