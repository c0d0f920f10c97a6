"""Sampling vs training layout: the checked reshard and the decode HLO (issue 9).

On the (2, 2, 2) mesh of 8 fake devices: the training -> sampling reshard
is one jitted call whose checksum is logged and whose corruption raises; the
compiled decode round all-gathers FSDP-sharded weights inside its loop in
the training layout and none anywhere in the sampling layout. A one-layer
model keeps the two compiles short; the HLO parser is also checked on the
replica-group formats XLA prints.

The sampling copy in the compute dtype (bf16 compute, fp32 params): the
reshard casts in the same jitted copy, still checked; the copy holds bf16
bytes, samples exactly as the fp32 params do (the model casts each weight to
bf16 at its use either way), and the compiled round converts no weight from
f32 to bf16 (with an fp32 copy XLA hoists such a convert of every weight out
of the decode loop: a second copy of the weights for the whole round).
"""

import dataclasses
import logging

import jax
import jax.numpy as jnp
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
# The same shapes computing in bf16 from fp32 params (the paper setups).
_BF16 = dataclasses.replace(_CONFIG, dtype=jnp.bfloat16)


@pytest.fixture(scope='module')
def mesh():
  return sharding.make_mesh((2, 2, 2))


@pytest.fixture(scope='module')
def train_model(mesh):
  return sharding.create_sharded_model(_CONFIG, mesh, sharding.TRAIN_RULES, seed=1)


@pytest.fixture(scope='module')
def bf16_train_model(mesh):
  return sharding.create_sharded_model(_BF16, mesh, sharding.TRAIN_RULES, seed=1)


def test_reshard_is_checked_and_logged(mesh, train_model, caplog):
  graphdef, state = nnx.split(train_model)
  # The trainer passes the compute dtype; fp32 params in fp32 cast nothing.
  reshard = resharder.Resharder(mesh, sharding.SAMPLE_RULES, dtype=jnp.float32)
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


@pytest.mark.parametrize('dtype', [None, jnp.bfloat16])
def test_reshard_corruption_raises(mesh, bf16_train_model, dtype):
  _, state = nnx.split(bf16_train_model)
  reshard = resharder.Resharder(mesh, sharding.SAMPLE_RULES, dtype=dtype)
  good = reshard(state)
  copy = reshard._copy

  def swap_halves(s):
    # Same values, two blocks swapped: a plain sum would not notice.
    out, source_sum = copy(s)
    kernel = out['layers'][0]['mlp']['up']
    v = kernel.get_value()
    kernel.set_value(jax.numpy.concatenate([v[64:], v[:64]]))
    return out, source_sum

  reshard._copy = swap_halves
  with pytest.raises(resharder.ReshardError, match='checksum'):
    reshard(state)
  cast = jax.tree.map(
    lambda x: x.astype(dtype) if resharder.casts(x, dtype) else x, state
  )
  assert checksum.checksum(good) == checksum.checksum(cast)


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


def _prompts(n=8, p=16, seed=0):
  rs = np.random.RandomState(seed)
  tokens = rs.randint(3, _CONFIG.vocab_size, (n, p)).astype(np.int32)
  lengths = rs.randint(1, p + 1, n)
  mask = (np.arange(p)[None, :] >= p - lengths[:, None]).astype(np.int32)
  return tokens * mask, mask


def test_bf16_sampling_copy_holds_bf16_and_samples_alike(
  mesh, bf16_train_model, caplog
):
  graphdef, state = nnx.split(bf16_train_model)
  with caplog.at_level(logging.INFO):
    cast = resharder.Resharder(mesh, sharding.SAMPLE_RULES, dtype=jnp.bfloat16)(state)
  assert 'sampling layout (cast to bfloat16): checksum' in caplog.text
  plain = resharder.Resharder(mesh, sharding.SAMPLE_RULES)(state)
  for src, a, b in zip(
    *(jax.tree.leaves(x) for x in (state, plain, cast)), strict=True
  ):
    want = jnp.bfloat16 if src.ndim >= 2 else jnp.float32
    assert b.dtype == want and b.sharding == a.sharding
    np.testing.assert_array_equal(np.asarray(b), np.asarray(src.astype(want)))
  # The bytes of the copy: bf16 weights, fp32 norm scales and 1-D biases.
  elements = {2: 0, 4: 0}
  for x in jax.tree.leaves(cast):
    elements[2 if x.ndim >= 2 else 4] += x.size
  nbytes = sum(x.nbytes for x in jax.tree.leaves(cast))
  assert nbytes == 2 * elements[2] + 4 * elements[4]
  assert 4 * elements[4] < 0.05 * nbytes

  tokens, mask = _prompts()
  kw = dict(max_new_tokens=8, rng=jax.random.key(0), temperature=0.0)
  got = sampler.sample(nnx.merge(graphdef, cast), tokens, mask, **kw)
  # The same layout from the fp32 params: each weight cast at its use.
  ref = sampler.sample(nnx.merge(graphdef, plain), tokens, mask, **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_array_equal(np.asarray(got.logprobs), np.asarray(ref.logprobs))
  # The training layout: same values, reductions split differently. In bf16
  # that rounds differently (the first token's logprobs differ by ~3e-3), so
  # a greedy near-tie may go either way: the training layout scores the
  # copy's tokens (teacher-forced) instead of drawing its own.
  seq = np.concatenate([tokens, np.asarray(got.tokens)], axis=1)
  p = tokens.shape[1]
  seq_mask = np.concatenate([mask, np.ones_like(np.asarray(got.tokens))], axis=1)
  logits = model_lib.logits(bf16_train_model, seq, seq_mask)[:, p - 1 : -1]
  logp = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  chosen = np.take_along_axis(logp, np.asarray(got.tokens)[..., None], -1)[..., 0]
  # Measured: 5e-3 (the 1-layer tiny config).
  np.testing.assert_allclose(chosen, np.asarray(got.logprobs), atol=2e-2)


def test_bf16_sampling_copy_is_the_rounds_only_copy(mesh, bf16_train_model):
  graphdef, state = nnx.split(bf16_train_model)
  tokens = np.ones((8, 16), np.int32)
  found, args, weights = {}, {}, {}
  for name, dtype in (('fp32', None), ('bf16', jnp.bfloat16)):
    copy = resharder.Resharder(mesh, sharding.SAMPLE_RULES, dtype=dtype)(state)
    model = nnx.merge(graphdef, copy)
    cache = sampler.prefill(model, tokens, np.ones_like(tokens))
    compiled = sampler.lower_round(
      model, cache, slots=_SLOTS, max_new_tokens=8
    ).compile()
    found[name] = hlo.weight_converts(compiled.as_text(), copy)
    args[name] = compiled.memory_analysis().argument_size_in_bytes
    weights[name] = sum(
      np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
      for x in jax.tree.leaves(copy)
    )
  narrowing = {
    k: [c for c in v if (c.source, c.target) == ('f32', 'bf16')]
    for k, v in found.items()
  }
  # fp32 copy: a bf16 convert of each weight, hoisted out of the decode loop
  # (held for the whole round). bf16 copy: none anywhere. (XLA:CPU then
  # widens bf16 weights to f32 for its fp32 matmuls: a CPU-only artifact.)
  assert len(narrowing['fp32']) >= 7, found['fp32']
  assert not any(c.in_loop for c in narrowing['fp32'])
  assert narrowing['bf16'] == [], found['bf16']
  # The round's arguments: the bf16 weights, the rest unchanged.
  assert weights['bf16'] < 0.55 * weights['fp32']
  assert args['fp32'] - args['bf16'] == weights['fp32'] - weights['bf16']


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
