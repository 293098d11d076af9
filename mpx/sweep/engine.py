"""The member axis: K members stacked on a leading axis, trained by one compiled program.

A *member* is (task, scheme, design, seed, hparams, labels). Members of a `Group` share
static shapes (model, data, batch size, steps); schemes only write different values into
the same param tree. A `Task` is written for ONE member; the engine maps it over members
(`vmap`, or `lax.map` in slices of `members_per_call` when memory is short: same code).

`make_train_chunk` returns `jit(scan(map_members(step)))`: `chunk_steps` steps of all
members, state donated. Device data is sampled inside the step from
`fold_in(member_key, step)`; a `Stream`'s batches come in as `[T, B, ...]` arguments
(`[T, S, B, ...]` with one stream per seed: each member gathers its seed's row). Either
way a result does not depend on how the run was chunked or resumed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax._src import core as jax_core  # trace_state_clean: no public equivalent
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from mpx.sweep import optim
from mpx.sweep.data import DeviceData, EvalData, Stream

PyTree = Any
Batch = Mapping[str, jax.Array]
MEMBER_AXIS = "members"


@dataclasses.dataclass(frozen=True)
class Member:
  """One trained model of a sweep.

  `hparams` are the traced values (per-member optimizer settings: `optim.HPARAMS`);
  `labels` are recorded with the results but never traced (a data fraction, the mask
  strength an init used); `design` names the scheme's variant (a mask design).
  """
  task: str
  scheme: str
  seed: int
  hparams: Mapping[str, float]
  design: str | None = None
  labels: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def describe(self) -> dict:
    """What a metrics record says about the member; labels are reported with the hparams
    (the summary groups members by them)."""
    return {"task": self.task, "scheme": self.scheme, "seed": self.seed,
            "hparams": dict(self.hparams) | dict(self.labels)}


@dataclasses.dataclass(frozen=True)
class Task:
  """What the engine needs of ONE member; every function but `init` and `summarize` is
  pure and traced (the engine maps it over members).

  init: member → params (host; a scheme may run its own optimisation, e.g. QK-Opt).
  loss: (params, batch, key) → (scalar loss, {name: scalar}); `key` is the member's own
    for this step (dropout, mixup); aux scalars are averaged per chunk as `train_<name>`.
  eval_step: (params, batch) → {name: [B] values}, one per evaluation example.
  summarize: ({name: [E] values over the whole evaluation set}, member) → metrics (host).
  """
  init: Callable[[Member], PyTree]
  loss: Callable[[PyTree, Batch, jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]
  eval_step: Callable[[PyTree, Batch], Mapping[str, jax.Array]]
  summarize: Callable[[Mapping[str, np.ndarray], Member], dict]


@dataclasses.dataclass(frozen=True)
class Probe:
  """The persistence diagnostics' input (`mpx.diagnostics.persistence_metrics`).

  apply: the model's `apply` (records attention maps); inputs: its arguments on the
    probe examples; batch: the loss batch for the gradient norms (e.g. the probe's
    training-domain part); patterns: per member, {layer: allowed [H, N, N] or [N, N]},
    the prior that member is scored on; example_groups adds `fidelity_<name>` on parts
    of the probe; query_rows restricts fidelity to some queries; map_layers: layers whose
    mean attention map is recorded.
  """
  apply: Callable
  inputs: tuple
  batch: Mapping[str, Any]
  patterns: Sequence[Mapping[str, np.ndarray]]
  example_groups: Mapping[str, np.ndarray] | None = None
  query_rows: np.ndarray | None = None
  map_layers: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ChunkOptions:
  """How a training chunk is compiled. None of them changes what it computes, beyond the
  order XLA may round in: the device A/B (`benchmarks/accelerator_check`, stage "ab")
  checks each variant's losses against the plain chunk's before it times them.

  scan_unroll: steps per iteration of the chunk's `lax.scan` (jax's `unroll`): fewer loop
    iterations, each a longer body for XLA to fuse and schedule; compile time grows with it.
  compiler_options: XLA options of the chunk's program, (name, value) pairs as
    `jax.jit(compiler_options=...)` takes them; an option another backend ignores (the
    GPU's command buffers on a CPU) is still checked by name and value there.
  """
  scan_unroll: int = 1
  compiler_options: tuple[tuple[str, str], ...] = ()

  def __post_init__(self):
    if self.scan_unroll < 1:
      raise ValueError(f"scan_unroll={self.scan_unroll} must be >= 1.")


# XLA:GPU's default command-buffer commands (FUSION ... DYNAMIC_SLICE_FUSION, the defaults
# of jax 0.10-0.11's XLA) plus WHILE and CONDITIONAL: the chunk's whole `lax.scan` becomes
# one CUDA graph with conditional nodes instead of a host-driven loop launching each step's
# graphs. A value replaces the default list (jit's options take no "+WHILE").
COMMAND_BUFFERS_WITH_LOOPS = ("FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,"
                              "WHILE,CONDITIONAL")
# The step variants a config names (`step_variant`), each timed against "plain" by the
# device A/B.
STEP_VARIANTS = {
    "plain": ChunkOptions(),
    "unroll2": ChunkOptions(scan_unroll=2),
    "unroll4": ChunkOptions(scan_unroll=4),
    "graphs": ChunkOptions(compiler_options=(
        ("xla_gpu_enable_command_buffer", COMMAND_BUFFERS_WITH_LOOPS),)),
}
# What `step_variant="auto"` compiles on a GPU (elsewhere: "plain"). The plain step until a
# device A/B names a faster variant whose losses match it; switching is this one line.
GPU_STEP_VARIANT = "plain"


def chunk_options(step_variant: str, platform: str | None = None) -> ChunkOptions:
  """The `ChunkOptions` of a step variant: a name of `STEP_VARIANTS`, or "auto"
  (`GPU_STEP_VARIANT` on a GPU, "plain" elsewhere) for `platform`, the platform the chunk
  is compiled for ("cpu", "gpu", "tpu"; None: this host's default backend)."""
  if step_variant == "auto":
    platform = jax.default_backend() if platform is None else platform
    step_variant = GPU_STEP_VARIANT if platform == "gpu" else "plain"
  if step_variant not in STEP_VARIANTS:
    raise ValueError(f"step_variant={step_variant!r}; choose from "
                     f"{('auto',) + tuple(STEP_VARIANTS)}.")
  return STEP_VARIANTS[step_variant]


@dataclasses.dataclass(frozen=True)
class Group:
  """Members trained together, and what the engine needs to train and evaluate them.

  Attributes:
    name: unique within a run (checkpoints and metrics are keyed by it).
    members: the K members.
    task: the member-level `Task`.
    data: `DeviceData` (sampled on device) or `Stream` (host batches).
    eval_data: the finite evaluation set `eval_step` runs on.
    steps, batch_size: training length and batch size.
    optim: static optimizer settings.
    probe: persistence diagnostics (None: none); keeps the initial params in the state.
    members_per_call: None vmaps all members at once; m maps them in slices of m
      (`lax.map(batch_size=m)`): the memory valve for large models, same results.
    chunk_options: how the training chunk is compiled: `ChunkOptions`, or a config's
      `step_variant` name, resolved (`chunk_options`) for the platform the chunk is
      compiled for, so "auto" follows the target of `mpx compile` too.
  """
  name: str
  members: Sequence[Member]
  task: Task
  data: DeviceData | Stream
  eval_data: EvalData
  steps: int
  batch_size: int
  optim: optim.OptimConfig = optim.OptimConfig()
  probe: Probe | None = None
  members_per_call: int | None = None
  chunk_options: ChunkOptions | str = ChunkOptions()

  def __post_init__(self):
    if isinstance(self.chunk_options, str):
      chunk_options(self.chunk_options)  # Raises naming the variants.
    if not self.members:
      raise ValueError(f"group {self.name!r} has no members.")
    if self.steps < 1:
      raise ValueError(f"group {self.name!r}: steps={self.steps} must be >= 1.")
    if self.members_per_call is not None and self.members_per_call < 1:
      raise ValueError(f"members_per_call={self.members_per_call} must be >= 1 (or None "
                       "to vmap every member at once).")
    if self.probe is not None and len(self.probe.patterns) != len(self.members):
      raise ValueError(f"group {self.name!r}: the probe has {len(self.probe.patterns)} "
                       f"patterns for {len(self.members)} members; give one per member.")
    if isinstance(self.data, DeviceData):
      self.data.check(len(self.members), self.batch_size)
    elif isinstance(self.data, Stream):
      self.data.stream_of([m.seed for m in self.members])  # Every seed has its stream.
    else:
      raise TypeError(f"group {self.name!r}: data must be a DeviceData or a Stream; got "
                      f"{type(self.data).__name__}.")


class SweepState(NamedTuple):
  """Everything that evolves during training, stacked over members (except `step`)."""
  params: PyTree
  opt_state: PyTree
  key: jax.Array            # [K, 2] uint32 raw keys (checkpointable).
  alive: jax.Array          # [K] bool: False once a member went non-finite.
  diverged_step: jax.Array  # [K] int32: the step at which it did, −1 if never.
  step: jax.Array           # [] int32: steps done.
  order: jax.Array | None   # [K, P] int32: the current epoch's example order (epoch sampling).
  initial: PyTree           # the params at init (drift, fidelity at init); None: no probe.


def _identity(member: Member) -> str:
  return json.dumps([member.task, member.scheme, member.seed, member.design,
                     dict(member.hparams), dict(member.labels)], sort_keys=True, default=str)


def merge_groups(groups: Sequence[Group]) -> Group:
  """One group of the members of `groups`: the same group built at several values of a
  traced hyperparameter, so only its members' hparams differ. A member that repeats (a
  scheme whose hparams ignore the swept value, e.g. the default scheme's mask multiplier
  0) is kept once; per-member rows (per-member `DeviceData`, probe patterns) follow
  their members."""
  if len({g.name for g in groups}) != 1:
    raise ValueError(f"merge_groups merges one group built at several values; got the "
                     f"groups {sorted({g.name for g in groups})}.")
  picks = {}
  for g, group in enumerate(groups):
    for i, member in enumerate(group.members):
      picks.setdefault(_identity(member), (g, i))
  rows = list(picks.values())
  first = groups[0]
  data = first.data
  if isinstance(data, DeviceData) and data.per_member:
    data = dataclasses.replace(data, arrays={
        name: np.stack([np.asarray(groups[g].data.arrays[name][i]) for g, i in rows])
        for name in data.arrays})
  probe = first.probe
  if probe is not None:
    probe = dataclasses.replace(probe, patterns=[groups[g].probe.patterns[i] for g, i in rows])
  return dataclasses.replace(first, members=[groups[g].members[i] for g, i in rows],
                             data=data, probe=probe)


# XLA's optimisation level for a program that runs once per member or group (an init):
# level 1 costs less CPU to compile on a multi-core CPU (boolean_gotu's tiny model init
# on 2 cores: 2.2 → 1.3 CPU-s; pinned to one core both levels take about 1.2) and gives
# the default level's values bit for bit (tests/test_sweep_engine.py checks each family's
# init); the training and evaluation programs, which run many times, keep XLA's default.
ONCE_OPTIONS = {"xla_backend_optimization_level": 1}


def once_options() -> dict | None:
  """`ONCE_OPTIONS` on CPU, None where the level is someone else's: another backend, a
  level in XLA_FLAGS (the test suite's 0), or JAX_DISABLE_MOST_OPTIMIZATIONS."""
  if (jax.default_backend() != "cpu"
      or jax.config.values.get("jax_disable_most_optimizations", False)):
    return None
  if re.search(r"--xla_backend_optimization_level\b", os.environ.get("XLA_FLAGS", "")):
    return None
  return ONCE_OPTIONS


def jit_once(fn: Callable) -> Callable:
  """`jax.jit(fn)` for a program run once per member or group, compiled with
  `once_options()`, read at the first call (after any `jax.distributed` setup). The
  wrapped `fn` is `jit_once(fn).__wrapped__`."""
  @functools.cache
  def compiled():
    return jax.jit(fn, compiler_options=once_options())

  @functools.wraps(fn)
  def call(*args, **kwargs):
    if not jax_core.trace_state_clean():  # Inside a trace (`mpx compile`'s eval_shape):
      return fn(*args, **kwargs)  # inlined there, as jit takes no options when nested.
    return compiled()(*args, **kwargs)
  return call


def stack(trees: Sequence[PyTree]) -> PyTree:
  """Member trees → one tree with a leading member axis (structures must match)."""
  _check_same_structure(trees)
  return _stack(*trees)


def _check_same_structure(trees: Sequence[PyTree]) -> None:
  structures = {jax.tree_util.tree_structure(t) for t in trees}
  if len(structures) != 1:
    raise ValueError("members have different param trees; init schemes must write values "
                     "into the same structure (a scheme without a prior keeps a neutral "
                     "mask_logits leaf).")


@jax.jit
def _stack(*trees: PyTree) -> PyTree:
  # One compile for the whole tree (eager, each leaf's stack compiles on its own).
  return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)


def unstack(tree: PyTree, index: int) -> PyTree:
  """Member `index` of a stacked tree: its params, hparams or metrics alone."""
  return jax.tree_util.tree_map(lambda leaf: leaf[index], tree)


def member_keys(members: Sequence[Member]) -> jax.Array:
  """[K, 2] raw keys: each member's training randomness, a function of its seed only."""
  return jnp.stack([jax.random.key_data(jax.random.fold_in(jax.random.key(m.seed), 1))
                    for m in members])


def init_state(group: Group, rows: Sequence[int] | None = None) -> SweepState:
  """Host-side init of every member, or of the members `rows` (in that order; a repeated
  member is initialised once): what one process of a multi-host run holds
  (`member_rows`). Init schemes may run their own optimisation."""
  indices = range(len(group.members)) if rows is None else [int(i) for i in rows]
  members = [group.members[i] for i in indices]
  inits = {i: group.task.init(group.members[i]) for i in dict.fromkeys(indices)}
  hparams = optim.stack_hparams([m.hparams for m in members])
  keys = member_keys(members)
  epoch_size = (group.data.num_examples if isinstance(group.data, DeviceData)
                and group.data.sampling == "epoch" else None)
  trees = [inits[i] for i in indices]
  _check_same_structure(trees)
  state = _initial_state(group.optim, epoch_size)(trees, hparams, keys)
  if group.probe is not None:
    state = state._replace(initial=_copy(state.params))
  return state


@functools.lru_cache(maxsize=64)
def _initial_state(optim_config, epoch_size: int | None) -> Callable:
  """`(member params, hparams, keys) → SweepState` at step 0, in one compiled program
  (eager, every leaf's stack and optimizer zeros compile on their own). Epoch 0's order
  per member (`[K, P]`) comes only with epoch sampling (Orbax cannot store an empty
  array)."""
  def initial_state(trees, hparams, keys):
    params = _stack(*trees)
    opt_state = jax.vmap(lambda p, h: optim.make_optimizer(optim_config, h).init(p))(
        params, hparams)
    k = len(trees)
    orders = None if epoch_size is None else _epoch_orders(keys, 0, epoch_size)
    return SweepState(params, opt_state, keys, jnp.ones((k,), bool),
                      jnp.full((k,), -1, jnp.int32), jnp.zeros((), jnp.int32), orders, None)
  return jit_once(initial_state)


@jax.jit
def _copy(tree: PyTree) -> PyTree:
  return jax.tree_util.tree_map(jnp.copy, tree)


def _epoch_orders(raw_keys_K2, epoch, num_examples: int) -> jax.Array:
  """Every member's example order for `epoch`, `[K, P]`."""
  return jax.vmap(lambda raw_key: epoch_order(jax.random.wrap_key_data(raw_key), epoch,
                                              num_examples))(raw_keys_K2)


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


def map_members(fn: Callable, members_per_call: int | None) -> Callable:
  """`(member_args, shared_args) → outputs` over the leading member axis of `member_args`:
  one vmap, or slices of `members_per_call` members vmapped inside a sequential map."""
  if members_per_call is None:
    return jax.vmap(fn, in_axes=(0, None))
  return lambda member_args, shared: jax.lax.map(lambda a: fn(a, shared), member_args,
                                                 batch_size=members_per_call)


def make_member_step(loss: Callable, optim_config: optim.OptimConfig) -> Callable:
  """One training step of one member on `batch`; NaN isolation freezes a member at its
  last finite state and records the step it diverged at. Returns the new
  (params, opt_state, alive, diverged_step) and {"loss", aux...} (NaN once diverged)."""
  loss_and_grad = jax.value_and_grad(loss, has_aux=True)

  def step_fn(params, opt_state, raw_key, alive, diverged_step, hparams, batch, step):
    step_key = jax.random.fold_in(jax.random.wrap_key_data(raw_key), step)
    (value, aux), grads = loss_and_grad(params, batch, jax.random.fold_in(step_key, 1))
    with jax.named_scope("optimizer"):  # Scopes name the ops in a profile (profile_step.py).
      optimizer = optim.make_optimizer(optim_config, hparams)
      updates, new_opt_state = optimizer.update(grads, opt_state, params)
      new_params = optax.apply_updates(params, updates)
    with jax.named_scope("nan_isolation"):
      # The optimizer state too: an inf second moment zeroes the update, so the params
      # stay finite while the member has silently stopped training.
      finite = jnp.isfinite(value) & _all_finite((new_params, new_opt_state))
      keep = alive & finite
      params = _select(keep, new_params, params)
      opt_state = _select(keep, new_opt_state, opt_state)
      diverged_step = jnp.where(alive & ~finite, step, diverged_step)
    scalars = {"loss": value} | {name: jnp.asarray(v, jnp.float32) for name, v in aux.items()}
    return params, opt_state, keep, diverged_step, jax.tree_util.tree_map(
        lambda v: jnp.where(alive, v, jnp.nan), scalars)

  return step_fn


def make_train_chunk(group: Group, chunk_steps: int, platform: str | None = None) -> Callable:
  """`(state, hparams, data) → (state, out)` for `chunk_steps` steps of every member, for
  `platform` (None: this host's default backend; `mpx compile` names its target's).

  `data` is the device arrays (`group.data.arrays`, as placed by `place`) or, for a
  `Stream`, the chunk's batches `{name: [chunk_steps, B, ...]}` shared by all members
  (`[chunk_steps, S, B, ...]` when `stream.stacked`: member k reads row
  `stream.stream_of(seeds)[k]`, a static index gathered inside the member map).
  `out` is {"train_loss", "train_<aux>": [K] means over the chunk's steps, "alive": [K]}:
  arrays apart from the donated state, so the host reads them while the next chunk runs.

  Steps past `group.steps` are no-ops, so every chunk has the same length and the
  program compiles once. With epoch sampling the state carries the epoch's order, redrawn
  only at epoch boundaries (a `lax.cond` outside the member map): a permutation is a sort
  over the whole training set, slow on CPU. Groups with equal static settings share one
  jitted function, which compiles once per set of shapes.
  """
  if chunk_steps < 1:
    raise ValueError(f"chunk_steps must be >= 1; got {chunk_steps}.")
  data = group.data
  kind = ("stream", None) if isinstance(data, Stream) else (
      "per_member" if data.per_member else "shared", data.sampling)
  stream_rows = (data.stream_of([m.seed for m in group.members])
                 if isinstance(data, Stream) and data.stacked else None)
  options = group.chunk_options
  if isinstance(options, str):
    options = chunk_options(options, platform)
  return _compiled_chunk(group.task.loss, group.optim, kind, stream_rows, group.batch_size,
                         group.steps, chunk_steps, group.members_per_call, options)


@functools.lru_cache(maxsize=64)
def _compiled_chunk(loss, optim_config, kind, stream_rows, batch_size, total_steps,
                    chunk_steps, members_per_call, options: ChunkOptions):
  member_step = make_member_step(loss, optim_config)
  layout, sampling = kind

  def one_member(member_args, shared):
    (params, opt_state, raw_key, alive, diverged_step, hparams, own, order,
     stream_row) = member_args
    arrays, step = shared
    if layout == "stream":
      batch = arrays if stream_row is None else {
          name: array_SB[stream_row] for name, array_SB in arrays.items()}
    else:
      arrays = own if layout == "per_member" else arrays
      num_examples = next(iter(arrays.values())).shape[0]
      with jax.named_scope("batch"):
        idx = _batch_indices(jax.random.wrap_key_data(raw_key), step, order, num_examples,
                             batch_size, sampling)
        batch = {name: array[idx] for name, array in arrays.items()}
    return member_step(params, opt_state, raw_key, alive, diverged_step, hparams, batch,
                       step)

  step_members = map_members(one_member, members_per_call)

  def chunk(state: SweepState, hparams, data):
    initial = state.initial  # Constant: kept out of the loop carry.
    own = data if layout == "per_member" else None
    rows_K = None if stream_rows is None else jnp.asarray(
        np.asarray(stream_rows, np.int32)[padded_members(state.alive.shape[0],
                                                         len(stream_rows))])
    if layout != "stream":
      num_examples = next(iter(data.values())).shape[1 if layout == "per_member" else 0]
      per_epoch = num_examples // batch_size

    def body(state, xs):
      step, batches = xs
      order = state.order
      if sampling == "epoch" and total_steps > per_epoch:  # A one-epoch run never redraws.
        # Epoch 0's order comes with the state (init_state), so step 0 needs no redraw.
        with jax.named_scope("epoch_redraw"):
          order = jax.lax.cond((step % per_epoch == 0) & (step > 0),
                               lambda: _epoch_orders(state.key, step // per_epoch,
                                                     num_examples),
                               lambda: order)
      shared = batches if layout == "stream" else (None if own is not None else data)
      params, opt_state, alive, diverged_step, scalars = step_members(
          (state.params, state.opt_state, state.key, state.alive, state.diverged_step,
           hparams, own, order, rows_K), (shared, step))
      active = step < total_steps
      new = state._replace(params=params, opt_state=opt_state, alive=alive,
                           diverged_step=diverged_step, step=state.step + 1, order=order)
      return _select(active, new, state), jax.tree_util.tree_map(
          lambda v: jnp.where(active, v, 0.0), scalars)

    steps = state.step + jnp.arange(chunk_steps, dtype=jnp.int32)
    final, scalars = jax.lax.scan(body, state._replace(initial=None),
                                  (steps, data if layout == "stream" else None),
                                  unroll=options.scan_unroll)
    counted = jnp.maximum(jnp.minimum(total_steps - state.step, chunk_steps), 1)
    out = {f"train_{name}": jnp.sum(v, axis=0) / counted for name, v in scalars.items()}
    return final._replace(initial=initial), out | {"alive": final.alive}

  return jax.jit(chunk, donate_argnums=(0,),
                 compiler_options=dict(options.compiler_options) or None)


# --------------------------------------------------------------------------- devices


def member_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh | None:
  """A 1-D mesh over every device of every process (`jax.devices()`) for the member axis;
  None on one device."""
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("devices is empty; pass None to use all devices.")
  return Mesh(np.array(devices), (MEMBER_AXIS,)) if len(devices) > 1 else None


def padded_size(num_members: int, mesh: Mesh | None) -> int:
  """Members are padded (with copies, never reported) to a multiple of the devices. The
  padding lives only on device: checkpoints are restored by member (`take_rows`), so a
  run resumes on another number of devices or hosts."""
  n = 1 if mesh is None else mesh.size
  return -(-num_members // n) * n


def padded_members(size: int, num_members: int) -> np.ndarray:
  """The member each of the `size` global rows holds: padding repeats the last member."""
  return np.minimum(np.arange(size), num_members - 1)


def member_rows(num_members: int, mesh: Mesh | None) -> np.ndarray:
  """The member index of each row this process's devices hold, in row order; padding
  rows repeat the last member. All rows on one process."""
  size = padded_size(num_members, mesh)
  rows = np.arange(size)
  if mesh is not None:
    index_map = NamedSharding(mesh, PartitionSpec(MEMBER_AXIS)).addressable_devices_indices_map(
        (size,))
    rows = np.unique(np.concatenate([rows[index] for index in index_map.values()]))
  return padded_members(size, num_members)[rows]


def take_rows(tree: PyTree, rows: np.ndarray) -> PyTree:
  """The member rows `rows` of every leaf with a member axis (scalars such as `step`
  are kept)."""
  rows = np.asarray(rows)
  if all(isinstance(x, (np.ndarray, np.generic)) for x in jax.tree_util.tree_leaves(tree)):
    return jax.tree_util.tree_map(lambda x: x if x.ndim == 0 else x[rows], tree)  # Host.
  return _take_rows(tree, rows)


@jax.jit
def _take_rows(tree: PyTree, rows: jax.Array) -> PyTree:
  # One compile for the whole tree (eager, each leaf's gather compiles on its own).
  return jax.tree_util.tree_map(lambda x: x if jnp.ndim(x) == 0 else x[rows], tree)


def to_global(tree: PyTree, mesh: Mesh | None, size: int) -> PyTree:
  """This process's member rows → global arrays `[size, ...]` sharded over the mesh
  (scalars replicated): `jax.make_array_from_process_local_data`, so no process holds
  another's members."""
  if mesh is None:
    return jax.tree_util.tree_map(jnp.asarray, tree)
  split = NamedSharding(mesh, PartitionSpec(MEMBER_AXIS))
  replicated = NamedSharding(mesh, PartitionSpec())

  def place_leaf(x):
    x = np.asarray(x)
    if x.ndim == 0:
      return jax.device_put(x, replicated)
    return jax.make_array_from_process_local_data(split, x, (size,) + x.shape[1:])
  return jax.tree_util.tree_map(place_leaf, tree)


def replicate(tree: PyTree, mesh: Mesh | None) -> PyTree:
  """Places every leaf whole on every device (data shared by all members)."""
  if mesh is None:
    return jax.tree_util.tree_map(jnp.asarray, tree)
  return jax.device_put(tree, NamedSharding(mesh, PartitionSpec()))


def place(group: Group, state: SweepState, mesh: Mesh | None, *, local: bool = False):
  """(state, hparams, device data or None) padded to the mesh and placed on it.

  `state` holds every member (`init_state(group)`), or with `local=True` only this
  process's rows (`init_state(group, member_rows(K, mesh))`, what a multi-host run builds).
  """
  k = len(group.members)
  size, rows = padded_size(k, mesh), member_rows(k, mesh)
  if not local:
    state = take_rows(state, rows)
  hparams = optim.stack_hparams([group.members[i].hparams for i in rows])
  data = None
  if isinstance(group.data, DeviceData):
    arrays = dict(group.data.arrays)
    data = (to_global(take_rows(arrays, rows), mesh, size) if group.data.per_member
            else replicate(arrays, mesh))
  return to_global(state, mesh, size), to_global(hparams, mesh, size), data
