"""benchmarks/accelerator_check on a CPU, and the cuDNN path's odd-token padding.

The script is what the first accelerator runs, unattended, in a few minutes: here it runs
every stage at toy sizes (`--tiny`) with the modules the device image lacks blocked,
respects a small budget, and records a crashing probe process; the padding that lets
cuDNN train at 197 tokens is checked against the unpadded attention and, at trace time,
against jax's own cuDNN checks.
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

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mpx.experiments.boolean_gotu as gotu_experiment
from mpx import attention as attention_lib
from mpx.sweep import config as config_lib
from mpx.sweep import memory
from mpx.tasks import boolean
from mpx.tasks.boolean import gotu as boolean_gotu

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHECK = ROOT / "benchmarks" / "accelerator_check"  # Runs as `python CHECK`.
# Not on the device image: the script must run without them.
BLOCKED = ("grain", "tensorflow_datasets", "tensorflow", "torch", "sklearn")


sys.path.insert(0, str(CHECK.parent))  # benchmarks/ is not a package.
from accelerator_check import __main__ as check  # noqa: E402
from accelerator_check import ab, context, cudnn, cudnn_probes, environment, eta  # noqa: E402
from accelerator_check import report as report_lib  # noqa: E402
from accelerator_check import sweep  # noqa: E402


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
  """`--tiny` with a budget every stage fits: (json report, markdown, stdout)."""
  tmp = tmp_path_factory.mktemp("tiny")
  done, report = _run(tmp, "--tiny", "--budget-s", "1500")
  return report, (tmp / "out" / report_lib.MARKDOWN_FILE).read_text(), done.stdout


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
  for row in stage["rows"]:
    assert row["member-steps/s"] == f"{row['rate']:.4g}", row
    assert row["program memory"] == memory.size(row["program"]), row
    # Printed to 3 significant digits (from XLA's count, printed to 4): a relative
    # rounding of at most (1 + 5e-3)(1 + 5e-4) - 1 < 5.6e-3.
    achieved = float(row["GFLOP / member-step (XLA)"]) * row["rate"] / 1e3
    assert float(row["achieved TFLOP/s"]) == pytest.approx(achieved, rel=5.6e-3), row
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
  at the rate the sweep measured for that K, plus the float32 compile; the trained run
  names the same members and steps."""
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
  trained = stage["facts"]["2Parity default and mask, trained"]
  assert f"({members} members × {steps} steps; expected " in trained, trained


@pytest.mark.slow
def test_tiny_run_reports_every_stage(tiny_run):
  """Every stage ran, and what it reports holds together: the numbers each stage
  derives agree with the measurements it derives them from and with this machine."""
  report, markdown, stdout = tiny_run
  stages = report["stages"]
  assert list(stages) == list(check.STAGES)
  for key, stage in stages.items():
    assert stage["status"] == "done", (key, stage["notes"])
    assert f"{stage['title']} (done" in markdown
  assert markdown.strip() in stdout  # The report is printed at the end too.
  peaks = _environment_content(stages)
  _sweep_content(stages, peaks)
  _cudnn_content(stages)
  _ab_content(stages)
  _models_content(stages)
  _eta_content(stages)


@pytest.mark.slow
def test_tiny_run_measures_the_sweep(tiny_run):
  report, _, _ = tiny_run
  stage = report["stages"]["sweep"]
  rows = stage["rows"]
  assert [(r["precision, attention"], r["K"]) for r in rows] == [
      ("float32, reference", 1), ("float32, reference", 2), ("bfloat16, jax", 2)]
  for row in rows:
    assert row["rate"] > 0 and "note" not in row, row
    xla, estimate = float(row["GFLOP / member-step (XLA)"]), float(row["6·P·N·B GFLOP"])
    assert 0.5 < xla / estimate < 2, row  # XLA counts the scan's body once, per member.
    assert row["of the peak"].endswith(row["precision, attention"].split(",")[0])
  assert stage["facts"]["most members that fit (tiny)"].startswith("2 (")


@pytest.mark.slow
def test_tiny_run_probes_pass_and_lists_refusals(tiny_run):
  report, _, _ = tiny_run
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
  report, _, _ = tiny_run
  rows = report["stages"]["models"]["rows"]
  assert [r["model"].split(" (")[0] for r in rows] == [
      "ViT 32 px / patch 2", "ViT 224 px / patch 16", "language tiny"]
  for row in rows:
    assert "note" not in row and float(row["images or tokens /s"]) > 0, row
  eta = report["stages"]["eta"]
  assert "fits one 600 s call" in eta["facts"]["ETA of the tiny table"]
  assert eta["facts"]["2Parity default and mask, trained"].startswith("to the end in")
  accuracy = eta["facts"]["their accuracy (mean over seeds, last evaluation)"]
  assert accuracy.startswith("default ") and ", mask " in accuracy


def test_a_small_budget_skips_stages_with_a_note(tmp_path):
  """With no time left only the environment runs (it is always measured: the peaks)."""
  _, report = _run(tmp_path, "--tiny", "--budget-s", "1")
  stages = report["stages"]
  assert stages["environment"]["status"] == "done"
  assert stages["environment"]["facts"]["device"].startswith("1 × cpu")
  for key in check.STAGES[1:]:
    assert stages[key]["status"] == "skipped"
    assert stages[key]["notes"][-1].startswith("Stage skipped:")
    assert "of the budget left" in stages[key]["notes"][-1]
  markdown = (tmp_path / "out" / report_lib.MARKDOWN_FILE).read_text()
  assert markdown.count("(skipped)") == len(check.STAGES) - 1


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
  assert detail.startswith("RuntimeError: cuDNN is not detected"), detail
  found = re.search(r"on the XLA path \(ok\): relative error (\S+) \(tolerance (\S+)\)",
                    detail)
  assert found and 0 < float(found[1]) <= float(found[2]), detail
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


def test_cudnn_path_pads_before_jax_checks_the_token_count(monkeypatch):
  """At trace time, without a GPU: jax's cuDNN attention refuses to train with a bias at
  197 tokens; mpx's cuDNN path hands it 198 under the engine's vmap(value_and_grad)."""
  from jax._src.cudnn import fused_attention_stablehlo as fused
  for name in ("check_cudnn_version", "check_compute_capability",
               "is_cuda_compute_capability_equal"):
    if not hasattr(fused, name):
      pytest.skip(f"jax's cuDNN attention has no {name} to stand in for a GPU")
  monkeypatch.setattr(fused, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(fused, "check_compute_capability", lambda capability: True)
  monkeypatch.setattr(fused, "is_cuda_compute_capability_equal", lambda capability: False)
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
  from jax._src.cudnn import fused_attention_stablehlo as fused
  for name in ("check_cudnn_version", "check_compute_capability",
               "is_cuda_compute_capability_equal"):
    if not hasattr(fused, name):
      pytest.skip(f"jax's cuDNN attention has no {name} to stand in for a GPU")
  monkeypatch.setattr(fused, "check_cudnn_version", lambda: 91000)
  monkeypatch.setattr(fused, "check_compute_capability", lambda capability: True)
  monkeypatch.setattr(fused, "is_cuda_compute_capability_equal", lambda capability: False)
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


def _equations(jaxpr):
  for e in jaxpr.eqns:
    yield e
    for param in e.params.values():
      inner = getattr(param, "jaxpr", param)
      if hasattr(inner, "eqns"):
        yield from _equations(inner)


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
  consistent: with each timed chunk taking 1 s, the rate must be K × steps × repeats."""
  monkeypatch.setattr(sweep.chunk_timing, "time_chunk", lambda *a, **k: 1.0)
  args = check.parse_args(["--tiny", "--out", str(tmp_path / "out"), "--cache-dir", ""])
  budget = report_lib.Budget(600)
  report = report_lib.Report(tmp_path / "out", {"command": "test", "budget_s": 600,
                                                "tiny": True, "started": "now"}, budget)
  ctx = context.Context(context.TINY, budget, report, args, "jax", boolean=gotu_experiment)
  row = sweep.measure_boolean(ctx, "paper", 2)
  assert row["rate"] == 2 * context.TINY.steps["paper"] * context.TINY.repeats, row
