"""A tiny sweep group shared by the sweep tests (imported, not collected)."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from etils import epath

from mpx import checkpoint, priors, schemes
from mpx.nn import TokenTransformer
from mpx.sweep import DeviceData, EvalData, engine, optim
from mpx.sweep import config as config_lib
from mpx.tasks import boolean

N_BITS = 6
MODEL = TokenTransformer(width=8, depth=1, num_heads=2, head_dim=4, mlp_dim=8)


def member(seed=0, scheme="mask", lr=1e-2, **hparams):
  hp = {"learning_rate": lr, "weight_decay": 1e-3,
        "mask_lr_multiplier": 1.0 if scheme == "mask" else 0.0}
  return engine.Member("toy", scheme, seed, hp | hparams)


# Compiled once: eager, `init` dispatches each of its ops alone (most of a test's init time).
_model_init = jax.jit(lambda key: MODEL.init(key, boolean.tokens(jnp.ones((1, N_BITS)))))


def init_params(m):
  params = _model_init(jax.random.key(m.seed))["params"]
  prior = priors.parity_prior(N_BITS, (0, 1), 3.0)
  return schemes.apply_scheme(m.scheme, params, prior, jax.random.key(7), num_heads=2,
                              head_dim=4, qk_opt_steps=50)


def predict(params, x):
  return MODEL.apply({"params": params}, boolean.tokens(x))[:, 0]


def loss_fn(params, batch, key):
  del key
  pred = predict(params, batch["x"])
  return jnp.mean((pred - batch["y"]) ** 2), {"mean_pred": jnp.mean(pred)}


def eval_step(params, batch):
  return {"output": predict(params, batch["x"])}


def summarize(values, member):
  del member
  return {"mean_output": float(np.mean(values["output"]))}


TASK = engine.Task(init=init_params, loss=loss_fn, eval_step=eval_step, summarize=summarize)


def arrays(num_examples=64):
  x = np.asarray(jax.random.rademacher(jax.random.key(99), (num_examples, N_BITS)), np.float32)
  return {"x": x, "y": x[:, 0] * x[:, 1]}


def regression_stream(seed, start_step, batch_size=16):
  """A generated regression stream, a function of (seed, step): y = x · w* + noise."""
  w = np.linspace(-1, 1, N_BITS).astype(np.float32)
  step = start_step
  while True:
    rng = np.random.default_rng([seed, step])
    x = np.sign(rng.standard_normal((batch_size, N_BITS))).astype(np.float32)
    yield {"x": x, "y": (x @ w / N_BITS + 0.01 * rng.standard_normal(batch_size)
                         ).astype(np.float32)}
    step += 1


def group(members, steps=12, sampling="iid", optimizer="adam_l2", name="toy", task=TASK,
          per_member=False, members_per_call=None, data=None):
  """The toy group; `per_member` gives every member its own copy of the data `[K, P]`."""
  a = arrays()
  if data is None:
    data = DeviceData({k: np.stack([v] * len(members)) for k, v in a.items()}
                      if per_member else a, per_member=per_member, sampling=sampling)
  return engine.Group(name=name, members=members, task=task, data=data,
                      eval_data=EvalData({"x": a["x"]}, 24), steps=steps, batch_size=16,
                      optim=optim.OptimConfig(optimizer=optimizer, total_steps=steps),
                      members_per_call=members_per_call)


def evaluate(g, state):
  """The engine's evaluator on the group's members."""
  from mpx.sweep import evaluate as evaluate_lib
  return evaluate_lib.Evaluator(g)(state)


def train(g, chunk_steps=4, mesh=None, state=None):
  """Trains a group to the end (from `state`, or its init); returns the final SweepState."""
  from mpx.sweep import run
  return run.fit(g, chunk_steps, mesh=mesh, state=state)[0]


TOY = str(pathlib.Path(__file__).parent / "toy_experiment.py")


def final_state(run_dir, group_name, overrides=()):
  """A toy_experiment.py run's last checkpointed state of one group, restored into the
  group's own structure (a run folder may be a gs:// URL)."""
  experiment = config_lib.load_experiment(TOY)
  _, cfg = config_lib.make_config(experiment, None, overrides)
  group = [g for g in experiment.build_groups(cfg) if g.name == group_name][0]
  with checkpoint.Checkpointer(epath.Path(run_dir) / "checkpoints" / group_name) as ckpt:
    state, _ = ckpt.restore(engine.init_state(group))
  return state
