"""A dead run fails loudly; a lost metrics row is reported (issue 39, items 3, 6).

A run whose every update was non-finite used to exit 0 with a finished
summary; a collapsed policy gave no warning; a row lost with its
checkpoint's step left a silent gap.
"""

import json
import math
import types

import jax
import jax.numpy as jnp
import pytest

from ada_jax.infra import checkpoint as checkpoint_lib
from ada_jax.infra import metrics as metrics_lib
from ada_jax.rl import fit as fit_lib


class _FakeTrainer:
  """Just what `fit` uses of a Trainer; every update of every step skipped."""

  def __init__(self, workdir, steps):
    self.rl = types.SimpleNamespace(
      steps=steps, eval_every=0, lr=1e30, controller=types.SimpleNamespace(rule='x')
    )
    self.writer = metrics_lib.MetricsWriter(workdir, tensorboard=False)
    self.ckpt = None
    self.sft_done = True
    self.step = 0
    self.saved = []
    self.config = types.SimpleNamespace(vocab_size=16)

  def run_sft(self):
    pass

  def rl_step(self):
    self.step += 1
    return dict(
      reward_round1_mean=0.0, rounds=1, zero_adv_frac=1.0, entropy=float('nan'),
      skipped_updates=2, updates=2, boxed_frac=0.0,
    )  # fmt: skip

  def save(self, force=False):
    self.saved.append(self.step)


def test_consecutive_all_nonfinite_steps_stop_the_run_marked_failed(tmp_path):
  (tmp_path / 'summary.json').write_text(json.dumps({'before_rl': {}}))
  trainer = _FakeTrainer(tmp_path, steps=10)
  with pytest.raises(fit_lib.DeadRunError) as e:
    fit_lib.fit(trainer, max_nonfinite_steps=3)
  assert '\n' not in str(e.value) and 'non-finite for 3 steps' in str(e.value)
  assert trainer.step == 3 and trainer.saved == [1, 2]  # the dead step is not saved
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['failed']['step'] == 3 and 'after_rl' not in summary
  rows = metrics_lib.read_rows(tmp_path / 'metrics.jsonl', phase='rl')
  assert len(rows) == 3


def _rows(entropies, boxed):
  return [dict(entropy=e, boxed_frac=b) for e, b in zip(entropies, boxed, strict=True)]


def test_entropy_gone_uniform_after_being_below_is_a_collapse():
  watch = fit_lib.CollapseWatch(vocab_size=16, patience=3)
  high = math.log(16)
  got = [watch.update(r) for r in _rows([1.0, 1.2, high, high, high], [0.5] * 5)]
  assert got[:4] == [None] * 4 and 'entropy' in got[4]


def test_a_policy_that_was_always_uniform_is_not_a_collapse():
  watch = fit_lib.CollapseWatch(vocab_size=16, patience=3)
  high = math.log(16)
  assert all(watch.update(r) is None for r in _rows([high] * 6, [0.0] * 6))


def test_boxed_answers_falling_to_zero_is_a_collapse_never_boxing_is_not():
  watch = fit_lib.CollapseWatch(vocab_size=16, patience=2)
  got = [watch.update(r) for r in _rows([1.0] * 4, [0.6, 0.3, 0.0, 0.0])]
  assert got[:3] == [None] * 3 and 'no boxed answer' in got[3]
  quiet = fit_lib.CollapseWatch(vocab_size=16, patience=2)
  assert all(quiet.update(r) is None for r in _rows([1.0] * 4, [0.1, 0.0, 0.0, 0.0]))


def test_readers_refuse_nonfinite_params_in_one_line():
  params = {'a': jnp.ones((2,)), 'b': {'w': jnp.array([1.0, jnp.inf])}}
  with pytest.raises(checkpoint_lib.NonFiniteParamsError) as e:
    checkpoint_lib.check_finite(params, 'DIR step 3')
  assert '\n' not in str(e.value) and '1 of 2 tensors' in str(e.value)
  checkpoint_lib.check_finite({'a': jnp.ones((2,))}, 'DIR')


def test_a_row_cut_at_the_checkpoint_step_is_reported_on_resume(tmp_path):
  rows = [json.dumps({'step': s, 'phase': 'rl', 'loss': 0.5}) for s in (1, 2, 4)]
  cut = json.dumps({'step': 5, 'phase': 'rl', 'loss': 0.5})[:12]  # power loss
  (tmp_path / 'metrics.jsonl').write_text('\n'.join([*rows, cut]))
  writer = metrics_lib.MetricsWriter(tmp_path, tensorboard=False, keep={'rl': 5})
  assert writer.lost_rows == [('rl', 3), ('rl', 5)]
  writer.close()
  whole = metrics_lib.MetricsWriter(tmp_path / 'x', tensorboard=False, keep={'rl': 0})
  assert whole.lost_rows == []


def test_readers_refuse_a_failed_runs_finite_checkpoint(tmp_path):
  # rl.lr=1e30: the first update leaves finite weights near 1e30, every later
  # one is skipped as non-finite, and the run stops as dead. Its checkpoint
  # passes the finiteness check; the summary's `failed` mark refuses it.
  params = {'w': jnp.full((4,), 9e29)}
  with checkpoint_lib.Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, params=params, opt_state={'mu': jnp.zeros((4,))}, force=True)
  one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  abstract = {'w': jax.ShapeDtypeStruct((4,), jnp.float32, sharding=one)}
  step, _, _ = checkpoint_lib.restore_params(tmp_path, abstract)
  assert step == 1  # readable while the run is not marked failed
  failed = {'step': 3, 'cause': 'every update was non-finite for 3 steps in a row'}
  (tmp_path / 'summary.json').write_text(json.dumps({'failed': failed}))
  with pytest.raises(checkpoint_lib.FailedRunError) as e:
    checkpoint_lib.restore_params(tmp_path, abstract)
  assert '\n' not in str(e.value) and 'failed at step 3' in str(e.value)
