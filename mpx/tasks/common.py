"""Config fields every mask-prior experiment on a transformer shares, declared once."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from mpx import schemes as schemes_lib
from mpx.schemes import QK_POS_SCALE
from mpx.sweep import engine
from mpx.sweep.config import SweepConfig


@dataclasses.dataclass(frozen=True)
class PriorConfig(SweepConfig):
  """The model's shape, the init schemes and their prior, the batch and the probe.

  Defaults are the GOTU model's; an experiment redeclares the ones it changes.
    width / depth / num_heads / head_dim / mlp_dim: the transformer's shape.
    batch_size: examples per training step of each member.
    schemes: init schemes (`mpx.schemes.SCHEMES`), one member per scheme and seed.
    mask_strength: the prior's ±a; mask_lr_multiplier: the mask's learning-rate factor
      (mask members only; the others' neutral mask is frozen).
    mask_layers: the layers with a mask leaf (None = all); per_head_mask: one prior per
      head (else one shared by the heads).
    qk_opt_steps / qk_pos_scale: QK-Opt's iterations and the position-embedding scale
      both QK schemes use (the recipe's ×18).
    probe_size: examples the persistence diagnostics run on.
    members_per_call: None vmaps a group's members at once (a traced sweep on one CPU
      device: slices of one value's members, faster there); m maps them in slices of m
      (the engine's memory valve: same results, less memory, for models too large to
      vmap every member).
    step_variant: how the training chunk is compiled, a name of
      `mpx.sweep.engine.STEP_VARIANTS` ("plain"; "unroll2" / "unroll4": the chunk's scan
      unrolled; "graphs": XLA:GPU command buffers that take in the scan's loop) or "auto":
      the engine's GPU default (`GPU_STEP_VARIANT`) on a GPU, "plain" elsewhere. Each
      computes what "plain" does (docs/performance.md).
  weight_decay: the optimizer's decay of every param but the masks (a traced value).
  """
  SCHEME_NAMES: ClassVar[tuple[str, ...]] = schemes_lib.SCHEMES  # A family's valid schemes.
  schemes: tuple[str, ...] = ("default", "qk_svd", "qk_opt", "mask")
  width: int = 256
  depth: int = 12
  num_heads: int = 6
  head_dim: int = 64
  mlp_dim: int = 256
  per_head_mask: bool = True
  mask_layers: tuple[int, ...] | None = None
  batch_size: int = 256
  weight_decay: float = 1e-3
  mask_strength: float = 4.0
  mask_lr_multiplier: float = 1.0
  qk_opt_steps: int = 10_000
  qk_pos_scale: float = QK_POS_SCALE
  probe_size: int = 128
  members_per_call: int | None = None
  step_variant: str = "auto"

  def __post_init__(self):
    super().__post_init__()
    bad = [s for s in self.schemes if s not in self.SCHEME_NAMES]
    if bad or not self.schemes:
      raise ValueError(f"unknown schemes {bad or '()'}; choose from {self.SCHEME_NAMES}.")
    if self.members_per_call is not None and self.members_per_call < 1:
      raise ValueError(f"members_per_call={self.members_per_call} must be >= 1 (or none "
                       "to vmap every member at once).")
    engine.chunk_options(self.step_variant)  # Raises naming the variants.
    for name in ("width", "depth", "num_heads", "head_dim", "mlp_dim", "batch_size"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)} must be >= 1.")
    # Checked here, not where a scheme first uses them, so the message names the key.
    if not (math.isfinite(self.mask_strength) and self.mask_strength > 0):
      raise ValueError(f"mask_strength={self.mask_strength} must be a finite number > 0 "
                       "(the prior's ±a).")
    for name in ("weight_decay", "mask_lr_multiplier"):
      if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
        raise ValueError(f"{name}={getattr(self, name)} must be a finite number >= 0.")
    outside = [i for i in self.mask_layers or () if not 0 <= i < self.depth]
    if outside:
      raise ValueError(f"mask_layers {outside} are not layers of a depth-{self.depth} "
                       f"model; choose from 0..{self.depth - 1} (or none for all).")

  @property
  def masked_layers(self) -> tuple[int, ...]:
    """The layers that carry a mask (`mask_layers`, None = every layer)."""
    return tuple(range(self.depth)) if self.mask_layers is None else tuple(self.mask_layers)

  def model_shape(self) -> dict:
    """The model's shape and mask placement as every family's model takes them, so the
    fields are passed on in one place."""
    return dict(width=self.width, depth=self.depth, num_heads=self.num_heads,
                head_dim=self.head_dim, mlp_dim=self.mlp_dim, mask_layers=self.mask_layers,
                per_head_mask=self.per_head_mask)


def scheme_labels(schemes, designs, default_design: str) -> list[tuple[str, str | None]]:
  """(label, design) per scheme: "mask" expands to `mask:<design>` per design; with only
  the family's default design the label stays "mask" (the paper's table keys)."""
  labels = []
  for scheme in schemes:
    if scheme != "mask":
      labels.append((scheme, None))
    elif tuple(designs) == (default_design,):
      labels.append(("mask", default_design))
    else:
      labels.extend((f"mask:{d}", d) for d in designs)
  return labels
