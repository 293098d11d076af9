"""Every python block of README.md and docs/*.md runs, exactly as written.

The blocks of a docs page run in order in one namespace (a page reads like a notebook), the
README's each on its own (a reader copies one), with a temporary directory as the working
directory. A block that needs what a test machine
lacks (a dataset, a cloud account, several hosts) is marked `<!-- not run: REASON -->` on
the line above its fence and listed in NOT_RUN; nothing else is skipped. Some pages'
results are checked beyond "it ran" (CHECKS).
"""

import json
import pathlib
import re

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


def _check_readme(namespace, cwd):
  """The functional block trains the mask; the engine block: 8 members of a linear
  regression, the large learning rate fits it, the small one has barely moved in 300
  steps; the discovery block trains both stages."""
  del cwd
  assert namespace["grads"]["mask_logits"].shape == (17, 17)
  assert float(abs(namespace["grads"]["mask_logits"]).max()) > 0
  mse = [m["mse"] for m in namespace["metrics"]]
  assert len(mse) == 8
  assert max(mse[4:]) < 1e-3 < min(mse[:4])
  # Discovery on the registered task: stage 2's arms trained with the graphs they read.
  members = namespace["summary"]["members"]
  assert [(m["task"], m["scheme"]) for m in members] == [
      ("mine", s) for s in ("default", "learned", "discovered_mask", "discovered_fourier")]
  for member in members[2:]:
    assert 0 <= member["metrics"]["bit_recall"] <= 1, member["metrics"]
  for route in ("mask", "fourier"):  # tiny learns nothing: the plumbing, not the graph.
    assert {"bits", "pairs", "bit_recall"} <= set(namespace["found"][route])


def _check_boolean(namespace, cwd):
  """The registered task trains every scheme of the tiny preset into the relative out_dir."""
  summary = namespace["summary"]
  assert {(m["task"], m["scheme"]) for m in summary["members"]} == {
      ("parity3", "default"), ("parity3", "mask")}
  records = [json.loads(line) for line in (cwd / "runs/parity3/metrics.jsonl").open()]
  assert {r["step"] for r in records} == {0, 48, 96}
  assert all(np.isfinite(r["loss"]) and "fidelity_unseen" in r for r in records)


CHECKS = {"README.md": _check_readme, "docs/boolean.md": _check_boolean}


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)])
def test_every_python_block_runs_as_written(page, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  namespace = run_page(page)
  if page in CHECKS:
    CHECKS[page](namespace, tmp_path)


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
