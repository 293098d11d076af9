"""XLA:CPU flags that mpx sets by default on a kind of CPU, each chosen by measurement.

XLA reads `XLA_FLAGS` once, when jax initialises its backend, so `apply` runs before
that: first thing in `mpx run` (and so under every launcher) and in the benchmarks. A
flag that `XLA_FLAGS` names already is the user's and wins; `MPX_CPU_DEFAULTS=0` turns
mpx's defaults off. Library code that imports mpx gets none of this: docs/performance.md
gives the line to set a flag yourself.

A default enters `DEFAULTS` only from `benchmarks/cpu_settings.py`'s interleaved A/B on
idle cores (both scales, K = 1 and 16, PyTorch in the same run), faster on that kind of
CPU, with the training loss bit for bit today's; a setting that moves the numbers enters
only once `benchmarks/preset_guard.py` shows every preset the README quotes at the same
accuracies to the reported digits (what moves is re-recorded). Each entry names the
jaxlib release it was measured on: XLA aborts on a flag it does not know, and a new
release may change what a flag costs.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re

ENV_SWITCH = "MPX_CPU_DEFAULTS"  # "0": mpx adds no XLA flags of its own.


@dataclasses.dataclass(frozen=True)
class CpuKind:
  """What the defaults are keyed by: the vendor ("intel", "amd", or /proc/cpuinfo's
  vendor_id as it stands; "unknown" without one) and the widest matmul ISA ("amx",
  "avx512", "avx2", "other")."""
  vendor: str
  isa: str


@dataclasses.dataclass(frozen=True)
class Default:
  """XLA flags for one kind of CPU on one jaxlib release, and the measurement behind
  them (machine, date, commit, the A/B's ratios, and that the loss was unchanged)."""
  kind: CpuKind
  jaxlib: str  # The release prefix it was measured on, e.g. "0.10.".
  flags: tuple[str, ...]
  reason: str


# Empty: no setting has been faster in every case on a CPU measured. AMD EPYC with AVX-512,
# 2 cores, jaxlib 0.10.2 (`benchmarks/run.py --settings`, 2026-12-06, 5b5d78a, 3 rounds):
# `--xla_cpu_multi_thread_eigen=false`, bit for bit, 0.87x at quick K = 1 and 1.02x
# (1.01-1.26) at quick K = 16; YNNPACK off or its dots to Eigen 1.18-1.20x at paper K = 16,
# 0.78-0.96x at quick, and the loss moves in its last bits; YNNPACK's reductions off
# (`--xla_cpu_experimental_ynn_fusion_type=-reduce`) within noise (0.76-1.39x) and the loss
# moves; oneDNN and XNNPACK switches inert. An entry reads, e.g.:
#   Default(CpuKind("intel", "avx512"), "0.10.", ("--xla_cpu_...=...",),
#           "run.py --settings, <machine>, <date>, <commit>: quick K = 1 1.15x (1.10-1.20),
#            ...; loss bit for bit over 32 steps")
DEFAULTS: tuple[Default, ...] = ()

_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}


def detect(cpuinfo: str | None = None) -> CpuKind:
  """The kind of this machine's CPU from /proc/cpuinfo (or the `cpuinfo` text given)."""
  if cpuinfo is None:
    try:
      cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
      cpuinfo = ""
  vendor = re.search(r"^vendor_id\s*:\s*(\S+)", cpuinfo, re.M)
  flags = re.search(r"^flags\s*:(.*)$", cpuinfo, re.M)
  flags = set(flags.group(1).split()) if flags else set()
  isa = ("amx" if "amx_tile" in flags else "avx512" if "avx512f" in flags
         else "avx2" if "avx2" in flags else "other")
  return CpuKind(_VENDORS.get(vendor.group(1), vendor.group(1)) if vendor else "unknown",
                 isa)


def jaxlib_version() -> str:
  """The installed jaxlib's version, e.g. "0.10.2"."""
  from jaxlib import version  # Imports no backend.
  return version.__version__


def defaults_for(kind: CpuKind, jaxlib: str,
                 table: tuple[Default, ...] | None = None) -> tuple[str, ...]:
  """The flags of every entry of `table` (`DEFAULTS`) for this kind of CPU and release."""
  return tuple(flag for entry in (DEFAULTS if table is None else table)
               if entry.kind == kind and jaxlib.startswith(entry.jaxlib) for flag in entry.flags)


def flag_name(flag: str) -> str:
  """`--xla_cpu_x=1` → "xla_cpu_x"."""
  return flag.lstrip("-").partition("=")[0]


def merge(xla_flags: str, flags: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
  """(`xla_flags` with each of `flags` whose name it lacks appended, the flags added)."""
  given = {flag_name(word) for word in xla_flags.split()}
  added = tuple(flag for flag in flags if flag_name(flag) not in given)
  return " ".join([*xla_flags.split(), *added]), added


def apply(environ=os.environ, cpuinfo: str | None = None,
          table: tuple[Default, ...] | None = None) -> tuple[str, ...]:
  """Adds this CPU's defaults to `environ["XLA_FLAGS"]`; returns the flags added.

  Raises if there are flags to add and jax's backend is up already: XLA would ignore
  them, and the run would silently measure or train without them.
  """
  if environ.get(ENV_SWITCH, "1").strip() == "0":
    return ()
  flags = defaults_for(detect(cpuinfo), jaxlib_version(), table)
  merged, added = merge(environ.get("XLA_FLAGS", ""), flags)
  if not added:
    return ()
  from jax._src import xla_bridge
  if xla_bridge.backends_are_initialized():
    raise RuntimeError(f"mpx's CPU defaults {' '.join(added)} came after jax initialised "
                       "its backend; call mpx.sweep.cpu_flags.apply() before any jax "
                       f"computation (or set {ENV_SWITCH}=0).")
  environ["XLA_FLAGS"] = merged
  return added


def describe(added: tuple[str, ...], environ=os.environ, cpuinfo: str | None = None) -> str:
  """One line for a report: the kind of CPU and the flags `apply` added for it."""
  kind = detect(cpuinfo)
  what = (f"off ({ENV_SWITCH}=0)" if environ.get(ENV_SWITCH, "1").strip() == "0"
          else " ".join(added) or "none")
  return f"mpx CPU defaults ({kind.vendor}, {kind.isa}, jaxlib {jaxlib_version()}): {what}"
