"""The PyTorch baseline a user would otherwise run: the GOTU TokenTransformer, seed after seed.

    python benchmarks/torch_reference.py --scale paper --steps 8 --seeds 2
    python benchmarks/torch_reference.py --scale quick --check     # also: a step lowers the loss

Same architecture and param count as `mpx.nn.TokenTransformer` as the Boolean GOTU
experiment builds it (`benchmarks/run.py` asserts the count): token Embed(2, D) of
(x + 1) / 2, learned CLS and absolute position embedding, pre-LN blocks with a fused qkv
projection without bias (as the GOTU code's vit-pytorch-style Attention), an additive
`log σ(M)` bias per layer and head held as an `nn.Parameter` (the work mpx's mask scheme
does), MLP D → mlp → D with exact GELU, readout LayerNorm(CLS) → Linear(1). PyTorch
defaults everywhere (N(0, 1) embeddings). Adam with coupled L2 (`weight_decay`), the mask
excluded from decay as in mpx; MSE on 2Parity with the epoch protocol, batch 256.
torch is an optional dependency: `pip install -e .[bench]`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

N_BITS = 15
N_TOKENS = N_BITS + 1


@dataclasses.dataclass(frozen=True)
class Scale:
  """Model and optimizer settings; mirror the `boolean_gotu` presets of the same name."""
  width: int
  depth: int
  num_heads: int
  head_dim: int
  mlp_dim: int
  learning_rate: float
  weight_decay: float = 1e-3
  batch_size: int = 256
  mask_strength: float = 4.0


SCALES = {
    "quick": Scale(width=32, depth=2, num_heads=2, head_dim=16, mlp_dim=32,
                   learning_rate=1e-3),
    "paper": Scale(width=256, depth=12, num_heads=6, head_dim=64, mlp_dim=256,
                   learning_rate=1e-5),
}


def num_threads() -> int:
  """The cores this process may run on (taskset / cgroup affinity), not the machine's."""
  return len(os.sched_getaffinity(0))


def clique_prior(num_heads: int, strength: float) -> torch.Tensor:
  """`[H, N, N]` mask logits of 2Parity's clique prior (`mpx.priors.parity_prior`):
  CLS, x0, x1 read each other, every token reads itself, all else is suppressed."""
  allowed = torch.eye(N_TOKENS, dtype=torch.bool)
  allowed[:3, :3] = True
  logits = torch.where(allowed, strength, -strength)
  return logits.expand(num_heads, N_TOKENS, N_TOKENS).clone()


class Attention(nn.Module):
  """Softmax(q·kᵀ/√R + log σ(M)) v with M a learned `[H, N, N]` parameter."""

  def __init__(self, width: int, num_heads: int, head_dim: int, mask: torch.Tensor):
    super().__init__()
    self.num_heads, self.head_dim = num_heads, head_dim
    self.qkv = nn.Linear(width, 3 * num_heads * head_dim, bias=False)
    self.out = nn.Linear(num_heads * head_dim, width)
    self.mask_logits = nn.Parameter(mask.clone())

  def forward(self, x_BND):
    b, n, _ = x_BND.shape
    qkv = self.qkv(x_BND).view(b, n, 3, self.num_heads, self.head_dim)
    q_BHNR, k_BHNR, v_BHNR = qkv.permute(2, 0, 3, 1, 4)
    logits = q_BHNR @ k_BHNR.transpose(-1, -2) * self.head_dim ** -0.5
    weights = (logits + F.logsigmoid(self.mask_logits)).softmax(dim=-1)
    out_BNC = (weights @ v_BHNR).transpose(1, 2).reshape(b, n, -1)
    return self.out(out_BNC)


class Block(nn.Module):
  """Pre-LN: x + Attn(LN(x)), then x + MLP(LN(x))."""

  def __init__(self, scale: Scale, mask: torch.Tensor):
    super().__init__()
    self.attention_norm = nn.LayerNorm(scale.width)
    self.attention = Attention(scale.width, scale.num_heads, scale.head_dim, mask)
    self.mlp_norm = nn.LayerNorm(scale.width)
    self.mlp = nn.Sequential(nn.Linear(scale.width, scale.mlp_dim), nn.GELU(),
                             nn.Linear(scale.mlp_dim, scale.width))

  def forward(self, x_BND):
    x_BND = x_BND + self.attention(self.attention_norm(x_BND))
    return x_BND + self.mlp(self.mlp_norm(x_BND))


class TokenTransformer(nn.Module):
  """±1 inputs `[B, 15]` → `[B]`: the GOTU model with a mask prior in every layer."""

  def __init__(self, scale: Scale):
    super().__init__()
    mask = clique_prior(scale.num_heads, scale.mask_strength)
    self.token_embed = nn.Embedding(2, scale.width)
    self.cls = nn.Parameter(torch.randn(1, 1, scale.width))
    self.pos_embed = nn.Parameter(torch.randn(N_TOKENS, scale.width))
    self.blocks = nn.Sequential(*[Block(scale, mask) for _ in range(scale.depth)])
    self.final_norm = nn.LayerNorm(scale.width)
    self.head = nn.Linear(scale.width, 1)

  def forward(self, x_BN):
    x_BND = self.token_embed(((x_BN + 1) / 2).long())
    cls = self.cls.expand(x_BND.shape[0], -1, -1)
    x_BND = torch.cat([cls, x_BND], dim=1) + self.pos_embed
    x_BND = self.final_norm(self.blocks(x_BND))
    return self.head(x_BND[:, 0])[:, 0]


def num_params(model: nn.Module) -> int:
  return sum(p.numel() for p in model.parameters())


def make_optimizer(model: nn.Module, scale: Scale) -> torch.optim.Adam:
  """Adam with coupled L2 (the GOTU code's optimizer); the mask is not decayed (as mpx)."""
  masks = [p for name, p in model.named_parameters() if name.endswith("mask_logits")]
  others = [p for name, p in model.named_parameters() if not name.endswith("mask_logits")]
  return torch.optim.Adam([{"params": others, "weight_decay": scale.weight_decay},
                           {"params": masks, "weight_decay": 0.0}], lr=scale.learning_rate)


def parity_data() -> tuple[torch.Tensor, torch.Tensor]:
  """2Parity's training set: every x ∈ {±1}^15 with x0 = 1 or x1 = 1, y = x0·x1."""
  codes = torch.arange(2 ** N_BITS)
  x = ((codes[:, None] >> torch.arange(N_BITS)) & 1).float() * 2 - 1
  x = x[(x[:, 0] > 0) | (x[:, 1] > 0)]
  return x, x[:, 0] * x[:, 1]


def train_member(scale: Scale, seed: int, steps: int, data, warmup: int = 1) -> float:
  """Trains one member for `warmup + steps` steps; returns the seconds of the last `steps`
  (the warm-up step allocates buffers, as mpx's timings exclude compilation)."""
  torch.manual_seed(seed)
  model = TokenTransformer(scale)
  optimizer = make_optimizer(model, scale)
  x, y = data
  per_epoch = len(x) // scale.batch_size
  generator = torch.Generator().manual_seed(seed)
  start = time.perf_counter()
  for step in range(warmup + steps):
    if step == warmup:
      start = time.perf_counter()
    if step % per_epoch == 0:
      order = torch.randperm(len(x), generator=generator)
    idx = order[(step % per_epoch) * scale.batch_size:][:scale.batch_size]
    loss = F.mse_loss(model(x[idx]), y[idx])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
  return time.perf_counter() - start


def _as_scale(scale: str | Scale) -> Scale:
  return SCALES[scale] if isinstance(scale, str) else scale


def member_steps_per_second(scale: str | Scale, steps: int, seeds: int) -> float:
  """Member-steps/s training `seeds` members one after another, `steps` timed steps each."""
  torch.set_num_threads(num_threads())
  scale, data = _as_scale(scale), parity_data()
  seconds = sum(train_member(scale, seed, steps, data) for seed in range(seeds))
  return seeds * steps / seconds


def matmul_gflops(n: int, repeats: int = 3) -> float:
  """GFLOP/s of a float32 n³ `torch.mm`, best of `repeats`: torch's own matmul rate, which
  can exceed XLA's on the same CPU (a different GEMM library)."""
  torch.set_num_threads(num_threads())
  a, b = torch.randn(n, n), torch.randn(n, n)
  torch.mm(a, b)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    torch.mm(a, b)
    best = min(best, time.perf_counter() - start)
  return 2 * n ** 3 / best / 1e9


def loss_decreases(scale: str | Scale, steps: int = 3, seed: int = 0) -> tuple[float, float]:
  """(loss before, loss after) `steps` updates on one fixed batch: a training smoke test."""
  scale = _as_scale(scale)
  torch.manual_seed(seed)
  model = TokenTransformer(scale)
  optimizer = make_optimizer(model, scale)
  x, y = parity_data()
  idx = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
  x, y = x[idx[:scale.batch_size]], y[idx[:scale.batch_size]]
  losses = []
  for _ in range(steps + 1):
    loss = F.mse_loss(model(x), y)
    losses.append(loss.item())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
  return losses[0], losses[-1]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--scale", choices=SCALES, default="quick")
  parser.add_argument("--steps", type=int, default=16, help="timed steps per member")
  parser.add_argument("--seeds", type=int, default=2, help="members, one after another")
  parser.add_argument("--check", action="store_true", help="also check a step lowers the loss")
  args = parser.parse_args(argv)
  scale = SCALES[args.scale]
  print(f"# torch {torch.__version__}, {num_threads()} thread(s), {args.scale} scale, "
        f"{num_params(TokenTransformer(scale)):,} params")
  if args.check:
    before, after = loss_decreases(scale)
    print(f"loss on one batch: {before:.4f} -> {after:.4f}")
    assert after < before, "a training step did not lower the loss"
  rate = member_steps_per_second(scale, args.steps, args.seeds)
  print(f"{rate:.3f} member-steps/s ({args.seeds} members x {args.steps} steps)")


if __name__ == "__main__":
  main()
