"""Sampling vs training layout: the checked reshard and the decode HLO (issue 9).

On the (2, 2, 2) mesh of 8 fake devices: the training -> sampling reshard
is one jitted call whose checksum is logged and whose corruption raises; the
compiled decode round all-gathers FSDP-sharded weights inside its loop in
the training layout and none anywhere in the sampling layout. A one-layer
model keeps the two compiles short; the HLO parser is also checked on the
replica-group formats XLA prints.
"""

import logging

import jax
import numpy as np
import pytest
from flax import nnx

from ada_jax import model as model_lib
from ada_jax import sampler, sharding
from ada_jax.infra import checksum, hlo, resharder

# The tiny config's shapes, one layer; 256 slots as in the tiny config (with
# fewer, the partitioner moves activations instead of gathering weights).
_CONFIG = model_lib.ModelConfig(
  'qwen2', 72, 128, 384, 1, 4, 2, 32, qkv_bias=True, tie_embeddings=True,
  max_position_embeddings=64,
)  # fmt: skip
_SLOTS = 256


@pytest.fixture(scope='module')
def mesh():
  return sharding.make_mesh((2, 2, 2))


@pytest.fixture(scope='module')
def train_model(mesh):
  return sharding.create_sharded_model(_CONFIG, mesh, sharding.TRAIN_RULES, seed=1)


def test_reshard_is_checked_and_logged(mesh, train_model, caplog):
  graphdef, state = nnx.split(train_model)
  reshard = resharder.Resharder(mesh, sharding.SAMPLE_RULES)
  with caplog.at_level(logging.INFO):
    out = reshard(state)
  sample = nnx.merge(graphdef, out)
  assert tuple(sample.layers[0].mlp.up[...].sharding.spec) == (None, 'tensor')
  assert tuple(train_model.layers[0].mlp.up[...].sharding.spec) == ('fsdp', 'tensor')
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(out), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  want = checksum.checksum(state)
  assert checksum.checksum(out) == want
  assert f'resharded params to sampling layout: checksum {want:08x} == {want:08x}' in (
    caplog.text
  )


def test_reshard_corruption_raises(mesh, train_model):
  _, state = nnx.split(train_model)
  reshard = resharder.Resharder(mesh, sharding.SAMPLE_RULES)
  good = reshard(state)
  copy = reshard._copy

  def swap_halves(s):
    # Same values, two blocks swapped: a plain sum would not notice.
    out = copy(s)
    kernel = out['layers'][0]['mlp']['up']
    v = kernel.get_value()
    kernel.set_value(jax.numpy.concatenate([v[64:], v[:64]]))
    return out

  reshard._copy = swap_halves
  with pytest.raises(resharder.ReshardError, match='checksum'):
    reshard(state)
  assert checksum.checksum(good) == checksum.checksum(state)


def _summary(model, mesh):
  text = sampler.decode_round_hlo(
    model,
    slots=_SLOTS,
    prompts=8,
    prompt_len=16,
    max_new_tokens=8,
    hoist_invariants=False,
  )
  return hlo.analyze_hlo(text, mesh, nnx.state(model))


def test_decode_loop_gathers_weights_only_in_training_layout(mesh, train_model):
  train = _summary(train_model, mesh)
  gathers = [c for c in train if c.weight and c.in_loop]
  assert gathers, hlo.summarize(train)
  assert any('fsdp' in c.axes for c in gathers)
  graphdef, state = nnx.split(train_model)
  reshard = resharder.Resharder(mesh, sharding.SAMPLE_RULES)
  sample_model = nnx.merge(graphdef, reshard(state))
  sample = _summary(sample_model, mesh)
  counts = hlo.summarize(sample)
  assert counts['loop_weight_all_gathers'] == 0, counts
  assert counts['round_weight_all_gathers'] == 0, counts
  # Across slots (data, fsdp) the loop only agrees on when to stop (scalars).
  across = [c for c in sample if c.in_loop and {'data', 'fsdp'} & set(c.axes)]
  assert all(c.shape == () for c in across), across
  assert all('?' not in c.axes for c in train + sample)


@pytest.mark.parametrize(
  'line, axes',
  [
    ('replica_groups={{0,1},{2,3},{4,5},{6,7}}, dimensions={0}', ('tensor',)),
    ('replica_groups={{0,2},{1,3},{4,6},{5,7}}', ('fsdp',)),
    ('replica_groups=[4,2]<=[8], dimensions={1}', ('tensor',)),
    ('replica_groups=[4,2]<=[2,2,2]T(0,2,1), dimensions={0}', ('fsdp',)),
    ('replica_groups=[4,2]<=[2,4]T(1,0), dimensions={0}', ('data',)),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}, x", ('tensor',)),
    ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}, x", ('data', 'fsdp')),
    (
      "replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], "
      "device_ids=([4,2]T(1,0)) {'axis_0'}, x",
      ('tensor',),
    ),
    ('replica_groups=something_new', ('?',)),
  ],
)
def test_replica_group_formats(mesh, line, axes):
  assert hlo._axes(hlo._device_groups(line, 8), mesh) == axes
