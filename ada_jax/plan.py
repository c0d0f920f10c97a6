r"""Memory plan before launch: will this config fit the pod's HBM?

  python -m ada_jax.plan --config configs/qwen25_math_7b.py:tpu=v5p-64 \
      [--config.rl.micro_batch_rows=32 ...] [--devices 32] [--hbm-gib 95]

Prints the per-device bytes of every buffer of one RL step (params in the
training layout and the sampling copy, AdamW state, gradients, prompt cache,
the KV cache of a sampling round, the rollout buffer, the activations of the
old-logp pass and of the update) grouped by phase, and ends with one line:
`fits: X GiB of Y GiB per device` or `does NOT fit: X > Y GiB; reduce ...`.

Needs no TPU and no weights: model dims come from `model.hf_path`'s
config.json when set, else from the built-in table of the four paper models
(planner.models.PAPER_MODELS, by config file name), else (tiny template) from
`model.tiny`. Devices and chip come from the `tpu=` preset of the config arg
(v4-32: 16 chips of 32 GiB, v5p-64: 32 of 95 GiB, v6e-64: 64 of 32 GiB);
`--devices` and `--hbm-gib` override them. The computation lives in
`ada_jax/planner/`.

Dimension legend: B prompts, P prompt bucket, N new tokens, S slots,
M rounds, R training rows, V vocab.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from ada_jax import from_config

# Cores-counted pod names (v4, v5p: two TensorCores per chip, one JAX device).
_CORES_PER_CHIP = {'v2': 2, 'v3': 2, 'v4': 2, 'v5p': 2, 'v5e': 1, 'v6e': 1}


def tpu_preset(name: str) -> tuple[str, int]:
  """'v5p-64' -> ('v5p', 32): the chip kind and the number of JAX devices."""
  m = re.fullmatch(r'(v\d+[a-z]*)-(\d+)', name)
  if not m or m.group(1) not in _CORES_PER_CHIP:
    raise ValueError(f'unknown TPU preset {name!r} (e.g. v4-32, v5p-64, v6e-64)')
  return m.group(1), int(m.group(2)) // _CORES_PER_CHIP[m.group(1)]


def _config_arg(spec: str) -> tuple[str, dict[str, str]]:
  """'configs/x.py:a=1,b' -> ('x', {'a': '1', 'b': ''})."""
  path, _, arg = spec.partition(':')
  args = {}
  for part in arg.split(','):
    key, _, value = part.strip().partition('=')
    if key:
      args[key] = value
  return os.path.splitext(os.path.basename(path))[0], args


def model_config(c, config_name: str):
  """The policy's ModelConfig: hf_path's config.json, the paper table, or tiny."""
  import jax.numpy as jnp

  from ada_jax.planner import models

  if c.model.hf_path or c.data.template == 'tiny':  # As the trainer does.
    return from_config.model_config(c)
  if config_name in models.PAPER_MODELS:
    dtype, param_dtype = jnp.dtype(c.model.dtype), jnp.dtype(c.model.param_dtype)
    return models.model_config(config_name, dtype, param_dtype)
  raise ValueError(
    f'config {config_name}: no model dims: set --config.model.hf_path (config.json '
    f'is read, no weights) or use one of {sorted(models.PAPER_MODELS)}'
  )


def step_shapes(c):
  """StepShapes of a config (R from adaptive.max_rows)."""
  from ada_jax.planner import memory as memory_plan

  rl = c.rl
  rows = from_config.controller(c).max_rows(rl.prompts_per_step)
  return memory_plan.StepShapes(
    prompts=rl.prompts_per_step,
    prompt_len=c.data.prompt_bucket,
    new_tokens=c.sampling.max_new_tokens,
    slots=rl.slots,
    max_rounds=rl.max_rounds,
    rows=rows,
    mini_batch_rows=rl.mini_batch_rows,
    micro_batch_rows=rl.micro_batch_rows,
  )


def _count(n: int) -> str:
  return f'{n / 1e9:.3f}B' if n >= 1e8 else f'{n / 1e6:.3f}M'


def _gib(n: float) -> str:
  return f'{n / 2**30:9.3f}'


def _mib(n: float) -> str:
  return f'{n / 2**20:11.2f}'


def report(c, spec: str, devices: int | None, hbm_gib: float | None) -> str:
  """The plan table and the final fits / does NOT fit line, as text."""
  import jax.numpy as jnp

  from ada_jax.planner import chips
  from ada_jax.planner import memory as memory_plan

  name, args = _config_arg(spec)
  chip = None
  if args.get('tpu'):
    chip, preset_devices = tpu_preset(args['tpu'])
    devices = devices or preset_devices
  if devices is None:
    raise ValueError('no tpu= preset in the config arg: pass --devices')
  if hbm_gib is None:
    if chip not in chips.CHIP_HBM_GIB:
      raise ValueError(f'no HBM size known for chip {chip!r}: pass --hbm-gib')
    hbm_gib = chips.CHIP_HBM_GIB[chip]
  cfg = model_config(c, name)
  shapes = step_shapes(c)
  mesh = memory_plan.resolve_mesh(dict(c.mesh), devices)
  p = memory_plan.plan(cfg, shapes, mesh)
  n_params = memory_plan.count_params(cfg)
  lines = [
    f'plan: {spec}  {devices} devices x {hbm_gib:g} GiB, mesh (data, fsdp, '
    f'tensor) = {mesh}',
    f'model: {cfg.model_type} L={cfg.num_layers} D={cfg.hidden_size} '
    f'H={cfg.num_heads} G={cfg.num_kv_heads} K={cfg.head_dim} '
    f'F={cfg.intermediate_size} V={cfg.vocab_size} tied={cfg.tie_embeddings} '
    f'({_count(n_params)} params, {jnp.dtype(cfg.param_dtype).name} '
    f'master, {c.model.dtype} compute/KV)',
    f'step: B={shapes.prompts} P={shapes.prompt_len} N={shapes.new_tokens} '
    f'S={shapes.slots} M={shapes.max_rounds} R={shapes.rows} '
    f'mini={shapes.mini_batch_rows} micro={shapes.micro_batch_rows}',
    '',
    f'{"component":<34} {"phase":<9} {"GiB/dev":>9} {"MiB/dev":>11}  note',
  ]
  for item in p.items:
    lines.append(
      f'{item.name:<34} {item.phase:<9} {_gib(item.bytes)} {_mib(item.bytes)}  '
      f'{item.note}'
    )
  lines.append('')
  for phase, total in p.phases.items():
    mark = '  <- peak' if phase == p.peak_phase else ''
    lines.append(f'total during {phase:<9}{"":<22}{_gib(total)} {_mib(total)}{mark}')
  hbm = hbm_gib * 2**30
  if p.update_rows_per_device > p.update_rows_intended:
    fixed = memory_plan.plan(cfg, shapes, mesh, micro_rows=p.update_rows_intended)
    lines.append(
      f'note: update.rl_update computes {p.update_rows_per_device} rows/device per '
      f'micro-batch, not {shapes.micro_batch_rows}/{mesh[0] * mesh[1]} = '
      f'{p.update_rows_intended}: its [R/mini, mini/micro, micro] reshape puts the '
      'row shards on the scanned dims; split over all data x fsdp devices, the '
      f'update would need {fixed.phase_bytes("update") / 2**30:.2f} GiB'
    )
  if p.phase_bytes('old_logp') > hbm:
    lines.append(
      f'note: the old-logp pass (update.logp_jit) runs all R={shapes.rows} rows '
      'at once; micro-batched like the update it would need a fraction of that'
    )
  if p.get('update activations') > hbm / 2:
    lines.append(
      "note: the update keeps every layer's activations and [H, T, T] scores "
      'for the backward (no remat, no flash attention in model.py)'
    )
  peak_gib = p.peak / 2**30
  if peak_gib <= hbm_gib:
    lines.append(
      f'fits: {peak_gib:.2f} GiB of {hbm_gib:g} GiB per device (peak: {p.peak_phase})'
    )
  else:
    knobs = memory_plan.biggest_knobs(p)
    keys = [k for k in knobs if not k.startswith('a larger')]
    other = [k for k in knobs if k.startswith('a larger')]
    advice = ' or use '.join(
      x for x in (f'reduce {", ".join(keys)}' if keys else '', *other) if x
    )
    lines.append(
      f'does NOT fit: {peak_gib:.2f} > {hbm_gib:g} GiB per device (peak: '
      f'{p.peak_phase}); {advice}'
    )
  return '\n'.join(lines)


def parser() -> argparse.ArgumentParser:
  """--config, --devices, --hbm-gib; `--config.key=value` overrides pass through."""
  p = argparse.ArgumentParser(
    prog='python -m ada_jax.plan', description=__doc__.splitlines()[0]
  )
  p.add_argument('--config', required=True, help='configs/NAME.py[:tpu=PRESET,...]')
  p.add_argument(
    '--devices', type=int, default=None, help='JAX devices (chips); default: tpu='
  )
  p.add_argument(
    '--hbm-gib', type=float, default=None, help='HBM per device; default: tpu='
  )
  return p


def main(argv: Sequence[str] | None = None) -> None:
  """Command line (see the module docstring)."""
  p = parser()
  args, rest = from_config.parse_command_line(p, argv)
  try:
    c = from_config.load(args.config, rest)
    print(report(c, args.config, args.devices, args.hbm_gib))
  except ValueError as e:
    sys.exit(f'plan: {e}')


if __name__ == '__main__':
  main()
