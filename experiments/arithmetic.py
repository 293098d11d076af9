"""Low-data arithmetic: 3-digit addition and multiplication × {default, QK-SVD, QK-Opt, mask}.

    mpx run arithmetic --preset quick     # 2 tasks × 4 schemes × 2 seeds, ~3 min on one CPU core
    mpx run arithmetic --preset quick --set seeds=4           # the README's rows, ~6 min
    mpx run arithmetic --preset paper     # 6 layers × 384 (Lee et al.'s NanoGPT), 5 seeds (GPU)
    mpx run arithmetic --preset quick --set tasks=addition --set fractions=0.001,0.002,0.008
                                          # a data-fraction curve (plots/fraction_curve.png)
    mpx run arithmetic --preset quick --set reverse_answer=true   # answers reversed

Expect (quick: a 2-layer width-32 decoder, 800 steps of batch 64 on 4,000 additions and
30,000 multiplications, plain answers, `--set seeds=4`) addition sequence accuracy mask
90.20 ± 2.70 > QK-Opt 64.78 ± 36.85 (3 of 4 seeds learn) > QK-SVD 5.91 ± 3.25 > default
1.00 ± 0.18; with 2 seeds the numbers move within that spread. Multiplication is not
learned by any scheme at this scale (sequence accuracy 0.2–0.3%, digit accuracy ≈ 43%,
QK-SVD ≈ 37%). The paper reports 1.19% (default) → 77.49% (mask) for addition at 0.4% of
the 10^6 problems and 5.01% → 69.49% for multiplication at 3%, QK-SVD and QK-Opt in
between. Measured fraction sweeps and both answer formats:
experiments/results/arithmetic_quick.md.

The paper gives no more of the setup; mpx's (see mpx/tasks/arithmetic.py): character
tokens `^123+045=0168$`, a GPT-style causal decoder (`mpx.nn.causal_decoder`) trained with
next-token loss on the answer digits and END, the digit-alignment prior (answer digit p
reads the operand digits that determine it) composed with the causal mask, and greedy
decoding of the held-out 10,000 problems. Answers are plain (most significant digit
first) by default: with reversed answers the default init also learns addition in some
seeds (its mean swings between 18% and 67% over data fractions), which the paper's 1.19%
rules out, while plain answers keep the default at ≤ 4% at every fraction measured
(≈ 1% from 0.2% of the data up).

One group per (task, fraction): every scheme and seed of it trains in one vmapped
program; a seed draws both the init and the training set, so the schemes of one seed see
the same problems. AdamW with warmup and cosine decay (the paper preset: batch 256, lr 1e-3,
wd 0.1, 5,000 steps: Lee et al.'s NanoGPT recipe without dropout).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from mpx import diagnostics, schemes
from mpx.schemes import QK_POS_SCALE
from mpx.nn import TokenTransformer, causal_decoder, greedy_decode
from mpx.sweep import engine, optim
from mpx.sweep.config import SweepConfig
from mpx.tasks import arithmetic

NAME = "arithmetic"  # `mpx run arithmetic`; also when imported as mpx.experiments.arithmetic.
# The paper's data fraction per task (the fraction its table is for).
DEFAULT_FRACTIONS = {"addition": 0.004, "multiplication": 0.03}

METRICS = ("sequence_accuracy", "digit_accuracy", "loss")

# QK-SVD and QK-Opt are "in between" in the paper, without numbers.
PAPER = {
    "addition": {"default": {"sequence_accuracy": 0.0119},
                 "mask": {"sequence_accuracy": 0.7749}},
    "multiplication": {"default": {"sequence_accuracy": 0.0501},
                       "mask": {"sequence_accuracy": 0.6949}},
}


@dataclasses.dataclass(frozen=True)
class Config(SweepConfig):
  """fractions: the data fractions to train on; None = the paper's per task
  (`DEFAULT_FRACTIONS`), a tuple = that sweep for every task (one group each).

  digits: operand digits of both operands (3: addition over 10^6 pairs; see
    mpx/tasks/arithmetic.py for why multiplication is 3×3 too).
  mask_strength: the prior's ±a; mask_layers: which layers carry it (None = all).
  test_size: held-out problems, disjoint from every training set.
  eval_batch: test problems per compiled evaluation call (all members at once).
  qk_pos_scale: the QK schemes scale the position embedding by it (the recipe's ×18).
    At the quick scale QK-SVD / QK-Opt then put 1.00 / 0.86–0.94 of the answer rows'
    attention on the alignment pattern in layer 0 on training inputs (0.94 / 0.57 with
    1), but only 0.64–0.84 in layer 1, whose input is dominated by layer 0's outputs
    (the decoder's position embedding is N(0, 0.02)). ×900 holds every layer but leaves
    the model content-blind (addition, seed 0: QK-SVD 0.10%, QK-Opt 0.07% against 8.94%
    and 81.54% at ×18), so the recipe's ×18 stays the default.
  probe_size: test problems the persistence diagnostics run on (fidelity on the rows
    that predict an answer digit, drift, gradient norms of the answer loss).
  """
  tasks: tuple[str, ...] = arithmetic.TASKS
  schemes: tuple[str, ...] = ("default", "qk_svd", "qk_opt", "mask")
  seeds: int = 5
  fractions: tuple[float, ...] | None = None
  digits: int = 3
  reverse_answer: bool = False
  width: int = 384
  depth: int = 6
  num_heads: int = 6
  head_dim: int = 64
  mlp_dim: int = 1536
  batch_size: int = 256
  learning_rate: float = 1e-3
  weight_decay: float = 0.1
  warmup_steps: int = 100
  steps: int = 5000
  mask_strength: float = 4.0
  mask_lr_multiplier: float = 1.0
  per_head_mask: bool = True
  mask_layers: tuple[int, ...] | None = None
  qk_opt_steps: int = 10_000
  qk_pos_scale: float = QK_POS_SCALE
  test_size: int = 10_000
  eval_batch: int = 2000
  probe_size: int = 128

  def __post_init__(self):
    super().__post_init__()
    unknown = [t for t in self.tasks if t not in arithmetic.TASKS]
    if unknown or not self.tasks:
      raise ValueError(f"unknown tasks {unknown or '()'}; choose from {arithmetic.TASKS}.")
    bad = [s for s in self.schemes if s not in schemes.SCHEMES]
    if bad or not self.schemes:
      raise ValueError(f"unknown schemes {bad or '()'}; choose from {schemes.SCHEMES}.")
    if self.fractions is not None and not (self.fractions and
                                           all(0 < f < 1 for f in self.fractions)):
      raise ValueError(f"fractions must lie in (0, 1); got {self.fractions}.")
    if not 0 < self.probe_size <= self.test_size:
      raise ValueError(f"probe_size={self.probe_size} must be in [1, test_size="
                       f"{self.test_size}].")
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f"warmup_steps={self.warmup_steps} must be in [0, steps="
                       f"{self.steps}).")


PRESETS = {
    # One CPU core: ~4 minutes (2 groups × 8 members, 800 steps each, 10,000 test problems).
    "quick": dict(seeds=2, width=32, depth=2, num_heads=2, head_dim=16, mlp_dim=64,
                  batch_size=64, learning_rate=3e-3, steps=800, warmup_steps=50,
                  chunk_steps=100),
    # Lee et al.'s NanoGPT (6 × 384, 6 heads, ~10.6 M params), 5,000 steps (GPU).
    "paper": dict(seeds=5, chunk_steps=250, eval_every=1000, checkpoint_every=1000,
                  eval_batch=1000),
    # Seconds: for the tests.
    "tiny": dict(tasks=("addition",), schemes=("default", "mask"), seeds=1, width=16,
                 depth=1, num_heads=2, head_dim=8, mlp_dim=32, batch_size=32, steps=20,
                 warmup_steps=2, chunk_steps=20, qk_opt_steps=20, test_size=500,
                 eval_batch=500),
}


def make_model(config: Config) -> TokenTransformer:
  return causal_decoder(arithmetic.VOCAB_SIZE, width=config.width, depth=config.depth,
                        num_heads=config.num_heads, head_dim=config.head_dim,
                        mlp_dim=config.mlp_dim, mask_layers=config.mask_layers,
                        per_head_mask=config.per_head_mask)


def task_fractions(config: Config, task: str) -> tuple[float, ...]:
  return (DEFAULT_FRACTIONS[task],) if config.fractions is None else config.fractions


def _member_hparams(config: Config, scheme: str, fraction: float) -> dict[str, float]:
  """`data_fraction` and `mask_strength` are recorded, not used by the optimizer."""
  return {"learning_rate": config.learning_rate, "weight_decay": config.weight_decay,
          "mask_lr_multiplier": config.mask_lr_multiplier if scheme == "mask" else 0.0,
          "mask_strength": config.mask_strength, "data_fraction": fraction}


def _persistence(model, loss_fn, params, initial, probe, allowed, answer_rows,
                 fidelity_init) -> dict:
  """Per-layer drift, fidelity on the answer rows and gradient norms, with their means
  over layers as flat metrics for the summary's persistence table."""
  first_last = ("block_0", f"block_{model.depth - 1}")
  layers = diagnostics.persistence_metrics(
      model.apply, loss_fn, params, initial, (probe["tokens"][:, :-1],), probe, allowed,
      map_layers=first_last, query_rows=answer_rows)
  return {"layers": layers, "fidelity_init": fidelity_init,
          "prior_pattern": np.asarray(allowed, float).tolist(),
          **diagnostics.layer_means(layers)}


def make_evaluate(model, task: arithmetic.ArithmeticTask, test_tokens_TS: np.ndarray,
                  eval_batch: int, loss_fn=None, initial_params=None, prior_NN=None,
                  probe_size: int = 128):
  """Host evaluation of all members on the test set: greedy answers (sequence and digit
  accuracy) and the teacher-forced answer loss, one jitted call per test chunk with the
  members vmapped. With `initial_params` (member index → params at init) and the task's
  prior also the persistence diagnostics on the first `probe_size` test problems."""
  weights_N = jnp.asarray(arithmetic.loss_weights(task))
  start, answer_len = task.prompt_len, task.answer_digits
  apply = lambda params, tokens: model.apply({"params": params}, tokens)
  n_test = len(test_tokens_TS)
  padded = -(-n_test // eval_batch) * eval_batch  # One compiled shape for every chunk.
  tokens_TS = np.concatenate([test_tokens_TS, np.repeat(test_tokens_TS[-1:],
                                                        padded - n_test, axis=0)])
  probe = {"tokens": jnp.asarray(test_tokens_TS[:probe_size])}
  answer_rows = np.zeros(task.n_tokens, bool)
  answer_rows[[p + task.layout.query_offset for p in task.layout.answer]] = True
  allowed = None if prior_NN is None else np.asarray(prior_NN) > 0
  fidelity_init = {}  # member index → fidelity of its initial params.

  def member_metrics(params, tokens_BS):
    logits_BNV = apply(params, tokens_BS[:, :-1])
    loss_B = arithmetic.example_loss(logits_BNV, tokens_BS[:, 1:], weights_N)
    # The teacher-forced pass already holds greedy step 0 (same prefix, causal model).
    first_B1 = jnp.argmax(logits_BNV[:, start - 1], axis=-1).astype(tokens_BS.dtype)[:, None]
    prompt_BN = jnp.concatenate([tokens_BS[:, :start], first_B1], axis=1)
    pred_BA = (jnp.concatenate([first_B1, greedy_decode(apply, params, prompt_BN,
                                                        answer_len - 1)], axis=1)
               if answer_len > 1 else first_B1)
    target_BA = tokens_BS[:, start:start + answer_len]
    return (arithmetic.sequence_correct(pred_BA, target_BA),
            arithmetic.digit_correct(pred_BA, target_BA), loss_B)

  batch_metrics = jax.jit(jax.vmap(member_metrics, in_axes=(0, None)))

  def persistence(i, params):
    if i not in fidelity_init:  # Constant per member: measured once.
      fidelity_init[i] = _persistence(model, loss_fn, initial_params[i], initial_params[i],
                                      probe, allowed, answer_rows, None)["fidelity"]
    return _persistence(model, loss_fn, params, initial_params[i], probe, allowed,
                        answer_rows, fidelity_init[i])

  def evaluate(params_K, members):
    chunks = [batch_metrics(params_K, jnp.asarray(tokens_TS[i:i + eval_batch]))
              for i in range(0, padded, eval_batch)]
    seq_KT, digit_KT, loss_KT = (np.concatenate([np.asarray(c[j]) for c in chunks],
                                                axis=1)[:, :n_test] for j in range(3))
    results = []
    for i in range(len(members)):
      m = {"sequence_accuracy": float(seq_KT[i].mean()),
           "digit_accuracy": float(digit_KT[i].mean()), "loss": float(loss_KT[i].mean())}
      if initial_params is not None:
        m |= persistence(i, engine.unstack(params_K, i))
      results.append(m)
    return results

  return evaluate


def build_group(config: Config, task_name: str, fraction: float) -> engine.Group:
  task = arithmetic.get_task(task_name, config.digits, reverse_answer=config.reverse_answer)
  model = make_model(config)
  members = [engine.Member(task_name, scheme, seed,
                           _member_hparams(config, scheme, fraction))
             for scheme in config.schemes for seed in range(config.seeds)]
  prior_NN = arithmetic.prior(task, config.mask_strength)
  masked = range(config.depth) if config.mask_layers is None else config.mask_layers
  dummy_BN = jnp.zeros((1, task.n_tokens), jnp.int32)
  model_init = jax.jit(lambda key: model.init(key, dummy_BN)["params"])  # One compile.

  initial_params = {}  # member index → params at init, for the drift diagnostics.

  def init_params(member: engine.Member):
    params = _init_params(member)
    initial_params[members.index(member)] = params
    return params

  def _init_params(member: engine.Member):
    key = jax.random.key(member.seed)
    params = model_init(key)
    if member.scheme == "mask":
      return schemes.set_masks_per_layer(params, {f"block_{i}": prior_NN for i in masked})
    return schemes.apply_scheme(member.scheme, params, prior_NN, jax.random.fold_in(key, 2),
                                num_heads=config.num_heads, head_dim=config.head_dim,
                                qk_opt_steps=config.qk_opt_steps,
                                pos_scale=config.qk_pos_scale)

  weights_N = jnp.asarray(arithmetic.loss_weights(task))

  def loss_fn(params, batch):
    tokens_BS = batch["tokens"]
    logits_BNV = model.apply({"params": params}, tokens_BS[:, :-1])
    return arithmetic.loss(logits_BNV, tokens_BS[:, 1:], weights_N)

  splits = {seed: arithmetic.make_splits(task, fraction, seed, config.test_size)
            for seed in range(config.seeds)}
  train_data = {"tokens": jnp.asarray(np.stack([splits[m.seed]["train"] for m in members]))}
  test_tokens = splits[0]["test"]  # The test set is the task's, the same for every seed.
  return engine.Group(
      name=f"{task_name}-f{fraction:g}", members=members, init_params=init_params,
      loss_fn=loss_fn, train_data=train_data,
      evaluate=make_evaluate(model, task, test_tokens, config.eval_batch, loss_fn,
                             initial_params, prior_NN, config.probe_size),
      steps=config.steps, batch_size=config.batch_size, sampling="epoch",
      optim=optim.OptimConfig(optimizer="adamw", schedule="warmup_cosine",
                              total_steps=config.steps, warmup_steps=config.warmup_steps))


def build_groups(config: Config) -> list[engine.Group]:
  return [build_group(config, task, fraction)
          for task in config.tasks for fraction in task_fractions(config, task)]
