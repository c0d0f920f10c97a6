r"""The memory plan against the TPU compiler: paper configs on their pods.

  python benchmarks/tpu_calibration.py [--layers 2] [--out FILE.jsonl] \
      [--configs qwen25_math_1p5b,...] [--pods v4-32,v5p-64,v6e-64] \
      [--variants balance,dapo] [--phases sampling,old_logp,...]

For every (config, pod, variant) it resolves the layout by the plan's rule
(`from_config.resolve_layout`), compiles each phase's real program for the
pod's topology with the TPU compiler (libtpu, no chip: `python -m
ada_jax.plan --check --target tpu` does the same for one config) and prints
one line per phase: plan / compiled GiB, their ratio and the compile time;
`--out` appends each as a JSON line (with XLA's arguments, outputs, aliased
and temporaries) so a later run can refit the planner's TPU terms
(planner/memory.py, FIT_TPU) from them. A layout the rule refuses (nothing
fits the pod) is printed as such and compiled at the largest tensor axis.

Needs `pip install libtpu` (requirements-test.txt has it). Slow: a phase of
a 2-layer paper model compiles in 10-80 s on 2 cores; at full depth the
sampling round (unrolled over layers) takes minutes.

Dimension legend: none (per-device bytes only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

import jax.numpy as jnp  # noqa: E402

from ada_jax import from_config, plan, sharding  # noqa: E402
from ada_jax.infra import tpu_pods  # noqa: E402
from ada_jax.planner import chips  # noqa: E402
from ada_jax.planner import memory as memory_plan  # noqa: E402

PAPER = (
  'qwen25_math_1p5b',
  'llama32_3b_instruct',
  'qwen3_4b_instruct',
  'qwen25_math_7b',
)
PHASES = (*memory_plan.TRAINING_PHASES, *memory_plan.COMMAND_PHASES)


def calibrate(
  config: str,
  pod: str,
  variant: str,
  layers: int,
  phases,
  out=None,
  filt='',
  mesh=None,
):
  """Plan vs TPU-compiled per phase for one config on one pod; prints lines.

  filt: 'on' / 'off' compiles the rounds with / without the top-p filter
  ('': as the config's sampling knobs decide, off for the paper configs).
  mesh: (data, fsdp, tensor) instead of the rule's, one row per batch shard
  per micro-batch.
  """
  spec = f'configs/{config}.py:tpu={pod},variant={variant}'
  c = from_config.load(spec)
  if mesh:
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
    c.rl.micro_batch_rows = mesh[0] * mesh[1]
  cfg = dataclasses.replace(plan.model_config(c, config), platform='tpu')
  p = tpu_pods.pod(pod)
  hbm = chips.CHIPS[p.generation].hbm_gib * 2**30
  # The full depth's layout (as `plan --layers` keeps it), then L layers.
  chosen = from_config.resolve_layout(c, cfg, p.chips, hbm, 'tpu', refuse=False)
  if layers:
    cfg = dataclasses.replace(cfg, num_layers=layers)
  shapes = from_config.step_shapes(c, cfg)
  if filt:
    shapes = dataclasses.replace(shapes, filter_logits=filt == 'on')
  mesh_shape = memory_plan.resolve_mesh(dict(c.mesh), p.chips)
  pl = memory_plan.plan(cfg, shapes, mesh_shape, backend='tpu')
  mesh = sharding.make_mesh(mesh_shape, tpu_pods.devices(p))
  fits = 'fits' if chosen is None or chosen.fits else 'does NOT fit'
  print(
    f'{config} {pod} {variant} L={cfg.num_layers}: mesh {mesh_shape} micro '
    f'{shapes.micro_batch_rows} ({fits}: peak {pl.peak / 2**30:.2f} GiB)',
    flush=True,
  )
  for phase in phases:
    start = time.perf_counter()
    got = plan.compiled_phases(cfg, shapes, mesh, (phase,))[phase]
    seconds = time.perf_counter() - start
    planned = pl.program_bytes(phase)
    print(
      f'  {phase:<11} plan {planned / 2**30:8.3f} GiB  '
      f'{"refused, needs" if got.refused else "compiled"} '
      f'{got.total / 2**30:8.3f} GiB  ratio {planned / got.total:5.2f}  '
      f'({seconds:.0f} s)',
      flush=True,
    )
    if out:
      row = dict(
        config=config,
        pod=pod,
        variant=variant,
        layers=cfg.num_layers,
        mesh=mesh_shape,
        micro=shapes.micro_batch_rows,
        phase=phase,
        plan=planned,
        compiled=got.total,
        compile_s=round(seconds, 1),
        **dataclasses.asdict(got),
        items={i.name.strip(): i.bytes for i in pl.items},
        shapes=dataclasses.asdict(shapes),
        model=_model_fields(cfg),
      )
      with open(out, 'a') as f:
        f.write(json.dumps(row) + '\n')


def _model_fields(cfg) -> dict:
  """What rebuilds the ModelConfig from `planner.models` (see `table_row`)."""
  return dict(
    num_layers=cfg.num_layers,
    dtype=jnp.dtype(cfg.dtype).name,
    param_dtype=jnp.dtype(cfg.param_dtype).name,
    attention=cfg.attention,
    remat=cfg.remat,
  )


def table_row(row: dict) -> dict:
  """A saved JSONL row as the test table keeps it (tests/data/tpu_compiled.json).

  Rows written before they carried `shapes` and `model` get them from the
  config (as `calibrate` would have, at the row's micro-batch).
  """
  if 'shapes' not in row or 'model' not in row:
    c = from_config.load(
      f'configs/{row["config"]}.py:tpu={row["pod"]},variant={row["variant"]}'
    )
    cfg = dataclasses.replace(
      plan.model_config(c, row['config']), platform='tpu', num_layers=row['layers']
    )
    shapes = dataclasses.replace(
      from_config.step_shapes(c, cfg),
      micro_batch_rows=row['micro'],
      filter_logits=True,
    )
    row = dict(row, shapes=dataclasses.asdict(shapes), model=_model_fields(cfg))
  # Rows saved before the filter was one of the shapes compiled their rounds
  # with it (`sampler.lower_round`'s default then).
  row = dict(row, shapes={'filter_logits': True, **row['shapes']})
  keep = ('config', 'pod', 'variant', 'layers', 'mesh', 'phase', 'compile_s')
  keep += ('arguments', 'outputs', 'aliased', 'temp', 'compiled', 'shapes', 'model')
  out = {k: row[k] for k in keep}
  if row.get('refused'):  # The compiler refused it for the chip's HBM.
    out['refused'] = True
  return out


def write_table(paths: list[str], out: str) -> None:
  """The latest row of each (config, pod, variant, layers, mesh, micro, phase)."""
  rows = {}
  for path in paths:
    for line in pathlib.Path(path).read_text().splitlines():
      r = json.loads(line)
      key = (r['config'], r['pod'], r['variant'], r['layers'], tuple(r['mesh']))
      r = table_row(r)
      filt = r['shapes']['filter_logits']
      waves = r['shapes'].get('waves', 1)
      cast = r['shapes'].get('command_cast', True)
      rows[(*key, r['shapes']['micro_batch_rows'], filt, waves, cast, r['phase'])] = r
  table = [r for _, r in sorted(rows.items())]
  lines = ',\n'.join(json.dumps(r, separators=(',', ':')) for r in table)
  pathlib.Path(out).write_text(f'[\n{lines}\n]\n')
  print(f'{len(table)} rows -> {out}')


def main(argv=None) -> None:
  """Command line (see the module docstring)."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--configs', default=','.join(PAPER))
  p.add_argument('--pods', default='v4-32,v5p-64,v6e-64')
  p.add_argument('--variants', default='balance,dapo')
  p.add_argument('--phases', default=','.join(PHASES))
  p.add_argument('--layers', type=int, default=2, help='0: full depth')
  p.add_argument(
    '--meshes',
    default='',
    help="'D,F,T;D,F,T': compile at these (data, fsdp, tensor) instead of the rule's",
  )
  p.add_argument('--out', default='')
  p.add_argument(
    '--filter', default='', choices=['', 'on', 'off'], help='top-p filter in rounds'
  )
  p.add_argument(
    '--table',
    default='',
    help='write the saved JSONL files (positional) as the test table at this path',
  )
  p.add_argument('jsonl', nargs='*')
  args = p.parse_args(argv)
  if args.table:
    write_table(args.jsonl, args.table)
    return
  meshes = [tuple(map(int, m.split(','))) for m in args.meshes.split(';') if m]
  for config in args.configs.split(','):
    for pod in args.pods.split(','):
      for variant in args.variants.split(','):
        for mesh in meshes or [None]:
          calibrate(
            config,
            pod,
            variant,
            args.layers,
            args.phases.split(','),
            args.out,
            args.filter,
            mesh,
          )


if __name__ == '__main__':
  main()
