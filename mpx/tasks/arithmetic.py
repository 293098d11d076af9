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

import jax
import jax.numpy as jnp
import numpy as np

from mpx import priors

# Token id = index in CHARS: digits are their own ids, which keeps decoding arithmetic.
CHARS = "0123456789+*=$_^"
PLUS, TIMES, EQUALS, END, PAD, BOS = (CHARS.index(c) for c in "+*=$_^")
VOCAB_SIZE = len(CHARS)
OPERATORS = {"addition": "+", "multiplication": "*"}
TASKS = tuple(OPERATORS)
# The held-out test set depends only on the task (not on the seed or the fraction), so
# every seed and every point of a fraction curve is measured on the same problems.
_TEST_STREAM = 0x7E57


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


def loss_weights(task: ArithmeticTask) -> np.ndarray:
  """`[N]` weights on the targets `seq[1:]`: 1 on the answer digits and END."""
  weights_N = np.zeros(task.n_tokens, np.float32)
  weights_N[task.prompt_len - 1:] = 1.0
  return weights_N


# --------------------------------------------------------------------------- splits


def split_indices(task: ArithmeticTask, fraction: float, seed: int,
                  test_size: int = 10_000) -> dict[str, np.ndarray]:
  """Problem indices (`a · 10^b_digits + b`) of a seeded train set and a disjoint test set.

  The train set has `round(fraction · space)` problems drawn with `seed`; the test set is
  fixed per task (see `_TEST_STREAM`). Both are drawn without replacement by numpy, never
  materialising the whole space: the train candidates that fall in the test set are
  dropped, and `n_train + test_size` candidates always leave enough.
  """
  space = task.space_size
  n_train = round(fraction * space)
  if not 0 < fraction < 1 or n_train < 1:
    raise ValueError(f"fraction must be in (0, 1) and give >= 1 problem of {space}; got "
                     f"{fraction}.")
  if test_size < 1 or n_train + test_size > space:
    raise ValueError(f"{n_train} train + {test_size} test problems exceed the {space} of "
                     f"{task.name} ({task.a_digits}x{task.b_digits} digits); lower the "
                     "fraction or test_size.")
  test = np.random.default_rng((_TEST_STREAM, space)).choice(space, test_size,
                                                             replace=False)
  candidates = np.random.default_rng((seed, space)).choice(space, n_train + test_size,
                                                           replace=False)
  train = candidates[~np.isin(candidates, test)][:n_train]
  return {"train": train, "test": test}


def make_splits(task: ArithmeticTask, fraction: float, seed: int,
                test_size: int = 10_000) -> dict[str, np.ndarray]:
  """`{"train": tokens_PS, "test": tokens_TS}`, see `split_indices`."""
  out = {}
  for name, index_P in split_indices(task, fraction, seed, test_size).items():
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
