"""The per-step reshard from the training layout to the sampling layout, checked.

The params live in the training layout (EMBED on fsdp, heads/MLP/vocab on
tensor). Before the rounds of a step they are copied into the sampling
layout (replicated over data and fsdp, tensor only) by one jitted identity
with `out_shardings` (`Resharder`). A weight sync that silently scrambles
shards makes "coherent garbage" samples with no error, so every reshard is
checked: a bit-exact checksum (`infra.checksum`) of the training params and
of the resharded copy, computed on device in one call, must match; it is
logged at INFO and a mismatch raises.

Why reshard at all: with FSDP-sharded weights the SPMD partitioner either
all-gathers the weights inside the decode loop, once per generated token,
or moves the activations over fsdp at every token; the sampling layout needs
neither. `infra.hlo` reads this off the compiled decode round
(tests/test_layouts.py, benchmarks/reshard.py).

Dimension legend: none (whole param trees).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import jax
from flax import nnx
from jax.sharding import Mesh

from ada_jax.infra import checksum
from ada_jax.infra import mesh as mesh_lib


class ReshardError(RuntimeError):
  """The resharded params differ from the training params."""


class Resharder:
  """Params from their (training) layout into `rules`' layout, one jitted call.

  The output shardings are derived on the first call and the jitted copy is
  reused, so a run compiles it (and its checksum) once.
  """

  def __init__(
    self,
    mesh: Mesh,
    rules: Mapping[str, str | None],
    *,
    check: bool = True,
    name: str = 'sampling',
  ):
    self.mesh, self.rules, self.check, self.name = mesh, rules, check, name
    self._copy = None

  def __call__(self, state: nnx.State) -> nnx.State:
    """The same values in the target layout; raises ReshardError on a mismatch."""
    if self._copy is None:
      shardings = mesh_lib.state_shardings(state, self.mesh, self.rules)
      self._copy = jax.jit(lambda s: s, out_shardings=shardings)
    out = self._copy(state)
    if self.check:
      before, after = (
        int(v) for v in jax.device_get(checksum.pair_checksums(state, out))
      )
      if before != after:
        raise ReshardError(
          f'resharded params to {self.name} layout: checksum {before:08x} != '
          f'{after:08x}; the copy is corrupt'
        )
      logging.info(
        'resharded params to %s layout: checksum %08x == %08x',
        self.name,
        before,
        after,
      )
    return out
