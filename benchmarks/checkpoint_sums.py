"""What checkpoint sums cost: a save, the sums it writes, and a resume's verification.

    python benchmarks/checkpoint_sums.py                  # tiny, quick, paper (2parity, 1 seed, default)
    python benchmarks/checkpoint_sums.py --scales tiny --repeats 3

For each scale, the state of one Boolean GOTU group as `mpx run` checkpoints it (its real
init, every floating leaf refilled with random normals of its shape and dtype: what
training leaves, which zstd cannot shrink, so no scale looks cheaper than it is; no
training), saved `--repeats` times with `mpx.checkpoint.Checkpointer` (sums included,
as every save writes them). Timed, median of the repeats:

  save      `Checkpointer.save`, whole (Orbax's write, its finalisation, the sums);
  sums      `write_sums` of both items again on the saved step (what the save spends on
            them, from the page cache, as in the save);
  verify    `verify_sums`, warm (the page cache holds the step) and cold (the step's
            files evicted with posix_fadvise first, as after a restart);
  read      `check_intact(verify=False)`: the whole read a resume did before sums, warm.

Prints a Markdown table; the ratios are sums / save, verify / save and verify / read.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile
import time

import jax
import numpy as np

from mpx import checkpoint
from mpx.sweep import config as config_lib
from mpx.sweep import engine
from mpx.sweep import run

SCALES = {"tiny": ("tiny", []), "quick": ("quick", ["tasks=2parity"]),
          "paper": ("paper", ["tasks=2parity", "seeds=1", "schemes=default"])}


def _state(preset: str, overrides: list[str]):
  """The first group's state at `preset`, floating leaves random (host numpy)."""
  experiment = config_lib.load_experiment("boolean_gotu")
  _, variants = config_lib.make_configs(experiment, preset, overrides)
  group = run._merged(run._built(experiment, variants[0][1])[0], None)
  rng = np.random.default_rng(0)

  def refill(leaf):
    leaf = np.asarray(leaf)
    if np.issubdtype(leaf.dtype, np.floating):
      return rng.standard_normal(leaf.shape).astype(leaf.dtype)
    return leaf
  return jax.tree.map(refill, jax.device_get(engine.init_state(group))), len(group.members)


def _evict(step_dir: pathlib.Path) -> None:
  """Drops the step's files from the page cache (only theirs), so the next read is cold."""
  for path in step_dir.rglob("*"):
    if path.is_file():
      fd = os.open(path, os.O_RDONLY)
      try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
      finally:
        os.close(fd)


def _timed(function) -> float:
  start = time.perf_counter()
  function()
  return time.perf_counter() - start


def measure(scale: str, repeats: int, folder: pathlib.Path) -> dict:
  preset, overrides = SCALES[scale]
  state, members = _state(preset, overrides)
  config = {"scale": scale}
  directory = folder / scale
  times = {"save": [], "sums": [], "verify warm": [], "verify cold": [], "read": []}
  with checkpoint.Checkpointer(directory, max_to_keep=None) as ckpt:
    ckpt.save(0, state, config)  # Orbax's first save opens its resources: not timed.
    for step in range(1, repeats + 1):
      times["save"].append(_timed(lambda: ckpt.save(step, state, config)))
      step_dir = directory / str(step)
      times["sums"].append(_timed(lambda: [checkpoint.write_sums(step_dir / item)
                                           for item in ("state", "config")]))
      times["verify warm"].append(_timed(lambda: checkpoint.verify_sums(directory, step)))
      _evict(step_dir)
      times["verify cold"].append(_timed(lambda: checkpoint.verify_sums(directory, step)))
      times["read"].append(_timed(lambda: checkpoint.check_intact(directory, step,
                                                                  verify=False)))
  files = [p for p in (directory / "1").rglob("*") if p.is_file()]
  return {"scale": scale, "members": members,
          "state MB": sum(np.asarray(x).nbytes for x in jax.tree.leaves(state)) / 1e6,
          "files MB": sum(p.stat().st_size for p in files) / 1e6, "files": len(files),
          **{name: statistics.median(values) for name, values in times.items()}}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scales", nargs="+", default=list(SCALES), choices=list(SCALES))
  parser.add_argument("--repeats", type=int, default=5)
  args = parser.parse_args()
  rows = []
  with tempfile.TemporaryDirectory(prefix="mpx-sums-") as folder:
    for scale in args.scales:
      rows.append(measure(scale, args.repeats, pathlib.Path(folder)))
  print("| scale | members | state MB | files (MB) | save s | sums s | verify warm s | "
        "verify cold s | read s | sums / save | verify warm / save | verify cold / save | "
        "verify warm / read |")
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['scale']} | {r['members']} | {r['state MB']:.2f} | {r['files']} "
          f"({r['files MB']:.2f}) | {r['save']:.3f} | {r['sums']:.4f} | "
          f"{r['verify warm']:.4f} | {r['verify cold']:.4f} | {r['read']:.3f} | "
          f"{r['sums'] / r['save']:.1%} | {r['verify warm'] / r['save']:.1%} | "
          f"{r['verify cold'] / r['save']:.1%} | {r['verify warm'] / r['read']:.1%} |")


if __name__ == "__main__":
  main()
