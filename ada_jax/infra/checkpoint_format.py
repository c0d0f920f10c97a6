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
from flax import nnx

PyTree = Any
_ARRAY_REF = '__ndarray__'  # reserved key: an array reference inside meta JSON.


# Tree <-> nested dict of path-named leaves.


def _is_var(x: Any) -> bool:
  return isinstance(x, nnx.Variable)


def _key_name(k: Any) -> str:
  for attr in ('key', 'idx', 'name'):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def flat(tree: PyTree) -> tuple[list[tuple[str, ...]], list[Any], Any]:
  """(paths, leaves, treedef); a Variable's path ends at the Variable."""
  with_path = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_var)[0]
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  if len(with_path) != len(leaves):
    raise ValueError('checkpoint: Variables must hold exactly one array each')
  paths = [tuple(_key_name(k) for k in p) for p, _ in with_path]
  return paths, leaves, treedef


def nest(paths: Sequence[tuple[str, ...]], leaves: Sequence[Any]) -> dict:
  """Nested dict {path[0]: {path[1]: ... leaf}}; two leaves on one path raise."""
  out: dict = {}
  for path, leaf in zip(paths, leaves, strict=True):
    node = out
    for k in path[:-1]:
      node = node.setdefault(k, {})
    if path[-1] in node:
      raise ValueError(f'checkpoint: two leaves map to {"/".join(path)}')
    node[path[-1]] = leaf
  return out


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
