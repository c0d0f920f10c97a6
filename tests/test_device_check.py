"""benchmarks/device_check.py on CPU at tiny shapes, and its report and choices.

The script runs as a user runs it (a subprocess, one CPU device, the
project's compile cache) into tmp_path: every part reports figures in the
JSON and a row in the printed table. About 55 s on 2 busy cores with a cold
compile cache (half of it the tiny main job), 20 s warm. The report of a
failed part and the choice of the RL step's depth and batch by the plan are
checked in-process, without running anything on a device.
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

from benchmarks import device_check  # noqa: E402

GIB = 1024**3


@pytest.fixture(scope='module')
def cpu_run(tmp_path_factory):
  """(exit code, stdout, stderr, JSON) of one CPU run of the script."""
  out = tmp_path_factory.mktemp('device_check')
  env = dict(
    os.environ,
    JAX_PLATFORMS='cpu',
    XLA_FLAGS='',  # One CPU device (conftest forces 8 on this process).
    JAX_COMPILATION_CACHE_DIR=str(ROOT / '.jax_cache'),
    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0',
    WANDB_MODE='offline',
  )
  proc = subprocess.run(
    [sys.executable, 'benchmarks/device_check.py', '--out', str(out)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
    check=False,
  )
  path = out / 'device_check.json'
  result = json.loads(path.read_text()) if path.exists() else None
  return proc.returncode, proc.stdout, proc.stderr, result


def _positive(x) -> bool:
  return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_cpu_run_reports_every_part(cpu_run):
  code, _, stderr, result = cpu_run
  assert code == 0, stderr[-3000:]
  assert result is not None, 'no device_check.json'
  assert result['tiny'] and result['device']['platform'] == 'cpu'
  assert result['failed'] == []
  parts = result['parts']
  assert set(parts) == set(device_check.PARTS)
  assert not [name for name, p in parts.items() if 'error' in p]

  job = parts['tiny_job']
  assert _positive(job['wall_s']) and job['steps'] == 2
  for when in ('before_rl', 'after_rl'):
    for key in ('eval_accuracy', 'eval_sampled_accuracy', 'eval_boxed_frac'):
      assert 0.0 <= job[when][key] <= 1.0, (when, key, job[when])

  for name in ('sampler_case_a', 'sampler_rl_case'):
    f = parts[name]
    assert _positive(f['tok_s']) and f['tokens'] > 0, f
    # The CPU's measured fp32 matmul peak: a finite fraction of it.
    assert _positive(f['peak_flops']) and _positive(f['roofline']), f
  # The RL case generates B x k slots x N tokens per round, every round.
  sizes = device_check.TINY
  assert parts['sampler_rl_case']['tokens'] == (
    sizes.rl_prompts * sizes.rl_samples * sizes.new_tokens * sizes.rl_rounds
  )

  step = parts['rl_step']
  mem, t = step['memory'], step['time']
  assert _positive(mem['plan_peak_bytes'])
  assert mem['plan_peak_phase'] in mem['plan_phases_bytes']
  assert mem['measured_peak_bytes'] is None and mem['ratio'] is None  # CPU.
  assert _positive(t['seconds']) and _positive(t['roofline']['seconds'])
  assert t['fraction'] == pytest.approx(t['roofline']['seconds'] / t['seconds'])
  assert t['recompiled'] == [], 'the timed step compiled'
  assert step['update']['skipped'] == 0 and math.isfinite(step['update']['loss'])


def test_cpu_run_prints_the_device_and_one_table(cpu_run):
  code, stdout, stderr, _ = cpu_run
  assert code == 0, stderr[-3000:]
  assert 'device: cpu (cpu backend' in stdout
  assert 'allocatable memory fraction: n/a (CPU)' in stdout
  lines = stdout.splitlines()
  for label in device_check.LABELS.values():
    rows = [x for x in lines if x.startswith(label)]
    assert len(rows) == 1, (label, stdout)
    assert 'FAILED' not in rows[0]
  memory = next(x for x in lines if x.startswith('RL step memory'))
  assert 'peak n/a' in memory and 'plan ' in memory


def test_a_failed_part_is_reported_in_its_row():
  def boom():
    raise ValueError('out of memory\nmore detail')

  parts = {}
  device_check.run_part(parts, 'rl_step', boom)
  assert parts['rl_step'] == {'error': 'ValueError: out of memory'}
  parts['tiny_job'] = {'error': 'RuntimeError: exit 1: bad config'}
  parts['sampler_case_a'] = parts['sampler_rl_case'] = {'error': 'X: y'}
  rows = device_check.table_rows(parts)
  assert [r[0] for r in rows] == list(device_check.LABELS.values())
  assert all(r[1].startswith('FAILED: ') for r in rows)
  assert rows[-1][1] == 'FAILED: ValueError: out of memory'


def test_the_rl_step_is_the_largest_candidate_the_plan_fits():
  sizes = device_check.FULL
  candidates = sizes.step_candidates
  config, shapes, plan, fits = device_check.choose_step(sizes, 'gpu', 48 * GIB)
  assert fits and (config.num_layers, shapes.prompts) == candidates[0]
  # The 1.5B's widths, from planner.models.
  assert (config.hidden_size, config.num_heads, config.num_kv_heads) == (1536, 12, 2)
  assert (config.head_dim, config.intermediate_size) == (128, 8960)
  assert config.vocab_size == 151936
  assert shapes.slots == shapes.rows == shapes.prompts * sizes.step_samples
  # A budget just below the first candidate's plan: a later one, which fits.
  _, _, plan2, fits2 = device_check.choose_step(sizes, 'gpu', plan.peak - 1)
  assert fits2 and plan2.peak < plan.peak
  # Nothing fits: the smallest candidate runs anyway, flagged.
  config3, shapes3, _, fits3 = device_check.choose_step(sizes, 'gpu', 1.0)
  assert not fits3 and (config3.num_layers, shapes3.prompts) == candidates[-1]


def test_allocatable_memory_per_backend(monkeypatch):
  from ada_jax.planner import chips

  monkeypatch.delenv(chips.GPU_MEM_FRACTION_ENV, raising=False)
  h100, v5p = chips.CHIPS['h100'], chips.CHIPS['v5p']
  assert device_check.allocatable_memory('gpu', h100, {}) == (
    0.75,
    pytest.approx(0.75 * 81559 / 1024 * GIB),
  )
  monkeypatch.setenv(chips.GPU_MEM_FRACTION_ENV, '0.5')
  fraction, limit = device_check.allocatable_memory('gpu', h100, {'bytes_limit': 1})
  assert fraction == 0.5 and limit == pytest.approx(0.5 * 81559 / 1024 * GIB)
  assert device_check.allocatable_memory('tpu', v5p, {}) == (1.0, 95 * GIB)
  # A GPU planner.chips lacks: the allocator's own limit.
  assert device_check.allocatable_memory('gpu', None, {'bytes_limit': 7}) == (0.5, 7)
  assert device_check.allocatable_memory('cpu', None, {}) == (None, None)
