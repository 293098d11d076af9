"""Initialisers that reproduce PyTorch's defaults, because the paper's baseline model is
the GOTU code's PyTorch TokenTransformer and its extrapolation depends on init scales."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

# nn.Linear: kaiming_uniform(a=√5) = U(±1/√fan_in). Flax DenseGeneral computes fan_in from
# the flattened kernel, so this is right for [D, H, R] and [H, R, D] kernels too.
torch_linear_kernel = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")

# nn.Embedding and the GOTU code's position embedding and CLS token: N(0, 1).
torch_embedding = nn.initializers.normal(stddev=1.0)


def torch_linear_bias(fan_in: int):
  """nn.Linear's bias init U(±1/√fan_in); a bias init does not see fan_in, so bind it."""
  bound = 1.0 / float(fan_in) ** 0.5

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -bound, bound)

  return init


def dense_inits(init_style: str, fan_in: int) -> dict:
  """Kernel and bias initializers for a Dense layer: "torch" (nn.Linear) or "flax"."""
  if init_style == "torch":
    return dict(kernel_init=torch_linear_kernel, bias_init=torch_linear_bias(fan_in))
  if init_style == "flax":
    return dict(kernel_init=nn.initializers.lecun_normal(), bias_init=nn.initializers.zeros)
  raise ValueError(f"init_style={init_style!r}; choose 'torch' or 'flax'.")
