"""Local and Cloud Storage (gs://) paths behind one small layer.

Every file a command reads or writes goes through `etils.epath`, which
reaches `gs://` through fsspec and gcsfs (no TensorFlow). What epath does
not do safely on an object store is here:

- `move`: object stores have no folders and no rename; a file or a tree is
  copied, then the source deleted (each file lands whole, and an interrupted
  move leaves every file in one place or both). gcsfs's own rename first
  tries the moveTo API, which some stores (and the GCS emulator) lack, and
  retries it for half a minute before it falls back to the same copy.
- `makedirs`: a no-op on object stores (a folder exists when a file does).
- `upload_dir`: libraries that write only local files (safetensors, the
  array_record writer of TFDS) write into a local folder, then it is copied
  up.
- `localize`: libraries that read only local files (safetensors' memory
  map, the tokenizers library) get a local copy of a `gs://` folder: its
  files (or those matching patterns, e.g. config.json alone for the plan)
  downloaded once into `$ADA_LOCAL_CACHE` (default ~/.cache/ada_jax) and kept
  while their sizes match the bucket's, so each host of a pod reads its own
  disk after the first call.
- `require`: a `gs://` path without gcsfs installed, or without credentials,
  is one line naming the path and what is missing (`StorageError`, exit 2),
  before anything is written.

The GCS emulator (`STORAGE_EMULATOR_HOST`, e.g. `gcp-storage-emulator` on a
loopback port; tests/conftest.py starts one): gcsfs and the Google client
read that variable alone. gcsfs's default filesystem (the extended one, for
hierarchical-namespace and zonal buckets) first probes each bucket's type
over gRPC and waits 60 s per call against a REST-only emulator before it
falls back; with the variable set, `gs://` and `gcs://` (epath's name) are
served by gcsfs's plain REST filesystem instead (the same as
`GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false` before gcsfs is imported), so a
user sets one variable.

Dimension legend: none (paths only).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
from collections.abc import Sequence
from typing import Any

from etils import epath

REMOTE_PREFIXES = ('gs://',)
EMULATOR_VAR = 'STORAGE_EMULATOR_HOST'
CACHE_VAR = 'ADA_LOCAL_CACHE'


def point_clients_at_emulator() -> None:
  """Passes `STORAGE_EMULATOR_HOST` on to the clients that do not read it.

  tensorstore (orbax's checkpoints) takes its GCS endpoint from
  `TENSORSTORE_GCS_HTTP_URL` and, without credentials, a fixed token from
  `GOOGLE_AUTH_TOKEN_FOR_TESTING`; both are read when tensorstore first
  opens a gs:// path, so this runs at import (before any checkpoint).
  Values already set are kept.
  """
  host = os.environ.get(EMULATOR_VAR)
  if host:
    os.environ.setdefault('TENSORSTORE_GCS_HTTP_URL', host)
    os.environ.setdefault('GOOGLE_AUTH_TOKEN_FOR_TESTING', 'emulator')


point_clients_at_emulator()


class StorageError(OSError):
  """A path cannot be reached (no client, no credentials); the message is one line."""


def is_remote(path: str | os.PathLike[str]) -> bool:
  """Whether `path` is on an object store (gs://)."""
  return os.fspath(path).startswith(REMOTE_PREFIXES)


def _filesystem() -> Any:
  """Gcsfs's filesystem (fsspec's cached instance), configured for an emulator."""
  try:
    import fsspec
    import gcsfs
  except ImportError:
    raise StorageError(
      'gs:// paths need gcsfs: pip install -r requirements.txt (gcsfs)'
    ) from None
  if os.environ.get(EMULATOR_VAR):
    # The REST-only filesystem, whatever order gcsfs was imported in: the
    # extended one probes each bucket's type over gRPC first (module doc).
    for protocol in ('gs', 'gcs'):
      fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)
  # The instance etils.epath uses (fsspec caches one per class and
  # arguments): one listing cache, so a move here is seen by epath at once.
  return fsspec.filesystem('gcs', finalize_on_close=True)


def require(path: str | os.PathLike[str]) -> None:
  """Checks that `path` can be reached; local paths always can.

  For gs://: gcsfs is importable and its bucket answers (credentials, or
  the emulator). Nothing is written.

  Raises:
    StorageError: one line naming the path and what is missing.
  """
  if not is_remote(path):
    return
  text = os.fspath(path)
  fs = _filesystem()
  bucket = text[len('gs://') :].split('/', 1)[0]
  # gcsfs logs each failed try with its traceback; the one line below says it.
  log = logging.getLogger('gcsfs')
  level = log.level
  log.setLevel(logging.CRITICAL)
  try:
    fs.ls(bucket, refresh=True)
  except FileNotFoundError:
    raise StorageError(f'{text}: bucket gs://{bucket} does not exist') from None
  except Exception as e:  # gcsfs raises auth, HTTP and OS errors alike.
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise StorageError(
      f'{text}: cannot reach gs://{bucket} ({reason}); set up credentials '
      '(gcloud auth application-default login, or a service account)'
    ) from None
  finally:
    log.setLevel(level)


def path(p: str | os.PathLike[str]) -> epath.Path:
  """An epath.Path; for gs:// after `_filesystem` set up the client."""
  if is_remote(p):
    _filesystem()
  return epath.Path(p)


def makedirs(p: str | os.PathLike[str]) -> None:
  """Creates a local folder (and its parents); nothing on object stores."""
  if not is_remote(p):
    os.makedirs(os.fspath(p), exist_ok=True)


def move(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
  """Moves a file or a tree from `src` to `dst` (its parent need not exist).

  Local: a rename. On an object store: every file copied, then the sources
  deleted.
  """
  s, d = os.fspath(src), os.fspath(dst)
  if not is_remote(s) and not is_remote(d):
    os.makedirs(os.path.dirname(d) or '.', exist_ok=True)
    os.replace(s, d)
    return
  if is_remote(s) != is_remote(d):
    raise ValueError(f'move {s} -> {d}: both paths must be on the same store')
  fs = _filesystem()
  if fs.isdir(s):
    fs.copy(s.rstrip('/') + '/', d.rstrip('/') + '/', recursive=True)
    fs.rm(s, recursive=True)
  else:
    fs.copy(s, d)
    fs.rm(s)
  fs.invalidate_cache()


def upload_dir(
  local: str | os.PathLike[str],
  dst: str | os.PathLike[str],
  skip_dirs: Sequence[str] = (),
) -> None:
  """Copies the local folder `local` into `dst` (local or gs://), file by file.

  Folders named in `skip_dirs` (at any depth) are left out.
  """
  src, d = os.fspath(local), os.fspath(dst)
  remote = is_remote(d)
  fs = _filesystem() if remote else None
  for root, dirs, files in os.walk(src):
    dirs[:] = [x for x in dirs if x not in skip_dirs]
    rel = os.path.relpath(root, src)
    for name in files:
      target = '/'.join(x for x in (d.rstrip('/'), rel, name) if x and x != '.')
      if remote:
        fs.put_file(os.path.join(root, name), target)
      else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(root, name), target)
  if remote:
    fs.invalidate_cache()


def cache_root() -> str:
  """Where `localize` keeps local copies: $ADA_LOCAL_CACHE or ~/.cache/ada_jax."""
  return os.environ.get(CACHE_VAR) or os.path.join(
    os.path.expanduser('~'), '.cache', 'ada_jax'
  )


def local_copy_path(p: str | os.PathLike[str]) -> str:
  """Where `localize` keeps the local copy of gs:// folder `p`."""
  bare = os.fspath(p).rstrip('/')[len('gs://') :]
  return os.path.join(cache_root(), 'gs', bare)


def localize(p: str | os.PathLike[str], patterns: Sequence[str] = ()) -> str:
  """A local folder with the files of folder `p` (local `p`: itself).

  For gs://: each file (matching one of the fnmatch `patterns`, if given)
  that is missing from the cache or differs in size is downloaded (to a
  temporary name, then renamed: a reader never sees half a file).

  Raises:
    FileNotFoundError: nothing under `p` (naming it).
  """
  if not is_remote(p):
    return os.fspath(p)
  src = os.fspath(p).rstrip('/')
  fs = _filesystem()
  bare = src[len('gs://') :]
  local = local_copy_path(src)
  found = fs.find(src, detail=True)
  if not found:
    raise FileNotFoundError(f'{src}: no such folder (nothing under it)')
  for name, info in found.items():
    rel = name[len(bare) + 1 :]
    if patterns and not any(fnmatch.fnmatch(rel, pat) for pat in patterns):
      continue
    dst = os.path.join(local, rel)
    if os.path.isfile(dst) and os.path.getsize(dst) == int(info['size']):
      continue
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    part = f'{dst}.part-{os.getpid()}'
    fs.get_file(name, part)
    os.replace(part, dst)
  return local
