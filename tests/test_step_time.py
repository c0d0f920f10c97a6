"""The step-time roofline: its FLOP counts against XLA's, and its scaling."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from ada_jax import model as model_lib
from ada_jax.planner import chips, models, step_time

_TINY = model_lib.ModelConfig(
  'qwen2', 512, 128, 384, 2, 4, 2, 32, qkv_bias=True, tie_embeddings=True,
  max_position_embeddings=512,
)  # fmt: skip


@pytest.mark.parametrize('rows, t', [(4, 64), (2, 256)])
def test_forward_flops_match_xla_cost_analysis(rows, t):
  """Our count of a full forward against XLA's own (the oracle).

  XLA also counts the elementwise work (norms, softmax, RoPE) that the
  roofline leaves out: a few percent more, never less.
  """
  graphdef, state = nnx.split(model_lib.create_model(_TINY))
  forward = jax.jit(lambda s, x, m: nnx.merge(graphdef, s).forward(x, m))
  tokens = jnp.ones((rows, t), jnp.int32)
  xla = forward.lower(state, tokens, tokens).compile().cost_analysis()['flops']
  c = _TINY
  ours = rows * (
    2 * step_time.matmul_params(c) * t
    + 4 * c.num_heads * c.head_dim * c.num_layers * t * t
    + 2 * c.hidden_size * c.vocab_size * t
  )
  assert 1.0 <= xla / ours < 1.05


def _phases(**kw):
  c = models.model_config('qwen25_math_7b', jnp.bfloat16, jnp.float32)
  args = dict(
    prompts=512, prompt_len=1024, new_tokens=2048, slots=4096, rounds=4,
    rows=2048, micro_batch_rows=32, mini_batch_rows=512, epochs=1,
    mesh=(1, 32, 1), chip=chips.CHIPS['v5p'],
  )  # fmt: skip
  args.update(kw)
  return {p.name: p for p in step_time.estimate(c, **args)}


def test_scaling_and_bounds():
  base = _phases()
  assert _phases(rounds=2)['sampling rounds'].seconds == pytest.approx(
    base['sampling rounds'].seconds / 2
  )
  remat = _phases(remat='block')['update']
  assert remat.flops == pytest.approx(base['update'].flops * 4 / 3)
  # Decode reads the bf16 sampling copy (~15 GB for 7.6B params) every step.
  per_step = base['sampling rounds'].hbm_bytes / (4 * 2048)
  seven_b = models.model_config('qwen25_math_7b', jnp.bfloat16, jnp.float32)
  assert per_step > step_time.param_count(seven_b) * 2
  assert base['sampling rounds'].bound == 'memory'
  assert base['update'].bound == 'compute'
  # Twice the chips of the same kind: the compute-bound update halves.
  wider = _phases(mesh=(1, 64, 1))['update']
  assert wider.flops == pytest.approx(base['update'].flops / 2)


def test_decode_reads_the_written_blocks():
  # P=1024, N=2048: blocks of 64 up to the current position, from 1024+64
  # keys at the first step to all 3072 at the last: about P + N/2 on average.
  keys = sum(step_time.decode_reads(1024, 2048))
  assert keys == pytest.approx(1024 + 2048 / 2 + 32, abs=1)
  assert sum(step_time.decode_reads(1024, 2048, 'dense')) == 3072
  # The prompt's buffer whole (P=100: a prefix is read whole), the
  # response's blocks (one of 28 for N=28; of 64 for N=130, the last one
  # clamped) up to the position's.
  assert step_time.decode_reads(100, 28) == (100, 28)
  assert step_time.decode_reads(100, 130) == (100, (64 * 64 + 128 * 64 + 192 * 2) / 130)
  assert step_time.decode_reads(100, 28, 'dense') == (0, 128)
  blockwise = _phases()['sampling rounds']
  dense = _phases(attention='dense')['sampling rounds']
  seven_b = models.model_config('qwen25_math_7b', jnp.bfloat16, jnp.float32)
  kv_token = 2 * seven_b.num_layers * seven_b.num_kv_heads * seven_b.head_dim * 2
  steps, slots_per_device = 4 * 2048, 4096 / 32
  saved = steps * slots_per_device * (3072 - keys) * kv_token
  assert dense.hbm_bytes - blockwise.hbm_bytes == pytest.approx(saved, rel=1e-9)
  assert dense.flops > blockwise.flops


def test_param_count_of_the_paper_models():
  c = models.model_config('qwen25_math_7b', jnp.bfloat16, jnp.float32)
  assert step_time.param_count(c) == pytest.approx(7.6e9, rel=0.01)


def test_grouped_slots_read_each_prompt_once_per_group():
  # The paper's M=8 slots per prompt: the prompt's keys (1024 per step) are
  # read once per 8 slots; the own keys and the FLOPs do not change.
  base, grouped = _phases()['sampling rounds'], _phases(slot_group=8)['sampling rounds']
  seven_b = models.model_config('qwen25_math_7b', jnp.bfloat16, jnp.float32)
  kv_token = 2 * seven_b.num_layers * seven_b.num_kv_heads * seven_b.head_dim * 2
  saved = 4 * 2048 * (4096 / 32) * 1024 * (1 - 1 / 8) * kv_token
  assert base.hbm_bytes - grouped.hbm_bytes == pytest.approx(saved, rel=1e-9)
  assert grouped.flops == base.flops


def test_slot_waves_read_the_weights_once_per_wave():
  # A round in W waves is W decode loops of S/W slots: the same FLOPs and KV
  # reads, the sampling copy read W times per column.
  one, two = _phases()['sampling rounds'], _phases(waves=2)['sampling rounds']
  seven_b = models.model_config('qwen25_math_7b', jnp.bfloat16, jnp.float32)
  weights = step_time.param_count(seven_b) * 2  # bf16, tensor 1.
  assert two.hbm_bytes - one.hbm_bytes == pytest.approx(4 * 2048 * weights, rel=1e-9)
  assert two.flops == one.flops
  assert two.seconds >= one.seconds
