#!/usr/bin/env bash
# A Cloud TPU VM slice for `mpx run ... --distributed`: create it, install mpx on every worker,
# run on all workers at once (the run directory in a bucket, mounted on every worker with
# Cloud Storage FUSE), copy the run directory back, delete it.
#
#   export TPU_NAME=mpx-v4-32 ZONE=us-central2-b ACCELERATOR_TYPE=v4-32 PROJECT=my-project \
#          MPX_OUT=gs://my-bucket/mpx/boolean_paper
#   bash launch/tpu_pod.sh all -- boolean_gotu --preset paper
#   bash launch/tpu_pod.sh delete
#
# See usage() below, or `bash launch/tpu_pod.sh --help`.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bash launch/tpu_pod.sh [--dry-run] [--quiet] SUBCOMMAND [-- EXPERIMENT [MPX RUN ARGS...]]

subcommands (each is one step; `all` never deletes):
  create    gcloud compute tpus tpu-vm create TPU_NAME (ACCELERATOR_TYPE, TPU_VERSION)
  install   on every worker: gcsfuse (Cloud Storage FUSE, from its apt repository; skipped
            where it is installed) and a Python 3.12 venv ~/mpx-venv (made with uv: the TPU
            images have Python 3.10, mpx needs 3.11+) with "jax[tpu]" and mpx. mpx comes from
            this checkout, copied to the workers as a tarball (uncommitted changes included),
            or, when MPX_REPO is set, from `pip install git+$MPX_REPO` on each worker
  run       on every worker at once: mount the bucket of MPX_OUT=gs://BUCKET/PATH at
            /mnt/gcs/BUCKET (gcsfuse; skipped where it is mounted), then
            ~/mpx-venv/bin/mpx run EXPERIMENT [ARGS...] --distributed --out /mnt/gcs/BUCKET/PATH
            (mpx writes its run directory through the filesystem, so every worker must see
            the same directory: the mount gives them the bucket's; JAX finds the slice's
            workers itself; process 0 writes every file)
  fetch     gcloud storage cp --recursive gs://BUCKET/PATH $MPX_FETCH_DIR/ (from this machine)
  delete    gcloud compute tpus tpu-vm delete TPU_NAME (gcloud asks to confirm; --quiet
            does not ask)
  all       create, install, run, fetch

options:
  --dry-run    print every command (gcloud and local) instead of running it
  --quiet      with delete: pass --quiet to gcloud, deleting without asking
  -h, --help   this text

environment (required where a subcommand needs it):
  TPU_NAME          name of the slice, e.g. TPU_NAME=mpx-v4-32
  ZONE              zone with that accelerator type, e.g. ZONE=us-central2-b
  ACCELERATOR_TYPE  (create) e.g. ACCELERATOR_TYPE=v4-32 (16 chips on 4 workers)
  PROJECT           e.g. PROJECT=my-project (default: gcloud config get-value project)
  MPX_OUT           (run, fetch) the run directory in a bucket the workers can write,
                    gs://BUCKET/PATH, e.g. MPX_OUT=gs://my-bucket/mpx/boolean_paper (the
                    workers see it as /mnt/gcs/my-bucket/mpx/boolean_paper)
optional:
  TPU_VERSION       the TPU software version (default from ACCELERATOR_TYPE: v4 and older
                    tpu-ubuntu2204-base, v5e v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e
                    v2-alpha-tpuv6e)
  TPU_SPOT=1        (create) a Spot slice: cheaper, can be preempted (then delete it, create
                    it again and `run` with --resume)
  MPX_REPO          install mpx with pip install git+$MPX_REPO instead of copying this
                    checkout, e.g. MPX_REPO=https://github.com/you/mpx.git@main
  MPX_EXTRAS        extras of mpx to install, e.g. MPX_EXTRAS=vision (for TFDS datasets)
  MPX_FETCH_DIR     (fetch) local directory to copy the run into (default: runs)
  TFDS_DATA_DIR     (run) passed on to every worker; a dataset in MPX_OUT's bucket is under
                    its mount, e.g. TFDS_DATA_DIR=/mnt/gcs/my-bucket/tensorflow_datasets
                    (TFDS without TensorFlow cannot open gs:// itself)

examples:
  bash launch/tpu_pod.sh --dry-run all -- boolean_gotu --preset paper
  bash launch/tpu_pod.sh run -- boolean_gotu --preset paper --resume
EOF
}

die() {
  echo "tpu_pod.sh: $*" >&2
  exit 2
}

quote() {  # the arguments as one shell-quoted line (plain words stay unquoted)
  local out="" arg
  for arg in "$@"; do
    if [[ $arg =~ ^~?[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      out+=" $arg"
    else
      out+=" '${arg//\'/\'\\\'\'}'"
    fi
  done
  printf '%s\n' "${out# }"
}

dry_run=0 quiet=0 subcommand="" saw_args=0
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --dry-run) dry_run=1; shift ;;
    --quiet) quiet=1; shift ;;
    --) saw_args=1; shift; break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *)
      [[ -z $subcommand ]] || die "one subcommand expected, got '$subcommand' and '$1'; put mpx run's arguments after --"
      subcommand=$1
      shift
      ;;
  esac
done

case $subcommand in
  create | install | fetch | delete)
    ((!saw_args)) || die "$subcommand takes no arguments after --" ;;
  run | all)
    ((saw_args && $# > 0)) || die "$subcommand needs mpx run's arguments, e.g.: bash launch/tpu_pod.sh $subcommand -- boolean_gotu --preset paper"
    for arg in "$@"; do
      case $arg in
        --out | --out=*) die "give the run directory as MPX_OUT (e.g. MPX_OUT=gs://my-bucket/mpx/boolean_paper), not $arg" ;;
        --distributed) die "--distributed is added by this script; leave it out of the arguments" ;;
      esac
    done
    ;;
  "") die "missing the subcommand (create, install, run, fetch, delete or all); see --help" ;;
  *) die "unknown subcommand '$subcommand' (create, install, run, fetch, delete or all)" ;;
esac
((!quiet)) || [[ $subcommand == delete ]] || die "--quiet is only for delete"

# The variables the steps need, all checked before the first step runs.
case $subcommand in
  create) steps=(create) ;;
  all) steps=(create install run fetch) ;;
  *) steps=("$subcommand") ;;
esac
needed=()
for step in "${steps[@]}"; do
  case $step in
    create) needed+=(TPU_NAME ZONE ACCELERATOR_TYPE PROJECT) ;;
    install | delete) needed+=(TPU_NAME ZONE PROJECT) ;;
    run) needed+=(TPU_NAME ZONE PROJECT MPX_OUT) ;;
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
    MPX_OUT) echo "the run directory in a bucket, gs://BUCKET/PATH, e.g. export MPX_OUT=gs://my-bucket/mpx/boolean_paper" ;;
  esac
}
missing=0
for name in TPU_NAME ZONE ACCELERATOR_TYPE PROJECT MPX_OUT; do
  if needs "$name" && [[ -z ${!name:-} ]]; then
    echo "tpu_pod.sh: $name is not set: $(example "$name")" >&2
    missing=1
  fi
done
((missing == 0)) || exit 2
# MPX_OUT=gs://BUCKET/PATH: the workers mount BUCKET at /mnt/gcs/BUCKET and write to PATH in it.
gs_out='^gs://([^/]+)/+(.*[^/])/*$'
if needs MPX_OUT; then
  [[ $MPX_OUT =~ $gs_out ]] || die "MPX_OUT must be a directory in a bucket, gs://BUCKET/PATH, e.g. export MPX_OUT=gs://my-bucket/mpx/boolean_paper; got '$MPX_OUT'"
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
tarball=$repo/build/tpu_pod/mpx-src.tar.gz
location=(--zone="${ZONE:-}" --project="${PROJECT:-}")
tpu_vm=(gcloud compute tpus tpu-vm)

step_create() {
  local spot=()
  [[ ${TPU_SPOT:-0} != 1 ]] || spot=(--spot)
  do_cmd "${tpu_vm[@]}" create "$TPU_NAME" "${location[@]}" --accelerator-type="$ACCELERATOR_TYPE" \
    --version="$TPU_VERSION" ${spot[@]+"${spot[@]}"}
}

# The ~ in the commands for the workers is expanded there, by the worker's shell.
# shellcheck disable=SC2088
step_install() {
  local spec extras=""
  [[ -z ${MPX_EXTRAS:-} ]] || extras="[$MPX_EXTRAS]"
  if [[ -n ${MPX_REPO:-} ]]; then
    spec="mpx$extras @ git+${MPX_REPO#git+}"
  else
    spec="\$HOME/mpx-src$extras"
    do_cmd mkdir -p "$(dirname "$tarball")"
    do_cmd tar -czf "$tarball" --exclude=./.git --exclude='./.venv*' --exclude=./build \
      --exclude=./dist --exclude=./runs --exclude='*.egg-info' --exclude=__pycache__ \
      --exclude=.pytest_cache -C "$repo" .
    do_cmd "${tpu_vm[@]}" scp "$tarball" "$TPU_NAME:mpx-src.tar.gz" --worker=all "${location[@]}"
  fi
  # gcsfuse from Google's apt repository (the TPU images are Ubuntu), unless it is installed.
  # The lock timeout: a fresh VM may still be running its own apt (unattended-upgrades).
  local key=/usr/share/keyrings/cloud.google.asc apt='sudo apt-get -o DPkg::Lock::Timeout=300'
  local gcsfuse="if ! command -v gcsfuse >/dev/null; then"
  gcsfuse+=" echo \"deb [signed-by=$key] https://packages.cloud.google.com/apt"
  gcsfuse+=" gcsfuse-\$(lsb_release -c -s) main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list"
  gcsfuse+=" >/dev/null; curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg"
  gcsfuse+=" | sudo tee $key >/dev/null; $apt update -qq; $apt install -y -qq gcsfuse; fi"
  local script=(
    "$gcsfuse"
    'python3 -m pip install --quiet --user --upgrade uv'
    'rm -rf ~/mpx-venv'
    '~/.local/bin/uv venv --quiet --python 3.12 ~/mpx-venv'
    "~/.local/bin/uv pip install --quiet --python ~/mpx-venv/bin/python \"jax[tpu]\" \"$spec\""
    '~/mpx-venv/bin/python -c "import socket, jax, mpx; print(socket.gethostname(), \"mpx\", mpx.__version__, \"jax\", jax.__version__)"'
  )
  [[ -n ${MPX_REPO:-} ]] || script=(
    'rm -rf ~/mpx-src && mkdir ~/mpx-src && tar -xzf ~/mpx-src.tar.gz -C ~/mpx-src'
    "${script[@]}")
  local joined="set -e" line
  for line in "${script[@]}"; do joined+="; $line"; done
  do_cmd "${tpu_vm[@]}" ssh "$TPU_NAME" "${location[@]}" --worker=all --command "$joined"
}

# mpx writes its run directory with plain filesystem calls, so the bucket is mounted on every
# worker (Cloud Storage FUSE) and the run goes to the mount. --rename-dir-limit: Orbax renames
# a finished checkpoint's temporary directory, which gcsfuse refuses on a flat bucket without
# it (a bucket with hierarchical namespace renames folders natively).
# shellcheck disable=SC2088
step_run() {  # (quote leaves a word that starts with ~/ unquoted, for the worker's shell)
  local command=("~/mpx-venv/bin/mpx" run "$@" --distributed --out "$mount_dir/$out_path")
  [[ -z ${TFDS_DATA_DIR:-} ]] || command=(env "TFDS_DATA_DIR=$TFDS_DATA_DIR" "${command[@]}")
  # shellcheck disable=SC2016 # (the worker's shell expands it)
  local dir owner='"$(id -u):$(id -g)"'
  dir=$(quote "$mount_dir")
  local mount="if ! mountpoint -q $dir; then sudo mkdir -p $dir; sudo chown $owner $dir;"
  mount+=" gcsfuse --implicit-dirs --rename-dir-limit=100000 $(quote "$bucket") $dir; fi"
  do_cmd "${tpu_vm[@]}" ssh "$TPU_NAME" "${location[@]}" --worker=all \
    --command "set -e; $mount; $(quote "${command[@]}")"
}

step_fetch() {
  local into=${MPX_FETCH_DIR:-runs}
  do_cmd mkdir -p "$into"
  do_cmd gcloud storage cp --recursive "gs://$bucket/$out_path" "$into/"
}

step_delete() {
  local yes=()
  ((!quiet)) || yes=(--quiet)
  do_cmd "${tpu_vm[@]}" delete "$TPU_NAME" "${location[@]}" ${yes[@]+"${yes[@]}"}
}

for step in "${steps[@]}"; do
  "step_$step" "$@"
done
if ((!dry_run)) && [[ $subcommand == create || $subcommand == all ]]; then
  echo "tpu_pod.sh: the slice $TPU_NAME is still up (and billed): bash launch/tpu_pod.sh delete" >&2
fi
