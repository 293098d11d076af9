"""The evaluator: padded evaluation batches are dropped before a task summarises."""

import dataclasses

import numpy as np

import sweep_fixtures as fx
from mpx.sweep import EvalData, engine


def test_an_eval_batch_that_does_not_divide_the_set_changes_nothing():
  """50 examples in batches of 7 (8 batches, 6 padding rows) or 64 (one batch, 14
  padding rows) give the metrics of batches of 10, which divide the set; the padding
  repeats the last example, so a mean over it would move."""
  x = fx.arrays(50)["x"]
  group = fx.group([fx.member(0, "mask"), fx.member(1, "default")])
  state = engine.init_state(group)
  evaluate = lambda size: fx.evaluate(
      dataclasses.replace(group, eval_data=EvalData({"x": x}, size)), state)
  dividing = evaluate(10)
  outputs = fx.predict(engine.unstack(state.params, 0), x)
  np.testing.assert_allclose(dividing[0]["mean_output"], float(np.mean(outputs)), rtol=1e-5)
  for size in (7, 64):
    padded = evaluate(size)
    assert len(padded) == 2
    for a, b in zip(dividing, padded):
      np.testing.assert_allclose(b["mean_output"], a["mean_output"], rtol=1e-6, err_msg=size)
