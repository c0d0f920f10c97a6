"""One command that checks any accelerator: the main job, the sampler, one RL step.

`python benchmarks/device_check.py [--out DIR] [--tiny]` runs four parts on
whatever JAX backend is present (TPU, GPU or CPU) and prints one table of
figures against their references:

  tiny job    `python -m ada_jax.main --config configs/tiny_arith.py`,
              shortened (JOB_OVERRIDES: 20 SFT steps, 2 RL steps, a few
              held-out prompts), in DIR/tiny_job: its held-out greedy and
              sampled accuracy before -> after RL (its summary.json) and its
              wall time (start-up and compiles included). It runs first, in
              a subprocess, before this process touches the device: on a GPU
              each process preallocates its own share of the memory, and the
              child would find this process's share taken.
  sampler A   benchmarks/sampler.py's case A for ours (`ours_case_a`: B
              rows left-padded to P, N new tokens, `sampler.sample`) on the
              benchmark's random Qwen2-shaped fp32 model (built here in JAX
              from its `MODEL` shapes: no torch needed);
  sampler RL  the benchmark's RL case for ours (`ours_rl_case`: B prompts
              prefilled once, rounds of `sample_round` over B x k slots).
              Both: tokens/s and the roofline fraction 2 x params x tokens /
              time / peak FLOP/s (the benchmark's `summarize`), the peak
              being the chip's dense bf16 one (planner.chips; the model
              computes in bf16 there) or, on CPU, the fp32 matmul peak
              measured as the benchmark does (the model in fp32, as the
              benchmark runs it);
  RL step     one RL step of a randomly initialised model with the widths
              of Qwen2.5-Math-1.5B (planner.models' paper model) at L
              layers, fp32 master weights and bf16 compute, remat='block',
              as the paper config: the reshard into the sampling copy, the
              prefill of B prompts, one sampling round of S = B x k slots,
              the training batch (`rollout.assemble_batch`), the old-logp
              pass and the update (`update.logp_jit`, `update.rl_update`), in
              the order `Trainer.rl_step` runs them, on one device. One
              warm-up step (compiles), then one timed. Memory: the device's
              peak (`memory_stats()['peak_bytes_in_use']`) against the plan's
              peak for the same shapes (`planner.memory.plan`, as `python -m
              ada_jax.plan` computes it). The peak cannot be reset, so the
              step runs first on the device in this process (the tiny job
              ran in its own process) and the peak is read right after it,
              before the sampler parts (a model about 100x smaller) run.
              Time: the timed step against the roofline lower bound of
              `planner.step_time.estimate` (fraction = roofline / measured).
              L and B: the first of STEP_CANDIDATES (deepest, then largest)
              whose planned peak fits STEP_BUDGET of the device's
              allocatable memory.

Sizes: on an accelerator the shapes above (FULL); with --tiny, and always on
CPU, tiny ones (TINY: few layers, narrow widths, short sequences, small
batches) so the check takes about a minute (tests/test_device_check.py).
On CPU the device reports no memory statistics (the measured peak is n/a;
the plan's figure is still printed) and no chip entry exists: the roofline
takes the measured fp32 matmul peak and XLA's read rate over a large array
(benchmarks/sampler.py's `matmul_peak` and `stream_rate`). An accelerator
missing from planner.chips gets no roofline (n/a), and its memory budget
from `memory_stats()['bytes_limit']`.

Printed: the device and backend, the allocatable memory fraction (GPU:
`chips.gpu_mem_fraction()`, XLA_PYTHON_CLIENT_MEM_FRACTION or its default;
TPU: 1.0, all HBM; CPU: n/a), the RL step's shapes, and the table (part,
figure, reference, ratio); DIR/device_check.json holds the same figures. A
part that fails is reported in its row and the other parts still run; the
command then exits 1 with one line naming the failed parts.

Dimension legend: B prompts (case A: rows), P prompt length, N new tokens,
k samples per prompt, S = B x k slots, R training rows (= S: one round's
samples), m rows per micro-batch, L layers, T = P + N.

Run: python benchmarks/device_check.py [--out DIR] [--tiny]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
  sys.path.insert(0, str(_ROOT))

# Neither import starts a JAX backend (the tiny job must run before one does).
from ada_jax.planner import chips as chips_lib  # noqa: E402
from benchmarks import sampler as bench  # noqa: E402

GIB = 1024**3
PARTS = ('tiny_job', 'sampler_case_a', 'sampler_rl_case', 'rl_step')
LABELS = {
  'tiny_job': 'tiny job',
  'sampler_case_a': 'sampler case A',
  'sampler_rl_case': 'sampler RL case',
  'rl_step_memory': 'RL step memory',
  'rl_step_time': 'RL step time',
}

JOB_CONFIG = 'configs/tiny_arith.py'
# The tiny job cut to a few steps of each phase: SFT, the held-out and
# pass-rate evaluations before and after RL, and RL steps with the
# controller's rounds (tests/test_reliability.py shrinks it the same way).
JOB_OVERRIDES = {
  'sft.steps': 20,
  'sft.batch_size': 16,
  'rl.steps': 2,
  'rl.prompts_per_step': 8,
  'rl.slots': 64,
  'rl.mini_batch_rows': 32,
  'rl.micro_batch_rows': 16,
  'rl.eval_every': 0,
  'rl.eval_max_prompts': 16,
  'rl.histogram_prompts': 8,
  'rl.histogram_k': 2,
  'rl.eval_sampled_k': 2,
  'rl.lr_schedule': 'constant',
  'verifier.workers': 1,
  'checkpoint.every': 100,
  'log.tensorboard': False,
}
JOB_TIMEOUT_S = 900

PAPER_MODEL = 'qwen25_math_1p5b'  # planner.models.PAPER_MODELS key.
# The share of the allocatable memory the chosen RL step's planned peak may
# take: the plan is an estimate (module doc of planner.memory).
STEP_BUDGET = 0.8


@dataclasses.dataclass(frozen=True)
class Sizes:
  """What each part runs at."""

  # Sampler case A: rows, P, real prompt lengths (min, max), N.
  a_rows: int
  a_width: int
  a_lengths: tuple[int, int]
  new_tokens: int
  # Sampler RL case: B prompts of P tokens, k samples per round, rounds.
  rl_prompts: int
  rl_width: int
  rl_samples: int
  rl_rounds: int
  repeats: int  # Timed runs of case A (best taken).
  rl_repeats: int  # Timed runs of the RL case.
  # RL step: (L, B) candidates, deepest then largest first; P, N, k, m.
  step_candidates: tuple[tuple[int, int], ...]
  step_prompt_len: int
  step_new_tokens: int
  step_samples: int
  step_micro: int
  dtype: str  # Compute dtype (KV cache and sampling copy too).
  param_dtype: str  # Master weights.
  # Changes to the paper model's widths ({}: the 1.5B's own).
  step_widths: tuple[tuple[str, int], ...] = ()
  # CPU peaks: matmul size, MB read by the stream.
  matmul_n: int = 2048
  stream_mb: int = 256


FULL = Sizes(
  a_rows=bench.CASE_A['rows'][0],
  a_width=bench.CASE_A['width'],
  a_lengths=(bench.CASE_A['min_len'], bench.CASE_A['max_len']),
  new_tokens=bench.NEW_TOKENS,
  rl_prompts=bench.CASE_B['prompts'],
  rl_width=bench.CASE_B['width'],
  rl_samples=bench.CASE_B['samples'],
  rl_rounds=bench.CASE_B['rounds'],
  repeats=3,
  rl_repeats=1,
  # 8 layers at B = 32 plans 17 GiB on one device (bf16 compute, remat
  # block): the largest fits an 80 GB GPU's default 75% share; the smaller
  # ones are for 16-32 GiB TPU chips.
  step_candidates=((8, 32), (8, 16), (4, 16), (4, 8), (2, 8), (2, 4)),
  step_prompt_len=512,
  step_new_tokens=512,
  step_samples=8,
  step_micro=4,
  dtype='bfloat16',
  param_dtype='float32',
)

# CPU: XLA:CPU has no native bf16 math (fp32 here, as the tiny config), and
# the paper model's 152k vocab alone would take most of the minute.
TINY = Sizes(
  a_rows=16,
  a_width=32,
  a_lengths=(16, 32),
  new_tokens=16,
  rl_prompts=8,
  rl_width=32,
  rl_samples=4,
  rl_rounds=2,
  repeats=1,
  rl_repeats=1,
  step_candidates=((2, 4),),
  step_prompt_len=16,
  step_new_tokens=8,
  step_samples=4,
  step_micro=4,
  dtype='float32',
  param_dtype='float32',
  step_widths=(
    ('vocab_size', 512),
    ('hidden_size', 64),
    ('intermediate_size', 128),
    ('num_heads', 4),
    ('num_kv_heads', 2),
    ('head_dim', 16),
  ),
  matmul_n=1024,
  stream_mb=64,
)


# ----------------------------------------------------------------------------
# The device.


def device_info() -> dict[str, Any]:
  """Backend, device kind, chip (planner.chips), allocatable fraction and bytes."""
  import jax

  device = jax.local_devices()[0]
  chip = chips_lib.by_device_kind(device.device_kind)
  stats = device.memory_stats() or {}
  fraction, allocatable = allocatable_memory(device.platform, chip, stats)
  return {
    'platform': device.platform,
    'device_kind': device.device_kind,
    'devices': jax.device_count(),
    'chip': chip.name if chip else None,
    'allocatable_fraction': fraction,
    'allocatable_bytes': allocatable,
    'bytes_limit': stats.get('bytes_limit'),
    'jax': jax.__version__,
  }


def allocatable_memory(
  platform: str, chip: chips_lib.Chip | None, stats: dict[str, Any]
) -> tuple[float | None, float | None]:
  """(allocatable fraction, bytes) of one device; None where it has none (CPU).

  The fraction: on GPU JAX's share (`chips.gpu_mem_fraction`), on TPU all
  HBM. The bytes: planner.chips' figure for a known chip, else the
  allocator's limit (`memory_stats()['bytes_limit']`).
  """
  fraction = {'gpu': chips_lib.gpu_mem_fraction, 'tpu': lambda: 1.0}.get(
    platform, lambda: None
  )()
  if chip is not None:
    return fraction, chips_lib.allocatable_gib(chip) * GIB
  return fraction, stats.get('bytes_limit')


def roofline_chip(info: dict[str, Any], sizes: Sizes) -> chips_lib.Chip | None:
  """The peaks to hold figures against: the chip's, measured on CPU, else None."""
  if info['chip'] is not None:
    return chips_lib.CHIPS[info['chip']]
  if info['platform'] != 'cpu':
    return None  # An accelerator planner.chips does not know: no peaks.
  bench.log('measuring the CPU peaks (matmul, read stream)')
  return chips_lib.Chip(
    'cpu (measured)',
    0.0,
    bench.matmul_peak(sizes.matmul_n),
    bench.stream_rate(False, sizes.stream_mb),
    platform='cpu',
  )


# ----------------------------------------------------------------------------
# The parts. Each returns its figures; an exception fails only its part.


def tiny_job(out: pathlib.Path) -> dict[str, Any]:
  """The shortened main job in a subprocess: held-out figures and wall time."""
  workdir = out / 'tiny_job'
  # A rerun into a finished workdir would resume (nothing left to run).
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = [
    sys.executable,
    '-m',
    'ada_jax.main',
    '--config',
    JOB_CONFIG,
    '--workdir',
    str(workdir),
    f'--config.data.data_dir={out / "tfds"}',  # Kept: a rerun skips the build.
    *(f'--config.{k}={v}' for k, v in JOB_OVERRIDES.items()),
  ]
  log_path = out / 'tiny_job.log'
  bench.log(f'tiny job: {" ".join(cmd[1:])} (log: {log_path})')
  t0 = time.perf_counter()
  with open(log_path, 'w') as log_file:
    proc = subprocess.run(
      cmd,
      cwd=_ROOT,
      stdout=log_file,
      stderr=subprocess.STDOUT,
      timeout=JOB_TIMEOUT_S,
      check=False,
    )
  wall = time.perf_counter() - t0
  if proc.returncode:
    lines = log_path.read_text().strip().splitlines() or ['(no output)']
    raise RuntimeError(f'exit {proc.returncode}: {lines[-1]} (log: {log_path})')
  summary = json.loads((workdir / 'summary.json').read_text())
  keys = ('eval_accuracy', 'eval_sampled_accuracy', 'eval_boxed_frac')
  return {
    'wall_s': wall,
    'steps': summary['steps'],
    **{
      when: {k: summary[when][k] for k in keys if k in summary[when]}
      for when in ('before_rl', 'after_rl')
    },
    'workdir': str(workdir),
  }


@functools.cache
def sampler_model(sizes: Sizes) -> tuple[Any, int]:
  """The sampler benchmark's random model (its `MODEL` shapes) and its params.

  Computing in the sizes' dtype: bf16 on an accelerator, so the roofline
  against the chip's bf16 peak is one the model can reach; fp32 on CPU, as
  the benchmark runs it.
  """
  import jax.numpy as jnp

  from ada_jax import hf
  from ada_jax import model as model_lib

  config = hf.config_from_hf(dict(bench.MODEL, model_type='qwen2'))
  config = dataclasses.replace(config, dtype=jnp.dtype(sizes.dtype))
  model = model_lib.create_model(config)
  return model, model_lib.count_params(model)


def _sampler_figures(
  case: dict[str, Any],
  chip: chips_lib.Chip | None,
  label: str,
  n_params: int,
  **shapes: int,
) -> dict[str, Any]:
  """The benchmark's summary of a timed case; the roofline None without a chip."""
  peak = chip.bf16_flops if chip else None
  out = bench.summarize(case, n_params, peak or math.nan)
  out['roofline'] = out['roofline'] if peak else None
  return {
    **out,
    'label': label,
    'params': n_params,
    'peak_flops': peak,
    'peak_of': chip.name if chip else None,
    **shapes,
  }


def sampler_case_a(sizes: Sizes, chip: chips_lib.Chip | None) -> dict[str, Any]:
  """The sampler benchmark's case A for ours."""
  model, n_params = sampler_model(sizes)
  rs = np.random.RandomState(0)
  tokens, mask = bench.left_padded(rs, sizes.a_rows, sizes.a_width, *sizes.a_lengths)
  bench.log(
    f'sampler case A: B={sizes.a_rows}, P={sizes.a_width}, N={sizes.new_tokens}'
  )
  case = bench.ours_case_a(model, tokens, mask, sizes.repeats, sizes.new_tokens)
  label = f'B={sizes.a_rows}, P={sizes.a_width}, N={sizes.new_tokens}'
  return _sampler_figures(
    case, chip, label, n_params, rows=sizes.a_rows, prompt_len=sizes.a_width
  )


def sampler_rl_case(sizes: Sizes, chip: chips_lib.Chip | None) -> dict[str, Any]:
  """The sampler benchmark's RL case (case B) for ours."""
  model, n_params = sampler_model(sizes)
  rs = np.random.RandomState(1)
  w = sizes.rl_width
  tokens, mask = bench.left_padded(rs, sizes.rl_prompts, w, w, w)
  label = (
    f'{sizes.rl_prompts}x{sizes.rl_samples} slots, P={w}, N={sizes.new_tokens},'
    f' {sizes.rl_rounds} rounds'
  )
  bench.log(f'sampler RL case: {label}')
  case = bench.ours_rl_case(
    model,
    tokens,
    mask,
    sizes.rl_repeats,
    samples=sizes.rl_samples,
    rounds=sizes.rl_rounds,
    new_tokens=sizes.new_tokens,
  )
  return _sampler_figures(
    case, chip, label, n_params, prompts=sizes.rl_prompts, prompt_len=w
  )


def step_config(sizes: Sizes, layers: int) -> Any:
  """The paper model's ModelConfig at L layers (and the sizes' widths)."""
  from ada_jax.planner import models

  config = models.model_config(PAPER_MODEL, sizes.dtype, sizes.param_dtype)
  return dataclasses.replace(
    config, num_layers=layers, remat='block', **dict(sizes.step_widths)
  )


def step_shapes(sizes: Sizes, prompts: int) -> Any:
  """The StepShapes of one step of B prompts: one round, every sample trained."""
  from ada_jax.planner import memory

  slots = prompts * sizes.step_samples
  return memory.StepShapes(
    prompts=prompts,
    prompt_len=sizes.step_prompt_len,
    new_tokens=sizes.step_new_tokens,
    slots=slots,
    max_rounds=1,
    rows=slots,
    mini_batch_rows=slots,
    micro_batch_rows=sizes.step_micro,
    slot_group=sizes.step_samples,
    filter_logits=False,
  )


def choose_step(
  sizes: Sizes, backend: str, budget: float | None
) -> tuple[Any, Any, Any, bool]:
  """(config, shapes, plan, fits): the first candidate whose plan fits `budget`.

  None of them fitting, the last (smallest) is run anyway: its failure or
  its peak is the finding.
  """
  from ada_jax.planner import memory

  for layers, prompts in sizes.step_candidates:
    config, shapes = step_config(sizes, layers), step_shapes(sizes, prompts)
    plan = memory.plan(config, shapes, (1, 1, 1), backend=backend)
    if budget is None or plan.peak <= budget:
      return config, shapes, plan, True
  return config, shapes, plan, False


def rl_step(
  sizes: Sizes, info: dict[str, Any], chip: chips_lib.Chip | None
) -> dict[str, Any]:
  """One RL step on one device: peak memory vs the plan, time vs the roofline."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from ada_jax import sampler, sharding
  from ada_jax.infra import checkpoint, compiles, resharder
  from ada_jax.planner import step_time
  from ada_jax.rl import rollout, update

  alloc = info['allocatable_bytes']
  budget = None if alloc is None else STEP_BUDGET * alloc
  c, s, plan, fits = choose_step(sizes, info['platform'], budget)
  b, p, n, k, r, m = (
    s.prompts,
    s.prompt_len,
    s.new_tokens,
    s.slot_group,
    s.rows,
    s.micro_batch_rows,
  )
  label = f'L={c.num_layers}, B={b} x k={k} = S={s.slots}, P={p}, N={n}, m={m}'
  bench.log(f'RL step: {label}')
  mesh = sharding.make_mesh((1, 1, 1), devices=jax.local_devices()[:1])
  graphdef, state = nnx.split(sharding.create_sharded_model(c, mesh))
  tx = update.make_optimizer()
  # As the trainer: params and AdamW state keep their shardings through the
  # update (pinned), so the timed step compiles nothing.
  shardings = jax.tree.map(lambda x: x.sharding, state)
  opt_shardings = jax.tree.map(
    lambda x: x.sharding, checkpoint.abstract_opt_state(tx, state)
  )
  opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(state)
  rl_update = update.rl_update_pinned(shardings, opt_shardings)
  # The trainer's sampling copy: the compute dtype, checksummed.
  copy = resharder.Resharder(mesh, sharding.SAMPLE_RULES, dtype=c.dtype)
  settings = update.UpdateSettings(
    prompt_len=p, mini_batch_rows=s.mini_batch_rows, micro_batch_rows=m
  )
  rs = np.random.RandomState(0)
  prompts = rs.randint(3, c.vocab_size, (b, p)).astype(np.int32)
  prompt_mask = np.ones_like(prompts)
  slot_prompt = np.repeat(np.arange(b), k)  # The paper schedule's groups.
  advantage = rs.choice([-1.0, 1.0], r).astype(np.float32)

  def sample(state: Any, seed: int) -> dict[str, Any]:
    # As rollout.run_step: the copy, cache and round are freed on return,
    # before the old-logp pass (the trainer drops its copy there too).
    model = nnx.merge(graphdef, copy(state))
    cache = sampler.prefill(model, prompts, prompt_mask)
    out = sampler.sample_round(
      model,
      cache,
      slot_prompt,
      max_new_tokens=n,
      rng=jax.random.key(seed),
      eos_ids=(),  # Every slot writes all N tokens: the roofline's full round.
      filter_logits=False,
      group=k,
    )
    buffer = {'tokens': out.tokens, 'logprobs': out.logprobs, 'mask': out.mask}
    batch = rollout.assemble_batch(
      prompts,
      prompt_mask,
      jax.tree.map(lambda x: x[None], buffer),  # [M=1, S, N]
      slot_prompt,
      np.arange(r),
      advantage,
      np.ones(r, np.float32),
      slots=s.slots,
      micro_batch_rows=m,
    )
    return jax.block_until_ready(batch)

  def step(state: Any, opt_state: Any, seed: int) -> tuple[Any, Any, dict, dict]:
    t0 = time.perf_counter()
    batch = sample(state, seed)
    t1 = time.perf_counter()
    old_logp, _ = update.logp_jit(
      graphdef,
      state,
      batch['tokens'],
      batch['attn_mask'],
      jnp.float32(1.0),
      prompt_len=p,
    )
    old_logp = jax.block_until_ready(old_logp)
    t2 = time.perf_counter()
    train = {k: batch[k] for k in ('tokens', 'attn_mask', 'resp_mask', 'advantages')}
    state, opt_state, metrics = rl_update(
      graphdef,
      tx,
      settings,
      state,
      opt_state,
      dict(train, old_logp=old_logp),
      jnp.float32(1e-6),
    )
    metrics = jax.device_get(metrics)
    t3 = time.perf_counter()
    times = {'sampling': t1 - t0, 'old_logp': t2 - t1, 'update': t3 - t2}
    return state, opt_state, metrics, times

  state, opt_state, _, warmup = step(state, opt_state, 0)  # Compiles.
  before = compiles.num_compiles()
  state, opt_state, metrics, times = step(state, opt_state, 1)
  recompiled = compiles.compiled_names(before)
  stats = jax.local_devices()[0].memory_stats()
  measured = stats.get('peak_bytes_in_use') if stats else None
  roof = None
  if chip is not None:
    itemsize = np.dtype(c.dtype).itemsize
    phases = step_time.estimate(
      c,
      prompts=b,
      prompt_len=p,
      new_tokens=n,
      slots=s.slots,
      rounds=1,
      rows=r,
      micro_batch_rows=m,
      mini_batch_rows=s.mini_batch_rows,
      epochs=1,
      mesh=(1, 1, 1),
      chip=chip,
      remat=c.remat,
      attention=c.attention,
      sample_bytes=itemsize,
      kv_bytes=itemsize,
      slot_group=k,
    )
    roof = {
      'seconds': step_time.total_seconds(phases),
      'phases': {ph.name: ph.seconds for ph in phases},
      'chip': chip.name,
      'peak_flops': chip.bf16_flops,
      'bytes_per_s': chip.hbm_bytes_per_s,
    }
  total = sum(times.values())
  return {
    'label': label,
    'model': {f.name: getattr(c, f.name) for f in dataclasses.fields(c)},
    'shapes': dataclasses.asdict(s),
    'fits_budget': fits,
    'budget_bytes': budget,
    'memory': {
      'measured_peak_bytes': measured,
      'plan_peak_bytes': plan.peak,
      'plan_peak_phase': plan.peak_phase,
      'plan_phases_bytes': plan.phases,
      'ratio': measured / plan.peak if measured else None,
      'read': 'peak_bytes_in_use after the step, the first work on the device',
    },
    'time': {
      'seconds': total,
      'phases_s': times,
      'warmup_s': sum(warmup.values()),
      # Compiles in the timed step (none expected): their names.
      'recompiled': recompiled,
      'roofline': roof,
      'fraction': roof['seconds'] / total if roof else None,
    },
    'update': {key: float(v) for key, v in metrics.items()},
  }


# ----------------------------------------------------------------------------
# Report.


def _bytes(x: float | None) -> str:
  if x is None:
    return 'n/a'
  return f'{x / GIB:.2f} GiB' if x >= GIB / 10 else f'{x / 2**20:.1f} MiB'


def _pct(x: float | None) -> str:
  return 'n/a' if x is None else f'{x:.2%}'


def table_rows(parts: dict[str, dict[str, Any]]) -> list[tuple[str, str, str, str]]:
  """(part, figure, reference, ratio) rows; a failed part's row says so."""
  rows = []

  def failed(key: str, part: str) -> bool:
    if 'error' in parts[part]:
      rows.append((LABELS[key], 'FAILED: ' + parts[part]['error'], '', ''))
      return True
    return False

  if not failed('tiny_job', 'tiny_job'):
    j = parts['tiny_job']
    acc = ', '.join(
      f'{name} {j["before_rl"][key]:.3f} -> {j["after_rl"][key]:.3f}'
      for name, key in (
        ('greedy', 'eval_accuracy'),
        ('sampled', 'eval_sampled_accuracy'),
      )
      if key in j['before_rl']
    )
    rows.append(
      (
        LABELS['tiny_job'],
        f'{j["wall_s"]:.1f} s wall; held-out {acc}',
        f'before -> after {j["steps"]} RL steps',
        '-',
      )
    )
  for part in ('sampler_case_a', 'sampler_rl_case'):
    if failed(part, part):
      continue
    f = parts[part]
    peak = f['peak_flops']
    ref = 'n/a' if peak is None else f'{f["peak_of"]}: {peak / 1e12:.3g} TFLOP/s'
    rows.append(
      (
        f'{LABELS[part]} ({f["label"]})',
        f'{f["tok_s"]:,.0f} tok/s',
        ref,
        _pct(f['roofline']),
      )
    )
  if 'error' in parts['rl_step']:
    failed('rl_step_memory', 'rl_step')
    failed('rl_step_time', 'rl_step')
  else:
    st = parts['rl_step']
    mem, t = st['memory'], st['time']
    rows.append(
      (
        f'{LABELS["rl_step_memory"]} ({st["label"]})',
        f'peak {_bytes(mem["measured_peak_bytes"])}',
        f'plan {_bytes(mem["plan_peak_bytes"])} ({mem["plan_peak_phase"]})',
        'n/a' if mem['ratio'] is None else f'{mem["ratio"]:.2f}',
      )
    )
    roof = t['roofline']
    rows.append(
      (
        LABELS['rl_step_time'],
        f'{t["seconds"]:.3f} s',
        'n/a' if roof is None else f'roofline {roof["seconds"]:.4f} s ({roof["chip"]})',
        _pct(t['fraction']),
      )
    )
  return rows


def format_table(rows: list[tuple[str, str, str, str]]) -> str:
  head = ('part', 'figure', 'reference', 'ratio')
  widths = [max(len(x[i]) for x in [head, *rows]) for i in range(4)]
  lines = [
    '  '.join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
    for row in [head, *rows]
  ]
  return '\n'.join(lines)


def report(result: dict[str, Any]) -> str:
  """The printed report: device lines, the table, the ratio legend."""
  info = result['device']
  frac = info['allocatable_fraction']
  where = {
    'gpu': f'chips.gpu_mem_fraction(): {chips_lib.GPU_MEM_FRACTION_ENV} or'
    f' {chips_lib.GPU_MEM_FRACTION_DEFAULT}',
    'tpu': 'TPU: all HBM',
  }.get(info['platform'], 'CPU')
  lines = [
    __doc__.splitlines()[0],
    f'device: {info["device_kind"]} ({info["platform"]} backend, {info["devices"]}'
    f' device(s), JAX {info["jax"]}); chip: {info["chip"] or "not in planner.chips"};'
    f' sizes: {"tiny" if result["tiny"] else "full"}',
    f'allocatable memory fraction: {"n/a" if frac is None else f"{frac:g}"} ({where});'
    f' allocatable {_bytes(info["allocatable_bytes"])}',
    '',
    format_table(table_rows(result['parts'])),
    '',
    'ratio: sampler rows and RL step time, the fraction of the roofline reached;'
    ' RL step memory, measured peak / plan peak',
  ]
  return '\n'.join(lines)


def run_part(
  parts: dict[str, dict[str, Any]], name: str, fn: Callable[[], dict[str, Any]]
) -> None:
  """Runs one part into parts[name]; an exception becomes its one-line error."""
  try:
    parts[name] = fn()
  except Exception as e:  # Any failure: the other parts still run.
    message = str(e).strip().splitlines()
    parts[name] = {'error': f'{type(e).__name__}: {message[0] if message else ""}'}
    bench.log(f'{name}: FAILED ({parts[name]["error"]})')


def main(argv: list[str]) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--out', default=None, help='folder for the JSON and the tiny job')
  p.add_argument('--tiny', action='store_true', help='tiny shapes (always on CPU)')
  args = p.parse_args(argv)
  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix='device_check_'))
  out.mkdir(parents=True, exist_ok=True)

  parts: dict[str, dict[str, Any]] = {}
  # First, before this process starts a backend (module doc).
  run_part(parts, 'tiny_job', lambda: tiny_job(out))
  info = device_info()
  tiny = args.tiny or info['platform'] == 'cpu'
  sizes = TINY if tiny else FULL
  try:
    chip = roofline_chip(info, sizes)
  except Exception as e:  # No peaks: the ratios say n/a, the parts still run.
    chip, info['peaks_error'] = None, f'{type(e).__name__}: {e}'
    bench.log(f'no peaks ({info["peaks_error"]})')
  # First on the device: the peak it reports is the RL step's own.
  run_part(parts, 'rl_step', lambda: rl_step(sizes, info, chip))
  run_part(parts, 'sampler_case_a', lambda: sampler_case_a(sizes, chip))
  run_part(parts, 'sampler_rl_case', lambda: sampler_rl_case(sizes, chip))
  bench.log('done')

  failed = [name for name in PARTS if 'error' in parts[name]]
  result = {
    'device': info,
    'tiny': tiny,
    'sizes': dataclasses.asdict(sizes),
    'parts': {name: parts[name] for name in PARTS},
    'failed': failed,
  }
  print(report(result))
  path = out / 'device_check.json'
  path.write_text(json.dumps(result, indent=1, default=str))
  print(f'figures: {path}')
  if failed:
    errors = '; '.join(f'{name} ({parts[name]["error"]})' for name in failed)
    print(f'device_check: {len(failed)} part(s) failed: {errors}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
