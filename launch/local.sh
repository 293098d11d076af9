#!/usr/bin/env bash
# Runs COMMAND as N local processes joined by jax.distributed: a multi-host run on one machine,
# on CPU devices, to try `mpx run ... --distributed` before renting a pod (and what the tests use).
#
#   bash launch/local.sh 2 -- mpx run boolean_gotu --preset tiny --out runs/local2 --resume=auto
#
# See usage() below, or `bash launch/local.sh --help`.
set -euo pipefail
me=local.sh
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # say, die, quote, the option checks

usage() {
  cat <<'EOF'
usage: bash launch/local.sh N [--devices D] [--port P] [--grace S] [--restarts R] [--dry-run] -- COMMAND...

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
  --restarts R  when a process exits with status 143 (SIGTERM: mpx saved a checkpoint),
                137 (SIGKILL) or 69 (storage unavailable past mpx's own retries), the
                others are stopped and all N are started again with the same command, at
                most R times (default 3; 0: never). Give mpx run
                --resume=auto, so that the same command continues the run
  --dry-run     print each process's environment and command line instead of running them
  -h, --help    this text

Each process's output (stdout and stderr) goes to the terminal, every line prefixed "[i] ".
The script waits for all of them; when one fails it stops the others and exits with the
failed process's status (after --restarts, for 143, 137 and 69). Status 75 (another process is
writing the run folder; mpx read and wrote nothing) is never restarted: local.sh does not
start a second writer; run the same command once that process has ended. Ctrl-C (or
SIGTERM) stops them all the same way and is never restarted (exit 130 or 143; then run the
same command again); a second Ctrl-C kills them at once.

example:
  bash launch/local.sh 2 -- mpx run boolean_gotu --preset tiny --out runs/local2 --resume=auto
EOF
}

num="" devices=2 port="" grace=60 restarts=3 dry_run=0 saw_command=0
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --devices | --devices=*) option_value 2 "$@"; devices=$value; shift "$taken" ;;
    --port | --port=*) option_value 12355 "$@"; port=$value; shift "$taken" ;;
    --grace | --grace=*) option_value 10 "$@"; grace=$value; shift "$taken" ;;
    --restarts | --restarts=*) option_value 3 "$@"; restarts=$value; shift "$taken" ;;
    --dry-run) dry_run=1; shift ;;
    --) saw_command=1; shift; break ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) one_word num "process count" "the command" "$1"; shift ;;
  esac
done

[[ -n $num ]] || die "missing N, the number of processes, e.g.: bash launch/local.sh 2 -- mpx run boolean_gotu --preset tiny"
must_be positive "$num" "N must be a positive integer, e.g. 2"
must_be positive "$devices" "--devices must be a positive integer, e.g. 2"
must_be whole "$grace" "--grace must be a number of seconds, e.g. 10"
must_be whole "$restarts" "--restarts must be a whole number, e.g. 3"
((saw_command && $# > 0)) || die "missing '-- COMMAND...', e.g.: bash launch/local.sh $num -- mpx run boolean_gotu --preset tiny"

fixed_port=$port
pick_port() {  # --port, or a free port (a new one for every start)
  if [[ -n $fixed_port ]]; then
    port=$fixed_port
  else
    local python
    python=$(command -v python3 || command -v python || true)
    [[ -n $python ]] || die "no python3 on PATH to pick a free port; pass one, e.g. --port 12355"
    port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("localhost", 0)); print(s.getsockname()[1])')
  fi
}
pick_port
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
  echo "# local.sh: $num processes, coordinator localhost:$port, $devices CPU devices each; on exit status 143, 137 or 69 all are started again, at most $restarts times"
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

stopping=0 signalled=0 ticks_left=0 status=0 pids=() finished=() prefixers=()
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
    say "got $1 again, killing the processes"
  else
    say "got $1, stopping all $num processes (SIGTERM; again: SIGKILL)"
  fi
  signalled=1
  ((status)) || status=$2
  stop_all
}
# The messages of this script (say) go to fd 3, the real stderr: the wait loop's stderr is
# closed off below, since bash would report a SIGKILLed job there ("Killed ...").
exec 3>&2
say_fd=3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpx-local.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'on_signal SIGINT 130' INT
trap 'on_signal SIGTERM 143' TERM

out=""  # the run folder, if the command names one (for the line below)
for ((i = 1; i <= $#; i++)); do
  case ${!i} in
    --out=*) out=${!i#--out=} ;;
    --out) next=$((i + 1)); out=${!next:-} ;;
  esac
done
say "$num processes x $devices CPU devices$([[ -z $out ]] || echo ", run folder $out"); restarts on exit status 143, 137 or 69: at most $restarts"

start_all() {  # $1: the start's number; all N processes, with their output prefixed
  # Each process is started as its own job (set -m: its own process group), so stopping it
  # stops whatever it started too; job control is off again for the rest (Ctrl-C then
  # reaches this script, whose trap stops the processes). A process's output goes through a
  # FIFO to a sed that prefixes its lines.
  local i env_words word
  set -m
  for ((i = 0; i < num; i++)); do
    ((!stopping)) || break  # stopped (Ctrl-C) while starting
    mkfifo "$tmp/$1-$i"
    sed "${line_buffered[@]}" "s/^/[$i] /" <"$tmp/$1-$i" &
    prefixers+=("$!")
    env_words=()
    while IFS= read -r word; do env_words+=("$word"); done < <(process_env "$i")
    env "${env_words[@]}" "${command[@]}" >"$tmp/$1-$i" 2>&1 </dev/null &
    finished+=(0)
    pids+=("$!")
  done
  set +m
}

wait_all() {  # until every process has ended; the first failure stops the others
  local remaining=${#pids[@]} i rc
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
        say "process $i exited with status $rc; stopping the others"
        stop_all
      fi
    done
    ((remaining > 0)) || break
    if ((stopping && ticks_left-- == 0)); then
      for ((i = 0; i < ${#pids[@]}; i++)); do
        ((finished[i])) && continue
        say "process $i still running after SIGTERM; sending SIGKILL"
        kill -KILL -- "-${pids[i]}" 2>/dev/null || true
      done
    fi
    sleep 0.2
  done 2>/dev/null
  wait "${prefixers[@]}" 2>/dev/null || true
}

command=("$@")
for ((start = 0; ; start++)); do
  start_all "$start"
  wait_all
  if ((status != 143 && status != 137 && status != 69 || signalled || start >= restarts)); then
    break
  fi
  say "restart $((start + 1)) of at most $restarts after exit status $status (143: SIGTERM, checkpoint saved; 137: killed; 69: storage unavailable): the same command again"
  stopping=0 status=0 pids=() finished=() prefixers=()
  pick_port
done
if ((status == 143 || status == 137 || status == 69)) && ((!signalled && restarts > 0)); then
  say "stopped with status $status after $restarts restarts (--restarts); run the same command again to continue"
elif ((status == 75)); then
  say "the run folder is being written by another process (exit status 75; mpx's line above names it): not started again, so as not to start a second writer. Let that process end (or stop it), then run the same command: it continues the run"
fi
exit "$status"
