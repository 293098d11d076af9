"""Boolean coverage: does a symmetric mask extrapolate exactly where the seen data covers
the unseen classes? (the sum-class hypothesis, from the prototypes measured before mpx).

    mpx run boolean_coverage --preset tiny --out /tmp/cov_tiny   # 1 task, 1 seed: ~1 min (compiling)
    mpx run boolean_coverage --preset quick --out runs/cov-quick # 8 tasks × {default, mask} × 2 seeds
    mpx run boolean_coverage --preset cpu --out runs/cov-cpu     # 4 layers, width 64, 4 seeds, 8 epochs
    python -m mpx.experiments.boolean_coverage runs/cov-cpu      # then: coverage.md, plots/coverage.png

The hypothesis: a mask that makes a task's support tokens interact symmetrically lets the
model compute a function of the support's sum (of each window's pattern, for windowed
supports), so it extrapolates exactly when every unseen input falls into a class that
the seen data holds. `boolean_coverage.class_coverage` turns that into a number before training:
covered unseen points answered as the seen data answers their class, uncovered ones at
the min-degree interpolator (MDI). Eight tasks on n = 15 bits are chosen so the
prediction spans 0..100% and, on several, differs from the MDI's (the default init sits at
the MDI at the `cpu` scale on 2Parity / Majority); `python -m ... RUN_DIR` joins the
prediction with each scheme's measured `accuracy_unseen` (sign accuracy on the unseen
part) into RUN_DIR/coverage.md and the scatter RUN_DIR/plots/coverage.png, and every
run's summary.md shows the prediction as the column `accuracy_unseen_predicted` and
RUN_DIR/coverage_predicted.md holds it from the start, before any training.

Predicted unseen accuracy (computed, `predictions()`): the mask's hypothesis / the MDI

    cov_parity2        x0x1               seen x0=1 or x1=1           0.0 / 0.0    (cov 0.00)
    cov_andnot         x0 AND NOT x1      seen not (x0=-1, x1=+1)      0.0 / 100.0  (cov 1.00)
    cov_parity3        x0x1x2             seen x0=1 or x1=1           50.0 / 0.0    (cov 0.50)
    cov_window3        Σ 3 windows of x0..x4, seen x0=1 or x1=1, no (+,+,+) window
                                                                      66.7 / 40.0   (cov 0.47)
    cov_majority5      maj(x0..x4)        seen x3=x4=1                87.5 / 50.0   (cov 0.75)
    cov_threshold4     sign(x0+..+x3−1.5) seen x0=1 or x1=1          100.0 / 75.0   (cov 0.75)
    cov_majority3      maj(x0,x1,x2)      seen x0=1 or x1=1          100.0 / 50.0   (cov 0.50)
    cov_majority3_hole maj(x0,x1,x2)      seen not (x0=x1=-1, x2=+1) 100.0 / 0.0    (cov 1.00)

cov_andnot is where the hypothesis says a symmetric mask must *hurt*: its unseen
(−1, +1) has the sum 0 of the seen (+1, −1), whose target is the opposite, while the MDI
−1 + x0 − x1 is right. cov_window3 is judged on windows (kind "window") and registered
with them as its `interaction_groups`, so its mask joins the bits of each window (not the
clique over x0..x4, whose sum classes would predict 26.7%; coverage.md shows both).

Expect (measured, experiments/results/boolean_coverage.md; 4 seeds, mean unseen %, default /
mask, against the prediction): parity2 0 / 0 (0), andnot 100 / 100 (0), parity3 12.5 / 50
(50), window3 41.4 / 40.2 (66.7), majority5 50 / 53.1 (87.5), threshold4 93.8 / 100 (100),
majority3 50 / 87.5 (100), majority3_hole 25 / 75 (100). The mask meets the prediction where
it lies above the MDI and every support bit varies in the seen data (14 of 16 seeds there,
the default 5); it fails on andnot, majority5 and window3, which sit at the MDI. `cpu` took
1 h 37 min + 2 h 01 min of one core each, run as two halves of the tasks (`--set tasks=...`)
and reported together (`python -m ... RUN_A RUN_B`). `tiny` (21 steps of a width-16 model)
learns nothing: it checks the files, not the hypothesis.

Presets: boolean_gotu's `quick` and `cpu` (model, lr 1e-3, epochs) with schemes default and
mask and these tasks; `tiny` is a smoke test. The family code (model, priors, member
Task) is `mpx.tasks.boolean.gotu`; this file adds the tasks, the prediction and the report.
"""

from __future__ import annotations

import functools
import json
import pathlib
import sys

import numpy as np

from mpx import report as report_lib
from mpx.experiments.boolean_gotu import METRICS as GOTU_METRICS
from mpx.experiments.boolean_gotu import PRESETS as GOTU_PRESETS
from mpx.experiments.boolean_gotu import (Config, build_groups,  # noqa: F401 (the experiment's)
                                          fingerprint)
from mpx.tasks import boolean
from mpx.tasks.boolean import coverage as boolean_coverage
from mpx.tasks.boolean.coverage import N_BITS, TASK_NAMES, TASKS

NAME = "boolean_coverage"  # `mpx run boolean_coverage`; also as mpx.experiments.boolean_coverage.

MEASURED = "accuracy_unseen"  # boolean_gotu's sign accuracy on the unseen part.
PREDICTED = "accuracy_unseen_predicted"  # Added to every member by `history_metrics`.
METRICS = tuple(GOTU_METRICS) + (PREDICTED,)
PAPER = {}  # The paper has no such tasks.

COVERAGE_FILE = "coverage.md"
PREDICTED_FILE = "coverage_predicted.md"
PLOT_FILE = "coverage.png"


PRESETS = {
    "quick": dict(GOTU_PRESETS["quick"], schemes=("default", "mask"), tasks=TASK_NAMES),
    "cpu": dict(GOTU_PRESETS["cpu"], schemes=("default", "mask"), tasks=TASK_NAMES),
    # A smoke test of the run and the report: one task, a few steps of big batches; about a
    # minute on one core, nearly all of it compiling (≈ 50 s per task).
    "tiny": dict(tasks=("cov_majority3_hole",), schemes=("default", "mask"), seeds=1,
                 width=16, depth=1, num_heads=2, head_dim=8, mlp_dim=16, learning_rate=1e-3,
                 epochs=1, batch_size=1024, chunk_steps=4, eval_every=0, checkpoint_every=0,
                 probe_size=32, qk_opt_steps=100),
}


# ----------------------------------------------------------------------------- predictions


@functools.cache
def prediction(name: str) -> dict:
  """What `boolean_coverage.class_coverage` predicts for task `name` before training: covered
  fraction, predicted and MDI unseen accuracy (fractions) with the task's classes, and
  `clique_predicted_accuracy_unseen`, the sum-over-support prediction (the prior the mask
  scheme trains with; the same as the prediction unless the task is judged on windows)."""
  if name not in TASKS:
    raise ValueError(f"no coverage prediction for task {name!r}; this experiment's tasks "
                     f"are {TASK_NAMES}.")
  spec, task = TASKS[name], boolean.get_task(name)
  cov = boolean_coverage.class_coverage(task, spec.class_groups, spec.kind)
  clique = (cov if (spec.class_groups, spec.kind) == ((spec.support,), "sum")
            else boolean_coverage.class_coverage(task, [spec.support], "sum"))
  return {"task": name, "target": spec.target_text, "seen": spec.seen_text,
          "kind": spec.kind, "groups": [list(g) for g in spec.class_groups],
          "seen_fraction": float(np.mean(task.seen(boolean.cube(N_BITS)))),
          "covered_fraction": cov.covered_fraction,
          "predicted_accuracy_unseen": cov.predicted_accuracy_unseen,
          "mdi_accuracy_unseen": cov.mdi_accuracy_unseen,
          "clique_predicted_accuracy_unseen": clique.predicted_accuracy_unseen}


def predictions(names=TASK_NAMES) -> list[dict]:
  return [prediction(n) for n in names]


def history_metrics(config, history) -> dict:
  """The run loop's hook: each member's final metrics get its task's prediction, so
  summary.md shows it beside the measured `accuracy_unseen`."""
  del config
  task = history[-1]["task"] if history else None
  return {PREDICTED: prediction(task)["predicted_accuracy_unseen"]} if task in TASKS else {}


def save_run_files(config, run_dir) -> None:
  """The run loop's hook, called before training: the predictions on record first."""
  names = [t for t in config.tasks if t in TASKS]
  if not names:
    return
  run_dir = pathlib.Path(run_dir)
  run_dir.mkdir(parents=True, exist_ok=True)
  text = ("# Predicted unseen accuracy (before training)\n\n"
          "`boolean_coverage.class_coverage` per task; written when the run started.\n\n"
          + prediction_table(predictions(names)))
  (run_dir / PREDICTED_FILE).write_text(text)


# ----------------------------------------------------------------------------- the join


def predicted_vs_measured(summary: dict) -> list[dict]:
  """One row per (task, scheme, hparams) of a run's summary.json whose task has a
  prediction: the prediction's fields and the measured `accuracy_unseen` over the
  non-diverged seeds (`measured_mean`, `_std` (ddof = 0), `_min`, `_max`, `n`), fractions.
  Tasks of other experiments are left out."""
  members = [m for m in summary["members"] if m["task"] in TASKS]
  rows = []
  for r in report_lib.summarize(members, [MEASURED]):
    s = r[MEASURED]
    rows.append(prediction(r["task"]) | {
        "scheme": r["scheme"], "hparams": r["hparams"], "n_seeds": r["n_seeds"],
        "n_diverged": r["n_diverged"], "n": s["n"], "measured_mean": s["mean"],
        "measured_std": s["std"], "measured_min": s["min"], "measured_max": s["max"]})
  return rows


def _pct(x) -> str:
  return report_lib.MISSING if x is None else f"{100 * x:.2f}"


def _classes(row) -> str:
  if row["kind"] == "window":
    return "windows " + ", ".join("".join(map(str, g)) for g in row["groups"])
  return "sum of " + " | ".join("x" + ",".join(map(str, g)) for g in row["groups"])


def prediction_table(rows) -> str:
  """Markdown: per task its target, seen set, classes and the predictions (%)."""
  lines = ["| task | target | seen | classes | seen (%) | covered (%) | predicted (%) | "
           "MDI (%) | clique sum (%) |", "|" + "---|" * 9]
  for r in rows:
    lines.append(f"| {r['task']} | {r['target']} | {r['seen']} | {_classes(r)} | "
                 f"{_pct(r['seen_fraction'])} | {_pct(r['covered_fraction'])} | "
                 f"{_pct(r['predicted_accuracy_unseen'])} | {_pct(r['mdi_accuracy_unseen'])} | "
                 f"{_pct(r['clique_predicted_accuracy_unseen'])} |")
  return "\n".join(lines) + "\n"


def coverage_table(rows) -> str:
  """Markdown of `predicted_vs_measured` rows: prediction, MDI and measured unseen
  accuracy (%) per task and scheme, and measured − predicted."""
  # Hparams that split a task's scheme (a swept value), not those a scheme fixes (the
  # mask's learning-rate factor is 0 for the default by construction).
  values: dict = {}
  for r in rows:
    for k in r["hparams"]:
      values.setdefault((r["task"], r["scheme"], k), set()).add(json.dumps(r["hparams"][k]))
  varying = sorted({k for (_, _, k), v in values.items() if len(v) > 1})
  header = ["task", "scheme", *varying, "seeds", "covered (%)", "predicted (%)", "MDI (%)",
            "measured unseen (%)", "measured − predicted"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  for r in rows:
    seeds = f"{r['n']}/{r['n_seeds']}" + (f" ({r['n_diverged']} diverged)"
                                          if r["n_diverged"] else "")
    if r["measured_mean"] is None:
      measured = gap = report_lib.MISSING
    else:
      measured = f"{_pct(r['measured_mean'])} ± {_pct(r['measured_std'])}"
      gap = f"{100 * (r['measured_mean'] - r['predicted_accuracy_unseen']):+.2f}"
    cells = [r["task"], r["scheme"], *(str(r["hparams"].get(k)) for k in varying), seeds,
             _pct(r["covered_fraction"]), _pct(r["predicted_accuracy_unseen"]),
             _pct(r["mdi_accuracy_unseen"]), measured, gap]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def plot_coverage(rows, path) -> str:
  """Predicted (x) against measured (y) unseen accuracy, %, one marker and colour per
  scheme (mean over seeds, min–max bar), each point labelled with its task, the diagonal
  y = x. Schemes are nudged apart in x so coinciding points stay visible."""
  from mpx import plotting
  schemes = list(dict.fromkeys(r["scheme"] for r in rows))
  markers = ("o", "s", "^", "D", "v", "P", "X", "*")
  fig, ((ax,),) = plotting.subplots(1, 1, (6.4, 6.0), right=0.2, bottom=1.1, top=0.4)
  ax.plot([0, 100], [0, 100], color="0.6", linestyle="--", linewidth=1, label="y = x")
  for i, scheme in enumerate(schemes):
    mine = [r for r in rows if r["scheme"] == scheme and r["measured_mean"] is not None]
    if not mine:
      continue
    nudge = (i - (len(schemes) - 1) / 2) * 1.2
    x = np.array([100 * r["predicted_accuracy_unseen"] for r in mine]) + nudge
    y = np.array([100 * r["measured_mean"] for r in mine])
    err = np.array([[100 * (r["measured_mean"] - r["measured_min"]) for r in mine],
                    [100 * (r["measured_max"] - r["measured_mean"]) for r in mine]])
    ax.errorbar(x, y, yerr=err, fmt=markers[i % len(markers)], color=f"C{i % 10}",
                markersize=7, capsize=3, label=f"{scheme} (n={max(r['n'] for r in mine)})")
    for xi, yi, r in zip(x, y, mine):
      ax.annotate(r["task"].removeprefix("cov_"), (xi, yi), textcoords="offset points",
                  xytext=(4, 3), fontsize="x-small", color=f"C{i % 10}")
  ax.set_xlim(-5, 105)
  ax.set_ylim(-5, 105)
  ax.set_xlabel("predicted unseen accuracy (%), boolean_coverage.class_coverage")
  ax.set_ylabel("measured unseen accuracy (%), mean over seeds, min–max")
  ax.set_title("symmetric-mask hypothesis: predicted vs measured", fontsize="medium")
  fig.legend(fontsize="small", loc="lower center", ncols=len(schemes) + 1)
  return plotting._save(fig, path)


def _read_summaries(run_dirs) -> dict:
  """The runs' summary.json files as one: their members joined (runs of task subsets,
  e.g. the halves of a sweep run on two cores); experiment and preset must agree."""
  summaries = []
  for run_dir in map(pathlib.Path, run_dirs):
    path = run_dir / report_lib.SUMMARY_JSON
    if not path.is_file():
      raise ValueError(f"{path} is missing: run `mpx run {NAME} --preset ... --out {run_dir}` "
                       "to the end first (it writes summary.json last).")
    summaries.append(json.loads(path.read_text(encoding="utf-8")))
  kinds = {(s["experiment"], s["preset"]) for s in summaries}
  if len(kinds) > 1:
    raise ValueError(f"{list(map(str, run_dirs))} are runs of different experiments or presets "
                     f"{sorted(kinds)}; report runs of one preset together.")
  return dict(summaries[0], members=[m for s in summaries for m in s["members"]])


def report(run_dir, *more_run_dirs) -> tuple[str, str]:
  """Reads the summary.json of RUN_DIR (and of more runs of the same preset, their members
  joined), writes RUN_DIR/coverage.md and RUN_DIR/plots/coverage.png; returns their paths."""
  run_dir = pathlib.Path(run_dir)
  summary = _read_summaries([run_dir, *more_run_dirs])
  rows = predicted_vs_measured(summary)
  if not rows:
    raise ValueError(f"{run_dir / report_lib.SUMMARY_JSON} has no member of this "
                     f"experiment's tasks {TASK_NAMES}.")
  others = sorted({m["task"] for m in summary["members"]} - set(TASKS))
  names = list(dict.fromkeys(r["task"] for r in rows))
  parts = [f"# Coverage: predicted vs measured unseen accuracy ({summary['experiment']}, "
           f"preset {summary['preset']})\n",
           f"![coverage](plots/{PLOT_FILE})\n",
           "Predicted: `boolean_coverage.class_coverage` (covered unseen points answered as "
           "the seen data answers their class, the rest at the MDI). Measured: "
           "`accuracy_unseen`, "
           "mean ± population std over the non-diverged seeds; seeds = with a value / all.\n",
           coverage_table(rows), "## The tasks\n", prediction_table(predictions(names))]
  if others:
    parts.append(f"Left out (no prediction): {', '.join(others)}.\n")
  table_path = run_dir / COVERAGE_FILE
  table_path.write_text("\n".join(parts))
  return str(table_path), plot_coverage(rows, run_dir / "plots" / PLOT_FILE)


if __name__ == "__main__":
  if len(sys.argv) < 2:
    sys.exit(f"usage: python -m mpx.experiments.{NAME} RUN_DIR [MORE_RUN_DIRS...]")
  for written in report(*sys.argv[1:]):
    print(f"wrote {written}")
