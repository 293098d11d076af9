"""Discovering the digit alignment of addition (not in the paper): route (a), "the mask
discovers", on 3-digit addition at 0.4% of the data.

    mpx run discover_arithmetic --preset tiny --out /tmp/discover_arith_tiny  # smoke test
    mpx run discover_arithmetic --preset quick --set seeds=4 --out ~/mpx-runs/discover-arith-quick
    mpx run discover_arithmetic --preset quick --set seeds=4 --out ~/mpx-runs/discover-arith-quick --resume=auto
    python -m mpx.experiments.discover_arithmetic ~/mpx-runs/discover-arith-quick  # discovery.md

Two stages, each one compiled group, trained in turn in one run folder:

  stage 1 (group TASK-stage1) trains on the seen problems
    default   the model's init, frozen neutral mask: the baseline;
    learned   the learnable neutral mask M = 0 in every layer and head (standard attention
              with gradient 1/2), `sparsity` · mean σ(M) added to the loss, the mask's
              learning rate × `discover_mask_lr_multiplier` (`mpx.tasks.discover_stages`).
  stage 2 (group TASK-stage2) reads stage 1's final checkpoint from the run folder, reads
    each seed's learned masks into a "query reads key" pattern (σ(M) > 1/2 in any layer
    and head, inside the causal mask: `arithmetic_discover.open_from_masks`) and trains a
    fresh model of the same seed with a ±mask_strength prior in every layer:
    mask              the hand-written digit-alignment prior (`arithmetic.prior`);
    discovered_mask   the learned pattern on the rows that predict an answer digit (each
                      also reads itself), every other row open as in the hand-written
                      prior (`arithmetic_discover.prior_pattern_NN`);
    random_mask       as many open entries per such row, drawn at random among its causal
                      keys (seeded per seed): the control.

Each stage-2 member carries the pattern it trained with (`pattern`, [query, key] entries)
and its precision / recall against the hand-written alignment, counted on the rows that
predict an answer digit, self entries left out (both patterns hold them open by
construction). RUN_DIR/discovered.json holds per seed the pooled pattern, each layer's and
head's, the random one, their scores and the learned σ(M); plots/discovered_TASK.png the
hand-written pattern, σ(M) per layer and the discovered and random patterns. A `--resume`
derives the patterns again from stage 1's checkpoint.

Fixed before any test accuracy of this experiment was looked at, and not tuned after:
the sparsity 0.1, the mask learning rate ×10 and the threshold σ(M) > 1/2 are
discover_prior's (fixed there on a planted Boolean function); the rows rule and the
scoring rule are the hand-written prior's own form (mpx/tasks/arithmetic/discover.py says
why).

Presets: `quick` is arithmetic's quick preset (2 layers × width 32, 2 heads of 16, MLP 64,
800 steps of batch 64, AdamW lr 3e-3 with warmup and cosine decay, plain answers, 4,000
seen problems, 10,000 test problems), so the arms `default` and `mask` are the members
`mpx run arithmetic --preset quick --set tasks=addition` trains, seed for seed; `tiny` is
a smoke test (it learns nothing). One configuration and one data fraction per run folder.

Expect (quick, `--set seeds=4`, 7 min on one shared CPU core;
experiments/results/discover_arithmetic_quick.md): route (a) does not find the alignment
at this scale. Test sequence accuracy: mask 90.66 ± 2.15 %, default 1.00 ± 0.18, learned
3.62 ± 2.64, discovered_mask 4.20 ± 2.80 with precision 0.36 ± 0.05 / recall 0.46 ± 0.09,
random_mask 5.18 ± 4.16 at the same precision / recall (0.35 / 0.46). The learned mask
finds the leading digits' operands (`=`→a2,b2; c3→a2,b2) and not the low digits' (c1 never
reads a0, b0): without a prior the model learns c3 and c2 and leaves c1, c0 at chance, and
the pressure closes what the loss does not defend. The default and mask arms equal
`mpx run arithmetic --preset quick --set tasks=addition` (2 seeds) to the printed digit.
The report (`python -m ...`) adds each member's accuracy per answer digit, which shows it.
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

from mpx import checkpoint, report as report_lib, schemes
from mpx.nn import greedy_decode
from mpx.experiments.arithmetic import PRESETS as ARITHMETIC_PRESETS
from mpx.sweep import engine
from mpx.tasks import arithmetic, discover_stages
from mpx.tasks.arithmetic import discover as ad

NAME = "discover_arithmetic"  # `mpx run discover_arithmetic`.

STAGE_1 = ("default", "learned")
DERIVED = {"discovered_mask": "found", "random_mask": "random"}  # Arm → its pattern.
ARMS = STAGE_1 + ("mask",) + tuple(DERIVED)
SCORES = ("precision", "recall")
METRICS = ("sequence_accuracy", "digit_accuracy", "loss", *SCORES, "n_open")
PAPER = {}  # Not in the paper.
DISCOVERED_FILE = "discovered.json"
REPORT_FILE = "discovery.md"


@dataclasses.dataclass(frozen=True)
class Config(arithmetic.Config):
  """arithmetic's Config (model, protocol, `mask_strength` and `mask_lr_multiplier` of
  every stage-2 prior); `schemes` are this experiment's arms (`ARMS`).

  sparsity: weight of the pressure mean σ(M) (every mask entry of every layer) in the
    `learned` arm's loss; it closes what the task does not hold open.
  discover_mask_lr_multiplier: the `learned` arm's mask learning rate, × the rest's.
  mask_threshold: an entry is open when σ(M) > it (1/2: above its init).
  persistence: the persistence diagnostics at each evaluation (False: a faster smoke test).
  """
  SCHEME_NAMES: ClassVar[tuple[str, ...]] = ARMS
  tasks: tuple[str, ...] = ("addition",)
  schemes: tuple[str, ...] = ARMS
  sparsity: float = 0.1
  discover_mask_lr_multiplier: float = 10.0
  mask_threshold: float = ad.MASK_THRESHOLD
  persistence: bool = True

  def __post_init__(self):
    super().__post_init__()
    if "learned" not in self.schemes and any(a in DERIVED for a in self.schemes):
      raise ValueError(f"schemes {self.schemes}: discovered_mask and random_mask read "
                       "stage 1's learned masks; add learned to schemes.")
    if not (self.sparsity >= 0 and self.discover_mask_lr_multiplier > 0):
      raise ValueError(f"sparsity={self.sparsity} must be >= 0 and discover_mask_lr_"
                       f"multiplier={self.discover_mask_lr_multiplier} > 0 (the mask learns).")
    if not 0 < self.mask_threshold < 1:
      raise ValueError(f"mask_threshold={self.mask_threshold} must be in (0, 1) (a σ(M)).")
    if self.fractions is not None and len(self.fractions) != 1:
      raise ValueError(f"fractions={self.fractions}: one data fraction per run folder (stage "
                       "2 reads one stage 1 per task); run each in its own --out.")


PRESETS = {
    # arithmetic's quick preset: its default and mask members, seed for seed.
    "quick": dict(ARITHMETIC_PRESETS["quick"]),
    # Seconds: both stages and the files (20 steps discover nothing), no persistence probe.
    "tiny": {k: v for k, v in ARITHMETIC_PRESETS["tiny"].items() if k != "schemes"}
            | dict(persistence=False),
}


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


def _masked(config: Config):
  return range(config.depth) if config.mask_layers is None else config.mask_layers


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


def _stage1_group(config: Config, task: str) -> engine.Group:
  """default and learned × seeds, arithmetic's group; the pressure is in every member's
  loss, where it moves only the learnable mask."""
  group = _group(config, task, STAGE_1)
  base = group.task
  n_tokens = spec_of(config, task).n_tokens

  def init(member):
    params = base.init(_default_member(member))
    if member.scheme == "learned":
      params = discover_stages.learnable_masks(params, n_tokens, _masked(config))
    return params

  task_ = discover_stages.with_sparsity(dataclasses.replace(base, init=init), config.sparsity)
  return dataclasses.replace(group, name=f"{task}-stage1", task=task_)


class Stage1(discover_stages.Stage1):
  """Stage 1 of one task as stage 2 reads it: each seed's learned masks, from the final
  checkpoint of TASK-stage1, read into its pattern and its random control."""

  def __init__(self, config: Config, task: str, group: engine.Group):
    super().__init__(NAME, task, group, self._derive)
    self.config, self.task = config, task

  def patterns(self) -> dict[int, dict[str, np.ndarray]]:
    """{seed: {"found": open_NN, "random": open_NN}}."""
    return self.derived()

  def _derive(self, state: engine.SweepState) -> dict:
    spec, threshold = spec_of(self.config, self.task), self.config.mask_threshold
    patterns, record = {}, {}
    for i, member in enumerate(self.group.members):
      if member.scheme != "learned":
        continue
      masks_LHNN = discover_stages.mask_logits_LHNN(engine.unstack(state.params, i))
      found_NN = ad.open_from_masks(masks_LHNN, threshold)
      random_NN = ad.random_like(found_NN, spec,
                                 [member.seed, zlib.crc32(f"{self.task}/random".encode())])
      patterns[member.seed] = {"found": found_NN, "random": random_NN}
      per_layer = [[_pattern_json(open_NN, spec) for open_NN in heads]
                   for heads in ad.open_per_mask(masks_LHNN, threshold)]
      record[str(member.seed)] = {
          "found": _pattern_json(found_NN, spec), "random": _pattern_json(random_NN, spec),
          "layers": [_pattern_json(open_HNN.any(0), spec)
                     for open_HNN in ad.open_per_mask(masks_LHNN, threshold)],
          "heads": per_layer,
          "sigma": np.round(1 / (1 + np.exp(-masks_LHNN.astype(np.float64))), 4).tolist()}
    self._write(spec, record)
    return patterns

  def _write(self, spec: arithmetic.ArithmeticTask, record: dict) -> None:
    """RUN_DIR/discovered.json gets this task's patterns, plots/discovered_TASK.png its
    figure."""
    data = discover_stages.record_discovered(
        self.run_dir / DISCOVERED_FILE, self.task, _task_json(spec) | {"seeds": record},
        {"threshold": self.config.mask_threshold},
        trained_with=lambda entry: {seed: [e["found"]["entries"], e["random"]["entries"]]
                                    for seed, e in entry["seeds"].items()})
    plot_discovered(self.task, data["tasks"][self.task],
                    self.run_dir / "plots" / f"discovered_{self.task}.png")


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


def _stage2_group(config: Config, task: str, stage1: Stage1 | None) -> engine.Group:
  """The hand-written prior and the priors of stage 1's patterns, × seeds."""
  spec = spec_of(config, task)
  group = _group(config, task, ("mask", *DERIVED))
  base, hand_NN = group.task, ad.alignment_NN(spec)

  def pattern(member) -> np.ndarray:
    if member.scheme == "mask":
      return hand_NN
    return stage1.patterns()[member.seed][DERIVED[member.scheme]]

  def init(member):
    if member.scheme == "mask":
      return base.init(member)
    prior_NN = ad.discovered_prior(spec, pattern(member), member.labels["mask_strength"])
    return schemes.set_masks_per_layer(base.init(_default_member(member)),
                                       {f"block_{i}": prior_NN for i in _masked(config)})

  def summarize(values, member):
    open_NN = pattern(member)
    return (base.summarize(values, member) | ad.score(open_NN, spec)
            | {"pattern": ad.entries(open_NN, spec)})

  return dataclasses.replace(group, name=f"{task}-stage2", task=dataclasses.replace(
      base, init=init, summarize=summarize))


# ----------------------------------------------------------------------------- the run

# (config, task) → its Stage1, so `save_run_files` can tell it the run folder.
_STAGE1: dict[tuple[Config, str], Stage1] = {}


def fingerprint(config: Config) -> dict:
  """Each task's tokens, hand-written pattern and fraction: `--resume` refuses a change."""
  out = {}
  for task in config.tasks:
    spec = spec_of(config, task)
    names = _tokens(spec)
    out[task] = {"tokens": " ".join(names), "fraction": fraction(config, task),
                 "hand_written": _named(names, ad.entries(ad.alignment_NN(spec), spec))}
  return out


def build_groups(config: Config):
  """Per task: stage 1 (default, learned), then stage 2 (the priors), in that order."""
  return discover_stages.two_stages(NAME, config, STAGE_1, _STAGE1, _stage1_group, Stage1,
                                    _stage2_group)


def save_run_files(config: Config, run_dir) -> None:
  """Tells stage 2 where stage 1's checkpoints are; refuses several configurations."""
  discover_stages.attach_run_dir(NAME, _STAGE1, config, run_dir)


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
  per_seed = discover_stages.per_seed
  lines = ["| arm | sequence accuracy (%) | per seed (%) | digit accuracy (%) | precision | "
           "recall | open entries | precision per seed | recall per seed |", "|" + "---|" * 9]
  for arm in (a for a in ARMS if a in rows):
    r = rows[arm]
    fmt = lambda stats, percent: discover_stages.fmt_stats(stats, percent, r["n_seeds"])
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
  groups = build_groups(config)
  save_run_files(config, run_dir)
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
  score = discover_stages.fmt_score
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


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit(f"usage: python -m mpx.experiments.{NAME} RUN_DIR")
  for name in report(sys.argv[1]):
    print(f"wrote {name}")
