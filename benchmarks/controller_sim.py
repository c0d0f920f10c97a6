"""Simulated sampling cost and gradient signal of each controller rule.

No model: every prompt has a fixed pass rate p and a sample is correct with
probability p (`draw` returns Bernoulli(p) rewards). The pass rates follow
the reference's motivation (reference doc §9, Fig. 2, Qwen2.5-Math-1.5B):
pass@1 26.5% and pass@256 81.3%, fitted by a mixture of a point mass at 0
(unsolvable prompts) and Beta(0.5, b) (many hard prompts), with b and the
mass solved from the two figures.

Setup as the paper: B=512 prompts per step, n=4, M=8, N=4, τ=0.7, over a
fixed set of 2048 prompts visited in order (so the est history sees each
prompt once per epoch), 20 steps (5 epochs). Per rule and schedule it prints
the means per step of: samples drawn (inference cost), rounds, slot-rounds
(rounds·S: the compute of fixed-shape rounds, idle slots included), the
fraction of idle slots, kept rows, the fraction of zero-advantage rows,
prompts short of positives / negatives (rule's exit requirement; for the
rules without one, no positive / no negative at all) and the round-1 reward.
A second table splits the prompts by pass rate and gives the fraction whose
group carries no gradient (all advantages 0); its last row gives the number
of distinct dataset prompts per bucket (small buckets are noisy).

Run: python benchmarks/controller_sim.py [--steps 20] [--seed 0]

Dimension legend: B prompts per step, S slots per round, n group size,
M samples per round, N max rounds.
"""

import argparse
import time

import numpy as np
from scipy import optimize, special

from ada_jax import adaptive

B, N_GROUP, M, N_ROUNDS = 512, 4, 8, 4
DATASET = 2048
PASS1, PASS256 = 0.265, 0.813
BETA_A = 0.5


def fit_pass_rates() -> tuple[float, float]:
  """(b, mass at 0) such that the mixture has the reference's pass@1, pass@256."""

  def zero_mass(b: float) -> float:
    return 1 - PASS1 * (BETA_A + b) / BETA_A

  def pass_at_256(b: float) -> float:
    miss = np.exp(special.betaln(BETA_A, b + 256) - special.betaln(BETA_A, b))
    return (1 - zero_mass(b)) * (1 - miss) - PASS256

  b = optimize.brentq(pass_at_256, 0.6, 1.3)
  return b, zero_mass(b)


def make_draw(p: np.ndarray, rng: np.random.Generator):
  def draw(slot_prompt: np.ndarray) -> np.ndarray:
    prob = np.where(slot_prompt >= 0, p[np.maximum(slot_prompt, 0)], 0.0)
    return (rng.random(len(slot_prompt)) < prob).astype(np.float64)

  return draw


# (label, rule, schedule, prompts per step, slots, extra options)
CONFIGS = [
  ('grpo', 'grpo', 'paper', B, B * N_GROUP, {}),
  ('dapo (2B cand.)', 'dapo', 'paper', 2 * B, B * N_GROUP, {'target_groups': B}),
  ('pos / paper', 'pos', 'paper', B, B * M, {}),
  ('pos / refill', 'pos', 'refill', B, B * M, {}),
  ('balance / paper', 'balance', 'paper', B, B * M, {}),
  ('balance / refill', 'balance', 'refill', B, B * M, {}),
  ('est (S=B·M)', 'est', 'paper', B, B * M, {}),
]

BUCKETS = [(0.0, 0.0), (1e-9, 0.05), (0.05, 0.15), (0.15, 0.5), (0.5, 0.9), (0.9, 1.0)]


def run(steps: int, seed: int) -> None:
  b, mass0 = fit_pass_rates()
  rng = np.random.default_rng(seed)
  pass_rate = np.where(
    rng.random(DATASET) < mass0, 0.0, rng.beta(BETA_A, b, size=DATASET)
  )
  print(
    f'pass rates: {mass0:.1%} at 0, else Beta({BETA_A}, {b:.3f}); '
    f'dataset {DATASET}: pass@1 {pass_rate.mean():.3f}, '
    f'pass@256 {np.mean(1 - (1 - pass_rate) ** 256):.3f}, '
    f'p < 0.1: {np.mean(pass_rate < 0.1):.1%}'
  )
  header = (
    f'{"rule / schedule":18s} {"S":>5s} {"samples":>8s} {"rounds":>6s} '
    f'{"slot·rnd":>8s} {"idle":>5s} {"rows":>5s} {"0-adv":>6s} '
    f'{"short+":>6s} {"short-":>6s} {"no+":>5s} {"no-":>5s} {"r1 rew":>6s}'
  )
  table, bucket_rows = [header, '-' * len(header)], []
  slot_rounds: dict[str, float] = {}
  for label, rule, schedule, prompts, slots, options in CONFIGS:
    draw_rng = np.random.default_rng(seed + 1)
    history = None
    acc: dict[str, list[float]] = {}
    zero_by_bucket = np.zeros(len(BUCKETS))
    seen_by_bucket = np.zeros(len(BUCKETS))
    start = time.perf_counter()
    for step in range(steps):
      ids = (np.arange(prompts) + step * B) % DATASET
      p = pass_rate[ids]
      g = adaptive.sample_groups(
        prompts,
        make_draw(p, draw_rng),
        rule=rule,
        group_size=N_GROUP,
        samples_per_round=M,
        max_rounds=N_ROUNDS,
        slots=slots,
        schedule=schedule,
        prompt_keys=ids.tolist(),
        history=history,
        **options,
      )
      history = g.history
      m = g.metrics
      for key in (
        'samples_drawn',
        'rounds',
        'slots_idle',
        'rows',
        'zero_adv_frac',
        'prompts_short_pos',
        'prompts_short_neg',
        'prompts_no_pos',
        'prompts_no_neg',
        'reward_round1_mean',
      ):
        acc.setdefault(key, []).append(m[key])
      acc.setdefault('slot_rounds', []).append(m['rounds'] * slots)
      # Per prompt with rows: does its group carry any gradient?
      kept = np.unique(g.prompt_index)
      dead = np.array([np.all(g.advantage[g.prompt_index == i] == 0) for i in kept])
      for j, (lo, hi) in enumerate(BUCKETS):
        in_bucket = (p[kept] >= lo) & (p[kept] <= hi)
        zero_by_bucket[j] += dead[in_bucket].sum()
        seen_by_bucket[j] += in_bucket.sum()
    mean = {k: float(np.mean(v)) for k, v in acc.items()}
    table.append(
      f'{label:18s} {slots:5d} {mean["samples_drawn"]:8.0f} {mean["rounds"]:6.2f} '
      f'{mean["slot_rounds"]:8.0f} {mean["slots_idle"] / mean["slot_rounds"]:5.1%} '
      f'{mean["rows"]:5.0f} {mean["zero_adv_frac"]:6.1%} '
      f'{mean["prompts_short_pos"]:6.1f} {mean["prompts_short_neg"]:6.1f} '
      f'{mean["prompts_no_pos"]:5.1f} {mean["prompts_no_neg"]:5.1f} '
      f'{mean["reward_round1_mean"]:6.3f}'
    )
    slot_rounds[label] = mean['slot_rounds']
    frac = zero_by_bucket / np.maximum(seen_by_bucket, 1)
    bucket_rows.append(f'{label:18s} ' + ' '.join(f'{x:9.1%}' for x in frac))
    print(f'  {label}: {time.perf_counter() - start:.1f}s', flush=True)
  print(
    f'\nMeans per step over {steps} steps (B={B}, n={N_GROUP}, M={M}, N={N_ROUNDS}):'
  )
  print('\n'.join(table))
  names = ['p=0', '(0,.05]', '(.05,.15]', '(.15,.5]', '(.5,.9]', '(.9,1]']
  print('\nFraction of kept prompts whose group has all-zero advantages, by pass rate:')
  print(f'{"rule / schedule":18s} ' + ' '.join(f'{x:>9s}' for x in names))
  print('\n'.join(bucket_rows))
  per_bucket = [np.sum((pass_rate >= lo) & (pass_rate <= hi)) for lo, hi in BUCKETS]
  print(f'{"(dataset prompts)":18s} ' + ' '.join(f'{x:9d}' for x in per_bucket))
  for rule in ('pos', 'balance'):
    ratio = slot_rounds[f'{rule} / refill'] / slot_rounds[f'{rule} / paper']
    print(
      f'{rule}: refill needs {ratio:.2f}x the slot-rounds (device compute) of paper'
    )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--steps', type=int, default=20)
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  run(args.steps, args.seed)


if __name__ == '__main__':
  main()
