"""Sampler against transformers generate, full-forward logprobs, distributions.

Also on 8 fake devices: rounds whose slots continue prompts held by other
devices equal the unsharded round, and the compiled round's temporaries stay
within the KV cache plus the per-token temporaries (no second cache copy).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from ada_jax import attention, hf, sampler, sharding
from ada_jax import model as model_lib
from ada_jax.infra import compiles
from tests import hf_fixtures

N = 10


def _prompts(seed=0):
  return hf_fixtures.left_padded_batch(
    np.random.RandomState(seed), [9, 6, 3, 9, 1, 5], 9
  )


def _pick_eos(tokens: np.ndarray) -> int:
  """A token whose first appearance in some row is mid-budget (EOS test)."""
  for pos in range(2, N - 2):
    for row in tokens:
      if row[pos] not in row[:pos]:
        return int(row[pos])
  raise AssertionError(f'no mid-budget token to use as EOS in {tokens}')


@pytest.mark.parametrize('variant', list(hf_fixtures.VARIANTS))
def test_greedy_equals_transformers_generate_with_eos(hf_models, variant):
  import torch

  path, torch_model = hf_models[variant]
  model = hf.load_model(path)
  tokens, mask = _prompts()
  free = sampler.sample(
    model, tokens, mask, max_new_tokens=N, rng=jax.random.key(0), temperature=0.0
  )
  eos = _pick_eos(np.asarray(free.tokens))
  ours = sampler.sample(
    model,
    tokens,
    mask,
    max_new_tokens=N,
    rng=jax.random.key(1),
    temperature=0.0,
    eos_ids=[eos],
  )
  with torch.no_grad():
    ref = torch_model.generate(
      input_ids=torch.tensor(tokens, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
      max_new_tokens=N,
      do_sample=False,
      eos_token_id=eos,
      pad_token_id=0,
    )[:, tokens.shape[1] :].numpy()
  got, lengths, m = (np.asarray(x) for x in (ours.tokens, ours.lengths, ours.mask))
  assert (lengths < N).any(), 'EOS never fired inside the budget'
  for row in range(len(tokens)):
    n = lengths[row]
    np.testing.assert_array_equal(
      got[row, :n], ref[row, :n], err_msg=f'{variant} row {row}'
    )
    assert m[row, :n].all() and not m[row, n:].any()
    if n < N:
      assert got[row, n - 1] == eos and eos not in got[row, : n - 1]


def _assert_logprobs_equal_full_forward(model, tokens, mask, r, temperature):
  """Each drawn token's log-prob equals the full forward over prompt and response."""
  full = np.concatenate([tokens, np.asarray(r.tokens)], 1)
  fmask = np.concatenate([mask, np.asarray(r.mask)], 1)
  logits = np.asarray(model_lib.logits(model, full, fmask))[:, tokens.shape[1] - 1 : -1]
  scale = temperature if temperature > 0 else 1.0
  logp = np.asarray(jax.nn.log_softmax(logits / scale, axis=-1))
  ref = np.take_along_axis(logp, np.asarray(r.tokens)[..., None], -1)[..., 0]
  m = np.asarray(r.mask).astype(bool)
  assert np.abs(ref - np.asarray(r.logprobs))[m].max() <= 1e-4
  assert (np.asarray(r.logprobs)[~m] == 0).all()


@pytest.mark.parametrize('temperature', [0.0, 0.7])
def test_logprobs_equal_full_forward(hf_models, temperature):
  model = hf.load_model(hf_models['qwen3'][0])
  tokens, mask = _prompts(1)
  r = sampler.sample(
    model,
    tokens,
    mask,
    max_new_tokens=N,
    rng=jax.random.key(2),
    temperature=temperature,
    eos_ids=[5, 7],
  )
  _assert_logprobs_equal_full_forward(model, tokens, mask, r, temperature)


def test_first_token_frequencies_follow_softmax(hf_models):
  model = hf.load_model(hf_models['qwen2_untied'][0])
  tokens, mask = _prompts(2)
  cache = sampler.prefill(model, tokens, mask)
  s, t = 4096, 1.3
  r = sampler.sample_round(
    model,
    cache,
    jnp.zeros((s,), jnp.int32),
    max_new_tokens=2,
    rng=jax.random.key(3),
    temperature=t,
  )
  probs = np.asarray(jax.nn.softmax(cache.last_logits[0] / t)).astype(np.float64)
  probs /= probs.sum()
  counts = np.bincount(np.asarray(r.tokens[:, 0]), minlength=probs.size)
  expected = probs * s
  big = expected >= 5  # chi-square needs expected counts >= 5; pool the rest.
  assert big.sum() >= 10  # A distribution worth testing, not one spike.
  obs, exp = counts[big], expected[big]
  if (~big).any():
    obs, exp = np.append(obs, counts[~big].sum()), np.append(exp, expected[~big].sum())
  _, p_value = stats.chisquare(obs, exp)
  assert p_value > 1e-3, p_value
  logp = np.log(probs)[np.asarray(r.tokens[:, 0])]
  np.testing.assert_allclose(np.asarray(r.logprobs[:, 0]), logp, atol=1e-5)
  # A round compiled without the top-p / top-k filter draws the same tokens
  # as one with it and the knobs off (it is only the filter that is left out).
  kw = dict(max_new_tokens=2, rng=jax.random.key(3), temperature=t)
  off = sampler.sample_round(
    model, cache, jnp.zeros((s,), jnp.int32), filter_logits=False, **kw
  )
  np.testing.assert_array_equal(np.asarray(off.tokens), np.asarray(r.tokens))
  np.testing.assert_allclose(
    np.asarray(off.logprobs), np.asarray(r.logprobs), atol=1e-6
  )
  with pytest.raises(ValueError, match='filter_logits=False'):
    sampler.sample_round(
      model, cache, np.zeros(s, np.int32), filter_logits=False, top_p=0.9, **kw
    )


def test_top_k_and_top_p_stay_in_allowed_set(hf_models):
  model = hf.load_model(hf_models['llama3_untied'][0])
  tokens, mask = _prompts(3)
  s = 512
  top_k = np.where(np.arange(s) < s // 2, 3, 0).astype(np.int32)
  top_p = np.where(np.arange(s) < s // 2, 1.0, 0.6).astype(np.float32)
  slot_prompt = np.arange(s) % len(tokens)
  cache = sampler.prefill(model, tokens, mask)
  r = sampler.sample_round(
    model,
    cache,
    slot_prompt,
    max_new_tokens=6,
    rng=jax.random.key(4),
    temperature=1.0,
    top_p=top_p,
    top_k=top_k,
  )
  full = np.concatenate([tokens[slot_prompt], np.asarray(r.tokens)], 1)
  fmask = np.concatenate([mask[slot_prompt], np.asarray(r.mask)], 1)
  logits = np.asarray(model_lib.logits(model, full, fmask))[:, tokens.shape[1] - 1 : -1]
  chosen = np.asarray(r.tokens)
  order = np.argsort(-logits, axis=-1)
  rank = np.argmax(order == chosen[..., None], axis=-1)
  assert (rank[: s // 2] < 3).all()
  assert (rank[: s // 2] == 2).any()  # The filter is not stricter than asked.
  probs = np.asarray(jax.nn.softmax(logits, axis=-1))
  sorted_p = np.take_along_axis(probs, order, -1)
  mass_before = np.cumsum(sorted_p, -1) - sorted_p
  chosen_mass_before = np.take_along_axis(mass_before, rank[..., None], -1)[..., 0]
  assert (chosen_mass_before[s // 2 :] < 0.6 + 1e-5).all()


def test_prompt_cache_rounds_equal_plain_sample(hf_models):
  model = hf.load_model(hf_models['qwen2_tied'][0])
  tokens, mask = _prompts(4)
  cache = sampler.prefill(model, tokens, mask)
  slot_prompt = np.array([2, 0, 5, 5, -1, 1, 3, 0])
  rng = jax.random.key(5)
  for rnd in range(2):  # The cache is reused, not consumed.
    key = jax.random.fold_in(rng, rnd)
    a = sampler.sample_round(
      model, cache, slot_prompt, max_new_tokens=N, rng=key, eos_ids=[4]
    )
    sp = np.maximum(slot_prompt, 0)
    b = sampler.sample(
      model, tokens[sp], mask[sp], max_new_tokens=N, rng=key, eos_ids=[4]
    )
    live = slot_prompt >= 0
    np.testing.assert_array_equal(
      np.asarray(a.tokens)[live], np.asarray(b.tokens)[live]
    )
    np.testing.assert_allclose(
      np.asarray(a.logprobs)[live], np.asarray(b.logprobs)[live], atol=1e-5
    )
    assert (
      not np.asarray(a.mask)[~live].any() and (np.asarray(a.lengths)[~live] == 0).all()
    )
  # (b: `sample` runs aligned rounds, slot i reading prompt i's cache in place.)
  with pytest.raises(ValueError, match='aligned round: 8 slots for 6 prompts'):
    sampler.sample_round(
      model, cache, slot_prompt, max_new_tokens=N, rng=rng, aligned=True
    )


@pytest.mark.parametrize('group', [1, 2])
def test_round_cache_layouts(hf_models, group):
  """A round's prefix keys are [.., K, P]; its own cache is whole-read or in blocks.

  The prefix keys are the prompt cache's keys of each group's prompt,
  transposed (a prefix is read whole at any length); values [.., P, K].
  A response of at most DECODE_WHOLE_MAX_BLOCKS blocks (read whole) holds
  keys [S, G, K, N]; a longer one (read block by block) is held in blocks
  on CPU, per layer N'/tk buffers of keys [S, G, K, tk] and values
  [S, G, tk, K], N' = N rounded up to whole blocks, its validity [S, N'].
  On TPU it stays [S, G, N, K].
  The rounds' outputs are checked against transformers, `sample` and the
  full forward elsewhere in this file.
  """
  model = hf.load_model(hf_models['qwen2_tied'][0])
  tokens, mask = _prompts(4)
  pc = sampler.prefill(model, tokens, mask)
  slot_prompt = np.array([2, 2, 5, 5, 1, 1, 3, 3])
  tk = attention.DECODE_BLOCK_K
  long = attention.DECODE_WHOLE_MAX_BLOCKS * tk + 1
  assert attention.round_keys_transposed(N) and not attention.round_cache_blocked(N)
  assert (
    attention.round_cache_blocked(long) and attention.round_cache_len(long) == 3 * tk
  )
  assert not attention.round_cache_blocked(long, 'tpu')
  assert attention.round_cache_len(long, 'tpu') == long
  c = model.config
  g, hd = c.num_kv_heads, c.head_dim
  own = slot_prompt[::group]
  for n in (N, long):
    cache = jax.jit(
      lambda pc, sp, n=n: sampler.round_cache(model, pc, sp, n, group=group)
    )(pc, slot_prompt)
    for layer in range(c.num_layers):
      np.testing.assert_array_equal(
        np.asarray(cache.prefix_k[layer]),
        np.swapaxes(np.asarray(pc.k[layer])[own], 2, 3),
      )
      np.testing.assert_array_equal(
        np.asarray(cache.prefix_v[layer]), np.asarray(pc.v[layer])[own]
      )
      if n == N:
        assert cache.k[layer].shape == (8, g, hd, n)
        assert cache.v[layer].shape == (8, g, n, hd)
        assert cache.valid.shape == (8, n)
      else:
        assert [x.shape for x in cache.k[layer]] == [(8, g, hd, tk)] * 3
        assert [x.shape for x in cache.v[layer]] == [(8, g, tk, hd)] * 3
        assert cache.valid.shape == (8, 3 * tk)


@pytest.mark.parametrize('group', [1, 2])
def test_long_round_equals_full_forward(hf_models, group):
  """A prompt of 3 key blocks, read whole, and a response of 3, read by the loop.

  P = N = 3 * DECODE_BLOCK_K, ragged prompts (the longest starts in block
  1): each slot's prefix is scored whole from the round's transposed copy,
  and its own response cache, held in blocks, block by block up to the
  current one. The oracle is the full forward over prompt and response (dense
  attention): every drawn token's log-prob equals it. With one slot per
  prompt, `sample` (an aligned round) draws the same tokens.
  """
  tk = attention.DECODE_BLOCK_K
  p = n = 3 * tk
  assert attention.round_cache_blocked(n)
  model = hf.load_model(hf_models['qwen2_tied'][0])
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(5), [p - tk - 3, 40, 2 * tk - 1], p
  )
  cache = sampler.prefill(model, tokens, mask)
  slot_prompt = np.repeat(np.arange(3), group).astype(np.int32)
  kw = dict(max_new_tokens=n, rng=jax.random.key(4), temperature=0.7)
  r = sampler.sample_round(model, cache, slot_prompt, group=group, **kw)
  assert np.asarray(r.mask).all()  # No EOS: every step's keys are read.
  _assert_logprobs_equal_full_forward(
    model, tokens[slot_prompt], mask[slot_prompt], r, 0.7
  )
  if group == 1:
    # `sample`'s aligned round (each slot's prompt cache in place) draws the same.
    a = sampler.sample(model, tokens, mask, **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(r.tokens))
    np.testing.assert_allclose(
      np.asarray(a.logprobs), np.asarray(r.logprobs), atol=1e-5
    )


def test_sharded_long_round_equals_unsharded(hf_models):
  """A round with its response in blocks (3) on a (2, 2, 2) mesh equals one device's.

  Each block's buffer [S, G, K, tk] is split like a whole cache: slots over
  the data axes, KV heads over tensor.
  """
  n = 3 * attention.DECODE_BLOCK_K
  assert attention.round_cache_blocked(n)
  path = hf_models['qwen2_tied'][0]
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(13), [9, 2, 7, 4], 9
  )
  slot_prompt = np.repeat(np.arange(4), 2).astype(np.int32)
  kw = dict(max_new_tokens=n, rng=jax.random.key(14), temperature=1.0, group=2)
  plain = hf.load_model(path)
  ref = sampler.sample_round(
    plain, sampler.prefill(plain, tokens, mask), slot_prompt, **kw
  )
  assert np.asarray(ref.mask).all()  # No EOS: every block is read.
  mesh = sharding.make_mesh((2, 2, 2))
  model = hf.load_model(path, mesh=mesh, rules=sharding.SAMPLE_RULES)
  rows = sharding.batch_sharding(mesh)
  cache = sampler.prefill(
    model, jax.device_put(tokens, rows), jax.device_put(mask, rows)
  )
  rc = jax.jit(
    lambda pc: sampler.round_cache(model, pc, slot_prompt, n, group=2, mesh=mesh)
  )(cache)
  assert len(rc.k[0]) == 3 and len(rc.v[0]) == 3
  for block in (*rc.k[0], *rc.v[0]):
    assert tuple(block.sharding.spec)[:2] == (sharding.BATCH_AXES, 'tensor')
  got = sampler.sample_round(model, cache, slot_prompt, **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(
    np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=1e-4
  )


@pytest.mark.parametrize('group', [1, 2])
def test_stacked_round_equals_blocked_and_full_forward(hf_models, group):
  """The TPU row's round cache, [S, G, N, K] read by the loop, run on CPU.

  The platform comes from the model (`ModelConfig.platform`, infra.platforms),
  so a 'tpu' model takes the stacked path here: its log-probs equal the
  full forward's, and it draws the same tokens as the CPU row's cache in
  blocks (log-probs within 1e-5).
  """
  tk = attention.DECODE_BLOCK_K
  p, n = 2 * tk, 3 * tk
  assert attention.round_cache_blocked(n, 'cpu')
  assert not attention.round_cache_blocked(n, 'tpu')
  blocked = hf.load_model(hf_models['qwen2_tied'][0])
  blocked = model_lib.with_config(blocked, platform='cpu')
  stacked = model_lib.with_config(blocked, platform='tpu')
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(7), [p - 5, 30, tk + 1], p
  )
  slot_prompt = np.repeat(np.arange(3), group).astype(np.int32)
  kw = dict(max_new_tokens=n, rng=jax.random.key(8), temperature=0.8, group=group)
  rc = jax.eval_shape(
    lambda: sampler.round_cache(
      stacked, sampler.prefill(stacked, tokens, mask), slot_prompt, n, group=group
    )
  )
  assert rc.k[0].shape == (len(slot_prompt), 2, n, 16)  # Stacked, not blocks.
  runs = {}
  for name, model in (('stacked', stacked), ('blocked', blocked)):
    cache = sampler.prefill(model, tokens, mask)
    runs[name] = sampler.sample_round(model, cache, slot_prompt, **kw)
  r = runs['stacked']
  assert np.asarray(r.mask).all()  # No EOS: every block is read.
  _assert_logprobs_equal_full_forward(
    stacked, tokens[slot_prompt], mask[slot_prompt], r, 0.8
  )
  np.testing.assert_array_equal(
    np.asarray(r.tokens), np.asarray(runs['blocked'].tokens)
  )
  np.testing.assert_allclose(
    np.asarray(r.logprobs), np.asarray(runs['blocked'].logprobs), atol=1e-5
  )


def test_sharded_stacked_round_equals_unsharded(hf_models):
  """The TPU row's stacked round cache on a (2, 2, 2) mesh equals one device's."""
  n = 3 * attention.DECODE_BLOCK_K
  path = hf_models['qwen2_tied'][0]
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(17), [9, 2, 7, 4], 9
  )
  slot_prompt = np.repeat(np.arange(4), 2).astype(np.int32)
  kw = dict(max_new_tokens=n, rng=jax.random.key(18), temperature=1.0, group=2)
  plain = model_lib.with_config(hf.load_model(path), platform='tpu')
  ref = sampler.sample_round(
    plain, sampler.prefill(plain, tokens, mask), slot_prompt, **kw
  )
  assert np.asarray(ref.mask).all()
  mesh = sharding.make_mesh((2, 2, 2))
  model = hf.load_model(path, mesh=mesh, rules=sharding.SAMPLE_RULES)
  model = model_lib.with_config(model, platform='tpu')
  rows = sharding.batch_sharding(mesh)
  cache = sampler.prefill(
    model, jax.device_put(tokens, rows), jax.device_put(mask, rows)
  )
  rc = jax.jit(
    lambda pc: sampler.round_cache(model, pc, slot_prompt, n, group=2, mesh=mesh)
  )(cache)
  assert not isinstance(rc.k[0], tuple)
  assert tuple(rc.k[0].sharding.spec)[:2] == (sharding.BATCH_AXES, 'tensor')
  got = sampler.sample_round(model, cache, slot_prompt, **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(
    np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=1e-5
  )


def test_decode_round_makes_rope_tables_once_per_step(hf_models):
  """The round's compiled HLO has one cos (and one sin) in the loop and one before.

  The loop carries the next step's RoPE tables (`sampler.step_rope`); made
  inside the step, XLA:CPU fused a cos and a sin into each of the layers' q
  and k rotations (3 per layer in a grouped round: the prefix's and the
  response's q, and k).
  """
  model = hf.load_model(hf_models['qwen2_tied'][0])
  assert model.config.num_layers >= 2
  hlo = sampler.decode_round_hlo(
    model, slots=8, prompts=4, prompt_len=9, max_new_tokens=N
  )
  assert hlo.count(' cosine(') == 2, hlo.count(' cosine(')
  assert hlo.count(' sine(') == 2, hlo.count(' sine(')


def test_decode_step_with_carried_rope_equals_its_own(hf_models):
  """decode_step given step_rope's tables equals decode_step making them."""
  model = hf.load_model(hf_models['qwen2_tied'][0])
  tokens, mask = _prompts(6)
  pc = sampler.prefill(model, tokens, mask)
  slot_prompt = np.arange(6)
  knobs = (jnp.ones(6), jnp.ones(6), jnp.zeros(6, jnp.int32))
  outs = []
  for carried in (False, True):
    cache = jax.jit(lambda pc, sp: sampler.round_cache(model, pc, sp, N))(
      pc, slot_prompt
    )
    prev = jnp.asarray(tokens[:, -1])
    i = jnp.int32(3)
    rope = sampler.step_rope(model, pc.lengths, i) if carried else None
    tok, lp, _ = sampler.decode_step(
      model,
      cache,
      prev,
      pc.lengths,
      i,
      tokens.shape[1],
      jax.random.key(0),
      *knobs,
      filter_logits=False,
      rope=rope,
    )
    outs.append((np.asarray(tok), np.asarray(lp)))
  np.testing.assert_array_equal(outs[0][0], outs[1][0])
  np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-6, atol=1e-6)


def test_no_recompile_when_knobs_or_slots_change(hf_models):
  model = hf.load_model(hf_models['qwen3'][0])
  tokens, mask = _prompts(5)
  cache = sampler.prefill(model, tokens, mask)
  kw = dict(max_new_tokens=N)
  sampler.sample_round(model, cache, np.zeros(8, np.int32), rng=jax.random.key(0), **kw)
  with compiles.assert_no_compiles('sample_round'):
    for i, (t, p, k, eos, sp) in enumerate(
      [
        (0.0, 1.0, 0, (), np.arange(8) % 6),
        (0.5, 0.9, 0, (3,), np.array([-1] * 7 + [2])),
        (np.linspace(0, 1, 8), 1.0, 5, (3, 9, 11), np.arange(8) % 3),
        (1.2, np.full(8, 0.3), np.arange(8), (1, 2, 3, 4, 5, 6, 7, 8), np.full(8, -1)),
      ]
    ):
      r = sampler.sample_round(
        model,
        cache,
        sp,
        rng=jax.random.key(i),
        temperature=t,
        top_p=p,
        top_k=k,
        eos_ids=eos,
        **kw,
      )
      jax.block_until_ready(r)


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_sharded_sampling_equals_unsharded(hf_models, temperature):
  path = hf_models['qwen2_tied'][0]
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(6), [9, 2, 7, 4] * 2, 9
  )
  kw = dict(
    max_new_tokens=N, rng=jax.random.key(7), temperature=temperature, eos_ids=[3]
  )
  ref = sampler.sample(hf.load_model(path), tokens, mask, **kw)
  mesh = sharding.make_mesh((2, 2, 2))
  model = hf.load_model(path, mesh=mesh, rules=sharding.SAMPLE_RULES)
  x = jax.device_put(tokens, sharding.batch_sharding(mesh))
  m = jax.device_put(mask, sharding.batch_sharding(mesh))
  got = sampler.sample(model, x, m, **kw)
  assert got.tokens.sharding.spec[0] == sharding.BATCH_AXES
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(
    np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=1e-4
  )


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_sharded_round_equals_unsharded_for_any_slot_assignment(hf_models, temperature):
  # Slots continue prompts held by other devices (the prompt cache's rows and
  # the slots both split four ways).
  path = hf_models['qwen2_tied'][0]
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(8), [9, 2, 7, 4, 1, 8, 3, 6], 9
  )
  slot_prompt = np.random.RandomState(9).randint(-1, len(tokens), 24).astype(np.int32)
  kw = dict(
    max_new_tokens=N, rng=jax.random.key(10), temperature=temperature, eos_ids=[3]
  )
  plain = hf.load_model(path)
  ref = sampler.sample_round(
    plain, sampler.prefill(plain, tokens, mask), slot_prompt, **kw
  )
  mesh = sharding.make_mesh((2, 2, 2))
  model = hf.load_model(path, mesh=mesh, rules=sharding.SAMPLE_RULES)
  rows = sharding.batch_sharding(mesh)
  cache = sampler.prefill(
    model, jax.device_put(tokens, rows), jax.device_put(mask, rows)
  )
  assert tuple(cache.k[0].sharding.spec)[:2] == (sharding.BATCH_AXES, 'tensor')
  assert tuple(cache.last_logits.sharding.spec) == (sharding.BATCH_AXES, 'tensor')
  got = sampler.sample_round(model, cache, slot_prompt, **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_array_equal(np.asarray(got.mask), np.asarray(ref.mask))
  np.testing.assert_allclose(
    np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=1e-4
  )


@pytest.mark.parametrize('platform', ['cpu', 'tpu'])
def test_sharded_filtered_round_equals_unsharded(hf_models, platform):
  # For a TPU target the top-p / top-k filter sorts with the slots moved over
  # the tensor axis too (sampler._filter_sharding): same tokens as the
  # unsharded round, as with the CPU's layout.
  path = hf_models['qwen2_tied'][0]
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(11), [9, 2, 7, 4, 1, 8, 3, 6], 9
  )
  slot_prompt = np.random.RandomState(12).randint(0, len(tokens), 24).astype(np.int32)
  kw = dict(
    max_new_tokens=N,
    rng=jax.random.key(13),
    temperature=1.3,
    top_p=np.linspace(0.2, 1.0, 24).astype(np.float32),
    top_k=(np.arange(24) % 4).astype(np.int32),
    eos_ids=[3],
  )
  plain = hf.load_model(path)
  ref = sampler.sample_round(
    plain, sampler.prefill(plain, tokens, mask), slot_prompt, **kw
  )
  mesh = sharding.make_mesh((2, 2, 2))
  assert sampler._filter_sharding(mesh, 24).spec[0] == (*sharding.BATCH_AXES, 'tensor')
  model = model_lib.with_config(
    hf.load_model(path, mesh=mesh, rules=sharding.SAMPLE_RULES), platform=platform
  )
  rows = sharding.batch_sharding(mesh)
  cache = sampler.prefill(
    model, jax.device_put(tokens, rows), jax.device_put(mask, rows)
  )
  got = sampler.sample_round(model, cache, slot_prompt, **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(
    np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=1e-4
  )


@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_grouped_round_equals_per_slot_round_sharded_and_not(hf_models, temperature):
  # The controller's paper layout: prompts in runs of 4 slots, idle tail. The
  # grouped round reads each prompt's keys once per 4 slots; results must
  # equal the per-slot round's, on one device and with slots and prompts
  # split over a (2, 2, 2) mesh (16 slots: 4 groups over 4 data shards).
  path = hf_models['qwen2_tied'][0]
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(11), [9, 2, 7, 4, 1, 8, 3, 6], 9
  )
  slot_prompt = np.array([5] * 4 + [0] * 4 + [7] * 4 + [-1] * 4, np.int32)
  kw = dict(
    max_new_tokens=N, rng=jax.random.key(12), temperature=temperature, eos_ids=[3]
  )
  plain = hf.load_model(path)
  cache = sampler.prefill(plain, tokens, mask)
  ref = sampler.sample_round(plain, cache, slot_prompt, group=1, **kw)
  got = sampler.sample_round(plain, cache, slot_prompt, group=4, **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(
    np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=1e-5
  )
  mesh = sharding.make_mesh((2, 2, 2))
  model = hf.load_model(path, mesh=mesh, rules=sharding.SAMPLE_RULES)
  rows = sharding.batch_sharding(mesh)
  sharded = sampler.prefill(
    model, jax.device_put(tokens, rows), jax.device_put(mask, rows)
  )
  got = sampler.sample_round(model, sharded, slot_prompt, group=4, **kw)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
  np.testing.assert_allclose(
    np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=1e-4
  )
  # A layout whose runs of 4 mix prompts is a caller's error, named.
  with pytest.raises(
    ValueError, match=r'slots 4\.\.7 continue different prompts \[0, 1\]'
  ):
    sampler.sample_round(
      plain, cache, np.array([5] * 4 + [0, 0, 1, 1] + [-1] * 8), group=4, **kw
    )
  with pytest.raises(ValueError, match='16 slots do not split into groups of 3'):
    sampler.sample_round(plain, cache, slot_prompt, group=3, **kw)


def test_slot_waves_equal_the_round_sampled_at_once(hf_models):
  # 32 slots (8 prompts x 4, idle tail) in 4 waves of 8: the same tokens and
  # log-probabilities as the round in one wave, unsharded and on a (2, 2, 2)
  # mesh, with per-slot knobs (each wave takes its slice), and one compile
  # for all waves of a round.
  path = hf_models['qwen2_tied'][0]
  tokens, mask = hf_fixtures.left_padded_batch(
    np.random.RandomState(21), [9, 2, 7, 4, 1, 8, 3, 6], 9
  )
  slot_prompt = np.array(
    [p for p in (3, 0, 6, 1, 7, 2) for _ in range(4)] + [-1] * 8, np.int32
  )
  temperature = np.linspace(0.5, 1.3, 32).astype(np.float32)
  kw = dict(
    max_new_tokens=N,
    rng=jax.random.key(22),
    temperature=temperature,
    top_k=np.arange(32) % 5,
    eos_ids=[3],
    group=4,
  )
  plain = hf.load_model(path)
  cache = sampler.prefill(plain, tokens, mask)
  ref = sampler.sample_round(plain, cache, slot_prompt, **kw)
  assert np.asarray(ref.mask)[:24].sum() > 24  # Decoded past the first token.

  def check(got, atol):
    for name in ('tokens', 'mask', 'lengths'):
      np.testing.assert_array_equal(
        np.asarray(getattr(got, name)), np.asarray(getattr(ref, name)), name
      )
    np.testing.assert_allclose(
      np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=atol
    )

  check(sampler.sample_round(plain, cache, slot_prompt, waves=4, **kw), 1e-5)
  mesh = sharding.make_mesh((2, 2, 2))
  model = hf.load_model(path, mesh=mesh, rules=sharding.SAMPLE_RULES)
  rows = sharding.batch_sharding(mesh)
  sharded = sampler.prefill(
    model, jax.device_put(tokens, rows), jax.device_put(mask, rows)
  )
  check(sampler.sample_round(model, sharded, slot_prompt, waves=4, **kw), 1e-5)
  # One compile for every wave: a second round (other waves' offsets, other
  # slots) compiles nothing.
  with compiles.assert_no_compiles('sample_round waves'):
    again = sampler.sample_round(model, sharded, np.roll(slot_prompt, 8), waves=4, **kw)
    jax.block_until_ready(again)
  with pytest.raises(ValueError, match='32 slots do not split into 3 waves'):
    sampler.sample_round(plain, cache, slot_prompt, waves=3, **kw)
  with pytest.raises(ValueError, match='do not split into 16 waves of whole'):
    sampler.sample_round(plain, cache, slot_prompt, waves=16, **kw)


# The round's memory: (S, B, P, N) and a 2-layer model whose cache dominates
# the per-token temporaries (vocab 256).
_S, _B, _P, _N = 64, 8, 64, 192


def _round_temp_bytes(
  kv_heads: int, mesh_shape=(2, 2, 2), group: int = 1
) -> tuple[int, int, int]:
  """(compiled temp bytes, KV cache bytes, the shapes' bound) per device."""
  cfg = model_lib.ModelConfig(
    'qwen2', 256, 128, 256, 2, 4, kv_heads, 32, tie_embeddings=True
  )
  mesh = sharding.make_mesh(mesh_shape)
  model = sharding.create_sharded_model(cfg, mesh, sharding.SAMPLE_RULES)
  rows = sharding.batch_sharding(mesh)
  tokens = jax.device_put(np.ones((_B, _P), np.int32), rows)
  cache = sampler.prefill(model, tokens, tokens)
  compiled = sampler.lower_round(
    model, cache, slots=_S, max_new_tokens=_N, group=group
  ).compile()
  dp, tensor = mesh_shape[0] * mesh_shape[1], mesh_shape[2]
  layer = (_S // dp) * (kv_heads // tensor) * (_P + _N) * cfg.head_dim * 4
  kv = 2 * cfg.num_layers * layer
  # Per token: the [S/dp, V/tensor] fp32 logits and _choose's temporaries of
  # that shape (scaled, exp weights, the filter's masks, the filter's
  # sort), and the fp32 scores [S/dp, H/tensor, P + N].
  choose = 16 * (_S // dp) * (cfg.vocab_size // tensor) * 4
  scores = 4 * (_S // dp) * (cfg.num_heads // tensor) * (_P + _N) * 4
  # The slot gather's source: every prompt's cache, gathered over the data
  # axes (each device's slots may continue any prompt).
  prompt = 2 * cfg.num_layers * _B * (kv_heads // tensor) * _P * cfg.head_dim * 4
  bound = kv + choose + scores + prompt + (64 << 10)
  # A second copy of any one layer's K or V would not fit under it.
  assert bound - kv < layer
  return compiled.memory_analysis().temp_size_in_bytes, kv, bound


def test_round_memory_is_the_kv_cache_and_per_token_temporaries():
  # The cache is built once by the padded slot gather and carried by the
  # decode loop without a copy.
  temp, kv, bound = _round_temp_bytes(kv_heads=4)
  assert kv <= temp <= bound, (temp, kv, bound)


def test_grouped_round_holds_each_prompts_keys_once_per_group():
  # Groups of 8 slots: the [S, G, P, K] per-slot prompt keys become
  # [S/8, G, P, K]; the compiled round's temp falls by (at least 80% of) that.
  temp, _, _ = _round_temp_bytes(kv_heads=4)
  grouped, _, _ = _round_temp_bytes(kv_heads=4, group=8)
  dp, tensor, layers, head_dim = 4, 2, 2, 32
  saved = 2 * layers * (_S // dp) * (4 // tensor) * _P * head_dim * 4 * (1 - 1 / 8)
  assert grouped <= temp - 0.8 * saved, (temp, grouped, saved)
