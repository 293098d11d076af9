"""Arithmetic: tokens, splits, the alignment prior, greedy decoding, metrics, the decoder,
the schemes on its params, and the `tiny` preset end to end."""

import dataclasses
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mpx import cli, schemes
from mpx.sweep import config as config_lib
from mpx.nn import causal_decoder, greedy_decode
from mpx.tasks.arithmetic import task as ar

FORMATS = [(name, reverse) for name in ar.TASKS for reverse in (True, False)]


@pytest.mark.parametrize("name, reverse", FORMATS)
def test_tokens_round_trip(name, reverse):
  task = ar.get_task(name, reverse_answer=reverse)
  rng = np.random.default_rng(0)
  a, b = rng.integers(0, 1000, 200), rng.integers(0, 1000, 200)
  a[:2], b[:2] = (0, 999), (0, 999)  # The extremes: all-zero and the longest answer.
  tokens = ar.encode(task, a, b)
  chex.assert_shape(tokens, (200, task.seq_len))
  assert task.n_tokens == task.layout.n_tokens == task.seq_len - 1
  got_a, got_b, got_c = ar.decode(task, tokens)
  np.testing.assert_array_equal(got_a, a)
  np.testing.assert_array_equal(got_b, b)
  np.testing.assert_array_equal(got_c, task.compute(a, b))
  for row in tokens[:5]:
    np.testing.assert_array_equal(ar.from_text(ar.to_text(row)), row)
  start = task.prompt_len
  np.testing.assert_array_equal(
      ar.answer_value(task, tokens[:, start:start + task.answer_digits]), task.compute(a, b))


def test_token_text_by_hand():
  add = ar.get_task("addition")
  assert ar.to_text(ar.encode(add, [123], [45])[0]) == "^123+045=8610$"
  plain = ar.get_task("addition", reverse_answer=False)
  assert ar.to_text(ar.encode(plain, [123], [45])[0]) == "^123+045=0168$"
  mul = ar.get_task("multiplication")
  assert ar.to_text(ar.encode(mul, [999], [999])[0]) == "^999*999=100899$"
  assert mul.answer_digits == 6 and ar.VOCAB_SIZE == 16


def test_bad_inputs_name_the_fix():
  task = ar.get_task("addition")
  with pytest.raises(ValueError, match="must be in"):
    ar.encode(task, [1000], [1])
  with pytest.raises(ValueError, match="position 4"):
    ar.decode(task, ar.from_text("^123*045=8610$"))
  with pytest.raises(ValueError, match="unknown arithmetic task"):
    ar.get_task("division")
  with pytest.raises(ValueError, match="lower the fraction"):
    ar.split_indices(ar.get_task("addition", 1), 0.5, 0, test_size=90)


@pytest.mark.parametrize("name, fraction", [("addition", 0.004), ("multiplication", 0.03)])
def test_splits_are_disjoint_and_exact(name, fraction):
  task = ar.get_task(name)
  splits = ar.split_indices(task, fraction, seed=3)
  assert len(splits["train"]) == round(fraction * 10**6)
  assert len(splits["test"]) == 10_000
  for idx in splits.values():
    assert len(np.unique(idx)) == len(idx)
  assert not np.intersect1d(splits["train"], splits["test"]).size
  again = ar.split_indices(task, fraction, seed=3)
  np.testing.assert_array_equal(again["train"], splits["train"])
  other = ar.split_indices(task, fraction, seed=4)
  assert not np.array_equal(other["train"], splits["train"])
  np.testing.assert_array_equal(other["test"], splits["test"])  # Fixed per task.
  tokens = ar.make_splits(task, fraction, 3)
  a, b, _ = ar.decode(task, tokens["test"])
  np.testing.assert_array_equal(a * 1000 + b, splits["test"])


def test_validation_problems_are_neither_trained_nor_tested():
  task = ar.get_task("addition")
  plain = ar.split_indices(task, 0.004, seed=3)
  assert set(plain) == {"train", "test"}            # Only `select` draws a validation set.
  by_seed = [ar.split_indices(task, 0.004, seed, validation_size=2000) for seed in (3, 4)]
  for splits in by_seed:
    assert len(splits["validation"]) == len(np.unique(splits["validation"])) == 2000
    assert len(splits["train"]) == 4000
    for other in ("train", "test"):
      assert not np.intersect1d(splits["validation"], splits[other]).size
    np.testing.assert_array_equal(splits["test"], plain["test"])
  np.testing.assert_array_equal(*(s["validation"] for s in by_seed))  # Fixed per task.
  with pytest.raises(ValueError, match="validation_size"):
    ar.split_indices(ar.get_task("addition", 1), 0.1, 0, test_size=50, validation_size=45)


def test_selection_reads_the_validation_problems_and_the_report_the_test_problems():
  import mpx.experiments.arithmetic as experiment
  assert experiment.VALIDATION[0] == ("val_sequence_accuracy", "max")
  _, config = config_lib.make_config(experiment, "tiny", ["select=learning_rate"])
  group, = experiment.build_groups(config)
  spec = ar.get_task("addition", config.digits, reverse_answer=config.reverse_answer)
  splits = ar.make_splits(spec, 0.004, 0, config.test_size, config.validation_size)
  np.testing.assert_array_equal(group.data.arrays["tokens"][0], splits["train"])
  np.testing.assert_array_equal(group.eval_data.arrays["tokens"],
                                np.concatenate([splits["test"], splits["validation"]]))
  test, val = np.ones(config.test_size), np.zeros(config.validation_size)
  values = {"sequence_accuracy": np.concatenate([test, val]),
            "digit_accuracy": np.concatenate([test, val]),
            "loss": np.concatenate([0 * test, 7 + val])}
  metrics = group.task.summarize(values, group.members[0])
  assert metrics == {"sequence_accuracy": 1.0, "digit_accuracy": 1.0, "loss": 0.0,
                     "val_sequence_accuracy": 0.0, "val_loss": 7.0}
  _, plain_config = config_lib.make_config(experiment, "tiny")
  plain, = experiment.build_groups(plain_config)
  assert len(plain.eval_data.arrays["tokens"]) == plain_config.test_size
  assert set(plain.task.summarize(values, plain.members[0])) == {
      "sequence_accuracy", "digit_accuracy", "loss"}


def test_alignment_prior_by_hand():
  # ^ a2 a1 a0 + b2 b1 b0 = c0 c1 c2 c3 ($): positions 0..12, a0 at 3, b0 at 7.
  allowed = np.asarray(ar.prior(ar.get_task("addition"))) > 0
  chex.assert_shape(allowed, (13, 13))
  assert set(np.flatnonzero(allowed[8])) == {3, 7, 8}        # '=' predicts c0: a0, b0.
  assert set(np.flatnonzero(allowed[9])) == {2, 3, 6, 7, 9}  # c0 predicts c1: a1, b1 + carry.
  assert set(np.flatnonzero(allowed[11])) == {1, 5, 11}     # c2 predicts c3: the carry out.
  assert set(np.flatnonzero(allowed[4])) == set(range(5))    # Other rows: causal only.
  assert not np.triu(allowed, 1).any()
  # Plain answers c3 c2 c1 c0 at 9..12: c1 is predicted by row 10, c0 by row 11.
  plain = np.asarray(ar.prior(ar.get_task("addition", reverse_answer=False))) > 0
  assert set(np.flatnonzero(plain[10])) == {2, 3, 6, 7, 10}
  assert set(np.flatnonzero(plain[11])) == {3, 7, 11}
  # Multiplication 3×3, reversed: c1 (row 9) reads the pairs with i + j ∈ {0, 1}.
  mul = np.asarray(ar.prior(ar.get_task("multiplication"))) > 0
  assert set(np.flatnonzero(mul[9])) == {2, 3, 6, 7, 9}


def _shift_model(params, tokens_BT):
  """Puts the max logit on (token + params) mod 10: the answer depends on feedback."""
  return jax.nn.one_hot((tokens_BT + params) % 10, ar.VOCAB_SIZE) * 5.0


def test_greedy_decode_follows_forced_logits():
  prompt = jnp.asarray(ar.encode(ar.get_task("addition"), [123, 4], [45, 6])[:, :9])
  constant = lambda params, tokens: jnp.broadcast_to(
      jax.nn.one_hot(7, ar.VOCAB_SIZE), tokens.shape + (ar.VOCAB_SIZE,))
  np.testing.assert_array_equal(greedy_decode(constant, None, prompt, 4), [[7] * 4] * 2)
  decode = jax.jit(jax.vmap(lambda p: greedy_decode(_shift_model, p, prompt, 4)))
  out = decode(jnp.array([1, 2]))  # Members: offsets 1 and 2, vmapped.
  chex.assert_shape(out, (2, 2, 4))
  np.testing.assert_array_equal(out[0, 0], [3, 4, 5, 6])  # '=' is 12: 13 mod 10, then +1.
  np.testing.assert_array_equal(out[1, 1], [4, 6, 8, 0])


def test_accuracy_and_loss_on_a_hand_made_batch():
  target = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [0, 0, 0, 1]])
  pred = np.array([[1, 2, 3, 4], [5, 6, 0, 8], [9, 9, 9, 9]])
  assert ar.sequence_accuracy(pred, target) == pytest.approx(1 / 3)
  assert ar.digit_accuracy(pred, target) == pytest.approx((4 + 3 + 0) / 12)
  logits = jnp.log(jax.nn.one_hot(jnp.array([[1, 2]]), 4) * 0.5 + 0.125)  # p = 0.625
  weights = jnp.array([0.0, 1.0])
  assert float(ar.loss(logits, jnp.array([[3, 2]]), weights)) == pytest.approx(
      -np.log(0.625), rel=1e-5)


MODEL = causal_decoder(ar.VOCAB_SIZE, width=16, depth=2, num_heads=2, head_dim=8, mlp_dim=32)


@pytest.fixture(scope="module")
def decoder_params():
  """One jitted init (eager Flax init compiles op by op: slow on one core)."""
  tokens = jnp.zeros((1, 13), jnp.int32)
  return jax.jit(lambda key: MODEL.init(key, tokens)["params"])(jax.random.key(0))


def test_causal_decoder_shapes_and_causality(decoder_params):
  model, params = MODEL, decoder_params
  tokens = jnp.asarray(ar.encode(ar.get_task("addition"), [123, 7], [45, 8])[:, :-1])
  chex.assert_shape(params["pos_embed"], (13, 16))
  chex.assert_shape(params["block_1"]["attention"]["mask_logits"], (2, 13, 13))
  chex.assert_shape(params["block_0"]["attention"]["query"]["kernel"], (16, 2, 8))
  apply = jax.jit(lambda tokens: model.apply({"params": params}, tokens))
  logits = apply(tokens)
  chex.assert_shape(logits, (2, 13, ar.VOCAB_SIZE))
  changed = tokens.at[:, 10].set(9)
  other = apply(changed)
  np.testing.assert_array_equal(other[:, :10], logits[:, :10])
  assert not np.allclose(other[:, 10:], logits[:, 10:])
  with pytest.raises(ValueError, match="integer token ids"):
    model.apply({"params": params}, tokens.astype(jnp.float32))


@pytest.mark.parametrize("scheme", schemes.SCHEMES)
def test_schemes_on_decoder_params(scheme, decoder_params):
  task, params = ar.get_task("addition"), decoder_params
  tokens = jnp.zeros((1, task.n_tokens), jnp.int32)
  prior = ar.prior(task)
  out = schemes.apply_scheme(scheme, params, prior, jax.random.key(1), num_heads=2,
                             head_dim=8, qk_opt_steps=10)
  chex.assert_trees_all_equal_structs(out, params)
  mask = out["block_1"]["attention"]["mask_logits"]
  if scheme == "mask":
    np.testing.assert_array_equal(mask, jnp.broadcast_to(prior, mask.shape))
  else:
    assert float(mask.min()) > 100  # Neutral.
  kernel = lambda p: p["block_0"]["attention"]["query"]["kernel"]
  assert np.array_equal(kernel(out), kernel(params)) == (scheme in ("default", "mask"))
  assert np.isfinite(jax.jit(MODEL.apply)({"params": out}, tokens)).all()


def test_tiny_preset_end_to_end(tmp_path, capsys):
  assert cli.main(["run", "arithmetic", "--preset", "tiny", "--out", str(tmp_path)]) == 0
  err = capsys.readouterr().err  # Every figure is drawn ("no plots: ..." if one fails).
  assert "plots: " in err and "no plots" not in err
  assert err.splitlines()[-1] == f"summary: {tmp_path}/summary.md"  # The end says where.
  summary = json.loads((tmp_path / "summary.json").read_text())
  assert {m["scheme"] for m in summary["members"]} == {"default", "mask"}
  metrics = {m["scheme"]: m["metrics"] for m in summary["members"]}
  for member in summary["members"]:
    assert {"sequence_accuracy", "digit_accuracy", "loss", "fidelity", "fidelity_init",
            "drift_qk"} <= set(member["metrics"])
    assert member["metrics"]["loss"] < np.log(ar.VOCAB_SIZE)  # Trained below uniform.
    assert member["hparams"]["data_fraction"] == 0.004
  # Persistence on the answer rows: the alignment prior holds at init, the default init
  # spreads its attention, and the mask moves less than the QK kernels.
  assert metrics["mask"]["fidelity_init"] > 0.9 > 0.5 > metrics["default"]["fidelity_init"]
  assert 0 < metrics["mask"]["drift_mask"] < metrics["mask"]["drift_qk"]
  assert summary["paper"]["addition"]["mask"]["sequence_accuracy"] == 0.7749
  assert (tmp_path / "plots" / "fraction_curve.png").exists()


def test_one_compiled_init_per_model():
  """Every group of one model (a task's fractions, both discovery stages) shares one
  compiled init, never another model's: a wider config gets wider params."""
  experiment = config_lib.load_experiment("arithmetic")
  config = config_lib.make_config(experiment, "tiny")[1]
  spec = ar.get_task("addition", config.digits)
  init = ar._model_init(ar.make_model(config), spec.n_tokens)
  assert ar._model_init(ar.make_model(config), spec.n_tokens) is init
  wide = dataclasses.replace(config, width=2 * config.width)
  dummy_BN = jnp.zeros((1, spec.n_tokens), jnp.int32)
  chex.assert_trees_all_equal_shapes(
      ar._model_init(ar.make_model(wide), spec.n_tokens)(jax.random.key(0)),
      ar.make_model(wide).init(jax.random.key(0), dummy_BN)["params"])
  fresh = jax.jit(lambda key: ar.make_model(config).init(key, dummy_BN)["params"])
  chex.assert_trees_all_equal(init(jax.random.key(3)), fresh(jax.random.key(3)))
