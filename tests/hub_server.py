"""A local stand-in for the Hugging Face Hub's HTTP API, on a loopback port.

The routes huggingface_hub's `repo_info`, `list_repo_tree` and
`snapshot_download` call, for models and datasets held in memory:

  GET  /api/{models,datasets}/REPO[/revision/REV] repo info (its commit sha)
  GET  /api/{models,datasets}/REPO/tree/REV       the files, recursive
  HEAD|GET /REPO/resolve/REV/PATH                 a model file
  HEAD|GET /datasets/REPO/resolve/REV/PATH        a dataset file

A gated repository answers its files with 401 and `X-Error-Code: GatedRepo`
unless the request carries its token (`Authorization: Bearer TOKEN`), as
the Hub does; an unknown one is 404 `RepoNotFound`. Clients are pointed
here by `HF_ENDPOINT`, so the code under test is the real download path.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http import server
from urllib.parse import unquote, urlparse


class Repo:
  """Files of one repository (path -> bytes); `token` set: gated."""

  def __init__(self, files: dict[str, bytes], token: str | None = None):
    self.files = dict(files)
    self.token = token
    digest = hashlib.sha1()
    for path in sorted(self.files):
      digest.update(path.encode() + b'\0' + self.files[path])
    self.sha = digest.hexdigest()


_TREE = re.compile(r'^/api/(models|datasets)/(.+)/tree/([^/]+)(/.*)?$')
_INFO = re.compile(r'^/api/(models|datasets)/(.+?)(?:/revision/([^/]+))?$')
_FILE = re.compile(r'^(/datasets)?/(.+?)/resolve/([^/]+)/(.+)$')


class HubServer:
  """Serves `repos` ({('model'|'dataset', repo_id): Repo}) until `stop()`."""

  def __init__(self, repos: dict[tuple[str, str], Repo]):
    self.repos = repos
    self.requests: list[str] = []
    hub = self

    class Handler(server.BaseHTTPRequestHandler):
      def log_message(self, *args):
        del args

      def do_HEAD(self):
        hub._answer(self, body=False)

      def do_GET(self):
        hub._answer(self, body=True)

    self._httpd = server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    self.url = f'http://127.0.0.1:{self._httpd.server_address[1]}'
    self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
    self._thread.start()

  def stop(self) -> None:
    self._httpd.shutdown()
    self._httpd.server_close()

  def _send(self, h, status: int, data: bytes, headers: dict, body: bool) -> None:
    h.send_response(status)
    for k, v in headers.items():
      h.send_header(k, v)
    h.send_header('Content-Length', str(len(data)))
    h.end_headers()
    if body:
      h.wfile.write(data)

  def _error(self, h, status: int, code: str, body: bool) -> None:
    message = json.dumps({'error': code}).encode()
    headers = {'X-Error-Code': code, 'X-Error-Message': code}
    self._send(h, status, message, headers, body)

  def _answer(self, h, body: bool) -> None:
    path = unquote(urlparse(h.path).path)
    self.requests.append(f'{h.command} {path}')
    if m := _TREE.match(path) or _INFO.match(path):
      kind, repo_id = m.group(1)[:-1], m.group(2)
      repo = self.repos.get((kind, repo_id))
      if repo is None:
        return self._error(h, 404, 'RepoNotFound', body)
      if m.re is _INFO:
        info = {
          'id': repo_id,
          'sha': repo.sha,
          'private': False,
          'gated': 'manual' if repo.token else False,
          'siblings': [{'rfilename': p} for p in sorted(repo.files)],
        }
      else:
        info = [
          {
            'type': 'file',
            'path': p,
            'size': len(data),
            'oid': hashlib.sha1(data).hexdigest(),
          }
          for p, data in sorted(repo.files.items())
        ]
      data = json.dumps(info).encode()
      return self._send(h, 200, data, {'Content-Type': 'application/json'}, body)
    if m := _FILE.match(path):
      kind = 'dataset' if m.group(1) else 'model'
      repo = self.repos.get((kind, m.group(2)))
      if repo is None:
        return self._error(h, 404, 'RepoNotFound', body)
      if repo.token and h.headers.get('Authorization') != f'Bearer {repo.token}':
        return self._error(h, 401, 'GatedRepo', body)
      data = repo.files.get(m.group(4))
      if data is None:
        return self._error(h, 404, 'EntryNotFound', body)
      headers = {
        'X-Repo-Commit': repo.sha,
        'ETag': f'"{hashlib.sha1(data).hexdigest()}"',
        'Content-Type': 'application/octet-stream',
      }
      return self._send(h, 200, data, headers, body)
    return self._error(h, 404, 'NotFound', body)
