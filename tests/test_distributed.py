"""Many processes give the single-device sweep: two real processes on localhost joined by
jax.distributed (CPU, gloo collectives), first a SLURM-detected job of 2 devices each (6
members on 4 devices) that a SIGTERM only one process sees stops with a checkpoint on both,
then that checkpoint resumed by 2 processes of 1 device each, end where one process on one
device ends. (8 devices in one process: tests/test_sweep_engine.py.)"""

import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import tempfile

import numpy as np
import pytest


ROOT = pathlib.Path(__file__).resolve().parents[1]
# 2Parity, default + mask, 3 seeds: 6 members (not a multiple of 4), 96 steps (one
# epoch), checkpoints every 16 (the last 2 kept), evaluations at 0, 48 and 96.
TINY = ["--set", "seeds=3", "--set", "eval_every=48"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


# One persistent compilation cache for this module's processes: the runs repeat programs
# (the same group on 1 device three times, on 2 processes twice), which halves the time.
_CACHE = {"JAX_COMPILATION_CACHE_DIR": tempfile.mkdtemp(prefix="mpx-test-jax-cache-"),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _env(devices: int, **extra) -> dict:
  env = {k: v for k, v in os.environ.items()  # conftest's MPX_CPU_DEFAULTS kept
         if (not k.startswith(("MPX_", "SLURM_")) or k == "MPX_CPU_DEFAULTS")
         and k != "XLA_FLAGS"}
  return env | _CACHE | {"JAX_PLATFORMS": "cpu",
                         "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "  # conftest's
                                      f"--xla_force_host_platform_device_count={devices}"
                         } | extra


def _mpx_run(out, devices, *args, env=None, processes=1, timeout=300):
  """`mpx run boolean_gotu --preset tiny` as `processes` processes of `devices` each."""
  command = [sys.executable, "-m", "mpx.cli", "run", "boolean_gotu", "--preset", "tiny", "--no-plots",
             "--out", str(out), *TINY, *args]
  if processes == 1:
    envs = [env or _env(devices)]
  else:
    port = _free_port()
    envs = [_env(devices, MPX_DISTRIBUTED="1", MPX_COORDINATOR=f"localhost:{port}",
                 MPX_NUM_PROCESSES=str(processes), MPX_PROCESS_ID=str(i))
            for i in range(processes)]
  procs = [subprocess.Popen(command, env=e, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for e in envs]
  outputs = [p.communicate(timeout=timeout)[0] for p in procs]
  for p, output in zip(procs, outputs):
    assert p.returncode == 0, output[-4000:]
  return outputs


def _metrics(run_dir):
  summary = json.loads((pathlib.Path(run_dir) / "summary.json").read_text())
  return [(m["scheme"], m["seed"], m["metrics"]) for m in summary["members"]]


def _assert_same(a, b, rtol):
  assert [(s, seed) for s, seed, _ in a] == [(s, seed) for s, seed, _ in b]
  for (_, _, x), (_, _, y) in zip(a, b):
    assert x.keys() == y.keys()
    for name in x:
      if x[name] is None or y[name] is None:  # E.g. no mask drift: an all-neutral mask.
        assert x[name] is y[name] is None, name
        continue
      np.testing.assert_allclose(x[name], y[name], rtol=rtol, atol=rtol, err_msg=name)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
  """The reference: one process, one device."""
  out = tmp_path_factory.mktemp("single") / "run"
  _mpx_run(out, 1)
  return _metrics(out)


def _slurm_job_id() -> int:
  """A job id whose coordinator port (JAX: 61440 + id mod 4096) is free here."""
  for job_id in range(4096):
    with socket.socket() as s:
      try:
        s.bind(("localhost", 61440 + job_id))
        return job_id
      except OSError:
        continue
  raise RuntimeError("no free port in 61440..65535")


@pytest.mark.slow
def test_sigterm_to_one_process_of_a_slurm_job_then_two_processes_resume(tmp_path, single):
  """The SLURM route (JAX detects the cluster from the SLURM_* variables srun sets), 2
  processes x 2 devices (6 members in 8 rows), and a SIGTERM that only process 1 sees: both
  save the same step and exit 143 (no deadlock in the collective save). `--resume` then
  continues that checkpoint on the MPX_* route in 2 processes x 1 device (6 rows): the run
  ends where one process on one device ends, and process 1 never prints (no banner, no
  progress, no summary)."""
  out = tmp_path / "run"
  job_id = _slurm_job_id()
  command = [sys.executable, "-m", "mpx.cli", "run", "boolean_gotu", "--preset", "tiny", "--no-plots",
             "--out", str(out), *TINY]
  procs = [subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env=_env(2, MPX_DISTRIBUTED="1", SLURM_JOB_ID=str(job_id),
                                     SLURM_STEP_NODELIST="localhost", SLURM_NTASKS="2",
                                     SLURM_PROCID=str(i), SLURM_LOCALID="0"))
           for i in range(2)]
  first = ""
  for line in procs[0].stdout:  # Process 0's first progress line: training has started.
    first += line
    if re.search(r"\] \d+/96 ", line):
      break
  procs[1].send_signal(signal.SIGTERM)
  outputs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [143, 143], outputs
  assert "4 cpu device(s)" in first                # One global mesh over both processes.
  assert "SIGTERM: saved group 2parity at step" in outputs[1]
  assert "device(s)" not in outputs[1] and "members)" not in outputs[1]  # No banner, progress.
  steps = [int(d.name) for d in next((out / "checkpoints").iterdir()).iterdir()
           if d.name.isdigit()]
  assert max(steps) < 96, steps
  resumed = _mpx_run(out, 1, "--resume", processes=2)
  assert "2 cpu device(s)" in resumed[0] and "# boolean_gotu (preset tiny)" in resumed[0]
  assert "# boolean_gotu" not in resumed[1]        # Process 1 writes and prints nothing:
  assert "device(s)" not in resumed[1] and "members)" not in resumed[1]
  records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
  assert sorted({r["step"] for r in records}) == [0, 48, 96]
  assert len(records) == 3 * 6                      # Every member once per evaluation.
  # Other device counts regroup the vmapped members: float32 differences in the last bits.
  _assert_same(_metrics(out), single, rtol=1e-5)


def test_half_given_cluster_variables_are_refused(monkeypatch):
  from mpx.sweep import distributed
  monkeypatch.setenv("MPX_COORDINATOR", "localhost:1234")
  monkeypatch.delenv("MPX_NUM_PROCESSES", raising=False)
  monkeypatch.delenv("MPX_PROCESS_ID", raising=False)
  with pytest.raises(ValueError, match="MPX_NUM_PROCESSES, MPX_PROCESS_ID not"):
    distributed.initialize()
