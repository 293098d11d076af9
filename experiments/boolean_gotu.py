"""Boolean GOTU: 2Parity, 3-bit Majority, Cyclic3 × {default, QK-SVD, QK-Opt, mask}.

    mpx run boolean_gotu --preset quick      # 3 tasks × 4 schemes × 2 seeds, a few minutes on 2 CPU cores
    mpx run boolean_gotu --preset paper      # the GOTU model and protocol, 10 seeds (GPU)
    mpx run boolean_gotu --preset paper --set compute_dtype=bfloat16   # GPU: bf16 matmuls
    mpx run boolean_gotu --preset cpu        # 4 layers, width 64, 4 seeds, 8 epochs: ~2 h on one core
    mpx run boolean_gotu --preset search --set epochs=4   # 14 mask designs on 2Parity, ~8 min CPU

Expect (quick, 2 seeds, experiments/results/boolean_quick.md): 2Parity at the
min-degree interpolator for every scheme but QK-Opt (75.00%; QK-Opt 50.00%), Majority
default / QK-SVD / QK-Opt / mask 87.50 / 87.50 / 75.00 / 93.75 ± 6.25, Cyclic3 58.48 ±
0.23 / 50.00 / 50.00 / 85.89 ± 2.58 (not converged); QK-Opt's attention on its pattern at
init ≥ 0.83 on every task. Expect (cpu, experiments/results/boolean_cpu.md): the default
at 75.00 / 87.50 on 2Parity / Majority in every seed; the mask 75.00 on 2Parity, 96.88 ±
5.41 on Majority (3 of 4 seeds at 100%) and 99.99 ± 0.01 on Cyclic3 (default 93.93);
QK-SVD 81.25 ± 10.83 on 2Parity (one seed at 100%), both QK schemes 90.62 ± 5.41 on
Majority and ≤ 60% on Cyclic3, where the ×18 position scale (`qk_pos_scale`) keeps most of
their members from learning. The paper reports default/QK ≈ 75 / 87 and mask 100 / 100 /
99.98 on 2Parity / Majority / Cyclic3.

`designs` expands the mask scheme into one scheme `mask:<design>` per entry of
`MASK_DESIGNS` (which pairs, layers and heads the prior suppresses); see
experiments/results/boolean_search.md for what the search measured.

Members of one task form one compiled group: every scheme and seed trains in one vmapped
program. The model is the GOTU code's TokenTransformer with PyTorch-default init; Adam
with coupled L2, batch 256, the epoch protocol (a fresh permutation per epoch). The
family code (model, priors, designs, the member Task) is `mpx.tasks.boolean.gotu`; this
file is the experiment's record.
"""

from __future__ import annotations

from mpx.tasks.boolean.gotu import (SELECTION_NOTE, VALIDATION, Config,  # noqa: F401
                                    SEARCH_DESIGNS, build_groups, fingerprint, make_group,
                                    members)

NAME = "boolean_gotu"  # `mpx run boolean_gotu`; also when imported as mpx.experiments.boolean_gotu.

METRICS = ("accuracy", "accuracy_unseen", "loss", "loss_unseen", "accuracy_exact",
           "unseen_mean_output", "mdi_distance_unseen", "target_distance_unseen")

PAPER = {
    "2parity": {"default": {"accuracy": 0.75}, "qk_svd": {"accuracy": 0.75},
                "qk_opt": {"accuracy": 0.75}, "mask": {"accuracy": 1.0}},
    "majority3": {"default": {"accuracy": 0.87}, "qk_svd": {"accuracy": 0.87},
                  "qk_opt": {"accuracy": 0.87}, "mask": {"accuracy": 1.0}},
    "cyclic3": {"mask": {"accuracy": 0.9998}},
}

PRESETS = {
    # QK-Opt runs the recipe's 10,000 iterations (≈ 1 s per member): with 2,000 it put
    # only 0.75–0.82 of its attention on the pattern at init at this width.
    "quick": dict(seeds=2, width=32, depth=2, num_heads=2, head_dim=16, mlp_dim=32,
                  learning_rate=1e-3, epochs=2, chunk_steps=16, eval_every=96,
                  qk_opt_steps=10_000),
    "paper": dict(seeds=10, chunk_steps=32, eval_every=320, checkpoint_every=320),
    # The largest scale a 2-core CPU finishes in about two hours (one core): 4 seeds.
    "cpu": dict(seeds=4, width=64, depth=4, num_heads=4, head_dim=16, mlp_dim=64,
                learning_rate=1e-3, epochs=8, chunk_steps=16, eval_every=128,
                checkpoint_every=128, qk_opt_steps=2000),
    "tiny": dict(tasks=("2parity",), schemes=("default", "mask"), seeds=1, width=16,
                 depth=1, num_heads=2, head_dim=8, mlp_dim=16, learning_rate=1e-3,
                 epochs=1, chunk_steps=8, eval_every=48, checkpoint_every=16,
                 qk_opt_steps=100),
    # The mask-design search (experiments/results/boolean_search.md): every design and
    # the vanilla baseline in one vmapped group, small enough for a 2-core CPU.
    "search": dict(tasks=("2parity",), schemes=("default", "mask"), seeds=1, width=64,
                   depth=2, num_heads=4, head_dim=16, mlp_dim=64, learning_rate=1e-3,
                   epochs=10, chunk_steps=32, designs=SEARCH_DESIGNS),
}

