r"""Sampling budget: samples per round M and most rounds N (balance).

Question: how do M (samples per active prompt per round) and N (most
rounds; a prompt draws at most M·N) trade reward per step against samples
drawn? The group size n = 4 stays fixed (M >= n is required).

Grid (balance, S = B·M slots): (M, N) = (4, 4) and (8, 2), both at most 16
samples per prompt; (8, 4), the reference's, and (16, 2), both at most 32.

Hypothesis: at the same M·N, smaller rounds (M=4, N=4) draw fewer samples
per step for about the same reward, since easy prompts exit after round 1
with only M samples, at the price of more sequential rounds; doubling M·N
lowers the zero-advantage fraction (more hard prompts find a positive) and
raises reward per step, but not reward per sample drawn.

Runs: local grid 4 settings x 3 seeds = 12 RL runs of 100 steps on
configs/tiny_arith.py (plus the 3 shared SFT warm starts), ~2 min each on
2 cores (M=16 about 3): ~27 min. TPU grid: the same four on
configs/qwen25_math_1p5b.py:tpu=v5p-64 (S = 512·M), seed 0.

Commands (repo root; TPU grid and the whole set: experiments/README.md):
  python -m ada_jax.sweep experiments/budget.py --run   # the local grid
  python -m experiments.budget                          # plots + table

Results (local grid, 3 seeds, the columns task, 2026-12-02;
experiments/README.md "budget"): at M·N = 16, (4, 4) draws 12% fewer
samples per step than (8, 2) (316 vs 361) for the same greedy gain (+52.6
vs +52.5 points), at twice the rounds. Doubling M·N to 32 lowers the
zero-advantage fraction from 0.09 to 0.03, as predicted, and draws 1.4-1.7x
the samples, but does not raise the gain (+53.6 for (8, 4), +51.2 for
(16, 2); std 2-8 points): per sample drawn the small budgets learn fastest.
"""

from experiments import experiment, report

BUDGETS = ((4, 4), (8, 2), (8, 4), (16, 2))  # (M, N).


def variants(prompts: int) -> experiment.Variants:
  """`m<M>_n<N>` -> balance with M, N and S = prompts·M slots."""
  return {
    f'm{m}_n{n}': (
      'variant=balance',
      {'rl.samples_per_round': m, 'rl.max_rounds': n, 'rl.slots': prompts * m},
    )
    for m, n in BUDGETS
  }


EXPERIMENT = experiment.Experiment(
  name='budget',
  variants=variants(experiment.TINY_PROMPTS),
  tpu_variants=variants(experiment.PAPER_PROMPTS),
  curves={
    **report.REWARD_CURVES,
    'samples_vs_step': ('step', 'samples_drawn'),
    'zero_adv_vs_step': ('step', 'zero_adv_frac'),
  },
  columns=(*report.STANDARD, report.ROUNDS, report.SAMPLE_S),
)
sweep = EXPERIMENT.sweep  # What `python -m ada_jax.sweep` expands.
analyze = EXPERIMENT.analyze

if __name__ == '__main__':
  EXPERIMENT.main()
