"""Boolean coverage: does a symmetric mask extrapolate exactly where the seen data covers
the unseen classes? (the sum-class hypothesis, from the prototypes measured before mpx).

    mpx run boolean_coverage --preset tiny --out /tmp/cov_tiny   # 1 task, 1 seed: ~1 min (compiling)
    mpx run boolean_coverage --preset quick --out runs/cov-quick # 8 tasks × {default, mask} × 2 seeds
    mpx run boolean_coverage --preset cpu --out runs/cov-cpu     # 4 layers, width 64, 4 seeds, 8 epochs
    python -m mpx.experiments.boolean_coverage runs/cov-cpu      # then: coverage.md, plots/coverage.png

The hypothesis: a mask that makes a task's support tokens interact symmetrically lets the
model compute a function of the support's sum (of each window's pattern, for windowed
supports), so it extrapolates exactly when every unseen input falls into a class that
the seen data holds. `mpx.tasks.boolean.coverage.class_coverage` turns that into a number before training:
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

Presets: boolean_gotu's `quick` and `cpu` (model, lr 1e-3, epochs; the test suite checks
it) with schemes default and mask and these tasks; `tiny` is a smoke test. The family
code is `mpx.tasks.boolean.gotu` (model, priors, groups) and `mpx.tasks.boolean.coverage`
(the tasks, the prediction and the report); this file is the experiment's record.
"""

import pathlib
import sys

from mpx.tasks.boolean import coverage
from mpx.tasks.boolean.coverage import report  # noqa: F401 (python -m ... RUN_DIR)
from mpx.tasks.boolean.gotu import Config, build_groups, fingerprint  # noqa: F401

NAME = "boolean_coverage"  # `mpx run boolean_coverage`; also as mpx.experiments.boolean_coverage.

METRICS = ("accuracy", "accuracy_unseen", "loss", "loss_unseen", "accuracy_exact",
           "unseen_mean_output", "mdi_distance_unseen", "target_distance_unseen",
           coverage.PREDICTED)
PAPER = {}  # The paper has no such tasks.

_ARMS = dict(schemes=("default", "mask"), tasks=coverage.TASK_NAMES)
PRESETS = {
    # boolean_gotu's quick and cpu presets on these tasks.
    "quick": dict(seeds=2, width=32, depth=2, num_heads=2, head_dim=16, mlp_dim=32,
                  learning_rate=1e-3, epochs=2, chunk_steps=16, eval_every=96,
                  qk_opt_steps=10_000, **_ARMS),
    "cpu": dict(seeds=4, width=64, depth=4, num_heads=4, head_dim=16, mlp_dim=64,
                learning_rate=1e-3, epochs=8, chunk_steps=16, eval_every=128,
                checkpoint_every=128, qk_opt_steps=2000, **_ARMS),
    # A smoke test of the run and the report: one task, a few steps of big batches.
    "tiny": dict(tasks=("cov_majority3_hole",), schemes=("default", "mask"), seeds=1,
                 width=16, depth=1, num_heads=2, head_dim=8, mlp_dim=16, learning_rate=1e-3,
                 epochs=1, batch_size=1024, chunk_steps=4, eval_every=0, checkpoint_every=0,
                 probe_size=32, qk_opt_steps=100),
}


def history_metrics(config, history) -> dict:
  """The run loop's hook: each member's final metrics get its task's prediction, so
  summary.md shows it beside the measured `accuracy_unseen`."""
  del config
  task = history[-1]["task"] if history else None
  if task not in coverage.TASKS:
    return {}
  return {coverage.PREDICTED: coverage.prediction(task)["predicted_accuracy_unseen"]}


def save_run_files(config, run_dir) -> None:
  """The run loop's hook, called before training: the predictions on record first."""
  names = [t for t in config.tasks if t in coverage.TASKS]
  if not names:
    return
  run_dir = pathlib.Path(run_dir)
  run_dir.mkdir(parents=True, exist_ok=True)
  text = ("# Predicted unseen accuracy (before training)\n\n"
          "`mpx.tasks.boolean.coverage.class_coverage` per task; written when the run "
          "started.\n\n"
          + coverage.prediction_table(coverage.predictions(names)))
  (run_dir / coverage.PREDICTED_FILE).write_text(text)


if __name__ == "__main__":
  if len(sys.argv) < 2:
    sys.exit(f"usage: python -m mpx.experiments.{NAME} RUN_DIR [MORE_RUN_DIRS...]")
  for written in report(*sys.argv[1:]):
    print(f"wrote {written}")
