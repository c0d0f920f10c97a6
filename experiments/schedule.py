r"""Round schedule: paper vs refill at the same slots.

Question: with the same S = B·M sampling slots per round, does `refill`
(every round shares all S slots among the still-active prompts, up to N·M
samples each) learn as well per step as the reference's `paper` schedule
(each active prompt gets M samples per round, the other slots idle), in
fewer rounds and less sampling time?

Hypothesis: refill's round 1 equals paper's, and afterwards it gives the
few hard prompts still active many samples at once, so they find their
missing positive or negative in fewer rounds: fewer rounds per step, higher
slot utilization and less sampling time per step, more samples drawn per
step (the idle slots are used), and the same or slightly higher reward per
step (fewer groups fall back to an incomplete pool).

Runs: local grid balance x {paper, refill} x 3 seeds = 6 RL runs of 100
steps on configs/tiny_arith.py (plus the 3 shared SFT warm starts), ~2 min
each on 2 cores: ~12 min. TPU grid: the same two on
configs/qwen25_math_1p5b.py:tpu=v5p-64, seed 0.

Commands (repo root; TPU grid and the whole set: experiments/README.md):
  python -m ada_jax.sweep experiments/schedule.py --run   # the local grid
  python -m experiments.schedule                          # plots + table

Results (local grid, 3 seeds, columns task, 2026-12-02; experiments/README.md
"schedule"): refill ran 2.66 rounds/step vs 3.93 at slot utilization 0.78
vs 0.44 and drew 520 vs 439 samples per step from the same slots, with the
same learning within noise (greedy gain +52.8 vs +53.6 points, std 4-8).
"""

from experiments import experiment, report

EXPERIMENT = experiment.Experiment(
  name='schedule',
  # Both keep the config's S = B·M slots: only the schedule differs.
  variants={s: (f'variant=balance,schedule={s}', {}) for s in ('paper', 'refill')},
  curves={
    **report.REWARD_CURVES,
    'reward_vs_sample_time': ('sample_s', 'reward_round1_mean'),
    'rounds_vs_step': ('step', 'rounds'),
    'slot_utilization_vs_step': ('step', 'slot_utilization'),
  },
  columns=(
    *report.STANDARD,
    report.ROUNDS,
    report.Column('slot utilization', report.step_mean('slot_utilization')),
    report.SAMPLE_S,
  ),
)
sweep = EXPERIMENT.sweep  # What `python -m ada_jax.sweep` expands.
analyze = EXPERIMENT.analyze

if __name__ == '__main__':
  EXPERIMENT.main()
