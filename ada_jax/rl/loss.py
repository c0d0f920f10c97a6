"""Policy-gradient loss: clipped surrogate, aggregation, entropy and KL terms.

Pure jnp functions, no config objects, safe to call inside jit, grad and scan.
The surrogate follows verl's `compute_policy_loss` (reference doc §5.1):
per-token ratio ρ = exp(clamp(logp − old_logp, −20, 20)), loss
max(−A·ρ, −A·clip(ρ, 1 − clip_low, 1 + clip_high)) (clip-higher), and for
A < 0 the dual clip min(·, −A·c).

Exact aggregation over micro-batches: every aggregated quantity here is a sum
over the rows and tokens it is given, divided by a `Normalizer` computed once
on the whole mini-batch. Split a mini-batch into micro-batches, pass each one
the mini-batch's normaliser, and the micro-batch losses (and every metric)
SUM to the mini-batch value. This is the exact token-mean the reference aims
at (§11.9), where verl's per-micro-batch token-mean only approximates it.

Per-token log-probs and entropy come from logits (`token_logp_and_entropy`)
or, without ever holding the [B, T, V] fp32 logits, from hidden states and a
projection applied chunk by chunk along T (`chunked_logp_and_entropy`).

Dimension legend:
  B: rows (sequences) in the micro-batch.
  T: response tokens per row.
  V: vocabulary size.
  D: model width (hidden states).
  K: tokens per chunk of the vocabulary projection.
"""

from collections.abc import Callable
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

AggMode = Literal['token-mean', 'seq-mean-token-mean', 'seq-mean-token-sum']
KlEstimator = Literal['k1', 'k3']

AGG_MODES: tuple[str, ...] = (
  'token-mean',
  'seq-mean-token-mean',
  'seq-mean-token-sum',
)
KL_ESTIMATORS: tuple[str, ...] = ('k1', 'k3')

# verl clamps the log-ratio so exp() cannot overflow on stale or garbage rows.
_LOG_RATIO_CLAMP = 20.0
# verl clamps the k3 estimate; a single outlier token must not dominate.
_K3_CLAMP = 10.0


class Normalizer(NamedTuple):
  """Denominators of a whole mini-batch (a pytree of two scalars).

  Attributes:
    tokens: total mask weight (counted response tokens) of the mini-batch.
    seqs: number of rows with at least one counted token; fully masked rows
      (fixed-shape padding) do not count as sequences.
  """

  tokens: jax.Array
  seqs: jax.Array


def loss_normalizer(mask: jax.Array) -> Normalizer:
  """Returns the denominators of a mini-batch.

  Call it on the mask of the whole mini-batch before splitting it into
  micro-batches and pass the result to `policy_loss` for every micro-batch.

  Args:
    mask: [..., T] float, int or bool; > 0 on response tokens that count
      (leading dims: rows, or micro-batches x rows).
  """
  w = jnp.asarray(mask).astype(jnp.float32)
  return Normalizer(
    tokens=jnp.sum(w),
    seqs=jnp.sum((jnp.sum(w, axis=-1) > 0).astype(jnp.float32)),
  )


def token_logp_and_entropy(
  logits: jax.Array,
  targets: jax.Array,
  *,
  temperature: float | jax.Array = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """Per-token log-probability of `targets` and entropy, in float32.

  The trainer recomputes old log-probs at the sampling temperature, so the
  logits are divided by it first, as the sampler does (verl: dp_actor).

  Args:
    logits: [B, T, V] logits predicting each target token (any float dtype).
    targets: [B, T] int token ids.
    temperature: > 0; a Python float or a traced scalar.

  Returns:
    logp: [B, T] float32 log π(target).
    entropy: [B, T] float32 entropy of the tempered distribution.
  """
  z = logits.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32)
  logp_all = jax.nn.log_softmax(z, axis=-1)
  logp = jnp.take_along_axis(logp_all, targets[..., None].astype(jnp.int32), axis=-1)
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  return logp[..., 0], entropy


def chunked_logp_and_entropy(
  hidden: jax.Array,
  targets: jax.Array,
  project: Callable[[jax.Array], jax.Array],
  *,
  chunk: int,
  temperature: float | jax.Array = 1.0,
) -> tuple[jax.Array, jax.Array]:
  """`token_logp_and_entropy(project(hidden), targets)`, K tokens at a time.

  The [B, T, V] fp32 logits of a long response over a 152k vocabulary
  (and their log-softmax, kept for the backward) outweigh a layer's
  activations many times; here only one chunk's [B, K, V] exists at a time. Each chunk runs under
  `jax.checkpoint`, so the backward recomputes its logits from the chunk's
  hidden states instead of keeping every chunk's for autodiff. Values and
  gradients equal the unchunked computation up to float summation order.

  Args:
    hidden: [B, T, D] hidden states predicting each target token.
    targets: [B, T] int token ids.
    project: maps hidden [B, K, D] to logits [B, K, V] (the LM head); it may
      close over (traced) params, whose gradients flow through it.
    chunk: the most tokens per chunk (static). T is cut into
      ceil(T / chunk) chunks of equal length K <= chunk, the last one padded
      by fewer than ceil(T / chunk) positions (dropped from the result).
    temperature: > 0; a Python float or a traced scalar.

  Returns:
    logp: [B, T] float32 log π(target).
    entropy: [B, T] float32 entropy of the tempered distribution.
  """
  if chunk < 1:
    raise ValueError(f'chunk must be >= 1, got {chunk}')
  b, t, d = hidden.shape
  n_chunks = -(-t // chunk)
  k = -(-t // n_chunks)  # Equal chunks: T=192, chunk=128 -> 2 x 96, no padding.
  pad = n_chunks * k - t
  if pad:
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  # Chunks lead, for scan: [n_chunks, B, K, ...] (rows keep their sharding).
  h = jnp.swapaxes(hidden.reshape(b, n_chunks, k, d), 0, 1)
  tgt = jnp.swapaxes(targets.reshape(b, n_chunks, k), 0, 1)
  temp = jnp.asarray(temperature, jnp.float32)

  # The default prevent_cse=True: with False, XLA:CPU kept more of the
  # chunk's temporaries alive (update temp +7% in tests/test_update.py's
  # model).
  @jax.checkpoint
  def one(h_c: jax.Array, t_c: jax.Array, temp: jax.Array):
    return token_logp_and_entropy(project(h_c), t_c, temperature=temp)

  def body(carry, xs):
    return carry, one(*xs, temp)

  _, (logp, ent) = jax.lax.scan(body, None, (h, tgt))

  def unchunk(x: jax.Array) -> jax.Array:
    return jnp.swapaxes(x, 0, 1).reshape(b, n_chunks * k)[:, :t]

  return unchunk(logp), unchunk(ent)


def kl_penalty(
  logp: jax.Array, ref_logp: jax.Array, estimator: KlEstimator = 'k3'
) -> jax.Array:
  """Per-token estimate of KL(π ‖ π_ref) from samples of π.

  Args:
    logp: [B, T] log π of the sampled tokens.
    ref_logp: [B, T] log π_ref of the same tokens.
    estimator: `k1` = logp − ref_logp (unbiased, high variance); `k3` =
      exp(r) − r − 1 with r = ref_logp − logp (unbiased, non-negative, low
      variance; verl's `low_var_kl`, clamped the same way).

  Returns:
    [B, T] float32 estimate per token.
  """
  logp = logp.astype(jnp.float32)
  ref_logp = ref_logp.astype(jnp.float32)
  if estimator == 'k1':
    return logp - ref_logp
  if estimator == 'k3':
    r = jnp.clip(ref_logp - logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return jnp.clip(jnp.exp(r) - r - 1.0, -_K3_CLAMP, _K3_CLAMP)
  raise ValueError(f'kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}')


def aggregate(
  values: jax.Array,
  mask: jax.Array,
  mode: AggMode,
  normalizer: Normalizer,
) -> jax.Array:
  """Aggregates per-token values into a scalar that is additive over rows.

  Args:
    values: [B, T] per-token values; masked entries must already be finite.
    mask: [B, T] token weights (> 0 counts).
    mode: `token-mean`: Σ w·v / tokens; `seq-mean-token-mean`: Σ_rows
      (Σ_t w·v / Σ_t w) / seqs; `seq-mean-token-sum`: Σ w·v / seqs.
    normalizer: denominators of the whole mini-batch.

  Returns:
    float32 scalar.
  """
  w = mask.astype(jnp.float32)
  wv = w * values.astype(jnp.float32)
  # Max with 1: a denominator of 0 only happens with an all-masked input, whose
  # numerator is 0 too, so this returns 0 instead of NaN and changes nothing else.
  if mode == 'token-mean':
    return jnp.sum(wv) / jnp.maximum(normalizer.tokens, 1.0)
  seq_sum = jnp.sum(wv, axis=-1)
  if mode == 'seq-mean-token-mean':
    seq_sum = seq_sum / jnp.maximum(jnp.sum(w, axis=-1), 1.0)
  elif mode != 'seq-mean-token-sum':
    raise ValueError(f'loss_agg_mode must be one of {AGG_MODES}, got {mode!r}')
  return jnp.sum(seq_sum) / jnp.maximum(normalizer.seqs, 1.0)


def policy_loss(
  logp: jax.Array,
  old_logp: jax.Array,
  advantages: jax.Array,
  mask: jax.Array,
  *,
  clip_low: float = 0.2,
  clip_high: float = 0.28,
  clip_ratio_c: float | None = 3.0,
  loss_agg_mode: AggMode = 'token-mean',
  normalizer: Normalizer | None = None,
  entropy: jax.Array | None = None,
  entropy_coef: float = 0.0,
  ref_logp: jax.Array | None = None,
  kl_coef: float = 0.0,
  kl_estimator: KlEstimator = 'k3',
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Clipped-surrogate policy loss with optional entropy bonus and KL penalty.

  loss = agg(ℓ_pg) − entropy_coef · agg(entropy) + kl_coef · agg(kl), with the
  same aggregation and normaliser for the three terms (as verl does).

  Args:
    logp: [B, T] log π_θ of the taken tokens (the differentiated input).
    old_logp: [B, T] log π_old of the same tokens (treated as constant).
    advantages: [B, T] advantages broadcast to tokens (treated as constant).
    mask: [B, T] float, int or bool; > 0 on response tokens that count. Masked
      entries of every input are ignored, even if NaN or inf.
    clip_low: ε_low, the ratio is clipped below at 1 − ε_low.
    clip_high: ε_high, the ratio is clipped above at 1 + ε_high (clip-higher).
    clip_ratio_c: dual-clip constant c > 1 for negative advantages; None
      disables the dual clip.
    loss_agg_mode: one of `AGG_MODES`, see `aggregate`.
    normalizer: denominators of the whole mini-batch (`loss_normalizer`); None
      uses this batch's own mask, i.e. the batch is the whole mini-batch.
    entropy: optional [B, T] per-token entropy of π_θ; needed when
      entropy_coef != 0, logged when given.
    entropy_coef: weight of the entropy bonus (subtracted from the loss).
    ref_logp: optional [B, T] log π_ref of the frozen reference policy; needed
      when kl_coef != 0, logged when given.
    kl_coef: weight of the KL penalty.
    kl_estimator: `k1` or `k3`, see `kl_penalty`.
    The clip and coefficient arguments are Python floats (static under jit):
    a zero coefficient drops its term from the traced graph.

  Returns:
    loss: float32 scalar to minimise.
    metrics: float32 scalars, all additive over micro-batches that share the
      normaliser: `loss`, `pg_loss`, `clip_frac` (tokens where the ratio clip
      is active), `clip_frac_lower` (tokens where the dual clip is active),
      `approx_kl` (token-mean of old_logp − logp), `ratio_mean`, and when given,
      `entropy` and `kl` (token-means).
  """
  if clip_ratio_c is not None and clip_ratio_c <= 1.0:
    raise ValueError(f'clip_ratio_c must be > 1, got {clip_ratio_c}')
  if entropy_coef and entropy is None:
    raise ValueError('entropy_coef != 0 needs the entropy input.')
  if kl_coef and ref_logp is None:
    raise ValueError('kl_coef != 0 needs the ref_logp input.')
  w = jnp.asarray(mask).astype(jnp.float32)
  if normalizer is None:
    normalizer = loss_normalizer(w)
  valid = w > 0

  # Zero masked entries of every input before any arithmetic: a multiplication
  # by the mask alone would let NaN/inf from padding through (0 · inf = NaN),
  # in the loss and in its gradient.
  def clean(x: jax.Array) -> jax.Array:
    return jnp.where(valid, x.astype(jnp.float32), 0.0)

  logp = clean(logp)
  old_logp = jax.lax.stop_gradient(clean(old_logp))
  adv = jax.lax.stop_gradient(clean(advantages))

  log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  loss_unclipped = -adv * ratio
  loss_clipped = -adv * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  pg_tok = jnp.maximum(loss_unclipped, loss_clipped)
  clipped = loss_clipped > loss_unclipped
  dual_clipped = jnp.zeros_like(clipped)
  if clip_ratio_c is not None:
    # Dual clip (Ye et al. 2020): with A < 0 a huge ratio would give an
    # unbounded loss; cap it at −A·c, where the gradient is zero.
    loss_dual = -adv * clip_ratio_c
    dual_clipped = (adv < 0) & (pg_tok > loss_dual)
    pg_tok = jnp.where(adv < 0, jnp.minimum(pg_tok, loss_dual), pg_tok)

  def token_mean(x: jax.Array) -> jax.Array:
    return aggregate(x, w, 'token-mean', normalizer)

  pg_loss = aggregate(pg_tok, w, loss_agg_mode, normalizer)
  loss = pg_loss
  metrics = {
    'pg_loss': pg_loss,
    'clip_frac': token_mean(clipped.astype(jnp.float32)),
    'clip_frac_lower': token_mean(dual_clipped.astype(jnp.float32)),
    'approx_kl': token_mean(old_logp - logp),
    'ratio_mean': token_mean(ratio),
  }
  if entropy is not None:
    ent = clean(entropy)
    if entropy_coef:
      loss = loss - entropy_coef * aggregate(ent, w, loss_agg_mode, normalizer)
    metrics['entropy'] = token_mean(ent)
  if ref_logp is not None:
    kl_tok = clean(
      kl_penalty(logp, jax.lax.stop_gradient(clean(ref_logp)), kl_estimator)
    )
    if kl_coef:
      loss = loss + kl_coef * aggregate(kl_tok, w, loss_agg_mode, normalizer)
    metrics['kl'] = token_mean(kl_tok)
  metrics['loss'] = loss
  return loss, metrics
