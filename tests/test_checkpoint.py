"""Checkpoint round trips on a (2,2,2) mesh, keep-last-K, fallbacks, SIGTERM.

And when to save: by steps, by minutes on a fake clock, and on a stop by its
kind (SIGINT, SIGTERM) and whether the write fits the preemption notice.
"""

import logging
import os
import pathlib
import shutil
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ada_jax import model as model_lib
from ada_jax import sharding
from ada_jax.infra import checkpoint, compiles

_CONFIG = model_lib.ModelConfig('qwen2', 64, 32, 64, 1, 4, 2, 8, qkv_bias=True)
# Step 3 of `_format1_state` with `_extras(3)`, written by the format-1
# Checkpointer of commit 4c40467 (runs in flight resume from such steps). Never
# regenerate it with newer code: it would then test nothing.
_FORMAT1 = pathlib.Path(__file__).parent / 'data' / 'checkpoint_format1'


@pytest.fixture(scope='module')
def train_state():
  """A sharded NNX param state and an adamw state after one update."""
  mesh = sharding.make_mesh((2, 2, 2))
  model = sharding.create_sharded_model(_CONFIG, mesh, sharding.TRAIN_RULES, seed=1)
  params = nnx.state(model)
  tx = optax.adamw(1e-2)

  @jax.jit
  def init_and_step(p):
    opt_state = tx.init(p)
    grads = jax.tree.map(lambda x: 0.1 * x + 0.01, p)
    updates, opt_state = tx.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state

  params, opt_state = init_and_step(params)
  return mesh, params, opt_state


@pytest.fixture(scope='module')
def small_state():
  """A two-leaf sharded param dict and its adamw state: cheap to save."""
  mesh = sharding.make_mesh((2, 2, 2))

  def put(x, *spec):
    return jax.device_put(x, NamedSharding(mesh, PartitionSpec(*spec)))

  params = {
    'w': put(jnp.arange(128.0).reshape(8, 16) / 100, 'fsdp', 'tensor'),
    'b': put(jnp.ones(16), 'tensor'),
  }
  return mesh, params, optax.adamw(1e-2).init(params)


class _Tiny(nnx.Module):
  """A list of layers (int path keys), a bias-free layer and a bf16 param."""

  def __init__(self):
    self.blocks = nnx.List(
      [
        nnx.Linear(4, 8, rngs=nnx.Rngs(0)),
        nnx.Linear(8, 4, use_bias=False, rngs=nnx.Rngs(1)),
      ]
    )
    self.scale = nnx.Param(jnp.ones(8, jnp.bfloat16))


def _format1_state(mesh, spec):
  """(params, adamw state) of the format-1 fixture, laid out by `spec(shape)`.

  Leaf i holds (arange + 10 i) % 97, values of the shapes alone (no PRNG, no
  optimizer arithmetic), so a restore can be compared exactly and two swapped
  leaves of one shape show.
  """

  def fill(tree, first):
    leaves, treedef = jax.tree.flatten(tree)
    return treedef.unflatten(
      [
        jax.device_put(
          ((jnp.arange(x.size) + 10 * (first + i)) % 97)
          .astype(x.dtype)
          .reshape(x.shape),
          NamedSharding(mesh, spec(x.shape)),
        )
        for i, x in enumerate(leaves)
      ]
    )

  params = fill(nnx.state(_Tiny()), 0)
  return params, fill(optax.adamw(1e-2).init(params), 100)


def _abstract(tree, shardings=None):
  if shardings is None:
    shardings = jax.tree.map(lambda x: x.sharding, tree)
  return jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
  )


def _extras(step):
  return {
    'data': {'epoch': 1, 'index': 17 + step, 'order': [3, 1, 2]},
    'controller': {
      'est_history': np.arange(6, dtype=np.float32).reshape(2, 3) * step,
      'nested': {'counts': [np.array([1, 2], np.int64), 2.5, None, 'x']},
    },
    'rng': np.asarray(jax.random.key_data(jax.random.key(step)), np.uint32),
    'typed_key': jax.random.key(7),
    'step': np.int32(step),
    'config': {'lr': 1e-6, 'rule': 'balance', 'flags': [True, False]},
  }


def _assert_extras(extras, step):
  """`extras` is `_extras(step)` back: tuples as lists, arrays bit-exact."""
  want = _extras(step)
  assert extras['data'] == want['data']
  assert extras['config'] == want['config']
  assert extras['step'] == step
  hist = extras['controller']['est_history']
  assert isinstance(hist, np.ndarray) and hist.dtype == np.float32
  np.testing.assert_array_equal(hist, want['controller']['est_history'])
  counts = extras['controller']['nested']['counts']
  np.testing.assert_array_equal(counts[0], [1, 2])
  assert counts[1:] == [2.5, None, 'x']
  assert extras['rng'].dtype == np.uint32
  np.testing.assert_array_equal(extras['rng'], want['rng'])
  np.testing.assert_array_equal(
    jax.random.key_data(extras['typed_key']), jax.random.key_data(want['typed_key'])
  )


def _assert_trees_equal(a, b):
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(la, lb, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _save(ckpt, step, params, opt_state, **kw):
  saved = ckpt.save(
    step, params=params, opt_state=opt_state, extras=_extras(step), **kw
  )
  ckpt.wait()
  return saved


def test_round_trip_into_target_shardings(train_state, tmp_path):
  mesh, params, opt_state = train_state
  with checkpoint.Checkpointer(tmp_path, keep=2, every_steps=5) as ckpt:
    assert ckpt.restore_latest(_abstract(params), _abstract(opt_state)) is None
    extras = _extras(5)
    # restore_latest compiled the checksums: a save mid-run compiles nothing.
    with compiles.assert_no_compiles('save'):
      assert not ckpt.save(3, params=params, opt_state=opt_state)  # off interval.
      assert ckpt.save(5, params=params, opt_state=opt_state, extras=extras)
      ckpt.wait()
    assert (tmp_path / 'checkpoints' / '5' / 'commit_success.txt').exists()
  # Params into the sampling layout, a different sharding than the saved one.
  sample_shardings = sharding.state_shardings(params, mesh, sharding.SAMPLE_RULES)
  target_params = _abstract(params, sample_shardings)
  target_opt = checkpoint.abstract_opt_state(optax.adamw(1e-2), target_params)
  assert target_opt[0].count.sharding.spec == PartitionSpec()
  with checkpoint.Checkpointer(tmp_path, keep=2, every_steps=5) as ckpt:
    step, got_params, got_opt, extras = ckpt.restore_latest(target_params, target_opt)
  assert step == 5
  assert isinstance(got_params, nnx.State)
  assert isinstance(got_opt[0], optax.ScaleByAdamState)
  _assert_trees_equal(got_params, params)
  _assert_trees_equal(got_opt, opt_state)
  for got, want in zip(
    jax.tree.leaves(got_params) + jax.tree.leaves(got_opt),
    jax.tree.leaves(target_params) + jax.tree.leaves(target_opt),
    strict=True,
  ):
    assert got.sharding == want.sharding
  up = got_params['layers'][0]['mlp']['up'].get_value()
  assert tuple(up.sharding.spec) == (None, 'tensor')
  # The restored state plugs back into the model.
  graphdef = nnx.graphdef(sharding.create_sharded_model(_CONFIG, mesh, seed=0))
  model = nnx.merge(graphdef, got_params)
  np.testing.assert_array_equal(
    np.asarray(model.layers[0].mlp.up[...]),
    np.asarray(params['layers'][0]['mlp']['up'].get_value()),
  )
  _assert_extras(extras, 5)


def test_restores_a_format_1_checkpoint(tmp_path):
  mesh = sharding.make_mesh((2, 2, 2))

  # Written with the first dimension over 'fsdp'; read with the last over
  # 'tensor', so the restore lands in a layout the files never had.
  def last_over_tensor(shape):
    return (
      PartitionSpec(*[None] * (len(shape) - 1), 'tensor') if shape else PartitionSpec()
    )

  params, opt_state = _format1_state(mesh, last_over_tensor)
  shutil.copytree(_FORMAT1, tmp_path, dirs_exist_ok=True)
  with checkpoint.Checkpointer(tmp_path) as ckpt:
    step, got_params, got_opt, extras = ckpt.restore_latest(
      _abstract(params), _abstract(opt_state)
    )
    assert ckpt.unusable == []  # Every leaf matched its format-1 checksum.
  assert step == 3
  assert isinstance(got_params, nnx.State)
  assert isinstance(got_opt[0], optax.ScaleByAdamState)
  _assert_trees_equal(got_params, params)
  _assert_trees_equal(got_opt, opt_state)
  for got, want in zip(
    jax.tree.leaves((got_params, got_opt)),
    jax.tree.leaves((params, opt_state)),
    strict=True,
  ):
    assert got.sharding == want.sharding
  _assert_extras(extras, 3)


def test_keeps_last_k_and_params_only_restore(train_state, tmp_path):
  _, params, opt_state = train_state
  with checkpoint.Checkpointer(
    tmp_path, keep=2, every_steps=1, async_save=False
  ) as ckpt:
    for step in (1, 2, 3, 4):
      assert _save(ckpt, step, params, opt_state)
    assert ckpt.steps() == [3, 4]
    step, got, opt, _ = ckpt.restore_latest(_abstract(params))
  assert step == 4 and opt is None
  _assert_trees_equal(got, params)


def test_shape_mismatch_raises_and_keeps_the_checkpoint(small_state, tmp_path):
  _, params, opt_state = small_state
  with checkpoint.Checkpointer(tmp_path, every_steps=1) as ckpt:
    _save(ckpt, 1, params, opt_state)
    other = {**params, 'extra': jax.ShapeDtypeStruct((3,), jnp.float32)}
    with pytest.raises(checkpoint.CheckpointMismatchError, match='extra'):
      ckpt.restore_latest(other)
    assert ckpt.steps() == [1]


def _data_files(step_dir):
  """All array data files of the params item (which ones a read uses is orbax's)."""
  return [
    p for p in (step_dir / 'params').rglob('*') if p.is_file() and p.parent.name == 'd'
  ]


@pytest.mark.parametrize(
  'damage', ['garble', 'truncate', 'delete_meta', 'no_marker', 'mixed_files']
)
def test_corrupt_latest_falls_back_to_previous(small_state, tmp_path, caplog, damage):
  _, params, opt_state = small_state
  later = jax.tree.map(lambda x: x + 1, params)
  with checkpoint.Checkpointer(tmp_path, every_steps=1, async_save=False) as ckpt:
    _save(ckpt, 1, params, opt_state)
    _save(ckpt, 2, later, opt_state)
  step_dir = tmp_path / 'checkpoints' / '2'
  for path in _data_files(step_dir) if damage in ('garble', 'truncate') else []:
    data = path.read_bytes()
    if damage == 'truncate':
      path.write_bytes(data[: len(data) // 3])
    else:  # Flip bytes mid-file: zstd passes raw float blocks through unchecked.
      mid = len(data) // 2
      path.write_bytes(
        data[:mid] + bytes(255 - b for b in data[mid : mid + 64]) + data[mid + 64 :]
      )
  if damage == 'delete_meta':
    for p in (step_dir / 'meta').iterdir():
      p.unlink()
  elif damage == 'no_marker':
    (step_dir / 'commit_success.txt').unlink()
  elif damage == 'mixed_files':
    # Readable files holding other numbers (step 1's params under step 2's
    # meta): only the checksums can tell.
    shutil.rmtree(step_dir / 'params')
    shutil.copytree(step_dir.parent / '1' / 'params', step_dir / 'params')
  with caplog.at_level(logging.WARNING), checkpoint.Checkpointer(tmp_path) as ckpt:
    step, got, _, extras = ckpt.restore_latest(_abstract(params), _abstract(opt_state))
    assert step == 1 and extras['data']['index'] == 18
    _assert_trees_equal(got, params)
    warned = [r.message for r in caplog.records if 'step 2' in r.message]
    assert any('unusable' in m for m in warned)
    if damage == 'mixed_files':
      assert any('checksum mismatch in params/' in m for m in warned)
    # Moved aside, so the resumed run can save step 2 again.
    assert ckpt.steps() == [1]
    assert len(list((tmp_path / 'checkpoints.corrupt').iterdir())) == 1
    assert _save(ckpt, 2, later, opt_state, force=True)


def test_crash_mid_save_falls_back(small_state, tmp_path, caplog):
  _, params, opt_state = small_state
  with checkpoint.Checkpointer(tmp_path, every_steps=1, async_save=False) as ckpt:
    _save(ckpt, 1, params, opt_state)
    _save(ckpt, 2, params, opt_state)
  # What a kill during the write of step 3 leaves: orbax's temporary directory.
  root = tmp_path / 'checkpoints'
  tmp = root / f'3.orbax-checkpoint-tmp-{int(time.time())}'
  os.rename(root / '2', tmp)
  with caplog.at_level(logging.WARNING), checkpoint.Checkpointer(tmp_path) as ckpt:
    # orbax removes the leftover in a background thread; the warning must not
    # depend on whether that thread has run yet, so let it finish first.
    deadline = time.time() + 10
    while tmp.exists() and time.time() < deadline:
      time.sleep(0.01)
    assert not tmp.exists()
    step, _, _, _ = ckpt.restore_latest(_abstract(params), _abstract(opt_state))
  assert step == 1
  assert any('unfinished save' in r.message for r in caplog.records)


def test_sigterm_sets_flag_and_forces_a_save(small_state, tmp_path):
  _, params, opt_state = small_state
  before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)]
  with checkpoint.Checkpointer(tmp_path, every_steps=100) as ckpt:
    ckpt.install_signal_handlers()
    try:
      assert not ckpt.should_save(7)
      os.kill(os.getpid(), signal.SIGTERM)
      deadline = time.time() + 5
      while not ckpt.signal_received and time.time() < deadline:
        time.sleep(0.01)
      assert ckpt.should_save(8) and ckpt.stop_requested
      assert ckpt.save(8, params=params, opt_state=opt_state, extras=_extras(8))
      ckpt.wait()
      assert ckpt.steps() == [8]
      assert not ckpt.save(8, params=params, opt_state=opt_state, force=True)
      with pytest.raises(KeyboardInterrupt):  # Ctrl-C after a signal: stop now.
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    finally:
      ckpt.restore_signal_handlers()
  assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)] == before


def test_every_minutes_saves_by_a_fake_clock_and_keeps_the_interval(
  small_state, tmp_path
):
  _, params, opt_state = small_state
  now = [0.0]
  kept = {}
  with checkpoint.Checkpointer(
    tmp_path,
    keep=1,
    every_steps=4,
    every_minutes=1.0,
    clock=lambda: now[0],
    async_save=False,
  ) as ckpt:
    saved = []
    for step in range(1, 10):
      now[0] = 25.0 * step  # 25 s per step: 60 s after 3 steps.
      if _save(ckpt, step, params, opt_state):
        saved.append(step)
      kept[step] = ckpt.steps()
  # By time at 3 and 7 (75 s after the start, and after the save at 4: each
  # save restarts the clock); by the interval at 4 and 8.
  assert saved == [3, 4, 7, 8]
  # keep=1: the last interval step, and the newest whatever its step.
  assert kept[3] == [3] and kept[4] == [4]
  assert kept[7] == [4, 7] and kept[8] == kept[9] == [8]


@pytest.mark.parametrize('fits', [True, False])
def test_a_stop_saves_by_its_kind_and_the_notice(tmp_path, fits):
  with checkpoint.Checkpointer(
    tmp_path, every_steps=100, save_on_preemption=fits
  ) as ckpt:
    ckpt.install_signal_handlers()
    try:
      assert ckpt.poll_stop() is None and not ckpt.should_save(1)
      # The handlers, called as the signals would call them.
      ckpt._on_signal(signal.SIGINT, None)
      assert ckpt.poll_stop() == checkpoint.INTERRUPT and ckpt.saves_on_stop()
      ckpt._on_signal(signal.SIGTERM, None)
      assert ckpt.poll_stop() == checkpoint.PREEMPTION
      assert ckpt.saves_on_stop() == fits
      # Without the time for a write, even the interval step saves nothing.
      assert ckpt.should_save(100) == fits and ckpt.stop_requested
    finally:
      ckpt.restore_signal_handlers()
