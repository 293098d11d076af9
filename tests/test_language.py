"""The language family: causality with the prior on, the ALiBi prior's per-head slopes,
what each scheme trains, a uniform model's perplexity, the fixed-ALiBi decoder, and
`mpx run language` end to end (BPE saved with the run, steps to the target, a missing
dataset as one message)."""

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpx import attention, cli, priors, report, schemes
from mpx.nn import causal_decoder
from mpx.sweep import config as config_lib
from mpx.sweep import engine, run
from mpx.tasks import language
from mpx.tasks.language import text

EXPERIMENT = config_lib.load_experiment("language")
TINY = language.Config(**EXPERIMENT.PRESETS["tiny"])
N, H = TINY.seq_len, TINY.num_heads


TASK = language.make_task(TINY, text.ByteTokenizer())  # One compiled init for the file.
MODEL = language.make_model(TINY, 257)


def _member_params(scheme):
  member = next(m for m in language.members(TINY, text.ByteTokenizer())
                if m.scheme == scheme)
  return TASK, member, TASK.init(member)


def test_alibi_prior_has_the_per_head_slopes():
  """log σ(M_h,i,j) = −2^(−8h/H) (i − j) on and below the diagonal, in every layer."""
  _, _, params = _member_params("mask")
  slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)
  distance = np.arange(N)[:, None] - np.arange(N)[None, :]
  below = distance >= 0
  for layer in range(TINY.depth):
    bias_HNN = np.asarray(attention.mask_bias(
        params[f"block_{layer}"]["attention"]["mask_logits"]))
    for h in range(H):
      np.testing.assert_allclose(bias_HNN[h][below], -slopes[h] * distance[below],
                                 rtol=1e-4, atol=1e-6)
  assert np.all(np.diff(slopes) < 0)  # Head 1 is the steepest.


# The tiny preset's training loss per step, members [default, alibi, mask, mask_nopos]:
# step 0 is init and loss, steps 1 and 2 follow the first updates (warmup gives step 0 a
# learning rate of 0). Recorded once; a change in init, batching, loss or optimizer moves
# them. rtol: float reassociation only (LLVM -O0, as the tests compile, and the default
# differ by < 4e-7).
GOLDEN_LOSSES = [
    [5.555908203125, 5.551442623138428, 5.55451774597168, 5.551442623138428],
    [5.5615129470825195, 5.559355735778809, 5.56168794631958, 5.559355735778809],
    [5.539806842803955, 5.53622579574585, 5.539163589477539, 5.536223888397217]]


def test_first_steps_match_the_golden_losses():
  (group,) = EXPERIMENT.build_groups(TINY)
  assert [m.scheme for m in group.members] == ["default", "alibi", "mask", "mask_nopos"]
  state, hparams, data = engine.place(group, engine.init_state(group), None)
  chunk = engine.make_train_chunk(group, 1)
  losses = []
  for _ in range(3):
    state, out = chunk(state, hparams, data)
    losses.append(np.asarray(out["train_loss"]))
  np.testing.assert_allclose(losses, GOLDEN_LOSSES, rtol=2e-6)


@pytest.mark.parametrize("scheme", schemes.LANGUAGE_SCHEMES)
def test_loss_at_t_has_zero_gradient_wrt_later_tokens(scheme):
  """The gradient of position t's loss w.r.t. the inputs after t is exactly zero: the
  pos_embed row j is added to input j, so its gradient is the input's."""
  _, _, params = _member_params(scheme)
  tokens = jax.random.randint(jax.random.key(0), (2, N), 0, 257)
  t = 5

  def loss_at_t(pos_embed):
    logits = MODEL.apply({"params": dict(params, pos_embed=pos_embed)}, tokens)
    return jax.nn.log_softmax(logits[:, t])[jnp.arange(2), tokens[:, t]].sum()

  grad_ND = np.asarray(jax.grad(loss_at_t)(params["pos_embed"]))
  assert np.all(grad_ND[t + 1:] == 0.0)
  assert np.all(np.abs(grad_ND[:t + 1]).sum(-1) > 0)  # The past does matter.


def test_each_scheme_trains_what_it_says():
  """After a few steps: the alibi prior and the no-position embeddings did not move, the
  mask schemes' prior did, the default's positions did."""
  (group,) = EXPERIMENT.build_groups(TINY)
  group = dataclasses.replace(group, probe=None)  # Training only: no diagnostics to compile.
  state, _ = run.fit(group, chunk_steps=TINY.chunk_steps)
  initial = [group.task.init(m) for m in group.members]
  for i, member in enumerate(group.members):
    final = jax.tree_util.tree_map(lambda x: np.asarray(x[i]), state.params)
    mask_moved = not np.array_equal(final["block_0"]["attention"]["mask_logits"],
                                    initial[i]["block_0"]["attention"]["mask_logits"])
    pos_moved = not np.array_equal(final["pos_embed"], initial[i]["pos_embed"])
    trains = schemes.language_scheme_trains(member.scheme)
    assert (mask_moved, pos_moved) == (trains["mask"], trains["positions"]), member.scheme
    if not trains["positions"]:
      assert not np.any(final["pos_embed"])


def test_a_uniform_model_has_perplexity_equal_to_the_vocabulary():
  """All-zero params give zero logits: perplexity = V and bits per byte = log2 V
  (byte tokens stand for one byte each)."""
  task, member, params = _member_params("default")
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  windows = language.windows(TINY, "validation")[:8]
  values = {k: np.asarray(v) for k, v in task.eval_step(zeros, {"tokens": windows}).items()}
  metrics = task.summarize(values, member)
  assert metrics["perplexity"] == pytest.approx(257, rel=1e-5)
  assert metrics["bits_per_byte"] == pytest.approx(math.log2(257), rel=1e-5)


def test_fixed_alibi_decoder_is_the_alibi_scheme():
  """`causal_decoder(positions="alibi")` (no pos_embed, frozen ALiBi mask) computes what
  the sweep's alibi member computes, and its mask gets no gradient."""
  _, _, params = _member_params("alibi")
  fixed = causal_decoder(257, width=TINY.width, depth=TINY.depth, num_heads=H,
                         head_dim=TINY.head_dim, mlp_dim=TINY.mlp_dim, positions="alibi",
                         tie_embeddings=True)
  tokens = jax.random.randint(jax.random.key(1), (2, N), 0, 257)
  fixed_params = fixed.init(jax.random.key(0), tokens)["params"]
  assert "pos_embed" not in fixed_params
  np.testing.assert_allclose(fixed_params["block_0"]["attention"]["mask_logits"],
                             priors.alibi_prior(N, H))
  copied = {k: v for k, v in params.items() if k != "pos_embed"}
  np.testing.assert_allclose(fixed.apply({"params": copied}, tokens),
                             MODEL.apply({"params": params}, tokens), rtol=1e-5, atol=1e-6)
  grads = jax.grad(lambda p: fixed.apply({"params": p}, tokens).sum())(copied)
  assert not np.any(grads["block_0"]["attention"]["mask_logits"])


def test_tied_embeddings_read_out_through_the_embedding():
  model = causal_decoder(11, width=8, depth=1, num_heads=2, tie_embeddings=True)
  params = model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))["params"]
  assert "head" not in params
  with pytest.raises(ValueError, match="positions"):
    causal_decoder(11, positions="rotary")


def test_steps_to_target_is_the_first_step_at_or_below_it():
  history = [{"step": 0, "perplexity": 250.0}, {"step": 50, "perplexity": 9.0},
             {"step": 100, "perplexity": 7.5}, {"step": 150, "perplexity": 8.5}]
  assert language.steps_to_target(history, 8.0) == {"steps_to_target": 100,
                                                    "reached_target": 1.0}
  assert language.steps_to_target(history, 5.0) == {"steps_to_target": None,
                                                    "reached_target": 0.0}
  assert language.steps_to_target(history, None) == {}


def test_bad_config_names_the_fix():
  with pytest.raises(ValueError, match="vocab_size"):
    dataclasses.replace(TINY, tokenizer="bpe", vocab_size=None)
  with pytest.raises(ValueError, match="mask_strength"):
    dataclasses.replace(TINY, mask_strength=8.0)
  with pytest.raises(ValueError, match="schemes"):
    dataclasses.replace(TINY, schemes=("qk_svd",))


def test_run_saves_its_bpe_and_reports_steps_to_target(tmp_path, capsys):
  """A BPE run end to end: the tokenizer is in the run folder, the table names it, the
  summary has perplexity and steps_to_target, config.json the data files read; a resume
  refuses a BPE that no longer matches the one trained from the data (before any
  training)."""
  out = tmp_path / "run"
  # Perplexity ≈ 301 at init, ≈ 295 after 4 steps: a target the init does not meet.
  sets = ["tokenizer=bpe", "vocab_size=300", "schemes=default,mask", "target_perplexity=297"]
  args = ["run", "language", "--preset", "tiny", "--out", str(out)]
  for s in sets:
    args += ["--set", s]
  assert cli.main(args) == 0
  err = capsys.readouterr().err  # Every figure of a language run is drawn.
  assert "plots: " in err and "no plots" not in err
  assert (out / "plots" / "overview.png").exists()
  saved = text.load_tokenizer(out / language.TOKENIZER_DIR)
  assert saved.name == "bpe300" and saved.vocab_size == 300
  members = json.loads((out / "summary.json").read_text())["members"]
  assert {m["scheme"] for m in members} == {"default", "mask"}
  records = report.read_metrics(out)
  for m in members:
    assert m["task"] == "kjv-bpe300"
    assert 1 < m["metrics"]["perplexity"] < 300
    history = [r for r in records if r["scheme"] == m["scheme"]]
    assert history[0]["step"] == 0 and history[0]["perplexity"] > 297
    first = next(r["step"] for r in history if r["perplexity"] <= 297)
    assert m["metrics"]["steps_to_target"] == first > 0
    assert m["metrics"]["reached_target"] == 1.0
  assert "| kjv-bpe300 | mask |" in (out / "summary.md").read_text()
  recorded = json.loads((out / "config.json").read_text())["fingerprint"]["data_files"]
  assert recorded == text.data_files("kjv", ("train", "validation"))
  other = text.train_bpe(["an entirely different corpus " * 50], 300)
  other.save(out / language.TOKENIZER_DIR)
  with pytest.raises(SystemExit):  # The run's BPE no longer matches what it trains on.
    cli.main(args + ["--resume"])
  assert "differs" in capsys.readouterr().err


def test_missing_dataset_is_one_message(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    cli.main(["run", "language", "--preset", "wikitext2", "--set", f"data_dir={tmp_path}",
              "--out", str(tmp_path / "run")])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert "wiki.train.raw" in err and str(tmp_path) in err and "Traceback" not in err


def _words(rng, n):
  vocab = ["the", "little", "dog", "ran", "to", "a", "park", "and", "saw", "bird", "Lily",
           "happy", "tree", "was", "big", "red", "ball", "said", "mom", "day", "sun", "ö"]
  return " ".join(rng.choice(vocab, n))


def _write_wikitext(root, rng):
  for split, lines in (("train", 400), ("valid", 40), ("test", 40)):
    body = [" = Valkyria Chronicles III = \n", "\n"]
    for i in range(lines):
      body += [f" = = Section {i} = = \n", "\n", f" {_words(rng, 60)} . \n", "\n"]
    (root / f"wiki.{split}.raw").write_text("".join(body), encoding="utf-8")


def test_selection_reads_validation_and_the_report_the_test_split():
  """With select, the evaluated windows are validation then test: `val_` metrics are the
  validation windows' (all selection reads), the reported ones the test windows'."""
  config = dataclasses.replace(TINY, select="learning_rate")
  (group,) = EXPERIMENT.build_groups(config)
  valid, test = (language.windows(TINY, s)[:TINY.eval_sequences] for s in ("validation", "test"))
  np.testing.assert_array_equal(group.eval_data.arrays["tokens"], np.concatenate([valid, test]))
  n = len(valid)
  nll = np.concatenate([np.full(n, 2.0), np.full(len(test), 1.0)]) * TINY.seq_len
  metrics = group.task.summarize({"nll": nll, "bytes": np.full(len(nll), TINY.seq_len)},
                                 group.members[0])
  assert metrics["val_loss"] == pytest.approx(2.0) and metrics["loss"] == pytest.approx(1.0)
  assert metrics["perplexity"] == pytest.approx(math.e)
  assert EXPERIMENT.VALIDATION == (("val_loss", "min"),)
  assert "test" in EXPERIMENT.fingerprint(config)["data_files"]
  (plain,) = EXPERIMENT.build_groups(TINY)
  np.testing.assert_array_equal(plain.eval_data.arrays["tokens"], valid)
  with pytest.raises(ValueError, match="no test split.*dataset=kjv or wikitext2"):
    dataclasses.replace(config, dataset="tinystories")


def _write_tinystories(root, rng):
  """The paper's V1 beside V2 (other stories): the preset reads V1."""
  for version in ("TinyStories", "TinyStoriesV2-GPT4"):
    for split, stories in (("train", 600), ("valid", 60)):
      text = "\n<|endoftext|>\n".join(f"Once upon a time {_words(rng, 50)}."
                                      for _ in range(stories))
      (root / f"{version}-{split}.txt").write_text(text + "\n", encoding="utf-8")


@pytest.mark.parametrize("preset, write, trains, files", [
    ("wikitext2", _write_wikitext, True, ("wiki.train.raw", "wiki.valid.raw")),
    ("tinystories", _write_tinystories, False,
     ("TinyStories-train.txt", "TinyStories-valid.txt"))])
def test_paper_presets_build_and_train_on_generated_files(tmp_path, preset, write, trains,
                                                          files):
  """The preset as shipped builds its group on files in the published format (BPE
  trained on the training split, 257-token windows) and records the files it reads; the
  same data trains a step (once: past the reader, both presets run the same code)."""
  write(tmp_path, np.random.default_rng(0))
  config = dataclasses.replace(language.Config(**EXPERIMENT.PRESETS[preset]),
                               data_dir=str(tmp_path))
  assert EXPERIMENT.fingerprint(config) == {"data_files": {
      split: {name: (tmp_path / name).stat().st_size}
      for split, name in zip(("train", "validation"), files)}}
  (group,) = EXPERIMENT.build_groups(config)
  tokenizer = language.tokenizer_for(config)
  assert isinstance(tokenizer, text.BpeTokenizer)
  assert group.name == f"{preset}-{tokenizer.name}"
  assert len(group.members) == 4 * config.seeds and group.steps == config.steps
  train = group.data.arrays["tokens"]
  assert train.shape[1] == config.seq_len + 1 and len(train) >= config.batch_size
  assert group.eval_data.arrays["tokens"].shape[1] == config.seq_len + 1
  if not trains:
    return
  small = dataclasses.replace(config, schemes=("default", "mask_nopos"), seeds=1,
                              seq_len=32, width=16, depth=1, num_heads=2, head_dim=8,
                              mlp_dim=32, batch_size=4, steps=2, warmup_steps=0,
                              chunk_steps=1, eval_every=0, checkpoint_every=0,
                              eval_sequences=4, probe_size=2, dtype="float32")
  group = dataclasses.replace(language.make_group(small), probe=None)
  _, metrics = run.fit(group, chunk_steps=1)
  assert all(1 < m["perplexity"] < 2 * tokenizer.vocab_size for m in metrics)
