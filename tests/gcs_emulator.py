"""A local Cloud Storage API for the tests, and for trying gs:// paths by hand.

  python tests/gcs_emulator.py [--port 9023] [--bucket bkt]
  export STORAGE_EMULATOR_HOST=http://127.0.0.1:9023

It is `gcp-storage-emulator` (requirements-test.txt) with two behaviours of
Cloud Storage added that it lacks and that our clients rely on:

- Generation preconditions: a write or delete with `ifGenerationMatch=G`
  fails with 412 unless the object's generation is G (0: absent), and a
  read pinned to `generation=G` is 404 once G is gone. The emulator ignores
  both (two creators of one object both succeed), and the run lease
  (`infra.lease.GcsStore`) is built on them.
- The `x-goog-generation` header on object reads. tensorstore's OCDBT
  driver (orbax's checkpoints) reads every manifest's generation from it
  and fails with "Malformed StorageGeneration" without it.

Everything else (routes, storage, generations, errors) is the emulator's,
and the clients under test are unchanged: they find it through
`STORAGE_EMULATOR_HOST` alone (`infra.storage` passes it on to
tensorstore). The additions wrap the emulator's handler table, once per
process.
"""

from __future__ import annotations

import argparse
import socket
import threading
from http import HTTPStatus

_installed = False
_lock = threading.RLock()


def _generation(storage, bucket: str, name: str) -> int:
  from gcp_storage_emulator import exceptions

  try:
    return int(storage.get_file_obj(bucket, name)['generation'])
  except exceptions.NotFound:
    return 0


def _refuse(response, status: HTTPStatus) -> None:
  response.status = status
  response.json({'error': {'code': int(status), 'message': status.phrase}})


def _object_name(request) -> str | None:
  if 'object_id' in request.params:
    return request.params['object_id']
  if 'name' in request.query:  # Media upload.
    return request.query['name'][0]
  data = request.data  # Multipart upload: the name is in its metadata.
  if isinstance(data, dict) and isinstance(data.get('meta'), dict):
    return data['meta'].get('name')
  return None


def _like_gcs(handler):
  def wrapped(request, response, storage, *args, **kwargs):
    name = _object_name(request)
    if name is None:
      return handler(request, response, storage, *args, **kwargs)
    bucket, query = request.params['bucket_name'], request.query
    with _lock:  # Compare and write as one step, as GCS does.
      current = _generation(storage, bucket, name)
      if 'ifGenerationMatch' in query and current != int(query['ifGenerationMatch'][0]):
        return _refuse(response, HTTPStatus.PRECONDITION_FAILED)
      if 'generation' in query and current != int(query['generation'][0]):
        return _refuse(response, HTTPStatus.NOT_FOUND)
      result = handler(request, response, storage, *args, **kwargs)
      if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
        now = _generation(storage, bucket, name)
        if now:
          response['x-goog-generation'] = str(now)
      return result

  return wrapped


def install() -> None:
  """Adds the two behaviours to this process's emulator (idempotent)."""
  global _installed
  from gcp_storage_emulator import server
  from gcp_storage_emulator.handlers import objects

  with _lock:
    if _installed:
      return
    wrapped = {
      h: _like_gcs(h)
      for h in (objects.insert, objects.delete, objects.get, objects.download)
    }
    for _, handlers in server.HANDLERS:
      for method, handler in list(handlers.items()):
        if handler in wrapped:
          handlers[method] = wrapped[handler]
    objects.insert = wrapped[objects.insert]  # The router's upload fallback.
    _installed = True


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def start(port: int = 0, bucket: str = 'ada-test'):
  """An in-memory emulator on a loopback port; returns (server, its URL)."""
  from gcp_storage_emulator import server

  install()
  port = port or free_port()
  emulator = server.create_server(
    '127.0.0.1', port, in_memory=True, default_bucket=bucket
  )
  emulator.start()
  return emulator, f'http://127.0.0.1:{port}'


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--port', type=int, default=9023)
  p.add_argument('--bucket', default='bkt')
  args = p.parse_args()
  emulator, url = start(args.port, args.bucket)
  print(f'export STORAGE_EMULATOR_HOST={url}   # bucket gs://{args.bucket}', flush=True)
  try:
    threading.Event().wait()
  except KeyboardInterrupt:
    pass
  finally:
    emulator.stop()


if __name__ == '__main__':
  main()
