"""One writer per run: a lease object in the run directory.

The main job takes `DIR/lease.json` before it writes anything else there
and gives it back when it exits; a second main job on the same workdir (a
second `launch_tpu.sh run`, a rerun while the first is alive) is refused
with one line naming the holder (`LeaseBusyError`; the main job exits 73,
`exit_codes.BUSY`). The lease holds the holder's host, process id, start
time and a heartbeat, renewed every `beat_s` seconds by a daemon thread. A
lease is stale, and taken over with a warning, when its heartbeat is older
than `stale_s` (a host that died or lost the disk) or when its holder ran on
this host and its process is gone (a killed run). A multi-host run takes it
once, on process 0 (the main job agrees the outcome across processes).

Every write is conditional, so two takers cannot both win: the lease goes
through a small `Store` whose `put(name, data, generation)` writes only if
the object's current generation is `generation` (0: only if absent) and
returns the new generation, or None when the precondition failed. That is
Cloud Storage's `ifGenerationMatch` contract: `GcsStore` passes it to GCS
itself (object generations, HTTP 412 on a failed precondition), and
`LocalStore` gives local disks the same contract with an `O_EXCL` create
and, for a replace, an `flock`ed compare then an atomic rename; `store_for`
picks one by the workdir. The tests run the lease over both stores, the GCS
one against the emulator made to honour preconditions as GCS does (the
emulator alone ignores them), and over an in-memory stand-in.

The heartbeat renews with the generation it last wrote: if another process
took the lease over meanwhile (this one was paused past `stale_s`), the
renewal fails and `lost` is set; the run checks it at each step and stops.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Protocol

LEASE_FILE = 'lease.json'
BEAT_S = 30.0  # How often the holder renews its heartbeat.
STALE_S = 180.0  # A heartbeat older than this: the holder is gone.


class LeaseBusyError(RuntimeError):
  """The run directory is held by a live process; the message is one line."""


class LeaseLostError(RuntimeError):
  """This process's lease was taken over (it looked dead); one line."""


class Store(Protocol):
  """Objects with generations; every write is conditional on one."""

  def get(self, name: str) -> tuple[bytes, int] | None:
    """(content, generation) of `name`, or None when absent."""

  def put(self, name: str, data: bytes, generation: int) -> int | None:
    """Writes `name` if its generation is `generation` (0: only if absent).

    Returns the new generation, or None when the precondition failed.
    """

  def delete(self, name: str, generation: int) -> bool:
    """Deletes `name` if its generation is `generation`; whether it did."""


class LocalStore:
  """A `Store` on a local (or NFS-like POSIX) directory.

  Create: `O_CREAT | O_EXCL`, so exactly one creator wins. Replace and
  delete: under an exclusive `flock` of a side file, the current
  generation (kept in the object, a `"generation"` key of its JSON) is
  compared, then the new content is renamed over the old one atomically.
  Creates take the same lock, so a create cannot slip between a replace's
  compare and its rename.
  """

  def __init__(self, directory: str | os.PathLike[str]):
    self.directory = os.fspath(directory)

  def _path(self, name: str) -> str:
    return os.path.join(self.directory, name)

  @contextlib.contextmanager
  def _locked(self, name: str):
    import fcntl

    fd = os.open(self._path(f'.{name}.lock'), os.O_CREAT | os.O_RDWR, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX)
      yield
    finally:
      os.close(fd)  # Releases the lock.

  def _generation(self, name: str) -> int:
    got = self.get(name)
    return 0 if got is None else got[1]

  def get(self, name: str) -> tuple[bytes, int] | None:
    try:
      with open(self._path(name), 'rb') as f:
        data = f.read()
    except FileNotFoundError:
      return None
    try:
      generation = int(json.loads(data).get('generation', 1))
    except (ValueError, AttributeError, TypeError):
      generation = 1  # Unreadable (cut short): replaceable at generation 1.
    return data, generation

  def put(self, name: str, data: bytes, generation: int) -> int | None:
    new = generation + 1
    body = _with_generation(data, new)
    with self._locked(name):
      if generation == 0:
        try:
          fd = os.open(self._path(name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
          return None
        with os.fdopen(fd, 'wb') as f:
          f.write(body)
        return new
      if self._generation(name) != generation:
        return None
      tmp = self._path(f'.{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}')
      with open(tmp, 'wb') as f:
        f.write(body)
      os.replace(tmp, self._path(name))
      return new

  def delete(self, name: str, generation: int) -> bool:
    with self._locked(name):
      if self._generation(name) != generation:
        return False
      with contextlib.suppress(FileNotFoundError):
        os.unlink(self._path(name))
      return True


class GcsStore:
  """A `Store` on a Cloud Storage folder (`gs://bucket/run`).

  The objects' own generations, through gcsfs's authenticated session (the
  one `infra.storage` configures, emulator included): a write is a media
  upload with `ifGenerationMatch` (0: only if absent), a delete carries the
  same precondition, and GCS answers 412 when it fails. gcsfs has no
  conditional write of its own beyond "create", hence the raw JSON-API
  calls.
  """

  def __init__(self, directory: str):
    from ada_jax.infra import storage

    if not storage.is_remote(directory):
      raise ValueError(f'not a gs:// folder: {directory}')
    self.directory = directory.rstrip('/')
    self._bucket, _, self._prefix = self.directory[len('gs://') :].partition('/')

  def _fs(self):
    from ada_jax.infra import storage

    return storage._filesystem()

  def _key(self, name: str) -> str:
    return f'{self._prefix}/{name}' if self._prefix else name

  def get(self, name: str) -> tuple[bytes, int] | None:
    fs, key = self._fs(), self._key(name)
    for _ in range(8):  # Replaced between the two reads: read again.
      try:
        meta = fs.call('GET', 'b/{}/o/{}', self._bucket, key, json_out=True)
        generation = int(meta['generation'])
        # Pinned to that generation: content and generation agree.
        _, data = fs.call(
          'GET', 'b/{}/o/{}', self._bucket, key, alt='media', generation=generation
        )
      except FileNotFoundError:
        if fs.exists(f'{self._bucket}/{key}', refresh=True):
          continue
        return None
      return bytes(data), generation
    raise OSError(f'{self.directory}/{name} changes faster than it can be read')

  def put(self, name: str, data: bytes, generation: int) -> int | None:
    fs, key = self._fs(), self._key(name)
    try:
      meta = fs.call(
        'POST',
        f'{fs._location}/upload/storage/v1/b/{{}}/o',
        self._bucket,
        uploadType='media',
        name=key,
        ifGenerationMatch=str(generation),
        data=data,
        headers={'Content-Type': 'application/octet-stream'},
        json_out=True,
      )
    except FileExistsError:  # 412: the precondition failed.
      return None
    fs.invalidate_cache(f'{self._bucket}/{key}')
    return int(meta['generation'])

  def delete(self, name: str, generation: int) -> bool:
    fs, key = self._fs(), self._key(name)
    try:
      fs.call(
        'DELETE', 'b/{}/o/{}', self._bucket, key, ifGenerationMatch=str(generation)
      )
    except (FileExistsError, FileNotFoundError):  # 412, or already gone.
      return False
    fs.invalidate_cache(f'{self._bucket}/{key}')
    return True


def store_for(workdir: str | os.PathLike[str]) -> Store:
  """The store of a run directory: `GcsStore` for gs://, else `LocalStore`."""
  from ada_jax.infra import storage

  if storage.is_remote(workdir):
    return GcsStore(os.fspath(workdir))
  return LocalStore(workdir)


def _with_generation(data: bytes, generation: int) -> bytes:
  record = json.loads(data)
  record['generation'] = generation
  return json.dumps(record, indent=2).encode()


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a lease: the content of `lease.json`."""

  host: str
  pid: int
  started: float  # time.time() when taken
  heartbeat: float  # time.time() of the last renewal
  token: str  # unique per taking, so a holder knows its own lease
  command: str = ''

  def describe(self, now: float) -> str:
    """`host h pid 123 (started 2026-12-03 10:00:00 UTC, heartbeat 12 s ago)`."""
    started = time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(self.started))
    return (
      f'host {self.host} pid {self.pid} (started {started}, heartbeat '
      f'{max(0.0, now - self.heartbeat):.0f} s ago)'
    )


def _parse(data: bytes) -> Holder | None:
  try:
    raw = json.loads(data)
    return Holder(
      host=str(raw['host']),
      pid=int(raw['pid']),
      started=float(raw['started']),
      heartbeat=float(raw['heartbeat']),
      token=str(raw['token']),
      command=str(raw.get('command', '')),
    )
  except (ValueError, KeyError, TypeError, AttributeError):
    return None  # Cut short by a crash mid-write: stale.


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Someone else's live process.
    return True
  return True


def stale_reason(holder: Holder | None, now: float, stale_s: float) -> str | None:
  """Why a lease may be taken over (None: its holder is live)."""
  if holder is None:
    return 'its lease file is unreadable'
  if now - holder.heartbeat > stale_s:
    return f'no heartbeat for {now - holder.heartbeat:.0f} s'
  if holder.host == socket.gethostname() and not _pid_alive(holder.pid):
    return f'its process {holder.pid} on this host is gone'
  return None


class Lease:
  """The run directory's lease, held by this process; see the module doc.

  Usage (the main job, process 0)::

    lease = Lease(LocalStore(workdir))
    lease.acquire()          # LeaseBusyError: one line naming the holder
    try:
      ...                    # the run; lease.check() at each step
    finally:
      lease.release()
  """

  def __init__(
    self,
    store: Store,
    *,
    name: str = LEASE_FILE,
    beat_s: float = BEAT_S,
    stale_s: float = STALE_S,
    where: str = '',
    command: str = '',
  ):
    self.store = store
    self.name = name
    self.beat_s = beat_s
    self.stale_s = stale_s
    self.where = where or getattr(store, 'directory', '')
    self.command = command
    self.holder: Holder | None = None
    self.took_over: str | None = None  # why, when a stale lease was taken
    self._generation = 0
    self._lost = threading.Event()
    self._stop = threading.Event()
    self._mutex = threading.Lock()
    self._thread: threading.Thread | None = None

  def _record(self, holder: Holder) -> bytes:
    return json.dumps(dataclasses.asdict(holder)).encode()

  def acquire(self, *, heartbeat: bool = True) -> None:
    """Takes the lease: creates it, or takes over a stale one.

    Raises:
      LeaseBusyError: a live process holds it (one line naming it).
    """
    now = time.time()
    me = Holder(
      host=socket.gethostname(),
      pid=os.getpid(),
      started=now,
      heartbeat=now,
      token=uuid.uuid4().hex,
      command=self.command,
    )
    for _ in range(8):  # Lost races with other takers: look again.
      current = self.store.get(self.name)
      if current is None:
        generation = self.store.put(self.name, self._record(me), 0)
      elif (holder := _parse(current[0])) is not None and holder.token == me.token:
        # Our write landed but its answer was lost (a retried request
        # then saw its own object): ours.
        generation = current[1]
      else:
        why = stale_reason(holder, time.time(), self.stale_s)
        if why is None:
          raise LeaseBusyError(
            f'{self.where} is in use by {holder.describe(time.time())}: one '
            'writer per run; wait for it to end or stop it'
          )
        generation = self.store.put(self.name, self._record(me), current[1])
        if generation is not None:
          self.took_over = why
          logging.warning(
            'took over the stale lease of %s (%s)',
            self.where,
            why if holder is None else f'{holder.describe(time.time())}: {why}',
          )
      if generation is not None:
        self.holder, self._generation = me, generation
        if heartbeat:
          self._thread = threading.Thread(
            target=self._beat, name='ada_lease_heartbeat', daemon=True
          )
          self._thread.start()
        return
    raise LeaseBusyError(f'{self.where}: lost the race for its lease 8 times')

  def renew(self) -> bool:
    """Writes a fresh heartbeat; False (and `lost`) if the lease was taken."""
    with self._mutex:
      if self.holder is None or self._lost.is_set():
        return False
      beat = dataclasses.replace(self.holder, heartbeat=time.time())
      generation = self.store.put(self.name, self._record(beat), self._generation)
      if generation is None:
        self._lost.set()
        return False
      self.holder, self._generation = beat, generation
      return True

  def _beat(self) -> None:
    while not self._stop.wait(self.beat_s):
      try:
        if not self.renew():
          logging.error('the lease of %s was taken over by another process', self.where)
          return
      except OSError as e:  # A passing disk error: try again next beat.
        logging.warning('lease heartbeat of %s failed: %s', self.where, e)

  @property
  def lost(self) -> bool:
    """Whether another process took this lease over."""
    return self._lost.is_set()

  def check(self) -> None:
    """Raises `LeaseLostError` if another process took the lease over."""
    if self.lost:
      raise LeaseLostError(
        f'{self.where}: another process took this run over (this one looked '
        f'dead for {self.stale_s:.0f} s); stopping without writing more'
      )

  def release(self) -> None:
    """Stops the heartbeat and deletes the lease if it is still ours."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=5)
    with self._mutex:
      if self.holder is not None and not self._lost.is_set():
        with contextlib.suppress(OSError):
          self.store.delete(self.name, self._generation)
      self.holder = None


def read_holder(store: Store, name: str = LEASE_FILE) -> Holder | None:
  """The current holder of a lease (None: no lease, or unreadable)."""
  got = store.get(name)
  return None if got is None else _parse(got[0])
