"""The mesh and micro-batch of a run: one rule, from the memory plan.

A config may leave three layout keys to this rule (0 means "by the rule"):

- `mesh.tensor = 0`: the smallest tensor axis that divides the KV heads
  (and the device count) whose plan fits the devices' memory, the rest of
  the devices on fsdp (data as the config says). The sampling layout splits
  KV heads over tensor only when they divide; a larger tensor axis shrinks
  the sampling copy of the weights and the gathered prompt cache but costs
  a collective per layer per token, so the smallest that fits wins. With no
  memory figure (a CPU host) it is the smallest divisor, 1.
- `rl.micro_batch_rows = 0`: one row per batch shard, data x fsdp (capped
  at the mini-batch): every device computes one row per micro-batch.
- `sampling.waves = 0`: one wave (each round's S slots at once) where a
  tensor axis fits; else the fewest slot waves, 2, 4 or 8, at the smallest
  tensor axis whose plan leaves HEADROOM of the memory free, else the
  fewest that fit at all. Waves keep the step (B, n, M, rounds, S, R) as
  it is and shrink the round's KV cache W-fold, at W decode loops per
  round (each reads the weights per token: sampling takes longer), so
  they come after the tensor axis, which costs only a collective per layer
  per token. A wave's S/W slots split over the batch shards and into whole
  prompt groups (`slot_group`).

The `tpu=` presets of every config use both, so any pod size gets a mesh,
and a pod where nothing fits is refused with the plan's line (`Layout.fits`
False; the caller prints it). `gpu=` presets reuse the same rule.

Dimension legend: none (shapes are the planner's; see planner/memory.py).
"""

from __future__ import annotations

import dataclasses
import math

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
    waves: slot waves per round (`StepShapes.waves`).
  """

  mesh: tuple[int, int, int]
  micro_batch_rows: int
  plan: memory_plan.Plan
  fits: bool
  tried: tuple[int, ...]
  waves: int = 1


# Free memory the rule keeps when it resorts to slot waves: XLA's buffer
# assignment on TPU differs from the plan by up to ~20% per program
# (planner/memory.py), so a plan at 99% of HBM is a gamble.
HEADROOM = 0.10
MAX_WAVES = 8


def wave_options(shapes: memory_plan.StepShapes, dp: int) -> list[int]:
  """Wave counts a round of S slots can take on dp batch shards (1 first)."""
  return [
    w
    for w in (1, 2, 4, MAX_WAVES)
    if shapes.slots % w == 0
    and (shapes.slots // w) % dp == 0
    and (shapes.slots // w) % max(shapes.slot_group, 1) == 0
  ] or [1]


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
  waves: int = 0,
  backend: str = 'tpu',
) -> Layout:
  """The layout of a config on `devices` devices of `hbm_bytes` each.

  Args:
    config: the policy.
    shapes: the step; `micro_batch_rows` 0 means by the rule (its `waves`
      is ignored: see `waves`).
    devices: JAX devices (chips).
    hbm_bytes: memory per device (None: unknown, nothing is refused).
    data: the data axis (-1: what tensor leaves, fsdp then 1).
    fsdp: the fsdp axis (-1: what data and tensor leave).
    tensor: the tensor axis; 0: by the rule.
    waves: slot waves per round; 0: by the rule (the module docstring).
    backend: the target platform the plan assumes.
  """
  if tensor:
    candidates = [tensor]
  else:
    candidates = tensor_candidates(config, devices, max(data, 1)) or [1]

  def mesh_at(t: int) -> tuple[int, int, int]:
    return memory_plan.resolve_mesh({'data': data, 'fsdp': fsdp, 'tensor': t}, devices)

  def at(t: int, w: int) -> Layout:
    mesh = mesh_at(t)
    micro = shapes.micro_batch_rows or micro_rows(
      shapes.mini_batch_rows, mesh[0] * mesh[1]
    )
    s = dataclasses.replace(shapes, micro_batch_rows=micro, waves=w)
    p = memory_plan.plan(config, s, mesh, backend=backend)
    fits = hbm_bytes is None or p.peak <= hbm_bytes
    return Layout(mesh, micro, p, fits, tuple(candidates), w)

  if waves:
    order = [(t, waves) for t in candidates]
  else:
    # One wave at the smallest tensor axis that fits; then by fewest waves.
    order = sorted(
      (
        (t, w)
        for t in candidates
        for w in wave_options(shapes, math.prod(mesh_at(t)[:2]))
      ),
      key=lambda tw: (tw[1] > 1, tw[1], tw[0]),
    )
  layout = None
  fallback = None
  for t, w in order:
    layout = at(t, w)
    if not layout.fits:
      continue
    roomy = hbm_bytes is None or layout.plan.peak <= (1 - HEADROOM) * hbm_bytes
    if w == 1 or waves or roomy:
      return layout
    fallback = fallback or layout
  return fallback or layout
