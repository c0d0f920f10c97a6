"""The memory plan vs XLA's compiled memory analysis, and the plan command.

The oracle is the compiled program itself: `rl_update` and the sampling
round are lowered with abstract, sharded inputs of a config's shapes on the
8 fake CPU devices, and their per-device argument + output + temp bytes
(donated outputs counted once) must be within 25% of the plan's numbers.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from ada_jax import model as model_lib
from ada_jax import plan, sampler, sharding
from ada_jax.infra.checkpoint import abstract_opt_state
from ada_jax.planner import memory as memory_plan
from ada_jax.planner import models
from ada_jax.rl import update

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TOL = 0.25

# One layer keeps the compiles short; the two families cover q/k/v biases
# (qwen2) and q/k norms (qwen3).
_QWEN2 = model_lib.ModelConfig(
  model_type='qwen2',
  vocab_size=512,
  hidden_size=64,
  intermediate_size=128,
  num_layers=1,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
  qkv_bias=True,
  tie_embeddings=True,
)
_QWEN3 = model_lib.ModelConfig(
  model_type='qwen3',
  vocab_size=384,
  hidden_size=48,
  intermediate_size=160,
  num_layers=1,
  num_heads=4,
  num_kv_heads=2,
  head_dim=16,
  qk_norm=True,
)
# B, P, N, S, M, R, mini, micro.
_SHAPES = memory_plan.StepShapes(16, 16, 32, 64, 2, 64, 32, 16)


def _abstract_state(config, mesh, rules):
  abstract = nnx.eval_shape(lambda: model_lib.Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  shardings = sharding.state_shardings(state, mesh, rules)
  return graphdef, jax.tree.map(
    lambda v, s: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s), state, shardings
  )


def _sds(shape, dtype, sh=None):
  return jax.ShapeDtypeStruct(shape, dtype, sharding=sh)


def _total(m) -> int:
  return (
    m.argument_size_in_bytes
    + m.output_size_in_bytes
    - m.alias_size_in_bytes
    + m.temp_size_in_bytes
  )


def _close(name, planned, measured):
  ratio = planned / measured
  print(f'{name}: plan {planned} / compiled {measured} = {ratio:.3f}')
  assert abs(ratio - 1) <= _TOL, (name, planned, measured, ratio)


@pytest.mark.parametrize(
  'config,mesh_shape', [(_QWEN2, (8, 1, 1)), (_QWEN3, (1, 2, 4))]
)
def test_update_matches_compiled(config, mesh_shape):
  s = _SHAPES
  mesh = sharding.make_mesh(mesh_shape)
  graphdef, state = _abstract_state(config, mesh, sharding.TRAIN_RULES)
  tx = update.make_optimizer()
  rows = NamedSharding(mesh, PartitionSpec(sharding.BATCH_AXES))
  t = s.prompt_len + s.new_tokens
  batch = {
    'tokens': _sds((s.rows, t), jnp.int32, rows),
    'attn_mask': _sds((s.rows, t), jnp.int32, rows),
    'resp_mask': _sds((s.rows, s.new_tokens), jnp.float32, rows),
    'advantages': _sds((s.rows, s.new_tokens), jnp.float32, rows),
    'old_logp': _sds((s.rows, s.new_tokens), jnp.float32, rows),
  }
  settings = update.UpdateSettings(
    prompt_len=s.prompt_len,
    mini_batch_rows=s.mini_batch_rows,
    micro_batch_rows=s.micro_batch_rows,
  )
  compiled = update.rl_update.lower(
    graphdef,
    tx,
    settings,
    state,
    abstract_opt_state(tx, state),
    batch,
    _sds((), jnp.float32),
  ).compile()
  m = compiled.memory_analysis()
  p = memory_plan.plan(config, s, mesh_shape)
  args = sum(
    p.get(k)
    for k in (
      'params (training layout)',
      'optimizer state (AdamW mu, nu)',
      'training batch [R, P+N]',
    )
  )
  temp = p.get('gradients + accumulator') + p.get('update activations')
  _close('update arguments', args, m.argument_size_in_bytes)
  _close('update temporaries', temp, m.temp_size_in_bytes)
  _close('update total', args + temp, _total(m))


@pytest.mark.parametrize(
  'config,mesh_shape', [(_QWEN2, (2, 2, 2)), (_QWEN3, (1, 2, 4))]
)
def test_sampling_round_matches_compiled(config, mesh_shape):
  s = _SHAPES
  mesh = sharding.make_mesh(mesh_shape)
  graphdef, state = _abstract_state(config, mesh, sharding.SAMPLE_RULES)
  kv = (s.prompts, config.num_kv_heads, s.prompt_len, config.head_dim)
  row_sh = sampler._rows_sharding(mesh, s.prompts, 4)  # As prefill makes it.
  row_sh2 = sampler._rows_sharding(mesh, s.prompts, 2)
  prompt_cache = sampler.PromptCache(
    tuple(_sds(kv, config.dtype, row_sh) for _ in range(config.num_layers)),
    tuple(_sds(kv, config.dtype, row_sh) for _ in range(config.num_layers)),
    _sds((s.prompts, s.prompt_len), jnp.bool_, row_sh2),
    _sds((s.prompts, config.vocab_size), jnp.float32, row_sh2),
    _sds((s.prompts,), jnp.int32, sampler._rows_sharding(mesh, s.prompts, 1)),
  )
  slots = (s.slots,)
  compiled = sampler._round_jit.lower(
    graphdef,
    mesh,
    state,
    prompt_cache,
    s.new_tokens,
    _sds(slots, jnp.int32),
    jax.random.key(0),
    _sds(slots, jnp.float32),
    _sds(slots, jnp.float32),
    _sds(slots, jnp.int32),
    _sds((sampler.MAX_EOS_IDS,), jnp.int32),
  ).compile()
  m = compiled.memory_analysis()
  p = memory_plan.plan(config, s, mesh_shape)
  args = p.get('params (sampling copy)') + p.get('prompt cache [B, P]')
  rest = p.get('KV cache [S, P+N] (round)') + p.get('round temporaries')
  _close('round arguments', args, m.argument_size_in_bytes)
  _close('round total', args + rest, _total(m))


def test_micro_rows_follow_the_update_reshape():
  # [64] rows over 8 devices -> [2, 2, 16]: 2 x 2 shards on the scanned dims.
  assert memory_plan.micro_rows_per_device(64, 32, 16, 8) == 8
  assert memory_plan.micro_rows_per_device(16, 16, 16, 8) == 2
  # The 7B paper step: R=2048, mini=512, micro=32 on 32 devices.
  assert memory_plan.micro_rows_per_device(2048, 512, 32, 32) == 32


def test_paper_model_table_has_the_released_sizes():
  expected = {
    'qwen25_math_1p5b': 1_543_714_304,
    'qwen25_math_7b': 7_615_616_512,
    'qwen3_4b_instruct': 4_022_468_096,
    'llama32_3b_instruct': 3_212_749_824,
  }
  for name, count in expected.items():
    cfg = models.model_config(name, jnp.bfloat16, jnp.float32)
    assert memory_plan.count_params(cfg) == count, name


def test_params_split_by_layout():
  cfg = _QWEN2
  full = memory_plan.param_bytes_per_device(cfg, (1, 1, 1), sharding.TRAIN_RULES)
  assert full == memory_plan.count_params(cfg) * 4
  train = memory_plan.param_bytes_per_device(cfg, (1, 2, 4), sharding.TRAIN_RULES)
  sample = memory_plan.param_bytes_per_device(cfg, (1, 2, 4), sharding.SAMPLE_RULES)
  assert train < sample < full


def _paper_config() -> ml_collections.ConfigDict:
  if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
  from configs import qwen25_math_7b

  return qwen25_math_7b.get_config('tpu=v5p-64')


def test_report_fits_and_does_not_fit_lines():
  c = _paper_config()
  spec = 'configs/qwen25_math_7b.py:tpu=v5p-64'
  out = plan.report(c, spec, None, None)
  last = out.splitlines()[-1]
  assert last.startswith('does NOT fit: ') and '> 95 GiB' in last, out
  assert 'reduce rl.micro_batch_rows' in last
  # A hypothetical chip with room for all of it.
  assert plan.report(c, spec, None, 1e5).splitlines()[-1].startswith('fits: ')


def test_command_line_prints_the_verdict():
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  out = subprocess.run(
    [
      sys.executable,
      '-m',
      'ada_jax.plan',
      '--config',
      'configs/tiny_arith.py:tpu=v4-32',
      '--config.rl.slots=128',
    ],
    cwd=_ROOT,
    env=env,
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  assert 'KV cache [S, P+N] (round)' in out
  assert out.splitlines()[-1].startswith('fits: '), out
  assert 'of 32 GiB per device' in out.splitlines()[-1]
