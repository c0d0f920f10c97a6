"""How long a checkpoint write takes on a pod, and the preemption notice.

A checkpoint holds the training state: the params in their own dtype (fp32
master) and AdamW's two moments of the same shape and dtype, three copies
of every weight (7B: 7.6e9 x 4 B x 3 = 91 GB). Each host writes the shards
its chips own (orbax / tensorstore, one replica of each shard), so a pod of
H hosts writes 1/H of it per host, in parallel, at the host's storage write
bandwidth: `write_seconds`. The bandwidth is an assumption (printed by the
plan, overridable there with `--write-gbps`), not a measurement: a TPU VM
host writing to Cloud Storage in a region of its own zone sustains on the
order of 1 GB/s with parallel uploads; a slower bucket or a busy network
gives less.

The notice a preempted VM gets: Compute Engine sends a preemption notice
(ACPI G2 soft off, SIGTERM to the job) and stops the VM 30 s later
(https://cloud.google.com/compute/docs/instances/spot, "Preemption
process"); TPU Spot VMs are preempted the same way. A SIGTERM save that
cannot finish inside it loses the write and costs the notice.

Used by `python -m ada_jax.plan` (time and cost of a run) and by the trainer's
SIGTERM rule (`rl.fit`): save at once if the write fits the notice.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from ada_jax import model as model_lib

# Seconds between the preemption notice and the VM's stop (see above).
PREEMPTION_NOTICE_S = 30.0
# Assumed per-host write bandwidth to the run's storage, GB/s (1e9 bytes).
WRITE_GBPS = 1.0
# AdamW: mu and nu, each the params' shape and dtype.
OPTIMIZER_COPIES = 2


def checkpoint_bytes(c: model_lib.ModelConfig) -> int:
  """Bytes of one checkpoint of the whole pod: params + AdamW moments."""
  from ada_jax.planner import memory

  per_copy = memory.count_params(c) * jnp.dtype(c.param_dtype).itemsize
  return per_copy * (1 + OPTIMIZER_COPIES)


@dataclasses.dataclass(frozen=True)
class WriteTime:
  """One checkpoint write of a run on a pod, by the assumptions above."""

  total_bytes: int
  hosts: int
  gbps: float  # Per host.
  notice_s: float

  @property
  def per_host_bytes(self) -> float:
    return self.total_bytes / max(self.hosts, 1)

  @property
  def seconds(self) -> float:
    return self.per_host_bytes / (self.gbps * 1e9)

  @property
  def margin_s(self) -> float:
    """Seconds left of the notice after the write (negative: it does not fit)."""
    return self.notice_s - self.seconds

  @property
  def fits_notice(self) -> bool:
    return self.margin_s >= 0

  def line(self) -> str:
    """One line for the plan and the logs."""
    verdict = 'fits' if self.fits_notice else 'does NOT fit'
    return (
      f'checkpoint {self.total_bytes / 1e9:.1f} GB ({self.per_host_bytes / 1e9:.1f} '
      f'GB per host x {self.hosts}) at an assumed {self.gbps:g} GB/s per host: '
      f'{self.seconds:.1f} s; {verdict} the {self.notice_s:g} s preemption notice '
      f'(margin {self.margin_s:+.1f} s)'
    )


def write_seconds(
  c: model_lib.ModelConfig,
  hosts: int,
  gbps: float = WRITE_GBPS,
  notice_s: float = PREEMPTION_NOTICE_S,
) -> WriteTime:
  """The checkpoint write of model `c` on `hosts` hosts at `gbps` per host."""
  if gbps <= 0:
    raise ValueError(f'write bandwidth must be positive, got {gbps} GB/s')
  return WriteTime(checkpoint_bytes(c), int(hosts), float(gbps), float(notice_s))
