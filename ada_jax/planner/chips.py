"""Accelerator chips as the planner sees them: memory, peak bf16 FLOP/s, bandwidth.

One JAX device per chip (v4 and v5p megacores are one device of two
TensorCores; one GPU is one device). From the vendors' public specification
pages:

  v4:   https://cloud.google.com/tpu/docs/v4   275 TFLOP/s bf16, 32 GiB HBM2,
        1200 GB/s
  v5p:  https://cloud.google.com/tpu/docs/v5p  459 TFLOP/s bf16, 95 GB HBM2e,
        2765 GB/s
  v5e:  https://cloud.google.com/tpu/docs/v5e  197 TFLOP/s bf16, 16 GB HBM2,
        819 GB/s
  v6e:  https://cloud.google.com/tpu/docs/v6e  918 TFLOP/s bf16, 32 GB HBM,
        1638 GB/s
  h100: https://www.nvidia.com/en-us/data-center/h100/ (H100 SXM): BF16
        Tensor Core 1,979 TFLOP/s with sparsity, so 989 dense; 80 GB HBM3
        (81,559 MiB as the driver reports it); 3.35 TB/s
  h200: https://www.nvidia.com/en-us/data-center/h200/ (H200 SXM): BF16
        Tensor Core 1,979 TFLOP/s with sparsity, so 989 dense; 141 GB HBM3e
        (143,771 MiB as the driver reports it); 4.8 TB/s

HBM is kept in GiB as the memory plan has always counted it (95 for v5p).
A TPU's whole HBM is the plan's budget. On a GPU, JAX's allocator takes a
fraction of it up front (`XLA_PYTHON_CLIENT_MEM_FRACTION`, default 0.75)
and that fraction is all a program can use: `allocatable_gib` is the
budget there. Peaks are what a chip can do at best: a roofline built on
them is a lower bound on time.
"""

from __future__ import annotations

import dataclasses
import os

# XLA's GPU client preallocates this fraction of the device's memory
# (jax docs, "GPU memory allocation"); the plan's budget on a GPU.
GPU_MEM_FRACTION_DEFAULT = 0.75
GPU_MEM_FRACTION_ENV = 'XLA_PYTHON_CLIENT_MEM_FRACTION'


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip (one JAX device)."""

  name: str
  hbm_gib: float
  bf16_flops: float  # Peak dense bf16 FLOP/s.
  hbm_bytes_per_s: float
  platform: str = 'tpu'  # infra.platforms name.
  # Substrings of `jax.Device.device_kind` naming this chip.
  device_kinds: tuple[str, ...] = ()


CHIPS: dict[str, Chip] = {
  'v4': Chip('v4', 32.0, 275e12, 1200e9, device_kinds=('TPU v4',)),
  'v5p': Chip('v5p', 95.0, 459e12, 2765e9, device_kinds=('TPU v5p', 'TPU v5')),
  'v5e': Chip('v5e', 16.0, 197e12, 819e9, device_kinds=('TPU v5 lite', 'TPU v5e')),
  'v6e': Chip('v6e', 32.0, 918e12, 1638e9, device_kinds=('TPU v6 lite', 'TPU v6e')),
  'h100': Chip(
    'h100', 81559 / 1024, 989e12, 3.35e12, platform='gpu', device_kinds=('H100',)
  ),
  'h200': Chip(
    'h200', 143771 / 1024, 989e12, 4.8e12, platform='gpu', device_kinds=('H200',)
  ),
}
# Per JAX device, for the memory plan (kept for its callers).
CHIP_HBM_GIB: dict[str, float] = {k: c.hbm_gib for k, c in CHIPS.items()}


def gpu_mem_fraction(environ: dict[str, str] | None = None) -> float:
  """The fraction of a GPU's memory JAX may allocate (env var or default).

  Raises:
    ValueError: naming the variable when its value is not in (0, 1].
  """
  env = os.environ if environ is None else environ
  raw = env.get(GPU_MEM_FRACTION_ENV, '')
  if not raw:
    return GPU_MEM_FRACTION_DEFAULT
  try:
    value = float(raw)
  except ValueError:
    value = -1.0
  if not 0 < value <= 1:
    raise ValueError(f'{GPU_MEM_FRACTION_ENV}={raw!r}: a fraction in (0, 1]')
  return value


def allocatable_gib(chip: Chip, environ: dict[str, str] | None = None) -> float:
  """What a program may use on one chip: all HBM on TPU, the JAX fraction on GPU."""
  if chip.platform == 'gpu':
    return chip.hbm_gib * gpu_mem_fraction(environ)
  return chip.hbm_gib


def by_device_kind(kind: str) -> Chip | None:
  """The chip whose device_kinds names `kind` (jax.Device.device_kind), or None.

  The longest matching name wins ('TPU v5 lite' is a v5e, not a v5p).
  """
  best, best_len = None, 0
  for chip in CHIPS.values():
    for name in chip.device_kinds:
      if name.lower() in kind.lower() and len(name) > best_len:
        best, best_len = chip, len(name)
  return best
