"""Boolean GOTU: 2Parity, 3-bit Majority, Cyclic3 × {default, QK-SVD, QK-Opt, mask}.

    mpx run boolean_gotu --preset quick      # 3 tasks × 4 schemes × 2 seeds, a few minutes on 2 CPU cores
    mpx run boolean_gotu --preset paper      # the GOTU model and protocol, 10 seeds (GPU)
    mpx run boolean_gotu --preset paper --set compute_dtype=bfloat16 --set attention=cudnn
                                             # GPU: bf16 matmuls, fused attention (untested on GPU)
    mpx run boolean_gotu --preset cpu        # 4 layers, width 64, 4 seeds, 8 epochs: ~2 h on one core
    mpx run boolean_gotu --preset search --set epochs=4   # 14 mask designs on 2Parity, ~8 min CPU

Expect (quick, 2 seeds): 2Parity at the min-degree interpolator for every scheme but
QK-Opt (75.00%; QK-Opt 50.00%), Majority default / QK-SVD / QK-Opt / mask 87.50 / 87.50 /
64.27 ± 14.27 / 93.75 ± 6.25, Cyclic3 58.48 ± 0.23 / 50.00 / 50.00 / 85.89 ± 2.58 (not
converged). Expect (cpu, experiments/results/boolean_cpu.md): the default at 75.00 / 87.50
on 2Parity / Majority in every seed; the mask 75.00 on 2Parity, 96.88 ± 5.41 on Majority
(3 of 4 seeds at 100%) and 99.99 ± 0.01 on Cyclic3 (default 93.93); QK-SVD 81.25 ± 10.83
on 2Parity (one seed at 100%), both QK schemes 90.62 ± 5.41 on Majority and ≤ 60% on
Cyclic3, where the ×18 position scale (`qk_pos_scale`) keeps most of their members from
learning. The paper reports default/QK ≈ 75 / 87 and mask 100 / 100 / 99.98 on 2Parity /
Majority / Cyclic3.

`designs` expands the mask scheme into one scheme `mask:<design>` per entry of
`MASK_DESIGNS` (which pairs, layers and heads the prior suppresses); see
experiments/results/boolean_search.md for what the search measured.

Members of one task form one compiled group: every scheme and seed trains in one vmapped
program. The model is the GOTU code's TokenTransformer with PyTorch-default init; Adam
with coupled L2, batch 256, the epoch protocol (a fresh permutation per epoch).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mpx import attention as attention_lib
from mpx import diagnostics, priors, schemes
from mpx.schemes import QK_POS_SCALE
from mpx.nn import TokenTransformer, boolean_tokens
from mpx.sweep import engine, optim
from mpx.sweep.config import SweepConfig
from mpx.tasks import boolean

NAME = "boolean_gotu"  # `mpx run boolean_gotu`; also when imported as mpx.experiments.boolean_gotu.
COMPUTE_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}

# Per task: (learning rate, epochs) of the GOTU protocol (PAPER.md).
TASK_PROTOCOL = {"2parity": (1e-5, 20), "majority3": (1e-5, 30), "cyclic3": (2e-5, 80)}

METRICS = ("accuracy", "accuracy_unseen", "loss", "loss_unseen", "accuracy_exact",
           "unseen_mean_output", "mdi_distance_unseen", "target_distance_unseen")

PAPER = {
    "2parity": {"default": {"accuracy": 0.75}, "qk_svd": {"accuracy": 0.75},
                "qk_opt": {"accuracy": 0.75}, "mask": {"accuracy": 1.0}},
    "majority3": {"default": {"accuracy": 0.87}, "qk_svd": {"accuracy": 0.87},
                  "qk_opt": {"accuracy": 0.87}, "mask": {"accuracy": 1.0}},
    "cyclic3": {"mask": {"accuracy": 0.9998}},
}


@dataclasses.dataclass(frozen=True)
class Config(SweepConfig):
  """learning_rate / epochs: None = the GOTU protocol's per-task values.

  designs: the mask designs (`MASK_DESIGNS`) the "mask" scheme expands into.
  init_style: "torch" (the GOTU code's init, N(0, 1) embeddings) or "flax" (lecun normal,
    N(0, 0.02) embeddings), a search axis: FINDINGS saw the embedding init move the
    unseen output more than the mask did.
  qk_pos_scale: the QK schemes scale the position embedding by it (the recipe's ×18), so
    the layers' real input LayerNorm(token + pos) is close to the pseudo-input the
    pattern is fitted on: at the cpu scale QK-Opt then puts 0.94–0.95 of its attention
    on its pattern at init on training inputs (0.53–0.79 with 1).
  probe_size: cube points (seen and unseen in proportion, seeded) the persistence
    diagnostics run on.
  compute_dtype: "float32" or "bfloat16" (projection and MLP matmuls only; logits,
    softmax, LayerNorm and params stay float32): bf16 is for GPUs, slow on CPU.
  attention: "reference", "jax" (`jax.nn.dot_product_attention`'s XLA path, the mask as
    a float32 bias) or "cudnn" (its fused cuDNN kernel: GPU with bfloat16 only).
  """
  tasks: tuple[str, ...] = tuple(TASK_PROTOCOL)  # Or your own, see boolean.register_task.
  schemes: tuple[str, ...] = ("default", "qk_svd", "qk_opt", "mask")
  seeds: int = 10
  width: int = 256
  depth: int = 12
  num_heads: int = 6
  head_dim: int = 64
  mlp_dim: int = 256
  batch_size: int = 256
  learning_rate: float | None = None
  epochs: int | None = None
  weight_decay: float = 1e-3
  mask_strength: float = 4.0
  mask_lr_multiplier: float = 1.0
  per_head_mask: bool = True
  mask_layers: tuple[int, ...] | None = None
  designs: tuple[str, ...] = ("clique",)
  init_style: str = "torch"
  qk_opt_steps: int = 10_000
  qk_pos_scale: float = QK_POS_SCALE
  eval_points_per_call: int = 8192
  probe_size: int = 128
  compute_dtype: str = "float32"
  attention: str = "reference"

  def __post_init__(self):
    super().__post_init__()
    if self.compute_dtype not in COMPUTE_DTYPES:
      raise ValueError(f"compute_dtype={self.compute_dtype!r}; choose from "
                       f"{tuple(COMPUTE_DTYPES)}.")
    if self.attention not in attention_lib.IMPLEMENTATIONS:
      raise ValueError(f"attention={self.attention!r}; choose from "
                       f"{attention_lib.IMPLEMENTATIONS}.")
    if self.learning_rate is not None and not self.learning_rate > 0:
      raise ValueError(f"learning_rate={self.learning_rate} must be > 0 (or none for the "
                       "GOTU protocol's per-task value).")
    if self.epochs is not None and self.epochs < 1:
      raise ValueError(f"epochs={self.epochs} must be >= 1 (or none for the GOTU "
                       "protocol's per-task value).")
    if not self.probe_size >= 8:
      raise ValueError(f"probe_size={self.probe_size} must be >= 8.")
    unknown = [t for t in self.tasks if t not in boolean.task_names()]
    if unknown or not self.tasks:
      raise ValueError(f"unknown tasks {unknown or '()'}; choose from "
                       f"{boolean.task_names()} (your own: boolean.register_task).")
    unset = [t for t in self.tasks if t not in TASK_PROTOCOL]
    if unset and (self.learning_rate is None or self.epochs is None):
      raise ValueError(f"tasks {unset} have no GOTU protocol: set learning_rate and epochs "
                       "(e.g. --set learning_rate=1e-3 --set epochs=8, as the cpu preset).")
    bad = [s for s in self.schemes if s not in schemes.SCHEMES]
    if bad:
      raise ValueError(f"unknown schemes {bad}; choose from {schemes.SCHEMES}.")
    unknown = [d for d in self.designs if d not in MASK_DESIGNS]
    if unknown or not self.designs:
      raise ValueError(f"unknown mask designs {unknown or '()'}; choose from "
                       f"{tuple(MASK_DESIGNS)}.")



def task_prior(task: str, strength: float) -> jax.Array:
  """The mask prior of each task: the interaction structure of its target. Majority
  suppresses the per-bit shortcut, Cyclic3 has its windows; any other task (2Parity and
  the user's own) gets the clique over its `support`."""
  spec = boolean.get_task(task)
  if task == "majority3":
    return priors.majority_prior(spec.n_bits, spec.support, strength)
  if task == "cyclic3":
    return priors.cyclic_prior(spec.n_bits, 3, strength)
  return priors.parity_prior(spec.n_bits, _support(task), strength)


# --------------------------------------------------------------------------- designs
# A design maps (task, strength, depth, num_heads) to one prior per layer. Layers without
# a prior get the neutral one, so designs differ only in values and share one program.

def _support(task: str) -> tuple[int, ...]:
  support = boolean.get_task(task).support
  if not support:
    raise ValueError(f"task {task!r} has no support: give make_task(..., support=...) the "
                     "bits its target depends on, which the mask prior is built from.")
  return support


def _n_tokens(task: str) -> int:
  return boolean.get_task(task).n_bits + 1  # CLS, then one token per bit.


def _adjacency(task: str, **options) -> np.ndarray:
  """The task's interaction graph with `priors.boolean_adjacency` options."""
  n_bits = boolean.get_task(task).n_bits
  if task == "cyclic3":
    edges = [(i, j) for i in range(n_bits) for j in range(n_bits)
             if i != j and min((i - j) % n_bits, (j - i) % n_bits) < 3]
    options = {"cls_row": "all", "cls_column": "all", **options}
    return priors.boolean_adjacency(n_bits, _support(task), support_edges=edges, **options)
  return priors.boolean_adjacency(n_bits, _support(task), **options)


def _tokens(task: str) -> list[int]:
  return [b + 1 for b in _support(task)]


def _every_layer(prior, depth: int) -> list[jax.Array]:
  return [prior] * depth


def _only_layer(prior, depth: int, layer: int) -> list[jax.Array]:
  return [prior if i == layer % depth else priors.neutral(prior.shape[-1])
          for i in range(depth)]


def _clique(task, strength, depth, num_heads):
  """The task's prior (`task_prior`) in every layer: the quick preset's mask."""
  return _every_layer(task_prior(task, strength), depth)


def _clique_noself(task, strength, depth, num_heads):
  """Support bits read each other but not themselves (no one-hop identity path)."""
  return _every_layer(priors.from_adjacency(_adjacency(task, self_attention=False),
                                            strength), depth)


def _partner_only(task, strength, depth, num_heads):
  """Support bits read only their partners (not self, not CLS); CLS reads CLS + support."""
  allowed = _adjacency(task, self_attention=False, cls_column="none")
  return _every_layer(priors.from_adjacency(allowed, strength), depth)


def _two_hop(task, strength, depth, num_heads):
  """CLS may not read the support bits; the other bits read the pair and CLS reads them,
  so the output sees the pair only through a second hop."""
  allowed = _adjacency(task, others="support", cls_row="all")
  allowed[0, _tokens(task)] = False
  return _every_layer(priors.from_adjacency(allowed, strength), depth)


def _first_layer_only(task, strength, depth, num_heads):
  """The clique in layer 0 only: the prior shapes the first interaction, then frees."""
  return _only_layer(task_prior(task, strength), depth, 0)


def _last_layer_only(task, strength, depth, num_heads):
  """The clique in the last layer only: the readout hop is constrained, features free."""
  return _only_layer(task_prior(task, strength), depth, -1)


def _asymmetric(allowed_strength: float, suppressed_strength: float):
  def design(task, strength, depth, num_heads):
    del strength  # The design fixes both strengths.
    allowed = np.asarray(task_prior(task, 1.0)) > 0
    return _every_layer(priors.from_adjacency(allowed, allowed_strength,
                                              suppressed_strength), depth)
  design.__doc__ = (f"The clique at +{allowed_strength:g} / −{suppressed_strength:g}: "
                    "how much the suppression strength (vs. the pass strength) matters.")
  return design


def _half_heads(task, strength, depth, num_heads):
  """The clique in the first half of the heads, the others free: a per-head prior keeps
  a structured path beside unconstrained ones."""
  prior = task_prior(task, strength)
  free = priors.neutral(_n_tokens(task))
  heads = [prior if h < max(1, num_heads // 2) else free for h in range(num_heads)]
  return _every_layer(priors.stack_heads(heads), depth)


def _one_head_partner(task, strength, depth, num_heads):
  """Head 0 is partner-only, the other heads free: a single dedicated interaction head."""
  partner = _partner_only(task, strength, 1, num_heads)[0]
  free = priors.neutral(_n_tokens(task))
  return _every_layer(priors.stack_heads([partner] + [free] * (num_heads - 1)), depth)


def _cls_blind(task, strength, depth, num_heads):
  """CLS reads only itself before the last layer and everything in it: it cannot
  accumulate a linear readout of the raw bits early."""
  early = priors.from_adjacency(_adjacency(task, cls_row="self"), strength)
  last = priors.from_adjacency(_adjacency(task, cls_row="all"), strength)
  return [early] * (depth - 1) + [last]


def _others_all(task, strength, depth, num_heads):
  """The clique, but irrelevant bits read every token (contrast to `clique`, where they
  read only themselves)."""
  return _every_layer(priors.from_adjacency(_adjacency(task, others="all"), strength),
                      depth)


def _cls_only(task, strength, depth, num_heads):
  """Only the CLS row is constrained (CLS reads CLS + support); every other row free."""
  allowed = np.ones((_n_tokens(task),) * 2, bool)
  allowed[0] = _adjacency(task)[0]
  return _every_layer(priors.from_adjacency(allowed, strength), depth)


def _no_linear(task, strength, depth, num_heads):
  """Blocks the easy linear readout (the MDI x0 + x1 − 1 is linear): support bits read
  only their partners, CLS reads only itself in layer 0 and then only the support bits
  (no self), so everything CLS sees has passed through a partner interaction."""
  bits = priors.from_adjacency(_adjacency(task, self_attention=False, cls_column="none",
                                          cls_row="self"), strength)
  read = _adjacency(task, self_attention=False, cls_column="none")
  read[0, 0] = False
  return [bits] + [priors.from_adjacency(read, strength)] * (depth - 1)


MASK_DESIGNS: dict[str, Callable] = {
    "clique": _clique,
    "clique_noself": _clique_noself,
    "partner_only": _partner_only,
    "two_hop": _two_hop,
    "first_layer_only": _first_layer_only,
    "last_layer_only": _last_layer_only,
    "asym_8_2": _asymmetric(8.0, 2.0),
    "asym_2_8": _asymmetric(2.0, 8.0),
    "half_heads": _half_heads,
    "one_head_partner": _one_head_partner,
    "cls_blind": _cls_blind,
    "others_all": _others_all,
    "cls_only": _cls_only,
    "no_linear": _no_linear,
}
SEARCH_DESIGNS = tuple(MASK_DESIGNS)

PRESETS = {
    "quick": dict(seeds=2, width=32, depth=2, num_heads=2, head_dim=16, mlp_dim=32,
                  learning_rate=1e-3, epochs=2, chunk_steps=16, eval_every=96,
                  qk_opt_steps=2000),
    "paper": dict(seeds=10, chunk_steps=32, eval_every=320, checkpoint_every=320),
    # The largest scale a 2-core CPU finishes in about two hours (one core): 4 seeds.
    "cpu": dict(seeds=4, width=64, depth=4, num_heads=4, head_dim=16, mlp_dim=64,
                learning_rate=1e-3, epochs=8, chunk_steps=16, eval_every=128,
                checkpoint_every=128, qk_opt_steps=2000),
    "tiny": dict(tasks=("2parity",), schemes=("default", "mask"), seeds=1, width=16,
                 depth=1, num_heads=2, head_dim=8, mlp_dim=16, learning_rate=1e-3,
                 epochs=1, chunk_steps=8, eval_every=48, checkpoint_every=16,
                 qk_opt_steps=100),
    # The mask-design search (experiments/results/boolean_search.md): every design and
    # the vanilla baseline in one vmapped group, small enough for a 2-core CPU.
    "search": dict(tasks=("2parity",), schemes=("default", "mask"), seeds=1, width=64,
                   depth=2, num_heads=4, head_dim=16, mlp_dim=64, learning_rate=1e-3,
                   epochs=10, chunk_steps=32, designs=SEARCH_DESIGNS),
}


def mask_design(name: str, task: str, strength: float, depth: int,
                num_heads: int) -> list[jax.Array]:
  """The per-layer priors of design `name`; unknown names list the valid ones."""
  if name not in MASK_DESIGNS:
    raise ValueError(f"unknown mask design {name!r}; choose from {tuple(MASK_DESIGNS)}.")
  return MASK_DESIGNS[name](task, strength, depth, num_heads)


def scheme_labels(config: Config) -> list[tuple[str, str | None]]:
  """(label, design) per scheme: "mask" expands to `mask:<design>` per design; with the
  default single design the label stays "mask" (the paper's table keys)."""
  labels = []
  for scheme in config.schemes:
    if scheme != "mask":
      labels.append((scheme, None))
    elif config.designs == ("clique",):
      labels.append(("mask", "clique"))
    else:
      labels.extend((f"mask:{d}", d) for d in config.designs)
  return labels


def make_model(config: Config) -> TokenTransformer:
  return TokenTransformer(width=config.width, depth=config.depth,
                          num_heads=config.num_heads, head_dim=config.head_dim,
                          mlp_dim=config.mlp_dim, mask_layers=config.mask_layers,
                          per_head_mask=config.per_head_mask, init_style=config.init_style,
                          dtype=COMPUTE_DTYPES[config.compute_dtype],
                          implementation=config.attention)


def _member_hparams(config: Config, task: str, scheme: str) -> dict[str, float]:
  lr = config.learning_rate if config.learning_rate is not None else TASK_PROTOCOL[task][0]
  return {"learning_rate": lr, "weight_decay": config.weight_decay,
          "mask_strength": config.mask_strength,
          "mask_lr_multiplier": config.mask_lr_multiplier if scheme == "mask" else 0.0}


def _persistence(model, loss_fn, params, initial, probe, patterns, fidelity_init) -> dict:
  """Per-layer drift, fidelity and gradient norms, plus their means over layers (and the
  fidelity at init) as flat metrics for the summary's persistence table. Fidelity is
  reported on the whole probe and on its seen and unseen parts; gradients are those of
  the loss on the probe's seen points (the training domain)."""
  first_last = ("block_0", f"block_{model.depth - 1}")
  seen = {"x": probe["x"][probe["seen"]], "y": probe["y"][probe["seen"]]}
  layers = diagnostics.persistence_metrics(
      model.apply, loss_fn, params, initial, (boolean_tokens(probe["x"]),), seen, patterns,
      map_layers=first_last, example_groups={"seen": probe["seen"], "unseen": ~probe["seen"]})
  return {"layers": layers, "fidelity_init": fidelity_init,
          # The last layer's pattern, as the share of heads allowing each pair (heatmaps).
          "prior_pattern": np.asarray(patterns[first_last[-1]]).mean(0).round(4).tolist(),
          **diagnostics.layer_means(layers, ("fidelity", "fidelity_seen", "fidelity_unseen"))}


def make_evaluate(model, task: boolean.BooleanTask, points_per_call: int, loss_fn=None,
                  initial_params=None, patterns=None, probe_size: int = 128):
  """Host evaluation: each member's function on the whole cube, then its metrics; with
  `initial_params` (member index → params at init) and `patterns` (member index →
  {layer: allowed [H, N, N]}, the member's own prior) also the persistence diagnostics
  on a seeded probe of cube points (`boolean.probe_points`)."""
  x_cube, y_cube = boolean.make_splits(task, 0)["test"]
  x_probe, y_probe, seen_probe = boolean.probe_points(task, probe_size, seed=0)
  probe = {"x": jnp.asarray(x_probe), "y": jnp.asarray(y_probe), "seen": seen_probe}
  mdi = boolean.mdi_values(task)
  unseen = ~task.seen(x_cube)
  tokens = boolean_tokens(x_cube)
  monomials = boolean.task_monomials(task)
  fidelity_init = {}  # member index → fidelity of its initial params.

  @jax.jit
  def predict(params_K, tokens_BN):
    return jax.lax.map(lambda p: model.apply({"params": p}, tokens_BN)[:, 0], params_K)

  def evaluate(params_K, members):
    chunks = [predict(params_K, tokens[i:i + points_per_call])
              for i in range(0, len(tokens), points_per_call)]
    preds = np.asarray(jnp.concatenate(chunks, axis=1), np.float64)
    results = []
    for i, pred in enumerate(preds[:len(members)]):
      m = boolean.function_metrics(pred, task, mdi)
      if initial_params is not None:
        if i not in fidelity_init:  # Constant per member: measured once.
          fidelity_init[i] = _persistence(model, loss_fn, initial_params[i],
                                          initial_params[i], probe, patterns[i],
                                          None)["fidelity"]
        m |= _persistence(model, loss_fn, engine.unstack(params_K, i), initial_params[i],
                          probe, patterns[i], fidelity_init[i])
      m["unseen_mean_output"] = float(pred[unseen].mean())
      coeffs = boolean.fourier_coefficients(pred, task.n_bits)
      m["degree_profile"] = boolean.degree_profile(coeffs, task.n_bits).round(6).tolist()
      m["fourier"] = {boolean.monomial_label(s): round(float(coeffs[sum(1 << i for i in s)]), 6)
                      for s in monomials}
      results.append(m)
    return results

  return evaluate


def member_patterns(config: Config, task: str, label: str, design: str | None
                    ) -> dict[str, np.ndarray]:
  """{layer: allowed [H, N, N]}: the pattern a member's fidelity is scored on. A mask
  member is scored on its own design's prior in each layer (a layer the design leaves
  neutral allows everything); the others on the task's prior, which the QK schemes
  realise and the default init is compared against."""
  heads = config.num_heads
  if label.partition(":")[0] == "mask":
    layers = mask_design(design, task, config.mask_strength, config.depth, heads)
    if config.mask_layers is not None:  # Layers without a mask leaf carry no prior.
      layers = [p if i in config.mask_layers else priors.neutral(_n_tokens(task))
                for i, p in enumerate(layers)]
  else:
    layers = [task_prior(task, config.mask_strength)] * config.depth
  n_tokens = _n_tokens(task)
  return {f"block_{i}": np.broadcast_to(np.asarray(p) > 0, (heads, n_tokens, n_tokens))
          for i, p in enumerate(layers)}


def build_group(config: Config, task_name: str) -> engine.Group:
  task = boolean.get_task(task_name)
  model = make_model(config)
  labels = scheme_labels(config)
  designs = dict(labels)
  members = [engine.Member(task_name, label, seed,
                           _member_hparams(config, task_name, label.partition(":")[0]))
             for label, _ in labels for seed in range(config.seeds)]
  tokens = boolean_tokens(jnp.ones((1, task.n_bits)))
  masked = range(config.depth) if config.mask_layers is None else config.mask_layers

  initial_params = {}  # member index → params at init, for the drift diagnostics.

  def init_params(member: engine.Member):
    params = _init_params(member)
    initial_params[members.index(member)] = params
    return params

  def _init_params(member: engine.Member):
    key = jax.random.key(member.seed)
    params = model.init(key, tokens)["params"]
    strength = member.hparams["mask_strength"]
    scheme = member.scheme.partition(":")[0]
    if scheme == "mask":
      layers = mask_design(designs[member.scheme], task_name, strength, config.depth,
                           config.num_heads)
      return schemes.set_masks_per_layer(params, {f"block_{i}": layers[i] for i in masked})
    prior = task_prior(task_name, strength)
    return schemes.apply_scheme(scheme, params, prior, jax.random.fold_in(key, 2),
                                num_heads=config.num_heads, head_dim=config.head_dim,
                                qk_opt_steps=config.qk_opt_steps,
                                pos_scale=config.qk_pos_scale)

  def loss_fn(params, batch):
    pred = model.apply({"params": params}, boolean_tokens(batch["x"]))[:, 0]
    return jnp.mean((pred - batch["y"]) ** 2)

  splits = [boolean.make_splits(task, m.seed)["train"] for m in members]
  train_data = {"x": jnp.asarray(np.stack([x for x, _ in splits])),
                "y": jnp.asarray(np.stack([y for _, y in splits]))}
  epochs = config.epochs if config.epochs is not None else TASK_PROTOCOL[task_name][1]
  steps = epochs * (train_data["x"].shape[1] // config.batch_size)
  return engine.Group(
      name=task_name, members=members, init_params=init_params, loss_fn=loss_fn,
      train_data=train_data,
      evaluate=make_evaluate(model, task, config.eval_points_per_call, loss_fn, initial_params,
                             [member_patterns(config, task_name, m.scheme, designs[m.scheme])
                              for m in members], config.probe_size),
      steps=steps, batch_size=config.batch_size, sampling="epoch",
      optim=optim.OptimConfig(optimizer="adam_l2", total_steps=steps))


def build_groups(config: Config) -> list[engine.Group]:
  return [build_group(config, t) for t in config.tasks]
