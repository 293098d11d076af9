"""Accelerators `mpx compile` compiles for without one: TPU topologies and GPU models.

A target is named as a user names the machine: a TPU topology (`v5e:2x2`, `v4:2x2x2`,
`v5p:2x2x1`, `v6e:4x4`) or a GPU model and count (`h100:8`, `h200:16`). XLA compiles for it
through jax's deviceless topologies (`jax.experimental.topologies`): libtpu for TPUs, the
CUDA PJRT plugin with a shipped target description for GPUs (the `aot` install extra).

The chips' published figures live in `CHIPS`, each with its source; they feed the fit
check and the roofline estimate, never a measured time.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.resources
import math
import os
import re

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip's published figures.

  memory: bytes of device memory a program may use (GPU: jax's default share of it, see
    `usable_memory`); peak_flops: dense FLOP/s of the matmuls a float32 program runs at
    jax's default precision (TPU: bfloat16 passes; GPU: TF32 tensor cores); peak_flops_bf16:
    dense bfloat16 FLOP/s; bandwidth: device memory bytes/s.
  """
  name: str
  platform: str  # jax's platform name: "tpu" or "gpu"
  memory: int
  peak_flops: float
  peak_flops_bf16: float
  bandwidth: float
  source: str
  topology: tuple = ()  # get_topology_desc's options, (name, value) pairs
  gpu_spec: str | None = None  # the XLA target description shipped in mpx/sweep/gpu_specs/


# v4 and v5p count a "megacore" (two TensorCores) as one device, as their pods do;
# without these options a v4:2x2x2 topology has 16 devices, not 8.
_MEGACORE = (("chip_config_name", "megacore"), ("chips_per_host_bounds", (2, 2, 1)),
             ("num_slices", 1))
CHIPS = {
    "v4": Chip("TPU v4", "tpu", 32 * GIB, 275e12, 275e12, 1228e9,
               "cloud.google.com/tpu/docs/v4 (32 GiB HBM2, 275 TFLOP/s bf16, 1,228 GB/s)",
               topology=_MEGACORE),
    "v5e": Chip("TPU v5e", "tpu", 16 * GIB, 197e12, 197e12, 819e9,
                "cloud.google.com/tpu/docs/v5e (16 GiB HBM2, 197 TFLOP/s bf16, 819 GB/s)"),
    "v5p": Chip("TPU v5p", "tpu", 95 * GIB, 459e12, 459e12, 2765e9,
                "cloud.google.com/tpu/docs/v5p (95 GiB HBM2e, 459 TFLOP/s bf16, 2,765 GB/s)",
                topology=_MEGACORE),
    "v6e": Chip("TPU v6e", "tpu", 32 * GIB, 918e12, 918e12, 1640e9,
                "cloud.google.com/tpu/docs/v6e (32 GiB HBM, 918 TFLOP/s bf16, 1,640 GB/s)"),
    "h100": Chip("NVIDIA H100 SXM 80GB", "gpu", 84_929_347_584, 494.7e12, 989.4e12, 3.35e12,
                 "NVIDIA H100 datasheet (SXM: TF32 989 / bf16 1,979 TFLOP/s with sparsity, "
                 "half that dense; 3.35 TB/s); memory: XLA's h100_sxm target description",
                 gpu_spec="h100_sxm.txtpb"),
    "h200": Chip("NVIDIA H200 SXM 141GB", "gpu", 150_754_820_096, 494.7e12, 989.4e12, 4.8e12,
                 "NVIDIA H200 datasheet (SXM: the H100's compute, 141 GB HBM3e, 4.8 TB/s); "
                 "memory as a device reports it (experiments/results/accelerator_check_h200.md)",
                 gpu_spec="h200_sxm.txtpb"),
}
GPUS_PER_HOST = 8
EXAMPLES = ("v5e:2x2", "v5e:4x4", "v4:2x2x2", "v5p:2x2x1", "v6e:2x2", "h100:8", "h200:8")
# jax's default share of a GPU's memory (XLA_PYTHON_CLIENT_MEM_FRACTION): it preallocates
# this much and every buffer comes from it.
GPU_MEMORY_FRACTION = 0.75


@dataclasses.dataclass(frozen=True)
class Target:
  """A named machine: its chip, its device count and jax's topology name."""
  name: str
  chip: Chip
  devices: int
  topology_name: str  # TPU: "v5e:2x2"; GPU: slices x hosts x devices per host, "1x1x8"
  topology_options: tuple = ()  # TPU: get_topology_desc's options, (name, value) pairs

  @property
  def platform(self) -> str:
    return self.chip.platform

  @property
  def usable_memory(self) -> int:
    """Bytes one device gives a program: a TPU's HBM; a GPU's memory × jax's
    preallocated share (`XLA_PYTHON_CLIENT_MEM_FRACTION`, default 0.75)."""
    if self.platform != "gpu":
      return self.chip.memory
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", GPU_MEMORY_FRACTION))
    return int(self.chip.memory * fraction)


class UnknownTarget(ValueError):
  pass


# Cloud TPU accelerator types (`gcloud ... --accelerator-type`): the chip of each prefix,
# and whether its number counts TensorCores (two per chip) or chips.
ACCELERATOR_TYPES = {"v4": ("v4", 2), "v5p": ("v5p", 2), "v5litepod": ("v5e", 1),
                     "v5e": ("v5e", 1), "v6e": ("v6e", 1)}


def _pod_topology(chip_name: str, chips: int) -> str:
  """The topology of a slice of `chips` chips as Cloud TPU shapes it: 2-D for v5e and
  v6e (4 → 2x2, 8 → 2x4, 16 → 4x4), 3-D for v4 and v5p (4 → 2x2x1, 8 → 2x2x2, 16 →
  2x2x4); each doubling goes to the last of the smallest dimensions."""
  three_d = dict(CHIPS[chip_name].topology).get("chip_config_name") == "megacore"
  dims = [2, 2, 1] if three_d and chips >= 4 else [1, 1, 1] if three_d else [1, 1]
  while math.prod(dims) < chips:
    smallest = min(dims)
    last = len(dims) - 1 - dims[::-1].index(smallest)
    dims[last] *= 2
  return "x".join(map(str, dims))


def parse(name: str) -> Target:
  """The target a user names: `CHIP:AxB[xC]` for a TPU topology (or a Cloud TPU
  accelerator type, `v4-32`, `v5litepod-16`), `GPU:COUNT` for GPUs."""
  known = f"known: {', '.join(EXAMPLES)} (TPU chips {', '.join(_chips('tpu'))} with any " \
          f"topology, or accelerator types such as v4-32, v5litepod-16; GPUs " \
          f"{', '.join(_chips('gpu'))} with a count)"
  pod = re.fullmatch(r"([a-z0-9]+)-(\d+)", str(name).strip().lower())
  if pod and pod.group(1) in ACCELERATOR_TYPES:
    chip_name, per_chip = ACCELERATOR_TYPES[pod.group(1)]
    chips = int(pod.group(2)) // per_chip
    if chips < 1 or chips & (chips - 1):
      raise UnknownTarget(f"accelerator type {name!r}: {chips} chips is no slice shape; "
                          f"{known}.")
    return parse(f"{chip_name}:{_pod_topology(chip_name, chips)}")
  chip_name, _, shape = str(name).strip().lower().partition(":")
  chip = CHIPS.get(chip_name)
  if chip is None or not shape:
    raise UnknownTarget(f"unknown target {name!r}; {known}.")
  if chip.platform == "tpu":
    if not re.fullmatch(r"\d+(x\d+){1,2}", shape):
      raise UnknownTarget(f"target {name!r}: a TPU topology is CHIP:AxB or CHIP:AxBxC "
                          f"(e.g. {chip_name}:2x2); {known}.")
    dims = [int(d) for d in shape.split("x")]
    # A host holds a 2x2 block of chips; a smaller topology is one host of its own shape.
    bounds = tuple(min(d, b) for d, b in zip(dims + [1] * (3 - len(dims)), (2, 2, 1)))
    options = dict(chip.topology) | {"chips_per_host_bounds": bounds}
    return Target(f"{chip_name}:{shape}", chip, math.prod(dims), f"{chip_name}:{shape}",
                  tuple(options.items()))
  if not shape.isdigit() or int(shape) < 1:
    raise UnknownTarget(f"target {name!r}: GPUs are named MODEL:COUNT (e.g. "
                        f"{chip_name}:8); {known}.")
  count = int(shape)
  if count > GPUS_PER_HOST and count % GPUS_PER_HOST:
    raise UnknownTarget(f"target {name!r}: more than {GPUS_PER_HOST} GPUs come in hosts of "
                        f"{GPUS_PER_HOST}: give a multiple of {GPUS_PER_HOST}; {known}.")
  hosts, per_host = (1, count) if count <= GPUS_PER_HOST else (count // GPUS_PER_HOST,
                                                               GPUS_PER_HOST)
  return Target(f"{chip_name}:{count}", chip, count, f"1x{hosts}x{per_host}")


def _chips(platform: str) -> list[str]:
  return [name for name, chip in CHIPS.items() if chip.platform == platform]


class MissingPackage(ImportError):
  pass


# The install that brings the compilers: libtpu and the CUDA PJRT plugin, at jax's version.
INSTALL = 'pip install "mpx[aot]"  (or: pip install "jax[tpu,cuda13-local]")'


def gpu_spec(chip: Chip) -> str:
  """The XLA target description of a GPU chip, shipped with mpx."""
  return (importlib.resources.files("mpx.sweep") / "gpu_specs" / chip.gpu_spec).read_text()


@functools.lru_cache(maxsize=None)
def devices(target: Target) -> tuple:
  """The target's devices as jax's deviceless topology describes them (no hardware)."""
  from jax.experimental import topologies
  try:
    if target.platform == "tpu":
      _check_installed("libtpu", "TPU")
      # Deviceless, several processes may load libtpu at once (test workers, launchers).
      os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
      topology = topologies.get_topology_desc(topology_name=target.topology_name,
                                              platform="tpu", **dict(target.topology_options))
    else:
      _check_installed(("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12"), "GPU")
      topology = topologies.get_topology_desc(platform="cuda",
                                              target_config=gpu_spec(target.chip),
                                              topology=target.topology_name)
  except NotImplementedError as e:  # The plugin did not register (CUDA's version check).
    raise MissingPackage(
        f"jax could not load its CUDA compiler for {target.name} ({e}); run mpx compile with "
        "JAX_PLATFORMS=cpu (it sets it when unset), or reinstall: " + INSTALL) from e
  found = tuple(topology.devices)
  if len(found) != target.devices:
    raise UnknownTarget(f"target {target.name}: jax's topology has {len(found)} devices, "
                        f"not {target.devices}; name the topology as its pod does.")
  return found


def _check_installed(modules: str | tuple[str, ...], kind: str) -> None:
  """Raises naming the install where none of `modules` (alternatives) is installed."""
  import importlib.util
  modules = (modules,) if isinstance(modules, str) else modules
  if all(importlib.util.find_spec(m) is None for m in modules):
    raise MissingPackage(f"compiling for a {kind} target needs {modules[0].split('.')[-1]}, "
                         f"which is not installed: {INSTALL}")
