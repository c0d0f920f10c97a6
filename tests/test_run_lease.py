"""One writer per run: the run directory's lease (issue 39, item 1).

Two main jobs on one workdir used to both resume and append rows. The lease
logic is checked over the local store, over the Cloud Storage store against
the GCS emulator, and over an in-memory stand-in; then two real processes
start at once on a fresh and on a half-finished workdir, local and gs://.

`gcp-storage-emulator` alone ignores `ifGenerationMatch` (a create over an
existing object succeeds); the tests' emulator (`tests/gcs_emulator.py`)
answers as Cloud Storage does: 412 when the object's generation is not the
one asked for, 404 for a read pinned to a generation that is gone.
Everything else (the HTTP calls, the generations, the client) is the
emulator's and gcsfs's.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from ada_jax import from_config
from ada_jax.infra import exit_codes
from ada_jax.infra import lease as lease_lib
from ada_jax.infra import metrics as metrics_lib


class GenerationStore:
  """An object store with GCS's `ifGenerationMatch` contract, in memory."""

  def __init__(self):
    self.objects: dict[str, tuple[bytes, int]] = {}
    self._lock = threading.Lock()
    self._next = 1000

  def get(self, name):
    with self._lock:
      return self.objects.get(name)

  def put(self, name, data, generation):
    with self._lock:
      current = self.objects.get(name, (b'', 0))[1]
      if current != generation:
        return None
      self._next += 7  # Generations are opaque: not current + 1.
      self.objects[name] = (data, self._next)
      return self._next

  def delete(self, name, generation):
    with self._lock:
      if self.objects.get(name, (b'', 0))[1] != generation:
        return False
      del self.objects[name]
      return True


@pytest.fixture(params=['local', 'gcs', 'generations'])
def store(request, tmp_path):
  if request.param == 'local':
    return lease_lib.LocalStore(tmp_path)
  if request.param == 'gcs':
    import uuid

    bucket = request.getfixturevalue('gcs_emulator')
    return lease_lib.GcsStore(f'{bucket}/lease-{uuid.uuid4().hex[:8]}')
  return GenerationStore()


def _plant(store, **fields):
  """A lease written by someone else (the default: a live process here)."""
  now = time.time()
  holder = dict(
    host=socket.gethostname(), pid=os.getpid(), started=now, heartbeat=now, token='x'
  )
  holder.update(fields)
  assert store.put(lease_lib.LEASE_FILE, json.dumps(holder).encode(), 0) is not None


def test_preconditions_create_once_and_replace_only_the_seen_generation(store):
  assert store.put('o', b'{"a": 1}', 0) is not None
  assert store.put('o', b'{"a": 2}', 0) is None  # exists
  _, gen = store.get('o')
  assert store.put('o', b'{"a": 3}', gen + 1) is None  # not the current generation
  new = store.put('o', b'{"a": 4}', gen)
  assert new is not None and new != gen
  assert store.put('o', b'{"a": 5}', gen) is None  # the old one is gone
  assert not store.delete('o', gen) and store.delete('o', new)
  assert store.get('o') is None


def test_a_live_lease_is_refused_with_one_line_naming_its_holder(store):
  _plant(store, pid=os.getpid())
  lease = lease_lib.Lease(store, where='--workdir D')
  with pytest.raises(lease_lib.LeaseBusyError) as e:
    lease.acquire(heartbeat=False)
  message = str(e.value)
  assert '\n' not in message
  assert f'host {socket.gethostname()} pid {os.getpid()}' in message
  assert message.startswith('--workdir D is in use by')


def test_a_lease_without_heartbeat_is_taken_over(store):
  _plant(store, host='elsewhere', heartbeat=time.time() - 600)
  lease = lease_lib.Lease(store, stale_s=180)
  lease.acquire(heartbeat=False)
  assert lease.took_over.startswith('no heartbeat for 6')
  assert lease_lib.read_holder(store).pid == os.getpid()


def test_a_lease_whose_process_is_gone_is_taken_over(store):
  dead = subprocess.Popen([sys.executable, '-c', 'pass'])
  dead.wait()
  _plant(store, pid=dead.pid)
  lease = lease_lib.Lease(store)
  lease.acquire(heartbeat=False)
  assert lease.took_over == f'its process {dead.pid} on this host is gone'


def test_a_holder_whose_lease_was_taken_learns_it_and_release_keeps_the_new(store):
  first = lease_lib.Lease(store, stale_s=0.0)
  first.acquire(heartbeat=False)
  time.sleep(0.01)
  second = lease_lib.Lease(store, stale_s=0.0)  # first looks dead to it
  second.acquire(heartbeat=False)
  assert not first.renew() and first.lost
  with pytest.raises(lease_lib.LeaseLostError):
    first.check()
  first.release()  # Not its lease any more: left alone.
  assert lease_lib.read_holder(store).token == second.holder.token
  assert second.renew()
  second.release()
  assert store.get(lease_lib.LEASE_FILE) is None


def test_takers_racing_for_a_stale_lease_have_one_winner(store):
  _plant(store, host='elsewhere', heartbeat=time.time() - 600)
  won, busy = [], []
  start = threading.Barrier(8)

  def take():
    lease = lease_lib.Lease(store)
    start.wait()
    try:
      lease.acquire(heartbeat=False)
      won.append(lease)
    except lease_lib.LeaseBusyError:
      busy.append(lease)

  threads = [threading.Thread(target=take) for _ in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert len(won) == 1 and len(busy) == 7


# Two main jobs at once. The winner runs a stand-in for the run (it holds
# the lease for a few seconds, then stops with exit 2), so no model is built.
_JOB = """
import sys, time
from ada_jax import from_config, main
def trainer(*a, **k):
  time.sleep(6)
  raise from_config.ConfigError('stand-in run over')
from_config.trainer = trainer
sys.exit(main.run(sys.argv[1:]))
"""


def _two_at_once(workdir):
  """Starts two jobs on `workdir` at once; their (exit code, stderr, stdout)."""
  cmd = [
    sys.executable, '-c', _JOB, '--config', 'configs/tiny_arith.py',
    '--workdir', str(workdir),
  ]  # fmt: skip
  procs = [
    subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(2)
  ]
  return [(p.wait(timeout=120), p.stderr.read(), p.stdout.read()) for p in procs]


def _check_one_proceeded(results, workdir):
  codes = sorted(code for code, _, _ in results)
  assert codes == [exit_codes.BAD_INPUT, exit_codes.BUSY], results
  (busy_err,) = [err for code, err, _ in results if code == exit_codes.BUSY]
  lines = [ln for ln in busy_err.splitlines() if ln.startswith('error:')]
  assert len(lines) == 1 and 'is in use by host' in lines[0], busy_err
  (ran,) = [err for code, err, _ in results if code == exit_codes.BAD_INPUT]
  assert 'stand-in run over' in ran
  assert not (workdir / lease_lib.LEASE_FILE).exists()  # released at exit


def test_two_jobs_at_once_on_a_fresh_workdir(tmp_path):
  workdir = tmp_path / 'run'
  _check_one_proceeded(_two_at_once(workdir), workdir)


def test_two_jobs_at_once_on_a_half_finished_workdir(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  c = from_config.load('configs/tiny_arith.py')
  (workdir / 'config.json').write_text(json.dumps(metrics_lib.config_json(c)))
  rows = ''.join(json.dumps({'step': s, 'phase': 'rl'}) + '\n' for s in (1, 2))
  (workdir / 'metrics.jsonl').write_text(rows)
  _check_one_proceeded(_two_at_once(workdir), workdir)
  assert (workdir / 'metrics.jsonl').read_text() == rows


def test_two_jobs_at_once_on_a_gcs_workdir(gcs_emulator):
  import uuid

  from ada_jax.infra import storage

  workdir = f'{gcs_emulator}/two-{uuid.uuid4().hex[:8]}'
  results = _two_at_once(workdir)
  codes = sorted(code for code, _, _ in results)
  assert codes == [exit_codes.BAD_INPUT, exit_codes.BUSY], results
  (busy_err,) = [err for code, err, _ in results if code == exit_codes.BUSY]
  assert f'--workdir {workdir} is in use by host' in busy_err, busy_err
  assert not storage.path(f'{workdir}/{lease_lib.LEASE_FILE}').exists()
