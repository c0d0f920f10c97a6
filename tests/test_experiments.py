"""Tests for ada_jax.sweep and experiments/: expansion, grids, analysis.

Sweeps expand to configs that build (local and TPU grids of every
experiment), placeholders and groups resolve, the per-seed warm start is
shared and describes the same SFT as the runs that read it, and `analyze()`
turns metrics written by a short real run (an SFT-only warm start, then 2
RL steps initialized from it, through the sweep's own configs) into PNGs
and one table row per variant.
"""

import json
import os
import pathlib
import re
import shutil
import signal

import pytest

from ada_jax import from_config, sweep
from ada_jax.infra import metrics as metrics_lib
from ada_jax.infra import run_dir
from ada_jax.rl import fit as fit_lib
from experiments import experiment as experiment_lib
from experiments import report

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXPERIMENTS = ('exit_rule', 'schedule', 'budget', 'baseline', 'main_job')
# Keys that shape the SFT phase: a warm start must agree with its users here.
SFT_KEYS = ('seed', 'model', 'data', 'sft', 'sampling.max_new_tokens', 'mesh')


def _path(name: str) -> str:
  return str(ROOT / 'experiments' / f'{name}.py')


def _get(c, dotted: str):
  for part in dotted.split('.'):
    c = c[part]
  return c.to_dict() if hasattr(c, 'to_dict') else c


# ada_jax.sweep on a synthetic experiment.

_EXPERIMENT = '''"""A test sweep."""


def sweep():
  return [
    dict(
      config='configs/tiny_arith.py',
      arg=f'variant={v}',
      overrides={'seed': s, 'rl.steps': 2},
      name=f'{v}_s{s}',
    )
    for v in ('grpo', 'balance')
    for s in (0, 1, 2)
  ] + [dict(config='configs/qwen3_4b_instruct.py', arg='runlocal', name='q3')]
'''


@pytest.fixture
def experiment(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  path = tmp_path / 'exit_rule_test.py'
  path.write_text(_EXPERIMENT)
  return str(path)


def test_sweep_expands_to_configs_that_build(experiment, capsys):
  runs = sweep.expand(experiment, root='/tmp/r')
  assert [r.name for r in runs][:3] == ['grpo_s0', 'grpo_s1', 'grpo_s2']
  assert runs[1].workdir == '/tmp/r/exit_rule_test/grpo_s1'
  for run in runs:
    c = sweep.build_config(run.config, run.overrides)
    from_config.validate(c)
  assert sweep.build_config(runs[4].config, runs[4].overrides).seed == 1
  sweep.main([experiment, '--workdir-root', '/tmp/r'])
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == (
    'python -m ada_jax.main --config=configs/tiny_arith.py:variant=grpo '
    '--workdir=/tmp/r/exit_rule_test/grpo_s0 --config.seed=0 --config.rl.steps=2'
  )
  assert len(lines) == 7
  # A sweep() without `local` has one grid: --grid tpu gives the same runs.
  sweep.main([experiment, '--workdir-root', '/tmp/r', '--grid', 'tpu'])
  assert capsys.readouterr().out.splitlines() == lines


def _status_runner(calls: list, state: str = 'exit 0: finished'):
  """A subprocess.run stand-in: records argv; `status` shows `state`."""

  class Result:
    stdout = f'w0: code abc, {state} (x.1): last line'
    returncode = 0

  def runner(argv, **kw):
    calls.append(argv)
    return Result()

  return runner


def test_sweep_run_local_and_tpu(experiment, tmp_path):
  calls = []
  runner = _status_runner(calls)

  runs = sweep.expand(experiment, root=str(tmp_path))
  done = pathlib.Path(runs[0].workdir)
  done.mkdir(parents=True)
  (done / 'summary.json').write_text('{"after_rl": {}}')
  # A finished run made with another config is not reused silently.
  c = sweep.build_config(runs[0].config, runs[0].overrides).to_dict()
  c['sft']['lr'] *= 2
  (done / 'config.json').write_text(json.dumps(c, default=str))
  with pytest.raises(ValueError, match=r'sft\.lr: '):
    sweep.run_all(runs, runner=runner)
  assert not calls
  c['sft']['lr'] /= 2
  (done / 'config.json').write_text(json.dumps(c, default=str))
  assert sweep.run_all(runs, runner=runner) == 0
  assert len(calls) == 6 and calls[0][1:3] == ['-m', 'ada_jax.main']
  calls.clear()
  assert sweep.run_all(runs[:2], tpu='pod', runner=runner, poll_s=0) == 0
  assert calls[0][:5] == ['./launch_tpu.sh', '--name', 'pod', 'run', runs[0].config]
  assert calls[1] == ['./launch_tpu.sh', '--name', 'pod', 'status']


def _finish(run: sweep.Run) -> None:
  """Makes `run`'s workdir look finished, with the config the sweep builds."""
  workdir = pathlib.Path(run.workdir)
  workdir.mkdir(parents=True)
  (workdir / 'summary.json').write_text('{"after_rl": {}}')
  config = metrics_lib.config_json(sweep.build_config(run.config, run.overrides))
  (workdir / run_dir.CONFIG_FILE).write_text(json.dumps(config))


class _Result:
  def __init__(self, returncode: int):
    self.returncode = returncode


@pytest.mark.parametrize(
  ('code', 'meaning'),
  [
    (1, 'failed'),
    (2, 'bad input (nothing written)'),
    (-9, 'killed by SIGKILL'),
  ],
)
def test_sweep_run_stops_at_a_failed_run(
  experiment, tmp_path, monkeypatch, capsys, code, meaning
):
  runs = sweep.expand(experiment, root=str(tmp_path))
  _finish(runs[0])
  calls = []

  def runner(argv, **kw):
    calls.append(argv)
    assert kw == {'check': False}  # The sweep reads the code, no traceback.
    return _Result(code if len(calls) == 2 else 0)

  assert sweep.run_all(runs, runner=runner) == 1
  assert len(calls) == 2  # runs[0] skipped, runs[1] ran, runs[2] failed.
  out, err = capsys.readouterr()
  assert 'has a finished summary.json: skipped' in out
  assert err.splitlines() == [
    f'sweep: error: run {runs[2].name} ({runs[2].workdir}) exited {code}: '
    f'{meaning}; see its output above'
  ]
  # The same through the command line: exit 1, and no traceback.
  monkeypatch.setattr(sweep.subprocess, 'run', runner)
  calls.clear()
  with pytest.raises(SystemExit) as e:
    sweep.main([experiment, '--run', '--workdir-root', str(tmp_path)])
  assert e.value.code == 1
  assert capsys.readouterr().err.startswith(f'sweep: error: run {runs[2].name} (')


def test_sweep_run_stops_resumable_on_exit_75(
  experiment, tmp_path, monkeypatch, capsys
):
  runs = sweep.expand(experiment, root=str(tmp_path))
  _finish(runs[0])
  calls = []

  def runner(argv, **kw):
    calls.append(argv)
    return _Result(75 if len(calls) == 2 else 0)

  monkeypatch.setattr(sweep.subprocess, 'run', runner)
  with pytest.raises(SystemExit) as e:
    sweep.main([experiment, '--run', '--workdir-root', str(tmp_path)])
  assert e.value.code == 75
  assert len(calls) == 2  # runs[3:] not started.
  out = capsys.readouterr().out
  assert out.splitlines()[-1] == (
    f'sweep: run {runs[2].name} ({runs[2].workdir}) stopped after a checkpoint: '
    'resumable: rerun the same sweep command (finished runs are skipped, this one '
    'resumes)'
  )
  # The rerun: runs[1] has finished meanwhile, runs[2] resumes.
  _finish(runs[1])
  calls.clear()
  assert (
    sweep.run_all(runs, runner=lambda argv, **kw: calls.append(argv) or _Result(0)) == 0
  )
  assert [c[4] for c in calls] == [f'--workdir={r.workdir}' for r in runs[2:]]
  assert capsys.readouterr().out.count('skipped') == 2


@pytest.mark.parametrize('code', [75, 0])
def test_sweep_outlives_a_signal_during_a_run(experiment, tmp_path, capsys, code):
  """SIGTERM/SIGINT to the group: the run checkpoints, the sweep reports it."""
  runs = sweep.expand(experiment, root=str(tmp_path))
  calls = []

  def runner(argv, **kw):
    calls.append(argv)
    os.kill(os.getpid(), signal.SIGTERM)  # As `kill -TERM -PGID` would.
    return _Result(code)  # 75: it checkpointed; 0: it finished meanwhile.

  before = signal.getsignal(signal.SIGTERM)
  assert sweep.run_all(runs, runner=runner) == 75
  assert len(calls) == 1
  assert signal.getsignal(signal.SIGTERM) is before
  out, err = capsys.readouterr()
  assert err.startswith(f'sweep: SIGTERM: waiting for {runs[0].name} to stop')
  last = out.splitlines()[-1]
  if code:
    assert 'stopped after a checkpoint: resumable' in last
  else:
    assert last.startswith(f'sweep: stopped (SIGTERM) after run {runs[0].name}')


def test_sweep_second_signal_stops_at_once(experiment, tmp_path):
  runs = sweep.expand(experiment, root=str(tmp_path))

  def runner(argv, **kw):
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    return _Result(0)

  with pytest.raises(KeyboardInterrupt):
    sweep.run_all(runs, runner=runner)
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sweep_rejects_bad_entries(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  bad = tmp_path / 'bad.py'
  bad.write_text(
    'def sweep():\n'
    "  return [dict(config='configs/tiny_arith.py', arg='variant=x', name='a')]\n"
  )
  with pytest.raises(ValueError, match='variant'):
    sweep.expand(str(bad))
  bad.write_text(
    "def sweep():\n  return [dict(config='configs/tiny_arith.py', name='a')] * 2\n"
  )
  with pytest.raises(ValueError, match='repeats'):
    sweep.expand(str(bad))
  with pytest.raises(SystemExit):
    sweep.main([str(bad), '--tpu', 'pod', '--workdir-root', '/local'])
  with pytest.raises(SystemExit):
    sweep.main([str(bad), '--set', 'no_equals_sign'])


_PLACEHOLDERS = '''"""Placeholders, groups and grids."""


def sweep(local=True):
  c = 'configs/tiny_arith.py'
  return [
    dict(config=c, overrides={'rl.steps': 0}, name='base', group='shared'),
    dict(config=c, overrides={'model.init_from': '{sweeps}/shared/base'}, name='a'),
    dict(
      config=c,
      overrides={'model.init_from': '{root}/a', 'data.template': '{tiny}'},
      name='b' if local else 'b_tpu',
    ),
  ]
'''


def test_sweep_placeholders_groups_and_grids(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(ROOT)
  path = tmp_path / 'ph.py'
  path.write_text(_PLACEHOLDERS)
  runs = sweep.expand(str(path), root='/r/', extra={'rl.steps': 7})
  assert [r.workdir for r in runs] == ['/r/shared/base', '/r/ph/a', '/r/ph/b']
  assert runs[1].overrides == (
    '--config.model.init_from=/r/shared/base',
    '--config.rl.steps=7',
  )
  # Only the two placeholders are replaced; other braces stay as written.
  assert runs[2].overrides[:2] == (
    '--config.model.init_from=/r/ph/a',
    '--config.data.template={tiny}',
  )
  assert runs[0].overrides == ('--config.rl.steps=7',)  # --set wins.
  assert sweep.expand(str(path), root='/r', local=False)[2].name == 'b_tpu'
  sweep.main([str(path), '--workdir-root', '/r', '--set', 'config.seed=3'])
  assert all(
    '--config.seed=3' in line for line in capsys.readouterr().out.split('\n')[:3]
  )
  sweep.main([str(path), '--workdir-root', 'gs://b/x', '--tpu', 'pod'])
  assert '/b_tpu' in capsys.readouterr().out  # --tpu implies the TPU grid.


# The experiments' grids.


@pytest.mark.parametrize('name', EXPERIMENTS)
def test_experiment_grids_build(name, tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  module = sweep.load_module(_path(name))
  assert module.EXPERIMENT.name == name
  assert module.__doc__ and 'Hypothesis' in module.__doc__
  assert f'python -m ada_jax.sweep experiments/{name}.py' in module.__doc__
  local = sweep.expand(_path(name), root=str(tmp_path))
  warm = [r for r in local if '/warm_start/' in r.workdir]
  assert [r.name for r in warm] == ['sft_s0', 'sft_s1', 'sft_s2']
  rl_runs = [r for r in local if r not in warm]
  variants = list(module.EXPERIMENT.variants)
  assert len(rl_runs) == 3 * len(variants)
  assert {report.variant_of(r.name) for r in rl_runs} == set(variants)
  for w in warm:  # Each seed's warm start comes before the runs that read it.
    (pathlib.Path(w.workdir) / 'checkpoints').mkdir(parents=True)
    assert sweep.build_config(w.config, w.overrides).rl.steps == 0
  steps = module.EXPERIMENT.rl_steps
  tiny_steps = sweep.build_config(warm[0].config, ()).rl.steps
  for run in rl_runs:
    c = sweep.build_config(run.config, run.overrides)
    from_config.validate(c)
    assert c.data.name == 'ada_columns'  # The grids run the worked-column task.
    # The grids' short runs, or (main_job) the main job's own step count.
    assert c.rl.steps == (steps if steps is not None else tiny_steps)
    source = next(w for w in warm if w.workdir == c.model.init_from)
    assert local.index(source) < local.index(run)
    base = sweep.build_config(source.config, source.overrides)
    c.model.init_from = ''
    for key in SFT_KEYS:  # The warm start did the SFT this run would have.
      assert _get(c, key) == _get(base, key), (run.name, key)
  tpu = sweep.expand(_path(name), root='gs://b/ada', local=False)
  assert len(tpu) == len(variants) and all('tpu=v5p-64' in r.config for r in tpu)
  for run in tpu:
    c = sweep.build_config(run.config, run.overrides)
    assert c.model.init_from == '' and c.rl.steps == 400


def test_warm_starts_are_shared_by_all_experiments(tmp_path, monkeypatch):
  monkeypatch.chdir(ROOT)
  seen = {}
  for name in EXPERIMENTS:
    for run in sweep.expand(_path(name), root=str(tmp_path), check=False):
      if '/warm_start/' in run.workdir:
        assert seen.setdefault(run.workdir, run) == run
  assert len(seen) == len(experiment_lib.SEEDS)


def test_budget_slots_follow_m():
  module = sweep.load_module(_path('budget'))
  for local, prompts in ((True, 32), (False, 512)):
    budgets = [
      e['overrides']
      for e in module.sweep(local=local)
      if e.get('group') != experiment_lib.WARM_START
    ]
    assert {(o['rl.samples_per_round'], o['rl.max_rounds']) for o in budgets} == set(
      module.BUDGETS
    )
    assert all(o['rl.slots'] == prompts * o['rl.samples_per_round'] for o in budgets)


# Analysis.


def _write_run(workdir, rewards, samples, acc=(0.1, 0.3)):
  with metrics_lib.MetricsWriter(str(workdir), tensorboard=False) as w:
    for step, (r, s) in enumerate(zip(rewards, samples, strict=True), start=1):
      w.write(
        step,
        {'reward_round1_mean': r, 'samples_drawn': s, 'zero_adv_frac': 0.5},
      )
  summary = {
    'before_rl': {'eval_accuracy': acc[0]},
    'after_rl': {'eval_accuracy': acc[1]},
  }
  (pathlib.Path(workdir) / 'summary.json').write_text(json.dumps(summary))


def test_report_numbers_by_hand(tmp_path):
  steps = [i / 10 for i in range(1, 7)]
  _write_run(tmp_path / 'a_s0', steps, [100] * 6)
  _write_run(tmp_path / 'a_s1', [v + 0.2 for v in steps], [300] * 6, (0.2, 0.3))
  _write_run(tmp_path / 'b_s0', steps[:4], [50] * 4)
  (tmp_path / 'c_s0').mkdir()  # Not started: left out.
  workdirs = {p.name: str(p) for p in tmp_path.iterdir()}
  variants = report.load(workdirs)
  assert sorted(variants) == ['a', 'b'] and len(variants['a']) == 2
  xs, mean, std = report.curve(variants['a'], 'samples', 'reward_round1_mean', 2)
  assert xs == [200, 400, 600, 800, 1000, 1200]  # Seed mean of cumulative.
  assert mean[:2] == pytest.approx([0.2, 0.25]) and std[0] == pytest.approx(
    0.1414, 1e-3
  )
  text = report.report(
    workdirs,
    str(tmp_path / 'out'),
    name='t',
    curves=report.REWARD_CURVES,
    columns=report.STANDARD,
    order=['b', 'a'],
  )
  rows = text.splitlines()
  # Last 5 of 0.1..0.6 average 0.4 (0.6 with +0.2); samples 100 and 300.
  assert rows[2].startswith('| b | 1 | 0.250 ± 0.000 | 50 ± 0 |')
  assert rows[3] == (
    '| a | 2 | 0.500 ± 0.141 | 200 ± 141 | 0.500 ± 0.000 | 0.300 ± 0.000 '
    '| +0.150 ± 0.071 |'
  )
  for plot in report.REWARD_CURVES:
    assert (tmp_path / 'out' / f'{plot}.png').stat().st_size > 1000
  assert (tmp_path / 'out' / 't.md').read_text().startswith('# t\n\n| variant |')


def test_main_job_tables_by_hand(tmp_path):
  """Greedy/sampled before, after, gain; totals; and the per-level tables."""
  for seed, (greedy, sampled, lv3) in enumerate(
    (((0.1, 0.3), (0.05, 0.15), (0.0, 0.4)), ((0.2, 0.6), (0.1, 0.1), (0.2, 0.4)))
  ):
    wd = tmp_path / f'balance_s{seed}'
    with metrics_lib.MetricsWriter(str(wd), tensorboard=False) as w:
      for step in (1, 2):
        row = {'samples_drawn': 100 * step, 'time_step_s': 1.5}
        w.write(step, {**row, 'eval_accuracy': 0.5} if step == 1 else row)

    def when(i, greedy=greedy, sampled=sampled, lv3=lv3):
      return {
        'eval_accuracy': greedy[i],
        'eval_sampled_accuracy': sampled[i],
        'eval_accuracy_by_level': {'0': 1.0, '3': lv3[i]},
        'eval_sampled_accuracy_by_level': {'0': 0.5, '3': lv3[i] / 2},
      }

    summary = {'before_rl': when(0), 'after_rl': when(1)}
    (wd / 'summary.json').write_text(json.dumps(summary))
  module = sweep.load_module(_path('main_job'))
  text = module.EXPERIMENT.analyze(
    {p.name: str(p) for p in tmp_path.iterdir()}, str(tmp_path / 'out')
  )
  main, greedy, sampled = (
    [r for r in t.splitlines() if r.startswith('| balance')]
    for t in text.split('\n\n')
    if t.startswith('| variant')
  )
  cells = main[0].strip('| ').split(' | ')
  # greedy before/after/gain, sampled before/after/gain, zero-adv (not
  # logged: n/a), samples/step (150), samples in all (300), RL wall s (3).
  assert cells[1:] == [
    '2',
    '0.150 ± 0.071',
    '0.450 ± 0.212',
    '+0.300 ± 0.141',
    '0.075 ± 0.035',
    '0.125 ± 0.035',
    '+0.050 ± 0.071',
    'n/a',
    '150 ± 0',
    '300 ± 0',
    '3 ± 0',
  ]
  # Held-out accuracy per sample drawn: before RL at 0, the step-1
  # evaluation after 100 samples, after RL at 300 (seed means).
  xs, mean, _ = report.curve(
    report.load({p.name: str(p) for p in tmp_path.iterdir() if p.name != 'out'})[
      'balance'
    ],
    'samples',
    'eval_accuracy',
  )
  assert xs == [0, 100, 300] and mean == pytest.approx([0.15, 0.5, 0.45])
  assert (tmp_path / 'out' / 'heldout_vs_samples.png').stat().st_size > 1000
  # L0 before/after, L1 (absent: n/a), L2 (n/a), L3 before/after.
  g = greedy[0].strip('| ').split(' | ')[2:]
  assert g[:2] == ['1.000 ± 0.000'] * 2 and g[2:6] == ['n/a'] * 4
  assert g[6:] == ['0.100 ± 0.141', '0.400 ± 0.000']
  assert sampled[0].strip('| ').split(' | ')[-2:] == ['0.050 ± 0.071', '0.200 ± 0.000']


@pytest.fixture(scope='module')
def real_run(tmp_path_factory):
  """exit_rule's seed-0 warm start and balance run, shrunk to seconds.

  The configs come from the sweep's own expansion, plus overrides that
  shrink them (8 prompts, 64 slots, 2 SFT and 2 RL steps, the shapes of
  tests/test_train.py, so the compile cache is shared).
  """
  root = tmp_path_factory.mktemp('sweeps')
  data_dir = tmp_path_factory.mktemp('tfds')
  shrink = {
    'data.data_dir': str(data_dir),
    'mesh.data': 2,
    'mesh.fsdp': 2,
    'mesh.tensor': 2,
    'rl.prompts_per_step': 8,
    'rl.slots': 64,
    'rl.mini_batch_rows': 32,
    'rl.micro_batch_rows': 16,
    'rl.eval_max_prompts': 8,
    'rl.histogram_prompts': 8,
    'rl.histogram_k': 2,
    'sft.steps': 2,
    'sft.batch_size': 8,
    'verifier.workers': 1,
    'log.tensorboard': False,
  }
  runs = sweep.expand(_path('exit_rule'), root=str(root), extra=shrink, check=False)
  warm = next(r for r in runs if r.name == 'sft_s0')
  balance = next(r for r in runs if r.name == 'balance_s0')
  summaries = {}
  for run, steps in ((warm, ()), (balance, ('--config.rl.steps=2',))):
    c = sweep.build_config(run.config, (*run.overrides, *steps))
    from_config.validate(c)
    summaries[run.name] = fit_lib.fit(from_config.trainer(c, run.workdir))
  return {
    'warm': warm.workdir,
    'warm_run': warm,
    'run': balance.workdir,
    'summaries': summaries,
  }


def test_warm_start_run_counts_as_finished(real_run):
  assert sweep._finished(real_run['warm'])  # --run skips it in later sweeps.
  # ... since its saved config.json is the one the sweep builds, exactly.
  assert sweep.config_mismatch(real_run['warm_run']) == []
  assert metrics_lib.read_rows(real_run['warm'], phase='rl') == []
  rows = metrics_lib.read_rows(real_run['run'])
  assert [r['phase'] for r in rows] == ['rl', 'rl']  # SFT came from the warm start.
  assert 'after_rl' in real_run['summaries']['balance_s0']


@pytest.mark.parametrize('name', EXPERIMENTS)
def test_analyze_real_run_metrics(name, real_run, tmp_path):
  module = sweep.load_module(_path(name))
  folder = tmp_path / name
  for variant in module.EXPERIMENT.variants:
    for seed in (0, 1):
      shutil.copytree(
        real_run['run'],
        folder / f'{variant}_s{seed}',
        ignore=shutil.ignore_patterns('checkpoints', 'tfds'),
      )
  module.EXPERIMENT.main(['--root', str(tmp_path), '--out', str(tmp_path / 'out')])
  text = (tmp_path / 'out' / f'{name}.md').read_text()
  tables = text.split('\n\n')
  table = next(t for t in tables if t.startswith('| variant'))
  rows = [line for line in table.splitlines() if line.startswith('| ')][1:]
  assert [r.split(' | ')[0][2:] for r in rows] == list(module.EXPERIMENT.variants)
  for row in rows:
    cells = row.strip('| ').split(' | ')[1:]
    assert cells[0] == '2'
    assert all(re.fullmatch(r'[+-]?\d+(\.\d+)? ± \d+(\.\d+)?', c) for c in cells[1:]), (
      row
    )
  for plot in module.EXPERIMENT.curves:
    assert (tmp_path / 'out' / f'{plot}.png').stat().st_size > 1000


# The TPU grid: model, pod and seeds as arguments; each distinct run once.


def test_tpu_grid_takes_model_pod_and_seeds(monkeypatch, capsys):
  monkeypatch.chdir(ROOT)
  grid = {'model': 'qwen25_math_7b', 'pod': 'v6e-64', 'seeds': (0, 1)}
  runs = sweep.expand(_path('exit_rule'), root='gs://b/ada', local=False, grid=grid)
  variants = sweep.load_module(_path('exit_rule')).EXPERIMENT.variants
  assert len(runs) == 2 * len(variants)
  for run in runs:
    assert run.config.startswith('configs/qwen25_math_7b.py:')
    assert 'tpu=v6e-64' in run.config and run.workdir.startswith('gs://b/ada/tpu_runs/')
  assert {sweep.build_config(r.config, r.overrides).seed for r in runs} == {0, 1}
  with pytest.raises(SystemExit):
    sweep.main([_path('exit_rule'), '--tpu', 'p', '--workdir-root', 'gs://b/x',
                '--model', 'nope'])  # fmt: skip
  assert 'no configs/nope.py' in capsys.readouterr().err


def test_a_run_shared_by_experiments_has_one_workdir(monkeypatch):
  """The same settings in two experiments: one workdir, so it runs once."""
  monkeypatch.chdir(ROOT)
  by_workdir, total = {}, 0
  for name in EXPERIMENTS:
    for run in sweep.expand(_path(name), root='gs://b/ada', local=False, check=False):
      total += 1
      same = by_workdir.setdefault(run.workdir, run)
      assert (same.config, same.overrides) == (run.config, run.overrides)
  assert len(by_workdir) < total  # The default balance run is in every grid.
  by_settings = {(r.config, r.overrides) for r in by_workdir.values()}
  assert len(by_settings) == len(by_workdir)  # Distinct settings, distinct dirs.


def test_job_exit_code_from_status():
  line = 'w{}: code abc, {} (tiny.x): last'
  assert sweep.job_exit_code(line.format(0, 'running pid 5')) is None
  finished = [line.format(w, 'exit 0: finished') for w in range(4)]
  assert sweep.job_exit_code('\n'.join(finished)) == 0
  failed = [*finished[:3], line.format(3, 'failed (exit 1): see logs')]
  assert sweep.job_exit_code('\n'.join(failed)) == 1
  stopped = [line.format(w, 'exit 75: stopped after a checkpoint') for w in range(2)]
  assert sweep.job_exit_code('\n'.join(stopped)) == 75


@pytest.mark.parametrize(('state', 'code'), [('failed (exit 2): see logs', 1),
                                             ('exit 75: stopped after a checkpoint', 75),
                                             ('exit 73: busy: another', 1)])  # fmt: skip
def test_tpu_sweep_stops_on_a_job_that_did_not_finish(
  experiment, tmp_path, capsys, state, code
):
  calls = []
  runner = _status_runner(calls, state)
  runs = sweep.expand(experiment, root=str(tmp_path))
  assert sweep.run_all(runs, tpu='pod', runner=runner, poll_s=0) == code
  assert len(calls) == 2  # The first run's launch and status; nothing after.
  out, err = capsys.readouterr()
  if code == 1:
    assert err.startswith(
      f'sweep: error: run {runs[0].name} ({runs[0].workdir}) on pod'
    )
    assert re.search(r'exit (2|73): ', err)
  else:
    assert 'stopped after a checkpoint on pod: resumable' in out


def test_tpu_sweep_skips_finished_runs_on_gs(experiment, gcs_dir):
  """A finished run on gs:// (the emulator) is skipped, not started again."""
  from ada_jax.infra import storage

  runs = sweep.expand(experiment, root=gcs_dir)[:2]
  done = storage.path(runs[0].workdir)
  done.mkdir(parents=True, exist_ok=True)
  (done / 'summary.json').write_text('{"after_rl": {}}')
  config = metrics_lib.config_json(
    sweep.build_config(runs[0].config, runs[0].overrides)
  )
  (done / run_dir.CONFIG_FILE).write_text(json.dumps(config))
  calls = []
  runner = _status_runner(calls)
  assert sweep.run_all(runs, tpu='pod', runner=runner, poll_s=0) == 0
  launched = [c for c in calls if 'run' in c]
  assert len(launched) == 1 and f'{runs[1].workdir}' in launched[0]


def test_report_reads_each_run_s_eval_json(tmp_path):
  """The benchmark table: Ave@k / pass@k per grader, seed mean, latest step."""

  def report_of(ada, ref, step):
    def grader(ave, pass_k):
      return {'ave_at_k': ave, 'pass_at': {'1': ave, '4': pass_k}}

    return {
      'k': 4, 'step': step, 'graders': ['ada', 'reference'],
      'paper_graders': 'reference', 'weighted': grader(*ada),
      'weighted_by_grader': {'ada': grader(*ada), 'reference': grader(*ref)},
    }  # fmt: skip

  steps = [0.1, 0.2]
  for name, ada, ref in (
    ('a_s0', (0.5, 0.7), (0.6, 0.8)),
    ('a_s1', (0.3, 0.5), (0.4, 0.6)),
  ):
    wd = tmp_path / name
    _write_run(wd, steps, [10, 10])
    old = wd / 'eval' / 'step_1'  # An older kept step: not the one read.
    old.mkdir(parents=True)
    (old / 'eval.json').write_text(json.dumps(report_of((0.0, 0.0), (0.0, 0.0), 1)))
    new = wd / 'eval' / 'step_20'
    new.mkdir()
    (new / 'eval.json').write_text(json.dumps(report_of(ada, ref, 20)))
  _write_run(tmp_path / 'b_s0', steps, [10, 10])  # No eval.json: n/a.
  workdirs = {p.name: str(p) for p in tmp_path.iterdir()}
  text = report.report(
    workdirs, str(tmp_path / 'out'), name='t', curves={}, columns=report.STANDARD
  )
  table = text.split("Benchmarks (each run's eval.json, weighted over its sets)")[1]
  assert (
    '| variant | seeds | Ave@4 (ada) | pass@4 (ada) | Ave@4 (reference, paper) '
    '| pass@4 (reference, paper) |'
  ) in table
  assert (
    '| a | 2 | 0.400 ± 0.141 | 0.600 ± 0.141 | 0.500 ± 0.141 | 0.700 ± 0.141 |' in table
  )
  assert '| b | 1 | n/a | n/a | n/a | n/a |' in table
