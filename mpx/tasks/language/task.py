"""The language family: a causal decoder × {default, alibi, mask, mask_nopos} on a text
corpus, and the member-level `Task` the sweep engine trains.

The corpus is tokenized once (`mpx.tasks.language.text`: bytes, or a BPE trained on the training
split and saved with the run), packed into `[S, N + 1]` windows held once on the device
and shared by every member (`DeviceData`; each member draws its own epoch order). The
metric is token-level validation perplexity with the tokenizer named, plus bits per byte
(comparable across tokenizers) and the steps a member took to reach `target_perplexity`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import pathlib
from typing import Callable, ClassVar, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mpx import priors, schemes
from mpx.nn.decoder import causal_decoder
from mpx.nn.transformer import TokenTransformer
from mpx.sweep import engine, optim
from mpx.sweep.data import DeviceData, EvalData
from mpx.tasks.language import text
from mpx.tasks.common import PriorConfig

DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}
TOKENIZER_DIR = "tokenizer"  # In the run folder: the BPE a run trained, reused on resume.


@dataclasses.dataclass(frozen=True)
class Config(PriorConfig):
  """Shared fields: `mpx.tasks.common.PriorConfig` (here: the decoder's widths).

  dataset: `text.DATASETS` ("kjv" is embedded; the others read `data_dir`).
  tokenizer: "bytes" or "bpe" (trained on the training split, `vocab_size` tokens).
  seq_len: tokens per training window (the position embedding and masks are N × N).
  tie_embeddings: the readout is the token embedding transposed.
  steps, warmup_steps: AdamW with linear warmup, then cosine decay to 0.
  eval_sequences: validation windows evaluated (None: all of them); with `select`, as
    many test windows too.
  target_perplexity: the convergence measure, steps until a member's validation
    perplexity first reached it (None: not measured).
  dtype: matmul compute dtype ("bfloat16" on accelerators); implementation: attention
    backend (`mpx.masked_attention`).
  mask_strength is not used: ALiBi's slopes set the prior's strength.
  data_dir: where a downloaded dataset's files are (docs/data.md); vocab_size: the BPE
    vocabulary (bpe only).
  learning_rate: AdamW's peak rate; grad_clip: global-norm clip (None = off).
  eval_batch: validation windows per compiled evaluation call.
  """
  SCHEME_NAMES: ClassVar[tuple[str, ...]] = schemes.LANGUAGE_SCHEMES
  schemes: tuple[str, ...] = schemes.LANGUAGE_SCHEMES
  dataset: str = "kjv"
  data_dir: str | None = None
  tokenizer: str = "bytes"
  vocab_size: int | None = None
  seq_len: int = 256
  seeds: int = 3
  width: int = 256
  depth: int = 6
  num_heads: int = 8
  head_dim: int = 32
  mlp_dim: int = 1024
  tie_embeddings: bool = True
  batch_size: int = 32
  learning_rate: float = 1e-3
  weight_decay: float = 0.1
  grad_clip: float | None = 1.0
  steps: int = 5000
  warmup_steps: int = 200
  eval_sequences: int | None = None
  eval_batch: int = 64
  target_perplexity: float | None = None
  probe_size: int = 16
  dtype: str = "float32"
  implementation: str = "reference"

  def optional_modules(self) -> tuple[str, ...]:
    """The BPE is the tokenizers library's; bytes need nothing."""
    return ("tokenizers",) if self.tokenizer == "bpe" else ()

  def __post_init__(self):
    super().__post_init__()
    if self.dataset not in text.DATASETS:
      raise ValueError(f"dataset={self.dataset!r}; choose from {text.DATASETS}.")
    if self.tokenizer not in text.TOKENIZERS:
      raise ValueError(f"tokenizer={self.tokenizer!r}; choose from {text.TOKENIZERS}.")
    if self.tokenizer == "bpe" and (self.vocab_size is None or self.vocab_size < 300):
      raise ValueError(f"tokenizer=bpe needs vocab_size >= 300 (the 256 bytes, EOS and "
                       f"merges); got {self.vocab_size}.")
    if self.mask_strength != PriorConfig.mask_strength:
      raise ValueError("mask_strength does not apply to language: the ALiBi slopes set "
                       "the prior; leave it out.")
    if not self.per_head_mask:
      raise ValueError("the ALiBi prior has one slope per head: per_head_mask must be true.")
    if self.dtype not in DTYPES:
      raise ValueError(f"dtype={self.dtype!r}; choose from {tuple(DTYPES)}.")
    if self.seq_len < 2:
      raise ValueError(f"seq_len={self.seq_len} must be >= 2.")
    if not 0 <= self.warmup_steps < self.steps:
      raise ValueError(f"need 0 <= warmup_steps < steps; got {self.warmup_steps}, "
                       f"{self.steps}.")
    if self.eval_sequences is not None and self.eval_sequences < 1:
      raise ValueError(f"eval_sequences={self.eval_sequences} must be >= 1 (or none for "
                       "the whole validation split).")
    if self.target_perplexity is not None and not self.target_perplexity > 1:
      raise ValueError(f"target_perplexity={self.target_perplexity} must be > 1.")
    if not self.learning_rate > 0:
      raise ValueError(f"learning_rate={self.learning_rate} must be > 0.")
    if self.select is not None and "test" not in text.dataset_splits(self.dataset):
      raise ValueError(f"select={self.select}: {self.dataset} has no test split to report "
                       "while validation chooses; use dataset=kjv or wikitext2, or run "
                       "without select.")


# --------------------------------------------------------------------------- model


def make_model(config: Config, vocab_size: int) -> TokenTransformer:
  """The decoder every scheme shares: learned positions (zeroed and frozen by the
  no-position schemes) and a per-head mask in the chosen layers."""
  return causal_decoder(vocab_size, **config.model_shape(),  # per_head_mask: checked True.
                        tie_embeddings=config.tie_embeddings, dtype=DTYPES[config.dtype],
                        implementation=config.implementation)


def half_weight_pattern(seq_len: int, num_heads: int) -> np.ndarray:
  """`[H, N, N]` the keys ALiBi weights at least half (e^(−m_h (i−j)) ≥ ½, j ≤ i): the
  pattern fidelity is scored on, the same for every scheme."""
  distance = np.arange(seq_len)[:, None] - np.arange(seq_len)[None, :]
  reach = np.log(2.0) / priors.alibi_slopes(num_heads)
  return (distance[None] >= 0) & (distance[None] <= reach[:, None, None])


# --------------------------------------------------------------------------- data


@functools.lru_cache(maxsize=4)
def tokenizer_for(config: Config):
  """The run's tokenizer: bytes, or a BPE trained on the training split (deterministic:
  every process of a run, and a resumed run, trains the same one; `save_tokenizer`
  checks that)."""
  train = (text.read_documents(config.dataset, "train", config.data_dir)
           if config.tokenizer == "bpe" else None)
  return text.make_tokenizer(config.tokenizer, train, config.vocab_size)


def separator(config: Config) -> bool:
  """WikiText's documents are the lines of one text: no EOS between them."""
  return config.dataset != "wikitext2"


@functools.lru_cache(maxsize=4)
def windows(config: Config, split: str) -> np.ndarray:
  """`[S, N + 1]` packed token windows of a split."""
  tokenizer = tokenizer_for(config)
  ids = text.encode_documents(tokenizer,
                              text.read_documents(config.dataset, split, config.data_dir),
                              separator=separator(config))
  return text.pack(ids, config.seq_len)


# --------------------------------------------------------------------------- task


def make_model_init(config: Config, vocab_size: int) -> Callable:
  """key → the model's params, in one compile (eager, each random op compiles on its own)."""
  model = make_model(config, vocab_size)
  tokens = jnp.zeros((1, config.seq_len), jnp.int32)
  return engine.jit_once(lambda key: model.init(key, tokens)["params"])


def make_task(config: Config, tokenizer, n_validation: int = 0) -> engine.Task:
  """Init by scheme; next-token cross-entropy; per evaluated window the summed NLL and
  the bytes its targets stand for (with `select`, `n_validation` validation windows, then
  the test windows)."""
  model = make_model(config, tokenizer.vocab_size)
  byte_lengths = jnp.asarray(tokenizer.byte_lengths(), jnp.float32)
  init_params = make_model_init(config, tokenizer.vocab_size)

  def init(member: engine.Member):
    params = init_params(jax.random.key(member.seed))
    return schemes.apply_language_scheme(member.scheme, params, config.num_heads)

  def nll(params, tokens_BN1):
    tokens_BN1 = tokens_BN1.astype(jnp.int32)
    logits_BNV = model.apply({"params": params}, tokens_BN1[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(
        logits_BNV.astype(jnp.float32), tokens_BN1[:, 1:]), tokens_BN1[:, 1:]

  def loss(params, batch, key):
    del key
    return nll(params, batch["tokens"])[0].mean(), {}

  def eval_step(params, batch):
    nll_BN, targets_BN = nll(params, batch["tokens"])
    return {"nll": nll_BN.sum(-1), "bytes": byte_lengths[targets_BN].sum(-1)}

  def scores(nll_S, bytes_S):
    total_nll, tokens = float(np.sum(nll_S)), nll_S.size * config.seq_len
    return {"perplexity": math.exp(total_nll / tokens), "loss": total_nll / tokens,
            "bits_per_byte": total_nll / math.log(2) / float(np.sum(bytes_S))}

  def summarize(values, member):
    """Without `select`: the validation windows. With it, the first `n_validation` windows
    are validation, which selection reads (`val_`), and the rest the reported test split."""
    del member
    if config.select is None:
      return scores(values["nll"], values["bytes"])
    split = lambda name: np.split(values[name], [n_validation])
    (val_nll, test_nll), (val_bytes, test_bytes) = split("nll"), split("bytes")
    return scores(test_nll, test_bytes) | {
        f"val_{k}": v for k, v in scores(val_nll, val_bytes).items()}

  return engine.Task(init=init, loss=loss, eval_step=eval_step, summarize=summarize)


def members(config: Config, tokenizer) -> list[engine.Member]:
  """Scheme × seed; the prior learns at `mask_lr_multiplier` in the mask schemes and is
  frozen in the others, positions are frozen (at zero) where the scheme has none."""
  grid = []
  for scheme in config.schemes:
    trains = schemes.language_scheme_trains(scheme)
    hparams = {"learning_rate": config.learning_rate, "weight_decay": config.weight_decay,
               "mask_lr_multiplier": config.mask_lr_multiplier if trains["mask"] else 0.0,
               optim.POSITION_MULTIPLIER: 1.0 if trains["positions"] else 0.0}
    # The task names the tokenizer: perplexity is per token of that tokenizer.
    grid += [engine.Member(f"{config.dataset}-{tokenizer.name}", scheme, seed, hparams)
             for seed in range(config.seeds)]
  return grid


def make_group(config: Config) -> engine.Group:
  """Every scheme and seed on one copy of the packed training windows; perplexity on the
  first `eval_sequences` validation windows; the probe is the first `probe_size`."""
  tokenizer = tokenizer_for(config)
  train = windows(config, "train")
  valid = windows(config, "validation")[:config.eval_sequences]
  evaluated = valid
  if config.select is not None:  # Selection reads validation; the report, the test split.
    evaluated = np.concatenate([valid, windows(config, "test")[:config.eval_sequences]])
  if len(train) < config.batch_size:
    raise ValueError(f"the training split packs into {len(train)} windows of "
                     f"{config.seq_len + 1} tokens, fewer than batch_size="
                     f"{config.batch_size}; lower seq_len or batch_size.")
  group_members = members(config, tokenizer)
  probe_tokens = valid[:config.probe_size].astype(np.int32)
  pattern = half_weight_pattern(config.seq_len, config.num_heads)
  masked = config.masked_layers
  probe = engine.Probe(
      apply=make_model(config, tokenizer.vocab_size).apply, inputs=(probe_tokens[:, :-1],),
      batch={"tokens": probe_tokens},
      # No attention maps: N × N per member per evaluation is 75 MB of metrics.jsonl for
      # the cpu preset's N = 128 (fidelity on the pattern summarises them).
      patterns=[{f"block_{i}": pattern for i in masked}] * len(group_members))
  return engine.Group(
      name=group_members[0].task, members=group_members,
      task=make_task(config, tokenizer, len(valid) if config.select is not None else 0),
      data=DeviceData({"tokens": train}, sampling="epoch"),
      eval_data=EvalData({"tokens": evaluated}, config.eval_batch), steps=config.steps,
      batch_size=config.batch_size, probe=probe, members_per_call=config.members_per_call,
      chunk_options=config.step_variant,
      optim=optim.OptimConfig(optimizer="adamw", schedule="warmup_cosine",
                              total_steps=config.steps, warmup_steps=config.warmup_steps,
                              grad_clip=config.grad_clip, b2=0.95))


def steps_to_target(history: Sequence[dict], target: float | None) -> dict:
  """The first evaluated step with perplexity ≤ target (None when never reached), and
  whether it was reached (1 / 0: the table's mean is the share of seeds that did, so a
  mean step over the seeds that made it cannot hide the ones that did not)."""
  if target is None:
    return {}
  reached = [r["step"] for r in history
             if r.get("perplexity") is not None and r["perplexity"] <= target]
  return {"steps_to_target": min(reached) if reached else None,
          "reached_target": float(bool(reached))}


def save_tokenizer(config: Config, run_dir: pathlib.Path) -> None:
  """Saves the BPE with the run; on resume, refuses one that no longer matches the
  tokenizer the run was trained with (the training split changed). Bytes need none."""
  if config.tokenizer != "bpe":
    return
  directory = pathlib.Path(run_dir) / TOKENIZER_DIR
  tokenizer = tokenizer_for(config)
  if (directory / "tokenizer.json").exists():
    saved = text.load_tokenizer(directory)
    probe = "".join(text.read_documents(config.dataset, "validation", config.data_dir)[:20])
    if saved.vocab_size != tokenizer.vocab_size or not np.array_equal(
        saved.encode(probe), tokenizer.encode(probe)):
      raise ValueError(f"{directory} holds the BPE this run was trained with, and the one "
                       f"trained now from {config.dataset}'s training split differs; "
                       "resume with the same data, or start a fresh run.")
    return
  tokenizer.save(directory)


# Selection (`select`) reads validation perplexity's log, the mean token loss; the run then
# reports the test split, which only this mode evaluates.
VALIDATION = (("val_loss", "min"),)
SELECTION_NOTE = ("With select, the reported perplexity and bits per byte are the test "
                  "split's (validation chose); without it they are validation's.")
