"""mpx sweep vs the PyTorch reference vs the machine's matmul peak, side by side in one run.

    python benchmarks/run.py                    # both scales, K = 1, 4, 16 (see README for time)
    python benchmarks/run.py --scales quick --members 1 4 16 --steps 32
    python benchmarks/run.py --quick-check      # smoke run: seconds per row, no targets claimed
    python benchmarks/run.py --write            # also write RESULTS and docs/performance.md
    python benchmarks/run.py --settings --settings-args "--cpus 0,1" --write  # + the A/B

Rows: mpx's vmapped group (`engine.make_train_chunk`, K members in one program), a loop
of single-member jitted steps (quick scale: what a user without the member axis runs),
and `torch_reference.py` (members one after another). The model and data are the
Boolean GOTU experiment's (2Parity, mask scheme, epoch protocol, batch 256). Rates
exclude compilation, which is printed separately. Achieved FLOP/s = the model's matmul
FLOPs per member-step (`mpx.sweep.flops.transformer_matmul_flops`) × member-steps/s, against a
float32 matmul peak measured by jax in the same process, so the ratios hold on whatever
machine runs this; XLA's cost analysis of the compiled program is printed beside it, and
a row where the two differ by more than 2× is marked. `--settings` adds
`cpu_settings.py`'s interleaved A/B of XLA:CPU settings (each in its own process) to the
report. mpx's per-CPU XLA flags (`mpx.sweep.cpu_flags`) are applied when `chunk_timing`
is imported, as `mpx run` applies them; the report names them.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import platform
import re
import shlex
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import chunk_timing  # noqa: E402 (applies mpx's per-CPU XLA flags, as `mpx run` does)
from mpx.sweep import config as config_lib  # noqa: E402
from mpx.sweep import cpu_flags  # noqa: E402
from mpx.sweep import engine, flops, optim  # noqa: E402
from mpx.tasks.boolean import gotu as boolean_gotu  # noqa: E402
from mpx.tasks import boolean  # noqa: E402

try:  # PyTorch is optional (the `bench` extra): the A/B's and the reports' code runs without it.
  import torch_reference  # noqa: E402
except ModuleNotFoundError as missing:
  if missing.name != "torch":
    raise
  torch_reference = None
NO_TORCH = "PyTorch is not installed: pip install -e \".[bench]\""

RESULTS = ROOT / "experiments" / "results" / "benchmark_cpu.md"
PAGE = ROOT / "docs" / "performance.md"  # --write replaces its lines between these two:
BEGIN = "<!-- benchmarks/run.py --write: from here -->"
END = "<!-- benchmarks/run.py --write: to here -->"
EXPERIMENT = ROOT / "experiments" / "boolean_gotu.py"
STEPS = {"quick": 32, "paper": 4}  # Timed steps per chunk when --steps is not given.
# The CPU targets: mpx at least PyTorch's rate per member-step with one member and 1.2x
# it at the best K, at both scales; the paper step at 60% of the matmul peak; vmapping 16
# quick members 4x a loop of them.
TARGETS = {"quick_k1": 1.0, "paper_k1": 1.0, "quick_best": 1.2, "paper_best": 1.2,
           "paper_peak": 0.60, "quick_vmap_vs_loop": 4.0}
TARGET_LABELS = {"quick_k1": "quick: mpx (K = 1) / PyTorch, member-steps/s",
                 "paper_k1": "paper: mpx (K = 1) / PyTorch, member-steps/s",
                 "quick_best": "quick: mpx (best K) / PyTorch, member-steps/s",
                 "paper_best": "paper: mpx (best K) / PyTorch, member-steps/s",
                 "paper_peak": "paper: mpx achieved FLOP/s / matmul peak",
                 "quick_vmap_vs_loop": "quick: vmapped / loop at K = 16, per member"}


@dataclasses.dataclass
class Row:
  """One measured configuration; `model_gflop` (the model's matmuls) and `xla_gflop`
  (XLA's cost analysis) are per member-step."""
  scale: str
  impl: str
  members: int
  rate: float
  compile_s: float | None = None
  model_gflop: float | None = None
  xla_gflop: float | None = None
  note: str = ""  # Why a row has no rate (rate is then nan).

  def achieved(self) -> float | None:
    return (None if self.model_gflop is None or np.isnan(self.rate)
            else self.model_gflop * self.rate)


# --------------------------------------------------------------------------- machine


def cpu_model() -> str:
  try:
    text = pathlib.Path("/proc/cpuinfo").read_text()
  except OSError:
    return platform.processor() or platform.machine()
  match = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
  return match.group(1).strip() if match else platform.machine()


def machine_lines(when: str, at: str) -> list[str]:
  """The report's lines on the machine and software; `when` and `at`: date and commit."""
  import flax
  cores = len(os.sched_getaffinity(0))
  return [
      f"- CPU: {cpu_model()}; {cores} core(s) in this process's affinity "
      f"(machine: {os.cpu_count()}); {platform.system()} {platform.machine()}",
      f"- jax {jax.__version__} ({jax.default_backend()}, devices: "
      f"{', '.join(str(d) for d in jax.devices())}), flax {flax.__version__}",
      f"- {NO_TORCH}" if torch_reference is None else
      f"- torch {torch_reference.torch.__version__}, {torch_reference.num_threads()} thread(s)",
      f"- {cpu_flags.describe(chunk_timing.CPU_FLAGS_ADDED)}",
      f"- XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; "
      f"{when}; commit {at}",
  ]


def commit() -> str:
  """The checkout's commit, "+ changes" when tracked files differ from it: which code the
  figures measured."""
  git = lambda *a: subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True,
                                  text=True).stdout.strip()
  head = git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)"
  return head + (" + changes" if git("status", "--porcelain", "--untracked-files=no") else "")


# --------------------------------------------------------------------------- mpx


def experiment_config(scale: str, members: int):
  experiment = config_lib.load_experiment(str(EXPERIMENT))
  _, cfg = config_lib.make_config(experiment, scale)
  cfg = dataclasses.replace(cfg, tasks=("2parity",), schemes=("mask",), seeds=members)
  return experiment, cfg


def model_gflop(scale: str) -> float:
  """The model's matmul GFLOP per member-step at a scale: what achieved FLOP/s divide."""
  _, cfg = experiment_config(scale, 1)
  return flops.transformer_matmul_flops(cfg, boolean.get_task("2parity").n_bits + 1) / 1e9


def make_group(scale: str, members: int) -> engine.Group:
  experiment, cfg = experiment_config(scale, members)
  return experiment.build_groups(cfg)[0]


def torch_scale(scale: str) -> torch_reference.Scale:
  """The torch model's settings, checked against the experiment's preset."""
  experiment, cfg = experiment_config(scale, 1)
  learning_rate = (boolean_gotu.TASK_PROTOCOL["2parity"][0] if cfg.learning_rate is None
                   else cfg.learning_rate)
  ours = torch_reference.Scale(cfg.width, cfg.depth, cfg.num_heads, cfg.head_dim,
                               cfg.mlp_dim, learning_rate, cfg.weight_decay,
                               cfg.batch_size, cfg.mask_strength)
  if ours != torch_reference.SCALES[scale]:
    raise AssertionError(f"torch_reference.SCALES[{scale!r}] = "
                         f"{torch_reference.SCALES[scale]} differs from the preset: {ours}.")
  return ours


def check_param_counts(scale: str) -> int:
  """Asserts the torch and mpx models have the same number of parameters."""
  experiment, cfg = experiment_config(scale, 1)
  tokens = boolean.tokens(jnp.ones((1, torch_reference.N_BITS)))
  shapes = jax.eval_shape(boolean_gotu.make_model(cfg).init, jax.random.key(0), tokens)
  ours = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes["params"]))
  theirs = torch_reference.num_params(torch_reference.TokenTransformer(torch_scale(scale)))
  assert ours == theirs, f"{scale}: mpx has {ours:,} params, torch {theirs:,}"
  return ours


def available_gib() -> float:
  """MemAvailable of /proc/meminfo (inf where unknown)."""
  available = chunk_timing.host_memory_available()
  return float("inf") if available is None else available / 2 ** 30


def needed_gib(compiled) -> float:
  """Host memory a compiled program allocates beyond its arguments (which already exist)
  and the outputs it writes into donated ones: XLA's own estimate."""
  m = compiled.memory_analysis()
  if m is None:
    return 0.0
  return (m.temp_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes) / 2 ** 30


def _size(gib: float) -> str:
  return f"{gib:.1f} GiB" if gib >= 1 else f"{gib * 1024:.0f} MiB"


def compiled_chunk(scale: str, members: int, steps: int):
  """The benchmarked program, K members × `steps` steps compiled, with its inputs:
  `(chunk, state, hparams, data, compile seconds)`."""
  return chunk_timing.compile_chunk(make_group(scale, members), steps)


def time_vmapped(scale: str, members: int, steps: int, repeats: int) -> Row:
  """K members in one `jit(scan(vmap(step)))` chunk: one warm-up chunk, then `repeats`.

  XLA's cost analysis counts a scan's body once (checked: the same FLOPs for 1, 2 and 8
  steps per chunk), so its FLOPs / K are per member-step.
  """
  chunk, state, hparams, data, compile_s = compiled_chunk(scale, members, steps)
  xla = chunk_timing.xla_flops(chunk) / members / 1e9
  need, have = needed_gib(chunk), available_gib()
  if need > have:  # Skip rather than have the OOM killer end the whole run.
    return Row(scale, "mpx vmapped", members, float("nan"), compile_s, model_gflop(scale), xla,
               f"skipped: needs {_size(need)}, {_size(have)} available")
  seconds = chunk_timing.time_chunk(chunk, state, hparams, data, repeats)
  return Row(scale, "mpx vmapped", members, members * steps * repeats / seconds, compile_s,
             model_gflop(scale), xla, _size(need))


def time_loop(scale: str, members: int, steps: int) -> Row:
  """K members one after another, each `steps` calls of a jitted single-member step
  (state donated, dispatch asynchronous): the loop a user writes without the member axis."""
  group = make_group(scale, 1)
  num_examples = group.data.num_examples
  per_epoch = num_examples // group.batch_size
  first = lambda tree: engine.unstack(tree, 0)
  hparams = first(optim.stack_hparams([m.hparams for m in group.members]))
  data = {k: jnp.asarray(v) for k, v in group.data.arrays.items()}
  order_of = jax.jit(lambda raw_key, epoch: engine.epoch_order(
      jax.random.wrap_key_data(raw_key), epoch, num_examples))
  member_step = engine.make_member_step(group.task.loss, group.optim)

  def one_step(params, opt_state, key, alive, diverged, hparams, data, order, step):
    position = step % per_epoch
    idx = jax.lax.dynamic_slice_in_dim(order, position * group.batch_size, group.batch_size)
    batch = {name: array[idx] for name, array in data.items()}
    return member_step(params, opt_state, key, alive, diverged, hparams, batch, step)

  step_fn = jax.jit(one_step, donate_argnums=(0, 1))

  def fresh_member():
    """(params, opt_state, key, alive, diverged_step) of one un-stacked member."""
    s = engine.init_state(group)
    return first((s.params, s.opt_state, s.key, s.alive, s.diverged_step))

  def call(member, order, step):
    params, opt_state, key, alive, diverged = member
    *new, scalars = step_fn(params, opt_state, key, alive, diverged, hparams, data, order,
                            jnp.int32(step))
    return (new[0], new[1], key, new[2], new[3]), scalars["loss"]

  members_state = [fresh_member() for _ in range(members)]
  order = order_of(members_state[0][2], 0)
  start = time.perf_counter()
  params, opt_state, key, alive, diverged = fresh_member()
  step_fn = step_fn.lower(params, opt_state, key, alive, diverged, hparams, data, order,
                          jnp.int32(0)).compile()
  compile_s = time.perf_counter() - start
  jax.block_until_ready(call(fresh_member(), order, 0))  # Warm-up.

  start = time.perf_counter()
  for member in members_state:
    for step in range(steps):
      if step % per_epoch == 0:
        order = order_of(member[2], step // per_epoch)
      member, loss = call(member, order, step)
  jax.block_until_ready(loss)
  seconds = time.perf_counter() - start
  return Row(scale, "mpx loop of jitted steps", members, members * steps / seconds,
             compile_s, model_gflop(scale), chunk_timing.xla_flops(step_fn) / 1e9)


def time_torch(scale: str, steps: int, seeds: int) -> Row:
  rate = torch_reference.member_steps_per_second(torch_scale(scale), steps, seeds)
  label = f"PyTorch reference, {seeds} seed{'s' if seeds > 1 else ''} in turn"
  return Row(scale, label, 1, rate, None, model_gflop(scale))


# --------------------------------------------------------------------------- report


def rows_table(rows: list[Row], peak: float) -> list[str]:
  lines = ["| scale | implementation | K | member-steps/s | compile (s) | GFLOP / member-step "
           "(model) | GFLOP / member-step (XLA) | achieved GFLOP/s | of matmul peak | memory "
           "|", "|---" * 10 + "|"]
  for r in rows:
    achieved = r.achieved()
    fraction = None if achieved is None else achieved / peak
    rate = r.note if np.isnan(r.rate) else f"{r.rate:.3f}"
    xla = chunk_timing.fmt(r.xla_gflop, ".3g")
    if mark := chunk_timing.flops_mark(r.model_gflop, r.xla_gflop):
      xla += f" {mark}"
    lines.append(f"| {r.scale} | {r.impl} | {r.members} | {rate} | "
                 f"{chunk_timing.fmt(r.compile_s, '.1f')} | "
                 f"{chunk_timing.fmt(r.model_gflop, '.4g')} | {xla} | "
                 f"{chunk_timing.fmt(achieved, '.1f')} | "
                 f"{chunk_timing.fmt(fraction, '.0%')} | {'' if np.isnan(r.rate) else r.note} |")
  return lines


def _find(rows, scale, impl, members=None) -> list[Row]:
  """Measured rows (skipped ones left out) of a scale, implementation and K."""
  return [r for r in rows if r.scale == scale and r.impl.startswith(impl)
          and (members is None or r.members == members) and not np.isnan(r.rate)]


def ratios(rows: list[Row], peak: float) -> list[tuple[str, float | None, float | None]]:
  """(what, measured ratio, target or None) for every ratio the rows allow, plus each
  target of the performance issue (measured None where its rows were not run)."""
  out, targets = [], dict(TARGETS)
  for scale in dict.fromkeys(r.scale for r in rows):
    vmapped, torch_rows = _find(rows, scale, "mpx vmapped"), _find(rows, scale, "PyTorch")
    if vmapped and torch_rows:
      one = _find(rows, scale, "mpx vmapped", 1)
      if one:
        out.append((f"{scale}: mpx (K = 1) / PyTorch, member-steps/s",
                    one[0].rate / torch_rows[0].rate, targets.pop(f"{scale}_k1", None)))
      best = max(vmapped, key=lambda r: r.rate)
      out.append((f"{scale}: mpx (best K = {best.members}) / PyTorch, member-steps/s",
                  best.rate / torch_rows[0].rate, targets.pop(f"{scale}_best", None)))
    if vmapped:
      best = max(vmapped, key=lambda r: r.achieved() or 0.0)
      out.append((f"{scale}: mpx achieved FLOP/s / matmul peak (best K = {best.members})",
                  (best.achieved() or 0.0) / peak, targets.pop(f"{scale}_peak", None)))
    loop = _find(rows, scale, "mpx loop")
    for k in sorted({r.members for r in loop}):
      same_k = _find(rows, scale, "mpx vmapped", k)
      if same_k:
        target = scale == "quick" and k == 16
        out.append((f"{scale}: vmapped / loop at K = {k}, per member",
                    same_k[0].rate / _find(rows, scale, "mpx loop", k)[0].rate,
                    targets.pop("quick_vmap_vs_loop") if target else None))
  return out + [(TARGET_LABELS[name], None, value) for name, value in targets.items()]


def ratios_table(items) -> list[str]:
  lines = ["| ratio | measured | target | |", "|---|---|---|---|"]
  for what, value, target in items:
    spec = ".0%" if "peak" in what else ".2f"
    unit = "" if "peak" in what else "x"
    verdict = ("not run" if value is None else "met" if value >= target else "**missed**"
               ) if target is not None else ""
    measured = chunk_timing.fmt(value, spec) + (unit if value is not None else "")
    wanted = chunk_timing.fmt(target, spec, "") + (unit if target is not None else "")
    lines.append(f"| {what} | {measured} | {wanted} | {verdict} |")
  return lines


SETTINGS_HEADING = "## XLA:CPU settings"
SETTINGS_INTRO = "XLA:CPU settings against the defaults, interleaved (`--settings`):"


def report(rows, peaks, torch_peaks, machine, params, command, smoke: bool,
           settings: str | None = None) -> str:
  peak = max(peaks.values())
  peak_text = ", ".join(f"{n}³ {g:.1f}" for n, g in peaks.items())
  torch_text = ", ".join(f"{n}³ {g:.1f}" for n, g in torch_peaks.items())
  lines = [f"`{command}`", ""]
  if smoke:
    lines += ["**Smoke run (`--quick-check`): a few steps per row; the ratios are not "
              "measurements of the targets.**", ""]
  lines += machine + [
      f"- float32 matmul peak (jnp.dot, best of several): {peak_text} GFLOP/s; "
      f"peak = {peak:.1f}; for reference torch.mm reaches {torch_text} GFLOP/s",
      "- params (mpx = torch, asserted): " + ", ".join(f"{s} {n:,}" for s, n in params.items()),
      "", *rows_table(rows, peak), "",
      "GFLOP / member-step (model): the model's matmuls, forward and backward "
      "(`mpx.sweep.flops.transformer_matmul_flops`), from which achieved GFLOP/s is computed; the PyTorch "
      "row trains the same model. (XLA): XLA's cost analysis of the compiled program (a "
      "scan's body counts once) / K, beside it as a check; ⚠ marks a count off by more "
      f"than {chunk_timing.FLOPS_DISAGREE:g}×. Rates exclude compilation; PyTorch excludes "
      "each member's first step. Memory: XLA's estimate of the compiled chunk's host "
      "memory.", "",
      *ratios_table(ratios(rows, peak))]
  if settings is not None:
    lines += ["", SETTINGS_HEADING, "", settings]
  return "\n".join(lines)


def machine_name() -> str:
  return f"{cpu_model()}, {len(os.sched_getaffinity(0))} core(s)"


def performance_block(rows, peaks, torch_peaks, machine: str, when: str, at: str,
                      command: str, settings: list[str] | None) -> str:
  """What docs/performance.md states of a run on `machine` (`machine_name()`): rates,
  ratios, each target met or missed, and the settings A/B's verdicts (`settings`: its
  summary lines)."""
  peak = max(peaks.values())
  lines = [f"Measured on {machine}, {when[:10]}, commit {at}, by "
           f"`{command}` ([experiments/results/benchmark_cpu.md]"
           "(../experiments/results/benchmark_cpu.md), the whole report):", "",
           "| scale | K | mpx member-steps/s | PyTorch | mpx / PyTorch | of jax's matmul peak |",
           "|---|---|---|---|---|---|"]
  for r in rows:
    torch_rows = _find(rows, r.scale, "PyTorch")
    if not r.impl.startswith("mpx vmapped") or not torch_rows:
      continue
    theirs, achieved = torch_rows[0].rate, r.achieved()
    rate, ratio = ((r.note, "–") if np.isnan(r.rate)
                   else (f"{r.rate:.3f}", f"{r.rate / theirs:.2f}×"))
    lines.append(f"| {r.scale} | {r.members} | {rate} | {theirs:.3f} | {ratio} | "
                 f"{chunk_timing.fmt(None if achieved is None else achieved / peak, '.0%')} |")
  torch_share = ", ".join(
      f"{r.scale} {r.achieved() / peak:.0%}" for r in rows
      if r.impl.startswith("PyTorch") and r.achieved() is not None)
  lines += ["", f"jax's float32 matmul peak: {peak:.1f} GFLOP/s (torch.mm: "
            f"{max(torch_peaks.values()):.1f}); PyTorch's step reaches {torch_share} of "
            "jax's peak. Achieved FLOP/s count the model's matmuls "
            "(`mpx.sweep.flops.transformer_matmul_flops`) × member-steps/s.", "", "Targets:", ""]
  for what, value, target in ratios(rows, peak):
    if target is None:
      continue
    spec, unit = (".0%", "") if "peak" in what else (".2f", "×")
    verdict = "not run" if value is None else "met" if value >= target else "**missed**"
    measured = "–" if value is None else format(value, spec) + unit
    lines.append(f"- {what} ≥ {format(target, spec)}{unit}: {measured}, {verdict}")
  lines += ["", SETTINGS_INTRO if settings
            else "XLA:CPU settings: not measured in this run (`--settings` measures them).",
            *([""] + settings if settings else [])]
  return "\n".join(lines)


def replace_block(page: str, block: str) -> str:
  """`page` with the lines between its BEGIN and END markers replaced by `block`."""
  if page.count(BEGIN) != 1 or page.count(END) != 1:
    raise ValueError(f"{PAGE.relative_to(ROOT)} must hold the lines {BEGIN} and {END} once "
                     "each, around the part that --write replaces; put them back.")
  head, rest = page.split(BEGIN)
  return head + BEGIN + "\n" + block + "\n" + END + rest.split(END)[1]


# report()'s machine lines ("- CPU: NAME; ...", "...; WHEN; commit ABC1234 + changes"),
# and the first line of a section carried over before.
_CPU = re.compile(r"^- CPU: ([^;\n]+)", re.M)
_STAMP = re.compile(r"; (\d{4}-\d\d-\d\dT\d\d:\d\d); commit (.+)$", re.M)
_CARRIED = re.compile(r"From (the run of [^\n]+?); this run did not[^\n]*\n\n")


def earlier_settings(results_text: str, page_text: str) -> tuple[str | None, list | None]:
  """The last settings A/B of the results file and of the page's block, marked with the
  run (when, commit, CPU) that measured it: a `--write` without `--settings` keeps what
  the A/B (an hour or more) found instead of dropping it. (None, None) where there is
  none."""
  if SETTINGS_HEADING not in results_text or SETTINGS_INTRO not in page_text:
    return None, None
  section = results_text.split(SETTINGS_HEADING, 1)[1].strip()
  carried = _CARRIED.match(section)  # Carried before: keep its origin, not this file's.
  if carried:
    origin, section = carried[1], section[carried.end():]
  else:
    stamp, cpu = _STAMP.search(results_text), _CPU.search(results_text)
    origin = (f"the run of {stamp[1]} at commit {stamp[2]}" if stamp else "an earlier run") + (
        f" on {cpu[1]}" if cpu else "")
  block = page_text.split(SETTINGS_INTRO, 1)[1].split(END, 1)[0]
  lines = [line for line in block.splitlines()
           if line.startswith("- ") and not line.startswith("- (from ")]
  return (f"From {origin}; this run did not measure them (`--settings`).\n\n{section}",
          [f"- (from {origin}; not measured again since)"] + lines)


def write_results(text: str, block: str, results: pathlib.Path = RESULTS,
                  page: pathlib.Path = PAGE) -> None:
  """The report as the results file (replaced whole) and its summary in
  docs/performance.md (between the markers)."""
  updated = replace_block(page.read_text(), block)  # Checked before either file changes.
  results.write_text("# `benchmarks/run.py`: mpx against PyTorch and the matmul peak (CPU)\n\n"
                     + text + "\n")
  page.write_text(updated)


# --------------------------------------------------------------------------- main


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scales", nargs="+", choices=tuple(STEPS), default=["quick", "paper"])
  parser.add_argument("--members", type=int, nargs="+", default=[1, 4, 16],
                      help="K, members per vmapped group")
  parser.add_argument("--steps", type=int, default=None,
                      help=f"timed steps per chunk (default per scale: {STEPS})")
  parser.add_argument("--repeats", type=int, default=2, help="timed chunks after a warm-up one")
  parser.add_argument("--torch-seeds", type=int, default=2)
  parser.add_argument("--loop-members", type=int, default=None,
                      help="K of the quick-scale loop baseline (default: the largest K)")
  parser.add_argument("--matmul-sizes", type=int, nargs="+", default=[1024, 2048])
  parser.add_argument("--quick-check", action="store_true",
                      help="smoke run: quick scale, K = 1 and 2, 2 steps, 1 torch seed")
  parser.add_argument("--settings", action="store_true",
                      help="also run the interleaved A/B of XLA:CPU settings "
                           "(benchmarks/cpu_settings.py); its table joins the report")
  parser.add_argument("--settings-args", default="", metavar="ARGS",
                      help="cpu_settings.py's options, e.g. '--cpus 0,1 --rounds 3'")
  parser.add_argument("--write", action="store_true",
                      help=f"write the report to {RESULTS.relative_to(ROOT)} and its "
                           f"summary to {PAGE.relative_to(ROOT)}")
  args = parser.parse_args(argv)
  if args.write and args.quick_check:
    parser.error("--write records a measurement; a --quick-check run is not one")
  if args.quick_check:
    args.scales, args.members, args.steps, args.repeats = ["quick"], [1, 2], 2, 1
    args.torch_seeds, args.loop_members = 1, 2
  return args


def main(argv=None):
  args = parse_args(argv)
  if torch_reference is None:
    sys.exit(f"benchmarks/run.py compares mpx with PyTorch in the same run; {NO_TORCH}")
  command = "python benchmarks/run.py " + shlex.join(sys.argv[1:] if argv is None else argv)
  when, at = datetime.datetime.now().isoformat(timespec="minutes"), commit()
  machine = machine_lines(when, at)
  print("\n".join(machine), flush=True)
  params = {s: check_param_counts(s) for s in ("quick", "paper")}
  before, after = torch_reference.loss_decreases(torch_scale("quick"))
  assert after < before, f"a torch step did not lower the loss ({before} -> {after})"
  print(f"params (mpx = torch): {params}; torch loss on one batch {before:.4f} -> {after:.4f}")
  peaks = chunk_timing.matmul_peak(tuple(args.matmul_sizes),
                                   repeats=3 if args.quick_check else 5)
  torch_peaks = {n: torch_reference.matmul_gflops(n) for n in args.matmul_sizes}
  print(f"matmul GFLOP/s: jax {peaks}, torch {torch_peaks}", flush=True)

  settings = settings_lines = None
  if args.settings:  # First, while this process holds little memory (paper K = 16: 17 GiB).
    import cpu_settings
    plan = cpu_settings.make_plan(cpu_settings.parse_args(
        shlex.split(args.settings_args) + (["--tiny"] if args.quick_check else [])),
        chunk_timing.CPU_FLAGS_ADDED)
    results = cpu_settings.run_ab(plan, lambda line: print(line, flush=True))
    settings, settings_lines = cpu_settings.report(plan, results), cpu_settings.summary(
        plan, results)

  if args.write and settings is None:
    settings, settings_lines = earlier_settings(
        RESULTS.read_text() if RESULTS.exists() else "", PAGE.read_text())

  rows = []
  for scale in args.scales:
    steps = args.steps or STEPS[scale]
    for k in args.members:
      rows.append(time_vmapped(scale, k, steps, args.repeats))
      print(rows[-1], flush=True)
    if scale == "quick":
      rows.append(time_loop(scale, args.loop_members or max(args.members), steps))
      print(rows[-1], flush=True)
    rows.append(time_torch(scale, steps * args.repeats, args.torch_seeds))
    print(rows[-1], flush=True)

  text = report(rows, peaks, torch_peaks, machine, params, command.strip(), args.quick_check,
                settings)
  print("\n" + text)
  if args.write:
    write_results(text, performance_block(rows, peaks, torch_peaks, machine_name(), when,
                                          at, command.strip(), settings_lines))
    print(f"\nwrote {RESULTS.relative_to(ROOT)} and {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
  main()
