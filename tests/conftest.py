"""Test setup: 8 fake CPU devices, persistent compile cache, shared tiny models.

The environment must be set before jax is imported anywhere, so it lives at
the top of this file (pytest imports conftest first).
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('WANDB_MODE', 'offline')  # wandb never reaches the network.
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
).strip()

import jax
import pytest

_CACHE = os.path.join(os.path.dirname(os.path.dirname(__file__)), '.jax_cache')
jax.config.update('jax_compilation_cache_dir', _CACHE)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)

from tests import hf_fixtures  # noqa: E402


@pytest.fixture(scope='session')
def hf_models(tmp_path_factory):
  """Variant -> (HF directory, torch model), built once per session."""
  root = str(tmp_path_factory.mktemp('hf_models'))
  out = {}
  for i, variant in enumerate(hf_fixtures.VARIANTS):
    path = hf_fixtures.hf_dir(root, variant)
    out[variant] = (path, hf_fixtures.make_hf_model(path, variant, seed=i))
  return out


_BUCKET = 'ada-test'
_EMULATOR_VARS = (
  'STORAGE_EMULATOR_HOST',
  'TENSORSTORE_GCS_HTTP_URL',
  'GOOGLE_AUTH_TOKEN_FOR_TESTING',
)


@pytest.fixture(scope='session')
def gcs_emulator():
  """A Cloud Storage API on a loopback port; yields its bucket's gs:// URL.

  `tests/gcs_emulator.py`: gcp-storage-emulator (requirements-test.txt) in
  this process, in memory, one per test process, with the two behaviours of
  GCS it lacks added (generation preconditions, the generation header that
  tensorstore reads). Clients find it by `STORAGE_EMULATOR_HOST` alone
  (gcsfs, the Google client; `infra.storage` turns gcsfs's gRPC bucket probe
  off when it is set and passes it on to tensorstore), so the code under
  test is unchanged.
  """
  import gcsfs

  from tests import gcs_emulator as emulator_lib

  saved = {k: os.environ.get(k) for k in _EMULATOR_VARS}
  emulator, url = emulator_lib.start(bucket=_BUCKET)
  os.environ['STORAGE_EMULATOR_HOST'] = url
  # tensorstore reads these once, at its first gs:// open in this process.
  os.environ['TENSORSTORE_GCS_HTTP_URL'] = url
  os.environ['GOOGLE_AUTH_TOKEN_FOR_TESTING'] = 'emulator'
  gcsfs.GCSFileSystem.clear_instance_cache()
  try:
    yield f'gs://{_BUCKET}'
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    gcsfs.GCSFileSystem.clear_instance_cache()
    emulator.stop()


@pytest.fixture
def gcs_dir(gcs_emulator, request):
  """A fresh gs:// folder of the emulator's bucket for one test."""
  import uuid

  return f'{gcs_emulator}/{request.node.name[:40]}-{uuid.uuid4().hex[:8]}'
