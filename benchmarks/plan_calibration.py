r"""The memory plan against XLA's compiled memory analysis: the full matrix.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \
      python benchmarks/plan_calibration.py [--meshes 1,8,1 2,4,1 1,4,2 2,2,2] \
      [--modes dense-none chunked-none dense-block chunked-block] \
      [--save results.json | --load results.json]

For each mesh and each attention-remat mode it compiles the real programs
(`ada_jax.plan --check`: the trainer's update, old-logp pass, prefill and
sampling round, abstract inputs in the trainer's layouts) of a 4-layer
qwen2-like model at T = P + N = 384 and prints, per phase, `plan X MiB, compiled Y MiB, ratio
R`. On the (2, 2, 2) mesh it also doubles, one at a time, the layers, T, the
rows per device (R) and the micro-batch (m), and prints the plan's change
against the compiled change (their ratio). The target: every ratio within
0.75-1.25. tests/test_plan.py runs one mesh and one mode of it.

XLA:CPU's buffer assignment is the oracle here; it says nothing certain
about TPU tiling (run `python -m ada_jax.plan --check` on the TPU VM).
`--save` keeps the compiled figures, `--load` reprints them against the
current plan without compiling (to refit the plan's constants).

Dimension legend: P prompt bucket, N new tokens, T = P + N, R training rows,
m rows per micro-batch, L layers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
if 'xla_force_host_platform_device_count' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
    os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
  )
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax.numpy as jnp

from ada_jax import model as model_lib
from ada_jax.planner import memory

MODEL = model_lib.ModelConfig(
  model_type='qwen2',
  vocab_size=1024,
  hidden_size=128,
  intermediate_size=384,
  num_layers=4,
  num_heads=4,
  num_kv_heads=2,
  head_dim=32,
  qkv_bias=True,
  tie_embeddings=True,
  max_position_embeddings=4096,
)
# B, P, N, S, M, R, mini, m: T = 384, 16 rows per micro-batch.
SHAPES = memory.StepShapes(16, 128, 256, 64, 2, 64, 32, 16)
MESHES = ((1, 8, 1), (2, 4, 1), (1, 4, 2), (2, 2, 2))
MODES = ('dense-none', 'chunked-none', 'dense-block', 'chunked-block')
PHASES = ('update', 'old_logp', 'reshard', 'prefill', 'sampling')
DOUBLINGS = {
  'layers': lambda c, s: (dataclasses.replace(c, num_layers=2 * c.num_layers), s),
  'T': lambda c, s: (
    c,
    dataclasses.replace(s, new_tokens=2 * (s.prompt_len + s.new_tokens) - s.prompt_len),
  ),
  'rows': lambda c, s: (c, dataclasses.replace(s, rows=2 * s.rows)),
  'micro': lambda c, s: (
    c,
    dataclasses.replace(s, micro_batch_rows=2 * s.micro_batch_rows),
  ),
}


def case(
  mode: str, doubling: str = ''
) -> tuple[model_lib.ModelConfig, memory.StepShapes]:
  """The model and shapes of one point of the matrix."""
  attention, remat = mode.split('-')
  c = dataclasses.replace(MODEL, attention=attention, remat=remat)
  s = SHAPES
  if doubling:
    c, s = DOUBLINGS[doubling](c, s)
  return c, s


def compile_case(mesh_shape, mode, doubling, phases=PHASES) -> dict[str, int]:
  """{phase: compiled total bytes per device} of one point."""
  from ada_jax import plan, sharding

  c, s = case(mode, doubling)
  mesh = sharding.make_mesh(tuple(mesh_shape))
  out = plan.compiled_phases(c, s, mesh, phases)
  return {k: v.total for k, v in out.items()}


def plan_case(mesh_shape, mode, doubling) -> dict[str, int]:
  c, s = case(mode, doubling)
  p = memory.plan(c, s, tuple(mesh_shape), backend='cpu')
  return {ph: p.program_bytes(ph) for ph in PHASES}


def key(mesh_shape, mode, doubling) -> str:
  return f'{",".join(map(str, mesh_shape))}|{mode}|{doubling}'


def report(results: dict[str, dict[str, int]], meshes, modes) -> list[float]:
  """Prints the matrix; returns every ratio (levels and changes)."""
  ratios = []
  print('levels: plan / compiled per device (MiB)')
  for mesh_shape in meshes:
    for mode in modes:
      k = key(mesh_shape, mode, '')
      if k not in results:
        continue
      planned = plan_case(mesh_shape, mode, '')
      cells = []
      for ph in PHASES:
        r = planned[ph] / results[k][ph]
        ratios.append(r)
        cells.append(
          f'{ph} {planned[ph] / 2**20:7.2f}/{results[k][ph] / 2**20:7.2f}={r:4.2f}'
        )
      print(f'  {tuple(mesh_shape)!s:10s} {mode:14s} ' + '  '.join(cells))
  print('changes when one thing doubles: plan change / compiled change')
  for mesh_shape in meshes:
    for mode in modes:
      base = key(mesh_shape, mode, '')
      if base not in results:
        continue
      p0 = plan_case(mesh_shape, mode, '')
      cells = []
      for d in DOUBLINGS:
        k = key(mesh_shape, mode, d)
        if k not in results:
          continue
        p1 = plan_case(mesh_shape, mode, d)
        parts = []
        for ph in PHASES:
          dc = results[k][ph] - results[base][ph]
          dp = p1[ph] - p0[ph]
          if abs(dc) < 0.05 * results[base][ph]:
            # Next to no change: the plan's level at the doubled point.
            r = p1[ph] / results[k][ph]
            ratios.append(r)
            parts.append(f'{ph[:3]} ={r:4.2f}')
            continue
          r = dp / dc
          ratios.append(r)
          parts.append(f'{ph[:3]} {r:4.2f}')
        cells.append(f'{d}: ' + ' '.join(parts))
      if cells:
        print(f'  {tuple(mesh_shape)!s:10s} {mode:14s} ' + ' | '.join(cells))
  if ratios:
    worst = max(ratios, key=lambda r: abs(r - 1))
    inside = sum(0.75 <= r <= 1.25 for r in ratios)
    print(f'{inside}/{len(ratios)} ratios within 0.75-1.25; worst {worst:.2f}')
  return ratios


def _ratios_quiet(results, meshes, modes) -> list[float]:
  import contextlib
  import io

  with contextlib.redirect_stdout(io.StringIO()):
    return report(results, meshes, modes)


def fit(results, meshes, modes, rounds: int = 4) -> dict[str, float]:
  """Coordinate search of memory.FIT minimising the worst |log ratio|."""
  import math

  def loss() -> tuple[float, float]:
    logs = [
      abs(math.log(r)) if r > 0 else 9.0 for r in _ratios_quiet(results, meshes, modes)
    ]
    return max(logs), sum(x * x for x in logs)

  best = loss()
  # The terms the matrix's small model identifies (activations, the round);
  # the ones that scale with the params (grads, weights_block, block_kept)
  # stay as counted from the programs' structure.
  fixed = ('grads', 'weights_block', 'block_kept')
  keys = [k for k in memory.FIT if k not in fixed]
  for _ in range(rounds):
    for k in keys:
      start = memory.FIT[k]
      options = [start * f for f in (0.5, 0.7, 0.85, 0.95, 1.05, 1.2, 1.5, 2.0)]
      options += [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
      for v in options:
        memory.FIT[k] = v
        got = loss()
        if got < best:
          best, start = got, v
      memory.FIT[k] = start
  print(f'fit: worst |log ratio| {best[0]:.3f}')
  return dict(memory.FIT)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--meshes', nargs='*', default=[','.join(map(str, m)) for m in MESHES])
  p.add_argument('--modes', nargs='*', default=list(MODES))
  p.add_argument(
    '--doublings-mesh', default='2,2,2', help='mesh of the doubling checks'
  )
  p.add_argument('--save', default='')
  p.add_argument('--load', default='')
  p.add_argument('--fit', action='store_true', help='refit memory.FIT (with --load)')
  args = p.parse_args()
  meshes = [tuple(int(x) for x in m.split(',')) for m in args.meshes]
  dmesh = tuple(int(x) for x in args.doublings_mesh.split(','))
  results: dict[str, dict[str, int]] = {}
  if args.load:
    with open(args.load) as f:
      results = json.load(f)
  else:
    for mesh_shape in meshes:
      for mode in args.modes:
        for d in ('', *(DOUBLINGS if mesh_shape == dmesh else ())):
          t0 = time.time()
          results[key(mesh_shape, mode, d)] = compile_case(mesh_shape, mode, d)
          print(
            f'# compiled {key(mesh_shape, mode, d)} in {time.time() - t0:.0f} s',
            flush=True,
          )
          if args.save:
            with open(args.save, 'w') as f:
              json.dump(results, f, indent=1)
  if args.fit:
    print(
      'FIT =', {k: round(v, 3) for k, v in fit(results, meshes, args.modes).items()}
    )
  report(results, meshes, args.modes)


if __name__ == '__main__':
  jnp.zeros(())  # JAX initialised with the flags above.
  main()
