"""One layout-independent checksum of device arrays, shared by every check.

A position-weighted uint32 sum of each leaf's bit patterns: integer sums
wrap exactly in any reduction order, so any sharding of the same values
gives the same number, and the odd position weights catch shards that land
in the wrong place, which a plain sum would not. Used by the checkpoints
(per leaf, against the values on disk) and by the resharder (the whole tree,
before and after a layout change).

Dimension legend: none (any leaf shape).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def leaf_checksum(x: jax.Array) -> jax.Array:
  """Position-weighted uint32 sum of the bits of `x` (order-independent)."""
  if x.dtype == jnp.bool_:
    words = x.astype(jnp.uint32)
  else:
    unsigned = {1: jnp.uint8, 2: jnp.uint16}.get(x.dtype.itemsize, jnp.uint32)
    words = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)
  words = words.reshape(-1)
  weights = jax.lax.iota(jnp.uint32, words.size) * jnp.uint32(2) + jnp.uint32(1)
  return jnp.sum(words * weights, dtype=jnp.uint32)


# One compiled call for a list of leaves (the checkpoints' per-leaf sums).
checksums_jit = jax.jit(lambda leaves: [leaf_checksum(x) for x in leaves])


def tree_checksum(tree) -> jax.Array:
  """One uint32 for a pytree: leaf checksums weighted by leaf position."""
  leaves = jax.tree.leaves(tree)
  sums = [leaf_checksum(x) * jnp.uint32(2 * i + 1) for i, x in enumerate(leaves)]
  return functools.reduce(jnp.add, sums, jnp.uint32(0))


@jax.jit
def pair_checksums(a, b) -> tuple[jax.Array, jax.Array]:
  """tree_checksum of two pytrees in one call (before and after a copy)."""
  return tree_checksum(a), tree_checksum(b)


def checksum(tree) -> int:
  """Layout-independent uint32 checksum of a pytree of arrays, on the host."""
  return int(jax.device_get(jax.jit(tree_checksum)(tree)))
