"""On-disk form of a checkpoint step: path-named leaves, checksums, JSON extras.

Used by `checkpoint.py`. Params and optimizer state are stored as nested
dicts keyed by tree path (an nnx Variable's path ends at the Variable), so a
restore lands in any abstract pytree with the same paths. Each leaf gets a
position-weighted uint32 sum of its bits, computed on device: wrap-around
integer sums are exact in any reduction order, so every target sharding
reproduces it. Host extras are JSON with their numpy arrays (and PRNG keys)
pulled out into a separate item, referenced by name.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx

PyTree = Any
_ARRAY_REF = '__ndarray__'  # reserved key: an array reference inside meta JSON.


# Tree <-> path-named leaves, named as orbax names its own keys.


def _is_var(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def flat(tree: PyTree) -> tuple[dict[tuple[str, ...], Any], Any]:
  """({path: leaf} in tree order, treedef); a Variable's path ends at it.

  Path names are orbax's (`ocp.tree.to_flat_dict`: dict keys and attribute
  names as str, sequence indices as digits), so `ocp.tree.from_flat_dict`
  nests them into the dict that orbax writes, and reads back, as is.
  """
  paths = ocp.tree.to_flat_dict(tree, is_leaf=_is_var)
  leaves, treedef = jax.tree.flatten(tree)
  # A Variable holding other than one array, or two leaves on one path (keys
  # 0 and '0', which the dict merged), would pair paths with the wrong leaves.
  if not len(paths) == len(jax.tree.leaves(tree, is_leaf=_is_var)) == len(leaves):
    raise ValueError('checkpoint: each Variable must hold one array, on a unique path')
  return dict(zip(paths, leaves, strict=True)), treedef


# Checksums.


def leaf_signature(leaves: Sequence[Any]) -> tuple:
  """(shape, dtype, sharding) of each leaf: the key of a compiled checksum."""
  return tuple((x.shape, np.dtype(x.dtype).name, x.sharding) for x in leaves)


def host_checksum(x: np.ndarray) -> int:
  """CRC32 of a host array (the extras arrays)."""
  return zlib.crc32(np.ascontiguousarray(x).tobytes())


# Extras: JSON with numpy arrays pulled out.


def encode_extras(
  obj: Any, path: tuple[str, ...], arrays: dict[str, np.ndarray]
) -> Any:
  """JSON-able copy of `obj`; its arrays go to `arrays`, named by their path."""
  if isinstance(obj, Mapping):
    for k in obj:
      if not isinstance(k, str):
        raise TypeError(f'extras: key {k!r} at {"/".join(path)} is not a str')
    return {k: encode_extras(v, (*path, k), arrays) for k, v in obj.items()}
  if isinstance(obj, list | tuple):
    return [encode_extras(v, (*path, str(i)), arrays) for i, v in enumerate(obj)]
  if isinstance(obj, np.generic):
    return obj.item()
  if isinstance(obj, np.ndarray | jax.Array):
    ref: dict[str, Any] = {}
    if jnp.issubdtype(obj.dtype, jax.dtypes.prng_key):
      ref['key_impl'] = str(jax.random.key_impl(obj))
      obj = jax.random.key_data(obj)
    arr = np.asarray(jax.device_get(obj))
    if arr.dtype.kind not in 'biuf':
      raise TypeError(f'extras: array at {"/".join(path)} has dtype {arr.dtype}')
    name = re.sub(r'[^A-Za-z0-9_-]', '_', '.'.join(path)) or 'root'
    while name in arrays:
      name += '_'
    arrays[name] = arr
    ref[_ARRAY_REF] = name
    return ref
  if obj is None or isinstance(obj, bool | int | float | str):
    return obj
  raise TypeError(f'extras: {type(obj).__name__} at {"/".join(path)} is not JSON-able')


def decode_extras(obj: Any, arrays: Mapping[str, np.ndarray]) -> Any:
  """Inverse of `encode_extras`: array references replaced by the arrays."""
  if isinstance(obj, dict):
    if _ARRAY_REF in obj:
      arr = np.asarray(arrays[obj[_ARRAY_REF]])
      if 'key_impl' in obj:
        return jax.random.wrap_key_data(arr, impl=obj['key_impl'])
      return arr
    return {k: decode_extras(v, arrays) for k, v in obj.items()}
  if isinstance(obj, list):
    return [decode_extras(v, arrays) for v in obj]
  return obj
