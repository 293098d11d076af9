"""The accelerator questions in one prepared command, against a wall-clock budget.

    PYTHONPATH=. python benchmarks/accelerator_check --out DIR --plan    # what it will do
    PYTHONPATH=. python benchmarks/accelerator_check --out DIR           # GPU, 540 s budget
    PYTHONPATH=. python benchmarks/accelerator_check --out DIR --stages environment,majority3
    PYTHONPATH=. python benchmarks/accelerator_check --out DIR --tiny    # CPU, toy sizes

Stages, most valuable first (one the remaining budget cannot fit is skipped with a note):
1. environment: device, memory, jax / jaxlib / CUDA / cuDNN versions, the float32
   (default precision: TF32 on NVIDIA tensor cores) and bfloat16 rates of an n³ `jnp.dot`,
   the peaks every later rate is a fraction of;
2. headline: the paper preset's 2Parity row, every scheme × as many seeds as fit, trained
   to the end with the whole-cube evaluation into a run folder in DIR (a cut run resumes
   on the next call); `majority3` and `cyclic3`, the other rows, run only when named;
3. profile: one paper-scale chunk at K = 1 and 16 traced, its time by kind of kernel and
   its top kernels with the jax op each came from;
4. sweep throughput: the Boolean 2Parity mask model at paper scale with K = 1, 16 and the
   most members XLA's `memory_analysis()` says fit, at quick scale with K = 1 and 64, and
   bf16 + fused attention beside float32 + the reference attention; member-steps/s, the
   model's and XLA's FLOPs, the fraction of the peak;
5. cuDNN attention under the engine's `jit(vmap(value_and_grad))`, each case against the
   reference attention, in a child process (a crash is recorded, not fatal);
6. ViT-Tiny at 32 and 224 px with `members_per_call` = 1 and 2 (step time, images/s,
   device memory), the `wikitext2` language model on generated tokens (tokens/s);
7. the ETA of the Boolean paper table from the measured rates and whether it fits one
   call, and what the headline run's evaluation and init cost over its training.

DIR/accelerator_check.md and DIR/accelerator_check.json are rewritten after every
measurement, so a run cut off by a timeout keeps what it finished. Nothing here needs
grain, tensorflow-datasets or torch: images and tokens are generated and fed straight to
the engine. `--tiny` runs every stage at toy sizes (the test suite runs it on a CPU).
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import pathlib
import sys
import tempfile
import time
import traceback

PACKAGE = pathlib.Path(__file__).resolve().parent
# Run as a folder, this one stands first on sys.path, where its modules would shadow any
# of their names: benchmarks/ (this package, chunk_timing) and the repository (mpx) instead.
sys.path[:] = [str(PACKAGE.parent), str(PACKAGE.parents[1])] + [
    p for p in sys.path if pathlib.Path(p).resolve() != PACKAGE]

import accelerator_check  # noqa: E402 (first: it starts the clock, sets jax's environment)
from accelerator_check import ab, context, cudnn, cudnn_probes, environment, eta  # noqa: E402
from accelerator_check import headline, models, plan, profiling, report, sweep  # noqa: E402
import jax  # noqa: E402

STAGE_FUNCTIONS = {  # In the order they run: the most valuable first.
    "environment": ("Environment and matmul peak", environment.stage_environment),
    "headline": ("The paper's 2Parity row, trained to the end", headline.stage_headline),
    "majority3": ("The paper's Majority row, trained to the end",
                  functools.partial(headline.stage_headline, task="majority3")),
    "cyclic3": ("The paper's Cyclic3 row, trained to the end",
                functools.partial(headline.stage_headline, task="cyclic3")),
    "profile": ("Profile: where a paper-scale step's time goes", profiling.stage_profile),
    "ab": ("A/B of step variants", ab.stage_ab),
    "sweep": ("Sweep throughput: the Boolean model", sweep.stage_sweep),
    "cudnn": ("cuDNN attention under the engine's jit(vmap)", cudnn.stage_cudnn),
    "models": ("ViT-Tiny and the language model", models.stage_models),
    "eta": ("ETA of the Boolean paper table", eta.stage_eta),
}
STAGES = tuple(STAGE_FUNCTIONS)
# Run unless --stages says otherwise: the other Boolean rows each take a call of their own.
DEFAULT_STAGES = tuple(s for s in STAGES if s not in ("majority3", "cyclic3"))
DEFAULT_CACHE = os.path.join(tempfile.gettempdir(), "mpx_accelerator_check_jax_cache")


def cpu_seconds() -> float:
  """CPU time of this process and its finished children (the probe process)."""
  t = os.times()
  return t.user + t.system + t.children_user + t.children_system


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="accelerator_check",
                      help="folder for accelerator_check.md / .json")
  parser.add_argument("--budget-s", type=float, default=540.0,
                      help="wall-clock budget from the start (default 540: one 10-minute "
                           "call with room to spare)")
  parser.add_argument("--tiny", action="store_true", help="every stage at toy sizes (CPU)")
  parser.add_argument("--stages", default=",".join(DEFAULT_STAGES),
                      help=f"comma-separated subset of {','.join(STAGES)} (default: all but "
                           "majority3 and cyclic3); they run in that order")
  parser.add_argument("--plan", action="store_true",
                      help="print the stages with the seconds each is expected to take, "
                           "and stop (no device, nothing compiled)")
  parser.add_argument("--no-cudnn", action="store_true",
                      help="skip the fused-attention row and probes (a rerun after a crash)")
  parser.add_argument("--cache-dir", default=DEFAULT_CACHE,
                      help="jax's persistent compilation cache, shared with the probe "
                           "process; a rerun compiles little ('' for none)")
  parser.add_argument("--cudnn-probes", default=None, help=argparse.SUPPRESS)
  parser.add_argument("--cases", default=",".join(cudnn_probes.PROBES), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  unknown = set(args.stages.split(",")) - set(STAGES)
  if unknown:
    parser.error(f"unknown stages {sorted(unknown)}; choose from {STAGES}")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  budget = report.Budget(args.budget_s, accelerator_check.START)
  sizes = context.TINY if args.tiny else context.DEVICE
  chosen = [key for key in STAGES if key in args.stages.split(",")]
  if args.plan:
    titles = {key: title for key, (title, _) in STAGE_FUNCTIONS.items()}
    print(plan.render(chosen, titles, sizes, plan.expectations(sizes, args.tiny),
                      context.load_boolean(), args.budget_s))
    return 0
  if args.cache_dir:
    jax.config.update("jax_compilation_cache_dir", args.cache_dir)
  if args.cudnn_probes:
    cudnn_probes.run_probes(pathlib.Path(args.cudnn_probes), args.cases.split(","), sizes)
    return 0
  command = "python benchmarks/accelerator_check " + " ".join(
      sys.argv[1:] if argv is None else argv)
  header = {"command": command.strip(), "budget_s": args.budget_s, "tiny": args.tiny,
            "started": datetime.datetime.now().isoformat(timespec="seconds")}
  out = report.Report(pathlib.Path(args.out), header, budget)
  ctx = context.new_context(sizes, budget, out, args)
  ctx.expect = plan.expectations(sizes, args.tiny)
  for key in chosen:
    title, function = STAGE_FUNCTIONS[key]
    st = out.stage(key, title)
    short = budget.short(sizes.stage_s[key]) if sizes.stage_s.get(key) else None
    if short:
      st["status"] = "skipped"
      st["notes"].append(f"Stage {short}.")
      out.write()
      continue
    start, cpu = time.perf_counter(), cpu_seconds()
    try:
      function(ctx, st)
      st["status"] = "partial" if st.pop("partial", False) else "done"
    except Exception as e:  # noqa: BLE001 (a failed stage must not lose the others)
      traceback.print_exc()
      st.pop("partial", None)
      st["status"] = "failed"
      st["notes"].append(f"Failed: {report.one_line(e)}")
    st["seconds"] = round(time.perf_counter() - start, 1)
    st["cpu_s"] = round(cpu_seconds() - cpu, 1)
    out.write()
    print(f"[{budget.used():.0f} s] {key}: {st['status']}", file=sys.stderr, flush=True)
  print(report.render(out.data))
  return 0


if __name__ == "__main__":
  sys.exit(main())
