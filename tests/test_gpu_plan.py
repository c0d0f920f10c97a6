"""The `gpu=` presets: parsing, the memory budget, the fit on 8xH100, the paper line.

The paper measured its step on 8xH100 (verl); `gpu=8xh100` plans the same
step for that hardware by the same layout rule as `tpu=`, against what JAX
may allocate on a GPU (HBM x XLA_PYTHON_CLIENT_MEM_FRACTION or its default
0.75). The plan's own computation is the oracle: the layout rule, the
memory plan and the command chunks, as `python -m ada_jax.plan` prints them.

Fast: ConfigDicts and the planner only, nothing compiles.
"""

import dataclasses
import itertools
import math
import pathlib
import sys

import pytest

from ada_jax import config_rules, from_config, plan
from ada_jax.infra import gpu_hosts
from ada_jax.planner import chips, layout, memory

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

from configs import common  # noqa: E402

PAPER = tuple(plan.PAPER_CONFIGS)
ENV = chips.GPU_MEM_FRACTION_ENV


@pytest.fixture(autouse=True)
def _default_fraction(monkeypatch):
  """The default share unless a test sets it: a CI machine's env must not count."""
  monkeypatch.delenv(ENV, raising=False)


def _load(name: str, arg: str):
  return from_config.load(f'{ROOT}/configs/{name}.py:{arg}')


def test_gpu_hosts_know_the_planners_gpu_chips():
  want = tuple(k for k, c in chips.CHIPS.items() if c.platform == 'gpu')
  assert want == gpu_hosts.GPU_CHIPS


def test_presets_parse_to_gpu_hosts():
  assert common.GPU_PRESETS == ('1xh100', '8xh100', '8xh200')
  for spec, (chip, gpus, hosts) in {
    '1xh100': ('h100', 1, 1),
    '8xh100': ('h100', 8, 1),
    '8xh200': ('h200', 8, 1),
    '16XH100': ('h100', 16, 2),
  }.items():
    g = gpu_hosts.hosts(spec)
    assert (g.chip, g.gpus, g.hosts) == (chip, gpus, hosts), spec
    assert chips.CHIPS[g.chip].platform == 'gpu'
  assert gpu_hosts.hosts('16XH100').name == '16xh100'


@pytest.mark.parametrize(
  ('spec', 'match'),
  [
    ('8xa100', "unknown GPU 'a100'"),
    ('8xv5p', "unknown GPU 'v5p'"),  # A TPU chip is not a GPU.
    ('3xh100', '3 GPUs is not 1, 2, 4 or a multiple of 8'),
    ('12xh200', '12 GPUs'),
    ('0xh100', '0 GPUs'),
    ('h100', 'is not NxCHIP'),
    ('8x', 'is not NxCHIP'),
  ],
)
def test_bad_gpu_presets_name_the_preset(spec, match):
  with pytest.raises(ValueError, match=match) as e:
    gpu_hosts.hosts(spec)
  assert repr(spec) in str(e.value)


@pytest.mark.parametrize('name', PAPER)
def test_gpu_args_error_naming_the_arg(name):
  config = f'configs/{name}.py'
  with pytest.raises(ValueError, match=rf"{config}: arg gpu='8xa100'.*a100"):
    _load(name, 'gpu=8xa100')
  with pytest.raises(ValueError, match=rf"{config}: args tpu='v4-32' and gpu="):
    _load(name, 'tpu=v4-32,gpu=8xh100')


def test_config_rules_and_preset_check_the_gpu_key():
  c = from_config.load(f'{ROOT}/configs/qwen25_math_7b.py', ['--config.gpu=6xh100'])
  with pytest.raises(config_rules.ConfigError, match=r"config gpu='6xh100': "):
    config_rules.check_keys(c)
  both = from_config.load(
    f'{ROOT}/configs/qwen25_math_7b.py:tpu=v5p-64', ['--config.gpu=8xh100']
  )
  with pytest.raises(config_rules.ConfigError, match=r'pod=.*gpu=.*not both'):
    from_config.preset(both)


@pytest.mark.parametrize('name', PAPER)
def test_gpu_presets_leave_the_layout_to_the_rule_and_keep_the_step(name):
  """Mesh (1, -1, 0) and micro-batch 0 as with tpu=; the rule derives both."""
  bare = _load(name, '')
  for preset, variant in itertools.product(common.GPU_PRESETS, ('balance', 'grpo')):
    c = _load(name, f'gpu={preset},variant={variant}')
    assert (c.gpu, c.pod) == (preset, '')
    assert dict(c.mesh) == common.RULE_MESH and c.rl.micro_batch_rows == 0
    target = from_config.preset(c)
    g = gpu_hosts.hosts(preset)
    assert (target.chip, target.devices, target.platform) == (g.chip, g.gpus, 'gpu')
    cfg = plan.model_config(c, name)
    chosen = from_config.resolve_layout(c, cfg, refuse=False)
    # The preset's GPUs and the GPU plan: the same call with everything spelled out.
    hbm = chips.allocatable_gib(chips.CHIPS[g.chip]) * 2**30
    fresh = _load(name, f'gpu={preset},variant={variant}')
    again = from_config.resolve_layout(fresh, cfg, g.gpus, hbm, 'gpu', refuse=False)
    assert (chosen.mesh, chosen.waves, chosen.plan.peak) == (
      again.mesh,
      again.waves,
      again.plan.peak,
    )
    assert math.prod(chosen.mesh) == g.gpus
    dp = chosen.mesh[0] * chosen.mesh[1]
    assert c.rl.micro_batch_rows == layout.micro_rows(c.rl.mini_batch_rows, dp)
    # Nothing of the paper's step changes with the preset.
    want = _load(name, f'variant={variant}')
    for key in ('prompts_per_step', 'group_size', 'samples_per_round', 'max_rounds'):
      assert c.rl[key] == want.rl[key], key
    for key in ('slots', 'mini_batch_rows', 'positive_threshold', 'target_groups'):
      assert c.rl[key] == want.rl[key], key
    assert c.data.prompt_bucket == bare.data.prompt_bucket
    assert c.sampling.max_new_tokens == bare.sampling.max_new_tokens


def _phases(c, cfg, chosen, devices: int, hbm: float) -> dict[str, float]:
  """Every phase's bytes per GPU as the plan reports it (chunked ones at their chunk)."""
  out = {'RL step': chosen.plan.peak}
  for phase, new in (
    ('pass_rates', c.sampling.max_new_tokens),
    ('evaluation', plan.EVAL_NEW_TOKENS),
    ('selection', c.sampling.max_new_tokens),
  ):
    slots = from_config.command_slots(c, cfg, phase, new, hbm=hbm, devices=devices)
    shapes = from_config.step_shapes(c, cfg, new)
    sized = dataclasses.replace(shapes, slots=slots)
    out[phase] = memory.plan(cfg, sized, chosen.mesh, backend='gpu').phase_bytes(phase)
  return out


@pytest.mark.parametrize('name', PAPER)
def test_every_paper_config_fits_8xh100_with_headroom(name):
  """The paper's step on the paper's hardware: >= 10% of the allocatable free.

  Every phase the plan reports (the RL step's peak, the trainer's histogram
  and evaluations, evaluate, select_prompts) for grpo, pos and balance at
  the default XLA_PYTHON_CLIENT_MEM_FRACTION. The 3B and 4B need slot waves
  for Ada's S = 4096 slots.
  """
  hbm = chips.allocatable_gib(chips.CHIPS['h100']) * 2**30
  for variant in ('grpo', 'pos', 'balance'):
    c = _load(name, f'gpu=8xh100,variant={variant}')
    cfg = plan.model_config(c, name)
    chosen = from_config.resolve_layout(c, cfg)  # Refuses a layout that does not fit.
    assert chosen.fits
    for phase, got in _phases(c, cfg, chosen, 8, hbm).items():
      assert got <= (1 - layout.HEADROOM) * hbm, (variant, phase, got / 2**30)
    if name in ('llama32_3b_instruct', 'qwen3_4b_instruct') and variant != 'grpo':
      assert chosen.waves > 1, (variant, chosen)


def test_one_h100_holds_no_paper_model_and_says_so():
  c = _load('qwen25_math_1p5b', 'gpu=1xh100')
  with pytest.raises(from_config.ConfigError, match=r'does not fit 1xh100 \(1 devices'):
    from_config.resolve_layout(c, plan.model_config(c, 'qwen25_math_1p5b'))


def test_budget_is_hbm_times_the_fraction(monkeypatch):
  h100 = chips.CHIPS['h100']
  c = _load('qwen25_math_7b', 'gpu=8xh100')
  spec = 'configs/qwen25_math_7b.py:gpu=8xh100'
  assert from_config.pod_memory(c) == ('h100', h100.hbm_gib * 0.75 * 2**30)
  out = plan.report(c, spec, None, None)
  assert (
    f'{h100.hbm_gib * 0.75:.1f} GiB allocatable of {h100.hbm_gib:.1f} GiB per GPU '
    f'({ENV}=0.75, the default; raise it to give JAX more)'
  ) in out
  monkeypatch.setenv(ENV, '0.9')
  c = _load('qwen25_math_7b', 'gpu=8xh100')
  assert from_config.pod_memory(c) == ('h100', h100.hbm_gib * 0.9 * 2**30)
  out = plan.report(c, spec, None, None)
  assert (
    f'{h100.hbm_gib * 0.9:.1f} GiB allocatable of {h100.hbm_gib:.1f} GiB per GPU '
    f'({ENV}=0.9, from the environment)'
  ) in out
  assert out.splitlines()[-1].endswith(
    f'of {h100.hbm_gib * 0.9:.1f} GiB per device (peak: sampling)'
  )
  # A TPU's budget is its whole HBM, whatever the GPU variable says.
  tpu = _load('qwen25_math_7b', 'tpu=v5p-64')
  assert from_config.pod_memory(tpu) == ('v5p', chips.CHIPS['v5p'].hbm_gib * 2**30)
  assert 'allocatable' not in plan.report(
    tpu, 'configs/qwen25_math_7b.py:tpu=v5p-64', None, None
  )
  monkeypatch.setenv(ENV, '1.5')
  with pytest.raises(ValueError, match=ENV):
    from_config.pod_memory(_load('qwen25_math_7b', 'gpu=8xh100'))


def _paper_line(name: str, arg: str) -> str:
  c = _load(name, arg)
  out = plan.report(c, f'configs/{name}.py:{arg}', None, None)
  return next(x for x in out.splitlines() if x.startswith('paper step times'))


def test_like_for_like_paper_times_on_8xh100_only():
  line = _paper_line('qwen25_math_7b', 'gpu=8xh100')
  assert 'balance 375 s' in line and 'like for like' in line, line
  step = float(line.split('roofline step of ')[1].split(' s')[0])
  ratio = float(line.split(' s is ')[1].split('x')[0])
  assert ratio == pytest.approx(step / 375, abs=0.01)
  assert 'measured grpo step' in _paper_line(
    'qwen25_math_1p5b', 'gpu=8xh100,variant=grpo'
  )
  for name, arg in (
    ('qwen25_math_7b', 'gpu=8xh200'),
    ('qwen25_math_7b', 'gpu=1xh100,variant=grpo'),
    ('qwen25_math_7b', 'tpu=v5p-64'),
    ('qwen25_math_1p5b', 'tpu=v4-32'),
  ):
    line = _paper_line(name, arg)
    assert 'measured on 8xH100' in line and 'like for like' not in line, line
  # A model the paper did not time: none, on its hardware too.
  line = _paper_line('llama32_3b_instruct', 'gpu=8xh100')
  assert 'none for' in line and 'like for like' not in line


def test_plan_command_on_8xh100(capsys):
  plan.main(['--config', 'configs/qwen3_4b_instruct.py:gpu=8xh100'])
  out = capsys.readouterr().out
  c = _load('qwen3_4b_instruct', 'gpu=8xh100')
  chosen = from_config.resolve_layout(c, plan.model_config(c, 'qwen3_4b_instruct'))
  assert f'mesh (data, fsdp, tensor) = {chosen.mesh}' in out
  assert f'sampling.waves={chosen.waves}' in out and chosen.waves > 1
  assert 'GiB allocatable of' in out and 'on gpu' in out
  for line in (
    "the trainer's evaluation and pass-rate histogram",
    'python -m ada_jax.evaluate',
    'python -m ada_jax.select_prompts',
  ):
    verdict = next(x for x in out.splitlines() if x.startswith(line))
    assert verdict.endswith(', fits'), verdict
  assert 'roofline lower bound on h100' in out
  assert 'on 8 h100 GPUs = at least' in out and 'GPU-hours' in out
  assert out.rstrip().splitlines()[-2].startswith('fits: ')


def test_hosts_of_eight_write_their_share():
  one = _load('qwen25_math_7b', 'gpu=8xh100')
  two = _load('qwen25_math_7b', 'gpu=16xh100')
  assert from_config.preset(two).devices_per_host == 8

  def checkpoint(c, arg):
    out = plan.report(c, f'configs/qwen25_math_7b.py:{arg}', None, None)
    return next(x for x in out.splitlines() if x.startswith('checkpoint '))

  assert 'per host x 1)' in checkpoint(one, 'gpu=8xh100')
  assert 'per host x 2)' in checkpoint(two, 'gpu=16xh100')
