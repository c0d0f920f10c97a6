"""attention.py: chunked and splash against dense, memory, sharding, TPU lowering."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from ada_jax import attention
from ada_jax import model as model_lib
from ada_jax import sharding as sharding_lib

# GQA (H=4, G=2), every optional feature the blocks touch (biases, q/k norm).
_CONFIG = model_lib.ModelConfig(
  'qwen3', 64, 32, 48, 2, 4, 2, 8, qkv_bias=True, qk_norm=True, attention='dense'
)


@pytest.fixture
def small_blocks(monkeypatch):
  """Block caps that make the tests' short T span several uneven blocks."""
  monkeypatch.setattr(attention, 'BLOCK_Q', 16)
  monkeypatch.setattr(attention, 'BLOCK_K', 8)


def _left_padded(lengths, width, vocab=64, seed=0):
  mask = np.zeros((len(lengths), width), np.int32)
  for i, n in enumerate(lengths):
    mask[i, width - n :] = 1
  tokens = np.random.RandomState(seed).randint(3, vocab, mask.shape) * mask
  return tokens.astype(np.int32), mask


def _padded_both_sides(spans, width, vocab=64, seed=0):
  """Training-row layout: (left pad, real tokens) per row, right pad after."""
  mask = np.zeros((len(spans), width), np.int32)
  for i, (left, n) in enumerate(spans):
    mask[i, left : left + n] = 1
  tokens = np.random.RandomState(seed).randint(3, vocab, mask.shape) * mask
  return tokens.astype(np.int32), mask


def _loss_and_grads(model, tokens, mask):
  """Masked mean of a nonlinear function of the logits (real positions only)."""
  graphdef, state = nnx.split(model)

  def loss(state):
    logits = nnx.merge(graphdef, state).forward(tokens, mask)
    w = jnp.asarray(mask, jnp.float32)[..., None]
    return jnp.sum(jnp.sin(logits) * w) / jnp.sum(w), logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(state)
  return np.asarray(logits), grads


def _max_grad_diff(a, b) -> float:
  return max(
    float(jnp.max(jnp.abs(x - y)))
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
  )


def test_resolve():
  assert attention.resolve('auto', 64, 64) == 'dense'  # the tiny config
  assert attention.resolve('auto', 1, 4096) == 'decode'
  assert attention.resolve('dense', 1, 4096) == 'dense'  # the reference
  assert attention.resolve('auto', 1, 1) == 'dense'  # nothing cached
  assert attention.resolve('auto', 3072, 3072, platform='cpu') == 'chunked'
  # GPU: the fused kernel where cuDNN takes the dtype and head dim.
  bf16 = jnp.bfloat16
  assert attention.resolve('auto', 3072, 3072, 'gpu', bf16, 128) == 'cudnn'
  assert attention.resolve('auto', 3072, 3072, 'gpu', jnp.float32, 128) == 'chunked'
  assert attention.resolve('auto', 3072, 3072, 'gpu', bf16, 12) == 'chunked'
  assert attention.resolve('auto', 3072, 3072, 'gpu', bf16, 256) == 'chunked'
  assert attention.resolve('auto', 3072, 4096, 'gpu', bf16, 128) == 'chunked'
  assert attention.resolve('auto', 1, 4096, 'gpu', bf16, 128) == 'decode'
  assert attention.resolve('cudnn', 8, 8, 'gpu', bf16, 64) == 'cudnn'
  assert attention.resolve('cudnn', 8, 20, 'gpu', bf16, 64) == 'chunked'
  assert attention.resolve('cudnn', 1, 20, 'gpu', bf16, 64) == 'decode'
  with pytest.raises(ValueError, match="attention='cudnn' needs a bf16/fp16"):
    attention.resolve('cudnn', 8, 8, 'gpu', jnp.float32, 64)
  # Off GPU the same call runs XLA's reference, which takes any dtype (tests).
  assert attention.resolve('cudnn', 8, 8, 'cpu', jnp.float32, 12) == 'cudnn'
  assert attention.resolve('auto', 3072, 3072, platform='tpu') == 'splash'
  assert attention.resolve('auto', 3072, 4096, platform='tpu') == 'chunked'
  assert attention.resolve('auto', 256, 256, platform='tpu') == 'dense'
  assert attention.resolve('chunked', 1, 100) == 'decode'
  assert attention.resolve('chunked', 8, 8) == 'chunked'
  assert attention.resolve('splash', 1, 100) == 'decode'
  assert attention.resolve('splash', 8, 20) == 'chunked'
  assert attention.resolve('splash', 8, 8) == 'splash'
  with pytest.raises(ValueError, match='attention='):
    attention.resolve('flash', 8, 8)
  with pytest.raises(ValueError, match='attention='):
    model_lib.ModelConfig('qwen2', 8, 8, 8, 1, 1, 1, 8, attention='flash')
  with pytest.raises(ValueError, match='remat='):
    model_lib.ModelConfig('qwen2', 8, 8, 8, 1, 1, 1, 8, remat='all')


def test_block_size():
  assert attention.block_size(3072, 512) == (512, 6)
  assert attention.block_size(600, 512) == (304, 2)
  assert attention.block_size(24, 512) == (24, 1)
  assert attention.block_size(5, 512) == (8, 1)
  assert attention.block_size(37, 16) == (16, 3)


@pytest.mark.parametrize('output_norm', [False, True])
@pytest.mark.parametrize('prefix', [0, 13])
def test_chunked_function_matches_dense(prefix, output_norm, monkeypatch):
  """Outputs and q/k/v gradients, with a cache prefix and a fully masked row.

  output_norm: dense normalizes on its output (what it does for large
  [T, S]; forced here at these small shapes) instead of the plain softmax.
  """
  if output_norm:
    monkeypatch.setattr(attention, 'DENSE_OUTPUT_NORM_MIN', 0)
  b, t, h, g, k = 3, 37, 4, 2, 8
  s = prefix + t
  rng = np.random.RandomState(0)
  q, kk, v = (
    jnp.asarray(rng.randn(*shape), jnp.float32)
    for shape in ((b, t, h, k), (b, g, s, k), (b, g, s, k))
  )
  # Row 0: all real. Row 1: 20 real tokens at the end. Row 2: no real token
  # at all (every query fully masked: must stay finite).
  valid = np.zeros((b, s), bool)
  valid[0] = True
  valid[1, s - 20 :] = True
  if prefix:
    valid[1, 3:prefix] = True  # a cache prefix with its own left padding
  query_index = jnp.broadcast_to(prefix + jnp.arange(t), (b, t))
  real = valid[:, prefix:]
  w = jnp.asarray(real, jnp.float32)[:, :, None, None]
  cot = jnp.asarray(rng.randn(b, t, h, k), jnp.float32) * w

  def dense(q, kk, v):
    mask = attention.dense_mask(query_index, jnp.asarray(valid))
    return attention.dense_attention(q, kk, v, mask, jnp.float32)

  def chunked(q, kk, v):
    return attention.chunked_attention(
      q, kk, v, query_index, jnp.asarray(valid), block_q=16, block_k=8
    )

  out_d, vjp_d = jax.vjp(dense, q, kk, v)
  out_c, vjp_c = jax.vjp(chunked, q, kk, v)
  assert np.isfinite(np.asarray(out_c)).all()
  np.testing.assert_allclose(
    np.asarray(out_c)[real], np.asarray(out_d)[real], atol=1e-5
  )
  for gd, gc in zip(vjp_d(cot), vjp_c(cot), strict=True):
    assert np.isfinite(np.asarray(gc)).all()
    np.testing.assert_allclose(np.asarray(gc), np.asarray(gd), atol=1e-5)


@jax.jit
def _dense_decode_reference(q, k, v, query_index, valid):
  mask = attention.dense_mask(query_index, valid)
  return attention.dense_attention(q, k, v, mask, jnp.float32)


@pytest.mark.parametrize('query_at', [20, 36])
def test_decode_matches_dense_and_reads_only_written_blocks(query_at):
  """Left-padded ragged rows, one query each; S = 37 (a clamped last block)."""
  b, h, g, k, s, tk = 4, 4, 2, 8, 37, 8
  decode = jax.jit(functools.partial(attention.decode_attention, block_k=tk))
  key_blocks = jax.jit(attention.decode_key_blocks, static_argnums=2)
  rng = np.random.RandomState(1)
  q = jnp.asarray(rng.randn(b, 1, h, k), jnp.float32)
  kk, v = (rng.randn(b, g, s, k).astype(np.float32) for _ in range(2))
  # Prompt bucket 16: rows hold 3, 9, 16, 1 real prompt tokens (left padded),
  # then generated tokens up to the query's index; later slots unwritten.
  prompt, lengths = 16, [3, 9, 16, 1]
  valid = np.zeros((b, s), bool)
  for i, n in enumerate(lengths):
    valid[i, prompt - n : query_at + 1] = True
  query_index = jnp.full((b, 1), query_at, jnp.int32)
  first, end = (int(x) for x in key_blocks(query_index, valid.copy(), tk))
  assert (first, end) == (0, query_at // tk + 1)  # row 2 starts at key 0
  # Copies: a CPU device array may alias the numpy buffer changed below.
  dense = np.asarray(
    _dense_decode_reference(q, kk.copy(), v.copy(), query_index, valid.copy())
  )
  # Keys and values outside the blocks [first, end) are never read.
  kk[:, :, end * tk :], v[:, :, end * tk :] = np.nan, np.nan
  got = decode(q, kk.copy(), v.copy(), query_index, valid.copy())
  np.testing.assert_allclose(np.asarray(got), dense, atol=1e-5)
  # Every row's span starting at key 8 or later, the loop starts at block 1:
  # NaN before it is never read either.
  valid[:, :8] = False
  assert int(key_blocks(query_index, valid.copy(), tk)[0]) == 1
  ref = np.asarray(
    _dense_decode_reference(
      q, np.nan_to_num(kk), np.nan_to_num(v), query_index, valid.copy()
    )
  )
  kk[:, :, :8], v[:, :, :8] = np.nan, np.nan
  got = decode(q, kk.copy(), v.copy(), query_index, valid.copy())
  np.testing.assert_allclose(np.asarray(got), ref, atol=1e-5)


@pytest.mark.parametrize('keys_transposed', [False, True])
def test_short_cache_is_read_whole_and_matches_dense_and_the_loop(keys_transposed):
  """A 2-block cache (read whole, no loop) against dense and the loop.

  S = 13: blocks of 8 (two: read whole) and of 4 (four: the loop), with
  left-padded ragged rows; keys held [B, G, S, K] or transposed [B, G, K, S].
  """
  b, h, g, k, s = 3, 4, 2, 8, 13
  rng = np.random.RandomState(2)
  q = jnp.asarray(rng.randn(b, 1, h, k), jnp.float32)
  kk, v = (jnp.asarray(rng.randn(b, g, s, k), jnp.float32) for _ in range(2))
  valid = np.zeros((b, s), bool)
  for i, start in enumerate([0, 4, 9]):
    valid[i, start:11] = True
  valid = jnp.asarray(valid)
  query_index = jnp.full((b, 1), 10, jnp.int32)
  assert -(-s // 8) <= attention.DECODE_WHOLE_MAX_BLOCKS < -(-s // 4)
  keys = jnp.swapaxes(kk, 2, 3) if keys_transposed else kk
  whole, loop = (
    jax.jit(
      functools.partial(
        attention.decode_attention, block_k=tk, keys_transposed=keys_transposed
      )
    )(q, keys, v, query_index, valid)
    for tk in (8, 4)
  )
  dense = _dense_decode_reference(q, kk, v, query_index, valid)
  np.testing.assert_allclose(np.asarray(whole), np.asarray(dense), atol=1e-5)
  np.testing.assert_allclose(np.asarray(whole), np.asarray(loop), atol=1e-5)


@pytest.mark.parametrize('layout', ['plain', 'transposed', 'blocked'])
@pytest.mark.parametrize('group', [1, 2, 4])
def test_decode_with_shared_prefix_matches_dense_over_the_joined_cache(group, layout):
  """Slots in groups of `group` share a left-padded prompt prefix (P = 21).

  The oracle is dense attention over each slot's own [prefix, response]
  cache; NaN in the response after the query proves it is not read. The
  prefix is read whole, without a loop, from its keys transposed
  ([.., K, P]). The response (13 keys, 4 blocks of 4) is held [.., S, K]
  ('plain'), with its keys [.., K, S] ('transposed', as a sampler round holds
  a response it reads whole) or in blocks ('blocked', as a round on CPU
  holds a response it reads block by block: tuples of 4 buffers [B, G, K, 4]
  and [B, G, 4, K], the 13 keys padded to 16).
  """
  groups, h, g, k, p, n, tk = 4, 4, 2, 8, 21, 13, 4
  b = groups * group
  rng = np.random.RandomState(2)
  q = jnp.asarray(rng.randn(b, 1, h, k), jnp.float32)
  pk, pv = (rng.randn(groups, g, p, k).astype(np.float32) for _ in range(2))
  rk, rv = (rng.randn(b, g, n, k).astype(np.float32) for _ in range(2))
  lengths, written = [5, 13, 9, 1], 7  # Prompt tokens per group; response keys.
  pvalid = np.zeros((groups, p), bool)
  for i, m in enumerate(lengths):
    pvalid[i, p - m :] = True
  rvalid = np.zeros((b, n), bool)
  rvalid[:, :written] = True
  # The joined cache each slot sees, for the dense oracle.
  own = np.repeat(np.arange(groups), group)
  joined_k = np.concatenate([pk[own], rk], axis=2)
  joined_v = np.concatenate([pv[own], rv], axis=2)
  joined_valid = np.concatenate([pvalid[own], rvalid], axis=1)
  ref = np.asarray(
    _dense_decode_reference(
      q,
      joined_k,
      joined_v,
      jnp.full((b, 1), p + written - 1, jnp.int32),
      joined_valid,
    )
  )
  end = -(-written // tk) * tk
  rk[:, :, end:], rv[:, :, end:] = np.nan, np.nan

  if layout == 'blocked':
    pad = ((0, 0), (0, 0), (0, 16 - n), (0, 0))
    rk, rv = (np.pad(x, pad).reshape(b, g, 4, tk, k) for x in (rk, rv))
    rk, rv = rk.transpose(2, 0, 1, 4, 3), rv.transpose(2, 0, 1, 3, 4)
    rk, rv = tuple(rk), tuple(rv)  # 4 buffers each.
    rvalid = np.pad(rvalid, ((0, 0), (0, 16 - n)))

  @jax.jit
  def decode(q, rk, rv, rvalid, pk, pv, pvalid, qi):
    if layout == 'transposed':
      rk = jnp.swapaxes(rk, 2, 3)
    prefix = attention.SharedPrefix(jnp.swapaxes(pk, 2, 3), pv, pvalid)
    return attention.decode_attention(
      q,
      rk,
      rv,
      qi,
      rvalid,
      block_k=tk,
      prefix=prefix,
      keys_transposed=layout == 'transposed',
    )

  args = (q, rk, rv, rvalid, pk, pv, pvalid, jnp.full((b, 1), written - 1, jnp.int32))
  got = decode(*args)
  np.testing.assert_allclose(np.asarray(got), ref, atol=1e-5)
  hlo = decode.lower(*args).compile().as_text()
  if layout != 'blocked':
    # One loop, the response's (4 blocks): the prefix (6 blocks) is read
    # whole, in one product (a block loop would read every block from the
    # longest prompt's first one anyway).
    assert hlo.count(' while(') == 1
  else:
    # No loop: one conditional per block (the query index is traced, so none
    # folds away), each reading its buffers in place.
    assert hlo.count(' while(') == 0 and hlo.count(' conditional(') == 4
    # A cache's blocks are its own: another block size is an error.
    with pytest.raises(ValueError, match='cache of 4 blocks of 4 keys does not'):
      attention.decode_attention(
        q,
        tuple(map(jnp.asarray, rk)),
        tuple(map(jnp.asarray, rv)),
        jnp.zeros((b, 1), jnp.int32),
        jnp.asarray(rvalid),
        block_k=8,
      )
  # The model's path: the mask carries the prefix's validity.
  mask = attention.make_mask(
    jnp.full((b, 1), written - 1, jnp.int32), jnp.asarray(rvalid), 'decode', pvalid
  )
  np.testing.assert_array_equal(np.asarray(mask.prefix_valid), pvalid)
  with pytest.raises(ValueError, match='shared prompt prefix needs decode'):
    attention.make_mask(
      jnp.zeros((b, 1), jnp.int32), jnp.asarray(rvalid), 'dense', pvalid
    )


def test_chunked_bf16_close_to_dense():
  b, t, h, g, k = 2, 40, 4, 2, 16
  rng = np.random.RandomState(1)
  q, kk, v = (
    jnp.asarray(rng.randn(*shape), jnp.bfloat16)
    for shape in ((b, t, h, k), (b, g, t, k), (b, g, t, k))
  )
  qi = jnp.broadcast_to(jnp.arange(t), (b, t))
  valid = jnp.ones((b, t), bool)
  dense = attention.dense_attention(
    q, kk, v, attention.dense_mask(qi, valid), jnp.bfloat16
  )
  out = attention.chunked_attention(q, kk, v, qi, valid, block_q=16, block_k=16)
  assert out.dtype == jnp.bfloat16
  diff = jnp.abs(out.astype(jnp.float32) - dense.astype(jnp.float32))
  assert float(jnp.max(diff)) < 0.05


def test_chunked_model_matches_dense(small_blocks):
  """Logits and param gradients, GQA, left padding, T a multiple of no block."""
  dense = model_lib.create_model(_CONFIG)
  chunked = model_lib.with_config(dense, attention='chunked')
  tokens, mask = _left_padded([37, 20, 3], 37)
  logits_d, grads_d = _loss_and_grads(dense, tokens, mask)
  logits_c, grads_c = _loss_and_grads(chunked, tokens, mask)
  real = mask.astype(bool)
  assert np.isfinite(logits_c).all()
  assert np.abs(logits_c - logits_d)[real].max() <= 1e-4
  assert _max_grad_diff(grads_c, grads_d) <= 1e-4


@pytest.mark.parametrize('per_row_index', [False, True])
def test_chunked_with_cache_prefix(small_blocks, per_row_index):
  """A second chunk of T > 1 tokens written after a prompt in the cache."""
  dense = model_lib.create_model(_CONFIG)
  chunked = model_lib.with_config(dense, attention='chunked')
  b, p, t = 3, 20, 11
  tokens, mask = _left_padded([20, 9, 2], p)
  more = np.random.RandomState(5).randint(3, 64, (b, t)).astype(np.int32)
  pos = model_lib.positions_from_mask(jnp.asarray(mask))
  more_pos = pos[:, -1:] + 1 + jnp.arange(t)[None]
  outs = []
  for model in (dense, chunked):
    cache = model_lib.init_cache(_CONFIG, b, p + t + 5)
    idx0 = jnp.zeros((b,), jnp.int32) if per_row_index else jnp.int32(0)
    first, cache = model(jnp.asarray(tokens), pos, cache, idx0, jnp.asarray(mask))
    idx1 = jnp.full((b,), p, jnp.int32) if per_row_index else jnp.int32(p)
    second, _ = model(
      jnp.asarray(more), more_pos, cache, idx1, jnp.ones((b, t), jnp.int32)
    )
    outs.append((np.asarray(first), np.asarray(second)))
  real = mask.astype(bool)
  np.testing.assert_allclose(outs[1][0][real], outs[0][0][real], atol=1e-4)
  np.testing.assert_allclose(outs[1][1], outs[0][1], atol=1e-4)


def test_roll_rows_and_its_backward():
  x = jnp.arange(2 * 5 * 3, dtype=jnp.float32).reshape(2, 5, 3)
  shift = jnp.array([2, 0], jnp.int32)
  rolled = attention.roll_rows(x, shift)
  np.testing.assert_array_equal(rolled[0], np.roll(np.asarray(x[0]), -2, axis=0))
  np.testing.assert_array_equal(rolled[1], x[1])
  np.testing.assert_array_equal(attention.roll_rows(rolled, -shift), x)
  # The custom backward (the opposite roll) equals autodiff's scatter-add.
  w = jnp.cos(jnp.arange(x.size, dtype=jnp.float32)).reshape(x.shape)
  custom = jax.grad(lambda a: jnp.sum(attention.roll_rows(a, shift) * w))(x)
  plain = jax.grad(lambda a: jnp.sum(attention._roll(a, shift) * w))(x)
  np.testing.assert_array_equal(custom, plain)
  mask = jnp.array([[0, 0, 1, 1, 0], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(attention.left_pads(mask), [2, 0, 0])


def test_fused_attention_of_left_aligned_rows_matches_dense():
  """The kernel's call (XLA implementation here) on rows rolled to the left."""
  b, t, h, g, k = 3, 24, 4, 2, 8
  rs = np.random.RandomState(1)
  q, kk, v = (jnp.asarray(rs.randn(b, t, n, k), jnp.float32) for n in (h, g, g))
  tokens, mask = _padded_both_sides([(5, 12), (0, 24), (9, 1)], t)
  del tokens
  valid = jnp.asarray(mask, bool)
  qi = jnp.broadcast_to(jnp.arange(t)[None], (b, t))
  dense = attention.dense_attention(
    q,
    kk.transpose(0, 2, 1, 3),
    v.transpose(0, 2, 1, 3),
    attention.dense_mask(qi, valid),
    jnp.float32,
  )
  shift = attention.left_pads(valid)
  m = attention.make_mask(qi, attention.roll_rows(valid, shift), 'cudnn')
  np.testing.assert_array_equal(m.lengths, [12, 24, 1])
  roll = functools.partial(attention.roll_rows, shift=shift)
  out = attention.fused_attention(roll(q), roll(kk), roll(v), m.lengths, 'cpu')
  out = attention.roll_rows(out, -shift)
  np.testing.assert_allclose(
    np.asarray(out)[mask.astype(bool)], np.asarray(dense)[mask.astype(bool)], atol=1e-5
  )


@pytest.mark.parametrize('remat', ['none', 'block'])
@pytest.mark.parametrize('layout', ['left', 'both'])
def test_cudnn_model_matches_dense(remat, layout):
  """The left-aligning transform: logits and param gradients equal dense's.

  The model runs attention='cudnn' through `jax.nn.dot_product_attention`
  with implementation='xla' (the CPU row of the platform table), so all but
  the kernel swap is checked here: left-padded ragged prompts, training rows
  padded on both sides, a row of padding only. (Without the roll, i.e.
  left_pads returning zeros, this and the prefill test fail.)
  """
  dense = model_lib.with_config(model_lib.create_model(_CONFIG), remat=remat)
  fused = model_lib.with_config(dense, attention='cudnn')
  if layout == 'left':
    tokens, mask = _left_padded([37, 20, 3, 0], 37)
  else:
    tokens, mask = _padded_both_sides([(4, 25), (0, 37), (30, 2), (10, 0)], 37)
  logits_d, grads_d = _loss_and_grads(dense, tokens, mask)
  logits_f, grads_f = _loss_and_grads(fused, tokens, mask)
  real = mask.astype(bool)
  assert np.isfinite(logits_f).all()
  assert np.abs(logits_f - logits_d)[real].max() <= 1e-4
  assert _max_grad_diff(grads_f, grads_d) <= 1e-4


def test_cudnn_prefill_writes_the_cache_in_the_usual_layout():
  """A prefill with the fused kernel: logits, K/V cache, and a decode step after."""
  dense = model_lib.create_model(_CONFIG)
  fused = model_lib.with_config(dense, attention='cudnn')
  tokens, mask = _left_padded([20, 9, 2], 20)
  pos = model_lib.positions_from_mask(jnp.asarray(mask))
  outs = []
  for model in (dense, fused):
    cache = model_lib.init_cache(_CONFIG, 3, 20)
    logits, cache = model(
      jnp.asarray(tokens), pos, cache, jnp.int32(0), jnp.asarray(mask)
    )
    outs.append((np.asarray(logits), cache))
  real = mask.astype(bool)
  np.testing.assert_allclose(outs[1][0][real], outs[0][0][real], atol=1e-4)
  (_, c_d), (_, c_f) = outs
  np.testing.assert_array_equal(c_f.valid, c_d.valid)
  for a, b in zip(c_f.k + c_f.v, c_d.k + c_d.v, strict=True):
    np.testing.assert_allclose(
      np.asarray(a).transpose(0, 2, 1, 3)[real],
      np.asarray(b).transpose(0, 2, 1, 3)[real],
      atol=1e-5,
    )


def _t_by_t_shapes(hlo: str, t: int) -> list[str]:
  """Array shapes in HLO text with two or more dims of size >= t."""
  found = []
  for dims in re.findall(r'\b(?:f32|bf16|f16|pred)\[([0-9,]+)\]', hlo):
    sizes = [int(d) for d in dims.split(',') if d]
    if sum(d >= t for d in sizes) >= 2:
      found.append(dims)
  return found


def test_chunked_never_materializes_t_by_t():
  """1 layer, T = 1024: the compiled training step holds no [.., T, T] array.

  Measured on jax 0.10.2 CPU, default 512 blocks: forward temp 48.1 MiB dense
  vs 9.1 MiB chunked, forward+backward 66.5 vs 23.4 MiB (2.8x; at T = 3072:
  584 vs 28.5 MiB, 20x).
  """
  t = 1024
  config = model_lib.ModelConfig('qwen2', 64, 64, 128, 1, 4, 2, 16, qkv_bias=True)
  model = model_lib.create_model(config)
  tokens = jax.ShapeDtypeStruct((1, t), jnp.int32)
  temps, shapes = {}, {}
  for impl in ('dense', 'chunked'):
    graphdef, state = nnx.split(model_lib.with_config(model, attention=impl))

    def loss(state, tokens, mask, graphdef=graphdef):
      return jnp.mean(nnx.merge(graphdef, state).forward(tokens, mask))

    compiled = jax.jit(jax.grad(loss)).lower(state, tokens, tokens).compile()
    temps[impl] = compiled.memory_analysis().temp_size_in_bytes
    shapes[impl] = _t_by_t_shapes(compiled.as_text(), t)
  assert shapes['dense'], 'the check must see the dense scores'
  assert not shapes['chunked'], shapes['chunked']
  assert temps['chunked'] * 2 < temps['dense'], temps


# ---------------------------------------------------------------- splash


def test_splash_segment_ids_and_blocks():
  ids = attention.splash_segment_ids(jnp.asarray([[0, 0, 1, 1], [1, 1, 1, 1]]), 6)
  np.testing.assert_array_equal(ids, [[0, 0, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]])
  assert ids.dtype == jnp.int32
  assert attention.splash_block(40) == (128, 128)
  assert attention.splash_block(3072) == (3072, 512)
  assert attention.splash_block(640) == (640, 128)
  assert attention.splash_block(768) == (768, 256)


def _qkv(b, t, h, g, k, seed=0):
  rng = np.random.RandomState(seed)
  return tuple(
    jnp.asarray(rng.randn(*shape), jnp.float32)
    for shape in ((b, t, h, k), (b, g, t, k), (b, g, t, k))
  )


def _dense_no_prefix(q, k, v, valid):
  b, t = valid.shape
  qi = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = attention.dense_mask(qi, jnp.asarray(valid))
  return attention.dense_attention(q, k, v, mask, q.dtype)


def test_splash_interpret_matches_dense():
  """The Pallas kernel itself, in interpret mode on CPU: outputs and grads."""
  b, t, h, g, k = 2, 40, 4, 2, 16
  q, kk, v = _qkv(b, t, h, g, k)
  _, valid = _left_padded([40, 13], t)
  valid = valid.astype(bool)
  cot = jnp.asarray(np.random.RandomState(3).randn(b, t, h, k), jnp.float32)
  cot = cot * jnp.asarray(valid, jnp.float32)[:, :, None, None]

  def splash(q, kk, v):
    return attention.splash_attention(
      q, kk, v, jnp.asarray(valid, jnp.int32), interpret=True
    )

  out_s, vjp_s = jax.vjp(splash, q, kk, v)
  out_d, vjp_d = jax.vjp(lambda *a: _dense_no_prefix(*a, valid), q, kk, v)
  assert np.isfinite(np.asarray(out_s)).all()
  np.testing.assert_allclose(
    np.asarray(out_s)[valid], np.asarray(out_d)[valid], atol=1e-5
  )
  for gs, gd in zip(vjp_s(cot), vjp_d(cot), strict=True):
    np.testing.assert_allclose(np.asarray(gs), np.asarray(gd), atol=1e-5)


def _stand_in_kernel(heads, tp, interpret):
  """The splash kernel's interface, computed densely: q [h, T, K], k/v [g, T, K]."""
  del interpret

  def kernel(q, k, v, segment_ids):
    assert q.shape == (heads, tp, q.shape[-1]), q.shape
    r = q.shape[0] // k.shape[0]
    k, v = jnp.repeat(k, r, axis=0), jnp.repeat(v, r, axis=0)
    seg = segment_ids.q[:, None] == segment_ids.kv[None, :]
    allow = (jnp.arange(tp)[None, :] <= jnp.arange(tp)[:, None]) & seg
    s = jnp.where(allow, jnp.einsum('htk,hsk->hts', q, k), attention.MASK_VALUE)
    return jnp.einsum('hts,hsk->htk', jax.nn.softmax(s, axis=-1), v)

  return kernel


@pytest.mark.parametrize(
  'mesh_shape',
  [
    (2, 2, 2),  # KV heads split over tensor
    (1, 2, 4),  # tensor 4 > G = 2: KV heads repeated to the 4 query heads
    (8, 1, 1),  # rows only
  ],
)
def test_splash_shard_map_wrapper(monkeypatch, mesh_shape):
  """Rows and heads split as specified, with a dense stand-in for the kernel."""
  monkeypatch.setattr(attention, '_splash_kernel', _stand_in_kernel)
  mesh = sharding_lib.make_mesh(mesh_shape)
  b, t, h, g, k = 8, 24, 4, 2, 8
  q, kk, v = _qkv(b, t, h, g, k)
  _, valid = _left_padded([24, 10, 3, 24, 1, 7, 20, 16], t)
  valid = valid.astype(bool)
  batch = sharding_lib.BATCH_AXES
  q = jax.device_put(q, jax.NamedSharding(mesh, jax.P(batch, None, 'tensor', None)))
  kv_heads = 'tensor' if g % mesh.shape['tensor'] == 0 else None
  kk, v = (
    jax.device_put(x, jax.NamedSharding(mesh, jax.P(batch, kv_heads, None, None)))
    for x in (kk, v)
  )
  seg = jax.device_put(jnp.asarray(valid, jnp.int32), sharding_lib.batch_sharding(mesh))
  out = jax.jit(attention.splash_attention)(q, kk, v, seg)
  ref = _dense_no_prefix(q, kk, v, valid)
  np.testing.assert_allclose(np.asarray(out)[valid], np.asarray(ref)[valid], atol=1e-5)
  text = jax.jit(attention.splash_attention).lower(q, kk, v, seg).as_text()
  assert 'manual_computation' in text or 'shard_map' in text


@pytest.mark.parametrize(
  'impl', ['chunked', 'cudnn', pytest.param('splash', marks=pytest.mark.slow)]
)
def test_sharded_model_matches_dense(small_blocks, impl):
  """The model on 8 devices (TRAIN_RULES); splash: shard_map + Pallas interpret.

  cudnn: the left-aligning rolls of sharded rows (XLA's reference kernel).
  """
  mesh = sharding_lib.make_mesh((2, 2, 2))
  dense = sharding_lib.create_sharded_model(_CONFIG, mesh)
  other = model_lib.with_config(dense, attention=impl)
  tokens, mask = _left_padded([40, 20, 3, 11], 40)
  rows = sharding_lib.batch_sharding(mesh)
  tokens, mask = (jax.device_put(x, rows) for x in (tokens, mask))
  logits_d, grads_d = _loss_and_grads(dense, tokens, mask)
  logits_o, grads_o = _loss_and_grads(other, tokens, mask)
  real = np.asarray(mask).astype(bool)
  assert np.isfinite(logits_o).all()
  assert np.abs(logits_o - logits_d)[real].max() <= 1e-4
  assert _max_grad_diff(grads_o, grads_d) <= 1e-4


def test_splash_cross_lowers_for_tpu():
  """The sharded training step with the real (Mosaic) kernel exports for TPU.

  The TPU target comes from the model's platform, not the running backend.
  """
  mesh = sharding_lib.make_mesh((2, 2, 2))
  model = sharding_lib.create_sharded_model(_CONFIG, mesh)
  model = model_lib.with_config(model, attention='splash', platform='tpu')
  graphdef, state = nnx.split(model)
  abstract = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state
  )
  rows = jax.ShapeDtypeStruct(
    (8, 256), jnp.int32, sharding=sharding_lib.batch_sharding(mesh)
  )

  def step(state, tokens, mask):
    def loss(state):
      return jnp.mean(nnx.merge(graphdef, state).forward(tokens, mask))

    return jax.value_and_grad(loss)(state)

  exported = jax.export.export(jax.jit(step), platforms=['tpu'])(abstract, rows, rows)
  text = exported.mlir_module()
  assert exported.platforms == ('tpu',)
  assert exported.nr_devices == 8
  assert 'tpu_custom_call' in text
  assert 'manual_computation' in text or 'shard_map' in text
