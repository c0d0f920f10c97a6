"""The config rules table: every key of every config has a rule, and it bites.

Fast: ConfigDicts only, nothing compiles (the cross-key rules that need the
devices run in test_train.py and test_reliability.py).
"""

import importlib.util
import itertools
import pathlib

import ml_collections
import pytest

from ada_jax import config_rules, from_config
from configs import common

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = sorted(
  p.stem
  for p in (ROOT / 'configs').glob('*.py')
  if p.stem not in ('__init__', 'common')
)


def _module(name):
  spec = importlib.util.spec_from_file_location(
    f'rules_cfg_{name}', ROOT / 'configs' / f'{name}.py'
  )
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _args(name):
  """Every arg combination the config accepts (variants, schedules, pods)."""
  yield ''
  for variant, schedule in itertools.product(common.VARIANTS, common.SCHEDULES):
    yield f'variant={variant},schedule={schedule}'
    for tpu in common.EXAMPLE_PODS:
      yield f'variant={variant},schedule={schedule},tpu={tpu}'
    yield f'variant={variant},schedule={schedule},runlocal'


@pytest.mark.parametrize('name', CONFIGS)
def test_every_leaf_of_every_config_has_a_rule_that_accepts_it(name):
  module = _module(name)
  rules = config_rules.rule_keys()
  seen = set()
  for arg in _args(name):
    c = module.get_config(arg)
    leaves = dict(config_rules.leaves(c))
    missing = sorted(set(leaves) - rules)
    assert not missing, f'{name}:{arg}: keys without a rule {missing}'
    config_rules.check_keys(c)  # Each default satisfies its own rule.
    seen |= set(leaves)
  assert seen, name


def test_a_key_without_a_rule_is_an_error():
  c = ml_collections.ConfigDict({'seed': 0, 'rl': {'new_knob': 1}})
  with pytest.raises(
    config_rules.ConfigError, match=r'config rl\.new_knob: no validation rule'
  ):
    config_rules.check_keys(c)


@pytest.mark.parametrize(
  'key, value, message',
  [
    ('rl.steps', -1, 'must be an int >= 0'),
    ('rl.steps', 1.5, 'must be an int >= 0'),
    ('rl.lr', float('nan'), 'must be a float >= 0'),
    ('sampling.temperature', 0.0, 'must be a float > 0 (the RL loss divides'),
    ('sampling.top_p', 1.5, r'must be a float in (0, 1]'),
    ('sampling.top_p', -0.5, r'must be a float in (0, 1]'),
    ('sampling.top_k', -1, 'must be an int >= 0 (0 turns it off)'),
    ('sampling.stop_ids', 'eos', "must be 'default', 'model' or comma-separated"),
    ('sampling.stop_ids', '1,-2', "must be 'default', 'model' or comma-separated"),
    ('mesh.data', 0, 'must be an int >= 1 or -1'),
    ('rl.rule', 'ppo', "must be one of ('grpo', 'pos', 'balance', 'dapo', 'est')"),
    ('rl.clip_ratio_c', 0.5, 'must be a float > 1 or 0.0 or 0'),
    ('data.levels', '3-1', 'bad range'),
    (
      'data.name',
      'gsm8k',
      "must be 'ada_arith', 'ada_columns' or 'ada_math_local/<one of",
    ),
    ('model.tiny.head_dim', 15, 'must be even'),
    ('log.tensorboard', 1, 'must be a bool'),
  ],
)
def test_bad_values_name_the_key_and_the_range(key, value, message):
  c = _module('tiny_arith').get_config()
  group, leaf = key.rsplit('.', 1)
  node = c
  for part in group.split('.'):
    node = node[part]
  with node.ignore_type():
    node[leaf] = value
  with pytest.raises(config_rules.ConfigError) as e:
    config_rules.check_keys(c)
  text = str(e.value)
  assert text.startswith(f'config {key}={value!r}: '), text
  assert message in text and '\n' not in text


@pytest.mark.parametrize(
  'arg, attention, refused',
  [
    ('', 'splash', True),  # This CPU host, no preset: a TPU kernel.
    ('', 'cudnn', True),
    ('tpu=v5p-64', 'splash', False),
    ('tpu=v5p-64', 'cudnn', True),
    ('gpu=8xh100', 'cudnn', False),
    ('gpu=8xh100', 'splash', True),
    ('', 'auto', False),
    ('', 'chunked', False),
  ],
)
def test_a_kernel_needs_its_platform(arg, attention, refused):
  """attention='splash' off a TPU target, 'cudnn' off a GPU one: one line."""
  c = _module('qwen25_math_1p5b').get_config(arg)
  c.model.attention = attention
  if refused:
    with pytest.raises(config_rules.ConfigError, match=r"^config model\.attention='"):
      config_rules._cross_platform(c)
  else:
    config_rules._cross_platform(c)


def test_cudnn_needs_a_bf16_compute_dtype():
  c = _module('qwen25_math_1p5b').get_config('gpu=8xh100')
  c.model.attention = 'cudnn'
  c.model.dtype = 'float32'
  with pytest.raises(config_rules.ConfigError, match=r"needs model\.dtype='bfloat16'"):
    config_rules._cross_platform(c)


def test_good_edge_values_pass():
  c = _module('tiny_arith').get_config()
  c.mesh.data = -1
  c.rl.clip_ratio_c = 0.0  # Off.
  c.sampling.top_p = 1.0
  c.rl.lr = 0  # An int where a float is expected.
  config_rules.check_keys(c)


def test_load_applies_overrides_by_the_old_type():
  c = from_config.load(
    str(ROOT / 'configs' / 'tiny_arith.py'),
    ['--config.rl.lr=1', '--config.log.tensorboard=false', '--config.data.levels=0-3'],
  )
  assert c.rl.lr == 1.0 and isinstance(c.rl.lr, float)
  assert c.log.tensorboard is False and c.data.levels == '0-3'
  with pytest.raises(
    from_config.ConfigError,
    match=r'--config\.log\.tensorboard=2: expected true or false',
  ):
    from_config.load(
      str(ROOT / 'configs' / 'tiny_arith.py'), ['--config.log.tensorboard=2']
    )
  with pytest.raises(from_config.ConfigError, match=r'--config\.rl: a group'):
    from_config.load(str(ROOT / 'configs' / 'tiny_arith.py'), ['--config.rl=3'])


def test_model_execution_keys_reach_the_model_config():
  c = from_config.load(
    str(ROOT / 'configs' / 'tiny_arith.py'),
    ['--config.model.attention=chunked', '--config.model.remat=block'],
  )
  config_rules.check_keys(c)
  cfg = from_config.model_config(c)
  assert (cfg.attention, cfg.remat) == ('chunked', 'block')
  assert cfg.max_position_embeddings == c.model.tiny.max_positions  # 0: its own.
  # The position limit, raised as the reference does for Qwen2.5-Math: the
  # model config, the config's own length check and an HF-loaded model
  # (with_config: no params change) all see it.
  c.model.max_position_embeddings = 4 * c.model.tiny.max_positions
  config_rules.check_keys(c)
  assert (
    from_config.model_config(c).max_position_embeddings
    == 4 * cfg.max_position_embeddings
  )
  assert config_rules.max_positions(c) == 4 * cfg.max_position_embeddings
  from flax import nnx

  from ada_jax import model as model_lib

  model = model_lib.Transformer(cfg, rngs=nnx.Rngs(0))
  raised = model_lib.with_config(model, **from_config.execution(c))
  assert raised.config.max_position_embeddings == 4 * cfg.max_position_embeddings
  with pytest.raises(
    config_rules.ConfigError, match=r"config model\.attention='flash'"
  ):
    config_rules.check_keys(
      from_config.load(
        str(ROOT / 'configs' / 'tiny_arith.py'), ['--config.model.attention=flash']
      )
    )


@pytest.mark.parametrize('spec, want', [('default', 3), ('model', 2), ('2', 1)])
def test_stop_ids_reach_the_tokenizer(tmp_path, spec, want):
  from tests import test_tokenizer

  test_tokenizer._qwen_base_dir(tmp_path / 'q')
  c = _module('tiny_arith').get_config()
  c.model.hf_path = str(tmp_path / 'q')
  c.sampling.stop_ids = spec
  assert len(from_config.tokenizer(c).eos_ids) == want
