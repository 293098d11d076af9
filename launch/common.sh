# shellcheck shell=bash
# What the launchers share: sourced by local.sh, slurm_gpu.sbatch and tpu_pod.sh, each of which
# sets `me`, its name in every message, first. tpu_worker.sh does not source it: it runs alone
# on a TPU worker, as ~/mpx-worker.sh.
: "${me:?the script sourcing launch/common.sh sets me, its name}"

say_fd=2  # local.sh moves it to fd 3: its wait loop silences stderr
say() {  # a line for the user, "NAME: ...", on stderr (a dry run's stdout is its commands)
  echo "$me: $*" >&"$say_fd"
}

die() {  # a bad command line or setup: exit 2
  say "$*"
  exit 2
}

quote_tilde=""  # tpu_pod.sh: "~?", its commands for the workers leave ~/ to the worker's shell
quote() {  # the arguments as one shell-quoted line (plain words stay unquoted)
  local out="" arg plain="^${quote_tilde}[A-Za-z0-9_./:=@%+,-]+\$"
  for arg in "$@"; do
    if [[ $arg =~ $plain ]]; then
      out+=" $arg"
    else
      out+=" '${arg//\'/\'\\\'\'}'"
    fi
  done
  printf '%s\n' "${out# }"
}

# option_value EXAMPLE "$@", at an option with a value, `--name VALUE` or `--name=VALUE`:
# sets value, and taken (the arguments to shift). With no value: "--name needs a value, e.g.
# --name EXAMPLE", or "(see --help)" for an empty EXAMPLE.
option_value() {
  local example=$1
  shift
  # shellcheck disable=SC2034  # value and taken are the caller's
  if [[ $1 == *=* ]]; then
    value=${1#*=} taken=1
  elif (($# >= 2)); then
    value=$2 taken=2
  elif [[ -n $example ]]; then
    die "$1 needs a value, e.g. $1 $example"
  else
    die "$1 needs a value (see --help)"
  fi
}

# one_word NAME WHAT AFTER WORD: WORD into the variable NAME, which must be empty: a command
# line has one such word (N, a subcommand), and the rest after --.
one_word() {
  [[ -z ${!1} ]] || die "one $2 expected, got '${!1}' and '$4'; put $3 after --"
  printf -v "$1" '%s' "$4"
}

# must_be KIND VALUE MESSAGE: "MESSAGE; got 'VALUE'" and exit 2 unless VALUE is of KIND:
# whole (0, 1, 2, ...), positive (1, 2, ...) or flag (0 or 1).
must_be() {
  local pattern
  case $1 in
    whole) pattern='^[0-9]+$' ;;
    positive) pattern='^[1-9][0-9]*$' ;;
    flag) pattern='^[01]$' ;;
    *) die "must_be: no kind '$1'" ;;
  esac
  [[ $2 =~ $pattern ]] || die "$3; got '$2'"
}

missing=0  # set by need_var; the caller exits 2 once every missing variable is named
need_var() {  # NAME TEXT: "NAME is not set: TEXT" where NAME is empty
  if [[ -z ${!1:-} ]]; then
    say "$1 is not set: $2"
    # shellcheck disable=SC2034  # the caller's
    missing=1
  fi
}

# mpx run's arguments, where the launcher adds --out (MPX_OUT), --distributed and
# --resume=auto itself: none of them is accepted. $1: how to give the run folder instead,
# $2: what starts and continues the run; then the arguments.
no_added_args() {
  local instead=$1 same=$2 arg
  shift 2
  for arg in "$@"; do
    case $arg in
      --out | --out=*) die "give the $instead, not $arg" ;;
      --distributed) die "--distributed is added by this script; leave it out of the arguments" ;;
      --resume | --resume=*) die "--resume=auto is added by this script ($same starts and continues the run); leave $arg out" ;;
    esac
  done
}
