"""The device mesh, and shardings from logical axes through a rule table.

One mesh with axes ('data', 'fsdp', 'tensor'). Arrays carry logical axis
names (the model's params do: model.py); a rule table, given by the caller
(the policy's training and sampling layouts are `ada_jax.sharding`'s
TRAIN_RULES and SAMPLE_RULES), maps each logical name to a mesh axis.

A dimension that does not divide by its mesh axis size (Qwen2.5-Math-1.5B has
2 KV heads; a tensor axis of 4) is replicated on that axis, with one log line.
Batches (rows, sampling slots) are split over ('data', 'fsdp').

Dimension legend: B rows, T tokens.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import jax
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')

_logged: set[tuple] = set()


def make_mesh(
  shape: Sequence[int] | Mapping[str, int] = (-1, 1, 1),
  devices: Sequence[jax.Device] | None = None,
) -> Mesh:
  """Mesh over ('data', 'fsdp', 'tensor'); one entry may be -1 (fills the rest).

  Args:
    shape: sizes per axis, as a 3-sequence or a mapping with those keys.
    devices: defaults to all devices (all hosts).

  Raises:
    ValueError: naming the shape when it does not match the device count.
  """
  if isinstance(shape, Mapping):
    unknown = set(shape) - set(MESH_AXES)
    if unknown:
      raise ValueError(f'mesh: unknown axes {sorted(unknown)}; use {MESH_AXES}')
    shape = [int(shape.get(a, 1)) for a in MESH_AXES]
  shape = [int(s) for s in shape]
  if len(shape) != 3:
    raise ValueError(f'mesh shape {shape} must have 3 entries {MESH_AXES}')
  devices = list(devices if devices is not None else jax.devices())
  n = len(devices)
  if shape.count(-1) > 1:
    raise ValueError(f'mesh shape {shape}: at most one -1')
  if -1 in shape:
    known = math.prod(s for s in shape if s != -1)
    if n % known:
      raise ValueError(f'mesh shape {shape} does not divide {n} devices')
    shape[shape.index(-1)] = n // known
  if math.prod(shape) != n:
    raise ValueError(
      f'mesh shape {dict(zip(MESH_AXES, shape, strict=True))} needs {math.prod(shape)} '
      f'devices, have {n}'
    )
  axis_types = (jax.sharding.AxisType.Auto,) * 3
  # TPU devices are laid out by their physical topology (rings along the
  # torus axes), splitting a physical axis where the shape needs it
  # (`jax.make_mesh` splits only on v5e and refuses e.g. (1, 32, 2) on a
  # v6e 8x8). Other devices keep their order. A host's devices then need not
  # be one contiguous block of the batch axes: hosts feed rows through
  # `multihost.global_rows`, which takes any layout.
  arr = mesh_utils.create_device_mesh(
    tuple(shape), devices, allow_split_physical_axes=True
  )
  return Mesh(arr, MESH_AXES, axis_types=axis_types)


def logical_to_spec(
  axes: Sequence[str | None],
  shape: Sequence[int],
  mesh: Mesh,
  rules: Mapping[str, str | None],
  name: str = '',
) -> PartitionSpec:
  """PartitionSpec for one array from its logical axes; non-dividing dims replicate."""
  spec, used = [], set()
  for logical, dim in zip(axes, shape, strict=True):
    mesh_axis = rules.get(logical) if logical else None
    if mesh_axis is None or mesh_axis in used or mesh.shape[mesh_axis] == 1:
      spec.append(None)
      continue
    if dim % mesh.shape[mesh_axis]:
      key = (logical, dim, mesh_axis, mesh.shape[mesh_axis])
      if key not in _logged:
        _logged.add(key)
        logging.warning(
          'sharding: %s dim %s=%d does not divide mesh axis %s=%d; replicated '
          '(e.g. %s)',
          logical,
          logical,
          dim,
          mesh_axis,
          mesh.shape[mesh_axis],
          name,
        )
      spec.append(None)
      continue
    used.add(mesh_axis)
    spec.append(mesh_axis)
  return PartitionSpec(*spec)


def _is_var(x) -> bool:
  return isinstance(x, nnx.Variable)


def state_shardings(
  state: nnx.State, mesh: Mesh, rules: Mapping[str, str | None]
) -> nnx.State:
  """A State-shaped tree of NamedSharding for (abstract or concrete) params.

  Variables without `axes` metadata (none in our model) are replicated.
  """

  def one(path, var):
    value = var.get_value()
    axes = var.get_metadata().get('axes')
    if axes is None:
      spec = PartitionSpec()
    else:
      name = '/'.join(str(p.key if hasattr(p, 'key') else p) for p in path)
      spec = logical_to_spec(axes, value.shape, mesh, rules, name)
    return var.replace(NamedSharding(mesh, spec))

  return jax.tree_util.tree_map_with_path(one, state, is_leaf=_is_var)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Rows over ('data', 'fsdp'), the other dims replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
  """Fully replicated sharding on `mesh`."""
  return NamedSharding(mesh, PartitionSpec())


def data_parallel_size(mesh: Mesh) -> int:
  """Number of batch shards (data x fsdp)."""
  return mesh.shape['data'] * mesh.shape['fsdp']
