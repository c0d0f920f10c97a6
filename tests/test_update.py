"""The micro-batched RL update and old-logp pass (update.py, rollout.assemble_batch).

On a (2,2,2) CPU mesh: micro-batches of the [C, m, ...] layout give the
update of the unsplit mini-batches; the micro-batched old-logp pass equals an
all-rows forward; the chunked log-probs equal the unchunked ones, gradients
included; every loss setting reaches the loss unchanged; and the compiled
update's and old-logp pass's per-device temporaries shrink as 1 / (data x
fsdp).

Dimension legend: R rows, C micro-batches of m rows, P prompt bucket,
N response tokens, T = P + N, V vocabulary, M rounds, S slots.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ada_jax import model as model_lib
from ada_jax import sharding
from ada_jax.infra.checkpoint import abstract_opt_state
from ada_jax.rl import loss as loss_lib
from ada_jax.rl import rollout, update

_CFG = model_lib.ModelConfig(
  model_type='qwen2',
  vocab_size=64,
  hidden_size=32,
  intermediate_size=64,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  qkv_bias=True,
  tie_embeddings=True,
)
R, P, N = 16, 8, 12
T = P + N


def _mesh(shape):
  n = int(np.prod(shape))
  return sharding.make_mesh(shape, devices=jax.devices()[:n])


def _micro_sharding(mesh):
  return NamedSharding(mesh, PartitionSpec(None, sharding.BATCH_AXES))


def _reference_logp(model, tokens, mask, temperature):
  """All rows in one forward, the whole [R, N, V] logits: the oracle."""
  logits = model_lib.logits(model, tokens, mask)[:, P - 1 : T - 1]
  return loss_lib.token_logp_and_entropy(
    logits, jnp.asarray(tokens)[:, P:], temperature=temperature
  )


def _flat_batch(seed=0):
  """Host [R, ...] rows: left-padded prompts, ragged responses, padding rows."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, _CFG.vocab_size, (R, T)).astype(np.int32)
  mask = np.ones((R, T), np.int32)
  for i, n_pad in enumerate(rng.integers(0, P - 1, R)):
    mask[i, :n_pad] = 0
  resp = (np.arange(N)[None] < rng.integers(1, N + 1, R)[:, None]).astype(np.int32)
  mask[:, P:] = resp
  weight = np.ones(R, np.float32)
  weight[[5, 11]] = 0.0  # Padding rows.
  w = resp * weight[:, None]
  adv = np.repeat(rng.normal(0, 1, (R, 1)), N, axis=1) * (w > 0)
  return {
    'tokens': tokens,
    'attn_mask': mask,
    'resp_mask': w.astype(np.float32),
    'advantages': adv.astype(np.float32),
  }


def _with_old_logp(batch, shift=None, noise=0.3, seed=1):
  """Old log-probs of the reference forward at temperature 1, perturbed."""
  logp, _ = _reference_logp(
    model_lib.create_model(_CFG), batch['tokens'], batch['attn_mask'], 1.0
  )
  logp = np.asarray(logp)
  if shift is not None:
    logp = logp + shift
  else:
    logp = logp + np.random.default_rng(seed).normal(0, noise, logp.shape)
  return dict(batch, old_logp=logp.astype(np.float32))


def _run_update(mesh, settings, batch, lr=1e-3):
  """One rl_update from the seed-0 params on `mesh`; host params and metrics."""
  model = sharding.create_sharded_model(_CFG, mesh)
  _, state = nnx.split(model)
  graphdef = nnx.graphdef(model)
  # Adam's g / (|g| + eps) turns float noise in a near-zero gradient (sums
  # that cancel, in another order per layout) into up to lr · noise / eps of
  # parameter change; eps 1e-6 keeps that below the 1e-5 tolerance while
  # lr · steps (4e-3) stays far above it.
  tx = update.make_optimizer(eps=1e-6)
  opt_state = jax.jit(tx.init)(state)
  micro = update.micro_batches(batch, settings.micro_batch_rows)
  micro = jax.device_put(micro, _micro_sharding(mesh))
  state, _, metrics = update.rl_update(
    graphdef, tx, settings, state, opt_state, micro, jnp.float32(lr)
  )
  params = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]
  return params, jax.device_get(metrics)


def test_micro_batches_equal_the_unsplit_update():
  batch = _with_old_logp(_flat_batch())
  kw = dict(
    prompt_len=P,
    mini_batch_rows=8,
    epochs=2,
    temperature=0.9,
    entropy_coef=0.01,
    logit_chunk=5,
  )
  one = update.UpdateSettings(micro_batch_rows=8, **kw)
  two = update.UpdateSettings(micro_batch_rows=4, **kw)
  # The oracle: one device, one micro-batch per mini-batch.
  ref_params, ref_m = _run_update(_mesh((1, 1, 1)), one, batch)
  mesh = _mesh((2, 2, 2))
  for settings in (one, two):  # 2 rows, then 1 row per device per micro-batch.
    params, m = _run_update(mesh, settings, batch)
    assert m['skipped'] == 0
    for k in ref_m:
      np.testing.assert_allclose(m[k], ref_m[k], rtol=1e-5, atol=1e-6, err_msg=k)
    for a, b in zip(params, ref_params, strict=True):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  start = [
    np.asarray(x) for x in jax.tree.leaves(nnx.state(model_lib.create_model(_CFG)))
  ]
  assert any(np.abs(a - b).max() > 1e-4 for a, b in zip(params, start, strict=True))


def test_micro_batched_old_logp_equals_the_all_rows_forward():
  mesh = _mesh((2, 2, 2))
  batch = _flat_batch()
  model = sharding.create_sharded_model(_CFG, mesh)
  graphdef, state = nnx.split(model)
  micro = jax.device_put(
    update.micro_batches(
      {k: batch[k] for k in ('tokens', 'attn_mask')}, micro_batch_rows=4
    ),
    _micro_sharding(mesh),
  )
  logp, ent = update.logp_jit(
    graphdef,
    state,
    micro['tokens'],
    micro['attn_mask'],
    jnp.float32(0.7),
    prompt_len=P,
    logit_chunk=5,
  )
  assert logp.shape == ent.shape == (R // 4, 4, N)
  # Laid out as the batch: the update reads it without resharding.
  assert logp.sharding.is_equivalent_to(micro['tokens'].sharding, 3)
  want_logp, want_ent = _reference_logp(
    model_lib.create_model(_CFG), batch['tokens'], batch['attn_mask'], 0.7
  )
  np.testing.assert_allclose(logp.reshape(R, N), want_logp, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ent.reshape(R, N), want_ent, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('chunk', [4, 5], ids=['divides', 'remainder'])
def test_chunked_response_logp_equals_unchunked_with_grads(chunk):
  batch = _flat_batch()
  tokens, mask = jnp.asarray(batch['tokens']), jnp.asarray(batch['attn_mask'])
  w = jnp.asarray(batch['resp_mask'])
  graphdef, state = nnx.split(model_lib.create_model(_CFG))

  def scalar(state, chunked):
    model = nnx.merge(graphdef, state)
    if chunked:
      logp, ent = update.response_logp(model, tokens, mask, P, 0.8, logit_chunk=chunk)
    else:
      logits = model.forward(tokens, mask)[:, P - 1 : T - 1]
      logp, ent = loss_lib.token_logp_and_entropy(
        logits, tokens[:, P:], temperature=0.8
      )
    return jnp.sum(w * logp) + 0.1 * jnp.sum(w * ent)

  grad = jax.jit(jax.value_and_grad(scalar), static_argnums=1)
  val, g = grad(state, True)
  val_ref, g_ref = grad(state, False)
  np.testing.assert_allclose(val, val_ref, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def _abstract_inputs(mesh=None, lead=(R // 4, 4)):
  abstract = nnx.eval_shape(lambda: model_lib.Transformer(_CFG, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  tx = update.make_optimizer()

  def sds(shape, dtype):
    sh = _micro_sharding(mesh) if mesh is not None else None
    return jax.ShapeDtypeStruct(lead + shape, dtype, sharding=sh)

  batch = {
    'tokens': sds((T,), jnp.int32),
    'attn_mask': sds((T,), jnp.int32),
    'resp_mask': sds((N,), jnp.float32),
    'advantages': sds((N,), jnp.float32),
    'old_logp': sds((N,), jnp.float32),
  }
  lr = jax.ShapeDtypeStruct((), jnp.float32)
  return graphdef, tx, state, jax.eval_shape(tx.init, state), batch, lr


def test_update_passes_every_loss_setting_to_the_loss(monkeypatch):
  s = update.UpdateSettings(
    prompt_len=P,
    mini_batch_rows=8,
    micro_batch_rows=4,
    temperature=0.7,
    clip_low=0.17,
    clip_high=0.31,
    clip_ratio_c=10.0,
    loss_agg_mode='seq-mean-token-sum',
    entropy_coef=0.013,
    logit_chunk=5,
  )
  losses, logps = [], []
  policy_loss, chunked = loss_lib.policy_loss, loss_lib.chunked_logp_and_entropy

  def record_loss(*args, **kwargs):
    losses.append(kwargs)
    return policy_loss(*args, **kwargs)

  def record_logp(*args, **kwargs):
    logps.append(kwargs)
    return chunked(*args, **kwargs)

  monkeypatch.setattr(loss_lib, 'policy_loss', record_loss)
  monkeypatch.setattr(loss_lib, 'chunked_logp_and_entropy', record_logp)
  graphdef, tx, *args = _abstract_inputs()
  jax.eval_shape(functools.partial(update._rl_update, graphdef, tx, s), *args)
  assert losses and logps
  for kw in losses:
    got = {k: kw[k] for k in ('clip_low', 'clip_high', 'clip_ratio_c')}
    assert got == {'clip_low': 0.17, 'clip_high': 0.31, 'clip_ratio_c': 10.0}
    assert kw['loss_agg_mode'] == 'seq-mean-token-sum'
    assert kw['entropy_coef'] == 0.013 and kw['entropy'] is not None
  for kw in logps:
    assert kw['temperature'] == 0.7 and kw['chunk'] == 5
  # The old-logp pass: the chunk and prompt length as given (its temperature
  # is a traced input, checked by value in the test above).
  logps.clear()
  state, _, batch, _ = args
  jax.eval_shape(
    functools.partial(update.logp_jit, prompt_len=P, logit_chunk=3),
    graphdef,
    state,
    batch['tokens'],
    batch['attn_mask'],
    jax.ShapeDtypeStruct((), jnp.float32),
  )
  assert logps and all(kw['chunk'] == 3 for kw in logps)


def test_dual_clip_constant_reaches_the_update():
  # Old log-probs log(5) below the policy's: every ratio is 5 at the first
  # update. A < 0 tokens lose min(5, c)·|A| (dual clip binds at c = 3, not at
  # c = 10); A > 0 tokens lose −1.28·A (clip-high). One mini-batch: the
  # metrics are the initial params' loss.
  batch = _with_old_logp(_flat_batch(), shift=-np.log(5.0))
  w, adv = batch['resp_mask'], batch['advantages']
  counted = w > 0

  def expected(c):
    tok = np.where(adv < 0, -adv * min(5.0, c), -adv * 1.28)
    return tok[counted].sum() / counted.sum()

  mesh = _mesh((1, 1, 1))
  got = {}
  for c in (3.0, 10.0):
    s = update.UpdateSettings(
      prompt_len=P, mini_batch_rows=R, micro_batch_rows=8, clip_ratio_c=c
    )
    _, m = _run_update(mesh, s, batch)
    got[c] = m
    np.testing.assert_allclose(m['loss'], expected(c), rtol=1e-4)
  assert got[3.0]['loss'] < got[10.0]['loss']
  assert got[3.0]['clip_frac_lower'] > 0 and got[10.0]['clip_frac_lower'] == 0


def test_update_rejects_a_flat_batch():
  s = update.UpdateSettings(prompt_len=P, mini_batch_rows=8, micro_batch_rows=4)
  graphdef, tx, *args = _abstract_inputs(lead=(R,))
  with pytest.raises(ValueError, match='micro-batches'):
    jax.eval_shape(functools.partial(update._rl_update, graphdef, tx, s), *args)


def test_assemble_batch_cuts_rows_in_order_over_all_row_shards():
  mesh = _mesh((2, 2, 2))
  rng = np.random.default_rng(4)
  b, m_rounds, s_slots = 4, 2, 8
  prompts = rng.integers(0, 64, (b, P)).astype(np.int32)
  pmask = (rng.uniform(size=(b, P)) > 0.2).astype(np.int32)
  buffer = {
    'tokens': rng.integers(0, 64, (m_rounds, s_slots, N)).astype(np.int32),
    'logprobs': rng.normal(size=(m_rounds, s_slots, N)).astype(np.float32),
    'mask': (rng.uniform(size=(m_rounds, s_slots, N)) > 0.3).astype(np.int32),
  }
  prompt_index = rng.integers(0, b, R).astype(np.int32)
  sample_id = rng.integers(0, m_rounds * s_slots, R).astype(np.int32)
  advantage = rng.normal(size=R).astype(np.float32)
  weight = (rng.uniform(size=R) > 0.2).astype(np.float32)
  model = sharding.create_sharded_model(_CFG, mesh, sharding.SAMPLE_RULES)
  out_sharding = rollout._batch_sharding(model, 4)
  out = rollout.assemble_batch(
    jnp.asarray(prompts),
    jnp.asarray(pmask),
    jax.device_put(buffer, rollout._buffer_sharding(model, s_slots)),
    prompt_index,
    sample_id,
    advantage,
    weight,
    slots=s_slots,
    micro_batch_rows=4,
    out_sharding=out_sharding,
  )
  rnd, slot = sample_id // s_slots, sample_id % s_slots
  resp_mask = buffer['mask'][rnd, slot]
  w = resp_mask * weight[:, None]
  want = {
    'tokens': np.concatenate([prompts[prompt_index], buffer['tokens'][rnd, slot]], 1),
    'attn_mask': np.concatenate([pmask[prompt_index], resp_mask], 1),
    'resp_mask': w,
    'advantages': advantage[:, None] * (w > 0),
    'sampler_logp': buffer['logprobs'][rnd, slot],
  }
  assert set(out) == set(want)
  for k, x in out.items():
    # Micro-batch c holds rows [4c, 4c + 4), one row of each on every device.
    assert x.shape == (R // 4, 4, *want[k].shape[1:]), k
    np.testing.assert_allclose(np.asarray(x).reshape(want[k].shape), want[k], err_msg=k)
    assert x.sharding.is_equivalent_to(out_sharding, 3), k
    assert {sh.data.shape[:2] for sh in x.addressable_shards} == {(R // 4, 1)}, k
  # A micro-batch that does not divide over the 4 row shards is replicated.
  assert rollout._batch_sharding(model, 2).is_fully_replicated


# Per-device temporaries vs the row shards. A model whose activations
# dominate its weights: T = 256, a 1024 vocabulary, 2 layers.
_BIG = model_lib.ModelConfig(
  model_type='qwen2',
  vocab_size=1024,
  hidden_size=64,
  intermediate_size=256,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
  qkv_bias=True,
  tie_embeddings=True,
)
_BIG_P, _BIG_N, _BIG_R, _BIG_MICRO = 64, 192, 32, 16


@functools.cache  # The one-device baseline serves both meshes.
def _temp_bytes(mesh_shape) -> tuple[int, int]:
  """(update, old-logp pass) compiled temp bytes per device on this mesh."""
  mesh = _mesh(mesh_shape)
  abstract = nnx.eval_shape(lambda: model_lib.Transformer(_BIG, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  shardings = sharding.state_shardings(state, mesh, sharding.TRAIN_RULES)
  state = jax.tree.map(
    lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s), state, shardings
  )
  tx = update.make_optimizer()
  lead = (_BIG_R // _BIG_MICRO, _BIG_MICRO)
  t = _BIG_P + _BIG_N

  def sds(shape, dtype):
    return jax.ShapeDtypeStruct(lead + shape, dtype, sharding=_micro_sharding(mesh))

  batch = {
    'tokens': sds((t,), jnp.int32),
    'attn_mask': sds((t,), jnp.int32),
    'resp_mask': sds((_BIG_N,), jnp.float32),
    'advantages': sds((_BIG_N,), jnp.float32),
    'old_logp': sds((_BIG_N,), jnp.float32),
  }
  s = update.UpdateSettings(
    prompt_len=_BIG_P, mini_batch_rows=_BIG_MICRO, micro_batch_rows=_BIG_MICRO
  )
  scalar = jax.ShapeDtypeStruct((), jnp.float32)
  upd = update.rl_update.lower(
    graphdef, tx, s, state, abstract_opt_state(tx, state), batch, scalar
  ).compile()
  logp = update.logp_jit.lower(
    graphdef, state, batch['tokens'], batch['attn_mask'], scalar, prompt_len=_BIG_P
  ).compile()
  return (
    upd.memory_analysis().temp_size_in_bytes,
    logp.memory_analysis().temp_size_in_bytes,
  )


@pytest.mark.parametrize(
  'mesh_shape', [(1, 8, 1), (2, 4, 1)], ids=['fsdp8', 'dp2xfsdp4']
)
def test_temp_bytes_shrink_with_the_row_shards(mesh_shape):
  # 8 row shards: each device computes 2 of a micro-batch's 16 rows, in the
  # update and in the old-logp pass, so its temporaries are about 1/8 of one
  # device's. Measured on CPU (jax 0.10.2): update 0.108 / 0.110, old-logp
  # pass 0.094 on both meshes. The flat [R] layout before it measured
  # 0.44 / 0.36 (whole micro-batches on a few devices, rows replicated over
  # fsdp) and 0.45 / 0.22 (all R rows in one forward).
  one_upd, one_logp = _temp_bytes((1, 1, 1))
  upd, logp = _temp_bytes(mesh_shape)
  print(f'{mesh_shape}: update {upd / one_upd:.3f}, old logp {logp / one_logp:.3f}')
  assert upd / one_upd < 1.5 / 8
  assert logp / one_logp < 1.5 / 8
