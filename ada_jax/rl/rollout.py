"""One RL step's sampling: controller rounds over the sampler and the verifier.

The draw contract between the parts: the step's prompts are prefilled once;
every `draw(slot_prompt)` of the controller (`adaptive.ControllerSettings`)
runs `sampler.sample_round` for the next round, keeps that round's Rollout
on device in a fixed [max_rounds, S, N] buffer and scores it with
`scoring.Scorer.score_round` (each host decodes and verifies the live slots
it holds; rewards and lengths are gathered over hosts). Afterwards the
training rows are gathered from the buffer by sample id (round = id // S,
slot = id % S) together with their prompts into a fixed batch of R_max rows,
advantages broadcast to the response tokens, laid out as the update consumes
it: [C, m, ...] micro-batches of m = micro_batch_rows rows in row order, the
rows of each micro-batch split over ('data', 'fsdp') (see `update`).

Multi-host: every process runs the controller on the same gathered global
rewards, so all take the same decisions (rounds, exits) and issue the same
jitted calls. Verifier counters are summed over hosts.

Dimension legend:
  B: prompts of the step   P: prompt bucket   S: slots   N: new tokens
  M: max rounds            R: training rows (R_max, fixed)
  C: micro-batches (R / m) m: rows per micro-batch
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ada_jax import adaptive, sampler, verifier
from ada_jax import model as model_lib
from ada_jax import sharding as sharding_lib
from ada_jax.infra import multihost
from ada_jax.rl import scoring

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
  """The sampler's knobs, fixed per run (slots and rounds: the controller's)."""

  max_new_tokens: int
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  eos_ids: tuple[int, ...] = ()
  # Slot waves per round (`sampler.sample_round`'s `waves`): the same
  # samples at 1/W of the round's KV cache.
  waves: int = 1


class StoppedError(Exception):
  """`run_step`'s `stop` said yes before a round: the step's sampling is dropped."""


@dataclasses.dataclass
class StepSamples:
  """What one step's sampling produced (device buffers + host statistics)."""

  groups: adaptive.Groups
  batch: dict[str, Array]  # the fixed [C, m, ...] training batch, see assemble_batch
  rewards: np.ndarray  # float [rounds, S], NaN on idle slots (all hosts)
  lengths: np.ndarray  # int [rounds, S] (all hosts)
  texts: dict[tuple[int, int], str]  # (round, slot) -> decoded response (this host)
  time_sample_s: float
  time_verify_s: float
  verifier_counters: dict[str, int]  # summed over hosts
  boxed: np.ndarray | None = None  # bool [rounds, S], a readable answer (all hosts)


@functools.partial(jax.jit, donate_argnums=(0,))
def _write_round(
  buffer: dict[str, Array], rollout: sampler.Rollout, r: Array
) -> dict[str, Array]:
  new = {'tokens': rollout.tokens, 'logprobs': rollout.logprobs, 'mask': rollout.mask}
  return {
    k: jax.lax.dynamic_update_index_in_dim(buffer[k], new[k], r, 0) for k in buffer
  }


def _buffer_sharding(model: model_lib.Transformer, s: int):
  """[M, S, N] with the slots where the sampler puts them (over the data axes).

  Without it the zeros would sit on one device and the first write would
  compile a second `_write_round` for the resharded buffer (and, multi-host,
  mix a host-local array into a global program).
  """
  sh = jax.tree.leaves(nnx.state(model))[0].sharding
  if not isinstance(sh, NamedSharding):
    return None
  mesh = sh.mesh
  if s % sharding_lib.data_parallel_size(mesh):
    return sharding_lib.replicated(mesh)
  return NamedSharding(mesh, PartitionSpec(None, sharding_lib.BATCH_AXES, None))


def _zeros(m: int, s: int, n: int) -> dict[str, Array]:
  return {
    'tokens': jnp.zeros((m, s, n), jnp.int32),
    'logprobs': jnp.zeros((m, s, n), jnp.float32),
    'mask': jnp.zeros((m, s, n), jnp.int32),
  }


@functools.cache
def _zeros_fn(m: int, s: int, n: int, sharding) -> Callable[[], dict[str, Array]]:
  # Made in place by a jit: a device_put of host zeros to a multi-host
  # sharding would first check, with a gather, that every host sent the same.
  return jax.jit(functools.partial(_zeros, m, s, n), out_shardings=sharding)


def _empty_buffer(m: int, s: int, n: int, sharding) -> dict[str, Array]:
  return _zeros_fn(m, s, n, sharding)()


def _batch_sharding(model: model_lib.Transformer, micro_rows: int):
  """[C, m, ...] with the m rows of every micro-batch over the data axes.

  So each device holds m/dp rows of every micro-batch, the slice it computes
  in the old-logp pass and the update. A micro-batch that does not divide by
  the data axes (`config_rules` forbids it; library callers may) is
  replicated: every device then computes all of it, as correct and slower.
  """
  sh = jax.tree.leaves(nnx.state(model))[0].sharding
  if not isinstance(sh, NamedSharding):
    return None
  mesh = sh.mesh
  if micro_rows % sharding_lib.data_parallel_size(mesh):
    return sharding_lib.replicated(mesh)
  return NamedSharding(mesh, PartitionSpec(None, sharding_lib.BATCH_AXES))


@functools.partial(
  jax.jit, static_argnames=('slots', 'micro_batch_rows', 'out_sharding')
)
def assemble_batch(
  prompt_tokens: Array,
  prompt_mask: Array,
  buffer: dict[str, Array],
  prompt_index: Array,
  sample_id: Array,
  advantage: Array,
  weight: Array,
  *,
  slots: int,
  micro_batch_rows: int,
  out_sharding: NamedSharding | None = None,
) -> dict[str, Array]:
  """The fixed training batch from the buffer rows named by sample id.

  Row i of the R rows (prompt_index[i], sample_id[i], ...) lands in
  micro-batch i // m at position i % m: the rows keep their order, cut into
  C = R / m micro-batches. Gathered straight into that layout (with
  `out_sharding` of `_batch_sharding`), so each device holds only its m/dp
  rows of each micro-batch.

  Args:
    prompt_tokens: int [B, P] (global array).
    prompt_mask: int [B, P].
    buffer: the step's rounds, `tokens`, `logprobs`, `mask` [M, S, N].
    prompt_index: int [R] prompt of each row.
    sample_id: int [R] round * S + slot of each row.
    advantage: float [R].
    weight: float [R], 0 on padding rows.
    slots: S (static).
    micro_batch_rows: m (static), dividing R.
    out_sharding: sharding of every [C, m, ...] output (static); None: left
      to the partitioner.

  Returns: `tokens`, `attn_mask` int [C, m, P+N]; `resp_mask` float
  [C, m, N] (response mask x row weight: padding rows count nowhere);
  `advantages` [C, m, N]; `sampler_logp` [C, m, N] (the sampler's
  logprobs, for the gap metric).
  """
  r = sample_id.shape[0]
  if r % micro_batch_rows:
    raise ValueError(f'{r} rows do not split into micro-batches of {micro_batch_rows}')

  def micro(x):
    return jnp.asarray(x).reshape(r // micro_batch_rows, micro_batch_rows)

  prompt_index, sample_id = micro(prompt_index), micro(sample_id)
  advantage, weight = micro(advantage), micro(weight)
  rnd, slot = sample_id // slots, sample_id % slots

  def rows(x):
    return x[rnd, slot]

  resp = rows(buffer['tokens'])
  resp_mask = rows(buffer['mask'])
  tokens = jnp.concatenate([prompt_tokens[prompt_index], resp], axis=-1)
  attn = jnp.concatenate([prompt_mask[prompt_index], resp_mask], axis=-1)
  w = resp_mask.astype(jnp.float32) * weight[..., None]
  out = {
    'tokens': tokens,
    'attn_mask': attn,
    'resp_mask': w,
    'advantages': jnp.broadcast_to(advantage[..., None], w.shape) * (w > 0),
    'sampler_logp': rows(buffer['logprobs']),
  }
  if out_sharding is not None:
    out = jax.lax.with_sharding_constraint(out, out_sharding)
  return out


def run_step(
  model: model_lib.Transformer,
  scorer: scoring.Scorer,
  prompt_tokens: Array,
  prompt_mask: Array,
  references: Sequence[str],
  *,
  controller: adaptive.ControllerSettings,
  sampling: SamplingSettings,
  rng: Array,
  prompt_keys: Sequence[int] | None = None,
  history: dict[str, np.ndarray] | None = None,
  buffer_sharding=None,
  micro_batch_rows: int | None = None,
  stop: Callable[[], bool] | None = None,
) -> StepSamples:
  """Prefill, controller rounds, verification and the training batch of one step.

  Args:
    model: the policy in its sampling layout.
    scorer: the tokenizer and the verifier's settings.
    prompt_tokens: int [B, P] left-padded prompts (global array).
    prompt_mask: int [B, P].
    references: B reference answers (global, same order).
    controller: the rule and its knobs; its slots S and max rounds M fix
      the shapes.
    sampling: the sampler's knobs.
    rng: PRNG key of this step.
    prompt_keys: stable per-prompt keys (est history).
    history: est history from the previous step.
    buffer_sharding: sharding of the [M, S, N] buffer; default: slots on the
      data axes of the model's mesh.
    micro_batch_rows: m, the update's micro-batch rows: the training batch
      comes as [R/m, m, ...], each micro-batch's rows on the data axes of the
      model's mesh (see `assemble_batch`). None: one micro-batch of all R.
    stop: asked before each round (a preemption poll, the same on every
      host); True raises `StoppedError`, leaving the caller's state as it was.
  """
  s, m, n = controller.slots, controller.max_rounds, sampling.max_new_tokens
  b = prompt_tokens.shape[0]
  t0 = time.perf_counter()
  cache = sampler.prefill(model, prompt_tokens, prompt_mask)
  buffer = _empty_buffer(m, s, n, buffer_sharding or _buffer_sharding(model, s))
  eos = sampler.eos_array(sampling.eos_ids)
  state = {'buffer': buffer}
  rounds: list[scoring.RoundScores] = []
  counters_before = verifier.counters()

  def draw(slot_prompt: np.ndarray) -> np.ndarray:
    r = len(rounds)
    if stop is not None and stop():
      raise StoppedError(f'stopped before sampling round {r}')
    rollout = sampler.sample_round(
      model,
      cache,
      slot_prompt,
      max_new_tokens=n,
      rng=jax.random.fold_in(rng, r),
      temperature=sampling.temperature,
      top_p=sampling.top_p,
      top_k=sampling.top_k,
      eos_ids=eos,
      filter_logits=sampler.needs_filter(sampling.top_p, sampling.top_k),
      group=controller.slot_group,
      waves=sampling.waves,
    )
    state['buffer'] = _write_round(state['buffer'], rollout, jnp.int32(r))
    rounds.append(scorer.score_round(rollout, slot_prompt, references))
    return rounds[-1].rewards

  groups = controller.sample_groups(b, draw, prompt_keys=prompt_keys, history=history)
  padded = groups.padded()
  micro = micro_batch_rows or len(padded['sample_id'])
  batch = assemble_batch(
    prompt_tokens,
    prompt_mask,
    state['buffer'],
    padded['prompt_index'],
    padded['sample_id'],
    padded['advantage'],
    padded['weight'],
    slots=s,
    micro_batch_rows=micro,
    out_sharding=_batch_sharding(model, micro),
  )
  counters_after = verifier.counters()
  counters = multihost.sum_over_hosts(
    {k: counters_after[k] - counters_before.get(k, 0) for k in counters_after}
  )
  total = time.perf_counter() - t0
  t_verify = sum(x.time_verify_s for x in rounds)
  return StepSamples(
    groups=groups,
    batch=batch,
    rewards=np.stack([x.rewards for x in rounds]),
    lengths=np.stack([x.lengths for x in rounds]),
    boxed=np.stack([x.boxed for x in rounds]),
    texts={
      (r, slot): text for r, x in enumerate(rounds) for slot, text in x.texts.items()
    },
    time_sample_s=total - t_verify,
    time_verify_s=t_verify,
    verifier_counters=counters,
  )


def sample_rows(
  out: StepSamples, examples: Sequence[Any], limit: int
) -> list[dict[str, Any]]:
  """Up to `limit` decoded training rows with reward, answer and counters.

  The first rows whose response this host decoded: all of them on one host;
  multi-host, only process 0 writes, from the slots it holds.
  """
  g = out.groups
  s = out.rewards.shape[1]  # S slots: sample id = round * S + slot
  rows = []
  for i in range(g.num_rows):
    if len(rows) == limit:
      break
    sid = int(g.sample_id[i])
    text = out.texts.get((sid // s, sid % s))
    if text is None:
      continue
    ex = examples[int(g.prompt_index[i])]
    rows.append(
      {
        'prompt': ex.prompt,
        'reference': ex.reference,
        'response': text,
        'reward': float(g.reward[i]),
        'advantage': float(g.advantage[i]),
        'extracted': verifier.extract(text),
        'verifier': out.verifier_counters,
      }
    )
  return rows
