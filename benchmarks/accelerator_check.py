"""The accelerator questions in one prepared command, against a wall-clock budget.

    PYTHONPATH=. python benchmarks/accelerator_check.py --out DIR                 # GPU, <= 5 min
    PYTHONPATH=. python benchmarks/accelerator_check.py --out DIR --budget-s 540  # one long call
    PYTHONPATH=. python benchmarks/accelerator_check.py --out DIR --tiny          # CPU, toy sizes

Stages, in priority order (one the remaining budget cannot fit is skipped with a note):
1. environment: device, memory, jax / jaxlib / CUDA / cuDNN versions, the float32
   (default precision: TF32 on NVIDIA tensor cores) and bfloat16 rates of an n³ `jnp.dot`,
   the peaks every later rate is a fraction of;
2. sweep throughput: the Boolean 2Parity mask model (the `boolean_gotu` preset's) at
   paper scale with K = 1, 16 and the most members XLA's `memory_analysis()` says fit,
   at quick scale with K = 1 and 64, and bf16 + fused attention beside float32 + the
   reference attention; member-steps/s, XLA's FLOPs, the fraction of the peak;
3. cuDNN attention under the engine's `jit(vmap(value_and_grad))`, each case against the
   reference attention, in a child process (a crash is recorded, not fatal);
4. ViT-Tiny at 32 and 224 px with `members_per_call` = 1 and 2 (step time, images/s,
   device memory), the `wikitext2` language model on generated tokens (tokens/s);
5. the ETA of the Boolean paper table from the measured rates and whether it fits one
   call; with time left, 2Parity's default and mask members trained to the end.

DIR/accelerator_check.md and DIR/accelerator_check.json are rewritten after every
measurement, so a run cut off by a timeout keeps what it finished. Nothing here needs
grain, tensorflow-datasets or torch: images and tokens are generated and fed straight to
the engine. `--tiny` runs every stage at toy sizes (the test suite runs it on a CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

START = time.monotonic()  # The budget counts from here, imports included.

# Set before jax starts: jax preallocates this share of a GPU at its first use. The parent
# keeps most of it; the stage-3 child process gets a little beside it.
PROBE_MEMORY_FRACTION = "0.05"
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.85")
# The experiments refuse attention="cudnn" (wrong under vmap, measured): this check measures it.
os.environ["MPX_MEASURE_CUDNN"] = "1"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import chunk_timing  # noqa: E402
import vision_throughput  # noqa: E402
import mpx  # noqa: E402
from mpx import attention as attention_lib  # noqa: E402
from mpx import report as report_lib  # noqa: E402
from mpx.nn import ViT  # noqa: E402
from mpx.sweep import config as config_lib  # noqa: E402
from mpx.sweep import engine, memory, optim  # noqa: E402
from mpx.sweep import run as run_lib  # noqa: E402
from mpx.sweep.data import DeviceData, EvalData  # noqa: E402
from mpx.tasks import boolean, language, vision  # noqa: E402
from mpx.tasks.boolean import gotu as boolean_gotu

JSON_FILE, MARKDOWN_FILE = "accelerator_check.json", "accelerator_check.md"
CALL_LIMIT_S = 600  # One device command's limit: what "fits one call" means.
STAGES = ("environment", "sweep", "cudnn", "models", "eta")
DEFAULT_CACHE = os.path.join(tempfile.gettempdir(), "mpx_accelerator_check_jax_cache")


@dataclasses.dataclass(frozen=True)
class Sizes:
  """What each stage measures: DEVICE on an accelerator, TINY (every stage at toy sizes)
  for a CPU check of the whole script."""
  matmul_n: int
  matmul_repeats: int
  presets: dict        # Boolean slot ("paper", "quick") → preset of experiments/boolean_gotu.py.
  members: dict        # Slot → the K measured; "paper" adds the most that fit.
  max_members: int     # Cap on the most that fit.
  steps: dict          # Slot → steps per compiled chunk.
  repeats: int         # Timed chunks after a warm-up one.
  vit: dict            # vision.Config overrides (none: ViT-Tiny).
  vit_rows: tuple      # (image size, members_per_call) measured.
  vit_batch: int
  vit_steps: int
  language_preset: str
  probe: dict          # Stage 3: attention shapes, the probe ViT, the engine probe's slot.
  stage_s: dict        # Least seconds a stage needs to start.
  row_s: float         # Least seconds a measurement needs before its compile time is known.


DEVICE = Sizes(
    matmul_n=8192, matmul_repeats=5, presets={"paper": "paper", "quick": "quick"},
    members={"paper": (1, 16), "quick": (1, 64)}, max_members=1024,
    steps={"paper": 8, "quick": 32}, repeats=2, vit={},
    vit_rows=((32, 1), (32, 2), (224, 1), (224, 2)), vit_batch=512, vit_steps=5,
    language_preset="wikitext2",
    probe=dict(batch=32, tokens=16, odd_tokens=197, heads=6, head_dim=64, vit_batch=8,
               vit=dict(width=192, depth=2, num_heads=3, head_dim=64, mlp_dim=768),
               engine_slot="quick", engine_steps=4),
    # The environment always runs (0): every rate is a fraction of its peaks.
    stage_s={"environment": 0, "sweep": 60, "cudnn": 45, "models": 60, "eta": 5},
    row_s=20.0)
TINY = Sizes(
    matmul_n=256, matmul_repeats=3, presets={"paper": "tiny", "quick": "quick"},
    members={"paper": (1, 2), "quick": ()}, max_members=2,
    steps={"paper": 8, "quick": 4}, repeats=1,
    vit=dict(width=16, depth=1, num_heads=2, head_dim=8, mlp_dim=32, mixup=0.0, cutmix=0.0,
             drop_path=0.0),
    vit_rows=((32, 1), (224, 2)), vit_batch=2,
    vit_steps=2, language_preset="tiny",
    probe=dict(batch=2, tokens=16, odd_tokens=197, heads=2, head_dim=8, vit_batch=2,
               vit=dict(width=16, depth=1, num_heads=2, head_dim=8, mlp_dim=32),
               engine_slot="paper", engine_steps=8),
    stage_s={"environment": 0, "sweep": 5, "cudnn": 5, "models": 5, "eta": 1}, row_s=1.0)


# --------------------------------------------------------------------------- helpers


def one_line(error: BaseException) -> str:
  text = str(error).strip().splitlines()
  return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def size_text(n: float | None) -> str:
  return "–" if n is None else memory.size(int(n))


def fmt(value, spec: str) -> str:
  return "–" if value is None else format(value, spec)




def memory_stats() -> dict | None:
  """The first device's allocator statistics; None where the backend keeps none (CPU)."""
  try:
    return jax.devices()[0].memory_stats()
  except (NotImplementedError, RuntimeError):
    return None


def memory_limit() -> tuple[float | None, str]:
  """(bytes one program may use, where that figure comes from): 95% of the device
  allocator's limit, or without one (CPU) 80% of the host's MemAvailable."""
  stats = memory_stats()
  if stats and stats.get("bytes_limit"):
    return 0.95 * stats["bytes_limit"], "95% of the device allocator's bytes_limit"
  try:
    match = re.search(r"^MemAvailable:\s+(\d+) kB", pathlib.Path("/proc/meminfo").read_text(),
                      re.M)
  except OSError:
    match = None
  if match:
    return 0.8 * int(match.group(1)) * 1024, "80% of the host's MemAvailable"
  return None, "unknown"


def param_count(params, k: int) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params)) // k


def relative_error(got, want) -> float:
  """‖got − want‖ / ‖want‖ over every leaf of two trees (float32)."""
  pairs = zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))
  num = den = 0.0
  for a, b in pairs:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    num += float(np.sum((a - b) ** 2))
    den += float(np.sum(b ** 2))
  return (num ** 0.5) / max(den ** 0.5, 1e-30)


def cpu_seconds() -> float:
  """CPU time of this process and its finished children (the probe process)."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


def _write_atomic(path: pathlib.Path, text: str) -> None:
  tmp = path.with_suffix(path.suffix + ".tmp")
  tmp.write_text(text)
  os.replace(tmp, path)


class Budget:
  """The wall-clock budget, counted from the script's start."""

  def __init__(self, seconds: float, start: float | None = None):
    self.seconds = seconds
    self.start = time.monotonic() if start is None else start

  def left(self) -> float:
    return self.seconds - (time.monotonic() - self.start)

  def used(self) -> float:
    return time.monotonic() - self.start

  def short(self, need: float) -> str | None:
    """None if `need` seconds fit, else the note a skipped measurement gets."""
    left = self.left()
    return None if left >= need else (f"skipped: {max(left, 0):.0f} s of the budget left, "
                                      f"needs ≈ {need:.0f} s")


# --------------------------------------------------------------------------- report


class Report:
  """The findings so far, rewritten in full (Markdown and JSON) after each measurement."""

  def __init__(self, out: pathlib.Path, header: dict, budget: Budget):
    self.out, self.budget = out, budget
    self.data = {"header": header, "stages": {}}
    out.mkdir(parents=True, exist_ok=True)

  def stage(self, key: str, title: str) -> dict:
    stage = {"title": title, "status": "running", "seconds": None, "facts": {},
             "columns": [], "rows": [], "notes": []}
    self.data["stages"][key] = stage
    self.write()
    return stage

  def write(self) -> None:
    self.data["header"]["used_s"] = round(self.budget.used(), 1)
    _write_atomic(self.out / JSON_FILE, json.dumps(self.data, indent=1, default=str) + "\n")
    _write_atomic(self.out / MARKDOWN_FILE, render(self.data))


def render(data: dict) -> str:
  """The report as Markdown: a header, then per stage its facts, table and notes."""
  h = data["header"]
  lines = ["# Accelerator check", "", f"`{h['command']}`", "",
           f"{h['started']}; budget {h['budget_s']:.0f} s, {h['used_s']:.0f} s used"
           f"{'; toy sizes (--tiny)' if h['tiny'] else ''}.", ""]
  for number, stage in enumerate(data["stages"].values(), 1):
    took = "" if stage["seconds"] is None else f", {stage['seconds']:.0f} s"
    lines += [f"## {number}. {stage['title']} ({stage['status']}{took})", ""]
    lines += [f"- {name}: {value}" for name, value in stage["facts"].items()]
    if stage["facts"]:
      lines.append("")
    if stage["rows"]:
      columns = stage["columns"]
      lines += ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
      lines += ["| " + " | ".join(str(row.get(c, "")) for c in columns) + " |"
                for row in stage["rows"]]
      lines.append("")
    lines += [note for note in stage["notes"] for note in (note, "")]
  return "\n".join(lines)


@dataclasses.dataclass
class Context:
  """What the stages share: sizes, budget, report, and earlier stages' measurements."""
  sizes: Sizes
  budget: Budget
  report: Report
  args: argparse.Namespace
  fused: str                                   # "cudnn" on a GPU, else "jax".
  peaks: dict = dataclasses.field(default_factory=dict)       # dtype → TFLOP/s.
  rates: dict = dataclasses.field(default_factory=dict)       # (preset, dtype, attention,
                                                               #  K) → member-steps/s.
  compile_s: dict = dataclasses.field(default_factory=dict)   # key → seconds.
  boolean: object = None                       # The boolean_gotu experiment module.
  groups: dict = dataclasses.field(default_factory=dict)      # Built Boolean groups.
  inits: dict = dataclasses.field(default_factory=dict)       # Model → initial state.
  most: int | None = None                      # The most paper-scale members that fit.

  def need(self, kind: str) -> float:
    """Seconds a measurement of `kind` needs: its last compile time and a margin."""
    return max(self.sizes.row_s, 1.5 * self.compile_s.get(kind, 0.0))


# --------------------------------------------------------------------------- 1. environment


def cuda_versions() -> str:
  """CUDA runtime and cuDNN versions jax was loaded with ("–" without a CUDA plugin)."""
  try:
    from jax._src.lib import cuda_versions as versions  # Not public: guarded.
  except ImportError:
    return "–"
  if versions is None:
    return "–"
  parts = []
  for name, getter in (("CUDA runtime", "cuda_runtime_get_version"),
                       ("cuDNN", "cudnn_get_version")):
    try:
      parts.append(f"{name} {getattr(versions, getter)()}")
    except Exception as e:  # noqa: BLE001 (a version query must not end the check)
      parts.append(f"{name} ? ({one_line(e)})")
  return ", ".join(parts)


def nvidia_smi() -> str | None:
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=20)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() or None


def stage_environment(ctx: Context, st: dict) -> None:
  import flax
  import jaxlib
  device = jax.devices()[0]
  stats = memory_stats()
  limit, source = memory_limit()
  facts = st["facts"]
  capability = getattr(device, "compute_capability", None)
  facts["device"] = (f"{jax.device_count()} × {device.device_kind} ({jax.default_backend()}"
                     f"{f', compute capability {capability}' if capability else ''})")
  facts["nvidia-smi"] = nvidia_smi() or "–"
  facts["device memory (memory_stats)"] = (
      "none (this backend keeps no allocator statistics)" if stats is None else
      f"bytes_limit {size_text(stats.get('bytes_limit'))}, in use "
      f"{size_text(stats.get('bytes_in_use'))}")
  facts["memory a program may use"] = f"{size_text(limit)} ({source})"
  facts["versions"] = (f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax "
                       f"{flax.__version__}, Python {platform.python_version()}; "
                       f"{cuda_versions()}")
  facts["XLA_FLAGS / memory fraction"] = (
      f"{os.environ.get('XLA_FLAGS', '')!r} / "
      f"{os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION')}")
  ctx.report.write()
  n = ctx.sizes.matmul_n
  for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
    peak_gflops = chunk_timing.matmul_peak((n,), ctx.sizes.matmul_repeats, dtype)[n]
    ctx.peaks[name] = peak_gflops / 1e3
  facts[f"matmul peak ({n}³ jnp.dot, best of {ctx.sizes.matmul_repeats})"] = (
      ", ".join(f"{k} {v:.3g} TFLOP/s" for k, v in ctx.peaks.items()) +
      " (float32 at default precision: TF32 on NVIDIA tensor cores)")


# --------------------------------------------------------------------------- 2. sweep


def boolean_group(ctx: Context, preset: str, **overrides):
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


def compile_tiled(ctx: Context, preset: str, group: engine.Group, k: int, steps: int):
  """K copies of the group's first member, compiled for `steps` steps: a program and cost
  identical to K distinct members' (values do not change either) without K host inits;
  the member is initialised once per preset (precision and attention do not change the
  params). Returns `(chunk, state, hparams, data, compile seconds)` like `chunk_timing`."""
  if preset not in ctx.inits:
    group_jit = dataclasses.replace(group, task=jitted_init(group.task))
    ctx.inits[preset] = engine.place(group_jit, engine.init_state(group_jit), None)
  state, hparams, data = ctx.inits[preset]
  rows = np.zeros(k, int)
  state, hparams = engine.take_rows(state, rows), engine.take_rows(hparams, rows)
  # The chunk donates the state: its scalars (kept, not gathered, by take_rows) are copied.
  state = jax.tree_util.tree_map(lambda x: jnp.copy(x) if jnp.ndim(x) == 0 else x, state)
  start = time.perf_counter()
  chunk = engine.make_train_chunk(group, steps).lower(state, hparams, data).compile()
  return chunk, state, hparams, data, time.perf_counter() - start


SWEEP_COLUMNS = ["preset", "precision, attention", "K", "member-steps/s", "compile s",
                 "GFLOP / member-step (XLA)", "6·P·N·B GFLOP", "achieved TFLOP/s",
                 "of the peak", "program memory", "note"]


def measure_boolean(ctx: Context, slot: str, k: int, dtype: str = "float32",
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
  row |= {"compile s": f"{compile_s:.1f}", "program memory": size_text(row["program"])}
  limit, _ = memory_limit()
  if program and limit and program.total > limit:
    row["note"] = f"not run: needs {size_text(program.total)}, {size_text(limit)} usable"
    return row
  seconds = chunk_timing.time_chunk(chunk, state, hparams, data, ctx.sizes.repeats)
  rate = k * steps * ctx.sizes.repeats / seconds
  gflop = chunk_timing.xla_flops(chunk) / k / 1e9
  tokens = boolean.get_task("2parity").n_bits + 1
  estimate = 6 * param_count(state.params, k) * tokens * cfg.batch_size / 1e9
  achieved = gflop * rate / 1e3
  peak = ctx.peaks.get(dtype)
  ctx.rates[(preset, dtype, attention, k)] = rate
  row |= {"rate": rate, "member-steps/s": f"{rate:.4g}", "GFLOP / member-step (XLA)":
          f"{gflop:.4g}", "6·P·N·B GFLOP": f"{estimate:.4g}",
          "achieved TFLOP/s": f"{achieved:.3g}",
          "of the peak": "–" if not peak else f"{achieved / peak:.0%} of {dtype}"}
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
  limit, source = memory_limit()
  if limit is None or per_member <= 0:
    return None, "no memory limit or no per-member growth known"
  k = int((limit - fixed) // per_member)
  return max(1, min(cap, k)), (f"{size_text(per_member)} per member + {size_text(fixed)} "
                               f"shared, {size_text(limit)} usable ({source})"
                               f"{f'; capped at {cap}' if k > cap else ''}")


def stage_sweep(ctx: Context, st: dict) -> None:
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
        limit, _ = memory_limit()
        ctx.most = max(1, int(k * limit / row["program"]))
        st["facts"][f"most members that fit ({paper})"] += (
            f"; {k} needed {size_text(row['program'])}, so {ctx.most}")
        st["rows"].append(row)
        row = measure_boolean(ctx, slot, ctx.most, dtype, attention)
    except Exception as e:  # noqa: BLE001 (one failed row must not lose the others)
      traceback.print_exc()
      row = {"preset": preset, "precision, attention": f"{dtype}, {attention}", "K": k,
             "note": f"failed: {one_line(e)}"}
      st["partial"] = True
    measured.append(row)
    st["rows"].append(row)
    ctx.report.write()
  st["notes"].append(
      f"The Boolean 2Parity mask group (`experiments/boolean_gotu.py` presets {paper} and "
      f"{quick}), K copies of one member in one compiled chunk of "
      f"{' / '.join(str(sizes.steps[s]) for s in ('paper', 'quick'))} steps; rates "
      f"exclude compilation (one warm-up chunk, then {sizes.repeats} timed). GFLOP / "
      "member-step: XLA's cost analysis of the chunk / K (a scan's body counts once); "
      "6·P·N·B: the matmul FLOPs of a step from the parameter count P, N tokens and batch B, "
      "a check on XLA's count. The fraction is of the measured matmul peak of the row's "
      "dtype; program memory: XLA's memory_analysis (arguments + temporaries + outputs − "
      "donated + code).")
  if jax.default_backend() != "gpu":
    st["notes"].append('cuDNN needs an NVIDIA GPU: the bf16 row here uses attention="jax", '
                       "the XLA path of the same fused function.")


# --------------------------------------------------------------------------- 3. cuDNN


PROBES = {
    "prior_vmap": "a prior per member (the engine's case), 16 tokens",
    "prior_map": "prior_vmap with the members in lax.map (no vmap): the kernel or its "
                 "batching rule",
    "odd_tokens_padded": "197 tokens (ViT-Tiny at 224 px) with a prior: mpx pads to 198",
    "odd_tokens_jax_alone": "197 tokens, a bias, jax.nn.dot_product_attention alone "
                            "(no mpx padding): jax's even-count rule",
    "causal_no_prior": "a causal mask and no prior: the mask is the only bias and carries "
                       "no member axis",
    "unbatched_cotangent": "loss = sum of the output: its cotangent carries no member axis",
    "vit_model": "a ViT at 224 px (197 tokens), bf16, 2 members, value_and_grad of the "
                 "loss, every param's gradient",
    "engine_chunk": "one engine chunk (jit(scan(vmap))) of the Boolean model in bf16, "
                    "2 members: the training loss",
}


def _attention_probe(name: str, p: dict, gpu: bool) -> dict:
  """jit(vmap(value_and_grad)) over 2 members of an attention-level loss, fused against
  the reference attention on the same bf16 values in float32."""
  k_members, b, h, d = 2, p["batch"], p["heads"], p["head_dim"]
  n = p["odd_tokens"] if name.startswith("odd") else p["tokens"]
  keys = jax.random.split(jax.random.key(0), 5)
  q, k, v = (jax.random.normal(key, (k_members, b, n, h, d), jnp.bfloat16)
             for key in keys[:3])
  m_KHNN = 3 * jax.random.normal(keys[3], (k_members, h, n, n))
  w_KBNHD = jax.random.normal(keys[4], (k_members, b, n, h, d))
  causal = name == "causal_no_prior"

  def attend(q, k, v, m_HNN, fused: bool):
    if name == "odd_tokens_jax_alone":
      bias_BHNN = jnp.broadcast_to(mpx.mask_bias(m_HNN), (b, h, n, n))
      backend = ("cudnn" if gpu else "xla") if fused else "xla"
      return jax.nn.dot_product_attention(q, k, v, bias=bias_BHNN, implementation=backend)
    prior = None if causal else m_HNN
    if not fused:
      return mpx.masked_attention(q, k, v, prior, causal=causal)
    if gpu:
      return mpx.masked_attention(q, k, v, prior, causal=causal, implementation="cudnn")
    # No cuDNN here: the XLA path with the padding the cuDNN path applies.
    return attention_lib._masked_attention_fused(q, k, v, prior, None, None, causal, None,
                                                 None, "xla", pad_odd=True)

  def loss(fused: bool):
    def f(m_HNN, q, k, v, w_BNHD):
      out = attend(q, k, v, m_HNN, fused).astype(jnp.float32)
      return jnp.sum(out) if name == "unbatched_cotangent" else jnp.sum(out * w_BNHD)
    member = jax.value_and_grad(f, argnums=(0, 1))
    if name == "prior_map":
      return jax.jit(lambda *xs: jax.lax.map(lambda x: member(*x), xs))
    return jax.jit(jax.vmap(member))

  got = jax.block_until_ready(loss(True)(m_KHNN, q, k, v, w_KBNHD))
  up = lambda x: x.astype(jnp.float32)
  want = loss(False)(m_KHNN, up(q), up(k), up(v), w_KBNHD)
  error = relative_error(got, want)
  return {"status": "ok" if error <= 2e-2 else "mismatch",
          "detail": f"relative error {error:.2g} (tolerance 2e-2)"}


def _vit_probe(p: dict, gpu: bool) -> dict:
  """The ViT's loss and every gradient, 2 members vmapped, fused attention vs reference."""
  import optax
  config = dict(image_size=224, patch_size=16, num_classes=10, pool="cls",
                pos_embed="learned", dtype=jnp.bfloat16, **p["vit"])
  images = jax.random.normal(jax.random.key(1), (p["vit_batch"], 224, 224, 3))
  labels = jnp.arange(p["vit_batch"]) % 10
  model = ViT(**config)
  init = jax.jit(lambda key: model.init(key, images[:1])["params"])  # One compile.
  inits = [init(jax.random.key(s)) for s in (0, 1)]
  params = engine.stack(inits)
  # A prior that is not neutral, so the bias matters.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: 3 * jax.random.normal(jax.random.key(2), x.shape)
      if attention_lib.is_mask_path(path) else x, params)

  def run(implementation):
    m = ViT(implementation=implementation, **config)
    loss = lambda params: optax.softmax_cross_entropy_with_integer_labels(
        m.apply({"params": params}, images).astype(jnp.float32), labels).mean()
    return jax.block_until_ready(jax.jit(jax.vmap(jax.value_and_grad(loss)))(params))

  error = relative_error(run("cudnn" if gpu else "jax"), run("reference"))
  return {"status": "ok" if error <= 5e-2 else "mismatch",
          "detail": f"relative error {error:.2g} (tolerance 5e-2)"}


def _engine_probe(ctx: Context, p: dict, gpu: bool) -> dict:
  """One chunk of the Boolean model in bf16, fused vs reference attention: the loss."""
  losses = []
  for attention in ("cudnn" if gpu else "jax", "reference"):
    preset = ctx.sizes.presets[p["engine_slot"]]
    group, _ = boolean_group(ctx, preset, compute_dtype="bfloat16", attention=attention)
    chunk, state, hparams, data, _ = compile_tiled(ctx, preset, group, 2, p["engine_steps"])
    _, out = chunk(state, hparams, data)
    losses.append(np.asarray(out["train_loss"]))
  error = relative_error(*losses)
  ok = np.all(np.isfinite(losses[0])) and error <= 5e-2
  text = lambda loss_K: "[" + ", ".join(f"{x:.4g}" for x in loss_K) + "]"
  return {"status": "ok" if ok else "mismatch",
          "detail": f"train loss {text(losses[0])} vs {text(losses[1])}, relative error "
                    f"{error:.2g} (tolerance 5e-2)"}


def run_probes(path: pathlib.Path, cases: list[str], sizes: Sizes) -> None:
  """The child process: each case's start, then its result, one JSON line each (flushed),
  so the parent knows which case a crash ended."""
  gpu = jax.default_backend() == "gpu"
  ctx = Context(sizes, Budget(1e9), None, None, "cudnn" if gpu else "jax",
                boolean=config_lib.load_experiment(str(ROOT / "experiments" /
                                                       "boolean_gotu.py")))
  with path.open("a") as log:
    def emit(record):
      log.write(json.dumps(record) + "\n")
      log.flush()
      os.fsync(log.fileno())
    for case in cases:
      emit({"case": case, "event": "start"})
      start = time.perf_counter()
      try:
        if case == "vit_model":
          result = _vit_probe(sizes.probe, gpu)
        elif case == "engine_chunk":
          result = _engine_probe(ctx, sizes.probe, gpu)
        else:
          result = _attention_probe(case, sizes.probe, gpu)
      except Exception as e:  # noqa: BLE001 (an error is a finding)
        result = {"status": "error", "detail": one_line(e)}
        if case == "odd_tokens_jax_alone" and "Unsupported sequence length" in str(e):
          result["status"] = "refused by jax (why mpx pads)"
      emit({"case": case, "event": "end", "seconds": time.perf_counter() - start} | result)


def read_probes(path: pathlib.Path) -> tuple[dict, str | None]:
  """(finished case → record, the case started but not finished or None)."""
  done, started = {}, None
  if path.exists():
    for line in path.read_text().splitlines():
      record = json.loads(line)
      if record["event"] == "start":
        started = record["case"]
      else:
        done[record["case"]], started = record, None
  return done, started


def refusals() -> list[str]:
  """What mpx refuses before any compile, each a one-line error naming the fix."""
  out = []
  q = jnp.zeros((1, 4, 1, 8), jnp.float32)
  cases = [("float32 q, k, v", (q, q, q))]
  if jax.default_backend() != "gpu":
    cases.append(("bf16 on this backend", (q.astype(jnp.bfloat16),) * 3))
  for what, args in cases:
    try:
      mpx.masked_attention(*args, implementation="cudnn")
    except ValueError as e:
      out.append(f"{what}: {e}")
  return out


def stage_cudnn(ctx: Context, st: dict) -> None:
  st["columns"] = ["case", "what", "result", "detail", "seconds"]
  gpu = jax.default_backend() == "gpu"
  fused = "cuDNN" if gpu else 'the XLA path (implementation="jax"; no GPU here)'
  st["facts"]["fused attention checked"] = fused
  for line in refusals():
    st["notes"].append(f"Refused before any compile: {line}")
  if ctx.args.no_cudnn:
    st["notes"].append("--no-cudnn: the probes were not run.")
    return
  path = ctx.report.out / "cudnn_probes.jsonl"
  path.unlink(missing_ok=True)
  remaining, rows = list(PROBES), {}

  def show():  # Finished cases into the report, in PROBES order.
    st["rows"] = [{"case": case, "what": PROBES[case], "result": rows[case].get("status"),
                   "detail": rows[case].get("detail", ""),
                   "seconds": fmt(rows[case].get("seconds"), ".1f")}
                  for case in PROBES if case in rows]
    ctx.report.write()

  while remaining:
    short = ctx.budget.short(ctx.sizes.stage_s["cudnn"] / 2)
    if short:
      rows |= {case: {"status": short} for case in remaining}
      st["partial"] = True
      break
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--cudnn-probes",
               str(path), "--cases", ",".join(remaining),
               f"--cache-dir={ctx.args.cache_dir}"] + (["--tiny"] if ctx.args.tiny else [])
    env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION=PROBE_MEMORY_FRACTION)
    with tempfile.TemporaryFile("w+") as stderr:
      child = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr,
                               text=True)
      code = None
      while code is None:  # Each finished case reaches the report while the rest run.
        try:
          code = child.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
          if ctx.budget.left() < 5:
            child.kill()
            child.wait()
            code = "timeout"
        done, started = read_probes(path)
        if set(done) - set(rows):
          rows |= done
          show()
      stderr.seek(0)
      tail = stderr.read().strip().splitlines()[-3:]
    remaining = [c for c in remaining if c not in done]
    if code == 0:
      break
    if code == "timeout":
      if started is not None:
        rows[started] = {"status": "timed out", "detail": "stopped at the budget"}
      rows |= {case: {"status": "skipped: budget"} for case in remaining if case != started}
      st["partial"] = True
      break
    exit_text = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    failure = f"probe process {exit_text}: {' / '.join(tail)}"
    if started is None:  # Ended before any case: nothing to gain from another try.
      rows |= {case: {"status": "error", "detail": failure} for case in remaining}
      break
    rows[started] = {"status": "crashed", "detail": failure}
    remaining.remove(started)
  show()
  st["notes"].append(
      "Each case runs jit(vmap(value_and_grad)) over 2 members, the program the sweep "
      "engine compiles, and compares the value and gradients with the reference attention "
      "on the same bf16 values in float32 (‖Δ‖ / ‖reference‖). The cases run in a child "
      "process, so a crash is recorded with the case it ended. Known upstream: jax "
      "requires an even token count to train cuDNN attention with a bias or mask (mpx "
      "pads an odd one with a key the mask hides); jax's cuDNN batching rules assumed "
      "every operand carries the vmapped axis, fixed upstream after jax 0.11.0, so "
      "causal_no_prior and unbatched_cotangent may fail on older versions.")


# --------------------------------------------------------------------------- 4. models


MODEL_COLUMNS = ["model", "members_per_call", "K", "step s (all members)", "images or "
                 "tokens /s", "per member", "compile s", "program memory",
                 "device peak so far", "note"]


def vit_row(ctx: Context, name: str, recipe: dict, members_per_call: int) -> dict:
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
  start = time.perf_counter()
  chunk = engine.make_train_chunk(group, sizes.vit_steps).lower(state, hparams, data).compile()
  compile_s = time.perf_counter() - start
  ctx.compile_s["vit"] = max(ctx.compile_s.get("vit", 0.0), compile_s)
  return timed_row(ctx, chunk, state, hparams, data, compile_s, 2, sizes.vit_steps,
                   sizes.vit_batch, {"model": name, "members_per_call": members_per_call})


def timed_row(ctx, chunk, state, hparams, data, compile_s, k, steps, items, row) -> dict:
  """Times a compiled chunk unless XLA says it does not fit; `items` per member-step."""
  program = memory.program_bytes(chunk)
  row |= {"K": k, "compile s": f"{compile_s:.1f}",
          "program memory": size_text(program.total if program else None)}
  limit, _ = memory_limit()
  if program and limit and program.total > limit:
    return row | {"note": f"not run: needs {size_text(program.total)}, {size_text(limit)} "
                          "usable"}
  seconds = chunk_timing.time_chunk(chunk, state, hparams, data, ctx.sizes.repeats)
  step_s = seconds / (steps * ctx.sizes.repeats)
  stats = memory_stats()
  return row | {"step s (all members)": f"{step_s:.4g}",
                "images or tokens /s": f"{k * items / step_s:.4g}",
                "per member": f"{items / step_s:.4g}",
                "device peak so far": size_text(stats.get("peak_bytes_in_use"))
                if stats else "–"}


class GeneratedTokens:
  """The tokenizer interface the language Task reads: a vocabulary, one byte per token."""
  name = "generated"

  def __init__(self, vocab_size: int):
    self.vocab_size = vocab_size

  def byte_lengths(self) -> np.ndarray:
    return np.ones(self.vocab_size, np.int32)


def language_row(ctx: Context) -> dict:
  """The language preset's members (every scheme × seed) on generated tokens."""
  experiment = config_lib.load_experiment(str(ROOT / "experiments" / "language.py"))
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


def stage_models(ctx: Context, st: dict) -> None:
  st["columns"] = MODEL_COLUMNS
  recipes = {r["image_size"]: r for r in (vision_throughput.RECIPE_32,
                                          vision_throughput.RECIPE_224)}
  plan = [(f"ViT {size} px / patch {recipes[size]['patch_size']}", recipes[size], m)
          for size, m in ctx.sizes.vit_rows]
  for name, recipe, m in plan:
    short = ctx.budget.short(ctx.need("vit"))
    row = ({"model": name, "members_per_call": m, "note": short} if short else None)
    if row is None:
      try:
        row = vit_row(ctx, name, recipe, m)
      except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        row = {"model": name, "members_per_call": m, "note": f"failed: {one_line(e)}"}
    st["partial"] = st.get("partial", False) or "note" in row
    st["rows"].append(row)
    ctx.report.write()
  short = ctx.budget.short(ctx.need("language"))
  if short:
    row = {"model": f"language {ctx.sizes.language_preset}", "note": short}
  else:
    try:
      row = language_row(ctx)
    except Exception as e:  # noqa: BLE001
      traceback.print_exc()
      row = {"model": f"language {ctx.sizes.language_preset}", "note": f"failed: {one_line(e)}"}
  st["partial"] = st.get("partial", False) or "note" in row
  st["rows"].append(row)
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


# --------------------------------------------------------------------------- 5. ETA


def table_plan(ctx: Context, preset: str, overrides=()) -> list[dict]:
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


def rate_for(ctx: Context, preset: str, members: int) -> tuple[float | None, str]:
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


def train_2parity(ctx: Context, preset: str, overrides: list[str], seconds: float) -> dict:
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
  metrics = run_dir / "run" / report_lib.METRICS_FILE
  records = report_lib.read_metrics(run_dir / "run") if metrics.exists() else []
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


def stage_eta(ctx: Context, st: dict) -> None:
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
      f"{total:.0f} s = training + {len(plan)} × {fmt(compile_s, '.0f')} s compile; "
      f"{'fits' if fits else 'does not fit'} one {CALL_LIMIT_S} s call (evaluation, "
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
    st["notes"].append(f"2Parity default and mask to the end: failed: {one_line(e)}")
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


# --------------------------------------------------------------------------- main


STAGE_FUNCTIONS = {
    "environment": ("Environment and matmul peak", stage_environment),
    "sweep": ("Sweep throughput: the Boolean model", stage_sweep),
    "cudnn": ("cuDNN attention under the engine's jit(vmap)", stage_cudnn),
    "models": ("ViT-Tiny and the language model", stage_models),
    "eta": ("ETA of the Boolean paper table", stage_eta),
}


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="accelerator_check",
                      help="folder for accelerator_check.md / .json")
  parser.add_argument("--budget-s", type=float, default=300.0,
                      help="wall-clock budget from the start (default 300)")
  parser.add_argument("--tiny", action="store_true", help="every stage at toy sizes (CPU)")
  parser.add_argument("--stages", default=",".join(STAGES),
                      help=f"comma-separated subset of {','.join(STAGES)}")
  parser.add_argument("--no-cudnn", action="store_true",
                      help="skip the fused-attention row and probes (a rerun after a crash)")
  parser.add_argument("--cache-dir", default=DEFAULT_CACHE,
                      help="jax's persistent compilation cache, shared with the probe "
                           "process; a rerun compiles little ('' for none)")
  parser.add_argument("--cudnn-probes", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--cases", default=",".join(PROBES), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  unknown = set(args.stages.split(",")) - set(STAGES)
  if unknown:
    parser.error(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  budget = Budget(args.budget_s, START)
  if args.cache_dir:
    jax.config.update("jax_compilation_cache_dir", args.cache_dir)
  sizes = TINY if args.tiny else DEVICE
  if args.cudnn_probes:
    run_probes(pathlib.Path(args.cudnn_probes), args.cases.split(","), sizes)
    return 0
  command = "python benchmarks/accelerator_check.py " + " ".join(
      sys.argv[1:] if argv is None else argv)
  header = {"command": command.strip(), "budget_s": args.budget_s, "tiny": args.tiny,
            "started": datetime.datetime.now().isoformat(timespec="seconds")}
  report = Report(pathlib.Path(args.out), header, budget)
  ctx = Context(sizes, budget, report, args,
                "cudnn" if jax.default_backend() == "gpu" else "jax",
                boolean=config_lib.load_experiment(str(ROOT / "experiments" /
                                                       "boolean_gotu.py")))
  chosen = args.stages.split(",")
  for key in STAGES:
    if key not in chosen:
      continue
    title, function = STAGE_FUNCTIONS[key]
    st = report.stage(key, title)
    short = budget.short(sizes.stage_s[key]) if sizes.stage_s[key] else None
    if short:
      st["status"] = "skipped"
      st["notes"].append(f"Stage {short}.")
      report.write()
      continue
    start, cpu = time.perf_counter(), cpu_seconds()
    try:
      function(ctx, st)
      st["status"] = "partial" if st.pop("partial", False) else "done"
    except Exception as e:  # noqa: BLE001 (a failed stage must not lose the others)
      traceback.print_exc()
      st.pop("partial", None)
      st["status"] = "failed"
      st["notes"].append(f"Failed: {one_line(e)}")
    st["seconds"] = round(time.perf_counter() - start, 1)
    st["cpu_s"] = round(cpu_seconds() - cpu, 1)
    report.write()
    print(f"[{budget.used():.0f} s] {key}: {st['status']}", file=sys.stderr, flush=True)
  print(render(report.data))
  return 0


if __name__ == "__main__":
  sys.exit(main())
