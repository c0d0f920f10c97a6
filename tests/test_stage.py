"""`python -m ada_jax.stage`: a paper config's model and sets into a bucket.

The real download code (huggingface_hub's repo_info / snapshot_download)
against `tests/hub_server.py`, a local server of the Hub's routes holding a
tiny random model under the paper model's id and tiny parquet sets, found
through `HF_ENDPOINT`; the bucket is the Cloud Storage emulator. Then the
staged files are read back the way the hosts read them (gs:// model.hf_path
and data.manual_dir), and a gated model is refused in one line without a
token.
"""

import io
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

from ada_jax import data, hf, hub_ids
from ada_jax.infra import exit_codes, storage
from tests import hf_fixtures
from tests.hub_server import HubServer, Repo

TOKEN = 'hf_test_access'


def _parquet(rows: dict[str, list]) -> bytes:
  import pyarrow as pa
  import pyarrow.parquet as pq

  out = io.BytesIO()
  pq.write_table(pa.table(rows), out)
  return out.getvalue()


@pytest.fixture(scope='module')
def hub(tmp_path_factory):
  model_dir = str(tmp_path_factory.mktemp('model'))
  hf_fixtures.make_hf_model(model_dir, 'qwen2_tied')
  model = {p.name: p.read_bytes() for p in pathlib.Path(model_dir).iterdir()}
  model['README.md'] = b'# not staged'
  prompts = _parquet({'problem': ['1+1?', '2+3?'], 'gt': ['2', '5']})
  evals = _parquet({'problem': ['3*3?', '10-4?', '7+8?'], 'answer': ['9', '6', '15']})
  repos = {
    ('model', hub_ids.MODELS['qwen25_math_1p5b']): Repo(model),
    ('model', hub_ids.MODELS['llama32_3b_instruct']): Repo(model, token=TOKEN),
    ('dataset', hub_ids.DATASETS['hard_1p5b']): Repo(
      {'data/train-00000-of-00001.parquet': prompts, 'README.md': b'# card'}
    ),
    ('dataset', hub_ids.DATASETS['math500']): Repo(
      {'data/test-00000-of-00001.parquet': evals}
    ),
  }
  server = HubServer(repos)
  yield server, model, prompts
  server.stop()


def _stage(hub, tmp_path, config, to, *extra, token=None):
  server = hub[0]
  env = dict(os.environ, HF_ENDPOINT=server.url, HF_HOME=str(tmp_path / 'hf_home'))
  env.pop('HF_TOKEN', None)
  if token:
    env['HF_TOKEN'] = token
  cmd = [sys.executable, '-m', 'ada_jax.stage', '--config', config, '--to', to, *extra]
  return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_stage_copies_model_and_sets_once_and_hosts_read_them(
  hub, gcs_dir, tmp_path, monkeypatch
):
  server, model, prompts = hub
  config = 'configs/qwen25_math_1p5b.py'
  server.requests.clear()
  proc = _stage(hub, tmp_path, config, gcs_dir, '--sets', 'hard_1p5b,math500')
  assert proc.returncode == 0, proc.stderr[-3000:]
  # One revision lookup per repository (snapshot_download's own, pinned to
  # that revision, goes to .../revision/SHA).
  for kind, repo in (
    ('models', hub_ids.MODELS['qwen25_math_1p5b']),
    ('datasets', hub_ids.DATASETS['hard_1p5b']),
    ('datasets', hub_ids.DATASETS['math500']),
  ):
    assert server.requests.count(f'GET /api/{kind}/{repo}') == 1, server.requests
  dest = f'{gcs_dir}/models/Qwen2.5-Math-1.5B'
  assert proc.stdout.strip().endswith(
    f'staged; run with: --config.model.hf_path={dest} '
    f'--config.data.manual_dir={gcs_dir}/manual'
  )
  for name in ('config.json', 'model.safetensors'):
    assert storage.path(f'{dest}/{name}').read_bytes() == model[name]
  assert not storage.path(f'{dest}/README.md').exists()  # Only what a policy needs.
  staged = f'{gcs_dir}/manual/hard_1p5b/data/train-00000-of-00001.parquet'
  assert storage.path(staged).read_bytes() == prompts
  assert not storage.path(f'{gcs_dir}/manual/hard_1p5b/README.md').exists()

  # Once: a second stage downloads nothing.
  server.requests.clear()
  proc = _stage(hub, tmp_path, config, gcs_dir, '--sets', 'hard_1p5b,math500')
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.count('already staged') == 3
  assert not [r for r in server.requests if '/resolve/' in r]

  # Every host reads them from the bucket (a local copy each, downloaded once).
  monkeypatch.setenv('ADA_LOCAL_CACHE', str(tmp_path / 'host'))
  assert hf.read_hf_config(dest)['hidden_size'] == 64
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    rows = data.load_examples(
      'ada_math_local/math500',
      'test',
      manual_dir=f'{gcs_dir}/manual',
      data_dir=str(tmp_path / 'tfds'),
      template='plain',
    )
  assert not [w for w in caught if 'skipped' in str(w.message)]  # No stray file.
  assert sorted(e.reference for e in rows) == ['15', '6', '9']


def test_a_gated_model_needs_hf_token(hub, gcs_dir, tmp_path):
  config = 'configs/llama32_3b_instruct.py'
  gated = hub_ids.MODELS['llama32_3b_instruct']
  assert gated in hub_ids.GATED
  for token, why in ((None, 'HF_TOKEN is not set'), ('hf_wrong', 'has no access')):
    proc = _stage(hub, tmp_path, config, gcs_dir, '--sets', 'math500', token=token)
    assert proc.returncode == exit_codes.BAD_INPUT
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith('error:')]
    assert line.startswith(f'error: model {gated} is gated and ') and why in line
    assert 'export HF_TOKEN=' in line
  proc = _stage(hub, tmp_path, config, gcs_dir, '--sets', 'math500', token=TOKEN)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert storage.path(f'{gcs_dir}/models/Llama-3.2-3B-Instruct/config.json').exists()


def test_the_readme_table_is_the_hub_ids_table():
  """README's Data table names each set's source as `hub_ids` does."""
  readme = (pathlib.Path(__file__).resolve().parent.parent / 'README.md').read_text()
  for name, repo in hub_ids.DATASETS.items():
    assert f'| `{name}` | `{repo}`' in readme, name
