"""The jitted training computations: log-probs, the RL update and the SFT step.

All functions take the model split into (graphdef, params state) so they jit
once per run; params and optimizer state are donated. One RL update call
runs every epoch x mini-batch of a step: an outer `lax.scan` over
mini-batches, an inner `lax.scan` over micro-batches that accumulates
gradients, with the loss normaliser of the whole mini-batch so token-mean is
exact (not a mean of micro-batch means). A non-finite gradient skips that
optimizer update (params and moments unchanged) and is counted.

The training batch arrives micro-batched: every leaf is [C, m, ...], micro-
batch c being rows [c*m, (c+1)*m) of the step's rows, with the m rows split
over the row shards ('data' x 'fsdp'; `rollout.assemble_batch` lays it out
so, `micro_batches` does it for a flat batch). Mini-batch u is micro-batches
[u*mini/m, (u+1)*mini/m). Scanning the unsharded leading dims therefore runs
every micro-batch on every device, m / (data x fsdp) rows each, in the
update and in the old-logp pass (`logp_jit`, one micro-batch at a time), and
nothing is resharded. (A flat [R] batch split over the row shards would put
whole micro-batches on a few devices each, every device then computing a
full micro-batch per scan step.)

Log-probs and entropy project only the response positions to the
vocabulary, `logit_chunk` tokens at a time (`loss.chunked_logp_and_entropy`):
the [rows, N, V] fp32 logits never exist whole, in the forward or the
backward.

The learning rate is an input (`optax.inject_hyperparams`), so a schedule
counted in training steps (the reference: warmup from 0, LR 0 on step 1,
constant across the mini-batch updates of one step) never recompiles.

Dimension legend:
  R: training rows   P: prompt bucket   N: response length   V: vocab
  C: micro-batches (R / m)   m: rows per micro-batch (micro_batch_rows)
  U: optimizer updates per step (epochs x mini-batches)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ada_jax import model as model_lib
from ada_jax import sharding as sharding_lib
from ada_jax.rl import loss as loss_lib

Array = jax.Array

# Response tokens per chunk of the vocabulary projection. One chunk's fp32
# logits are [m/dp, 128, V/tensor] per device: 78 MB for one row over a 152k
# vocabulary, against 1.9 GB for a 3072-token response projected at once.
LOGIT_CHUNK = 128


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
  """Static hyperparameters of the RL update (hashable: a jit static arg).

  `logit_chunk`: response tokens projected to the vocabulary at a time (see
  `LOGIT_CHUNK`); it changes memory, not the numbers.
  """

  prompt_len: int
  mini_batch_rows: int
  micro_batch_rows: int
  epochs: int = 1
  temperature: float = 1.0
  clip_low: float = 0.2
  clip_high: float = 0.28
  clip_ratio_c: float | None = 3.0
  loss_agg_mode: str = 'token-mean'
  entropy_coef: float = 0.0
  grad_clip: float = 1.0
  logit_chunk: int = LOGIT_CHUNK


@functools.cache  # One object per setting: a static jit arg, shared by trainers.
def make_optimizer(
  *, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0
) -> optax.GradientTransformation:
  """AdamW whose learning rate is set per step (see `set_lr`)."""
  return optax.inject_hyperparams(optax.adamw)(
    learning_rate=0.0, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay
  )


LR_SCHEDULES = ('constant', 'cosine')


def lr_at(
  step: int, *, peak: float, warmup: int, schedule: str = 'constant', total: int = 0
) -> float:
  """The reference's schedule, counted in training steps starting at 1.

  Linear warmup from 0 (LR 0 on step 1 when warmup > 0), then constant or
  cosine to 0 at `total`.
  """
  if warmup > 0 and step <= warmup:
    return peak * (step - 1) / warmup
  if schedule == 'constant':
    return peak
  if schedule == 'cosine':
    frac = (step - warmup) / max(total - warmup, 1)
    # math, not jnp: an eager jnp op on host data compiles mid-run.
    return peak * 0.5 * (1 + math.cos(math.pi * min(max(frac, 0.0), 1.0)))
  raise ValueError(f'unknown lr schedule {schedule!r} (one of {LR_SCHEDULES})')


def _set_lr(opt_state: Any, lr: Array) -> Any:
  hp = dict(opt_state.hyperparams)
  hp['learning_rate'] = jnp.asarray(lr, hp['learning_rate'].dtype)
  return opt_state._replace(hyperparams=hp)


def response_logp(
  model: model_lib.Transformer,
  tokens: Array,
  mask: Array,
  prompt_len: int,
  temperature: float | Array,
  *,
  logit_chunk: int = LOGIT_CHUNK,
) -> tuple[Array, Array]:
  """Per-token logp and entropy [rows, N] of the response tokens tokens[:, P:].

  Only the response positions are projected to the vocabulary (the prompt's
  logits are never materialised), `logit_chunk` positions at a time.

  Args:
    model: the policy.
    tokens: int [rows, P+N].
    mask: int [rows, P+N], 1 on real tokens.
    prompt_len: P (static).
    temperature: the sampling temperature (float or traced scalar).
    logit_chunk: response positions per chunk of the projection (static).
  """
  t = tokens.shape[1]
  # The training forward (remat='block' applies here), rows held on the
  # batch axes.
  hidden = _rows_over_batch_axes(model.hidden(tokens, mask))
  return loss_lib.chunked_logp_and_entropy(
    hidden[:, prompt_len - 1 : t - 1],
    tokens[:, prompt_len:],
    model.project,
    chunk=logit_chunk,
    temperature=temperature,
  )


def _rows_over_batch_axes(x: Array) -> Array:
  """Holds x [rows, ...] with its rows over ('data', 'fsdp'), if they divide.

  Why: with fsdp the weights' model dim and the rows share the mesh axis
  'fsdp', and left alone the partitioner may keep the weights where they are
  and replicate the rows instead (partial sums over the model dim, then an
  all-reduce of the whole micro-batch's activations and logits): every device
  computes every row, the per-device memory does not shrink with fsdp. Rows
  held on the batch axes at the hidden states (and, through the transpose
  of the constraint, their cotangent) make it gather the weights instead.
  The other dims are left to the partitioner (e.g. tensor parallelism).
  """
  mesh = getattr(jax.typeof(x).sharding, 'mesh', None)
  if mesh is None or not set(sharding_lib.BATCH_AXES) <= set(mesh.axis_names):
    return x
  if x.shape[0] % sharding_lib.data_parallel_size(mesh):
    return x
  rest = (PartitionSpec.UNCONSTRAINED,) * (x.ndim - 1)
  spec = PartitionSpec(sharding_lib.BATCH_AXES, *rest)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def micro_batches(batch: dict[str, Any], micro_batch_rows: int) -> dict[str, Any]:
  """A flat batch ([R, ...] leaves) in the update's layout [C, m, ...].

  Micro-batch c is rows [c*m, (c+1)*m). A reshape of each leaf (numpy stays
  numpy); on a device array split over rows it moves data, so the trainer
  never calls it: `rollout.assemble_batch` builds the batch in this layout.

  Raises:
    ValueError: m does not divide R.
  """

  def split(x):
    r = x.shape[0]
    if r % micro_batch_rows:
      raise ValueError(
        f'{r} rows do not split into micro-batches of {micro_batch_rows}'
      )
    return x.reshape(r // micro_batch_rows, micro_batch_rows, *x.shape[1:])

  return jax.tree.map(split, batch)


@functools.partial(
  jax.jit, static_argnums=(0,), static_argnames=('prompt_len', 'logit_chunk')
)
def logp_jit(
  graphdef,
  state,
  tokens: Array,
  mask: Array,
  temperature: Array,
  *,
  prompt_len: int,
  logit_chunk: int = LOGIT_CHUNK,
) -> tuple[Array, Array]:
  """Old log-probs and entropy [C, m, N] of a batch, one micro-batch at a time.

  Args:
    graphdef: static model structure.
    state: params (training layout; not donated).
    tokens: int [C, m, P+N] in the update's layout (see the module doc).
    mask: int [C, m, P+N].
    temperature: scalar sampling temperature.
    prompt_len: P (static).
    logit_chunk: response positions per chunk of the projection (static).

  Returns:
    (logp, entropy), float32 [C, m, N], laid out as the batch.
  """
  model = nnx.merge(graphdef, state)

  def one(carry, xs):
    tok, msk = xs
    out = response_logp(
      model, tok, msk, prompt_len, temperature, logit_chunk=logit_chunk
    )
    return carry, out

  # A scan, not one [C*m]-row forward: the activations of one micro-batch
  # (m/dp rows per device) at a time, as in the update.
  _, (logp, entropy) = jax.lax.scan(one, None, (tokens, mask))
  return logp, entropy


@jax.jit
def logp_gap(
  old_logp: Array, sampler_logp: Array, weight: Array
) -> tuple[Array, Array]:
  """Max and mean |trainer - sampler| log-prob over weighted response tokens.

  Any layout ([R, N] or [C, m, N]): elementwise, then reduced. On device: in
  multi-host runs the rows span hosts, no host can read them.
  """
  w = weight > 0
  gap = jnp.where(w, jnp.abs(old_logp - sampler_logp), 0.0)
  return jnp.max(gap), jnp.sum(gap) / jnp.maximum(jnp.sum(w), 1)


def _tree_where(pred: Array, a: Any, b: Any) -> Any:
  return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)


def _rl_update(
  graphdef,
  tx: optax.GradientTransformation,
  s: UpdateSettings,
  state: nnx.State,
  opt_state: Any,
  batch: dict[str, Array],
  lr: Array,
) -> tuple[nnx.State, Any, dict[str, Array]]:
  """All optimizer updates of one RL step.

  Args:
    graphdef: static model structure.
    tx: the optimizer from `make_optimizer` (static).
    s: static settings.
    state: params (donated).
    opt_state: optimizer state (donated).
    batch: micro-batched [C, m, ...] leaves (see the module doc; m =
      s.micro_batch_rows): `tokens` int [C, m, P+N], `attn_mask` int
      [C, m, P+N], `resp_mask` float [C, m, N] (response mask times row
      weight), `advantages` [C, m, N], `old_logp` [C, m, N].
    lr: scalar learning rate for every update of this step.

  Returns:
    (params, optimizer state, metrics averaged over the updates; `skipped`
    counts the non-finite updates).

  Raises:
    ValueError: the batch is not [C, m, ...] with m = s.micro_batch_rows, or
      its C*m rows do not split into mini-batches of micro-batches.
  """
  shape = batch['tokens'].shape
  if len(shape) != 3 or shape[1] != s.micro_batch_rows:
    raise ValueError(
      f'batch tokens {shape}: expected [C, {s.micro_batch_rows}, P+N] micro-batches '
      '(rollout.assemble_batch, or update.micro_batches of a flat batch)'
    )
  c = shape[0]
  if s.mini_batch_rows % s.micro_batch_rows or (c * s.micro_batch_rows) % (
    s.mini_batch_rows
  ):
    raise ValueError(
      f'rows {c * s.micro_batch_rows} / mini-batch {s.mini_batch_rows} / '
      f'micro-batch {s.micro_batch_rows} do not divide'
    )
  n_micro = s.mini_batch_rows // s.micro_batch_rows
  # [C, m, ...] -> [mini-batches, micro-batches, m, ...]: splits the unsharded
  # leading dim, the rows of every micro-batch stay where they are.
  minis = jax.tree.map(lambda x: x.reshape(c // n_micro, n_micro, *x.shape[1:]), batch)
  opt_state = _set_lr(opt_state, lr)

  def micro_loss(params, mb, normalizer):
    model = nnx.merge(graphdef, params)
    logp, entropy = response_logp(
      model,
      mb['tokens'],
      mb['attn_mask'],
      s.prompt_len,
      s.temperature,
      logit_chunk=s.logit_chunk,
    )
    return loss_lib.policy_loss(
      logp,
      mb['old_logp'],
      mb['advantages'],
      mb['resp_mask'],
      clip_low=s.clip_low,
      clip_high=s.clip_high,
      clip_ratio_c=s.clip_ratio_c,
      loss_agg_mode=s.loss_agg_mode,
      normalizer=normalizer,
      entropy=entropy,
      entropy_coef=s.entropy_coef,
    )

  grad_fn = jax.grad(micro_loss, has_aux=True)

  def one_update(carry, mini):
    params, opt_state = carry
    normalizer = loss_lib.loss_normalizer(mini['resp_mask'])

    def accumulate(acc, mb):
      grads, metrics = grad_fn(params, mb, normalizer)
      return jax.tree.map(jnp.add, acc, (grads, metrics)), None

    zeros = jax.tree.map(jnp.zeros_like, params)
    _, metrics0 = jax.eval_shape(
      grad_fn, params, jax.tree.map(lambda x: x[0], mini), normalizer
    )
    zeros_m = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), metrics0)
    (grads, metrics), _ = jax.lax.scan(accumulate, (zeros, zeros_m), mini)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm) & jnp.isfinite(metrics['loss'])
    scale = jnp.minimum(1.0, s.grad_clip / (grad_norm + 1e-6))
    grads = jax.tree.map(lambda g: jnp.where(finite, g * scale, 0.0), grads)
    updates, new_opt = tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    params = _tree_where(finite, new_params, params)
    opt_state = _tree_where(finite, new_opt, opt_state)
    metrics = dict(metrics, grad_norm=grad_norm, skipped=(~finite).astype(jnp.float32))
    return (params, opt_state), metrics

  def one_epoch(carry, _):
    # Epochs repeat the same mini-batches in order (the reference: no shuffle).
    return jax.lax.scan(one_update, carry, minis)

  (state, opt_state), metrics = jax.lax.scan(
    one_epoch, (state, opt_state), None, length=s.epochs
  )
  out = {k: jnp.mean(v) for k, v in metrics.items()}
  out['skipped'] = jnp.sum(metrics['skipped'])
  return state, opt_state, out


def _sft_update(
  graphdef,
  tx: optax.GradientTransformation,
  state: nnx.State,
  opt_state: Any,
  tokens: Array,
  attn_mask: Array,
  loss_mask: Array,
  lr: Array,
) -> tuple[nnx.State, Any, dict[str, Array]]:
  """One teacher-forced cross-entropy step on [R, T] sequences.

  loss_mask [R, T] marks the target tokens (the response) by their position.
  """
  opt_state = _set_lr(opt_state, lr)

  def ce(params):
    model = nnx.merge(graphdef, params)
    logits = model.forward(tokens, attn_mask)[:, :-1]
    logp = jax.nn.log_softmax(logits, axis=-1)
    tgt = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    w = loss_mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(tgt * w) / jnp.maximum(jnp.sum(w), 1.0)

  loss, grads = jax.value_and_grad(ce)(state)
  grad_norm = optax.tree.norm(grads)
  updates, opt_state = tx.update(grads, opt_state, state)
  return (
    optax.apply_updates(state, updates),
    opt_state,
    {'loss': loss, 'grad_norm': grad_norm},
  )


# The jitted updates. Left to itself, the partitioner may give the outputs
# other shardings than the inputs had (e.g. norm scales split on fsdp, or the
# optimizer state of an eager `tx.init` on one device); the next call then
# sees new input shardings and compiles again. The trainer therefore uses the
# `*_pinned` versions, whose params and optimizer state come out exactly as
# they went in, so each compiles once per run.
rl_update = jax.jit(_rl_update, static_argnums=(0, 1, 2), donate_argnums=(3, 4))
sft_update = jax.jit(_sft_update, static_argnums=(0, 1), donate_argnums=(2, 3))


def _hashable(tree: Any) -> tuple[Any, ...]:
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple(leaves)


@functools.cache
def _pinned_jit(fn: Any, n_static: int, state_key: tuple, opt_key: tuple) -> Any:
  # Cached, so trainers with the same shardings in one process share one
  # jitted function (and its compiled programs).
  out = (
    jax.tree.unflatten(state_key[0], state_key[1]),
    jax.tree.unflatten(opt_key[0], opt_key[1]),
    None,
  )
  return jax.jit(
    fn,
    static_argnums=tuple(range(n_static)),
    donate_argnums=(n_static, n_static + 1),
    out_shardings=out,
  )


def rl_update_pinned(state_shardings: Any, opt_shardings: Any) -> Any:
  """`rl_update` with params and optimizer state out in the given shardings."""
  return _pinned_jit(
    _rl_update, 3, _hashable(state_shardings), _hashable(opt_shardings)
  )


def sft_update_pinned(state_shardings: Any, opt_shardings: Any) -> Any:
  """`sft_update` with params and optimizer state out in the given shardings."""
  return _pinned_jit(
    _sft_update, 2, _hashable(state_shardings), _hashable(opt_shardings)
  )
