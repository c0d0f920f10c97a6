"""Multi-controller helpers: which rows a host holds, and gathers of host data.

Multi-host runs are plain multi-controller JAX (`jax.distributed`, no
Pathways): every process runs the same program and must issue the same jitted
calls in the same order. Device arrays are global; host values (rewards,
response lengths, verifier counters) differ per process, so any decision
that changes the number of jitted calls (rounds, stopping) is taken from the
gathered, global values, identical on every host.

- `global_rows`: the global array from the whole [B, ...] host array that
  every process holds; each device takes its block, whatever order the
  mesh gives the devices (on a TPU pod a host's rows need not be one
  block). `row_blocks`: which rows a process's devices hold (the plan's
  mesh line); `feed_problem`: whether a process feeds exactly its devices'
  rows (the pod check, and the tests that simulate each host of a pod).
- `local_rows` / `gather_rows`: the rows of a global [S, ...] array this
  process can read, and the [S] values every process computed for its own
  rows merged into one global vector (one collective).
- `sum_over_hosts`, `any_host`, `broadcast_from_main`,
  `broadcast_json_from_main`: small agreements.
- `main_first`: process 0 runs a block (e.g. builds a dataset on a shared
  disk) before the others run it; a failure there fails every process.
- `agree_code`, `agreed`: a decision one process took alone (process 0's
  config checks, run directory, lease, restart, optional imports) becomes
  every process's: each contributes an exit code (0: fine) and all take the
  first nonzero one, so every process exits with the same code and none is
  left waiting in a collective for a process that already left.
- `init_distributed`: joins `jax.distributed` as the environment says
  (`distributed_init_kwargs`: which way, auto-detected or explicit).

With one process every helper is a plain local operation (no collective, no
compile), so single-process runs are unchanged.

Dimension legend: B prompts (batch rows), S sampling slots.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from ada_jax.infra import mesh as mesh_lib


def rows_sharding(mesh: Mesh, rows: int, ndim: int = 2) -> NamedSharding:
  """Rows split over ('data', 'fsdp') when they divide, else replicated."""
  if rows % mesh_lib.data_parallel_size(mesh):
    return mesh_lib.replicated(mesh)
  return mesh_lib.batch_sharding(mesh, ndim)


def global_rows(host: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """The global [rows, ...] array from the whole array, which every process holds.

  Each device takes its block of `host` (`jax.make_array_from_callback`),
  so any mesh order works: on a TPU pod the mesh follows the physical
  topology and a host's devices may hold several separate blocks of rows
  (v5p-64 at (1, 32, 1): process 0 holds rows 0-16, 64-80, 256-272 and
  320-336 of 512). Every process encodes the whole step (it knows the
  global order anyway; a step's prompts are a few hundred strings), which
  is simpler than asking which rows a host holds and cannot feed a row to
  the wrong device. The one path for host rows onto devices.
  """
  host = np.asarray(host)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def row_blocks(
  sharding: NamedSharding, rows: int, process_index: int | None = None
) -> list[tuple[int, int]]:
  """[lo, hi) blocks of rows of a [rows, ...] array a process's devices hold.

  Sorted and merged where they touch; replicas counted once. Computed from
  the devices' `process_index`, so it also answers for the processes of a
  pod described by libtpu's topology (no chip: `infra.tpu_pods`).

  Args:
    sharding: the array's sharding.
    rows: the array's first dimension.
    process_index: which process (default: this one).
  """
  p = jax.process_index() if process_index is None else process_index
  spans = sorted(
    {
      (ix[0].start or 0, rows if ix[0].stop is None else ix[0].stop)
      for d, ix in sharding.devices_indices_map((rows,)).items()
      if d.process_index == p
    }
  )
  merged: list[tuple[int, int]] = []
  for lo, hi in spans:
    if merged and lo <= merged[-1][1]:
      merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
    else:
      merged.append((lo, hi))
  return merged


def feed_problem(
  sharding: NamedSharding, rows: int, process_index: int, live: bool = False
) -> str | None:
  """Why a process would not feed its devices their rows of a [rows] array, or None.

  From the devices' `process_index` alone (so it answers for every process
  of a pod that libtpu describes without a chip): the blocks
  `global_rows` hands this process's devices must be exactly their rows.
  live=True (on the pod itself, this process's own devices): also feeds
  the rows for real and reads them back from the local shards.
  """
  host = np.arange(rows)
  mine = {
    d: ix
    for d, ix in sharding.devices_indices_map((rows,)).items()
    if d.process_index == process_index
  }
  if not mine:
    return f'process {process_index} holds no device of the mesh'
  for d, ix in mine.items():
    want = np.arange(rows)[ix]
    if len(want) == 0 or not np.array_equal(host[ix], want):
      return f'process {process_index}: device {d.id} would get rows {host[ix][:4]}...'
  held = {
    int(i)
    for lo, hi in row_blocks(sharding, rows, process_index)
    for i in range(lo, hi)
  }
  if held != {int(i) for ix in mine.values() for i in host[ix]}:
    return f'process {process_index}: its row blocks disagree with its devices'
  if live:
    idx, got = local_rows(global_rows(host.astype(np.int32), sharding))
    if not np.array_equal(got, host[idx]):
      return f'process {process_index}: rows fed to its devices read back wrong'
  return None


def local_rows(x: jax.Array) -> tuple[np.ndarray, np.ndarray]:
  """(row indices, host values) of the rows of x [S, ...] this process holds.

  Only addressable shards are read, so this works on arrays that span hosts
  (reading one whole would fail); replicas of a shard are read once.
  """
  if x.is_fully_addressable:
    return np.arange(x.shape[0]), np.asarray(x)
  seen: dict[int, np.ndarray] = {}
  for shard in x.addressable_shards:
    start = shard.index[0].start or 0
    if start not in seen:
      seen[start] = np.asarray(shard.data)
  idx = np.concatenate([np.arange(k, k + len(v)) for k, v in sorted(seen.items())])
  return idx, np.concatenate([v for _, v in sorted(seen.items())])


def gather_rows(idx: np.ndarray, local: np.ndarray, size: int) -> np.ndarray:
  """Merges per-host values of rows `idx` into the global float32 [size, ...].

  Every process passes the values it computed for the rows it holds; rows
  held by several processes (replicas) must agree, and any row no process
  sent is NaN. One collective with more than one process (float32 on the
  wire, as JAX runs without x64: integers are exact below 2**24).

  Args:
    idx: int [n] row indices this process holds.
    local: [n, ...] values for those rows.
    size: S, the number of rows.
  """
  local = np.asarray(local, np.float32)
  mine = np.full((size, *local.shape[1:]), np.nan, np.float32)
  mine[idx] = local
  if jax.process_count() == 1:
    return mine
  from jax.experimental import multihost_utils

  have = np.zeros((size,), np.float32)
  have[idx] = 1.0
  gathered = multihost_utils.process_allgather({'have': have, 'values': mine})
  out = np.full_like(mine, np.nan)
  for have_p, values_p in zip(gathered['have'], gathered['values'], strict=True):
    rows = have_p > 0
    out[rows] = values_p[rows]
  return out


def sum_over_hosts(counts: Mapping[str, int]) -> dict[str, int]:
  """Per-key sums of host counters (same keys on every host)."""
  keys = sorted(counts)
  if jax.process_count() == 1 or not keys:
    return {k: int(counts[k]) for k in keys}
  from jax.experimental import multihost_utils

  local = np.asarray([counts[k] for k in keys], np.int32)
  total = np.asarray(multihost_utils.process_allgather(local)).sum(axis=0)
  return {k: int(v) for k, v in zip(keys, total, strict=True)}


def any_host(flag: bool) -> bool:
  """True on every host if `flag` is True on any host."""
  if jax.process_count() == 1:
    return bool(flag)
  from jax.experimental import multihost_utils

  return bool(np.any(multihost_utils.process_allgather(np.asarray([int(flag)]))))


def broadcast_from_main(value: int) -> int:
  """Process 0's integer, on every host (e.g. a decision read from its files)."""
  if jax.process_count() == 1:
    return int(value)
  from jax.experimental import multihost_utils

  return int(multihost_utils.broadcast_one_to_all(np.asarray(value, np.int32)))


@contextlib.contextmanager
def main_first(name: str) -> Iterator[None]:
  """Process 0 runs the block first, the others after it finished.

  For work whose first run writes shared files that later runs only read
  (building a TFDS dataset into a shared data dir): run concurrently, hosts
  would read each other's half-written files. If the block raises on
  process 0, the others raise `AgreedError` instead of waiting for it.
  """
  del name  # The agreement below is the sync point.
  if jax.process_count() == 1:
    yield
    return
  if jax.process_index() != 0:
    # Waits for process 0's block; fails here if it failed there.
    code, process = agree_code(0)
    if code:
      raise AgreedError(code, f'process {process} failed (exit {code}): see its log')
    yield
    return
  try:
    yield
  except BaseException:
    agree_code(1)
    raise
  agree_code(0)


# The explicit path's variables, all three or none.
_EXPLICIT_VARS = ('ADA_COORDINATOR', 'ADA_NUM_PROCESSES', 'ADA_PROCESS_ID')


def _env_int(env: Mapping[str, str], name: str, low: int, high: int | None) -> int:
  """`env[name]` as an integer in [low, high) (no upper bound: None), else one line."""
  text = env[name]
  want = f'an integer >= {low}' if high is None else f'an integer in [{low}, {high})'
  try:
    value = int(text)
  except ValueError:
    raise ValueError(f'{name}={text!r}: expected {want}') from None
  if value < low or (high is not None and value >= high):
    raise ValueError(f'{name}={text!r}: expected {want}')
  return value


def distributed_init_kwargs(
  env: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
  """How this process joins `jax.distributed`, read from the environment.

  An empty variable counts as unset. The explicit variables win over
  ADA_DISTRIBUTED=1 when both are set: they name one cluster exactly, while
  ADA_DISTRIBUTED=1 may be exported job-wide (a batch script's header) and
  auto-detection would then ignore the addresses the launcher chose.

  Args:
    env: the environment (default: `os.environ`).

  Returns:
    None: a single process, no `jax.distributed` (no variable set, or
    ADA_DISTRIBUTED=0). `{}`: `jax.distributed.initialize()` without
    arguments, which detects the cluster (TPU pods, SLURM, Open MPI):
    ADA_DISTRIBUTED=1. `{'coordinator_address', 'num_processes',
    'process_id'}`: explicit, from ADA_COORDINATOR (process 0's HOST:PORT),
    ADA_NUM_PROCESSES and ADA_PROCESS_ID.

  Raises:
    ValueError: one line naming the variable: only some of the explicit
      three set, a value that is not HOST:PORT or not an integer in range,
      or ADA_DISTRIBUTED other than 0 or 1.
  """
  env = os.environ if env is None else env
  given = [k for k in _EXPLICIT_VARS if env.get(k)]
  if given:
    missing = [k for k in _EXPLICIT_VARS if k not in given]
    if missing:
      raise ValueError(
        f'{", ".join(given)} set but {", ".join(missing)} not: the explicit '
        'jax.distributed path needs all three (or none, for ADA_DISTRIBUTED=1)'
      )
    coordinator = env['ADA_COORDINATOR']
    host, _, port = coordinator.rpartition(':')
    # jax.distributed binds the coordinator on the port after the last ':'.
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
      raise ValueError(
        f"ADA_COORDINATOR={coordinator!r}: expected HOST:PORT, process 0's "
        'address and a free port (e.g. node0:12345)'
      )
    num_processes = _env_int(env, 'ADA_NUM_PROCESSES', 1, None)
    return {
      'coordinator_address': coordinator,
      'num_processes': num_processes,
      'process_id': _env_int(env, 'ADA_PROCESS_ID', 0, num_processes),
    }
  flag = env.get('ADA_DISTRIBUTED', '')
  if flag not in ('', '0', '1'):
    raise ValueError(
      f'ADA_DISTRIBUTED={flag!r}: expected 1 (jax.distributed.initialize() '
      'with cluster auto-detection) or 0'
    )
  return {} if flag == '1' else None


def init_distributed() -> None:
  """jax.distributed from the environment; a no-op without these variables.

  Which way is `distributed_init_kwargs`'s: ADA_DISTRIBUTED=1 (set by
  launch_tpu.sh; also SLURM and Open MPI GPU clusters):
  `jax.distributed.initialize()` with auto-detection. ADA_COORDINATOR,
  ADA_NUM_PROCESSES and ADA_PROCESS_ID: explicit initialization (plain ssh
  launches; the two-process CPU tests, over gloo); they win over
  ADA_DISTRIBUTED=1.

  Raises:
    ValueError: a bad or half-set variable (one line naming it), before
      anything joins.
  """
  kwargs = distributed_init_kwargs()
  if kwargs is None:
    return
  if kwargs:
    if os.environ.get('ADA_DISTRIBUTED') == '1':
      logging.info('ADA_DISTRIBUTED=1 and ADA_COORDINATOR: the explicit path wins')
    if (
      jax.config.jax_platforms in (None, '', 'cpu')
      or os.environ.get('JAX_PLATFORMS') == 'cpu'
    ):
      # CPU cross-process collectives (the two-process tests).
      jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(**kwargs)
  logging.info(
    'jax.distributed: process %d of %d, %d local of %d devices',
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )


class AgreedError(Exception):
  """Raised on every process when one of them failed in an agreed block.

  Attributes:
    code: the exit code every process leaves with (the first nonzero one
      by process index).
  """

  def __init__(self, code: int, message: str):
    super().__init__(message)
    self.code = code


def agree_code(code: int) -> tuple[int, int]:
  """(the first nonzero exit code by process index, its process) on every host.

  (0, 0) when every process passed 0. One small collective that every process
  must reach: call it at the same point of the program on every process.
  """
  if jax.process_count() == 1:
    return int(code), 0
  from jax.experimental import multihost_utils

  codes = np.asarray(
    multihost_utils.process_allgather(np.asarray([code], np.int32))
  ).reshape(-1)
  for process, c in enumerate(codes):
    if c:
      return int(c), process
  return 0, 0


@contextlib.contextmanager
def agreed(codes: Mapping[type[BaseException], int]) -> Iterator[None]:
  """Runs a block on every process; if it raises on any, it fails on all.

  `codes` maps the exception types a process may raise in the block to exit
  codes (checked in order; anything else propagates as it is, undecided: use
  it for errors that are bugs). After the block every process agrees
  (`agree_code`); then each raises `AgreedError` with the agreed code:
  with its own error's message where it failed, else naming the process
  that did. With one process this is a plain try/except.
  """
  err: BaseException | None = None
  code = 0
  try:
    yield
  except tuple(codes) as e:
    err = e
    code = next(c for t, c in codes.items() if isinstance(e, t))
  agreed_code, process = agree_code(code)
  if err is not None:
    raise AgreedError(agreed_code, str(err)) from err
  if agreed_code:
    raise AgreedError(
      agreed_code, f'process {process} failed (exit {agreed_code}): see its log'
    )


def broadcast_json_from_main(value: Any) -> Any:
  """Process 0's JSON-able value, on every host (the others pass anything)."""
  if jax.process_count() == 1:
    return value
  from jax.experimental import multihost_utils

  data = json.dumps(value).encode() if jax.process_index() == 0 else b''
  size = broadcast_from_main(len(data))
  buf = np.zeros((size,), np.uint8)
  if jax.process_index() == 0:
    buf[:] = np.frombuffer(data, np.uint8)
  got = np.asarray(multihost_utils.broadcast_one_to_all(buf), np.uint8)
  return json.loads(got.tobytes().decode())
