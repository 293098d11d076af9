"""mpx's per-CPU XLA defaults: detected from /proc/cpuinfo, never over the user's flags,
and in XLA_FLAGS before jax starts its backend (in `mpx run` and the benchmarks)."""

import os
import pathlib
import subprocess
import sys

import pytest

from mpx.sweep import cpu_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]

INTEL_AMX = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 fma avx512f avx512bw amx_bf16 amx_tile amx_int8
"""
AMD_AVX512 = "vendor_id\t: AuthenticAMD\nflags\t\t: fpu avx2 fma avx512f avx512vl\n"
INTEL_AVX2 = "vendor_id\t: GenuineIntel\nflags\t\t: fpu sse2 avx avx2 fma\n"
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd sve\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize("cpuinfo, kind", [
    (INTEL_AMX, cpu_flags.CpuKind("intel", "amx")),
    (AMD_AVX512, cpu_flags.CpuKind("amd", "avx512")),
    (INTEL_AVX2, cpu_flags.CpuKind("intel", "avx2")),
    ("vendor_id\t: HygonGenuine\nflags\t\t: sse2\n", cpu_flags.CpuKind("HygonGenuine", "other")),
    (ARM, cpu_flags.CpuKind("unknown", "other")),
    ("", cpu_flags.CpuKind("unknown", "other"))])
def test_the_kind_of_cpu_comes_from_cpuinfo(cpuinfo, kind):
  assert cpu_flags.detect(cpuinfo) == kind


def _table(kind, *flags, jaxlib=None):
  return (cpu_flags.Default(kind, cpu_flags.jaxlib_version() if jaxlib is None else jaxlib,
                            flags, "a test's entry"),)


def test_a_kind_gets_its_own_entries_on_the_release_they_were_measured_on():
  amd = cpu_flags.CpuKind("amd", "avx512")
  table = (_table(amd, "--xla_a=1", jaxlib="0.10.") + _table(amd, "--xla_b=1", jaxlib="0.11.")
           + _table(cpu_flags.CpuKind("intel", "avx512"), "--xla_c=1", jaxlib="0.10."))
  assert cpu_flags.defaults_for(amd, "0.10.2", table) == ("--xla_a=1",)
  assert cpu_flags.defaults_for(amd, "0.11.0", table) == ("--xla_b=1",)
  assert cpu_flags.defaults_for(cpu_flags.CpuKind("amd", "avx2"), "0.10.2", table) == ()


def test_a_flag_the_user_gave_wins():
  merged, added = cpu_flags.merge("--xla_b=0 --xla_c", ("--xla_a=1", "--xla_b=1", "--xla_c=1"))
  assert merged == "--xla_b=0 --xla_c --xla_a=1" and added == ("--xla_a=1",)
  environ = {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=true"}
  table = _table(cpu_flags.detect(AMD_AVX512), "--xla_cpu_multi_thread_eigen=false")
  assert cpu_flags.apply(environ, AMD_AVX512, table) == ()
  assert environ == {"XLA_FLAGS": "--xla_cpu_multi_thread_eigen=true"}


def test_the_switch_turns_them_off_and_a_late_call_is_an_error():
  table = _table(cpu_flags.detect(AMD_AVX512), "--xla_cpu_multi_thread_eigen=false")
  environ = {"MPX_CPU_DEFAULTS": "0"}
  assert cpu_flags.apply(environ, AMD_AVX512, table) == ()
  assert "XLA_FLAGS" not in environ
  assert "off (MPX_CPU_DEFAULTS=0)" in cpu_flags.describe((), environ, AMD_AVX512)
  import jax
  jax.devices()  # The backend is up: XLA would ignore the flag.
  with pytest.raises(RuntimeError, match="before any jax computation"):
    cpu_flags.apply({}, AMD_AVX512, table)
  assert cpu_flags.apply({}, INTEL_AVX2, table) == ()  # Nothing to add: nothing to refuse.


# A table entry for this machine whose effect shows: XLA's host device count, which it reads
# with the other flags when the backend starts.
PATCH = """
import sys
from mpx.sweep import cpu_flags
cpu_flags.DEFAULTS = (cpu_flags.Default(cpu_flags.detect(), cpu_flags.jaxlib_version(),
                                        ("--xla_force_host_platform_device_count=3",), "test"),)
"""
THROUGH_CLI = PATCH + """
from mpx import cli
import jax
cli._run_command = lambda args: print("devices", jax.device_count()) or 0
sys.exit(cli.main(["run", "boolean_gotu"]))
"""
THROUGH_BENCHMARKS = PATCH + """
sys.path.insert(0, "benchmarks")
import run
import jax
print("devices", jax.device_count(), run.machine_lines("now", "c")[3])
"""


@pytest.mark.parametrize("code", [THROUGH_CLI, THROUGH_BENCHMARKS], ids=["mpx run", "run.py"])
def test_mpx_run_and_the_benchmarks_set_them_before_the_backend_starts(code):
  env = {k: v for k, v in os.environ.items() if k != "MPX_CPU_DEFAULTS"}  # conftest's
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                        env=env | {"JAX_PLATFORMS": "cpu"}, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert "devices 3" in done.stdout, done.stdout + done.stderr[-2000:]
  said = done.stdout if code is THROUGH_BENCHMARKS else done.stderr  # The report, mpx run.
  assert "--xla_force_host_platform_device_count=3" in said.split("mpx CPU defaults")[1], said
