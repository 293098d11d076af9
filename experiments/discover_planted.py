"""Discovery on planted tasks (not in the paper): discover_boolean's two stages on a
benchmark of 20 generated Boolean tasks whose interaction structure is known and not a
small clique (`mpx.tasks.boolean.planted`: the generator, the tasks, the report).

    mpx run discover_planted --preset tiny --out /tmp/planted-tiny    # 1 task, 1 seed: smoke test
    mpx run discover_planted --preset quick --out /tmp/planted-quick  # 20 tasks, 9 arms, 2 seeds
    mpx run discover_planted --preset cpu --out ~/runs/planted-cpu/p00_sparse17 \\
        --resume=auto --set tasks=p00_sparse17                        # a task per run folder
    python -m mpx.experiments.discover_planted RUN_DIR [MORE_RUN_DIRS...]  # planted.md, figures

Stage 1 trains `default` (route (b) reads its function's Fourier spectrum on the whole
cube) and `learned` (a learnable neutral mask under the sparsity pressure: route (a) reads
its masks); stage 2 trains the true graph's prior (`mask`), each route's graph as a prior,
and two controls per route of the discovered graph's size: `random_*` (random bits and
pairs among all n) and `support_*` (the true support bits, random pairs among them).
Both routes' settings are discover_boolean's, fixed before these tasks existed (sparsity
0.1, mask learning rate ×10, σ(M) > 1/2, |c_S| >= 0.1 max |c_S|); no unseen label reaches
stage 1 or the reading of a graph (tests/test_planted.py scrambles them).

The tasks are drawn by `planted.generate` with seed `planted.GENERATOR_SEED` and recorded
in the run's fingerprint: a resumed run refuses a changed task. Each task trains on
`planted.TRAIN_SIZE` iid draws of its seen points. Run the cpu preset in pieces (one run
folder per task, `--set tasks=TASK`, outside the work tree) and report them together.

Presets: `tiny` a smoke test (1 task of 15 bits, one seed, a width-8 model, 8 steps);
`quick` every task, a small model, 2 seeds, the final evaluation only (measured: 28 CPU
minutes pinned to one core; 14.6 min on 2 cores as two folders of ten tasks, one per core,
then one report: docs/discover.md; results: experiments/results/discover_planted_quick.md);
`cpu` boolean_gotu's cpu model (4 layers × 64, 4 heads) as discover_boolean's cpu preset,
2 seeds, evaluated and checkpointed every 128 steps (measured: 12–50 min of one core per
task, 15–17 bits; results: experiments/results/discover_planted_cpu.md).
"""

import sys

from mpx.tasks.boolean.discover import SCORES
from mpx.tasks.boolean.planted import (NAME, REPORT_FILE, Config,  # noqa: F401
                                       build_groups, fingerprint, report)

METRICS = ("accuracy_unseen", *SCORES, "accuracy", "accuracy_seen", "loss_unseen",
           "mdi_distance_unseen", "target_distance_unseen", "graph_bits", "graph_pairs",
           "graph_empty")
PAPER = {}  # Not in the paper.

PRESETS = {
    # A small model, every task, 2 seeds; only the final evaluation.
    "quick": dict(width=16, depth=2, num_heads=2, head_dim=8, mlp_dim=32, batch_size=128,
                  learning_rate=1e-3, epochs=2, chunk_steps=64, seeds=2, persistence=False),
    # boolean_gotu's cpu model and discover_boolean's cpu preset, 2 seeds.
    "cpu": dict(width=64, depth=4, num_heads=4, head_dim=16, mlp_dim=64, learning_rate=1e-3,
                epochs=8, chunk_steps=16, seeds=2, eval_every=128, checkpoint_every=128),
    # A smoke test: 1 task of 15 bits, 1 seed, one epoch in 8 steps of a width-8 model
    # (each task is two groups to compile: ≤ 20 s of CPU holds for one).
    "tiny": dict(tasks=("p01_chain15",), seeds=1, width=8, depth=1,
                 num_heads=1, head_dim=8, mlp_dim=8, learning_rate=1e-3, epochs=1,
                 batch_size=2048, chunk_steps=8, eval_points_per_call=4096,
                 persistence=False),
}

if __name__ == "__main__":
  if len(sys.argv) < 2:
    sys.exit(f"usage: python -m mpx.experiments.{NAME} RUN_DIR [MORE_RUN_DIRS...]")
  for name in report(*sys.argv[1:]):
    print(f"wrote {name}")
