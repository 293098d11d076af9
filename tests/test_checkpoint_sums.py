"""mpx.checkpoint: sums over every byte of a checkpoint, verified before a resume.

Orbax's array data carries no checksum of its own (only OCDBT's b-tree index and
manifests do), so bytes flipped in it restored silently with other numbers. Every file
of a finalised step is now summed when it is written and verified by `check_intact`,
which reads the step whole before a run resumes: a mismatch, a missing file or a missing
or damaged sum file is a DamagedCheckpoint; a step written before sums existed verifies
as unsummed and still restores.
"""

import json
import pathlib
import shutil

import pytest

import numpy as np

from mpx import checkpoint

from test_checkpoint import CONFIG, assert_trees_identical, zeros_like
from test_checkpoint import make_state as small_state


def make_state(seed: int = 0):
  """test_checkpoint's small state of every dtype, and weights as training leaves them:
  random floats, which zstd stores as they are, so that flipped bytes in them decode."""
  weights = np.random.default_rng(seed).standard_normal((4, 4096)).astype(np.float32)
  return small_state(seed) | {"weights": weights}


def _flip(path: pathlib.Path, where: str = "middle", count: int = 16) -> None:
  """XORs `count` bytes of `path` with 0xFF at its start, middle or end (the whole file
  where it is shorter)."""
  data = bytearray(path.read_bytes())
  count = min(count, len(data))
  start = {"start": 0, "middle": (len(data) - count) // 2, "end": len(data) - count}[where]
  data[start:start + count] = bytes(b ^ 0xFF for b in data[start:start + count])
  path.write_bytes(bytes(data))


def _written(directory: pathlib.Path) -> None:
  with checkpoint.Checkpointer(directory) as ckpt:
    ckpt.save(1, make_state(1), CONFIG)
    ckpt.save(2, make_state(2), CONFIG)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> pathlib.Path:
  """Steps 1 and 2 of a small state, as written (copy before damaging)."""
  directory = tmp_path_factory.mktemp("written") / "ckpt"
  _written(directory)
  return directory


def _copy(written: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
  directory = tmp_path / "ckpt"
  shutil.copytree(written, directory)
  return directory


def _array_data(step: pathlib.Path) -> pathlib.Path:
  """The largest file of the step's array data (what the damage in the field hit)."""
  files = [p for p in (step / "state").glob("ocdbt.process_*/d/*") if p.is_file()]
  assert files, sorted(step.rglob("*"))
  return max(files, key=lambda p: p.stat().st_size)


def test_every_file_of_a_step_is_summed_with_it(written):
  """Each item of a finalised step holds its sum file, which lists every other file of
  the item, written before the step was finalised (so it is part of what "finished"
  means): the only files outside the sums are Orbax's commit records, written after."""
  step = written / "2"
  for item in ("state", "config"):
    sums = json.loads((step / item / checkpoint.SUMS_FILE).read_text())
    files = {str(p.relative_to(step / item)) for p in (step / item).rglob("*") if p.is_file()}
    assert set(sums["files"]) == files - {checkpoint.SUMS_FILE, "commit_success.txt"}
  assert checkpoint.verify_sums(written, 2) is True


def test_a_byte_flipped_in_array_data_is_damage(written, tmp_path):
  """The damage from the field: 16 bytes flipped in the largest file of the array data
  raise DamagedCheckpoint naming the step, the file and both sums; the older step still
  restores."""
  directory = _copy(written, tmp_path)
  data = _array_data(directory / "2")
  _flip(data)
  rel = data.relative_to(directory / "2")
  message = (rf"checkpoint step 2 in {directory} does not restore: {rel}: sha256 "
             r"[0-9a-f]{64} expected, [0-9a-f]{64} found")
  with pytest.raises(checkpoint.DamagedCheckpoint, match=message) as info:
    checkpoint.check_intact(directory, 2)
  assert info.value.step == 2
  assert checkpoint.check_intact(directory, 1) == CONFIG


@pytest.mark.parametrize("item", ["state", "config"])
def test_a_missing_sum_file_is_damage(written, tmp_path, item):
  directory = _copy(written, tmp_path)
  (directory / "2" / item / checkpoint.SUMS_FILE).unlink()
  with pytest.raises(checkpoint.DamagedCheckpoint,
                     match=rf"step 2 .* {item}/{checkpoint.SUMS_FILE} is missing"):
    checkpoint.check_intact(directory, 2)


@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_a_damaged_sum_file_is_damage(written, tmp_path, where):
  """Bytes flipped anywhere in a sum file (its JSON, a sum it holds, its own sum) make
  the step damaged, named as the sum file's damage."""
  directory = _copy(written, tmp_path)
  _flip(directory / "2" / "state" / checkpoint.SUMS_FILE, where, count=1)
  with pytest.raises(checkpoint.DamagedCheckpoint,
                     match=rf"step 2 .* state/{checkpoint.SUMS_FILE} is damaged"):
    checkpoint.check_intact(directory, 2)


def test_a_step_written_without_sums_verifies_as_unsummed_and_restores(written, tmp_path):
  """A step written before sums existed (no sum file in any item) is no damage:
  `verify_sums` says False, and it restores as it always did."""
  directory = _copy(written, tmp_path)
  for item in ("state", "config"):
    (directory / "2" / item / checkpoint.SUMS_FILE).unlink()
  assert checkpoint.verify_sums(directory, 2) is False
  assert checkpoint.verify_sums(directory, 1) is True
  assert checkpoint.check_intact(directory, 2) == CONFIG
  with checkpoint.Checkpointer(directory) as ckpt:
    assert_trees_identical(ckpt.restore(zeros_like(make_state()))[0], make_state(2))


def _files(step: pathlib.Path) -> list[str]:
  return sorted(str(p.relative_to(step)) for p in step.rglob("*") if p.is_file())


def test_flipped_bytes_anywhere_in_a_checkpoint_never_reach_a_restore(written, tmp_path):
  """The target: bytes flipped at the start, middle or end of each file of a step in
  turn either make `check_intact` raise DamagedCheckpoint (the run falls back to an
  older step), or leave what a resume restores (the state and the config) bit for bit as
  written."""
  reached = []
  files = _files(written / "2")
  assert len(files) > 10, files
  for rel in files:
    for where in ("start", "middle", "end"):
      directory = tmp_path / f"{rel.replace('/', '_')}-{where}"
      shutil.copytree(written, directory)
      _flip(directory / "2" / rel, where)
      try:
        config = checkpoint.check_intact(directory, 2)
      except checkpoint.DamagedCheckpoint:
        shutil.rmtree(directory)
        continue
      except Exception as e:  # Not sorted as damage: the run would stop, not fall back.
        reached.append(f"{rel} ({where}): check_intact raised {type(e).__name__}")
        continue
      try:  # What the resume then restores: as written, or an error check_intact missed.
        with checkpoint.Checkpointer(directory) as ckpt:
          state, restored_config = ckpt.restore(zeros_like(make_state()), step=2)
        assert config == restored_config == CONFIG
        assert_trees_identical(state, make_state(2))
      except (AssertionError, checkpoint.StorageError) as e:
        reached.append(f"{rel} ({where}): {type(e).__name__}")
      shutil.rmtree(directory)
  assert not reached, f"flipped bytes that check_intact let through: {reached}"


def test_sums_in_a_bucket_cover_every_file(bucket):
  """In a gs:// folder (the GCS emulator, written through tensorstore and gcsfs) the sums
  list every object of each item, as the bucket lists them, and verify."""
  import gcsfs
  from etils import epath
  directory = f"{bucket}/sums/ckpt"
  with checkpoint.Checkpointer(directory) as ckpt:
    ckpt.save(1, make_state(1), CONFIG)
  fs = gcsfs.GCSFileSystem()
  fs.invalidate_cache()
  for item in ("state", "config"):
    prefix = f"{directory.removeprefix('gs://')}/1/{item}/"
    objects = {path.removeprefix(prefix) for path in fs.find(prefix)}
    sums = json.loads((epath.Path(directory) / "1" / item / checkpoint.SUMS_FILE).read_text())
    assert set(sums["files"]) == objects - {checkpoint.SUMS_FILE, "commit_success.txt"}
    assert any(name.startswith("ocdbt.process_0/d/") for name in sums["files"]) or item == "config"
  assert checkpoint.verify_sums(directory, 1) is True


# --- many processes: one decision ------------------------------------------------------------

_PROCESS = """
import json, sys
from etils import epath
from mpx.sweep import distributed
distributed.initialize()
import jax
from mpx import checkpoint
from mpx.sweep import run
root, config = sys.argv[1], json.loads(sys.argv[2])
if jax.process_index() == 1:  # Process 0 reads and decides: process 1 reads nothing.
  def unread(directory, step, **kwargs):
    raise checkpoint.DamagedCheckpoint(directory, step, "process 1 read it")
  checkpoint.verify_sums = checkpoint.check_intact = unread
steps, damaged, unsummed = run._intact_steps(epath.Path(root), config)
print("VERDICT", json.dumps([steps, [[d.step, d.cause] for d in damaged], unsummed]))
"""


@pytest.mark.slow
def test_process_0_decides_for_every_process(written, tmp_path):
  """Two processes resuming one folder: process 0 alone verifies the sums and reads the
  state (which waits for no other process), and its verdict is both processes': step 2
  damaged, step 1 intact."""
  import os
  import socket
  import subprocess
  import sys
  root = tmp_path / "checkpoints"
  shutil.copytree(written, root / "group")
  _flip(_array_data(root / "group" / "2"))
  with socket.socket() as s:
    s.bind(("localhost", 0))
    port = s.getsockname()[1]
  env = {k: v for k, v in os.environ.items() if not k.startswith(("MPX_", "SLURM_"))}
  env |= {"JAX_PLATFORMS": "cpu", "MPX_COORDINATOR": f"localhost:{port}",
          "MPX_NUM_PROCESSES": "2", "MPX_CPU_DEFAULTS": "0"}
  procs = [subprocess.Popen([sys.executable, "-c", _PROCESS, str(root), json.dumps(CONFIG)],
                            env=env | {"MPX_PROCESS_ID": str(i)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  outputs = [p.communicate(timeout=120)[0] for p in procs]
  verdicts = []
  for p, output in zip(procs, outputs):
    assert p.returncode == 0, output[-3000:]
    verdicts.append(json.loads(output.split("VERDICT ", 1)[1].splitlines()[0]))
  steps, damaged, unsummed = verdicts[0]
  assert verdicts[1] == verdicts[0]
  assert steps == {"group": 1} and unsummed == []
  assert [step for step, _ in damaged] == [2]
  assert "sha256" in damaged[0][1] and "expected" in damaged[0][1]
