"""Per-device HBM plan of one RL step, from shapes and shardings alone.

No accelerator and no weights are needed: parameter shapes come from
`nnx.eval_shape` on the model constructor, their per-device shards from
`sharding.logical_to_spec` on an `AbstractMesh` of the pod's device count,
and every other buffer from the step's fixed shapes (B, P, N, S, M, R, micro
rows). `ada_jax/plan.py` is the command line; the chips and the paper
models are `planner.chips` and `planner.models`; `tests/test_plan.py` checks the
update and round programs against XLA's compiled memory analysis.

What is alive when (ada_jax/rl/trainer.py): the training params and the AdamW
moments live all run; each step reshards a sampling copy of the params that
stays referenced until the step ends (also through the update). Phases:

  sampling: prompt cache [B, P] + rollout buffer [M, S, N] + the round
            program (KV cache [S, P+N] carried by the decode loop, part of
            its initial copy, the gathered prompt cache, the per-token
            temporaries);
  old logp: one forward over all R rows at once (update.logp_jit);
  update:   the training batch, the gradient accumulator (1.1x the params)
            and the activations the backward keeps (no remat):
            per layer hidden states, attention scores [micro, H, T, T], and
            the fp32 [micro, N, V] logits / log-softmax.

The activation and temporary terms are bytes per element of each array,
fitted to XLA's buffer assignment of the compiled programs on CPU (fake
devices, 9 update and 10 round programs: plan/compiled 0.85-1.15, one
outlier: a round with G = tensor = 4 at 1.37, the plan high) and written in
the compute dtype's bytes so they carry over to bf16. tests/test_plan.py
keeps them within 25%. TPU fuses at least as well; read them as upper-side
estimates there.

What the programs do today, and the plan follows (ada_jax/plan.py prints
notes for the first two):
  * update.rl_update reshapes the row-sharded batch [R] to [R/mini,
    mini/micro, micro]: the row shards land on the scanned dims, so one
    micro-batch is split over fewer devices than data x fsdp (7B on v5p-64:
    all 32 rows of a micro-batch on every device);
  * update.logp_jit runs all R/dp rows in one forward (no micro-batches);
  * the model keeps every layer's [H, T, T] scores for the backward (no
    remat, no flash attention);
  * the round all-gathers the row-sharded prompt cache (one layer at a time)
    for the slot gather, and draws the first token from [S, V] fp32 logits
    not split over the slots;
  * train.rl_step holds the sampling copy of the params through the update.

Dimension legend:
  B: prompts per step     P: prompt bucket      N: max new tokens
  T: P + N                S: sampling slots     M: max rounds
  R: training rows        b: rows of one micro-batch on one device
  L: layers   D: hidden   H: query heads   G: KV heads   K: head dim
  F: MLP width            V: vocab
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh

from ada_jax import model as model_lib
from ada_jax import sharding as sharding_lib

GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class StepShapes:
  """The fixed shapes of one RL step (what the config decides)."""

  prompts: int  # B
  prompt_len: int  # P
  new_tokens: int  # N
  slots: int  # S
  max_rounds: int  # M
  rows: int  # R
  mini_batch_rows: int
  micro_batch_rows: int


@dataclasses.dataclass(frozen=True)
class Item:
  """One line of the plan: per-device bytes of one buffer (or group)."""

  name: str
  phase: str  # 'resident' | 'sampling' | 'old_logp' | 'update'
  bytes: int
  note: str = ''
  knob: str = ''  # the config key that shrinks it


@dataclasses.dataclass(frozen=True)
class Plan:
  """Per-device memory of a step; `peak` is the largest phase."""

  items: tuple[Item, ...]
  mesh: tuple[int, int, int]
  update_rows_per_device: int
  update_rows_intended: int

  def phase_bytes(self, phase: str) -> int:
    """Resident bytes plus the phase's own."""
    return sum(i.bytes for i in self.items if i.phase in ('resident', phase))

  @property
  def phases(self) -> dict[str, int]:
    return {p: self.phase_bytes(p) for p in ('sampling', 'old_logp', 'update')}

  @property
  def peak_phase(self) -> str:
    return max(self.phases, key=self.phases.get)

  @property
  def peak(self) -> int:
    return self.phases[self.peak_phase]

  def get(self, name: str) -> int:
    """Bytes of the item called `name`."""
    return next(i.bytes for i in self.items if i.name == name)


def abstract_mesh(shape: tuple[int, int, int]) -> AbstractMesh:
  """A device-free mesh with axes ('data', 'fsdp', 'tensor')."""
  return AbstractMesh(tuple(shape), sharding_lib.MESH_AXES)


def resolve_mesh(mesh: Mapping[str, int], devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) with the -1 filled for `devices` devices."""
  shape = [int(mesh.get(a, 1)) for a in sharding_lib.MESH_AXES]
  known = math.prod(s for s in shape if s != -1)
  if shape.count(-1) > 1 or devices % known:
    raise ValueError(f'mesh {dict(mesh)} does not fit {devices} devices')
  shape = [devices // known if s == -1 else s for s in shape]
  if math.prod(shape) != devices:
    raise ValueError(f'mesh {shape} needs {math.prod(shape)} devices, have {devices}')
  return tuple(shape)


@functools.cache
def _param_shapes(
  config: model_lib.ModelConfig,
) -> tuple[tuple[str, tuple[int, ...], Any, tuple, int], ...]:
  """(name, shape, dtype, logical axes, copies) of every param.

  The blocks are identical, so one block is traced (eval_shape, no
  allocation) and counted L times: fast even for the 7B model.
  """
  one = dataclasses.replace(config, num_layers=1)
  abstract = nnx.eval_shape(lambda: model_lib.Transformer(one, rngs=nnx.Rngs(0)))
  out = []
  for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
    value = var.get_value()
    axes = var.get_metadata().get('axes') or (None,) * len(value.shape)
    copies = config.num_layers if path[0] == 'layers' else 1
    name = '/'.join(str(p) for p in path)
    out.append((name, tuple(value.shape), value.dtype, tuple(axes), copies))
  return tuple(out)


def count_params(config: model_lib.ModelConfig) -> int:
  """Number of parameters of the model."""
  return sum(math.prod(shape) * k for _, shape, _, _, k in _param_shapes(config))


def param_bytes_per_device(
  config: model_lib.ModelConfig,
  mesh: tuple[int, int, int],
  rules: Mapping[str, str | None],
) -> int:
  """Per-device bytes of the params in the layout of `rules` (largest shard)."""
  amesh = abstract_mesh(mesh)
  total = 0
  for name, shape, dtype, axes, copies in _param_shapes(config):
    spec = sharding_lib.logical_to_spec(axes, shape, amesh, rules, name)
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    n = 1
    for dim, ax in zip(shape, spec, strict=True):
      n *= dim // (amesh.shape[ax] if ax else 1)
    total += n * jnp.dtype(dtype).itemsize * copies
  return total


def _split(dim: int, ways: int) -> int:
  """Per-device size of a dim split `ways` ways (replicated if not dividing)."""
  return dim // ways if ways > 1 and dim % ways == 0 else dim


def _rows(rows: int, dp: int) -> int:
  """Rows per device of a [rows, ...] array split over data x fsdp when dividing."""
  return _split(rows, dp)


def micro_rows_per_device(rows: int, mini: int, micro: int, dp: int) -> int:
  """Rows of one micro-batch that each device computes in `update.rl_update`.

  The update reshapes the row-sharded batch [R] to [R/mini, mini/micro,
  micro] and scans over the first two: the dp row shards land on the scanned
  dims first, so a micro-batch is split only over what is left of dp.
  """
  left = dp
  for dim in (rows // mini, mini // micro):
    left //= math.gcd(dim, left)
  return math.ceil(micro / math.gcd(micro, left))


def _layer_bytes(c: model_lib.ModelConfig, t: int, tensor: int) -> tuple[int, int]:
  """(bytes per row one layer keeps for the backward, one layer's transients).

  Per element of each activation, fitted to XLA's buffer assignment of the
  compiled update (fp32, a = 4) and written in the compute dtype's bytes a:
  the fp32 softmax of the scores [H, T, T] (4; its cast to the dtype fuses
  into the next matmul), the q/k/v projections with their fp32 RoPE copies,
  the attention output and the residual stream (3a + 7 per q/k/v element),
  the MLP's gate, up, silu and product (6a per [T, F] element). The softmax
  backward's fp32 temporaries [H, T, T] exist for one layer at a time.
  """
  a = jnp.dtype(c.dtype).itemsize
  h = _split(c.num_heads, tensor)
  g = _split(c.num_kv_heads, tensor)
  f = _split(c.intermediate_size, tensor)
  kept = 4 * h * t * t + t * (h + 2 * g) * c.head_dim * (3 * a + 7) + 6 * a * t * f
  return kept, 14 * h * t * t


def plan(
  config: model_lib.ModelConfig,
  shapes: StepShapes,
  mesh: tuple[int, int, int],
  *,
  kv_dtype: Any = None,
  micro_rows: int | None = None,
) -> Plan:
  """The per-device memory of one RL step on a (data, fsdp, tensor) mesh.

  Args:
    config: the policy.
    shapes: the step's fixed shapes.
    mesh: (data, fsdp, tensor) sizes.
    kv_dtype: sampler KV-cache dtype (default: the compute dtype, as
      `sampler.prefill` does).
    micro_rows: rows per device of one update micro-batch; default what
      `update.rl_update` does (see `micro_rows_per_device`).
  """
  c, s = config, shapes
  dp, tensor = mesh[0] * mesh[1], mesh[2]
  p, n = s.prompt_len, s.new_tokens
  t = p + n
  kv_bytes = jnp.dtype(kv_dtype or c.dtype).itemsize
  train = param_bytes_per_device(c, mesh, sharding_lib.TRAIN_RULES)
  sample = param_bytes_per_device(c, mesh, sharding_lib.SAMPLE_RULES)
  # AdamW mu and nu take the params' dtype and sharding; counts are scalars.
  opt = 2 * train
  kv_row = 2 * c.num_layers * c.num_kv_heads * c.head_dim * kv_bytes
  b_dev = _rows(s.prompts, dp)
  s_dev = _rows(s.slots, dp)
  r_dev = _rows(s.rows, dp)
  prompt_cache = b_dev * (p * kv_row + p + c.vocab_size * 4 + 4)
  kv_cache = s_dev * t * (kv_row + 1)
  # The round program (sampler._round_jit), fitted to XLA's buffer
  # assignment: a quarter of the initial [S, P+N] cache outlives the loop's
  # entry; the slot gather all-gathers the row-sharded prompt cache, one
  # layer at a time, and its last logits [B, V]; the first token is drawn
  # from [S, V] fp32 logits that are not split over the slots (~3/4 of one
  # copy alive); per token, ~3 fp32 copies of the scores [S, H, 1, P+N].
  h_s = _split(c.num_heads, tensor)
  round_tmp = (
    kv_cache // 4
    + s.prompts * (p * kv_row // c.num_layers + c.vocab_size * 4)
    + s.slots * c.vocab_size * 3
    + s_dev * h_s * t * 12
  )
  rollout_out = s_dev * (n * 12 + 4)
  buffer = s.max_rounds * s_dev * n * 12
  batch = r_dev * (2 * t * 4 + 5 * n * 4)
  micro = micro_rows or micro_rows_per_device(
    s.rows, s.mini_batch_rows, s.micro_batch_rows, dp
  )
  intended = math.ceil(s.micro_batch_rows / dp)
  kept, transient = _layer_bytes(c, t, tensor)
  # fp32 [N, V] logits: the logits, log-softmax, exp(log-softmax) for the
  # entropy and their gradients, ~3.75 copies kept at once.
  logits = _split(c.vocab_size, tensor) * n * 15
  update_act = micro * (c.num_layers * kept + transient + logits)
  # The forward-only pass keeps nothing for a backward: one layer's fp32
  # softmax and two fp32 copies of the [N, V] logits per row, over all R/dp
  # rows at once (calibrated like the rest, not tested: ~1.1-1.3x XLA's).
  logp_act = r_dev * (4 * h_s * t * t + 8 * n * c.vocab_size)
  # The accumulator; each micro-batch's gradients are added into it as the
  # backward produces them (measured: 1.1x the params).
  grads = train + train // 8
  items = (
    Item('params (training layout)', 'resident', train, 'fsdp x tensor'),
    Item('optimizer state (AdamW mu, nu)', 'resident', opt, 'fsdp x tensor'),
    Item(
      'params (sampling copy)',
      'resident',
      sample,
      'tensor only; held through the update',
      'a larger tensor axis (mesh.tensor)',
    ),
    Item('prompt cache [B, P]', 'sampling', prompt_cache, '', 'rl.prompts_per_step'),
    Item(
      'rollout buffer [M, S, N]', 'sampling', buffer, '', 'rl.max_rounds / rl.slots'
    ),
    Item(
      'KV cache [S, P+N] (round)',
      'sampling',
      kv_cache,
      'slots over data x fsdp',
      'rl.slots / sampling.max_new_tokens',
    ),
    Item(
      'round temporaries',
      'sampling',
      round_tmp + rollout_out,
      'gathered prompt cache (1 layer), [S, V] logits',
      'rl.slots / sampling.max_new_tokens',
    ),
    Item(
      'old-logp forward (all R rows)',
      'old_logp',
      logp_act + batch,
      f'{r_dev} rows/device',
      'rl.prompts_per_step',
    ),
    Item('training batch [R, P+N]', 'update', batch),
    Item('gradients + accumulator', 'update', grads, 'fsdp x tensor'),
    Item(
      'update activations',
      'update',
      update_act,
      f'{micro} rows/device per micro-batch',
      'rl.micro_batch_rows / sampling.max_new_tokens',
    ),
  )
  return Plan(items, tuple(mesh), micro, intended)


def biggest_knobs(p: Plan, count: int = 3) -> list[str]:
  """Config keys of the largest items of the peak phase, biggest first."""
  items = sorted(
    (i for i in p.items if i.phase in ('resident', p.peak_phase) and i.knob),
    key=lambda i: -i.bytes,
  )
  out = []
  for i in items:
    if i.knob not in out:
      out.append(i.knob)
  return out[:count]
