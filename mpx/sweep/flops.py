"""The model's FLOPs: every matmul of a training step, counted from its traced program.

XLA's own count (`Compiled.cost_analysis()`) depends on the backend: on GPUs it undercounts
the Boolean paper-scale step 2.5–5×, and a GPU compiled without the device gives none. The
count here is the step's `dot_general`s as jax traces them (forward and backward, before
any compiler), the same on every backend; achieved FLOP/s and the roofline estimate of
`mpx compile` divide by it.
"""

from __future__ import annotations

import math
from typing import Iterator

import jax


def _sub_jaxprs(equation) -> Iterator:
  """The jaxprs an equation calls (a scan's body, a pjit's, a custom rule's primal)."""
  for param in equation.params.values():
    for sub in (param if isinstance(param, (tuple, list)) else (param,)):
      inner = getattr(sub, "jaxpr", sub)
      if hasattr(inner, "eqns"):
        yield inner


def matmul_flops(jaxpr) -> int:
  """2 × output size × contracted size of every `dot_general` of `jaxpr` and the jaxprs it
  calls: a scan's body × its length, a cond's costliest branch (one runs; the attention's
  per-platform products are such branches), a while loop's body once."""
  total = 0
  for e in jaxpr.eqns:
    if e.primitive.name == "dot_general":
      (contracting, _), _ = e.params["dimension_numbers"]
      lhs = e.invars[0].aval.shape
      total += 2 * math.prod(e.outvars[0].aval.shape) * math.prod(lhs[i] for i in contracting)
    elif e.primitive.name == "cond":
      total += max(matmul_flops(branch.jaxpr) for branch in e.params["branches"])
    else:
      repeats = e.params.get("length", 1) if e.primitive.name == "scan" else 1
      total += repeats * sum(matmul_flops(sub) for sub in _sub_jaxprs(e))
  return total


def step_flops(loss, params, batch) -> int:
  """Matmul FLOPs of one training step of one member: value and gradient of
  `loss(params, batch, key)`, traced on shapes (`params`, `batch` may be
  `jax.ShapeDtypeStruct`s; nothing runs)."""
  grad = jax.value_and_grad(lambda p, b: loss(p, b, jax.random.key(0))[0])
  return matmul_flops(jax.make_jaxpr(grad)(params, batch).jaxpr)


def transformer_matmul_flops(config, n_tokens: int, out_features: int = 1) -> float:
  """Matmul FLOPs of one training step of one member of the GOTU TokenTransformer
  (`mpx.nn.transformer`, the Boolean experiments' model), forward and backward, in closed
  form: equal to `step_flops` of the Boolean loss (a test checks), and what the
  benchmarks' achieved FLOP/s divides by.

  Per example of N tokens (CLS included), width D, L layers of H heads of R dims (HR =
  H·R) and an MLP of M: each layer's q, k, v and output projections 2·N·4·D·HR, its MLP
  2·N·2·D·M, its attention logits and weighted sum 2·2·H·N²·R; the readout 2·D on the CLS
  token. Embeddings are gathers, LayerNorm, softmax, the prior and the optimizer are
  elementwise: no matmul. The backward pass runs two matmuls of each forward one's size
  (the input's gradient and the weight's; q, k and p, v for attention), so a step is
  3× the forward pass: 6·P·N·B for the dense weights P plus attention's 12·L·H·N²·R·B.
  `config` needs width, depth, num_heads, head_dim, mlp_dim and batch_size."""
  d, heads = config.width, config.num_heads * config.head_dim
  per_layer = (2 * n_tokens * (4 * d * heads + 2 * d * config.mlp_dim)
               + 4 * config.num_heads * n_tokens ** 2 * config.head_dim)
  forward = config.depth * per_layer + 2 * d * out_features
  return 3.0 * forward * config.batch_size
