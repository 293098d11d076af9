"""Planted Boolean tasks: a benchmark for discovering the prior (not in the paper).

Discovery's five tasks (discover_boolean) are small cliques on 2–3 bits that route (b)
reads exactly, so they cannot rank the routes. These tasks are drawn once by a seeded
generator (`generate`, `GENERATOR_SEED`) and fixed in code before any of their results:
`N_TASKS` tasks on n = 15–17 bits, four kinds in turn,

  sparse  a sum of 3 monomials of degree 2–3 on 4–6 bits (2–6 pairs), ±1 coefficients;
  chain   x_p0 x_p1 + x_p1 x_p2 + … along a random path of 4–6 bits;
  window  products of 3 consecutive bits along a random order of 5–6 bits (non-cyclic);
  junta   a threshold sign(w · x) of 4–6 bits (weights 2, 1, 1, … : never 0), a clique.

Polynomials carry an odd number of ±1 terms (a linear term on a paired bit where needed),
so the target is an odd integer, never 0, and sign accuracy is defined everywhere. Each
task sees, GOTU-style, the points where one of 2 or 3 bits of an interacting term is +1
(3/4 or 7/8 of the cube; the rest is where extrapolation is measured) and trains on
`TRAIN_SIZE` uniform draws of them (protocol iid: the cost of training does not grow
with n). Its `support` and `interaction_groups` (its terms' bits; a junta's whole
support) make gotu's hand-written prior its true graph (`graphs.true_graph`).

`Config`, `build_groups` and `fingerprint` are the experiment `discover_planted`
(experiments/discover_planted.py): discover_boolean's two stages on these tasks with two
more controls (`discover.SUPPORT_ARMS`: the true support with random pairs). `report`
reads its runs into planted.md: per route, precision and recall of the graph, unseen
accuracy against the true graph's and the default's, and how often discovery recovers the
true graph's gain (`recovered`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import itertools
import json
import pathlib
import subprocess
from typing import ClassVar

import numpy as np

from mpx import report as report_lib
from mpx.tasks.boolean import discover, gotu
from mpx.tasks.boolean.registry import BooleanTask, make_task

NAME = "discover_planted"  # The experiment (`mpx run discover_planted`).
GENERATOR_SEED = 20261205  # Fixed with the code, before any result: the task list.
N_TASKS = 20
# Inclusive. Every arm is evaluated on the whole cube (route (b) reads the function there),
# 2^n points: one 20-bit task took over 10 minutes of the quick preset on one core, so the
# benchmark stays at 15–17 bits to keep the quick preset near 28 minutes on one core.
N_BITS = (15, 17)
KINDS = ("sparse", "chain", "window", "junta")
TRAIN_SIZE = 2**14  # iid draws from the seen points, per seed.
# The report's definitions, fixed before any result: a task-seed counts towards recovery
# where the true graph's prior beats the default by more than GAIN_MARGIN unseen accuracy,
# and a route recovers it where (route − default) >= RECOVERY · (true − default).
GAIN_MARGIN = 0.05
RECOVERY = 0.9
# The default "extrapolates" a task where its mean unseen accuracy is at least this.
EXTRAPOLATES = 0.9
ROUTES = ("discovered_mask", "discovered_fourier")
CONTROLS = ("random_mask", "support_mask", "random_fourier", "support_fourier")
REPORT_FILE = "planted.md"
PLOT_FILE = "planted_graphs.png"
PROVENANCE_FILE = "provenance.jsonl"


@dataclasses.dataclass(frozen=True)
class PlantedSpec:
  """One planted task.

  Attributes:
    name: its registry name, `pNN_KINDn`.
    n_bits: input length n.
    kind: one of `KINDS`.
    terms: (coefficient, bits) pairs: the target is their sum of c · prod x_bits, or with
      `threshold` its sign.
    threshold: the target is sign(sum) (a junta's linear threshold), else the sum.
    seen_bits: the seen domain is "some bit of these is +1".
  """
  name: str
  n_bits: int
  kind: str
  terms: tuple[tuple[int, tuple[int, ...]], ...]
  threshold: bool
  seen_bits: tuple[int, ...]

  def target(self, x_PN) -> np.ndarray:
    """y_P: the sum of the terms on x_PN (±1), or its sign; float32."""
    x_PN = np.asarray(x_PN, np.float32)
    y_P = sum(c * np.prod(x_PN[:, list(bits)], axis=1) for c, bits in self.terms)
    return (np.sign(y_P) if self.threshold else y_P).astype(np.float32)

  def seen(self, x_PN) -> np.ndarray:
    """bool_P: some seen bit is +1 (GOTU's "x0 = 1 or x1 = 1")."""
    return np.any(np.asarray(x_PN)[:, list(self.seen_bits)] > 0, axis=1)

  @property
  def support(self) -> tuple[int, ...]:
    """The bits of the terms: what the target depends on."""
    return tuple(sorted({b for _, bits in self.terms for b in bits}))

  @property
  def groups(self) -> tuple[tuple[int, ...], ...]:
    """The interacting groups: a junta's support (a clique), else each term of >= 2 bits."""
    if self.threshold:
      return (self.support,)
    return tuple(bits for _, bits in self.terms if len(bits) >= 2)

  @property
  def pairs(self) -> tuple[tuple[int, int], ...]:
    """The true graph's pairs: each two bits of a group."""
    return tuple(sorted({p for g in self.groups for p in itertools.combinations(sorted(g), 2)}))

  @property
  def seen_share(self) -> float:
    """The seen part of the cube, 1 − 2^-(seen bits)."""
    return 1.0 - 0.5**len(self.seen_bits)

  def text(self) -> str:
    """The target as a formula, e.g. `x3x7 - x7x11x2 + x3`."""
    parts = []
    for c, bits in self.terms:
      mono = "".join(f"x{b}" for b in bits)
      coef = "" if abs(c) == 1 else str(abs(c))
      parts.append(("-" if c < 0 else "+") + " " + coef + mono)
    body = " ".join(parts).lstrip("+ ")
    return f"sign({body})" if self.threshold else body

  def seen_text(self) -> str:
    """The seen domain in words, e.g. `x3 = 1 or x9 = 1`."""
    return " or ".join(f"x{b} = 1" for b in self.seen_bits)

  def to_json(self) -> dict:
    """The definition, recorded in the run's fingerprint (a resume refuses a change)."""
    return {"n_bits": self.n_bits, "kind": self.kind, "target": self.text(),
            "seen": self.seen_text(), "train_size": TRAIN_SIZE}


# ----------------------------------------------------------------------------- generator


def _odd(terms, rng, bits_in_pairs):
  """Adds a ±1 linear term on a paired bit where the count is even: an odd number of ±1
  terms sums to an odd integer, never 0."""
  if len(terms) % 2 == 0:
    terms.append((int(rng.choice([-1, 1])), (int(rng.choice(bits_in_pairs)),)))
  return terms


def _sparse(rng, order):
  """3 distinct monomials of degree 2–3 over 4–6 bits, covering them, with 2–6 pairs."""
  while True:
    size = int(rng.integers(4, 7))
    support = order[:size]
    monos = [tuple(sorted(rng.choice(support, int(rng.integers(2, 4)), replace=False).tolist()))
             for _ in range(3)]
    pairs = {p for m in monos for p in itertools.combinations(m, 2)}
    if (len(set(monos)) == 3 and set().union(*monos) == set(support.tolist())
        and 2 <= len(pairs) <= 6):
      return [(int(rng.choice([-1, 1])), m) for m in monos]


def _chain(rng, order):
  """x_p0 x_p1 + x_p1 x_p2 + … along the first 4–6 bits of `order`: a path graph."""
  path = order[:int(rng.integers(4, 7))].tolist()
  terms = [(int(rng.choice([-1, 1])), tuple(sorted(path[i:i + 2]))) for i in range(len(path) - 1)]
  return _odd(terms, rng, path)


def _window(rng, order):
  """Products of 3 consecutive bits along the first 5–6 bits of `order` (not cyclic)."""
  path = order[:int(rng.integers(5, 7))].tolist()
  terms = [(int(rng.choice([-1, 1])), tuple(sorted(path[i:i + 3])))
           for i in range(len(path) - 2)]
  return _odd(terms, rng, path)


def _junta(rng, order):
  """Weights 2, 1, 1, 1 (4 bits), 1 × 5 (5 bits) or 2, 1 × 5 (6 bits): an odd sum."""
  size = int(rng.integers(4, 7))
  weights = [2] + [1] * (size - 1) if size % 2 == 0 else [1] * size
  return [(int(w * rng.choice([-1, 1])), (int(b),)) for w, b in zip(weights, order[:size])]


_BUILDERS = {"sparse": _sparse, "chain": _chain, "window": _window, "junta": _junta}


def generate(seed: int = GENERATOR_SEED, count: int = N_TASKS) -> tuple[PlantedSpec, ...]:
  """The benchmark: `count` tasks, kind `KINDS[k % 4]`, n uniform in `N_BITS`, the bits
  a random permutation of the n (so structure sits anywhere), the seen bits 2 or 3 bits of
  the first interacting term (a junta: of its support)."""
  rng = np.random.default_rng(seed)
  specs = []
  for k in range(count):
    kind = KINDS[k % len(KINDS)]
    n = int(rng.integers(N_BITS[0], N_BITS[1] + 1))
    order = rng.permutation(n)
    terms = tuple(sorted(_BUILDERS[kind](rng, order), key=lambda t: (-len(t[1]), t[1])))
    gate = sorted(terms[0][1]) if kind != "junta" else sorted(b for _, (b,) in terms)
    how_many = 3 if len(gate) >= 3 and rng.random() < 0.5 else 2
    seen_bits = tuple(sorted(rng.choice(gate, how_many, replace=False).tolist()))
    specs.append(PlantedSpec(f"p{k:02d}_{kind}{n}", n, kind, terms, kind == "junta",
                             seen_bits))
  return tuple(specs)


SPECS = generate()
TASKS = {spec.name: spec for spec in SPECS}
TASK_NAMES = tuple(TASKS)


def digest(specs=SPECS) -> str:
  """A short hash of the task list and every definition: the benchmark's identity."""
  text = json.dumps({s.name: s.to_json() for s in specs}, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=None)
def boolean_task(name: str) -> BooleanTask:
  """The planted task `name` as a BooleanTask (one shared instance per name), its
  hand-written prior the true graph: support = the terms' bits, interaction_groups =
  `PlantedSpec.groups`."""
  if name not in TASKS:
    raise ValueError(f"no planted task {name!r}; the benchmark's tasks are {TASK_NAMES}.")
  spec = TASKS[name]
  return make_task(spec.name, spec.target, spec.seen, spec.n_bits, protocol="iid",
                   train_size=TRAIN_SIZE, integer_valued=not spec.threshold,
                   support=spec.support, interaction_groups=spec.groups)


def task_table(names=TASK_NAMES) -> str:
  """Markdown: each task's n, kind, target, seen domain and share, support and pairs."""
  lines = ["| task | n | kind | target | seen | seen (%) | support | pairs |",
           "|" + "---|" * 8]
  for name in names:
    s = TASKS[name]
    lines.append(f"| {name} | {s.n_bits} | {s.kind} | {s.text()} | {s.seen_text()} | "
                 f"{100 * s.seen_share:.1f} | {list(s.support)} | {len(s.pairs)} |")
  return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- the experiment


@dataclasses.dataclass(frozen=True)
class Config(discover.Config):
  """discover_boolean's Config (`mpx.tasks.boolean.discover.Config`: model, protocol, both
  routes' fixed settings) on the planted tasks, with every arm (`discover.ALL_ARMS`: the
  support controls too). learning_rate / epochs: the planted tasks have no GOTU protocol,
  so they default to the cpu model's 1e-3 and 8."""
  SCHEME_NAMES: ClassVar[tuple[str, ...]] = discover.ALL_ARMS
  tasks: tuple[str, ...] = TASK_NAMES
  schemes: tuple[str, ...] = discover.ALL_ARMS
  learning_rate: float | None = 1e-3
  epochs: int | None = 8


def fingerprint(config: Config) -> dict:
  """Each task's cube (`gotu.fingerprint`) and its planted definition with the generator
  seed and the benchmark's `digest`: `--resume` refuses a run whose task (or benchmark)
  changed."""
  return gotu.fingerprint(config) | {"planted": {
      "generator_seed": GENERATOR_SEED, "benchmark": digest(),
      "tasks": {t: TASKS[t].to_json() for t in config.tasks if t in TASKS}}}


def _commit() -> str:
  """The mpx checkout's commit (`+dirty` with uncommitted changes), or "unknown"."""
  here = pathlib.Path(__file__).resolve().parent
  try:
    head = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True, timeout=30).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--", "."],
                           capture_output=True, text=True, check=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError):
    return "unknown"
  return head + ("+dirty" if dirty.strip() else "")


def _read_and_record(config, task, group, state, run_dir):
  """discover.read_graphs, and a line in RUN_DIR/provenance.jsonl: the commit and command
  of the process that read stage 1 (each start and resume that reaches stage 2)."""
  found = discover.read_graphs(config, task, group, state, run_dir)
  saved = json.loads((run_dir / "config.json").read_text()) if (
      run_dir / "config.json").is_file() else {}
  line = {"task": task, "commit": _commit(),
          "command": saved.get("run", {}).get("command"),
          "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
  with (run_dir / PROVENANCE_FILE).open("a") as f:
    f.write(json.dumps(line) + "\n")
  return found


def build_groups(config: Config, run_dir=None):
  """discover_boolean's groups (`discover.build_groups`) on the planted tasks: per task,
  stage 1, then stage 2 reading stage 1's final checkpoint in `run_dir`."""
  from mpx.sweep import stages
  return stages.two_stages(NAME, config, run_dir, discover.STAGE_1, discover.stage1_group,
                           _read_and_record, discover.stage2_group)


# ----------------------------------------------------------------------------- the report


def unseen_by_task_seed(summary: dict) -> dict:
  """{(task, seed): {arm: metrics}} of a run's summary.json members."""
  out = {}
  for m in summary["members"]:
    out.setdefault((m["task"], m["seed"]), {})[m["scheme"]] = m["metrics"]
  return out


def recovered(route: float, default: float, true: float, *, margin: float = GAIN_MARGIN,
              share: float = RECOVERY) -> bool | None:
  """Whether a route recovers the true graph's gain on one task-seed: (route − default)
  >= share · (true − default); None (not counted) where true − default <= margin."""
  gain = true - default
  if not gain > margin:
    return None
  return route - default >= share * gain


def _mean(values) -> float | None:
  values = [v for v in values if v is not None]
  return float(np.mean(values)) if values else None


def route_rows(summary: dict, *, margin: float = GAIN_MARGIN, share: float = RECOVERY
               ) -> list[dict]:
  """Per route and control: mean precision / recall of bits and pairs over task-seeds,
  mean unseen accuracy, its mean gap to the default and to the true graph's (`mask`), and
  `recovered` counted over the eligible task-seeds."""
  by = unseen_by_task_seed(summary)
  rows = []
  for arm in ROUTES + CONTROLS:
    cells = [(k, arms) for k, arms in sorted(by.items()) if arm in arms]
    if not cells:
      continue
    acc = lambda arms, a: arms[a]["accuracy_unseen"] if a in arms else None
    row = {"arm": arm, "n": len(cells)}
    for s in discover.SCORES:
      row[s] = _mean(arms[arm].get(s) for _, arms in cells)
    row["exact"] = sum(arms[arm].get("bit_precision") == arms[arm].get("bit_recall") == 1.0
                       and arms[arm].get("pair_precision") in (1.0, None)
                       and arms[arm].get("pair_recall") in (1.0, None) for _, arms in cells)
    row["accuracy_unseen"] = _mean(acc(arms, arm) for _, arms in cells)
    row["minus_default"] = _mean(acc(arms, arm) - acc(arms, "default") for _, arms in cells
                                 if "default" in arms)
    row["minus_true"] = _mean(acc(arms, arm) - acc(arms, "mask") for _, arms in cells
                              if "mask" in arms)
    verdicts = [recovered(acc(arms, arm), acc(arms, "default"), acc(arms, "mask"),
                          margin=margin, share=share)
                for _, arms in cells if "default" in arms and "mask" in arms]
    row["eligible"] = sum(v is not None for v in verdicts)
    row["recovered"] = sum(bool(v) for v in verdicts)
    rows.append(row)
  return rows


def task_rows(summary: dict) -> list[dict]:
  """Per task: mean unseen accuracy over seeds of the default, the true graph and both
  routes, and whether the default extrapolates (>= `EXTRAPOLATES`)."""
  by = unseen_by_task_seed(summary)
  rows = []
  for task in dict.fromkeys(t for t, _ in sorted(by)):
    seeds = [arms for (t, _), arms in sorted(by.items()) if t == task]
    row = {"task": task}
    for arm in ("default", "mask") + ROUTES:
      row[arm] = _mean(a[arm]["accuracy_unseen"] for a in seeds if arm in a)
    row["default_extrapolates"] = (None if row["default"] is None
                                   else row["default"] >= EXTRAPOLATES)
    rows.append(row)
  return rows


def _f(x, percent=False) -> str:
  if x is None:
    return report_lib.MISSING
  return f"{100 * x:.2f}" if percent else f"{x:.2f}"


def route_table(rows) -> str:
  """Markdown of `route_rows`."""
  lines = ["| arm | task-seeds | bit precision | bit recall | pair precision | pair recall | "
           "exact graphs | unseen (%) | − default (pp) | − true (pp) | recovered |",
           "|" + "---|" * 11]
  for r in rows:
    lines.append(f"| {r['arm']} | {r['n']} | " + " | ".join(
        _f(r[s]) for s in discover.SCORES) + f" | {r['exact']} | "
        f"{_f(r['accuracy_unseen'], True)} | {_f(r['minus_default'], True)} | "
        f"{_f(r['minus_true'], True)} | {r['recovered']} / {r['eligible']} |")
  return "\n".join(lines) + "\n"


def plot_graphs(summary: dict, path) -> str:
  """Discovered against true graphs: per route, each task-seed's precision (x) and recall
  (y) of support bits (left) and of pairs (right), jittered; (1, 1) is the true graph."""
  from mpx import plotting
  by = unseen_by_task_seed(summary)
  fig, axes = plotting.subplots(1, 2, (10.0, 4.8), right=0.2, bottom=0.9, top=0.4,
                                wspace=0.85)
  rng = np.random.default_rng(0)
  for col, what in enumerate(("bit", "pair")):
    ax = axes[0, col]
    for i, arm in enumerate(ROUTES + ("support_fourier", "random_fourier")):
      points = [(arms[arm].get(f"{what}_precision"), arms[arm].get(f"{what}_recall"))
                for arms in by.values() if arm in arms]
      points = np.array([(p, r) for p, r in points if p is not None and r is not None])
      if len(points):
        jitter = rng.uniform(-0.015, 0.015, points.shape)
        ax.scatter(*(points + jitter).T, s=18, alpha=0.6, color=f"C{i}",
                   label=arm if col == 0 else None)
    ax.set_xlim(-0.05, 1.05)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel(f"{what} precision")
    ax.set_ylabel(f"{what} recall")
    ax.set_title(f"{what}s: discovered against true", fontsize="medium")
  fig.legend(fontsize="small", loc="lower center", ncols=4)
  return plotting._save(fig, path)


def _runs_table(run_dirs) -> str:
  """Markdown: every run folder's command (config.json) and the commits of the processes
  that read its stage 1 (provenance.jsonl)."""
  lines = ["| run folder | command | commits |", "|---|---|---|"]
  for run_dir in map(pathlib.Path, run_dirs):
    config = run_dir / "config.json"
    command = (json.loads(config.read_text()).get("run", {}).get("command")
               if config.is_file() else None)
    prov = run_dir / PROVENANCE_FILE
    commits = (sorted({json.loads(l)["commit"] for l in prov.read_text().splitlines() if l})
               if prov.is_file() else [])
    lines.append(f"| {run_dir} | `{command}` | {', '.join(commits) or report_lib.MISSING} |")
  return "\n".join(lines) + "\n"


RESULTS_TEMPLATE = """# Discovery on planted tasks ({preset}, {n_tasks} tasks)

Written by `python -m mpx.experiments.discover_planted RUN_DIR [MORE_RUN_DIRS...]`.

## Runs

{runs}
## Definitions (fixed before any result)

Unseen accuracy: sign accuracy on the points outside each task's seen domain. The default
extrapolates a task where its mean unseen accuracy is >= {extrapolates:.0%}: here in
{extrapolating} of {n_tasks} tasks. A task-seed is eligible where the true graph's prior
(`mask`) beats the default by more than {margin:.0%} (true − default > {margin}); a route
recovers it where (route − default) >= {share} (true − default). Controls: `random_*` a random
graph of the discovered graph's size on all n bits; `support_*` the true support with as
many random pairs among it as the discovered graph has (capped at what exists).

## Per route

![graphs](plots/{plot})

{routes}
## Per task (unseen accuracy, %, mean over seeds)

{tasks}
## The tasks

{definitions}
## Reading

(To be written from the tables above.)
"""


def report(run_dir, *more_run_dirs) -> list[str]:
  """Reads RUN_DIR's summary.json and discovered.json (and more runs of the same
  configuration, e.g. task subsets); writes RUN_DIR/planted.md (`RESULTS_TEMPLATE`: runs,
  definitions, per-route and per-task tables) and plots/planted_graphs.png, beside
  discover's discovery.md and per-task figures."""
  run_dir = pathlib.Path(run_dir)
  dirs = [run_dir, *map(pathlib.Path, more_run_dirs)]
  written = discover.report(*dirs)
  summary, _ = discover.read_runs(dirs)
  tasks = task_rows(summary)
  lines = ["| task | default | true graph | (a) mask | (b) Fourier | default extrapolates |",
           "|---|---|---|---|---|---|"]
  for r in tasks:
    lines.append(f"| {r['task']} | " + " | ".join(
        _f(r[a], True) for a in ("default", "mask") + ROUTES) +
        f" | {'yes' if r['default_extrapolates'] else 'no'} |")
  plot = plot_graphs(summary, run_dir / "plots" / PLOT_FILE)
  text = RESULTS_TEMPLATE.format(
      preset=summary["preset"], n_tasks=len(tasks), runs=_runs_table(dirs),
      extrapolates=EXTRAPOLATES, extrapolating=sum(bool(r["default_extrapolates"])
                                                   for r in tasks),
      margin=GAIN_MARGIN, share=RECOVERY, plot=PLOT_FILE,
      routes=route_table(route_rows(summary)), tasks="\n".join(lines) + "\n",
      definitions=task_table([r["task"] for r in tasks if r["task"] in TASKS]))
  path = run_dir / REPORT_FILE
  path.write_text(text)
  return [str(path), plot, *written]
