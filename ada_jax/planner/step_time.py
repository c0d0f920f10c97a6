"""A roofline lower bound on the time of one RL step, from shapes alone.

For each phase of a step (prefill, the sampling rounds, the old-logp pass,
the update) it counts the FLOPs and the HBM bytes one device must move, at
the step's fixed shapes, and divides by the chip's peaks (`chips`): the
phase takes at least max(FLOPs / peak FLOP/s, bytes / HBM bandwidth).
Information, not a promise: real steps also pay collectives, the host
(verifier, controller), kernel efficiency well below peak, and the decode
loop's latency per token.

What is counted (the work our programs do at fixed shapes, not the least a
perfect implementation could do):
  * every matmul of the decoder (q, k, v, o, gate, up, down) at 2 FLOPs per
    multiply-add, split evenly over all devices (data, fsdp and tensor
    parallelism share the work);
  * attention at 4·H·K FLOPs per (query, key) pair, over every key the
    program reads: per decode step, the whole prompt bucket and the slot's
    own blocks up to the one holding the current position (`decode_reads`:
    blockwise decode reads whole blocks of the written response;
    attention='dense' reads all P+N keys from step 1), T² pairs per
    training sequence (dense or chunked, causal masking computes the masked
    half too);
  * the vocabulary projection where the program makes logits: the last
    prompt token (prefill), every decode step, every response token
    (old-logp and update);
  * the update as forward + backward = 3 forwards, plus one forward more
    with `remat='block'` (the backward recomputes each block);
  * HBM bytes: the weights each pass reads (the sampling copy, in its dtype,
    once per decode step; the training params, gathered, once per
    micro-batch forward and backward), the KV cache a decode step reads
    (a prompt's keys once per group of m slots that share them),
    and the optimizer's read and write of params, gradients and AdamW
    moments per update. Activations are left out: fused on TPU they mostly
    stay on chip; the bound only gets lower.
The sampling rounds run at the fixed S slots every round (idle slots too),
for N steps unless every slot has stopped; the bound assumes `rounds` full
rounds (default: the config's max rounds).

Dimension legend: B prompts, P prompt bucket, N new tokens, T = P + N,
S slots, R training rows, L layers, D hidden, H heads, G KV heads, K head
dim, F MLP width, V vocab.
"""

from __future__ import annotations

import dataclasses
import math

from ada_jax import attention as attention_lib
from ada_jax import model as model_lib
from ada_jax.planner import chips as chips_lib


@dataclasses.dataclass(frozen=True)
class PaperSteps:
  """One model's step times as the paper measured them (seconds per step)."""

  seconds: dict[str, float]  # Rule (grpo, pos, balance) -> seconds.
  source: str
  # The hardware they were measured on: `devices` chips of `chips.CHIPS[chip]`.
  chip: str = 'h100'
  devices: int = 8

  def same_hardware(self, chip: str | None, devices: int) -> bool:
    """Whether a plan for `devices` x `chip` is on the measured hardware."""
    return chip == self.chip and devices == self.devices


# The paper's measured wall time per update step (arXiv 2510.04996 v1,
# Table 2: "average wall time per update step", 8xH100 with verl, at the
# paper's step: B=512, n=4, M=8, P=1024, N=2048; the reference doc
# ../shared/docs/reinforce_ada_reference.md, section 9). Keyed by the
# released model's name (the Hub id's last part): a model the paper did
# not time has none, and the plan prints none for it rather than another
# model's. The only figures the paper gives; the 3B and 4B were not timed.
_TABLE_2 = 'arXiv 2510.04996 (v1) Table 2, measured on 8xH100 with verl'
PAPER_STEP_S: dict[str, PaperSteps] = {
  'Qwen2.5-Math-1.5B': PaperSteps(
    {'grpo': 102.0, 'pos': 228.0, 'balance': 290.0}, _TABLE_2
  ),
  'Qwen2.5-Math-7B': PaperSteps(
    {'grpo': 236.0, 'pos': 333.0, 'balance': 375.0}, _TABLE_2
  ),
}


def paper_steps(model: str) -> PaperSteps | None:
  """The paper's step times of `model` (a name or a Hub id), or None."""
  return PAPER_STEP_S.get(model.rsplit('/', 1)[-1])


@dataclasses.dataclass(frozen=True)
class Phase:
  """One phase's per-device work and its roofline time."""

  name: str
  flops: float
  hbm_bytes: float
  seconds: float
  bound: str  # 'compute' or 'memory'
  note: str = ''


def matmul_params(c: model_lib.ModelConfig) -> int:
  """Multiply-adds per token in the decoder's matmuls (no vocab projection)."""
  d, h, g, k, f = (
    c.hidden_size,
    c.num_heads,
    c.num_kv_heads,
    c.head_dim,
    c.intermediate_size,
  )
  return c.num_layers * (d * (h + 2 * g) * k + h * k * d + 3 * d * f)


def param_count(c: model_lib.ModelConfig) -> int:
  """All parameters (embeddings and the untied head included; norms left out)."""
  head = 0 if c.tie_embeddings else c.hidden_size * c.vocab_size
  return matmul_params(c) + c.vocab_size * c.hidden_size + head


def decode_reads(
  prompt_len: int, new_tokens: int, attention: str = 'auto'
) -> tuple[float, float]:
  """(prompt keys, own keys) one slot's decode step reads, averaged over N steps.

  Blockwise decode (every `attention` but 'dense') reads its prompt's keys
  whole from a buffer of their own (all P: `attention.SharedPrefix`), and
  its own response blocks of `decode_block(N)` up to the current position's
  (a clamped last block reads a full block). Dense reads the slot's whole
  [P + N] buffer every step (all of it counted as own keys: no prompt
  buffer is shared).
  """
  if attention == 'dense':
    return 0.0, float(prompt_len + new_tokens)
  tn, _ = attention_lib.decode_block(new_tokens)
  # Step i (1-based) writes response index i - 1 and reads up to its block.
  own = sum(((i - 1) // tn + 1) * tn for i in range(1, new_tokens + 1))
  return float(prompt_len), own / new_tokens


def _phase(name: str, flops: float, nbytes: float, chip: chips_lib.Chip, note=''):
  t_flops = flops / chip.bf16_flops
  t_bytes = nbytes / chip.hbm_bytes_per_s
  return Phase(
    name,
    flops,
    nbytes,
    max(t_flops, t_bytes),
    'compute' if t_flops >= t_bytes else 'memory',
    note,
  )


def _sample_weights(c: model_lib.ModelConfig, tensor: int, sample_bytes: int) -> float:
  """Bytes of the sampling copy one device reads whole: split over tensor only."""
  return param_count(c) * sample_bytes / tensor


def _kv_token(c: model_lib.ModelConfig, kv_bytes: int) -> int:
  """KV-cache bytes of one token over all layers (K and V)."""
  return 2 * c.num_layers * c.num_kv_heads * c.head_dim * kv_bytes


def _attn_pair(c: model_lib.ModelConfig) -> int:
  """Attention FLOPs of one (query, key) pair over all layers (QK^T and PV)."""
  return 4 * c.num_heads * c.head_dim * c.num_layers


def _vocab(c: model_lib.ModelConfig) -> int:
  """FLOPs of one token's vocabulary projection."""
  return 2 * c.hidden_size * c.vocab_size


def prefill_phase(
  c: model_lib.ModelConfig,
  *,
  prompts: int,
  prompt_len: int,
  mesh: tuple[int, int, int],
  chip: chips_lib.Chip,
  sample_bytes: int = 2,
  kv_bytes: int = 2,
) -> Phase:
  """The prefill of B prompts of P tokens (logits of the last token only)."""
  devices, p = math.prod(mesh), prompt_len
  flops = prompts * (2 * matmul_params(c) * p + _attn_pair(c) * p * p + _vocab(c))
  return _phase(
    'prefill',
    flops / devices,
    _sample_weights(c, mesh[2], sample_bytes)
    + prompts * p * _kv_token(c, kv_bytes) / devices,
    chip,
    f'B={prompts} prompts x P={p}',
  )


def sampling_phase(
  c: model_lib.ModelConfig,
  *,
  prompt_len: int,
  new_tokens: int,
  slots: int,
  rounds: int,
  mesh: tuple[int, int, int],
  chip: chips_lib.Chip,
  attention: str = 'auto',
  sample_bytes: int = 2,
  kv_bytes: int = 2,
  slot_group: int = 1,
  waves: int = 1,
) -> Phase:
  """`rounds` full sampling rounds of N decode steps of S slots.

  Each decode step reads the sampling copy once, each prompt's keys once
  per group of m = `slot_group` slots and each slot's own keys up to the
  current position's block (`decode_reads`). In W slot `waves` a round is
  W decode loops of S/W slots: the same FLOPs and KV reads, the weights
  read W times per column.
  """
  devices, tensor = math.prod(mesh), mesh[2]
  g_split = tensor if c.num_kv_heads % tensor == 0 else 1
  prompt_keys, own_keys = decode_reads(prompt_len, new_tokens, attention)
  step_flops = slots * (
    2 * matmul_params(c) + _attn_pair(c) * (prompt_keys + own_keys) + _vocab(c)
  )
  read = slots / slot_group * prompt_keys + slots * own_keys
  step_bytes = (
    waves * _sample_weights(c, tensor, sample_bytes)
    + read * _kv_token(c, kv_bytes) / (devices / tensor) / g_split
  )
  steps = rounds * new_tokens
  return _phase(
    'sampling rounds',
    steps * step_flops / devices,
    steps * step_bytes,
    chip,
    f'{rounds} rounds x N={new_tokens} steps of S={slots} slots'
    + (f', prompt keys read once per {slot_group} slots' if slot_group > 1 else '')
    + (f', in {waves} waves' if waves > 1 else ''),
  )


def estimate(
  c: model_lib.ModelConfig,
  *,
  prompts: int,
  prompt_len: int,
  new_tokens: int,
  slots: int,
  rounds: int,
  rows: int,
  micro_batch_rows: int,
  mini_batch_rows: int,
  epochs: int,
  mesh: tuple[int, int, int],
  chip: chips_lib.Chip,
  remat: str = 'none',
  attention: str = 'auto',
  sample_bytes: int = 2,
  kv_bytes: int = 2,
  slot_group: int = 1,
  waves: int = 1,
) -> list[Phase]:
  """Per-phase roofline times of one step on `mesh` (data, fsdp, tensor).

  Args:
    c: the policy.
    prompts: B, prompts per step.
    prompt_len: P, the prompt bucket.
    new_tokens: N, the response budget.
    slots: S, sampling slots per round.
    rounds: full sampling rounds assumed (at most the config's max rounds).
    rows: R, training rows.
    micro_batch_rows: rows of one micro-batch (all devices together).
    mini_batch_rows: rows of one optimizer update.
    epochs: passes over the rows.
    mesh: (data, fsdp, tensor) sizes.
    chip: the accelerator.
    remat: 'none' or 'block' (one more forward in the backward).
    attention: the config's `model.attention` ('dense': decode reads the
      whole cache every step; else the written blocks, `decode_reads`).
    sample_bytes: bytes per weight of the sampling copy (2: bf16).
    kv_bytes: bytes per KV-cache element.
    slot_group: m, slots per prompt group (the sampler reads a prompt's keys
      once per m slots; `ControllerSettings.slot_group`).
    waves: W, slot waves per round (`sampling_phase`).
  """
  devices = math.prod(mesh)
  tensor = mesh[2]
  t = prompt_len + new_tokens
  n_params = param_count(c)
  copy = dict(sample_bytes=sample_bytes, kv_bytes=kv_bytes)
  phases = [
    prefill_phase(
      c, prompts=prompts, prompt_len=prompt_len, mesh=mesh, chip=chip, **copy
    ),
    sampling_phase(
      c,
      prompt_len=prompt_len,
      new_tokens=new_tokens,
      slots=slots,
      rounds=rounds,
      mesh=mesh,
      chip=chip,
      attention=attention,
      slot_group=slot_group,
      waves=waves,
      **copy,
    ),
  ]
  # Training forwards over R rows of T tokens, logits of the N response tokens.
  forward = rows * (
    2 * matmul_params(c) * t + _attn_pair(c) * t * t + _vocab(c) * new_tokens
  )
  shards = mesh[1] * tensor  # The training params are split over fsdp x tensor.
  micro_passes = math.ceil(rows / micro_batch_rows)
  # Each micro-batch pass reads the gathered weights (split over tensor) once,
  # cast to the compute dtype.
  train_weights = n_params * 2 / tensor
  phases.append(
    _phase(
      'old-logp pass',
      forward / devices,
      micro_passes * train_weights,
      chip,
      f'R={rows} rows x T={t}',
    )
  )
  passes = 4 if remat == 'block' else 3
  updates = epochs * math.ceil(rows / mini_batch_rows)
  # AdamW: read params, grads, mu, nu; write params, mu, nu (fp32).
  optimizer = updates * n_params * 4 * 7 / shards
  phases.append(
    _phase(
      'update',
      passes * epochs * forward / devices,
      passes * epochs * micro_passes * train_weights + optimizer,
      chip,
      f'{passes} forward-equivalents (remat={remat}), {updates} optimizer updates',
    )
  )
  return phases


def total_seconds(phases: list[Phase]) -> float:
  """The step's lower bound: phases run one after another."""
  return sum(p.seconds for p in phases)
