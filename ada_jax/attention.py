"""Attention for the policy: one entry point, five implementations.

Every attention call of the model (training forward, prefill, decode) goes
through `attend`, with an implementation resolved statically by `resolve` from
`ModelConfig.attention` and the call's shapes:

  dense    scores [B, G, R, T, S] in fp32, masked, softmaxed in fp32. The
           reference (attention='dense' uses it for every call, decode
           included).
  chunked  online-softmax (flash-style) blockwise attention in plain JAX: a
           scan over query blocks of BLOCK_Q, inside it a loop over key blocks
           of BLOCK_K, fp32 running max / sum / accumulator; the live block is
           [B, G, R, tq, tk] and neither the [B, 1, T, S] mask nor the
           [B, G, R, T, S] scores ever exist. The loop over key blocks stops
           at the last block any query of the block may see (causal skip:
           about half the work of dense for a causal prompt). A custom_vjp
           gives it the flash backward: the forward keeps q, k, v (in block
           layout), the output and the fp32 log-sum-exp [B, G, R, T], and the
           backward recomputes each block's scores from them, so autodiff
           memory is O(B H T K) instead of O(B H T S). Runs on every backend;
           any T and S (padded up to whole blocks; padded keys are invalid,
           padded queries see nothing and are cut off).
  splash   the TPU Pallas kernel `splash_attention`, for T > 1 without a cache
           prefix (S == T: training forward, prefill). Causal mask on cache
           indices, left padding as segment ids (0 on padding tokens, 1 on
           real ones: a real query then sees exactly the real keys at or
           before it, as dense does), GQA through the kernel's MHA form (KV
           heads a divisor of the query heads). Under pjit it runs inside
           `shard_map` over the mesh of its inputs' avals: rows over
           ('data', 'fsdp'), heads over 'tensor' (KV heads repeated to the
           query heads when only those divide the tensor axis).
  cudnn    the GPU's fused (flash) kernel, `jax.nn.dot_product_attention(
           implementation='cudnn')`, for T > 1 without a cache prefix
           (S == T) where its constraints hold (`fused_fits`: bf16/fp16, head
           dim a multiple of 8 up to CUDNN_MAX_HEAD_DIM). The kernel masks
           causally and by per-row sequence lengths, i.e. right padding; our
           rows are left-padded (prompts) or padded on both sides (training
           rows), so the model rolls each row left by its left pad once per
           forward, on tokens, mask and positions together
           (`model.Transformer`, `roll_rows`): real tokens then start at index
           0 and stay contiguous, RoPE positions are unchanged (they come from
           the mask), and the kernel gets each row's real length. The
           outputs (and the K/V written into a prefill's cache) are rolled
           back. Off GPU the same call runs with implementation='xla' (XLA's
           dense reference: tests only), so everything but the kernel swap
           is checked on CPU (tests/test_attention.py).
  decode   T = 1 against a cache (every config but 'dense'): the online
           softmax of chunked over key blocks of DECODE_BLOCK_K read in place
           from the cache, only the blocks [first, end) that hold written
           positions: from the block of the earliest valid key in the batch
           (left padding: the longest prompt's first token) to the block of
           the current position. The loop bounds are traced, the block shape
           static: the cost of a step follows the written length, nothing
           recompiles as it grows. A cache of at most
           DECODE_WHOLE_MAX_BLOCKS blocks is read whole, in one step.
           Optionally with a `SharedPrefix`: the sampler's slots of one
           prompt (m consecutive rows) share its prompt's keys, held once
           per prompt apart from the slots' own response cache; the group's
           m·R queries per KV head are scored against them in one product
           (the prefix is read once per prompt, not once per slot, and
           whole: every prefix key precedes every query), and the online
           softmax carries on over the slot's own keys. Such a round's
           cache holds the keys it reads whole transposed, [.., K, S]: the
           prefix's always, its own where `round_keys_transposed`. On CPU a
           round's own cache too long to read whole is held in blocks
           (`round_cache_blocked`): a tuple of S/tk buffers, keys
           [B, G, K, tk] and values [B, G, tk, K], each block read under a
           `lax.cond` of its own, so a product reads its buffer in place.
  auto     when S == T and T >= CHUNKED_MIN_T: splash on TPU, cudnn on GPU
           where `fused_fits` (else chunked), chunked on CPU; chunked for
           other T >= CHUNKED_MIN_T, dense below (short prompts, the tiny
           config's T = 64), decode for T = 1.

Numerics everywhere: scores scaled by 1/sqrt(K), fp32 scores and softmax,
output cast to the compute dtype. Masked entries get MASK_VALUE (finite), so
a query with nothing to attend to (a padding token) gets a finite average of
values and no NaN reaches values or gradients. Real queries always see at
least their own key, so their results do not depend on that choice; outputs
at padding positions differ between implementations (dense averages all S
values, chunked the ones in the blocks it visits, splash the padding keys at
or before it) and are meaningless everywhere.

Splash off TPU: the kernel runs in Pallas interpret mode (slow; for tests).
Checked on jax 0.10.2 (tests/test_attention.py): interpret mode runs on CPU
and matches dense; `jax.export(..., platforms=['tpu'])` cross-lowers a
sharded forward+backward with the Mosaic kernel from a CPU host. Mosaic
compiles the kernel only on a TPU, so block-size or head-dim limits of the
real kernel show up there first.

Dimension legend:
  B: batch rows          T: query tokens of this call
  S: keys (cache slots)  H: query heads
  G: KV heads            R: query heads per KV head (H // G)
  K: head dim            tq, tk: query / key block sizes
  nq, nk: query / key blocks (T and S padded up to whole blocks)
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from ada_jax.infra import platforms
from ada_jax.infra.mesh import BATCH_AXES

Array = jax.Array
# A round's own cache held in blocks (`round_cache_blocked`): S/tk buffers,
# keys [B, G, K, tk] or values [B, G, tk, K].
Blocks = tuple[Array, ...]

IMPLEMENTATIONS = ('auto', 'dense', 'chunked', 'splash', 'cudnn')
# cuDNN's flash attention: bf16/fp16 and a head dim that is a multiple of 8
# up to 128 (256 on Hopper and later; 128 holds on every GPU, and every
# paper model's head dim is 128). jax 0.10.2,
# `jax._src.cudnn.fused_attention_stablehlo.check_is_flash_attention`.
CUDNN_MAX_HEAD_DIM = 128
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)
# 'auto' goes blockwise from this many query tokens on. Below it the dense
# scores are small (T = 256: 256 KiB per row and head) and one fused softmax
# is faster than a loop.
CHUNKED_MIN_T = 512
# Chunked block caps. A [tq, tk] fp32 block is 1 MiB per row and head; the
# flash backward holds about four of them (scores, probs, dp, ds).
BLOCK_Q = 512
BLOCK_K = 512
# Decode key block: the cache is read from the first block holding a valid
# key to the block of the current position, DECODE_BLOCK_K keys at a time.
# 64: finer steps follow the written length more closely; on CPU a block of
# 128 also kept one layer's sliced K/V block alive past its loop (+512 KiB in
# tests/test_sampler.py's round), 64 and 32 did not.
DECODE_BLOCK_K = 64
# Caches of at most this many decode blocks are read whole, without the loop.
DECODE_WHOLE_MAX_BLOCKS = 2
# Splash tiles: multiples of 128 (the lane width) that divide the padded T.
_SPLASH_BLOCKS = (512, 256, 128)
_SPLASH_ALIGN = 128
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
# Dense attention normalizes on its output from this many [T, S] elements
# per row and head on (T > 1; 256 KiB of fp32 scores), where the [T, S]
# arrays set the memory. Below it, and when decoding, it is the plain
# softmax: its arithmetic is the one the tiny runs' documented figures were
# measured with (README, experiments/README.md). Those runs are chaotic in
# the last bit: with the output-side normalization at T = 26 the seed-2 SFT
# warm start of experiments/main_job.py ended at held-out greedy 0.113
# instead of 0.263 (its loss drop came late in the 1,200 steps).
DENSE_OUTPUT_NORM_MIN = 256 * 256


class AttentionMask(NamedTuple):
  """What each query may see, in the form its implementation wants.

  query_index: int [B, T], the cache index of each query token.
  kv_valid: bool [B, S], cache slots holding real tokens (after this call's
    writes).
  dense: bool [B, 1, T, S] (dense only, else None): the full mask, built once
    per call and shared by the layers.
  key_blocks: int32 [2] (decode only, else None): the key blocks [first, end)
    the decode loop reads, computed once per call.
  prefix_valid: bool [B/m, P] (decode with a shared prefix, else None): which
    positions of each group's prompt prefix hold real tokens (see
    `decode_attention`).
  lengths: int32 [B] (cudnn only, else None): each row's real tokens, which
    the left-aligned rows hold at [0, length) (at least 1: a row of padding
    only attends to its first slot, a finite, meaningless value).
  """

  query_index: Array
  kv_valid: Array
  dense: Array | None = None
  key_blocks: Array | None = None
  prefix_valid: Array | None = None
  lengths: Array | None = None


def resolve(
  attention: str,
  t: int,
  s: int,
  platform: str | None = None,
  dtype: Any = None,
  head_dim: int | None = None,
) -> str:
  """The implementation ('dense' | 'chunked' | 'splash' | 'cudnn' | 'decode') for T queries, S keys.

  Static: depends on the config string, the shapes, the compute dtype and
  head dim (cudnn's constraints; None: not known, taken to fit) and the
  target platform only (`infra.platforms`; '' or None: the running backend).
  Decode (T = 1 against S > 1 keys) reads only the written key blocks
  ('decode') unless the config asks for dense everywhere (the reference);
  splash and cudnn need S == T (no cache prefix) and fall back to chunked
  otherwise.

  Raises:
    ValueError: attention='cudnn' asked for where the kernel's constraints
      do not hold (`fused_fits`).
  """
  if attention not in IMPLEMENTATIONS:
    raise ValueError(f'attention={attention!r}: use one of {IMPLEMENTATIONS}')
  if attention == 'dense':
    return 'dense'
  if t == 1:
    # One token with nothing before it (a T = 1 training forward, which may
    # be differentiated: the decode loop's traced bounds are not) is dense.
    return 'decode' if s > 1 else 'dense'
  if attention == 'chunked':
    return 'chunked'
  if attention in ('splash', 'cudnn'):
    if attention == 'cudnn' and not fused_fits(dtype, head_dim, platform):
      raise ValueError(
        f"attention='cudnn' needs a bf16/fp16 compute dtype and a head dim that "
        f'is a multiple of 8 up to {CUDNN_MAX_HEAD_DIM}; got dtype '
        f'{jnp.dtype(dtype).name if dtype is not None else "?"}, head dim {head_dim}'
      )
    return attention if s == t else 'chunked'
  if t < CHUNKED_MIN_T:
    return 'dense'
  if s != t:
    return 'chunked'
  long = platforms.get(platform).long_attention
  if long == 'cudnn' and not fused_fits(dtype, head_dim, platform):
    return 'chunked'
  return long


def fused_fits(dtype: Any, head_dim: int | None, platform: str | None = None) -> bool:
  """Whether the fused kernel of `platform` takes this dtype and head dim.

  Only cuDNN (a 'gpu' target) constrains them; elsewhere the same call runs
  XLA's reference, which takes anything. None: not known, taken to fit.
  """
  if platforms.get(platform).fused_kernel != 'cudnn':
    return True
  if dtype is not None and jnp.dtype(dtype) not in [
    jnp.dtype(d) for d in _CUDNN_DTYPES
  ]:
    return False
  return head_dim is None or (head_dim % 8 == 0 and head_dim <= CUDNN_MAX_HEAD_DIM)


def make_mask(
  query_index: Array,
  kv_valid: Array,
  impl: str,
  prefix_valid: Array | None = None,
) -> AttentionMask:
  """The AttentionMask for `impl`; only dense gets the [B, 1, T, S] bool.

  prefix_valid: bool [B/m, P], decode only: a prompt prefix shared by groups
  of m consecutive rows, held apart from the rows' own cache (see
  `decode_attention`).
  """
  if prefix_valid is not None and impl != 'decode':
    raise ValueError(f'a shared prompt prefix needs decode attention, got {impl!r}')
  dense = dense_mask(query_index, kv_valid) if impl == 'dense' else None
  blocks = lengths = None
  if impl == 'decode':
    tk, _ = decode_block(kv_valid.shape[-1])
    blocks = decode_key_blocks(query_index, kv_valid, tk)
  if impl == 'cudnn':
    # Left-aligned rows (`roll_rows`): the real keys are [0, length).
    lengths = jnp.maximum(jnp.sum(kv_valid, axis=-1, dtype=jnp.int32), 1)
  return AttentionMask(query_index, kv_valid, dense, blocks, prefix_valid, lengths)


def dense_mask(query_index: Array, kv_valid: Array) -> Array:
  """The full mask: causal on cache indices, padding, cache validity.

  Args:
    query_index: int [B, T], the cache index each query token occupies.
    kv_valid: bool [B, S], cache slots holding real tokens (after this call's
      writes).

  Returns:
    bool [B, 1, T, S]: True where query t may attend to key s.
  """
  s = jnp.arange(kv_valid.shape[-1], dtype=jnp.int32)
  causal = s[None, None, :] <= query_index[:, :, None]
  return (causal & kv_valid[:, None, :])[:, None]


def attend(
  q: Array,
  k_cache: Array | Blocks,
  v_cache: Array | Blocks,
  mask: AttentionMask,
  impl: str,
  dtype: Any,
  prefix_kv: tuple[Array, Array] | None = None,
  platform: str | None = None,
) -> Array:
  """Attention output [B, T, H, K] in `dtype`.

  Args:
    q: [B, T, H, K] queries (RoPE applied), compute dtype.
    k_cache: [B, G, S, K] keys, this call's included (cache dtype).
    v_cache: [B, G, S, K] values.
    mask: from `make_mask` with the same `impl`.
    impl: a resolved implementation (see `resolve`) but cudnn, which reads
      the call's own keys, not a cache (`model.Attention` calls
      `fused_attention`).
    dtype: the compute dtype.
    prefix_kv: decode only, with mask.prefix_valid: the shared prefix's keys
      [B/m, G, K, P] (transposed: a prefix is read whole) and values
      [B/m, G, P, K]. A cache with a shared prefix (a sampler round's) holds
      its own keys transposed, [B, G, K, S], where `round_keys_transposed`
      says so, or is held in blocks (`Blocks`, `round_cache_blocked`).
    platform: the target platform (splash's interpret mode).
  """
  if impl == 'decode':
    prefix = None
    if prefix_kv is not None:
      prefix = SharedPrefix(*prefix_kv, mask.prefix_valid)
    return decode_attention(
      q,
      k_cache,
      v_cache,
      mask.query_index,
      mask.kv_valid,
      mask.key_blocks,
      prefix=prefix,
      keys_transposed=cache_keys_transposed(mask.kv_valid, mask.prefix_valid),
    )
  k, v = k_cache.astype(dtype), v_cache.astype(dtype)
  if impl == 'dense':
    return dense_attention(q, k, v, mask.dense, dtype)
  if impl == 'chunked':
    return chunked_attention(q, k, v, mask.query_index, mask.kv_valid)
  if impl == 'splash':
    if k.shape[2] != q.shape[1]:
      raise ValueError(f'splash needs S == T, got S={k.shape[2]}, T={q.shape[1]}')
    # S == T: this call wrote every slot from index 0, so validity is the
    # token mask and cache order is sequence order.
    return splash_attention(q, k, v, mask.kv_valid.astype(jnp.int32), platform=platform)
  raise ValueError(f'unknown attention implementation {impl!r}')


def dense_attention(q: Array, k: Array, v: Array, mask: Array, dtype: Any) -> Array:
  """The reference: q [B, T, H, K], k/v [B, G, S, K], mask bool [B, 1, T, S]."""
  b, t, h, kd = q.shape
  g = k.shape[1]
  qg = q.reshape(b, t, g, h // g, kd)
  scores = jnp.einsum('btgrk,bgsk->bgrts', qg, k, preferred_element_type=jnp.float32)
  scores = scores / math.sqrt(kd)
  scores = jnp.where(mask[:, :, None], scores, MASK_VALUE)
  if t == 1 or t * k.shape[2] < DENSE_OUTPUT_NORM_MIN:
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    out = jnp.einsum('bgrts,bgsk->btgrk', probs, v)
    return out.reshape(b, t, h, kd)
  # Large [T, S]: the softmax's normalization is applied to the
  # [B, G, R, T, K] output, not to the probabilities, so a layer makes three
  # fp32 [T, S] arrays (scores, masked, exponentials), not four. XLA:CPU's
  # buffer assignment put a chain of four same-size arrays in two slots at
  # some sizes and in three at others (the old-logp pass: two at T = 384,
  # three at T = 768); three take two at every size
  # benchmarks/plan_calibration.py compiles.
  top = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
  unnormalized = jnp.exp(scores - top)
  total = jnp.sum(unnormalized, axis=-1)
  out = jnp.einsum(
    'bgrts,bgsk->bgrtk',
    unnormalized.astype(dtype),
    v,
    preferred_element_type=jnp.float32,
  )
  out = (out / total[..., None]).astype(dtype)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, kd)


# ---------------------------------------------------------------- chunked


def block_size(n: int, cap: int) -> tuple[int, int]:
  """(block, count) covering n: ceil(n / cap) blocks, each a multiple of 8.

  The fewest blocks of at most `cap` (rounded up to 8), as even as possible,
  so padding stays under 8 * count: T = 3072, cap 512 -> 6 x 512; T = 600 ->
  2 x 304; T = 24 -> 1 x 24.
  """
  count = -(-n // cap)
  block = -(-n // count)
  return -(-block // 8) * 8, count


def chunked_attention(
  q: Array,
  k: Array,
  v: Array,
  query_index: Array,
  kv_valid: Array,
  *,
  block_q: int | None = None,
  block_k: int | None = None,
) -> Array:
  """Blockwise attention: q [B, T, H, K], k/v [B, G, S, K] -> [B, T, H, K].

  Same visibility as dense (key s visible to query t iff s <= query_index[t]
  and kv_valid[s]), never materialising [T, S]. Output in q's dtype.
  """
  b, t, h, kd = q.shape
  g, s = k.shape[1], k.shape[2]
  r = h // g
  tq, nq = block_size(t, block_q or BLOCK_Q)
  tk, nk = block_size(s, block_k or BLOCK_K)
  # [B, T, H, K] -> [nq, B, G, R, tq, K]; padded queries get index -1 (they
  # see nothing, and do not extend any block's key range).
  qb = jnp.pad(q.reshape(b, t, g, r, kd), ((0, 0), (0, nq * tq - t), *[(0, 0)] * 3))
  qb = qb.reshape(b, nq, tq, g, r, kd).transpose(1, 0, 3, 4, 2, 5)
  qi = jnp.pad(
    query_index.astype(jnp.int32), ((0, 0), (0, nq * tq - t)), constant_values=-1
  )
  qi = qi.reshape(b, nq, tq).transpose(1, 0, 2)
  # [B, G, S, K] -> [nk, B, G, tk, K]; padded keys are invalid.
  pad_k = ((0, 0), (0, 0), (0, nk * tk - s), (0, 0))
  kb = jnp.pad(k, pad_k).reshape(b, g, nk, tk, kd).transpose(2, 0, 1, 3, 4)
  vb = jnp.pad(v, pad_k).reshape(b, g, nk, tk, kd).transpose(2, 0, 1, 3, 4)
  valid = jnp.pad(kv_valid.astype(jnp.bool_), ((0, 0), (0, nk * tk - s)))
  valid = valid.reshape(b, nk, tk).transpose(1, 0, 2)
  out = _flash(qb, kb, vb, qi, valid)  # [nq, B, G, R, tq, K]
  out = out.transpose(1, 0, 4, 2, 3, 5).reshape(b, nq * tq, h, kd)
  return out[:, :t]


def _key_blocks(qi: Array, tk: int, nk: int) -> Array:
  """How many key blocks a query block needs: up to its largest index."""
  return jnp.clip(jnp.max(qi) // tk + 1, 1, nk)


def _block_scores(
  qb: Array, kb: Array, qi: Array, valid: Array, first, keys_t: bool = False
):
  """Masked fp32 scores [B, G, R, tq, tk] of a key block, and bool [B, tq, tk].

  kb [B, G, tk, K] holds the keys at cache indices first .. first + tk - 1
  ([B, G, K, tk] with keys_t, the transposed layout of a round's cache).
  """
  kd = qb.shape[-1]
  if keys_t:
    tk = kb.shape[-1]
    s = jnp.einsum('bgrqk,bgks->bgrqs', qb, kb, preferred_element_type=jnp.float32)
  else:
    tk = kb.shape[-2]
    s = jnp.einsum('bgrqk,bgsk->bgrqs', qb, kb, preferred_element_type=jnp.float32)
  s = s / math.sqrt(kd)
  key = first + jnp.arange(tk, dtype=jnp.int32)
  allowed = (key[None, None, :] <= qi[:, :, None]) & valid[:, None, :]
  return jnp.where(allowed[:, None, None], s, MASK_VALUE), allowed


def _online_init(q: Array) -> tuple[Array, Array, Array]:
  """(max, sum, accumulator) before any key block, for queries q [..., K]."""
  # Starting the max at MASK_VALUE (not -inf) keeps every exponent finite:
  # a fully masked row ends with m = MASK_VALUE and total >= 1.
  return (
    jnp.full(q.shape[:-1], MASK_VALUE, jnp.float32),
    jnp.zeros(q.shape[:-1], jnp.float32),
    jnp.zeros(q.shape, jnp.float32),
  )


def _online_step(carry, s: Array, vb: Array, dt: Any):
  """Folds one key block's masked scores s [..., tk] and values vb into carry."""
  m, total, acc = carry
  m_new = jnp.maximum(m, jnp.max(s, axis=-1))
  alpha = jnp.exp(m - m_new)
  p = jnp.exp(s - m_new[..., None])
  total = alpha * total + jnp.sum(p, axis=-1)
  pv = jnp.einsum(
    'bgrqs,bgsk->bgrqk', p.astype(dt), vb, preferred_element_type=jnp.float32
  )
  return m_new, total, alpha[..., None] * acc + pv


# jit on the forward and backward bodies: every layer has the same shapes, so
# they are traced and lowered once per model, not once per layer.
@jax.jit
def _flash_forward(q, k, v, qi, valid):
  """(out [nq, B, G, R, tq, K] in q's dtype, lse fp32 [nq, B, G, R, tq])."""
  nk, tk = k.shape[0], k.shape[3]
  dt = q.dtype

  def q_block(_, xs):
    qb, qib = xs

    def body(j, carry):
      s, _ = _block_scores(qb, k[j], qib, valid[j], j * tk)
      return _online_step(carry, s, v[j], dt)

    init = _online_init(qb)
    m, total, acc = jax.lax.fori_loop(0, _key_blocks(qib, tk, nk), body, init)
    return None, ((acc / total[..., None]).astype(dt), m + jnp.log(total))

  _, (out, lse) = jax.lax.scan(q_block, None, (q, qi))
  return out, lse


@jax.custom_vjp
def _flash(q, k, v, qi, valid):
  return _flash_forward(q, k, v, qi, valid)[0]


def _flash_fwd(q, k, v, qi, valid):
  out, lse = _flash_forward(q, k, v, qi, valid)
  return out, (q, k, v, qi, valid, out, lse)


def _flash_bwd(res, d_out):
  return (*_flash_backward(*res, d_out), None, None)


@jax.jit
def _flash_backward(q, k, v, qi, valid, out, lse, d_out):
  """(dq, dk, dv): each block's probabilities recomputed from lse; fp32 sums."""
  nk, tk = k.shape[0], k.shape[3]
  dt = q.dtype
  scale = math.sqrt(q.shape[-1])
  # D = rowsum(dO * O) = sum_s P * dP: the softmax Jacobian's diagonal term.
  delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)

  def q_block(carry, xs):
    qb, qib, dob, lseb, db = xs

    def body(j, c):
      dq, dk, dv = c
      kj, vj = k[j], v[j]
      s, allowed = _block_scores(qb, kj, qib, valid[j], j * tk)
      p = jnp.exp(s - lseb[..., None])
      dv_j = jnp.einsum(
        'bgrqs,bgrqk->bgsk', p.astype(dt), dob, preferred_element_type=jnp.float32
      )
      dp = jnp.einsum('bgrqk,bgsk->bgrqs', dob, vj, preferred_element_type=jnp.float32)
      # Masked scores are constants (MASK_VALUE): no gradient flows to them.
      ds = jnp.where(allowed[:, None, None], p * (dp - db[..., None]), 0.0) / scale
      ds = ds.astype(dt)
      dq = dq + jnp.einsum(
        'bgrqs,bgsk->bgrqk', ds, kj, preferred_element_type=jnp.float32
      )
      dk_j = jnp.einsum('bgrqs,bgrqk->bgsk', ds, qb, preferred_element_type=jnp.float32)
      dk = jax.lax.dynamic_update_index_in_dim(dk, dk[j] + dk_j, j, 0)
      dv = jax.lax.dynamic_update_index_in_dim(dv, dv[j] + dv_j, j, 0)
      return dq, dk, dv

    dq0 = jnp.zeros(qb.shape, jnp.float32)
    dq, dk, dv = jax.lax.fori_loop(0, _key_blocks(qib, tk, nk), body, (dq0, *carry))
    return (dk, dv), dq.astype(dt)

  zeros = jnp.zeros(k.shape, jnp.float32)
  (dk, dv), dq = jax.lax.scan(q_block, (zeros, zeros), (q, qi, d_out, lse, delta))
  return dq, dk.astype(k.dtype), dv.astype(v.dtype)


_flash.defvjp(_flash_fwd, _flash_bwd)


# ----------------------------------------------------------------- decode


def decode_block(s: int, cap: int | None = None) -> tuple[int, int]:
  """(block, count) of the decode loop over S keys: blocks of min(cap, S)."""
  tk = min(cap or DECODE_BLOCK_K, s)
  return tk, -(-s // tk)


def decode_reads_whole(s: int, block_k: int | None = None) -> bool:
  """Whether decode reads a cache of S keys whole, in one step (no block loop)."""
  return decode_block(s, block_k)[1] <= DECODE_WHOLE_MAX_BLOCKS


def round_keys_transposed(s: int) -> bool:
  """Whether a sampler round's own cache of S keys holds them transposed, [.., K, S].

  The rows' own response cache (S = N) does when decode reads it whole (at
  most DECODE_WHOLE_MAX_BLOCKS blocks): scoring a whole [K, S] read, the
  right operand's layout for a matrix product, takes XLA:CPU's small batched
  products about half the time of [S, K] (0.69 -> 0.37 ms per layer at
  B = 64, S = 96). The loop's dynamic slices of transposed keys cost more
  than they save (the long case's overall tokens/s fell 12%), so a longer
  cache is [.., S, K], or in blocks on CPU (`round_cache_blocked`). A
  round's shared prefix is always read whole and held transposed (see
  `SharedPrefix`).
  """
  return decode_reads_whole(s)


def round_cache_blocked(s: int, platform: str | None = None) -> bool:
  """Whether a sampler round's own cache of S keys is held in blocks (`Blocks`).

  A tuple of S/tk buffers (tk from `decode_block`, S rounded up to whole
  blocks, `round_cache_len`), keys [B, G, K, tk] and values [B, G, tk, K]:
  on CPU, for a cache the decode loop reads (more than
  DECODE_WHOLE_MAX_BLOCKS blocks). Each block is read under a `lax.cond` of
  its own (taken while the block holds written keys), so its products read
  the buffer in place. XLA:CPU copies a loop's dynamic slice before a
  product reads it: in a profiler trace of [B, G, S, K] (one layer, 64 rows,
  prefix P = 256, 496 response keys written) the copies took 3.6-3.8 ms
  against about 3.1 ms of products; a block-major [S/tk, B, G, K, tk] array
  made each copy one contiguous slab, and separate buffers drop the copy.
  Response attention of one layer, 64 rows, 2 KV heads of 64 (caches of
  four layers rotated, so none stays in cache), 16 -> 496 keys written, 4
  quiet runs each (load 0.22-0.53): block-major loop 0.28-0.68 -> 2.06-2.10
  ms, blocks under conds 0.17-0.23 -> 1.62-1.70. At 496 keys that reads 32
  MB at 20-25 GB/s on one core. Pinned to one core, the products alone
  stream 26-32 GB/s, as fast as XLA's own row sum over the same bytes
  (27-32); the softmax between them takes the rest. XLA:CPU runs these
  small batched products on one core, and ran two independent chains of
  conds (even and odd blocks, or halves of the rows) no faster than one.
  Not on TPU, where the slices are fused into the reads and a minor
  dimension of tk = 64 would be padded to the 128 lanes; there the cache
  stays [B, G, S, K].
  """
  return platforms.get(platform).round_cache_blocked and not decode_reads_whole(s)


def round_cache_len(s: int, platform: str | None = None) -> int:
  """Key slots of a round's own cache for S keys: whole blocks when in blocks."""
  if not round_cache_blocked(s, platform):
    return s
  tk, nk = decode_block(s)
  return tk * nk


def cache_keys_transposed(kv_valid: Array, prefix_valid: Array | None) -> bool:
  """Whether a decode cache's own keys (not its prefix's) are [B, G, K, S].

  The one rule its writer (the model's layer, `model.write_kv`) and its
  reader (`attend`) share: true for a cache with a shared prefix (a sampler
  round's) of S keys (kv_valid's length) where `round_keys_transposed(S)`.
  """
  return prefix_valid is not None and round_keys_transposed(kv_valid.shape[-1])


def decode_key_blocks(query_index: Array, kv_valid: Array, tk: int) -> Array:
  """int32 [2]: the key blocks [first, end) that hold any visible key.

  first: the block of the earliest valid key of any row (left padding: the
  longest prompt's first token); end: one past the block of the latest
  query. Computed once per call (the layers share it); batch-wide, so one
  loop serves every row and rows see masked keys of other rows' spans.
  """
  s = kv_valid.shape[-1]
  nk = -(-s // tk)
  any_valid = jnp.any(kv_valid, axis=-1)
  first_key = jnp.where(any_valid, jnp.argmax(kv_valid, axis=-1), s)
  end = jnp.clip(jnp.max(query_index) // tk + 1, 1, nk)
  # At least one block: a loop over none would leave a 0/0 average.
  first = jnp.minimum(jnp.min(first_key) // tk, end - 1)
  return jnp.stack([first, end]).astype(jnp.int32)


def _prefix_query_index(prefix_valid: Array, t: int) -> Array:
  """A query index int [B/m, T] after the whole prefix: it sees every key."""
  n, p = prefix_valid.shape
  return jnp.full((n, t), p - 1, jnp.int32)


class SharedPrefix(NamedTuple):
  """A prompt prefix that groups of m consecutive rows share, read once per group.

  k: [B/m, G, K, P], transposed (the layout a whole read scores fastest; see
  `round_keys_transposed`); v: [B/m, G, P, K] (cache dtype); valid: bool
  [B/m, P].

  Every prefix key precedes every query, so decode reads the prefix whole,
  in one step: a block loop would read every block from the longest
  prompt's first one anyway, and on XLA:CPU its iterations and block copies
  cost more than the left padding it skips. Whole and transposed against
  the loop over [.., P, K] blocks of 64, one layer, prefix and a short
  response (ms): 64 rows, P = 256: 0.90-1.11 vs 1.72-2.72; 512 slots in
  groups of 8, P = 256: 3.88-4.20 vs 5.58-5.75; P = 1024: 4.36-4.92 vs
  6.78-7.75 (64 rows) and 10.74-11.14 vs 12.88-17.75 (512 slots).
  """

  k: Array
  v: Array
  valid: Array


def decode_attention(
  q: Array,
  k: Array | Blocks,
  v: Array | Blocks,
  query_index: Array,
  kv_valid: Array,
  key_blocks: Array | None = None,
  *,
  block_k: int | None = None,
  prefix: SharedPrefix | None = None,
  keys_transposed: bool = False,
) -> Array:
  """Attention over the written blocks only: q [B, T, H, K] -> [B, T, H, K].

  Args:
    q: queries (T = 1 when decoding), compute dtype.
    k: keys [B, G, S, K], cache dtype (cast one block at a time).
    v: values [B, G, S, K].
    query_index: int [B, T], the cache index of each query.
    kv_valid: bool [B, S].
    key_blocks: int32 [2] from `decode_key_blocks` (same block size), or
      None to compute it here.
    block_k: key block cap; default DECODE_BLOCK_K.
    prefix: keys before the rows' own k/v that groups of m = B / (B/m)
      consecutive rows share (the sampler's slots of one prompt): the
      attention is over prefix keys, then k/v. Each group's m·R queries per KV
      head are scored against its whole prefix in one product, so the prefix
      is read once per group, not once per row, and the per-row cache holds
      only the rows' own tokens.
    keys_transposed: k is [B, G, K, S] (see `round_keys_transposed`).

  A cache in blocks (`round_cache_blocked`: tuples of S/tk buffers, k
  [B, G, K, tk], v [B, G, tk, K]) is read block by block whatever its
  length; its block width is its own (block_k, if given, must match).

  Same visibility as dense (key s visible iff s <= query_index and
  kv_valid[s]; with a prefix, every valid prefix key too); keys outside the
  [first, end) blocks are never read.
  """
  b, t, h, kd = q.shape
  blocked = isinstance(k, tuple)
  g, s = (k[0] if blocked else k).shape[1], kv_valid.shape[-1]
  r = h // g
  tk, _ = decode_block(s, block_k)
  if blocked and (tk != k[0].shape[-1] or len(k) * tk != s):
    raise ValueError(
      f'a cache of {len(k)} blocks of {k[0].shape[-1]} keys does not hold {s} keys'
      f' in blocks of {tk}'
    )
  if key_blocks is None:
    key_blocks = decode_key_blocks(query_index, kv_valid, tk)
  qb = q.reshape(b, t, g, r, kd).transpose(0, 2, 3, 1, 4)  # [B, G, R, T, K]
  carry = _online_init(qb)
  if prefix is not None:
    carry = _prefix_carry(qb, prefix)
  if blocked:
    _, total, acc = _block_conds(carry, qb, k, v, query_index, kv_valid, key_blocks)
  else:
    _, total, acc = _decode_loop(
      carry, qb, k, v, query_index, kv_valid, key_blocks, tk, keys_transposed
    )
  out = (acc / total[..., None]).astype(q.dtype)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, h, kd)


def _prefix_carry(qb: Array, prefix: SharedPrefix):
  """The online-softmax carry of qb [B, G, R, T, K] after its groups' whole prefix."""
  b, g, r, t, kd = qb.shape
  n = prefix.valid.shape[0]
  m = b // n
  if n * m != b:
    raise ValueError(f'{b} rows do not split into groups of {n} prefixes')
  # Group m rows' queries as m·R query rows of one prefix: [B/m, G, m·R, T, K].
  qg = (
    qb.reshape(n, m, g, r, t, kd)
    .transpose(0, 2, 1, 3, 4, 5)
    .reshape(n, g, m * r, t, kd)
  )
  qi = _prefix_query_index(prefix.valid, t)
  carry = _read_whole(_online_init(qg), qg, prefix.k, prefix.v, qi, prefix.valid, True)

  def ungroup(x):  # [B/m, G, m·R, T, ...] -> [B, G, R, T, ...]
    x = x.reshape(n, g, m, r, *x.shape[3:])
    return jnp.moveaxis(x, 2, 1).reshape(b, g, r, *x.shape[4:])

  return tuple(ungroup(x) for x in carry)


def _read_whole(carry, qb, k, v, qi, valid, keys_t: bool):
  """Folds all of k/v [B, G, S, K] (k [B, G, K, S] with keys_t) into carry, in one step."""
  dt = qb.dtype
  scores, _ = _block_scores(qb, k.astype(dt), qi, valid, 0, keys_t)
  return _online_step(carry, scores, v.astype(dt), dt)


def _decode_loop(carry, qb, k, v, qi, valid, key_blocks, tk: int, keys_t=False):
  """Folds key blocks [first, end) of k/v [B, G, S, K] into carry, for qb [B, G, R, T, K].

  k is [B, G, K, S] with keys_t. Blocks are read in place with dynamic slices
  of size tk (no block-layout copy of the cache). The last block's start is
  clamped to S - tk and the keys it shares with the block before are masked
  out, so any S works.
  """
  s = valid.shape[-1]
  dt = qb.dtype
  k_axis = 3 if keys_t else 2
  if decode_reads_whole(s, tk):
    # A short cache is read whole in one step: at most one block more than
    # the written ones, and no loop or block copies (on XLA:CPU the loop's
    # iterations cost more than the keys they read).
    return _read_whole(carry, qb, k, v, qi, valid, keys_t)

  def body(j, carry):
    first = j * tk
    start = jnp.minimum(first, s - tk)
    kb = jax.lax.dynamic_slice_in_dim(k, start, tk, axis=k_axis).astype(dt)
    vb = jax.lax.dynamic_slice_in_dim(v, start, tk, axis=2).astype(dt)
    key = start + jnp.arange(tk, dtype=jnp.int32)
    vis = jax.lax.dynamic_slice_in_dim(valid, start, tk, axis=1) & (key >= first)
    scores, _ = _block_scores(qb, kb, qi, vis, start, keys_t)
    return _online_step(carry, scores, vb, dt)

  return jax.lax.fori_loop(key_blocks[0], key_blocks[1], body, carry)


def _block_conds(carry, qb, k: Blocks, v: Blocks, qi, valid, key_blocks):
  """Folds key blocks [first, end) of a cache in blocks into carry (see `_decode_loop`).

  k: S/tk buffers [B, G, K, tk], v: [B, G, tk, K]. Unrolled: block j is
  folded under a `lax.cond` taken when first <= j < end, its buffers the
  cond's operands, so the products read them in place (a loop would take
  a dynamic slice of a stacked cache, which XLA:CPU copies first). The
  program grows with S/tk (one cond per block and layer); only CPU rounds
  use it.
  """
  tk = k[0].shape[-1]
  dt = qb.dtype

  def fold(j):
    def step(carry, kb, vb):
      vis = valid[:, j * tk : (j + 1) * tk]
      scores, _ = _block_scores(qb, kb.astype(dt), qi, vis, j * tk, True)
      return _online_step(carry, scores, vb.astype(dt), dt)

    return step

  def skip(carry, kb, vb):
    return carry

  for j, (kb, vb) in enumerate(zip(k, v, strict=True)):
    taken = (key_blocks[0] <= j) & (j < key_blocks[1])
    carry = jax.lax.cond(taken, fold(j), skip, carry, kb, vb)
  return carry


# ------------------------------------------------------------------ cudnn


def left_pads(mask: Array) -> Array:
  """int32 [B]: each row's padding before its first real token (0 if none).

  Real tokens of a row must be contiguous (prompt, then response): the rows
  the policy runs on are left-padded prompts, or left-padded prompts followed
  by right-padded responses.
  """
  return jnp.argmax(mask.astype(jnp.bool_), axis=-1).astype(jnp.int32)


def _roll(x: Array, shift: Array) -> Array:
  t = x.shape[1]
  index = (jnp.arange(t, dtype=jnp.int32)[None, :] + shift[:, None]) % t
  index = index.reshape(index.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1, mode='promise_in_bounds')


@jax.custom_vjp
def roll_rows(x: Array, shift: Array) -> Array:
  """Each row rolled left by its shift along axis 1: out[b, i] = x[b, (i + shift[b]) % T].

  `roll_rows(x, -shift)` undoes it. The backward is the opposite roll (a
  gather), not the scatter-add autodiff would make of the forward gather.
  """
  return _roll(x, shift)


def _roll_rows_fwd(x: Array, shift: Array) -> tuple[Array, Array]:
  return _roll(x, shift), shift


def _roll_rows_bwd(shift: Array, g: Array) -> tuple[Array, None]:
  return _roll(g, -shift), None


roll_rows.defvjp(_roll_rows_fwd, _roll_rows_bwd)


def fused_attention(
  q: Array, k: Array, v: Array, lengths: Array, platform: str | None = None
) -> Array:
  """Causal attention of left-aligned rows: q [B, T, H, K], k/v [B, T, G, K] -> [B, T, H, K].

  Row b's real tokens are [0, lengths[b]); query t sees keys s <= t below
  the length, as dense does for the same tokens. The target platform's
  fused kernel (`infra.platforms`: cuDNN on GPU, XLA's reference elsewhere,
  for tests). Queries at or past the length come out zero.
  """
  return jax.nn.dot_product_attention(
    q,
    k,
    v,
    is_causal=True,
    query_seq_lengths=lengths,
    key_value_seq_lengths=lengths,
    implementation=platforms.get(platform).fused_kernel,
  )


# ----------------------------------------------------------------- splash


def splash_segment_ids(token_valid: Array, length: int | None = None) -> Array:
  """int32 [B, length] segment ids: 1 on real tokens, 0 on padding.

  Under the kernel's causal mask a real query then sees the real keys at or
  before it (dense's mask exactly); a padding query sees the padding keys at
  or before it, at least itself, so no row is empty. Positions past T (the
  kernel's alignment padding) are padding.
  """
  ids = token_valid.astype(jnp.int32)
  t = ids.shape[-1]
  length = length or t
  return jnp.pad(ids, ((0, 0), (0, length - t)))


def splash_block(t: int) -> tuple[int, int]:
  """(padded T, tile): T rounded up to 128, the largest tile that divides it."""
  tp = -(-t // _SPLASH_ALIGN) * _SPLASH_ALIGN
  return tp, next(blk for blk in _SPLASH_BLOCKS if tp % blk == 0)


def _splash_kernel(heads: int, tp: int, interpret: bool):
  """The causal MHA/GQA splash kernel for `heads` (local) query heads, T = tp.

  Built per call, outside any shard_map: the kernel holds its mask tables as
  arrays, which a shard_map trace would turn into tracers (so no caching
  across traces either).
  """
  from jax.experimental.pallas.ops.tpu import splash_attention as sa

  _, block = splash_block(tp)
  sizes = sa.BlockSizes(
    block_q=block,
    block_kv=block,
    block_kv_compute=block,
    block_q_dkv=block,
    block_kv_dkv=block,
    block_kv_dkv_compute=block,
    block_q_dq=block,
    block_kv_dq=block,
  )
  mask = sa.MultiHeadMask([sa.CausalMask((tp, tp))] * heads)
  return sa.make_splash_mha(
    mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
  )


def _splash_interpret(platform: str | None = None) -> bool:
  """Pallas interpret mode where the target platform cannot compile the kernel."""
  return not platforms.get(platform).splash_compiled


def _splash_local(kernel, q: Array, k: Array, v: Array, seg: Array) -> Array:
  """One shard: q [B, H, Tp, K], k/v [B, G, Tp, K], seg [B, Tp] -> [B, H, Tp, K]."""
  from jax.experimental.pallas.ops.tpu import splash_attention as sa

  def one(qr, kr, vr, sr):
    return kernel(qr, kr, vr, segment_ids=sa.SegmentIds(sr, sr))

  return jax.vmap(one)(q, k, v, seg)


def _mesh_of(x: Array):
  """The mesh x's aval lives on (abstract under jit), or None."""
  mesh = getattr(jax.typeof(x).sharding, 'mesh', None)
  if mesh is None or mesh.empty or mesh.size == 1:
    return None
  if not set(BATCH_AXES) | {'tensor'} <= set(mesh.axis_names):
    return None
  return mesh


def splash_attention(
  q: Array,
  k: Array,
  v: Array,
  segment_ids: Array,
  *,
  interpret: bool | None = None,
  mesh: Any = None,
  platform: str | None = None,
) -> Array:
  """Causal splash attention: q [B, T, H, K], k/v [B, G, T, K] -> [B, T, H, K].

  Args:
    q: queries in the compute dtype (scaled here by 1/sqrt(K)).
    k: keys, cache layout.
    v: values, cache layout.
    segment_ids: int [B, T] (see `splash_segment_ids`; 0 padding, 1 real).
    interpret: Pallas interpret mode; default: where the target platform
      cannot compile the kernel (`infra.platforms`).
    mesh: shard over this mesh; default: the mesh of q's sharding, if any
      with axes ('data', 'fsdp', 'tensor'); none: one local call.
    platform: the target platform ('' or None: the running backend).
  """
  b, t, h, kd = q.shape
  g = k.shape[1]
  dt = q.dtype
  interpret = _splash_interpret(platform) if interpret is None else interpret
  tp, _ = splash_block(t)
  # The kernel does not scale: fold 1/sqrt(K) into q (in fp32, then back).
  qh = (q.astype(jnp.float32) / math.sqrt(kd)).astype(dt).transpose(0, 2, 1, 3)
  pad = ((0, 0), (0, 0), (0, tp - t), (0, 0))
  qh, k, v = jnp.pad(qh, pad), jnp.pad(k, pad), jnp.pad(v, pad)
  seg = splash_segment_ids(segment_ids, tp)
  mesh = mesh if mesh is not None else _mesh_of(q)
  if mesh is None:
    out = _splash_local(_splash_kernel(h, tp, interpret), qh, k, v, seg)
  else:
    rows = BATCH_AXES if b % (mesh.shape['data'] * mesh.shape['fsdp']) == 0 else None
    tensor = mesh.shape['tensor']
    heads = None
    if g % tensor == 0:
      heads = 'tensor'
    elif h % tensor == 0:
      # Only the query heads divide: give every query head its own KV head
      # so both split alike (R x the K/V bytes, the work split tensor-ways).
      k, v = jnp.repeat(k, h // g, axis=1), jnp.repeat(v, h // g, axis=1)
      heads = 'tensor'
    spec4 = PartitionSpec(rows, heads, None, None)
    kernel = _splash_kernel(h // tensor if heads else h, tp, interpret)
    out = jax.shard_map(
      functools.partial(_splash_local, kernel),
      mesh=mesh,
      in_specs=(spec4, spec4, spec4, PartitionSpec(rows, None)),
      out_specs=spec4,
      check_vma=False,
    )(qh, k, v, seg)
  return out[:, :, :t].transpose(0, 2, 1, 3).astype(dt)
