"""The Reinforce-Ada controller: elimination rounds over fixed sampling slots.

Owns which prompt fills which sampling slot of each round, when a prompt
exits, which samples become training rows and their advantages: the rules
(GRPO, Reinforce-Ada-pos/balance, DAPO filtering, Est) in `rules`, the
round loops in `rounds`, the slot layouts of the paper and refill schedules
in `schedule`, and `sample_groups` with a run's settings
(`ControllerSettings`, checked once) in `controller`. Pure numpy and
deterministic for a given draw: the device side only ever sees fixed-shape
slot batches.

May import: nothing of ada_jax outside this package, and never JAX.

Public API: `sample_groups`, `ControllerSettings`, `Groups`, `max_rows`,
`RULES`, `SCHEDULES`, `ADVANTAGES`.
"""

from ada_jax.adaptive.controller import (
  ADVANTAGES,
  RULES,
  SCHEDULES,
  ControllerSettings,
  Groups,
  max_rows,
  sample_groups,
  slot_group,
)

__all__ = [
  'ADVANTAGES',
  'RULES',
  'SCHEDULES',
  'ControllerSettings',
  'Groups',
  'max_rows',
  'sample_groups',
  'slot_group',
]
