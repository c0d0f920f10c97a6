"""Model numerics against transformers and against its own full forward."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ada_jax import attention, hf
from ada_jax import model as model_lib
from tests import hf_fixtures


@pytest.fixture
def small_blocks(monkeypatch):
  """Chunked block caps that split the tests' short T into uneven blocks."""
  monkeypatch.setattr(attention, 'BLOCK_Q', 16)
  monkeypatch.setattr(attention, 'BLOCK_K', 8)


@pytest.mark.parametrize('impl', ['auto', 'chunked'])
@pytest.mark.parametrize('variant', list(hf_fixtures.VARIANTS))
def test_logits_match_transformers_left_padded(hf_models, variant, impl, small_blocks):
  path, torch_model = hf_models[variant]
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(0), [24, 17, 5, 1], 24
  )
  model = model_lib.with_config(hf.load_model(path), attention=impl)
  ours = np.asarray(model_lib.logits(model, tokens, mask))
  ref = hf_fixtures.torch_logits(torch_model, tokens, mask)
  real = mask.astype(bool)
  assert ours.dtype == np.float32 and ours.shape == (4, 24, hf_fixtures.VOCAB)
  diff = np.abs(ours - ref)[real].max()
  assert diff <= 1e-4, f'{variant}: max abs diff {diff}'


def test_left_padding_does_not_change_logits(hf_models):
  path, _ = hf_models['qwen2_tied']
  model = hf.load_model(path)
  tokens, mask = hf_fixtures.left_padded_batch(np.random.RandomState(1), [9], 9)
  padded = np.concatenate([np.zeros((1, 7), np.int32), tokens], 1)
  pmask = np.concatenate([np.zeros((1, 7), np.int32), mask], 1)
  a = np.asarray(model_lib.logits(model, tokens, mask))[0]
  b = np.asarray(model_lib.logits(model, padded, pmask))[0, 7:]
  np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize('variant', ['qwen3', 'llama3_tied'])
@pytest.mark.parametrize('per_row_index', [False, True])
def test_incremental_decode_equals_full_forward(hf_models, variant, per_row_index):
  path, _ = hf_models[variant]
  model = hf.load_model(path)
  c = model.config
  b, prompt, total = 3, 6, 14
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(2), [6, 4, 2], prompt
  )
  rest = np.random.RandomState(3).randint(3, c.vocab_size, (b, total - prompt))
  full_tokens = np.concatenate([tokens, rest], 1).astype(np.int32)
  full_mask = np.concatenate([mask, np.ones_like(rest)], 1).astype(np.int32)
  expected = np.asarray(model_lib.logits(model, full_tokens, full_mask))

  cache = model_lib.init_cache(c, b, total)
  idx = jnp.zeros((b,), jnp.int32) if per_row_index else jnp.int32(0)
  pos = model_lib.positions_from_mask(jnp.asarray(mask))
  out, cache = model(jnp.asarray(tokens), pos, cache, idx, jnp.asarray(mask))
  real = mask.astype(bool)
  np.testing.assert_allclose(
    np.asarray(out)[real], expected[:, :prompt][real], atol=1e-4
  )
  next_pos = pos[:, -1] + 1
  for t in range(prompt, total):
    idx_t = jnp.full((b,), t, jnp.int32) if per_row_index else jnp.int32(t)
    out, cache = model(
      jnp.asarray(full_tokens[:, t : t + 1]),
      next_pos[:, None],
      cache,
      idx_t,
      jnp.ones((b, 1), jnp.int32),
    )
    np.testing.assert_allclose(
      np.asarray(out)[:, 0], expected[:, t], atol=1e-4, err_msg=f'position {t}'
    )
    next_pos = next_pos + 1


def test_write_kv_into_blocks_equals_a_whole_cache_split_into_blocks():
  """A cache in blocks (a round's on CPU) holds what a [B, G, S, K] cache holds.

  One token at a time at every index, the keys written transposed
  ([B, G, K, tk] blocks) and the values not ([B, G, tk, K]); a block
  untouched by a write keeps its contents (NaN stays NaN). More than one
  token, or an index per row, is a named error.
  """
  b, g, k, tk, nb = 2, 3, 4, 4, 3
  rng = np.random.RandomState(0)
  new = rng.randn(nb * tk, b, 1, g, k).astype(np.float32)
  kb = tuple(jnp.full((b, g, k, tk), jnp.nan) for _ in range(nb))
  vb = tuple(jnp.full((b, g, tk, k), jnp.nan) for _ in range(nb))
  whole = jnp.full((b, g, nb * tk, k), jnp.nan)
  write = jax.jit(model_lib.write_kv)
  for i in range(nb * tk - 1):  # The last slot stays unwritten.
    kb, vb = write(kb, vb, new[i], -new[i], jnp.int32(i))
    whole = model_lib.write_cache(whole, new[i].transpose(0, 2, 1, 3), jnp.int32(i), 2)
    blocks = np.asarray(whole).reshape(b, g, nb, tk, k).transpose(2, 0, 1, 3, 4)
    np.testing.assert_array_equal(np.stack(vb), -blocks)
    np.testing.assert_array_equal(np.stack(kb), np.swapaxes(blocks, -1, -2))
  two = np.concatenate([new[0], new[1]], axis=1)  # [B, 2, G, K]
  with pytest.raises(ValueError, match='cache in blocks takes one token at one index'):
    model_lib.write_kv(kb, vb, two, two, jnp.int32(0))
  with pytest.raises(ValueError, match='cache in blocks takes one token at one index'):
    model_lib.write_kv(kb, vb, new[0], new[0], jnp.zeros((b,), jnp.int32))


def test_bf16_compute_gives_fp32_logits_close_to_fp32(hf_models):
  path, _ = hf_models['qwen2_untied']
  tokens, mask = hf_fixtures.left_padded_batch(np.random.RandomState(4), [8, 5], 8)
  f32 = np.asarray(model_lib.logits(hf.load_model(path), tokens, mask))
  bf16_model = hf.load_model(path, dtype=jnp.bfloat16, param_dtype=jnp.float32)
  bf = model_lib.logits(bf16_model, tokens, mask)
  assert bf.dtype == jnp.float32
  assert jax.tree.leaves(bf16_model)[0].dtype == jnp.float32  # fp32 master params.
  real = mask.astype(bool)
  assert np.abs(np.asarray(bf) - f32)[real].max() < 0.1


def test_every_param_has_logical_axes(hf_models):
  model = hf.load_model(hf_models['qwen3'][0])
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    axes = var.get_metadata().get('axes')
    assert axes is not None and len(axes) == var.get_value().ndim, path


def _grads(model, tokens, mask):
  graphdef, state = nnx.split(model)

  def loss(state):
    logits = nnx.merge(graphdef, state).forward(tokens, mask)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    tgt = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    w = mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(tgt * w) / jnp.sum(w), logits

  return jax.jit(jax.value_and_grad(loss, has_aux=True))(state)


@pytest.mark.parametrize('impl', ['dense', 'chunked'])
def test_remat_block_keeps_values_and_gradients(hf_models, impl, small_blocks):
  model = model_lib.with_config(hf.load_model(hf_models['qwen3'][0]), attention=impl)
  remat = model_lib.with_config(model, remat='block')
  tokens, mask = hf_fixtures.left_padded_batch(np.random.RandomState(6), [24, 9], 24)
  tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
  (loss_a, logits_a), grads_a = _grads(model, tokens, mask)
  (loss_b, logits_b), grads_b = _grads(remat, tokens, mask)
  np.testing.assert_allclose(logits_b, logits_a, atol=1e-6)
  np.testing.assert_allclose(loss_b, loss_a, atol=1e-6)
  for a, b in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b), strict=True):
    np.testing.assert_allclose(b, a, atol=1e-6)


def test_with_config_shares_params_and_rejects_shape_changes(hf_models):
  model = hf.load_model(hf_models['qwen2_tied'][0])
  other = model_lib.with_config(model, attention='chunked', remat='block')
  assert (other.config.attention, other.config.remat) == ('chunked', 'block')
  assert model.config.attention == 'auto' and model.config.remat == 'none'
  assert other.embed.get_value() is model.embed.get_value()
  with pytest.raises(ValueError, match='num_layers'):
    model_lib.with_config(model, num_layers=1)


def test_remat_block_cuts_the_backward_memory():
  """Scanned, checkpointed blocks keep one input per layer, not every activation."""
  c = model_lib.ModelConfig(
    'qwen2', 256, 128, 512, 8, 4, 2, 32, qkv_bias=True, tie_embeddings=True,
    max_position_embeddings=256,
  )  # fmt: skip
  tokens = jnp.ones((4, 128), jnp.int32)

  def temp(remat):
    graphdef, state = nnx.split(
      model_lib.create_model(dataclasses.replace(c, remat=remat))
    )

    def loss(state):
      return jnp.mean(nnx.merge(graphdef, state).forward(tokens, tokens) ** 2)

    compiled = jax.jit(jax.grad(loss)).lower(state).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  none, block = temp('none'), temp('block')
  assert block < 0.5 * none, (none, block)
