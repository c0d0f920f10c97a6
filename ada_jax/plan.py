r"""Memory plan before launch: will this config fit the pod's HBM?

  python -m ada_jax.plan --config configs/qwen25_math_7b.py:tpu=v5p-64 \
      [--config.rl.micro_batch_rows=32 ...] [--devices 32] [--hbm-gib 95] \
      [--write-gbps 1] [--check [--check-phases update,old_logp,...]]

Prints the per-device bytes of every buffer of one RL step (params in the
training layout and the sampling copy, AdamW state, gradients, prompt cache,
the KV cache of a sampling round, the rollout buffer, the activations of the
old-logp pass and of the update) grouped by phase, and ends with one line:
`fits: X GiB of Y GiB per device` or `does NOT fit: X > Y GiB; ...` naming
the smallest change that fits. Before it: the trainer's own evaluation and
the evaluate / select_prompts commands (their own verdicts), a roofline
step-time estimate per phase, the paper's measured step times of the same
model (none for a model the paper did not time), the checkpoint write
against the preemption notice, and the run's estimated total time and
chip-hours (`planner.run_time`: the steps, the trainer's evaluations and
pass-rate histograms, the checkpoint writes at an assumed per-host write
bandwidth, `--write-gbps`): lower bounds, information, not a promise.

`--check` then compiles the config's real programs (the trainer's jitted
update, old-logp pass and sampling rounds, on abstract inputs in the layouts
the trainer produces) on the devices at hand and prints `phase NAME: plan X
GiB, compiled Y GiB, ratio R` per phase and `check: worst ratio R (PHASE)`.
On CPU `--devices N` fakes N devices; XLA:CPU says nothing certain about TPU
tiling. On a TPU VM it compiles for the real chips (no weights needed).

`--launch-check run|eval` is `launch_tpu.sh`'s check on the user's
machine before it sends anything to the pod: the config rules as the job
runs them (on the pod's chips as CPU devices; a paper model's files, which
are on the workers, stood in by its config.json) and the plan's line for
the command; exit 10 and one line when refused (`launch_check`).

Needs no TPU and no weights: model dims come from `model.hf_path`'s
config.json when set, else from the built-in table of the four paper models
(planner.models.PAPER_MODELS, by config file name), else (tiny template) from
`model.tiny`. Devices and chip come from the `tpu=` preset of the config arg
(v4-32: 16 chips of 32 GiB, v5p-64: 32 of 95 GiB, v6e-64: 64 of 32 GiB)
or its `gpu=` preset (8xh100: the paper's 8 H100s, planned for the GPU
platform against what JAX may allocate on each, HBM x
XLA_PYTHON_CLIENT_MEM_FRACTION or its default 0.75: 59.7 of 79.6 GiB,
printed on a `memory:` line; there the paper's step times are like for
like, and the line says so); `--devices` and `--hbm-gib` override them.
The computation lives in `ada_jax/planner/`.

Dimension legend: B prompts, P prompt bucket, N new tokens, S slots,
M rounds, R training rows, V vocab.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from ada_jax import from_config


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
  """The policy's ModelConfig: hf_path's config.json, the paper table, or tiny.

  With the config's execution choices (`model.attention`, `model.remat`).
  """
  import dataclasses

  import jax.numpy as jnp

  from ada_jax.planner import models

  if c.model.hf_path or c.data.template == 'tiny':  # As the trainer does.
    return from_config.model_config(c)
  if config_name in models.PAPER_MODELS:
    dtype, param_dtype = jnp.dtype(c.model.dtype), jnp.dtype(c.model.param_dtype)
    cfg = models.model_config(config_name, dtype, param_dtype)
    return dataclasses.replace(cfg, **from_config.execution(c))
  raise ValueError(
    f'config {config_name}: no model dims: set --config.model.hf_path (config.json '
    f'is read, no weights) or use one of {sorted(models.PAPER_MODELS)}'
  )


# What `python -m ada_jax.evaluate` generates by default (its
# DEFAULT_MAX_NEW_TOKENS; a command does not import another), capped there
# by the model's positions minus the prompt bucket.
EVAL_NEW_TOKENS = 4096


def step_shapes(c, cfg=None, eval_new_tokens: int = EVAL_NEW_TOKENS):
  """StepShapes of a config (`from_config.step_shapes`)."""
  return from_config.step_shapes(c, cfg, eval_new_tokens)


def _count(n: int) -> str:
  return f'{n / 1e9:.3f}B' if n >= 1e8 else f'{n / 1e6:.3f}M'


def _gib(n: float) -> str:
  return f'{n / 2**30:9.3f}'


def _mib(n: float) -> str:
  return f'{n / 2**20:11.2f}'


_PHASE_ORDER = (
  'resident',
  'reshard',
  'prefill',
  'sampling',
  'old_logp',
  'update',
  'pass_rates',
  'evaluation',
  'selection',
)


def _target(c, devices: int | None, hbm_gib: float | None):
  """(chip kind or None, devices, memory GiB per device) from the preset and overrides.

  The memory is what a program may use (`planner.chips.allocatable_gib`): a
  TPU's HBM, a GPU's share that JAX allocates (HBM x
  XLA_PYTHON_CLIENT_MEM_FRACTION or its default); `--hbm-gib` overrides it.
  """
  from ada_jax.planner import chips

  chip = None
  target = from_config.preset(c)
  if target is not None:
    chip = target.chip
    devices = devices or target.devices
  if devices is None:
    raise ValueError('no tpu= or gpu= preset in the config arg: pass --devices')
  if hbm_gib is None:
    if chip not in chips.CHIPS:
      raise ValueError(f'no HBM size known for chip {chip!r}: pass --hbm-gib')
    hbm_gib = chips.allocatable_gib(chips.CHIPS[chip])
  return chip, devices, hbm_gib


def _gib_figure(gib: float) -> str:
  """'95', '32', '8.5' as before; '59.7' for a GPU's fractional share."""
  return f'{gib:g}' if round(gib, 1) == gib else f'{gib:.1f}'


def budget_line(chip: str | None, hbm_gib: float, environ: dict | None = None) -> str:
  """What the plan's per-device memory is, for a GPU chip; '' for a TPU or none.

  A GPU's budget is the share JAX preallocates, not its HBM: the line says
  which fraction that is and where it comes from, so a reader knows both
  the figure and the knob. `--hbm-gib` (a figure other than the share) is
  said as such.
  """
  from ada_jax.planner import chips

  if chip not in chips.CHIPS or chips.CHIPS[chip].platform != 'gpu':
    return ''
  gpu = chips.CHIPS[chip]
  env = os.environ if environ is None else environ
  fraction = chips.gpu_mem_fraction(env)
  if abs(hbm_gib - chips.allocatable_gib(gpu, env)) > 1e-9:
    return (
      f'memory: {_gib_figure(hbm_gib)} GiB per GPU as --hbm-gib says (of '
      f'{gpu.hbm_gib:.1f} GiB HBM; JAX allocates '
      f'{chips.GPU_MEM_FRACTION_ENV}={fraction:g} of it)'
    )
  source = (
    'from the environment'
    if env.get(chips.GPU_MEM_FRACTION_ENV)
    else 'the default; raise it to give JAX more'
  )
  return (
    f'memory: {hbm_gib:.1f} GiB allocatable of {gpu.hbm_gib:.1f} GiB per GPU '
    f'({chips.GPU_MEM_FRACTION_ENV}={fraction:g}, {source})'
  )


def _seconds(seconds: float) -> str:
  """'29.5 s', or '0.0123 s' below a second (a tiny model's parts)."""
  return f'{seconds:.1f} s' if seconds >= 1 else f'{seconds:.3g} s'


def _duration(seconds: float) -> str:
  """'3.29 h (11847 s)', '12.5 min (750 s)' or '0.0123 s'."""
  if seconds >= 3600:
    return f'{seconds / 3600:.2f} h ({seconds:.0f} s)'
  if seconds >= 60:
    return f'{seconds / 60:.1f} min ({seconds:.0f} s)'
  return _seconds(seconds)


def _paper_model(c) -> str:
  """The released model the config plans (its Hub id), '' for a tiny one."""
  if c.data.template == 'tiny' and not c.model.hf_path:
    return ''  # runlocal: a random tiny model of the family, not the paper's.
  return c.model.get('hub_id', '')


def paper_step_line(
  c, chip: str | None = None, devices: int = 0, step_seconds: float | None = None
) -> str:
  """The paper's measured step times of the config's own model, or that it has none.

  On the paper's own hardware (`step_time.PaperSteps.chip` x `devices`:
  8xH100) the line says it is a like-for-like comparison and, with
  `step_seconds` (the roofline's step), how the bound compares with the
  paper's time of this config's rule. Elsewhere (TPU, 8xH200) the times are
  the paper's 8xH100 times, beside a roofline of other hardware.
  """
  from ada_jax.planner import step_time

  model = _paper_model(c)
  paper = step_time.paper_steps(model) if model else None
  if paper is None:
    timed = ', '.join(step_time.PAPER_STEP_S)
    return (
      f'paper step times: none for {model or "this model"} (the paper timed '
      f'{timed} only)'
    )
  times = ', '.join(f'{k} {v:g} s' for k, v in paper.seconds.items())
  line = (
    f'paper step times of {model.rsplit("/", 1)[-1]} ({paper.source}; this '
    f'config: {c.rl.rule}): {times}'
  )
  if not paper.same_hardware(chip, devices):
    return line
  line += f'; like for like: the same hardware as this plan ({devices}x{chip})'
  measured = paper.seconds.get(c.rl.rule)
  if step_seconds is not None and measured:
    # The bound over the measured time: how much of the measured step the
    # chip's peaks alone explain.
    line += (
      f', the roofline step of {step_seconds:.1f} s is '
      f'{step_seconds / measured:.2f}x the measured {c.rl.rule} step'
    )
  return line


def time_lines(
  c,
  cfg,
  shapes,
  mesh,
  chip: str | None,
  write_gbps: float | None = None,
  score_slots: int = 0,
) -> list[str]:
  """The roofline per step phase, the run's total and chip-hours, the paper's.

  All lower bounds: information, not a promise. write_gbps: the assumed
  per-host checkpoint write bandwidth (None: `checkpoint_time.WRITE_GBPS`).
  score_slots: the slots of the trainer's scoring passes
  (`RLSettings.score_slots`; 0: the step's S).
  """
  import math

  import jax.numpy as jnp

  from ada_jax.planner import checkpoint_time, chips, run_time, step_time

  if write_gbps is None:
    write_gbps = checkpoint_time.WRITE_GBPS
  # Each host writes its share of a checkpoint (a CPU host: all of it); the
  # preset's hosts, or as many of its hosts as --devices chips fill.
  hosts = 1
  target = from_config.preset(c)
  if target is not None:
    hosts = max(1, math.prod(mesh) // target.devices_per_host)
  write = checkpoint_time.write_seconds(cfg, hosts, write_gbps)
  checkpoint = f'{write.line()}; --write-gbps sets the bandwidth'
  if chip not in chips.CHIPS:
    return [
      'step and run time: no chip peaks known (no tpu= or gpu= preset): not estimated',
      paper_step_line(c),
      checkpoint,
    ]
  # The sampling copy and the KV cache are in the compute dtype.
  copy = dict(
    sample_bytes=jnp.dtype(cfg.dtype).itemsize, kv_bytes=jnp.dtype(cfg.dtype).itemsize
  )
  phases = step_time.estimate(
    cfg,
    prompts=shapes.prompts,
    prompt_len=shapes.prompt_len,
    new_tokens=shapes.new_tokens,
    slots=shapes.slots,
    rounds=shapes.max_rounds,
    rows=shapes.rows,
    micro_batch_rows=shapes.micro_batch_rows,
    mini_batch_rows=shapes.mini_batch_rows,
    epochs=c.rl.epochs,
    mesh=mesh,
    chip=chips.CHIPS[chip],
    remat=cfg.remat,
    attention=cfg.attention,
    slot_group=shapes.slot_group,
    waves=shapes.waves,
    **copy,
  )
  lines = [
    f'step time (roofline lower bound on {chip}: information, not a promise; '
    'collectives, the host, the verifier and kernel efficiency come on top):'
  ]
  for ph in phases:
    lines.append(
      f'  {ph.name:<16} {ph.seconds:8.1f} s  {ph.bound}-bound  '
      f'{ph.flops / 1e12:10.1f} TFLOP, {ph.hbm_bytes / 1e9:9.1f} GB per device  '
      f'{ph.note}'
    )
  step = step_time.total_seconds(phases)
  lines.append(f'  {"step":<16} {step:8.1f} s')
  lines.append(paper_step_line(c, chip, math.prod(mesh), step))
  lines.append(checkpoint)
  rl = c.rl
  # The trainer evaluates its eval split's first rl.eval_max_prompts (0: all
  # of it, a size known only once the data is built: not counted then).
  eval_prompts = rl.eval_max_prompts if c.data.eval_split else 0
  every_minutes = float(c.checkpoint.get('every_minutes', 0))
  run = run_time.estimate(
    cfg,
    steps=rl.steps,
    step_seconds=step,
    slots=score_slots or shapes.slots,
    prompt_len=shapes.prompt_len,
    new_tokens=shapes.new_tokens,
    mesh=mesh,
    chip=chips.CHIPS[chip],
    eval_prompts=eval_prompts,
    eval_every=rl.eval_every,
    eval_sampled_k=rl.get('eval_sampled_k', 0),
    histogram_prompts=rl.histogram_prompts,
    histogram_k=rl.histogram_k,
    checkpoint_every=c.checkpoint.every,
    checkpoint_every_minutes=every_minutes,
    hosts=hosts,
    write_gbps=write_gbps,
    attention=cfg.attention,
    **copy,
  )
  lines.append(
    'run time (lower bound: every part at its roofline, one after another; '
    'information, not a promise):'
  )
  parts = [(f'{run.steps} RL steps x {_seconds(run.step_seconds)}', run.steps_seconds)]
  for s in run.scorings:
    parts.append(
      (
        f'{s.name}: {s.runs} x {s.prompts} prompts x k={s.k}, '
        f'{score_slots or shapes.slots} slots',
        s.total_seconds,
      )
    )
  minutes = f' or {every_minutes:g} min' if every_minutes > 0 else ''
  parts.append(
    (
      f'checkpoint writes: {run.checkpoints} x {_seconds(run.write.seconds)} (every '
      f'{c.checkpoint.every} steps{minutes}, at {run.write.gbps:g} GB/s per host)',
      run.checkpoint_seconds,
    )
  )
  lines.extend(f'  {what:<72}{_seconds(seconds):>12}' for what, seconds in parts)
  if not c.data.eval_split:
    lines.append('  no held-out evaluation (data.eval_split is empty)')
  left_out = ['compiles, loading weights and data, the verifier']
  if c.data.eval_split and not rl.eval_max_prompts:
    left_out.append(
      f'the evaluations of the whole {c.data.eval_split!r} split (its size is '
      'known once the data is built; rl.eval_max_prompts counts them)'
    )
  if c.sft.steps:
    left_out.append(f'SFT ({c.sft.steps} steps)')
  lines.append(f'  not counted: {"; ".join(left_out)}')
  hours = f'{run.chip_hours:.1f}' if run.chip_hours >= 0.1 else f'{run.chip_hours:.2g}'
  unit = 'GPU' if chips.CHIPS[chip].platform == 'gpu' else 'chip'
  lines.append(
    f'estimated run time (lower bound): at least {_duration(run.total_seconds)} '
    f'on {run.chips} {chip} {unit}s = at least {hours} {unit}-hours'
  )
  return lines


def report(
  c,
  spec: str,
  devices: int | None,
  hbm_gib: float | None,
  *,
  eval_new_tokens: int = EVAL_NEW_TOKENS,
  cfg: Any = None,
  write_gbps: float | None = None,
) -> str:
  """The plan table, the step and run time and the final fits / does NOT fit line.

  cfg: the ModelConfig to plan (default: the config's; `--layers` and
  `--target` pass their own). write_gbps: the assumed per-host checkpoint
  write bandwidth, GB/s (None: `checkpoint_time.WRITE_GBPS`).
  """
  import jax.numpy as jnp

  from ada_jax.infra import platforms
  from ada_jax.planner import chips
  from ada_jax.planner import memory as memory_plan

  name, _ = _config_arg(spec)
  chip, devices, hbm_gib = _target(c, devices, hbm_gib)
  cfg = model_config(c, name) if cfg is None else cfg
  if cfg.platform:
    backend = platforms.name(cfg.platform)
  else:  # The preset chip's platform (tpu=: TPU, gpu=: GPU).
    backend = chips.CHIPS[chip].platform if chip in chips.CHIPS else 'cpu'
  from_config.resolve_layout(c, cfg, devices, hbm_gib * 2**30, backend, refuse=False)
  shapes = step_shapes(c, cfg, eval_new_tokens)
  mesh = memory_plan.resolve_mesh(dict(c.mesh), devices)
  p = memory_plan.plan(cfg, shapes, mesh, backend=backend)
  n_params = memory_plan.count_params(cfg)
  t = shapes.prompt_len + shapes.new_tokens
  lines = [
    f'plan: {spec}  {devices} devices x {_gib_figure(hbm_gib)} GiB, mesh (data, '
    f'fsdp, tensor) = {mesh}',
    *filter(None, [budget_line(chip, hbm_gib)]),
    f'model: {cfg.model_type} L={cfg.num_layers} D={cfg.hidden_size} '
    f'H={cfg.num_heads} G={cfg.num_kv_heads} K={cfg.head_dim} '
    f'F={cfg.intermediate_size} V={cfg.vocab_size} tied={cfg.tie_embeddings} '
    f'({_count(n_params)} params, {jnp.dtype(cfg.param_dtype).name} '
    f'master, {c.model.dtype} compute/KV)',
    f'step: B={shapes.prompts} P={shapes.prompt_len} N={shapes.new_tokens} '
    f'S={shapes.slots} M={shapes.max_rounds} R={shapes.rows} '
    f'mini={shapes.mini_batch_rows} micro={shapes.micro_batch_rows} '
    f'({p.update_rows_per_device} rows/device), attention={cfg.attention} '
    f'({memory_plan.attention_impl(cfg, t, backend)} at T={t} on {backend}), '
    f'remat={cfg.remat}',
    '',
    f'{"component":<46} {"phase":<10} {"GiB/dev":>9} {"MiB/dev":>11}  note',
  ]
  for phase in _PHASE_ORDER:
    for item in p.items:
      if item.phase == phase:
        lines.append(
          f'{item.name.strip():<46} {item.phase:<10} {_gib(item.bytes)} '
          f'{_mib(item.bytes)}  {item.note}'
        )
  lines.append('')
  for phase, total in p.phases.items():
    mark = '  <- peak' if phase == p.peak_phase else ''
    lines.append(f'total during {phase:<10}{"":<34}{_gib(total)} {_mib(total)}{mark}')
  hbm = hbm_gib * 2**30
  totals, chunks = {}, {}
  for phase, command in (
    (
      'pass_rates',
      "the trainer's evaluation and pass-rate histogram (S/k prompts x k)",
    ),
    ('evaluation', f'python -m ada_jax.evaluate (N={shapes.eval_new_tokens})'),
    ('selection', 'python -m ada_jax.select_prompts'),
  ):
    # Each runs in chunks of rl.slots halved until its phase fits, as the
    # commands and the trainer (RLSettings.score_slots) size them.
    new = shapes.eval_new_tokens if phase == 'evaluation' else shapes.new_tokens
    slots = from_config.command_slots(c, cfg, phase, new, hbm=hbm, devices=devices)
    sized = dataclasses.replace(shapes, slots=slots)
    totals[phase] = memory_plan.plan(cfg, sized, mesh, backend=backend).phase_bytes(
      phase
    )
    chunks[phase] = slots
    verdict = 'fits' if totals[phase] <= hbm else 'does NOT fit'
    lines.append(
      f'{command}: {totals[phase] / 2**30:.2f} GiB per device at {slots} slots per '
      f'chunk, {verdict}'
    )
  if any(t > hbm for t in totals.values()):
    lines.append(
      'note: these score S // k prompts x k samples per round of S slots '
      '(k = 1: S prompts in an aligned round, slot i continuing prompt i); '
      'fewer slots (rl.slots, or --slots of the commands) shrink them'
    )
  lines.append('')
  score_slots = chunks['pass_rates']
  lines.extend(time_lines(c, cfg, shapes, mesh, chip, write_gbps, score_slots))
  lines.append('')
  peak_gib = p.peak / 2**30
  budget = _gib_figure(hbm_gib)
  if peak_gib <= hbm_gib:
    lines.append(
      f'fits: {peak_gib:.2f} GiB of {budget} GiB per device (peak: {p.peak_phase})'
    )
  else:
    change = memory_plan.smallest_change(cfg, shapes, mesh, hbm, backend=backend)
    lines.append(
      f'does NOT fit: {peak_gib:.2f} > {budget} GiB per device (peak: '
      f'{p.peak_phase}); {change}'
    )
  return '\n'.join(lines)


def check_devices(c, devices: int, target: str) -> tuple[Any, str]:
  """(devices to compile for, what they are) for --check.

  --target tpu on a host without TPU chips: the config pod's real devices
  from libtpu's topology description (`infra.tpu_pods`), compiled by the
  TPU compiler ahead of time. Otherwise the devices at hand (a TPU VM's
  chips, or fake CPU devices from --devices).
  """
  import jax

  from ada_jax.infra import platforms, tpu_pods

  running = platforms.name()
  if target == 'tpu' and running != 'tpu':
    if not c.get('pod', ''):
      raise ValueError('--target tpu needs a tpu= preset in the config arg (the pod)')
    pod = tpu_pods.pod(c.pod)
    try:
      devs = tpu_pods.devices(pod)
    except RuntimeError as e:
      raise ValueError(str(e)) from None
    return devs, (
      f'{pod.accelerator}: libtpu topology {pod.topology}, {pod.hosts} hosts x '
      f'{pod.chips_per_host_count} chips, compiled ahead of time by the TPU '
      'compiler (no chip)'
    )
  if target and target != running:
    raise ValueError(
      f'--target {target}: this host runs {running}; only tpu can be compiled '
      'for from another platform (libtpu topologies)'
    )
  if jax.device_count() != devices:
    raise ValueError(
      f'--check compiles on the devices at hand: {jax.device_count()} here, the '
      f'plan is for {devices} (on CPU pass --devices {devices})'
    )
  return jax.devices(), f'{jax.device_count()} {running} devices at hand'


def mesh_line(c, mesh: Any, where: str) -> str:
  """`mesh: ...`: the topology, hosts, chips per host and the rows each host feeds."""
  from ada_jax.infra import multihost

  b = c.rl.prompts_per_step
  sh = multihost.rows_sharding(mesh, b)
  hosts = sorted({d.process_index for d in mesh.devices.flat})
  per_host = {}
  for h in hosts:
    blocks = multihost.row_blocks(sh, b, process_index=h)
    per_host[h] = (sum(hi - lo for lo, hi in blocks), len(blocks))
  rows = sorted({v[0] for v in per_host.values()})
  nblocks = sorted({v[1] for v in per_host.values()})
  chips = len(mesh.devices.flat) // len(hosts)
  shape = tuple(mesh.shape[a] for a in mesh.axis_names)
  return (
    f'mesh: {where}; (data, fsdp, tensor) = {shape}; {len(hosts)} hosts x '
    f'{chips} chips; each host feeds {"/".join(map(str, rows))} of {b} prompt '
    f'rows (in {"/".join(map(str, nblocks))} blocks)'
  )


def check_report(
  c,
  spec: str,
  devices: int | None,
  hbm_gib: float | None,
  phases: Sequence[str],
  *,
  eval_new_tokens: int = EVAL_NEW_TOKENS,
  cfg: Any = None,
  target: str = '',
  timings: dict[str, float] | None = None,
) -> str:
  """Plan vs compiled per phase for the config's real programs (--check).

  target: '' the devices at hand, 'tpu' a TPU pod's devices from libtpu
  when this host has none (see `check_devices`). `timings`, when given,
  receives each phase's compile seconds.
  """
  import time

  import jax.numpy as jnp

  from ada_jax import sharding
  from ada_jax.infra import platforms
  from ada_jax.planner import memory as memory_plan

  name, _ = _config_arg(spec)
  _, devices, hbm_gib = _target(c, devices, hbm_gib)
  cfg = model_config(c, name) if cfg is None else cfg
  cfg = dataclasses.replace(cfg, platform=target or platforms.name())
  backend = platforms.name(cfg.platform)
  from_config.resolve_layout(c, cfg, devices, hbm_gib * 2**30, backend, refuse=False)
  shapes = step_shapes(c, cfg, eval_new_tokens)
  mesh_shape = memory_plan.resolve_mesh(dict(c.mesh), devices)
  p = memory_plan.plan(cfg, shapes, mesh_shape, backend=backend)
  devs, where = check_devices(c, devices, target)
  mesh = sharding.make_mesh(mesh_shape, devs)
  lines = [mesh_line(c, mesh, where)]
  worst = None
  for phase in phases:
    start = time.perf_counter()
    got = compiled_phases(cfg, shapes, mesh, (phase,))[phase]
    seconds = time.perf_counter() - start
    if timings is not None:
      timings[phase] = seconds
    planned = p.program_bytes(phase)
    ratio = planned / got.total
    compiled = 'refused by the compiler, needs' if got.refused else 'compiled'
    lines.append(
      f'phase {phase}: plan {planned / 2**30:.3f} GiB, {compiled} '
      f'{got.total / 2**30:.3f} GiB, ratio {ratio:.2f} (compiled in {seconds:.0f} s)'
    )
    if worst is None or abs(ratio - 1) > abs(worst[0] - 1):
      worst = (ratio, phase)
  lines.append(f'check: worst ratio {worst[0]:.2f} ({worst[1]})')
  if backend == 'cpu':
    lines.append(
      'note: compiled by XLA:CPU on fake devices; it says nothing certain about '
      'TPU tiling (padding, fusion): pass --target tpu (libtpu) or run --check on '
      'the TPU VM for its figures'
    )
    if jnp.dtype(cfg.dtype).itemsize < 4:
      lines.append(
        f'note: XLA:CPU has no native {jnp.dtype(cfg.dtype).name} math and keeps '
        'fp32 copies of such buffers: ratios of bf16 configs are off here (1.5B '
        'on 32 devices: sampling 0.40, update 0.72 in bf16, 1.02 and 0.96 with '
        "--config.model.dtype=float32, which checks the plan's structure on CPU)"
      )
  return '\n'.join(lines)


def pod_check(
  c,
  spec: str,
  devices: Sequence[Any],
  process_index: int,
  hbm_bytes: float,
  *,
  layers: int = 0,
  ignore_plan: bool = False,
  live: bool = False,
) -> tuple[list[str], list[str]]:
  """(what was checked, problems) of a config on a pod's devices, for one process.

  Before any long work (`launch_tpu.sh setup` and `run`, on every worker):
  the config's layout (the plan's rule where it is left to it) builds a mesh
  on these devices; this process feeds exactly its devices' rows of the
  step's prompts and slots (`multihost.feed_problem`; live: also for real
  on the pod's own devices); the plan fits `hbm_bytes`; with `layers`, the
  config's programs compile at that depth on the mesh and each fits.
  ignore_plan: a plan or program that does not fit is reported, not a
  problem (`launch_tpu.sh --ignore-plan`). The same function runs here
  against libtpu's topologies (tests/test_tpu_topology.py), one process at a
  time.
  """
  from ada_jax import sharding
  from ada_jax.infra import multihost
  from ada_jax.planner import memory as memory_plan

  done, problems = [], []
  name, _ = _config_arg(spec)
  if c.get('pod', ''):
    from ada_jax.infra import tpu_pods

    want = tpu_pods.pod(c.pod).chips
    if len(devices) != want:
      return done, [f'{c.pod} has {want} chips; this pod has {len(devices)} devices']
  cfg = dataclasses.replace(model_config(c, name), platform='tpu')
  try:
    chosen = from_config.resolve_layout(
      c, cfg, len(devices), hbm_bytes, 'tpu', refuse=not ignore_plan
    )
  except from_config.ConfigError as e:
    return done, [str(e)]
  shape = memory_plan.resolve_mesh(dict(c.mesh), len(devices))
  try:
    mesh = sharding.make_mesh(shape, devices)
  except ValueError as e:
    return done, [f'mesh {shape}: {e}']
  done.append(f'mesh {shape} builds')
  for what, rows in (('prompt', c.rl.prompts_per_step), ('slot', c.rl.slots)):
    sh = multihost.rows_sharding(mesh, rows)
    problem = multihost.feed_problem(sh, rows, process_index, live=live)
    if problem:
      problems.append(f'{what} rows: {problem}')
    else:
      n = sum(hi - lo for lo, hi in multihost.row_blocks(sh, rows, process_index))
      done.append(f'feeds {n} of {rows} {what} rows')
  shapes = step_shapes(c, cfg)
  peak = (chosen.plan if chosen else memory_plan.plan(cfg, shapes, shape)).peak
  line = f'plan {peak / 2**30:.2f} of {hbm_bytes / 2**30:.2f} GiB'
  if peak > hbm_bytes:
    (done if ignore_plan else problems).append(
      f'{line}: does NOT fit' + (' (--ignore-plan)' if ignore_plan else '')
    )
  else:
    done.append(f'{line} fits')
  if layers and not problems:
    small = dataclasses.replace(cfg, num_layers=layers)
    got = compiled_phases(small, step_shapes(c, small), mesh, _CHECK_PHASES)
    worst = max(got, key=lambda k: got[k].total)
    text = f'{worst} compiled at {layers} layers: {got[worst].total / 2**30:.2f} GiB'
    if got[worst].total > hbm_bytes and not ignore_plan:
      problems.append(f'{text} > {hbm_bytes / 2**30:.2f} GiB')
    else:
      done.append(text)
  return done, problems


def run_pod_check(c, spec: str, layers: int, ignore_plan: bool) -> int:
  """`--pod-check` on one worker of a pod: one line, exit code 0 or 1."""
  import socket

  import jax

  from ada_jax.infra import multihost

  multihost.init_distributed()
  devs = jax.devices()
  stats = devs[0].memory_stats() or {}
  _, hbm_bytes = from_config.pod_memory(c)
  hbm_bytes = float(stats.get('bytes_limit') or hbm_bytes or 0) or float('inf')
  who = f'{socket.gethostname()} process {jax.process_index()}/{jax.process_count()}'
  done, problems = pod_check(
    c,
    spec,
    devs,
    jax.process_index(),
    hbm_bytes,
    layers=layers,
    ignore_plan=ignore_plan,
    live=True,
  )
  if problems:
    print(f'pod-check: {who}: FAILED: {"; ".join(problems)}', flush=True)
    return 1
  print(f'pod-check: {who}: ok: {", ".join(done)}', flush=True)
  return 0


# `--launch-check`: launch_tpu.sh goes on at exit 0 and refuses at this code.
LAUNCH_REFUSED = 10
_EVALUATE = 'python -m ada_jax.evaluate'  # Its line in `report`.
_VERDICTS = ('fits: ', 'does NOT fit: ')  # The step's final line in `report`.


def stand_in_model_files(c, name: str, command: str, folder: str) -> list[str]:
  """Points the model paths that are not on this machine at a local stand-in.

  The workers read `model.hf_path`, `model.tokenizer_path` and
  `model.init_from` (gs:// or their own disks); `launch_tpu.sh` checks a
  config here first, where they are absent. A paper model's hf_path is
  pointed at `folder`, which gets its config.json from the planner's table
  (`planner.models`), so every config rule runs as on the workers except
  the ones reading those files: the tokenizer's vocabulary check and
  init_from's checkpoints (both cleared here) run there. `eval` with an
  empty hf_path reads the model from its checkpoint (an HF directory), so
  that is stood in too. In place, on `c`.

  Returns:
    The keys stood in or cleared, e.g. ['model.hf_path'].

  Raises:
    ValueError: the model is not here and not a paper model: its dims are
      not known here.
  """
  import json

  from ada_jax import hf
  from ada_jax.planner import models

  m = c.model

  def away(path: str) -> bool:  # gs:// is never a local path.
    return bool(path) and not os.path.exists(path)

  keys = [k for k in ('tokenizer_path', 'init_from') if away(m.get(k, ''))]
  in_checkpoint = command == 'eval' and not m.hf_path and c.data.template != 'tiny'
  model_away = away(m.hf_path) or in_checkpoint
  if model_away and name not in models.PAPER_MODELS:
    raise ValueError(
      f'model.hf_path={m.hf_path or "(the checkpoint)"} is not on this machine and '
      f'{name} is not a paper model (planner.models): its dims are not known here'
    )
  with c.unlocked():
    for k in keys:
      m[k] = ''
    if model_away:
      cfg = models.model_config(name, m.dtype, m.param_dtype)
      with open(os.path.join(folder, 'config.json'), 'w') as f:
        json.dump(hf.config_to_hf(cfg), f)
      m.hf_path = folder
      keys.append('hf_path')
  return [f'model.{k}' for k in keys]


def launch_check(
  c,
  spec: str,
  command: str,
  *,
  ignore_plan: bool = False,
  eval_new_tokens: int = EVAL_NEW_TOKENS,
  eval_slots: int | None = None,
) -> tuple[bool, list[str]]:
  """`launch_tpu.sh run` / `eval`, here, before anything is sent to the pod.

  The config rules as the job runs them (`from_config.validate`; the
  workers' model files stood in, `stand_in_model_files`), then the plan's
  verdict for the command: run, the step's final line of `report`; eval,
  `report`'s line for `python -m ada_jax.evaluate` (the largest chunk that
  fits, so a misfit means not even the smallest does), or with the user's
  `--slots` (eval_slots) the plan at that chunk
  (`from_config.command_slots_problem`, as evaluate checks it). The lines are the
  plan's own, as `python -m ada_jax.plan` prints them: the launcher and the
  plan cannot disagree. A layout left to the rule (keys at 0) that fits
  nowhere is refused by the job itself (`from_config.resolve_layout`), so
  ignore_plan launches a misfit only where the config sets its layout.
  Needs `c.pod` and as many JAX devices as its chips (`run_launch_check`
  fakes them): the rules divide rows and slots by the device count.

  Returns:
    (refused, lines to print); with ignore_plan a misfit is a line
    starting 'warning: '.
  """
  import tempfile

  from ada_jax import config_rules

  name, _ = _config_arg(spec)
  _, devices, hbm_gib = _target(c, None, None)
  chips = f'{devices} chip{"s" if devices > 1 else ""}'
  where = f'{spec} on {c.pod} ({chips} x {hbm_gib:g} GiB)'
  with tempfile.TemporaryDirectory(prefix='ada_launch_check_') as folder:
    try:
      stood_in = stand_in_model_files(c, name, command, folder)
    except ValueError as e:
      config_rules.check_keys(c)
      return False, [
        f'config checked here: {spec}: its keys only ({e}: the other rules and '
        'the plan run on the workers)'
      ]
    before = dict(config_rules.leaves(c))
    chosen = from_config.validate(c, refuse=False)
    # The keys the layout rule filled in, as flags that set them.
    filled = ' '.join(
      f'--config.{k}={v}' for k, v in config_rules.leaves(c) if before.get(k) != v
    )
    cfg = dataclasses.replace(model_config(c, name), platform='tpu')
    lines = report(c, spec, None, None, cfg=cfg, eval_new_tokens=eval_new_tokens)
  lines = lines.splitlines()
  step = [x for x in lines if x.startswith(_VERDICTS)][-1]
  own = step if command == 'run' else next(x for x in lines if x.startswith(_EVALUATE))
  own_fits = own.startswith('fits: ') or own.endswith(', fits')
  if command == 'eval' and eval_slots:
    problem = from_config.command_slots_problem(
      c, cfg, 'evaluation', eval_new_tokens, eval_slots
    )
    if problem:
      own, own_fits = f'python -m ada_jax.evaluate {problem}', False
    else:
      own = f'python -m ada_jax.evaluate --slots {eval_slots}: fits'
      own_fits = True
  job_refuses = chosen is not None and not chosen.fits
  rules = 'the config rules pass'
  if stood_in:
    rules += f' ({", ".join(stood_in)}: on the workers, checked there)'
  head = f'config checked here: {where}: {rules}'
  if own_fits and not job_refuses:
    return False, [head, f'plan: {own}']
  line = f'{where}: {own}'
  hint = '--ignore-plan to launch anyway'
  if job_refuses:
    hint = (
      '--ignore-plan launches it only with its layout set, as the job refuses a '
      f'layout left to the rule that fits nowhere: {filled}'
    )
  if command == 'eval' and not own_fits and not eval_slots:
    line += ' (its smallest chunk): use a larger pod'
  elif own_fits:  # eval: evaluate validates the run's layout too.
    line += f"; but evaluate's layout rule refuses the step: {step}"
    hint = f'set the layout to evaluate: {filled}'
  if ignore_plan and not job_refuses:
    return False, [head, f'warning: {line}; launching anyway (--ignore-plan)']
  return True, [f'{line}; nothing was sent to the pod ({hint})']


def run_launch_check(
  spec: str,
  overrides: Sequence[str],
  command: str,
  *,
  pod: str = '',
  ignore_plan: bool = False,
  eval_new_tokens: int = EVAL_NEW_TOKENS,
  eval_slots: int | None = None,
) -> int:
  """`--launch-check`: prints the check's lines; returns 0 or LAUNCH_REFUSED.

  pod: the accelerator type where the config arg has no tpu= preset
  (`launch_tpu.sh --type`); with neither, only the config's keys are
  checked here. export: the config loads.
  """
  import jax

  from ada_jax.infra import tpu_pods

  try:
    c = from_config.load(spec, overrides)
    if command == 'export':
      print(f'config checked here: {spec} loads', flush=True)
      return 0
    if pod and not c.get('pod', ''):
      with c.unlocked():
        c.pod = pod
    if not c.get('pod', ''):
      from ada_jax import config_rules

      config_rules.check_keys(c)
      print(
        f'config checked here: {spec}: its keys only (no tpu= in the config arg, '
        'no --type: the other rules and the plan run on the workers)',
        flush=True,
      )
      return 0
    # The rules divide by the device count: here, the pod's chips as CPU
    # devices (set before the backend starts; none of its memory is used).
    jax.config.update('jax_platforms', 'cpu')
    jax.config.update('jax_num_cpu_devices', tpu_pods.pod(c.pod).chips)
    refused, lines = launch_check(
      c,
      spec,
      command,
      ignore_plan=ignore_plan,
      eval_new_tokens=eval_new_tokens,
      eval_slots=eval_slots,
    )
  except ValueError as e:  # ConfigError included: one line, naming the config.
    named = str(e).startswith(spec.partition(':')[0])
    refused, lines = True, [str(e) if named else f'{spec}: {e}']
  print('\n'.join(lines), flush=True)
  return LAUNCH_REFUSED if refused else 0


PAPER_CONFIGS = {  # Config name -> the model's row in the tables.
  'qwen25_math_1p5b': '1.5B (Qwen2.5-Math-1.5B)',
  'llama32_3b_instruct': '3B (Llama-3.2-3B-Instruct)',
  'qwen3_4b_instruct': '4B (Qwen3-4B-Instruct-2507)',
  'qwen25_math_7b': '7B (Qwen2.5-Math-7B)',
}


def _table_target(kind: str, name: str) -> tuple[str, int, float, str]:
  """(chip, devices, memory bytes per device, column head) of a table's preset.

  A GPU's memory is its allocatable share at the default
  XLA_PYTHON_CLIENT_MEM_FRACTION, whatever this process's environment says:
  the tables are documentation, the same on every machine.
  """
  from ada_jax.infra import gpu_hosts, tpu_pods
  from ada_jax.planner import chips

  if kind == 'gpu':
    g = gpu_hosts.hosts(name)
    chip = chips.CHIPS[g.chip]
    budget = chips.allocatable_gib(chip, environ={})
    head = f'{name} ({g.gpus} GPUs, {budget:.1f} of {chip.hbm_gib:.1f} GiB)'
    return g.chip, g.gpus, budget * 2**30, head
  pod = tpu_pods.pod(name)
  hbm = chips.CHIPS[pod.generation].hbm_gib
  return (
    pod.generation,
    pod.chips,
    hbm * 2**30,
    f'{name} ({pod.chips} chips, {hbm:g} GiB)',
  )


def preset_tables(
  pods: Sequence[str], variants: Sequence[str], root: str = '.', kind: str = 'tpu'
) -> str:
  """The presets' tables of configs/common.py, from the plan's layout rule.

  One row per paper model, one column per pod (kind 'tpu': `tpu=` slices)
  or GPU host (kind 'gpu': `gpu=` presets, at the default memory
  fraction): the mesh the rule picks for Ada-balance (the paper's step),
  its micro-batch, peak GiB per device and phase (on GPU also its share of
  the allocatable memory), or that nothing fits; then the variants whose
  tensor axis differs. tests/test_configs.py checks that the docstring
  holds exactly this (`ADA_WRITE_TABLES=1` rewrites it).
  """
  from ada_jax.planner import chips

  targets = [_table_target(kind, p) for p in pods]
  head = ' | '.join(t[3] for t in targets)
  lines = [f'| model | {head} |', '|---' * (len(pods) + 1) + '|']
  notes = []
  unit, where = ('GPU', 'GPUs') if kind == 'gpu' else ('chip', 'pod')
  # Every phase a run or its commands run, Ada-balance, each chunked phase
  # at the largest chunk that fits (`from_config.command_slots`).
  phases = [
    f'Every phase by the plan (Ada-balance; GiB per {unit}; chunked phases at '
    'the largest chunk of slots that fits):',
    '',
    f'| model | {where} | waves | RL step (peak phase) | histogram + in-run eval '
    '| evaluate (N=4096) | select_prompts |',
    '|---|---|---|---|---|---|---|',
  ]
  for name, row in PAPER_CONFIGS.items():
    cells = []
    for pod_name, (chip, devices, hbm, _) in zip(pods, targets, strict=True):
      platform = chips.CHIPS[chip].platform
      tensors = {}
      for variant in variants:
        c = from_config.load(
          f'{root}/configs/{name}.py:{kind}={pod_name},variant={variant}'
        )
        cfg = dataclasses.replace(model_config(c, name), platform=platform)
        chosen = from_config.resolve_layout(
          c, cfg, devices, hbm, platform, refuse=False
        )
        tensors[variant] = (chosen.mesh[2], chosen.waves, chosen.fits)
        if variant == variants[0]:
          phases.append(
            _phase_row(c, cfg, chosen, row, pod_name, devices, hbm, platform)
          )
          peak = chosen.plan.peak / 2**30
          waves = f', {chosen.waves} waves' if chosen.waves > 1 else ''
          # On GPU the budget is a share of HBM: say how much of it is used.
          share = f', {chosen.plan.peak / hbm:.0%} of it' if kind == 'gpu' else ''
          if chosen.fits:
            cells.append(
              f'(1, -1, {chosen.mesh[2]}), m={chosen.micro_batch_rows}{waves}: '
              f'{peak:.1f} GiB ({chosen.plan.peak_phase}){share}'
            )
          else:
            cells.append(
              f'does NOT fit: {peak:.1f} GiB at (1, -1, {chosen.mesh[2]}) '
              f'({chosen.plan.peak_phase})'
            )
      base = tensors[variants[0]]
      for variant, got in tensors.items():
        if got != base:
          what = f'tensor {got[0]}, {got[1]} wave(s)' if got[2] else 'does NOT fit'
          notes.append(f'{row.split()[0]} {variant} on {pod_name}: {what}')
    lines.append(f'| {row} | ' + ' | '.join(cells) + ' |')
  if notes:
    lines.append('')
    lines.append('Other variants where the rule differs: ' + '; '.join(notes) + '.')
  return '\n'.join([*lines, '', *phases])


def _phase_row(
  c,
  cfg,
  chosen,
  row: str,
  pod: str,
  devices: int,
  hbm: float,
  backend: str = 'tpu',
) -> str:
  """One line of the every-phase table: the step and each chunked phase."""
  from ada_jax.planner import memory

  cells = [
    f'{chosen.plan.peak / 2**30:.1f} ({chosen.plan.peak_phase})'
    if chosen.fits
    else f'does NOT fit: {chosen.plan.peak / 2**30:.1f}'
  ]
  for phase, new in (
    ('pass_rates', c.sampling.max_new_tokens),
    ('evaluation', 4096),
    ('selection', c.sampling.max_new_tokens),
  ):
    slots = from_config.command_slots(c, cfg, phase, new, hbm=hbm, devices=devices)
    shapes = dataclasses.replace(from_config.step_shapes(c, cfg, new), slots=slots)
    got = memory.plan(cfg, shapes, chosen.mesh, backend=backend).phase_bytes(phase)
    verdict = '' if got <= hbm else ' does NOT fit'
    cells.append(f'{got / 2**30:.1f} at {slots} slots{verdict}')
  return f'| {row.split()[0]} | {pod} | {chosen.waves} | ' + ' | '.join(cells) + ' |'


# --check: the config's real programs, compiled on abstract inputs.
#
# `compiled_phases` lowers and compiles, on the devices at hand (fake CPU
# devices via `--xla_force_host_platform_device_count`, or a TPU VM's chips),
# the programs a run executes, through the code paths the trainer uses:
#
#   reshard    `Resharder.lower` (the trainer's copy of the training params
#              into the compute-dtype sampling copy);
#   update     `update.rl_update_pinned` (the trainer's jitted update, outputs
#              pinned to the params' and optimizer state's shardings), params
#              from `sharding.abstract_model` in TRAIN_RULES, AdamW state from
#              `checkpoint.abstract_opt_state`, the [C, m, ...] batch in the
#              layout `rollout.assemble_batch` gives it (`_batch_sharding`);
#   old_logp   `update.logp_jit` on the same params and batch;
#   prefill    `sampler.lower_prefill` (what `prefill` runs) on the sampling
#              copy and the step's B prompts [B, P], rows over the data axes;
#   sampling   `sampler.lower_round` (what `sample_round` runs) on the
#              sampling copy (SAMPLE_RULES, cast to the compute dtype as the
#              trainer's `Resharder(dtype=...)` makes it) and the prompt cache
#              in the layout `sampler.prefill` pins;
#   pass_rates the same round at S prompts and slots (the trainer's `_score`),
#              or a chunk's prefill where that is the larger program;
#   evaluation / selection: that round on the params in their own dtype, at
#              the evaluation's new tokens (prompt selection: the config's).
#
# No weights and no device memory are needed: every input is a
# ShapeDtypeStruct. The result is XLA's `memory_analysis` per device:
# arguments + outputs - aliased (donated) + temporaries. On CPU that is
# XLA:CPU's buffer assignment, which says nothing certain about TPU tiling
# (padding of small minor dims to 128 lanes, TPU fusion choices).
#
# Dimension legend: B prompts, P prompt bucket, N new tokens, S slots,
# R training rows, C micro-batches of m rows, V vocab, G KV heads, K head dim.

_CHECK_PHASES = ('reshard', 'prefill', 'sampling', 'old_logp', 'update', 'pass_rates')


@dataclasses.dataclass(frozen=True)
class Compiled:
  """Per-device bytes of one compiled program (XLA's memory analysis)."""

  arguments: int
  outputs: int
  aliased: int
  temp: int
  # The compiler refused the program for the chip's HBM (libtpu, at compile
  # time: `RESOURCE_EXHAUSTED: ... HLO temporaries (50.42G) exceeds
  # available HBM (30.75G)`): the temporaries are the refusal's figure, the
  # arguments and outputs their shardings' bytes, not a buffer assignment.
  refused: bool = False

  @property
  def total(self) -> int:
    """What the program holds at once: donated outputs counted once."""
    return self.arguments + self.outputs - self.aliased + self.temp


_TEMPORARIES = re.compile(r'HLO temporaries \(([\d.]+)([KMGT]?)\)')


def _shard_bytes(tree: Any) -> int:
  """Per-device bytes of a pytree of ShapeDtypeStructs (their largest shard)."""
  import math

  import jax
  import numpy as np

  total = 0
  for x in jax.tree.leaves(tree):
    sh = getattr(x, 'sharding', None)
    shape = sh.shard_shape(x.shape) if sh is not None else x.shape
    total += math.prod(shape) * np.dtype(x.dtype).itemsize
  return total


def _compile(lowered: Any, inputs: Any, outputs: Any = ()) -> Any:
  """The executable, or its `Compiled(refused=True)` where it needs more HBM.

  inputs, outputs: the program's abstract arguments and the outputs that
  are not donated arguments' buffers (per-device bytes from their
  shardings).
  """
  try:
    return lowered.compile()
  except Exception as e:  # jax.errors.JaxRuntimeError, by message.
    text = str(e)
    found = _TEMPORARIES.search(text)
    if 'RESOURCE_EXHAUSTED' not in text or not found:
      raise
    temp = float(found[1]) * 1024 ** ' KMGT'.index(found[2] or ' ')
    return Compiled(_shard_bytes(inputs), _shard_bytes(outputs), 0, int(temp), True)


def _memory(compiled: Any) -> Compiled:
  if isinstance(compiled, Compiled):  # Refused (`_compile`).
    return compiled
  m = compiled.memory_analysis()
  return Compiled(
    int(m.argument_size_in_bytes),
    int(m.output_size_in_bytes),
    int(m.alias_size_in_bytes),
    int(m.temp_size_in_bytes),
  )


def _sds(shape, dtype, sh=None) -> Any:
  import jax

  return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sh)


def training_inputs(
  config: Any, shapes: Any, mesh: Any
) -> tuple[Any, Any, Any, dict[str, Any]]:
  """(graphdef, params, AdamW state, [C, m, ...] batch), all abstract.

  Laid out as a run lays them out: params in TRAIN_RULES, optimizer state
  sharded like its params, the batch as `rollout.assemble_batch` returns it.
  """
  import jax.numpy as jnp
  from flax import nnx

  from ada_jax import sharding as sharding_lib
  from ada_jax.infra import checkpoint as checkpoint_lib
  from ada_jax.rl import rollout, update

  graphdef, state = sharding_lib.abstract_model(config, mesh, sharding_lib.TRAIN_RULES)
  opt = checkpoint_lib.abstract_opt_state(update.make_optimizer(), state)
  m = shapes.micro_batch_rows
  c = shapes.rows // m
  t = shapes.prompt_len + shapes.new_tokens
  sh = rollout._batch_sharding(nnx.merge(graphdef, state), m)
  batch = {
    'tokens': _sds((c, m, t), jnp.int32, sh),
    'attn_mask': _sds((c, m, t), jnp.int32, sh),
    'resp_mask': _sds((c, m, shapes.new_tokens), jnp.float32, sh),
    'advantages': _sds((c, m, shapes.new_tokens), jnp.float32, sh),
    'old_logp': _sds((c, m, shapes.new_tokens), jnp.float32, sh),
  }
  return graphdef, state, opt, batch


def compile_update(
  config: Any,
  shapes: Any,
  mesh: Any,
  settings: Any = None,
) -> Any:
  """The trainer's update (`rl_update_pinned`) for these shapes, compiled.

  Returns the executable (`_memory` reads its memory analysis).
  """
  import jax
  import jax.numpy as jnp

  from ada_jax.rl import update

  graphdef, state, opt, batch = training_inputs(config, shapes, mesh)
  tx = update.make_optimizer()
  settings = settings or update.UpdateSettings(
    prompt_len=shapes.prompt_len,
    mini_batch_rows=shapes.mini_batch_rows,
    micro_batch_rows=shapes.micro_batch_rows,
  )
  fn = update.rl_update_pinned(
    jax.tree.map(lambda x: x.sharding, state), jax.tree.map(lambda x: x.sharding, opt)
  )
  lowered = fn.lower(graphdef, tx, settings, state, opt, batch, _sds((), jnp.float32))
  return _compile(lowered, (state, opt, batch))


def compile_old_logp(
  config: Any,
  shapes: Any,
  mesh: Any,
  logit_chunk: int = 128,
) -> Any:
  """The trainer's old-logp pass (`update.logp_jit`), compiled (the executable)."""
  import jax.numpy as jnp

  from ada_jax.rl import update

  graphdef, state, _, batch = training_inputs(config, shapes, mesh)
  lowered = update.logp_jit.lower(
    graphdef,
    state,
    batch['tokens'],
    batch['attn_mask'],
    _sds((), jnp.float32),
    prompt_len=shapes.prompt_len,
    logit_chunk=logit_chunk,
  )
  return _compile(lowered, (state, batch['tokens'], batch['attn_mask']))


def sampling_model(config: Any, mesh: Any, *, cast: bool = True) -> Any:
  """The abstract sampling layout (SAMPLE_RULES).

  cast: in the compute dtype, as the trainer's `Resharder(dtype=...)` makes
  its copy; False: in the params' own dtype, as `from_config.policy`
  restores them for the evaluate and select_prompts commands.
  """
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from ada_jax import sharding as sharding_lib
  from ada_jax.infra import resharder

  graphdef, state = sharding_lib.abstract_model(config, mesh, sharding_lib.SAMPLE_RULES)
  if not cast:
    return nnx.merge(graphdef, state)
  dtype = jnp.dtype(config.dtype)
  state = jax.tree.map(
    lambda x: _sds(
      x.shape, dtype if resharder.casts(x, dtype) else x.dtype, x.sharding
    ),
    state,
  )
  return nnx.merge(graphdef, state)


def prompt_cache(config: Any, mesh: Any, prompts: int, prompt_len: int) -> Any:
  """An abstract PromptCache of B prompts in the layout `sampler.prefill` pins."""
  import jax.numpy as jnp

  from ada_jax import sampler

  b, p = prompts, prompt_len
  kv = (b, config.num_kv_heads, p, config.head_dim)
  kv_sh = sampler._cache_sharding(mesh, b, config.num_kv_heads)
  layers = config.num_layers
  return sampler.PromptCache(
    tuple(_sds(kv, config.dtype, kv_sh) for _ in range(layers)),
    tuple(_sds(kv, config.dtype, kv_sh) for _ in range(layers)),
    _sds((b, p), jnp.bool_, sampler._rows_sharding(mesh, b, 2)),
    _sds(
      (b, config.vocab_size),
      jnp.float32,
      sampler._logits_sharding(mesh, b, config.vocab_size),
    ),
    _sds((b,), jnp.int32, sampler._rows_sharding(mesh, b, 1)),
  )


def compile_prefill(
  config: Any, mesh: Any, *, prompts: int, prompt_len: int, cast: bool = True
) -> Any:
  """The prefill of B prompts (`sampler.lower_prefill`: what `prefill` runs)."""
  from flax import nnx

  from ada_jax import sampler

  model = sampling_model(config, mesh, cast=cast)
  lowered = sampler.lower_prefill(model, prompts=prompts, prompt_len=prompt_len)
  out = prompt_cache(config, mesh, prompts, prompt_len)
  # The int32 prompts [B, P] are left out of the inputs: MiB beside GiB.
  return _compile(lowered, nnx.state(model), out)


def compile_reshard(config: Any, mesh: Any) -> Any:
  """The step's reshard (`Resharder.lower`): training params to the sampling copy.

  The training layout's params in, the compute-dtype sampling copy out, as
  the trainer's `Resharder(mesh, SAMPLE_RULES, dtype=config.dtype)` runs it.
  """
  from flax import nnx

  from ada_jax import sharding as sharding_lib
  from ada_jax.infra import resharder

  _, state = sharding_lib.abstract_model(config, mesh, sharding_lib.TRAIN_RULES)
  copy = resharder.Resharder(mesh, sharding_lib.SAMPLE_RULES, dtype=config.dtype)
  out = nnx.state(sampling_model(config, mesh))
  return _compile(copy.lower(state), state, out)


def compile_round(
  config: Any,
  mesh: Any,
  *,
  prompts: int,
  prompt_len: int,
  slots: int,
  new_tokens: int,
  cast: bool = True,
  aligned: bool = False,
  group: int = 1,
  filter_logits: bool = True,
  waves: int = 1,
) -> Any:
  """One sampling round (`sampler.lower_round`, what `sample_round` runs), compiled.

  filter_logits: compile the top-p / top-k filter (`StepShapes.filter_logits`,
  as the run decides it from its sampling knobs). waves: the program of one
  of the round's slot waves (S / W slots; every wave runs it).
  """
  from flax import nnx

  from ada_jax import sampler

  model = sampling_model(config, mesh, cast=cast)
  cache = prompt_cache(config, mesh, prompts, prompt_len)
  lowered = sampler.lower_round(
    model,
    cache,
    slots=slots,
    max_new_tokens=new_tokens,
    aligned=aligned,
    group=group,
    filter_logits=filter_logits,
    waves=waves,
  )
  # The per-slot inputs ([S] ids, temperatures, ...) are left out: bytes.
  return _compile(lowered, (nnx.state(model), cache))


def compiled_phases(
  config: Any,
  shapes: Any,
  mesh: Any,
  phases: tuple[str, ...] = _CHECK_PHASES,
) -> dict[str, Compiled]:
  """Compiled memory of the programs of `phases` (see `compiled_programs`)."""
  return {
    k: _memory(v) for k, v in compiled_programs(config, shapes, mesh, phases).items()
  }


def compiled_programs(
  config: Any,
  shapes: Any,
  mesh: Any,
  phases: tuple[str, ...] = _CHECK_PHASES,
) -> dict[str, Any]:
  """The compiled executables of `phases` (see the module doc).

  pass_rates, evaluation and selection run one chunk of
  `scoring.sample_and_score` (S // k prompts and their k samples in one
  round; k = 1: S prompts in an aligned round, no gather), each after its
  prefill (the larger of the two programs is the phase's);
  the last two on the params in their own dtype, evaluation at
  `shapes.eval_new_tokens`.
  """
  from ada_jax import sampler
  from ada_jax.rl import update

  s = shapes
  out = {}
  for phase in phases:
    if phase == 'update':
      settings = update.UpdateSettings(
        prompt_len=s.prompt_len,
        mini_batch_rows=s.mini_batch_rows,
        micro_batch_rows=s.micro_batch_rows,
        logit_chunk=s.logit_chunk,
      )
      out[phase] = compile_update(config, s, mesh, settings)
    elif phase == 'old_logp':
      out[phase] = compile_old_logp(config, s, mesh, s.logit_chunk)
    elif phase == 'reshard':
      out[phase] = compile_reshard(config, mesh)
    elif phase == 'prefill':
      out[phase] = compile_prefill(
        config, mesh, prompts=s.prompts, prompt_len=s.prompt_len
      )
    elif phase == 'sampling':
      out[phase] = compile_round(
        config,
        mesh,
        prompts=s.prompts,
        prompt_len=s.prompt_len,
        slots=s.slots,
        new_tokens=s.new_tokens,
        group=s.slot_group,
        filter_logits=s.filter_logits,
        waves=s.waves,
      )
    elif phase in ('pass_rates', 'evaluation', 'selection'):
      new = s.eval_new_tokens or s.new_tokens if phase == 'evaluation' else s.new_tokens
      # The chunks of scoring.sample_and_score (sampler.prompts_per_round):
      # the larger one's program where the phase runs two.
      ks = {'evaluation': [1], 'selection': [s.histogram_k]}.get(
        phase, [s.histogram_k] + ([1] if s.greedy_eval else [])
      )
      runs = []
      for k in ks:
        per = sampler.prompts_per_round(s.slots, k)
        # Each chunk prefills its prompts, then runs its round.
        runs.append(
          compile_prefill(
            config,
            mesh,
            prompts=per,
            prompt_len=s.prompt_len,
            cast=phase == 'pass_rates' or s.command_cast,
          )
        )
        runs.append(
          compile_round(
            config,
            mesh,
            prompts=per,
            prompt_len=s.prompt_len,
            slots=s.slots,
            new_tokens=new,
            cast=phase == 'pass_rates' or s.command_cast,
            aligned=per == s.slots,
            filter_logits=s.filter_logits,
          )
        )
      out[phase] = max(runs, key=lambda r: _memory(r).total)
    else:
      raise ValueError(f'unknown phase {phase!r}')
  return out


def parser() -> argparse.ArgumentParser:
  """--config, --devices, --hbm-gib, --check; `--config.key=value` pass through."""
  p = argparse.ArgumentParser(
    prog='python -m ada_jax.plan', description=__doc__.splitlines()[0]
  )
  p.add_argument(
    '--config', required=True, help='configs/NAME.py[:tpu=POD|gpu=NxCHIP,...]'
  )
  p.add_argument(
    '--devices',
    type=int,
    default=None,
    help='JAX devices (chips); default: tpu= / gpu=',
  )
  p.add_argument(
    '--hbm-gib',
    type=float,
    default=None,
    help='memory per device, GiB; default: tpu= (HBM) / gpu= (allocatable)',
  )
  p.add_argument(
    '--eval-new-tokens',
    type=int,
    default=EVAL_NEW_TOKENS,
    help='new tokens of `ada_jax.evaluate` (capped by the model positions)',
  )
  p.add_argument(
    '--eval-slots',
    type=int,
    default=None,
    help="--launch-check eval: evaluate's --slots, checked against the plan",
  )
  p.add_argument(
    '--write-gbps',
    type=float,
    default=None,
    help='assumed per-host checkpoint write bandwidth to the run storage, GB/s, '
    'for the checkpoint and run time estimates (default: '
    'planner.checkpoint_time.WRITE_GBPS)',
  )
  p.add_argument(
    '--check',
    action='store_true',
    help='also compile the real programs and compare (CPU: fake --devices)',
  )
  p.add_argument(
    '--check-phases',
    default=','.join(_PHASE_ORDER[1:]),
    help='comma-separated phases --check compiles',
  )
  p.add_argument(
    '--target',
    choices=('', 'tpu', 'gpu', 'cpu'),
    default='',
    help="the platform the programs are built for ('': the preset's, tpu with "
    "tpu=, gpu with gpu=, else this host's); --check --target tpu on a host without "
    'TPU chips compiles for the pod with libtpu (no chip)',
  )
  p.add_argument(
    '--pod-check',
    action='store_true',
    help='on every worker of a pod (launch_tpu.sh setup/run): the mesh builds on '
    'the chips, this host feeds its rows, the plan fits (and, with --layers, the '
    'programs compile and fit); one line per worker, exit 1 on a problem',
  )
  p.add_argument(
    '--launch-check',
    choices=('run', 'eval', 'export'),
    default='',
    help='here, before launch_tpu.sh COMMAND sends anything to the pod: the '
    "config rules (the workers' model files stood in by the paper model's "
    "config.json) and the plan's verdict for the command; its lines, exit "
    f'{LAUNCH_REFUSED} when refused (export: the config loads)',
  )
  p.add_argument(
    '--pod',
    default='',
    help='--launch-check: the accelerator type when the config arg has no tpu= '
    '(launch_tpu.sh --type)',
  )
  p.add_argument(
    '--ignore-plan',
    action='store_true',
    help='--pod-check, --launch-check: report a plan that does not fit instead '
    'of failing',
  )
  p.add_argument(
    '--layers',
    type=int,
    default=0,
    help='plan and compile with L layers (same widths, lengths, batch, mesh): '
    'a check in seconds to minutes; 0: the full depth',
  )
  return p


def main(argv: Sequence[str] | None = None) -> None:
  """Command line (see the module docstring)."""
  p = parser()
  args, rest = from_config.parse_command_line(p, argv)
  if args.target == 'tpu':
    from ada_jax.infra import tpu_pods

    if not tpu_pods.chips_attached():
      # Compile for the pod with libtpu's topology; the host's own backend
      # stays CPU (a libtpu without chips would probe for them first).
      os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  if args.check and args.devices:
    # Fake CPU devices for a compile on CPU (a TPU backend ignores the flag);
    # read when the backend starts, i.e. later.
    flags = os.environ.get('XLA_FLAGS', '')
    if 'xla_force_host_platform_device_count' not in flags:
      os.environ['XLA_FLAGS'] = (
        f'{flags} --xla_force_host_platform_device_count={args.devices}'
      ).strip()
  if args.launch_check:
    sys.exit(
      run_launch_check(
        args.config,
        rest,
        args.launch_check,
        pod=args.pod,
        ignore_plan=args.ignore_plan,
        eval_new_tokens=args.eval_new_tokens,
        eval_slots=args.eval_slots,
      )
    )
  if args.pod_check:
    try:
      c = from_config.load(args.config, rest)
      sys.exit(run_pod_check(c, args.config, args.layers, args.ignore_plan))
    except ValueError as e:
      print(f'pod-check: FAILED: {e}', flush=True)
      sys.exit(1)
  try:
    c = from_config.load(args.config, rest)
    name, _ = _config_arg(args.config)
    cfg = model_config(c, name)
    # The plan is for the preset's platform (TPU with tpu=, GPU with gpu=)
    # unless --target says otherwise; --check compiles for --target, or for
    # the devices at hand.
    target = from_config.preset(c)
    planned = args.target or (target.platform if target is not None else '')
    plan_cfg = dataclasses.replace(cfg, platform=planned) if planned else cfg
    _, devices, hbm_gib = _target(c, args.devices, args.hbm_gib)
    tensor_rule = c.mesh.tensor == 0
    # The layout is the full depth's; --layers keeps it (same mesh, fewer
    # layers).
    chosen = from_config.resolve_layout(
      c, plan_cfg, devices, hbm_gib * 2**30, planned, refuse=False
    )
    if args.layers:
      cfg = dataclasses.replace(cfg, num_layers=args.layers)
      plan_cfg = dataclasses.replace(plan_cfg, num_layers=args.layers)
    kw = dict(eval_new_tokens=args.eval_new_tokens)
    print(
      report(
        c,
        args.config,
        args.devices,
        args.hbm_gib,
        cfg=plan_cfg,
        write_gbps=args.write_gbps,
        **kw,
      ),
      flush=True,
    )
    if chosen is not None and tensor_rule:
      print(
        f'layout: mesh.tensor={chosen.mesh[2]} by the rule (the smallest of '
        f'{list(chosen.tried)} dividing the {cfg.num_kv_heads} KV heads that '
        f'fits{"" if chosen.fits else ": none does"}), '
        f'rl.micro_batch_rows={c.rl.micro_batch_rows}, sampling.waves='
        f'{chosen.waves} (one wave where a tensor axis fits, else the fewest of '
        '2, 4, 8 leaving 10% free)',
        flush=True,
      )
    if args.check:
      phases = [x for x in args.check_phases.split(',') if x]
      print(
        check_report(
          c,
          args.config,
          args.devices,
          args.hbm_gib,
          phases,
          target=args.target,
          cfg=cfg,
          **kw,
        )
      )
  except ValueError as e:
    sys.exit(f'plan: {e}')


if __name__ == '__main__':
  main()
