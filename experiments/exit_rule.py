r"""Exit rule: grpo vs pos vs balance vs dapo vs est.

Question: per training step and per sample drawn, which rule learns fastest,
and how do their zero-advantage fractions and entropies differ?

Hypothesis (paper Fig. 3-5): balance > pos > grpo in round-1 reward per
step, with the fewest zero-advantage rows for balance; per sample drawn the
gap narrows, since Ada draws 2-4x grpo's samples per step. dapo keeps only
mixed groups (no zero-advantage rows) at twice the candidates; est spends
one round of B·M slots ∝ 1/p̂. The greedy test accuracy after RL follows
the reward.

Runs: local grid 5 rules x 3 seeds = 15 RL runs of 100 steps on
configs/tiny_arith.py (plus the 3 shared SFT warm starts), ~2 min each on
2 cores: ~30 min (+12 min if the warm starts are not there yet). TPU grid:
the 5 rules on configs/qwen25_math_1p5b.py:tpu=v5p-64, seed 0.

Commands (repo root; TPU grid and the whole set: experiments/README.md):
  python -m ada_jax.sweep experiments/exit_rule.py --run   # the local grid
  python -m experiments.exit_rule                          # plots + table

Results (local grid, 3 seeds, columns task, 2026-12-02; experiments/README.md
"exit_rule"): every adaptive rule ends ahead of grpo in greedy gain
(balance +53.6, pos +52.4, dapo +50.4, est +48.7 vs grpo +46.5 points, std
7-10; balance and pos ahead of grpo on every seed), with far fewer
zero-advantage rows (balance 0.03, dapo 0, grpo 0.41), at 2-3.4x the
samples.
"""

from experiments import experiment, report

EXPERIMENT = experiment.Experiment(
  name='exit_rule',
  variants={v: (f'variant={v}', {}) for v in ('grpo', 'pos', 'balance', 'dapo', 'est')},
  curves={
    **report.REWARD_CURVES,
    'entropy_vs_step': ('step', 'entropy'),
    'zero_adv_vs_step': ('step', 'zero_adv_frac'),
  },
  columns=(*report.STANDARD, report.ENTROPY),
)
sweep = EXPERIMENT.sweep  # What `python -m ada_jax.sweep` expands.
analyze = EXPERIMENT.analyze

if __name__ == '__main__':
  EXPERIMENT.main()
