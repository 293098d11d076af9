"""The launchers' restart loops, against stand-ins for SLURM and gcloud, and a real one.

- `slurm_gpu.sbatch` under a stand-in `sbatch` that runs the script as SLURM would
  (a copy in a spool folder, SLURM_SUBMIT_DIR, SLURM_JOB_ID, SLURM_RESTART_COUNT; again
  while the job asked `scontrol requeue`; a SIGTERM to the script for the time limit's
  warning), with stand-ins for `srun` (the mpx step exits as each start's plan says, 143
  after a SIGTERM) and `scontrol`.
- `tpu_pod.sh` under a stand-in `gcloud` that keeps a slice's state (created, READY,
  PREEMPTED, a queued resource's states) and runs the workers' commands here, each worker
  a home folder of its own (a fresh one after every create: a new VM's disk), the bucket a
  folder; the workers' `mpx` is a stand-in that advances a step counter in the run folder,
  saves on SIGTERM (exit 143) and ends when the counter reaches its target.
- `local.sh` for real: 2 processes of `mpx run` joined by jax.distributed on CPU, one
  SIGKILLed mid-run, restarted by local.sh with the same command, ending bit for bit where
  an uninterrupted 2-process run ends.
"""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

pytestmark = pytest.mark.slow  # Real processes killed and restarted: the slow lane.

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAUNCH = ROOT / "launch"
TESTS = ROOT / "tests"


def _env(tmp_path, bin_dir=None, **extra):
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("SLURM_", "MPX_", "TPU_")) and k not in (
             "ZONE", "ACCELERATOR_TYPE", "PROJECT", "TFDS_DATA_DIR", "JAX_PLATFORMS")}
  env["CLOUDSDK_CONFIG"] = str(tmp_path / "gcloud-config")
  if bin_dir is not None:
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
  env.update(extra)
  return env


def _executable(path, text):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)
  path.chmod(0o755)


# --- SLURM -----------------------------------------------------------------------------------

SBATCH = f'''#!{sys.executable}
"""Stand-in sbatch: runs the batch script here as SLURM would, again after each requeue."""
import os, pathlib, shutil, signal, subprocess, sys, time
state = pathlib.Path(os.environ["STANDIN"])
args = sys.argv[1:]
while args[0].startswith("-"):
  args = args[1:]
script, *script_args = args
directives = [l for l in pathlib.Path(script).read_text().splitlines() if l.startswith("#SBATCH")]
(state / "directives").write_text("\\n".join(directives) + "\\n")
spool = state / "spool"  # SLURM runs a copy of the script, not the file in the checkout
spool.mkdir(exist_ok=True)
shutil.copy(script, spool / "slurm_script")
plan = (state / "plan").read_text().split()
start = 0
while True:
  (state / "requeued").unlink(missing_ok=True)
  env = dict(os.environ, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT=str(start),
             SLURM_JOB_NUM_NODES="1", SLURM_NTASKS="2", STANDIN_START=str(start),
             SLURM_SUBMIT_DIR=os.getcwd())
  job = subprocess.Popen(["bash", str(spool / "slurm_script"), *script_args], env=env)
  if plan[min(start, len(plan) - 1)] == "term":  # the time limit's warning: --signal=B:TERM
    deadline = time.time() + 60
    while not (state / f"running-{{start}}").exists() and time.time() < deadline:
      time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
  status = job.wait()
  with open(state / "jobs", "a") as f:
    f.write(f"start {{start}} exit {{status}}\\n")
  if not (state / "requeued").exists():
    sys.exit(status)
  start += 1
  if start > 20:
    sys.exit("stand-in sbatch: requeued more than 20 times")
'''

SRUN = '''#!/bin/bash
# Stand-in srun: the check step succeeds; the mpx step does what this start's plan says.
echo "srun $*" >> "$STANDIN/calls"
case " $* " in
  *" -c "*) echo "node0 mpx 0.0 jax 0.0"; exit 0 ;;
esac
plan=($(cat "$STANDIN/plan"))
n=${#plan[@]}
what=${plan[$((STANDIN_START < n ? STANDIN_START : n - 1))]}
echo "start $STANDIN_START: $what" >> "$STANDIN/calls"
case $what in
  ok) exit 0 ;;
  kill) exit 137 ;;
  refused) echo "mpx run: refused: the config differs" >&2; exit 3 ;;
  locked*)  # locked-N: the first N tries of this start find the run folder locked
    tries=$(( $(cat "$STANDIN/tries-$STANDIN_START" 2>/dev/null || echo 0) + 1 ))
    echo "$tries" > "$STANDIN/tries-$STANDIN_START"
    ((tries > ${what#locked-})) && exit 0
    echo "mpx run: locked: /shared/runs/gotu is being written by pid 7 on node9" >&2; exit 75 ;;
  fail) exit 1 ;;
  term)
    trap 'echo "srun: SIGTERM passed on, mpx saved" >> "$STANDIN/calls"; exit 143' TERM
    touch "$STANDIN/running-$STANDIN_START"
    for _ in $(seq 600); do sleep 0.05; done
    echo "start $STANDIN_START: no SIGTERM came in 30 s" >> "$STANDIN/calls"; exit 99 ;;
esac
'''

SCONTROL = '''#!/bin/bash
echo "scontrol $*" >> "$STANDIN/calls"
touch "$STANDIN/requeued"
'''


def _slurm(tmp_path, plan, **extra):
  """sbatch (the stand-in) of the script with `plan` (one word per start)."""
  state, bin_dir = tmp_path / "slurm", tmp_path / "slurm-bin"
  state.mkdir()
  (state / "plan").write_text(" ".join(plan))
  for name, text in (("sbatch", SBATCH), ("srun", SRUN), ("scontrol", SCONTROL)):
    _executable(bin_dir / name, text)
  venv = tmp_path / "venv"
  _executable(venv / "bin" / "mpx", "#!/bin/sh\n")
  env = _env(tmp_path, bin_dir, STANDIN=str(state), MPX_VENV=str(venv),
             MPX_OUT="/shared/runs/gotu", **extra)
  result = subprocess.run(["sbatch", "--nodes=1", "launch/slurm_gpu.sbatch", "boolean_gotu",
                           "--preset", "paper"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
  calls = (state / "calls").read_text().splitlines()
  jobs = (state / "jobs").read_text().splitlines()
  return result, calls, jobs, state


def _mpx_steps(calls):
  return [c for c in calls if c.startswith("srun ") and " run boolean_gotu " in c]


def test_slurm_requeues_after_the_time_limit_and_a_kill_then_ends(tmp_path):
  result, calls, jobs, state = _slurm(tmp_path, ["term", "kill", "ok"])
  assert result.returncode == 0, result.stderr
  assert jobs == ["start 0 exit 143", "start 1 exit 137", "start 2 exit 0"]
  # The same command every time: start-or-resume.
  steps = _mpx_steps(calls)
  assert len(steps) == 3 and len(set(steps)) == 1, steps
  assert steps[0].endswith(" run boolean_gotu --preset paper --distributed "
                           "--out /shared/runs/gotu --resume=auto")
  assert "srun: SIGTERM passed on, mpx saved" in calls       # The warning reached mpx.
  assert [c for c in calls if c.startswith("scontrol")] == ["scontrol requeue 4242"] * 2
  assert "requeueing the job (1 of at most 10)" in result.stderr
  assert "the run is done" in result.stderr
  directives = (state / "directives").read_text()
  for line in ("#SBATCH --requeue", "#SBATCH --signal=B:TERM@300", "#SBATCH --open-mode=append"):
    assert line in directives.splitlines()


def test_slurm_records_the_status_when_the_signal_reaches_srun_too(tmp_path):
  """scancel and a node's shutdown signal the batch shell and srun at once: the status
  the script acts on must be srun's own (143: requeue) however the two interleave; a
  `wait` re-entered after the trap once returned -1 (no requeue)."""
  state, bin_dir = tmp_path / "slurm", tmp_path / "slurm-bin"
  state.mkdir()
  (state / "plan").write_text("term")
  for name, text in (("srun", SRUN), ("scontrol", SCONTROL)):
    _executable(bin_dir / name, text)
  venv = tmp_path / "venv"
  _executable(venv / "bin" / "mpx", "#!/bin/sh\n")
  env = _env(tmp_path, bin_dir, STANDIN=str(state), MPX_VENV=str(venv), MPX_OUT="/runs/x",
             SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="0", SLURM_JOB_NUM_NODES="1",
             SLURM_NTASKS="2", STANDIN_START="0")
  outcomes = []
  for attempt in range(20):
    (state / "running-0").unlink(missing_ok=True)
    job = subprocess.Popen(["setsid", "bash", str(LAUNCH / "slurm_gpu.sbatch"), "boolean_gotu"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _eventually(lambda: (state / "running-0").exists(), bool, timeout=30)
    time.sleep(0.01 * (attempt % 5))
    os.killpg(job.pid, signal.SIGTERM)  # The batch shell and srun alike.
    _, err = job.communicate(timeout=30)
    outcomes.append("requeueing the job" in err)
  assert outcomes == [True] * 20


def test_slurm_requeues_a_bounded_number_of_times(tmp_path):
  result, calls, jobs, _ = _slurm(tmp_path, ["term"], MPX_MAX_REQUEUES="2")
  assert result.returncode == 143
  assert jobs == ["start 0 exit 143", "start 1 exit 143", "start 2 exit 143"]
  assert len([c for c in calls if c.startswith("scontrol")]) == 2
  assert "requeued 2 times (MPX_MAX_REQUEUES=2): not again" in result.stderr
  assert "Submit the same command to continue" in result.stderr


def test_slurm_waits_for_a_locked_run_directory_and_never_writes_beside_it(tmp_path):
  """Exit 75 (another process writes MPX_OUT, e.g. the previous allocation's): srun again
  every MPX_LOCK_RETRY seconds, within the job; after MPX_LOCK_WAIT seconds the job ends
  with 75, not requeued."""
  result, calls, jobs, _ = _slurm(tmp_path, ["locked-2"], MPX_LOCK_RETRY="1",
                                  MPX_LOCK_WAIT="5")
  assert result.returncode == 0 and jobs == ["start 0 exit 0"], result.stderr
  steps = _mpx_steps(calls)
  assert len(steps) == 3 and len(set(steps)) == 1, steps
  assert not [c for c in calls if c.startswith("scontrol")]
  for waited in (0, 1):
    assert (f"is being written by another process (exit status 75; mpx's line above names "
            f"it): trying again in 1 s ({waited} of at most 5 s waited") in result.stderr
  (tmp_path / "bounded").mkdir()
  result, calls, jobs, _ = _slurm(tmp_path / "bounded", ["locked-99"], MPX_LOCK_RETRY="1",
                                  MPX_LOCK_WAIT="2")
  assert result.returncode == 75 and jobs == ["start 0 exit 75"], result.stderr
  assert len(_mpx_steps(calls)) == 3 and not [c for c in calls if c.startswith("scontrol")]
  assert ("is still being written by another process after 2 s (exit status 75; mpx's "
          "line above names it; MPX_LOCK_WAIT=2): not requeued") in result.stderr


@pytest.mark.parametrize("what, status, message", [
    ("refused", 3, "holds another run"), ("fail", 1, "not requeued")])
def test_slurm_does_not_requeue_a_refused_or_failed_run(tmp_path, what, status, message):
  result, calls, jobs, _ = _slurm(tmp_path, [what])
  assert result.returncode == status and jobs == [f"start 0 exit {status}"]
  assert not [c for c in calls if c.startswith("scontrol")]
  assert message in result.stderr


# --- TPU pod ---------------------------------------------------------------------------------

GCLOUD = f'''#!{sys.executable}
"""Stand-in gcloud: one slice's state in a JSON file, its workers' commands run here."""
import json, os, pathlib, re, shutil, signal, subprocess, sys
root = pathlib.Path(os.environ["STANDIN"])
args = sys.argv[1:]
with open(root / "calls", "a") as f:
  f.write(json.dumps(args) + "\\n")
state_file = root / "state.json"
state = json.loads(state_file.read_text()) if state_file.exists() else {{}}
config = json.loads((root / "config.json").read_text())
workers = root / "workers"

def save():
  state_file.write_text(json.dumps(state))

def kill_jobs():  # the VMs go: every job's process group is killed
  for pid_file in workers.glob("*/mpx-jobs/*/pid"):
    try:
      os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    except (ProcessLookupError, ValueError):
      pass

def new_vms():  # fresh disks
  kill_jobs()
  shutil.rmtree(workers, ignore_errors=True)
  for i in range(config["workers"]):
    (workers / str(i)).mkdir(parents=True)

def option(name):
  return next(a.split("=", 1)[1] for a in args if a.startswith(name + "="))

if args[:3] == ["config", "get-value", "project"]:
  sys.exit(0)
if args[:2] == ["storage", "cp"]:
  src, dest = args[-2], args[-1]
  local = root / "gcs" / src[len("gs://"):]
  shutil.copytree(local, pathlib.Path(dest) / local.name, dirs_exist_ok=True)
  sys.exit(0)
kind, verb = args[2], args[3]  # compute tpus KIND VERB
if verb == "describe":
  # Events, each once and in order, when the run has reached their step (the workers'
  # mpx holds there until the event releases it): a preemption, say.
  steps_file = root / "gcs" / "my-bucket" / "mpx" / "run" / "steps"
  steps = int(steps_file.read_text()) if steps_file.exists() else 0
  fired = state.setdefault("fired", 0)
  events = config.get("events", [])
  if fired < len(events) and steps >= events[fired]["at_steps"]:
    event = events[fired]
    state.update(event.get("state", {{}}))
    if event.get("kill"):
      kill_jobs()
    (root / f"hold-{{event['at_steps']}}").unlink(missing_ok=True)
    state["fired"] = fired + 1
  if kind == "queued-resources" and state.get("queued") == "WAITING_FOR_RESOURCES":
    if state.get("waits", 0) > 0:
      state["waits"] -= 1
    else:
      state["queued"], state["node"] = "ACTIVE", "READY"
      new_vms()
  save()
  key = "node" if kind == "tpu-vm" else "queued"
  if state.get(key) is None:
    print("ERROR: (gcloud.compute.tpus.describe) NOT_FOUND: Resource not found", file=sys.stderr)
    sys.exit(1)
  print(state[key])
elif verb == "create":
  state["creates"] = state.get("creates", 0) + 1
  if state["creates"] in config.get("fail_creates", []):
    save()
    print("ERROR: (gcloud.compute.tpus.create) There is no more capacity in the zone",
          file=sys.stderr)
    sys.exit(1)
  if kind == "queued-resources" and config.get("queued_waits"):
    state["queued"], state["waits"] = "WAITING_FOR_RESOURCES", config["queued_waits"]
  else:
    state["queued"] = "ACTIVE" if kind == "queued-resources" else state.get("queued")
    state["node"] = "READY"
    new_vms()
  save()
elif verb == "delete":
  kill_jobs()
  state["node"] = None
  if kind == "queued-resources":
    state["queued"] = None
  save()
elif verb == "scp":
  files = [a for a in args[4:] if not a.startswith("-")][:-1]
  for home in workers.iterdir():
    for name in files:
      shutil.copy(name, home / pathlib.Path(name).name)
elif verb == "ssh":
  if state.get("node") != "READY":
    print("ERROR: the TPU is not READY", file=sys.stderr)
    sys.exit(1)
  which = option("--worker")
  command = args[args.index("--command") + 1].replace("/mnt/gcs", str(root / "gcs")).replace(
      "gs://", str(root / "gcs") + "/")  # The run folder: a URL, through the same "bucket".
  status = 0
  for i in range(config["workers"]) if which == "all" else [int(which)]:
    env = dict(os.environ, HOME=str(workers / str(i)), MPX_WORKER_ID=str(i),
               PATH=f"{{root / 'worker-bin'}}{{os.pathsep}}{{os.environ['PATH']}}")
    done = subprocess.run(["bash", "-c", command], env=env, stdin=subprocess.DEVNULL)
    status = status or done.returncode
  sys.exit(status)
else:
  sys.exit(f"stand-in gcloud: unexpected {{args}}")
'''

# The workers' tools: sudo runs the command (apt-get and tee are swallowed), gcsfuse "mounts"
# by marking the folder, uv makes a venv whose mpx is MPX_STANDIN below.
WORKER_TOOLS = {
    "sudo": '#!/bin/bash\ncase $1 in apt-get | tee) cat >/dev/null 2>&1 || true ;; '
            '*) "$@" ;; esac\n',
    "lsb_release": "#!/bin/sh\necho jammy\n",
    "curl": "#!/bin/sh\n",
    "gcsfuse": '#!/bin/bash\necho "gcsfuse $*" >> "$STANDIN/worker-calls"\n'
               'mkdir -p "${@: -1}" && touch "${@: -1}/.mounted"\n',
    "mountpoint": '#!/bin/bash\n[ -e "$2/.mounted" ]\n',
    "python3": '#!/bin/bash\necho "python3 $*" >> "$STANDIN/worker-calls"\n'
               'mkdir -p ~/.local/bin && cp "$STANDIN/uv" ~/.local/bin/uv\n',
}
UV = '''#!/bin/bash
echo "uv $*" >> "$STANDIN/worker-calls"
if [ "$1" = venv ]; then
  dir=${@: -1}
  mkdir -p "$dir/bin"
  cp "$STANDIN/mpx" "$dir/bin/mpx"
  printf '#!/bin/sh\\necho "$(hostname) mpx 0.0 jax 0.0"\\n' > "$dir/bin/python"
  chmod +x "$dir/bin/python"
fi
'''
# The workers' mpx: worker 0 counts steps in the run folder (the bucket), every worker ends
# when the counter reaches STANDIN/target; SIGTERM: "saved", 143. STANDIN/exit-N: worker 0
# exits N at the step written in it (once); STANDIN/hold-N: worker 0 waits at step N while
# the file is there (the stand-in gcloud removes it when its event at that step fires).
MPX = '''#!/bin/bash
out=""
for ((i = 1; i <= $#; i++)); do
  [ "${!i}" = --out ] && { j=$((i + 1)); out=${!j}; }
done
echo "mpx $*" >> "$STANDIN/worker-calls"
case " $* " in *" --resume=auto "*) ;; *) echo "no --resume=auto" >&2; exit 2 ;; esac
trap 'echo "mpx: SIGTERM, saved"; exit 143' TERM
echo "mpx: worker $MPX_WORKER_ID starts at step $(cat "$out/steps" 2>/dev/null || echo 0)"
mkdir -p "$out"
target=$(cat "$STANDIN/target")
while :; do
  [ -f "$out/summary.json" ] && { echo "mpx: done"; exit 0; }
  if [ "$MPX_WORKER_ID" = 0 ]; then
    n=$(( $(cat "$out/steps" 2>/dev/null || echo 0) + 1 ))
    echo "$n" > "$out/steps.tmp" && mv "$out/steps.tmp" "$out/steps"
    [ "$n" -ge "$target" ] && { echo '{}' > "$out/summary.json"; echo "mpx: done"; exit 0; }
    for f in "$STANDIN"/exit-*; do
      [ -f "$f" ] && [ "$(cat "$f")" = "$n" ] && { rm "$f"; exit "${f##*-}"; }
    done
    while [ -e "$STANDIN/hold-$n" ]; do sleep 0.05 & wait $!; done
  fi
  sleep 0.02 & wait $!
done
'''

TPU_VARS = dict(TPU_NAME="mpx-v4-16", ZONE="us-central2-b", ACCELERATOR_TYPE="v4-16",
                PROJECT="my-project", MPX_OUT="gs://my-bucket/mpx/run")


@pytest.fixture
def pod(tmp_path):
  """The stand-in gcloud and workers; `pod(args, **config)` runs tpu_pod.sh with them."""
  root = tmp_path / "pod"
  (root / "gcs" / "my-bucket").mkdir(parents=True)
  bin_dir = tmp_path / "pod-bin"
  _executable(bin_dir / "gcloud", GCLOUD)
  for name, text in WORKER_TOOLS.items():
    _executable(root / "worker-bin" / name, text)
  _executable(root / "uv", UV)
  _executable(root / "mpx", MPX)
  (root / "target").write_text("25")
  (root / "config.json").write_text(json.dumps({"workers": 2}))
  env = _env(tmp_path, bin_dir, STANDIN=str(root), MPX_PYTHON=sys.executable,
             MPX_LOG_SYNC="1", MPX_FETCH_DIR=str(tmp_path / "fetched"),
             # Its own build folder: CI's two Python lines run this file at once in one checkout.
             MPX_BUILD_DIR=str(tmp_path / "build"),
             # The workers' mpx is a stand-in: no check compiles the paper preset here
             # (tests/test_launch.py checks that run, all and watch call it).
             MPX_PREFLIGHT="0", **TPU_VARS)

  def run(*args, timeout=240, env_extra=None, **config):
    if config:
      (root / "config.json").write_text(json.dumps({"workers": 2} | config))
    return subprocess.run(["bash", str(LAUNCH / "tpu_pod.sh"), *args], cwd=tmp_path,
                          env=env | (env_extra or {}), capture_output=True, text=True,
                          timeout=timeout)

  run.root = root
  yield run
  for pid_file in root.glob("workers/*/mpx-jobs/*/pid"):  # No job outlives the test.
    try:
      os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    except (ProcessLookupError, ValueError):
      pass


def _eventually(get, ok, timeout=60):
  """`get()` once `ok` holds for it (checked every 0.2 s), or a failure after `timeout` s."""
  deadline = time.monotonic() + timeout
  while True:
    value = get()
    if ok(value):
      return value
    assert time.monotonic() < deadline, value
    time.sleep(0.2)


def _calls(root):
  return [json.loads(line) for line in (root / "calls").read_text().splitlines()]


def _verbs(root):
  return [" ".join(c[2:4]) for c in _calls(root) if c[:2] == ["compute", "tpus"]]


def _starts(root):
  """The workers' mpx command lines, one per start and worker."""
  return [line for line in (root / "worker-calls").read_text().splitlines()
          if line.startswith("mpx ")]


ARGS = ["--", "boolean_gotu", "--preset", "paper"]


def test_pod_run_is_detached_with_status_logs_and_stop(pod, tmp_path):
  root = pod.root
  assert pod("create").returncode == 0
  result = pod("install")
  assert result.returncode == 0, result.stderr
  calls = (root / "worker-calls").read_text()
  assert calls.count("uv venv") == 2 and calls.count("uv pip install") == 2
  pip = next(line for line in calls.splitlines() if line.startswith("uv pip install"))
  jax_version = re.search(r"^jax==(\S+)$", (root / "workers" / "0" / "mpx-constraints.txt")
                          .read_text(), re.M).group(1)
  assert f"jax[tpu]=={jax_version}" in pip and "-c " in pip
  (root / "worker-calls").write_text("")
  result = pod("install")  # Nothing changed: skipped on every worker.
  assert result.returncode == 0 and "uv " not in (root / "worker-calls").read_text()
  assert result.stdout.count("mpx install unchanged, skipped") == 2
  (root / "target").write_text("100000")  # Runs until stopped.
  start = time.monotonic()
  result = pod("run", *ARGS)
  assert result.returncode == 0, result.stderr
  assert time.monotonic() - start < 60  # Returned; the job runs on.
  assert "started (log" in result.stdout and "run folder gs://my-bucket/mpx/run" in result.stderr
  assert "the devices per host and the padding rows" in result.stderr
  status = pod("status")
  assert "READY" in status.stdout
  assert re.search(r"worker 0: running \(since \d{8}T\d{6}Z\)", status.stdout), status.stdout
  assert "worker 1: running" in status.stdout
  logs = _eventually(lambda: pod("logs", "--worker", "1", "--lines", "5").stdout,
                     lambda out: re.search(r"^mpx: worker 1 starts at step \d+$", out, re.M))
  assert "==> worker 1:" in logs and "worker 0" not in logs
  bucket_logs = root / "gcs" / "my-bucket" / "mpx" / "run" / "logs"  # Copied every second.
  copies = _eventually(lambda: sorted(bucket_logs.glob("*/worker-*.log")),
                       lambda found: len(found) == 2 and all(
                           "mpx: worker" in p.read_text() for p in found))
  assert [p.name for p in copies] == ["worker-0.log", "worker-1.log"]
  assert "run boolean_gotu" in copies[0].read_text()
  assert pod("run", *ARGS).returncode != 0  # One job at a time.
  result = pod("stop", "--grace", "10")
  assert result.returncode == 0 and result.stdout.count("stopped") == 2
  status = pod("status").stdout
  assert "worker 0: exited 143" in status and "worker 1: exited 143" in status
  logs = pod("logs", "--worker", "0").stdout
  assert "mpx: SIGTERM, saved" in logs and "the job exited with status 143" in logs


def test_pod_watch_recreates_a_preempted_slice_and_restarts_a_stopped_job(pod, tmp_path):
  """No slice: watch creates it, installs, runs. At step 10 it is PREEMPTED (the jobs die
  with the VMs): deleted, and created (the first try finds no capacity: tried again),
  installed, run again; at step 15 worker 0's job exits 143 alone: stopped everywhere and
  run again. At 25 the run is done and fetched."""
  root = pod.root
  (root / "target").write_text("25")
  (root / "hold-10").touch()       # Preempted at step 10,
  (root / "exit-143").write_text("15")  # worker 0's job stopped at 15, done at 25.
  result = pod("watch", "--interval", "0", *ARGS, fail_creates=[2],
               events=[{"at_steps": 10, "state": {"node": "PREEMPTED"}, "kill": True}])
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  verbs = _verbs(root)
  assert verbs.count("tpu-vm create") == 3 and verbs.count("tpu-vm delete") == 1, verbs
  assert "the slice is PREEMPTED: restart 1 of at most 10" in result.stderr
  assert "no more capacity" in result.stderr
  assert "creating, installing or starting on the slice failed (above): restart 2 of at most 10" in result.stderr
  assert ("the job stopped (preempted, killed, or storage unavailable: exit status 69) on a "
          "worker: restart 3 of at most 10") in result.stderr
  starts = _starts(root)
  assert len(starts) == 6 and len(set(starts)) == 1, starts  # 3 starts x 2 workers, one command.
  assert starts[0] == ("mpx run boolean_gotu --preset paper --distributed "
                       f"--out {root}/gcs/my-bucket/mpx/run --resume=auto")
  assert json.loads((tmp_path / "fetched" / "run" / "summary.json").read_text()) == {}
  assert (tmp_path / "fetched" / "run" / "steps").read_text().strip() == "25"
  # Every start's logs go to the bucket, in a folder of its own (the first start's only if
  # it lived to its first copy, MPX_LOG_SYNC=1 s); the last start's end with the run's.
  logs = sorted((root / "gcs" / "my-bucket" / "mpx" / "run" / "logs").iterdir())
  assert len(logs) in (2, 3), logs
  assert sorted(p.name for p in logs[-1].iterdir()) == ["worker-0.log", "worker-1.log"]
  assert "mpx: done" in (logs[-1] / "worker-1.log").read_text()
  assert "mpx: SIGTERM, saved" in (logs[-2] / "worker-1.log").read_text()  # The stop.
  assert "the run is done on every worker" in result.stderr


def test_pod_watch_queued_resource_waits_and_is_recreated(pod, tmp_path):
  """TPU_QUEUED=1: a queued resource, WAITING_FOR_RESOURCES twice, then ACTIVE; SUSPENDED
  at step 10 (a Spot preemption): deleted with --force, queued again, run to the end."""
  root = pod.root
  (root / "hold-10").touch()
  result = pod("watch", "--interval", "0", *ARGS, env_extra={"TPU_QUEUED": "1", "TPU_SPOT": "1"},
               events=[{"at_steps": 10, "state": {"queued": "SUSPENDED", "node": None},
                        "kill": True}],
               queued_waits=2)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  creates = [c for c in _calls(root) if c[2:4] == ["queued-resources", "create"]]
  assert len(creates) == 2 and "--spot" in creates[0] and "--node-id=mpx-v4-16" in creates[0]
  deletes = [c for c in _calls(root) if c[3] == "delete"]
  assert deletes == [["compute", "tpus", "queued-resources", "delete", "mpx-v4-16",
                      "--zone=us-central2-b", "--project=my-project", "--force", "--quiet"]]
  assert "the queued resource mpx-v4-16 is WAITING_FOR_RESOURCES" in result.stderr
  assert "the slice is SUSPENDED: restart 1" in result.stderr
  assert len(set(_starts(root))) == 1 and len(_starts(root)) == 4
  assert (tmp_path / "fetched" / "run" / "summary.json").exists()


def test_pod_watch_stops_at_the_restart_limit_and_on_a_failure(pod, tmp_path):
  root = pod.root
  (root / "hold-3").touch()
  result = pod("watch", "--interval", "0", "--max-restarts", "0", *ARGS,
               events=[{"at_steps": 3, "state": {"node": "PREEMPTED"}, "kill": True}])
  assert result.returncode == 5, result.stderr[-3000:]  # Not mpx's 4 (a storage fault).
  assert "0 restarts are done (--max-restarts): stopping here" in result.stderr
  assert _verbs(root).count("tpu-vm create") == 1
  (root / "exit-3").write_text("5")  # mpx refuses (another run in the folder): no restart.
  (root / "state.json").write_text(json.dumps({"node": "READY"}))
  for pid_file in root.glob("workers/*/mpx-jobs/*/pid"):
    try:
      os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    except ProcessLookupError:
      pass
  for jobs in root.glob("workers/*/mpx-jobs"):
    shutil.rmtree(jobs)
  result = pod("watch", "--interval", "0", *ARGS, events=[])
  assert result.returncode == 3, result.stderr[-3000:]
  assert "no job on the slice: installing and starting it" in result.stderr
  assert "the job failed with status 3" in result.stderr and "restart 1" not in result.stderr


def test_pod_watch_runs_a_job_whose_storage_stayed_unavailable_again(pod):
  """Exit 69 on a worker (a storage fault that may pass outlasted mpx's retries): watch
  stops the job and runs it again, as after a preemption, counted in --max-restarts."""
  root = pod.root
  (root / "exit-69").write_text("1")  # Worker 0's storage fails past its retries, once.
  result = pod("watch", "--interval", "0", *ARGS, events=[])
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("the job stopped (preempted, killed, or storage unavailable: exit status 69) on a "
          "worker: restart 1 of at most 10") in result.stderr
  assert len(_starts(root)) == 4 and len(set(_starts(root))) == 1


def test_pod_watch_runs_a_locked_job_again(pod):
  """Exit 75 on a worker (another process writes the run folder): watch stops the job and
  runs it again after --interval, as after a preemption, counted in --max-restarts."""
  root = pod.root
  (root / "exit-75").write_text("2")  # Worker 0 finds the folder locked, once.
  result = pod("watch", "--interval", "0", *ARGS, events=[])
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("the run folder is being written by another process (exit status 75: its holder "
          "is named in the log, bash launch/tpu_pod.sh logs); trying again, never beside "
          "it: restart 1 of at most 10") in result.stderr
  assert len(_starts(root)) == 4 and len(set(_starts(root))) == 1


# --- local.sh --------------------------------------------------------------------------------

FLAKY = """import os, signal, sys, pathlib, time
root, me = pathlib.Path(sys.argv[1]), os.environ['MPX_PROCESS_ID']
count = root / f"starts-{me}"
n = int(count.read_text()) if count.exists() else 0
count.write_text(str(n + 1))
print("start", n, "port", os.environ["MPX_COORDINATOR"].split(":")[1], flush=True)
(root / f"printed-{me}-{n}").touch()
if me == "1" and n < int(sys.argv[2]):
  deadline = time.time() + 60  # Process 0 has started and printed (it may lag under load).
  while not (root / f"printed-0-{n}").exists() and time.time() < deadline:
    time.sleep(0.01)
  os.kill(os.getpid(), getattr(signal, sys.argv[3]))
"""


def test_worker_job_records_the_status_of_a_stopped_command(tmp_path):
  """`stop` sends SIGTERM to the job's whole process group, wrapper included. The status
  the wrapper records must be the command's own (143 here) however the signal and the
  command's exit interleave: a re-entered `wait` once recorded -1 in about half the tries."""
  command = ["bash", "-c", 'trap "exit 143" TERM; echo started >"$0"; sleep 100 & wait',
             str(tmp_path / "started")]
  statuses = []
  for attempt in range(20):
    for name in ("pid", "exit", "started"):
      (tmp_path / name).unlink(missing_ok=True)
    job = subprocess.Popen(
        ["setsid", "bash", str(LAUNCH / "tpu_worker.sh"), "_job", str(tmp_path / "pid"),
         str(tmp_path / "exit"), str(tmp_path / "log"), str(tmp_path / "logs"), *command],
        env=_env(tmp_path, MPX_LOG_SYNC="100"), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    pid = tmp_path / "pid"
    _eventually(lambda: (tmp_path / "started").exists() and pid.exists() and
                pid.read_text().strip(), bool, timeout=30)
    time.sleep(0.01 * (attempt % 5))  # The signal at several points of the command's life.
    os.killpg(int(pid.read_text()), signal.SIGTERM)
    job.wait(timeout=30)
    statuses.append((tmp_path / "exit").read_text().strip())
  assert statuses == ["143"] * 20


@pytest.mark.parametrize("signum, status", [("SIGKILL", 137), ("SIGTERM", 143)])
def test_local_restarts_are_bounded(tmp_path, signum, status):
  """Process 1 dies (SIGKILL) or is stopped (SIGTERM) on its first 2 starts: with the
  default 3 restarts the third start ends the run (exit 0), with --restarts 1 local.sh
  gives up after one restart with the status; every start gets a new coordinator port."""
  code = [sys.executable, "-c", FLAKY, str(tmp_path), "2", signum]
  run = lambda *args: subprocess.run(
      ["bash", str(LAUNCH / "local.sh"), "2", "--devices", "1", "--grace", "2", *args, "--",
       *code], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
  result = run()
  assert result.returncode == 0, result.stderr
  assert (tmp_path / "starts-0").read_text() == (tmp_path / "starts-1").read_text() == "3"
  assert result.stderr.count(f"after exit status {status}") == 2
  ports = set(re.findall(r"\[0\] start \d port (\d+)", result.stdout))
  assert len(ports) == 3, result.stdout
  for path in [*tmp_path.glob("starts-*"), *tmp_path.glob("printed-*")]:
    path.unlink()
  result = run("--restarts", "1")
  assert result.returncode == status, result.stderr
  assert (tmp_path / "starts-1").read_text() == "2"
  assert f"stopped with status {status} after 1 restarts (--restarts)" in result.stderr


# --- local.sh, for real ----------------------------------------------------------------------

TOY = str(TESTS / "toy_experiment.py")
SETS = ["--no-plots", "--set", "steps=8", "--set", "seeds=1", "--set", "checkpoint_every=4"]
_CACHE = {"JAX_COMPILATION_CACHE_DIR": tempfile.mkdtemp(prefix="mpx-test-launch-"),
          "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
          "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
# The command of every process: mpx run, where process 1 SIGKILLs itself once (the marker
# file says it did) while toy_a's chunk from step 4 to 6 runs (tests/test_resume_auto.py).
KILL_ONCE = (
    "import os, signal, sys; sys.path.insert(0, {tests!r}); import test_resume_auto as t\n"
    "marker = {marker!r}\n"
    "if os.environ['MPX_PROCESS_ID'] == '1' and not os.path.exists(marker):\n"
    "  open(marker, 'w').close(); t._arm('mid-chunk', signal.SIGKILL, setattr)\n"
    "from mpx import cli; sys.exit(cli.main(sys.argv[1:]))\n")


def _local(tmp_path, out, *extra_args, code):
  command = [sys.executable, "-c", code]
  env = _env(tmp_path, **_CACHE)
  env["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "")  # conftest's, before local.sh's count
  return subprocess.run(["bash", str(LAUNCH / "local.sh"), "2", "--devices", "1", "--grace", "1",
                         *extra_args, "--", *command, "run", TOY, "--out", str(out),
                         "--resume=auto", *SETS], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=900)


def test_local_restarts_a_killed_process_and_ends_equal(tmp_path):
  """The reference: the run uninterrupted on the same 2 devices, in one process (the same
  mesh and rows per device as 2 processes of one device each)."""
  reference = tmp_path / "reference"
  env = _env(tmp_path, **_CACHE, JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"
  done = subprocess.run([sys.executable, "-m", "mpx.cli", "run", TOY, "--out", str(reference),
                         "--resume=auto", *SETS], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=900)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "devices: 2 cpu, 1 process(es) x 2 per host" in done.stderr
  out = tmp_path / "killed"
  code = KILL_ONCE.format(tests=str(TESTS), marker=str(tmp_path / "killed-once"))
  result = _local(tmp_path, out, code=code)
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
  assert "local.sh: 2 processes x 1 CPU devices, run folder" in result.stderr
  assert "[0] devices: 2 cpu, 2 process(es) x 1 per host" in result.stdout
  assert (tmp_path / "killed-once").exists()
  assert "process 1 exited with status 137; stopping the others" in result.stderr
  assert "restart 1 of at most 3 after exit status 137" in result.stderr
  assert "(resuming: toy_a from step 4" in result.stdout
  from test_resume_auto import _assert_same_run  # Params, metrics, summaries: bit for bit.
  _assert_same_run(reference, out)
