"""Discovering the digit alignment of an arithmetic task in two stages, route (a) "the mask
discovers" (`experiments/discover_arithmetic.py` is the experiment's record).

Stage 1 (group TASK-stage1) trains on the seen problems `default` (the model's init,
frozen neutral mask: the baseline) and `learned` (the learnable neutral mask M = 0 in every
layer and head, `sparsity` · mean σ(M) added to the loss, the mask's learning rate ×
`discover_mask_lr_multiplier`: `mpx.tasks.discovery`). Stage 2 (group TASK-stage2) reads
stage 1's final checkpoint from the run folder (`mpx.sweep.stages`), reads each seed's
learned masks into a "query reads key" pattern (σ(M) > 1/2 in any layer and head, inside
the causal mask: `patterns.open_from_masks`) and trains a fresh model of the same seed with
a ±mask_strength prior in every layer:
  mask              the hand-written digit-alignment prior (`arithmetic.prior`);
  discovered_mask   the learned pattern on the rows that predict an answer digit (each
                    also reads itself), every other row open as in the hand-written
                    prior (`patterns.prior_pattern_NN`);
  random_mask       as many open entries per such row, drawn at random among its causal
                    keys (seeded per seed): the control.

Each stage-2 member carries the pattern it trained with (`pattern`, [query, key] entries)
and its precision / recall against the hand-written alignment, counted on the rows that
predict an answer digit, self entries left out (both patterns hold them open by
construction). RUN_DIR/discovered.json holds per seed the pooled pattern, each layer's and
head's, the random one, their scores and the learned σ(M); plots/discovered_TASK.png the
hand-written pattern, σ(M) per layer and the discovered and random patterns.
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

from mpx import checkpoint, report as report_lib, schemes
from mpx.nn import greedy_decode
from mpx.sweep import engine, stages
from mpx.tasks import arithmetic, discovery
from mpx.tasks.arithmetic import patterns as ad

NAME = "discover_arithmetic"  # The experiment (`mpx run discover_arithmetic`).

STAGE_1 = ("default", "learned")
DERIVED = {"discovered_mask": "found", "random_mask": "random"}  # Arm → its pattern.
ARMS = STAGE_1 + ("mask",) + tuple(DERIVED)
SCORES = ("precision", "recall")
DISCOVERED_FILE = "discovered.json"
REPORT_FILE = "discovery.md"


@dataclasses.dataclass(frozen=True)
class Config(discovery.DiscoveryConfig, arithmetic.Config):
  """arithmetic's Config (model, protocol, `mask_strength` and `mask_lr_multiplier` of
  every stage-2 prior) and the `learned` arm's (`discovery.DiscoveryConfig`); `schemes`
  are this experiment's arms (`ARMS`)."""
  SCHEME_NAMES: ClassVar[tuple[str, ...]] = ARMS
  tasks: tuple[str, ...] = ("addition",)
  schemes: tuple[str, ...] = ARMS

  def __post_init__(self):
    super().__post_init__()
    if "learned" not in self.schemes and any(a in DERIVED for a in self.schemes):
      raise ValueError(f"schemes {self.schemes}: discovered_mask and random_mask read "
                       "stage 1's learned masks; add learned to schemes.")
    if self.fractions is not None and len(self.fractions) != 1:
      raise ValueError(f"fractions={self.fractions}: one data fraction per run folder (stage "
                       "2 reads one stage 1 per task); run each in its own --out.")


def fraction(config: Config, task: str) -> float:
  """The task's one data fraction (the paper's unless `fractions` names one)."""
  return arithmetic.task_fractions(config, task)[0]


def spec_of(config: Config, task: str) -> arithmetic.ArithmeticTask:
  """The task's format under `config` (digits, answer order)."""
  return arithmetic.get_task(task, config.digits, reverse_answer=config.reverse_answer)


def _members(config: Config, task: str, arms) -> list[engine.Member]:
  """arm × seed, as `arithmetic.members` builds them: the default's mask frozen, the
  learned arm's ×`discover_mask_lr_multiplier`, every prior's ×`mask_lr_multiplier`."""
  multiplier = {"default": 0.0, "learned": config.discover_mask_lr_multiplier}
  labels = {"mask_strength": config.mask_strength, "data_fraction": fraction(config, task)}
  return [engine.Member(task, arm, seed, {
              "learning_rate": config.learning_rate, "weight_decay": config.weight_decay,
              "mask_lr_multiplier": multiplier.get(arm, config.mask_lr_multiplier)},
                        labels=labels)
          for arm in arms if arm in config.schemes for seed in range(config.seeds)]


def _group(config: Config, task: str, arms) -> engine.Group:
  """arithmetic's group of `arms` × seeds; without its persistence probe where
  `persistence=False`."""
  group = arithmetic.make_group(config, task, fraction(config, task),
                                _members(config, task, arms))
  return group if config.persistence else dataclasses.replace(group, probe=None)


def _default_member(member: engine.Member) -> engine.Member:
  """The member as arithmetic's `default` scheme inits it (the same key, frozen mask)."""
  return dataclasses.replace(member, scheme="default")


# ----------------------------------------------------------------------------- stage 1


def stage1_group(config: Config, task: str) -> engine.Group:
  """default and learned × seeds, arithmetic's group; the pressure is in every member's
  loss, where it moves only the learnable mask."""
  group = _group(config, task, STAGE_1)
  base = group.task
  n_tokens = spec_of(config, task).n_tokens

  def init(member):
    params = base.init(_default_member(member))
    if member.scheme == "learned":
      params = discovery.learnable_masks(params, n_tokens, config.masked_layers)
    return params

  task_ = discovery.with_sparsity(dataclasses.replace(base, init=init), config.sparsity)
  return dataclasses.replace(group, name=f"{task}-stage1", task=task_)


def read_patterns(config: Config, task: str, group: engine.Group, state: engine.SweepState,
                  run_dir: pathlib.Path) -> dict[int, dict[str, np.ndarray]]:
  """Stage 1's final `state` read into each seed's pattern and its random control,
  {seed: {"found": open_NN, "random": open_NN}}; recorded in RUN_DIR/discovered.json
  (`stages.record`: a resume must read the same) with plots/discovered_TASK.png."""
  spec, threshold = spec_of(config, task), config.mask_threshold
  found, record = {}, {}
  for i, member in enumerate(group.members):
    if member.scheme != "learned":
      continue
    masks_LHNN = discovery.mask_logits_LHNN(engine.unstack(state.params, i))
    found_NN = ad.open_from_masks(masks_LHNN, threshold)
    random_NN = ad.random_like(found_NN, spec,
                               [member.seed, zlib.crc32(f"{task}/random".encode())])
    found[member.seed] = {"found": found_NN, "random": random_NN}
    per_layer = [[_pattern_json(open_NN, spec) for open_NN in heads]
                 for heads in ad.open_per_mask(masks_LHNN, threshold)]
    record[str(member.seed)] = {
        "found": _pattern_json(found_NN, spec), "random": _pattern_json(random_NN, spec),
        "layers": [_pattern_json(open_HNN.any(0), spec)
                   for open_HNN in ad.open_per_mask(masks_LHNN, threshold)],
        "heads": per_layer,
        "sigma": np.round(1 / (1 + np.exp(-masks_LHNN.astype(np.float64))), 4).tolist()}
  data = stages.record(
      run_dir / DISCOVERED_FILE, task, _task_json(spec) | {"seeds": record},
      {"threshold": config.mask_threshold},
      trained_with=lambda entry: {seed: [e["found"]["entries"], e["random"]["entries"]]
                                  for seed, e in entry["seeds"].items()})
  plot_discovered(task, data["tasks"][task], run_dir / "plots" / f"discovered_{task}.png")
  return found


def _pattern_json(open_NN, spec) -> dict:
  """A pattern's open scored entries and its score."""
  return {"entries": ad.entries(open_NN, spec)} | ad.score(open_NN, spec)


def _tokens(spec: arithmetic.ArithmeticTask) -> list[str]:
  """Each input position's name (`plotting.arithmetic_tokens`: BOS, a<p>, b<p>, c<p>)."""
  from mpx import plotting
  return plotting.arithmetic_tokens(spec.layout, arithmetic.OPERATORS[spec.name])


def _task_json(spec: arithmetic.ArithmeticTask) -> dict:
  """What a reader needs to draw and name the patterns of `spec`."""
  return {"digits": [spec.a_digits, spec.b_digits], "reverse_answer": spec.reverse_answer,
          "n_tokens": spec.n_tokens, "tokens": _tokens(spec),
          "answer_rows": np.flatnonzero(arithmetic.answer_rows_N(spec)).tolist(),
          "hand_written": _pattern_json(ad.alignment_NN(spec), spec)}


# ----------------------------------------------------------------------------- stage 2


def stage2_group(config: Config, task: str, stage1: stages.Reading | None
                 ) -> engine.Group:
  """The hand-written prior and the priors of stage 1's patterns, × seeds."""
  spec = spec_of(config, task)
  group = _group(config, task, ("mask", *DERIVED))
  base, hand_NN = group.task, ad.alignment_NN(spec)

  def pattern(member) -> np.ndarray:
    if member.scheme == "mask":
      return hand_NN
    return stage1.value()[member.seed][DERIVED[member.scheme]]

  def init(member):
    if member.scheme == "mask":
      return base.init(member)
    prior_NN = ad.discovered_prior(spec, pattern(member), member.labels["mask_strength"])
    return schemes.set_masks_per_layer(base.init(_default_member(member)),
                                       {f"block_{i}": prior_NN for i in config.masked_layers})

  def summarize(values, member):
    open_NN = pattern(member)
    return (base.summarize(values, member) | ad.score(open_NN, spec)
            | {"pattern": ad.entries(open_NN, spec)})

  return dataclasses.replace(group, name=f"{task}-stage2", task=dataclasses.replace(
      base, init=init, summarize=summarize))


# ----------------------------------------------------------------------------- the run

def fingerprint(config: Config) -> dict:
  """Each task's tokens, hand-written pattern and fraction: `--resume` refuses a change."""
  out = {}
  for task in config.tasks:
    spec = spec_of(config, task)
    names = _tokens(spec)
    out[task] = {"tokens": " ".join(names), "fraction": fraction(config, task),
                 "hand_written": _named(names, ad.entries(ad.alignment_NN(spec), spec))}
  return out


def build_groups(config: Config, run_dir=None) -> list[engine.Group]:
  """Per task: stage 1 (default, learned), then stage 2 (the priors, reading stage 1's
  final checkpoint in `run_dir`), in that order."""
  return stages.two_stages(NAME, config, run_dir, STAGE_1, stage1_group, read_patterns,
                           stage2_group)


# ----------------------------------------------------------------------------- the report


def _spec(task: str, record: dict) -> arithmetic.ArithmeticTask:
  """The format a discovered.json record was written for."""
  return arithmetic.get_task(task, record["digits"], reverse_answer=record["reverse_answer"])


def _prior_pattern_NN(spec, pattern: dict) -> np.ndarray:
  """A recorded pattern as the prior trains with it (`ad.prior_pattern_NN`)."""
  return ad.prior_pattern_NN(spec, ad.from_entries(pattern["entries"], spec))


def plot_discovered(task: str, record: dict, path) -> str:
  """One row per seed: the hand-written pattern, the learned σ(M) of each layer (max over
  heads; circles: the hand-written entries of the answer rows), and the discovered and
  random patterns as the priors train with them. Row = query (it predicts the next
  token), column = key."""
  from mpx import plotting
  spec, names, seeds = _spec(task, record), record["tokens"], sorted(record["seeds"], key=int)
  depth = len(next(iter(record["seeds"].values()))["sigma"]) if seeds else 0
  true_ij = np.asarray(record["hand_written"]["entries"]).reshape(-1, 2)
  columns = ([("hand-written", lambda s: ad.alignment_NN(spec))]
             + [(f"σ(M) layer {l}, max over heads",
                 lambda s, l=l: np.asarray(s["sigma"][l]).max(0)) for l in range(depth)]
             + [("discovered (σ > threshold, any layer)",
                 lambda s: _prior_pattern_NN(spec, s["found"])),
                ("random control", lambda s: _prior_pattern_NN(spec, s["random"]))])
  fig, axes = plotting.subplots(
      max(len(seeds), 1), len(columns),
      (2.7 * len(columns), 2.6 * max(len(seeds), 1) + 0.4), left=0.5,
      right=0.15, bottom=0.5, top=0.75, wspace=0.5, hspace=0.8)
  for row, seed in enumerate(seeds):
    entry = record["seeds"][seed]
    for col, (title, get) in enumerate(columns):
      ax = axes[row, col]
      ax.imshow(np.asarray(get(entry), float), vmin=0, vmax=1, cmap="viridis")
      if title.startswith("σ"):
        ax.scatter(true_ij[:, 1], true_ij[:, 0], s=14, facecolors="none", edgecolors="red",
                   linewidths=0.6)
      ax.set_xticks(range(len(names)), names, fontsize="xx-small", rotation=90)
      ax.set_yticks(range(len(names)), names, fontsize="xx-small")
      ax.set_title(f"{title}\nseed {seed}" if row == 0 else f"seed {seed}", fontsize="x-small")
  fig.suptitle(f"{task}: hand-written and discovered attention patterns (row reads column)",
               fontsize="small")
  return plotting._save(fig, path)


def discovery_table(summary: dict, task: str) -> str:
  """Markdown, one row per arm: test sequence accuracy (%) and the pattern's precision /
  recall against the hand-written alignment, mean ± std over seeds, then per seed."""
  members = [m for m in summary["members"] if m["task"] == task]
  rows = {r["scheme"]: r for r in report_lib.summarize(
      members, ["sequence_accuracy", "digit_accuracy", *SCORES, "n_open"])}
  per_seed = discovery.per_seed
  lines = ["| arm | sequence accuracy (%) | per seed (%) | digit accuracy (%) | precision | "
           "recall | open entries | precision per seed | recall per seed |", "|" + "---|" * 9]
  for arm in (a for a in ARMS if a in rows):
    r = rows[arm]
    fmt = lambda stats, percent: discovery.fmt_stats(stats, percent, r["n_seeds"])
    lines.append("| " + " | ".join([
        arm, fmt(r["sequence_accuracy"], True),
        per_seed(members, task, arm, "sequence_accuracy", True),
        fmt(r["digit_accuracy"], True), *(fmt(r[s], False) for s in SCORES),
        fmt(r["n_open"], False),
        *(per_seed(members, task, arm, s, False) for s in SCORES)]) + " |")
  return "\n".join(lines) + "\n"


def _named(names, entries) -> str:
  """Entries as "query→key" token names, grouped by row, e.g. `=→a2,b2`."""
  by_row = {}
  for i, j in entries:
    by_row.setdefault(i, []).append(names[j])
  return "; ".join(f"{names[i]}→{','.join(keys)}" for i, keys in sorted(by_row.items()))


def saved_config(run_dir) -> Config:
  """The Config a run folder trained (its config.json)."""
  saved = json.loads((pathlib.Path(run_dir) / "config.json").read_text())
  if saved.get("experiment") != NAME:
    raise ValueError(f"{run_dir} holds a {saved.get('experiment')!r} run, not {NAME}.")
  return Config(**{k: tuple(v) if isinstance(v, list) else v
                   for k, v in saved["config"].items()})


def place_accuracy(config: Config, run_dir, problems: int = 2000) -> dict:
  """{task: {arm: {seed: [% right per answer digit, in sequence order]}}} of every
  member's final checkpoint, greedily decoding the first `problems` test problems: which
  digits each model learned (the summary has only whole answers and the digit mean)."""
  run_dir = pathlib.Path(run_dir)
  groups = build_groups(config, run_dir)
  out = {}
  for group in groups:
    task = group.members[0].task
    spec = spec_of(config, task)
    start, answer = spec.prompt_len, spec.answer_digits
    test_PS = arithmetic.make_splits(spec, fraction(config, task), 0, config.test_size)["test"]
    test_PS = jnp.asarray(test_PS[:problems])
    model = arithmetic.make_model(config)
    apply = lambda params, tokens: model.apply({"params": params}, tokens)
    decode = jax.jit(lambda params: greedy_decode(apply, params, test_PS[:, :start], answer))
    # The template: every arm has the same param tree, and the default init reads nothing
    # of stage 1 (a stage-2 init would derive the patterns again and rewrite the record).
    default_init = arithmetic.make_task(config, spec).init
    template = dataclasses.replace(group, task=dataclasses.replace(
        group.task, init=lambda member: default_init(_default_member(member))))
    with checkpoint.Checkpointer(run_dir / "checkpoints" / group.name, max_to_keep=None) as ckpt:
      state, _ = ckpt.restore_host(engine.init_state(template))
    for i, member in enumerate(group.members):
      pred_PA = np.asarray(decode(jax.tree_util.tree_map(jnp.asarray,
                                                         engine.unstack(state.params, i))))
      right_A = (pred_PA == np.asarray(test_PS[:, start:start + answer])).mean(0)
      out.setdefault(task, {}).setdefault(member.scheme, {})[member.seed] = (
          np.round(100 * right_A, 1).tolist())
  return out


def place_table(accuracy: dict, names) -> str:
  """Markdown: one row per arm and seed, one column per answer digit."""
  lines = ["| arm | seed | " + " | ".join(f"{n} (%)" for n in names) + " |",
           "|" + "---|" * (2 + len(names))]
  for arm in (a for a in ARMS if a in accuracy):
    for seed, values in sorted(accuracy[arm].items()):
      lines.append(f"| {arm} | {seed} | " + " | ".join(f"{v:.1f}" for v in values) + " |")
  return "\n".join(lines) + "\n"


def report(run_dir, problems: int = 2000) -> list[str]:
  """Reads RUN_DIR's summary.json and discovered.json; writes RUN_DIR/discovery.md (a
  table per task, each seed's patterns by layer, each member's accuracy per answer digit
  on `problems` test problems from its final checkpoint) and redraws the figures."""
  run_dir = pathlib.Path(run_dir)
  for name in (report_lib.SUMMARY_JSON, DISCOVERED_FILE):
    if not (run_dir / name).is_file():
      raise ValueError(f"{run_dir / name} is missing: run `mpx run {NAME} --out {run_dir}` "
                       "to the end first (summary.json is written last).")
  summary = json.loads((run_dir / report_lib.SUMMARY_JSON).read_text())
  discovered = json.loads((run_dir / DISCOVERED_FILE).read_text())
  score = discovery.fmt_score
  parts = [f"# Discovering the digit alignment ({summary['experiment']}, preset "
           f"{summary['preset']})\n",
           "Test sequence accuracy and the precision / recall of the pattern each arm trained "
           "with against the hand-written alignment, on the rows that predict an answer "
           "digit, self entries left out (mean ± population std over seeds; "
           f"{report_lib.MISSING}: undefined). Threshold σ(M) > {discovered['threshold']}, "
           "pooled over layers and heads. Rows are named by their token: a row predicts the "
           "next one (`=` predicts the first answer digit).\n"]
  config = saved_config(run_dir)
  places = place_accuracy(config, run_dir, min(problems, config.test_size))
  written = []
  for task, record in discovered["tasks"].items():
    written.append(plot_discovered(task, record, run_dir / "plots" / f"discovered_{task}.png"))
    parts += [f"## {task}\n", f"![{task}](plots/discovered_{task}.png)\n",
              discovery_table(summary, task),
              f"Hand-written: {_named(record['tokens'], record['hand_written']['entries'])}.\n"]
    for seed, entry in sorted(record["seeds"].items(), key=lambda kv: int(kv[0])):
      for label, pattern in ([("pooled", entry["found"])]
                             + [(f"layer {l}", p) for l, p in enumerate(entry["layers"])]
                             + [("random", entry["random"])]):
        parts.append(f"- seed {seed}, {label}: precision {score(pattern['precision'])}, "
                     f"recall {score(pattern['recall'])}, {pattern['n_open']} open: "
                     f"{_named(record['tokens'], pattern['entries']) or 'none'}")
    spec = _spec(task, record)
    names = [record["tokens"][p] for p in sorted(spec.layout.answer)]
    parts += ["", f"Accuracy per answer digit, greedy, on the first "
              f"{min(problems, config.test_size)} test problems (final checkpoints):\n",
              place_table(places[task], names)]
  path = run_dir / REPORT_FILE
  path.write_text("\n".join(parts) + "\n")
  return [str(path), *written]


