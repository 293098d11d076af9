"""mpx's TokenTransformer against the GOTU PyTorch model it reproduces, weight for weight.

Both run in float32: the same weights and ±1 inputs must give the same outputs to 1e-5,
with the neutral prior and with a learned-looking one (the torch model adds
`log σ(M)` per layer and head, as mpx does).
"""

import pathlib
import sys

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpx import nn as mpx_nn
from mpx.tasks import boolean

torch = pytest.importorskip(
    "torch", reason="compares against PyTorch: pip install torch==2.13.0 (the `bench` "
    "extra of setup.cfg: pip install -e .[bench])")

ROOT = pathlib.Path(__file__).resolve().parents[1]
WIDTH, DEPTH, HEADS, HEAD_DIM, MLP = 32, 2, 2, 16, 32


sys.path.insert(0, str(ROOT / "benchmarks"))  # benchmarks/ is not a package.
import torch_reference as REF  # noqa: E402
N_TOKENS = REF.N_TOKENS  # 15 bits + CLS.


def _mpx_model(implementation="reference"):
  return mpx_nn.TokenTransformer(width=WIDTH, depth=DEPTH, num_heads=HEADS,
                                 head_dim=HEAD_DIM, mlp_dim=MLP, init_style="torch",
                                 implementation=implementation)


def _torch_model():
  scale = REF.Scale(width=WIDTH, depth=DEPTH, num_heads=HEADS, head_dim=HEAD_DIM,
                    mlp_dim=MLP, learning_rate=1e-3)
  return REF.TokenTransformer(scale).eval()


def _pm1_inputs(seed=0, batch=64):
  return np.random.default_rng(seed).choice([-1.0, 1.0], (batch, REF.N_BITS))


def torch_state_dict(params) -> dict:
  """mpx params as the torch model's state dict.

  Layouts: Flax Dense kernels are [in, out] and torch Linear weights [out, in];
  query/key/value kernels [D, H, R] stack into the fused qkv weight [3·H·R, D] (torch
  views its output as [3, H, R]); the out kernel [H, R, D] is [H·R, D] transposed.
  Raises if an mpx param is left over, so a new param cannot go untested.
  """
  flat = {"/".join(path): np.asarray(leaf)
          for path, leaf in flax.traverse_util.flatten_dict(params["params"]).items()}
  as_torch = lambda array: torch.from_numpy(np.array(array))  # Writable copy.
  take = lambda name: as_torch(flat.pop(name))
  linear_weight = lambda name: as_torch(flat.pop(name).T)

  state = {"token_embed.weight": take("token_embed/embedding"), "cls": take("cls"),
           "pos_embed": take("pos_embed")}
  for i in range(DEPTH):
    ours, theirs = f"block_{i}/", f"blocks.{i}."
    for norm in ("attention_norm", "mlp_norm"):
      state[f"{theirs}{norm}.weight"] = take(f"{ours}{norm}/scale")
      state[f"{theirs}{norm}.bias"] = take(f"{ours}{norm}/bias")
    qkv_DHR = [flat.pop(f"{ours}attention/{name}/kernel") for name in ("query", "key", "value")]
    state[f"{theirs}attention.qkv.weight"] = as_torch(
        np.concatenate([w.reshape(WIDTH, -1) for w in qkv_DHR], axis=1).T)
    out_HRD = flat.pop(f"{ours}attention/out/kernel")
    state[f"{theirs}attention.out.weight"] = as_torch(out_HRD.reshape(-1, WIDTH).T)
    state[f"{theirs}attention.out.bias"] = take(f"{ours}attention/out/bias")
    state[f"{theirs}attention.mask_logits"] = take(f"{ours}attention/mask_logits")
    for index, fc in ((0, "fc1"), (2, "fc2")):  # nn.Sequential(Linear, GELU, Linear).
      state[f"{theirs}mlp.{index}.weight"] = linear_weight(f"{ours}mlp/{fc}/kernel")
      state[f"{theirs}mlp.{index}.bias"] = take(f"{ours}mlp/{fc}/bias")
  state["final_norm.weight"] = take("final_norm/scale")
  state["final_norm.bias"] = take("final_norm/bias")
  state["head.weight"] = linear_weight("head/kernel")
  state["head.bias"] = take("head/bias")
  assert not flat, f"mpx params with no torch counterpart: {sorted(flat)}"
  return state


def _perturbed(params, seed, mask_scale=None):
  """Every weight moved off its init by N(0, 0.2²), so LayerNorm's ones and zeros (the
  same init in both frameworks) and square kernels must be transplanted to match; with
  `mask_scale`, every `mask_logits` becomes N(0, mask_scale²) draws (a non-neutral prior),
  else the masks stay neutral."""
  flat = flax.traverse_util.flatten_dict(params)
  keys = iter(jax.random.split(jax.random.key(seed), len(flat)))

  def move(path, leaf):
    noise = jax.random.normal(next(keys), leaf.shape)
    if path[-1] != "mask_logits":
      return leaf + 0.2 * noise
    return leaf if mask_scale is None else mask_scale * noise

  return flax.traverse_util.unflatten_dict({p: move(p, x) for p, x in flat.items()})


def _outputs(params, x_BN, implementation="reference"):
  """(mpx, torch) outputs `[B]` as float32 numpy arrays for the same weights and inputs."""
  ours = _mpx_model(implementation).apply(params, boolean.tokens(x_BN))[:, 0]
  model = _torch_model()
  model.load_state_dict(torch_state_dict(params))  # strict: every torch param is set.
  with torch.no_grad():
    theirs = model(torch.from_numpy(x_BN.astype(np.float32))).numpy()
  return np.asarray(ours), theirs


def _init(seed=0):
  return _mpx_model().init(jax.random.key(seed), jnp.zeros((1, REF.N_BITS), jnp.int32))


@pytest.mark.parametrize("implementation", ["reference", "jax"])
def test_neutral_prior_matches_torch(implementation):
  x_BN = _pm1_inputs()
  ours, theirs = _outputs(_perturbed(_init(), 1), x_BN, implementation)
  assert ours.shape == theirs.shape == (len(x_BN),)
  assert np.std(ours) > 0.1  # Outputs vary with the input, so 1e-5 is a real check.
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("implementation", ["reference", "jax"])
def test_random_prior_matches_torch(implementation):
  params = _perturbed(_init(2), 3, mask_scale=3.0)
  assert params["params"]["block_0"]["attention"]["mask_logits"].shape == (
      HEADS, N_TOKENS, N_TOKENS)
  x_BN = _pm1_inputs(4)
  ours, theirs = _outputs(params, x_BN, implementation)
  neutral, _ = _outputs(_perturbed(_init(2), 3), x_BN)
  assert np.max(np.abs(ours - neutral)) > 0.1  # The prior moves the output.
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)
