"""The `mpx` command."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import pathlib
import re
import signal
import sys
import textwrap
import threading

import mpx
from mpx import priors


def _arithmetic_layout(args) -> priors.ArithmeticLayout:
  """Both operands of `--digits`; the answer as long as the largest sum or product."""
  answer = args.digits + 1 if args.name == "addition" else 2 * args.digits
  return priors.arithmetic_layout(args.digits, args.digits, answer)


def _build_prior(args) -> "jax.Array":
  """The prior named by `mpx prior NAME`, from the command's options."""
  s = args.strength
  if args.name == "neutral":
    return priors.neutral(args.tokens)
  if args.name == "parity":
    return priors.parity_prior(args.n_bits, args.support or (0, 1), s)
  if args.name == "majority":
    return priors.majority_prior(args.n_bits, args.support or (0, 1, 2), s,
                                 suppress_shortcut=not args.keep_shortcut)
  if args.name == "cyclic":
    return priors.cyclic_prior(args.n_bits, args.window, s)
  if args.name == "addition":
    return priors.addition_prior(_arithmetic_layout(args), s)
  if args.name == "multiplication":
    return priors.multiplication_prior(_arithmetic_layout(args), s)
  if args.name == "window":
    return priors.window_prior(*args.grid, args.window, s)
  if args.name == "impulse":
    return priors.impulse_prior(*args.grid, args.heads, s)
  if args.name == "alibi":
    return priors.alibi_prior(args.tokens, args.heads)
  raise AssertionError(args.name)  # argparse restricts the choices.


PRIOR_NAMES = ("parity", "majority", "cyclic", "addition", "multiplication", "window",
               "impulse", "alibi", "neutral")


def _prior_labels(args) -> dict:
  """`plotting.plot_prior`'s tokens (and the impulse heads' shifts) of `mpx prior NAME`;
  ALiBi and neutral priors are over plain positions."""
  from mpx import plotting
  if args.name in ("parity", "majority", "cyclic"):
    return {"tokens": plotting.boolean_tokens(args.n_bits)}
  if args.name in ("addition", "multiplication"):
    operator = "+" if args.name == "addition" else "*"
    return {"tokens": plotting.arithmetic_tokens(_arithmetic_layout(args), operator)}
  if args.name in ("window", "impulse"):
    labels = {"tokens": plotting.grid_tokens(*args.grid, cls_token=True)}
    if args.name == "impulse":
      labels["head_titles"] = [f"head {h}: reads (r{m:+d}, c{n:+d})"
                               for h, (m, n) in enumerate(priors.impulse_shifts(args.heads))]
    return labels
  return {}


def _make_parent(out: str, kind: str = "PNG", example: str = "priors/parity.png") -> None:
  """Creates the folders `--out` names; a file in the way is a one-line error."""
  if not out:
    raise ValueError(f"--out is empty; give the {kind} file to write (e.g. {example}).")
  path = pathlib.Path(out)
  if path.is_dir():
    raise ValueError(f"--out {out} is a folder; give the {kind} file to write in it.")
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
  except (FileExistsError, NotADirectoryError):
    blocker = next(p for p in reversed(path.parents) if p.exists() and not p.is_dir())
    raise ValueError(f"--out {out}: {blocker} is a file, not a folder.") from None


def _prior_command(args) -> int:
  from mpx import plotting
  _make_parent(args.out)
  mask = _build_prior(args)
  title = f"{args.name} prior, shape {tuple(mask.shape)}"
  plotting.plot_prior(mask, args.out, title, **_prior_labels(args))
  print(f"wrote {args.out}: {title}")
  return 0


class _Terminated(BaseException):
  """SIGTERM while no training runs (the setup, the checkpoint scan, the pull from a
  bucket, the summary; training has its own handler that saves first): it unwinds as
  Ctrl-C does, so the run folder's lock is released on the way out."""


def _terminated(signum, frame):
  del signum, frame
  raise _Terminated


def _run_command(args) -> int:
  from mpx.sweep import run as run_lib
  main_thread = threading.current_thread() is threading.main_thread()
  previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
  try:
    return _run_unless_stopped(args)
  except _Terminated:
    print("mpx run: stopped by SIGTERM outside training (while the run was set up or its "
          f"summary written), so no training was lost; {run_lib.again(args.resume)} "
          "starts or continues it.", file=sys.stderr)
    return run_lib.PREEMPTED_EXIT_CODE
  finally:
    if main_thread:
      signal.signal(signal.SIGTERM, previous)


def _run_unless_stopped(args) -> int:
  from mpx.sweep import config as config_lib
  from mpx.sweep import lock as lock_lib
  from mpx.sweep import run as run_lib
  experiment = config_lib.load_experiment(args.experiment)
  overrides = [*(args.set or ()), *([f"select={args.select}"] if args.select else [])]
  try:
    run_lib.run_experiment(experiment, preset=args.preset, overrides=overrides,
                           out_dir=args.out, resume=args.resume,
                           finish=lambda summary: _draw_plots(summary, args.plots))
  except lock_lib.Locked as e:  # Another process writes the folder: try again later.
    print(f"mpx run: locked: {e}", file=sys.stderr)
    return run_lib.LOCKED_EXIT_CODE
  except run_lib.Preempted as e:
    print(f"mpx run: {e} Continue with {run_lib.again(args.resume)}.", file=sys.stderr)
    return e.exit_code
  except KeyboardInterrupt:  # Outside training (a second Ctrl-C in it exits at once).
    print("mpx run: stopped by Ctrl-C outside training (while the run was set up or its "
          f"summary written), so no training was lost; {run_lib.again(args.resume)} starts "
          "or continues it.",
          file=sys.stderr)
    return run_lib.INTERRUPTED_EXIT_CODE
  return 0


def _compile_command(args) -> int:
  from mpx.sweep import aot
  from mpx.sweep import config as config_lib
  experiment = config_lib.load_experiment(args.experiment)
  overrides = [*(args.set or ()), *([f"select={args.select}"] if args.select else [])]
  preset, reports = aot.compile_experiment(experiment, args.target, preset=args.preset,
                                           overrides=overrides)
  print(f"mpx compile {experiment.NAME} --preset {preset} --target {args.target}: "
        f"{len(reports)} group(s), jax {jax_version()}\n")
  for report in reports:
    print(aot.format_report(report) + "\n", flush=True)
  if args.json:
    _make_parent(args.json, "JSON", "compile.json")
    pathlib.Path(args.json).write_text(json.dumps(
        {"experiment": experiment.NAME, "preset": preset, "target": args.target,
         "overrides": overrides, "jax": jax_version(),
         "groups": [aot.as_dict(r) for r in reports]}, indent=1, default=str) + "\n")
  unfit = [aot.does_not_fit(r) for r in reports if not r.fits]
  if unfit:
    print(f"mpx compile: does not fit: {'; '.join(unfit)}", file=sys.stderr)
    return aot.DOES_NOT_FIT_EXIT_CODE
  return 0


def jax_version() -> str:
  import jax
  return jax.__version__


def _draw_plots(summary: dict, plots: bool) -> None:
  """The run's figures (process 0, while the run still holds its folder)."""
  from mpx import checkpoint
  from mpx.sweep import distributed
  from mpx.sweep import run_folder
  if not distributed.is_primary():  # Process 0 writes the run's files.
    return
  run_dir, local_dir = summary["run_dir"], summary["local_dir"]
  if not plots:
    print(f"no plots (--no-plots): `mpx plot {run_dir}` draws them", file=sys.stderr)
  else:
    try:  # Drawn by default: summary.md links plots/overview.png.
      from mpx import plotting
      print(f"plots: {_plots_line(plotting.plot_run(local_dir), run_dir)}", file=sys.stderr)
    except (ImportError, ValueError) as e:  # The run itself succeeded: say why, exit 0.
      print(f"no plots: {e}", file=sys.stderr)
    checkpoint.retrying("uploading the run's plots to",  # A gs:// run's (nothing for a path).
                     lambda: run_folder.push(local_dir, run_dir), run_dir)
  print(f"summary: {run_dir}/summary.md", file=sys.stderr)  # The last line: where to look.


def _run_reporting_storage_faults(args) -> int:
  """`mpx run`, where a storage fault (a full disk, a refused write, checkpoints that do
  not restore) ends in one line and exit status 4, and the libraries' thread errors go to
  a log file that line names (`mpx.sweep.storage`)."""
  from mpx.sweep import run as run_lib
  from mpx.sweep import storage
  with storage.background_errors_to_log() as errors:
    try:
      return _run_command(args)
    except Exception as e:  # gcsfs's HttpError, e.g., is no OSError.
      if isinstance(e, OSError) and (broken := _half_installed(e)) is not None:
        print(f"mpx run: error: {broken}", file=sys.stderr)  # Not the run folder's: exit 2.
        return run_lib.ERROR_EXIT_CODE
      line = storage.fault_line(e, errors, run_lib.again(args.resume))
      if line is None:
        raise
      print(line, file=sys.stderr)
      return (storage.UNAVAILABLE_EXIT_CODE if line.startswith(storage.UNAVAILABLE)
              else run_lib.STORAGE_EXIT_CODE)


def _plot_command(args) -> int:
  from mpx import plotting
  if "://" in args.run_dir:
    raise ValueError(f"{args.run_dir} is a URL; `mpx plot` reads a local folder: copy it "
                     f"first (gcloud storage cp --recursive {args.run_dir} runs/). `mpx run` "
                     "already drew the plots into the bucket.")
  _check_run_folder(pathlib.Path(args.run_dir))
  print(f"wrote {_plots_line(plotting.plot_run(args.run_dir), args.run_dir)}")
  return 0


def _select_command(args) -> int:
  from mpx import report
  from mpx.sweep import select
  text = select.combined_report(args.run_dirs)
  if args.out is not None:
    _make_parent(args.out, "Markdown", "results/selection.md")
    report.atomic_write(args.out, text)
    print(f"wrote {args.out}")
  else:
    print(text, end="")
  return 0


def _check_run_folder(path: pathlib.Path) -> None:
  """A one-line error unless `path` is a run folder with records to plot."""
  from mpx import report
  hint = "give the folder `mpx run` wrote (its --out)"
  if not path.exists():
    raise ValueError(f"{path} does not exist; {hint}.")
  if not path.is_dir():
    raise ValueError(f"{path} is a file, not a run folder; {hint}.")
  if not (path / report.METRICS_FILE).exists():
    if (path / "config.json").exists():
      raise ValueError(f"{path} has no {report.METRICS_FILE} yet: the run writes it at its "
                       "first evaluation; plot again then.")
    raise ValueError(f"{path} is not a run folder (no {report.METRICS_FILE} or config.json);"
                     f" {hint}.")


def _plots_line(written: list[str], run_dir) -> str:
  """"N PNG files in RUN_DIR/plots", pointing at the overview when there is one."""
  first = f", start with {written[0]}" if written and written[0].endswith("overview.png") else ""
  return f"{len(written)} PNG files in {run_dir}/plots{first}"


TINY_PRESET = "tiny"  # Every built-in experiment's smoke run: seconds of training.


def _preset_label(name: str, first: bool) -> str:
  notes = ["default"] * first + ["runs in under a minute"] * (name == TINY_PRESET)
  return f"{name} ({', '.join(notes)})" if notes else name


def experiments_help() -> str:
  """The experiments `mpx run` finds (./experiments first, then mpx's own) with their
  presets. It imports every experiment, so only `mpx run --help` calls it."""
  from mpx.sweep import config as config_lib
  lines = ["experiments (NAME, or the path to your own experiment file):"]
  for name in config_lib.available_experiments():
    try:
      experiment = config_lib.load_experiment(name)
    except Exception as e:  # A user's broken file is listed with its error, not fatal.
      lines.append(f"  {name}: cannot be loaded: {type(e).__name__}: {e}")
      continue
    summary = " ".join((experiment.__doc__ or "").strip().split("\n\n")[0].split())
    presets = [_preset_label(p, i == 0) for i, p in enumerate(experiment.PRESETS)]
    lines.append(_wrap(f"{name}: {summary}" if summary else name, "  "))
    lines.append(_wrap(f"--preset {', '.join(presets)}", "      "))
  return "\n".join(lines)


_NAMES = r"\w+(?:\s*[/,]\s*\w+)*"  # `a`, `a / b`, `a, b`: the fields an entry describes.


def field_docs(config_class) -> dict[str, str]:
  """{field: its description} from the "name: text" entries of the config class's
  docstrings and its bases' (`a / b: text` describes both; `; c: text` or `. c: text`
  starts another; deeper-indented lines continue one). The class's own entry wins."""
  docs = {}
  for klass in config_class.__mro__:
    entries, indent = [], None
    for line in inspect.cleandoc(klass.__dict__.get("__doc__") or "").splitlines():
      depth = len(line) - len(line.lstrip())
      continued = indent is not None and depth > indent and line.strip()
      if not continued:
        indent = None
      for i, part in enumerate(re.split(rf"(?:;|(?<=\.))\s+(?={_NAMES}:\s)", line.strip())):
        m = re.match(rf"({_NAMES}):\s+", part)
        if continued and i == 0:
          entries[-1][1].append(part)
        elif m:
          entries.append((m.group(1), [part[m.end():]]))
          indent = depth if indent is None else indent
    for names, text in entries:
      for name in re.split(r"\s*[/,]\s*", names):
        docs.setdefault(name, " ".join(text))
  return docs


def experiment_help(name_or_path: str) -> str:
  """`mpx run EXPERIMENT --help`: what the experiment is, its presets and every config key
  with its type, default and description; traced keys are marked."""
  from mpx.sweep import config as config_lib
  experiment = config_lib.load_experiment(name_or_path)
  doc = (experiment.__doc__ or "").strip()
  lines = [_wrap(" ".join(doc.split("\n\n")[0].split()), "") if doc else name_or_path, "",
           "presets (--preset NAME; the first is the default):"]
  for i, (preset, values) in enumerate(experiment.PRESETS.items()):
    shown = " ".join(f"{k}={_show(v)}" for k, v in values.items()) or "(the defaults)"
    lines.append(_wrap(f"{_preset_label(preset, i == 0)}: {shown}", "  "))
  lines += ["", "config keys (--set KEY=VALUE; a list a,b,c sweeps a key: one group per "
            "value, or for keys marked * (traced) members of one program):"]
  docs = field_docs(experiment.Config)
  for field in dataclasses.fields(experiment.Config):
    traced = "*" if field.name in config_lib.TRACED else ""
    default = (field.default if field.default is not dataclasses.MISSING
               else field.default_factory())
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    lines.append(_wrap(f"{field.name}{traced} ({kind}) = {_show(default)}", "  "))
    if field.name in docs:
      lines.append(_wrap(docs[field.name], "      "))
  return "\n".join(lines)


def _show(value) -> str:
  """A config value as `--set` takes it: tuples as a,b,c."""
  if isinstance(value, (tuple, list)):
    return ",".join(map(str, value)) or "()"
  return str(value)


def _wrap(text: str, indent: str) -> str:
  return textwrap.fill(text, 96, initial_indent=indent, subsequent_indent=indent + "    ",
                       break_on_hyphens=False, break_long_words=False)


class _RunHelp(argparse.Action):
  """`mpx run --help`: the usage, then `experiments_help()`, loaded only when asked so
  `import mpx.cli` and the other commands stay light."""

  def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
               help=None):
    super().__init__(option_strings, dest, default=default, nargs=0, help=help)

  def __call__(self, parser, namespace, values, option_string=None):
    experiment = getattr(namespace, "experiment", None)
    if experiment:  # `mpx run EXPERIMENT --help`: that experiment's presets and keys.
      try:
        text = experiment_help(experiment)
      except ValueError as e:
        parser.error(str(e))
      print(f"usage: mpx run {experiment} [--preset NAME] [--set KEY=VALUE ...] [--out DIR] "
            "[--resume[=auto]]\n(`mpx run --help`: every option and the exit codes)\n")
      print(text)
      parser.exit()
    parser.epilog = f"{RUN_EXIT_CODES}\n\n{experiments_help()}"
    parser.print_help()
    parser.exit()


RESUME_AUTO = "auto"  # mpx.sweep.run.RESUME_AUTO, without importing JAX while parsing.


def _resume_value(text: str) -> str:
  """`--resume=auto`; `--resume` alone is `const=True`."""
  if text != RESUME_AUTO:
    raise argparse.ArgumentTypeError(
        f"expected --resume or --resume={RESUME_AUTO}, got the value {text!r}; put the "
        "experiment before --resume (mpx run EXPERIMENT ... --resume)")
  return text


RUN_EXIT_CODES = """\
exit status:
  0    done: the summary is written (a finished run given again only rewrites it)
  1    failed: an unexpected error (traceback above)
  2    error: a bad command line, a config refused when built or traced, or an optional
       dependency missing (one line naming its install) or half-installed (one line
       naming the import that failed and the package to reinstall); nothing was written,
       but for a package that broke during the run (reinstall it, run the same command)
  3    refused: the run directory holds another run (another config, or progress a fresh
       start would overwrite), or --resume found nothing to continue; nothing was written
  4    storage: a full disk, a denied permission, a bucket refusing a write, or a group
       none of whose checkpoints restores (one line: the path, the cause, the log of the
       libraries' thread errors); fix it, then run the same command again. A damaged
       newest checkpoint alone (its sums differ, or it does not restore) is no fault: it
       is set aside, the run resumes from the newest one that verifies (read twice: a
       read that fails once is retried, not counted)
  69   storage unavailable: a fault that may pass (a bucket's 503s, a timeout, an I/O
       error) outlasted MPX_STORAGE_RETRY_S seconds of retries (default 600); run the
       same command later: it continues from the last checkpoint (the launchers do)
  75   locked: another process is writing the run directory (its host, pid, start and
       command are named); nothing was read or written. Run the same command once it has
       ended (a lock whose process died is taken over: see docs/sweeps.md). Also a run
       whose lock another process took over (its heartbeat had stopped): it stops at once,
       without saving, and the new holder continues from the last checkpoint
  130  interrupted: Ctrl-C, the state is checkpointed as for SIGTERM (a second Ctrl-C
       stops at once, without saving); run the same command again
  143  preempted: SIGTERM, the state is checkpointed; run the same command again
       (SIGKILL shows as 137: the same command continues from the last checkpoint)"""


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="mpx", description="Mask-based attention priors: log σ(M) added to the logits.")
  parser.add_argument("--version", action="version", version=f"mpx {mpx.__version__}")
  sub = parser.add_subparsers(dest="command", metavar="COMMAND")

  run = sub.add_parser("run", help="train an experiment's sweep (all members in one program); "
                                   "--help lists the experiments and presets",
                       add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter)
  run.add_argument("-h", "--help", action=_RunHelp,
                   help="show this help, the experiments and their presets, and exit; after "
                        "an experiment (mpx run EXPERIMENT --help): its presets and config "
                        "keys with defaults")
  run.add_argument("experiment", help="experiment name (e.g. boolean_gotu) or path to its file")
  run.add_argument("--preset", help="preset of the experiment (default: its first)")
  run.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config field (repeatable); unknown keys are an error. "
                        "A list (a,b,c or logspace(1e-4,1e-2,5) / linspace(...)) sweeps it: "
                        "for learning_rate, weight_decay and mask_lr_multiplier (traced "
                        "values) the values are members of each group, one program; for "
                        "any other field, one group per value")
  run.add_argument("--select", metavar="HPARAM",
                   help="choose each scheme's HPARAM (a traced field given a list) on the "
                        "family's validation split and report the run at that value; the "
                        "same as --set select=HPARAM")
  run.add_argument("--out", help="run directory (default: runs/FILE-PRESET, FILE the "
                                 "experiment's file name)")
  run.add_argument("--resume", nargs="?", const=True, default=False, type=_resume_value,
                   metavar="auto",
                   help="continue the run in the run directory from its latest checkpoints; "
                        "--resume=auto: start the run, or continue it where the directory "
                        "holds the same run (one command for the first start and every "
                        "restart; another run there is refused)")
  run.add_argument("--no-plots", dest="plots", action="store_false",
                   help="skip the figures (RUN_DIR/plots); `mpx plot RUN_DIR` draws them later")
  run.add_argument("--distributed", action="store_true",
                   help="join a multi-process run (jax.distributed; also MPX_DISTRIBUTED=1): "
                        "see launch/README.md")
  run.set_defaults(func=_run_reporting_storage_faults)

  compile_ = sub.add_parser(
      "compile", help="compile an experiment's programs for a TPU topology or GPU model "
                      "without one: memory per device, fit, FLOPs, a roofline estimate",
      description="Builds exactly what `mpx run` would for the same arguments and compiles "
                  "each group's training chunk and evaluation with XLA for --target, on "
                  "this machine (no accelerator needed; pip install 'mpx[aot]'). Exit 0: "
                  "every group fits; 2: one does not (one line: the need against the "
                  "chip's memory, the members per device that would fit), or a bad "
                  "command line. Times printed are roofline estimates, not measurements.")
  compile_.add_argument("experiment", help="experiment name (e.g. boolean_gotu) or path")
  compile_.add_argument("--preset", help="preset of the experiment (default: its first)")
  compile_.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a config field, as for mpx run (repeatable)")
  compile_.add_argument("--select", metavar="HPARAM", help="as for mpx run")
  compile_.add_argument("--no-plots", dest="plots", action="store_false",
                        help="accepted as mpx run takes it (a compile draws nothing), so "
                             "a job's run arguments can be given as they are")
  compile_.add_argument("--target", required=True,
                        help="a TPU topology (v5e:2x2, v5e:4x4, v4:2x2x2, v5p:2x2x1, "
                             "v6e:2x2) or accelerator type (v4-32, v5litepod-16), or GPUs "
                             "(h100:8, h200:8)")
  compile_.add_argument("--json", metavar="FILE", help="also write the reports as JSON")
  compile_.set_defaults(func=_compile_command)

  plot = sub.add_parser("plot", help="draw a run's curves into RUN_DIR/plots")
  plot.add_argument("run_dir", help="a run folder: the --out of `mpx run`")
  plot.set_defaults(func=_plot_command)

  choose = sub.add_parser(
      "select", help="choose each scheme's hyperparameter on validation over run folders "
                     "that are one grid (a run, then the same command at more values)")
  choose.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                      help="run folders of `mpx run ... --select HPARAM`")
  choose.add_argument("--out", help="Markdown file to write (default: print it)")
  choose.set_defaults(func=_select_command)

  prior = sub.add_parser("prior", help="draw a mask prior as a heatmap")
  prior.add_argument("name", choices=PRIOR_NAMES)
  prior.add_argument("--out", required=True,
                     help="PNG file to write (missing folders are created)")
  prior.add_argument("--strength", type=float, default=4.0, help="a: allowed +a, suppressed -a")
  prior.add_argument("--n-bits", type=int, default=15, help="Boolean priors: input bits")
  prior.add_argument("--support", type=int, nargs="+", help="Boolean priors: relevant bits")
  prior.add_argument("--keep-shortcut", action="store_true",
                     help="majority: do not suppress the global-sum shortcut")
  prior.add_argument("--window", type=int, default=3, help="cyclic / window size")
  prior.add_argument("--digits", type=int, default=3, help="arithmetic operand digits")
  prior.add_argument("--grid", type=int, nargs=2, default=(4, 4), metavar=("H", "W"),
                     help="vision patch grid")
  prior.add_argument("--heads", type=int, default=3, help="impulse / alibi heads")
  prior.add_argument("--tokens", type=int, default=16, help="alibi / neutral tokens")
  prior.set_defaults(func=_prior_command)
  return parser


def _half_installed(e: BaseException) -> str | None:
  """One line naming the import that failed and the package to reinstall, where `e` was
  raised while another package's module ran its import (an ImportError, or the OSError of
  a shared library that ctypes cannot open, as a half-installed torch raises): an error
  outside the run folder, which must not read as a storage fault of it. None where no
  installed package's import raised it (mpx's own errors keep their meaning), or where
  the storage did (a full disk while a package writes its cache at import)."""
  import importlib.metadata
  from mpx import checkpoint
  if isinstance(e, OSError) and e.errno in checkpoint.STORAGE_ERRNOS:
    return None
  try:
    distributions = importlib.metadata.packages_distributions()
  except Exception:  # Unreadable metadata: the installed folders still tell.
    distributions = {}
  modules = []  # The installed packages' modules being imported, outermost first.
  traceback = e.__traceback__
  while traceback is not None:
    frame = traceback.tb_frame
    name, file = frame.f_globals.get("__name__", ""), frame.f_code.co_filename
    installed = (name.partition(".")[0] in distributions
                 or {"site-packages", "dist-packages"} & set(pathlib.Path(file).parts))
    if frame.f_code.co_name == "<module>" and installed and not name.startswith("mpx"):
      modules.append(name)
    traceback = traceback.tb_next
  if not modules:
    return None
  package = modules[-1].partition(".")[0]
  distribution = distributions.get(package, [package])[0]
  what = " ".join(f"{type(e).__name__}: {e}".split())
  return (f"importing {modules[0].partition('.')[0]} failed in {package}, which is "
          f"half-installed ({what}): reinstall it (pip install --force-reinstall "
          f"{distribution})")


def _missing_dependency(e: ImportError) -> str | None:
  """One line naming the install for an optional dependency that is missing; None for
  any other ImportError (a bug in mpx keeps its traceback)."""
  from mpx.sweep.config import EXTRAS  # Optional package → the extra that installs it.
  name = (e.name or "").partition(".")[0]
  if "pip install" in str(e):  # mpx's own message names the install already.
    return str(e)
  if name in EXTRAS:
    return f"{name} is not installed: pip install 'mpx[{EXTRAS[name]}]'"
  return None


def main(argv: list[str] | None = None) -> int:
  parser = make_parser()
  args = parser.parse_args(argv)
  if args.command is None:
    parser.print_help()
    return 0
  if args.command == "run":
    from mpx.sweep import cpu_flags, distributed
    added = cpu_flags.apply()  # XLA reads its flags when jax starts its backend: before.
    if added:
      print(f"mpx run: {cpu_flags.describe(added)} ({cpu_flags.ENV_SWITCH}=0 turns them off)",
            file=sys.stderr)
    if distributed.requested(args.distributed):
      distributed.initialize()  # Before any other JAX call.
  if args.command == "compile" and "JAX_PLATFORMS" not in os.environ:
    # The host only traces: its own accelerator (or a CUDA plugin without CUDA) stays out.
    import jax
    jax.config.update("jax_platforms", "cpu")
  try:
    return args.func(args)
  except ImportError as e:
    line = _half_installed(e) or _missing_dependency(e)
    if line is None:
      raise
    parser.exit(2, f"mpx {args.command}: error: {line}\n")
  except (ValueError, FileNotFoundError, FileExistsError) as e:
    if args.command == "run":
      from mpx.sweep import run as run_lib  # Imported already: it raised the error.
      if isinstance(e, run_lib.Refused):  # The run folder holds another run: exit 3.
        parser.exit(run_lib.REFUSED_EXIT_CODE, f"mpx run: refused: {e}\n")
    parser.exit(2, f"mpx {args.command}: error: {e}\n")


if __name__ == "__main__":
  sys.exit(main())
