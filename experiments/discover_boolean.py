"""Discovering the prior of a Boolean task (not in the paper): when a task's interaction
structure is not known, read it from training on the seen data, then train a fresh model
with it as the mask. The stages, graphs and report are `mpx.tasks.boolean.discover`.

    mpx run discover_boolean --preset tiny --out /tmp/discover_tiny   # 2Parity, 1 seed: a smoke test
    mpx run discover_boolean --preset quick --out runs/discover-quick # 5 tasks × 7 arms × 2 seeds
    mpx run discover_boolean --preset cpu --out runs/discover-cpu --resume=auto  # 4 layers × 64, 4 seeds
    python -m mpx.experiments.discover_boolean runs/discover-cpu      # discovery.md, figures

Stage 1 trains `default` (route (b) reads its function's Fourier spectrum) and `learned`
(a learnable neutral mask under a sparsity pressure: route (a) reads its masks); stage 2
trains the hand-written `mask`, each route's graph as a prior and a random graph of each
one's size. (Called discover_prior before; that name still runs it.)

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
The `cpu` run (4 seeds, experiments/results/discover_prior_cpu.md) is the one that reports.

Presets: `quick` and `cpu` are boolean_gotu's model, learning rate and epochs (the test
suite checks it), so the arms `default` and `mask` are boolean_gotu's / boolean_coverage's
members of the same preset and seeds (quick: their numbers agree to the last digit);
`quick` evaluates only at the end; `tiny` is a smoke test. One configuration per run
folder: lists of a hyperparameter are refused.
"""

import sys

from mpx.tasks.boolean.discover import (DISCOVERED_FILE, NAME, REPORT_FILE,  # noqa: F401
                                        SCORES, Config, build_groups, fingerprint, report)

METRICS = ("accuracy_unseen", *SCORES, "accuracy", "accuracy_seen", "loss_unseen",
           "mdi_distance_unseen", "target_distance_unseen", "graph_bits", "graph_pairs",
           "graph_empty")
PAPER = {}  # Not in the paper.

PRESETS = {
    # boolean_gotu's quick model and protocol; only the final evaluation.
    "quick": dict(width=32, depth=2, num_heads=2, head_dim=16, mlp_dim=32,
                  learning_rate=1e-3, epochs=2, chunk_steps=16, seeds=2),
    # boolean_gotu's cpu preset (its evaluations and checkpoints every 128 steps).
    "cpu": dict(width=64, depth=4, num_heads=4, head_dim=16, mlp_dim=64, learning_rate=1e-3,
                epochs=8, chunk_steps=16, seeds=4, eval_every=128, checkpoint_every=128),
    # A smoke test of both stages and the files: 2Parity, 1 seed, one epoch in 12 steps of
    # a one-head width-8 model (≤ 20 s of CPU: two groups compile two of everything).
    "tiny": dict(tasks=("2parity",), seeds=1, width=8, depth=1, num_heads=1, head_dim=8,
                 mlp_dim=8, learning_rate=1e-3, epochs=1, batch_size=2048, chunk_steps=12,
                 eval_points_per_call=4096, persistence=False),
}

if __name__ == "__main__":
  if len(sys.argv) < 2:
    sys.exit(f"usage: python -m mpx.experiments.{NAME} RUN_DIR [MORE_RUN_DIRS...]")
  for name in report(*sys.argv[1:]):
    print(f"wrote {name}")
