"""TPU chips as the planner sees them: HBM, peak bf16 FLOP/s, HBM bandwidth.

One JAX device per chip (v4 and v5p megacores are one device of two
TensorCores). From the vendor's public specification pages, each chip's
"key specifications" table:

  v4:  https://cloud.google.com/tpu/docs/v4   275 TFLOP/s bf16, 32 GiB HBM2,
       1200 GB/s
  v5p: https://cloud.google.com/tpu/docs/v5p  459 TFLOP/s bf16, 95 GB HBM2e,
       2765 GB/s
  v5e: https://cloud.google.com/tpu/docs/v5e  197 TFLOP/s bf16, 16 GB HBM2,
       819 GB/s
  v6e: https://cloud.google.com/tpu/docs/v6e  918 TFLOP/s bf16, 32 GB HBM,
       1638 GB/s

HBM is kept in GiB as the memory plan has always counted it (95 for v5p;
the issue's 15%-free target is 80.75 GiB of it). Peaks are what a chip can
do at best: a roofline built on them is a lower bound on time.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
  """One accelerator chip (one JAX device)."""

  name: str
  hbm_gib: float
  bf16_flops: float  # Peak dense bf16 FLOP/s.
  hbm_bytes_per_s: float


CHIPS: dict[str, Chip] = {
  'v4': Chip('v4', 32.0, 275e12, 1200e9),
  'v5p': Chip('v5p', 95.0, 459e12, 2765e9),
  'v5e': Chip('v5e', 16.0, 197e12, 819e9),
  'v6e': Chip('v6e', 32.0, 918e12, 1638e9),
}
# Per JAX device, for the memory plan (kept for its callers).
CHIP_HBM_GIB: dict[str, float] = {k: c.hbm_gib for k, c in CHIPS.items()}
