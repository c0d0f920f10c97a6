"""TPU pods by accelerator type, and their real devices without a chip.

A pod is named as Cloud TPU names it (`v4-32`, `v5p-64`, `v5litepod-16` or
`v5e-16`, `v6e-64`). `pod(name)` gives its generation, chips (= JAX
devices: a v4 or v5p chip is one megacore device of two TensorCores, and its
name counts cores), physical topology and hosts. `devices(pod)` gives the
pod's real TPU device objects (`process_index`, `coords`) from libtpu's
topology description (`jax.experimental.topologies`), which needs
`pip install libtpu` (the version `jax[tpu]` pins) but no chip: meshes and
per-host feeding are checked against them, and the TPU compiler compiles
programs for them ahead of time on a CPU host (`python -m ada_jax.plan
--check --target tpu`).

Topologies, as Cloud TPU lays them out: a 3-D torus for v4 and v5p
(2x2x1 = 4 chips, one host, then doubling the last of the smallest axes:
2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8, ...), a 2-D grid for v5e and v6e (1x1,
2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16). Hosts hold 4 chips (2x2x1), except
the single-host v5e-8 / v6e-8 (all 8 chips on one host) and v5e-1.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import math
import os
import re

# Accelerator-type prefixes -> generation; chips per core count in the name.
_PREFIXES = {'v4': 'v4', 'v5p': 'v5p', 'v5e': 'v5e', 'v5litepod': 'v5e', 'v6e': 'v6e'}
_CORES_PER_CHIP = {'v4': 2, 'v5p': 2, 'v5e': 1, 'v6e': 1}
_DIMS = {'v4': 3, 'v5p': 3, 'v5e': 2, 'v6e': 2}
# libtpu's topology names use these generation strings.
_LIBTPU_NAME = {'v4': 'v4', 'v5p': 'v5p', 'v5e': 'v5e', 'v6e': 'v6e'}
# The largest slices Cloud TPU offers (chips).
_MAX_CHIPS = {'v4': 4096, 'v5p': 8960, 'v5e': 256, 'v6e': 256}
LIBTPU_HINT = (
  "pip install 'libtpu==0.0.42.*' (the version jax[tpu] 0.10.2 pins; Linux "
  'x86_64 only); it needs no TPU chip'
)


@dataclasses.dataclass(frozen=True)
class Pod:
  """One TPU slice: `v5p-64` is 32 chips, topology 2x4x4, 8 hosts of 4."""

  accelerator: str  # As given, e.g. 'v5litepod-16'.
  generation: str  # 'v4' | 'v5p' | 'v5e' | 'v6e' (planner/chips.py keys).
  chips: int  # JAX devices.
  shape: tuple[int, ...]  # Chips per physical axis.
  chips_per_host: tuple[int, int, int]

  @property
  def topology(self) -> str:
    """Libtpu's topology name, e.g. 'v5p:2x4x4'."""
    return f'{_LIBTPU_NAME[self.generation]}:{"x".join(map(str, self.shape))}'

  @property
  def hosts(self) -> int:
    return self.chips // math.prod(self.chips_per_host)

  @property
  def chips_per_host_count(self) -> int:
    return math.prod(self.chips_per_host)


def _shape(chips: int, dims: int) -> tuple[int, ...]:
  """The physical layout of `chips` (module docstring)."""
  if chips == 1:
    return (1,) * dims
  shape = [2, 2, 1] if dims == 3 else [2, 2]
  while math.prod(shape) < chips:
    smallest = min(shape)
    last = max(i for i, s in enumerate(shape) if s == smallest)
    shape[last] *= 2
  return tuple(shape)


def pod(accelerator: str) -> Pod:
  """The pod of an accelerator type, e.g. 'v5p-64' (64 cores = 32 chips).

  Raises:
    ValueError: one line naming the type, when it is not a slice Cloud TPU
      offers for v4, v5p, v5e (v5litepod) or v6e.
  """
  m = re.fullmatch(r'(v\d+[a-z]*)-(\d+)', accelerator.strip())
  gen = _PREFIXES.get(m.group(1)) if m else None
  if gen is None:
    raise ValueError(
      f'unknown TPU accelerator type {accelerator!r}: use v4-N, v5p-N, v5litepod-N '
      '(or v5e-N) or v6e-N, e.g. v4-32, v5p-64, v5litepod-16, v6e-64'
    )
  count = int(m.group(2))
  cores = _CORES_PER_CHIP[gen]
  chips = count // cores
  ok = count % cores == 0 and chips >= 1 and chips & (chips - 1) == 0
  ok = ok and chips <= _MAX_CHIPS[gen] and (chips >= 4 or gen in ('v5e', 'v6e'))
  ok = ok and chips != 2
  if not ok:
    what = 'TensorCores (2 per chip)' if cores == 2 else 'chips'
    least = 4 * cores if gen in ('v4', 'v5p') else 1
    raise ValueError(
      f'TPU accelerator type {accelerator!r} is not a {gen} slice: its number '
      f'counts {what}, a power of two from {least} to {_MAX_CHIPS[gen] * cores}'
      + ('' if least > 1 else ' other than 2')
    )
  if chips <= 8 and gen in ('v5e', 'v6e'):
    per_host = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}[chips]
  else:
    per_host = (2, 2, 1)
  return Pod(accelerator.strip(), gen, chips, _shape(chips, _DIMS[gen]), per_host)


def chips_attached() -> bool:
  """Whether this host has TPU chips (a TPU VM's device files), without jax."""
  return bool(glob.glob('/dev/accel*') or glob.glob('/dev/vfio/[0-9]*'))


def _quiet_libtpu(p: Pod) -> None:
  """Off a TPU VM libtpu looks for the VM's metadata and complains; say it.

  Also lets several processes load libtpu (no chip to share).

  Only sets variables the environment leaves unset, so a TPU VM's own
  values stand.
  """
  os.environ.setdefault('TPU_ACCELERATOR_TYPE', p.accelerator)
  os.environ.setdefault('TPU_WORKER_HOSTNAMES', 'localhost')
  os.environ.setdefault('TPU_SKIP_MDS_QUERY', '1')
  # Without chips nothing is shared between processes that load libtpu: two
  # compiles at once (pytest -n 2, a plan beside a benchmark) are fine, and
  # libtpu's one-process lock file would refuse the second.
  os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')


@functools.cache
def devices(p: Pod) -> tuple:
  """The pod's TPU devices from libtpu's topology description (no chip needed).

  Raises:
    RuntimeError: one line naming how to install libtpu when it is missing.
  """
  try:
    import libtpu  # noqa: F401
  except ImportError:
    raise RuntimeError(
      f'compiling for TPU {p.accelerator} needs libtpu: {LIBTPU_HINT}'
    ) from None
  from jax.experimental import topologies

  _quiet_libtpu(p)
  kw = {}
  if p.generation == 'v4':
    kw['chip_config_name'] = 'megacore'  # One device per chip, as on a pod.
  if p.chips_per_host != (2, 2, 1):
    kw['chips_per_host_bounds'] = list(p.chips_per_host)
  desc = topologies.get_topology_desc(p.topology, 'tpu', **kw)
  devs = tuple(desc.devices)
  if len(devs) != p.chips:
    raise RuntimeError(
      f'libtpu gave {len(devs)} devices for {p.accelerator} ({p.topology}); '
      f'expected {p.chips}'
    )
  return devs
