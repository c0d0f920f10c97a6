"""The run's config is its identity (issue 39, item 2).

A rerun with another `rl.lr` or variant used to continue the run and rewrite
config.json; now a change to a key that alters what the run computes is a
one-line refusal naming the keys and both values, the other keys' changes
are recorded with their step, and `--extend-steps` is the one way to more
steps. Fast: ConfigDicts and small files only.
"""

import json
import shutil

import pytest

from ada_jax import config_rules, from_config
from ada_jax.infra import metrics as metrics_lib
from ada_jax.infra import run_dir
from ada_jax.rl import trainer as trainer_lib
from tests import test_config_rules, test_vocab_check

TINY = 'configs/tiny_arith.py'


def _run(tmp_path, *overrides):
  """A workdir recording the tiny config (30 RL steps) with `overrides`."""
  workdir = tmp_path / 'run'
  workdir.mkdir(exist_ok=True)
  c = from_config.load(TINY, ['--config.rl.steps=30', *overrides])
  (workdir / run_dir.CONFIG_FILE).write_text(json.dumps(metrics_lib.config_json(c)))
  return str(workdir)


def _given(*overrides):
  return from_config.load(TINY, ['--config.rl.steps=30', *overrides])


@pytest.mark.parametrize('name', test_config_rules.CONFIGS)
def test_every_key_of_every_config_is_in_one_class(name):
  classes = config_rules.key_classes()
  assert set(classes) == config_rules.rule_keys()
  assert set(classes.values()) == {config_rules.COMPUTATION, config_rules.EXECUTION}
  assert config_rules.rule_keys() >= config_rules._EXECUTION_KEYS
  module = test_config_rules._module(name)
  for arg in test_config_rules._args(name):
    leaves = set(dict(config_rules.leaves(module.get_config(arg))))
    assert leaves <= set(classes), f'{name}:{arg}: {sorted(leaves - set(classes))}'


@pytest.mark.parametrize(
  'override, named',
  [
    ('--config.rl.lr=0.01', 'rl.lr: 0.0003 recorded, 0.01 given'),
    ('--config.rl.rule=grpo', "rl.rule: 'balance' recorded, 'grpo' given"),
    ('--config.rl.steps=10', 'rl.steps: 30 recorded, 10 given'),
    ('--config.rl.steps=40', 'rl.steps: 30 recorded, 40 given'),
    ('--config.seed=1', 'seed: 0 recorded, 1 given'),
    (
      '--config.sampling.max_new_tokens=5',
      'sampling.max_new_tokens: ',
    ),
  ],
)
def test_a_changed_computation_key_is_refused_in_one_line(tmp_path, override, named):
  workdir = _run(tmp_path)
  with pytest.raises(config_rules.ConfigError) as e:
    from_config.identity(_given(override), workdir)
  assert named in str(e.value) and '\n' not in str(e.value)
  assert sorted(p.name for p in tmp_path.joinpath('run').iterdir()) == ['config.json']


def test_keys_that_do_not_change_the_computation_may_change(tmp_path):
  workdir = _run(tmp_path)
  ident = from_config.identity(
    _given(
      '--config.checkpoint.every=7',
      '--config.verifier.workers=3',
      '--config.data.data_dir=/elsewhere',
      '--config.mesh.data=2',
      '--config.rl.micro_batch_rows=32',
    ),
    workdir,
  )
  assert not ident.fresh and ident.steps == 30
  assert ident.changes['checkpoint.every'][1] == 7
  assert ident.changes['data.data_dir'] == ('', '/elsewhere')
  assert set(ident.changes) == {
    'checkpoint.every', 'verifier.workers', 'data.data_dir', 'mesh.data',
    'rl.micro_batch_rows',
  }  # fmt: skip


def test_extend_steps_is_refused_unless_above_and_then_recorded(tmp_path):
  workdir = _run(tmp_path)
  for n in (10, 30):
    with pytest.raises(config_rules.ConfigError, match='must be above'):
      from_config.identity(_given(), workdir, extend_steps=n)
  ident = from_config.identity(_given(), workdir, extend_steps=40)
  assert (ident.steps, ident.schedule_ends) == (40, (30, 40))
  assert ident.changes == {'rl.steps': (30, 40)}
  run_dir.append_history(
    workdir, {'step': 31, 'changes': {k: list(v) for k, v in ident.changes.items()}}
  )
  # Resumed with the same flag: the same extension, nothing new to record.
  again = from_config.identity(_given(), workdir, extend_steps=40)
  assert (again.steps, again.schedule_ends, again.changes) == (40, (30, 40), {})
  with pytest.raises(config_rules.ConfigError, match='pass --extend-steps 40'):
    from_config.identity(_given(), workdir)


def test_the_added_steps_get_a_new_schedule():
  rl = trainer_lib.RLSettings(
    steps=40, prompts_per_step=1, controller=None, sampling=None, update=None,
    lr=1e-3, warmup=5, lr_schedule='cosine', schedule_ends=(30, 40),
  )  # fmt: skip
  assert rl.lr_at(1) == 0.0  # the first schedule's warmup
  assert rl.lr_at(30) == pytest.approx(0.0)  # its end
  assert rl.lr_at(31) == pytest.approx(1e-3 * 0.5 * (1 + 0.9510565), rel=1e-6)
  assert rl.lr_at(40) == pytest.approx(0.0)
  one = trainer_lib.RLSettings(
    steps=30, prompts_per_step=1, controller=None, sampling=None, update=None,
    lr=1e-3, warmup=5, lr_schedule='cosine',
  )  # fmt: skip
  assert [one.lr_at(s) for s in range(1, 31)] == [rl.lr_at(s) for s in range(1, 31)]


def test_the_model_is_compared_by_content_not_path(tmp_path):
  model = test_vocab_check._hf_dir(tmp_path / 'm', vocab=16, tokenizer_ids=8)
  moved = str(tmp_path / 'moved')
  shutil.copytree(model, moved)
  workdir = _run(tmp_path, f'--config.model.hf_path={model}')
  run_dir.append_history(
    workdir,
    {
      'step': 0,
      'identity': from_config.derived_identity(
        _given(f'--config.model.hf_path={model}')
      ),
    },
  )
  ident = from_config.identity(_given(f'--config.model.hf_path={moved}'), workdir)
  assert ident.changes == {'model.hf_path': (model, moved)}
  other = test_vocab_check._hf_dir(tmp_path / 'other', vocab=24, tokenizer_ids=8)
  with pytest.raises(config_rules.ConfigError, match=r'model\.fingerprint'):
    from_config.identity(_given(f'--config.model.hf_path={other}'), workdir)


def test_config_json_is_never_rewritten(tmp_path):
  first = {'rl': {'lr': 3e-4}}
  metrics_lib.MetricsWriter(tmp_path, tensorboard=False, config=first).close()
  metrics_lib.MetricsWriter(
    tmp_path, tensorboard=False, config={'rl': {'lr': 1.0}}
  ).close()
  assert json.loads((tmp_path / 'config.json').read_text()) == first
