"""The step's programs lower for `cuda` on a CPU-only host.

JAX lowers a jitted program for another platform than the devices at hand
(`lowering_platforms=('cuda',)`), so the GPU programs of a paper model are
built here from its real widths (Qwen2.5-Math-1.5B, fewer layers) on the
fake CPU mesh: the prefill, the sampling round, the old-logp pass and the
update, with the model's target platform 'gpu' (attention='auto' resolves
to the fused cuDNN kernel for the training forward and the prefill, through
the left-aligning rolls). The cuDNN custom call itself cannot be lowered
without a GPU ("cuDNN is not detected"), so these programs take the same
call with XLA's implementation (the platform table's CPU choice); the
kernel swap is what `benchmarks/device_check.py` leaves to a GPU.

Dimension legend: B prompts, P prompt bucket, N new tokens, S slots,
R training rows, m rows per micro-batch.
"""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from ada_jax import attention, plan, sampler, sharding
from ada_jax.infra import platforms
from ada_jax.planner import memory, models
from ada_jax.rl import update

_SHAPES = memory.StepShapes(
  prompts=16,
  prompt_len=1024,
  new_tokens=2048,
  slots=64,
  max_rounds=4,
  rows=32,
  mini_batch_rows=16,
  micro_batch_rows=8,
)


@pytest.fixture
def gpu_config(monkeypatch):
  """The 1.5B's widths at 4 layers, built for GPU, cuDNN swapped for XLA."""
  monkeypatch.setitem(
    platforms.TABLE,
    'gpu',
    dataclasses.replace(platforms.TABLE['gpu'], fused_kernel='xla'),
  )
  cfg = models.model_config('qwen25_math_1p5b', jnp.bfloat16, jnp.float32)
  return dataclasses.replace(cfg, num_layers=4, platform='gpu', remat='block')


def _for_cuda(lowered) -> str:
  text = lowered.as_text()
  # What the lowering was for (jax 0.10.2 keeps it on the computation).
  assert tuple(lowered._lowering._platforms) == ('cuda',)
  return text


def test_the_training_forward_targets_the_fused_kernel(gpu_config):
  t = _SHAPES.prompt_len + _SHAPES.new_tokens
  c = gpu_config
  args = (c.attention, t, t, c.platform, c.dtype, c.head_dim)
  assert attention.resolve(*args) == 'cudnn'
  assert memory.attention_impl(c, t, 'gpu') == 'cudnn'


def test_update_and_old_logp_lower_for_cuda(gpu_config):
  mesh = sharding.make_mesh((1, 8, 1))
  graphdef, state, opt, batch = plan.training_inputs(gpu_config, _SHAPES, mesh)
  tx = update.make_optimizer()
  settings = update.UpdateSettings(
    prompt_len=_SHAPES.prompt_len,
    mini_batch_rows=_SHAPES.mini_batch_rows,
    micro_batch_rows=_SHAPES.micro_batch_rows,
  )
  fn = update.rl_update_pinned(
    jax.tree.map(lambda x: x.sharding, state), jax.tree.map(lambda x: x.sharding, opt)
  )
  temperature = jax.ShapeDtypeStruct((), jnp.float32)
  lowered = fn.trace(graphdef, tx, settings, state, opt, batch, temperature).lower(
    lowering_platforms=('cuda',)
  )
  text = _for_cuda(lowered)
  # The fused path's attention: XLA's dot_product_attention on rolled rows.
  assert 'gather' in text
  logp = update.logp_jit.trace(
    graphdef,
    state,
    batch['tokens'],
    batch['attn_mask'],
    temperature,
    prompt_len=_SHAPES.prompt_len,
  ).lower(lowering_platforms=('cuda',))
  _for_cuda(logp)


def test_prefill_and_sampling_round_lower_for_cuda(gpu_config):
  mesh = sharding.make_mesh((1, 8, 1))
  model = plan.sampling_model(gpu_config, mesh)
  prefill = sampler.lower_prefill(
    model,
    prompts=_SHAPES.prompts,
    prompt_len=_SHAPES.prompt_len,
    lowering_platforms=('cuda',),
  )
  _for_cuda(prefill)
  cache = plan.prompt_cache(gpu_config, mesh, _SHAPES.prompts, _SHAPES.prompt_len)
  for waves in (1, 2):
    lowered = sampler.lower_round(
      model,
      cache,
      slots=_SHAPES.slots,
      max_new_tokens=_SHAPES.new_tokens,
      group=4,
      waves=waves,
      lowering_platforms=('cuda',),
    )
    _for_cuda(lowered)
