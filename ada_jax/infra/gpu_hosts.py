"""GPU machines by preset name: `8xh100` is eight H100s on one host.

A preset names the total GPU count and the chip, `NxCHIP` (`1xh100`,
`8xh100`, `8xh200`, `16xh100`), CHIP one of GPU_CHIPS: the GPU entries of
`planner.chips` (platform 'gpu'; infra sits below the planner, so the
names are listed here and tests/test_gpu_plan.py keeps the two in step).
One GPU is one JAX device. Hosts hold GPUS_PER_HOST GPUs, as the paper's
8xH100 node (and every DGX/HGX H100 or H200 node) does: N up to 8 is one
host of N (1, 2, 4 or 8), beyond that N is whole hosts of 8 (hosts =
N / 8). The host count sizes what is per host in the plan (checkpoint
writes: each host writes its share).

Unlike a TPU slice (`infra/tpu_pods.py`) there is no topology to compile
against: the plan's memory figure per GPU is what JAX may allocate on it
(`planner.chips.allocatable_gib`: HBM x XLA_PYTHON_CLIENT_MEM_FRACTION, or
its default 0.75).
"""

from __future__ import annotations

import dataclasses
import re

GPUS_PER_HOST = 8
# planner.chips' keys of platform 'gpu'.
GPU_CHIPS = ('h100', 'h200')
# A preset larger than this is a typo, not a machine anyone plans for here.
MAX_GPUS = 4096


@dataclasses.dataclass(frozen=True)
class GpuHosts:
  """N GPUs of one kind: `8xh100` is one host of 8 H100s."""

  name: str  # As given, normalized: '8xh100'.
  chip: str  # A planner.chips key with platform 'gpu'.
  gpus: int  # JAX devices.

  @property
  def gpus_per_host(self) -> int:
    return min(self.gpus, GPUS_PER_HOST)

  @property
  def hosts(self) -> int:
    return self.gpus // self.gpus_per_host


def hosts(spec: str) -> GpuHosts:
  """The GPUs of a preset name, e.g. '8xh100'.

  Raises:
    ValueError: one line naming the preset, when it is not NxCHIP with a
      known GPU chip and N of 1, 2, 4 or a multiple of 8 (whole hosts).
  """
  known = GPU_CHIPS
  m = re.fullmatch(r'(\d+)x([a-z0-9]+)', spec.strip().lower())
  if m is None:
    raise ValueError(
      f'GPU preset {spec!r} is not NxCHIP (N GPUs in all, CHIP one of {known}), '
      'e.g. 8xh100'
    )
  count, chip = int(m.group(1)), m.group(2)
  if chip not in known:
    raise ValueError(f'GPU preset {spec!r}: unknown GPU {chip!r}; known: {known}')
  whole = count % GPUS_PER_HOST == 0
  if not (count in (1, 2, 4) or whole) or not 1 <= count <= MAX_GPUS:
    raise ValueError(
      f'GPU preset {spec!r}: {count} GPUs is not 1, 2, 4 or a multiple of '
      f'{GPUS_PER_HOST} (whole hosts of {GPUS_PER_HOST}) up to {MAX_GPUS}'
    )
  return GpuHosts(f'{count}x{chip}', chip, count)
