"""The environment stage: the device, its memory, the versions and the matmul peaks.

It always runs, first: every later rate is a fraction of its peaks, and every later
program is checked against the memory it finds before it runs.
"""

from __future__ import annotations

import os
import platform
import subprocess

import jax
import jax.numpy as jnp

from accelerator_check import context, report
import chunk_timing


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
  available = chunk_timing.host_memory_available()
  if available is not None:
    return 0.8 * available, "80% of the host's MemAvailable"
  return None, "unknown"


def does_not_fit(program) -> str | None:
  """The note of a program (`memory.program_bytes`) that XLA plans beyond the limit: it
  is not run, rather than found out by running out of memory."""
  limit, _ = memory_limit()
  if program and limit and program.total > limit:
    return (f"not run: needs {report.size_text(program.total)}, "
            f"{report.size_text(limit)} usable")
  return None


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
      parts.append(f"{name} ? ({report.one_line(e)})")
  return ", ".join(parts)


def nvidia_smi() -> str | None:
  try:
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                          "--format=csv,noheader"], capture_output=True, text=True,
                         timeout=20)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() or None


def stage_environment(ctx: context.Context, st: dict) -> None:
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
      f"bytes_limit {report.size_text(stats.get('bytes_limit'))}, in use "
      f"{report.size_text(stats.get('bytes_in_use'))}")
  facts["memory a program may use"] = f"{report.size_text(limit)} ({source})"
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
