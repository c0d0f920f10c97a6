"""Tests for configs/: arg combinations, docstring commands, TPU presets.

Every arg combination builds, errors name the key, docstring commands
parse and TPU presets divide (sweeps: tests/test_experiments.py).

Fast: ConfigDicts only, nothing compiles.
"""

import dataclasses
import importlib.util
import itertools
import pathlib
import re
import shlex
import subprocess

import pytest

from ada_jax import evaluate, from_config, main, plan
from ada_jax.infra import tpu_pods
from configs import common

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAPER = {  # config -> allowed data= values.
  'qwen25_math_1p5b': ('hard', 'easy'),
  'qwen25_math_7b': ('hard', 'easy'),
  'qwen3_4b_instruct': ('hard',),
  'llama32_3b_instruct': ('hard',),
}
ALL = ('tiny_arith', *PAPER)


def _module(name):
  spec = importlib.util.spec_from_file_location(
    f'cfg_{name}', ROOT / 'configs' / f'{name}.py'
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


MODULES = {name: _module(name) for name in ALL}


def _paper_args(name):
  for variant, schedule, data, tpu in itertools.product(
    common.VARIANTS, common.SCHEDULES, PAPER[name], ('', *common.EXAMPLE_PODS)
  ):
    parts = [f'variant={variant}', f'schedule={schedule}', f'data={data}']
    yield ','.join([*parts, f'tpu={tpu}'] if tpu else parts), tpu


@pytest.mark.parametrize('name', PAPER)
def test_paper_configs_build_with_every_arg(name):
  for arg, tpu in _paper_args(name):
    c = MODULES[name].get_config(arg)
    assert c.model.hf_path == ''
    assert c.data.name.startswith('ada_math_local/')
    rl = c.rl
    assert c.pod == tpu
    assert rl.micro_batch_rows == 0  # One row per batch shard, by the rule.
    devices = tpu_pods.pod(tpu).chips if tpu else 16
    from_config.resolve_layout(
      c, plan.model_config(c, name), devices, None if not tpu else 1e15
    )
    dp = c.mesh.data * (devices // (c.mesh.data * c.mesh.tensor))
    rows = common.train_rows(rl.rule, rl, rl.group_size)
    assert rl.slots % dp == 0, arg
    assert rows % rl.mini_batch_rows == 0 and rows // rl.mini_batch_rows == 4, arg
    assert rl.mini_batch_rows % rl.micro_batch_rows == 0, arg
    if tpu:
      assert rl.micro_batch_rows == dp, arg
    assert c.data.prompt_bucket + c.sampling.max_new_tokens <= 4096


@pytest.mark.parametrize('name', ALL)
def test_runlocal_validates(name):
  for variant, schedule in itertools.product(common.VARIANTS, common.SCHEDULES):
    c = MODULES[name].get_config(f'runlocal,variant={variant},schedule={schedule}')
    from_config.validate(c)
    tiny_task = 'ada_columns' if name == 'tiny_arith' else 'ada_arith'
    assert c.model.hf_path == '' and c.data.name == tiny_task
    if name in PAPER:
      assert (
        c.model.tiny.family
        == {
          'qwen25_math_1p5b': 'qwen2',
          'qwen25_math_7b': 'qwen2',
          'qwen3_4b_instruct': 'qwen3',
          'llama32_3b_instruct': 'llama',
        }[name]
      )
      assert c.rl.steps <= 5 and c.rl.slots <= 64 and c.sft.steps == 0


@pytest.mark.parametrize('name', PAPER)
def test_empty_hf_path_fails_validation_naming_the_key(name):
  with pytest.raises(ValueError, match=r'model\.hf_path'):
    from_config.validate(MODULES[name].get_config())


def test_reference_values():
  c = MODULES['qwen25_math_1p5b'].get_config()
  rl = c.rl
  assert (rl.prompts_per_step, rl.group_size, rl.samples_per_round) == (512, 4, 8)
  assert (rl.max_rounds, rl.slots, rl.positive_threshold) == (4, 4096, 0.7)
  assert (rl.lr, rl.warmup, rl.weight_decay, rl.clip_ratio_c) == (1e-6, 10, 0.0, 10.0)
  assert (rl.clip_low, rl.clip_high, rl.entropy_coef, rl.steps) == (0.2, 0.28, 0.0, 400)
  assert rl.mini_batch_rows == 512 and rl.loss_agg_mode == 'token-mean'
  assert (c.data.prompt_bucket, c.sampling.max_new_tokens) == (1024, 2048)
  assert c.checkpoint.every == 50 and c.sampling.temperature == 1.0
  g = MODULES['qwen25_math_1p5b'].get_config('variant=grpo').rl
  assert (g.slots, g.max_rounds, g.clip_ratio_c, g.weight_decay, g.warmup) == (
    2048,
    1,
    3.0,
    0.01,
    0,
  )
  assert MODULES['qwen25_math_7b'].get_config('data=easy').data.name.endswith('easy_7b')


def test_tiny_arith_values_unchanged_by_arg_parsing():
  tiny = MODULES['tiny_arith']
  c = tiny.get_config()
  assert (c.rl.steps, c.rl.prompts_per_step, c.rl.slots, c.rl.lr) == (
    250,
    32,
    256,
    3e-4,
  )
  assert (c.data.name, c.sft.teacher, c.sft.boxed_share) == (
    'ada_columns',
    'columns',
    1.0,
  )
  # The columns task's documented figures: 3 layers, 1200 SFT steps.
  assert (c.model.tiny.layers, c.sft.steps, c.sft.carry_drop) == (3, 1200, 0.6)
  # The format task keeps the values of its documented figures.
  f = tiny.get_config('task=format')
  assert (f.data.levels, f.data.balance_levels, f.sft.steps) == ('0,1,4-7', True, 1000)
  assert (f.model.tiny.layers, f.rl.lr) == (2, 1e-3)
  assert (f.sft.lr_schedule, f.sft.boxed_share, f.sft.teacher) == (
    'cosine',
    0.4,
    'answer',
  )
  assert (f.sampling.max_new_tokens, f.rl.eval_sampled_k) == (8, 0)
  on_pod = tiny.get_config('tpu=v4-32,variant=balance').to_dict()
  assert on_pod.pop('pod') == 'v4-32'
  assert on_pod == {k: v for k, v in c.to_dict().items() if k != 'pod'}
  assert tiny.get_config('seed=3').seed == 3
  assert tiny.get_config('variant=grpo').rl.slots == 128


@pytest.mark.parametrize(
  ('name', 'arg', 'key'),
  [
    ('qwen25_math_1p5b', 'foo=1', 'foo'),
    ('qwen25_math_1p5b', 'variant=ppo', 'variant'),
    ('qwen25_math_7b', 'schedule=greedy', 'schedule'),
    ('qwen25_math_7b', 'tpu=v3-8', 'tpu'),
    ('qwen25_math_7b', 'gpu=8xa100', 'gpu'),
    ('qwen25_math_1p5b', 'gpu=3xh100', 'gpu'),
    ('qwen3_4b_instruct', 'tpu=v4-32,gpu=8xh100', "tpu='v4-32' and gpu="),
    ('qwen25_math_7b', 'data=medium', 'data'),
    ('qwen3_4b_instruct', 'data=easy', 'data'),
    ('llama32_3b_instruct', 'data=easy', 'data'),
    ('llama32_3b_instruct', 'seed=x', 'seed'),
    ('llama32_3b_instruct', 'variant', 'variant'),
    ('tiny_arith', 'bogus', 'bogus'),
    ('tiny_arith', 'variant=nope', 'variant'),
    ('tiny_arith', 'tpu=v2-8', 'tpu'),
    ('tiny_arith', 'task=mul', 'task'),
  ],
)
def test_bad_args_name_config_and_key(name, arg, key):
  with pytest.raises(ValueError, match=rf'configs/{name}\.py.*{key}'):
    MODULES[name].get_config(arg)


def _docstring_commands(name):
  """Commands in a config's docstring, backslash continuations joined."""
  text = (MODULES[name].__doc__ or '').replace('\\\n', ' ')
  return [
    shlex.split(m.group(0))
    for m in re.finditer(r'(python -m ada_jax\.\w+|\./launch_tpu\.sh run)[^\n]*', text)
  ]


def _parse_main(argv):
  """Parses main's command line as ada_jax.main does."""
  args, overrides = main.parse(argv)
  assert args.workdir
  return from_config.load(args.config, overrides)


@pytest.mark.parametrize('name', ALL)
def test_docstring_commands_parse(name, monkeypatch):
  monkeypatch.chdir(ROOT)
  commands = _docstring_commands(name)
  kinds = {tuple(cmd[:3]) for cmd in commands}
  assert ('python', '-m', 'ada_jax.main') in kinds
  assert any(cmd[0] == './launch_tpu.sh' for cmd in commands), name
  for cmd in commands:
    if cmd[:3] == ['python', '-m', 'ada_jax.main']:
      c = _parse_main(cmd[3:])
      if c.data.template == 'tiny':  # Runs as written: validate it too.
        from_config.validate(c)
    elif cmd[:2] == ['./launch_tpu.sh', 'run']:
      rest = cmd[2:]
      workdir = rest[rest.index('--workdir') + 1]
      assert workdir.startswith('gs://')
      overrides = [a for a in rest[1:] if a.startswith('--config.')]
      c = _parse_main([f'--config={rest[0]}', f'--workdir={workdir}', *overrides])
      # Where `launch_tpu.sh stage` puts the config's model and sets.
      hub_id = c.model.get('hub_id', '')
      if not hub_id:  # The tiny config: nothing to stage.
        continue
      staged = f'gs://BUCKET/assets/models/{hub_id.split("/")[-1]}'
      assert c.model.hf_path == staged
      assert c.data.manual_dir == 'gs://BUCKET/assets/manual'
    else:
      assert cmd[:2] == ['./launch_tpu.sh', 'eval']
      args, rest = evaluate.parser().parse_known_args(cmd[2:])
      assert all(a.startswith('--config.') for a in rest)
      from_config.load(args.config, rest)
      assert args.k == 32
      for d in args.datasets.split(','):
        evaluate.dataset_split(d)


def test_launch_run_accepts_docstring_command(tmp_path):
  """The TPU line of a config reaches launch_tpu.sh's dry run intact."""
  cmd = next(
    c for c in _docstring_commands('qwen25_math_7b') if c[0] == './launch_tpu.sh'
  )
  fake = tmp_path / 'gcloud'
  fake.write_text('#!/bin/sh\nexit 97\n')
  fake.chmod(0o755)
  proc = subprocess.run(
    [
      'bash',
      str(ROOT / 'launch_tpu.sh'),
      *('--dry-run', '--name', 'p', '--zone', 'z', '--type', 'v5p-64'),
      *cmd[1:],
    ],
    capture_output=True,
    text=True,
    env={'PATH': f'{tmp_path}:/usr/bin:/bin', 'HOME': str(tmp_path)},
    timeout=30,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr
  assert 'configs/qwen25_math_7b.py:tpu=v5p-64' in proc.stdout
  assert (
    '--config.model.hf_path=gs://BUCKET/assets/models/Qwen2.5-Math-7B' in proc.stdout
  )


_SIZES = {
  'qwen25_math_1p5b': '1.5b',
  'llama32_3b_instruct': '3b',
  'qwen3_4b_instruct': '4b',
  'qwen25_math_7b': '7b',
}


@pytest.mark.parametrize('name', PAPER)
def test_presets_follow_the_layout_rule(name):
  """Every variant on every example pod: the rule's layout fits, or is refused.

  The rule (planner/layout.py) takes the smallest tensor axis dividing the
  KV heads whose plan fits in one slot wave; else the fewest waves (2, 4,
  8) at the smallest tensor axis leaving layout.HEADROOM free (else that
  fits at all). Every layout the rule passed over is checked not to qualify;
  where none fits, validation refuses the config with the plan's line.
  """
  from ada_jax.planner import chips, layout, memory

  for variant, tpu in itertools.product(common.VARIANTS, common.EXAMPLE_PODS):
    c = MODULES[name].get_config(f'variant={variant},tpu={tpu}')
    pod = tpu_pods.pod(tpu)
    cfg = plan.model_config(c, name)
    assert (cfg.attention, cfg.remat) == ('auto', 'block')
    hbm = chips.CHIPS[pod.generation].hbm_gib * 2**30
    chosen = from_config.resolve_layout(c, cfg, pod.chips, hbm, 'tpu', refuse=False)
    assert c.sampling.waves == chosen.waves
    shapes = from_config.step_shapes(c, cfg)
    assert shapes.waves == chosen.waves
    assert chosen.plan.peak == memory.plan(cfg, shapes, chosen.mesh).peak

    def peak(t, w, cfg=cfg, shapes=shapes, chips=pod.chips):
      mesh = memory.resolve_mesh({'data': 1, 'fsdp': -1, 'tensor': t}, chips)
      micro = layout.micro_rows(shapes.mini_batch_rows, mesh[1])
      s2 = dataclasses.replace(shapes, micro_batch_rows=micro, waves=w)
      return memory.plan(cfg, s2, mesh).peak

    roomy = (1 - layout.HEADROOM) * hbm
    for w in (1, 2, 4, 8):
      for t in chosen.tried:
        if (w, t) >= (chosen.waves, chosen.mesh[2]):
          continue
        if shapes.slots % w or (shapes.slots // w) % max(shapes.slot_group, 1):
          continue
        # Passed over: does not fit (one wave) or leaves too little free.
        assert peak(t, w) > (hbm if w == 1 else roomy), (variant, tpu, t, w)
    if chosen.fits:
      assert chosen.plan.peak <= hbm
    else:
      fresh = MODULES[name].get_config(f'variant={variant},tpu={tpu}')
      with pytest.raises(from_config.ConfigError, match=r'config mesh\.tensor=0: .*'):
        from_config.resolve_layout(fresh, cfg, pod.chips, hbm, 'tpu')


@pytest.mark.parametrize('name', PAPER)
def test_commands_and_scoring_chunks_fit_every_example_pod(name):
  """evaluate, select_prompts and the trainer's scoring fit, chunked by the plan.

  Each takes the largest chunk of slots whose phase fits
  (`from_config.command_slots`): evaluate at its 4096 new tokens on params
  copied to the compute dtype (`from_config.policy`). 7B on v6e-64 did not
  fit at any chunk with fp32 params restored whole (28.4 GiB of 32).
  """
  from ada_jax.planner import chips, memory

  for tpu in common.EXAMPLE_PODS:
    c = MODULES[name].get_config(f'tpu={tpu}')
    pod = tpu_pods.pod(tpu)
    cfg = plan.model_config(c, name)
    hbm = chips.CHIPS[pod.generation].hbm_gib * 2**30
    from_config.resolve_layout(c, cfg, pod.chips, hbm, 'tpu')
    mesh = memory.resolve_mesh(dict(c.mesh), pod.chips)
    for phase, new in (
      ('evaluation', 4096),
      ('selection', c.sampling.max_new_tokens),
      ('pass_rates', c.sampling.max_new_tokens),
    ):
      slots = from_config.command_slots(c, cfg, phase, new)
      shapes = dataclasses.replace(from_config.step_shapes(c, cfg, new), slots=slots)
      got = memory.plan(cfg, shapes, mesh).phase_bytes(phase)
      assert got <= hbm, (tpu, phase, slots, got / 2**30)


@pytest.mark.parametrize(
  ('kind', 'markers'),
  [('tpu', 'plan tables'), ('gpu', 'gpu plan tables')],
)
def test_docstring_tables_match_the_plan(kind, markers):
  """configs/common.py's preset tables are the plan's (ADA_WRITE_TABLES=1 rewrites).

  Generated by `plan.preset_tables` from the layout rule on the example
  pods (`tpu=`) and GPU hosts (`gpu=`, at the default memory fraction), so
  a change to the planner or the rule shows up here. The TPU tables sit
  between their own markers: adding the GPU ones leaves them as they were.
  """
  import os

  path = ROOT / 'configs' / 'common.py'
  text = path.read_text()
  start, end = f'[{markers}]\n', f'[end {markers}]\n'
  presets = common.EXAMPLE_GPUS if kind == 'gpu' else common.EXAMPLE_PODS
  table = plan.preset_tables(presets, ('balance', 'dapo', 'grpo'), str(ROOT), kind)
  body = text[text.index(start) + len(start) : text.index(end)]
  want = f'\n{table}\n\n'
  if os.environ.get('ADA_WRITE_TABLES') == '1' and body != want:
    path.write_text(text.replace(start + body + end, start + want + end))
    body = want
  assert body == want, (
    'configs/common.py tables are stale: rerun with ADA_WRITE_TABLES=1'
  )
