"""Two processes feed an interleaved mesh: hosts' rows need not be one block.

On a TPU pod the mesh follows the physical topology, so a host's devices
hold several separate blocks of the batch rows (tests/test_tpu_topology.py
shows it on libtpu's topologies). Here two real processes over gloo
(tests/multihost_feed_worker.py) build a mesh whose devices alternate
between them and feed, compute and gather through `multihost`: every
device gets its own rows and every host reads back all of them.
"""

import json
import pathlib
import subprocess
import sys

import numpy as np

from tests import test_multihost

ROOT = pathlib.Path(__file__).resolve().parent.parent
_TIMEOUT_S = 180


def test_two_processes_feed_an_interleaved_mesh(tmp_path):
  port = test_multihost._free_port()
  procs = []
  for i in range(2):
    env = test_multihost.process_env(port, i)
    cmd = [sys.executable, str(ROOT / 'tests' / 'multihost_feed_worker.py')]
    procs.append(
      subprocess.Popen(
        [*cmd, f'--out={tmp_path / f"{i}.json"}'],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
    )
  try:
    outs = [p.communicate(timeout=_TIMEOUT_S)[0] for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, out in zip(procs, outs, strict=True):
    assert p.returncode == 0, out[-3000:]
  rows = 16
  host = np.arange(rows * 3).reshape(rows, 3)
  expected = (host * 2 + 1).sum(axis=1)
  seen = set()
  for i in range(2):
    r = json.loads((tmp_path / f'{i}.json').read_text())
    assert r['process'] == i
    # Interleaved: each process holds every other pair of rows, 4 blocks.
    assert len(r['blocks']) == 4, r['blocks']
    assert r['local_ok']
    seen |= set(r['local_rows'])
    np.testing.assert_array_equal(r['merged'], expected)
  assert seen == set(range(rows))
