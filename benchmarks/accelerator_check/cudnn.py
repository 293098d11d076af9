"""Stage 3, cuDNN attention under the engine's `jit(vmap)`: the probes, run at arm's length.

The cases (`cudnn_probes.py`) run in a child process, which this stage starts again
after a crash with the cases left, so one crashing case is recorded with its signal and
the others still run; each finished case reaches the report while the rest run.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp

from accelerator_check import context, cudnn_probes
import chunk_timing
import mpx
from mpx import attention as attention_lib

# The child's share of a GPU, beside the parent's (`XLA_PYTHON_CLIENT_MEM_FRACTION`).
PROBE_MEMORY_FRACTION = "0.05"
PACKAGE = pathlib.Path(__file__).resolve().parent  # What `python PACKAGE` runs: __main__.py.


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


def _form_name() -> str:
  return next(name for name, form in attention_lib.CUDNN_FORMS.items()
              if form == attention_lib.CUDNN_FORM)


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


def stage_cudnn(ctx: context.Context, st: dict) -> None:
  probes = cudnn_probes.PROBES
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
  remaining, rows = list(probes), {}

  def show():  # Finished cases into the report, in PROBES order.
    st["rows"] = [{"case": case, "what": probes[case], "result": rows[case].get("status"),
                   "detail": rows[case].get("detail", ""),
                   "seconds": chunk_timing.fmt(rows[case].get("seconds"), ".1f")}
                  for case in probes if case in rows]
    ctx.report.write()

  while remaining:
    short = ctx.budget.short(ctx.sizes.stage_s["cudnn"] / 2)
    if short:
      rows |= {case: {"status": short} for case in remaining}
      st["partial"] = True
      break
    command = [sys.executable, str(PACKAGE), "--cudnn-probes", str(path),
               "--cases", ",".join(remaining), f"--cache-dir={ctx.args.cache_dir}",
               *(["--tiny"] if ctx.args.tiny else [])]
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
  matched = sorted({form for case, (form, _) in cudnn_probes.FORM_PROBES.items()
                    if rows.get(case, {}).get("status") == "ok"})
  st["facts"]["forms that match the reference"] = (
      (", ".join(matched) or "none") if gpu else "– (no cuDNN here)")
  st["notes"].append(
      "The form_* cases hand cuDNN the engine's case in one form each "
      "(`mpx.attention.CUDNN_FORMS`): a bf16 bias, hard masks folded into the bias as a "
      "finite negative (no −inf), the bias not materialised per example, full-length "
      "sequence lengths, and all of them; engine_chunk_form_all trains the Boolean model "
      "with the form 'all'. Without cuDNN each form runs on the XLA path (its operands "
      "compute the attention) and reads 'not available'. `attention=cudnn` uses "
      f"`mpx.attention.CUDNN_FORM` (now {_form_name()}): once a form matches here, in the "
      "engine chunk too, naming it there is the one-line change.")
  st["notes"].append(
      "Each case runs jit(vmap(value_and_grad)) over 2 members, the program the sweep "
      "engine compiles, and compares the value and gradients with the reference attention "
      "on the same bf16 values in float32 (‖Δ‖ / ‖reference‖). The cases run in a child "
      "process, so a crash is recorded with the case it ended. Known upstream: jax "
      "requires an even token count to train cuDNN attention with a bias or mask (mpx "
      "pads an odd one with a key the mask hides); jax's cuDNN batching rules assumed "
      "every operand carries the vmapped axis, fixed upstream after jax 0.11.0, so "
      "causal_no_prior and unbatched_cotangent may fail on older versions.")
