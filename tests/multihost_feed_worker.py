"""One process of test_multihost_feed.py: host rows onto an interleaved mesh.

Two of these run with 4 fake CPU devices each, joined by `jax.distributed`
(gloo). The mesh takes the 8 devices interleaved by process (p0, p1, p0,
p1, ...), as a TPU pod's physical layout does (v5p-64: process 0 holds four
separate blocks of rows), so neither process's rows are one block. Every
process feeds the whole host array through `multihost.global_rows`, a
jitted function works on it, and the rows each process can read are
gathered back (`local_rows`, `gather_rows`); the worker writes what it saw
to `--out` as JSON.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from ada_jax import sharding  # noqa: E402
from ada_jax.infra import multihost  # noqa: E402

ROWS = 16


def main() -> None:
  """Feeds, computes, gathers; writes the record."""
  p = argparse.ArgumentParser()
  p.add_argument('--out', required=True)
  args = p.parse_args()
  multihost.init_distributed()
  by_process = [[d for d in jax.devices() if d.process_index == i] for i in range(2)]
  interleaved = [d for pair in zip(*by_process, strict=True) for d in pair]
  mesh = sharding.make_mesh((1, 8, 1), interleaved)
  sh = multihost.rows_sharding(mesh, ROWS)
  host = np.arange(ROWS * 3, dtype=np.int32).reshape(ROWS, 3)
  x = multihost.global_rows(host, sh)
  y = jax.jit(lambda a: a * 2 + 1, out_shardings=sh)(x)
  idx, local = multihost.local_rows(y)
  merged = multihost.gather_rows(idx, local.sum(axis=1), ROWS)
  record = dict(
    process=jax.process_index(),
    blocks=multihost.row_blocks(sh, ROWS),
    local_rows=[int(i) for i in idx],
    local_ok=bool(np.array_equal(local, host[idx] * 2 + 1)),
    merged=[float(v) for v in merged],
  )
  pathlib.Path(args.out).write_text(json.dumps(record))


if __name__ == '__main__':
  main()
