"""mpx.checkpoint: bit-identical round trips, retention, loud mismatches, crash safety."""

import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import typing

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mpx import checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = pathlib.Path(__file__).resolve().parent
MEMBERS = 4


class Extras(typing.NamedTuple):
  key: jax.Array      # raw PRNG key data, uint32
  alive: jax.Array    # bool
  step: jax.Array     # int32
  host: np.ndarray    # numpy leaf
  lr: np.float32      # numpy scalar


def make_state(seed: int = 0):
  """A small stacked sweep state: params, an adam state, a NamedTuple of mixed dtypes."""
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  params = {
      "block": {"kernel": jax.random.normal(k1, (MEMBERS, 3, 5)),
                "bias": jax.random.normal(k2, (MEMBERS, 5)).astype(jnp.bfloat16)},
      "mask_logits": jnp.full((MEMBERS, 4, 4), 200.0 + seed),
  }
  opt_state = optax.adam(1e-3).init(params)
  # Non-trivial moments, so a restore that returned zeros would fail.
  opt_state = jax.tree.map(lambda x: x + 0.5 if x.dtype != jnp.int32 else x + 7, opt_state)
  extras = Extras(
      key=jax.random.key_data(jax.random.split(k3, MEMBERS)),
      alive=jnp.array([True, False, True, True]),
      step=jnp.arange(MEMBERS, dtype=jnp.int32) + seed,
      host=np.arange(6, dtype=np.int64).reshape(2, 3) * (seed + 1),
      lr=np.float32(1e-3 * (seed + 1)))
  return {"params": params, "opt": opt_state, "extras": extras}


def assert_trees_identical(actual, expected):
  assert jax.tree_util.tree_structure(actual) == jax.tree_util.tree_structure(expected)
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(actual)[0],
                          jax.tree.leaves(expected)):
    assert type(a) is type(b), jax.tree_util.keystr(path)
    assert np.asarray(a).dtype == np.asarray(b).dtype, jax.tree_util.keystr(path)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b),
                                  err_msg=jax.tree_util.keystr(path))


def zeros_like(tree):
  return jax.tree.map(lambda x: (np.zeros_like(x)[()] if isinstance(x, (np.ndarray, np.generic))
                                 else jnp.zeros_like(x)), tree)


CONFIG = {"experiment": "boolean_gotu", "lr": [1e-3, 3e-3], "seeds": 2, "mask": None}


def test_round_trip_is_bit_identical(tmp_path):
  state = make_state()
  dtypes = {str(x.dtype) for x in jax.tree.leaves(state)}
  assert {"bfloat16", "float32", "int32", "uint32", "bool", "int64"} <= dtypes
  with checkpoint.Checkpointer(tmp_path / "ckpt") as ckpt:
    ckpt.save(10, state, CONFIG)
    restored, config = ckpt.restore(zeros_like(state))
  assert config == CONFIG
  assert_trees_identical(restored, state)
  assert isinstance(restored["extras"], Extras)
  assert isinstance(restored["opt"][0], optax.ScaleByAdamState)


def test_restore_into_abstract_target(tmp_path):
  state = make_state()
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state, CONFIG)
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x,
        state)
    restored, _ = ckpt.restore(abstract)
  assert_trees_identical(restored, state)


def test_steps_retention_and_config(tmp_path):
  with checkpoint.Checkpointer(tmp_path, max_to_keep=2) as ckpt:
    assert ckpt.latest_step() is None and ckpt.all_steps() == []
    for step in (100, 200, 300):
      ckpt.save(step, make_state(step), {**CONFIG, "at": step})
    assert ckpt.all_steps() == [200, 300]
    assert ckpt.latest_step() == 300
    restored, config = ckpt.restore(make_state(), step=200)
    assert config["at"] == 200
    assert_trees_identical(restored, make_state(200))
    # Saving an existing step again keeps the finalised checkpoint.
    ckpt.save(300, make_state(999), {**CONFIG, "at": 999})
    assert ckpt.restore(make_state())[1]["at"] == 300
  assert checkpoint.restore_config(tmp_path) == {**CONFIG, "at": 300}
  assert checkpoint.restore_config(tmp_path, step=200)["at"] == 200
  with checkpoint.Checkpointer(tmp_path, max_to_keep=None) as ckpt:  # reopen: keeps all
    for step in (400, 500, 600):
      ckpt.save(step, make_state(), CONFIG)
    assert ckpt.all_steps() == [200, 300, 400, 500, 600]


def test_reading_a_run_folder_logs_no_orbax_notice(tmp_path, caplog):
  """Every resume reads the checkpoints read-only; Orbax's "Given directory is read only"
  warning said nothing the user had to act on."""
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, make_state(1), CONFIG)
  with caplog.at_level(logging.INFO):
    assert checkpoint.latest_step(tmp_path) == 1
    assert checkpoint.restore_config(tmp_path) == CONFIG
  assert not [r for r in caplog.records if "read only" in r.getMessage()], caplog.text


def test_mismatched_target_names_the_leaf(tmp_path):
  state = make_state()
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state, CONFIG)
    wider = jax.tree.map(lambda x: x, state)
    wider["params"]["block"]["kernel"] = jnp.zeros((MEMBERS, 3, 6))
    with pytest.raises(ValueError, match=r"\['kernel'\].*\(4, 3, 6\).*\(4, 3, 5\)"):
      ckpt.restore(wider)
    recast = jax.tree.map(lambda x: x, state)
    recast["params"]["block"]["bias"] = jnp.zeros((MEMBERS, 5), jnp.float32)
    with pytest.raises(ValueError, match=r"\['bias'\].*float32.*bfloat16"):
      ckpt.restore(recast)
    extended = {**state, "new": jnp.zeros(2)}
    with pytest.raises(ValueError, match=r"\['new'\]"):
      ckpt.restore(extended)
    with pytest.raises(ValueError, match=r"lacks, e\.g\. extras/alive"):
      ckpt.restore({"params": state["params"], "opt": state["opt"]})
    with pytest.raises(ValueError, match="typed PRNG key"):
      ckpt.save(2, {"key": jax.random.key(0)}, CONFIG)
    with pytest.raises(ValueError, match="JSON"):
      ckpt.save(2, state, {"lr": jnp.float32(1.0)})


def test_missing_checkpoint_raises_file_not_found(tmp_path):
  with checkpoint.Checkpointer(tmp_path / "empty") as ckpt:
    with pytest.raises(FileNotFoundError, match="empty"):
      ckpt.restore(make_state())
    ckpt.save(5, make_state(), CONFIG)
    with pytest.raises(FileNotFoundError, match=r"step 4 .*\[5\]"):
      ckpt.restore(make_state(), step=4)
  with pytest.raises(FileNotFoundError, match="nowhere"):
    checkpoint.restore_config(tmp_path / "nowhere")


def _flip_middle(path: pathlib.Path) -> None:
  data = bytearray(path.read_bytes())
  middle = len(data) // 2
  data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
  path.write_bytes(bytes(data))


def _flip_end(path: pathlib.Path) -> None:
  data = bytearray(path.read_bytes())
  data[-16:] = bytes(b ^ 0xFF for b in data[-16:])
  path.write_bytes(bytes(data))


# Damage a finalised step may come with, and (a word of) the cause it is reported with:
# by its sums (`check_intact`), and by Orbax's own reading (`restore`, which trusts them).
SUM = r"sha256 [0-9a-f]{64} expected, [0-9a-f]{64} found"
DAMAGE = {
    "flipped data": (lambda step: [_flip_middle(p) for p in (step / "state" / "d").iterdir()],
                     rf"state/d/[0-9a-f]+: {SUM}$", "CRC-32C checksum verification failed"),
    "index end flipped": (lambda step: [_flip_end(p) for p in (step / "state" / "d").iterdir()],
                          rf"state/d/[0-9a-f]+: {SUM}$", "Error decoding .* in state/d/"),
    "truncated data": (lambda step: [p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2])
                                     for p in (step / "state" / "d").iterdir()],
                       rf"state/d/[0-9a-f]+: {SUM} \(\d+ bytes expected, \d+ found\)",
                       "OUT_OF_RANGE"),
    "missing metadata": (lambda step: (step / "state" / "_METADATA").unlink(),
                         "a file is missing: state/_METADATA", "_METADATA"),
    "undecodable config": (lambda step: _flip_middle(step / "config" / "metadata"),
                           f"config/metadata: {SUM}",
                           "Error"),  # UnicodeDecodeError or JSONDecodeError.
    "missing state": (lambda step: shutil.rmtree(step / "state"), "an item is missing: state",
                      "an item is missing"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_step_raises_damaged_checkpoint_and_is_set_aside(tmp_path, damage):
  """A finalised step whose bytes do not restore completely raises DamagedCheckpoint naming
  the step and the cause, from check_intact (its sums first, then Orbax's reading) and
  restore (never Orbax's or tensorstore's own errors; a missing _METADATA is no changed
  config); the older step still restores, and set_aside renames the damaged one out of
  the steps, unchanged."""
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, make_state(1), CONFIG)
    ckpt.save(2, make_state(2), CONFIG)
  damage_step, by_sums, by_orbax = DAMAGE[damage]
  damage_step(tmp_path / "2")
  damaged = {p.relative_to(tmp_path / "2"): p.read_bytes()
             for p in (tmp_path / "2").rglob("*") if p.is_file()}
  message = rf"checkpoint step 2 in {tmp_path} does not restore: "
  with pytest.raises(checkpoint.DamagedCheckpoint, match=message + by_sums) as info:
    checkpoint.check_intact(tmp_path, 2)
  assert (info.value.step, info.value.path) == (2, str(tmp_path / "2"))
  with pytest.raises(checkpoint.DamagedCheckpoint, match=message + f".*{by_orbax}"):
    checkpoint.check_intact(tmp_path, 2, verify=False)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    with pytest.raises(checkpoint.DamagedCheckpoint, match=message + f".*{by_orbax}"):
      ckpt.restore(zeros_like(make_state()))
    assert_trees_identical(ckpt.restore(zeros_like(make_state()), step=1)[0], make_state(1))
  assert checkpoint.check_intact(tmp_path, 1) == CONFIG
  moved = pathlib.Path(checkpoint.set_aside(tmp_path, 2))
  assert moved.parent == tmp_path and moved.name.startswith("2.damaged-")
  assert checkpoint.all_steps(tmp_path) == [1]
  assert {p.relative_to(moved): p.read_bytes() for p in moved.rglob("*")
          if p.is_file()} == damaged
  with checkpoint.Checkpointer(tmp_path) as ckpt:  # A writer leaves it alone.
    ckpt.save(2, make_state(2), CONFIG)
    assert ckpt.all_steps() == [1, 2] and moved.is_dir()


def _start(code: str, **env) -> subprocess.Popen:
  """A Python subprocess that can import this file's helpers (started, not awaited)."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", **env}
  prelude = f"import sys; sys.path.insert(0, {str(TESTS)!r}); sys.path.insert(0, {str(ROOT)!r})\n"
  return subprocess.Popen([sys.executable, "-c", prelude + textwrap.dedent(code)], cwd=ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# How a writer dies after save(1) has returned: right away; inside save(2) as its config
# item starts to be written (the state item's temporary directory exists, its data may
# not); or at the last moment of save(2), every file written and only the step
# directory's rename left.
KILLS = {
    "after_save": "os.kill(os.getpid(), signal.SIGKILL)",
    "item_write": """
      def die(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
      ocp.JsonCheckpointHandler.save = die
      ocp.JsonCheckpointHandler.async_save = die
      """,
    "final_rename": """
      rename = os.rename
      def rename_or_die(source, destination, *args, **kwargs):
        if os.path.basename(os.fspath(source)).startswith("2.orbax-checkpoint-tmp"):
          os.kill(os.getpid(), signal.SIGKILL)
        return rename(source, destination, *args, **kwargs)
      os.rename = rename_or_die
      """,
}


def test_sigkilled_writer_leaves_the_latest_finalised_checkpoint(tmp_path):
  writers = {}
  for moment, kill in KILLS.items():  # concurrently: each is mostly jax start-up time
    kill = textwrap.indent(textwrap.dedent(kill).strip(), " " * 6).strip()
    writers[moment] = _start(f"""
      import os, signal
      import orbax.checkpoint as ocp
      from mpx import checkpoint
      from test_checkpoint import make_state, CONFIG
      ckpt = checkpoint.Checkpointer({str(tmp_path / moment)!r})
      ckpt.save(1, make_state(1), CONFIG)
      {kill}
      ckpt.save(2, make_state(2), {{**CONFIG, "at": 2}})
      print("save(2) returned")
      """)
  for moment, writer in writers.items():
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == -signal.SIGKILL, (moment, out, err)
    assert "returned" not in out, moment
    directory = tmp_path / moment
    leftovers = [p.name for p in directory.iterdir() if p.name.startswith("2")]
    assert all(".orbax-checkpoint-tmp" in name for name in leftovers), (moment, leftovers)
    assert bool(leftovers) == (moment != "after_save"), (moment, leftovers)
    assert checkpoint.restore_config(directory) == CONFIG  # readers ignore the partial step
    with checkpoint.Checkpointer(directory) as ckpt:  # the next writer resumes from step 1
      assert ckpt.all_steps() == [1], moment
      restored, config = ckpt.restore(make_state())
      assert config == CONFIG
      assert_trees_identical(restored, make_state(1))
      ckpt.save(2, make_state(2), CONFIG)
      assert ckpt.all_steps() == [1, 2]
      assert sorted(p.name for p in directory.iterdir()) == ["1", "2"], moment  # cleaned up
      assert_trees_identical(ckpt.restore(make_state())[0], make_state(2))


def test_partial_temporary_directory_is_never_picked(tmp_path):
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    ckpt.save(2, make_state(2), CONFIG)
  # What an interrupted orbax save of step 3 leaves behind.
  partial = tmp_path / "3.orbax-checkpoint-tmp-1234567890"
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "_METADATA").write_text("{")
  (tmp_path / "4.orbax-checkpoint-tmp").mkdir()
  assert checkpoint.restore_config(tmp_path) == CONFIG
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    assert ckpt.all_steps() == [2] and ckpt.latest_step() == 2
    assert_trees_identical(ckpt.restore(make_state())[0], make_state(2))
    ckpt.save(5, make_state(5), CONFIG)
    assert ckpt.all_steps() == [2, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2", "5"]  # leftovers removed


def test_sharded_state_round_trip(tmp_path):
  proc = _start(f"""
      import jax, jax.numpy as jnp, numpy as np
      from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
      from mpx import checkpoint
      from test_checkpoint import make_state, assert_trees_identical, zeros_like, CONFIG
      assert jax.device_count() == 4, jax.devices()
      mesh = Mesh(np.array(jax.devices()), ("members",))
      def shard(tree):
        def put(x):
          if not isinstance(x, jax.Array):
            return x
          spec = P("members") if x.ndim and x.shape[0] == 4 else P()
          return jax.device_put(x, NamedSharding(mesh, spec))
        return jax.tree.map(put, tree)
      state = shard(make_state(3))
      assert len(state["params"]["block"]["kernel"].addressable_shards) == 4
      with checkpoint.Checkpointer({str(tmp_path)!r}) as ckpt:
        ckpt.save(7, state, CONFIG)
        target = shard(zeros_like(state))
        restored, config = ckpt.restore(target)
      assert config == CONFIG
      assert_trees_identical(restored, state)
      for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
        if isinstance(want, jax.Array):
          assert got.sharding == want.sharding, (got.sharding, want.sharding)
      assert restored["params"]["block"]["kernel"].sharding.spec == P("members")
      print("sharded ok")
      """, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, out + err
  assert "sharded ok" in out
