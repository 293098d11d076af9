"""Discovering a Boolean task's prior in two stages: read its interaction graph from
training on the seen data, then train a fresh model with it as the mask
(`experiments/discover_boolean.py` is the experiment's record, docs/discover.md the guide).

Stage 1 (group TASK-stage1) trains on the seen data:
  default   the model's init, frozen neutral mask: the baseline, and route (b)'s model;
  learned   the learnable neutral mask M = 0 in every layer and head (standard attention
            with gradient 1/2), `sparsity` · mean σ(M) added to the loss, the mask's
            learning rate × `discover_mask_lr_multiplier`: route (a)'s model.
Stage 2 (group TASK-stage2) reads stage 1's final checkpoint from the run folder
(`mpx.sweep.stages`, the graphs of `mpx.tasks.boolean.graphs`): route (a) the learned
member's masks, σ(M) above `mask_threshold` in any layer and head; route (b) the default
member's output on the whole cube, Fourier coefficients above `fourier_threshold` of the
largest, per seed. Each graph becomes a ±mask_strength prior in every layer
(`priors.from_interactions`) and trains a fresh model of the same seed, as the
hand-written prior does:
  mask                 the hand-written prior (gotu's `mask` scheme);
  discovered_mask      route (a)'s graph;   random_mask      a random graph of its size;
  discovered_fourier   route (b)'s graph;   random_fourier   a random graph of its size;
  support_mask / support_fourier  (`SUPPORT_ARMS`, not in `ARMS`: discover_planted's) the
                       true support with as many random pairs among it as the route's graph.

The stage-2 members carry the graph they trained with and its precision / recall of
support bits and pairs against the task's true graph (`graphs.true_graph`, the target's
own spectrum). RUN_DIR/discovered.json holds every graph (pooled, per layer and head, per
seed) and plots/discovered_TASK.png the true and discovered adjacencies; a graph that is
empty trains with the neutral prior (it equals the default; `graph_empty` says so).
`discover(task, out_dir)` runs it on a task of yours.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import zlib
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from mpx import priors, report as report_lib, schemes
from mpx.sweep import engine, evaluate, stages
from mpx.tasks import boolean, discovery
from mpx.tasks.boolean import fourier, gotu, graphs
from mpx.tasks.boolean.graphs import InteractionGraph

NAME = "discover_boolean"  # The experiment (`mpx run discover_boolean`).

TASKS = ("2parity", "majority3", "cyclic3", "cov_parity3", "cov_majority3_hole")
STAGE_1 = ("default", "learned")
# Stage-2 arms whose prior comes from stage 1: (the stage-1 arm it reads, its graph).
DERIVED = {"discovered_mask": ("learned", "mask"), "random_mask": ("learned", "random_mask"),
           "discovered_fourier": ("default", "fourier"),
           "random_fourier": ("default", "random_fourier")}
ARMS = STAGE_1 + ("mask",) + tuple(DERIVED)
# The controls that separate "which bits" from "which pairs" (discover_planted's; not in
# ARMS, so discover_boolean's runs are as before): the task's true support with as many
# random pairs among it as the route's graph has (`graphs.support_like`).
SUPPORT_ARMS = {"support_mask": ("learned", "support_mask"),
                "support_fourier": ("default", "support_fourier")}
ALL_DERIVED = DERIVED | SUPPORT_ARMS
ALL_ARMS = ARMS + tuple(SUPPORT_ARMS)
SCORES = ("bit_precision", "bit_recall", "pair_precision", "pair_recall")
DISCOVERED_FILE = "discovered.json"
REPORT_FILE = "discovery.md"


@dataclasses.dataclass(frozen=True)
class Config(discovery.DiscoveryConfig, gotu.Config):
  """boolean_gotu's Config (model, protocol, `mask_strength`, `mask_lr_multiplier` of every
  stage-2 prior) and the `learned` arm's (`discovery.DiscoveryConfig`: route (a) reads
  its masks at `mask_threshold`); `schemes` are this experiment's arms (`ARMS`).

  fourier_threshold: route (b) keeps coefficients with |c_S| >= it × max |c_S| (S ≠ ∅).
  """
  SCHEME_NAMES: ClassVar[tuple[str, ...]] = ARMS
  tasks: tuple[str, ...] = TASKS
  schemes: tuple[str, ...] = ARMS
  fourier_threshold: float = graphs.FOURIER_THRESHOLD

  def __post_init__(self):
    super().__post_init__()
    missing = sorted({ALL_DERIVED[a][0] for a in self.schemes if a in ALL_DERIVED}
                     - set(self.schemes))
    if missing:
      raise ValueError(f"schemes {self.schemes}: the discovered and random arms read stage "
                       f"1's {missing}; add them to schemes.")
    if self.designs != ("clique",):
      raise ValueError(f"designs={self.designs}: the hand-written arm `mask` is the task's "
                       "prior (design clique); compare designs with boolean_gotu.")
    unknown = [t for t in self.tasks if "mask" in self.schemes and not boolean.get_task(t).support]
    if unknown:
      raise ValueError(f"tasks {unknown} have no support, so no hand-written prior: drop "
                       "mask from schemes (or give make_task the support).")
    if not 0 < self.fourier_threshold <= 1:
      raise ValueError(f"fourier_threshold={self.fourier_threshold} must be in (0, 1] (a "
                       "share of the largest coefficient).")


# ----------------------------------------------------------------------------- stage 1

def _group(config: Config, spec: boolean.BooleanTask, members: list[engine.Member]
           ) -> engine.Group:
  """boolean_gotu's group of `members`, with its persistence probe where the task has a
  support (the probe scores attention on the task's hand-written prior); a task whose
  structure is unknown (no support) or `persistence=False` trains without it."""
  return gotu.make_group(config, spec, members, probe=config.persistence and bool(spec.support))


def _default_init(config: Config, spec: boolean.BooleanTask):
  """boolean_gotu's `default` init (the model's own, neutral frozen mask), which needs no
  support: member → params."""
  n_bits = spec.n_bits
  model_init, neutral = gotu.make_model_init(config, n_bits), priors.neutral(n_bits + 1)
  return lambda member: schemes.set_masks(model_init(jax.random.key(member.seed)), neutral)


def stage1_group(config: Config, task: str) -> engine.Group:
  """default and learned × seeds; the pressure is in every member's loss, where it moves
  only a learnable mask (the default's is frozen and has zero gradient)."""
  spec = boolean.get_task(task)
  members = []
  for arm in (a for a in STAGE_1 if a in config.schemes):
    hparams = {"learning_rate": gotu_lr(config, task), "weight_decay": config.weight_decay,
               "mask_lr_multiplier": config.discover_mask_lr_multiplier if arm == "learned"
               else 0.0}
    members += [engine.Member(task, arm, seed, hparams,
                              labels={"mask_strength": config.mask_strength})
                for seed in range(config.seeds)]
  group = _group(config, spec, members)
  default_init = _default_init(config, spec)
  n_tokens = spec.n_bits + 1
  masked = config.masked_layers

  def init(member):
    params = default_init(member)
    if member.scheme == "learned":
      params = discovery.learnable_masks(params, n_tokens, masked)
    return params

  task_ = discovery.with_sparsity(dataclasses.replace(group.task, init=init),
                                        config.sparsity)
  return dataclasses.replace(group, name=f"{task}-stage1", task=task_)


def gotu_lr(config: Config, task: str) -> float:
  """The learning rate boolean_gotu gives the task (the config's, else its protocol's)."""
  return config.learning_rate if config.learning_rate is not None else gotu.TASK_PROTOCOL[task][0]


def read_graphs(config: Config, task: str, group: engine.Group, state: engine.SweepState,
                run_dir: pathlib.Path) -> dict[int, dict[str, InteractionGraph]]:
  """Stage 1's final `state` read into both routes' graphs and their random controls,
  {seed: {"mask", "random_mask", "fourier", "random_fourier": graph}}; recorded in
  RUN_DIR/discovered.json (`stages.record`: a resume must read the same) with
  plots/discovered_TASK.png."""
  spec = boolean.get_task(task)
  params_K = jax.tree_util.tree_map(jnp.asarray, state.params)
  preds = evaluate.eval_values(group, params_K)["pred"]  # [K, 2^n], cube order.
  truth = graphs.true_graph(spec)
  found, record = {}, {}
  for i, member in enumerate(group.members):
    seed, out = member.seed, found.setdefault(member.seed, {})
    entry = record.setdefault(str(seed), {})
    if member.scheme == "learned":
      masks = discovery.mask_logits_LHNN(engine.unstack(state.params, i))
      out["mask"] = graphs.graph_from_masks(masks, config.mask_threshold)
      entry["mask_layers"] = graphs.graphs_to_json(
          graphs.mask_graphs(masks, config.mask_threshold))
      entry["mask_sigma_max"] = np.round(jax.nn.sigmoid(masks.reshape(
          (-1,) + masks.shape[-2:]).max(0)), 4).tolist()
      route = "mask"
    else:
      values = np.asarray(preds[i], np.float64)
      out["fourier"] = graphs.graph_from_function(values, spec.n_bits,
                                                  config.fourier_threshold)
      weights = graphs.pair_weights(fourier.fourier_coefficients(values, spec.n_bits),
                                    spec.n_bits)
      entry["fourier_pair_weight"] = np.round(weights / max(weights.max(), 1e-12),
                                              4).tolist()
      route = "fourier"
    out[f"random_{route}"] = graphs.random_like(
        out[route], [seed, zlib.crc32(f"{task}/{route}".encode())])
    names = [route, f"random_{route}"]
    if f"support_{route}" in config.schemes:  # Only where trained: discover_boolean's
      out[f"support_{route}"] = graphs.support_like(  # discovered.json is as before.
          out[route], truth, [seed, zlib.crc32(f"{task}/support_{route}".encode())])
      names.append(f"support_{route}")
    for name in names:
      entry[name] = out[name].to_json() | graphs.score(out[name], truth)
  data = stages.record(
      run_dir / DISCOVERED_FILE, task,
      {"n_bits": truth.n_bits, "truth": truth.to_json(), "seeds": record},
      {"thresholds": {"mask": config.mask_threshold, "fourier": config.fourier_threshold}},
      trained_with=lambda entry: {
          seed: {g: {"bits": e[g]["bits"], "pairs": e[g]["pairs"]}
                 for _, g in ALL_DERIVED.values() if g in e}
          for seed, e in entry["seeds"].items()})
  plot_discovered(task, data["tasks"][task], run_dir / "plots" / f"discovered_{task}.png")
  return found


# ----------------------------------------------------------------------------- stage 2


def stage2_group(config: Config, task: str, stage1: stages.Reading | None
                 ) -> engine.Group:
  """The hand-written prior and the priors of stage 1's graphs, × seeds."""
  arms = [a for a in ALL_ARMS if a in config.schemes and a not in STAGE_1]
  members = []
  for arm in arms:
    hparams = {"learning_rate": gotu_lr(config, task), "weight_decay": config.weight_decay,
               "mask_lr_multiplier": config.mask_lr_multiplier}
    members += [engine.Member(task, arm, seed, hparams, design="clique" if arm == "mask" else None,
                              labels={"mask_strength": config.mask_strength})
                for seed in range(config.seeds)]
  spec = boolean.get_task(task)
  group = _group(config, spec, members)
  base, default_init = group.task, _default_init(config, spec)
  truth = graphs.true_graph(spec)
  hand = (graphs.graph_from_open(np.asarray(gotu.task_prior(spec, 1.0)) > 0)
          if "mask" in arms else None)
  masked = config.masked_layers

  def graph(member) -> InteractionGraph:
    if member.scheme == "mask":
      return hand
    return stage1.value()[member.seed][ALL_DERIVED[member.scheme][1]]

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
    return metrics | graphs.score(found, truth) | {
        "graph": found.to_json(), "graph_bits": len(found.bits),
        "graph_pairs": len(found.pairs), "graph_empty": float(found.empty)}

  return dataclasses.replace(group, name=f"{task}-stage2",
                             task=dataclasses.replace(base, init=init, summarize=summarize))


# ----------------------------------------------------------------------------- the run


def fingerprint(config: Config) -> dict:
  """Each task's definition (gotu's): `--resume` refuses a changed task."""
  return gotu.fingerprint(config)


def build_groups(config: Config, run_dir=None) -> list[engine.Group]:
  """Per task: stage 1 (default, learned), then stage 2 (the priors, reading stage 1's
  final checkpoint in `run_dir`), in that order."""
  return stages.two_stages(NAME, config, run_dir, STAGE_1, stage1_group, read_graphs,
                           stage2_group)


def discover(task: boolean.BooleanTask | str, out_dir, *, preset: str = "quick",
             overrides=(), resume: bool | str = False) -> dict:
  """Discovers the interaction graph of `task` (a BooleanTask of yours, which this
  registers, or a task's name) and trains with it: the experiment at `preset` into the
  run folder `out_dir`, with every arm but the hand-written `mask` where the task has no
  support. Returns `run.run_experiment`'s summary plus "discovered": discovered.json's
  record of the task (per seed, both routes' graphs and their scores)."""
  from mpx.sweep import config as config_lib, run
  if isinstance(task, boolean.BooleanTask):
    task = boolean.register_task(task).name
  arms = [a for a in ARMS if a != "mask" or boolean.get_task(task).support]
  summary = run.run_experiment(
      config_lib.load_experiment(NAME), preset=preset, out_dir=str(out_dir),
      overrides=[f"tasks={task}", f"schemes={','.join(arms)}", *overrides], resume=resume)
  record = json.loads((pathlib.Path(summary["local_dir"]) / DISCOVERED_FILE).read_text())
  return dict(summary, discovered=record["tasks"][task])


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


_fmt = discovery.fmt_stats
_score = discovery.fmt_score
_per_seed = discovery.per_seed


def discovery_table(summary: dict, task: str) -> str:
  """Markdown, one row per arm of `task`: unseen accuracy (%) and the graph's precision /
  recall of support bits and pairs against the true graph, mean ± std over seeds, then the
  per-seed unseen accuracies."""
  members = summary["members"]
  rows = {r["scheme"]: r for r in report_lib.summarize(
      [m for m in members if m["task"] == task], ["accuracy_unseen", *SCORES])}
  lines = ["| arm | unseen accuracy (%) | bit precision | bit recall | pair precision | "
           "pair recall | unseen accuracy per seed (%) |", "|" + "---|" * 7]
  for arm in ALL_ARMS:
    if arm not in rows:
      continue
    r = rows[arm]
    fmt = lambda stats, percent: _fmt(stats, percent, r["n_seeds"])
    cells = [arm, fmt(r["accuracy_unseen"], True), *(fmt(r[s], False) for s in SCORES),
             _per_seed(members, task, arm, "accuracy_unseen", True)]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def read_runs(run_dirs) -> tuple[dict, dict]:
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
  summary, discovered = read_runs([run_dir, *more_run_dirs])
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
    read_from = {graph: arm for arm, graph in ALL_DERIVED.values()}
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


