#!/usr/bin/env bash
# Runs COMMAND as N local processes joined by jax.distributed: a multi-host run on one machine,
# on CPU devices, to try `mpx run ... --distributed` before renting a pod (and what the tests use).
#
#   bash launch/local.sh 2 -- mpx run boolean_gotu --preset tiny --out runs/local2
#
# See usage() below, or `bash launch/local.sh --help`.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: bash launch/local.sh N [--devices D] [--port P] [--grace S] [--dry-run] -- COMMAND...

Runs COMMAND as N processes on this machine, joined by jax.distributed. Process i gets

  MPX_DISTRIBUTED=1 MPX_COORDINATOR=localhost:P MPX_NUM_PROCESSES=N MPX_PROCESS_ID=i
  JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=D (+ your XLA_FLAGS)

so `mpx run` initialises jax.distributed with N processes of D CPU devices each. Every
process is given the same command line (the same --out: process 0 writes the files).

  N             number of processes (e.g. 2)
  --devices D   CPU devices per process (default 2)
  --port P      coordinator port (default: a free port, picked by binding port 0)
  --grace S     when stopping, the processes get SIGTERM (mpx finishes its chunk and saves
                a checkpoint), and SIGKILL if still running S seconds later (default 60)
  --dry-run     print each process's environment and command line instead of running them
  -h, --help    this text

Each process's output (stdout and stderr) goes to the terminal, every line prefixed "[i] ".
The script waits for all of them; when one fails it stops the others and exits with the
failed process's status. Ctrl-C (or SIGTERM) stops them all the same way (exit 130 or 143;
then continue with the same command and --resume); a second Ctrl-C kills them at once.

example:
  bash launch/local.sh 2 -- mpx run boolean_gotu --preset tiny --out runs/local2
EOF
}

die() {
  echo "local.sh: $*" >&2
  exit 2
}

quote() {  # the arguments as one shell-quoted line (plain words stay unquoted)
  local out="" arg
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
      out+=" $arg"
    else
      out+=" '${arg//\'/\'\\\'\'}'"
    fi
  done
  printf '%s\n' "${out# }"
}

num="" devices=2 port="" grace=60 dry_run=0 saw_command=0
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --devices) (($# >= 2)) || die "--devices needs a value, e.g. --devices 2"; devices=$2; shift 2 ;;
    --devices=*) devices=${1#*=}; shift ;;
    --port) (($# >= 2)) || die "--port needs a value, e.g. --port 12355"; port=$2; shift 2 ;;
    --port=*) port=${1#*=}; shift ;;
    --grace) (($# >= 2)) || die "--grace needs a value, e.g. --grace 10"; grace=$2; shift 2 ;;
    --grace=*) grace=${1#*=}; shift ;;
    --dry-run) dry_run=1; shift ;;
    --) saw_command=1; shift; break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *)
      [[ -z $num ]] || die "one process count expected, got '$num' and '$1'; put the command after --"
      num=$1
      shift
      ;;
  esac
done

[[ -n $num ]] || die "missing N, the number of processes, e.g.: bash launch/local.sh 2 -- mpx run boolean_gotu --preset tiny"
[[ $num =~ ^[1-9][0-9]*$ ]] || die "N must be a positive integer, e.g. 2; got '$num'"
[[ $devices =~ ^[1-9][0-9]*$ ]] || die "--devices must be a positive integer, e.g. 2; got '$devices'"
[[ $grace =~ ^[0-9]+$ ]] || die "--grace must be a number of seconds, e.g. 10; got '$grace'"
((saw_command && $# > 0)) || die "missing '-- COMMAND...', e.g.: bash launch/local.sh $num -- mpx run boolean_gotu --preset tiny"

if [[ -z $port ]]; then
  python=$(command -v python3 || command -v python || true)
  [[ -n $python ]] || die "no python3 on PATH to pick a free port; pass one, e.g. --port 12355"
  port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')
fi
if ! [[ $port =~ ^[0-9]+$ ]] || ((port < 1 || port > 65535)); then
  die "--port must be 1..65535, e.g. 12355; got '$port'"
fi

# Our device count first, then the caller's XLA_FLAGS (without a device count of its own,
# which would silently override --devices).
xla_flags="--xla_force_host_platform_device_count=$devices"
read -r -a caller_flags <<<"${XLA_FLAGS:-}"
for flag in ${caller_flags[@]+"${caller_flags[@]}"}; do
  [[ $flag == --xla_force_host_platform_device_count=* ]] || xla_flags+=" $flag"
done

process_env() {  # the environment of process $1, as NAME=VALUE words
  printf '%s\n' MPX_DISTRIBUTED=1 "MPX_COORDINATOR=localhost:$port" "MPX_NUM_PROCESSES=$num" \
    "MPX_PROCESS_ID=$1" JAX_PLATFORMS=cpu "XLA_FLAGS=$xla_flags"
}

if ((dry_run)); then
  echo "# local.sh: $num processes, coordinator localhost:$port, $devices CPU devices each"
  for ((i = 0; i < num; i++)); do
    env_words=()
    while IFS= read -r word; do env_words+=("$word"); done < <(process_env "$i")
    quote env "${env_words[@]}" "$@"
  done
  exit 0
fi

if sed -u q </dev/null >/dev/null 2>&1; then
  line_buffered=(-u)  # GNU sed
else
  line_buffered=(-l)  # BSD sed (macOS)
fi

stopping=0 ticks_left=0 status=0 pids=() finished=() prefixers=()
stop_all() {  # SIGTERM to every running process group; SIGKILL follows after --grace seconds
  local i
  if ((stopping)); then  # asked twice: SIGKILL now
    ticks_left=0
    return 0
  fi
  stopping=1 ticks_left=$((grace * 5))  # the loop below ticks every 0.2 s
  for ((i = 0; i < ${#pids[@]}; i++)); do
    ((finished[i])) || kill -TERM -- "-${pids[i]}" 2>/dev/null || true
  done
}
# shellcheck disable=SC2329  # called by the traps below
on_signal() {
  if ((stopping)); then
    echo "local.sh: got $1 again, killing the processes" >&3
  else
    echo "local.sh: got $1, stopping all $num processes (SIGTERM; again: SIGKILL)" >&3
  fi
  ((status)) || status=$2
  stop_all
}
# The messages of this script go to fd 3, the real stderr: the wait loop's stderr is closed
# off below, since bash would report a SIGKILLed job there ("Killed ...").
exec 3>&2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpx-local.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'on_signal SIGINT 130' INT
trap 'on_signal SIGTERM 143' TERM

# Each process is started as its own job (set -m: its own process group), so stopping it stops
# whatever it started too; job control is off again for the rest (Ctrl-C then reaches this
# script, whose trap stops the processes). A process's output goes through a FIFO to a sed
# that prefixes its lines.
set -m
for ((i = 0; i < num; i++)); do
  ((!stopping)) || break  # stopped (Ctrl-C) while starting
  mkfifo "$tmp/$i"
  sed "${line_buffered[@]}" "s/^/[$i] /" <"$tmp/$i" &
  prefixers+=("$!")
  env_words=()
  while IFS= read -r word; do env_words+=("$word"); done < <(process_env "$i")
  env "${env_words[@]}" "$@" >"$tmp/$i" 2>&1 </dev/null &
  finished+=(0)
  pids+=("$!")
done
set +m

remaining=${#pids[@]}
while ((remaining > 0)); do
  for ((i = 0; i < ${#pids[@]}; i++)); do
    ((finished[i])) && continue
    kill -0 "${pids[i]}" 2>/dev/null && continue
    rc=0
    wait "${pids[i]}" 2>/dev/null || rc=$?
    finished[i]=1
    remaining=$((remaining - 1))
    if ((rc != 0 && status == 0)); then
      status=$rc
      echo "local.sh: process $i exited with status $rc; stopping the others" >&3
      stop_all
    fi
  done
  ((remaining > 0)) || break
  if ((stopping && ticks_left-- == 0)); then
    for ((i = 0; i < ${#pids[@]}; i++)); do
      ((finished[i])) && continue
      echo "local.sh: process $i still running after SIGTERM; sending SIGKILL" >&3
      kill -KILL -- "-${pids[i]}" 2>/dev/null || true
    done
  fi
  sleep 0.2
done 2>/dev/null
wait "${prefixers[@]}" 2>/dev/null || true
exit "$status"
