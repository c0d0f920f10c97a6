"""Fault injection: a run never loses or corrupts what it wrote.

Runs the main job as a user would (`python -m ada_jax.main` in a subprocess,
the tiny config shrunk to seconds) and breaks it the ways real runs break:
SIGKILL at a seeded step of SFT and of RL, then resume; corrupt the latest
and then every checkpoint; a checkpoint save that fails (patched to raise,
and a real unwritable directory with root's override dropped); SIGTERM;
evaluate, export and select_prompts on a finished run and on one frozen
mid-write; bad config values, files and workdirs. Each checks what the run
left on disk: the (phase, step) keys of its rows once each and equal to an
uninterrupted run's, the summary, the exit code and a one-line error.

One uninterrupted reference run is shared by the module; every other run
starts from a copy of a workdir or shares its data dir and compile cache.
"""

import contextlib
import hashlib
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from ada_jax import evaluate, export, from_config, main, select_prompts
from ada_jax.infra import checkpoint as checkpoint_lib
from ada_jax.infra import exit_codes
from ada_jax.rl import fit as fit_lib

ROOT = pathlib.Path(__file__).resolve().parent.parent
# The format task (ada_arith), which the reference run and its figures use.
CONFIG = str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format'
# One shared reference run: pytest runs with --dist=loadfile (pyproject), so
# this module's tests share a worker and the run is made once.
# Fields that differ between a run and its interrupted-and-resumed twin.
TIMING = ('time_sample_s', 'time_verify_s', 'time_update_s', 'time_step_s')
UNSTABLE = (*TIMING, 'tokens_per_s', 'num_compiles')
_SEED = 20261201  # Picks the RL step the kill lands on.


def _overrides(data_dir: str, **extra) -> list[str]:
  """The tiny config shrunk to a few seconds: SFT rows at steps 25 and 50."""
  values = {
    'data.data_dir': data_dir,
    'sft.steps': 50,
    'sft.batch_size': 16,
    'rl.steps': 4,
    'rl.prompts_per_step': 8,
    'rl.slots': 64,
    'rl.mini_batch_rows': 32,
    'rl.micro_batch_rows': 16,
    'rl.eval_every': 2,
    'rl.eval_max_prompts': 16,
    'rl.histogram_prompts': 8,
    'rl.histogram_k': 2,
    'rl.lr_schedule': 'constant',
    'verifier.workers': 1,
    'verifier.timeout_s': 10.0,  # Loaded CI machines: no timeouts by accident.
    'checkpoint.every': 1,
    'checkpoint.keep': 3,
    **extra,
  }
  return [f'--config.{k}={v}' for k, v in values.items()]


def _env() -> dict[str, str]:
  # The session's compile cache, so subprocesses compile little.
  return dict(
    os.environ,
    JAX_COMPILATION_CACHE_DIR=str(ROOT / '.jax_cache'),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0',
    PYTHONUNBUFFERED='1',
  )


def _argv(workdir, overrides) -> list[str]:
  return [
    sys.executable,
    '-m',
    'ada_jax.main',
    f'--config={CONFIG}',
    f'--workdir={workdir}',
    *overrides,
  ]


def _drop_root() -> list[str]:
  """A prefix that makes file permissions bind (root ignores them).

  As root, `setpriv` drops the capabilities that override permissions
  (the process stays root, owner of its files); otherwise nothing is needed.
  """
  if os.geteuid() != 0:
    return []
  setpriv = shutil.which('setpriv')
  assert setpriv, 'running as root needs setpriv (util-linux) to drop overrides'
  return [setpriv, '--bounding-set=-dac_override,-dac_read_search,-fowner']


def run_main(workdir, overrides, *, timeout=300, prefix=()):
  """The main job to its end: (exit code, stdout, stderr)."""
  proc = subprocess.run(
    [*prefix, *_argv(workdir, overrides)],
    capture_output=True,
    text=True,
    env=_env(),
    timeout=timeout,
    check=False,
  )
  return proc.returncode, proc.stdout, proc.stderr


def _rows(workdir, name='metrics.jsonl'):
  path = pathlib.Path(workdir) / name
  if not path.exists():
    return []
  out = []
  for line in path.read_text().splitlines():
    # A killed process may leave a half-written last line.
    with contextlib.suppress(json.JSONDecodeError):
      out.append(json.loads(line))
  return out


def start_and_act(workdir, overrides, until, act, *, timeout=300):
  """Starts the main job; once `until(rows)` holds, `act(proc)`; returns proc.

  Polls metrics.jsonl as a watcher would; the run goes on meanwhile, so the
  action lands somewhere in the step after the one that made `until` true.
  """
  proc = subprocess.Popen(
    _argv(workdir, overrides),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=_env(),
  )
  deadline = time.monotonic() + timeout
  while not until(_rows(workdir)):
    if proc.poll() is not None:
      _, err = proc.communicate()
      pytest.fail(
        f'run ended (exit {proc.returncode}) before the fault:\n{err[-3000:]}'
      )
    if time.monotonic() > deadline:
      proc.kill()
      pytest.fail('timed out waiting for the fault point')
    time.sleep(0.05)
  act(proc)
  return proc


def keys(rows):
  return [(r['phase'], r['step']) for r in rows]


def assert_same_rows(got, want):
  """Same (phase, step) keys, once each, and equal fields but timings."""
  assert keys(got) == keys(want)
  assert len(set(keys(got))) == len(got)
  for a, b in zip(got, want, strict=True):
    a = {k: v for k, v in a.items() if k not in UNSTABLE}
    b = {k: v for k, v in b.items() if k not in UNSTABLE}
    assert a.keys() == b.keys(), (a['phase'], a['step'])
    for k in a:
      assert (
        np.allclose(a[k], b[k], rtol=1e-6, atol=0)
        if isinstance(a[k], float)
        else a[k] == b[k]
      ), (a['phase'], a['step'], k, a[k], b[k])


def assert_same_summary(got, want):
  for part in ('before_rl', 'after_rl'):
    assert got[part] == want[part], part
  assert got['steps'] == want['steps']
  assert 'preempted_at' not in got


def summary(workdir):
  return json.loads((pathlib.Path(workdir) / 'summary.json').read_text())


def tree_hashes(path) -> dict[str, str]:
  """sha256 of every file under `path` (and a marker per directory)."""
  out = {}
  for p in sorted(pathlib.Path(path).rglob('*')):
    rel = str(p.relative_to(path))
    out[rel] = 'dir' if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
  return out


@pytest.fixture(scope='module')
def data_dir(tmp_path_factory):
  """ada_arith built once for the module's runs."""
  from ada_jax import data

  path = tmp_path_factory.mktemp('tfds')
  for split in ('train', 'test'):
    data.load_examples('ada_arith', split, data_dir=str(path), template='tiny')
  return str(path)


@pytest.fixture(scope='module')
def reference(data_dir, tmp_path_factory):
  """The uninterrupted run: its workdir, rows, samples and summary."""
  wd = tmp_path_factory.mktemp('reference')
  code, out, err = run_main(wd, _overrides(data_dir))
  assert code == 0, err[-3000:]
  assert 'greedy test accuracy: before RL' in out
  return {
    'workdir': wd,
    'rows': _rows(wd),
    'samples': _rows(wd, 'samples.jsonl'),
    'summary': summary(wd),
    'stdout': out,
  }


def test_reference_run_has_each_phase(reference):
  assert keys(reference['rows']) == [('sft', 25), ('sft', 50)] + [
    ('rl', s) for s in range(1, 5)
  ]
  assert (reference['workdir'] / 'tb' / 'sft').is_dir()
  assert (reference['workdir'] / 'tb' / 'rl').is_dir()


# Item 1: a resume keeps the SFT curve (rows and TensorBoard).


def test_rerunning_a_finished_run_keeps_every_row(reference, data_dir, tmp_path):
  wd = tmp_path / 'run'
  shutil.copytree(reference['workdir'], wd)
  code, out, err = run_main(wd, _overrides(data_dir))
  assert code == 0, err[-3000:]
  assert 'resumed from step 4 of 4' in out
  assert_same_rows(_rows(wd), reference['rows'])
  assert sum(r['phase'] == 'sft' for r in _rows(wd)) == 2
  from tensorboard.backend.event_processing import event_accumulator

  for phase, tag, steps in (
    ('sft', 'sft/loss', [25, 50]),
    ('rl', 'rl/loss', [1, 2, 3, 4]),
  ):
    acc = event_accumulator.EventAccumulator(str(wd / 'tb' / phase))
    acc.Reload()
    assert [e.step for e in acc.Scalars(tag)] == steps, phase


# Item 2 of the fault list: SIGKILL mid-RL and mid-SFT, then resume.


def test_sigkill_during_rl_then_resume_equals_uninterrupted(
  reference, data_dir, tmp_path
):
  kill_after = random.Random(_SEED).choice([1, 2, 3])
  wd = tmp_path / 'run'
  proc = start_and_act(
    wd,
    _overrides(data_dir),
    lambda rows: ('rl', kill_after) in keys(rows),
    lambda p: p.send_signal(signal.SIGKILL),
  )
  proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL
  code, out, err = run_main(wd, _overrides(data_dir))
  assert code == 0, err[-3000:]
  assert 'resumed from step' in out
  assert_same_rows(_rows(wd), reference['rows'])
  assert keys(_rows(wd, 'samples.jsonl')) == keys(reference['samples'])
  assert_same_summary(summary(wd), reference['summary'])


def test_sigkill_during_sft_starts_over_cleanly(reference, data_dir, tmp_path):
  wd = tmp_path / 'run'
  proc = start_and_act(
    wd,
    _overrides(data_dir),
    lambda rows: ('sft', 25) in keys(rows),
    lambda p: p.send_signal(signal.SIGKILL),
  )
  proc.communicate(timeout=60)
  code, out, err = run_main(wd, _overrides(data_dir))
  assert code == 0, err[-3000:]
  assert 'starting' in out and 'over' in out and 'restarts/' in out
  assert_same_rows(_rows(wd), reference['rows'])
  (kept,) = (wd / 'restarts').iterdir()
  assert ('sft', 25) in keys(_rows(kept))  # The earlier rows, set aside whole.
  assert_same_summary(summary(wd), reference['summary'])


# Item 4: corrupt checkpoints; the last one, then all of them.


def _corrupt(step_dir: pathlib.Path) -> None:
  data = max(
    (p for p in step_dir.rglob('*') if p.is_file() and 'params' in p.parts),
    key=lambda p: p.stat().st_size,
  )
  raw = bytearray(data.read_bytes())
  for i in range(len(raw) // 2, len(raw) // 2 + 64):
    raw[i] ^= 0xFF
  data.write_bytes(bytes(raw))


def test_corrupt_latest_checkpoint_resumes_from_the_one_before(
  reference, data_dir, tmp_path
):
  wd = tmp_path / 'run'
  shutil.copytree(reference['workdir'], wd)
  _corrupt(wd / 'checkpoints' / '4')
  code, out, err = run_main(wd, _overrides(data_dir))
  assert code == 0, err[-3000:]
  assert 'resumed from step 3 of 4' in out
  assert (wd / 'checkpoints.corrupt').is_dir()
  assert_same_rows(_rows(wd), reference['rows'])
  assert_same_summary(summary(wd), reference['summary'])


def test_every_checkpoint_corrupt_starts_over_and_sets_files_aside(
  reference, data_dir, tmp_path
):
  wd = tmp_path / 'run'
  shutil.copytree(reference['workdir'], wd)
  for step_dir in (wd / 'checkpoints').iterdir():
    if step_dir.name.isdigit():
      _corrupt(step_dir)
  code, out, err = run_main(wd, _overrides(data_dir))
  assert code == 0, err[-3000:]
  line = next(x for x in out.splitlines() if x.startswith('starting'))
  assert 'unusable' in line and 'restarts/' in line
  assert_same_rows(_rows(wd), reference['rows'])  # Not appended: 6 rows.
  (kept,) = (wd / 'restarts').iterdir()
  assert_same_rows(_rows(kept), reference['rows'])
  assert {'summary.json', 'config.json', 'tb'} <= {p.name for p in kept.iterdir()}
  assert_same_summary(summary(wd), reference['summary'])


# Item 3: a checkpoint that cannot be written stops the run.


def test_save_patched_to_raise_stops_the_run_before_any_summary(
  data_dir, tmp_path, monkeypatch
):
  c = from_config.load(CONFIG, _overrides(data_dir, **{'sft.steps': 0}))
  from_config.validate(c)
  trainer = from_config.trainer(c, str(tmp_path))
  real_save = trainer.ckpt._manager.save

  def save(step, *args, **kwargs):
    if step == 2:
      raise OSError(28, 'No space left on device')
    return real_save(step, *args, **kwargs)

  monkeypatch.setattr(trainer.ckpt._manager, 'save', save)
  with pytest.raises(checkpoint_lib.CheckpointSaveError) as e:
    fit_lib.fit(trainer)
  assert 'saving step 2' in str(e.value) and 'No space left' in str(e.value)
  assert '\n' not in str(e.value)
  assert [r['step'] for r in _rows(tmp_path) if r['phase'] == 'rl'] == [1, 2]
  assert 'after_rl' not in summary(tmp_path)


def test_unwritable_checkpoint_dir_mid_run_exits_1_without_hanging(data_dir, tmp_path):
  wd = tmp_path / 'run'
  overrides = _overrides(data_dir, **{'rl.steps': 12})
  prefix = _drop_root()
  proc = subprocess.Popen(
    [*prefix, *_argv(wd, overrides)],
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=_env(),
  )
  deadline = time.monotonic() + 300
  while ('rl', 2) not in keys(_rows(wd)):
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.monotonic() < deadline
    time.sleep(0.05)
  os.kill(proc.pid, signal.SIGSTOP)  # Unwritable between two steps.
  (wd / 'checkpoints').chmod(0o555)
  t0 = time.monotonic()
  os.kill(proc.pid, signal.SIGCONT)
  try:
    _, err = proc.communicate(timeout=120)  # Orbax alone would wait 300 s.
  finally:
    (wd / 'checkpoints').chmod(0o755)
  assert time.monotonic() - t0 < 120
  assert proc.returncode == exit_codes.FAILED, err[-3000:]
  line = next(x for x in err.splitlines() if x.startswith('error: '))
  assert 'checkpoint: saving step' in line and 'Permission denied' in line
  assert str(wd / 'checkpoints') in line
  assert 'after_rl' not in summary(wd)
  assert max(r['step'] for r in _rows(wd) if r['phase'] == 'rl') < 12


# Item 7: SIGTERM stops after a checkpoint, exits 75, says where.


def test_sigterm_exits_75_with_preempted_at_and_resumes(reference, data_dir, tmp_path):
  wd = tmp_path / 'run'
  proc = start_and_act(
    wd,
    _overrides(data_dir),
    lambda rows: ('rl', 1) in keys(rows),
    lambda p: p.send_signal(signal.SIGTERM),
  )
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == exit_codes.STOPPED, err[-3000:]
  s = summary(wd)
  assert s['preempted_phase'] == 'rl' and s['preempted_at'] in (1, 2, 3)
  assert f'at RL step {s["preempted_at"]}' in out
  code, out, err = run_main(wd, _overrides(data_dir))
  assert code == 0, err[-3000:]
  assert_same_rows(_rows(wd), reference['rows'])
  assert_same_summary(summary(wd), reference['summary'])


# Readers write nothing into the run they read (item 2 of the issue).


def _read_everything(run, data_dir, out_root):
  """evaluate, export and select_prompts on `run`, outputs under out_root."""
  evaluate.main([
    '--config', CONFIG, '--checkpoint', str(run), '--datasets', 'ada_arith',
    '--k', '1', '--temperature', '0', '--out', str(out_root / 'eval'),
    *_overrides(data_dir),
  ])  # fmt: skip
  export.main(['--workdir', str(run), '--out', str(out_root / 'hf')])
  select_prompts.main([
    '--config', CONFIG, '--checkpoint', str(run), '--k', '2',
    '--max-prompts', '16', '--out', str(out_root / 'sel' / 'hard.jsonl'),
    *_overrides(data_dir),
  ])  # fmt: skip


def test_readers_change_nothing_in_a_finished_run(reference, data_dir, tmp_path):
  run = tmp_path / 'run'
  shutil.copytree(reference['workdir'], run)
  before = tree_hashes(run)
  _read_everything(run, data_dir, tmp_path / 'out')
  assert tree_hashes(run) == before
  report = json.loads((tmp_path / 'out' / 'eval' / 'eval.json').read_text())
  # The run's own band of levels (data.levels), as its in-run evaluation.
  c = from_config.load(CONFIG, _overrides(data_dir))
  from ada_jax import data

  band = data.select_levels(
    data.load_examples('ada_arith', 'test', data_dir=data_dir, template='tiny'),
    c.data.levels,
  )
  assert report['datasets']['ada_arith']['problems'] == len(band)


def test_readers_change_nothing_in_a_run_being_written(data_dir, tmp_path):
  wd = tmp_path / 'run'
  proc = start_and_act(
    wd,
    _overrides(data_dir, **{'rl.steps': 6}),
    lambda rows: ('rl', 2) in keys(rows),
    lambda p: os.kill(p.pid, signal.SIGSTOP),  # Frozen mid-run.
  )
  try:
    # What a save in flight leaves: a reader must not clean it up.
    (wd / 'checkpoints' / '9.orbax-checkpoint-tmp-1').mkdir()
    before = tree_hashes(wd)
    _read_everything(wd, data_dir, tmp_path / 'out')
    assert tree_hashes(wd) == before
    (wd / 'checkpoints' / '9.orbax-checkpoint-tmp-1').rmdir()
  finally:
    os.kill(proc.pid, signal.SIGCONT)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  assert keys(_rows(wd))[-1] == ('rl', 6)


def test_export_refuses_to_write_into_the_run(reference, tmp_path):
  run = tmp_path / 'run'
  shutil.copytree(reference['workdir'], run)
  before = tree_hashes(run)
  with pytest.raises(SystemExit, match='is the run itself'):
    export.main(['--workdir', str(run), '--out', str(run)])
  with pytest.raises(SystemExit, match='is a run directory'):
    export.main(['--workdir', str(run), '--out', str(reference['workdir'])])
  assert tree_hashes(run) == before


# Item 8 and item 5: bad input, one line, nothing written.


@pytest.mark.parametrize(
  'flags, message',
  [
    (['--config.rl.nope=1'], r'--config\.rl\.nope: unknown key \(rl has no .nope.'),
    (['--config.rl.steps=abc'], r'--config\.rl\.steps=abc: expected int'),
    (['--config.rl.steps=-1'], r'config rl\.steps=-1: must be an int >= 0'),
    (
      ['--config.sampling.temperature=0.0'],
      r'config sampling\.temperature=0\.0: must be a float > 0 \(the RL loss',
    ),
    (
      ['--config.sampling.top_p=0.0'],
      r'config sampling\.top_p=0\.0: must be a float in \(0, 1\]',
    ),
    (['--config.data.levels=20-30'], r'config data\.levels=.20-30. keeps no example'),
    (
      ['--config.model.dtype=float64'],
      r"config model\.dtype='float64': must be one of",
    ),
    (
      ['--config.checkpoint.every_minutes=-5'],
      r'config checkpoint\.every_minutes=-5\.0: must be a float >= 0 \(minutes '
      r'between time-based checkpoints; 0 turns them off\)$',
    ),
  ],
  ids=[
    'unknown_key',
    'bad_type',
    'negative_steps',
    'temperature',
    'top_p',
    'levels',
    'dtype',
    'every_minutes',
  ],
)
def test_bad_config_value_one_line_and_nothing_written(
  tmp_path, capsys, flags, message
):
  wd = tmp_path / 'run'
  code = main.run(['--config', CONFIG, '--workdir', str(wd), *flags])
  err = capsys.readouterr().err.strip()
  assert code == exit_codes.BAD_INPUT
  assert len(err.splitlines()) == 1 and err.startswith('error: '), err
  import re

  assert re.search(message, err), err
  assert not wd.exists()


def test_missing_config_file_one_line(tmp_path, capsys):
  code = main.run(['--config', 'configs/nope.py', '--workdir', str(tmp_path / 'w')])
  err = capsys.readouterr().err.strip()
  assert code == exit_codes.BAD_INPUT
  assert err == 'error: --config configs/nope.py: no such file'


def test_bad_config_arg_one_line(tmp_path, capsys):
  code = main.run(['--config', f'{CONFIG},tpu=nope', '--workdir', str(tmp_path / 'w')])
  err = capsys.readouterr().err.strip()
  assert code == exit_codes.BAD_INPUT and len(err.splitlines()) == 1
  assert "arg tpu='nope': unknown TPU accelerator type" in err


def test_read_only_workdir_one_line(data_dir, tmp_path):
  wd = tmp_path / 'ro'
  wd.mkdir()
  wd.chmod(0o555)
  try:
    code, _, err = run_main(wd, _overrides(data_dir), prefix=_drop_root(), timeout=120)
  finally:
    wd.chmod(0o755)
  assert code == exit_codes.BAD_INPUT, err[-3000:]
  assert err.strip().splitlines()[-1] == (
    f'error: --workdir {wd}: not writable (Permission denied)'
  )
  assert list(wd.iterdir()) == []
