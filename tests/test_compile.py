"""`mpx compile`: the run's own programs compiled for a TPU topology and a GPU model on this
CPU (libtpu and the CUDA plugin of the `aot` extra, which the test extra installs)."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpx import cli
from mpx.sweep import aot, config as config_lib, engine, run as run_lib, targets

BOOLEAN = config_lib.load_experiment("boolean_gotu")
# 8 members (2 per chip of a v5e:2x2), of widths that fill XLA:TPU's 128-lane tiles, so
# that its padding of small dimensions does not hide what the members take; small batches
# keep XLA:TPU's compile short (its time grows with them).
TINY_SWEEP = ["seeds=4", "width=128", "num_heads=1", "head_dim=128", "mlp_dim=128",
              "batch_size=32", "eval_points_per_call=512"]


@pytest.fixture(scope="module")
def tpu_report():
  """The training chunk alone: XLA:TPU's compiles are the slow ones."""
  _, (report,) = aot.compile_experiment(BOOLEAN, "v5e:2x2", preset="tiny",
                                        overrides=TINY_SWEEP, evaluation=False)
  return report


@pytest.fixture(scope="module")
def gpu_report():
  _, (report,) = aot.compile_experiment(BOOLEAN, "h100:1", preset="tiny",
                                        overrides=TINY_SWEEP)
  return report


def _shared_argument_bytes(report) -> int:
  """What every device holds whole: the Boolean cube's training arrays (replicated)."""
  _, config = config_lib.make_config(BOOLEAN, "tiny", TINY_SWEEP)
  group, = BOOLEAN.build_groups(config)
  return sum(np.asarray(v).nbytes for v in group.data.arrays.values())


@pytest.mark.parametrize("which", ["tpu_report", "gpu_report"])
def test_the_member_axis_is_sharded_over_the_targets_devices(which, request):
  """Each device's arguments are its own members' states plus the shared data: the total
  over the device count (8 members on 4 v5e chips: 2 each; on one H100: 8). A program
  whose member axis were replicated would hold all 8 states on every chip."""
  report = request.getfixturevalue(which)
  assert report.members == report.rows == 8
  assert report.per_device == 8 // report.target.devices
  step = 4  # The state's step counter, an int32 on every device.
  members_bytes = report.train.memory.arguments - _shared_argument_bytes(report) - step
  hparams_per_member = 3 * 4  # learning rate, weight decay, mask multiplier: float32 each.
  own = report.per_device * (report.state_per_member + hparams_per_member)
  if report.target.platform == "gpu":
    assert members_bytes == own
  else:  # XLA:TPU pads arrays to its tiles (the cube's 15 bits, the [17, 17] masks).
    assert own <= members_bytes <= 1.1 * own, (members_bytes, own)
  assert report.fits and report.need <= report.target.usable_memory


def test_the_tpu_report_has_xlas_counts_and_the_models_flops(tpu_report):
  """XLA:TPU counts FLOPs and bytes; the model's matmuls (traced) are beside them, and the
  roofline estimate is the larger of its two bounds."""
  r = tpu_report
  assert r.train.flops > 0 and r.train.bytes_accessed > 0 and r.train.fusions > 0
  chip = r.target.chip
  compute = r.model_flops * r.per_device / chip.peak_flops
  memory_bound = r.train.bytes_accessed / chip.bandwidth
  assert r.step_seconds == max(compute, memory_bound)
  text = aot.format_report(r)
  assert "not a measurement" in text and "fits" in text and "| training chunk (8 steps) |" in text


def test_the_gpu_report_names_what_a_deviceless_gpu_compile_cannot_know(gpu_report):
  assert gpu_report.train.flops is None  # XLA:GPU gives no cost analysis without the device.
  assert gpu_report.step_bytes[1] == "the step's kernels' operands and outputs"
  assert gpu_report.train.loop_kernels > 10 and gpu_report.train.loop_bytes > 0
  assert aot.GPU_NOTE in aot.format_report(gpu_report)


@pytest.mark.slow
def test_where_xla_says_the_gpu_program_differs_the_report_says_so():
  """One member over two epochs: its permutation is a sort, for which XLA logs that
  without the device it takes a fallback algorithm; the report passes that on."""
  _, (report,) = aot.compile_experiment(
      BOOLEAN, "h100:1", preset="tiny", evaluation=False,
      overrides=["seeds=1", "schemes=default", "epochs=2", "batch_size=32"])
  sort = aot.DEVICELESS_NOTES["Missing deviceless CUB scratch size data for sort"]
  assert report.notes == (sort,) and f"note: {sort}" in aot.format_report(report)


def _lowered_text(group, target_name: str | None) -> str:
  """The group's training chunk lowered for `target_name`'s devices (None: this CPU)."""
  if target_name is None:
    devices, platform = jax.devices()[:1], "cpu"
  else:
    target = targets.parse(target_name)
    devices, platform = targets.devices(target), target.platform
  mesh = jax.sharding.Mesh(np.array(devices), (engine.MEMBER_AXIS,))
  rows = engine.padded_size(len(group.members), mesh)
  state = aot.abstract_state(group, aot.member_params(group), rows, mesh)
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(engine.MEMBER_AXIS))
  hparams = aot._widened(engine.optim.stack_hparams([group.members[0].hparams]), rows, split,
                         None)
  chunk = engine.make_train_chunk(group, 2, platform=platform)
  return chunk.lower(state, hparams, aot.abstract_data(group, 2, rows, mesh)).as_text()


def test_programs_for_a_tpu_or_a_gpu_hold_no_cpu_only_path():
  """The attention's CPU products (their optimization barriers) are chosen by the platform
  a program is lowered for: the CPU's program has them, the TPU's and GPU's do not, though
  all three are lowered on this CPU."""
  _, config = config_lib.make_config(BOOLEAN, "tiny")
  group, = BOOLEAN.build_groups(config)
  assert "optimization_barrier" in _lowered_text(group, None)
  for target in ("v5e:2x2", "h100:1"):
    assert "optimization_barrier" not in _lowered_text(group, target), target


def test_compile_builds_the_groups_that_run_trains(tmp_path, monkeypatch):
  """`mpx compile` compiles `mpx run`'s own groups: the same names, members (traced values
  included), steps, batch and step variant, captured from a run as it starts training."""
  overrides = ["seeds=2", "learning_rate=1e-3,1e-2", "step_variant=unroll2"]
  trained = []

  class Captured(Exception):
    pass

  def capture(group, *args, **kwargs):
    trained.append(group)
    raise Captured

  monkeypatch.setattr(run_lib, "train_group", capture)
  with pytest.raises(Captured):
    run_lib.run_experiment(BOOLEAN, preset="tiny", overrides=overrides,
                           out_dir=str(tmp_path / "run"))
  compiled = []

  def capture_compiled(group, *args, **kwargs):
    compiled.append(group)
    raise Captured

  monkeypatch.setattr(aot, "compile_group", capture_compiled)
  with pytest.raises(Captured):
    aot.compile_experiment(BOOLEAN, "h100:1", preset="tiny", overrides=overrides)
  key = lambda g: (g.name, list(g.members), g.steps, g.batch_size, g.chunk_options)
  assert [key(g) for g in compiled] == [key(g) for g in trained]
  assert len(compiled[0].members) == 2 * 2 * 2  # 2 schemes × 2 seeds × 2 learning rates.


def test_a_group_that_does_not_fit_ends_with_one_line(gpu_report, monkeypatch, capsys):
  """An H100 given a small share of its memory (jax's XLA_PYTHON_CLIENT_MEM_FRACTION): exit
  2, one line with the need, the memory and the members per device that would fit, which
  is fewer than the 8 it holds."""
  monkeypatch.setattr(aot, "compile_experiment", lambda *args, **kwargs: ("tiny", [gpu_report]))
  fraction = gpu_report.need / gpu_report.target.chip.memory / 2
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", str(fraction))
  code = cli.main(["compile", "boolean_gotu", "--preset", "tiny", "--target", "h100:1"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == aot.DOES_NOT_FIT_EXIT_CODE
  assert len(err) == 1 and err[0].startswith("mpx compile: does not fit: group 2parity "), err
  fit = gpu_report.members_that_fit
  assert 0 < fit < 8 and f"≈ {fit} members per device would fit (now 8)" in err[0], err
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", str(fraction * 4))
  assert cli.main(["compile", "boolean_gotu", "--target", "h100:1"]) == 0


def test_a_tpu_program_too_large_for_hbm_is_refused_at_compile_time():
  """XLA:TPU refuses a program over the chip's HBM; the report keeps the need it names."""
  devices = targets.devices(targets.parse("v5e:1x1"))
  sharding = jax.sharding.SingleDeviceSharding(devices[0])
  big = jax.ShapeDtypeStruct((5 * 2**30,), jnp.float32, sharding=sharding)  # 20 GiB
  program = aot.compile_program("big", jax.jit(lambda x: x * 2).lower(big))
  assert program.memory is None and "HBM" in program.error
  assert program.needed >= 20 * 2**30


def test_unknown_targets_and_bad_shapes_name_the_known_ones():
  for bad in ("tpu9:2x2", "v5e", "v5e:four", "h100:12", "a100:8"):
    with pytest.raises(targets.UnknownTarget, match="known: v5e:2x2"):
      targets.parse(bad)
  assert targets.parse("H100:16").topology_name == "1x2x8"
  assert targets.parse("v4:2x2x2").devices == 8


def test_a_missing_compiler_names_the_extra(monkeypatch):
  monkeypatch.setattr(targets.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(targets.MissingPackage, match=r"mpx\[aot\]"):
    targets.devices.__wrapped__(targets.parse("v6e:2x2"))


@pytest.mark.slow
def test_two_processes_load_libtpu_at_once():
  """pytest workers (and launchers) compile for TPUs side by side: libtpu's lock file
  would refuse the second process without ALLOW_MULTIPLE_LIBTPU_LOAD."""
  code = ("from mpx.sweep import targets; "
          "print(len(targets.devices(targets.parse('v5e:2x2'))))")
  env = {k: v for k, v in os.environ.items() if k != "ALLOW_MULTIPLE_LIBTPU_LOAD"}
  procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
  assert [out.strip() for out, _ in outs] == ["4", "4"]


def test_the_command_buffer_variant_s_options_reach_the_gpu_compiler(monkeypatch):
  """`step_variant=graphs` only sets XLA:GPU options, which XLA applies after the HLO (the
  program text is plain's, `experiments/results/compile_gpu_variants.md`), and XLA:CPU
  ignores: a CPU run compares plain with itself. Compiled for an H100 here, the variant
  compiles, and the same option with a value XLA:GPU does not know is refused, so the
  option reaches the GPU compiler as given."""
  overrides = ["tasks=2parity", "seeds=1", "step_variant=graphs"]
  _, (report,) = aot.compile_experiment(BOOLEAN, "h100:1", preset="tiny",
                                        overrides=overrides, evaluation=False)
  assert report.train.error is None and report.train.fusions > 0
  monkeypatch.setitem(engine.STEP_VARIANTS, "graphs", engine.ChunkOptions(compiler_options=(
      ("xla_gpu_enable_command_buffer", "FUSION,NOT_A_COMMAND"),)))
  with pytest.raises(Exception, match="'NOT_A_COMMAND' is not a valid enum value"):
    aot.compile_experiment(BOOLEAN, "h100:1", preset="tiny", overrides=overrides,
                           evaluation=False)
