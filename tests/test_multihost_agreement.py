"""What process 0 decides alone is agreed by every process (issue 37, item 7).

Two `python -m ada_jax.main` processes joined over gloo: process 0 alone
holds the workdir's lease and checks the config against the recorded one.
When it refuses (a live lease: 73; another config: 2) the other process
must exit with the same code at once, not wait in a collective.
"""

import json
import os
import socket
import subprocess
import sys
import time

from ada_jax import from_config
from ada_jax.infra import exit_codes
from ada_jax.infra import lease as lease_lib
from ada_jax.infra import metrics as metrics_lib
from tests import test_multihost


def _two_processes(workdir, *overrides):
  port = test_multihost._free_port()
  procs = []
  for i in range(2):
    env = test_multihost.process_env(port, i)
    cmd = [
      sys.executable, '-m', 'ada_jax.main', '--config', 'configs/tiny_arith.py',
      '--workdir', str(workdir), *overrides,
    ]  # fmt: skip
    procs.append(
      subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
      )
    )
  return [(p.wait(timeout=120), p.stderr.read()) for p in procs]


def _error_lines(err):
  return [ln for ln in err.splitlines() if ln.startswith('error:')]


def test_a_busy_workdir_stops_both_processes_with_73(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  now = time.time()
  holder = dict(
    host=socket.gethostname(), pid=os.getpid(), started=now, heartbeat=now, token='t'
  )
  lease_lib.LocalStore(workdir).put(
    lease_lib.LEASE_FILE, json.dumps(holder).encode(), 0
  )
  (p0, err0), (p1, err1) = _two_processes(workdir)
  assert (p0, p1) == (exit_codes.BUSY, exit_codes.BUSY), (err0, err1)
  assert 'is in use by host' in _error_lines(err0)[0]
  assert _error_lines(err1) == ['error: process 0 failed (exit 73): see its log']


def test_a_changed_config_stops_both_processes_with_2(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  c = from_config.load('configs/tiny_arith.py')
  (workdir / 'config.json').write_text(json.dumps(metrics_lib.config_json(c)))
  (p0, err0), (p1, err1) = _two_processes(workdir, '--config.rl.lr=0.01')
  assert (p0, p1) == (exit_codes.BAD_INPUT, exit_codes.BAD_INPUT), (err0, err1)
  assert 'rl.lr: 0.0003 recorded, 0.01 given' in _error_lines(err0)[0]
  assert sorted(p.name for p in workdir.iterdir() if not p.name.startswith('.')) == [
    'config.json'
  ]
