"""The Boolean GOTU family: the TokenTransformer on a Boolean task, its mask priors and
designs, the four init schemes, and the member-level `Task` the sweep engine trains.

Everything a Boolean experiment needs lives here; `experiments/boolean_gotu.py` keeps
only the record (commands, expected numbers, presets, member grid, the paper's numbers).
A task registered with `boolean.register_task` trains through the same code: its mask
prior is the clique over its `support`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mpx import attention as attention_lib
from mpx import priors, schemes
from mpx.nn import TokenTransformer
from mpx.sweep import engine, optim
from mpx.sweep.data import DeviceData, EvalData
from mpx.tasks import boolean
from mpx.tasks.boolean import fourier
from mpx.tasks import common
from mpx.tasks.common import PriorConfig

COMPUTE_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}

# Per task: (learning rate, epochs) of the GOTU protocol (PAPER.md).
TASK_PROTOCOL = {"2parity": (1e-5, 20), "majority3": (1e-5, 30), "cyclic3": (2e-5, 80)}

@dataclasses.dataclass(frozen=True)
class Config(PriorConfig):
  """Shared fields: `mpx.tasks.common.PriorConfig`. learning_rate / epochs: None = the GOTU protocol's per-task values.

  tasks: the registered Boolean tasks to train, one group each (`boolean.register_task`
    adds your own).
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
  eval_points_per_call: cube points per call of the evaluation (its memory).
  compute_dtype: "float32" or "bfloat16" (projection and MLP matmuls only; logits,
    softmax, LayerNorm and params stay float32): bf16 is for GPUs, slow on CPU.
  attention: "reference", "jax" (`jax.nn.dot_product_attention`'s XLA path, the mask as
    a float32 bias) or "cudnn" (its fused cuDNN kernel: refused, wrong under vmap on
    jax 0.11.2, see experiments/results/accelerator_check_h200.md; the accelerator check
    tries each form of `mpx.attention.CUDNN_FORMS`).
  """
  tasks: tuple[str, ...] = tuple(TASK_PROTOCOL)  # Or your own, see boolean.register_task.
  seeds: int = 10
  learning_rate: float | None = None
  epochs: int | None = None
  designs: tuple[str, ...] = ("clique",)
  init_style: str = "torch"
  eval_points_per_call: int = 8192
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
    if self.attention == "cudnn" and os.environ.get("MPX_MEASURE_CUDNN") != "1":
      raise ValueError(
          "attention='cudnn' trains wrong under the sweep engine's vmap: measured on an "
          "H200 with jax 0.11.2, a member's loss is NaN from its first step "
          "(experiments/results/accelerator_check_h200.md). Use attention=reference (the "
          "default) or jax; MPX_MEASURE_CUDNN=1 lets benchmarks/accelerator_check "
          "measure it again.")
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
    unknown = [d for d in self.designs if d not in MASK_DESIGNS]
    if unknown or not self.designs:
      raise ValueError(f"unknown mask designs {unknown or '()'}; choose from "
                       f"{tuple(MASK_DESIGNS)}.")



def task_prior(task: boolean.BooleanTask | str, strength: float) -> jax.Array:
  """The mask prior of each task (a BooleanTask or its name): the interaction structure
  of its target. Majority suppresses the per-bit shortcut, Cyclic3 has its windows; any
  other task (2Parity and the user's own) gets the clique over its `support`, or over
  each of its `interaction_groups` when it names them."""
  spec = _resolve(task)
  if spec.name == "majority3":
    return priors.majority_prior(spec.n_bits, spec.support, strength)
  if spec.name == "cyclic3":
    return priors.cyclic_prior(spec.n_bits, 3, strength)
  edges = [(i, j) for group in spec.interaction_groups for i in group for j in group
           if i != j] or None
  return priors.parity_prior(spec.n_bits, _support(spec), strength, support_edges=edges)


def _resolve(task: boolean.BooleanTask | str) -> boolean.BooleanTask:
  """The task itself: a name is looked up once, where it enters, and the task object is
  passed on from there."""
  return task if isinstance(task, boolean.BooleanTask) else boolean.get_task(task)


# --------------------------------------------------------------------------- designs
# A design maps (task, strength, depth, num_heads) to one prior per layer, the task a
# BooleanTask. Layers without a prior get the neutral one, so designs differ only in values
# and share one program.

def _support(spec: boolean.BooleanTask) -> tuple[int, ...]:
  if not spec.support:
    raise ValueError(f"task {spec.name!r} has no support: give make_task(..., support=...) the "
                     "bits its target depends on, which the mask prior is built from.")
  return spec.support


def _n_tokens(spec: boolean.BooleanTask) -> int:
  return spec.n_bits + 1  # CLS, then one token per bit.


def _adjacency(spec: boolean.BooleanTask, **options) -> np.ndarray:
  """The task's interaction graph with `priors.boolean_adjacency` options."""
  n_bits = spec.n_bits
  if spec.name == "cyclic3":
    edges = [(i, j) for i in range(n_bits) for j in range(n_bits)
             if i != j and min((i - j) % n_bits, (j - i) % n_bits) < 3]
    options = {"cls_row": "all", "cls_column": "all", **options}
    return priors.boolean_adjacency(n_bits, _support(spec), support_edges=edges, **options)
  return priors.boolean_adjacency(n_bits, _support(spec), **options)


def _tokens(spec: boolean.BooleanTask) -> list[int]:
  return [b + 1 for b in _support(spec)]


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

def mask_design(name: str, task: boolean.BooleanTask | str, strength: float, depth: int,
                num_heads: int) -> list[jax.Array]:
  """The per-layer priors of design `name`; unknown names list the valid ones."""
  if name not in MASK_DESIGNS:
    raise ValueError(f"unknown mask design {name!r}; choose from {tuple(MASK_DESIGNS)}.")
  return MASK_DESIGNS[name](_resolve(task), strength, depth, num_heads)


def scheme_labels(config: Config) -> list[tuple[str, str | None]]:
  """(label, design) per scheme; the mask scheme expands per design (`common.scheme_labels`)."""
  return common.scheme_labels(config.schemes, config.designs, "clique")


def make_model(config: Config) -> TokenTransformer:
  return TokenTransformer(**config.model_shape(), init_style=config.init_style,
                          dtype=COMPUTE_DTYPES[config.compute_dtype],
                          implementation=config.attention)


def fingerprint(config: Config) -> dict:
  """Each task's definition (`boolean.fingerprint`): `mpx run --resume` refuses a run
  whose task changed under the same name."""
  return {task: boolean.fingerprint(boolean.get_task(task)) for task in config.tasks}


def members(config: Config, task: boolean.BooleanTask | str) -> list[engine.Member]:
  """The member grid of one task: every scheme label (mask designs expanded) × seed."""
  task = _resolve(task).name
  lr = config.learning_rate if config.learning_rate is not None else TASK_PROTOCOL[task][0]
  grid = []
  for label, design in scheme_labels(config):
    mask = label.partition(":")[0] == "mask"
    hparams = {"learning_rate": lr, "weight_decay": config.weight_decay,
               "mask_lr_multiplier": config.mask_lr_multiplier if mask else 0.0}
    grid += [engine.Member(task, label, seed, hparams, design=design,
                           labels={"mask_strength": config.mask_strength})
             for seed in range(config.seeds)]
  return grid


def member_patterns(config: Config, task: boolean.BooleanTask | str, label: str,
                    design: str | None) -> dict[str, np.ndarray]:
  """{layer: allowed [H, N, N]}: the pattern a member's fidelity is scored on. A mask
  member is scored on its own design's prior in each layer (a layer the design leaves
  neutral allows everything); the others on the task's prior, which the QK schemes
  realise and the default init is compared against."""
  spec = _resolve(task)
  heads = config.num_heads
  if label.partition(":")[0] == "mask":
    layers = mask_design(design, spec, config.mask_strength, config.depth, heads)
    if config.mask_layers is not None:  # Layers without a mask leaf carry no prior.
      layers = [p if i in config.mask_layers else priors.neutral(_n_tokens(spec))
                for i, p in enumerate(layers)]
  else:
    layers = [task_prior(spec, config.mask_strength)] * config.depth
  n_tokens = _n_tokens(spec)
  return {f"block_{i}": np.broadcast_to(np.asarray(p) > 0, (heads, n_tokens, n_tokens))
          for i, p in enumerate(layers)}


# With `select`: the share of the seen domain held out of training as the validation set
# (fixed before any unseen accuracy was looked at), drawn once per task, not per seed.
VALIDATION_FRACTION = 0.1
# Selection reads these, best first: the seen-domain held-out sign accuracy (near 100% for
# most learning rates), then its squared loss to break the ties.
VALIDATION = (("val_accuracy", "max"), ("val_loss", "min"))
SELECTION_NOTE = ("Validation is a held-out slice of the seen domain: choosing on it says "
                  "nothing about extrapolation to the unseen domain, which the task "
                  "withholds by design.")


def validation_points(spec: boolean.BooleanTask) -> np.ndarray:
  """[2^n] bool over the cube: the held-out seen points (`VALIDATION_FRACTION` of them)."""
  seen = np.asarray(spec.seen(boolean.cube(spec.n_bits)), bool)
  rng = np.random.default_rng(20261202)
  picked = rng.choice(np.flatnonzero(seen), int(VALIDATION_FRACTION * seen.sum()),
                      replace=False)
  held_out = np.zeros_like(seen)
  held_out[picked] = True
  return held_out


def training_split(spec: boolean.BooleanTask, seed: int, held_out: np.ndarray | None
                   ) -> tuple[np.ndarray, np.ndarray]:
  """The task's training set (`boolean.make_splits`), drawn from the seen points that are
  not `held_out`: every one in cube order (enumerate) or `train_size` draws (iid)."""
  if held_out is None:
    return boolean.make_splits(spec, seed)["train"]
  x, y = boolean.make_splits(spec, seed)["test"]
  pool = np.asarray(spec.seen(x), bool) & ~held_out
  if spec.protocol == "iid":
    idx = np.random.default_rng(seed).choice(np.flatnonzero(pool), spec.train_size)
    return x[idx], y[idx]
  return x[pool], y[pool]


def make_model_init(config: Config, n_bits: int):
  """key → the model's params on n_bits inputs (its own init: a neutral, frozen mask).

  One compile for every member of every group of one model (eager, `model.init`
  dispatches each op on its own); bit for bit the eager values.
  """
  return _model_init(make_model(config), n_bits)


@functools.lru_cache(maxsize=None)
def _model_init(model: TokenTransformer, n_bits: int):
  tokens = boolean.tokens(jnp.ones((1, n_bits)))
  return engine.jit_once(lambda key: model.init(key, tokens)["params"])


def make_task(config: Config, task: boolean.BooleanTask | str) -> engine.Task:
  """The member-level Task: init by scheme (mask designs per layer, QK schemes from the
  task's prior), squared loss on the CLS output, the whole cube as evaluation set."""
  spec = _resolve(task)
  model = make_model(config)
  masked = config.masked_layers
  mdi = fourier.mdi_values(spec)
  unseen = ~spec.seen(boolean.cube(spec.n_bits))
  monomials = fourier.task_monomials(spec)
  held_out = validation_points(spec) if config.select is not None else None
  target = boolean.make_splits(spec, 0)["test"][1]
  model_init = make_model_init(config, spec.n_bits)

  def init(member: engine.Member):
    key = jax.random.key(member.seed)
    params = model_init(key)
    strength = member.labels["mask_strength"]
    scheme = member.scheme.partition(":")[0]
    if scheme == "mask":
      layers = mask_design(member.design, spec, strength, config.depth, config.num_heads)
      return schemes.set_masks_per_layer(params, {f"block_{i}": layers[i] for i in masked})
    return schemes.apply_scheme(scheme, params, task_prior(spec, strength),
                                jax.random.fold_in(key, 2), num_heads=config.num_heads,
                                head_dim=config.head_dim, qk_opt_steps=config.qk_opt_steps,
                                pos_scale=config.qk_pos_scale)

  def predict(params, x_BN):
    return model.apply({"params": params}, boolean.tokens(x_BN))[:, 0]

  def loss(params, batch, key):
    del key  # Deterministic model.
    return jnp.mean((predict(params, batch["x"]) - batch["y"]) ** 2), {}

  def eval_step(params, batch):
    return {"pred": predict(params, batch["x"])}

  def summarize(values, member):
    del member
    pred = np.asarray(values["pred"], np.float64)
    metrics = fourier.function_metrics(pred, spec, mdi)
    metrics["unseen_mean_output"] = float(pred[unseen].mean())
    if held_out is not None:  # Trained without these seen points: selection reads them.
      metrics["val_accuracy"] = float(np.mean(  # Sign accuracy, as `accuracy` (Cyclic3: ±1, ±3).
          np.sign(pred[held_out]) == np.sign(target[held_out])))
      metrics["val_loss"] = float(np.mean((pred[held_out] - target[held_out]) ** 2))
    coeffs = fourier.fourier_coefficients(pred, spec.n_bits)
    metrics["degree_profile"] = fourier.degree_profile(
        coeffs, spec.n_bits).round(6).tolist()
    metrics["fourier"] = {fourier.monomial_label(s):
                          round(float(coeffs[sum(1 << i for i in s)]), 6) for s in monomials}
    return metrics

  return engine.Task(init=init, loss=loss, eval_step=eval_step, summarize=summarize)


def make_group(config: Config, task: boolean.BooleanTask | str,
               group_members: Sequence[engine.Member], *, probe: bool = True
               ) -> engine.Group:
  """One task's members in one compiled group: the seen points shared by every member
  (the enumerate protocol trains on all of them; an iid task's sample is per seed), the
  epoch protocol, Adam with coupled L2, and with `probe` the persistence probe on
  `probe_points` (it scores attention on the task's prior, so it needs the support)."""
  spec = _resolve(task)
  held_out = validation_points(spec) if config.select is not None else None
  splits = {m.seed: training_split(spec, m.seed, held_out) for m in group_members}
  if spec.protocol == "enumerate":
    x, y = splits[group_members[0].seed]
    data = DeviceData({"x": x, "y": y}, sampling="epoch")
  else:
    data = DeviceData({"x": np.stack([splits[m.seed][0] for m in group_members]),
                       "y": np.stack([splits[m.seed][1] for m in group_members])},
                      per_member=True, sampling="epoch")
  x_cube, _ = boolean.make_splits(spec, 0)["test"]
  epochs = config.epochs if config.epochs is not None else TASK_PROTOCOL[spec.name][1]
  steps = epochs * (data.num_examples // config.batch_size)
  return engine.Group(
      name=spec.name, members=list(group_members), task=make_task(config, spec), data=data,
      eval_data=EvalData({"x": x_cube}, config.eval_points_per_call), steps=steps,
      batch_size=config.batch_size, members_per_call=config.members_per_call,
      chunk_options=config.step_variant,
      probe=persistence_probe(config, spec, group_members) if probe else None,
      optim=optim.OptimConfig(optimizer="adam_l2", total_steps=steps))


def persistence_probe(config: Config, spec: boolean.BooleanTask,
                      group_members: Sequence[engine.Member]) -> engine.Probe:
  """The persistence diagnostics' inputs: `probe_points` and each member's pattern."""
  x_probe, y_probe, seen_probe = boolean.probe_points(spec, config.probe_size, seed=0)
  return engine.Probe(
      apply=make_model(config).apply, inputs=(boolean.tokens(x_probe),),
      batch={"x": jnp.asarray(x_probe[seen_probe]), "y": jnp.asarray(y_probe[seen_probe])},
      patterns=[member_patterns(config, spec, m.scheme, m.design) for m in group_members],
      example_groups={"seen": seen_probe, "unseen": ~seen_probe},
      map_layers=("block_0", f"block_{config.depth - 1}"))


def build_groups(config: Config) -> list[engine.Group]:
  """One group per task: its schemes (mask designs expanded) × seeds."""
  specs = [boolean.get_task(name) for name in config.tasks]
  return [make_group(config, spec, members(config, spec)) for spec in specs]
