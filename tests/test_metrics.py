"""Tests for ada_jax.infra.metrics: JSONL, resume, TensorBoard records, wandb, plots."""

import json
import struct
import sys
import types

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from ada_jax.infra import metrics as metrics_lib
from ada_jax.infra import run_dir


def _rl_row(step):
  return {
    'reward_round1_mean': np.float32(0.25 + 0.01 * step),
    'reward_batch_mean': jnp.float32(0.5),
    'samples_drawn': np.int64(64 + step),
    'entropy': 1.0 / step,
    'exited_per_round': [np.int32(3), 2, 0],
    'skipped_updates': 0,
    'loss': float('nan'),
  }


def test_jsonl_round_trip_and_samples(tmp_path):
  with metrics_lib.MetricsWriter(tmp_path, tensorboard=False, config={'lr': 1e-6}) as w:
    w.write(0, {'loss': jnp.array(2.5), 'lr': np.float64(0.0)}, phase='sft')
    for step in (1, 2):
      w.write(step, _rl_row(step))
    w.write_samples(2, [{'response': 'x = \\boxed{4}', 'reward': np.float32(1.0)}])
  rows = metrics_lib.read_rows(tmp_path)
  assert [(r['step'], r['phase']) for r in rows] == [(0, 'sft'), (1, 'rl'), (2, 'rl')]
  assert rows[0] == {'step': 0, 'phase': 'sft', 'loss': 2.5, 'lr': 0.0}
  r2 = rows[2]
  assert r2['samples_drawn'] == 66 and isinstance(r2['samples_drawn'], int)
  assert r2['reward_round1_mean'] == pytest.approx(0.27)
  assert r2['exited_per_round'] == [3, 2, 0]
  assert r2['loss'] is None  # Non-finite -> null: the file stays strict JSON.
  assert list(r2)[:2] == ['step', 'phase']
  for line in (tmp_path / 'metrics.jsonl').read_text().splitlines():
    json.loads(line, parse_constant=lambda c: pytest.fail(f'non-JSON {c}'))
  assert [r['step'] for r in metrics_lib.read_rows(tmp_path, phase='rl')] == [1, 2]
  samples = metrics_lib.read_rows(tmp_path / 'samples.jsonl')
  assert samples == [
    {'step': 2, 'phase': 'rl', 'response': 'x = \\boxed{4}', 'reward': 1.0}
  ]
  assert json.loads((tmp_path / 'config.json').read_text()) == {'lr': 1e-6}


def test_to_python_rejects_unknown_types():
  assert metrics_lib.to_python({'a': np.bool_(True), 'b': (np.arange(2),)}) == {
    'a': True,
    'b': [[0, 1]],
  }
  with pytest.raises(TypeError):
    metrics_lib.to_python(object())


def test_other_processes_write_nothing(tmp_path):
  workdir = tmp_path / 'run'
  w = metrics_lib.MetricsWriter(workdir, process_index=1, config={'a': 1})
  w.write(1, _rl_row(1))
  w.write_samples(1, [{'response': 'r'}])
  w.close()
  assert not workdir.exists()


def test_resume_drops_rows_past_each_phase_position(tmp_path):
  with metrics_lib.MetricsWriter(tmp_path, tensorboard=False) as w:
    for step in (25, 50):  # SFT counts its own steps, past RL's.
      w.write(step, {'loss': 1.0 / step}, phase='sft')
    for step in range(1, 6):
      w.write(step, {'x': step})
      w.write_samples(step, [{'r': step}, {'r': -step}])
  # The killed run left half a line behind.
  with open(tmp_path / 'metrics.jsonl', 'a') as f:
    f.write('{"step": 6, "x"')
  with metrics_lib.MetricsWriter(tmp_path, tensorboard=False, keep={'rl': 3}) as w:
    for step in range(4, 7):
      w.write(step, {'x': step})
      w.write_samples(step, [{'r': step}])
  rows = metrics_lib.read_rows(tmp_path)
  assert [(r['phase'], r['step']) for r in rows] == [
    ('sft', 25),
    ('sft', 50),
    *[('rl', s) for s in range(1, 7)],
  ]
  samples = metrics_lib.read_rows(tmp_path / 'samples.jsonl')
  assert [s['r'] for s in samples] == [1, -1, 2, -2, 3, -3, 4, 5, 6]
  # A phase's position cuts that phase only, whatever the other's steps.
  with metrics_lib.MetricsWriter(tmp_path, tensorboard=False, keep={'sft': 25}):
    pass
  rows = metrics_lib.read_rows(tmp_path)
  assert [(r['phase'], r['step']) for r in rows] == [
    ('sft', 25),
    *[('rl', s) for s in range(1, 7)],
  ]


def _event_class():
  """tensorflow.Event built from its .proto description (fields used only).

  Field numbers as in tensorboard/compat/proto/{event,summary}.proto, so the
  real protobuf parser, not the writer's own encoder, decodes the file.
  """
  f = descriptor_pb2.FileDescriptorProto(name='ev_test.proto', package='tf_test')
  T = descriptor_pb2.FieldDescriptorProto
  opt, rep = T.LABEL_OPTIONAL, T.LABEL_REPEATED

  def msg(name, fields):
    m = f.message_type.add(name=name)
    for number, fname, ftype, label, type_name in fields:
      m.field.add(
        name=fname, number=number, type=ftype, label=label, type_name=type_name
      )

  msg(
    'Value',
    [
      (1, 'tag', T.TYPE_STRING, opt, None),
      (2, 'simple_value', T.TYPE_FLOAT, opt, None),
    ],
  )
  msg('Summary', [(1, 'value', T.TYPE_MESSAGE, rep, '.tf_test.Value')])
  msg('SessionLog', [(1, 'status', T.TYPE_INT32, opt, None)])
  msg('Event', [
    (1, 'wall_time', T.TYPE_DOUBLE, opt, None),
    (2, 'step', T.TYPE_INT64, opt, None),
    (3, 'file_version', T.TYPE_STRING, opt, None),
    (5, 'summary', T.TYPE_MESSAGE, opt, '.tf_test.Summary'),
    (7, 'session_log', T.TYPE_MESSAGE, opt, '.tf_test.SessionLog'),
  ])  # fmt: skip
  pool = descriptor_pool.DescriptorPool()
  pool.Add(f)
  return message_factory.GetMessageClass(pool.FindMessageTypeByName('tf_test.Event'))


def _read_events(path):
  """Parses TFRecord framing, checking both CRCs, into Event messages."""
  event_cls, data, events = _event_class(), path.read_bytes(), []
  while data:
    (n,) = struct.unpack('<Q', data[:8])
    assert struct.unpack('<I', data[8:12])[0] == metrics_lib._masked_crc(data[:8])
    payload = data[12 : 12 + n]
    assert struct.unpack('<I', data[12 + n : 16 + n])[0] == metrics_lib._masked_crc(
      payload
    )
    events.append(event_cls.FromString(payload))
    data = data[16 + n :]
  return events


def test_crc32c_known_vector():
  assert metrics_lib.crc32c(b'123456789') == 0xE3069283
  assert metrics_lib.crc32c(b'') == 0


def test_tensorboard_events_readable(tmp_path):
  with metrics_lib.MetricsWriter(tmp_path) as w:
    for step in (1, 2):
      w.write(step, _rl_row(step))
  (path,) = tmp_path.glob('tb/rl/events.out.tfevents.*')
  events = _read_events(path)
  assert events[0].file_version == 'brain.Event:2'
  assert [e.step for e in events[1:]] == [1, 2]
  values = {v.tag: v.simple_value for v in events[2].summary.value}
  assert values['rl/reward_round1_mean'] == pytest.approx(0.27)
  assert values['rl/samples_drawn'] == 66.0
  assert values['rl/exited_per_round/1'] == 2.0
  assert 'rl/loss' not in values  # NaN was logged as null, not as a scalar.
  # A resumed writer opens a new file that starts with a purge marker.
  with metrics_lib.MetricsWriter(tmp_path, keep={'rl': 1}) as w:
    w.write(2, {'x': 1})
  new = [p for p in tmp_path.glob('tb/rl/events.out.tfevents.*') if p != path]
  (resumed,) = new if new else pytest.fail('no new event file')
  start = _read_events(resumed)[1]
  assert start.step == 2 and start.session_log.status == 1


def test_wandb_only_when_asked(tmp_path, monkeypatch):
  calls = []
  fake = types.ModuleType('wandb')

  class Run:
    def log(self, data, step):
      calls.append(('log', step, data))

    def finish(self):
      calls.append(('finish',))

  fake.init = lambda **kw: calls.append(('init', kw)) or Run()
  monkeypatch.setitem(sys.modules, 'wandb', fake)
  with metrics_lib.MetricsWriter(tmp_path / 'a', tensorboard=False) as w:
    w.write(1, {'x': 1})
  assert calls == []
  cfg = ml_collections.ConfigDict({'seed': 3, 'dtype': np.dtype('float32')})
  with metrics_lib.MetricsWriter(tmp_path / 'b', wandb_project='p', config=cfg) as w:
    w.write(7, {'x': np.float32(0.5)}, phase='sft')
  want_cfg = {'seed': 3, 'dtype': 'float32'}  # Non-JSON values fall back to str.
  run_id = (tmp_path / 'b' / 'wandb_id').read_text().strip()
  assert calls[0] == (
    'init',
    {'project': 'p', 'config': want_cfg, 'name': 'b', 'id': run_id, 'resume': 'allow'},
  )
  assert json.loads((tmp_path / 'b' / 'config.json').read_text()) == want_cfg
  assert calls[1:] == [('log', 7, {'sft/x': 0.5}), ('finish',)]


def test_plots_and_summary(tmp_path):
  with metrics_lib.MetricsWriter(tmp_path, tensorboard=False) as w:
    w.write(0, {'loss': 3.0}, phase='sft')
    for step in range(1, 6):
      w.write(step, _rl_row(step))
  paths = metrics_lib.plot_run(tmp_path)
  assert sorted(p.name for p in paths) == ['entropy.png', 'reward.png', 'samples.png']
  for p in paths:
    data = p.read_bytes()
    assert data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) > 1000
    width, height = struct.unpack('>II', data[16:24])  # IHDR chunk.
    assert (width, height) == (600, 350)
  rows = metrics_lib.read_rows(tmp_path, phase='rl')
  table = metrics_lib.summary_table(rows)
  assert table.splitlines()[0] == '5 rows, steps 1..5'
  line = next(x for x in table.splitlines() if x.startswith('samples_drawn'))
  assert line.split()[1:] == ['65', '69', '65', '67', '69']
  assert 'loss' not in table  # Not a summary key, and all null anyway.
  assert metrics_lib.summary_table([]) == '(no metrics rows)'


def test_before_after_plots_by_level_and_pass_rates(tmp_path):
  hist = [('0', 3), ('(0.00,0.50]', 2), ('(0.50,1.00]', 1), ('1', 0)]
  result = {
    'eval_accuracy_by_level': {'0': 0.9, '1': 0.5},
    'eval_sampled_accuracy_by_level': {'0': 0.8, '1': 0.3},
    'pass_rate_histogram': hist,
  }
  paths = metrics_lib.plot_before_after(
    tmp_path, {'before_rl': result, 'after_rl': result}
  )
  assert [p.name for p in paths] == ['by_level.png', 'pass_rates.png']
  assert all(p.read_bytes()[:4] == b'\x89PNG' for p in paths)
  # Summaries of older runs have neither: nothing to draw.
  assert metrics_lib.plot_before_after(tmp_path, {'before_rl': {}}) == []


def test_remote_files_buffer_then_rewrite(tmp_path, monkeypatch):
  # Object stores cannot append: pretend tmp_path is one.
  monkeypatch.setattr(metrics_lib, '_is_local', lambda path: False)
  (tmp_path / 'metrics.jsonl').write_text('{"step": 1, "phase": "rl"}\n')
  w = metrics_lib.MetricsWriter(tmp_path, remote_flush_s=3600, keep={'rl': 1})
  w.write(2, {'x': 1})
  w.write(3, {'x': 2})
  assert [r['step'] for r in metrics_lib.read_rows(tmp_path)] == [1]  # Not yet.
  w.flush()
  assert [r['step'] for r in metrics_lib.read_rows(tmp_path)] == [1, 2, 3]
  w.write(4, {'x': 3})
  w.close()
  assert [r['step'] for r in metrics_lib.read_rows(tmp_path)] == [1, 2, 3, 4]
  (path,) = tmp_path.glob('tb/rl/events.out.tfevents.*')
  assert [e.step for e in _read_events(path)] == [0, 2, 2, 3, 4]


def test_tensorboard_sees_each_phase_step_once_after_resume(tmp_path):
  """TensorBoard itself (its EventAccumulator, the oracle) reads the events.

  The first run logs SFT steps 25 and 50 and RL steps 1-5; killed after its
  step-2 checkpoint, the resumed run logs RL steps 3-5 again with other
  values. TensorBoard must show SFT whole and RL steps 1-5 once each, 3-5
  from the resumed run.
  """
  from tensorboard.backend.event_processing import event_accumulator

  with metrics_lib.MetricsWriter(tmp_path) as w:
    for step in (25, 50):
      w.write(step, {'loss': step / 100}, phase='sft')
    for step in range(1, 6):
      w.write(step, {'x': float(step)})
  with metrics_lib.MetricsWriter(tmp_path, keep={'rl': 2}) as w:
    for step in range(3, 6):
      w.write(step, {'x': 10.0 * step})

  def scalars(phase, tag):
    acc = event_accumulator.EventAccumulator(str(tmp_path / 'tb' / phase))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]

  assert scalars('sft', 'sft/loss') == [(25, 0.25), (50, 0.5)]
  assert scalars('rl', 'rl/x') == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0), (5, 50.0)]


def test_a_resumed_run_continues_its_wandb_run(tmp_path, monkeypatch):
  """Real wandb, offline: one wandb run per workdir, a fresh one after a restart."""
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_DIR', str(tmp_path / 'wandb_files'))
  monkeypatch.setenv('WANDB_SILENT', 'true')
  (tmp_path / 'wandb_files').mkdir()
  run = tmp_path / 'run'
  ids = []
  for step in (1, 2):  # A run, then its resume.
    with metrics_lib.MetricsWriter(run, wandb_project='p', tensorboard=False) as w:
      ids.append(w._wandb.id)
      w.write(step, {'x': float(step)})
  assert ids[0] == ids[1] == (run / 'wandb_id').read_text().strip()
  run_dir.set_aside(run)  # Starting over: a new wandb run.
  with metrics_lib.MetricsWriter(run, wandb_project='p', tensorboard=False) as w:
    assert w._wandb.id != ids[0]


def test_wandb_missing_is_one_line(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'wandb', None)  # import wandb: ImportError
  with pytest.raises(ImportError) as e:
    metrics_lib.MetricsWriter(tmp_path, wandb_project='proj', tensorboard=False)
  assert str(e.value).startswith("log.wandb_project='proj' needs wandb")
  assert '\n' not in str(e.value)
