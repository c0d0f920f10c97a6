"""Minimal safetensors reader/writer over numpy memory maps.

Why our own: the checkpoint loader must read one tensor at a time without
ever materialising a whole file (host memory stays near one tensor), and must
read bf16 tensors, which the numpy backend of the `safetensors` package does
not map lazily. The format is a u64 header length, a JSON header
{name: {dtype, shape, data_offsets}}, then raw little-endian bytes.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator, Mapping

import ml_dtypes
import numpy as np

_DTYPES: dict[str, np.dtype] = {
  'F64': np.dtype('<f8'),
  'F32': np.dtype('<f4'),
  'F16': np.dtype('<f2'),
  'BF16': np.dtype(ml_dtypes.bfloat16),
  'I64': np.dtype('<i8'),
  'I32': np.dtype('<i4'),
  'I16': np.dtype('<i2'),
  'I8': np.dtype('i1'),
  'U8': np.dtype('u1'),
  'BOOL': np.dtype('?'),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class SafetensorsFile:
  """Lazy, memory-mapped view of one .safetensors file."""

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    if not os.path.exists(self.path):
      raise FileNotFoundError(f'safetensors file not found: {self.path}')
    with open(self.path, 'rb') as f:
      raw = f.read(8)
      if len(raw) != 8:
        raise ValueError(f'{self.path}: not a safetensors file (too short)')
      (n,) = struct.unpack('<Q', raw)
      try:
        header = json.loads(f.read(n))
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f'{self.path}: corrupt safetensors header: {e}') from e
    header.pop('__metadata__', None)
    self._header = header
    self._offset = 8 + n
    self._mmap = None

  def keys(self) -> list[str]:
    return list(self._header)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._header[name]['shape'])

  def get(self, name: str) -> np.ndarray:
    """A read-only memory-mapped array (no copy until you transform it)."""
    info = self._header[name]
    if info['dtype'] not in _DTYPES:
      raise ValueError(
        f'{self.path}: tensor {name} has unsupported dtype {info["dtype"]}'
      )
    if self._mmap is None:
      self._mmap = np.memmap(self.path, dtype=np.uint8, mode='r')
    start, end = info['data_offsets']
    raw = self._mmap[self._offset + start : self._offset + end]
    return raw.view(_DTYPES[info['dtype']]).reshape(info['shape'])


def save_file(
  tensors: Mapping[str, np.ndarray] | Iterator[tuple[str, np.ndarray]],
  path: str | os.PathLike,
  metadata: Mapping[str, str] | None = None,
) -> None:
  """Writes tensors (a mapping, or (name, array) pairs) as one safetensors file."""
  items = list(tensors.items() if isinstance(tensors, Mapping) else tensors)
  header: dict = {'__metadata__': dict(metadata or {'format': 'pt'})}
  offset = 0
  for name, arr in items:
    nbytes = arr.size * arr.dtype.itemsize
    header[name] = {
      'dtype': _NAMES[np.dtype(arr.dtype)],
      'shape': list(arr.shape),
      'data_offsets': [offset, offset + nbytes],
    }
    offset += nbytes
  blob = json.dumps(header, separators=(',', ':')).encode()
  blob += b' ' * (-len(blob) % 8)  # Keep the data 8-byte aligned.
  with open(path, 'wb') as f:
    f.write(struct.pack('<Q', len(blob)))
    f.write(blob)
    for _, arr in items:
      np.ascontiguousarray(arr).tofile(f)
