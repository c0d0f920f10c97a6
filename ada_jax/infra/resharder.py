"""The per-step reshard from the training layout to the sampling layout, checked.

The params live in the training layout (EMBED on fsdp, heads/MLP/vocab on
tensor). Before the rounds of a step they are copied into the sampling
layout (replicated over data and fsdp, tensor only) by one jitted identity
with `out_shardings` (`Resharder`). A weight sync that silently scrambles
shards makes "coherent garbage" samples with no error, so every reshard is
checked: a bit-exact checksum (`infra.checksum`) of the source, computed in
the copy's own jit, and one of the copy's output buffers, computed after it,
must match; it is logged at INFO and a mismatch raises.

The copy can also cast (`Resharder(mesh, rules, dtype=jnp.bfloat16)`): the
sampling copy is then held in the compute dtype. With fp32 master params and
bf16 compute, an fp32 copy makes XLA hoist a bf16 convert of every weight
out of the decode loop (the model casts each weight at its use), so a round
would hold the fp32 copy and a bf16 one; a bf16 copy is the only one. Only
leaves of two or more dimensions are cast (the weight matrices, the
embeddings, 2-D biases), which the model always casts to the compute dtype
before use, so the forward's values do not change; 1-D leaves (RMSNorm
scales, applied in fp32, and 1-D biases) keep their dtype: a few KiB. The
checksum then covers the cast values: the source side is the checksum of
the cast, in the source layout, taken in the same jit as the copy.

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
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from ada_jax.infra import checksum
from ada_jax.infra import mesh as mesh_lib

# The copy's side of the check, on its output buffers (a second call, so the
# compiler cannot take it from the copy's inputs).
_out_checksum = jax.jit(checksum.tree_checksum)


class ReshardError(RuntimeError):
  """The resharded params differ from the training params."""


def casts(x: jax.Array | jax.ShapeDtypeStruct, dtype: Any) -> bool:
  """Whether a reshard to `dtype` casts this leaf (floating, 2 or more dims)."""
  return (
    dtype is not None
    and x.ndim >= 2
    and jnp.issubdtype(x.dtype, jnp.floating)
    and jnp.dtype(x.dtype) != jnp.dtype(dtype)
  )


class Resharder:
  """Params from their (training) layout into `rules`' layout, one jitted call.

  The output shardings are derived on the first call and the jitted copy is
  reused, so a run compiles it (and its checksum) once.

  Args:
    mesh: the mesh of the params.
    rules: logical axis -> mesh axis of the target layout.
    dtype: cast the floating leaves of 2+ dims to this dtype in the same copy
      (the model's compute dtype; see `casts`); None keeps every dtype.
    check: compare the source's checksum with the copy's, raise on a mismatch.
    name: the target layout's name, for the log line and the error.
  """

  def __init__(
    self,
    mesh: Mesh,
    rules: Mapping[str, str | None],
    *,
    dtype: Any = None,
    check: bool = True,
    name: str = 'sampling',
  ):
    self.mesh, self.rules, self.check, self.name = mesh, rules, check, name
    self.dtype = None if dtype is None else jnp.dtype(dtype)
    self._copy = None
    self._label = ''  # ' (cast to bfloat16)' when the copy casts any leaf.

  def _build(self, state: nnx.State):
    shardings = mesh_lib.state_shardings(state, self.mesh, self.rules)
    dtype = self.dtype

    def cast(x):
      return x.astype(dtype) if casts(x, dtype) else x

    source = jax.tree.map(lambda x: x.sharding, state)

    def copy(s):
      # The cast runs in the source layout (the reshard then moves the
      # narrower values), and the source checksum is summed there, pinned to
      # the source shardings, not from the copy's output.
      cast_src = jax.lax.with_sharding_constraint(jax.tree.map(cast, s), source)
      source_sum = checksum.tree_checksum(cast_src) if self.check else None
      return cast_src, source_sum

    return jax.jit(copy, out_shardings=(shardings, None))

  def lower(self, state: nnx.State) -> Any:
    """The copy's program lowered for `state` (abstract leaves will do).

    What `__call__` runs, for the planner's compiled check (`plan.compile_reshard`).
    """
    return self._build(state).lower(state)

  def __call__(self, state: nnx.State) -> nnx.State:
    """The same values in the target layout (cast to `dtype`, if given).

    Raises:
      ReshardError: the copy's checksum differs from the source's.
    """
    if self._copy is None:
      self._copy = self._build(state)
      if any(casts(x, self.dtype) for x in jax.tree.leaves(state)):
        self._label = f' (cast to {self.dtype.name})'
    out, source_sum = self._copy(state)
    if self.check:
      before, after = (int(x) for x in jax.device_get((source_sum, _out_checksum(out))))
      cast = self._label
      if before != after:
        raise ReshardError(
          f'resharded params to {self.name} layout{cast}: checksum {before:08x} '
          f'!= {after:08x}; the copy is corrupt'
        )
      logging.info(
        'resharded params to %s layout%s: checksum %08x == %08x',
        self.name,
        cast,
        before,
        after,
      )
    return out
