"""A tiny sweep group shared by the sweep tests (imported, not collected)."""

import jax
import jax.numpy as jnp
import numpy as np

from mpx import priors, schemes
from mpx.nn import TokenTransformer, boolean_tokens
from mpx.sweep import engine, optim

N_BITS = 6
MODEL = TokenTransformer(width=8, depth=1, num_heads=2, head_dim=4, mlp_dim=8)


def member(seed=0, scheme="mask", lr=1e-2, **hparams):
  hp = {"learning_rate": lr, "weight_decay": 1e-3,
        "mask_lr_multiplier": 1.0 if scheme == "mask" else 0.0}
  return engine.Member("toy", scheme, seed, hp | hparams)


def init_params(m):
  params = MODEL.init(jax.random.key(m.seed), boolean_tokens(jnp.ones((1, N_BITS))))["params"]
  prior = priors.parity_prior(N_BITS, (0, 1), 3.0)
  return schemes.apply_scheme(m.scheme, params, prior, jax.random.key(7), num_heads=2,
                              head_dim=4, qk_opt_steps=50)


def loss_fn(params, batch):
  pred = MODEL.apply({"params": params}, boolean_tokens(batch["x"]))[:, 0]
  return jnp.mean((pred - batch["y"]) ** 2)


def data(num_members, num_examples=64):
  x = np.asarray(jax.random.rademacher(jax.random.key(99), (num_examples, N_BITS)), np.float32)
  y = x[:, 0] * x[:, 1]
  return {"x": jnp.asarray(np.stack([x] * num_members)),
          "y": jnp.asarray(np.stack([y] * num_members))}


def evaluate(params_K, members):
  x = data(1)["x"][0]
  preds = jax.vmap(lambda p: MODEL.apply({"params": p}, boolean_tokens(x))[:, 0])(params_K)
  return [{"mean_output": float(p.mean())} for p in np.asarray(preds)[:len(members)]]


def group(members, steps=12, sampling="iid", optimizer="adam_l2", name="toy"):
  return engine.Group(name=name, members=members, init_params=init_params, loss_fn=loss_fn,
                      train_data=data(len(members)), evaluate=evaluate, steps=steps,
                      batch_size=16, sampling=sampling,
                      optim=optim.OptimConfig(optimizer=optimizer, total_steps=steps))


def train(g, chunk_steps=4, mesh=None):
  """Trains a group to the end; returns the final SweepState."""
  size = engine.padded_size(len(g.members), mesh)
  hp = engine.shard_members(engine.pad_members(
      optim.stack_hparams([m.hparams for m in g.members]), size), mesh)
  d = engine.shard_members(engine.pad_members(dict(g.train_data), size), mesh)
  state = engine.shard_members(engine.pad_members(engine.init_state(g), size), mesh)
  chunk = engine.make_train_chunk(g, chunk_steps)
  while int(state.step) < g.steps:
    state, _ = chunk(state, hp, d)
  return state
