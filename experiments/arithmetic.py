"""Low-data arithmetic: 3-digit addition and multiplication × {default, QK-SVD, QK-Opt, mask}.

    mpx run arithmetic --preset quick     # 2 tasks × 4 schemes × 2 seeds, ~3 min on one CPU core
    mpx run arithmetic --preset quick --set seeds=4           # the README's rows, ~6 min
    mpx run arithmetic --preset paper     # 6 layers × 384 (Lee et al.'s NanoGPT), 5 seeds (GPU)
    mpx run arithmetic --preset quick --set tasks=addition --set fractions=0.001,0.002,0.008
                                          # a data-fraction curve (plots/fraction_curve.png)
    mpx run arithmetic --preset quick --set reverse_answer=true   # answers reversed

Expect (quick: a 2-layer width-32 decoder, 800 steps of batch 64 on 4,000 additions and
30,000 multiplications, plain answers, `--set seeds=4`) addition sequence accuracy mask
90.20 ± 2.70 > QK-Opt 64.78 ± 36.85 (3 of 4 seeds learn) > QK-SVD 5.91 ± 3.25 > default
1.00 ± 0.18; with 2 seeds the numbers move within that spread. Multiplication is not
learned by any scheme at this scale (sequence accuracy 0.2–0.3%, digit accuracy ≈ 43%,
QK-SVD ≈ 37%); at `cpu` (4 × 128, 6,000 steps, 2 seeds) the default learns it (6.95 ±
0.28%) and the mask does not help (5.21 ± 0.32%); at each scheme's own rate (chosen on
validation) 8.68 ± 1.74 against 7.86 ± 0.52 (experiments/results/arithmetic_cpu.md).
The paper reports 1.19% (default) → 77.49% (mask) for addition at 0.4% of
the 10^6 problems and 5.01% → 69.49% for multiplication at 3%, QK-SVD and QK-Opt in
between. Measured fraction sweeps and both answer formats:
experiments/results/arithmetic_quick.md.

The paper gives no more of the setup; mpx's (see mpx/tasks/arithmetic/task.py): character
tokens `^123+045=0168$`, a GPT-style causal decoder (`mpx.nn.causal_decoder`) trained with
next-token loss on the answer digits and END, the digit-alignment prior (answer digit p
reads the operand digits that determine it) composed with the causal mask, and greedy
decoding of the held-out 10,000 problems. Answers are plain (most significant digit
first) by default: with reversed answers the default init also learns addition in some
seeds (its mean swings between 18% and 67% over data fractions), which the paper's 1.19%
rules out, while plain answers keep the default at ≤ 4% at every fraction measured
(≈ 1% from 0.2% of the data up).

One group per (task, fraction): every scheme and seed of it trains in one vmapped
program (the family code is `mpx.tasks.arithmetic`; this file is the record); a seed draws both the init and the training set, so the schemes of one seed see
the same problems. AdamW with warmup and cosine decay (the paper preset: batch 256, lr 1e-3,
wd 0.1, 5,000 steps: Lee et al.'s NanoGPT recipe without dropout).
"""

from __future__ import annotations

from mpx.tasks.arithmetic import (SELECTION_NOTE, VALIDATION, Config,  # noqa: F401
                                  make_group, members, task_fractions)

NAME = "arithmetic"  # `mpx run arithmetic`; also when imported as mpx.experiments.arithmetic.

METRICS = ("sequence_accuracy", "digit_accuracy", "loss")

# QK-SVD and QK-Opt are "in between" in the paper, without numbers.
PAPER = {
    "addition": {"default": {"sequence_accuracy": 0.0119},
                 "mask": {"sequence_accuracy": 0.7749}},
    "multiplication": {"default": {"sequence_accuracy": 0.0501},
                       "mask": {"sequence_accuracy": 0.6949}},
}

PRESETS = {
    # One CPU core: ~4 minutes (2 groups × 8 members, 800 steps each, 10,000 test problems).
    "quick": dict(seeds=2, width=32, depth=2, num_heads=2, head_dim=16, mlp_dim=64,
                  batch_size=64, learning_rate=3e-3, steps=800, warmup_steps=50,
                  chunk_steps=100),
    # Lee et al.'s NanoGPT (6 × 384, 6 heads, ~10.6 M params), 5,000 steps (GPU).
    "paper": dict(seeds=5, chunk_steps=250, eval_every=1000, checkpoint_every=1000,
                  eval_batch=1000),
    # The multiplication row on one CPU core: a 4 × 128 decoder, 6,000 steps of batch 128
    # (the default learns here: 2.4% sequence / 64% digit accuracy at 3,000 steps in the
    # search, experiments/results/arithmetic_cpu.md); ≈ 1.9 h of one core for 6 members.
    "cpu": dict(tasks=("multiplication",), schemes=("default", "qk_opt", "mask"), seeds=2,
                width=128, depth=4, num_heads=4, head_dim=32, mlp_dim=512, batch_size=128,
                learning_rate=1e-3, steps=6000, warmup_steps=100, chunk_steps=100,
                eval_every=1000, checkpoint_every=500),
    # Seconds: for the tests.
    "tiny": dict(tasks=("addition",), schemes=("default", "mask"), seeds=1, width=16,
                 depth=1, num_heads=2, head_dim=8, mlp_dim=32, batch_size=32, steps=20,
                 warmup_steps=2, chunk_steps=20, qk_opt_steps=20, test_size=500,
                 eval_batch=500),
}


def build_groups(config: Config):
  """One group per (task, data fraction): its schemes × seeds."""
  return [make_group(config, task, fraction, members(config, task, fraction))
          for task in config.tasks for fraction in task_fractions(config, task)]
