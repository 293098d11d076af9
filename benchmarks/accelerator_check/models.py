"""The models stage: ViT-Tiny and the language model, beside the Boolean one.

ViT-Tiny at 32 and 224 px with `members_per_call` = 1 and 2 (step time, images/s, device
memory), and the `wikitext2` language model (tokens/s), each on generated images or
tokens fed straight to the engine: the device needs no dataset, grain or TFDS.
"""

from __future__ import annotations

import dataclasses
import functools
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from accelerator_check import context, environment, report
import chunk_timing
from mpx.sweep import config as config_lib
from mpx.sweep import engine, memory, optim
from mpx.sweep.data import DeviceData, EvalData
from mpx.tasks import language, vision
import vision_throughput

MODEL_COLUMNS = ["model", "members_per_call", "K", "step s (all members)", "images or "
                 "tokens /s", "per member", "compile s", "program memory",
                 "device peak so far", "note"]


def timed_row(ctx, chunk, state, hparams, data, compile_s, k, steps, items, row) -> dict:
  """Times a compiled chunk unless XLA says it does not fit; `items` per member-step."""
  program = memory.program_bytes(chunk)
  row = row | {"K": k, "compile s": f"{compile_s:.1f}",
               "program memory": report.size_text(program.total if program else None)}
  note = environment.does_not_fit(program)
  if note:
    return row | {"note": note}
  seconds = chunk_timing.time_chunk(chunk, state, hparams, data, ctx.sizes.repeats)
  step_s = seconds / (steps * ctx.sizes.repeats)
  stats = environment.memory_stats()
  return row | {"step s (all members)": f"{step_s:.4g}",
                "images or tokens /s": f"{k * items / step_s:.4g}",
                "per member": f"{items / step_s:.4g}",
                "device peak so far": report.size_text(stats.get("peak_bytes_in_use"))
                if stats else "–"}


def vit_row(ctx: context.Context, name: str, recipe: dict, members_per_call: int) -> dict:
  """Two ViT members in one chunk of the vision family's real training step, mapped
  `members_per_call` at a time, fed generated CIFAR-shaped uint8 batches."""
  sizes = ctx.sizes
  config = vision.Config(dataset="cifar10", schemes=("default",), batch_size=sizes.vit_batch,
                         **recipe, **sizes.vit)
  group = dataclasses.replace(vision_throughput.make_group(config, 2),
                              members_per_call=members_per_call)
  key = ("vit", recipe["image_size"])  # members_per_call does not change the init.
  if key not in ctx.inits:
    ctx.inits[key] = engine.place(group, engine.init_state(group), None)[:2]
  # Copies: the chunk donates its state.
  state, hparams = jax.tree_util.tree_map(jnp.copy, ctx.inits[key])
  data = engine.replicate(vision_throughput.batches(config, sizes.vit_steps), None)
  chunk, compile_s = chunk_timing.compile_timed(group, sizes.vit_steps, state, hparams, data)
  ctx.compile_s["vit"] = max(ctx.compile_s.get("vit", 0.0), compile_s)
  return timed_row(ctx, chunk, state, hparams, data, compile_s, 2, sizes.vit_steps,
                   sizes.vit_batch, {"model": name, "members_per_call": members_per_call})


class GeneratedTokens:
  """The tokenizer interface the language Task reads: a vocabulary, one byte per token."""
  name = "generated"

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size

  def byte_lengths(self) -> np.ndarray:
    return np.ones(self.vocab_size, np.int32)


def language_row(ctx: context.Context) -> dict:
  """The language preset's members (every scheme × seed) on generated tokens."""
  experiment = config_lib.load_experiment(str(context.EXPERIMENTS / "language.py"))
  _, cfg = config_lib.make_config(experiment, ctx.sizes.language_preset)
  tokenizer = GeneratedTokens(cfg.vocab_size or 257)
  rng = np.random.default_rng(0)
  windows = rng.integers(0, tokenizer.vocab_size, (8 * cfg.batch_size, cfg.seq_len + 1),
                         dtype=np.int32)
  members = language.members(cfg, tokenizer)
  group = engine.Group(
      name="language", members=members, task=language.make_task(cfg, tokenizer),
      data=DeviceData({"tokens": windows}, sampling="epoch"),
      eval_data=EvalData({"tokens": windows[:cfg.batch_size]}, cfg.batch_size),
      steps=cfg.steps, batch_size=cfg.batch_size, members_per_call=cfg.members_per_call,
      optim=optim.OptimConfig(optimizer="adamw", schedule="warmup_cosine",
                              total_steps=cfg.steps, warmup_steps=cfg.warmup_steps,
                              grad_clip=cfg.grad_clip, b2=0.95))
  steps = ctx.sizes.steps["quick"]
  chunk, state, hparams, data, compile_s = chunk_timing.compile_chunk(group, steps)
  ctx.compile_s["language"] = compile_s
  name = (f"language {ctx.sizes.language_preset} ({cfg.depth} × {cfg.width}, "
          f"{cfg.seq_len} tokens, vocab {tokenizer.vocab_size}, {cfg.dtype})")
  return timed_row(ctx, chunk, state, hparams, data, compile_s, len(members), steps,
                   cfg.batch_size * cfg.seq_len, {"model": name, "members_per_call": "all"})


def measured_row(ctx: context.Context, kind: str, label: dict, measure) -> dict:
  """`measure()`'s row, or `label` with why there is none: too little budget left for a
  measurement of `kind`, or the error it raised (one failed row must not lose the others)."""
  short = ctx.budget.short(ctx.need(kind))
  if short:
    return label | {"note": short}
  try:
    return measure()
  except Exception as e:  # noqa: BLE001
    traceback.print_exc()
    return label | {"note": f"failed: {report.one_line(e)}"}


def stage_models(ctx: context.Context, st: dict) -> None:
  st["columns"] = MODEL_COLUMNS
  recipes = {r["image_size"]: r for r in (vision_throughput.RECIPE_32,
                                          vision_throughput.RECIPE_224)}
  plan = []
  for size, m in ctx.sizes.vit_rows:
    name = f"ViT {size} px / patch {recipes[size]['patch_size']}"
    plan.append(("vit", {"model": name, "members_per_call": m},
                 functools.partial(vit_row, ctx, name, recipes[size], m)))
  plan.append(("language", {"model": f"language {ctx.sizes.language_preset}"},
               functools.partial(language_row, ctx)))
  for kind, label, measure in plan:
    row = measured_row(ctx, kind, label, measure)
    st["partial"] = st.get("partial", False) or "note" in row
    st["rows"].append(row)
    ctx.report.write()
  width = ctx.sizes.vit.get("width", 192)
  st["notes"].append(
      f"ViT (width {width}; ViT-Tiny unless --tiny) with the vision family's real training "
      f"step (mixup/cutmix, label smoothing, drop-path, AdamW; --tiny turns mixup, cutmix "
      f"and drop-path off), float32 and the reference "
      f"attention as the presets run it, batch {ctx.sizes.vit_batch} of generated uint8 "
      f"images, 2 members (default scheme), {ctx.sizes.vit_steps} steps per chunk. "
      "members_per_call = 1 maps the members one after another inside the program, 2 "
      "vmaps both. Images or tokens /s count all members; device peak: the allocator's "
      "peak since the process started (memory_stats), not this row's alone; program "
      "memory is this row's (XLA's analysis). The language row: the preset's members "
      "(every scheme × seed) on random tokens.")
