"""gs:// paths against a Cloud Storage emulator (`infra.storage`).

The emulator (tests/conftest.py `gcs_emulator`) is `gcp-storage-emulator` on
a loopback port; every client reaches it through `STORAGE_EMULATOR_HOST`
alone. Each test has its own folder of the emulator's bucket.
"""

import os
import subprocess
import sys
import time

import pytest

from ada_jax.infra import run_dir, storage


def test_files_round_trip_quickly_on_the_emulator(gcs_dir):
  """Write, list, read and move through epath, each well under a second.

  gcsfs's default filesystem waits 60 s per bucket-type probe against a
  REST-only emulator; `storage` serves gs:// with the plain one when
  STORAGE_EMULATOR_HOST is set.
  """
  start = time.monotonic()
  p = storage.path(gcs_dir) / 'a' / 'x.txt'
  p.write_text('hello')
  assert [c.name for c in (storage.path(gcs_dir) / 'a').iterdir()] == ['x.txt']
  storage.move(f'{gcs_dir}/a', f'{gcs_dir}/b/a')
  assert not p.exists()
  assert (storage.path(gcs_dir) / 'b' / 'a' / 'x.txt').read_text() == 'hello'
  storage.move(f'{gcs_dir}/b/a/x.txt', f'{gcs_dir}/y.txt')
  assert (storage.path(gcs_dir) / 'y.txt').read_text() == 'hello'
  assert time.monotonic() - start < 10


def test_set_aside_moves_a_gs_run_s_progress_files(gcs_dir):
  """A restart from scratch on gs:// sets the old files aside (no folder rename).

  etils' rename on an object store needed the destination folder to exist
  (and gcsfs's moveTo retried for 30 s on stores without it).
  """
  root = storage.path(gcs_dir)
  (root / 'metrics.jsonl').write_text('{"step": 1}\n')
  (root / 'config.json').write_text('{}')
  (root / run_dir.TB_DIR / 'rl' / 'events.out.tfevents.1').write_text('e')
  (root / 'data' / 'keep.txt').write_text('k')  # Not a progress file.
  dest = run_dir.set_aside(gcs_dir)
  assert dest is not None
  moved = sorted(c.name for c in dest.iterdir())
  assert moved == sorted(['config.json', 'metrics.jsonl', run_dir.TB_DIR])
  assert (dest / 'metrics.jsonl').read_text() == '{"step": 1}\n'
  assert (dest / run_dir.TB_DIR / 'rl' / 'events.out.tfevents.1').read_text() == 'e'
  assert not (root / 'metrics.jsonl').exists()
  assert not (root / run_dir.TB_DIR).exists()
  assert (root / 'data' / 'keep.txt').read_text() == 'k'


@pytest.mark.parametrize('store', ['local', 'gcs'])
def test_upload_dir_copies_a_local_tree_but_skipped_folders(store, request, tmp_path):
  src = tmp_path / 'src'
  (src / 'sub' / '.cache').mkdir(parents=True)
  (src / 'a.bin').write_bytes(b'\x00\x01')
  (src / 'sub' / 'b.txt').write_text('b')
  (src / 'sub' / '.cache' / 'lock').write_text('x')
  root = request.getfixturevalue('gcs_dir') if store == 'gcs' else str(tmp_path)
  storage.upload_dir(src, f'{root}/out', skip_dirs=('.cache',))
  out = storage.path(root) / 'out'
  assert (out / 'a.bin').read_bytes() == b'\x00\x01'
  assert (out / 'sub' / 'b.txt').read_text() == 'b'
  assert not (out / 'sub' / '.cache' / 'lock').exists()


def test_require_names_a_missing_bucket(gcs_emulator):
  storage.require(f'{gcs_emulator}/run')  # The bucket exists.
  with pytest.raises(storage.StorageError, match='gs://no-such-bucket'):
    storage.require('gs://no-such-bucket/run')


def test_gs_path_without_gcsfs_is_one_line():
  """Without gcsfs a gs:// path is one line naming the path's need (exit 2 by callers)."""
  code = (
    'import sys; sys.modules["gcsfs"] = None\n'
    'from ada_jax.infra import storage\n'
    'try:\n'
    '  storage.require("gs://bucket/run")\n'
    'except storage.StorageError as e:\n'
    '  print("ERR", e)\n'
  )
  out = subprocess.run(
    [sys.executable, '-c', code],
    capture_output=True,
    text=True,
    check=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  ).stdout
  assert out.startswith('ERR gs:// paths need gcsfs'), out
  assert len(out.strip().splitlines()) == 1


def test_main_refuses_an_unreachable_gs_workdir_in_one_line(gcs_emulator):
  """`--workdir gs://missing-bucket/run`: exit 2, one line, nothing written."""
  out = subprocess.run(
    [sys.executable, '-m', 'ada_jax.main', '--config', 'configs/tiny_arith.py',
     '--workdir', 'gs://no-such-bucket/run'],
    capture_output=True, text=True, timeout=120,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )  # fmt: skip
  assert out.returncode == 2, out.stderr[-2000:]
  lines = [x for x in out.stderr.splitlines() if 'no-such-bucket' in x]
  assert len(lines) == 1 and 'does not exist' in lines[0], out.stderr[-2000:]


def test_data_dir_on_gs_is_built_once_then_read_from_the_bucket(
  gcs_dir, tmp_path, monkeypatch
):
  """A gs:// TFDS data dir: built on local disk, copied up, read by other hosts.

  The array_record writer opens local files only (it failed on gs://); a
  second host (a fresh ADA_LOCAL_CACHE) reads the bucket's files without
  building anything.
  """
  import tensorflow_datasets as tfds

  from ada_jax import data

  data_dir = f'{gcs_dir}/tfds'
  kw = dict(data_dir=data_dir, template='tiny', num_train=220, num_test=55, seed=3)
  monkeypatch.setenv('ADA_LOCAL_CACHE', str(tmp_path / 'host0'))
  first = data.load_examples('ada_arith', 'train', **kw)
  assert len(first) == 220
  uploaded = storage._filesystem().find(data_dir)
  assert any('.array_record-' in f for f in uploaded), uploaded

  monkeypatch.setenv('ADA_LOCAL_CACHE', str(tmp_path / 'host1'))

  def no_build(*a, **k):
    raise AssertionError('built again instead of reading the bucket')

  monkeypatch.setattr(tfds.core.DatasetBuilder, 'download_and_prepare', no_build)
  assert data.load_examples('ada_arith', 'train', **kw) == first


def test_emulator_host_is_passed_on_to_tensorstore():
  """Tensorstore (orbax) does not read STORAGE_EMULATOR_HOST: storage passes it on."""
  code = (
    'import os\n'
    'from ada_jax.infra import storage\n'
    'print(os.environ["TENSORSTORE_GCS_HTTP_URL"], '
    'os.environ["GOOGLE_AUTH_TOKEN_FOR_TESTING"])\n'
  )
  env = {k: v for k, v in os.environ.items() if 'TENSORSTORE' not in k}
  env.pop('GOOGLE_AUTH_TOKEN_FOR_TESTING', None)
  env['STORAGE_EMULATOR_HOST'] = 'http://127.0.0.1:9'
  out = subprocess.run(
    [sys.executable, '-c', code], capture_output=True, text=True, check=True, env=env
  ).stdout.split()
  assert out == ['http://127.0.0.1:9', 'emulator']


def test_a_corrupt_step_on_gs_is_moved_aside_not_deleted(gcs_dir):
  """Checkpoint quarantine on gs://: the step's files kept under checkpoints.corrupt/.

  The old code's rename needed the destination folder to exist on an object
  store and fell back to deleting the step (possibly most of a long run).
  """
  from ada_jax.infra import checkpoint

  steps = storage.path(gcs_dir) / 'checkpoints'
  (steps / '5' / 'params' / 'shard').write_text('weights')
  (steps / '5' / 'meta.json').write_text('{}')
  dst = checkpoint.set_aside_step(steps, 5)
  assert dst is not None and dst.parent.name == 'checkpoints.corrupt'
  assert (dst / 'params' / 'shard').read_text() == 'weights'
  assert not (steps / '5').exists()
