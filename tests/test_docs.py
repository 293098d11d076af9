"""Every python block of README.md and docs/*.md runs, exactly as written.

The blocks of a docs page run in order in one namespace (a page reads like a notebook), the
README's each on its own (a reader copies one), with a temporary directory as the working
directory. A block that needs what a test machine
lacks (a dataset, a cloud account, several hosts) is marked `<!-- not run: REASON -->` on
the line above its fence and listed in NOT_RUN; nothing else is skipped. Each page's results are checked beyond "it
ran" against what the page says of them (CHECKS; the test passes them what the blocks
printed).
"""

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).parents[1]
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
# (page, reason) of every block that is not run; a new marker must be listed here.
NOT_RUN: set[tuple[str, str]] = set()
_BLOCK = re.compile(r"(?:<!-- not run: (?P<reason>.*?) -->\n)?```python\n(?P<code>.*?)```", re.S)


def blocks(page: str) -> list[tuple[str | None, str, int]]:
  """(not-run reason or None, code, line number) of every python block of a page."""
  text = (ROOT / page).read_text()
  return [(m["reason"], m["code"], text.count("\n", 0, m.start("code")) + 1)
          for m in _BLOCK.finditer(text)]


def run_page(page: str) -> dict:
  """Runs a page's blocks; the README's each alone (they are copied one at a time), a docs
  page's in one namespace. Returns every name they defined."""
  namespace, defined = {"__name__": f"docs:{page}"}, {}
  for reason, code, line in blocks(page):
    if reason is None:
      if page == "README.md":
        namespace = {"__name__": f"docs:{page}:{line}"}
      exec(compile("\n" * (line - 1) + code, str(ROOT / page), "exec"), namespace)
      defined.update(namespace)
  return defined


def _check_readme(namespace, cwd, printed):
  """The functional block trains the mask of a window prior; the Flax block keeps Flax's
  param names beside the prior; the engine block: 8 members of a linear regression, the
  large learning rate fits it, the small one has barely moved in 300 steps; the discovery
  block trains both stages, and each stage-2 arm is scored against the target's true
  graph (x3·x7·x5: bits {3, 5, 7}, every pair of them)."""
  del printed
  assert namespace["grads"]["mask_logits"].shape == (17, 17)
  assert float(abs(namespace["grads"]["mask_logits"]).max()) > 0
  # window_prior(4, 4, window=3): CLS (token 0) reads and is read by every patch; patch
  # (r, c) (token 1 + 4r + c) reads the patches of its 3×3 window.
  rc = [(r, c) for r in range(4) for c in range(4)]
  window = np.ones((17, 17), bool)
  window[1:, 1:] = [[abs(r - s) <= 1 and abs(c - d) <= 1 for s, d in rc] for r, c in rc]
  np.testing.assert_array_equal(np.asarray(namespace["params"]["mask_logits"]) > 0, window)
  variables = namespace["variables"]["params"]  # Flax's params + "mask_logits".
  assert sorted(variables) == ["key", "mask_logits", "out", "query", "value"]
  np.testing.assert_array_equal(variables["mask_logits"], namespace["prior"])
  assert namespace["y"].shape == (2, 17, 32)
  # The optimizer line keeps the prior out of weight decay: with zero gradients AdamW's
  # update is the decay alone, which moves the kernels but not the mask.
  zeros = jax.tree.map(jnp.zeros_like, variables)
  updates, _ = namespace["tx"].update(zeros, namespace["opt_state"], variables)
  assert not np.any(updates["mask_logits"]) and np.any(updates["query"]["kernel"])
  mse = [m["mse"] for m in namespace["metrics"]]
  assert len(mse) == 8
  assert max(mse[4:]) < 1e-3 < min(mse[:4])
  # Discovery on the task: every arm but the hand-written one (no support), stage 2's
  # trained with the graphs they read; the summary's record is discovered.json's.
  members = {m["scheme"]: m for m in namespace["summary"]["members"]}
  assert [(m["task"], s) for s, m in members.items()] == [
      ("mine", s) for s in ("default", "learned", "discovered_mask", "random_mask",
                            "discovered_fourier", "random_fourier")]
  out = namespace["out"]
  assert not out.is_relative_to(cwd)  # A temporary folder: the block runs again.
  record = json.loads((out / "discovered.json").read_text())["tasks"]["mine"]
  assert record == namespace["summary"]["discovered"]
  assert record["truth"] == {"bits": [3, 5, 7], "pairs": [[3, 5], [3, 7], [5, 7]]}
  found = namespace["found"]
  records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
  trained = {r["scheme"]: r["graph"] for r in records if "graph" in r}
  for arm, route in (("discovered_mask", "mask"), ("discovered_fourier", "fourier")):
    member, graph = members[arm], found[route]
    recall = len(set(graph["bits"]) & {3, 5, 7}) / 3  # tiny's graphs are noise: any value.
    assert trained[member["scheme"]] == {"bits": graph["bits"], "pairs": graph["pairs"]}
    assert member["metrics"]["bit_recall"] == pytest.approx(recall), (route, graph)
    assert graph["bit_recall"] == pytest.approx(recall), (route, graph)


def _check_boolean(namespace, cwd, printed):
  """The registered task trains every scheme of the tiny preset into a temporary run
  folder (summary.md in there), so the page runs again."""
  del printed
  out = pathlib.Path(namespace["out"])
  assert not out.is_relative_to(cwd)
  summary = namespace["summary"]
  assert {(m["task"], m["scheme"]) for m in summary["members"]} == {
      ("parity3", "default"), ("parity3", "mask")}
  records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
  assert {r["step"] for r in records} == {0, 48, 96}
  assert all(np.isfinite(r["loss"]) and "fidelity_unseen" in r for r in records)
  assert "parity3" in (out / "summary.md").read_text()


def _check_diagnostics(namespace, cwd, printed):
  """The prior persists in the example, as the page says: the mask's relative drift stays
  an order of magnitude below the query/key kernels' in both layers, fidelity stays near
  its value at init, and the mask's gradient is the smaller one; the four functions name
  the layers alike."""
  del cwd
  from mpx import diagnostics
  layers = {"Encoder_0/layers_0/attn", "Encoder_0/layers_1/attn"}
  drift = namespace["drift"]
  for layer, d in drift.items():
    assert 10 * d["mask"] < min(d["query"], d["key"]), (layer, d)
    assert f"{layer}: mask {d['mask']:.3f}, W_Q {d['query']:.3f}, W_K {d['key']:.3f}" in printed
  model, probe, allowed = namespace["model"], namespace["probe"], namespace["allowed"]
  fidelity = {name: {layer: diagnostics.prior_fidelity(w, allowed) for layer, w in
                     diagnostics.attention_maps(model.apply, p, probe).items()}
              for name, p in (("init", namespace["initial"]), ("trained", namespace["params"]))}
  assert set(fidelity["init"]) == set(fidelity["trained"]) == layers
  for layer in layers:
    assert abs(fidelity["trained"][layer] - fidelity["init"][layer]) < 0.05, fidelity
  norms = diagnostics.gradient_norms(namespace["grads"])
  assert set(norms) == layers
  for layer, n in norms.items():
    assert n["mask"] < min(n["query"], n["key"]), (layer, n)


def _check_discover(namespace, cwd, printed):
  """Route (a) reads the same graph as route (b), so the printed score is 1 throughout;
  the prior: CLS and the support bits read each other, x0 and x1 read each other, every
  token itself, −4 elsewhere."""
  del cwd
  assert "{'bit_precision': 1.0, 'bit_recall': 1.0, 'pair_precision': 1.0, " \
         "'pair_recall': 1.0}" in printed.splitlines()
  open_NN = np.eye(9, dtype=bool)
  open_NN[0, [1, 2, 3]] = open_NN[[1, 2, 3], 0] = True
  open_NN[1, 2] = open_NN[2, 1] = True
  prior = np.asarray(namespace["prior"])
  np.testing.assert_array_equal(prior, np.where(open_NN, 4.0, -4.0))


def _check_functional(namespace, cwd, printed):
  """The weights obey the hard masks (causal, row 1's 3 padding keys, query 0 of row 0
  sees nothing and gets zeros) and sum to 1 elsewhere; dropout changes the output."""
  del cwd, printed
  import mpx
  B, N, H = namespace["B"], namespace["N"], namespace["H"]
  weights = np.asarray(namespace["weights"])
  assert weights.shape == (B, H, N, N)
  assert not weights[..., np.triu_indices(N, 1)[0], np.triu_indices(N, 1)[1]].any()
  assert not weights[1, :, :, -3:].any()
  sums = weights.sum(-1)
  np.testing.assert_array_equal(sums[0, :, 0], 0.0)
  sums[0, :, 0] = 1.0
  np.testing.assert_allclose(sums, 1.0, atol=1e-6)
  q, k, v, prior = (namespace[n] for n in ("q", "k", "v", "prior"))
  plain = np.asarray(mpx.masked_attention(q, k, v, prior))
  assert namespace["train_out"].shape == plain.shape
  assert not np.allclose(namespace["train_out"], plain)


def _check_linen(namespace, cwd, printed):
  """The printed param names are the documented ones; the merged checkpoint holds every
  stored leaf and the fresh mask only; the default prior is M = 200; maps are
  probabilities."""
  del cwd
  import jax
  from mpx import priors
  assert "['key', 'mask_logits', 'out', 'query', 'value']" in printed.splitlines()
  H, N = namespace["H"], namespace["N"]
  merged = namespace["params"]["MultiHeadDotProductAttention_0"]
  old = namespace["old_params"]["MultiHeadDotProductAttention_0"]
  np.testing.assert_array_equal(merged["mask_logits"],
                                np.broadcast_to(namespace["local"], (H, N, N)))
  assert set(merged) == set(old) | {"mask_logits"}
  for a, b in zip(jax.tree_util.tree_leaves({k: merged[k] for k in old}),
                  jax.tree_util.tree_leaves(old)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(
      namespace["neutral"]["MultiHeadDotProductAttention_0"]["mask_logits"],
      priors.NEUTRAL_LOGIT)
  maps = np.asarray(namespace["maps"]["MultiHeadDotProductAttention_0"])
  np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-6)


def _check_nnx(namespace, cwd, printed):
  """Flax's param names plus mask_logits; the decay left the prior as built; the vmapped
  members differ, and member 0 trained alone reproduces its loss."""
  del cwd, printed
  import jax.numpy as jnp
  import optax
  from flax import nnx
  H, N = namespace["H"], namespace["N"]
  old_names = set(nnx.to_pure_dict(nnx.state(namespace["old"])))
  assert set(nnx.to_pure_dict(nnx.state(namespace["new"]))) == old_names | {"mask_logits"}
  assert old_names == {"key", "out", "query", "value"}
  np.testing.assert_array_equal(namespace["model"].attention.mask_logits[...],
                                np.broadcast_to(namespace["local"], (H, N, N)))
  losses = np.asarray(namespace["losses"])
  assert len(set(losses.tolist())) == 4
  alone = namespace["Encoder"](nnx.Rngs(namespace["keys"][0]))
  optimizer = nnx.Optimizer(alone, optax.adam(1e-2), wrt=nnx.Param)
  x, y = namespace["x"], namespace["y"]

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads)
    return loss

  for _ in range(3):
    loss = step(alone, optimizer)
  np.testing.assert_allclose(float(loss), losses[0], rtol=1e-5)


def _check_performance(namespace, cwd, printed):
  """The CPU defaults' block: in the test session mpx's defaults are off (conftest), so
  it adds nothing after jax has started and says so rather than raising."""
  del cwd
  assert namespace["added"] == ()
  assert "mpx CPU defaults (" in printed and "off (MPX_CPU_DEFAULTS=0)" in printed, printed


CHECKS = {"README.md": _check_readme, "docs/boolean.md": _check_boolean,
          "docs/diagnostics.md": _check_diagnostics, "docs/discover.md": _check_discover,
          "docs/functional.md": _check_functional, "docs/linen.md": _check_linen,
          "docs/nnx.md": _check_nnx, "docs/performance.md": _check_performance}


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)])
def test_every_python_block_runs_as_written(page, tmp_path, monkeypatch, capsys):
  """The pages that save a checkpoint run twice in one folder, as a reader reruns them
  (Orbax refuses to write over a folder); the run folders of the others are checked to
  be fresh temporary ones."""
  monkeypatch.chdir(tmp_path)
  namespace = run_page(page)
  if page in RUN_TWICE:
    capsys.readouterr()
    namespace = run_page(page)
  if page in CHECKS:
    CHECKS[page](namespace, tmp_path, capsys.readouterr().out)


RUN_TWICE = ("docs/linen.md", "docs/nnx.md")
CONTINUE = "The code blocks of this page continue each other"


def test_pages_say_where_blocks_continue_each_other():
  """A docs page's blocks share one namespace (a block run alone would raise NameError):
  the page says so before its first block; the README's blocks each stand alone."""
  for page in PAGES:
    found = blocks(page)
    text = (ROOT / page).read_text()
    if page != "README.md" and len(found) > 1:
      assert CONTINUE in text.split("```python", 1)[0], page
    else:
      assert CONTINUE not in text, page


def test_the_blocks_not_run_are_the_listed_ones():
  marked = {(page, reason) for page in PAGES for reason, _, _ in blocks(page) if reason}
  assert marked == NOT_RUN
  assert set(CHECKS) <= set(PAGES)


def test_pages_link_only_inside_the_repository():
  for page in PAGES:
    text = (ROOT / page).read_text()
    for target in re.findall(r"\]\(([^)#\s]+)", text):
      if not re.match(r"[a-z]+://", target):
        assert (ROOT / page).parent.joinpath(target).resolve().is_relative_to(ROOT), target
        assert (ROOT / page).parent.joinpath(target).exists(), f"{page}: {target}"
    for outside in ("../shared", "PAPER.md", "DESIGN.md", "FINDINGS.md"):
      assert outside not in text, f"{page} points outside the repository: {outside}"
    assert not re.search(r"\bissue #?\d+|#\d{2}\b", text), f"{page} speaks of issue numbers"


def test_the_performance_page_quotes_the_benchmark_results_file():
  """docs/performance.md states what benchmarks/run.py measured, from the file the
  benchmark writes (`--write`): its date, commit, every rate of mpx and PyTorch, and the
  ratios to PyTorch at the best K."""
  results = (ROOT / "experiments/results/benchmark_cpu.md").read_text()
  page = " ".join((ROOT / "docs/performance.md").read_text().split())
  date, commit = re.search(r"; (\d{4}-\d{2}-\d{2})T[\d:]+; commit (\w+)", results).groups()
  assert f"{date}, commit {commit}" in page
  rates = re.findall(r"\| (quick|paper) \| (?:mpx vmapped|PyTorch[^|]*) \| (\d+) \| ([\d.]+) \|",
                     results)
  assert {scale for scale, _, _ in rates} == {"quick", "paper"}
  for scale, _, rate in rates:
    assert f"| {scale} | " in page and f" {rate} |" in page, rate
  for best in re.findall(r"\| ((?:quick|paper): mpx \(best K = \d+\) / PyTorch, member-steps/s) "
                         r"\| ([\d.]+)x", results):
    assert f"{best[0]} ≥ 1.20×: {best[1]}×" in page, best
