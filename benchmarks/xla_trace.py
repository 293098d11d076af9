"""Where a compiled program's time goes: a jax profiler trace read against the program's HLO.

Shared by `profile_step.py` (a CPU chunk) and the accelerator check's profile stage (a GPU
or CPU chunk), so that both classify alike. The trace (`jax.profiler.trace`, the Chrome
trace `*.trace.json.gz` under plugins/profile) holds one event per executed op: on a GPU
the device's kernels on its stream lines, on the CPU XLA's thunks; each names its HLO
instruction (`args.hlo_op`). The compiled program's text (`compiled.as_text()`) says what
that instruction is (opcode, fused computation, custom-call target) and which jax op it
came from (`op_name` metadata, source location). Every op's own time (its duration less
the ops nested in it: a CPU `while` holds its body's ops) goes to one kind; the span from
the first op's start to the last one's end is that time, plus the gaps between ops, less
where ops overlap (several streams or threads at once):

    sum(kinds) + gaps - overlap == span
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import re
import time

import jax

MATMUL, ATTENTION, COPIES = "matmul", "attention", "copies and transposes"
CONTROL, UNMAPPED = "control flow (while, conditional: own time)", "no HLO op (memcpy, memset)"
GAPS, OVERLAP = "gaps (time between ops)", "overlap (ops at the same time)"
# The kinds every table lists, even at 0: what the reader compares across runs.
MAIN_KINDS = (MATMUL, ATTENTION, COPIES)
ATTENTION_SCOPE = "masked_attention"  # mpx.attention.masked_attention's named scope.

_INSTRUCTION = re.compile(r"^\s*(ROOT )?%?([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(.*\{$")
_CONTROL = {"while", "conditional", "call", "async-start", "async-done"}
_COPY_OPS = {"copy", "transpose", "copy-start", "copy-done"}
_SKIP_TO_OPERAND = {"bitcast", "tuple", "get-tuple-element"}


@dataclasses.dataclass(frozen=True)
class Instruction:
  """One HLO instruction of the compiled program and the kind its time counts as."""
  name: str
  opcode: str
  shape: str
  kind: str
  op_name: str = ""   # The jax op (name stack) it came from.
  source: str = ""    # The innermost source line jax recorded, "file.py:123".


@dataclasses.dataclass(frozen=True)
class Event:
  """One executed op of the trace, times in µs."""
  line: tuple          # (pid, tid): the stream or thread it ran on.
  name: str            # Kernel name on a GPU, the HLO instruction's on the CPU.
  hlo_op: str          # "" where the event names none (a memcpy).
  start: float
  duration: float


def module_name(hlo_text: str) -> str:
  """The HLO module's name ("jit_chunk"), which the trace's events carry."""
  return re.match(r"HloModule ([\w.\-]+)", hlo_text)[1]


def _attribute(text: str, key: str) -> str:
  found = re.search(key + r'="([^"]*)"', text) or re.search(key + r"=([\w.\-%]+)", text)
  return found[1].lstrip("%") if found else ""


def _sources(hlo_text: str) -> dict[int, str]:
  """stack_frame_id → "file.py:line" of its innermost location (HLO text's tables)."""
  tables = {}
  for name in ("FileNames", "FileLocations", "StackFrames"):
    block = re.search(rf"^{name}\n((?:\d+ .*\n)+)", hlo_text, re.M)
    tables[name] = dict(re.findall(r"^(\d+) (.*)$", block[1], re.M)) if block else {}
  out = {}
  for frame, text in tables["StackFrames"].items():
    location = tables["FileLocations"].get(_attribute(text, "file_location_id"), "")
    path = tables["FileNames"].get(_attribute(location, "file_name_id"), "").strip('"')
    if path:
      out[int(frame)] = f"{path.rsplit('/', 1)[-1]}:{_attribute(location, 'line')}"
  return out


def hlo_instructions(hlo_text: str) -> dict[str, Instruction]:
  """Every instruction of a compiled program's text (entry, loop bodies, fused
  computations), by name, with its kind (`classify`)."""
  computations, current = {}, None
  raw = []  # (computation, is_root, name, shape, opcode, rest of the line)
  for line in hlo_text.splitlines():
    if line.startswith("}"):
      current = None
      continue
    found = _COMPUTATION.match(line)
    if found:
      current = found[1]
      computations[current] = {"root": None, "ops": {}}
      continue
    found = _INSTRUCTION.match(line) if current else None
    if found:
      root, name, shape, opcode, rest = found.groups()
      computations[current]["ops"][name] = (opcode, rest)
      if root:
        computations[current]["root"] = name
      raw.append((name, shape, opcode, rest))
  sources = _sources(hlo_text)
  out = {}
  for name, shape, opcode, rest in raw:
    frame = _attribute(rest, "stack_frame_id")
    out[name] = Instruction(name, opcode, shape, classify(opcode, rest, computations),
                            _attribute(rest, "op_name"),
                            sources.get(int(frame), "") if frame else "")
  return out


def _root_opcodes(computation: dict) -> list[str]:
  """The opcodes a fused computation produces: its root's, through bitcasts and tuples."""
  ops, seen, todo, found = computation["ops"], set(), [computation["root"]], []
  while todo:
    name = todo.pop()
    if name in seen or name not in ops:
      continue
    seen.add(name)
    opcode, rest = ops[name]
    if opcode in _SKIP_TO_OPERAND:
      todo += re.findall(r"%([\w.\-]+)", rest.split(")", 1)[0])
    else:
      found.append(opcode)
  return sorted(set(found))


def classify(opcode: str, rest: str, computations: dict) -> str:
  """The kind of an instruction's time: matmul (dots, GEMM custom calls and fusions that
  hold a dot), attention (mpx's attention core by its named scope, or a fused attention
  kernel), copies and transposes (alone or as a fusion's root), control flow, or else
  "fusion (root: op)" / the opcode."""
  target = _attribute(rest, "custom_call_target") + " " + _attribute(rest, "kind")
  op_name = _attribute(rest, "op_name")
  if opcode in _CONTROL:
    return CONTROL
  if re.search(r"fmha|flash|attention", target, re.I) or ATTENTION_SCOPE in op_name:
    return ATTENTION
  called = computations.get(_attribute(rest, "calls"), {"root": None, "ops": {}})
  inner = {op for op, _ in called["ops"].values()}
  if (opcode in ("dot", "convolution") or inner & {"dot", "convolution"}
      or re.search(r"gemm|matmul|cublas", target, re.I)):
    return MATMUL
  roots = _root_opcodes(called) if opcode == "fusion" else [opcode]
  if roots and set(roots) <= _COPY_OPS:
    return COPIES
  if opcode == "fusion":
    return f"fusion (root: {'+'.join(roots) or '?'})"
  return opcode if opcode != "custom-call" else f"custom-call {target.strip()}"


def read_trace(trace_dir: str) -> dict:
  """The Chrome trace a `jax.profiler.trace(trace_dir)` wrote (one per trace folder)."""
  paths = glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True)
  if len(paths) != 1:
    raise ValueError(f"{trace_dir} holds {len(paths)} *.trace.json.gz files; trace one "
                     "program into a folder of its own.")
  with gzip.open(paths[0]) as f:
    return json.load(f)


def device_events(trace: dict, module: str) -> list[Event]:
  """The executed ops of one program: on a GPU every event of its device's stream lines
  (kernels, and memcpys that name no HLO op), elsewhere the events of XLA's thunks that
  name an HLO op of `module` (the program's HLO module name, e.g. "jit_chunk")."""
  events = trace["traceEvents"]
  names = {(e.get("name"), e["pid"], e.get("tid")): e["args"].get("name", "")
           for e in events if e.get("ph") == "M" and "args" in e}
  devices = {pid for (kind, pid, _), n in names.items()
             if kind == "process_name" and re.search(r"/device:(GPU|TPU):\d+", n)}
  streams = {(pid, tid) for (kind, pid, tid), n in names.items()
             if kind == "thread_name" and pid in devices and n.startswith("Stream")}
  out = []
  for e in events:
    if e.get("ph") != "X" or "dur" not in e:
      continue
    args = e.get("args", {})
    line = (e["pid"], e.get("tid"))
    if devices:
      keep = (line in streams if streams else e["pid"] in devices) and (
          not args.get("hlo_module") or args["hlo_module"].startswith(module))
    else:
      keep = bool(args.get("hlo_op")) and str(args.get("hlo_module", "")).startswith(module)
    if keep:
      out.append(Event(line, e["name"], args.get("hlo_op", ""), float(e["ts"]),
                       float(e["dur"])))
  return out


def own_times(events: list[Event]) -> list[float]:
  """Each event's own time: its duration less the events nested in it on its line (a
  CPU while loop's span holds its body's ops; a GPU stream's kernels do not nest)."""
  own = [e.duration for e in events]
  by_line = collections.defaultdict(list)
  for i, e in enumerate(events):
    by_line[e.line].append(i)
  for indices in by_line.values():
    indices.sort(key=lambda i: (events[i].start, -events[i].duration))
    stack = []  # Indices of the events still open at this start.
    for i in indices:
      start = events[i].start
      while stack and events[stack[-1]].start + events[stack[-1]].duration <= start:
        stack.pop()
      if stack:
        parent = events[stack[-1]]
        own[stack[-1]] -= min(events[i].duration, parent.start + parent.duration - start)
      stack.append(i)
  return own


def busy_time(events: list[Event]) -> float:
  """The time at least one op runs: the union of the events' intervals, every line."""
  total, end = 0.0, float("-inf")
  for start, stop in sorted((e.start, e.start + e.duration) for e in events):
    if stop > end:
      total += stop - max(start, end)
      end = stop
  return total


@dataclasses.dataclass
class Profile:
  """Where the traced span went, µs: by kind and by op (name, HLO op)."""
  span: float
  kinds: dict            # kind → own µs, gaps and overlap included.
  ops: list              # (µs, count, event name, Instruction or None), most first.


def instruction_of(event: Event, instructions: dict[str, Instruction]) -> Instruction | None:
  """The HLO instruction an event ran: the one it names, else the one its own name is (a
  CPU thunk's; a GPU fusion kernel's, "loop_add_fusion_3" for "loop_add_fusion.3")."""
  for name in (event.hlo_op, event.name, re.sub(r"_(\d+)$", r".\1", event.name)):
    if name in instructions:
      return instructions[name]
  return None


def profile(events: list[Event], instructions: dict[str, Instruction]) -> Profile:
  """The span of `events` split by kind (`classify` of each event's HLO instruction)."""
  if not events:
    raise ValueError("the trace holds no executed op of the program: was it traced while "
                     "it ran (jax.block_until_ready inside the trace)?")
  own = own_times(events)
  span = (max(e.start + e.duration for e in events) - min(e.start for e in events))
  busy = busy_time(events)
  kinds = collections.Counter({kind: 0.0 for kind in MAIN_KINDS})
  per_op = collections.defaultdict(lambda: [0.0, 0, None])
  for e, t in zip(events, own):
    instruction = instruction_of(e, instructions)
    kind = (instruction.kind if instruction else
            UNMAPPED if not e.hlo_op else f"unknown HLO op ({e.hlo_op.split('.')[0]})")
    kinds[kind] += t
    op = per_op[(e.name, e.hlo_op)]
    op[0], op[1], op[2] = op[0] + t, op[1] + 1, instruction
  kinds[GAPS] = span - busy
  kinds[OVERLAP] = -(sum(own) - busy)
  ops = sorted(((t, n, name, instruction) for (name, _), (t, n, instruction)
                in per_op.items()), key=lambda row: -row[0])
  return Profile(span, dict(kinds), ops)


def trace_chunk(chunk, state, hparams, data, trace_dir: str):
  """`(Profile, state, wall seconds)` of one call of a compiled, warmed-up training chunk
  traced into `trace_dir`; the wall time is the host's, around the traced call."""
  with jax.profiler.trace(str(trace_dir)):
    start = time.perf_counter()
    state, out = chunk(state, hparams, data)
    jax.block_until_ready(out)
    wall = time.perf_counter() - start
  text = chunk.as_text()
  events = device_events(read_trace(trace_dir), module_name(text))
  return profile(events, hlo_instructions(text)), state, wall


def jax_op(instruction: Instruction | None, parts: int = 4) -> str:
  """Where an op came from: the last parts of its jax name stack and its source line."""
  if instruction is None:
    return ""
  name = "/".join(instruction.op_name.split("/")[-parts:])
  return f"{name} ({instruction.source})" if instruction.source else name


OTHER = "other kinds (each < {:.0%} of the span)"


def kind_rows(result: Profile, per: float, least: float = 0.01) -> list[dict]:
  """Rows by kind, largest first, then the kinds under `least` of the span together, then
  gaps and overlap: ms per `per` (e.g. per step) and the share of the span; the rows add
  up to the span."""
  kinds = dict(result.kinds)
  small = [k for k in kinds if k not in MAIN_KINDS + (GAPS, OVERLAP)
           and abs(kinds[k]) < least * result.span]
  if len(small) > 1:
    kinds[OTHER.format(least)] = sum(kinds.pop(k) for k in small)
  order = sorted((k for k in kinds if k not in (GAPS, OVERLAP)), key=lambda k: -kinds[k])
  return [{"kind": k, "ms": kinds[k] / 1e3 / per, "share": kinds[k] / result.span}
          for k in order + [GAPS, OVERLAP]]


def op_rows(result: Profile, per: float, top: int) -> list[dict]:
  """The `top` ops by own time: name, HLO instruction, kind, shape, jax op, ms per `per`."""
  rows = []
  for t, count, name, instruction in result.ops[:top]:
    rows.append({"op": name[:60], "HLO op": instruction.name if instruction else "",
                 "kind": instruction.kind if instruction else UNMAPPED,
                 "shape": instruction.shape[:48] if instruction else "",
                 "from": jax_op(instruction), "calls": count, "ms": t / 1e3 / per,
                 "share": t / result.span})
  return rows


FORMATS = {"ms": ".3f", "share": ".1%"}


def markdown(columns: list[str], rows: list[dict], headers: dict | None = None) -> list[str]:
  """A Markdown table of `rows` (`kind_rows`, `op_rows`), numbers as FORMATS says,
  columns renamed by `headers` (e.g. {"ms": "ms per step"})."""
  cell = lambda row, c: format(row[c], FORMATS[c]) if c in FORMATS else str(row[c])
  header = [(headers or {}).get(c, c) for c in columns]
  return (["| " + " | ".join(header) + " |", "|---" * len(columns) + "|"] +
          ["| " + " | ".join(cell(r, c) for c in columns) + " |" for r in rows])
