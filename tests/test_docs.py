"""Every python block of README.md and docs/*.md runs, exactly as written, and every page
with code blocks has a check of its own.

The blocks of a docs page run in order in one namespace (a page reads like a notebook), the
README's each on its own (a reader copies one), with a temporary directory as the working
directory. A block that needs what a test machine
lacks (a dataset, a cloud account, several hosts) is marked `<!-- not run: REASON -->` on
the line above its fence and listed in NOT_RUN; nothing else is skipped. Each page's results are checked beyond "it
ran" against what the page says of them (CHECKS; the test passes them what the blocks
printed). A page's bash blocks are not run (they train for minutes to hours, download,
start hosts); SHELL_CHECKS checks them instead, by default with `resolve_commands`: every
`mpx run` names an experiment, preset and config keys that exist, every install an extra,
every `python -m` a module, every script a file. A new page with code blocks needs its
entries in these two registries (test_every_page_with_code_blocks_has_its_check).
"""

import configparser
import importlib.util
import itertools
import json
import os
import pathlib
import re
import shlex
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).parents[1]
PAGES = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
# (page, reason) of every block that is not run; a new marker must be listed here.
NOT_RUN: set[tuple[str, str]] = set()
_BLOCK = re.compile(r"(?:<!-- not run: (?P<reason>.*?) -->\n)?```python\n(?P<code>.*?)```", re.S)
_SHELL_BLOCK = re.compile(r"```(?:bash|sh)\n(.*?)```", re.S)


def blocks(page: str) -> list[tuple[str | None, str, int]]:
  """(not-run reason or None, code, line number) of every python block of a page."""
  text = (ROOT / page).read_text()
  return [(m["reason"], m["code"], text.count("\n", 0, m.start("code")) + 1)
          for m in _BLOCK.finditer(text)]


def shell_blocks(page: str) -> list[str]:
  """The text of every bash block of a page."""
  return _SHELL_BLOCK.findall((ROOT / page).read_text())


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


def _check_own_experiment(namespace, cwd, printed):
  """The file's block defines an experiment: a SweepConfig, presets whose tiny builds one
  group of every scheme and seed (`test_the_own_experiment_file_runs_with_mpx_run` runs
  it with `mpx run`)."""
  del cwd, printed
  from mpx.sweep import config as config_lib
  assert issubclass(namespace["Config"], config_lib.SweepConfig)
  group, = namespace["build_groups"](namespace["Config"](**namespace["PRESETS"]["tiny"]))
  assert [(m.scheme, m.seed) for m in group.members] == [("default", 0), ("mask", 0)]


CHECKS = {"README.md": _check_readme, "docs/boolean.md": _check_boolean,
          "docs/diagnostics.md": _check_diagnostics, "docs/discover.md": _check_discover,
          "docs/functional.md": _check_functional, "docs/linen.md": _check_linen,
          "docs/nnx.md": _check_nnx, "docs/own_experiment.md": _check_own_experiment,
          "docs/performance.md": _check_performance}


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


OWN_EXPERIMENT = "docs/own_experiment.md"


def test_the_own_experiment_file_runs_with_mpx_run(tmp_path, monkeypatch, capsys):
  """The page's file, saved under the name the page gives it, runs with the page's first
  command: every scheme and seed of the tiny preset trained and summarised into
  runs/neighbours-tiny, the run ending with that summary's path. The page names every
  attribute an experiment file must define."""
  from mpx import cli
  from mpx.sweep import config as config_lib
  text = (ROOT / OWN_EXPERIMENT).read_text()
  (code,) = [code for _, code, _ in blocks(OWN_EXPERIMENT)]
  assert "Save this as `neighbours.py`" in text
  assert "\nmpx run neighbours.py --preset tiny " in text
  for name in config_lib.EXPERIMENT_ATTRIBUTES:
    assert f"| `{name}" in text, name
  monkeypatch.chdir(tmp_path)
  (tmp_path / "neighbours.py").write_text(code)
  assert cli.main(["run", "neighbours.py", "--preset", "tiny", "--no-plots"]) == 0
  summary = json.loads((tmp_path / "runs/neighbours-tiny/summary.json").read_text())
  assert [(m["task"], m["scheme"], m["seed"]) for m in summary["members"]] == [
      ("neighbours", "default", 0), ("neighbours", "mask", 0)]
  for m in summary["members"]:
    assert 0 <= m["metrics"]["accuracy"] <= 1 and np.isfinite(m["metrics"]["loss"]), m
  assert capsys.readouterr().err.splitlines()[-1] == "summary: runs/neighbours-tiny/summary.md"
  # Its legend says what its own metrics mean, not what the Boolean family's do.
  from mpx import report
  namespace = {}
  exec(code, namespace)
  assert summary["metric_descriptions"] == namespace["METRIC_DESCRIPTIONS"]
  md = (tmp_path / "runs/neighbours-tiny/summary.md").read_text()
  words = namespace["METRIC_DESCRIPTIONS"]
  assert f"- `accuracy (%)`: {words['accuracy']}; {report.PERCENT_NOTE}\n" in md
  assert f"- `loss`: {words['loss']}\n" in md
  assert report.METRIC_DESCRIPTIONS["accuracy"] not in md
  # The page's selection command: each scheme's rate chosen on its validation split.
  (select,) = [line for line in text.splitlines()
               if line.startswith("mpx run neighbours.py") and "--select" in line]
  argv = shlex.split(select.partition("#")[0])[1:] + ["--no-plots", "--out", "selected"]
  assert cli.main(argv) == 0
  summary = json.loads((tmp_path / "selected/summary.json").read_text())
  chosen = {r["scheme"]: r["learning_rate"] for r in summary["selection"]["rows"]}
  assert set(chosen) == {"default", "mask"} and set(chosen.values()) <= {1e-3, 1e-2}
  assert all({"val_accuracy", "val_loss"} <= set(m["metrics"]) for m in summary["members"])
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


# ----------------------------------------------------------------------------- shell blocks


def _commands(block: str) -> list[list[str]]:
  """The commands of a bash block as argument lists: continued lines joined, comments
  dropped, split at line ends, `&&`, `;`, `&` and `|`."""
  commands = []
  for line in block.replace("\\\n", " ").splitlines():
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    words = []
    for token in lexer:
      if token in ("&&", ";", "&", "|", "||"):
        commands.append(words)
        words = []
      else:
        words.append(token)
    commands.append(words)
  return [c for c in commands if c]


def _extras() -> set[str]:
  cfg = configparser.ConfigParser()
  cfg.read(ROOT / "setup.cfg")
  return set(cfg["options.extras_require"])


def _resolve(words: list[str]) -> bool:
  """Checks one command against what exists; False for a program this does not know."""
  from mpx import cli
  from mpx.sweep import config as config_lib
  while words[0] in ("taskset", "nice"):  # Prefixes: the command is what follows.
    words = words[3:] if words[0] == "taskset" else words[1:]
  if words[0] == "bash" and words[1].endswith(".sh"):
    assert (ROOT / words[1]).is_file(), words[1]
    return "--" not in words or _resolve(words[words.index("--") + 1:])
  if words[:3] == ["pip", "install", "-e"]:  # This repository, with extras of setup.cfg.
    path, _, extras = words[3].partition("[")
    assert path == "." and set(filter(None, extras.rstrip("]").split(","))) <= _extras(), words
    return True
  if words[0].startswith("python") and words[1] == "-m" and words[2] != "venv":
    assert importlib.util.find_spec(words[2]) is not None, words[2]
    return True
  if words[0] == "pdoc":  # pdoc -o DIR MODULE...
    assert all(importlib.util.find_spec(m) is not None for m in words[3:]), words
    return True
  if words[0] != "mpx":
    return False
  if "--help" in words:
    assert words[-1] == "--help" and len(words) <= 4, words
    if len(words) == 4:
      config_lib.load_experiment(words[2])
    return True
  args = cli.make_parser().parse_args(words[1:])
  if args.command == "compile":
    from mpx.sweep import targets
    targets.parse(args.target)
  if args.command in ("run", "compile"):
    selected = [f"select={args.select}"] if args.select else []
    config_lib.make_configs(config_lib.load_experiment(args.experiment), args.preset,
                            [*(args.set or ()), *selected])
  return True


def resolve_commands(page: str) -> None:
  """Every `mpx` command of the page's bash blocks parses and its experiment, preset and
  `--set` keys exist; every `pip install -e` names extras of setup.cfg, every `python -m`
  and `pdoc` a module, every `bash X.sh` a file; each block holds at least one of them."""
  for block in shell_blocks(page):
    assert [_resolve(words) for words in _commands(block)].count(True), block


def _own_experiment_commands(page: str) -> None:
  """The page's commands run the file it writes: saved under its name in an empty folder,
  each command resolves against it (its presets and `--set` keys)."""
  (code,) = [code for _, code, _ in blocks(page)]
  with tempfile.TemporaryDirectory() as folder:
    pathlib.Path(folder, "neighbours.py").write_text(code)
    cwd = os.getcwd()
    os.chdir(folder)
    try:
      resolve_commands(page)
    finally:
      os.chdir(cwd)


# page → the check of its bash blocks, called with the page's name.
SHELL_CHECKS = {page: resolve_commands for page in (
    "README.md", "docs/api.md", "docs/data.md", "docs/discover.md", "docs/hosts.md",
    "docs/sweeps.md")} | {OWN_EXPERIMENT: _own_experiment_commands}


@pytest.mark.parametrize("page", sorted(SHELL_CHECKS))
def test_the_shell_blocks_of_a_page_pass_its_check(page):
  SHELL_CHECKS[page](page)


def test_every_page_with_code_blocks_has_its_check():
  """A page with python blocks has its CHECKS entry, one with bash blocks its SHELL_CHECKS
  entry: a new page cannot go without one. The test lists the pages that lack it."""
  unchecked = [f"{page} (python: add it to CHECKS)" for page in PAGES
               if any(reason is None for reason, _, _ in blocks(page)) and page not in CHECKS]
  unchecked += [f"{page} (bash: add it to SHELL_CHECKS)" for page in PAGES
                if shell_blocks(page) and page not in SHELL_CHECKS]
  assert not unchecked
  assert set(SHELL_CHECKS) <= set(PAGES)


def test_the_readme_is_a_front_page():
  """README.md stays at most 180 lines (detail goes to docs/): it opens with the two
  commands, install and run the main job, install and run the tests, and keeps the
  reproduction table, one line per row and a verdict in each mpx cell."""
  lines = (ROOT / "README.md").read_text().splitlines()
  assert len(lines) <= 180, len(lines)
  assert lines[3].startswith("# 1. install and run the main job")
  assert lines[4].startswith("python3 -m venv") and "mpx run boolean_gotu" in lines[4]
  assert lines[6].startswith("# 2. install and run the tests")
  assert lines[7].startswith("python3 -m venv") and "pytest" in lines[7]
  table = lines.index("## Reproduction status")
  header = next(i for i in range(table, table + 10) if lines[i].startswith("| result |"))
  rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[header + 2:]))
  verdicts = ("reproduced", "not run", "not learned", "unchanged", "rate's")
  for row in rows:
    assert any(v in row.split(" | ")[2] for v in verdicts), row


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


def test_the_reproduction_table_quotes_the_paper_s_boolean_metric():
  """The paper's 2Parity and Majority numbers are whole-cube accuracy: the README's rows
  name it and quote experiments/results/boolean_cpu.md's `accuracy`, then its unseen
  accuracy (0.00 for every 2Parity scheme there), scheme by scheme."""
  results = (ROOT / "experiments/results/boolean_cpu.md").read_text()
  measured = {(task, scheme): (accuracy, unseen) for task, scheme, accuracy, unseen in
              re.findall(r"^\| (\w+) \| (\w+) \| \**([\d.]+ ± [\d.]+)\**[^|]*\| [^|]*\| "
                         r"([\d.]+ ± [\d.]+) \|", results, re.M)}
  readme = (ROOT / "README.md").read_text().splitlines()
  for label, task in (("2Parity", "2parity"), ("3-bit Majority", "majority3")):
    first = next(i for i, line in enumerate(readme)
                 if line.startswith(f"| {label} whole-cube accuracy, default / mask |"))
    assert readme[first + 1].startswith("| same, QK-SVD / QK-Opt |")
    for line, schemes in ((readme[first], ("default", "mask")),
                          (readme[first + 1], ("qk_svd", "qk_opt"))):
      quoted = re.findall(r"[\d.]+ ± [\d.]+", line.split(" | ")[2].replace("**", ""))
      assert quoted == [measured[task, s][i] for i in (0, 1) for s in schemes], line


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
