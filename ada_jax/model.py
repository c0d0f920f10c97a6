"""Decoder-only Transformer policy (Qwen2/2.5, Qwen3, Llama 3.x) in Flax NNX.

One module serves both sampling (explicit KV cache in and out) and training
(full forward). Every parameter carries logical axis names in its `axes`
metadata; `sharding.py`'s rules map them onto the mesh.

Numerics follow the HF reference implementations: RMSNorm and RoPE in fp32,
attention softmax in fp32, logits in fp32 whatever the compute dtype.

Attention itself lives in attention.py (dense, chunked, splash or decode,
chosen by `ModelConfig.attention` and the call's shapes; a decode step reads
only the cache blocks that hold written positions).
`ModelConfig.remat='block'` rematerializes each decoder block's forward in the
backward (only calls with T > 1: decode is never differentiated).

Dimension legend:
  B: batch rows            T: query tokens of this call
  S: cache length          D: model width (hidden_size)
  H: query heads           G: KV heads (H % G == 0)
  K: head dim              F: MLP width (intermediate_size)
  V: vocab size            L: layers
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from ada_jax import attention as attention_lib
from ada_jax.infra import platforms

Array = jax.Array

# Logical axis names (see sharding.py for the rules that map them to mesh axes).
VOCAB, EMBED, Q_HEADS, KV_HEADS, HEAD_DIM, MLP, NORM = (
  'vocab',
  'embed',
  'q_heads',
  'kv_heads',
  'head_dim',
  'mlp',
  'norm',
)
REMAT = ('none', 'block')


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Architecture of one policy; mirrors the HF config fields we support."""

  model_type: str  # 'qwen2' | 'qwen3' | 'llama'
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  # None (default RoPE) or a hashable tuple of (key, value) pairs of the HF
  # rope_scaling dict (rope_type 'llama3' or 'linear').
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = False
  qkv_bias: bool = False
  o_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 4096
  bos_token_id: int | None = None
  eos_token_id: int | tuple[int, ...] | None = None
  param_dtype: Any = jnp.float32
  dtype: Any = jnp.float32  # compute dtype; logits are always fp32.
  # Static execution choices (they change memory and speed, not the params):
  # attention: 'auto' | 'dense' | 'chunked' | 'splash' | 'cudnn' (see
  # attention.py);
  # remat: 'none' | 'block' (each decoder block recomputed in the backward).
  attention: str = 'auto'
  remat: str = 'none'
  # The platform the programs are built for ('tpu' | 'gpu' | 'cpu'; '': the
  # running backend): the backend-dependent choices (attention for 'auto',
  # a round's cache layout, splash's interpret mode) come from its row of
  # `infra.platforms.TABLE`, so a TPU program can be traced on a CPU host.
  platform: str = ''

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
        f'num_heads={self.num_heads} is not a multiple of '
        f'num_kv_heads={self.num_kv_heads}'
      )
    if self.attention not in attention_lib.IMPLEMENTATIONS:
      raise ValueError(
        f'attention={self.attention!r}: use one of {attention_lib.IMPLEMENTATIONS}'
      )
    if self.remat not in REMAT:
      raise ValueError(f'remat={self.remat!r}: use one of {REMAT}')
    if self.platform:
      platforms.name(self.platform)  # A clear error for an unknown one.

  @property
  def rope_scaling_dict(self) -> dict[str, Any] | None:
    return dict(self.rope_scaling) if self.rope_scaling else None


class KVCache(NamedTuple):
  """Per-layer keys and values plus which cache slots hold real tokens.

  k, v: tuples of L arrays [B, G, S, K] (heads before positions, so the
  attention dots read the cache without transposing it every step; k may be
  [B, G, K, S] in a cache with a shared prefix, below);
  valid: bool [B, S].
  Cache index order equals sequence order (prompts are left-padded), so
  causality is `key index <= query index` on cache indices.
  """

  k: tuple[Array | attention_lib.Blocks, ...]
  v: tuple[Array | attention_lib.Blocks, ...]
  valid: Array
  # A prompt prefix shared by groups of m consecutive rows (the sampler's
  # slots of one prompt), read before k/v: per-layer [B/m, G, P, K] and bool
  # [B/m, P]. Decode only; k/v/valid then index the rows' own tokens from 0.
  # Such a cache holds the prefix's keys transposed ([B/m, G, K, P]: decode
  # reads a prefix whole), and its own ([B, G, K, S]) where
  # `attention.round_keys_transposed` says so (a cache decode reads whole);
  # where `attention.round_cache_blocked` says so its own k/v are held in
  # blocks: per layer a tuple of S/tk buffers [B, G, K, tk] and [B, G, tk, K].
  prefix_k: tuple[Array, ...] = ()
  prefix_v: tuple[Array, ...] = ()
  prefix_valid: Array | None = None


def init_cache(
  config: ModelConfig, batch: int, length: int, dtype: Any = None
) -> KVCache:
  """An empty cache of `length` slots per row (dtype: compute dtype)."""
  dtype = dtype or config.dtype
  shape = (batch, config.num_kv_heads, length, config.head_dim)
  zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
  zeros_v = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
  return KVCache(zeros, zeros_v, jnp.zeros((batch, length), jnp.bool_))


def positions_from_mask(mask: Array) -> Array:
  """RoPE positions [B, T] from a 0/1 mask: left padding does not shift them."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def rope_inv_freq(config: ModelConfig) -> Array:
  """fp32 inverse frequencies [K/2], with llama3 / linear scaling applied."""
  k = config.head_dim
  inv = 1.0 / (config.rope_theta ** (jnp.arange(0, k, 2, dtype=jnp.float32) / k))
  scaling = config.rope_scaling_dict
  if not scaling:
    return inv
  kind = scaling.get('rope_type', scaling.get('type', 'default'))
  if kind == 'default':
    return inv
  if kind == 'linear':
    return inv / float(scaling['factor'])
  if kind == 'llama3':
    factor = float(scaling['factor'])
    low = float(scaling.get('low_freq_factor', 1.0))
    high = float(scaling.get('high_freq_factor', 4.0))
    old_len = float(scaling['original_max_position_embeddings'])
    wavelen = 2 * math.pi / inv
    scaled = jnp.where(wavelen > old_len / low, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
    return jnp.where(medium, smoothed, scaled)
  raise ValueError(f'unsupported rope_scaling type {kind!r}')


class RopeTables(NamedTuple):
  """RoPE's cos and sin at a call's positions, fp32 [B, T, 1, K/2] each."""

  cos: Array
  sin: Array


def rope_tables(positions: Array, inv_freq: Array) -> RopeTables:
  """The RoPE angles of one model call: cos / sin of positions [B, T] x inv_freq.

  Every layer's q and k rotate by the same angles, so a call makes them once
  (or takes them made: `Transformer.__call__`'s rope). Within one XLA
  computation the compiler may still fuse the cos / sin into each rotation,
  per head; the sampler's decode loop makes the next step's tables in the
  step before, so they reach the step as loop state (see `sampler`).
  """
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, K/2]
  return RopeTables(jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :])


def apply_rope(x: Array, rope: RopeTables) -> Array:
  """Rotate-half RoPE on x [B, T, H, K] by `rope_tables`' angles, in fp32."""
  cos, sin = rope
  xf = x.astype(jnp.float32)
  x1, x2 = jnp.split(xf, 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def _param(rngs: nnx.Rngs, shape, axes, dtype, scale: float | None = None):
  fan_in = shape[0] if scale is None else None
  std = scale if scale is not None else 1.0 / math.sqrt(fan_in)
  value = (jax.random.normal(rngs.params(), shape, jnp.float32) * std).astype(dtype)
  return nnx.Param(value, axes=axes)


class RMSNorm(nnx.Module):
  """RMSNorm with fp32 statistics, as HF computes it."""

  def __init__(self, dim: int, eps: float, dtype: Any, axes=(NORM,)):
    self.scale = nnx.Param(jnp.ones((dim,), dtype), axes=axes)
    self.eps = eps

  def __call__(self, x: Array) -> Array:
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return (self.scale[...].astype(jnp.float32) * xf).astype(x.dtype)


class Attention(nnx.Module):
  """GQA self-attention with optional q/k/v bias and per-head q/k RMSNorm."""

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    d, h, g, k, pd = (
      c.hidden_size,
      c.num_heads,
      c.num_kv_heads,
      c.head_dim,
      c.param_dtype,
    )
    self.q = _param(rngs, (d, h, k), (EMBED, Q_HEADS, HEAD_DIM), pd)
    self.k = _param(rngs, (d, g, k), (EMBED, KV_HEADS, HEAD_DIM), pd)
    self.v = _param(rngs, (d, g, k), (EMBED, KV_HEADS, HEAD_DIM), pd)
    self.o = _param(
      rngs, (h, k, d), (Q_HEADS, HEAD_DIM, EMBED), pd, 1 / math.sqrt(h * k)
    )
    if c.qkv_bias:
      self.q_bias = nnx.Param(jnp.zeros((h, k), pd), axes=(Q_HEADS, HEAD_DIM))
      self.k_bias = nnx.Param(jnp.zeros((g, k), pd), axes=(KV_HEADS, HEAD_DIM))
      self.v_bias = nnx.Param(jnp.zeros((g, k), pd), axes=(KV_HEADS, HEAD_DIM))
    if c.o_bias:
      self.o_bias = nnx.Param(jnp.zeros((d,), pd), axes=(EMBED,))
    if c.qk_norm:
      self.q_norm = RMSNorm(k, c.rms_norm_eps, pd, axes=(HEAD_DIM,))
      self.k_norm = RMSNorm(k, c.rms_norm_eps, pd, axes=(HEAD_DIM,))
    self.config = c

  def __call__(
    self,
    x: Array,
    rope: RopeTables,
    mask: attention_lib.AttentionMask,
    k_cache: Array | attention_lib.Blocks,
    v_cache: Array | attention_lib.Blocks,
    write_index: Array,
    impl: str,
    prefix_kv: tuple[Array, Array] | None = None,
  ) -> tuple[Array, Array, Array]:
    c = self.config
    dt = c.dtype
    q = jnp.einsum('btd,dhk->bthk', x, self.q[...].astype(dt))
    k = jnp.einsum('btd,dgk->btgk', x, self.k[...].astype(dt))
    v = jnp.einsum('btd,dgk->btgk', x, self.v[...].astype(dt))
    if c.qkv_bias:
      q = q + self.q_bias[...].astype(dt)
      k = k + self.k_bias[...].astype(dt)
      v = v + self.v_bias[...].astype(dt)
    if c.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    q = apply_rope(q, rope)
    k = apply_rope(k, rope)
    keys_t = attention_lib.cache_keys_transposed(mask.kv_valid, mask.prefix_valid)
    k_cache, v_cache = write_kv(k_cache, v_cache, k, v, write_index, keys_t)

    if impl == 'cudnn':
      # S == T from index 0: the cache holds exactly this call's keys, which
      # the kernel takes as they are, [B, T, G, K] (no transposed read).
      out = attention_lib.fused_attention(q, k, v, mask.lengths, c.platform)
    else:
      out = attention_lib.attend(
        q, k_cache, v_cache, mask, impl, dt, prefix_kv, platform=c.platform
      )
    y = jnp.einsum('bthk,hkd->btd', out, self.o[...].astype(dt))
    if c.o_bias:
      y = y + self.o_bias[...].astype(dt)
    return y, k_cache, v_cache


def write_kv(
  k_cache: Array | attention_lib.Blocks,
  v_cache: Array | attention_lib.Blocks,
  k: Array,
  v: Array,
  write_index: Array,
  keys_transposed: bool = False,
) -> tuple[Array, Array] | tuple[attention_lib.Blocks, attention_lib.Blocks]:
  """Writes one layer's new keys and values k, v [B, T, G, K] into its caches.

  v_cache is [B, G, S, K]; k_cache too, or [B, G, K, S] with keys_transposed
  (a cache with a shared prefix, see `KVCache`). A cache in blocks (tuples of
  buffers, k [B, G, K, tk], v [B, G, tk, K]) takes one token (T = 1) at one
  index for all rows.
  """
  if isinstance(k_cache, tuple):
    if k.shape[1] != 1 or jnp.ndim(write_index):
      raise ValueError(
        f'a cache in blocks takes one token at one index, got T={k.shape[1]}'
        f' at an index of shape {jnp.shape(write_index)}'
      )
    k_col = k.transpose(0, 2, 3, 1).astype(k_cache[0].dtype)  # [B, G, K, 1]
    v_col = v.transpose(0, 2, 1, 3).astype(v_cache[0].dtype)  # [B, G, 1, K]
    return (
      _write_blocks(k_cache, k_col, write_index, axis=3),
      _write_blocks(v_cache, v_col, write_index, axis=2),
    )
  if keys_transposed:
    k_cache = write_cache(k_cache, k.transpose(0, 2, 3, 1), write_index, axis=3)
  else:
    k_cache = write_cache(k_cache, k.transpose(0, 2, 1, 3), write_index, axis=2)
  v_cache = write_cache(v_cache, v.transpose(0, 2, 1, 3), write_index, axis=2)
  return k_cache, v_cache


def _write_blocks(
  blocks: attention_lib.Blocks, new: Array, index: Array, axis: int
) -> attention_lib.Blocks:
  """Writes one position `new` (size 1 on `axis`) at cache index `index` of blocks.

  Every block takes an in-place write at its clamped offset: the new column
  in the block that holds `index`, its own column back in the others. A
  cond per block around the write was slower, as was one write into a
  stacked [S/tk, ..] array (0.12 against 0.06 ms a step for 8 blocks of 4
  layers' keys and values).
  """
  tk = blocks[0].shape[axis]
  out = []
  for j, block in enumerate(blocks):
    at = jnp.clip(index - j * tk, 0, tk - 1)
    starts = [0] * block.ndim
    starts[axis] = at
    old = jax.lax.dynamic_slice(block, starts, new.shape)
    col = jnp.where(index // tk == j, new, old)
    out.append(jax.lax.dynamic_update_slice(block, col, starts))
  return tuple(out)


def write_cache(cache: Array, new: Array, write_index: Array, axis: int = 1) -> Array:
  """Writes `new` into `cache` along the position `axis` at write_index.

  cache [B, ..., S, ...] and new [B, ..., T, ...] differ only on `axis`.
  write_index is a scalar (all rows at the same index: one in-place
  dynamic_update_slice, the fast path for batched decode) or int [B] (each
  row at its own index).
  """
  new = new.astype(cache.dtype)
  if write_index.ndim == 0:
    starts = [0] * cache.ndim
    starts[axis] = write_index
    return jax.lax.dynamic_update_slice(cache, new, starts)

  def one(row_cache, row_new, idx):
    starts = [0] * row_cache.ndim
    starts[axis - 1] = idx
    return jax.lax.dynamic_update_slice(row_cache, row_new, starts)

  return jax.vmap(one)(cache, new, write_index)


class FeedForward(nnx.Module):
  """SwiGLU feed-forward."""

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    d, f, pd = c.hidden_size, c.intermediate_size, c.param_dtype
    self.gate = _param(rngs, (d, f), (EMBED, MLP), pd)
    self.up = _param(rngs, (d, f), (EMBED, MLP), pd)
    self.down = _param(rngs, (f, d), (MLP, EMBED), pd)
    self.dtype = c.dtype

  def __call__(self, x: Array) -> Array:
    dt = self.dtype
    gate = x @ self.gate[...].astype(dt)
    up = x @ self.up[...].astype(dt)
    return (jax.nn.silu(gate) * up) @ self.down[...].astype(dt)


class Block(nnx.Module):
  """Pre-norm decoder block."""

  def __init__(self, c: ModelConfig, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.param_dtype)
    self.attn = Attention(c, rngs)
    self.mlp_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.param_dtype)
    self.mlp = FeedForward(c, rngs)

  def __call__(
    self,
    x: Array,
    rope: RopeTables,
    mask: attention_lib.AttentionMask,
    k_cache: Array | attention_lib.Blocks,
    v_cache: Array | attention_lib.Blocks,
    write_index: Array,
    impl: str,
    prefix_kv: tuple[Array, Array] | None = None,
  ) -> tuple[Array, Array, Array]:
    y, k_cache, v_cache = self.attn(
      self.attn_norm(x),
      rope,
      mask,
      k_cache,
      v_cache,
      write_index,
      impl,
      prefix_kv,
    )
    x = x + y
    x = x + self.mlp(self.mlp_norm(x))
    return x, k_cache, v_cache


def _remat_block(layer: Block, impl: str, *args: Any) -> tuple[Array, Array, Array]:
  """Runs `layer` under jax.checkpoint, saving nothing inside it.

  The backward keeps only the block's inputs (x [B, T, D] and what the layers
  share: RoPE tables, mask, params) and recomputes the block, attention's
  forward included. Values and gradients are those of the plain call.

  The recomputation is kept apart from the forward by jax.checkpoint's
  optimization barriers (XLA on GPU removes them only after scheduling). XLA
  on CPU removes them during optimization (none is left in the compiled HLO)
  and merges most of the recomputation back into the forward, so on CPU this
  saves little: 28 blocks, B=8, T=256, D=256, temp 1673 MiB vs 1785 MiB
  without remat, where the same remat in a scan over the layers (which fixes
  the order) gives 260 MiB (benchmarks/compile_time.py). TPU is not
  measurable here.
  """
  graphdef, state = nnx.split(layer)

  @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
  def run(state, *args):
    return nnx.merge(graphdef, state)(*args, impl)

  return run(state, *args)


class Transformer(nnx.Module):
  """The policy: embeddings, L blocks, final norm, (tied) LM head."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    c = config
    self.config = c
    self.embed = _param(
      rngs, (c.vocab_size, c.hidden_size), (VOCAB, EMBED), c.param_dtype, 0.02
    )
    self.layers = nnx.List([Block(c, rngs) for _ in range(c.num_layers)])
    self.final_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, c.param_dtype)
    if not c.tie_embeddings:
      self.lm_head = _param(
        rngs, (c.hidden_size, c.vocab_size), (EMBED, VOCAB), c.param_dtype
      )

  def __call__(
    self,
    tokens: Array,
    positions: Array,
    cache: KVCache,
    write_index: Array,
    token_mask: Array,
    *,
    return_hidden: bool = False,
    rope: RopeTables | None = None,
  ) -> tuple[Array, KVCache]:
    """Runs T new tokens through the model, reading and writing the cache.

    Args:
      tokens: int [B, T].
      positions: int [B, T] RoPE positions (see positions_from_mask).
      cache: KVCache with S >= write_index + T slots; with a shared prefix
        (decode, T = 1) write_index and the causal order count from the
        first key after the prefix.
      write_index: scalar or int [B], cache index of tokens[:, 0].
      token_mask: [B, T] 1 on real tokens (written into cache validity).
      return_hidden: return the final hidden states [B, T, D] instead of logits.
      rope: `rope_tables(positions, rope_inv_freq(config))`, made by the
        caller (the sampler's decode loop, see `rope_tables`); default: made
        here.

    Returns:
      (fp32 logits [B, T, V] or hidden [B, T, D], updated cache).
    """
    c = self.config
    b, t = tokens.shape
    impl = _resolve(c, t, cache.valid.shape[-1])
    shift = None
    if impl == 'cudnn':
      # The fused kernel (S == T, written from index 0) wants each row's real
      # tokens at [0, length): every row is rolled left by its left pad
      # (`attention.roll_rows`) on tokens, mask and positions together, and
      # the outputs, the written keys and values and the cache validity are
      # rolled back at the end, so callers see the usual layout.
      shift = attention_lib.left_pads(token_mask)
      tokens, positions, token_mask = (
        attention_lib.roll_rows(a, shift) for a in (tokens, positions, token_mask)
      )
      if rope is not None:
        rope = RopeTables(*(attention_lib.roll_rows(a, shift) for a in rope))
    if cache.prefix_valid is not None:
      if t != 1 or c.attention == 'dense':
        raise ValueError(
          f'a shared-prefix cache is for decode (T = 1, attention != dense), '
          f'got T={t}, attention={c.attention!r}'
        )
      impl = 'decode'
    write_index = jnp.asarray(write_index, jnp.int32)
    valid = write_cache(cache.valid, token_mask.astype(jnp.bool_), write_index)
    start = write_index if write_index.ndim == 0 else write_index[:, None]
    query_index = start + jnp.arange(t, dtype=jnp.int32)[None, :]
    query_index = jnp.broadcast_to(query_index, (b, t))
    mask = attention_lib.make_mask(query_index, valid, impl, cache.prefix_valid)
    if rope is None:
      rope = rope_tables(positions, rope_inv_freq(c))

    x = jnp.take(self.embed[...], tokens, axis=0).astype(c.dtype)
    new_k, new_v = [], []
    for i, layer in enumerate(self.layers):
      args = (x, rope, mask, cache.k[i], cache.v[i], write_index)
      if c.remat == 'block' and t > 1:
        x, k_i, v_i = _remat_block(layer, impl, *args)
      else:
        prefix = None
        if cache.prefix_valid is not None:
          prefix = (cache.prefix_k[i], cache.prefix_v[i])
        x, k_i, v_i = layer(*args, impl, prefix)
      new_k.append(k_i)
      new_v.append(v_i)
    x = self.final_norm(x)
    if shift is not None:
      back = -shift
      x = attention_lib.roll_rows(x, back)
      # Keys and values [B, G, S, K]: their S axis rolled back.
      new_k, new_v = (
        [attention_lib.roll_rows(a.swapaxes(1, 2), back).swapaxes(1, 2) for a in kv]
        for kv in (new_k, new_v)
      )
      valid = attention_lib.roll_rows(valid, back)
    new_cache = cache._replace(k=tuple(new_k), v=tuple(new_v), valid=valid)
    if return_hidden:
      return x, new_cache
    return self.project(x), new_cache

  def project(self, hidden: Array) -> Array:
    """fp32 logits [B, T, V] from final hidden states [B, T, D]."""
    c = self.config
    if c.tie_embeddings:
      w = self.embed[...].astype(c.dtype)
      return jnp.einsum('btd,vd->btv', hidden, w, preferred_element_type=jnp.float32)
    w = self.lm_head[...].astype(c.dtype)
    return jnp.einsum('btd,dv->btv', hidden, w, preferred_element_type=jnp.float32)

  def hidden(self, tokens: Array, mask: Array) -> Array:
    """The training forward: final hidden states [B, T, D], no cache kept.

    With `remat='block'` the layers run in a `lax.scan` over their params,
    stacked at call time (the param tree keeps its `layers[i]` paths), each
    step under jax.checkpoint: the backward keeps one [B, T, D] input per
    layer and recomputes the block. The scan is what makes the saving
    reliable: XLA on CPU drops the optimization barriers of unrolled
    checkpoints and merges the recomputation back into the forward (28
    blocks, B=8, T=256, D=256: 1673 MiB temp unrolled, 260 MiB scanned).
    The stacked copy of the layers' params costs 1x their bytes per device
    while the step runs.
    """
    c = self.config
    b, t = tokens.shape
    if c.remat != 'block' or t == 1:
      cache = init_cache(c, b, t)
      h, _ = self(
        tokens, positions_from_mask(mask), cache, jnp.int32(0), mask, return_hidden=True
      )
      return h
    impl = _resolve(c, t, t)
    valid = mask.astype(jnp.bool_)
    positions = positions_from_mask(mask)
    shift = None
    if impl == 'cudnn':  # Left-aligned rows, rolled back at the end (`__call__`).
      shift = attention_lib.left_pads(mask)
      tokens, valid, positions = (
        attention_lib.roll_rows(a, shift) for a in (tokens, valid, positions)
      )
    query_index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (b, t))
    attn_mask = attention_lib.make_mask(query_index, valid, impl)
    rope = rope_tables(positions, rope_inv_freq(c))
    graphdef, _ = nnx.split(self.layers[0])
    stacked = jax.tree.map(
      lambda *xs: jnp.stack(xs), *(nnx.state(layer) for layer in self.layers)
    )
    kv_shape = (b, c.num_kv_heads, t, c.head_dim)

    @functools.partial(jax.checkpoint, policy=jax.checkpoint_policies.nothing_saveable)
    def body(x, state):
      empty = jnp.zeros(kv_shape, c.dtype)  # The block writes its own K/V here.
      layer = nnx.merge(graphdef, state)
      x, _, _ = layer(x, rope, attn_mask, empty, empty, jnp.int32(0), impl)
      return x, None

    x = jnp.take(self.embed[...], tokens, axis=0).astype(c.dtype)
    x, _ = jax.lax.scan(body, x, stacked)
    x = self.final_norm(x)
    return x if shift is None else attention_lib.roll_rows(x, -shift)

  def forward(self, tokens: Array, mask: Array) -> Array:
    """Full forward without a persistent cache: fp32 logits [B, T, V]."""
    return self.project(self.hidden(tokens, mask))


def _resolve(c: ModelConfig, t: int, s: int) -> str:
  """`attention.resolve` for this model's config and a T-token call on S keys."""
  return attention_lib.resolve(c.attention, t, s, c.platform, c.dtype, c.head_dim)


@functools.partial(jax.jit, static_argnums=0)
def _logits_jit(graphdef, state, tokens, mask):
  return nnx.merge(graphdef, state).forward(tokens, mask)


def logits(model: Transformer, tokens: Array, mask: Array) -> Array:
  """Full forward: float32 logits [B, T, V] for int tokens [B, T] (may be left-padded).

  `mask` is 1 on real tokens. Outputs at padding positions are finite but
  meaningless.
  """
  graphdef, state = nnx.split(model)
  return _logits_jit(
    graphdef, state, jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, jnp.int32)
  )


def create_model(config: ModelConfig, seed: int = 0) -> Transformer:
  """A randomly initialised model on the default device (see sharding.create_sharded_model)."""
  return Transformer(config, rngs=nnx.Rngs(seed))


# Config fields that change how the model runs, never its params. The
# position limit is one: RoPE is computed per position, there is no table
# (the reference raises Qwen2.5-Math's to 32768 for evaluation).
_EXECUTION_FIELDS = (
  'attention',
  'remat',
  'dtype',
  'max_position_embeddings',
  'platform',
)


def with_config(model: Transformer, **changes: Any) -> Transformer:
  """The same params (shared, not copied) under a config with `changes`.

  Only execution fields may change (attention, remat, dtype, platform); e.g.
  `with_config(hf.load_model(path), attention='chunked', remat='block')`.
  """
  bad = sorted(set(changes) - set(_EXECUTION_FIELDS))
  if bad:
    raise ValueError(f'with_config: {bad} change the params; only {_EXECUTION_FIELDS}')
  config = dataclasses.replace(model.config, **changes)
  abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, _ = nnx.split(abstract)
  return nnx.merge(graphdef, nnx.state(model))


def count_params(model: Transformer) -> int:
  """Number of parameters."""
  return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
