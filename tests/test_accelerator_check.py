"""benchmarks/accelerator_check on a CPU, the FLOP counts and traces it reports, and the
cuDNN path's odd-token padding.

The script is what an accelerator runs, unattended, in a few minutes: here it runs every
stage at toy sizes (`--tiny`) with the modules the device image lacks blocked, respects a
small budget, plans without a device, and records a crashing probe process; the model's
FLOP count is checked against the step's own matmuls, a low XLA count is marked, and the
trace reader is checked on a GPU-shaped trace; the padding that lets cuDNN train at 197
tokens is checked against the unpadded attention and, at trace time, against jax's own
cuDNN checks.
"""

import dataclasses
import json
import math
import os
import pathlib
import platform
import re
import subprocess
import sys
import textwrap
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mpx.experiments.boolean_gotu as gotu_experiment
from mpx import attention as attention_lib
from mpx.sweep import config as config_lib
from mpx.sweep import flops, memory
from mpx.tasks import boolean
from mpx.tasks.boolean import gotu as boolean_gotu

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECK = ROOT / "benchmarks" / "accelerator_check"  # Runs as `python CHECK`.
# Not on the device image: the script must run without them.
BLOCKED = ("grain", "tensorflow_datasets", "tensorflow", "torch", "sklearn")


sys.path.insert(0, str(CHECK.parent))  # benchmarks/ is not a package.
from accelerator_check import __main__ as check  # noqa: E402
from accelerator_check import ab, context, cudnn, cudnn_probes, environment, eta  # noqa: E402
from accelerator_check import headline, plan  # noqa: E402
from accelerator_check import report as report_lib  # noqa: E402
from accelerator_check import sweep  # noqa: E402
import chunk_timing  # noqa: E402
import xla_trace  # noqa: E402
from test_nn import _equations  # noqa: E402 (tests/: walks nested jaxprs)


def _device_image_env(tmp: pathlib.Path) -> dict:
  """The environment of a process that cannot import what the device image lacks: a
  sitecustomize on PYTHONPATH marks those modules absent (`sys.modules[name] = None`:
  importing one raises ModuleNotFoundError, `importlib.util.find_spec` finds nothing, as
  for a module not installed); children of the process, the probe process included,
  inherit it."""
  blocker = tmp / "blocker"
  blocker.mkdir(exist_ok=True)
  (blocker / "sitecustomize.py").write_text(
      f"import sys\nsys.modules.update(dict.fromkeys({BLOCKED!r}))\n")
  return dict(os.environ, PYTHONPATH=f"{blocker}{os.pathsep}{ROOT}")


def _run(tmp: pathlib.Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
  out = tmp / "out"
  command = [sys.executable, str(CHECK), "--out", str(out), "--cache-dir",
             str(tmp / "cache"), *args]
  done = subprocess.run(command, cwd=ROOT, env=_device_image_env(tmp), capture_output=True,
                        text=True, timeout=1800)
  assert done.returncode == 0, done.stderr[-3000:]
  return done, json.loads((out / report_lib.JSON_FILE).read_text())


def test_blocked_modules_do_not_import(tmp_path):
  """The check of the check: under that environment the blocked modules really fail."""
  env = _device_image_env(tmp_path)
  for name in ("grain", "tensorflow_datasets"):
    done = subprocess.run([sys.executable, "-c", f"import {name}"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr
  probe = "import importlib.util; assert importlib.util.find_spec('tensorflow') is None"
  assert subprocess.run([sys.executable, "-c", probe], env=env, timeout=120).returncode == 0


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
  """`--tiny` with a budget every stage fits: (json report, markdown, stdout, out dir)."""
  tmp = tmp_path_factory.mktemp("tiny")
  done, report = _run(tmp, "--tiny", "--budget-s", "1500")
  return report, (tmp / "out" / report_lib.MARKDOWN_FILE).read_text(), done.stdout, tmp / "out"


def _number(text: str) -> float:
  return float(re.match(r"[-+0-9.e]+", text).group())


def _environment_content(stages):
  """The device, versions and flags of the process that ran (this one's, inherited), the
  matmul peak at the tiny size."""
  import flax
  import jaxlib
  facts = stages["environment"]["facts"]
  assert facts["device"] == f"{jax.device_count()} × cpu (cpu)"
  assert facts["versions"].startswith(
      f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}, "
      f"Python {platform.python_version()}; "), facts["versions"]
  assert facts["XLA_FLAGS / memory fraction"] == (
      f"{os.environ.get('XLA_FLAGS', '')!r} / "
      f"{os.environ.get('XLA_PYTHON_CLIENT_MEM_FRACTION')}")
  tiny = context.TINY
  peak = facts[f"matmul peak ({tiny.matmul_n}³ jnp.dot, best of {tiny.matmul_repeats})"]
  found = re.match(r"float32 (\S+) TFLOP/s, bfloat16 (\S+) TFLOP/s", peak)
  assert found and min(map(float, found.groups())) > 0, peak
  return {"float32": float(found[1]), "bfloat16": float(found[2])}


def _sweep_content(stages, peaks):
  """Each row's numbers agree with one another (rate, XLA's FLOPs, the peak, the program
  size), and the most members that fit is the arithmetic of the two float32 rows."""
  stage = stages["sweep"]
  _, config = config_lib.make_config(gotu_experiment, "tiny")
  model = flops.transformer_matmul_flops(config, boolean.get_task("2parity").n_bits + 1)
  for row in stage["rows"]:
    assert row["member-steps/s"] == f"{row['rate']:.4g}", row
    assert row["program memory"] == memory.size(row["program"]), row
    assert row["GFLOP / member-step (model)"] == f"{model / 1e9:.4g}", row
    # Printed to 3 significant digits, from the model's count: the rounding is < 5e-3.
    achieved = model * row["rate"] / 1e12
    assert float(row["achieved TFLOP/s"]) == pytest.approx(achieved, rel=5e-3), row
    dtype = row["precision, attention"].split(",")[0]
    # Both to 3 digits (1% off at most), the percent rounded to an integer.
    percent = 100 * float(row["achieved TFLOP/s"]) / peaks[dtype]
    assert abs(_number(row["of the peak"]) - percent) <= 0.5 + 0.011 * percent, (row, peaks)
  one, two = (next(r for r in stage["rows"] if r["K"] == k
                   and r["precision, attention"] == "float32, reference") for k in (1, 2))
  per_member = two["program"] - one["program"]
  assert per_member > 0
  most = stage["facts"]["most members that fit (tiny)"]
  assert most.startswith(f"2 ({memory.size(per_member)} per member + "
                         f"{memory.size(one['program'] - per_member)} shared, "), most
  assert most.endswith("; capped at 2)"), most


def _cudnn_content(stages):
  """Every probe compared two different computations (bf16 fused against float32
  reference: a nonzero error) within its tolerance; the engine's two losses agree."""
  stage = stages["cudnn"]
  assert stage["facts"]["fused attention checked"] == (
      'the XLA path (implementation="jax"; no GPU here)')
  for row in stage["rows"]:
    if row["case"] == "engine_chunk_form_all":
      continue
    found = re.search(r"relative error (\S+) \(tolerance (\S+)\)", row["detail"])
    assert found, row
    error, tolerance = float(found[1]), float(found[2])
    assert 0 < error <= tolerance, row
  engine = next(r for r in stage["rows"] if r["case"] == "engine_chunk")
  losses = re.match(r"train loss \[(.*)\] vs \[(.*)\]", engine["detail"]).groups()
  got, want = (np.array([float(x) for x in part.split(", ")]) for part in losses)
  assert got.shape == want.shape == (2,) and np.all(np.isfinite(got))
  np.testing.assert_allclose(got, want, rtol=5e-2)


def _ab_content(stages):
  """Every tiny variant ran: the plain step is the reference and reproduces itself exactly
  on a CPU; each other variant's losses agree with it within its tolerance (bf16's not
  exactly: it computes in bf16); the fastest named is the fastest row that agrees."""
  stage = stages["ab"]
  rows = {r["variant"]: r for r in stage["rows"]}
  assert list(rows) == list(context.TINY.ab["variants"])
  assert rows["plain"]["verdict"] == "reference" and rows["plain"]["× plain"] == "1.00"
  assert stage["facts"]["plain against itself"].startswith("0 (")
  for name, row in rows.items():
    assert row["rate"] > 0 and row["member-steps/s"] == f"{row['rate']:.4g}", row
    assert float(row["× plain"]) == pytest.approx(row["rate"] / rows["plain"]["rate"],
                                                  abs=5e-3), row
    if name != "plain":
      found = re.match(r"(\S+) \(tolerance (\S+)\)", row["losses vs plain"])
      error, limit = float(found[1]), float(found[2])
      assert row["verdict"] == "same" and error <= limit == ab.tolerance(ab.VARIANTS[name])
      assert (error > 0) == (name == "bf16"), row
  best = max(rows.values(), key=lambda r: r["rate"])
  assert stage["facts"]["fastest that computes the same"].startswith(
      f"{best['variant']} ({best['member-steps/s']} member-steps/s")


def _models_content(stages):
  """Two ViT members per row, mapped as `TINY.vit_rows` says; throughput is K × batch (or
  the language row's tokens) per step, and per member a K-th of it."""
  rows = stages["models"]["rows"]
  vit = [r for r in rows if r["model"].startswith("ViT")]
  assert [(r["K"], r["members_per_call"]) for r in vit] == [
      (2, m) for _, m in context.TINY.vit_rows]
  for row in rows:  # Each printed to 4 significant digits: 5e-4 apiece, a ratio < 1.1e-3.
    rate = float(row["images or tokens /s"])
    assert float(row["per member"]) == pytest.approx(rate / row["K"], rel=1.1e-3), row
    assert _number(row["program memory"]) > 0, row
  for row in vit:
    items = row["K"] * context.TINY.vit_batch / float(row["step s (all members)"])
    assert float(row["images or tokens /s"]) == pytest.approx(items, rel=1.1e-3), row
  assert rows[-1]["model"] == "language tiny (1 × 16, 16 tokens, vocab 257, float32)"


def _eta_content(stages):
  """The tiny table's ETA: 2Parity's members × steps (the tiny preset's, computed here)
  at the rate the sweep measured for that K, plus the float32 compile; the headline run
  it is checked against is the headline stage's, its overhead the arithmetic of both."""
  stage = stages["eta"]
  _, config = config_lib.make_config(gotu_experiment, "tiny")
  x, _ = boolean_gotu.training_split(boolean.get_task("2parity"), 0, None)
  members = len(config.schemes) * config.seeds
  steps = config.epochs * (len(x) // config.batch_size)
  (row,) = stage["rows"]
  assert (row["task"], row["members"], row["steps"]) == ("2parity", members, steps)
  assert row["member-steps"] == f"{members * steps:,}"
  sweep = [r for r in stages["sweep"]["rows"]
           if r["precision, attention"] == "float32, reference"]
  measured = next(r for r in sweep if r["K"] == members)  # The tiny sweep measures K = 2.
  assert row["rate used"] == f"{measured['rate']:.4g} member-steps/s (K = {members})"
  assert row["training s"] == f"{members * steps / measured['rate']:.0f}"
  compile_s = max(float(r["compile s"]) for r in sweep)
  eta = stage["facts"]["ETA of the tiny table"]
  found = re.match(r"(\d+) s = training \+ 1 × (\d+) s compile; fits one 600 s call", eta)
  assert found, eta
  assert abs(int(found[2]) - compile_s) <= 0.6, (eta, compile_s)
  assert abs(int(found[1]) - (members * steps / measured["rate"] + compile_s)) <= 1, eta
  exact = stage["eta_s"]  # The unrounded figures: a missing term shows however fast the CPU.
  assert abs(exact["compile"] - compile_s) <= 0.05 and exact["groups"] == 1, exact
  assert exact["total"] == pytest.approx(members * steps / measured["rate"] + exact["compile"],
                                         rel=1e-9), exact
  seeds = context.TINY.headline["seeds"]
  run = stage["facts"]["the 2parity run (headline) against this ETA"]
  found = re.match(rf"(\d+) s for {members * seeds} members × {steps} steps: (\d+) s of "
                   r"training at the rate measured here and (\d+) s compile, so evaluation, "
                   r"init \(QK-Opt's included\) and checkpoints cost × (\S+) over training", run)
  assert found, run
  assert f"to the end in {found[1]} s" in stages["headline"]["facts"]["trained"]
  run = exact["headline"]
  assert found.groups()[:3] == (f"{run['wall']:.0f}", f"{run['training']:.0f}",
                                f"{exact['compile']:.0f}")
  # The rate at 2 × 2 members: the nearest measured K, 2.
  assert run["training"] == pytest.approx(members * seeds * steps / measured["rate"], rel=1e-9)
  overhead = (run["wall"] - exact["compile"]) / run["training"]
  assert stage["overhead"] == pytest.approx(overhead, rel=1e-9)
  assert found[4] == f"{overhead:.2f}"


def _headline_content(stages, out):
  """The tiny 2Parity row, every scheme × 2 seeds trained to the end in a run folder:
  its table's mean ± std per scheme are those of the folder's summary.json (computed
  here), beside the paper's number."""
  stage = stages["headline"]
  folder = out / "boolean_gotu-tiny-2parity"
  summary = json.loads((folder / "summary.json").read_text())
  assert (folder / "summary.md").read_text().startswith("# boolean_gotu (preset tiny)")
  _, config = config_lib.make_config(gotu_experiment, "tiny")
  x, _ = boolean_gotu.training_split(boolean.get_task("2parity"), 0, None)
  steps = config.epochs * (len(x) // config.batch_size)
  rows = {r["scheme"]: r for r in stage["rows"]}
  assert set(rows) == set(config.schemes)
  for scheme, row in rows.items():
    members = [m for m in summary["members"] if m["scheme"] == scheme]
    assert row["seeds"] == len(members) == context.TINY.headline["seeds"]
    assert row["step"] == f"{steps} (end)"
    for column, metric in (("whole-cube accuracy (%)", "accuracy"),
                           ("unseen accuracy (%)", "accuracy_unseen")):
      values = 100 * np.array([m["metrics"][metric] for m in members])
      assert row[column] == f"{values.mean():.2f} ± {values.std():.2f}", (row, values)
    assert row["paper (%)"] == f"{100 * gotu_experiment.PAPER['2parity'][scheme]['accuracy']:g}"
  assert stage["facts"]["trained"].startswith("to the end in "), stage["facts"]
  assert "--set tasks=2parity --set seeds=2 --out boolean_gotu-tiny-2parity" in (
      stage["facts"]["run"])


def _profile_content(stages, out):
  """Per K traced: the table has the kinds (mpx's attention core among them, by its
  named scope), and its rows add up to the traced span: exactly in the JSON's unrounded
  figures, and printed to 0.001 ms per row, so within half that per row and the span's
  own rounding; the span is no longer than the host's clock around the traced call
  (each printed to 0.001 ms per step: 0.002 between them). The traces and tables are
  in the output folder."""
  stage = stages["profile"]
  for k in context.TINY.profile["members"]:
    rows = [r for r in stage["rows"] if r["K"] == k]
    kinds = [r["kind"] for r in rows]
    assert {xla_trace.MATMUL, xla_trace.ATTENTION, xla_trace.COPIES} <= set(kinds), kinds
    assert any(kind.startswith("fusion (root: ") for kind in kinds), kinds
    assert kinds[-2:] == [xla_trace.GAPS, xla_trace.OVERLAP]
    assert next(r for r in rows if r["kind"] == xla_trace.ATTENTION)["ms"] > 0
    span = stage["span_ms"][str(k)]
    assert sum(r["ms"] for r in rows) == pytest.approx(span, rel=1e-9)
    fact = stage["facts"][f"K = {k}"]
    printed_span = float(re.search(r"span (\S+) ms per step", fact)[1])
    printed = sum(float(r["ms per step"]) for r in rows)
    assert abs(printed - printed_span) <= 0.0005 * (len(rows) + 1), (printed, fact)
    traced = float(re.search(r", (\S+) traced \(host clock\)", fact)[1])
    assert printed_span <= traced + 0.002, fact
    assert list((out / "profile" / f"k{k}").glob("**/*.trace.json.gz"))
    assert (out / "profile" / f"k{k}.md").read_text().startswith(f"# Profile at K = {k}")
  assert [t["title"] for t in stage["tables"]] == [
      f"Top {context.TINY.profile['top']} ops at K = {k}, by their own time"
      for k in context.TINY.profile["members"]]


@pytest.mark.slow
def test_tiny_run_reports_every_stage(tiny_run):
  """Every stage ran, and what it reports holds together: the numbers each stage
  derives agree with the measurements it derives them from and with this machine."""
  report, markdown, stdout, out = tiny_run
  stages = report["stages"]
  assert list(stages) == list(check.DEFAULT_STAGES)
  for key, stage in stages.items():
    assert stage["status"] == "done", (key, stage["notes"])
    assert f"{stage['title']} (done" in markdown
  assert markdown.strip() in stdout  # The report is printed at the end too.
  peaks = _environment_content(stages)
  _headline_content(stages, out)
  _profile_content(stages, out)
  _sweep_content(stages, peaks)
  _cudnn_content(stages)
  _ab_content(stages)
  _models_content(stages)
  _eta_content(stages)


@pytest.mark.slow
def test_tiny_run_measures_the_sweep(tiny_run):
  report, *_ = tiny_run
  stage = report["stages"]["sweep"]
  rows = stage["rows"]
  assert [(r["precision, attention"], r["K"]) for r in rows] == [
      ("float32, reference", 1), ("float32, reference", 2), ("bfloat16, jax", 2)]
  for row in rows:
    assert row["rate"] > 0 and "note" not in row, row
    xla, model = (float(row[f"GFLOP / member-step ({c})"]) for c in ("XLA", "model"))
    assert 0.5 < xla / model < 2, row  # XLA:CPU counts the scan's body once, per member.
    assert row["of the peak"].endswith(row["precision, attention"].split(",")[0])
  assert stage["facts"]["most members that fit (tiny)"].startswith("2 (")


@pytest.mark.slow
def test_tiny_run_probes_pass_and_lists_refusals(tiny_run):
  report, *_ = tiny_run
  stage = report["stages"]["cudnn"]
  assert [r["case"] for r in stage["rows"]] == list(cudnn_probes.PROBES)
  forms = set(cudnn_probes.FORM_PROBES) | {"engine_chunk_form_all"}
  for row in stage["rows"]:  # No cuDNN on a CPU: the forms' cases say so.
    assert row["result"] == ("not available" if row["case"] in forms else "ok"), row
  refused = [n for n in stage["notes"] if n.startswith("Refused before any compile")]
  assert any("float16 or all bfloat16" in n for n in refused)
  assert any("only on an NVIDIA GPU" in n for n in refused)


@pytest.mark.slow
def test_tiny_run_measures_the_models_and_the_eta(tiny_run):
  report, *_ = tiny_run
  rows = report["stages"]["models"]["rows"]
  assert [r["model"].split(" (")[0] for r in rows] == [
      "ViT 32 px / patch 2", "ViT 224 px / patch 16", "language tiny"]
  for row in rows:
    assert "note" not in row and float(row["images or tokens /s"]) > 0, row
  eta = report["stages"]["eta"]
  assert "fits one 600 s call" in eta["facts"]["ETA of the tiny table"]
  assert eta["facts"]["ETA of the table with that overhead"].endswith(" s")


def test_a_small_budget_skips_stages_with_a_note(tmp_path):
  """With no time left only the environment runs (it is always measured: the peaks)."""
  _, report = _run(tmp_path, "--tiny", "--budget-s", "1")
  stages = report["stages"]
  assert stages["environment"]["status"] == "done"
  assert stages["environment"]["facts"]["device"].startswith("1 × cpu")
  assert list(stages) == list(check.DEFAULT_STAGES)
  for key in check.DEFAULT_STAGES[1:]:
    assert stages[key]["status"] == "skipped"
    assert stages[key]["notes"][-1].startswith("Stage skipped:")
    assert "of the budget left" in stages[key]["notes"][-1]
  markdown = (tmp_path / "out" / report_lib.MARKDOWN_FILE).read_text()
  assert markdown.count("(skipped)") == len(check.DEFAULT_STAGES) - 1


def test_a_crashing_probe_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
  """A probe process killed by a signal mid-case (what a cuDNN crash does): that case
  reads "crashed", a new process runs the rest."""
  fake = tmp_path / "fake_probes.py"
  fake.write_text(textwrap.dedent("""\
      import json, os, pathlib, signal, sys
      args = sys.argv[2:]
      log = pathlib.Path(args[args.index("--cudnn-probes") + 1])
      cases = args[args.index("--cases") + 1].split(",")
      with log.open("a") as f:
        for case in cases:
          f.write(json.dumps({"case": case, "event": "start"}) + "\\n")
          f.flush()
          if case == "odd_tokens_padded":
            os.kill(os.getpid(), signal.SIGKILL)
          f.write(json.dumps({"case": case, "event": "end", "status": "ok", "detail": "",
                              "seconds": 0.0}) + "\\n")
      """))
  python = tmp_path / "python"
  python.write_text(f"#!/bin/sh\nexec {sys.executable} {fake} \"$@\"\n")
  python.chmod(0o755)
  monkeypatch.setattr(cudnn.sys, "executable", str(python))
  args = check.parse_args(["--tiny", "--out", str(tmp_path / "out"), "--cache-dir", ""])
  budget = report_lib.Budget(600)
  report = report_lib.Report(tmp_path / "out", {"command": "test", "budget_s": 600,
                                                "tiny": True, "started": "now"}, budget)
  ctx = context.Context(context.TINY, budget, report, args, "jax")
  stage = report.stage("cudnn", "probes")
  cudnn.stage_cudnn(ctx, stage)
  results = {r["case"]: r for r in stage["rows"]}
  assert list(results) == list(cudnn_probes.PROBES)
  assert results["odd_tokens_padded"]["result"] == "crashed"
  assert "killed by signal 9" in results["odd_tokens_padded"]["detail"]
  assert all(r["result"] == "ok" for c, r in results.items() if c != "odd_tokens_padded")


def test_the_ab_never_names_a_variant_whose_losses_differ(tmp_path, monkeypatch):
  """A variant that trains something else (a larger learning rate) on a smaller batch,
  so it runs faster: it is timed but marked "differs", and the plain step is named."""
  monkeypatch.setitem(ab.VARIANTS, "other", {"learning_rate": 3e-3, "batch_size": 16})
  sizes = dataclasses.replace(context.TINY, ab=dict(
      context.TINY.ab, rounds=3, check_steps=8, variants=("plain", "other")))
  args = check.parse_args(["--tiny", "--out", str(tmp_path / "out"), "--cache-dir", ""])
  budget = report_lib.Budget(600)
  report = report_lib.Report(tmp_path / "out", {"command": "test", "budget_s": 600,
                                                "tiny": True, "started": "now"}, budget)
  ctx = context.Context(sizes, budget, report, args, "jax", boolean=gotu_experiment)
  stage = report.stage("ab", "A/B")
  ab.stage_ab(ctx, stage)
  plain, other = stage["rows"]
  assert other["verdict"] == "differs" and other["rate"] > plain["rate"], other
  assert float(other["losses vs plain"].split()[0]) > 10 * ab.FLOAT32_TOLERANCE
  assert stage["facts"]["fastest that computes the same"].startswith("plain (")


def test_the_form_probes_say_not_available_without_cudnn(tmp_path):
  """On a CPU the form cases run their form on the XLA path, where it matches the
  reference, then try cuDNN: "not available" per case, with jax's reason, and the probe
  process goes on to the next case."""
  path = tmp_path / "probes.jsonl"
  cases = ["form_all", "engine_chunk_form_all"]
  cudnn_probes.run_probes(path, cases, context.TINY)
  done, started = cudnn.read_probes(path)
  assert list(done) == cases and started is None
  assert all(done[c]["status"] == "not available" for c in cases), done
  detail = done["form_all"]["detail"]
  # jax's reason first, in jax's words (they vary: "RuntimeError: cuDNN is not detected"
  # without CUDA's plugin, "cuDNN not found." or a nanobind SystemError with it).
  found = re.fullmatch(r"(\w+: .+); on the XLA path \(ok\): relative error (\S+) "
                       r"\(tolerance (\S+)\)", detail)
  assert found and 0 < float(found[2]) <= float(found[3]), detail
  assert "needs an NVIDIA GPU" in done["engine_chunk_form_all"]["detail"]


def test_most_members_from_two_program_sizes(monkeypatch):
  """Memory grows by one member's bytes per member: (limit − shared) / per member."""
  monkeypatch.setattr(environment, "memory_limit", lambda: (1000.0, "test"))
  rows = [{"K": 1, "program": 130}, {"K": 16, "program": 130 + 15 * 60}]
  k, how = sweep.most_members(rows, cap=1024)
  assert k == math.floor((1000 - 70) / 60) and "60 B per member" in how
  assert sweep.most_members(rows, cap=5)[0] == 5
  assert sweep.most_members(rows[:1], cap=5)[0] is None


def test_rates_are_interpolated_in_k():
  ctx = context.Context(context.TINY, report_lib.Budget(1), None, None, "jax")
  ctx.rates = {("paper", "float32", "reference", 1): 10.0,
               ("paper", "float32", "reference", 16): 100.0,
               ("paper", "bfloat16", "cudnn", 16): 1e6}
  assert eta.rate_for(ctx, "paper", 16) == (100.0, "K = 16")
  rate, how = eta.rate_for(ctx, "paper", 6)
  assert rate == pytest.approx(10 + 5 / 15 * 90) and how == "between K = 1 and 16"
  assert eta.rate_for(ctx, "paper", 40) == (100.0, "K = 16")
  assert eta.rate_for(ctx, "quick", 4) == (None, "none measured")


# --------------------------------------------------------------------------- padding


def _fused(q, k, v, m, pad_odd, causal=False, padding_mask=None):
  return attention_lib._masked_attention_fused(q, k, v, m, None, None, causal,
                                               padding_mask, None, "xla", pad_odd=pad_odd)


@pytest.mark.parametrize("n", [7, 197])
def test_padding_odd_tokens_changes_nothing(n):
  """The cuDNN path's padding, run on XLA: the loss and every gradient (prior, q, k, v)
  are those of the unpadded attention within float32 rounding (the hidden key adds an
  exact 0 to each sum, which XLA may round in another order); a key left visible moves
  them by ~1e-1."""
  keys = jax.random.split(jax.random.key(n), 5)
  q, k, v = (jax.random.normal(key, (2, n, 2, 8)) for key in keys[:3])
  m_HNN = 3 * jax.random.normal(keys[3], (2, n, n))
  w = jax.random.normal(keys[4], (2, n, 2, 8))
  pad_BN = jnp.ones((2, n), bool).at[0, -2:].set(False)
  for kwargs in ({}, {"causal": True}, {"padding_mask": pad_BN}):
    def loss(args, pad_odd):
      return jnp.sum(_fused(*args, pad_odd=pad_odd, **kwargs) * w)
    grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    want, got = grad((q, k, v, m_HNN), False), grad((q, k, v, m_HNN), True)
    chex.assert_trees_all_close(got, want, atol=1e-6, rtol=1e-6)


def test_pad_to_even_hides_the_extra_key_and_keeps_even_counts():
  q = jnp.ones((3, 197, 2, 8))
  bias = jnp.ones((3, 2, 197, 197))
  q2, k2, v2, bias2, allowed = attention_lib._pad_to_even(q, q, q, bias, None)
  assert q2.shape == k2.shape == v2.shape == (3, 198, 2, 8)
  assert bias2.shape == (3, 2, 198, 198) and float(bias2[..., -1, :].sum()) == 0
  allowed = np.broadcast_to(allowed, (3, 2, 198, 198))
  assert not allowed[..., -1].any() and allowed[..., :-1].all()  # Every query sees the real keys.
  mask = jnp.ones((3, 2, 197, 197), bool).at[:, :, 5, :].set(False)  # Row 5: no key.
  allowed = attention_lib._pad_to_even(q, q, q, None, mask)[4]
  assert not allowed[:, :, 5].any() and allowed[:, :, -1, :-1].all()
  even = jnp.ones((3, 196, 2, 8))
  assert attention_lib._pad_to_even(even, even, even, None, None)[0] is even
  assert attention_lib._pad_to_even(q, q, q, None, None)[0] is q  # No bias: no rule.


def _stand_in_for_a_gpu(monkeypatch):
  """jax's cuDNN attention checks the GPU at trace time: they pass here, as on cuDNN 9.10."""
  from jax._src.cudnn import fused_attention_stablehlo as fused
  for name in ("check_cudnn_version", "check_compute_capability",
               "is_cuda_compute_capability_equal"):
    if not hasattr(fused, name):
      pytest.skip(f"jax's cuDNN attention has no {name} to stand in for a GPU")
  monkeypatch.setattr(fused, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(fused, "check_compute_capability", lambda capability: True)
  monkeypatch.setattr(fused, "is_cuda_compute_capability_equal", lambda capability: False)


def test_cudnn_path_pads_before_jax_checks_the_token_count(monkeypatch):
  """At trace time, without a GPU: jax's cuDNN attention refuses to train with a bias at
  197 tokens; mpx's cuDNN path hands it 198 under the engine's vmap(value_and_grad)."""
  _stand_in_for_a_gpu(monkeypatch)
  monkeypatch.setattr(attention_lib, "_check_cudnn", lambda q, k, v: None)  # "On a GPU."
  n = 197
  q_KBNHD = jnp.ones((2, 4, n, 3, 64), jnp.bfloat16)
  m_KHNN = jnp.zeros((2, 3, n, n))

  w_KBNHD = jnp.ones((2, 4, n, 3, 64))  # Per member, as the engine's output projection.

  def step(pad_odd):
    def loss(m_HNN, q, w):
      return jnp.sum(w * attention_lib._masked_attention_fused(
          q, q, q, m_HNN, None, None, False, None, None, "cudnn", pad_odd=pad_odd))
    return jax.make_jaxpr(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1))))(
        m_KHNN, q_KBNHD, w_KBNHD)

  with pytest.raises(NotImplementedError, match="Unsupported sequence length Q 197"):
    step(pad_odd=False)
  jaxpr = step(pad_odd=None)  # The default: pad for cuDNN.
  shapes = [tuple(v.aval.shape) for e in _equations(jaxpr.jaxpr)
            if "dot_product_attention" in e.primitive.name for v in e.invars[:4]]
  assert shapes and {s[1] for s in shapes[::4]} == {n + 1}  # q's tokens: 198.
  assert {s[-2:] for s in shapes[3::4]} == {(n + 1, n + 1)}  # The bias: 198 × 198.


# --------------------------------------------------------------------------- cuDNN forms


def test_every_cudnn_form_computes_the_reference_attention():
  """Each form on the XLA backend, under the engine's jit(vmap(value_and_grad)) over 2
  members with a prior each, a causal and a padding mask (a row with no visible key
  included): the value and the gradients of the prior, q, k and v are the reference
  attention's (float32, 7 tokens padded to 8)."""
  n, k_members = 7, 2
  keys = jax.random.split(jax.random.key(3), 5)
  q, k, v = (jax.random.normal(key, (k_members, 2, n, 2, 8)) for key in keys[:3])
  m_KHNN = 3 * jax.random.normal(keys[3], (k_members, 2, n, n))
  w = jax.random.normal(keys[4], (k_members, 2, n, 2, 8))
  pad_BN = jnp.ones((2, n), bool).at[0, -2:].set(False).at[1].set(False)

  def run(form):
    def loss(m, q, k, v, w):
      out = (attention_lib.masked_attention(q, k, v, m, causal=True, padding_mask=pad_BN)
             if form is None else attention_lib._masked_attention_fused(
                 q, k, v, m, None, None, True, pad_BN, None, "xla", pad_odd=True,
                 form=attention_lib.CUDNN_FORMS[form]))
      return jnp.sum(out * w)
    return jax.jit(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1, 2, 3))))(
        m_KHNN, q, k, v, w)

  want = run(None)
  for form in attention_lib.CUDNN_FORMS:
    chex.assert_trees_all_close(run(form), want, atol=2e-5, rtol=2e-5, custom_message=form)


def test_the_cudnn_forms_hand_over_what_they_name():
  """The operands each form gives jax: the plain form a float32 bias and the boolean
  mask; "all" a bf16 bias with every hard mask folded in as a finite negative (no mask,
  no −inf) and full-length sequence lengths; "broadcast_bias" a [1, H, N, N] bias."""
  n = 7
  q = jax.random.normal(jax.random.key(0), (3, n, 2, 8), jnp.bfloat16)
  m_HNN = -300.0 * jnp.ones((2, n, n))  # log σ(−300) = −300: below the finite floor.
  operands = lambda form: attention_lib._fused_operands(
      q, q, q, m_HNN, None, None, True, None, None, True, attention_lib.CUDNN_FORMS[form])
  _, _, _, bias, mask, lengths, visible = operands("plain")
  assert bias.dtype == jnp.float32 and bias.shape == (3, 2, n + 1, n + 1)
  assert mask is not None and lengths == {} and visible.shape == (3, 2, n)
  q2, k2, _, bias, mask, lengths, _ = operands("all")
  assert bias.dtype == jnp.bfloat16 and bias.shape == (3, 2, n + 1, n + 1) and mask is None
  bias = np.asarray(bias, np.float32)
  assert np.all(np.isfinite(bias)) and bias.min() >= 1.01 * attention_lib.FINITE_NEGATIVE
  assert np.all(bias[:, :, 0, 1:] <= 0.99 * attention_lib.FINITE_NEGATIVE)  # Causal.
  assert np.all(bias[:, :, :, -1] <= 0.99 * attention_lib.FINITE_NEGATIVE)  # The padding.
  np.testing.assert_array_equal(lengths["query_seq_lengths"], [n + 1] * 3)
  np.testing.assert_array_equal(lengths["key_value_seq_lengths"], [n + 1] * 3)
  assert lengths["query_seq_lengths"].dtype == jnp.int32
  bias = operands("broadcast_bias")[3]
  assert bias.shape == (1, 2, n + 1, n + 1)


def test_a_cudnn_form_reaches_the_kernel_under_the_engines_vmap(monkeypatch):
  """At trace time, without a GPU (jax's checks stood in for): under vmap(value_and_grad)
  over 2 members the "all" form gives cuDNN's primitive a bf16 bias [K·B, H, N, N] and
  full-length sequence lengths [K·B] (jax 0.10's batching rule reshapes every operand to
  K·B, so lengths without the member axis would fail); "broadcast_bias" fails there."""
  _stand_in_for_a_gpu(monkeypatch)
  q_KBNHD = jnp.ones((2, 4, 16, 3, 64), jnp.bfloat16)
  m_KHNN = jnp.zeros((2, 3, 16, 16))
  w_KBNHD = jnp.ones((2, 4, 16, 3, 64))  # Per member, as the engine's output projection.

  def step(form):
    def loss(m_HNN, q, w):
      return jnp.sum(w * attention_lib._masked_attention_fused(
          q, q, q, m_HNN, None, None, False, None, None, "cudnn",
          form=attention_lib.CUDNN_FORMS[form]))
    return jax.make_jaxpr(jax.vmap(jax.value_and_grad(loss, argnums=(0, 1))))(
        m_KHNN, q_KBNHD, w_KBNHD)

  operands = [[(tuple(v.aval.shape), str(v.aval.dtype)) for v in e.invars[:6]]
              for e in _equations(step("all").jaxpr)
              if "dot_product_attention" in e.primitive.name]
  assert operands
  for q, _, _, bias, q_lengths, kv_lengths in operands:
    assert q == ((8, 16, 3, 64), "bfloat16") and bias == ((8, 3, 16, 16), "bfloat16")
    assert q_lengths == kv_lengths == ((8,), "int32")
  with pytest.raises(TypeError, match="reshape"):
    step("broadcast_bias")


def test_the_most_members_are_checked_against_xla_before_they_run(monkeypatch):
  """The most that fit is a linear estimate from two K; when XLA's plan of that K says
  it does not fit, it is scaled down once and measured there instead."""
  limit = 1000.0
  program = lambda k: 40 + 60 * k + (500 if k > 12 else 0)  # Not linear past 12.

  def measure(ctx, slot, k, dtype="float32", attention="reference"):
    row = {"preset": "tiny", "precision, attention": f"{dtype}, {attention}", "K": k,
           "program": program(k)}
    return row | ({"note": "not run: too big"} if program(k) > limit else {"rate": 1.0})

  monkeypatch.setattr(environment, "memory_limit", lambda: (limit, "test"))
  monkeypatch.setattr(sweep, "measure_boolean", measure)
  sizes = dataclasses.replace(context.TINY, max_members=100)
  args = check.parse_args(["--tiny", "--no-cudnn"])
  ctx = context.Context(sizes, report_lib.Budget(600), None, args, "jax")
  ctx.report = type("NoReport", (), {"write": lambda self: None})()
  stage = {"facts": {}, "rows": [], "notes": []}
  sweep.stage_sweep(ctx, stage)
  assert [(r["K"], "note" in r) for r in stage["rows"]] == [
      (1, False), (2, False), (16, True), (10, False)]
  assert ctx.most == 10 == int(16 * limit / program(16))
  assert stage["facts"]["most members that fit (tiny)"].endswith("so 10")


def test_the_sweeps_rate_counts_every_member_step(tmp_path, monkeypatch):
  """Every sweep figure derives from one rate, so a wrong factor in it keeps them all
  consistent: with each timed chunk taking 1 s, the rate must be K × steps × repeats.
  With XLA's cost analysis 5× low (as a GPU's was), the row is marked and the achieved
  rate divides the model's count, not XLA's."""
  monkeypatch.setattr(sweep.chunk_timing, "time_chunk", lambda *a, **k: 1.0)
  real = chunk_timing.xla_flops
  monkeypatch.setattr(chunk_timing, "xla_flops", lambda compiled: real(compiled) / 5)
  args = check.parse_args(["--tiny", "--out", str(tmp_path / "out"), "--cache-dir", ""])
  budget = report_lib.Budget(600)
  report = report_lib.Report(tmp_path / "out", {"command": "test", "budget_s": 600,
                                                "tiny": True, "started": "now"}, budget)
  ctx = context.Context(context.TINY, budget, report, args, "jax", boolean=gotu_experiment)
  row = sweep.measure_boolean(ctx, "paper", 2)
  assert row["rate"] == 2 * context.TINY.steps["paper"] * context.TINY.repeats, row
  ratio = float(row["GFLOP / member-step (XLA)"]) / float(row["GFLOP / member-step (model)"])
  assert ratio < 0.5 and row["note"] == f"⚠ XLA counts {ratio:.2f}× the model's FLOPs", row
  _, config = config_lib.make_config(gotu_experiment, "tiny")
  model = flops.transformer_matmul_flops(config, 16)
  assert float(row["achieved TFLOP/s"]) == pytest.approx(model * row["rate"] / 1e12, rel=5e-3)


# --------------------------------------------------------------------------- FLOP counts


@pytest.mark.parametrize("preset", ["tiny", "paper"])
def test_the_models_flops_are_the_matmuls_of_its_training_step(preset):
  """`transformer_matmul_flops` is every matmul of value_and_grad of the member's loss (its
  attention products once, not per platform branch), counted
  from the step's jaxpr (traced on shapes: nothing runs), at the tiny and the paper
  preset (159 GFLOP, not the 31–115 XLA's GPU cost analysis gave)."""
  _, config = config_lib.make_config(gotu_experiment, preset)
  spec = boolean.get_task("2parity")
  task = boolean_gotu.make_task(config, spec)
  tokens = boolean.tokens(jnp.ones((1, spec.n_bits)))
  params = jax.eval_shape(
      lambda key: boolean_gotu.make_model(config).init(key, tokens)["params"],
      jax.random.key(0))
  batch = {"x": jax.ShapeDtypeStruct((config.batch_size, spec.n_bits), jnp.float32),
           "y": jax.ShapeDtypeStruct((config.batch_size,), jnp.float32)}
  counted = flops.step_flops(task.loss, params, batch)
  assert flops.transformer_matmul_flops(config, spec.n_bits + 1) == counted
  if preset == "paper":
    assert round(counted / 1e9, 1) == 158.2


def test_run_and_preset_timing_mark_a_low_xla_count(monkeypatch):
  """XLA's cost analysis 5× low (as a GPU's was): run.py's table and preset_timing.py's
  line mark it beside the model's count (the sweep stage's row: the test above)."""
  import preset_timing
  import run as bench
  _, config = config_lib.make_config(gotu_experiment, "tiny")
  model = flops.transformer_matmul_flops(config, 16)
  monkeypatch.setattr(bench, "compiled_chunk", lambda *a: ("compiled",))
  monkeypatch.setattr(chunk_timing, "xla_flops", lambda compiled: model / 5)
  line = preset_timing.flops_line("tiny", config)
  assert line == (f"{model / 1e9:.4g} GFLOP per member-step (the model's matmuls); XLA's "
                  f"cost analysis {model / 5e9:.4g} ⚠ XLA counts 0.20× the model's FLOPs")
  row = bench.Row("tiny", "mpx vmapped", 1, 2.0, 1.0, model / 1e9, model / 5e9)
  table = bench.rows_table([row], peak=1.0)
  assert table[-1].startswith(
      f"| tiny | mpx vmapped | 1 | 2.000 | 1.0 | {model / 1e9:.4g} | {model / 5e9:.3g} ⚠ XLA "
      f"counts 0.20× the model's FLOPs | {2 * model / 1e9:.1f} |"), table
  assert row.achieved() == 2 * model / 1e9
  # Within 2× either way, nothing is marked.
  assert chunk_timing.flops_mark(1.0, 0.5) == chunk_timing.flops_mark(1.0, 2.0) == ""


# --------------------------------------------------------------------------- traces


GPU_HLO = """HloModule jit_chunk, is_scheduled=true

%fused_dot (p0: f32[8,8], p1: f32[8,8]) -> f32[8,8] {
  %p0 = f32[8,8]{1,0} parameter(0)
  %p1 = f32[8,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_transpose (p0.1: f32[8,8]) -> f32[8,8] {
  %p0.1 = f32[8,8]{1,0} parameter(0)
  %t = f32[8,8]{0,1} transpose(%p0.1), dimensions={1,0}
  ROOT %b = f32[8,8]{1,0} bitcast(%t)
}

%fused_add (p0.2: f32[8,8]) -> f32[8,8] {
  %p0.2 = f32[8,8]{1,0} parameter(0)
  ROOT %add.3 = f32[8,8]{1,0} add(%p0.2, %p0.2)
}

ENTRY %main (a: f32[8,8]) -> f32[8,8] {
  %a = f32[8,8]{1,0} parameter(0)
  %gemm_fusion = f32[8,8]{1,0} fusion(%a, %a), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(chunk)/block_0/mlp/fc1/dot_general"}
  %transpose_fusion = f32[8,8]{1,0} fusion(%gemm_fusion), kind=kLoop, calls=%fused_transpose
  %softmax = f32[8,8]{1,0} fusion(%transpose_fusion), kind=kLoop, calls=%fused_add, metadata={op_name="jit(chunk)/block_0/attention/masked_attention/exp"}
  %cublas = (f32[8,8]{1,0}, s8[64]{0}) custom-call(%softmax, %a), custom_call_target="__cublas$gemm"
  ROOT %add_fusion = f32[8,8]{1,0} fusion(%softmax), kind=kLoop, calls=%fused_add
}
"""


def _gpu_trace() -> dict:
  """A trace as jax writes one on a GPU: the device's stream lines (kernels naming their
  HLO op, a memcpy naming none), a derived line and the host's events, which repeat the
  ops and must not count, and another program's kernel."""
  meta = lambda kind, pid, tid, name: {"ph": "M", "name": kind, "pid": pid, "tid": tid,
                                       "args": {"name": name}}
  kernel = lambda tid, name, start, dur, op=None, module="jit_chunk": {
      "ph": "X", "pid": 1, "tid": tid, "name": name, "ts": start, "dur": dur,
      "args": {"hlo_op": op, "hlo_module": module} if op else {}}
  return {"traceEvents": [
      meta("process_name", 1, 0, "/device:GPU:0"), meta("process_name", 2, 0, "/host:CPU"),
      meta("thread_name", 1, 10, "Stream #13(Compute)"),
      meta("thread_name", 1, 11, "Stream #14(MemcpyD2H)"),
      meta("thread_name", 1, 20, "XLA Ops"),
      kernel(10, "sm90_xmma_gemm_f32f32", 0.0, 10.0, "gemm_fusion"),
      kernel(10, "transpose_kernel", 12.0, 3.0, "transpose_fusion"),
      kernel(10, "loop_exp_fusion", 15.0, 5.0, "softmax"),
      kernel(10, "cutlass_gemm", 22.0, 4.0, "cublas"),
      kernel(10, "loop_add_fusion", 26.0, 2.0, "add_fusion"),
      kernel(10, "add_fusion", 28.0, 1.0),  # Names no HLO op: it is one.
      kernel(10, "other_program", 40.0, 100.0, "fusion.9", module="jit_other"),
      kernel(11, "MemcpyD2H", 20.0, 4.0),
      kernel(20, "gemm_fusion", 0.0, 10.0, "gemm_fusion"),
      {"ph": "X", "pid": 2, "tid": 1, "name": "gemm_fusion", "ts": 0.0, "dur": 30.0,
       "args": {"hlo_op": "gemm_fusion", "hlo_module": "jit_chunk"}}]}


def test_a_gpu_trace_is_split_by_kind_and_adds_up_to_its_span():
  """Kernels 0–29 µs: matmul 10 (a GEMM fusion) + 4 (a cuBLAS call), a transpose 3,
  mpx's attention core 5, add fusions 2 + 1 (one found by its kernel's name), a memcpy 4
  on another stream that overlaps the cuBLAS call by 2; idle 10–12: gaps 2, overlap −2,
  sum 29 = the span."""
  instructions = xla_trace.hlo_instructions(GPU_HLO)
  assert xla_trace.module_name(GPU_HLO) == "jit_chunk"
  events = xla_trace.device_events(_gpu_trace(), "jit_chunk")
  assert len(events) == 7
  result = xla_trace.profile(events, instructions)
  assert result.span == 29.0
  assert result.kinds == {xla_trace.MATMUL: 14.0, xla_trace.ATTENTION: 5.0,
                          xla_trace.COPIES: 3.0, "fusion (root: add)": 3.0,
                          xla_trace.UNMAPPED: 4.0, xla_trace.GAPS: 2.0,
                          xla_trace.OVERLAP: -2.0}
  rows = xla_trace.kind_rows(result, per=2, least=0.0)
  assert sum(r["ms"] for r in rows) == pytest.approx(29.0 / 1e3 / 2)
  top = xla_trace.op_rows(result, per=1, top=2)
  assert [(r["op"], r["kind"], r["from"]) for r in top] == [
      ("sm90_xmma_gemm_f32f32", xla_trace.MATMUL, "block_0/mlp/fc1/dot_general"),
      ("loop_exp_fusion", xla_trace.ATTENTION, "block_0/attention/masked_attention/exp")]


def test_nested_ops_count_their_own_time():
  """A CPU while loop's event spans its body's ops: it keeps only its own time."""
  line = (1, 1)
  events = [xla_trace.Event(line, "while.1", "while.1", 0.0, 10.0),
            xla_trace.Event(line, "dot.1", "dot.1", 1.0, 3.0),
            xla_trace.Event(line, "add.1", "add.1", 5.0, 4.0),
            xla_trace.Event(line, "copy.1", "copy.1", 11.0, 1.0)]
  assert xla_trace.own_times(events) == [3.0, 3.0, 4.0, 1.0]
  assert xla_trace.busy_time(events) == 11.0


# --------------------------------------------------------------------------- plan, headline


def test_the_plan_runs_without_a_device_or_a_compile(tmp_path):
  """`--plan` prints every stage in order with its seconds and the source of them, and
  compiles nothing (jax logs each compile) nor writes the output folder."""
  env = dict(_device_image_env(tmp_path), JAX_LOG_COMPILES="1")
  out = tmp_path / "out"
  done = subprocess.run([sys.executable, str(CHECK), "--out", str(out), "--tiny", "--plan",
                         "--budget-s", "1500"], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "Compiling" not in done.stderr and not out.exists(), done.stderr[-3000:]
  assert done.stdout.startswith(
      "Plan: budget 1500 s; seconds from estimates for a 2-core CPU (context.py).")
  rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ")][1:]
  assert [r[0].lstrip("| ").split(":")[0] for r in rows] == list(check.DEFAULT_STAGES)
  assert [float(r[1]) for r in rows][2] == context.TINY.expect["stage_s"]["profile"]
  assert rows[1][4].startswith(f"{context.TINY.headline['seeds']} of 2 seeds")


def test_the_plan_reads_the_last_results_of_its_kind(tmp_path):
  """The newest committed results JSON of the same kind (--tiny or not) replaces the
  estimates: its stages' seconds, its paper-scale rates and compile, its overhead."""
  def results(name, started, tiny, seconds):
    stages = {"sweep": {"status": "done", "seconds": seconds, "rows": [
                  {"preset": "paper", "precision, attention": "float32, reference", "K": 16,
                   "rate": 500.0, "compile s": "12.5"}]},
              "models": {"status": "partial", "seconds": 99.0},
              "eta": {"status": "done", "seconds": 1.0, "overhead": 1.5}}
    (tmp_path / name).write_text(json.dumps(
        {"header": {"started": started, "tiny": tiny}, "stages": stages}))
  results("accelerator_check_a.json", "2027-01-01T00:00:00", False, 100.0)
  results("accelerator_check_b.json", "2027-02-01T00:00:00", False, 90.0)
  results("accelerator_check_c.json", "2027-03-01T00:00:00", True, 80.0)
  expect = plan.expectations(context.DEVICE, tiny=False, folder=tmp_path)
  assert expect["source"].endswith("accelerator_check_b.json (2027-02-01T00:00:00)")
  assert expect["stage_s"]["sweep"] == 90.0
  assert expect["stage_s"]["models"] == context.DEVICE.expect["stage_s"]["models"]  # Cut.
  assert (expect["rates"], expect["compile_s"], expect["overhead"]) == ({16: 500.0}, 12.5, 1.5)
  assert plan.expectations(context.DEVICE, tiny=False, folder=tmp_path / "none") == (
      context.DEVICE.expect)


def test_the_headline_plans_the_seeds_that_fit():
  """The most seeds whose run fits: members × steps at the rate of that many members,
  times the overhead, plus a compile; a resumed run keeps its seeds."""
  expect = {"rates": {1: 100.0, 16: 400.0}, "compile_s": 20.0, "overhead": 1.0}
  per_seed = 4 * 1920  # Every scheme, the paper preset's 2Parity steps.
  seconds = lambda s: 20.0 + s * per_seed / (100.0 + (4 * s - 1) / 15 * 300.0)
  assert headline.expected_seconds(gotu_experiment, "paper", "2parity", 3, expect) == (
      pytest.approx(seconds(3)))
  seeds, expected = headline.plan_seeds(gotu_experiment, "paper", "2parity", 10,
                                        seconds(3) + 0.1, expect)
  assert (seeds, expected) == (3, pytest.approx(seconds(3)))
  assert headline.plan_seeds(gotu_experiment, "paper", "2parity", 10, 1.0, expect)[0] == 0
  assert headline.plan_seeds(gotu_experiment, "paper", "2parity", 2, 1e6, expect)[0] == 2


def test_the_headline_writes_its_rows_while_it_trains(tmp_path, monkeypatch):
  """The report holds each scheme's numbers as soon as the run has logged an evaluation,
  before the run ends; a later call resumes the cut run with the seeds it started with
  (whatever its own plan says) and reports its summary."""
  folder = tmp_path / "out" / "boolean_gotu-tiny-2parity"
  report_file = tmp_path / "out" / report_lib.JSON_FILE
  seen = []

  def fake_run(experiment, *, preset, overrides, out_dir, resume):
    assert (preset, overrides, out_dir, resume) == (
        "tiny", ["tasks=2parity", "seeds=2"], str(folder), "auto")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": {"seeds": 2}}))
    with (folder / "metrics.jsonl").open("w") as f:
      for scheme in ("default", "mask"):
        for seed in (0, 1):
          f.write(json.dumps({"step": 48, "task": "2parity", "scheme": scheme, "seed": seed,
                              "hparams": {"seed": seed}, "diverged": False,
                              "accuracy": 0.5 + 0.25 * seed, "accuracy_unseen": 0.0,
                              "loss": 1.0}) + "\n")
    for _ in range(200):  # The poller writes the rows within a few of its intervals.
      rows = json.loads(report_file.read_text())["stages"]["headline"]["rows"]
      if rows:
        seen.append(rows)
        break
      time.sleep(0.05)
    raise headline.run_lib.Preempted("stopped")

  monkeypatch.setattr(headline.run_lib, "run_experiment", fake_run)
  args = check.parse_args(["--tiny", "--out", str(tmp_path / "out")])
  budget = report_lib.Budget(600)
  report = report_lib.Report(tmp_path / "out", {"command": "test", "budget_s": 600,
                                                "tiny": True, "started": "now"}, budget)
  sizes = dataclasses.replace(context.TINY, headline=dict(context.TINY.headline, poll_s=0.05))
  ctx = context.Context(sizes, budget, report, args, "jax", boolean=gotu_experiment,
                        expect=context.TINY.expect)
  stage = report.stage("headline", "headline")
  headline.stage_headline(ctx, stage)
  assert seen and [r["step"] for r in seen[0]] == [48, 48]
  assert [r["whole-cube accuracy (%)"] for r in seen[0]] == ["62.50 ± 12.50"] * 2
  assert stage["partial"] and stage["facts"]["trained"].startswith("stopped at the deadline")

  def resumed(experiment, *, preset, overrides, out_dir, resume):
    assert overrides == ["tasks=2parity", "seeds=2"]  # Not the 1 seed planned below.
    members = [{"task": "2parity", "scheme": scheme, "seed": seed, "hparams": {"seed": seed},
                "diverged": False, "metrics": {"accuracy": 0.75, "accuracy_unseen": 0.0,
                                               "loss": 2.0}}
               for scheme in ("default", "mask") for seed in (0, 1)]
    (folder / "summary.json").write_text(json.dumps({"members": members}))

  monkeypatch.setattr(headline.run_lib, "run_experiment", resumed)
  ctx.sizes = dataclasses.replace(sizes, headline=dict(sizes.headline, seeds=1))
  stage = report.stage("headline", "headline")
  headline.stage_headline(ctx, stage)
  assert stage["facts"]["seeds"] == "2, as the run an earlier call started (resumed)"
  assert [(r["step"], r["whole-cube accuracy (%)"]) for r in stage["rows"]] == [
      ("96 (end)", "75.00 ± 0.00")] * 2
  assert "partial" not in stage and stage["facts"]["trained"].startswith("to the end")
  assert ctx.headline["finished"] is False  # The first call's: a resumed one's wall time is
                                            # part of a run, no measure of its overhead.
