r"""Reads an experiment's runs back: seed-mean curves as PNG, a markdown table.

Every experiment names its runs `<variant>_s<seed>` and its `analyze` hands
`{name: workdir}` here with the curves and table columns that decide its
question. A run contributes its RL rows (`metrics.jsonl`, phase `rl`) and
`summary.json` (greedy test accuracy before and after RL), and its
`python -m ada_jax.evaluate` report where it has one (`eval/eval.json`, or
the latest `eval/step_N/`): a table of Ave@k and pass@k per grader (the
paper configs compute no greedy accuracy; this is their table). A run without RL
rows (not started) is left out; a run still going counts with the steps it
has, and each variant's curves stop at its shortest run.

Curves: each run's series is smoothed with a trailing moving average
(`SMOOTH` steps; the paper plots 20-step averages of 400+ steps), then
averaged over seeds, with a ±1 std band across seeds. The x axis is the step
or a cumulative per-step metric (samples drawn, sampling seconds). Table
cells are mean ± std over seeds (sample std; 0 for a single seed).
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import math
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from etils import epath

SMOOTH = 10
# x axis name -> the per-step metric it accumulates (None: the step itself).
X_AXES = {'step': None, 'samples': 'samples_drawn', 'sample_s': 'time_sample_s'}
X_LABELS = {
  'step': 'RL step',
  'samples': 'samples drawn (cumulative)',
  'sample_s': 'sampling time, s (cumulative)',
}


@dataclasses.dataclass(frozen=True)
class Run:
  """One seed of one variant: its RL metrics rows, summary.json, eval.json.

  `evaluation`: the run's `python -m ada_jax.evaluate` report, from
  DIR/eval/eval.json or, after `--step all`, the latest DIR/eval/step_N/
  ({} when it has none).
  """

  rows: list[dict[str, Any]]
  summary: dict[str, Any]
  evaluation: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Column:
  """A table column: header, value of one run (None: not available), format."""

  header: str
  value: Callable[[Run], float | None]
  fmt: str = '.3f'


def _values(run: Run, key: str) -> list[float]:
  return [float(r[key]) for r in run.rows if isinstance(r.get(key), int | float)]


def step_mean(key: str) -> Callable[[Run], float | None]:
  """The metric's mean over the run's steps."""
  return lambda run: statistics.mean(v) if (v := _values(run, key)) else None


def last_mean(key: str, steps: int = 5) -> Callable[[Run], float | None]:
  """The metric's mean over the run's last `steps` steps."""
  return lambda run: statistics.mean(v[-steps:]) if (v := _values(run, key)) else None


def step_sum(key: str) -> Callable[[Run], float | None]:
  """The metric summed over the run's steps (e.g. samples drawn in all)."""
  return lambda run: math.fsum(v) if (v := _values(run, key)) else None


def _accuracy(run: Run, when: str, key: str, level: str | None = None) -> float | None:
  """summary[when][key] (or its `level` entry, for a `*_by_level` key)."""
  acc = run.summary.get(when, {}).get(key)
  if level is not None:
    acc = (acc or {}).get(level)
  return float(acc) if acc is not None else None


def _gain(run: Run, key: str, level: str | None = None) -> float | None:
  after = _accuracy(run, 'after_rl', key, level)
  before = _accuracy(run, 'before_rl', key, level)
  return after - before if after is not None and before is not None else None


def accuracy(
  when: str, key: str, level: str | None = None
) -> Callable[[Run], float | None]:
  """A held-out accuracy of the summary: before_rl or after_rl."""
  return lambda run: _accuracy(run, when, key, level)


def gain(key: str, level: str | None = None) -> Callable[[Run], float | None]:
  """after_rl minus before_rl of a held-out accuracy."""
  return lambda run: _gain(run, key, level)


GREEDY, SAMPLED = 'eval_accuracy', 'eval_sampled_accuracy'
REWARD = Column('reward, last 5 steps', last_mean('reward_round1_mean'))
SAMPLES = Column('samples/step', step_mean('samples_drawn'), '.0f')
ZERO_ADV = Column('zero-adv frac', step_mean('zero_adv_frac'))
ACCURACY = Column('greedy acc. after RL', accuracy('after_rl', GREEDY))
GAIN = Column('gain over before RL', gain(GREEDY), '+.3f')
STANDARD = (REWARD, SAMPLES, ZERO_ADV, ACCURACY, GAIN)
ENTROPY = Column('entropy, last 5 steps', last_mean('entropy'))
ROUNDS = Column('rounds/step', step_mean('rounds'), '.2f')
SAMPLE_S = Column('sampling s/step', step_mean('time_sample_s'), '.2f')
# The main job's table (experiments/main_job.py): held-out accuracy before,
# after and gained, greedy and sampled (temperature 1, k per problem), and
# the cost of getting there.
MAIN_JOB = (
  Column('greedy before', accuracy('before_rl', GREEDY)),
  Column('greedy after', accuracy('after_rl', GREEDY)),
  Column('greedy gain', gain(GREEDY), '+.3f'),
  Column('sampled before', accuracy('before_rl', SAMPLED)),
  Column('sampled after', accuracy('after_rl', SAMPLED)),
  Column('sampled gain', gain(SAMPLED), '+.3f'),
  ZERO_ADV,
  SAMPLES,
  Column('samples in all', step_sum('samples_drawn'), '.0f'),
  Column('RL wall s', step_sum('time_step_s'), '.0f'),
)


def by_level(key: str, levels: Sequence[str]) -> tuple[Column, ...]:
  """Held-out accuracy `key` per difficulty level, before and after RL."""
  k = f'{key}_by_level'
  return tuple(
    Column(f'L{lv} {when}', accuracy(f'{when}_rl', k, lv))
    for lv in levels
    for when in ('before', 'after')
  )


# Held-out metrics logged every `rl.eval_every` steps (and in summary.json
# before and after RL), drawn as sparse curves.
EVAL_METRICS = ('eval_accuracy', 'eval_sampled_accuracy')
# The curves every experiment draws: reward per step and per sample drawn.
REWARD_CURVES = {
  'reward_vs_step': ('step', 'reward_round1_mean'),
  'reward_vs_samples': ('samples', 'reward_round1_mean'),
}


def variant_of(name: str) -> str:
  """`balance_s2` -> `balance`."""
  return name.rsplit('_s', 1)[0]


def load(workdirs: Mapping[str, str]) -> dict[str, list[Run]]:
  """Runs by variant, in name order; runs without RL rows are left out."""
  from ada_jax.infra import metrics as metrics_lib
  from ada_jax.infra import run_dir

  out: dict[str, list[Run]] = {}
  for name, workdir in sorted(workdirs.items()):
    wd = epath.Path(workdir)
    if not (wd / run_dir.METRICS_FILE).exists():
      continue
    rows = metrics_lib.read_rows(wd, phase='rl')
    if not rows:
      continue
    summary_path = wd / 'summary.json'
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    out.setdefault(variant_of(name), []).append(Run(rows, summary, _evaluation(wd)))
  return out


def _evaluation(workdir: epath.Path) -> dict[str, Any]:
  """The run's eval.json (the latest step's after `--step all`), or {}."""
  folder = workdir / 'eval'
  if (folder / 'eval.json').exists():
    return json.loads((folder / 'eval.json').read_text())
  steps = []
  if folder.exists():
    for child in folder.iterdir():
      tail = child.name.removeprefix('step_')
      if tail.isdigit() and (child / 'eval.json').exists():
        steps.append((int(tail), child))
  return json.loads((max(steps)[1] / 'eval.json').read_text()) if steps else {}


def eval_columns(runs: Sequence[Run]) -> list[Column]:
  """Ave@k and pass@k (weighted over the sets) per grader of the eval.json files.

  One pair per grader found, the paper's graders (the reference's) marked.
  """
  reports = [r.evaluation for r in runs if r.evaluation]
  if not reports:
    return []
  k = reports[0]['k']
  modes: list[str] = []
  for rep in reports:
    graders = rep.get('graders', ['ada'])
    for m in [graders] if isinstance(graders, str) else graders:
      if m not in modes:
        modes.append(m)

  def get(mode: str, what: str) -> Callable[[Run], float | None]:
    def value(run: Run) -> float | None:
      w = run.evaluation.get('weighted_by_grader', {}).get(mode)
      if w is None and run.evaluation.get('graders') in (mode, [mode]):
        w = run.evaluation.get('weighted')  # One grader, older reports.
      if not w:
        return None
      return w['ave_at_k'] if what == 'ave' else w['pass_at'].get(str(k))

    return value

  out = []
  for m in modes:
    mark = ', paper' if m == reports[0].get('paper_graders') else ''
    out.append(Column(f'Ave@{k} ({m}{mark})', get(m, 'ave')))
    out.append(Column(f'pass@{k} ({m}{mark})', get(m, 'pass')))
  return out


def _smoothed(values: Sequence[float], window: int) -> list[float]:
  """Trailing mean over the last `window` values (fewer at the start)."""
  return [
    statistics.fmean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))
  ]


def curve(
  runs: Sequence[Run], x: str, y: str, smooth: int = SMOOTH
) -> tuple[list[float], list[float], list[float]]:
  """(x, seed-mean of smoothed y, seed-std) over the shortest run's steps.

  A metric logged only on some steps (the periodic held-out evaluation,
  `EVAL_METRICS`) is drawn unsmoothed at those steps, between its value
  before RL (x = 0) and after RL (the run's last x) from summary.json.
  """
  if y in EVAL_METRICS:
    return _eval_curve(runs, x, y)
  steps = min(len(run.rows) for run in runs)
  ys, xs = [], []
  for run in runs:
    rows = run.rows[:steps]
    ys.append(_smoothed([float(r.get(y, math.nan)) for r in rows], smooth))
    xs.append(_xs(rows, x))
  return _seed_stats(xs, ys)


def _xs(rows: Sequence[dict[str, Any]], x: str) -> list[float]:
  key = X_AXES[x]
  if key is None:
    return [float(r['step']) for r in rows]
  return list(itertools.accumulate(float(r.get(key, 0.0)) for r in rows))


def _seed_stats(xs, ys) -> tuple[list[float], list[float], list[float]]:
  by_step = list(zip(*ys, strict=True))
  return (
    [statistics.mean(v) for v in zip(*xs, strict=True)],
    [statistics.mean(v) for v in by_step],
    [_std(v) for v in by_step],
  )


def _eval_curve(runs: Sequence[Run], x: str, y: str):
  xs, ys = [], []
  for run in runs:
    all_x = _xs(run.rows, x)
    px, py = [0.0], [run.summary.get('before_rl', {}).get(y, math.nan)]
    for r, xv in zip(run.rows, all_x, strict=True):
      if isinstance(r.get(y), int | float):
        px.append(xv)
        py.append(float(r[y]))
    if 'after_rl' in run.summary and all_x:
      px.append(all_x[-1])
      py.append(run.summary['after_rl'].get(y, math.nan))
    xs.append(px)
    ys.append([float(v) for v in py])
  points = min(len(p) for p in xs)
  return _seed_stats([p[:points] for p in xs], [p[:points] for p in ys])


def _std(values: Sequence[float]) -> float:
  """Sample std across seeds, 0 for one seed, NaN where a run lacks the metric.

  Python 3.11's `statistics.stdev` raises on NaN instead of returning it.
  """
  if any(math.isnan(v) for v in values):
    return math.nan
  return statistics.stdev(values) if len(values) > 1 else 0.0


def plot(
  variants: Mapping[str, Sequence[Run]],
  curves: Mapping[str, tuple[str, str]],
  out_dir: str,
  *,
  title: str,
) -> list[str]:
  """Writes OUT/<curve>.png, one line per variant; returns the paths."""
  # A bare Figure draws on the Agg canvas without touching pyplot's state.
  from matplotlib.figure import Figure

  out = epath.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  paths = []
  for name, (x, y) in curves.items():
    fig = Figure(figsize=(6.5, 3.8), dpi=100)
    ax = fig.add_subplot()
    for variant, runs in variants.items():
      xs, mean, std = curve(runs, x, y)
      (line,) = ax.plot(xs, mean, label=f'{variant} (n={len(runs)})')
      lo = [m - s for m, s in zip(mean, std, strict=True)]
      hi = [m + s for m, s in zip(mean, std, strict=True)]
      ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xlabel(X_LABELS[x])
    ax.set_ylabel(y)
    ax.set_title(f'{title}: {y}')
    ax.grid(alpha=0.3)
    ax.legend(fontsize='small')
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format='png')
    path = out / f'{name}.png'
    path.write_bytes(buf.getvalue())
    paths.append(os.fspath(path))
  return paths


def _cell(values: Sequence[float], fmt: str) -> str:
  if not values:
    return 'n/a'
  sd = statistics.stdev(values) if len(values) > 1 else 0.0
  return f'{statistics.mean(values):{fmt}} ± {sd:{fmt.lstrip("+")}}'


def table(variants: Mapping[str, Sequence[Run]], columns: Sequence[Column]) -> str:
  """Markdown: one row per variant, mean ± std over its seeds per column."""
  lines = [
    '| variant | seeds | ' + ' | '.join(c.header for c in columns) + ' |',
    '|---|---|' + '---|' * len(columns),
  ]
  for variant, runs in variants.items():
    cells = []
    for column in columns:
      values = [v for run in runs if (v := column.value(run)) is not None]
      cells.append(_cell(values, column.fmt))
    lines.append(f'| {variant} | {len(runs)} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines) + '\n'


def report(
  workdirs: Mapping[str, str],
  out_dir: str,
  *,
  name: str,
  curves: Mapping[str, tuple[str, str]],
  columns: Sequence[Column],
  order: Sequence[str] = (),
  tables: Mapping[str, Sequence[Column]] | None = None,
) -> str:
  """Plots and table of one experiment: OUT/<curve>.png and OUT/NAME.md.

  Args:
    workdirs: run name (`<variant>_s<seed>`) -> workdir.
    out_dir: created if missing.
    name: the experiment, for titles and the markdown file.
    curves: plot name -> (x axis in `X_AXES`, metric).
    columns: the table's columns after variant and seeds.
    order: variants in table and legend order; others follow, sorted.
    tables: more tables after the first, title -> columns (e.g. per level).

  Returns:
    The markdown tables.
  """
  found = load(workdirs)
  ranked = [v for v in order if v in found]
  variants = {v: found[v] for v in ranked + sorted(set(found) - set(ranked))}
  out = epath.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  plots = plot(variants, curves, out_dir, title=name) if variants else []
  text = table(variants, columns)
  for title, cols in (tables or {}).items():
    text += f'\n{title}\n\n' + table(variants, cols)
  benchmark = eval_columns([r for runs in variants.values() for r in runs])
  if benchmark:
    text += "\nBenchmarks (each run's eval.json, weighted over its sets)\n\n" + table(
      variants, benchmark
    )
  images = ''.join(f'![{os.path.basename(p)}]({os.path.basename(p)})\n' for p in plots)
  (out / f'{name}.md').write_text(f'# {name}\n\n{text}\n{images}')
  return text
