"""Test setup: 8 fake CPU devices, persistent compile cache, shared tiny models.

The environment must be set before jax is imported anywhere, so it lives at
the top of this file (pytest imports conftest first).
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
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
