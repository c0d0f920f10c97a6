"""The trainer end to end on the tiny config (issue 7's acceptance tests).

Config errors; a 2-step run on a (2,2,2) mesh of 8 fake CPU devices;
SIGTERM during a step's sampling or its update -> checkpoint of the last
completed step -> resume, ending like an uninterrupted run; SIGTERM where the
write does not fit the preemption notice -> no checkpoint; checkpoints by
time on a fake clock; an injected NaN skipping the update; no backend compile after the first RL step
for every rule and schedule. Runs are shrunk with config overrides (fewer
prompts and slots, 2-3 RL steps, a few eval prompts) and all use the same
mesh and shapes where they can, so that compiled programs are shared.
"""

import dataclasses
import importlib.util
import itertools
import json
import os
import pathlib
import signal
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ada_jax import adaptive, data, from_config, verifier
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.infra import compiles
from ada_jax.infra import metrics as metrics_lib
from ada_jax.planner import checkpoint_time
from ada_jax.rl import fit as fit_lib
from ada_jax.rl import trainer as trainer_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Timings and compile counts differ between a run and its resumed twin.
_UNSTABLE = ('time_', 'tokens_per_s', 'num_compiles')


def _config_module():
  spec = importlib.util.spec_from_file_location(
    'tiny_arith_config', ROOT / 'configs' / 'tiny_arith.py'
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_TINY = _config_module()


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """One TFDS data dir for the session: ada_arith is generated once."""
  return str(tmp_path_factory.mktemp('tfds'))


def tiny_config(data_dir: str, arg: str = '', **rl):
  """The tiny config on a (2,2,2) mesh, shrunk 4x, 3 RL steps, no SFT.

  The format task (ada_arith) unless `arg` names another `task=`.
  """
  c = _TINY.get_config(arg if 'task=' in arg else ','.join(('task=format', arg)))
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 2, 2, 2
  c.data.data_dir = data_dir
  c.rl.prompts_per_step //= 4
  c.rl.slots //= 4
  c.rl.target_groups //= 4
  rows = adaptive.max_rows(
    c.rl.prompts_per_step,
    rule=c.rl.rule,
    group_size=c.rl.group_size,
    slots=c.rl.slots,
    target_groups=c.rl.target_groups or None,
  )
  c.rl.mini_batch_rows, c.rl.micro_batch_rows = rows, rows // 2
  c.rl.steps, c.rl.eval_every, c.rl.eval_max_prompts = 3, 2, 8
  c.rl.lr_schedule = 'constant'  # A cosine over 3 steps ends at lr 0.
  c.rl.histogram_prompts, c.rl.histogram_k = 8, 2
  c.sft.steps = 0
  c.verifier.workers = 1
  c.checkpoint.every = 100
  c.log.tensorboard = False
  for key, value in rl.items():
    c.rl[key] = value
  return c


def hash_verify(responses, references, *, timeout_s=2.0, workers=None):
  """A fast deterministic stand-in for the verifier: mixed 0/1 rewards."""
  del timeout_s, workers
  return np.array(
    [
      zlib.crc32(f'{r}|{f}'.encode()) % 2 == 0
      for r, f in zip(responses, references, strict=True)
    ]
  )


def host(tree):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def same_params(a, b) -> bool:
  return all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@dataclasses.dataclass
class Run:
  trainer: trainer_lib.Trainer
  summary: dict
  rows: list[dict]
  params_before: list[np.ndarray]
  params_after: list[np.ndarray]
  step_params: dict[int, tuple[list[np.ndarray], list[np.ndarray]]]
  compiles_after_step1: int | None


def run(c, workdir, *, verify_fn=hash_verify, trainer_hook=None) -> Run:
  """build_trainer + fit, recording params around each RL step."""
  from_config.validate(c)
  trainer = from_config.trainer(c, str(workdir), verify_fn=verify_fn)
  if trainer_hook is not None:
    trainer_hook(trainer)
  before = host(trainer.state)
  step_params, marks = {}, {}
  rl_step = trainer.rl_step

  def recorded_step():
    p0 = host(trainer.state)
    row = rl_step()
    step_params[trainer.step] = (p0, host(trainer.state))
    marks[trainer.step] = compiles.num_compiles()
    return row

  trainer.rl_step = recorded_step
  summary = fit_lib.fit(trainer)
  rows = metrics_lib.read_rows(workdir, phase='rl')
  return Run(
    trainer,
    summary,
    rows,
    before,
    host(trainer.state),
    step_params,
    marks.get(1),
  )


# Item 9: config errors, each naming the key.


@pytest.mark.parametrize(
  'arg, edit, key',
  [
    ('', lambda c: setattr(c.rl, 'slots', 62), 'rl.slots'),
    ('', lambda c: setattr(c.rl, 'group_size', 3), 'rl.group_size'),
    ('', lambda c: setattr(c.rl, 'rule', 'ppo'), 'rl.rule'),
    ('', lambda c: setattr(c.rl, 'schedule', 'greedy'), 'rl.schedule'),
    ('', lambda c: setattr(c.rl, 'lr_schedule', 'linear'), 'rl.lr_schedule'),
    ('', lambda c: setattr(c.sft, 'lr_schedule', 'cos'), 'sft.lr_schedule'),
    ('', lambda c: setattr(c.sft, 'boxed_share', 0.0), 'sft.boxed_share'),
    ('', lambda c: setattr(c.sampling, 'max_new_tokens', 60), 'max_new_tokens'),
    # 2 rows of a micro-batch over 4 row shards (data 2 x fsdp 2).
    ('', lambda c: setattr(c.rl, 'micro_batch_rows', 2), 'rl.micro_batch_rows'),
    (
      'variant=pos',
      lambda c: setattr(c.rl, 'samples_per_round', 2),
      'rl.samples_per_round',
    ),
  ],
  ids=[
    'slots_dp',
    'odd_group_balance',
    'rule',
    'schedule',
    'lr_schedule',
    'sft_lr_schedule',
    'sft_boxed_share',
    'length',
    'micro_dp',
    'spr',
  ],
)
def test_config_error_names_key(data_dir, arg, edit, key):
  c = tiny_config(data_dir, arg)
  from_config.validate(c)  # The shrunk config itself is valid.
  edit(c)
  with pytest.raises(ValueError, match=key.replace('.', r'\.')):
    from_config.validate(c)


def test_config_error_hosts(data_dir, monkeypatch):
  c = tiny_config(data_dir)
  monkeypatch.setattr(jax, 'process_count', lambda: 3)
  with pytest.raises(ValueError, match=r'rl\.prompts_per_step'):
    from_config.validate(c)


def test_odd_group_size_is_fine_outside_balance(data_dir):
  c = tiny_config(data_dir, 'variant=pos')
  c.rl.group_size = 3
  c.rl.mini_batch_rows = c.rl.micro_batch_rows = c.rl.prompts_per_step * 3
  from_config.validate(c)


# A 2-step run on a (2,2,2) mesh with the real verifier.


def test_two_step_run_on_2x2x2_mesh(data_dir, tmp_path, capsys):
  calls = []

  def real_verify(responses, references, **kw):
    # The real verifier pool scores every response; the hash bit on top keeps
    # the rewards mixed whatever the (short) warm start left the policy at,
    # so that the advantages, hence the update, are not all zero.
    real = verifier.verify_batch(responses, references, **kw)
    calls.append(real)
    return real | hash_verify(responses, references)

  # The columns task: its worked-solution teacher and its evaluation by level.
  c = tiny_config(data_dir, 'task=columns', steps=2, eval_every=0, warmup=2)
  c.sft.steps, c.sft.warmup, c.sft.lr_schedule = 4, 0, 'cosine'
  c.rl.eval_max_prompts, c.rl.eval_sampled_k = 16, 2
  verifier_calls = verifier.counters()['calls']
  r = run(c, tmp_path / 'wd', verify_fn=real_verify)
  assert calls and all(x.dtype == bool for x in calls)
  assert verifier.counters()['calls'] > verifier_calls
  sft_rows = metrics_lib.read_rows(tmp_path / 'wd', phase='sft')
  assert [row['step'] for row in sft_rows] == [4]
  assert sft_rows[0]['lr'] == 0.0  # cosine reaches 0 at the last SFT step
  mesh = r.trainer.mesh
  assert dict(mesh.shape) == {'data': 2, 'fsdp': 2, 'tensor': 2}
  assert [row['step'] for row in r.rows] == [1, 2]
  for row in r.rows:
    missing = set(metrics_lib.RL_KEYS) - set(row)
    assert not missing, missing
    assert row['phase'] == 'rl'
    assert row['skipped_updates'] == 0
    assert np.isfinite(row['loss']) and np.isfinite(row['grad_norm'])
  # Warmup from 0: step 1 takes no step, step 2 does.
  assert r.rows[0]['lr'] == 0.0 and r.rows[1]['lr'] == pytest.approx(c.rl.lr / 2)
  assert r.rows[1]['zero_adv_frac'] < 1, r.rows[1]
  assert same_params(*r.step_params[1])
  assert not same_params(*r.step_params[2])
  assert not same_params(r.params_before, r.params_after)
  assert r.summary['steps'] == 2
  assert r.summary['verifier_backend'] == 'ada'
  for part in ('before_rl', 'after_rl'):
    # (The hash bit rewards unboxed answers too: no order between the two.)
    assert {'eval_accuracy', 'eval_boxed_frac'} <= set(r.summary[part])
    # Levels are carries (the first 16 held-out problems have none).
    by_level = r.summary[part]['eval_sampled_accuracy_by_level']
    assert set(by_level) == set(r.summary[part]['eval_accuracy_by_level'])
    assert 0 <= r.summary[part]['eval_sampled_accuracy'] <= 1
  assert (tmp_path / 'wd' / 'by_level.png').exists()
  assert (tmp_path / 'wd' / 'pass_rates.png').exists()
  samples = (tmp_path / 'wd' / 'samples.jsonl').read_text().splitlines()
  assert samples and all(json.loads(x)['verifier_backend'] == 'ada' for x in samples)
  # Output redirected to a file (capsys: not a terminal) holds plain
  # progress lines, no carriage-return redraws.
  out, err = capsys.readouterr()
  assert '\r' not in out + err
  assert f'rl/{c.rl.rule}: step 2/2 (100%)' in err
  assert 'sft: step 4/4 (100%)' in err


# SIGTERM, checkpoint, resume; equality with an uninterrupted run.


@pytest.fixture(scope='module')
def full_run(data_dir, tmp_path_factory):
  """3 RL steps, not interrupted."""
  return run(tiny_config(data_dir), tmp_path_factory.mktemp('full'))


@pytest.fixture(scope='module')
def preempted_run(data_dir, tmp_path_factory):
  """The same run, SIGTERM'd during step 2's sampling, then resumed."""
  workdir = tmp_path_factory.mktemp('preempted')
  holder = {}

  def verify_and_kill(responses, references, **kw):
    t = holder.get('trainer')
    if t is not None and t.step == 2 and not holder.get('sent'):
      holder['sent'] = True
      os.kill(os.getpid(), signal.SIGTERM)
    return hash_verify(responses, references, **kw)

  first = run(
    tiny_config(data_dir),
    workdir,
    verify_fn=verify_and_kill,
    trainer_hook=lambda t: holder.update(trainer=t),
  )
  steps_after_first = first.trainer.ckpt.steps()
  resumed = run(tiny_config(data_dir), workdir)
  return first, steps_after_first, resumed


def test_sigterm_during_sampling_saves_the_last_completed_step(preempted_run):
  first, steps_after_first, resumed = preempted_run
  # Step 2's sampling stopped at the next round (or its end), without the
  # update: step 1, the last completed, saved at once.
  assert first.summary['preempted_at'] == 1 and first.summary['preempted_saved']
  assert first.trainer.step == 1 and sorted(first.step_params) == [1]
  assert steps_after_first == [1]
  assert [row['step'] for row in first.rows] == [1]
  assert 'after_rl' not in first.summary
  # Resumed from step 1 and ran steps 2 and 3.
  assert sorted(resumed.step_params) == [2, 3]
  assert same_params(resumed.params_before, first.params_after)
  assert [row['step'] for row in resumed.rows] == [1, 2, 3]
  assert resumed.summary['steps'] == 3 and 'preempted_at' not in resumed.summary
  assert 3 in resumed.trainer.ckpt.steps()


def _stable(row):
  return {k: v for k, v in row.items() if not k.startswith(_UNSTABLE)}


def assert_same_run(a: Run, b: Run) -> None:
  """Same metrics rows (timings and compile counts aside) and final params."""
  assert len(a.rows) == len(b.rows)
  for x, y in zip(a.rows, b.rows, strict=True):
    x, y = _stable(x), _stable(y)
    assert x.keys() == y.keys()
    for k in x:
      if isinstance(x[k], str):
        assert x[k] == y[k], (x['step'], k)
      else:
        assert np.allclose(x[k], y[k], rtol=1e-5, atol=1e-6), (x['step'], k, x[k], y[k])
  for x, y in zip(a.params_after, b.params_after, strict=True):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


def test_kill_and_resume_equals_uninterrupted(full_run, preempted_run):
  _, _, resumed = preempted_run
  assert len(full_run.rows) == 3
  assert_same_run(full_run, resumed)
  assert not same_params(full_run.params_before, full_run.params_after)
  for part in ('before_rl', 'after_rl'):
    assert json.dumps(full_run.summary[part]) == json.dumps(resumed.summary[part])


def _sigterm_in_update(step):
  """A trainer hook: SIGTERM while step `step`'s update runs (from its batch).

  The save of an earlier step, if any, has finished by then (as it has on a
  pod, a step later), so the step a run resumes from is exact.
  """

  def hook(trainer):
    def batch_hook(at, batch):
      if at == step:
        trainer.ckpt.wait()
        os.kill(os.getpid(), signal.SIGTERM)  # Handled before the update returns.
      return batch

    trainer.batch_hook = batch_hook

  return hook


def test_sigterm_during_update_saves_that_step_and_resumes(
  data_dir, full_run, tmp_path
):
  events = []

  def hook(trainer):
    _sigterm_in_update(2)(trainer)
    evaluate, save = trainer.evaluate, trainer.ckpt.save
    trainer.evaluate = lambda **kw: events.append('evaluate') or evaluate(**kw)
    trainer.ckpt.save = lambda step, **kw: (
      events.append(('save', step, kw['force'])) or save(step, **kw)
    )

  first = run(tiny_config(data_dir), tmp_path, trainer_hook=hook)
  # The update finished and its step was saved at once: the evaluation due
  # at step 2 (eval_every=2) skipped, as it could outlast the notice.
  assert first.summary['preempted_at'] == 2 and first.summary['preempted_saved']
  assert sorted(first.step_params) == [1, 2] and first.trainer.ckpt.steps() == [2]
  # (The first evaluation is the one before RL.)
  assert events == ['evaluate', ('save', 1, False), ('save', 2, True)]
  assert [row['step'] for row in first.rows] == [1, 2]
  assert 'eval_accuracy' not in first.rows[1]
  resumed = run(tiny_config(data_dir), tmp_path)
  assert sorted(resumed.step_params) == [3]
  full_rows = [dict(r) for r in full_run.rows]
  for key in [k for k in full_rows[1] if k.startswith('eval_')]:
    del full_rows[1][key]
  assert_same_run(dataclasses.replace(full_run, rows=full_rows), resumed)


def test_sigterm_when_the_write_misses_the_notice_exits_without_saving(
  data_dir, full_run, tmp_path, monkeypatch, capsys
):
  # No notice at all: no write fits it (the run reads the plan's figures).
  monkeypatch.setattr(checkpoint_time, 'PREEMPTION_NOTICE_S', 0.0)
  c = tiny_config(data_dir)
  c.checkpoint.every = 1
  first = run(c, tmp_path, trainer_hook=_sigterm_in_update(2))
  assert not first.trainer.ckpt.save_on_preemption
  # Step 2 finished but is not saved: the run stopped at its boundary.
  assert first.trainer.ckpt.steps() == [1]
  assert first.summary['preempted_at'] == 2
  assert not first.summary['preempted_saved'] and first.summary['resumes_from'] == 1
  assert [row['step'] for row in first.rows] == [1, 2]
  out = capsys.readouterr().out
  assert out.splitlines()[-1] == (
    'preempted: exiting without a checkpoint; the run resumes from step 1'
  )
  monkeypatch.undo()
  resumed = run(c, tmp_path)  # Step 2 again (its row replaced), then 3.
  assert sorted(resumed.step_params) == [2, 3]
  assert_same_run(full_run, resumed)


def test_checkpoints_by_time_on_a_fake_clock(data_dir, tmp_path):
  c = tiny_config(data_dir)
  c.checkpoint.every, c.checkpoint.every_minutes = 100, 1.0
  decided = {}

  def fake_clock(trainer):
    # 40 s per RL step: 60 s have passed after step 2 (a save; the clock
    # restarts), not after steps 1 or 3 (40 s since the last save).
    trainer.ckpt.clock = lambda: 40.0 * trainer.step
    save = trainer.ckpt.save

    def recorded(step, **kw):
      started = save(step, **kw)
      if not kw.get('force'):
        decided[step] = started
      return started

    trainer.ckpt.save = recorded

  r = run(c, tmp_path, trainer_hook=fake_clock)
  assert decided == {1: False, 2: True, 3: False}
  assert r.summary['steps'] == 3  # And the end of the run, forced: step 3.
  assert r.trainer.ckpt.steps() == [3]  # A time-based save is kept while newest.


def test_evaluate_counts_boxed_answers(full_run, monkeypatch):
  # The real evaluation path (sampler, decode, verify, gather), with canned
  # decoded responses: right or wrong, boxed or bare, a box left unclosed.
  texts = ['\\boxed{3}', '3', '\\boxed{4', 'so \\boxed{5}']
  calls = itertools.count()
  monkeypatch.setattr(
    tokenizer_lib.Tokenizer, 'decode', lambda self, ids, **kw: texts[next(calls) % 4]
  )
  t = full_run.trainer
  monkeypatch.setattr(
    t,
    'scorer',
    dataclasses.replace(
      t.scorer,
      verify_fn=lambda responses, refs, **kw: np.array(
        [r == texts[0] for r in responses]
      ),
    ),
  )
  result = t.evaluate()
  n = next(calls)  # One decode per evaluated problem (greedy, k=1).
  assert n == len(t.eval_examples[: t.rl.eval_max_prompts or None]) > 4
  seen = [texts[i % 4] for i in range(n)]
  assert result == {
    'eval_accuracy': pytest.approx(seen.count(texts[0]) / n),
    'eval_boxed_frac': pytest.approx(
      sum(verifier.extract(x) is not None for x in seen) / n
    ),
  }
  assert 0 < result['eval_accuracy'] < result['eval_boxed_frac'] < 1


def test_sigterm_during_sft_stops_it_and_resume_reruns_it(data_dir, tmp_path):
  c = tiny_config(data_dir, steps=1)
  c.sft.steps, c.sft.batch_size = 75, 8

  def kill_on_first_sft_row(trainer):
    write = trainer.writer.write

    def write_and_kill(step, row, phase):
      write(step, row, phase=phase)
      if phase == 'sft' and step == 25:
        os.kill(os.getpid(), signal.SIGTERM)

    trainer.writer.write = write_and_kill

  first = run(c, tmp_path, trainer_hook=kill_on_first_sft_row)
  # Stopped at the next check (step 50) without writing it, and saved nothing.
  assert first.summary['preempted_at'] == 0 and not first.trainer.sft_done
  sft_rows = metrics_lib.read_rows(tmp_path, phase='sft')
  assert [r['step'] for r in sft_rows] == [25]
  assert first.trainer.ckpt.steps() == [] and first.rows == []
  resumed = run(c, tmp_path)
  assert resumed.trainer.sft_done and resumed.summary['steps'] == 1
  assert 'preempted_at' not in resumed.summary


def test_sft_share_keeps_sft_and_rl_problems_apart(data_dir, tmp_path):
  c = tiny_config(data_dir)
  c.data.levels, c.data.sft_share, c.data.balance_levels = '0,1,4-7', 0.5, True
  t = from_config.trainer(c, str(tmp_path), verify_fn=hash_verify)
  sft = {e.prompt_key for e in t.sft_examples}
  rl = {e.prompt_key for e in t.train_examples}
  assert sft and rl and not sft & rl
  assert abs(len(sft) - len(rl)) <= 6  # Half of each level, rounded.
  for ex in (t.sft_examples, t.train_examples, t.eval_examples):
    assert {e.level for e in ex} == {0, 1, 4, 5, 6, 7}
  # Balanced: 1d+1d (80 train problems) as often as 2d+1d (hundreds).
  counts = data.level_histogram(t.train_examples)
  assert max(counts.values()) < 1.2 * min(counts.values())


def test_levels_that_keep_nothing_name_the_key(data_dir, tmp_path):
  c = tiny_config(data_dir)
  c.data.levels = '20-30'
  with pytest.raises(ValueError, match=r'data\.levels.*its levels: \[0, 1, 2'):
    from_config.trainer(c, str(tmp_path), verify_fn=hash_verify)


# A shared warm start: model.init_from.


def test_init_from_sft_run_equals_doing_the_sft(data_dir, tmp_path):
  def config(**edits):
    c = tiny_config(data_dir, steps=1)
    c.sft.steps, c.sft.batch_size = 3, 8
    for key, value in edits.items():
      c.model[key] = value
    return c

  own = run(config(), tmp_path / 'own')
  warm = config()
  warm.rl.steps = 0
  sft_only = run(warm, tmp_path / 'sft_only')
  shared = run(config(init_from=str(tmp_path / 'sft_only')), tmp_path / 'shared')
  # The warm start's SFT params, not a fresh init, and no second SFT.
  assert same_params(shared.params_before, sft_only.params_after)
  assert not any(
    r['phase'] == 'sft' for r in metrics_lib.read_rows(tmp_path / 'shared')
  )
  assert len(own.rows) == 1
  assert_same_run(own, shared)
  with pytest.raises(ValueError, match=r'model\.init_from'):
    from_config.validate(config(init_from=str(tmp_path / 'missing')))


# An injected NaN skips the update.


def test_injected_nan_skips_the_update(data_dir, tmp_path):
  def poison(step, batch):
    if step == 2:
      adv = batch['advantages']
      # Same sharding as the real advantages: the poison adds no compile.
      nan = jax.device_put(np.full(adv.shape, np.nan, adv.dtype), adv.sharding)
      batch = dict(batch, advantages=nan)
    return batch

  r = run(
    tiny_config(data_dir, eval_every=0, warmup=0),
    tmp_path / 'wd',
    trainer_hook=lambda t: setattr(t, 'batch_hook', poison),
  )
  skipped = {row['step']: row['skipped_updates'] for row in r.rows}
  assert skipped[2] > 0 and skipped[1] == skipped[3] == 0, skipped
  assert same_params(*r.step_params[2])
  assert not same_params(*r.step_params[1])
  assert not same_params(*r.step_params[3])  # The run goes on.
  assert all(np.isfinite(p).all() for p in r.params_after)
  assert r.summary['steps'] == 3


# No backend compile after the first RL step, evaluation included.


@pytest.mark.parametrize(
  'arg',
  [
    'variant=grpo',
    'variant=dapo',
    'variant=est',
    'variant=pos,schedule=paper',
    'variant=pos,schedule=refill',
    'variant=balance,schedule=paper',
    'variant=balance,schedule=refill',
  ],
)
def test_no_compile_after_first_rl_step(data_dir, tmp_path, arg):
  r = run(tiny_config(data_dir, arg), tmp_path / 'wd')
  assert [row['step'] for row in r.rows] == [1, 2, 3]
  assert 'eval_accuracy' in r.rows[1]  # The evaluation at step 2 ran.
  first = r.compiles_after_step1
  assert r.rows[0]['num_compiles'] <= first
  late = compiles.compiled_names(first)
  assert not late, f'{arg}: compiled after step 1: {late}'
  assert r.rows[-1]['num_compiles'] == r.rows[0]['num_compiles']


def test_sampling_copy_is_in_the_compute_dtype(data_dir, tmp_path):
  # bf16 compute from fp32 master params (the paper configs): the trainer's
  # sampling copy holds the weights in bf16, its training params stay fp32.
  c = tiny_config(data_dir)
  c.model.dtype = 'bfloat16'
  from_config.validate(c)
  trainer = from_config.trainer(c, str(tmp_path / 'wd'), verify_fn=hash_verify)
  copy = nnx.state(trainer.sampling_model(), nnx.Param)
  for src, got in zip(
    jax.tree.leaves(trainer.state), jax.tree.leaves(copy), strict=True
  ):
    assert src.dtype == jnp.float32
    assert got.dtype == (jnp.bfloat16 if got.ndim >= 2 else jnp.float32)


def test_max_problem_tokens_filters_training_problems_only(data_dir, tmp_path, caplog):
  c = tiny_config(data_dir)
  tok = from_config.tokenizer(c)
  train, _, test = from_config._examples(c, str(tmp_path), tok)
  limit = sorted(len(tok.encode(e.problem)) for e in train)[len(train) // 2]
  c.data.max_problem_tokens = limit
  with caplog.at_level('WARNING'):
    kept, _, kept_test = from_config._examples(c, str(tmp_path), tok)
  assert 0 < len(kept) < len(train)
  assert all(len(tok.encode(e.problem)) <= limit for e in kept)
  assert kept_test == test  # Evaluation sets are never filtered.
  dropped = len(train) - len(kept)
  assert f'dropped {dropped} train problems longer than data.max_problem_tokens' in (
    caplog.text
  )
