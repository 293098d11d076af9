"""Low-data arithmetic: 3-digit addition and multiplication as character-level LM tasks.

The paper gives only its numbers (addition on 0.4% of the data, multiplication on 3%), so
the setup follows Lee et al., "Teaching Arithmetic to Small Transformers" (2023), and every
choice is a field of `ArithmeticTask`.

A problem is one fixed-length token sequence (no padding is ever needed):

    BOS a_{k-1}..a_0 op b_{k-1}..b_0 = c ... END

Operands are zero-padded, most significant digit first. The answer has a fixed number of
digits (zero-padded) and is reversed (least significant first) unless
`reverse_answer=False`: reversed, every carry is computed before the digit that needs
it. The positions are those of `priors.arithmetic_layout`, so the alignment prior of a
task matches its tokens by construction. A causal LM reads `seq[:-1]` (exactly
`layout.n_tokens` tokens) and predicts `seq[1:]`; the loss counts only the answer digits
and END (`loss_weights`).

Multiplication defaults to 3×3 digits (6-digit answers). 2×2 has only 10^4 problems: its
3% is 300 training examples and the disjoint test set could not reach 10,000 problems; 3×3
keeps the paper's 3% (30,000 of 10^6 pairs) a low-data regime on the same space as
addition, with a test set of the size the addition task uses. `digits` changes it.

Host-side numpy for data; the metrics are pure jnp functions that also take numpy arrays.
Shapes are in the names: P problems, S sequence (`n_tokens + 1`), N model input, A answer
digits, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from mpx import priors, schemes
from mpx.nn import TokenTransformer, causal_decoder, greedy_decode
from mpx.sweep import engine, optim
from mpx.sweep.data import DeviceData, EvalData
from mpx.tasks.common import PriorConfig

# Token id = index in CHARS: digits are their own ids, which keeps decoding arithmetic.
CHARS = "0123456789+*=$_^"
PLUS, TIMES, EQUALS, END, PAD, BOS = (CHARS.index(c) for c in "+*=$_^")
VOCAB_SIZE = len(CHARS)
OPERATORS = {"addition": "+", "multiplication": "*"}
TASKS = tuple(OPERATORS)
# The held-out test set depends only on the task (not on the seed or the fraction), so
# every seed and every point of a fraction curve is measured on the same problems.
_TEST_STREAM = 0x7E57
# With `select` only: validation problems, fixed per task, drawn from neither the test set
# nor (then) any training set; selection reads them, the report never does.
_VALIDATION_STREAM = 0x7A1D


@dataclasses.dataclass(frozen=True)
class ArithmeticTask:
  """One arithmetic format.

  Attributes:
    name: "addition" or "multiplication".
    a_digits, b_digits: operand lengths; operands range over [0, 10^digits).
    reverse_answer: answer least significant digit first (the default, as in
      `priors.arithmetic_layout`).
  """
  name: str
  a_digits: int = 3
  b_digits: int = 3
  reverse_answer: bool = True

  def __post_init__(self):
    if self.name not in OPERATORS:
      raise ValueError(f"unknown arithmetic task {self.name!r}; choose from {TASKS}.")
    for field in ("a_digits", "b_digits"):
      if not 1 <= getattr(self, field) <= 6:
        raise ValueError(f"{field} must be in [1, 6] (the space is enumerated by index); "
                         f"got {getattr(self, field)}.")

  @property
  def operator(self) -> int:
    return CHARS.index(OPERATORS[self.name])

  @property
  def answer_digits(self) -> int:
    """Enough digits for the largest answer: max + 1 for a sum, the sum for a product."""
    if self.name == "addition":
      return max(self.a_digits, self.b_digits) + 1
    return self.a_digits + self.b_digits

  @property
  def layout(self) -> priors.ArithmeticLayout:
    return priors.arithmetic_layout(self.a_digits, self.b_digits, self.answer_digits,
                                    reverse_answer=self.reverse_answer, bos=True)

  @property
  def n_tokens(self) -> int:
    """The model's input length (the layout's, so the prior fits the model)."""
    return self.layout.n_tokens

  @property
  def seq_len(self) -> int:
    return self.n_tokens + 1  # + END

  @property
  def prompt_len(self) -> int:
    """Tokens before the first answer digit: BOS, operands, operator and `=`."""
    return self.n_tokens - self.answer_digits

  @property
  def space_size(self) -> int:
    return 10 ** (self.a_digits + self.b_digits)

  def compute(self, a_P: np.ndarray, b_P: np.ndarray) -> np.ndarray:
    a_P, b_P = np.asarray(a_P, np.int64), np.asarray(b_P, np.int64)
    return a_P + b_P if self.name == "addition" else a_P * b_P


def get_task(name: str, digits: int | tuple[int, int] = 3, *,
             reverse_answer: bool = True) -> ArithmeticTask:
  """`digits` is one length for both operands or `(a_digits, b_digits)`."""
  a, b = (digits, digits) if isinstance(digits, int) else digits
  return ArithmeticTask(name, a, b, reverse_answer)


def prior(task: ArithmeticTask, strength: float = 4.0, *, carry: bool = True) -> jax.Array:
  """The digit-alignment prior composed with the causal mask, `[N, N]` logits.

  Rows predicting an answer digit read their aligned operand digits and themselves
  (`priors.addition_prior` / `multiplication_prior`); other rows are open. Future keys
  are suppressed too: for the mask scheme that changes nothing (the causal mask hides
  them), and it makes the QK schemes' target pattern (`prior > 0`) one a causal model
  can realise.
  """
  build = priors.addition_prior if task.name == "addition" else priors.multiplication_prior
  aligned = np.asarray(build(task.layout, strength, carry=carry)) > 0
  causal = np.tril(np.ones((task.n_tokens, task.n_tokens), bool))
  return priors.from_adjacency(aligned & causal, strength)


# --------------------------------------------------------------------------- tokens


def _digits_PK(x_P: np.ndarray, k: int) -> np.ndarray:
  """Digit p (place 10^p) of each number in column p."""
  return (np.asarray(x_P, np.int64)[:, None] // 10 ** np.arange(k)) % 10


def encode(task: ArithmeticTask, a_P, b_P) -> np.ndarray:
  """Operands → full sequences `[P, S]` int32, answer included."""
  a_P, b_P = np.atleast_1d(np.asarray(a_P, np.int64)), np.atleast_1d(np.asarray(b_P, np.int64))
  for name, x, k in (("a", a_P, task.a_digits), ("b", b_P, task.b_digits)):
    if x.size and (x.min() < 0 or x.max() >= 10 ** k):
      raise ValueError(f"operand {name} must be in [0, 10^{k}) for {task.name} with "
                       f"{k} digits; got values in [{x.min()}, {x.max()}].")
  if a_P.shape != b_P.shape or a_P.ndim != 1:
    raise ValueError(f"a and b must be 1-D of one shape; got {a_P.shape}, {b_P.shape}.")
  layout = task.layout
  tokens_PS = np.full((len(a_P), task.seq_len), PAD, np.int32)
  tokens_PS[:, 0] = BOS
  tokens_PS[:, layout.a[0] + 1] = task.operator
  tokens_PS[:, layout.b[0] + 1] = EQUALS
  tokens_PS[:, -1] = END
  for positions, x in ((layout.a, a_P), (layout.b, b_P),
                       (layout.answer, task.compute(a_P, b_P))):
    tokens_PS[:, list(positions)] = _digits_PK(x, len(positions))
  return tokens_PS


def answer_value(task: ArithmeticTask, answer_tokens_PA) -> np.ndarray:
  """Answer tokens (sequence order) → integers; −1 where a token is not a digit."""
  answer_PA = np.asarray(answer_tokens_PA, np.int64)
  if answer_PA.ndim != 2 or answer_PA.shape[1] != task.answer_digits:
    raise ValueError(f"answer tokens must be [P, {task.answer_digits}]; got "
                     f"{answer_PA.shape}.")
  places_PA = answer_PA if task.reverse_answer else answer_PA[:, ::-1]
  value_P = (places_PA * 10 ** np.arange(task.answer_digits)).sum(1)
  return np.where((answer_PA <= 9).all(1), value_P, -1)


def _number(tokens_PS: np.ndarray, positions) -> np.ndarray:
  return (tokens_PS[:, list(positions)].astype(np.int64) * 10 ** np.arange(len(positions))).sum(1)


def decode(task: ArithmeticTask, tokens_PS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Full sequences → (a, b, answer) integers; the inverse of `encode`."""
  tokens_PS = np.atleast_2d(np.asarray(tokens_PS))
  if tokens_PS.shape[1] != task.seq_len:
    raise ValueError(f"{task.name} sequences have {task.seq_len} tokens; got "
                     f"{tokens_PS.shape[1]}.")
  layout = task.layout
  fixed = {0: BOS, layout.a[0] + 1: task.operator, layout.b[0] + 1: EQUALS,
           task.seq_len - 1: END}
  for pos, token in fixed.items():
    if np.any(tokens_PS[:, pos] != token):
      raise ValueError(f"not a {task.name} sequence: position {pos} must be "
                       f"{CHARS[token]!r}.")
  digits = list(layout.a) + list(layout.b) + list(layout.answer)
  if np.any(tokens_PS[:, digits] > 9):
    raise ValueError(f"not a {task.name} sequence: a digit position holds a symbol.")
  start = task.prompt_len
  answer = answer_value(task, tokens_PS[:, start:start + task.answer_digits])
  return _number(tokens_PS, layout.a), _number(tokens_PS, layout.b), answer


def to_text(tokens_S) -> str:
  """One sequence as characters, e.g. `^123+045=8610$` (reversed answer 168)."""
  return "".join(CHARS[int(t)] for t in np.asarray(tokens_S))


def from_text(text: str) -> np.ndarray:
  unknown = sorted(set(text) - set(CHARS))
  if unknown:
    raise ValueError(f"characters {unknown} are not in the vocabulary {CHARS!r}.")
  return np.array([CHARS.index(c) for c in text], np.int32)


def answer_rows_N(task: ArithmeticTask) -> np.ndarray:
  """`[N]` True at the rows that predict an answer digit (position − 1 in a causal LM)."""
  rows_N = np.zeros(task.n_tokens, bool)
  rows_N[[p + task.layout.query_offset for p in task.layout.answer]] = True
  return rows_N


def loss_weights(task: ArithmeticTask) -> np.ndarray:
  """`[N]` weights on the targets `seq[1:]`: 1 on the answer digits and END."""
  weights_N = np.zeros(task.n_tokens, np.float32)
  weights_N[task.prompt_len - 1:] = 1.0
  return weights_N


# --------------------------------------------------------------------------- splits


def split_indices(task: ArithmeticTask, fraction: float, seed: int,
                  test_size: int = 10_000, validation_size: int = 0
                  ) -> dict[str, np.ndarray]:
  """Problem indices (`a · 10^b_digits + b`) of a seeded train set and a disjoint test set
  (and, with `validation_size`, a validation set disjoint from both).

  The train set has `round(fraction · space)` problems drawn with `seed`; the test and
  validation sets are fixed per task (`_TEST_STREAM`, `_VALIDATION_STREAM`). All are drawn
  without replacement by numpy, never materialising the whole space: candidates that fall
  in an earlier set are dropped, and drawing as many extra as those sets hold always
  leaves enough. Without a validation set the train set is exactly the one drawn before
  validation existed.
  """
  space = task.space_size
  n_train = round(fraction * space)
  if not 0 < fraction < 1 or n_train < 1:
    raise ValueError(f"fraction must be in (0, 1) and give >= 1 problem of {space}; got "
                     f"{fraction}.")
  if test_size < 1 or validation_size < 0 or n_train + test_size + validation_size > space:
    raise ValueError(f"{n_train} train + {test_size} test + {validation_size} validation "
                     f"problems exceed the {space} of {task.name} ({task.a_digits}x"
                     f"{task.b_digits} digits); lower the fraction, test_size or "
                     "validation_size.")
  draw = lambda stream, n: np.random.default_rng((stream, space)).choice(space, n,
                                                                         replace=False)
  out = {"test": draw(_TEST_STREAM, test_size)}
  held = out["test"]
  if validation_size:
    candidates = draw(_VALIDATION_STREAM, validation_size + test_size)
    out["validation"] = candidates[~np.isin(candidates, held)][:validation_size]
    held = np.concatenate([held, out["validation"]])
  candidates = draw(seed, n_train + len(held))
  return {"train": candidates[~np.isin(candidates, held)][:n_train]} | out


def make_splits(task: ArithmeticTask, fraction: float, seed: int,
                test_size: int = 10_000, validation_size: int = 0) -> dict[str, np.ndarray]:
  """`{"train": tokens_PS, "test": tokens_TS}` (and "validation"), see `split_indices`."""
  out = {}
  for name, index_P in split_indices(task, fraction, seed, test_size,
                                     validation_size).items():
    a_P, b_P = np.divmod(index_P, 10 ** task.b_digits)
    out[name] = encode(task, a_P, b_P)
  return out


# --------------------------------------------------------------------------- metrics


def token_cross_entropy(logits_BNV: jax.Array, targets_BN: jax.Array) -> jax.Array:
  log_probs_BNV = jax.nn.log_softmax(logits_BNV.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(log_probs_BNV, targets_BN[..., None], axis=-1)[..., 0]


def example_loss(logits_BNV, targets_BN, weights_N) -> jax.Array:
  """`[B]` mean cross-entropy over each example's weighted targets."""
  weights_N = jnp.asarray(weights_N, jnp.float32)
  return (token_cross_entropy(logits_BNV, targets_BN) @ weights_N) / weights_N.sum()


def loss(logits_BNV, targets_BN, weights_N) -> jax.Array:
  """Mean cross-entropy over the answer digits and END (teacher forced)."""
  return example_loss(logits_BNV, targets_BN, weights_N).mean()


def sequence_correct(pred_BA, target_BA) -> jax.Array:
  """`[B]` 1.0 where the whole answer is exact."""
  return jnp.all(jnp.asarray(pred_BA) == jnp.asarray(target_BA), axis=-1).astype(jnp.float32)


def digit_correct(pred_BA, target_BA) -> jax.Array:
  """`[B]` share of answer digits right, place by place."""
  return jnp.mean(jnp.asarray(pred_BA) == jnp.asarray(target_BA), axis=-1, dtype=jnp.float32)


def sequence_accuracy(pred_BA, target_BA) -> float:
  return float(sequence_correct(pred_BA, target_BA).mean())


def digit_accuracy(pred_BA, target_BA) -> float:
  return float(digit_correct(pred_BA, target_BA).mean())


# --------------------------------------------------------------------------- the family
# The member-level Task of the arithmetic experiment: a causal decoder trained with the
# answer loss, its four init schemes, greedy-decoding evaluation, the persistence probe.

DEFAULT_FRACTIONS = {"addition": 0.004, "multiplication": 0.03}  # The paper's per task.


@dataclasses.dataclass(frozen=True)
class Config(PriorConfig):
  """Shared fields: `mpx.tasks.common.PriorConfig`. fractions: the data fractions to train on; None = the paper's per task
  (`DEFAULT_FRACTIONS`), a tuple = that sweep for every task (one group each).

  digits: operand digits of both operands (3: addition over 10^6 pairs; see
    the module docstring for why multiplication is 3×3 too).
  test_size: held-out problems, disjoint from every training set.
  validation_size: with `select` only, problems that selection reads (`VALIDATION`), drawn
    from neither the test set nor any training set; without `select` none is drawn and
    the training sets are unchanged.
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
  tasks: "addition" and/or "multiplication", one group per task and fraction.
  reverse_answer: the answer's digits least-significant first (Lee et al.'s format).
  learning_rate / warmup_steps / steps: AdamW's peak rate, its linear warmup, the
    training steps (cosine decay to the end).
  """
  width: int = 384       # Lee et al.'s NanoGPT: 6 × 384, MLP 4×, AdamW wd 0.1.
  depth: int = 6
  mlp_dim: int = 1536
  weight_decay: float = 0.1
  tasks: tuple[str, ...] = TASKS
  seeds: int = 5
  fractions: tuple[float, ...] | None = None
  digits: int = 3
  reverse_answer: bool = False
  learning_rate: float = 1e-3
  warmup_steps: int = 100
  steps: int = 5000
  test_size: int = 10_000
  validation_size: int = 2000
  eval_batch: int = 2000

  def __post_init__(self):
    super().__post_init__()
    unknown = [t for t in self.tasks if t not in TASKS]
    if unknown or not self.tasks:
      raise ValueError(f"unknown tasks {unknown or '()'}; choose from {TASKS}.")
    if self.fractions is not None and not (self.fractions and
                                           all(0 < f < 1 for f in self.fractions)):
      raise ValueError(f"fractions must lie in (0, 1); got {self.fractions}.")
    if self.validation_size < 1:
      raise ValueError(f"validation_size={self.validation_size} must be >= 1.")
    if not 0 < self.probe_size <= self.test_size:
      raise ValueError(f"probe_size={self.probe_size} must be in [1, test_size="
                       f"{self.test_size}].")
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f"warmup_steps={self.warmup_steps} must be in [0, steps="
                       f"{self.steps}).")


def make_model(config: Config) -> TokenTransformer:
  return causal_decoder(VOCAB_SIZE, **config.model_shape())


def make_model_init(config: Config, n_tokens: int):
  """key → the model's params on `n_tokens` tokens."""
  return _model_init(make_model(config), n_tokens)


@functools.lru_cache(maxsize=None)
def _model_init(model: TokenTransformer, n_tokens: int):
  """One compile for every group of one model (a task's fractions, both discovery
  stages)."""
  dummy_BN = jnp.zeros((1, n_tokens), jnp.int32)
  return engine.jit_once(lambda key: model.init(key, dummy_BN)["params"])


def task_fractions(config: Config, task: str) -> tuple[float, ...]:
  return (DEFAULT_FRACTIONS[task],) if config.fractions is None else config.fractions


def members(config: Config, task: str, fraction: float) -> list[engine.Member]:
  """The member grid of one (task, fraction): scheme × seed; a seed draws both the init
  and the training set, so the schemes of one seed see the same problems."""
  grid = []
  for scheme in config.schemes:
    hparams = {"learning_rate": config.learning_rate, "weight_decay": config.weight_decay,
               "mask_lr_multiplier": config.mask_lr_multiplier if scheme == "mask" else 0.0}
    labels = {"mask_strength": config.mask_strength, "data_fraction": fraction}
    grid += [engine.Member(task, scheme, seed, hparams, labels=labels)
             for seed in range(config.seeds)]
  return grid


def make_task(config: Config, spec: ArithmeticTask) -> engine.Task:
  """Init by scheme (the alignment prior in the mask, or realised by QK-SVD / QK-Opt),
  the answer loss, and per test problem: greedy answer right (sequence and digits) and
  the teacher-forced answer loss."""
  model = make_model(config)
  prior_NN = prior(spec, config.mask_strength)
  masked = config.masked_layers
  model_init = _model_init(model, spec.n_tokens)
  weights_N = jnp.asarray(loss_weights(spec))
  start, answer_len = spec.prompt_len, spec.answer_digits
  apply = lambda params, tokens: model.apply({"params": params}, tokens)

  def init(member: engine.Member):
    key = jax.random.key(member.seed)
    params = model_init(key)
    if member.scheme == "mask":
      return schemes.set_masks_per_layer(params, {f"block_{i}": prior_NN for i in masked})
    return schemes.apply_scheme(member.scheme, params, prior_NN, jax.random.fold_in(key, 2),
                                num_heads=config.num_heads, head_dim=config.head_dim,
                                qk_opt_steps=config.qk_opt_steps,
                                pos_scale=config.qk_pos_scale)

  def train_loss(params, batch, key):
    del key  # No dropout.
    tokens_BS = batch["tokens"]
    return loss(apply(params, tokens_BS[:, :-1]), tokens_BS[:, 1:], weights_N), {}

  def eval_step(params, batch):
    tokens_BS = batch["tokens"]
    logits_BNV = apply(params, tokens_BS[:, :-1])
    loss_B = example_loss(logits_BNV, tokens_BS[:, 1:], weights_N)
    # The teacher-forced pass already holds greedy step 0 (same prefix, causal model).
    first_B1 = jnp.argmax(logits_BNV[:, start - 1], axis=-1).astype(tokens_BS.dtype)[:, None]
    prompt_BN = jnp.concatenate([tokens_BS[:, :start], first_B1], axis=1)
    pred_BA = (jnp.concatenate([first_B1, greedy_decode(apply, params, prompt_BN,
                                                        answer_len - 1)], axis=1)
               if answer_len > 1 else first_B1)
    target_BA = tokens_BS[:, start:start + answer_len]
    return {"sequence_accuracy": sequence_correct(pred_BA, target_BA),
            "digit_accuracy": digit_correct(pred_BA, target_BA), "loss": loss_B}

  def summarize(values, member):
    """The test problems come first; with `select`, the validation problems after them."""
    del member
    metrics = {name: float(np.mean(v[:config.test_size])) for name, v in values.items()}
    if config.select is not None:
      metrics |= {f"val_{name}": float(np.mean(values[name][config.test_size:]))
                  for name in ("sequence_accuracy", "loss")}
    return metrics

  return engine.Task(init=init, loss=train_loss, eval_step=eval_step, summarize=summarize)


# Selection (`select`) reads these, best first: greedy sequence accuracy on the validation
# problems, then their answer loss to break ties (several rates at 0% in multiplication).
VALIDATION = (("val_sequence_accuracy", "max"), ("val_loss", "min"))
SELECTION_NOTE = ("Validation problems are drawn from neither the training sets nor the "
                  "test set; the reported accuracies are on the test set.")


def make_group(config: Config, task_name: str, fraction: float,
               group_members) -> engine.Group:
  """One (task, fraction): each member trains on its seed's sample (`[K, P]` data), all
  are tested on the task's held-out problems; AdamW with warmup and cosine decay; the
  persistence probe is the first `probe_size` test problems, fidelity on the rows that
  predict an answer digit."""
  spec = get_task(task_name, config.digits, reverse_answer=config.reverse_answer)
  validation_size = config.validation_size if config.select is not None else 0
  splits = {seed: make_splits(spec, fraction, seed, config.test_size, validation_size)
            for seed in sorted({m.seed for m in group_members})}
  test_tokens = next(iter(splits.values()))["test"]  # The task's, the same for every seed.
  eval_tokens = (np.concatenate([test_tokens, next(iter(splits.values()))["validation"]])
                 if validation_size else test_tokens)  # As `make_task`'s summarize reads.
  allowed = np.asarray(prior(spec, config.mask_strength)) > 0
  probe_tokens = jnp.asarray(test_tokens[:config.probe_size])
  probe = engine.Probe(apply=make_model(config).apply, inputs=(probe_tokens[:, :-1],),
                       batch={"tokens": probe_tokens},
                       patterns=[{f"block_{i}": allowed for i in range(config.depth)}
                                 for _ in group_members],
                       query_rows=answer_rows_N(spec),
                       map_layers=("block_0", f"block_{config.depth - 1}"))
  return engine.Group(
      name=f"{task_name}-f{fraction:g}", members=list(group_members),
      task=make_task(config, spec),
      data=DeviceData({"tokens": np.stack([splits[m.seed]["train"] for m in group_members])},
                      per_member=True, sampling="epoch"),
      eval_data=EvalData({"tokens": eval_tokens}, config.eval_batch), steps=config.steps,
      batch_size=config.batch_size, probe=probe, members_per_call=config.members_per_call,
      chunk_options=config.step_variant,
      optim=optim.OptimConfig(optimizer="adamw", schedule="warmup_cosine",
                              total_steps=config.steps, warmup_steps=config.warmup_steps))
