"""Each QK scheme realises its prior on the actual model's real training inputs at init.

The QK schemes fit W_Q, W_K on the pseudo-input LayerNorm(pos); the layers see
LayerNorm(token + pos) and, after the first, the residual stream. A baseline that does not
hold its pattern on those inputs makes every comparison against it weak, so the test runs
the experiment's own init on its own training data and reads the attention maps.
"""

import pathlib

import numpy as np
import pytest

from mpx import diagnostics
from mpx.nn import boolean_tokens
from mpx.sweep import config as config_lib

ROOT = pathlib.Path(__file__).parents[1] / "experiments"
BOOLEAN = config_lib.load_experiment(str(ROOT / "boolean_gotu.py"))
MIN_MASS = 0.8


@pytest.mark.parametrize("task", ["2parity", "majority3", "cyclic3"])
def test_boolean_qk_schemes_hold_their_pattern_on_training_inputs(task):
  _, config = config_lib.make_config(BOOLEAN, "cpu", [f"tasks={task}", "seeds=1",
                                                       "schemes=qk_svd,qk_opt"])
  group = BOOLEAN.build_group(config, task)
  model = BOOLEAN.make_model(config)
  allowed = np.asarray(BOOLEAN.task_prior(task, config.mask_strength)) > 0
  for i, member in enumerate(group.members):
    params = group.init_params(member)
    tokens = boolean_tokens(group.train_data["x"][i][:256])
    maps = diagnostics.attention_maps(model.apply, params, tokens)
    for layer in range(config.depth):
      mass = diagnostics.prior_fidelity(maps[f"block_{layer}"], allowed)
      assert mass >= MIN_MASS, (member.scheme, layer, mass)
