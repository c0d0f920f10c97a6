"""The mesh and micro-batch of a run: one rule, from the memory plan.

A config may leave two layout keys to this rule (0 means "by the rule"):

- `mesh.tensor = 0`: the smallest tensor axis that divides the KV heads
  (and the device count) whose plan fits the devices' memory, the rest of
  the devices on fsdp (data as the config says). The sampling layout splits
  KV heads over tensor only when they divide; a larger tensor axis shrinks
  the sampling copy of the weights and the gathered prompt cache but costs
  a collective per layer per token, so the smallest that fits wins. With no
  memory figure (a CPU host) it is the smallest divisor, 1.
- `rl.micro_batch_rows = 0`: one row per batch shard, data x fsdp (capped
  at the mini-batch): every device computes one row per micro-batch.

The `tpu=` presets of every config use both, so any pod size gets a mesh,
and a pod where nothing fits is refused with the plan's line (`Layout.fits`
False; the caller prints it). `gpu=` presets reuse the same rule.

Dimension legend: none (shapes are the planner's; see planner/memory.py).
"""

from __future__ import annotations

import dataclasses

from ada_jax import model as model_lib
from ada_jax.planner import memory as memory_plan


@dataclasses.dataclass(frozen=True)
class Layout:
  """A resolved layout and its plan.

  Attributes:
    mesh: (data, fsdp, tensor) sizes.
    micro_batch_rows: m.
    plan: the memory plan at this layout.
    fits: whether the plan's peak fits the memory (True with no memory figure).
    tried: the tensor sizes the rule tried, in order.
  """

  mesh: tuple[int, int, int]
  micro_batch_rows: int
  plan: memory_plan.Plan
  fits: bool
  tried: tuple[int, ...]


def micro_rows(mini_batch_rows: int, dp: int) -> int:
  """One row per batch shard (data x fsdp), at most the mini-batch."""
  return min(mini_batch_rows, dp)


def tensor_candidates(
  config: model_lib.ModelConfig, devices: int, data: int
) -> list[int]:
  """Tensor sizes the rule may take, smallest first: divisors of the KV heads."""
  g = config.num_kv_heads
  return [
    t
    for t in range(1, g + 1)
    if g % t == 0
    and devices % (data * t) == 0
    and config.num_heads % t == 0
    and config.intermediate_size % t == 0
  ]


def choose(
  config: model_lib.ModelConfig,
  shapes: memory_plan.StepShapes,
  devices: int,
  hbm_bytes: float | None,
  *,
  data: int = 1,
  fsdp: int = -1,
  tensor: int = 0,
  backend: str = 'tpu',
) -> Layout:
  """The layout of a config on `devices` devices of `hbm_bytes` each.

  Args:
    config: the policy.
    shapes: the step; `micro_batch_rows` 0 means by the rule.
    devices: JAX devices (chips).
    hbm_bytes: memory per device (None: unknown, nothing is refused).
    data: the data axis (-1: what tensor leaves, fsdp then 1).
    fsdp: the fsdp axis (-1: what data and tensor leave).
    tensor: the tensor axis; 0: by the rule.
    backend: the target platform the plan assumes.
  """
  if tensor:
    candidates = [tensor]
  else:
    candidates = tensor_candidates(config, devices, max(data, 1)) or [1]
  layout = None
  for t in candidates:
    mesh = memory_plan.resolve_mesh({'data': data, 'fsdp': fsdp, 'tensor': t}, devices)
    dp = mesh[0] * mesh[1]
    micro = shapes.micro_batch_rows or micro_rows(shapes.mini_batch_rows, dp)
    p = memory_plan.plan(
      config, dataclasses.replace(shapes, micro_batch_rows=micro), mesh, backend=backend
    )
    fits = hbm_bytes is None or p.peak <= hbm_bytes
    layout = Layout(mesh, micro, p, fits, tuple(candidates))
    if fits:
      return layout
  return layout
