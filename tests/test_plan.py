"""The memory plan vs XLA's compiled memory analysis, and the plan command.

The oracle is the compiled program itself: `ada_jax.plan.compiled_phases` compiles the
trainer's own update (`rl_update_pinned`), old-logp pass (`logp_jit`),
prefill (`sampler.lower_prefill`) and sampling round (`sampler.lower_round`)
on abstract inputs laid out as a run lays them out (the [C, m, ...] batch of `rollout.assemble_batch`, the prompt
cache `sampler.prefill` pins), on 8 fake CPU devices; each program's
per-device arguments + outputs + temporaries (donated outputs counted once)
must be within 25% of the plan's. CI runs one point of the calibration
matrix (benchmarks/plan_calibration.py: a 4-layer model at T = 384, mesh
(2, 2, 2), chunked attention with block remat, the paper configs' mode on
CPU), and of its doublings the update's T doubling (where a summed plan
missed: 2.47x the compiled change) and dense attention's old-logp T doubling
(0.65x before the softmax was normalized on its output); the script runs
every mesh and mode and the doublings.
"""

import dataclasses
import importlib.util
import os
import subprocess
import sys

import jax.numpy as jnp
import ml_collections
import pytest

from ada_jax import plan, sharding
from ada_jax.infra import tpu_pods
from ada_jax.planner import memory, models

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TOL = 0.25


def _calibration():
  spec = importlib.util.spec_from_file_location(
    'plan_calibration', os.path.join(_ROOT, 'benchmarks', 'plan_calibration.py')
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_CAL = _calibration()
_MESH = (2, 2, 2)
_MODE = 'chunked-block'


@pytest.fixture(scope='module')
def compiled():
  config, shapes = _CAL.case(_MODE)
  mesh = sharding.make_mesh(_MESH)
  return plan.compiled_phases(config, shapes, mesh, _CAL.PHASES)


@pytest.mark.parametrize('phase', _CAL.PHASES)
def test_phase_matches_compiled(compiled, phase):
  config, shapes = _CAL.case(_MODE)
  p = memory.plan(config, shapes, _MESH, backend='cpu')
  planned, measured = p.program_bytes(phase), compiled[phase].total
  ratio = planned / measured
  print(f'{phase}: plan {planned} / compiled {measured} = {ratio:.3f}')
  assert abs(ratio - 1) <= _TOL, (phase, planned, measured, ratio)


def test_update_change_follows_compiled_when_t_doubles(compiled):
  # T = 384 -> 768 at the same 384-key attention block: with block remat the
  # recomputed layer's backward peaks at its linear activations or at its
  # score blocks, not at both, so compiled memory grows by far less than the
  # linear activations' sum would add (a summed plan: 2.47x the change).
  config, shapes = _CAL.case(_MODE, 'T')
  mesh = sharding.make_mesh(_MESH)
  doubled = plan.compiled_phases(config, shapes, mesh, ('update',))['update'].total
  base_config, base_shapes = _CAL.case(_MODE)

  def planned(c, s):
    return memory.plan(c, s, _MESH, backend='cpu').program_bytes('update')

  plan_change = planned(config, shapes) - planned(base_config, base_shapes)
  compiled_change = doubled - compiled['update'].total
  ratio = plan_change / compiled_change
  print(
    f'T doubling: plan change {plan_change} / compiled {compiled_change} = {ratio:.3f}'
  )
  assert abs(ratio - 1) <= _TOL, (plan_change, compiled_change, ratio)


def test_dense_old_logp_change_follows_compiled_when_t_doubles():
  # Dense attention's old-logp pass, T = 384 -> 768. With the softmax
  # normalized over [T, S] probabilities, XLA:CPU packed a layer's four
  # same-size fp32 score arrays into two slots at T = 384 and three at 768:
  # the plan's change was 0.65x the compiled one. The output-side
  # normalization leaves three arrays, which take two slots at both sizes.
  mesh = sharding.make_mesh(_MESH)

  def both(doubling):
    config, shapes = _CAL.case('dense-none', doubling)
    got = plan.compiled_phases(config, shapes, mesh, ('old_logp',))['old_logp'].total
    planned = memory.plan(config, shapes, _MESH, backend='cpu').program_bytes(
      'old_logp'
    )
    return planned, got

  (p0, c0), (p1, c1) = both(''), both('T')
  ratio = (p1 - p0) / (c1 - c0)
  print(f'dense old-logp T doubling: plan change {p1 - p0} / compiled {c1 - c0}')
  assert abs(ratio - 1) <= _TOL, (p0, c0, p1, c1, ratio)
  assert abs(p0 / c0 - 1) <= _TOL and abs(p1 / c1 - 1) <= _TOL, (p0, c0, p1, c1)


def test_grouped_round_matches_plan_with_slots_over_eight_shards():
  # Slots in groups of 4 over 8 data shards: the round all-gathers every
  # prompt's keys to take each group's prefix. It must not hold those beside
  # the slots' empty response caches (it did: plan / compiled 0.73 here, as
  # for 1.5B at the paper's shapes on 32 fake devices).
  config, shapes = _CAL.case(_MODE)
  shapes = dataclasses.replace(shapes, slot_group=4)
  mesh_shape = (1, 8, 1)
  got = plan.compiled_phases(
    config, shapes, sharding.make_mesh(mesh_shape), ('sampling',)
  )['sampling'].total
  planned = memory.plan(config, shapes, mesh_shape, backend='cpu').program_bytes(
    'sampling'
  )
  assert abs(planned / got - 1) <= _TOL, (planned, got, planned / got)


def test_update_arguments_are_the_trainer_layout(compiled):
  # Params + AdamW state + the [C, m, ...] batch split over data x fsdp: the
  # plan's argument bytes are exact, so a replicated batch would show here.
  config, shapes = _CAL.case(_MODE)
  p = memory.plan(config, shapes, _MESH, backend='cpu')
  args = (
    p.get('params (training layout)')
    + p.get('optimizer state (AdamW mu, nu)')
    + p.get('training batch [C, m, ...]')
  )
  got = compiled['update'].arguments
  assert abs(args - got) <= 0.02 * got, (args, got)


def test_micro_rows_per_device():
  # m rows of every micro-batch over data x fsdp (rollout.assemble_batch).
  assert memory.micro_rows_per_device(16, 8) == 2
  assert memory.micro_rows_per_device(32, 32) == 1
  assert memory.micro_rows_per_device(12, 8) == 12  # Not dividing: replicated.


def test_paper_model_table_has_the_released_sizes():
  expected = {
    'qwen25_math_1p5b': 1_543_714_304,
    'qwen25_math_7b': 7_615_616_512,
    'qwen3_4b_instruct': 4_022_468_096,
    'llama32_3b_instruct': 3_212_749_824,
  }
  for name, count in expected.items():
    cfg = models.model_config(name, jnp.bfloat16, jnp.float32)
    assert memory.count_params(cfg) == count, name


def test_params_split_by_layout():
  cfg = _CAL.MODEL
  full = memory.param_bytes_per_device(cfg, (1, 1, 1), sharding.TRAIN_RULES)
  assert full == memory.count_params(cfg) * 4
  train = memory.param_bytes_per_device(cfg, (1, 2, 4), sharding.TRAIN_RULES)
  sample = memory.param_bytes_per_device(cfg, (1, 2, 4), sharding.SAMPLE_RULES)
  assert train < sample < full


def test_remat_and_blockwise_attention_shrink_the_planned_update():
  cfg = models.model_config('qwen25_math_7b', jnp.bfloat16, jnp.float32)
  shapes = memory.StepShapes(512, 1024, 2048, 4096, 4, 2048, 512, 32)
  paper = dataclasses.replace(cfg, attention='auto', remat='block')
  lean = memory.plan(paper, shapes, (1, 32, 1)).phase_bytes('update')
  dense = dataclasses.replace(cfg, attention='dense', remat='none')
  fat = memory.plan(dense, shapes, (1, 32, 1)).phase_bytes('update')
  assert fat > 5 * lean


def _paper_config(arg: str) -> ml_collections.ConfigDict:
  if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
  from configs import qwen25_math_7b

  return qwen25_math_7b.get_config(arg)


def test_report_verdicts_and_step_time():
  spec = 'configs/qwen25_math_7b.py:tpu=v5p-64'
  out = plan.report(_paper_config('tpu=v5p-64'), spec, None, None)
  lines = out.splitlines()
  assert lines[-1].startswith('fits: ') and 'of 95 GiB' in lines[-1], out
  assert 'information, not a promise' in out
  assert 'grpo 236 s, pos 333 s, balance 375 s' in out
  # A chip too small for the step: the verdict names a change that fits.
  small = plan.report(_paper_config('tpu=v5p-64'), spec, None, 8).splitlines()[-1]
  assert small.startswith('does NOT fit: ') and '> 8 GiB' in small
  assert '--config.' in small or 'larger pod' in small, small


def test_command_line_check_prints_plan_against_compiled():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'ada_jax.plan',
      '--config',
      'configs/tiny_arith.py:tpu=v4-32',
      '--config.rl.slots=128',
      '--devices',
      '8',
      '--check',
      '--check-phases',
      'sampling',
    ],
    cwd=_ROOT,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  lines = out.splitlines()
  assert any(line.startswith('fits: ') and 'of 32 GiB' in line for line in lines)
  phase = next(line for line in lines if line.startswith('phase sampling: plan '))
  ratio = float(phase.rsplit('ratio ', 1)[1].split()[0])
  assert 0.5 < ratio < 2, phase
  assert f'check: worst ratio {ratio:.2f} (sampling)' in out
  assert 'says nothing certain about TPU tiling' in out


def test_the_command_lists_every_phase_of_the_plan():
  # `ada_jax.plan` keeps its own (jax-free) order of the phases for its table
  # and `--check-phases`; a phase the planner adds must show there too.
  want = ('resident', *memory.TRAINING_PHASES, *memory.COMMAND_PHASES)
  assert want == plan._PHASE_ORDER


@pytest.mark.parametrize('name', sorted(models.PAPER_MODELS))
def test_commands_pick_the_largest_chunk_that_fits_each_pod(name, caplog):
  """The commands (evaluate, select_prompts) halve rl.slots until they fit.

  With `layout.HEADROOM` of HBM free where a smaller chunk gives it.

  The paper configs keep rl.slots=4096 for the RL rounds; evaluate's 4096
  new tokens did not fit 1.5B on v4-32 at that chunk (47.8 GiB of 32), and
  a default that runs out of memory is what a user met. The plan is the
  oracle (its evaluation and selection phases are calibrated against the
  TPU compiler in test_tpu_topology / tests/data/tpu_compiled.json).
  """
  from ada_jax import from_config
  from ada_jax.planner import layout

  for pod in ('v4-32', 'v5p-64', 'v6e-64'):
    c = from_config.load(f'configs/{name}.py:tpu={pod}')
    cfg = plan.model_config(c, name)
    from_config.resolve_layout(c, cfg, refuse=False)
    _, hbm = from_config.pod_memory(c)
    mesh = memory.resolve_mesh(dict(c.mesh), tpu_pods.pod(pod).chips)
    for phase, new in (('evaluation', 3072), ('selection', c.sampling.max_new_tokens)):
      slots = from_config.command_slots(c, cfg, phase, new)
      shapes = dataclasses.replace(plan.step_shapes(c, cfg, new), slots=slots)

      def need(s, shapes=shapes, phase=phase, cfg=cfg, mesh=mesh):
        sized = dataclasses.replace(shapes, slots=s)
        return memory.plan(cfg, sized, mesh, backend='tpu').phase_bytes(phase)

      assert c.rl.slots % slots == 0 and slots % (mesh[0] * mesh[1]) == 0
      assert (c.rl.slots // slots).bit_count() == 1  # rl.slots / 2^i
      roomy = (1 - layout.HEADROOM) * hbm
      if need(slots) <= hbm:
        # The largest that leaves the headroom free (or the smallest).
        assert slots == c.rl.slots or need(2 * slots) > roomy
        assert need(slots) <= roomy or slots == mesh[0] * mesh[1]
      else:  # Nothing fits: the smallest chunk, and a warning.
        assert slots == mesh[0] * mesh[1]
        assert f'{phase}: ' in caplog.text and 'over the' in caplog.text


def test_command_slots_on_1p5b_v4_32_and_on_a_cpu_host():
  from ada_jax import from_config

  c = from_config.load('configs/qwen25_math_1p5b.py:tpu=v4-32')
  cfg = plan.model_config(c, 'qwen25_math_1p5b')
  from_config.resolve_layout(c, cfg)
  assert from_config.command_slots(c, cfg, 'evaluation', 3072) == 2048
  text = plan.report(c, 'configs/qwen25_math_1p5b.py:tpu=v4-32', None, None)
  assert 'python -m ada_jax.evaluate (N=' in text
  assert 'at 2048 slots per chunk, fits' in text
  tiny = from_config.load('configs/tiny_arith.py')  # No pod, CPU: as it is.
  assert from_config.command_slots(tiny, None, 'evaluation', 64) == tiny.rl.slots
