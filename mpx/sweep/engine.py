"""The member axis: K members stacked on a leading axis, trained by one compiled program.

A *member* is (task, init scheme, seed, hyperparameters). Members of a `Group` share
static shapes (model, data size, batch size, steps); init schemes only write different
values into the same param tree. `make_train_chunk` returns `jit(scan(vmap(step)))`:
`chunk_steps` steps for all members, state donated, batches drawn on device from
`fold_in(member_key, step)` so results do not depend on chunking or resuming.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mpx.sweep import optim

PyTree = Any
SAMPLING = ("iid", "epoch")
MEMBER_AXIS = "members"


@dataclasses.dataclass(frozen=True)
class Member:
  """One trained model of a sweep. `hparams` are swept values (pytree data)."""
  task: str
  scheme: str
  seed: int
  hparams: Mapping[str, float]

  def describe(self) -> dict:
    return {"task": self.task, "scheme": self.scheme, "seed": self.seed,
            "hparams": dict(self.hparams)}


@dataclasses.dataclass
class Group:
  """Members trained together, with what the engine needs to train and evaluate them.

  Attributes:
    name: unique within a run (checkpoints and metrics are keyed by it).
    members: the K members.
    init_params: host function member → that member's params (un-stacked).
    loss_fn: `(params, batch) → scalar`, pure; `batch` is a dict of arrays `[B, ...]`.
    train_data: dict of arrays `[K, P, ...]`, each member's training set.
    evaluate: host function `(stacked params, members) → [metrics dict per member]`.
    steps, batch_size: training length and batch size.
    sampling: "iid" (uniform with replacement) or "epoch" (a fresh permutation per
      epoch, batches in order, the last partial batch dropped).
    optim: static optimizer settings.
  """
  name: str
  members: Sequence[Member]
  init_params: Callable[[Member], PyTree]
  loss_fn: Callable[[PyTree, Mapping[str, jax.Array]], jax.Array]
  train_data: Mapping[str, jax.Array]
  evaluate: Callable[[PyTree, Sequence[Member]], list[dict]]
  steps: int
  batch_size: int
  sampling: str = "iid"
  optim: optim.OptimConfig = optim.OptimConfig()

  def __post_init__(self):
    if self.sampling not in SAMPLING:
      raise ValueError(f"sampling={self.sampling!r}; choose one of {SAMPLING}.")
    if not self.members:
      raise ValueError(f"group {self.name!r} has no members.")
    sizes = {k: v.shape[:2] for k, v in self.train_data.items()}
    if len({s for s in sizes.values()}) != 1 or next(iter(sizes.values()))[0] != len(
        self.members):
      raise ValueError(f"train_data must be [K={len(self.members)}, P, ...] arrays with one "
                       f"P; got leading shapes {sizes}.")
    if self.batch_size > self.num_examples:
      raise ValueError(f"batch_size {self.batch_size} exceeds the {self.num_examples} "
                       "training examples.")

  @property
  def num_examples(self) -> int:
    return next(iter(self.train_data.values())).shape[1]


class SweepState(NamedTuple):
  """Everything that evolves during training, stacked over members (except `step`)."""
  params: PyTree
  opt_state: PyTree
  key: jax.Array            # [K, 2] uint32 raw keys (checkpointable).
  alive: jax.Array          # [K] bool: False once a member went non-finite.
  diverged_step: jax.Array  # [K] int32: the step at which it did, −1 if never.
  step: jax.Array           # [] int32: steps done.
  order: jax.Array          # [K, P] int32: the current epoch's example order ([K, 0] iid).


def stack(trees: Sequence[PyTree]) -> PyTree:
  """Member trees → one tree with a leading member axis (structures must match)."""
  structures = {jax.tree_util.tree_structure(t) for t in trees}
  if len(structures) != 1:
    raise ValueError("members have different param trees; init schemes must write values "
                     "into the same structure (a scheme without a prior keeps a neutral "
                     "mask_logits leaf).")
  return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)


def unstack(tree: PyTree, index: int) -> PyTree:
  return jax.tree_util.tree_map(lambda leaf: leaf[index], tree)


def init_state(group: Group) -> SweepState:
  """Host-side init of every member (init schemes may run their own optimisation)."""
  params = stack([group.init_params(m) for m in group.members])
  hparams = optim.stack_hparams([m.hparams for m in group.members])
  opt_state = jax.vmap(lambda p, h: optim.make_optimizer(group.optim, h).init(p))(
      params, hparams)
  keys = jnp.stack([jax.random.key_data(jax.random.fold_in(jax.random.key(m.seed), 1))
                    for m in group.members])
  k = len(group.members)
  return SweepState(params, opt_state, keys, jnp.ones((k,), bool),
                    jnp.full((k,), -1, jnp.int32), jnp.zeros((), jnp.int32),
                    _epoch_orders(group, keys, 0))


def _epoch_orders(group: Group, raw_keys_K2, epoch) -> jax.Array:
  """Every member's example order for `epoch` (`[K, P]`; `[K, 0]` for iid sampling)."""
  if group.sampling != "epoch":
    return jnp.zeros((raw_keys_K2.shape[0], 0), jnp.int32)
  return jax.vmap(lambda raw_key: epoch_order(jax.random.wrap_key_data(raw_key), epoch,
                                              group.num_examples))(raw_keys_K2)


def epoch_order(key, epoch, num_examples: int) -> jax.Array:
  """The example order of one epoch: a permutation drawn from `fold_in(key, epoch)`."""
  return jax.random.permutation(jax.random.fold_in(key, epoch), num_examples)


def _batch_indices(key, step, order, num_examples: int, batch_size: int, sampling: str):
  """Indices of the batch at `step`: iid draws, or the epoch order's next slice."""
  if sampling == "iid":
    return jax.random.randint(jax.random.fold_in(key, step), (batch_size,), 0, num_examples)
  position = step % (num_examples // batch_size)
  return jax.lax.dynamic_slice_in_dim(order, position * batch_size, batch_size)


def _all_finite(tree) -> jax.Array:
  """One reduction over every float leaf (integer leaves such as optax's `count` are
  always finite): a reduction per leaf ANDed together is a chain XLA fuses into each
  consumer's select, which made compile time quadratic in the leaves."""
  leaves = [jnp.ravel(x) for x in jax.tree_util.tree_leaves(tree)
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  if not leaves:
    return jnp.asarray(True)
  return jnp.all(jnp.isfinite(jnp.concatenate(
      [x.astype(jnp.result_type(*leaves)) for x in leaves])))


def _select(pred, on_true, on_false):
  return jax.tree_util.tree_map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def make_member_step(group: Group) -> Callable:
  """One training step of one member; NaN isolation freezes a member at its last finite
  state and records the step it diverged at."""
  loss_and_grad = jax.value_and_grad(group.loss_fn)

  def step_fn(params, opt_state, raw_key, alive, diverged_step, hparams, data, order, step):
    key = jax.random.wrap_key_data(raw_key)
    idx = _batch_indices(key, step, order, group.num_examples, group.batch_size,
                         group.sampling)
    batch = {name: array[idx] for name, array in data.items()}
    loss, grads = loss_and_grad(params, batch)
    optimizer = optim.make_optimizer(group.optim, hparams)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    # The optimizer state too: an inf second moment zeroes the update, so the params stay
    # finite while the member has silently stopped training.
    finite = jnp.isfinite(loss) & _all_finite((new_params, new_opt_state))
    keep = alive & finite
    params = _select(keep, new_params, params)
    opt_state = _select(keep, new_opt_state, opt_state)
    diverged_step = jnp.where(alive & ~finite, step, diverged_step)
    return params, opt_state, keep, diverged_step, jnp.where(alive, loss, jnp.nan)

  return step_fn


def make_train_chunk(group: Group, chunk_steps: int) -> Callable:
  """`(state, hparams, data) → (state, mean_loss[K])` for `chunk_steps` steps.

  Steps past `group.steps` are no-ops, so every chunk has the same length and the
  program compiles once. The state is donated. With epoch sampling the state carries the
  epoch's order, redrawn only at epoch boundaries (a `lax.cond` outside the member vmap):
  a permutation is a sort over the whole training set, slow on CPU.
  """
  if chunk_steps < 1:
    raise ValueError(f"chunk_steps must be >= 1; got {chunk_steps}.")
  member_step = jax.vmap(make_member_step(group), in_axes=(0, 0, 0, 0, 0, 0, 0, 0, None))
  per_epoch = group.num_examples // group.batch_size

  def chunk(state: SweepState, hparams, data):
    def body(state, step):
      order = state.order
      if group.sampling == "epoch":
        # Epoch 0's order comes with the state (init_state), so step 0 needs no redraw.
        order = jax.lax.cond((step % per_epoch == 0) & (step > 0),
                             lambda: _epoch_orders(group, state.key, step // per_epoch),
                             lambda: order)
      params, opt_state, alive, diverged_step, loss = member_step(
          state.params, state.opt_state, state.key, state.alive, state.diverged_step,
          hparams, data, order, step)
      active = step < group.steps
      new = SweepState(params, opt_state, state.key, alive, diverged_step, state.step + 1,
                       order)
      return _select(active, new, state), jnp.where(active, loss, 0.0)

    steps = state.step + jnp.arange(chunk_steps, dtype=jnp.int32)
    final, losses = jax.lax.scan(body, state, steps)
    counted = jnp.maximum(jnp.minimum(group.steps - state.step, chunk_steps), 1)
    return final, jnp.sum(losses, axis=0) / counted

  return jax.jit(chunk, donate_argnums=(0,))


# --------------------------------------------------------------------------- devices


def member_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh | None:
  """A 1-D mesh over the local devices for the member axis; None on one device."""
  devices = list(jax.local_devices() if devices is None else devices)
  if not devices:
    raise ValueError("devices is empty; pass None to use all local devices.")
  return Mesh(np.array(devices), (MEMBER_AXIS,)) if len(devices) > 1 else None


def padded_size(num_members: int, mesh: Mesh | None) -> int:
  """Members are padded (with copies, never reported) to a multiple of the devices."""
  n = 1 if mesh is None else mesh.size
  return -(-num_members // n) * n


def shard_members(tree: PyTree, mesh: Mesh | None) -> PyTree:
  """Places the leading member axis of every leaf across the mesh (scalars replicated)."""
  if mesh is None:
    return tree
  split = NamedSharding(mesh, PartitionSpec(MEMBER_AXIS))
  replicated = NamedSharding(mesh, PartitionSpec())
  return jax.tree_util.tree_map(
      lambda x: jax.device_put(x, split if jnp.ndim(x) > 0 else replicated), tree)


def pad_members(tree: PyTree, size: int) -> PyTree:
  """Pads the member axis to `size` by repeating the last member."""
  def pad(x):
    if jnp.ndim(x) == 0 or x.shape[0] == size:
      return x
    return jnp.concatenate([x, jnp.repeat(x[-1:], size - x.shape[0], axis=0)])
  return jax.tree_util.tree_map(pad, tree)
