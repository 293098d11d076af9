"""mpx.xla_flags: the CPU flags are added once and never override the user's choice."""

import subprocess
import sys

from mpx import xla_flags


def test_adds_flags_to_empty_and_existing_settings():
  env = {}
  assert xla_flags.set_cpu_flags(env) == " ".join(xla_flags.CPU_FLAGS)
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  assert env["XLA_FLAGS"].split()[0] == "--xla_force_host_platform_device_count=2"
  xla_flags.set_cpu_flags(env)
  assert env["XLA_FLAGS"].split() == ["--xla_force_host_platform_device_count=2",
                                      *xla_flags.CPU_FLAGS]
  xla_flags.set_cpu_flags(env)  # Idempotent.
  assert len(env["XLA_FLAGS"].split()) == 1 + len(xla_flags.CPU_FLAGS)


def test_keeps_the_users_own_ynn_setting():
  env = {"XLA_FLAGS": f"{xla_flags.YNN_FUSION_FLAG}=dot"}
  assert xla_flags.set_cpu_flags(env) == f"{xla_flags.YNN_FUSION_FLAG}=dot"


def test_installed_jaxlib_accepts_the_flags():
  """XLA aborts the process on an unknown flag, so a jaxlib that renamed it must fail here."""
  code = ("from mpx import xla_flags; xla_flags.set_cpu_flags(); import jax.numpy as jnp; "
          "print(float(jnp.ones(3).sum()))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip().endswith("3.0")
