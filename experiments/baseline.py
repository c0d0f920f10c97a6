r"""Advantage baseline: global vs local statistics, std on or off (balance).

Question: with balance sampling, which baseline gives the better update: the
prompt's whole pool of samples (`global`: r - P/(P+Q), the reference's
choice for Ada) or the kept group of n (`local`: GRPO's), and does dividing
by the std help either?

Hypothesis: global without std (the reference default) is best. Balance
keeps about as many positives as negatives, so the kept group's mean is
near 1/2 whatever the prompt's pass rate; the pool mean estimates the pass
rate, so a rare correct answer to a hard prompt gets a large advantage
(1 - p̂). Dividing by std mostly upweights prompts with p̂ near 0 or 1,
which helps local (std of a balanced group is ~0.5) little and makes global
noisier (a pool std near 0 blows up the scale).

Runs: local grid {global, local} x {std, no std} x 3 seeds = 12 RL runs
of 100 steps on configs/tiny_arith.py:variant=balance (plus the 3 shared SFT
warm starts), ~2 min each on 2 cores: ~24 min. TPU grid: the same four on
configs/qwen25_math_1p5b.py:tpu=v5p-64, seed 0.

Commands (repo root; TPU grid and the whole set: experiments/README.md):
  python -m ada_jax.sweep experiments/baseline.py --run   # the local grid
  python -m experiments.baseline                          # plots + table

Results (local grid, 3 seeds, the columns task, 2026-12-02;
experiments/README.md "baseline"): the four baselines are
indistinguishable in 100 steps: greedy gains +51.8 to +53.7 points (std
6-8), round-1 reward 0.566-0.586, zero-advantage fraction 0.03-0.04. The
std only rescales the advantages (mean |A| 1.13 vs 0.47 global, 0.83 vs
0.48 local), which Adam mostly undoes. global_nostd (the reference) is
never worse than the others by more than a seed's noise.
"""

from experiments import experiment, report

EXPERIMENT = experiment.Experiment(
  name='baseline',
  # main reads rl.normalize_std as a string ('' = the rule's default).
  variants={
    f'{adv}_{"std" if std else "nostd"}': (
      'variant=balance',
      {'rl.advantage': adv, 'rl.normalize_std': 'true' if std else 'false'},
    )
    for adv in ('global', 'local')
    for std in (False, True)
  },
  curves={
    **report.REWARD_CURVES,
    'entropy_vs_step': ('step', 'entropy'),
    'adv_abs_vs_step': ('step', 'adv_abs_mean'),
    'grad_norm_vs_step': ('step', 'grad_norm'),
  },
  columns=(
    *report.STANDARD,
    report.ENTROPY,
    report.Column('mean abs advantage', report.step_mean('adv_abs_mean')),
  ),
)
sweep = EXPERIMENT.sweep  # What `python -m ada_jax.sweep` expands.
analyze = EXPERIMENT.analyze

if __name__ == '__main__':
  EXPERIMENT.main()
