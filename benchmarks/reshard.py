"""Training vs sampling layout on 8 fake CPU devices: reshard cost, decode, HLO.

The tiny config's policy (2 layers, hidden 128, MLP 384, vocab 72, 4 heads
of 32, 2 KV heads) on a (data 2, fsdp 2, tensor 2) mesh, with the tiny
config's round shapes (B=32 prompts, P=16, S=256 slots, N=8 new tokens).
Reported:
  * the reshard training -> sampling layout (one jitted call), alone and
    with its checksum check, best of `--repeats`;
  * one decode round (`sampler.sample_round`, prompt cache prefilled once)
    in each layout, best of `--repeats`; fake devices share the host's
    cores, so these timings are information only, not a TPU prediction;
  * from the compiled round's HLO, in each layout: weight all-gathers inside
    the decode loop (per token) and outside it (per round), and the loop's
    collectives by mesh axes; with XLA's loop-invariant code motion (what
    runs) and without it (where the partitioner put the gathers);
  * the same model computing in bf16 from fp32 params: the reshard that
    casts to bf16 in its copy (`Resharder(..., dtype=jnp.bfloat16)`), and
    from each compiled round (fp32 sampling copy vs bf16 one) its weight
    converts (`hlo.weight_converts`: f32 -> bf16 ones hoisted out of the
    loop are a second copy of the weights for the whole round) and its
    argument bytes.

Dimension legend: B prompts, P prompt bucket, S slots, N new tokens.

Run: python benchmarks/reshard.py [--repeats 5] [--slots 256]
About two minutes on 2 cores (six round compiles).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ['XLA_FLAGS'] = (
  os.environ.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
).strip()

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from ada_jax import model as model_lib
from ada_jax import sampler, sharding
from ada_jax.infra import checksum, hlo, resharder

CONFIG = model_lib.ModelConfig(
  'qwen2', 72, 128, 384, 2, 4, 2, 32, qkv_bias=True, tie_embeddings=True,
  max_position_embeddings=64,
)  # fmt: skip
PROMPTS, PROMPT_LEN, NEW_TOKENS = 32, 16, 8


def best_of(fn, repeats: int) -> float:
  """Best wall time of `fn()` (blocked on its result) after one warm-up."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - t)
  return min(times)


def decode_time(model, slots: int, repeats: int) -> float:
  rs = np.random.RandomState(0)
  tokens = rs.randint(3, CONFIG.vocab_size, (PROMPTS, PROMPT_LEN)).astype(np.int32)
  cache = sampler.prefill(model, tokens, np.ones_like(tokens))
  slot_prompt = (np.arange(slots) % PROMPTS).astype(np.int32)

  def run():
    return sampler.sample_round(
      model, cache, slot_prompt, max_new_tokens=NEW_TOKENS, rng=jax.random.key(0)
    ).tokens

  return best_of(run, repeats)


def hlo_counts(model, mesh, slots: int, hoist: bool) -> dict[str, int]:
  text = sampler.decode_round_hlo(
    model,
    slots=slots,
    prompts=PROMPTS,
    prompt_len=PROMPT_LEN,
    max_new_tokens=NEW_TOKENS,
    hoist_invariants=hoist,
  )
  return hlo.summarize(hlo.analyze_hlo(text, mesh, nnx.state(model)))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--repeats', type=int, default=5)
  parser.add_argument('--slots', type=int, default=256)
  args = parser.parse_args()
  mesh = sharding.make_mesh((2, 2, 2))
  train_model = sharding.create_sharded_model(CONFIG, mesh, sharding.TRAIN_RULES)
  graphdef, state = nnx.split(train_model)
  n_params = sum(x.size for x in jax.tree.leaves(state))
  print(f'mesh {dict(mesh.shape)}, {n_params} params, S={args.slots}')

  plain = resharder.Resharder(mesh, sharding.SAMPLE_RULES, check=False)
  checked = resharder.Resharder(mesh, sharding.SAMPLE_RULES)
  t_plain = best_of(lambda: plain(state), args.repeats)
  t_checked = best_of(lambda: checked(state), args.repeats)
  sample_state = checked(state)
  print(
    f'reshard training -> sampling layout: {t_plain * 1e3:.2f} ms '
    f'({t_checked * 1e3:.2f} ms with the checksum check); checksum '
    f'{checksum.checksum(state):08x} == {checksum.checksum(sample_state):08x}'
  )
  models = {
    'training': train_model,
    'sampling': nnx.merge(graphdef, sample_state),
  }
  for name, model in models.items():
    t = decode_time(model, args.slots, args.repeats)
    tokens = args.slots * NEW_TOKENS
    print(
      f'decode round, {name} layout: {t * 1e3:.1f} ms '
      f'({tokens / t:.0f} tokens/s; fake devices, information only)'
    )
  for hoist in (True, False):
    label = 'as compiled' if hoist else 'no loop-invariant code motion'
    for name, model in models.items():
      counts = hlo_counts(model, mesh, args.slots, hoist)
      loop = {
        k: v for k, v in counts.items() if k.startswith('loop_') and 'weight' not in k
      }
      print(
        f'HLO ({label}), {name} layout: weight all-gathers in the decode loop '
        f'{counts["loop_weight_all_gathers"]}, per round outside it '
        f'{counts["round_weight_all_gathers"]}; loop collectives {loop}'
      )
  bf16_copy(mesh, args.slots, args.repeats)


def bf16_copy(mesh, slots: int, repeats: int) -> None:
  """bf16 compute from fp32 params: the sampling copy in fp32 vs in bf16."""
  config = dataclasses.replace(CONFIG, dtype=jnp.bfloat16)
  graphdef, state = nnx.split(
    sharding.create_sharded_model(config, mesh, sharding.TRAIN_RULES)
  )
  cast = resharder.Resharder(mesh, sharding.SAMPLE_RULES, dtype=jnp.bfloat16)
  t_cast = best_of(lambda: cast(state), repeats)
  print(f'bf16 compute: reshard with the cast to bf16: {t_cast * 1e3:.2f} ms (checked)')
  tokens = np.ones((PROMPTS, PROMPT_LEN), np.int32)
  for name, dtype in (('fp32', None), ('bf16', jnp.bfloat16)):
    copy = resharder.Resharder(mesh, sharding.SAMPLE_RULES, dtype=dtype)(state)
    model = nnx.merge(graphdef, copy)
    cache = sampler.prefill(model, tokens, np.ones_like(tokens))
    compiled = sampler.lower_round(
      model, cache, slots=slots, max_new_tokens=NEW_TOKENS
    ).compile()
    converts = hlo.weight_converts(compiled.as_text(), copy)
    kinds: dict[str, int] = {}
    for c in converts:
      key = f'{c.source}->{c.target} {"in loop" if c.in_loop else "hoisted"}'
      kinds[key] = kinds.get(key, 0) + 1
    weights = sum(
      np.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
      for x in jax.tree.leaves(copy)
    )
    args = compiled.memory_analysis().argument_size_in_bytes
    print(
      f'bf16 compute, {name} sampling copy: weight converts in the round {kinds}; '
      f'round arguments {args / 2**20:.2f} MiB per device (weights '
      f'{weights / 2**20:.2f} MiB)'
    )


if __name__ == '__main__':
  main()
