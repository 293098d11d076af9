"""Candidate XLA:CPU settings against today's defaults and PyTorch, interleaved in one run.

    python benchmarks/cpu_settings.py                     # all candidates, both scales, K = 1, 16
    python benchmarks/cpu_settings.py --cpus 0,1 --rounds 3 --candidates default ynn-reduce
    python benchmarks/cpu_settings.py --add "mine=--xla_cpu_a=1 --xla_cpu_b=2"
    python benchmarks/cpu_settings.py --tiny              # smoke run: quick K = 1, 2 steps
    python benchmarks/run.py --settings --write           # the same A/B inside run.py's report

XLA reads XLA_FLAGS once per process, so each measurement is a subprocess: one candidate
(its flags and cores) on one case (scale, K), pinned to its cores, with the caller's
XLA_FLAGS plus its own and mpx's per-CPU defaults off (each row states everything it
sets). A round runs every case, and in each case every candidate and PyTorch
(`torch_reference.py`, on the same cores), the candidates' order rotated from round to
round, so drift of the machine's load hits them alike.

Per candidate and case: member-steps/s (median of the rounds), the ratio to the default
paired round by round (median, and the range), the ratio to PyTorch, whether XLA's
optimized HLO is the default's (HLO-pass flags that this jaxlib ignores leave it as it
was: such a candidate is compiled once per case and not run), and whether the numbers
change: the training loss
(each chunk's mean, per member) over at least `--loss-steps` steps against the default's,
bit for bit or the largest relative difference. A setting that changes them is flagged,
never taken silently. The default's own row compares its second round with its first.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

import run  # benchmarks/run.py: the chunk, the PyTorch scale (puts the repository on sys.path).
import chunk_timing  # noqa: E402 (after run, which puts the repository on sys.path)
from mpx.sweep import cpu_flags  # noqa: E402

YNN = "--xla_cpu_experimental_ynn_fusion_type="


@dataclasses.dataclass(frozen=True)
class Candidate:
  """XLA flags and a core count (None: every core of `--cpus`), and why it is a candidate.

  `hlo`: the flags act on XLA's HLO passes (library fusions, rewrites) alone, so an
  optimized program that is the default's or another such candidate's means the rest of
  them changed nothing here, and the candidate is not timed. Flags that act on code
  generation or the runtime (vector width, Eigen's threads, fast math) leave the HLO as it
  is and are always timed.
  """
  name: str
  flags: tuple[str, ...] = ()
  cores: int | None = None
  why: str = ""
  hlo: bool = False


CANDIDATES = (
    Candidate("default", (), None, "jax's defaults (and the caller's XLA_FLAGS)"),
    Candidate("ynn-reduce", (YNN + "-reduce",), None,
              "reductions back to XLA's loops: YNNPACK's reduce fusion ran 2x slow on jax 0.10",
              hlo=True),
    Candidate("ynn-eigen-dots", (YNN + "-individual_dot",), None,
              "dots to Eigen, reductions in YNNPACK", hlo=True),
    Candidate("ynn-off", (YNN,), None, "no YNNPACK: Eigen dots, XLA's loops", hlo=True),
    Candidate("ynn-fused", (YNN + "dot,eltwise,reduce",), None,
              "YNNPACK fuses dots with their consumers and elementwise ops", hlo=True),
    Candidate("onednn", ("--xla_cpu_use_onednn=true",), None, "dots to oneDNN", hlo=True),
    Candidate("onednn-custom-call", ("--xla_cpu_experimental_onednn_custom_call=true",), None,
              "oneDNN custom calls", hlo=True),
    Candidate("onednn-fusions",
              (YNN, "--xla_cpu_experimental_onednn_fusion_type=dot,eltwise,reduce"), None,
              "oneDNN fusions instead of YNNPACK's", hlo=True),
    Candidate("xnn-fusions", (YNN, "--xla_cpu_experimental_xnn_fusion_type=dot,eltwise,reduce"),
              None, "XNNPACK fusions instead of YNNPACK's", hlo=True),
    Candidate("xnnpack", ("--xla_cpu_use_xnnpack=true",), None, "XNNPACK where it applies",
              hlo=True),
    Candidate("eigen-single-thread", ("--xla_cpu_multi_thread_eigen=false",), None,
              "Eigen's matmuls on one thread (XLA still runs ops in parallel)"),
    Candidate("vector-512", ("--xla_cpu_prefer_vector_width=512",), None,
              "512-bit vectors in XLA's loops (AVX-512 CPUs)"),
    Candidate("one-core", (), 1, "one core: one thread for XLA and for PyTorch"),
    Candidate("fast-math", ("--xla_cpu_enable_fast_math=true",), None,
              "changes numerics: measured to know what it would buy, never a silent default"),
)
CASES = ("quick:1", "quick:16", "paper:1", "paper:16")
STEPS = {"quick": 32, "paper": 1}        # Steps per chunk: one chunk warms up, `repeats` are timed.
TORCH_STEPS = {"quick": 64, "paper": 4}  # Timed PyTorch steps per round (one seed).


# --------------------------------------------------------------------------- worker


def measure_mpx(scale: str, members: int, steps: int, repeats: int, loss_steps: int,
                loss_members: int, known: dict[str, str]) -> dict:
  """One chunk to warm up, `repeats` timed; then chunks until `loss_steps` steps are done
  where K <= `loss_members` (the loss check of the larger K covers the timed steps). A
  program in `known` ({program: candidate}) was measured already and is not run again."""
  import jax
  chunk, state, hparams, data, compile_s = run.compiled_chunk(scale, members, steps)
  program = hashlib.sha1(chunk.as_text().encode()).hexdigest()[:12]
  if program in known:
    return {"program": program, "same_as": known[program]}
  need, have = run.needed_gib(chunk), run.available_gib()
  if need > have:
    return {"skipped": f"needs {need:.1f} GiB, {have:.1f} GiB available", "program": program}
  state, out = chunk(state, hparams, data)
  outs = [out]
  jax.block_until_ready(out)
  start = time.perf_counter()
  for _ in range(repeats):
    state, out = chunk(state, hparams, data)
    outs.append(out)
  jax.block_until_ready(out)
  seconds = time.perf_counter() - start
  while members <= loss_members and len(outs) * steps < loss_steps:
    state, out = chunk(state, hparams, data)
    outs.append(out)
  return {"rate": members * steps * repeats / seconds, "compile_s": compile_s,
          "program": program, "steps": steps,
          "losses": [np.asarray(o["train_loss"], np.float32).tolist() for o in outs]}


def worker(spec: dict) -> dict:
  """One measurement, in the process `spawn` started: mpx's chunk or PyTorch's steps."""
  if spec["kind"] == "torch":
    if run.torch_reference is None:
      return {"error": run.NO_TORCH}
    return {"rate": run.torch_reference.member_steps_per_second(
        run.torch_scale(spec["scale"]), spec["steps"], 1)}
  return measure_mpx(spec["scale"], spec["members"], spec["steps"], spec["repeats"],
                     spec["loss_steps"], spec["loss_members"], spec["known_programs"])


# --------------------------------------------------------------------------- parent


def base_xla_flags(added: tuple[str, ...]) -> str:
  """The caller's XLA_FLAGS without the per-CPU defaults `cpu_flags.apply` `added`."""
  return " ".join(w for w in os.environ.get("XLA_FLAGS", "").split() if w not in added)


def spawn(spec: dict, base: str, flags: tuple[str, ...], cpus: list[int]) -> dict:
  """The worker in a fresh process on `cpus` with XLA_FLAGS `base` and `flags`; a failed
  one as {"error": its last line}."""
  env = dict(os.environ, XLA_FLAGS=" ".join([base, *flags]).strip())
  env[cpu_flags.ENV_SWITCH] = "0"
  done = subprocess.run(["taskset", "-c", ",".join(map(str, cpus)), sys.executable, __file__,
                         "--worker", json.dumps(spec)],
                        capture_output=True, text=True, env=env, check=False)
  lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
  if done.returncode or not lines:
    tail = [l for l in done.stderr.strip().splitlines() if l.strip()] or ["no output"]
    last = re.sub(r"^[FEWI]\d{4} [\d:.]+\s+\d+ \S+\] ", "", tail[-1].strip())  # XLA's prefix.
    return {"error": f"exit {done.returncode}: {last[:300]}"}
  return json.loads(lines[-1][len("RESULT "):])


@dataclasses.dataclass
class Plan:
  candidates: tuple[Candidate, ...]
  cases: tuple[str, ...]
  cpus: list[int]
  base_flags: str  # The caller's XLA_FLAGS, which every candidate adds its own to.
  rounds: int = 3
  repeats: int = 2
  steps: dict = dataclasses.field(default_factory=lambda: dict(STEPS))
  torch_steps: dict = dataclasses.field(default_factory=lambda: dict(TORCH_STEPS))
  loss_steps: int = 32
  loss_members: int = 1

  def cores(self, candidate: Candidate) -> list[int]:
    return self.cpus if candidate.cores is None else self.cpus[:candidate.cores]


def run_ab(plan: Plan, log=print, spawn=spawn) -> dict:
  """{(case, candidate name or "PyTorch@N"): [each round's result]}: every case, in each
  every candidate (the default first, the others' order rotated each round) and PyTorch
  on each core count the candidates use. A candidate of HLO flags whose program the
  default or an earlier such candidate compiled is compiled once per case, not run."""
  if plan.candidates[0].name != "default":
    raise ValueError("the first candidate must be 'default', the one the others are "
                     "compared with; e.g. --candidates default ynn-reduce")
  results, programs = {}, {}  # programs: {case: {program: the HLO candidate measuring it}}
  core_sets = sorted({len(plan.cores(c)) for c in plan.candidates})
  others = plan.candidates[1:]
  for r in range(plan.rounds):
    shift = r % len(others) if others else 0
    for case in plan.cases:
      scale, members = case.split(":")
      known = programs.setdefault(case, {})
      for candidate in (plan.candidates[0], *others[shift:], *others[:shift]):
        runs = results.setdefault((case, candidate.name), [])
        if runs and ("same_as" in runs[0] or "error" in runs[0] or "skipped" in runs[0]):
          continue  # Another's program, failed or too large: so it would be again.
        hlo = candidate.hlo or candidate is plan.candidates[0]
        spec = {"kind": "mpx", "scale": scale, "members": int(members),
                "steps": plan.steps[scale], "repeats": plan.repeats,
                "loss_steps": plan.loss_steps if r == 0 else 0,
                "loss_members": plan.loss_members,
                "known_programs": known if hlo and not runs else {}}  # Its first run only.
        runs.append(spawn(spec, plan.base_flags, candidate.flags, plan.cores(candidate)))
        if hlo and "rate" in runs[-1]:
          known.setdefault(runs[-1]["program"], candidate.name)
        log(f"round {r + 1} {case} {candidate.name}: {_short(runs[-1])}")
      for n in core_sets:
        out = spawn({"kind": "torch", "scale": scale, "steps": plan.torch_steps[scale]},
                    plan.base_flags, (), plan.cpus[:n])
        results.setdefault((case, f"PyTorch@{n}"), []).append(out)
        log(f"round {r + 1} {case} PyTorch on {n} core(s): {_short(out)}")
  return results


def _short(out: dict) -> str:
  if "rate" in out:
    return f"{out['rate']:.3f} member-steps/s"
  if "same_as" in out:
    return f"{out['same_as']}'s program (the rest of its flags inert here): not run"
  return out.get("error") or out.get("skipped", "?")


def loss_change(reference: list, losses: list, steps: int) -> str:
  """The loss of the chunks both runs have, as one cell: bit for bit, or the largest
  relative difference."""
  n = min(len(reference), len(losses))
  if n == 0:
    return "–"
  a = np.asarray(reference[:n], np.float32)
  b = np.asarray(losses[:n], np.float32)
  span = f"{n * steps} step{'s' if n * steps > 1 else ''}"
  if a.shape != b.shape:
    return f"not comparable ({a.shape} vs {b.shape})"
  if np.array_equal(a, b, equal_nan=True):
    return f"bit for bit ({span})"
  with np.errstate(divide="ignore", invalid="ignore"):
    rel = np.abs(a.astype(np.float64) - b) / np.abs(a.astype(np.float64))
  worst = np.nanmax(np.where(np.isnan(a) != np.isnan(b), np.inf, rel))
  return f"**changes**: max rel {worst:.1e} ({span})"


def _rates(outs: list[dict]) -> list[float]:
  return [o["rate"] for o in outs if "rate" in o]


@dataclasses.dataclass
class Line:
  """One row of the report (a candidate on a case)."""
  case: str
  name: str
  cores: int
  rates: list[float]
  vs_default: list[float]  # Paired by round.
  vs_torch: float | None
  program: str
  numbers: str
  note: str = ""
  same_as: str | None = None  # The candidate whose program it compiled (not run itself).

  def verdict(self) -> str:
    """Faster or slower where every round agrees; a failed or skipped one says why."""
    if self.note:
      return self.note
    if self.name == "default":
      return ""
    if self.same_as is not None:
      return "inert" if self.same_as == "default" else f"= {self.same_as}"
    if not self.vs_default:
      return "not compared"
    if min(self.vs_default) > 1:
      return "faster"
    return "slower" if max(self.vs_default) < 1 else "within noise"


def lines(plan: Plan, results: dict) -> list[Line]:
  out = []
  for case in plan.cases:
    default = results.get((case, "default"), [])
    done = {}  # This case's lines so far, by name: a twin copies its program's.
    for candidate in plan.candidates:
      runs = results.get((case, candidate.name), [])
      if not runs or not default:
        continue
      n, first = len(plan.cores(candidate)), runs[0]
      torch_rates = _rates(results.get((case, f"PyTorch@{n}"), []))
      same_as = first.get("same_as")
      if same_as is not None:
        twin = done[same_as]
        line = dataclasses.replace(
            twin, name=candidate.name, program=f"{same_as}'s (flags inert here)",
            numbers="bit for bit (same program)" if same_as == "default" else twin.numbers,
            same_as=same_as)
      else:
        rates = _rates(runs)
        paired = [] if candidate.name == "default" else [
            a["rate"] / b["rate"] for a, b in zip(runs, default) if "rate" in a and "rate" in b]
        program = ("–" if "program" not in first
                   else "default's" if candidate.name == "default"
                   else "same HLO" if first["program"] == default[0].get("program")
                   else "other HLO")
        reference = (default[1] if candidate.name == "default" and len(default) > 1
                     else default[0])
        numbers = ("–" if "losses" not in first or "losses" not in reference
                   or first is reference
                   else loss_change(reference["losses"], first["losses"], first["steps"]))
        if candidate.name == "default" and numbers != "–":
          numbers = "round 2 against round 1: " + numbers
        line = Line(case, candidate.name, n, rates, paired,
                    statistics.median(rates) / statistics.median(torch_rates)
                    if rates and torch_rates else None, program, numbers,
                    first.get("error") or first.get("skipped", ""))
      done[candidate.name] = line
      out.append(line)
  return out


def table(plan: Plan, results: dict) -> list[str]:
  rows = ["| case | candidate | cores | member-steps/s (median; rounds) | / default (paired) "
          "| / PyTorch | HLO | training loss vs default | |", "|---" * 9 + "|"]
  for line in lines(plan, results):
    if line.note or not line.rates:
      rows.append(f"| {line.case} | {line.name} | {line.cores} | {line.note or '–'} | | | "
                  f"{line.program} | {line.numbers} | |")
      continue
    rounds = ", ".join(f"{r:.3f}" for r in line.rates)
    paired = ("" if not line.vs_default else
              f"{statistics.median(line.vs_default):.3f} "
              f"({min(line.vs_default):.3f}–{max(line.vs_default):.3f})")
    rows.append(f"| {line.case} | {line.name} | {line.cores} | "
                f"{statistics.median(line.rates):.3f}; {rounds} | {paired} | "
                f"{chunk_timing.fmt(line.vs_torch, '.2f')}x | {line.program} | "
                f"{line.numbers} | {line.verdict()} |")
  for case in plan.cases:
    for key, runs in results.items():
      if key[0] == case and key[1].startswith("PyTorch@"):
        rates = _rates(runs)
        cell = (f"{statistics.median(rates):.3f}; " + ", ".join(f"{r:.3f}" for r in rates)
                if rates else runs[0].get("error", "?"))
        rows.append(f"| {case} | PyTorch | {key[1].split('@')[1]} | {cell} | | 1.00x | | | |")
  return rows


def summary(plan: Plan, results: dict) -> list[str]:
  """One line per candidate: its verdict in each case, and whether it moves the numbers."""
  by_name = {}
  for line in lines(plan, results):
    by_name.setdefault(line.name, []).append(line)
  out = []
  for candidate in plan.candidates[1:]:
    found = by_name.get(candidate.name, [])
    twins = {l.same_as for l in found}
    if found and len(twins) == 1 and None not in twins:
      what = ("inert on this jaxlib" if twins == {"default"}
              else f"{twins.pop()}'s program (its other flags inert on this jaxlib)")
      out.append(f"- {candidate.name}: {what}: the same HLO in every case")
      continue
    verdicts = ", ".join(f"{l.case} {l.verdict()}" for l in found)
    changes = [l.case for l in found if l.numbers.startswith("**changes")]
    numbers = (f"**changes the numbers** ({', '.join(changes)}): only after the preset guard"
               if changes else "numbers bit for bit" if any(
                   l.numbers.startswith("bit for bit") for l in found) else "numbers not compared")
    setting = " ".join(candidate.flags) or "no flags"
    cores = f", {candidate.cores} core(s)" if candidate.cores else ""
    out.append(f"- {candidate.name} ({setting}{cores}): {verdicts}; {numbers}")
  return out


def report(plan: Plan, results: dict) -> str:
  head = [f"Interleaved A/B of XLA:CPU settings: {plan.rounds} round(s) on cores "
          f"{','.join(map(str, plan.cpus))}; steps per chunk {plan.steps}, {plan.repeats} "
          f"timed chunk(s) after a warm-up one; PyTorch {plan.torch_steps} steps per round; "
          f"the training loss (each chunk's mean, per member) of round 1 compared over "
          f"every chunk both runs made: at least {plan.loss_steps} steps at K <= "
          f"{plan.loss_members}, the timed ones at larger K. A row's / default is its rate "
          "over the default's in the same round; faster or slower only where every round "
          "agrees.", "",
          "| candidate | XLA flags | why |", "|---|---|---|"]
  head += [f"| {c.name} | {' '.join(f'`{f}`' for f in c.flags) or '–'}"
           f"{f' (on {c.cores} core)' if c.cores else ''} | {c.why} |" for c in plan.candidates]
  return "\n".join(head + [""] + table(plan, results) + [""] + summary(plan, results))


# --------------------------------------------------------------------------- main


def parse_args(argv):
  names = [c.name for c in CANDIDATES]
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--candidates", nargs="+", default=names, metavar="NAME",
                      help=f"of {', '.join(names)} (default is always run)")
  parser.add_argument("--add", action="append", default=[], metavar="NAME='FLAG [FLAG]'",
                      help="one more candidate: XLA flags on every core (repeatable)")
  parser.add_argument("--cases", nargs="+", default=list(CASES), metavar="SCALE:K")
  parser.add_argument("--cpus", default=None,
                      help="cores to pin to, e.g. 0,1 (default: this process's affinity)")
  parser.add_argument("--rounds", type=int, default=None, help="default 3 (--tiny: 1)")
  parser.add_argument("--repeats", type=int, default=2, help="timed chunks per measurement")
  parser.add_argument("--steps", nargs="+", default=[], metavar="SCALE:N",
                      help=f"steps per chunk (default {STEPS}); a chunk also pays a fixed "
                           "cost (fresh pages for XLA's temporaries: 0.2-0.3 s at paper "
                           "scale), so paper:1 understates mpx against PyTorch")
  parser.add_argument("--loss-steps", type=int, default=32)
  parser.add_argument("--tiny", action="store_true",
                      help="smoke run in seconds: quick K = 1, 2 steps, 1 round")
  parser.add_argument("--worker", help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def make_plan(args, added: tuple[str, ...]) -> Plan:
  """The A/B that `args` ask for; `added`: the flags `cpu_flags.apply` put in XLA_FLAGS."""
  known = {c.name: c for c in CANDIDATES}
  names = ["default"] + [n for n in args.candidates if n != "default"]
  unknown = [n for n in names if n not in known]
  if unknown:
    raise SystemExit(f"unknown candidate(s) {unknown}; choose from {list(known)} or define "
                     "one with --add NAME='FLAG [FLAG]'")
  extra = []
  for spec in args.add:
    name, _, flags = spec.partition("=")
    if not name or not flags.startswith("--") or name in known:
      raise SystemExit(f"--add {spec!r}: write NEWNAME='--xla_flag=value --xla_other=value'")
    extra.append(Candidate(name, tuple(flags.split()), None, "--add (always timed)"))
  mpx_defaults = cpu_flags.defaults_for(cpu_flags.detect(), cpu_flags.jaxlib_version())
  if mpx_defaults:  # The table's choice for this CPU, measured again.
    extra.append(Candidate("mpx-defaults", mpx_defaults, None, "mpx's per-CPU defaults"))
  cpus = (sorted(os.sched_getaffinity(0)) if args.cpus is None
          else [int(c) for c in args.cpus.split(",")])
  plan = Plan(tuple(known[n] for n in names) + tuple(extra), tuple(args.cases),
              cpus, base_xla_flags(added), args.rounds or (1 if args.tiny else 3),
              args.repeats,
              loss_steps=args.loss_steps)
  if args.tiny:
    plan.cases, plan.repeats, plan.loss_steps = ("quick:1",), 1, 4
    plan.steps, plan.torch_steps = {"quick": 2, "paper": 1}, {"quick": 2, "paper": 1}
  for spec in args.steps:  # After --tiny's, which they override.
    scale, _, n = spec.partition(":")
    if scale not in plan.steps or not n.isdigit() or int(n) < 1:
      raise SystemExit(f"--steps {spec!r}: write SCALE:N with SCALE in {list(plan.steps)}")
    plan.steps[scale] = int(n)
  return plan


def main(argv=None):
  args = parse_args(argv)
  if args.worker:
    print("RESULT " + json.dumps(worker(json.loads(args.worker))), flush=True)
    return
  plan = make_plan(args, chunk_timing.CPU_FLAGS_ADDED)
  log = lambda line: print(line, file=sys.stderr, flush=True)
  results = run_ab(plan, log)
  print(report(plan, results))


if __name__ == "__main__":
  main()
