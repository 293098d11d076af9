"""`mpx compile`: a run's own programs compiled for a TPU topology or a GPU model, on any
machine, so that a pod or a GPU job is checked before it is paid for.

It builds the groups `mpx run` would build for the same arguments (`run.build_run_groups`:
members, groups, traced values, chunk length, step variant, dtype), places them as the run
would on the target's devices (the member axis sharded, padding included), and lowers and
compiles each group's training chunk and its evaluation with XLA's compiler for that
target. It builds shapes, not state: one member's param shapes (`jax.eval_shape` of its
init) widened to the group's rows, so a sweep of 200,000 members is checked as fast as one
of ten.

What it reports is XLA's: memory per device, FLOPs and bytes where the backend counts
them, the program's fusions, collectives and custom calls, the compile time. The step
time it gives is a roofline estimate from the chips' published peaks (`targets.CHIPS`),
never a measurement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
import tempfile
import time
import types
from concurrent import futures
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mpx.sweep import config as config_lib
from mpx.sweep import engine
from mpx.sweep import evaluate as evaluate_lib
from mpx.sweep import flops as flops_lib
from mpx.sweep import memory
from mpx.sweep import optim
from mpx.sweep import run as run_lib
from mpx.sweep import stages
from mpx.sweep import targets as targets_lib
from mpx.sweep.data import DeviceData, Stream

# `mpx compile`'s exit status when a group does not fit its target's memory.
DOES_NOT_FIT_EXIT_CODE = 2
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
               "collective-permute")
# XLA's log lines that say a program compiled without the device differs from the one the
# device would compile, and what each means for the run.
DEVICELESS_NOTES = {
    "Missing deviceless CUB scratch size data for sort":
        "a sort (the epoch's permutation) takes XLA's fallback algorithm without the "
        "device: slower on the GPU than the device's own compile",
}
GPU_NOTE = ("compiled without the device, XLA:GPU autotunes nothing: its kernel choices "
            "(GEMM algorithms, fusions it times) may differ from the device's own compile")


@dataclasses.dataclass(frozen=True)
class Program:
  """One compiled program for the target: what XLA says of it."""
  name: str
  seconds: float
  memory: memory.Program | None
  flops: float | None  # XLA's cost analysis; a loop's body counts once
  bytes_accessed: float | None
  fusions: int
  collectives: int
  custom_calls: int
  loop_kernels: int | None = None  # kernels per iteration of its loop (`loop_body_stats`)
  loop_bytes: int | None = None  # their operands and outputs, bytes per iteration
  error: str | None = None  # the compiler refused it (a TPU program too large for HBM)
  needed: int | None = None  # bytes per device the refusal names


@dataclasses.dataclass(frozen=True)
class GroupReport:
  """A group compiled for a target."""
  group: str
  target: targets_lib.Target
  members: int
  rows: int  # members with padding: a multiple of the devices
  members_per_call: int | None
  steps: int
  chunk_steps: int
  unroll: int  # steps per iteration of the chunk's loop (the step variant's scan unroll)
  compute_dtype: str
  model_flops: int  # per member-step: the step's matmuls
  state_per_member: int  # bytes of one member's state (params, optimizer, key, ...)
  train: Program
  evaluation: Program
  notes: tuple[str, ...] = ()  # where XLA said the program differs from the device's own

  @property
  def per_device(self) -> int:
    return self.rows // self.target.devices

  def _phases(self) -> list[tuple[int, int]]:
    """(bytes per device, bytes one more member per device adds) while training (the
    chunk's program) and while evaluating (the state beside the evaluation's program):
    a member adds its state, and its share of the temporaries and outputs where the
    members are vmapped at once (a slice's otherwise). A program the compiler refused
    counts the need its refusal names, all of it per member (an upper bound)."""
    m = max(self.per_device, 1)
    vmapped = self.members_per_call is None

    def phase(program: Program, resident: int) -> tuple[int, int]:
      if program.memory is None:
        return (program.needed or 0), (program.needed or 0) // m
      q = program.memory
      total = q.total if resident is None else resident + q.total - q.arguments
      scaling = q.temporaries + (0 if resident is None else q.outputs)
      return total, self.state_per_member + (scaling // m if vmapped else 0)

    train = phase(self.train, None)
    resident = (self.train.memory.arguments if self.train.memory is not None
                else self.state_per_member * m)
    return [train, phase(self.evaluation, resident)]

  @property
  def need(self) -> int:
    """Bytes per device: training (the chunk's state, data, temporaries, outputs and
    code) or evaluating (the state beside the evaluation's program), the larger."""
    return max(total for total, _ in self._phases())

  @property
  def fits(self) -> bool:
    return self.train.error is None and self.evaluation.error is None and (
        self.need <= self.target.usable_memory)

  @property
  def per_member(self) -> int:
    """Bytes one more member per device adds, in the phase that needs the most."""
    return max(self._phases())[1]

  @property
  def members_that_fit(self) -> int:
    """Members per device that fit the usable memory in both phases, from this compile
    (linear in the members: an estimate that a compile at that count checks)."""
    m = self.per_device
    return max(min((self.target.usable_memory - (total - per * m)) // max(per, 1)
                   for total, per in self._phases()), 0)

  @property
  def peak(self) -> float:
    chip = self.target.chip
    return chip.peak_flops_bf16 if self.compute_dtype == "bfloat16" else chip.peak_flops

  @property
  def step_bytes(self) -> tuple[float, str]:
    """Bytes one device moves per step: XLA's count of the chunk (its loop body, of
    `unroll` steps), else the step's kernels' operands and outputs in its HLO (each read
    whole once)."""
    if self.train.bytes_accessed:
      return self.train.bytes_accessed / self.unroll, "XLA's bytes accessed"
    if self.train.loop_bytes:
      return self.train.loop_bytes / self.unroll, "the step's kernels' operands and outputs"
    return 2.0 * self.state_per_member * self.per_device, "≥ the state read and written"

  @property
  def step_seconds(self) -> float:
    """The roofline estimate of one step (every member on the device): the larger of
    the model's FLOPs over the chip's peak and the bytes over its bandwidth."""
    compute = self.model_flops * self.per_device / self.peak
    return max(compute, self.step_bytes[0] / self.target.chip.bandwidth)


def _device_mesh(devices) -> Mesh:
  return Mesh(np.array(devices), (engine.MEMBER_AXIS,))


def _abstract(x, sharding) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)


def _widened(tree, rows: int, split, replicated):
  """Leaves with a leading member axis of 1 → `rows`, sharded over the members; scalars
  replicated."""
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct((rows,) + x.shape[1:], x.dtype, sharding=split)
      if x.ndim else jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated), tree)


def member_params(group: engine.Group):
  """One member's param shapes: its init traced on shapes (nothing is computed); where
  a scheme's init runs host code that needs values (an SVD in numpy), that member's init
  run once. Every member has this structure (the run checks it)."""
  member = group.members[0]
  try:
    return jax.eval_shape(lambda: group.task.init(member))
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
          jax.errors.TracerBoolConversionError, jax.errors.TracerIntegerConversionError):
    return jax.eval_shape(lambda p: p, group.task.init(member))


def abstract_state(group: engine.Group, params, rows: int, mesh: Mesh) -> engine.SweepState:
  """The group's `SweepState` on `rows` member rows as shapes sharded over `mesh`: what
  `engine.place(group, init_state(group), mesh)` holds, without making it."""
  data = group.data
  epoch_size = (data.num_examples if isinstance(data, DeviceData)
                and data.sampling == "epoch" else None)
  hparams = optim.stack_hparams([group.members[0].hparams])
  keys = jax.ShapeDtypeStruct((1, 2), jnp.uint32)
  one = jax.eval_shape(engine._initial_state(group.optim, epoch_size).__wrapped__, [params],
                       hparams, keys)
  if group.probe is not None:
    one = one._replace(initial=one.params)
  split = NamedSharding(mesh, PartitionSpec(engine.MEMBER_AXIS))
  return _widened(one, rows, split, NamedSharding(mesh, PartitionSpec()))


def _state_bytes(state: engine.SweepState, rows: int) -> int:
  """Bytes of one member's rows of the state."""
  return sum(math.prod(x.shape[1:]) * np.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(state) if x.ndim and x.shape[0] == rows)


def abstract_data(group: engine.Group, chunk_steps: int, rows: int, mesh: Mesh):
  """The chunk's data argument as shapes: the device arrays (shared: replicated;
  per member: sharded), or one stream chunk `[T, (S,) B, ...]` (replicated), its shapes
  from the stream's first batch."""
  replicated = NamedSharding(mesh, PartitionSpec())
  data = group.data
  if isinstance(data, Stream):
    batch = next(iter(data.batches(data.stream_seeds[0], 0)))
    lead = (chunk_steps, data.num_streams) if data.stacked else (chunk_steps,)
    return {k: jax.ShapeDtypeStruct(lead + np.shape(v), np.asarray(v).dtype,
                                    sharding=replicated) for k, v in batch.items()}
  if data.per_member:
    split = NamedSharding(mesh, PartitionSpec(engine.MEMBER_AXIS))
    return {k: jax.ShapeDtypeStruct((rows,) + np.shape(v)[1:], np.asarray(v).dtype,
                                    sharding=split) for k, v in data.arrays.items()}
  return {k: _abstract(np.asarray(v), replicated) for k, v in data.arrays.items()}


def _one_batch(group: engine.Group, data) -> dict:
  """One member's training batch as shapes (for the model's FLOP count)."""
  if isinstance(group.data, Stream):
    drop = 2 if group.data.stacked else 1
    return {k: jax.ShapeDtypeStruct(v.shape[drop:], v.dtype) for k, v in data.items()}
  drop = 1 if group.data.per_member else 0
  return {k: jax.ShapeDtypeStruct((group.batch_size,) + v.shape[drop + 1:], v.dtype)
          for k, v in data.items()}


@contextlib.contextmanager
def _stderr_captured():
  """XLA's C++ log lines (fd 2) during a compile, collected and passed on."""
  lines: list[str] = []
  with tempfile.TemporaryFile(mode="w+b") as captured:
    saved = os.dup(2)
    os.dup2(captured.fileno(), 2)
    try:
      yield lines
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = captured.read().decode(errors="replace")
      os.write(2, text.encode())
      lines.extend(text.splitlines())


_HBM_NEEDED = re.compile(r"\(([\d.]+)([KMGT])\) exceeds available HBM")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def compile_program(name: str, lowered) -> Program:
  """Compiles `lowered` (a program lowered on shapes with the target's shardings) and reads
  XLA's analyses; a compile the target's compiler refuses (a TPU program too large for
  HBM) is reported, not raised."""
  start = time.perf_counter()
  try:
    compiled = lowered.compile()
  except Exception as e:  # XLA's refusal: RESOURCE_EXHAUSTED and kin, as jax raises them.
    message = str(e)
    if "RESOURCE_EXHAUSTED" not in message and "exceeds available" not in message:
      raise
    found = _HBM_NEEDED.search(message)
    needed = int(float(found.group(1)) * _UNITS[found.group(2)]) if found else None
    first = next((line for line in message.splitlines() if "HBM" in line), message)
    return Program(name, time.perf_counter() - start, None, None, None, 0, 0, 0,
                   error=first.strip()[:300], needed=needed)
  seconds = time.perf_counter() - start
  cost = _cost(compiled)
  text = compiled.as_text() or ""
  loop = loop_body_stats(text) or (None, None)
  return Program(
      name, seconds, memory.program_bytes(compiled), cost.get("flops"),
      cost.get("bytes accessed"), len(re.findall(r"\sfusion\(", text)),
      sum(len(re.findall(rf"\s{op}(-start)?\(", text)) for op in COLLECTIVES),
      len(re.findall(r"\scustom-call\(", text)), *loop)


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
                "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_SHAPE = re.compile(r"\b(pred|[sufb]f?\d+)\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
# Instructions of a loop body that run as kernels of their own (or a library call).
_KERNELS = ("fusion", "custom-call", "copy", "sort", "scatter", "gather", "dot",
            "convolution", "reduce", "conditional") + COLLECTIVES


def _type_bytes(type_text: str) -> int:
  return sum(math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES.get(dtype, 4)
             for dtype, dims in _SHAPE.findall(type_text))


def _computations(text: str) -> dict[str, list[str]]:
  """An HLO module's computations: name → its instruction lines."""
  found, name = {}, None
  for line in text.splitlines():
    head = re.match(r"^(?:ENTRY )?(%[\w.\-]+) .*\{\s*$", line)
    if head:
      name = head.group(1)
      found[name] = []
    elif name is not None and line.strip() == "}":
      name = None
    elif name is not None:
      found[name].append(line)
  return found


def loop_body_stats(text: str) -> tuple[int, int] | None:
  """(kernels, bytes) of one iteration of the program's largest while loop (the chunk's
  step), from its optimised HLO: each kernel instruction (fusion, library call, copy,
  collective...; a conditional counts once, not its branches) reads its operands and
  writes its outputs once. None where the program has no loop."""
  computations = _computations(text)
  bodies = re.findall(r"while\(.*?body=(%[\w.\-]+)", text)
  if not bodies:
    return None
  body = max((computations.get(b, []) for b in bodies), key=len)
  types, kernels, moved = {}, 0, 0
  for line in body:
    match = _INSTRUCTION.match(line)
    if not match:
      continue
    name, type_text, op, rest = match.groups()
    types[name] = type_text
    if op.removesuffix("-start") in _KERNELS:
      operands = re.findall(r"(%[\w.\-]+)", rest.split("),", 1)[0])
      kernels += 1
      moved += _type_bytes(type_text) + sum(_type_bytes(types.get(o, "")) for o in operands)
  return kernels, moved


def _cost(compiled) -> dict:
  """XLA's cost analysis as one dict ({} where the backend gives none)."""
  try:
    cost = compiled.cost_analysis()
  except (NotImplementedError, RuntimeError):
    return {}
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  return dict(cost or {})


def compile_group(group: engine.Group, cfg, target: targets_lib.Target, devices, *,
                  evaluation: bool = True, pool: futures.Executor | None = None
                  ) -> Callable[[], GroupReport]:
  """Lowers the group's training chunk and (unless `evaluation=False`) evaluation for
  `target` and compiles them, in `pool` where given (XLA compiles outside the GIL: the
  groups' programs compile side by side); returns the function that waits for them and
  gives the report."""
  mesh = _device_mesh(devices)
  rows = engine.padded_size(len(group.members), mesh)
  params = member_params(group)
  state = abstract_state(group, params, rows, mesh)
  split = NamedSharding(mesh, PartitionSpec(engine.MEMBER_AXIS))
  hparams = _widened(optim.stack_hparams([group.members[0].hparams]), rows, split, None)
  data = abstract_data(group, cfg.chunk_steps, rows, mesh)
  chunk = engine.make_train_chunk(group, cfg.chunk_steps, platform=target.platform)
  options = group.chunk_options
  if isinstance(options, str):
    options = engine.chunk_options(options, target.platform)
  submit = pool.submit if pool is not None else _done
  train = submit(compile_program, f"training chunk ({cfg.chunk_steps} steps)",
                 chunk.lower(state, hparams, data))
  eval_name = f"evaluation (batch {group.eval_data.batch_size})"
  if evaluation:
    replicated = NamedSharding(mesh, PartitionSpec())
    batch = {k: _abstract(np.asarray(v), replicated)
             for k, v in next(group.eval_data.batches()).items()}
    evaluate = evaluate_lib._eval_fn(group.task.eval_step, group.members_per_call)
    evaluated = submit(compile_program, eval_name, evaluate.lower(state.params, batch))
  else:
    evaluated = _done(Program, eval_name + ", not compiled", 0.0, None, None, None, 0, 0, 0)
  report = functools.partial(
      GroupReport, group=group.name, target=target, members=len(group.members), rows=rows,
      members_per_call=group.members_per_call, steps=group.steps,
      chunk_steps=cfg.chunk_steps, unroll=options.scan_unroll,
      compute_dtype=getattr(cfg, "compute_dtype", "float32"),
      model_flops=flops_lib.step_flops(group.task.loss, params, _one_batch(group, data)),
      state_per_member=_state_bytes(state, rows))
  return lambda: report(train=train.result(), evaluation=evaluated.result())


def _done(fn, *args) -> futures.Future:
  """`fn(*args)` computed now, as a finished future."""
  done = futures.Future()
  done.set_result(fn(*args))
  return done


def compile_experiment(experiment: types.ModuleType, target: str, *, preset: str | None = None,
                       overrides=(), evaluation: bool = True, jobs: int | None = None
                       ) -> tuple[str, list[GroupReport]]:
  """`mpx compile`: (preset, one report per group) of the run `mpx run` would start with
  these arguments, compiled for `target` (the training chunks alone with
  `evaluation=False`), `jobs` programs at a time (None: one per core of this process)."""
  target = targets_lib.parse(target)
  preset, variants = config_lib.make_configs(experiment, preset, overrides)
  config_lib.check_installed([c for _, configs in variants for c in configs])
  if stages.reads_run_dir(experiment.build_groups):
    raise ValueError(f"{experiment.NAME} builds its second stage from the first stage's "
                     "run folder, which a compile does not have; compile the first stage's "
                     "own experiment instead.")
  devices = targets_lib.devices(target)
  # The run's grouping: one device gives no mesh (a CPU then maps a traced sweep's members
  # in slices, an accelerator vmaps them all), several a mesh over them.
  mesh = _device_mesh(devices) if len(devices) > 1 else None
  groups = run_lib.build_run_groups(experiment, variants, mesh, target.platform)
  cfg = variants[0][1][0]
  if jobs is None:
    jobs = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1)
  with _stderr_captured() as log, futures.ThreadPoolExecutor(jobs) as pool:
    pending = [compile_group(g, cfg, target, devices, evaluation=evaluation, pool=pool)
               for g in groups]
    reports = [finish() for finish in pending]
  notes = tuple(note for key, note in DEVICELESS_NOTES.items()
                if any(key in line for line in log))
  return preset, [dataclasses.replace(r, notes=notes) for r in reports]


# --------------------------------------------------------------------------- the report


def _gb(n: float | None) -> str:
  return "–" if n is None else memory.size(int(n))


def _duration(seconds: float) -> str:
  if seconds >= 3600:
    return f"{seconds / 3600:.3g} h"
  if seconds >= 60:
    return f"{seconds / 60:.3g} min"
  return f"{seconds:.3g} s"


def format_report(report: GroupReport) -> str:
  """One group's table and lines, as `mpx compile` prints them."""
  t, chip = report.target, report.target.chip
  calls = (f"in slices of {report.members_per_call}" if report.members_per_call
           else "vmapped together")
  lines = [f"group {report.group}: {report.members} members ({report.rows - report.members} "
           f"padding rows), {report.per_device} per device on {t.name} ({t.devices} × "
           f"{chip.name}), {calls}", "",
           "| program | compile s | arguments | temporaries | outputs | code | per device "
           "| fusions | collectives | custom calls | kernels per step | XLA GFLOP | "
           "XLA GB accessed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for p in (report.train, report.evaluation):
    if p.memory is None:
      why = "no memory analysis" if p.error is None else f"refused: {p.error}"
      lines.append(f"| {p.name} | {p.seconds:.1f} | {why} | | | | {_gb(p.needed)} | | | | "
                   "| | |")
      continue
    m = p.memory
    lines.append(
        f"| {p.name} | {p.seconds:.1f} | {_gb(m.arguments)} | {_gb(m.temporaries)} | "
        f"{_gb(m.outputs)} | {_gb(m.code)} | {_gb(m.total)} | {p.fusions} | "
        f"{p.collectives} | {p.custom_calls} | "
        f"{'–' if p.loop_kernels is None else p.loop_kernels // report.unroll} | "
        f"{'–' if p.flops is None else f'{p.flops / 1e9:.4g}'} | "
        f"{'–' if p.bytes_accessed is None else f'{p.bytes_accessed / 1e9:.4g}'} |")
  usable = t.usable_memory
  share = ("" if t.platform != "gpu" else
           f", jax's {usable / chip.memory:.0%} share of {_gb(chip.memory)}")
  verdict = "fits" if report.fits else "does not fit"
  lines += ["", f"memory: {_gb(report.need)} per device of {_gb(usable)}{share}: {verdict}; "
            f"≈ {report.members_that_fit} members per device would fit "
            f"({_gb(report.per_member)} per member; now {report.per_device})"]
  xla = report.train.flops
  lines.append(
      f"FLOPs per member-step: {report.model_flops / 1e9:.4g} G (the model's matmuls, "
      "traced)" + ("" if xla is None else
                   f"; XLA counts {xla / report.unroll / report.per_device / 1e9:.4g} G "
                   "per member-step (the chunk's loop body once)"))
  bytes_, source = report.step_bytes
  lines.append(
      f"estimate (roofline from published peaks, not a measurement): "
      f"{report.step_seconds * 1e3:.3g} ms per step of {report.per_device} member(s) = max("
      f"{report.model_flops * report.per_device / 1e9:.4g} GFLOP / {report.peak / 1e12:.4g} "
      f"TFLOP/s, {bytes_ / 1e9:.3g} GB ({source}) / {chip.bandwidth / 1e12:.3g} TB/s); "
      f"{report.steps} steps ≈ {_duration(report.steps * report.step_seconds)} of training "
      "(evaluation, init and compile not counted); a lower bound on the real time")
  notes = list(report.notes)
  if t.platform == "gpu":
    notes.append(GPU_NOTE)
  lines += [f"note: {n}" for n in notes]
  return "\n".join(lines)


def does_not_fit(report: GroupReport) -> str:
  """The one line `mpx compile` ends with when a group does not fit."""
  t = report.target
  return (f"group {report.group} does not fit {t.name}: it needs {_gb(report.need)} per "
          f"device, one {t.chip.name} gives {_gb(t.usable_memory)}; ≈ "
          f"{report.members_that_fit} members per device would fit (now "
          f"{report.per_device}): fewer members, more chips, or members_per_call")


def as_dict(report: GroupReport) -> dict[str, Any]:
  """The report as plain values (`mpx compile --json`)."""
  out = dataclasses.asdict(report)
  out["target"] = {"name": report.target.name, "devices": report.target.devices,
                   "chip": report.target.chip.name,
                   "usable_memory": report.target.usable_memory}
  out.update(per_device=report.per_device, need=report.need, fits=report.fits,
             per_member=report.per_member, members_that_fit=report.members_that_fit,
             step_seconds_estimate=report.step_seconds,
             run_seconds_estimate=report.steps * report.step_seconds)
  return out
