"""KV-cached batched sampling over fixed-shape slots: one compile per run.

Two entry points share one compiled decode program:

  sample(model, prompt_tokens, prompt_mask, ...)          plain batched sampling
  prefill(model, prompt_tokens, prompt_mask) -> PromptCache   once per RL step
  sample_round(model, prompt_cache, slot_prompt, ...)     every round of the step

`prefill` runs the step's B prompts once and keeps their KV cache and
last-position logits. Each round, `sample_round` gathers the prefix KV of the
prompt each slot continues (slot_prompt[s], -1 = idle slot) instead of
re-running the prompt, and decodes all S slots in one `lax.while_loop` that
stops as soon as every live slot has emitted an EOS. The prompt cache is only
read (never donated), so every round of the step reuses it.

The round's cache (`round_cache`): with blockwise decode attention (every
`model.attention` but 'dense') the prompt's keys are held once per group of
`group` consecutive slots ([S/group, G, P, K]; the controller's paper
schedule puts a prompt's M slots side by side, `slot_group`) and each slot
has its own [S, G, N, K] response cache; a decode step scores a group's
queries against its prompt's keys in one product, so a prompt's keys are read
once per group, not once per slot, and whole. Each holds its keys
transposed when decode reads it whole: the prefix always ([.., K, P]), the
response cache where `attention.round_keys_transposed` ([.., K, N]). The
round copies the prompt's keys into that layout once, and every decode
step's score product reads them as a matrix product's right operand. On CPU
a response cache too long to read whole is held in blocks, per layer N/tk
buffers of keys [S, G, K, tk] and values [S, G, tk, K]
(`attention.round_cache_blocked`): decode reads each block's buffer in
place.
attention='dense' keeps the reference layout, a [S, G, P + N, K] cache per
slot with the prompt copied in.
The loop also carries the next step's RoPE tables (`step_rope`, made in the
step before), so every layer of a step rotates by one cos / sin table.

Sampling knobs are traced arrays: temperature, top_p and top_k per slot [S],
EOS ids padded to MAX_EOS_IDS. Changing them, or the slot assignment, never
recompiles; S, the prompt bucket P and the generation length N fix the shapes.
One static switch: `filter_logits=False` (a run whose config turns top-p and
top-k off, `needs_filter`) compiles the round without their filter and its
vocab sort.

Drawing a token costs no random number per vocab entry: two uniforms per slot
invert the CDF of softmax(logits / T), first over blocks of the vocab, then
inside the chosen block (see `_choose`).

Log-probabilities: `logprobs[s, t]` is the fp32 log-probability of the
sampled token under softmax(logits / temperature) over the FULL vocabulary,
the quantity the trainer recomputes from its own forward pass (so their gap
can be logged). top-k / top-p only restrict which tokens may be drawn; they do
not renormalise the reported log-probability (a filtered draw therefore has a
logprob no larger than under the truncated distribution). At temperature 0
(greedy) it is the log-softmax of the raw logits.

Dimension legend:
  B: prompts of the step          S: sampling slots of a round
  P: prompt bucket (left-padded)  N: max new tokens
  V: vocab   L: layers   G: KV heads   K: head dim   E: MAX_EOS_IDS
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ada_jax import attention as attention_lib
from ada_jax import model as model_lib
from ada_jax import sharding as sharding_lib
from ada_jax.infra import hlo, platforms

Array = jax.Array
MAX_EOS_IDS = 8


class Rollout(NamedTuple):
  """Sampled continuations; entries after a row's first EOS are masked."""

  tokens: Array  # int32 [S, N]
  logprobs: Array  # fp32 [S, N]
  mask: Array  # int32 [S, N], 1 up to and including the first EOS
  lengths: Array  # int32 [S]


class PromptCache(NamedTuple):
  """The step's prompts, run once: per-layer KV [B, G, P, K] and what decoding needs."""

  k: tuple[Array, ...]
  v: tuple[Array, ...]
  valid: Array  # bool [B, P]
  last_logits: Array  # fp32 [B, V], logits after the last prompt token
  lengths: Array  # int32 [B], real prompt lengths (first new token's position)


def _mesh_of(state: nnx.State):
  """The mesh of concrete (non-traced) params, None when not mesh-sharded."""
  leaf = jax.tree.leaves(state)[0]
  sh = getattr(leaf, 'sharding', None)
  return sh.mesh if isinstance(sh, NamedSharding) else None


def _rows_sharding(mesh, rows: int, ndim: int):
  """Rows (prompts or slots) split over the data axes when they divide."""
  if mesh is None or rows % sharding_lib.data_parallel_size(mesh):
    return None
  return NamedSharding(
    mesh, PartitionSpec(sharding_lib.BATCH_AXES, *([None] * (ndim - 1)))
  )


def _tensor_if_divides(mesh, size: int) -> str | None:
  return 'tensor' if size % mesh.shape['tensor'] == 0 else None


def _cache_sharding(mesh, rows: int, kv_heads: int):
  """KV cache [rows, G, T, K]: rows over the data axes, KV heads over tensor.

  Heads stay where the tensor-split K/V projections put them: a cache
  replicated over tensor would be all-gathered at every generated token.
  A cache in blocks shards each block's buffer alike.
  """
  if mesh is None or rows % sharding_lib.data_parallel_size(mesh):
    return None
  heads = _tensor_if_divides(mesh, kv_heads)
  return NamedSharding(mesh, PartitionSpec(sharding_lib.BATCH_AXES, heads, None, None))


def _logits_sharding(mesh, rows: int, vocab: int):
  """Logits [rows, V]: rows over the data axes, the vocab over tensor.

  The layout the vocab-split LM head gives the decode loop's logits, so the
  first token (drawn from the prompt cache's last logits) is chosen with the
  same per-device [S/dp, V/tensor] temporaries as every later one.
  """
  if mesh is None or rows % sharding_lib.data_parallel_size(mesh):
    return None
  vocab_axis = _tensor_if_divides(mesh, vocab)
  return NamedSharding(mesh, PartitionSpec(sharding_lib.BATCH_AXES, vocab_axis))


def filter_rows_divide(rows: int, dp: int, tensor: int) -> bool:
  """Whether `_filter_sharding` moves `rows` over the tensor axis too.

  Needs a tensor axis and rows dividing over data x fsdp x tensor (the
  planner's TPU rounds count the filter's sort by the same test).
  """
  return tensor > 1 and rows % (dp * tensor) == 0


def _filter_sharding(mesh, rows: int):
  """The top-p / top-k filter's [rows, V] layout: rows over every mesh axis.

  The filter sorts each row's whole vocab. Left split over tensor, the
  partitioner gathers the vocab for the sort, and how many whole-vocab fp32
  copies it keeps depends on the vocab size (libtpu at (1, 2, 8), per slot:
  0.65 for Llama's 128,256 entries, 0.26 for Qwen2.5's 152,064, 4.4 for
  Qwen3's 151,936). Moving the rows over the tensor axis instead (an
  all-to-all of the same bytes) gives every device S / (dp x tensor) whole
  rows: the sort's temporaries are those of an unsharded sort on 1 / tensor
  of the slots, whatever the vocab. None (propagation decides) where
  `filter_rows_divide` says no. Used where the platform table says so
  (`platforms.Platform.filter_rows_spread`).
  """
  if mesh is None or not filter_rows_divide(
    rows, sharding_lib.data_parallel_size(mesh), mesh.shape['tensor']
  ):
    return None
  return NamedSharding(mesh, PartitionSpec((*sharding_lib.BATCH_AXES, 'tensor'), None))


def _vector(layout: NamedSharding) -> NamedSharding:
  """The layout of a [rows] vector beside a [rows, ...] array laid out so."""
  return NamedSharding(layout.mesh, PartitionSpec(layout.spec[0]))


def _constrain(x, sh):
  """Constrains x (an array, or a tuple of them: one sharding for all) to sh."""
  if sh is None:
    return x
  return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, sh), x)


@functools.partial(jax.jit, static_argnums=(0, 1, 5))
def _prefill_jit(graphdef, mesh, state, tokens, mask, kv_dtype):
  model = nnx.merge(graphdef, state)
  b, p = tokens.shape
  cache = model_lib.init_cache(model.config, b, p, kv_dtype)
  sh = _cache_sharding(mesh, b, model.config.num_kv_heads)
  cache = model_lib.KVCache(
    tuple(_constrain(x, sh) for x in cache.k),
    tuple(_constrain(x, sh) for x in cache.v),
    cache.valid,
  )
  positions = model_lib.positions_from_mask(mask)
  hidden, cache = model(
    tokens, positions, cache, jnp.int32(0), mask, return_hidden=True
  )
  # Left padding: the last column is every row's last real token.
  last = model.project(hidden[:, -1:])[:, 0]
  lengths = jnp.sum(mask, axis=-1).astype(jnp.int32)
  # Pinned, whatever the prompts' own layout: the rows stay split over the
  # data axes, the last logits' vocab over tensor (as the LM head makes them).
  return PromptCache(
    cache.k,
    cache.v,
    _constrain(cache.valid, _rows_sharding(mesh, b, 2)),
    _constrain(last, _logits_sharding(mesh, b, model.config.vocab_size)),
    _constrain(lengths, _rows_sharding(mesh, b, 1)),
  )


def prefill(
  model: model_lib.Transformer,
  prompt_tokens: Array,
  prompt_mask: Array,
  *,
  kv_dtype: Any = None,
) -> PromptCache:
  """Runs the step's B left-padded prompts [B, P] once; returns their cache.

  Args:
    model: the policy (ideally in the sampling layout, see sharding.py).
    prompt_tokens: int [B, P], left-padded.
    prompt_mask: [B, P], 1 on real tokens; every row needs >= 1 real token.
    kv_dtype: cache dtype; default the model's compute dtype (fp32 tests stay
      exact), e.g. jnp.bfloat16 to halve cache memory.
  """
  graphdef, state = nnx.split(model)
  kv_dtype = jnp.dtype(kv_dtype or model.config.dtype)
  return _prefill_jit(
    graphdef,
    _mesh_of(state),
    state,
    _as(prompt_tokens, np.int32),
    _as(prompt_mask, np.int32),
    kv_dtype,
  )


# The vocab is drawn from in (up to) this many blocks: a block, then a token in
# it (see `_choose`).
VOCAB_BLOCKS = 128


def needs_filter(top_p: float, top_k: int) -> bool:
  """Whether knobs with these values need the top-p / top-k filter compiled.

  The callers' static `filter_logits`: a run whose config turns both off
  (top_p = 1, top_k = 0) compiles a round without the filter's vocab sort.
  """
  return float(top_p) < 1.0 or int(top_k) > 0


def _filter_floor(
  scaled: Array, top_p: Array, top_k: Array, layout: Any = None
) -> Array:
  """Each row's smallest kept scaled logit [S] under its top-k / nucleus set.

  layout: `_filter_sharding`, the rows' layout for the sort (None: as given).
  """
  v = scaled.shape[-1]
  scaled = _constrain(scaled, layout)
  if layout is not None:
    top_p, top_k = _constrain((top_p, top_k), _vector(layout))
  sorted_desc = -jnp.sort(-scaled, axis=-1)
  rank = jnp.arange(v, dtype=jnp.int32)[None, :]
  k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)[:, None]
  in_k = rank < k
  masked = jnp.where(in_k, sorted_desc, -jnp.inf)
  probs = jax.nn.softmax(masked, axis=-1)
  before = jnp.cumsum(probs, axis=-1) - probs
  keep = in_k & ((before < top_p[:, None]) | (rank == 0))
  n_keep = jnp.sum(keep, axis=-1)
  return jnp.take_along_axis(sorted_desc, (n_keep - 1)[:, None], axis=-1)[:, 0]


def _invert_cdf(mass: Array, u: Array) -> Array:
  """Index [S] whose cumulative mass first exceeds u * total; mass [S, n] >= 0."""
  cdf = jnp.cumsum(mass, axis=-1)
  below = jnp.sum(cdf <= u[:, None] * cdf[:, -1:], axis=-1)
  return jnp.minimum(below, mass.shape[-1] - 1).astype(jnp.int32)


def _choose(
  logits: Array,
  u: Array,
  temperature: Array,
  top_p: Array,
  top_k: Array,
  filter_logits: bool = True,
  filter_layout: Any = None,
) -> tuple[Array, Array]:
  """Next token [S] and its fp32 logprob under softmax(logits / T) (full vocab).

  The draw inverts the CDF of softmax(logits / T) (restricted to the top-p /
  top-k set) with two uniforms per slot, u [S, 2], in two levels: the vocab
  [V] is viewed as [VB, V / VB] blocks (VB = gcd(V, VOCAB_BLOCKS)); u[:, 0]
  picks a block by the blocks' masses, u[:, 1] a token inside it. Per token
  this is one exp, a block sum and a max over the vocab, no random number
  per vocab entry (Gumbel-max drew V of them) and no cumulative sum over V
  (only over VB blocks and one block's V / VB entries). A block is a
  contiguous slice of the vocab: with the vocab split over the tensor axis
  (VB a multiple of its size) each block lies on one shard. Each level resolves its
  uniform's 2^-23 steps separately, so a token's probability is exact to
  about 2^-23 of its block's mass, not of the whole distribution's. Where
  fp32 rounding in the cumulative sums would land on a token of zero mass (a
  filtered one, or an underflowed exp; of the order of 2^-23 of draws at
  most), the row's most likely token is taken instead.

  The logprob is the token's scaled logit minus the log-sum-exp of the full
  scaled vocab: no [S, V] log-softmax is formed.

  filter_logits (static): False compiles no top-p / top-k filter (the knobs
  must then be off); True filters under a `lax.cond` on the traced knobs.
  filter_layout: the filter's row layout (`_filter_sharding`; None: as the
  logits are laid out).
  """
  s, v = logits.shape
  nb = math.gcd(v, VOCAB_BLOCKS)
  greedy = temperature <= 0
  t = jnp.where(greedy, 1.0, temperature)[:, None]
  scaled = logits / t
  top = jnp.max(scaled, axis=-1, keepdims=True)
  weight = jnp.exp(scaled - top)  # [S, V], the top token's is 1
  log_z = top[:, 0] + jnp.log(jnp.sum(weight, axis=-1))
  if filter_logits:
    floor = jax.lax.cond(
      jnp.any((top_p < 1.0) | (top_k > 0)),
      lambda: _filter_floor(scaled, top_p, top_k, filter_layout),
      lambda: jnp.full((s,), -jnp.inf, scaled.dtype),
    )
    weight = jnp.where(scaled >= floor[:, None], weight, 0.0)
  blocks = weight.reshape(s, nb, v // nb)
  block = _invert_cdf(jnp.sum(blocks, axis=-1), u[:, 0])
  inside = jnp.take_along_axis(blocks, block[:, None, None], axis=1)[:, 0]
  j = _invert_cdf(inside, u[:, 1])
  has_mass = jnp.take_along_axis(inside, j[:, None], axis=-1)[:, 0] > 0
  mode = jnp.argmax(logits, axis=-1)
  sampled = jnp.where(has_mass, block * (v // nb) + j, mode)
  token = jnp.where(greedy, mode, sampled).astype(jnp.int32)
  logp = jnp.take_along_axis(scaled, token[:, None], axis=-1)[:, 0] - log_z
  return token, logp


def next_token(
  logits: Array,
  rng: Array,
  step: Array | int,
  temperature: Array,
  top_p: Array,
  top_k: Array,
  filter_logits: bool = True,
  filter_layout: Any = None,
  slot_offset: Array | int = 0,
  round_slots: int | None = None,
) -> tuple[Array, Array]:
  """Column `step`'s tokens [S] and logprobs from its logits [S, V].

  The uniforms of slot s at column `step` are element s of one [S, 2] draw
  under fold_in(rng, step): with JAX's partitionable threefry (the default)
  each element comes from its own counter, so the stream does not depend on
  how the slots are sharded. A slot wave (`sample_round`'s `waves`) holds
  slots slot_offset .. slot_offset + S - 1 of a round of `round_slots`: it
  takes its slice of the round's [round_slots, 2] draw, so each slot draws
  what it draws in a round sampled at once. The token choice of the decode
  loop (exposed for benchmarks/sampler.py, which times it on its own).
  """
  s = logits.shape[0]
  total = s if round_slots is None else int(round_slots)
  u = jax.random.uniform(jax.random.fold_in(rng, step), (total, 2))
  if total != s:
    u = jax.lax.dynamic_slice_in_dim(u, slot_offset, s, axis=0)
  return _choose(logits, u, temperature, top_p, top_k, filter_logits, filter_layout)


def decode_step(
  model: model_lib.Transformer,
  cache: model_lib.KVCache,
  prev: Array,
  start_pos: Array,
  i: Array | int,
  p: int,
  rng: Array,
  temperature: Array,
  top_p: Array,
  top_k: Array,
  filter_logits: bool = True,
  rope: model_lib.RopeTables | None = None,
  filter_layout: Any = None,
  slot_offset: Array | int = 0,
  round_slots: int | None = None,
) -> tuple[Array, Array, model_lib.KVCache]:
  """Decode step i >= 1: the model on the previous tokens, then column i's tokens.

  The body of the decode loop (exposed for benchmarks/sampler.py, which
  times it on its own at chosen cache positions).

  Args:
    model: the policy.
    cache: the round's cache, [S, G, P + N, K] per layer, or [S, G, N, K]
      after a shared prompt prefix (keys maybe transposed, or in blocks:
      see `round_cache`).
    prev: int [S], column i - 1's tokens, written at cache index p + i - 1
      (i - 1 after a shared prefix).
    start_pos: int [S], each slot's prompt length (RoPE position of column 0).
    i: int scalar, the column to choose.
    p: P, the prompt bucket.
    rng: the round's key.
    temperature: fp32 [S], 0 = greedy.
    top_p: fp32 [S].
    top_k: int [S].
    filter_logits: static, see `_choose`.
    filter_layout: see `_choose`.
    rope: `step_rope(model, start_pos, i)`, made before the step (the loop
      makes it in the step before); default: made in the step.
    slot_offset: a slot wave's first slot in its round (see `next_token`).
    round_slots: static, the round's slots (None: S, one wave).

  Returns:
    (tokens [S], fp32 logprobs [S], the cache with column i - 1 written).
  """
  s = prev.shape[0]
  # With a shared prefix the cache holds the response only, from index 0.
  offset = 0 if cache.prefix_valid is not None else p
  logits, cache = model(
    prev[:, None],
    (start_pos + i - 1)[:, None],
    cache,
    offset + i - 1,
    jnp.ones((s, 1), jnp.int32),
    rope=rope,
  )
  tok, lp = next_token(
    logits[:, 0],
    rng,
    i,
    temperature,
    top_p,
    top_k,
    filter_logits,
    filter_layout,
    slot_offset,
    round_slots,
  )
  return tok, lp, cache


def step_rope(
  model: model_lib.Transformer, start_pos: Array, i: Array | int
) -> model_lib.RopeTables:
  """RoPE tables [S, 1, 1, K/2] of decode step i (its input at start_pos + i - 1).

  The decode loop makes step i + 1's tables in step i and carries them: made
  inside the step that reads them, XLA:CPU fused the cos / sin into every
  layer's q and k rotation and computed them per head (about a tenth of an
  RL round's step); carried, they reach the step as a buffer.
  """
  positions = (start_pos + i - 1)[:, None]
  return model_lib.rope_tables(positions, model_lib.rope_inv_freq(model.config))


def _slot_rows(x: Array, slot_prompt: Array, aligned: bool) -> Array:
  """Prompt rows [B, ...] -> slot rows [S, ...], slot s taking slot_prompt[s]'s.

  Aligned (slot s continues prompt s, S == B): the rows are where they are,
  on the device that holds them. Otherwise a gather, which the partitioner
  makes an all-gather of x over the data axes (all B rows on every device:
  the memory plan counts it). Idle slots (-1) take row 0.
  """
  return x if aligned else jnp.take(x, jnp.maximum(slot_prompt, 0), axis=0)


def round_cache(
  model: model_lib.Transformer,
  pc: PromptCache,
  slot_prompt: Array,
  n: int,
  *,
  aligned: bool = False,
  group: int = 1,
  mesh=None,
) -> model_lib.KVCache:
  """The KV cache a round of S slots starts from (traceable; see `sample_round`).

  attention='dense': the reference layout, one [S, G, P + N, K] cache per
  slot with its prompt's keys copied in. Otherwise the prompt's keys once per
  group of `group` slots ([S/group, G, P, K], a `SharedPrefix`) and the
  slots' own empty [S, G, N, K] response cache, the prefix's keys
  transposed ([.., K, P]: decode reads a prefix whole) and the response's
  ([S, G, K, N]) where `attention.round_keys_transposed` says so; on CPU a
  response too long to read whole is held in blocks, per layer N'/tk
  buffers of keys [S, G, K, tk] and values [S, G, tk, K] with
  N' = `attention.round_cache_len(N)` (`attention.round_cache_blocked`).
  """
  s = slot_prompt.shape[0]
  kv_heads = model.config.num_kv_heads
  sh4 = _cache_sharding(mesh, s, kv_heads)
  sh2 = _rows_sharding(mesh, s, 2)

  def rows(x):
    return _slot_rows(x, slot_prompt, aligned)

  if model.config.attention == 'dense':
    # The reference layout: one [S, G, P + N, K] cache per slot, the prompt's
    # keys copied into every slot (one padded write of the gathered prefix; a
    # concatenate with a zeros buffer kept a second, partial copy).
    def slot_cache(prefix):
      return _constrain(jnp.pad(rows(prefix), ((0, 0), (0, 0), (0, n), (0, 0))), sh4)

    cache = model_lib.KVCache(
      tuple(slot_cache(x) for x in pc.k),
      tuple(slot_cache(x) for x in pc.v),
      _constrain(jnp.pad(rows(pc.valid), ((0, 0), (0, n))), sh2),
    )
  else:
    # The prompt's keys once per group of `group` slots (the slots of one
    # prompt), apart from the slots' own [S, G, N, K] response cache: the
    # decode loop reads each prompt's prefix once per group, not per slot.
    ng = s // group
    gidx = jnp.maximum(jnp.max(slot_prompt.reshape(ng, group), axis=1), 0)
    shp = _cache_sharding(mesh, ng, kv_heads)

    def prefix_rows(x):
      if aligned and group == 1:
        return x
      return jnp.take(x, gidx, axis=0)

    # Keys read whole are held transposed ([.., K, P], [.., K, N]; see
    # `model_lib.KVCache`): one copy of each layer's prefix keys per round,
    # read whole at every step.
    pk = tuple(_constrain(jnp.swapaxes(prefix_rows(x), 2, 3), shp) for x in pc.k)
    pv = tuple(_constrain(prefix_rows(x), shp) for x in pc.v)
    hd, dt = model.config.head_dim, pc.k[0].dtype
    platform = model.config.platform
    length = attention_lib.round_cache_len(n, platform)
    if attention_lib.round_cache_blocked(n, platform):
      tk, nk = attention_lib.decode_block(length)
      response_k = tuple(jnp.zeros((s, kv_heads, hd, tk), dt) for _ in range(nk))
      response_v = tuple(jnp.zeros((s, kv_heads, tk, hd), dt) for _ in range(nk))
    else:
      transposed = attention_lib.round_keys_transposed(n)
      k_shape = (s, kv_heads, *((hd, n) if transposed else (n, hd)))
      response_k = jnp.zeros(k_shape, dt)
      response_v = jnp.zeros((s, kv_heads, n, hd), dt)
    response_k = _constrain(response_k, sh4)
    response_v = _constrain(response_v, sh4)
    # Every layer's prefix is taken before the empty response caches enter
    # the loop: without the barrier XLA held the all-gathered prompts of all
    # layers beside the 2L response buffers (1.5B at the paper's shapes on 32
    # fake devices: 49.0 GiB compiled against 35.7 planned; the plan's max of
    # the two is what a round holds now).
    (pk, pv), (response_k, response_v) = jax.lax.optimization_barrier(
      ((pk, pv), (response_k, response_v))
    )
    cache = model_lib.KVCache(
      tuple(response_k for _ in pc.k),
      tuple(response_v for _ in pc.v),
      _constrain(jnp.zeros((s, length), jnp.bool_), sh2),
      pk,
      pv,
      _constrain(prefix_rows(pc.valid), _rows_sharding(mesh, ng, 2)),
    )
  return cache


@functools.partial(jax.jit, static_argnums=(0, 1, 4, 11, 12, 13, 15))
def _round_jit(
  graphdef,
  mesh,
  state,
  pc: PromptCache,
  n: int,
  slot_prompt,
  rng,
  temperature,
  top_p,
  top_k,
  eos_ids,
  aligned: bool = False,
  filter_logits: bool = True,
  group: int = 1,
  slot_offset=0,
  round_slots: int | None = None,
):
  model = nnx.merge(graphdef, state)
  s = slot_prompt.shape[0]
  live = slot_prompt >= 0
  p = pc.valid.shape[1]
  sh4 = _cache_sharding(mesh, s, model.config.num_kv_heads)
  sh2 = _rows_sharding(mesh, s, 2)

  def rows(x):
    return _slot_rows(x, slot_prompt, aligned)

  cache = round_cache(
    model, pc, slot_prompt, n, aligned=aligned, group=group, mesh=mesh
  )
  start_pos = rows(pc.lengths)

  def is_eos(tok):
    return jnp.any(
      (tok[:, None] == eos_ids[None, :]) & (eos_ids[None, :] >= 0), axis=-1
    )

  # The first token's logits [S, V] split like the loop's (slots over the
  # data axes, vocab over tensor): replicated, they and _choose's [S, V]
  # temporaries would be whole on every device.
  first = _constrain(
    rows(pc.last_logits),
    _logits_sharding(mesh, s, model.config.vocab_size),
  )
  spread = platforms.get(model.config.platform).filter_rows_spread
  layout = _filter_sharding(mesh, s) if filter_logits and spread else None
  tok0, lp0 = next_token(
    first,
    rng,
    0,
    temperature,
    top_p,
    top_k,
    filter_logits,
    layout,
    slot_offset,
    round_slots,
  )
  tokens = _constrain(jnp.zeros((s, n), jnp.int32).at[:, 0].set(tok0), sh2)
  logps = _constrain(jnp.zeros((s, n), jnp.float32).at[:, 0].set(lp0), sh2)
  # alive[s]: the slot has not emitted EOS before the current column.
  mask = _constrain(
    jnp.zeros((s, n), jnp.int32).at[:, 0].set(live.astype(jnp.int32)), sh2
  )
  done = ~live | is_eos(tok0)

  def cond(carry):
    i, _, _, _, _, done, _, _ = carry
    return (i < n) & ~jnp.all(done)

  sh_rope = _rows_sharding(mesh, s, 4)

  def rope_at(i):
    return model_lib.RopeTables(
      *(_constrain(x, sh_rope) for x in step_rope(model, start_pos, i))
    )

  def body(carry):
    i, cache, tokens, logps, mask, done, prev, rope = carry
    tok, lp, cache = decode_step(
      model,
      cache,
      prev,
      start_pos,
      i,
      p,
      rng,
      temperature,
      top_p,
      top_k,
      filter_logits,
      rope,
      layout,
      slot_offset,
      round_slots,
    )
    alive = ~done
    tok = jnp.where(alive, tok, 0)
    tokens = jax.lax.dynamic_update_slice(tokens, tok[:, None], (0, i))
    logps = jax.lax.dynamic_update_slice(
      logps, jnp.where(alive, lp, 0.0)[:, None], (0, i)
    )
    mask = jax.lax.dynamic_update_slice(mask, alive.astype(jnp.int32)[:, None], (0, i))
    done = done | is_eos(tok)
    # Keep slots split over the data axes through the loop (propagation alone
    # may pick a replicated layout for the carry).
    cache = cache._replace(
      k=_constrain(cache.k, sh4),
      v=_constrain(cache.v, sh4),
      valid=_constrain(cache.valid, sh2),
    )
    tokens, logps, mask = (_constrain(x, sh2) for x in (tokens, logps, mask))
    return i + 1, cache, tokens, logps, mask, done, tok, rope_at(i + 1)

  carry = (jnp.int32(1), cache, tokens, logps, mask, done, tok0, rope_at(1))
  _, _, tokens, logps, mask, _, _, _ = jax.lax.while_loop(cond, body, carry)
  tokens = _constrain(tokens * mask, sh2)
  logps = _constrain(logps * mask, sh2)
  lengths = jnp.sum(mask, axis=-1).astype(jnp.int32)
  return Rollout(tokens, logps, _constrain(mask, sh2), lengths)


def _as(x, dtype):
  """To `dtype` without device ops for host data (eager device ops compile)."""
  if isinstance(x, jax.Array):
    return x if x.dtype == dtype else x.astype(dtype)
  return np.asarray(x, dtype)


def _per_slot(x, s: int, dtype, name: str):
  arr = _as(x, dtype)
  if arr.ndim == 0:
    return (
      np.full((s,), arr, dtype) if isinstance(arr, np.ndarray) else jnp.full((s,), arr)
    )
  if arr.shape != (s,):
    raise ValueError(f'{name} must be a scalar or have shape ({s},), got {arr.shape}')
  return arr


def eos_array(eos_ids: Sequence[int] | Array) -> np.ndarray:
  """EOS ids padded with -1 to MAX_EOS_IDS (a fixed shape: no recompiles)."""
  ids = np.asarray(eos_ids, np.int32).reshape(-1)
  if ids.size > MAX_EOS_IDS:
    raise ValueError(f'at most {MAX_EOS_IDS} eos_ids, got {ids.size}')
  return np.pad(ids, (0, MAX_EOS_IDS - ids.size), constant_values=-1)


def prompts_per_round(slots: int, k: int) -> int:
  """Prompts whose k samples one round of `slots` slots scores.

  k > 1: slots // k prompts, their k samples side by side (the RL round's
  shape). k = 1 (or k > slots): `slots` prompts, one sample each, slot i
  continuing prompt i (an aligned round, run k times).
  """
  return slots // k if 1 < k <= slots else slots


def sample_round(
  model: model_lib.Transformer,
  prompt_cache: PromptCache,
  slot_prompt: Array,
  *,
  max_new_tokens: int,
  rng: Array,
  temperature: float | Array = 1.0,
  top_p: float | Array = 1.0,
  top_k: int | Array = 0,
  eos_ids: Sequence[int] | Array = (),
  aligned: bool = False,
  filter_logits: bool = True,
  group: int = 1,
  waves: int = 1,
) -> Rollout:
  """Decodes S slots, slot s continuing prompt slot_prompt[s] (-1: idle, masked).

  Args:
    model: the policy the prompt cache was made with.
    prompt_cache: from `prefill`; read, not consumed.
    slot_prompt: int [S] prompt index per slot, -1 for idle slots.
    max_new_tokens: N, static (one compile per value).
    rng: a jax PRNG key.
    temperature: scalar or [S]; 0 means greedy.
    top_p: scalar or [S] nucleus mass (1.0 = off).
    top_k: scalar or [S] (0 = off).
    eos_ids: up to MAX_EOS_IDS token ids that end a continuation.
    aligned: slot s continues prompt s or is idle (slot_prompt[s] in {s,
      -1}, S == B): the slots read the prompt cache where it lies, no gather
      of every prompt's cache onto every device (evaluation, pass rates).
      Static (its own compile).
    filter_logits: compile the top-p / top-k filter (its vocab sort). False
      (pass `needs_filter(top_p, top_k)` of the run's config) leaves it out:
      top_p must then be 1 and top_k 0 in every slot. Static (its own
      compile), so a run passes one value throughout.
    group: m, slots per prompt group: every run of m consecutive slots
      (0..m-1, m..2m-1, ...) continues one prompt or idles, so the decode
      loop reads that prompt's cached keys once per group instead of once per
      slot (see `attention.SharedPrefix`). The controller's paper schedule
      lays its rounds out this way (`ControllerSettings.slot_group`). Static
      (its own compile); the results equal group=1's. Falls back to 1 when
      the S/m groups do not split evenly over the mesh's data axes, and has
      no effect with attention='dense'.
    waves: W, slot waves: the S slots decoded in W rounds of S/W slots
      (slots 0..S/W-1, then the next S/W, ...), one after another, from the
      same prompt cache; each wave draws its slots' slice of the random
      stream a round of S slots draws (`next_token`), so the result equals
      waves=1's (the tokens exactly), at 1/W of the round's KV cache. One
      compile for all W waves (the wave's offset is traced). Not with
      `aligned`.

  Returns:
    Rollout with [S, N] tokens / logprobs / mask and [S] lengths.

  Raises:
    ValueError: `aligned` with S != B; `filter_logits` False with host
      top_p / top_k that ask for filtering; S not a multiple of `group`, or
      a host `slot_prompt` whose group mixes prompts; S not a multiple of
      W x `group`, or waves with `aligned`.
  """
  graphdef, state = nnx.split(model)
  slot_prompt = _as(slot_prompt, np.int32)
  s = slot_prompt.shape[0]
  waves = int(waves)
  if waves < 1 or s % waves or (waves > 1 and (s // waves) % max(int(group), 1)):
    raise ValueError(
      f'waves={waves}: {s} slots do not split into {waves} waves of whole '
      f'groups of {group}'
    )
  if waves > 1 and aligned:
    raise ValueError('waves > 1 with an aligned round (slot s continues prompt s)')
  group = _slot_group(slot_prompt[: s // waves], int(group), _mesh_of(state))
  if waves > 1:  # Every wave's groups whole (the first's are checked above).
    _slot_group(slot_prompt, int(group), None)
  if aligned and s != prompt_cache.lengths.shape[0]:
    raise ValueError(
      f'aligned round: {s} slots for {prompt_cache.lengths.shape[0]} prompts '
      '(slot s continues prompt s: they must be equal)'
    )
  top_p = _per_slot(top_p, s, jnp.float32, 'top_p')
  top_k = _per_slot(top_k, s, jnp.int32, 'top_k')
  host = isinstance(top_p, np.ndarray) and isinstance(top_k, np.ndarray)
  if not filter_logits and host and ((top_p < 1.0) | (top_k > 0)).any():
    raise ValueError(
      'filter_logits=False (no top-p / top-k filter compiled) with top_p < 1 '
      'or top_k > 0'
    )
  temperature = _per_slot(temperature, s, jnp.float32, 'temperature')
  mesh = _mesh_of(state)
  if waves == 1:
    return _round_jit(
      graphdef,
      mesh,
      state,
      prompt_cache,
      int(max_new_tokens),
      slot_prompt,
      rng,
      temperature,
      top_p,
      top_k,
      eos_array(eos_ids),
      bool(aligned),
      bool(filter_logits),
      group,
    )
  w = s // waves
  parts = [
    _round_jit(
      graphdef,
      mesh,
      state,
      prompt_cache,
      int(max_new_tokens),
      slot_prompt[i * w : (i + 1) * w],
      rng,
      *(x[i * w : (i + 1) * w] for x in (temperature, top_p, top_k)),
      eos_array(eos_ids),
      False,
      bool(filter_logits),
      group,
      np.int32(i * w),
      s,
    )
    for i in range(waves)
  ]
  return _join_waves(mesh, parts)


@functools.partial(jax.jit, static_argnums=0)
def _join_waves(mesh, parts: list[Rollout]) -> Rollout:
  """The waves' rollouts [S/W, ...] as the round's [S, ...], rows split as a round's."""
  joined = [jnp.concatenate(x, axis=0) for x in zip(*parts, strict=True)]
  s = joined[0].shape[0]
  return Rollout(*(_constrain(x, _rows_sharding(mesh, s, x.ndim)) for x in joined))


def _slot_group(slot_prompt, group: int, mesh) -> int:
  """The static group size `sample_round` compiles for (see its `group`)."""
  s = slot_prompt.shape[0]
  if group < 1 or s % group:
    raise ValueError(f'group={group}: {s} slots do not split into groups of {group}')
  if isinstance(slot_prompt, np.ndarray) and group > 1:
    grouped = slot_prompt.reshape(s // group, group)
    first = grouped.max(axis=1, keepdims=True)
    mixed = np.flatnonzero(((grouped != first) & (grouped >= 0)).any(axis=1))
    if mixed.size:
      g = int(mixed[0])
      raise ValueError(
        f'group={group}: slots {g * group}..{(g + 1) * group - 1} continue '
        f'different prompts {sorted(set(grouped[g][grouped[g] >= 0].tolist()))}'
      )
  dp = 1 if mesh is None else sharding_lib.data_parallel_size(mesh)
  return group_on_mesh(s, group, dp)


def group_on_mesh(slots: int, group: int, data_shards: int) -> int:
  """The group a round of `slots` compiles for on `data_shards` row shards.

  `group` when its S/group groups split evenly over the shards (each device
  then holds whole groups), else 1: a group spanning devices would gather
  its prompt's keys across shards at every step. The memory plan calls this
  too, so plan and program fall back alike.
  """
  return group if (slots // group) % data_shards == 0 else 1


def lower_round(
  model: model_lib.Transformer,
  prompt_cache: PromptCache,
  *,
  slots: int,
  max_new_tokens: int,
  eos_ids: Sequence[int] | Array = (),
  aligned: bool = False,
  filter_logits: bool = True,
  group: int = 1,
  waves: int = 1,
  lowering_platforms: tuple[str, ...] | None = None,
) -> jax.stages.Lowered:
  """The decode program `sample_round` runs for these shapes, lowered.

  The same jit and argument shardings as `sample_round`, so
  `.compile().as_text()` is the HLO a run executes (`infra.hlo` reads it).
  With `waves` > 1: the program of one wave (S / W slots), which every wave
  of the round runs. lowering_platforms: lower for another platform than
  the devices' (e.g. ('cuda',) on a CPU host: tests/test_gpu_lowering.py).
  """
  graphdef, state = nnx.split(model)
  w = int(slots) // int(waves)
  per_slot = np.ones((w,), np.float32)
  group = _slot_group(np.zeros((w,), np.int32), int(group), _mesh_of(state))
  wave_args = () if waves == 1 else (np.int32(0), int(slots))
  return _round_jit.trace(
    graphdef,
    _mesh_of(state),
    state,
    prompt_cache,
    int(max_new_tokens),
    np.zeros((w,), np.int32),
    jax.random.key(0),
    per_slot,
    per_slot,
    np.zeros((w,), np.int32),
    eos_array(eos_ids),
    bool(aligned),
    bool(filter_logits),
    group,
    *wave_args,
  ).lower(lowering_platforms=lowering_platforms)


def lower_prefill(
  model: model_lib.Transformer,
  *,
  prompts: int,
  prompt_len: int,
  kv_dtype: Any = None,
  lowering_platforms: tuple[str, ...] | None = None,
) -> jax.stages.Lowered:
  """The program `prefill` runs for B prompts [B, P], lowered.

  The prompts come split over the data axes where B divides, as the trainer
  feeds them (`multihost.global_rows`), so `.compile()` gives the memory a
  run's prefill takes (`ada_jax.plan`'s 'prefill' phase).
  """
  graphdef, state = nnx.split(model)
  mesh = _mesh_of(state)
  rows = jax.ShapeDtypeStruct(
    (int(prompts), int(prompt_len)),
    jnp.int32,
    sharding=_rows_sharding(mesh, prompts, 2),
  )
  return _prefill_jit.trace(graphdef, mesh, state, rows, rows, kv_dtype).lower(
    lowering_platforms=lowering_platforms
  )


def sample(
  model: model_lib.Transformer,
  prompt_tokens: Array,
  prompt_mask: Array,
  *,
  max_new_tokens: int,
  rng: Array,
  temperature: float | Array = 1.0,
  top_p: float | Array = 1.0,
  top_k: int | Array = 0,
  eos_ids: Sequence[int] | Array = (),
  kv_dtype: Any = None,
  filter_logits: bool = True,
) -> Rollout:
  """Samples one continuation per left-padded prompt [B, P]; see sample_round."""
  cache = prefill(model, prompt_tokens, prompt_mask, kv_dtype=kv_dtype)
  b = cache.lengths.shape[0]
  return sample_round(
    model,
    cache,
    np.arange(b, dtype=np.int32),
    max_new_tokens=max_new_tokens,
    rng=rng,
    temperature=temperature,
    top_p=top_p,
    top_k=top_k,
    eos_ids=eos_ids,
    aligned=True,
    filter_logits=filter_logits,
  )


def decode_round_hlo(
  model: model_lib.Transformer,
  *,
  slots: int,
  prompts: int,
  prompt_len: int,
  max_new_tokens: int,
  hoist_invariants: bool = True,
) -> str:
  """The compiled HLO text of one decode round for the model's current layout.

  A dummy prompt batch is prefilled so that the prompt cache has the
  shardings a run gives it; the round is then lowered exactly as
  `sampler.sample_round` calls it.

  Args:
    model: the policy, in the layout to inspect.
    slots: S.
    prompts: B, prompts of the step.
    prompt_len: P, the prompt bucket.
    max_new_tokens: N.
    hoist_invariants: False compiles without XLA's while-loop invariant code
      motion: the HLO then shows where the partitioner put each gather,
      i.e. what it asks to run per token (read it with `infra.hlo`).
  """
  tokens = np.ones((prompts, prompt_len), np.int32)
  cache = prefill(model, tokens, np.ones_like(tokens))
  lowered = lower_round(model, cache, slots=slots, max_new_tokens=max_new_tokens)
  options = None if hoist_invariants else {'xla_disable_hlo_passes': hlo.LICM_PASS}
  return lowered.compile(compiler_options=options).as_text()
