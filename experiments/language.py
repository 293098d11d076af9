"""Language modelling: a causal decoder × {default, alibi, mask, mask_nopos}.

    mpx run language --preset quick        # embedded King James Bible, bytes, CPU (< 5 min)
    mpx run language --preset cpu          # the same model, 3 seeds, 2,000 steps (≈ 1 h, 1 core)
    mpx run language --preset wikitext2 --set data_dir=/path/to/wikitext-2-raw
    mpx run language --preset tinystories --set data_dir=/path/to/TinyStories

Expect (the paper): "modest, consistent gains in perplexity and convergence speed" from the
mask prior over the default on WikiText-2 and TinyStories (no numbers given). Expect
(quick): see the README's table and experiments/results/language_quick.md.

Schemes: default (learned absolute positions), alibi (ALiBi as a fixed bias, no absolute
positions), mask (ALiBi's causal distance bias as a learnable mask prior, `M = logit(e^(−m_h
(i−j)))`, slopes 2^(−8h/H), with learned positions), mask_nopos (the same prior without
absolute positions). Data: `mpx.tasks.language.text` reads WikiText-2 (`wikitext-2-raw-v1`,
`wiki.{train,valid,test}.raw`) and TinyStories from `data_dir`: the paper's V1
(`TinyStories-{train,valid}.txt` or the Hugging Face hub's parquet files; `--set
dataset=tinystories_v2` reads V2, `tinystories_all` the JSON shards); a missing dataset
prints where to get it. Nothing is downloaded at run time; config.json records the files
read (`fingerprint`). The family code is `mpx.tasks.language`; this file is the record.

Size: the tinystories preset is 6 layers × 288 wide (llama2.c's 15M model's width and
depth) with a 4,096-token BPE and tied embeddings, about 7.2M weights (masks excluded);
llama2.c's 15M reference (32k vocabulary, untied) reaches 1.072 nats/token validation
loss, which is not comparable across tokenizers: compare bits per byte.
"""

from __future__ import annotations

from mpx.tasks import language
from mpx.tasks.language import text
from mpx.tasks.language import SELECTION_NOTE, VALIDATION, Config  # noqa: F401

NAME = "language"  # `mpx run language`; also when imported as mpx.experiments.language.

METRICS = ("perplexity", "bits_per_byte", "steps_to_target", "reached_target")

PAPER: dict = {}  # The paper gives no numbers (PAPER.md): see the docstring.

PRESETS = {
    # The embedded default: bytes of the KJV, a 2-layer width-64 decoder, 2 seeds.
    "quick": dict(dataset="kjv", tokenizer="bytes", seq_len=128, seeds=2, width=64,
                  depth=2, num_heads=4, head_dim=16, mlp_dim=256, batch_size=16,
                  learning_rate=3e-3, weight_decay=0.1, steps=400, warmup_steps=40,
                  chunk_steps=50, eval_every=50, eval_sequences=96, eval_batch=48,
                  probe_size=8, target_perplexity=10.0),
    # The largest run of the table that fits a 2-core CPU: quick's model, 3 seeds, 5× the
    # steps (≈ 1 h on one core).
    "cpu": dict(dataset="kjv", tokenizer="bytes", seq_len=128, seeds=3, width=64, depth=2,
                num_heads=4, head_dim=16, mlp_dim=256, batch_size=16, learning_rate=3e-3,
                weight_decay=0.1, steps=2000, warmup_steps=100, chunk_steps=50,
                eval_every=100, checkpoint_every=500, eval_sequences=512, eval_batch=64,
                probe_size=8, target_perplexity=6.0),
    "wikitext2": dict(dataset="wikitext2", tokenizer="bpe", vocab_size=8192, seq_len=256,
                      seeds=3, width=256, depth=6, num_heads=8, head_dim=32, mlp_dim=1024,
                      batch_size=32, learning_rate=1e-3, weight_decay=0.1, steps=8000,
                      warmup_steps=400, chunk_steps=100, eval_every=500,
                      checkpoint_every=1000, target_perplexity=150.0, dtype="bfloat16"),
    "tinystories": dict(dataset="tinystories", tokenizer="bpe", vocab_size=4096,
                        seq_len=256, seeds=3, width=288, depth=6, num_heads=6,
                        head_dim=48, mlp_dim=1152, batch_size=128, learning_rate=5e-4,
                        weight_decay=0.1, steps=30000, warmup_steps=1000, chunk_steps=100,
                        eval_every=1000, checkpoint_every=1000, eval_sequences=4096,
                        target_perplexity=8.0, dtype="bfloat16"),
    # Seconds: for the tests.
    "tiny": dict(dataset="kjv", tokenizer="bytes", seq_len=16, seeds=1, width=16, depth=1,
                 num_heads=2, head_dim=8, mlp_dim=32, batch_size=8, steps=8,
                 warmup_steps=2, chunk_steps=4, eval_every=4, eval_sequences=16,
                 eval_batch=16, probe_size=4, target_perplexity=1000.0),
}


def build_groups(config: Config):
  """One group: every scheme × seed on the corpus."""
  return [language.make_group(config)]


def history_metrics(config: Config, history):
  """A member's metrics from its evaluation history: the steps to the target."""
  return language.steps_to_target(history, config.target_perplexity)


def fingerprint(config: Config) -> dict:
  """The data files the run reads, `{split: {file: bytes}}`: config.json records them, and
  a resume that would read other files is refused."""
  splits = ("train", "validation") + (("test",) if config.select is not None else ())
  return {"data_files": text.data_files(config.dataset, splits, config.data_dir)}


def save_run_files(config: Config, run_dir):
  """The BPE the run trains goes into the run folder."""
  language.save_tokenizer(config, run_dir)
