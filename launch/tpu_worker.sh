#!/usr/bin/env bash
# The worker side of tpu_pod.sh: copied to every worker of the slice as ~/mpx-worker.sh and
# run there by `gcloud compute tpus tpu-vm ssh --worker=all`. Not meant to be run by hand.
#
# See usage() below.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bash ~/mpx-worker.sh SUBCOMMAND [ARGS...]   (on a worker; tpu_pod.sh runs it)

  install JAX_REQUIREMENT MPX_REQUIREMENT
      gcsfuse (from Google's apt repository) where it is missing; then, unless nothing
      changed since the last install (the requirements, ~/mpx-constraints.txt and the
      source in ~/mpx-src), a Python 3.12 venv ~/mpx-venv made by uv with both
      requirements under the constraints file
  start BUCKET MOUNT_DIR LOG_DIR STAMP -- COMMAND...
      mounts BUCKET at MOUNT_DIR (gcsfuse; skipped where it is mounted), then starts
      COMMAND detached from the ssh session (setsid, nohup) and returns; its stdout and
      stderr go to ~/mpx-jobs/STAMP/worker-N.log (N: this worker's number), which is
      copied to LOG_DIR every MPX_LOG_SYNC seconds (default 60) and when COMMAND ends;
      its exit status to ~/mpx-jobs/STAMP/worker-N.exit. Refused while a job runs.
  status
      one line: "worker N: running (since STAMP)", "worker N: exited CODE (STAMP)",
      "worker N: killed (STAMP)" (gone without an exit status) or "worker N: no job"
  logs LINES [--follow]
      the last LINES lines of the latest job's log (--follow: and what comes after)
  stop GRACE
      SIGTERM to the job (mpx saves a checkpoint and exits 143), SIGKILL after GRACE
      seconds; waits for it to end

environment (for tests): MPX_WORKER_ID (this worker's number; default: the metadata
server's agent-worker-number), MPX_LOG_SYNC (seconds between log copies)
EOF
}

die() {
  echo "mpx-worker.sh: $*" >&2
  exit 2
}

jobs_dir=$HOME/mpx-jobs
venv=$HOME/mpx-venv
constraints=$HOME/mpx-constraints.txt

worker_id() {  # this worker's number, as gcloud's --worker=N names it
  if [[ -n ${MPX_WORKER_ID:-} ]]; then
    echo "$MPX_WORKER_ID"
    return
  fi
  curl -fsS -H 'Metadata-Flavor: Google' \
    http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number \
    || die "cannot read this worker's number from the metadata server (is this a Cloud TPU VM?); set MPX_WORKER_ID"
}

# --- install --------------------------------------------------------------------------------

install_gcsfuse() {  # from Google's apt repository (the TPU images are Ubuntu), if missing
  command -v gcsfuse >/dev/null && return 0
  local key=/usr/share/keyrings/cloud.google.asc
  # The lock timeout: a fresh VM may still be running its own apt (unattended-upgrades).
  local apt=(sudo apt-get -o DPkg::Lock::Timeout=300)
  echo "deb [signed-by=$key] https://packages.cloud.google.com/apt gcsfuse-$(lsb_release -c -s) main" \
    | sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null
  curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee "$key" >/dev/null
  "${apt[@]}" update -qq
  "${apt[@]}" install -y -qq gcsfuse
}

install_fingerprint() {  # what the venv is built from: requirements, constraints, source
  {
    printf '%s\n' "$@"
    cat "$constraints"
    if [[ -d $HOME/mpx-src ]]; then
      (cd "$HOME/mpx-src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
    fi
  } | sha256sum | cut -d' ' -f1
}

cmd_install() {
  (($# == 2)) || die "install needs JAX_REQUIREMENT MPX_REQUIREMENT"
  [[ -f $constraints ]] || die "no $constraints: tpu_pod.sh install copies it here first"
  install_gcsfuse
  local fingerprint
  fingerprint=$(install_fingerprint "$@")
  if [[ -x $venv/bin/mpx && -f $venv/.mpx-install && $(<"$venv/.mpx-install") == "$fingerprint" ]]; then
    echo "$(hostname): mpx install unchanged, skipped"
  else
    # uv makes the venv: the TPU images ship Python 3.10, mpx needs 3.11 or newer.
    [[ -x $HOME/.local/bin/uv ]] || python3 -m pip install --quiet --user uv
    rm -rf "$venv"
    "$HOME/.local/bin/uv" venv --quiet --python 3.12 "$venv"
    "$HOME/.local/bin/uv" pip install --quiet --python "$venv/bin/python" -c "$constraints" "$@"
    echo "$fingerprint" >"$venv/.mpx-install"
  fi
  "$venv/bin/python" -c 'import socket, jax, mpx; print(socket.gethostname(), "mpx", mpx.__version__, "jax", jax.__version__)'
}

# --- the job --------------------------------------------------------------------------------

latest() {  # the latest job's stamp, or nothing
  [[ -f $jobs_dir/latest ]] && cat "$jobs_dir/latest"
  return 0
}

job_running() {  # whether the latest job's process group is alive
  local stamp pid
  stamp=$(latest)
  [[ -n $stamp && -f $jobs_dir/$stamp/pid ]] || return 1
  pid=$(<"$jobs_dir/$stamp/pid")
  kill -0 -- "-$pid" 2>/dev/null
}

copy_log() {  # $1 log file, $2 folder: a copy of the log there (a preempted VM's disk is gone)
  mkdir -p "$2" && cp "$1" "$2/" 2>/dev/null || echo "mpx-worker.sh: could not copy $1 to $2" >&2
}

cmd_job() {  # (internal) the detached job: COMMAND, its exit status, the log copies
  local pid_file=$1 exit_file=$2 log=$3 log_dir=$4
  shift 4
  (
    trap 'kill "$pause" 2>/dev/null; exit 0' TERM  # (no sleep left behind in the job's group)
    while :; do
      sleep "${MPX_LOG_SYNC:-60}" &
      pause=$!
      wait "$pause"
      copy_log "$log" "$log_dir"
    done
  ) &
  local syncer=$! job status seen signals=0
  # SIGTERM (stop) reaches COMMAND through the process group; this shell waits for it.
  # COMMAND's status is written by a subshell that runs it in the foreground: a `wait`
  # interrupted by the signal and re-entered after bash reaped the job returns no status.
  trap 'signals=$((signals + 1))' TERM
  rm -f "$exit_file.part"
  (trap : TERM; code=0; "$@" </dev/null || code=$?; echo "$code" >"$exit_file.part") &
  job=$!
  echo "$$" >"$pid_file"  # The process group (this session) is the job's.
  while :; do
    seen=$signals
    wait "$job" || true
    ((signals != seen)) || break  # returned without a signal: the subshell has ended
  done
  kill "$syncer" 2>/dev/null || true
  if ! status=$(<"$exit_file.part") || [[ ! $status =~ ^[0-9]+$ ]]; then
    status=1
    echo "mpx-worker.sh: the job ended without recording a status; recorded as 1"
  fi
  rm -f "$exit_file.part"
  echo "$status" >"$exit_file"
  echo "mpx-worker.sh: the job exited with status $status"
  copy_log "$log" "$log_dir"
  exit "$status"
}

mount_bucket() {  # $1 bucket, $2 folder: the bucket mounted there unless it is
  mountpoint -q "$2" && return 0
  sudo mkdir -p "$2"
  sudo chown "$(id -u):$(id -g)" "$2"
  # --rename-dir-limit: Orbax renames a finished checkpoint's temporary folder, which gcsfuse
  # refuses on a flat bucket without it (a bucket with hierarchical namespace renames natively).
  gcsfuse --implicit-dirs --rename-dir-limit=100000 "$1" "$2"
}

cmd_start() {
  (($# >= 6)) && [[ $5 == -- ]] || die "start needs BUCKET MOUNT_DIR LOG_DIR STAMP -- COMMAND..."
  local bucket=$1 mount_dir=$2 log_dir=$3 stamp=$4
  shift 5
  local id
  id=$(worker_id)
  if job_running; then
    die "worker $id: a job is running already (since $(latest)); stop it first: bash launch/tpu_pod.sh stop"
  fi
  mount_bucket "$bucket" "$mount_dir"
  local dir=$jobs_dir/$stamp
  mkdir -p "$dir"
  rm -f "$dir/pid" "$dir/worker-$id.exit"
  echo "$stamp" >"$jobs_dir/latest"
  local log=$dir/worker-$id.log
  echo "mpx-worker.sh: worker $id, started $stamp: $*" >>"$log"
  # setsid: its own session, so neither the end of the ssh session nor a hangup stops it.
  # (The log is passed on for the copies and appended to: no read and write in one pipe.)
  # shellcheck disable=SC2094
  setsid nohup bash "${BASH_SOURCE[0]}" _job "$dir/pid" "$dir/worker-$id.exit" "$log" \
    "$log_dir" "$@" >>"$log" 2>&1 </dev/null &
  local ticks=50
  while [[ ! -s $dir/pid ]] && ((ticks-- > 0)); do sleep 0.1; done
  [[ -s $dir/pid ]] || die "worker $id: the job did not start; see $log"
  echo "worker $id: started (log $log, copied to $log_dir every ${MPX_LOG_SYNC:-60} s)"
}

cmd_status() {
  local id stamp
  id=$(worker_id)
  stamp=$(latest)
  if [[ -z $stamp ]]; then
    echo "worker $id: no job"
  elif job_running; then
    echo "worker $id: running (since $stamp)"
  elif [[ -f $jobs_dir/$stamp/worker-$id.exit ]]; then
    echo "worker $id: exited $(<"$jobs_dir/$stamp/worker-$id.exit") ($stamp)"
  else
    echo "worker $id: killed ($stamp)"
  fi
}

cmd_logs() {
  [[ ${1:-} =~ ^[0-9]+$ ]] || die "logs needs a number of lines, e.g. logs 100"
  local stamp id
  stamp=$(latest)
  id=$(worker_id)
  [[ -n $stamp ]] || die "worker $id: no job has been started here"
  local follow=()
  [[ ${2:-} != --follow ]] || follow=(-f)
  echo "==> worker $id: $jobs_dir/$stamp/worker-$id.log"
  tail -n "$1" ${follow[@]+"${follow[@]}"} "$jobs_dir/$stamp/worker-$id.log"
}

cmd_stop() {
  [[ ${1:-} =~ ^[0-9]+$ ]] || die "stop needs a grace period in seconds, e.g. stop 120"
  local id stamp pid ticks
  id=$(worker_id)
  if ! job_running; then
    echo "worker $id: no job running"
    return 0
  fi
  stamp=$(latest)
  pid=$(<"$jobs_dir/$stamp/pid")
  kill -TERM -- "-$pid" 2>/dev/null || true
  ticks=$(($1 * 5))
  while job_running && ((ticks-- > 0)); do sleep 0.2; done
  if job_running; then
    echo "worker $id: still running $1 s after SIGTERM; SIGKILL"
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  echo "worker $id: stopped"
}

(($# > 0)) || { usage >&2; exit 2; }
subcommand=$1
shift
case $subcommand in
  -h | --help) usage ;;
  install) cmd_install "$@" ;;
  start) cmd_start "$@" ;;
  _job) cmd_job "$@" ;;
  status) cmd_status ;;
  logs) cmd_logs "$@" ;;
  stop) cmd_stop "$@" ;;
  *) die "unknown subcommand '$subcommand' (install, start, status, logs or stop)" ;;
esac
