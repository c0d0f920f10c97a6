"""Meshes, logical-axis rules and sharded forward == unsharded forward."""

import logging

import jax
import numpy as np
import pytest
from flax import nnx

from ada_jax import hf, sharding
from ada_jax import model as model_lib
from ada_jax.infra import mesh as mesh_lib
from ada_jax.infra import resharder
from tests import hf_fixtures


def test_make_mesh_fills_minus_one():
  mesh = sharding.make_mesh((-1, 2, 1))
  assert dict(mesh.shape) == {'data': 4, 'fsdp': 2, 'tensor': 1}
  assert dict(sharding.make_mesh({'tensor': 4, 'data': -1}).shape) == {
    'data': 2,
    'fsdp': 1,
    'tensor': 4,
  }
  with pytest.raises(ValueError, match='needs 12 devices, have 8'):
    sharding.make_mesh((3, 2, 2))
  with pytest.raises(ValueError, match='unknown axes'):
    sharding.make_mesh({'model': 2})


@pytest.mark.parametrize('shape', [(8, 1, 1), (2, 2, 2), (1, 2, 4)])
def test_sharded_forward_equals_unsharded(hf_models, shape, caplog):
  path = hf_models['qwen2_tied'][0]
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(6), [8] * 4 + [5] * 4, 8
  )
  expected = np.asarray(model_lib.logits(hf.load_model(path), tokens, mask))
  mesh = sharding.make_mesh(shape)
  mesh_lib._logged.clear()  # Logged once per process; other tests may have.
  with caplog.at_level(logging.WARNING):
    model = hf.load_model(path, mesh=mesh)
  kernel = model.layers[0].mlp.gate[...]
  assert kernel.sharding.mesh.shape == mesh.shape
  if shape == (1, 2, 4):
    # 2 KV heads on a tensor axis of 4: replicated, and said once.
    assert model.layers[0].attn.k[...].sharding.spec[1] is None
    assert any(
      'kv_heads' in r.message and 'replicated' in r.message for r in caplog.records
    )
    assert tuple(model.layers[0].attn.q[...].sharding.spec) == ('fsdp', 'tensor', None)
  x = jax.device_put(tokens, sharding.batch_sharding(mesh))
  m = jax.device_put(mask, sharding.batch_sharding(mesh))
  got = np.asarray(model_lib.logits(model, x, m))
  np.testing.assert_allclose(got, expected, atol=1e-5)


def test_born_sharded_and_reshard_to_sampling_layout():
  c = model_lib.ModelConfig('qwen2', 64, 32, 64, 2, 4, 2, 8, qkv_bias=True)
  mesh = sharding.make_mesh((2, 2, 2))
  model = sharding.create_sharded_model(c, mesh, sharding.TRAIN_RULES, seed=3)
  assert tuple(model.layers[1].mlp.up[...].sharding.spec) == ('fsdp', 'tensor')
  graphdef, state = nnx.split(model)
  reshard = resharder.Resharder(mesh, sharding.SAMPLE_RULES)
  sample = nnx.merge(graphdef, reshard(state))
  assert tuple(sample.layers[1].mlp.up[...].sharding.spec) == (None, 'tensor')
  for (_, a), (_, b) in zip(
    nnx.to_flat_state(nnx.state(model)),
    nnx.to_flat_state(nnx.state(sample)),
    strict=True,
  ):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))
  ref = model_lib.create_model(c, seed=3)
  # Same seed, same init (up to jit-vs-eager float rounding).
  np.testing.assert_allclose(
    np.asarray(ref.layers[1].mlp.up[...]),
    np.asarray(model.layers[1].mlp.up[...]),
    atol=1e-6,
  )
