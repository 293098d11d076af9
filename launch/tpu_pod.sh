#!/usr/bin/env bash
# A Cloud TPU VM slice for `mpx run ... --distributed`: create it, install mpx on every worker,
# start the run detached on every worker (the run folder in a bucket, mounted on every worker
# with Cloud Storage FUSE), follow it, re-create a preempted slice and restart until the run
# is done, copy the run folder back, delete the slice.
#
#   export TPU_NAME=mpx-v4-32 ZONE=us-central2-b ACCELERATOR_TYPE=v4-32 PROJECT=my-project \
#          MPX_OUT=gs://my-bucket/mpx/boolean_paper
#   bash launch/tpu_pod.sh watch -- boolean_gotu --preset paper
#   bash launch/tpu_pod.sh delete
#
# See usage() below, or `bash launch/tpu_pod.sh --help`.
set -euo pipefail
me=tpu_pod.sh
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # say, die, quote, the option checks
quote_tilde="~?"  # ~/ in the workers' commands is for the worker's shell to expand

usage() {
  cat <<'EOF'
usage: bash launch/tpu_pod.sh [OPTIONS] SUBCOMMAND [-- EXPERIMENT [MPX RUN ARGS...]]

subcommands:
  create    the slice: gcloud compute tpus tpu-vm create TPU_NAME (ACCELERATOR_TYPE,
            TPU_VERSION, --spot with TPU_SPOT=1), or with TPU_QUEUED=1 a queued resource
            of that name (gcloud compute tpus queued-resources create), waited for until
            ACTIVE
  install   on every worker: gcsfuse (Cloud Storage FUSE, from its apt repository; skipped
            where it is installed) and a Python 3.12 venv ~/mpx-venv (made with uv) with
            "jax[tpu]==V", V the jax version of MPX_PYTHON here, and mpx, every dependency
            pinned to the version MPX_PYTHON's environment has (launch/tpu_constraints.py
            writes the constraints file; platform-specific wheels such as jaxlib and CUDA's
            are left to the workers). Skipped on a worker where nothing changed since its
            last install (the constraints, the requirements, mpx's source). mpx comes from
            this checkout, copied as a tarball (uncommitted changes included), or from
            `pip install git+$MPX_REPO` when MPX_REPO is set
  run       start the run on every worker, detached, and return:
              ~/mpx-venv/bin/mpx run EXPERIMENT [ARGS...] --distributed
                --out gs://BUCKET/PATH --resume=auto
            (MPX_OUT as a URL: the run folder's lock is the bucket's object, which keeps
            out a second writer from any host; a FUSE mount's lock holds on one host),
            after mounting the bucket at /mnt/gcs/BUCKET (for the logs and datasets)
            (gcsfuse; skipped where it is mounted). --resume=auto: the same command starts
            the run and continues it after any stop. Each worker logs to
            ~/mpx-jobs/STAMP/worker-N.log (N: the worker's number, as --worker=N names it),
            copied to MPX_OUT/logs/STAMP/ every MPX_LOG_SYNC seconds and at the end
  status    the slice's state and, on every worker, the job's: running, exited CODE
            (0 done, 143 preempted and saved, see launch/README.md), killed, or no job
  logs      the last lines of every worker's log (--worker N: one worker's; --lines N;
            --follow)
  stop      SIGTERM to the job on every worker (mpx saves a checkpoint and exits 143),
            SIGKILL after --grace seconds
  watch     until the run is done: create the slice if it is missing, install and run; then
            every --interval seconds check the slice and the job; a preempted or vanished
            slice is deleted, created, installed and run again (a failed create is tried
            again), a job that stopped with 143 (preempted), 137 (killed) or 69 (storage
            unavailable past mpx's retries), or was refused with 75 (another process
            writes the run folder: tried again every --interval seconds, never beside it)
            is run again, at most --max-restarts times in all (then exit 5, a status of
            its own); when every worker exited 0, fetch. A job that
            failed otherwise (1 failed, 2 error, 3 refused) ends the watch with its
            status. Run it where it outlives
            your terminal: `nohup bash launch/tpu_pod.sh watch -- ... > watch.log 2>&1 &`
            on a small VM (or in tmux there)
  fetch     gcloud storage cp --recursive gs://BUCKET/PATH $MPX_FETCH_DIR/ (from this machine)
  delete    the slice (and its queued resource with TPU_QUEUED=1); gcloud asks to confirm
            (--quiet does not ask)
  all       create, install, run (detached; then status, logs, watch or fetch)

Before run, all and watch create a slice or start a job, `mpx compile` (with MPX_PYTHON,
which needs mpx's aot extra) compiles the job's programs for ACCELERATOR_TYPE's topology on
this machine: a job that does not fit the chips' memory, or does not compile, stops there
in one line (exit 2) before anything is created or started (docs/hosts.md, "Check before
you pay"). --no-preflight (or MPX_PREFLIGHT=0) skips that check.

options:
  --dry-run           print every command (gcloud and local) instead of running it
  --no-preflight      skip mpx compile's check before run, all and watch
  --quiet             with delete: pass --quiet to gcloud, deleting without asking
  --worker N          with logs: only worker N's
  --lines N           with logs: the last N lines (default 100)
  --follow            with logs: keep printing what comes (Ctrl-C to end)
  --grace S           with stop and watch: seconds between SIGTERM and SIGKILL (default 120)
  --interval S        with watch and create: seconds between checks (default 120)
  --max-restarts N    with watch: re-creations and restarts in all (default 10)
  -h, --help          this text

environment (required where a subcommand needs it):
  TPU_NAME          name of the slice, e.g. TPU_NAME=mpx-v4-32
  ZONE              zone with that accelerator type, e.g. ZONE=us-central2-b
  ACCELERATOR_TYPE  (create, watch) e.g. ACCELERATOR_TYPE=v4-32 (16 chips on 4 workers)
  PROJECT           e.g. PROJECT=my-project (default: gcloud config get-value project)
  MPX_OUT           (run, fetch, watch) the run folder in a bucket the workers can write,
                    gs://BUCKET/PATH, e.g. MPX_OUT=gs://my-bucket/mpx/boolean_paper (the
                    workers see it as /mnt/gcs/my-bucket/mpx/boolean_paper)
optional:
  TPU_VERSION       the TPU software version (default from ACCELERATOR_TYPE: v4 and older
                    tpu-ubuntu2204-base, v5e v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e
                    v2-alpha-tpuv6e)
  TPU_SPOT=1        (create) a Spot slice: cheaper, can be preempted (watch re-creates it)
  TPU_QUEUED=1      (create, delete, status, watch) through a queued resource named TPU_NAME: the
                    request waits in a queue until capacity is there
  MPX_PYTHON        (install) the Python of the environment you run mpx in here, whose jax
                    version and dependency versions the workers get (default: python3)
  MPX_REPO          install mpx with pip install git+$MPX_REPO instead of copying this
                    checkout, e.g. MPX_REPO=https://github.com/you/mpx.git@main
  MPX_EXTRAS        extras of mpx to install besides gcs, e.g. MPX_EXTRAS=vision (TFDS)
  MPX_LOG_SYNC      (run) seconds between the copies of the workers' logs to MPX_OUT/logs
                    (default 60)
  MPX_FETCH_DIR     (fetch) local directory to copy the run into (default: runs)
  MPX_PREFLIGHT=0   same as --no-preflight: no mpx compile check before run, all and watch
  MPX_BUILD_DIR     (install, run) local directory for the files copied to the workers
                    (default: build/tpu_pod in this checkout); one per concurrent install
  TFDS_DATA_DIR     (run) passed on to every worker; a dataset in MPX_OUT's bucket is under
                    its mount, e.g. TFDS_DATA_DIR=/mnt/gcs/my-bucket/tensorflow_datasets
                    (TFDS without TensorFlow cannot open gs:// itself)

examples:
  bash launch/tpu_pod.sh --dry-run all -- boolean_gotu --preset paper
  bash launch/tpu_pod.sh logs --worker 0 --follow
EOF
}

dry_run=0 quiet=0 subcommand="" saw_args=0 worker="" lines=100 follow=0 grace=120 preflight=1
interval=120 max_restarts=10 given=()
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --dry-run) dry_run=1; shift ;;
    --no-preflight) preflight=0; shift ;;
    --quiet) quiet=1; given+=(--quiet); shift ;;
    --follow) follow=1; given+=(--follow); shift ;;
    --worker | --lines | --grace | --interval | --max-restarts)
      option_value "" "$@"  # (no example: "--name needs a value (see --help)")
      must_be whole "$value" "$1 needs a whole number, e.g. $1 10"
      case $1 in
        --worker) worker=$value ;;
        --lines) lines=$value ;;
        --grace) grace=$value ;;
        --interval) interval=$value ;;
        --max-restarts) max_restarts=$value ;;
      esac
      given+=("$1")
      shift "$taken"
      ;;
    --) saw_args=1; shift; break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) one_word subcommand subcommand "mpx run's arguments" "$1"; shift ;;
  esac
done

subcommands="create, install, run, status, logs, stop, watch, fetch, delete or all"
case $subcommand in
  create | install | status | logs | stop | fetch | delete)
    ((!saw_args)) || die "$subcommand takes no arguments after --" ;;
  run | all | watch)
    ((saw_args && $# > 0)) || die "$subcommand needs mpx run's arguments, e.g.: bash launch/tpu_pod.sh $subcommand -- boolean_gotu --preset paper"
    no_added_args "run folder as MPX_OUT (e.g. MPX_OUT=gs://my-bucket/mpx/boolean_paper)" \
      "the same command" "$@"
    ;;
  "") die "missing the subcommand ($subcommands); see --help" ;;
  *) die "unknown subcommand '$subcommand' ($subcommands)" ;;
esac
for option in ${given[@]+"${given[@]}"}; do
  case $option:$subcommand in
    --quiet:delete | --worker:logs | --lines:logs | --follow:logs | --grace:stop | --grace:watch \
      | --interval:watch | --interval:create | --interval:all | --max-restarts:watch) ;;
    *) die "$option does not apply to $subcommand (see --help)" ;;
  esac
done

# The variables the steps need, all checked before the first step runs.
case $subcommand in
  all) steps=(create install run) ;;
  *) steps=("$subcommand") ;;
esac
needed=()
for step in "${steps[@]}"; do
  case $step in
    create) needed+=(TPU_NAME ZONE ACCELERATOR_TYPE PROJECT) ;;
    install | delete | status | logs | stop) needed+=(TPU_NAME ZONE PROJECT) ;;
    run) needed+=(TPU_NAME ZONE PROJECT MPX_OUT) ;;
    watch) needed+=(TPU_NAME ZONE ACCELERATOR_TYPE PROJECT MPX_OUT) ;;
    fetch) needed+=(MPX_OUT) ;;
  esac
done
needs() {
  local name
  for name in "${needed[@]}"; do [[ $name == "$1" ]] && return 0; done
  return 1
}
if needs PROJECT && [[ -z ${PROJECT:-} ]] && command -v gcloud >/dev/null; then
  PROJECT=$(gcloud config get-value project 2>/dev/null || true)
fi
example() {
  case $1 in
    TPU_NAME) echo "the name of the slice, e.g. export TPU_NAME=mpx-v4-32" ;;
    ZONE) echo "a zone with that accelerator type, e.g. export ZONE=us-central2-b" ;;
    ACCELERATOR_TYPE) echo "the slice type, e.g. export ACCELERATOR_TYPE=v4-32" ;;
    PROJECT) echo "the Google Cloud project, e.g. export PROJECT=my-project (or gcloud config set project my-project)" ;;
    MPX_OUT) echo "the run folder in a bucket, gs://BUCKET/PATH, e.g. export MPX_OUT=gs://my-bucket/mpx/boolean_paper" ;;
  esac
}
for name in TPU_NAME ZONE ACCELERATOR_TYPE PROJECT MPX_OUT; do
  if needs "$name"; then need_var "$name" "$(example "$name")"; fi
done
((missing == 0)) || exit 2
# MPX_OUT=gs://BUCKET/PATH: the workers mount BUCKET at /mnt/gcs/BUCKET and write to PATH in it.
gs_out='^gs://([^/]+)/+(.*[^/])/*$'
if needs MPX_OUT; then
  [[ $MPX_OUT =~ $gs_out ]] || die "MPX_OUT must be a folder in a bucket, gs://BUCKET/PATH, e.g. export MPX_OUT=gs://my-bucket/mpx/boolean_paper; got '$MPX_OUT'"
  bucket=${BASH_REMATCH[1]} out_path=${BASH_REMATCH[2]}
  mount_dir=/mnt/gcs/$bucket
fi
if needs ACCELERATOR_TYPE && [[ -z ${TPU_VERSION:-} ]]; then
  case $ACCELERATOR_TYPE in
    v2-* | v3-* | v4-*) TPU_VERSION=tpu-ubuntu2204-base ;;
    v5litepod-* | v5e-*) TPU_VERSION=v2-alpha-tpuv5-lite ;;
    v5p-*) TPU_VERSION=v2-alpha-tpuv5 ;;
    v6e-*) TPU_VERSION=v2-alpha-tpuv6e ;;
    *) die "no default TPU_VERSION for ACCELERATOR_TYPE=$ACCELERATOR_TYPE; set it, e.g. export TPU_VERSION=tpu-ubuntu2204-base" ;;
  esac
fi
for flag in TPU_SPOT TPU_QUEUED MPX_PREFLIGHT; do
  must_be flag "${!flag:-0}" "$flag must be 0 or 1, e.g. export $flag=1"
done
queued=${TPU_QUEUED:-0}
[[ ${MPX_PREFLIGHT:-1} == 1 ]] || preflight=0
log_sync=${MPX_LOG_SYNC:-60}
must_be positive "$log_sync" "MPX_LOG_SYNC must be a number of seconds, e.g. export MPX_LOG_SYNC=60"
if ((!dry_run)) && ! command -v gcloud >/dev/null; then
  die "gcloud is not on PATH: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) and run gcloud auth login"
fi

do_cmd() {  # prints the command; runs it unless --dry-run
  if ((dry_run)); then
    quote "$@"
  else
    echo "+ $(quote "$@")" >&2
    "$@"
  fi
}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
helper_copied=0  # launch/tpu_worker.sh, as ~/mpx-worker.sh on every worker
build=${MPX_BUILD_DIR:-$repo/build/tpu_pod}  # what install copies to the workers
location=(--zone="${ZONE:-}" --project="${PROJECT:-}")
tpu_vm=(gcloud compute tpus tpu-vm)
queued_resources=(gcloud compute tpus queued-resources)
describe_node=("${tpu_vm[@]}" describe "${TPU_NAME:-}" "${location[@]}" '--format=value(state)')
describe_queued=("${queued_resources[@]}" describe "${TPU_NAME:-}" "${location[@]}"
                 '--format=value(state.state)')

# The ~ in the commands for the workers is expanded there, by the worker's shell.
# shellcheck disable=SC2088
worker_cmd() {  # a command for the workers: mpx-worker.sh SUBCOMMAND ARGS, where it is there
  echo "if [ -f ~/mpx-worker.sh ]; then bash ~/mpx-worker.sh $(quote "$@"); else echo \"\$(hostname): no job\"; fi"
}

on_workers() {  # $1: all or a worker's number, $2: the command
  do_cmd "${tpu_vm[@]}" ssh "$TPU_NAME" "${location[@]}" --worker="$1" --command "$2"
}

step_create() {
  local spot=()
  [[ ${TPU_SPOT:-0} != 1 ]] || spot=(--spot)
  if ((!queued)); then
    do_cmd "${tpu_vm[@]}" create "$TPU_NAME" "${location[@]}" --accelerator-type="$ACCELERATOR_TYPE" \
      --version="$TPU_VERSION" ${spot[@]+"${spot[@]}"}
    return
  fi
  do_cmd "${queued_resources[@]}" create "$TPU_NAME" --node-id="$TPU_NAME" "${location[@]}" \
    --accelerator-type="$ACCELERATOR_TYPE" --runtime-version="$TPU_VERSION" ${spot[@]+"${spot[@]}"}
  if ((dry_run)); then
    echo "# then every $interval s, until it prints ACTIVE:"
    quote "${describe_queued[@]}"
    return
  fi
  local state
  while :; do
    state=$("${describe_queued[@]}")
    case $state in
      ACTIVE) say "the queued resource $TPU_NAME is ACTIVE"; return ;;
      FAILED | SUSPENDED) die "the queued resource $TPU_NAME is $state: $(quote "${queued_resources[@]}" describe "$TPU_NAME" "${location[@]}") says why; delete it (bash launch/tpu_pod.sh delete) and create it again" ;;
    esac
    say "the queued resource $TPU_NAME is ${state:-(no state yet)}; checking again in $interval s"
    sleep "$interval"
  done
}

# shellcheck disable=SC2088
step_install() {
  local python=${MPX_PYTHON:-python3} jax_version spec extras=""
  jax_version=$("$python" -c 'import importlib.metadata as m; print(m.version("jax"))' 2>/dev/null) \
    || die "MPX_PYTHON=$python has no jax: set MPX_PYTHON to the Python of the environment you run mpx in here, e.g. export MPX_PYTHON=.venv/bin/python (the workers get its jax version)"
  extras="[gcs${MPX_EXTRAS:+,$MPX_EXTRAS}]"  # gcs: the run folder is the gs:// URL itself
  local files=("$build/mpx-constraints.txt" "$build/mpx-worker.sh") script=()
  do_cmd mkdir -p "$build"
  do_cmd "$python" "$repo/launch/tpu_constraints.py" --out "$build/mpx-constraints.txt"
  do_cmd cp "$repo/launch/tpu_worker.sh" "$build/mpx-worker.sh"
  if [[ -n ${MPX_REPO:-} ]]; then
    [[ $MPX_REPO != *[\"\$\`\ ]* ]] || die "MPX_REPO holds a space, quote, \$ or backquote; give the plain URL, e.g. MPX_REPO=https://github.com/you/mpx.git@main"
    spec="\"mpx$extras @ git+${MPX_REPO#git+}\""
  else
    spec="\"\$HOME/mpx-src$extras\""
    do_cmd tar -czf "$build/mpx-src.tar.gz" --exclude=./.git --exclude='./.venv*' --exclude=./build \
      --exclude=./dist --exclude=./runs --exclude='*.egg-info' --exclude=__pycache__ \
      --exclude=.pytest_cache -C "$repo" .
    files+=("$build/mpx-src.tar.gz")
    script+=('rm -rf ~/mpx-src && mkdir ~/mpx-src && tar -xzf ~/mpx-src.tar.gz -C ~/mpx-src')
  fi
  do_cmd "${tpu_vm[@]}" scp "${files[@]}" "$TPU_NAME:~/" --worker=all "${location[@]}"
  helper_copied=1
  script+=("bash ~/mpx-worker.sh install \"jax[tpu]==$jax_version\" $spec")
  local joined="set -e" line
  for line in "${script[@]}"; do joined+="; $line"; done
  on_workers all "$joined"
}

last_stamp=""
stamp() {  # the run's start, the same for every worker: its log folder's name (one a second)
  local stamp
  stamp=$(date -u +%Y%m%dT%H%M%SZ)
  while [[ $stamp == "$last_stamp" ]]; do
    sleep 1
    stamp=$(date -u +%Y%m%dT%H%M%SZ)
  done
  echo "$stamp"
}

# shellcheck disable=SC2088
step_run() {  # (quote leaves a word that starts with ~/ unquoted, for the worker's shell)
  local stamp out=$mount_dir/$out_path
  stamp=$(stamp)
  last_stamp=$stamp
  local command=("~/mpx-venv/bin/mpx" run "$@" --distributed --out "gs://$bucket/$out_path" --resume=auto)
  [[ -z ${TFDS_DATA_DIR:-} ]] || command=(env "TFDS_DATA_DIR=$TFDS_DATA_DIR" "${command[@]}")
  say "run on every worker of $TPU_NAME, detached: $(quote "${command[@]}")"
  say "run folder $MPX_OUT (its lock the bucket's object; $out through the workers' mount); logs ~/mpx-jobs/$stamp/worker-N.log on worker N, copied to $MPX_OUT/logs/$stamp/ every $log_sync s"
  say "mpx prints the members, the devices per host and the padding rows first: bash launch/tpu_pod.sh logs --worker 0"
  if ((!helper_copied)); then  # install copied it already
    do_cmd mkdir -p "$build"
    do_cmd cp "$repo/launch/tpu_worker.sh" "$build/mpx-worker.sh"
    do_cmd "${tpu_vm[@]}" scp "$build/mpx-worker.sh" "$TPU_NAME:~/" --worker=all "${location[@]}"
    helper_copied=1
  fi
  on_workers all "env MPX_LOG_SYNC=$log_sync bash ~/mpx-worker.sh start $(quote "$bucket" \
    "$mount_dir" "$out/logs/$stamp" "$stamp" --) $(quote "${command[@]}")"
}

step_status() {
  if ((queued)); then
    do_cmd "${describe_queued[@]}" || true
  fi
  do_cmd "${describe_node[@]}" || true
  on_workers all "$(worker_cmd status)"
}

step_logs() {
  local args=(logs "$lines")
  ((!follow)) || args+=(--follow)
  on_workers "${worker:-all}" "$(worker_cmd "${args[@]}")"
}

step_stop() {
  on_workers all "$(worker_cmd stop "$grace")"
}

step_fetch() {
  local into=${MPX_FETCH_DIR:-runs}
  do_cmd mkdir -p "$into"
  do_cmd gcloud storage cp --recursive "gs://$bucket/$out_path" "$into/"
}

step_delete() {  # $1: --quiet (watch), or nothing: as the command line says
  local yes=()
  ((!quiet)) && [[ ${1:-} != --quiet ]] || yes=(--quiet)
  if ((queued)); then  # --force: the node too
    do_cmd "${queued_resources[@]}" delete "$TPU_NAME" "${location[@]}" --force ${yes[@]+"${yes[@]}"}
  else
    do_cmd "${tpu_vm[@]}" delete "$TPU_NAME" "${location[@]}" ${yes[@]+"${yes[@]}"}
  fi
}

# --- watch ----------------------------------------------------------------------------------

slice_state() {  # ready, pending, gone (preempted, terminated, ...), absent or unknown
  local describe=("${describe_node[@]}") out err rc=0
  ((!queued)) || describe=("${describe_queued[@]}")
  err=$(mktemp)
  out=$("${describe[@]}" 2>"$err") || rc=$?
  if ((rc != 0)); then
    if grep -q NOT_FOUND "$err"; then echo absent; else echo "unknown $(tr '\n' ' ' <"$err")"; fi
    rm -f "$err"
    return
  fi
  rm -f "$err"
  case $out in
    READY) echo ready ;;
    ACTIVE)  # the queued resource is; its node must be READY too
      out=$("${describe_node[@]}" 2>/dev/null || true)
      if [[ $out == READY ]]; then echo ready; else echo "pending node ${out:-(none)}"; fi ;;
    CREATING | STARTING | RESTARTING | REPAIRING | REIMAGING | ACCEPTED | WAITING_FOR_RESOURCES \
      | PROVISIONING) echo "pending $out" ;;
    *) echo "gone $out" ;;  # PREEMPTED, TERMINATED, STOPPED, SUSPENDED, FAILED, DELETING, ...
  esac
}

job_state() {  # from every worker's status line: running, done, restart, locked, none, failed CODE, unknown
  local out rc=0
  out=$("${tpu_vm[@]}" ssh "$TPU_NAME" "${location[@]}" --worker=all --command "$(worker_cmd status)" 2>&1) || rc=$?
  local states
  states=$(grep -oE ': (running|exited [0-9]+|killed|no job)' <<<"$out" | sed 's/^: //' || true)
  if ((rc != 0)) || [[ -z $states ]]; then
    echo "unknown"
    return
  fi
  local failed
  failed=$(grep -oE '^exited [0-9]+$' <<<"$states" | grep -vE ' (0|69|75|137|143)$' | head -n 1 | cut -d' ' -f2 || true)
  if grep -qE '^(killed|exited 137|exited 143|exited 69)$' <<<"$states"; then
    echo restart  # a preempted or killed process (or a passing storage fault) explains its peers' failures
  elif grep -q '^exited 75$' <<<"$states"; then
    echo locked  # another process writes the run folder: mpx read and wrote nothing
  elif [[ -n $failed ]]; then
    echo "failed $failed"
  elif grep -q '^no job$' <<<"$states"; then
    echo none
  elif grep -q '^running' <<<"$states"; then
    echo running
  else
    echo "done"
  fi
}

step_watch() {
  if ((dry_run)); then
    echo "# watch: every $interval s the slice's state, then the job's on every worker; at most $max_restarts restarts in all"
    quote "${describe_node[@]}"
    ((!queued)) || quote "${describe_queued[@]}"
    quote "${tpu_vm[@]}" ssh "$TPU_NAME" "${location[@]}" --worker=all --command "$(worker_cmd status)"
    echo "# a missing, preempted or terminated slice: delete (if there), create, install, run"
    step_delete --quiet
    step_create
    step_install
    step_run "$@"
    echo "# no job on a worker: install, run"
    echo "# the job stopped by a preemption (143) or killed (137) on a worker, or refused because another process writes the run folder (75): stop, run"
    step_stop
    step_run "$@"
    echo "# every worker exited 0: fetch"
    step_fetch
    return
  fi
  say "watching $TPU_NAME every $interval s until the run in $MPX_OUT is done (at most $max_restarts restarts); this process must outlive your terminal: run it with nohup or in tmux, on a small VM"
  local restarts=0 unknown=0 started=0 state job
  again() {  # this script's subcommand $@, in a process of its own: its status, not an exit
    PROJECT=$PROJECT bash "${BASH_SOURCE[0]}" --no-preflight "$@"  # checked before the watch
  }
  restart() {  # $1: why
    restarts=$((restarts + 1))
    if ((restarts > max_restarts)); then
      say "$1, and $max_restarts restarts are done (--max-restarts): stopping here. The run folder keeps every checkpoint; see the logs (bash launch/tpu_pod.sh logs, or $MPX_OUT/logs/), then run watch again to continue"
      exit 5  # Not 4 (mpx's storage fault): the launcher gave up, the run did not fail.
    fi
    say "$1: restart $restarts of at most $max_restarts"
  }
  while :; do
    state=$(slice_state)
    case $state in
      ready) unknown=0 ;;
      pending*) say "the slice is ${state#pending }; checking again in $interval s"; sleep "$interval"; continue ;;
      absent | gone*)
        unknown=0
        if [[ $state == gone* ]]; then
          restart "the slice is ${state#gone }"
          again --quiet delete || say "deleting the slice failed (above); creating it anyway"
        elif ((started)); then
          restart "the slice is gone"
        else
          say "no slice $TPU_NAME: creating it"
        fi
        # In processes of their own, so that a failure (no capacity for a Spot slice, say)
        # is one more attempt, not the end of the watch.
        if again --interval "$interval" create && again install && again run -- "$@"; then
          started=1
        else
          restart "creating, installing or starting on the slice failed (above)"
          started=0  # (its absence next time is this failure's, already counted)
        fi
        sleep "$interval"
        continue
        ;;
      unknown*)
        unknown=$((unknown + 1))
        ((unknown <= 10)) || die "the slice's state could not be read 10 times in a row: ${state#unknown }"
        say "could not read the slice's state (${state#unknown }); checking again in $interval s"
        sleep "$interval"
        continue
        ;;
    esac
    job=$(job_state)
    case $job in
      running) ;;
      done)
        say "the run is done on every worker; fetching it"
        step_fetch
        say "done: the run is in ${MPX_FETCH_DIR:-runs}/$(basename "$out_path") (and in $MPX_OUT); the slice is still up (and billed): bash launch/tpu_pod.sh delete"
        return 0
        ;;
      none)
        say "no job on the slice: installing and starting it"
        if again install && again run -- "$@"; then
          started=1
        else
          restart "installing or starting the job failed (above)"
        fi
        ;;
      restart | locked)
        if [[ $job == locked ]]; then
          restart "the run folder is being written by another process (exit status 75: its holder is named in the log, bash launch/tpu_pod.sh logs); trying again, never beside it"
        else
          restart "the job stopped (preempted, killed, or storage unavailable: exit status 69) on a worker"
        fi
        # In processes of their own: a failed ssh (a slice going down) is checked again.
        again --grace "$grace" stop || say "stopping the job failed (above); starting it anyway"
        again run -- "$@" || say "starting the job failed (above); checking again in $interval s"
        ;;
      failed*)
        again --grace "$grace" stop || say "stopping the other workers' jobs failed (above)"
        say "the job failed with status ${job#failed } (1 failed, 2 error, 3 refused, 4 storage: see launch/README.md); its log: bash launch/tpu_pod.sh logs. Fix the cause, then run watch again: the run continues from its checkpoints"
        exit "${job#failed }"
        ;;
      unknown)
        unknown=$((unknown + 1))
        ((unknown <= 10)) || die "the workers' job status could not be read 10 times in a row (gcloud ... ssh fails)"
        say "could not read the job's state on every worker; checking again in $interval s"
        ;;
    esac
    sleep "$interval"
  done
}

# Before a slice is created or a job started: the job's programs compiled for the slice's
# topology here, so that a job that does not fit stops before anything is paid for.
step_preflight() {
  local type=${ACCELERATOR_TYPE:-}
  if [[ -z $type ]]; then  # run on an existing slice: its type, as gcloud describes it
    if ((dry_run)); then
      quote "${tpu_vm[@]}" describe "$TPU_NAME" "${location[@]}" '--format=value(acceleratorType)'
      type="\$ACCELERATOR_TYPE"  # what describe prints, in the dry run's commands
    else
      type=$("${tpu_vm[@]}" describe "$TPU_NAME" "${location[@]}" '--format=value(acceleratorType)') \
        || die "could not read the accelerator type of $TPU_NAME for the check before the run (above); set ACCELERATOR_TYPE, or skip the check with --no-preflight"
    fi
  fi
  do_cmd "${MPX_PYTHON:-python3}" -m mpx.cli compile "$@" --target "$type" \
    || die "mpx compile refused the job for $type (above: it does not fit, or does not compile); nothing was created or started. Fix it, or skip the check with --no-preflight"
}

if ((preflight)) && [[ $subcommand == run || $subcommand == all || $subcommand == watch ]]; then
  step_preflight "$@"
fi
for step in "${steps[@]}"; do
  "step_$step" "$@"
done
if ((!dry_run)) && [[ $subcommand == create || $subcommand == all ]]; then
  say "the slice $TPU_NAME is still up (and billed): bash launch/tpu_pod.sh delete"
fi
if ((!dry_run)) && [[ $subcommand == run || $subcommand == all ]]; then
  say "started; follow it with: bash launch/tpu_pod.sh status | logs [--worker N] | watch -- $(quote "$@")"
fi
