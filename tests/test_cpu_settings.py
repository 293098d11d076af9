"""benchmarks/cpu_settings.py (the interleaved A/B of XLA:CPU settings) and what
`benchmarks/run.py --write` makes of a run: the results file and docs/performance.md."""

import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks/ is not a package.

import cpu_settings  # noqa: E402
import run  # noqa: E402

C = cpu_settings.Candidate
CANDIDATES = (C("default"), C("fast", ("--fast",), hlo=True), C("moves", ("--moves",)),
              C("inert", ("--inert",), hlo=True), C("bogus", ("--bogus",)), C("one", (), 1),
              C("noisy", ("--noisy",)), C("twin", ("--fast", "--inert"), hlo=True))
LOSSES = [[1.0], [0.5]]


def fake_spawn(calls):
  """What the workers would report: the default at 10 member-steps/s with LOSSES in round
  1 and twice as fast in round 2 (the machine's load dropped), the others relative to it;
  --inert does nothing: the program is the one without it."""
  def spawn(spec, base, flags, cpus):
    calls.append((spec["kind"], flags, len(cpus), dict(spec.get("known_programs", {})),
                  spec.get("loss_steps")))
    if spec["kind"] == "torch":
      return {"rate": 8.0 if len(cpus) == 2 else 5.0}
    if flags == ("--bogus",):
      return {"error": "exit 1: Unknown flag in XLA_FLAGS: --bogus"}
    program = {(): "p0", ("--inert",): "p0", ("--fast", "--inert"): "p1"}.get(flags, "p1")
    if program in spec["known_programs"]:
      return {"program": program, "same_as": spec["known_programs"][program]}
    load = sum(1 for c in calls if c[:3] == ("mpx", (), 2))  # The round, from the defaults.
    rate = {(): 10.0, ("--fast",): 12.0, ("--moves",): 9.0,
            ("--noisy",): 11.0 if load == 1 else 9.0}[flags]
    losses = [[1.0], [0.5000001]] if flags == ("--moves",) else LOSSES
    return {"rate": rate * load * (0.5 if len(cpus) == 1 else 1.0), "steps": 2,
            "program": program, "losses": losses}
  return spawn


@pytest.fixture
def ab():
  plan = cpu_settings.Plan(CANDIDATES, ("quick:1",), [0, 1], "--xla_user=1", rounds=2)
  calls = []
  results = cpu_settings.run_ab(plan, lambda line: None, fake_spawn(calls))
  return plan, results, calls


def test_rounds_interleave_the_candidates_and_skip_an_inert_one(ab):
  _, _, calls = ab
  names = {c.flags: c.name for c in CANDIDATES if c.cores is None}
  name = lambda flags, n: "one" if n == 1 else names[flags]
  order = [("torch", n) if kind == "torch" else name(flags, n) for kind, flags, n, _, _ in calls]
  assert order == [
      "default", "fast", "moves", "inert", "bogus", "one", "noisy", "twin", ("torch", 1),
      ("torch", 2), "default", "moves", "one", "noisy", "fast", ("torch", 1), ("torch", 2)]
  # The programs measured so far go to the candidates of HLO flags (one that compiles one
  # of them is not run), not to the others; the loss runs long only in round 1.
  assert [(name(f, n), p) for k, f, n, p, _ in calls if k == "mpx"][:8] == [
      ("default", {}), ("fast", {"p0": "default"}), ("moves", {}),
      ("inert", {"p0": "default", "p1": "fast"}), ("bogus", {}), ("one", {}), ("noisy", {}),
      ("twin", {"p0": "default", "p1": "fast"})]
  assert [s for k, _, _, _, s in calls if k == "mpx"] == [32] * 8 + [0] * 5


def test_the_report_says_faster_slower_inert_failed_and_which_moves_the_numbers(ab):
  plan, results, _ = ab
  assert cpu_settings.summary(plan, results) == [
      "- fast (--fast): quick:1 faster; numbers bit for bit",
      "- moves (--moves): quick:1 slower; **changes the numbers** (quick:1): only after the "
      "preset guard",
      "- inert: inert on this jaxlib: the same HLO in every case",
      "- bogus (--bogus): quick:1 exit 1: Unknown flag in XLA_FLAGS: --bogus; numbers not "
      "compared",
      "- one (no flags, 1 core(s)): quick:1 slower; numbers bit for bit",
      "- noisy (--noisy): quick:1 within noise; numbers bit for bit",
      "- twin: fast's program (its other flags inert on this jaxlib): the same HLO in every "
      "case"]
  table = "\n".join(cpu_settings.table(plan, results))
  # Paired by round: the load's drift cancels (medians 18 / 15 and 15 / 12 for PyTorch).
  assert "| quick:1 | fast | 2 | 18.000; 12.000, 24.000 | 1.200 (1.200–1.200) | 2.25x | " \
         "other HLO | bit for bit (4 steps) | faster |" in table
  assert "| quick:1 | one | 1 | 7.500; 5.000, 10.000 | 0.500 (0.500–0.500) | 1.50x |" in table
  assert "| quick:1 | default | 2 | 15.000; 10.000, 20.000 |  | 1.88x | default's | round 2 " \
         "against round 1: bit for bit (4 steps) |" in table
  assert "| quick:1 | noisy | 2 | 14.500; 11.000, 18.000 | 1.000 (0.900–1.100) |" in table
  assert "**changes**: max rel 2.4e-07 (4 steps)" in table
  assert "| quick:1 | twin | 2 | 18.000; 12.000, 24.000 | 1.200 (1.200–1.200) | 2.25x | " \
         "fast's (flags inert here) | bit for bit (4 steps) | = fast |" in table


def test_loss_change_counts_nans_and_compares_the_chunks_both_made():
  a = [[1.0, np.nan], [0.5, np.nan]]
  assert cpu_settings.loss_change(a, a + [[0.1, 0.1]], 8) == "bit for bit (16 steps)"
  assert cpu_settings.loss_change(a, [[1.0, 2.0]], 8) == "**changes**: max rel inf (8 steps)"
  assert cpu_settings.loss_change([[2.0]], [[2.5]], 1) == "**changes**: max rel 2.5e-01 (1 step)"


def test_a_plan_measures_the_default_first_and_refuses_an_unknown_name():
  args = cpu_settings.parse_args(["--candidates", "ynn-reduce", "--cpus", "0",
                                  "--add", "mine=--xla_a=1 --xla_b=2"])
  plan = cpu_settings.make_plan(args, ())
  assert [c.name for c in plan.candidates] == ["default", "ynn-reduce", "mine"]
  assert plan.candidates[2].flags == ("--xla_a=1", "--xla_b=2") and plan.cpus == [0]
  with pytest.raises(SystemExit, match="unknown candidate"):
    cpu_settings.make_plan(cpu_settings.parse_args(["--candidates", "nope"]), ())


def test_the_base_flags_are_the_callers_without_mpx_defaults(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_user=1 --xla_mpx=1")
  assert cpu_settings.base_xla_flags(("--xla_mpx=1",)) == "--xla_user=1"


def _rows():
  """A run's rows: the model's GFLOP per member-step (0.3524, 158.2) beside XLA's."""
  R = run.Row
  return [R("quick", "mpx vmapped", 1, 81.008, 2.7, 0.3524, 0.399),
          R("quick", "mpx vmapped", 16, 87.432, 2.6, 0.3524, 0.399),
          R("quick", "mpx loop of jitted steps", 16, 79.737, 2.0, 0.3524, 0.395),
          R("quick", "PyTorch reference, 2 seeds in turn", 1, 112.292, None, 0.3524),
          R("paper", "mpx vmapped", 1, 0.979, 6.8, 158.2, 160.0),
          R("paper", "mpx vmapped", 16, float("nan"), 6.5, 158.2, 160.0,
            note="skipped: needs 17 GiB"),
          R("paper", "PyTorch reference, 2 seeds in turn", 1, 0.8, None, 158.2)]


def test_write_refreshes_the_results_file_and_the_performance_page(tmp_path):
  block = run.performance_block(_rows(), {1024: 287.5}, {1024: 352.5}, "a CPU, 2 core(s)",
                                "2026-12-04T23:00", "abc1234", "python benchmarks/run.py --write",
                                ["- fast (--fast): quick:1 faster; numbers bit for bit"])
  for line in ["Measured on a CPU, 2 core(s), 2026-12-04, commit abc1234, by `python "
               "benchmarks/run.py --write` ([experiments/results/benchmark_cpu.md]",
               "| quick | 1 | 81.008 | 112.292 | 0.72× | 10% |",  # The model's count's share.
               "| paper | 16 | skipped: needs 17 GiB | 0.800 | – | – |",
               "- quick: mpx (K = 1) / PyTorch, member-steps/s ≥ 1.00×: 0.72×, **missed**",
               "- quick: mpx (best K = 16) / PyTorch, member-steps/s ≥ 1.20×: 0.78×, "
               "**missed**",
               "- paper: mpx (K = 1) / PyTorch, member-steps/s ≥ 1.00×: 1.22×, met",
               "- paper: mpx (best K = 1) / PyTorch, member-steps/s ≥ 1.20×: 1.22×, met",
               "- quick: vmapped / loop at K = 16, per member ≥ 4.00×: 1.10×, **missed**",
               "- fast (--fast): quick:1 faster; numbers bit for bit"]:
    assert line in block, line
  page, results = tmp_path / "performance.md", tmp_path / "benchmark_cpu.md"
  page.write_text(f"# Performance\n\nintro\n{run.BEGIN}\nold numbers\n{run.END}\n\nafter\n")
  run.write_results("the report", block, results, page)
  assert page.read_text() == f"# Performance\n\nintro\n{run.BEGIN}\n{block}\n{run.END}\n\nafter\n"
  assert results.read_text().endswith("\n\nthe report\n")
  page.write_text("no markers")
  results.unlink()
  with pytest.raises(ValueError, match="put them back"):
    run.write_results("the report", block, results, page)
  assert not results.exists()  # Neither file changes.


def test_the_performance_page_holds_the_write_markers():
  page = (ROOT / "docs" / "performance.md").read_text()
  assert run.replace_block(page, "x").count(run.BEGIN) == 1


@pytest.mark.slow
def test_the_tiny_ab_runs_end_to_end():
  """Workers in their own processes: the default (its loss compared with its own round
  2), a flag of no effect on the HLO (compiled once, not run), a flag XLA does not know
  (reported, the run goes on), and PyTorch."""
  args = cpu_settings.parse_args(["--tiny", "--rounds", "2", "--candidates", "default",
                                  "--add", "bogus=--xla_cpu_no_such_flag=1"])
  plan = cpu_settings.make_plan(args, ())
  plan.candidates += (C("same", ("--xla_cpu_collective_timeout_seconds=1234",), hlo=True),)
  out = cpu_settings.report(plan, cpu_settings.run_ab(plan, lambda line: None))
  torch_row = f"| quick:1 | PyTorch | {len(plan.cpus)} | " + (  # This process's cores.
      "" if run.torch_reference else f"{run.NO_TORCH} |")  # Optional: the A/B goes on.
  assert torch_row in out, out
  assert "| default's | round 2 against round 1: bit for bit (4 steps) |" in out, out
  assert "- same: inert on this jaxlib: the same HLO in every case" in out, out
  assert "- bogus (--xla_cpu_no_such_flag=1): quick:1 exit 1: Unknown flag in XLA_FLAGS: " \
         "--xla_cpu_no_such_flag=1" in out, out


def test_the_profile_sorts_ops_by_what_they_do():
  """profile_step.py sorts the compiled program's ops by the engine's named scopes (under
  vmap too), the rest by xla_trace's kind: matmuls (any fusion with a dot), reductions by
  their root, copies."""
  import jax
  import jax.numpy as jnp
  import profile_step
  import xla_trace

  def step(w, x):
    y = jnp.tanh(x @ w)
    with jax.named_scope("nan_isolation"):
      keep = jnp.all(jnp.isfinite(y))
    return jnp.where(keep, jnp.sum(y, axis=0), 0.0), y.T.copy()

  x = jnp.ones((4, 64, 32))
  compiled = jax.jit(jax.vmap(step, in_axes=(None, 0))).lower(jnp.ones((32, 32)), x).compile()
  instructions = xla_trace.hlo_instructions(compiled.as_text())
  found = {profile_step.what_it_does(i) for i in instructions.values()
           if i.opcode not in ("parameter", "tuple", "get-tuple-element", "constant")}
  assert {xla_trace.MATMUL, "nan_isolation"} <= found, found
  assert any("reduce" in kind for kind in found), found


def test_the_profile_counts_ops_per_step_by_what_they_do():
  """`scope_rows` sums the traced ops' own time and executions by scope or kind: ops per
  step (a count, which holds on a loaded machine), ms per member-step, share of the span."""
  import profile_step
  import xla_trace

  I = xla_trace.Instruction
  adam = I("fusion.1", "fusion", "f32[32]", "fusion (root: add)", "vmap(optimizer)/add")
  dot = I("dot.1", "dot", "f32[4,32]", xla_trace.MATMUL, "block_0/mlp/dot_general")
  result = xla_trace.Profile(span=100.0, kinds={}, ops=[
      (60.0, 4, "dot.1", dot), (30.0, 8, "fusion.1", adam), (6.0, 4, "fusion.1", adam)])
  rows = profile_step.scope_rows(result, steps=2, member_steps=4)
  assert rows == [
      {"what it does": xla_trace.MATMUL, "ops per step": "2.0", "ms": 0.015, "share": 0.6},
      {"what it does": "optimizer", "ops per step": "6.0", "ms": 0.009, "share": 0.36}]


def test_a_write_without_settings_keeps_the_last_settings_ab(tmp_path):
  """`--write` without `--settings` carries the last A/B over, marked with the run that
  measured it; carried again, it keeps that run's mark."""
  ab = ["- fast (--fast): quick:1 faster; numbers bit for bit"]
  block = run.performance_block(_rows(), {1024: 287.5}, {1024: 352.5}, "a CPU, 2 core(s)",
                                "2026-12-04T23:00", "abc1234", "python benchmarks/run.py", ab)
  page = f"intro\n{run.BEGIN}\n{block}\n{run.END}\n"
  results = ("`python benchmarks/run.py --settings`\n\n- CPU: AMD EPYC; 2 core(s)\n"
             "- XLA_FLAGS=''; 2026-12-04T23:00; commit abc1234 + changes\n\n| table |\n\n"
             "## XLA:CPU settings\n\n| the A/B |")
  assert run.earlier_settings("no A/B here", page) == (None, None)
  section, lines = run.earlier_settings(results, page)
  origin = "the run of 2026-12-04T23:00 at commit abc1234 + changes on AMD EPYC"
  assert section == (f"From {origin}; this run did not measure them (`--settings`).\n\n"
                     "| the A/B |")
  assert lines == [f"- (from {origin}; not measured again since)"] + ab
  later = run.performance_block(_rows(), {1024: 287.5}, {1024: 352.5}, "a CPU, 2 core(s)",
                                "2026-12-07T09:00", "def5678", "python benchmarks/run.py", lines)
  text = run.report(_rows(), {1024: 287.5}, {1024: 352.5},
                    ["- CPU: Intel Xeon; 2 core(s)", "- XLA_FLAGS=''; 2026-12-07T09:00; "
                     "commit def5678"], {}, "cmd", False,
                    section)
  assert run.earlier_settings(text, f"{run.BEGIN}\n{later}\n{run.END}") == (section, lines)
