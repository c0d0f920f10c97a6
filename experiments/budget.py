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

Results (local grid, 3 seeds, the format task, 2026-12-01; the columns
rerun is pending; experiments/README.md "budget"): M·N = 32
draws ~1.85x the samples of M·N = 16 and lowers the zero-advantage
fraction (0.40 vs 0.51), but neither round-1 reward (0.449-0.459) nor the
greedy gain (+3.8 to +6.1 points, std ~1.7) orders by budget in 100 steps.
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
