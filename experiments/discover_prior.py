"""Discovering the prior (not in the paper): when a task's interaction structure is not
known, read it from training on the seen data, then train a fresh model with it as the mask.

    mpx run discover_prior --preset tiny --out /tmp/discover_tiny   # 2Parity, 1 seed: a smoke test
    mpx run discover_prior --preset quick --out runs/discover-quick # 5 tasks × 7 arms × 2 seeds
    mpx run discover_prior --preset cpu --out runs/discover-cpu     # 4 layers × 64, 4 seeds
    mpx run discover_prior --preset cpu --out runs/discover-cpu --resume   # after a stop
    python -m mpx.experiments.discover_prior runs/discover-cpu      # discovery.md, figures

Two stages per task, each one compiled group, trained in turn in one run folder:

  stage 1 (group TASK-stage1) trains on the seen data
    default   the model's init, frozen neutral mask: the baseline, and route (b)'s model;
    learned   the learnable neutral mask M = 0 in every layer and head (standard attention
              with gradient 1/2), `sparsity` · mean σ(M) added to the loss, the mask's
              learning rate × `discover_mask_lr_multiplier`: route (a)'s model.
  stage 2 (group TASK-stage2) reads stage 1's final checkpoint from the run folder
    (`mpx.tasks.boolean.discover`): route (a) the learned member's masks, σ(M) above
    `mask_threshold` in any layer and head; route (b) the default member's output on the
    whole cube, Fourier coefficients above `fourier_threshold` of the largest, per seed.
    Each graph becomes a ±mask_strength prior in every layer (`priors.from_interactions`:
    CLS reads the support, paired bits read each other, other bits only themselves) and
    trains a fresh model of the same seed, as the hand-written prior does:
    mask                 the hand-written prior (boolean_gotu's `mask` scheme);
    discovered_mask      route (a)'s graph;   random_mask      a random graph of its size;
    discovered_fourier   route (b)'s graph;   random_fourier   a random graph of its size.

The stage-2 members carry the graph they trained with and its precision / recall of
support bits and pairs against the task's true graph (`boolean_discover.true_graph`, the
target's own spectrum), so summary.md holds discovery and unseen accuracy side by side.
RUN_DIR/discovered.json holds every graph (pooled, per layer and head, per seed) and
plots/discovered_TASK.png the true and discovered adjacencies. A `--resume` derives the
graphs again from stage 1's checkpoint; a discovered graph that is empty trains with the
neutral prior (it equals the default; `graph_empty` says so).

Every choice that shapes discovery (sparsity 0.1, mask learning rate ×10, the thresholds
σ(M) > 1/2 and |c_S| >= 0.1 max |c_S|) was fixed on a planted synthetic function
(x0x1 + x2x3 on 12 bits) before any unseen accuracy of these tasks was looked at.

Expect (quick, 2 seeds, 24 min of CPU; experiments/results/discover_prior_quick.md): route
(b) recovers the true graph (precision and recall 1.00 of bits and pairs) on 2Parity,
Majority, cov_parity3 and cov_majority3_hole, and its prior trains to the hand-written
prior's unseen accuracy (0 / 75.00 ± 25.00 / 0 / 61.89 ± 38.11 %); route (a) finds every
support bit with spurious ones (bit precision 0.27–0.75) and trains to the default's
numbers (cov_majority3_hole 12.50 ± 12.50 against 0); on Cyclic3, which the quick model does
not fit, neither route finds the windows (36.95 / 39.50 against the hand-written 80.98).
The `cpu` run (4 seeds) is the one that reports.

Presets: `quick` and `cpu` are boolean_gotu's model, learning rate and epochs, so the arms
`default` and `mask` are boolean_gotu's / boolean_coverage's members of the same preset and
seeds (quick: their numbers agree to the last digit); `quick` evaluates only at the end;
`tiny` is a smoke test. One configuration per run folder: lists of a hyperparameter are
refused.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import zlib
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

import mpx.experiments.boolean_coverage  # noqa: F401 (registers the cov_* tasks)
from mpx import priors, report as report_lib, schemes
from mpx.experiments.boolean_gotu import PRESETS as GOTU_PRESETS
from mpx.sweep import engine, evaluate, optim
from mpx.sweep.data import DeviceData, EvalData
from mpx.tasks import boolean, discover_stages
from mpx.tasks.boolean import discover as boolean_discover
from mpx.tasks.boolean import fourier as boolean_fourier
from mpx.tasks.boolean import gotu
from mpx.tasks.boolean.discover import InteractionGraph

NAME = "discover_prior"  # `mpx run discover_prior`; also as mpx.experiments.discover_prior.

TASKS = ("2parity", "majority3", "cyclic3", "cov_parity3", "cov_majority3_hole")
STAGE_1 = ("default", "learned")
# Stage-2 arms whose prior comes from stage 1: (the stage-1 arm it reads, its graph).
DERIVED = {"discovered_mask": ("learned", "mask"), "random_mask": ("learned", "random_mask"),
           "discovered_fourier": ("default", "fourier"),
           "random_fourier": ("default", "random_fourier")}
ARMS = STAGE_1 + ("mask",) + tuple(DERIVED)
SCORES = ("bit_precision", "bit_recall", "pair_precision", "pair_recall")
METRICS = ("accuracy_unseen", *SCORES, "accuracy", "accuracy_seen", "loss_unseen", "mdi_distance_unseen",
           "target_distance_unseen", "graph_bits", "graph_pairs", "graph_empty")
PAPER = {}  # Not in the paper.
DISCOVERED_FILE = "discovered.json"
REPORT_FILE = "discovery.md"


@dataclasses.dataclass(frozen=True)
class Config(gotu.Config):
  """boolean_gotu's Config (model, protocol, `mask_strength`, `mask_lr_multiplier` of every
  stage-2 prior); `schemes` are this experiment's arms (`ARMS`).

  sparsity: weight of the pressure mean σ(M) (over every mask entry of every layer) in the
    `learned` arm's loss; it closes what the task does not hold open.
  discover_mask_lr_multiplier: the `learned` arm's mask learning rate, × the rest's.
  mask_threshold: route (a) reads an entry as open when σ(M) > it (1/2: above its init).
  fourier_threshold: route (b) keeps coefficients with |c_S| >= it × max |c_S| (S ≠ ∅).
  persistence: the persistence diagnostics at each evaluation (False: a faster smoke test).
  """
  SCHEME_NAMES: ClassVar[tuple[str, ...]] = ARMS
  tasks: tuple[str, ...] = TASKS
  schemes: tuple[str, ...] = ARMS
  sparsity: float = 0.1
  discover_mask_lr_multiplier: float = 10.0
  mask_threshold: float = boolean_discover.MASK_THRESHOLD
  fourier_threshold: float = boolean_discover.FOURIER_THRESHOLD
  persistence: bool = True

  def __post_init__(self):
    super().__post_init__()
    missing = sorted({DERIVED[a][0] for a in self.schemes if a in DERIVED} - set(self.schemes))
    if missing:
      raise ValueError(f"schemes {self.schemes}: the discovered and random arms read stage "
                       f"1's {missing}; add them to schemes.")
    if not (self.sparsity >= 0 and self.discover_mask_lr_multiplier > 0):
      raise ValueError(f"sparsity={self.sparsity} must be >= 0 and discover_mask_lr_"
                       f"multiplier={self.discover_mask_lr_multiplier} > 0 (the mask learns).")
    if self.designs != ("clique",):
      raise ValueError(f"designs={self.designs}: the hand-written arm `mask` is the task's "
                       "prior (design clique); compare designs with boolean_gotu.")
    unknown = [t for t in self.tasks if "mask" in self.schemes and not boolean.get_task(t).support]
    if unknown:
      raise ValueError(f"tasks {unknown} have no support, so no hand-written prior: drop "
                       "mask from schemes (or give make_task the support).")
    if not 0 < self.mask_threshold < 1 or not 0 < self.fourier_threshold <= 1:
      raise ValueError(f"mask_threshold={self.mask_threshold} must be in (0, 1) (a σ(M)) and "
                       f"fourier_threshold={self.fourier_threshold} in (0, 1] (a share of "
                       "the largest coefficient).")


_MODEL = ("width", "depth", "num_heads", "head_dim", "mlp_dim", "learning_rate", "epochs",
          "chunk_steps")
PRESETS = {
    # boolean_gotu's quick model and protocol; only the final evaluation.
    "quick": {k: GOTU_PRESETS["quick"][k] for k in _MODEL} | dict(seeds=2),
    # boolean_gotu's cpu preset (its evaluations and checkpoints every 128 steps).
    "cpu": {k: GOTU_PRESETS["cpu"][k] for k in _MODEL} | dict(
        seeds=4, eval_every=128, checkpoint_every=128),
    # A smoke test of both stages and the files: 2Parity, 1 seed, 24 steps of big batches.
    "tiny": dict(tasks=("2parity",), seeds=1, width=16, depth=1, num_heads=2, head_dim=8,
                 mlp_dim=16, learning_rate=1e-3, epochs=1, batch_size=1024, chunk_steps=4,
                 persistence=False),
}


# ----------------------------------------------------------------------------- stage 1

def _group(config: Config, task: str, members: list[engine.Member]) -> engine.Group:
  """boolean_gotu's group of `members`: its data, evaluation on the whole cube and
  optimizer, and its persistence probe where the task has a support (the probe scores
  attention on the task's hand-written prior). A task whose structure is unknown (no
  support) or `persistence=False` trains the same group without the probe."""
  spec = boolean.get_task(task)
  if config.persistence and spec.support:
    return gotu.make_group(config, task, members)
  splits = {m.seed: gotu.training_split(spec, m.seed, None) for m in members}
  if spec.protocol == "enumerate":
    data = DeviceData(dict(zip("xy", splits[members[0].seed])), sampling="epoch")
  else:
    data = DeviceData({k: np.stack([splits[m.seed][i] for m in members])
                       for i, k in enumerate("xy")}, per_member=True, sampling="epoch")
  epochs = config.epochs if config.epochs is not None else gotu.TASK_PROTOCOL[task][1]
  steps = epochs * (data.num_examples // config.batch_size)
  return engine.Group(
      name=task, members=members, task=gotu.make_task(config, task), data=data,
      eval_data=EvalData({"x": boolean.cube(spec.n_bits)}, config.eval_points_per_call),
      steps=steps, batch_size=config.batch_size, members_per_call=config.members_per_call,
      optim=optim.OptimConfig(optimizer="adam_l2", total_steps=steps))


def _default_init(config: Config, task: str):
  """boolean_gotu's `default` init (the model's own, neutral frozen mask), which needs no
  support: member → params."""
  n_bits = boolean.get_task(task).n_bits
  model_init, neutral = gotu.make_model_init(config, n_bits), priors.neutral(n_bits + 1)
  return lambda member: schemes.set_masks(model_init(jax.random.key(member.seed)), neutral)


def _stage1_group(config: Config, task: str) -> engine.Group:
  """default and learned × seeds; the pressure is in every member's loss, where it moves
  only a learnable mask (the default's is frozen and has zero gradient)."""
  members = []
  for arm in (a for a in STAGE_1 if a in config.schemes):
    hparams = {"learning_rate": gotu_lr(config, task), "weight_decay": config.weight_decay,
               "mask_lr_multiplier": config.discover_mask_lr_multiplier if arm == "learned"
               else 0.0}
    members += [engine.Member(task, arm, seed, hparams,
                              labels={"mask_strength": config.mask_strength})
                for seed in range(config.seeds)]
  group = _group(config, task, members)
  default_init = _default_init(config, task)
  n_tokens = boolean.get_task(task).n_bits + 1
  masked = range(config.depth) if config.mask_layers is None else config.mask_layers

  def init(member):
    params = default_init(member)
    if member.scheme == "learned":
      params = discover_stages.learnable_masks(params, n_tokens, masked)
    return params

  task_ = discover_stages.with_sparsity(dataclasses.replace(group.task, init=init),
                                        config.sparsity)
  return dataclasses.replace(group, name=f"{task}-stage1", task=task_)


def gotu_lr(config: Config, task: str) -> float:
  """The learning rate boolean_gotu gives the task (the config's, else its protocol's)."""
  return config.learning_rate if config.learning_rate is not None else gotu.TASK_PROTOCOL[task][0]


class Stage1(discover_stages.Stage1):
  """Stage 1 of one task as stage 2 reads it (`discover_stages.Stage1`): the final
  checkpoint of TASK-stage1 in the run folder, turned into both routes' graphs per seed
  once per process, on first use."""

  def __init__(self, config: Config, task: str, group: engine.Group):
    super().__init__(NAME, task, group, self._derive)
    self.config, self.task = config, task

  def graphs(self) -> dict[int, dict[str, InteractionGraph]]:
    """{seed: {"mask", "fourier", "random_mask", "random_fourier": graph}}."""
    return self.derived()

  def _derive(self, state: engine.SweepState) -> dict:
    config, spec = self.config, boolean.get_task(self.task)
    params_K = jax.tree_util.tree_map(jnp.asarray, state.params)
    preds = evaluate.eval_values(self.group, params_K)["pred"]  # [K, 2^n], cube order.
    truth = boolean_discover.true_graph(spec)
    graphs, record = {}, {}
    for i, member in enumerate(self.group.members):
      seed, out = member.seed, graphs.setdefault(member.seed, {})
      entry = record.setdefault(str(seed), {})
      if member.scheme == "learned":
        masks = discover_stages.mask_logits_LHNN(engine.unstack(state.params, i))
        out["mask"] = boolean_discover.graph_from_masks(masks, config.mask_threshold)
        entry["mask_layers"] = boolean_discover.graphs_to_json(
            boolean_discover.mask_graphs(masks, config.mask_threshold))
        entry["mask_sigma_max"] = np.round(jax.nn.sigmoid(masks.reshape(
            (-1,) + masks.shape[-2:]).max(0)), 4).tolist()
        route = "mask"
      else:
        values = np.asarray(preds[i], np.float64)
        out["fourier"] = boolean_discover.graph_from_function(values, spec.n_bits,
                                                              config.fourier_threshold)
        weights = boolean_discover.pair_weights(
            boolean_fourier.fourier_coefficients(values, spec.n_bits), spec.n_bits)
        entry["fourier_pair_weight"] = np.round(weights / max(weights.max(), 1e-12),
                                                4).tolist()
        route = "fourier"
      out[f"random_{route}"] = boolean_discover.random_like(
          out[route], [seed, zlib.crc32(f"{self.task}/{route}".encode())])
      for name in (route, f"random_{route}"):
        entry[name] = out[name].to_json() | boolean_discover.score(out[name], truth)
    self._write(truth, record)
    return graphs

  def _write(self, truth: InteractionGraph, record: dict) -> None:
    """RUN_DIR/discovered.json gets this task's graphs (the other tasks' are kept), and
    plots/discovered_TASK.png its figure."""
    data = discover_stages.record_discovered(
        self.run_dir / DISCOVERED_FILE, self.task,
        {"n_bits": truth.n_bits, "truth": truth.to_json(), "seeds": record},
        {"thresholds": {"mask": self.config.mask_threshold,
                        "fourier": self.config.fourier_threshold}},
        trained_with=lambda entry: {
            seed: {g: {"bits": e[g]["bits"], "pairs": e[g]["pairs"]}
                   for _, g in DERIVED.values() if g in e}
            for seed, e in entry["seeds"].items()})
    plot_discovered(self.task, data["tasks"][self.task],
                    self.run_dir / "plots" / f"discovered_{self.task}.png")


# ----------------------------------------------------------------------------- stage 2


def _stage2_group(config: Config, task: str, stage1: Stage1 | None) -> engine.Group:
  """The hand-written prior and the priors of stage 1's graphs, × seeds."""
  arms = [a for a in ARMS if a in config.schemes and a not in STAGE_1]
  members = []
  for arm in arms:
    hparams = {"learning_rate": gotu_lr(config, task), "weight_decay": config.weight_decay,
               "mask_lr_multiplier": config.mask_lr_multiplier}
    members += [engine.Member(task, arm, seed, hparams, design="clique" if arm == "mask" else None,
                              labels={"mask_strength": config.mask_strength})
                for seed in range(config.seeds)]
  group = _group(config, task, members)
  base, default_init = group.task, _default_init(config, task)
  spec = boolean.get_task(task)
  truth = boolean_discover.true_graph(spec)
  hand = (boolean_discover.graph_from_open(np.asarray(gotu.task_prior(task, 1.0)) > 0)
          if "mask" in arms else None)
  masked = range(config.depth) if config.mask_layers is None else config.mask_layers

  def graph(member) -> InteractionGraph:
    if member.scheme == "mask":
      return hand
    return stage1.graphs()[member.seed][DERIVED[member.scheme][1]]

  def init(member):
    if member.scheme == "mask":
      return base.init(member)
    found = graph(member)
    prior = (priors.neutral(spec.n_bits + 1) if found.empty
             else found.prior(member.labels["mask_strength"]))
    return schemes.set_masks_per_layer(default_init(member),
                                       {f"block_{i}": prior for i in masked})

  def summarize(values, member):
    metrics = base.summarize(values, member)
    found = graph(member)
    return metrics | boolean_discover.score(found, truth) | {
        "graph": found.to_json(), "graph_bits": len(found.bits),
        "graph_pairs": len(found.pairs), "graph_empty": float(found.empty)}

  return dataclasses.replace(group, name=f"{task}-stage2",
                             task=dataclasses.replace(base, init=init, summarize=summarize))


# ----------------------------------------------------------------------------- the run

# (config, task) → its Stage1, so `save_run_files` can tell it the run folder.
_STAGE1: dict[tuple[Config, str], Stage1] = {}


def fingerprint(config: Config) -> dict:
  """Each task's definition (boolean_gotu's): `--resume` refuses a changed task."""
  return gotu.fingerprint(config)


def build_groups(config: Config):
  """Per task: stage 1 (default, learned), then stage 2 (the priors), in that order."""
  return discover_stages.two_stages(NAME, config, STAGE_1, _STAGE1, _stage1_group, Stage1,
                                    _stage2_group)


def save_run_files(config: Config, run_dir) -> None:
  """The run loop's hook before training: tells stage 2 where stage 1's checkpoints are,
  and refuses a run folder of several configurations (stage 2 reads stage 1's members by
  their order in one group)."""
  discover_stages.attach_run_dir(NAME, _STAGE1, config, run_dir)


# ----------------------------------------------------------------------------- the report


def _adjacency_NN(n_bits: int, graph: dict) -> np.ndarray:
  return InteractionGraph.from_json(n_bits, graph).adjacency().astype(float)


def plot_discovered(task: str, record: dict, path) -> str:
  """One row per seed: the true graph, the learned σ(M) (max over layers and heads, CLS
  first), route (a)'s graph, the default model's Fourier pair weights (normalised) and
  route (b)'s graph; a graph's diagonal marks its support bits."""
  from mpx import plotting
  n = record["n_bits"]
  seeds = sorted(record["seeds"], key=int)
  columns = [("true graph", lambda s: _adjacency_NN(n, record["truth"])),
             ("learned σ(M), max over layers, heads", lambda s: s.get("mask_sigma_max")),
             ("(a) mask route", lambda s: s.get("mask") and _adjacency_NN(n, s["mask"])),
             ("Fourier pair weight (default)", lambda s: s.get("fourier_pair_weight")),
             ("(b) Fourier route", lambda s: s.get("fourier") and _adjacency_NN(n, s["fourier"]))]
  fig, axes = plotting.subplots(
      len(seeds), len(columns), (2.6 * len(columns), 2.5 * len(seeds) + 0.4), left=0.5,
      right=0.15, bottom=0.5, top=0.75, wspace=0.5, hspace=0.8)
  for row, seed in enumerate(seeds):
    for col, (title, get) in enumerate(columns):
      ax, values = axes[row, col], get(record["seeds"][seed])
      if values is None:
        ax.set_axis_off()
        continue
      values = np.asarray(values, float)
      ax.imshow(values, vmin=0, vmax=1, cmap="viridis")
      names = (["CLS"] if len(values) == n + 1 else []) + [f"x{i}" for i in range(n)]
      ticks = list(range(0, len(names), max(1, len(names) // 8)))
      ax.set_xticks(ticks, [names[t] for t in ticks], fontsize="xx-small", rotation=90)
      ax.set_yticks(ticks, [names[t] for t in ticks], fontsize="xx-small")
      ax.set_title(f"{title}\nseed {seed}" if row == 0 else f"seed {seed}", fontsize="x-small")
  fig.suptitle(f"{task}: true and discovered interaction graphs (diagonal = support)",
               fontsize="small")
  return plotting._save(fig, path)


_fmt = discover_stages.fmt_stats
_score = discover_stages.fmt_score
_per_seed = discover_stages.per_seed


def discovery_table(summary: dict, task: str) -> str:
  """Markdown, one row per arm of `task`: unseen accuracy (%) and the graph's precision /
  recall of support bits and pairs against the true graph, mean ± std over seeds, then the
  per-seed unseen accuracies."""
  members = summary["members"]
  rows = {r["scheme"]: r for r in report_lib.summarize(
      [m for m in members if m["task"] == task], ["accuracy_unseen", *SCORES])}
  lines = ["| arm | unseen accuracy (%) | bit precision | bit recall | pair precision | "
           "pair recall | unseen accuracy per seed (%) |", "|" + "---|" * 7]
  for arm in ARMS:
    if arm not in rows:
      continue
    r = rows[arm]
    fmt = lambda stats, percent: _fmt(stats, percent, r["n_seeds"])
    cells = [arm, fmt(r["accuracy_unseen"], True), *(fmt(r[s], False) for s in SCORES),
             _per_seed(members, task, arm, "accuracy_unseen", True)]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def _read(run_dirs) -> tuple[dict, dict]:
  """The runs' summary.json members and discovered.json tasks, joined (pieces of one study
  run as `--set tasks=...`); their thresholds must agree."""
  summaries, discovered = [], []
  for run_dir in map(pathlib.Path, run_dirs):
    for name in (report_lib.SUMMARY_JSON, DISCOVERED_FILE):
      if not (run_dir / name).is_file():
        raise ValueError(f"{run_dir / name} is missing: run `mpx run {NAME} --out {run_dir}` "
                         "to the end first (summary.json is written last).")
    summaries.append(json.loads((run_dir / report_lib.SUMMARY_JSON).read_text()))
    discovered.append(json.loads((run_dir / DISCOVERED_FILE).read_text()))
  if len({json.dumps(d["thresholds"], sort_keys=True) for d in discovered}) > 1:
    raise ValueError(f"{list(map(str, run_dirs))} discovered with other thresholds; report "
                     "runs of one configuration together.")
  summary = dict(summaries[0], members=[m for s in summaries for m in s["members"]])
  joined = dict(discovered[0], tasks={k: v for d in discovered for k, v in d["tasks"].items()})
  return summary, joined


def report(run_dir, *more_run_dirs) -> list[str]:
  """Reads RUN_DIR's summary.json and discovered.json (and those of more runs of the same
  configuration, e.g. the tasks run in pieces); writes RUN_DIR/discovery.md (a table per
  task, each seed's graphs) and redraws RUN_DIR/plots/discovered_TASK.png."""
  run_dir = pathlib.Path(run_dir)
  summary, discovered = _read([run_dir, *more_run_dirs])
  written = []
  parts = [f"# Discovering the prior ({summary['experiment']}, preset {summary['preset']})\n",
           "Unseen sign accuracy and the precision / recall of the graph each arm trained "
           "with, against the task's true graph (mean ± population std over seeds; "
           f"{report_lib.MISSING}: undefined, e.g. the precision of an empty graph). "
           f"Thresholds: σ(M) > {discovered['thresholds']['mask']} (route a), |c_S| >= "
           f"{discovered['thresholds']['fourier']} max |c_S| (route b).\n"]
  for task, record in discovered["tasks"].items():
    figure = plot_discovered(task, record, run_dir / "plots" / f"discovered_{task}.png")
    written.append(figure)
    parts += [f"## {task}\n", f"![{task}](plots/discovered_{task}.png)\n",
              discovery_table(summary, task),
              f"True graph: bits {record['truth']['bits']}, "
              f"{len(record['truth']['pairs'])} pairs.\n"]
    # Which stage-1 arm each route reads, and its seen accuracy: a graph is worth as much
    # as the fit it was read from (route (b)'s cut is relative: noise gives a graph too).
    read_from = {graph: arm for arm, graph in DERIVED.values()}
    seen = {(m["scheme"], m["seed"]): m["metrics"].get("accuracy_seen")
            for m in summary["members"] if m["task"] == task}
    for seed, entry in sorted(record["seeds"].items(), key=lambda kv: int(kv[0])):
      for route in ("mask", "fourier"):
        if route in entry:
          g = entry[route]
          scores = "; ".join(f"{s.replace('_', ' ')} {_score(g[s])}" for s in SCORES)
          fit = seen.get((read_from[route], int(seed)))
          fit = "" if fit is None else f"; read from a model at {100 * fit:.2f}% seen accuracy"
          parts.append(f"- seed {seed}, route {route}: bits {g['bits']}, pairs "
                       f"{[tuple(p) for p in g['pairs']]} ({scores}{fit})")
    parts.append("")
  path = run_dir / REPORT_FILE
  path.write_text("\n".join(parts) + "\n")
  return [str(path), *written]


if __name__ == "__main__":
  if len(sys.argv) < 2:
    sys.exit(f"usage: python -m mpx.experiments.{NAME} RUN_DIR [MORE_RUN_DIRS...]")
  for name in report(*sys.argv[1:]):
    print(f"wrote {name}")
