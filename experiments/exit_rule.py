r"""Exit rule: grpo vs pos vs balance vs dapo vs est on the tiny task.

Question: per training step and per sample drawn, which rule learns the
tiny arithmetic task fastest, and how do their zero-advantage fractions and
entropies differ?

Hypothesis (paper Fig. 3-5): balance > pos > grpo in round-1 reward per
step, with the fewest zero-advantage rows for balance; per sample drawn the
gap narrows, since Ada draws 2-4x grpo's samples per step. dapo keeps only
mixed groups (no zero-advantage rows) at twice the candidates; est spends
one round of B·M slots ∝ 1/p̂.

Commands (3 seeds x 5 rules on configs/tiny_arith.py, a few minutes each):
  python -m ada_jax.sweep experiments/exit_rule.py            # print
  python -m ada_jax.sweep experiments/exit_rule.py --run      # run here
  python experiments/exit_rule.py --root /tmp/ada_sweeps --out /tmp/exit_rule

Results: not run yet.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import statistics
from collections.abc import Mapping, Sequence

VARIANTS = ('grpo', 'pos', 'balance', 'dapo', 'est')
SEEDS = (0, 1, 2)
CURVES = {  # plot name -> (x, y); x 'samples' is the cumulative samples_drawn.
  'reward_vs_step': ('step', 'reward_round1_mean'),
  'reward_vs_samples': ('samples', 'reward_round1_mean'),
  'entropy_vs_step': ('step', 'entropy'),
  'zero_adv_vs_step': ('step', 'zero_adv_frac'),
}


def sweep() -> list[dict]:
  """Every rule with 3 seeds on the tiny config."""
  return [
    dict(config='configs/tiny_arith.py', arg=f'variant={v},seed={s}', name=f'{v}_s{s}')
    for v in VARIANTS
    for s in SEEDS
  ]


def _mean_std(values: Sequence[float]) -> str:
  if not values:
    return 'n/a'
  sd = statistics.stdev(values) if len(values) > 1 else 0.0
  return f'{statistics.mean(values):.3f} ± {sd:.3f}'


def _curves(runs: Sequence[list[dict]], y: str, x: str) -> tuple[list, list]:
  """Seed-mean curve: x of the first run, y averaged over runs per step."""
  steps = min(len(r) for r in runs)
  xs, ys = [], []
  for i in range(steps):
    if x == 'samples':
      xs.append(
        statistics.mean(sum(row['samples_drawn'] for row in r[: i + 1]) for r in runs)
      )
    else:
      xs.append(runs[0][i]['step'])
    ys.append(statistics.mean(float(r[i].get(y, float('nan'))) for r in runs))
  return xs, ys


def analyze(workdirs: Mapping[str, str], out_dir: str) -> str:
  """Plots and a markdown table from the runs' metrics.jsonl and summary.json.

  Args:
    workdirs: run name (`<rule>_s<seed>`) -> workdir.
    out_dir: where `<curve>.png` and `exit_rule.md` go.

  Returns:
    The markdown table.
  """
  from matplotlib.figure import Figure

  from ada_jax import metrics as metrics_lib

  runs, summaries = collections.defaultdict(list), collections.defaultdict(list)
  for name, wd in sorted(workdirs.items()):
    rule = name.rsplit('_s', 1)[0]
    rows = metrics_lib.read_rows(wd, phase='rl')
    if rows:
      runs[rule].append(rows)
    path = os.path.join(wd, 'summary.json')
    if os.path.isfile(path):
      with open(path) as f:
        summaries[rule].append(json.load(f))
  os.makedirs(out_dir, exist_ok=True)
  for plot, (x, y) in CURVES.items():
    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    for rule, rule_runs in runs.items():
      ax.plot(*_curves(rule_runs, y, x), label=f'{rule} (n={len(rule_runs)})')
    ax.set_xlabel('samples drawn' if x == 'samples' else 'step')
    ax.set_ylabel(y)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format='png')
    with open(os.path.join(out_dir, f'{plot}.png'), 'wb') as f:
      f.write(buf.getvalue())
  lines = [
    '| rule | seeds | reward (last 5 steps) | samples/step | zero-adv frac | '
    'entropy (last) | greedy acc. after RL |',
    '|---|---|---|---|---|---|---|',
  ]
  for rule in [v for v in VARIANTS if v in runs]:
    rs = runs[rule]
    acc = [s['after_rl']['eval_accuracy'] for s in summaries[rule] if 'after_rl' in s]
    cells = [
      _mean_std(
        [statistics.mean(r['reward_round1_mean'] for r in rows[-5:]) for rows in rs]
      ),
      _mean_std([statistics.mean(r['samples_drawn'] for r in rows) for rows in rs]),
      _mean_std([statistics.mean(r['zero_adv_frac'] for r in rows) for rows in rs]),
      _mean_std([rows[-1]['entropy'] for rows in rs]),
      _mean_std(acc),
    ]
    lines.append(f'| {rule} | {len(rs)} | ' + ' | '.join(cells) + ' |')
  table = '\n'.join(lines) + '\n'
  with open(os.path.join(out_dir, 'exit_rule.md'), 'w') as f:
    f.write(table)
  return table


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description='Analyze the exit_rule sweep.')
  parser.add_argument('--root', default='/tmp/ada_sweeps', help='sweep workdir root')
  parser.add_argument('--out', default='/tmp/exit_rule')
  args = parser.parse_args()
  base = os.path.join(args.root, 'exit_rule')
  dirs = {r['name']: os.path.join(base, r['name']) for r in sweep()}
  print(analyze({n: d for n, d in dirs.items() if os.path.isdir(d)}, args.out))
