"""Tests for ada_jax.rl.loss: hand-computed values, gradients, masks, micro-batches.

Dimension legend: B rows, T response tokens, V vocabulary.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ada_jax.rl import loss as loss_lib

# A hand-checkable batch (clip_low 0.2, clip_high 0.28, dual clip c = 3):
#   row 0, A = +1, ratios 1, 1.5, 0.5, [masked]:
#     token losses -1, -1.28 (clipped high), -0.5      -> sum -2.78
#   row 1, A = -1, ratios 1, 1.5, 5, 0.5:
#     token losses 1, 1.5, 3 (dual clip), 0.8 (clipped low) -> sum 6.3
#   row 2: padding, fully masked, garbage values.
RATIOS = np.array([[1.0, 1.5, 0.5, 7.0], [1.0, 1.5, 5.0, 0.5], [2.0, 3.0, 4.0, 5.0]])
ADV = np.array([[1.0] * 4, [-1.0] * 4, [np.nan] * 4])
MASK = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.int32)


def _batch():
  old_logp = np.log(np.full((3, 4), 0.25))
  logp = old_logp + np.log(RATIOS)
  logp[2] = np.inf  # Padding garbage must not leak into anything.
  return jnp.asarray(logp), jnp.asarray(old_logp), jnp.asarray(ADV), jnp.asarray(MASK)


@pytest.mark.parametrize(
  ('mode', 'expected'),
  [
    ('token-mean', (-2.78 + 6.3) / 7),
    ('seq-mean-token-mean', (-2.78 / 3 + 6.3 / 4) / 2),
    ('seq-mean-token-sum', (-2.78 + 6.3) / 2),
  ],
  ids=loss_lib.AGG_MODES,
)
def test_loss_values_by_hand(mode, expected):
  logp, old_logp, adv, mask = _batch()
  loss, m = loss_lib.policy_loss(
    logp, old_logp, adv, mask, clip_ratio_c=3.0, loss_agg_mode=mode
  )
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(m['pg_loss'], expected, rtol=1e-5)
  np.testing.assert_allclose(m['loss'], expected, rtol=1e-5)
  # Clip active on (0, 1) and (1, 3); the dual clip on (1, 2); 7 counted tokens.
  np.testing.assert_allclose(m['clip_frac'], 2 / 7, rtol=1e-6)
  np.testing.assert_allclose(m['clip_frac_lower'], 1 / 7, rtol=1e-6)
  log_r = np.log(RATIOS[:2])[MASK[:2] > 0]
  np.testing.assert_allclose(m['approx_kl'], -log_r.mean(), rtol=1e-5)
  assert all(np.isfinite(v) for v in m.values())


def test_zero_gradient_in_clipped_regions():
  logp, old_logp, adv, mask = _batch()

  def f(lp):
    return loss_lib.policy_loss(lp, old_logp, adv, mask, clip_ratio_c=3.0)[0]

  g = np.asarray(jax.grad(f)(logp))
  assert np.all(np.isfinite(g))
  # d(−A·ρ)/d logp = −A·ρ where unclipped; token-mean divides by 7 tokens.
  expected = np.zeros((3, 4))
  expected[0, 0], expected[0, 2] = -1.0 / 7, -0.5 / 7
  expected[1, 0], expected[1, 1] = 1.0 / 7, 1.5 / 7
  # Zero: (0, 1) clipped high, (1, 2) dual clip, (1, 3) clipped low, masked ones.
  np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-8)


def test_dual_clip_bounds_negative_advantage_loss():
  old = jnp.zeros((1, 3))
  logp = jnp.log(jnp.array([[2.0, 10.0, 1e6]]))
  adv = jnp.full((1, 3), -2.0)
  mask = jnp.ones((1, 3))
  common = dict(loss_agg_mode='seq-mean-token-sum')
  with_c, m = loss_lib.policy_loss(logp, old, adv, mask, clip_ratio_c=3.0, **common)
  no_c, m_no = loss_lib.policy_loss(logp, old, adv, mask, clip_ratio_c=None, **common)
  # ρ = 2 is under c = 3, so it is kept: 2·2; ρ = 10 and ρ = 1e6 are capped at 2·3.
  np.testing.assert_allclose(with_c, 4.0 + 6.0 + 6.0, rtol=1e-5)
  # Without the dual clip the loss of a negative advantage grows with ρ.
  np.testing.assert_allclose(no_c, 4.0 + 20.0 + 2e6, rtol=1e-4)
  np.testing.assert_allclose(m['clip_frac_lower'], 2 / 3, rtol=1e-6)
  assert float(m_no['clip_frac_lower']) == 0.0
  # Dual clip applies to A < 0 only: the same ratios with A > 0 are clip-high.
  pos, _ = loss_lib.policy_loss(logp, old, -adv, mask, clip_ratio_c=3.0, **common)
  np.testing.assert_allclose(pos, -3 * 2 * 1.28, rtol=1e-5)
  with pytest.raises(ValueError, match='clip_ratio_c'):
    loss_lib.policy_loss(logp, old, adv, mask, clip_ratio_c=1.0)


def _random_batch(seed, b=8, t=16):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, t + 1, size=b)
  lengths[3] = 0  # A padding row.
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  old_logp = np.log(rng.uniform(0.05, 1.0, (b, t)))
  logp = old_logp + rng.normal(0, 0.3, (b, t))
  adv = np.repeat(rng.normal(0, 1, (b, 1)), t, axis=1)
  ent = rng.uniform(0, 3, (b, t))
  ref = old_logp + rng.normal(0, 0.2, (b, t))
  return tuple(
    jnp.asarray(x, jnp.float32) for x in (logp, old_logp, adv, mask, ent, ref)
  )


@pytest.mark.parametrize('mode', loss_lib.AGG_MODES)
def test_micro_batches_sum_to_mini_batch(mode):
  logp, old, adv, mask, ent, ref = _random_batch(0)
  kw = dict(
    loss_agg_mode=mode,
    entropy_coef=0.01,
    kl_coef=0.1,
    kl_estimator='k3',
    clip_ratio_c=3.0,
  )

  def full(lp):
    return loss_lib.policy_loss(lp, old, adv, mask, entropy=ent, ref_logp=ref, **kw)

  norm = loss_lib.loss_normalizer(mask)

  def split(lp):
    total, metrics = 0.0, {}
    for s in range(0, 8, 2):  # 4 micro-batches of 2 rows.
      sl = slice(s, s + 2)
      loss, m = loss_lib.policy_loss(
        lp[sl], old[sl], adv[sl], mask[sl], entropy=ent[sl], ref_logp=ref[sl],
        normalizer=norm, **kw,
      )  # fmt: skip
      total += loss
      metrics = {k: metrics.get(k, 0.0) + v for k, v in m.items()}
    return total, metrics

  (l_full, m_full), g_full = jax.value_and_grad(full, has_aux=True)(logp)
  (l_split, m_split), g_split = jax.value_and_grad(split, has_aux=True)(logp)
  np.testing.assert_allclose(l_split, l_full, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(g_split, g_full, rtol=1e-6, atol=1e-9)
  assert set(m_split) == set(m_full)
  for k in m_full:
    np.testing.assert_allclose(m_split[k], m_full[k], rtol=1e-5, atol=1e-7, err_msg=k)
  # A per-micro-batch token-mean (no shared normaliser) is a different number.
  naive = sum(
    loss_lib.policy_loss(
      logp[s : s + 2], old[s : s + 2], adv[s : s + 2], mask[s : s + 2]
    )[0]
    for s in range(0, 8, 2)
  )
  assert abs(float(naive) - float(l_full)) > 1e-3


def test_normalizer_counts_tokens_and_non_empty_rows():
  norm = loss_lib.loss_normalizer(jnp.asarray(MASK))
  assert float(norm.tokens) == 7.0
  assert float(norm.seqs) == 2.0
  norm_bool = loss_lib.loss_normalizer(jnp.asarray(MASK > 0))
  assert float(norm_bool.tokens) == 7.0


@pytest.mark.parametrize('mode', loss_lib.AGG_MODES)
def test_masked_entries_change_nothing(mode):
  logp, old, adv, mask, ent, ref = _random_batch(1)
  kw = dict(loss_agg_mode=mode, entropy_coef=0.01, kl_coef=0.1)

  def f(lp, old, adv, ent, ref):
    return loss_lib.policy_loss(lp, old, adv, mask, entropy=ent, ref_logp=ref, **kw)

  junk_values = np.array([np.nan, np.inf, -np.inf, 1e30], np.float32)
  junk = jnp.asarray(junk_values[np.arange(mask.size).reshape(mask.shape) % 4])

  def garble(x):
    return jnp.where(mask > 0, x, junk)

  vg = jax.value_and_grad(f, has_aux=True)
  (l1, m1), g1 = vg(logp, old, adv, ent, ref)
  (l2, m2), g2 = vg(garble(logp), garble(old), garble(adv), garble(ent), garble(ref))
  assert np.isfinite(float(l1))
  np.testing.assert_array_equal(l1, l2)
  for k in m1:
    np.testing.assert_array_equal(m1[k], m2[k], err_msg=k)
  np.testing.assert_array_equal(g1, g2)
  assert np.all(np.asarray(g2)[np.asarray(mask) == 0] == 0)


def test_kl_estimators_by_hand():
  logp = jnp.log(jnp.array([[0.5, 0.25, 0.3]]))
  ref = jnp.log(jnp.array([[0.25, 0.5, 0.3]]))
  k1 = loss_lib.kl_penalty(logp, ref, 'k1')
  k3 = loss_lib.kl_penalty(logp, ref, 'k3')
  ln2 = math.log(2)
  np.testing.assert_allclose(k1, [[ln2, -ln2, 0.0]], atol=1e-6)
  # k3 = e^r − r − 1 with r = ref − logp:
  #   r = −ln2 gives 0.5 + ln2 − 1, r = ln2 gives 2 − ln2 − 1.
  np.testing.assert_allclose(k3, [[ln2 - 0.5, 1 - ln2, 0.0]], atol=1e-6)
  # The clamp at 10 for far-away reference policies (verl low_var_kl).
  far = loss_lib.kl_penalty(jnp.zeros((1, 1)), jnp.full((1, 1), 50.0), 'k3')
  assert float(far[0, 0]) == 10.0
  with pytest.raises(ValueError, match='kl_estimator'):
    loss_lib.kl_penalty(logp, ref, 'k2')


def test_kl_and_entropy_terms_enter_the_loss():
  logp = jnp.log(jnp.array([[0.5, 0.25, 0.3]]))
  ref = jnp.log(jnp.array([[0.25, 0.5, 0.3]]))
  ent = jnp.array([[1.0, 2.0, 9.0]])
  mask = jnp.array([[1, 1, 0]])
  adv = jnp.zeros((1, 3))  # pg_loss is exactly 0.
  ln2 = math.log(2)
  for est, kl_mean in (('k1', 0.0), ('k3', (ln2 - 0.5 + 1 - ln2) / 2)):
    loss, m = loss_lib.policy_loss(
      logp, logp, adv, mask, entropy=ent, entropy_coef=0.1, ref_logp=ref,
      kl_coef=0.5, kl_estimator=est,
    )  # fmt: skip
    np.testing.assert_allclose(m['kl'], kl_mean, atol=1e-6)
    np.testing.assert_allclose(m['entropy'], 1.5, rtol=1e-6)
    np.testing.assert_allclose(loss, -0.1 * 1.5 + 0.5 * kl_mean, atol=1e-6)
  with pytest.raises(ValueError, match='ref_logp'):
    loss_lib.policy_loss(logp, logp, adv, mask, kl_coef=0.1)
  with pytest.raises(ValueError, match='loss_agg_mode'):
    loss_lib.policy_loss(logp, logp, adv, mask, loss_agg_mode='sum')


def test_token_logp_and_entropy_matches_numpy():
  rng = np.random.default_rng(2)
  logits = rng.normal(0, 2, (2, 3, 5)).astype(np.float32)
  targets = rng.integers(0, 5, (2, 3))
  for temp in (1.0, 0.7):
    logp, ent = loss_lib.token_logp_and_entropy(
      jnp.asarray(logits, jnp.bfloat16), jnp.asarray(targets), temperature=temp
    )
    assert logp.dtype == jnp.float32 and ent.dtype == jnp.float32
    z = np.asarray(jnp.asarray(logits, jnp.bfloat16), np.float64) / temp
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.log(np.take_along_axis(p, targets[..., None], -1))[..., 0]
    np.testing.assert_allclose(logp, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, -(p * np.log(p)).sum(-1), rtol=1e-5, atol=1e-5)
  # Temperature as a traced value under jit: the same numbers.
  f = jax.jit(lambda x, y, t: loss_lib.token_logp_and_entropy(x, y, temperature=t))
  lp_jit, _ = f(jnp.asarray(logits), jnp.asarray(targets), jnp.float32(0.7))
  lp_ref, _ = loss_lib.token_logp_and_entropy(
    jnp.asarray(logits), jnp.asarray(targets), temperature=0.7
  )
  np.testing.assert_allclose(lp_jit, lp_ref, rtol=1e-6)


def test_dual_clip_constant_10_vs_3():
  # A < 0 with ratios 2, 5, 20: c = 3 caps 5 and 20 at 3; c = 10 caps only 20.
  # The paper configs use c = 10: the constant must reach the loss as given.
  old = jnp.zeros((1, 3))
  logp = jnp.log(jnp.array([[2.0, 5.0, 20.0]]))
  adv = jnp.full((1, 3), -1.0)
  mask = jnp.ones((1, 3))
  kw = dict(loss_agg_mode='seq-mean-token-sum')
  c3, m3 = loss_lib.policy_loss(logp, old, adv, mask, clip_ratio_c=3.0, **kw)
  c10, m10 = loss_lib.policy_loss(logp, old, adv, mask, clip_ratio_c=10.0, **kw)
  np.testing.assert_allclose(c3, 2.0 + 3.0 + 3.0, rtol=1e-6)
  np.testing.assert_allclose(c10, 2.0 + 5.0 + 10.0, rtol=1e-6)
  np.testing.assert_allclose(m3['clip_frac_lower'], 2 / 3, rtol=1e-6)
  np.testing.assert_allclose(m10['clip_frac_lower'], 1 / 3, rtol=1e-6)


@pytest.mark.parametrize('chunk', [4, 5, 64], ids=['divides', 'remainder', 'whole'])
def test_chunked_logp_and_entropy_equals_unchunked(chunk):
  # hidden [B, T, D] -> logits through w [D, V]; T = 12 in chunks of 4 (3
  # chunks), 5 (3 chunks of 4: equal lengths) or 64 (one chunk).
  rng = np.random.default_rng(3)
  b, t, d, v = 3, 12, 8, 11
  hidden = jnp.asarray(rng.normal(0, 1, (b, t, d)), jnp.float32)
  w = jnp.asarray(rng.normal(0, 1, (d, v)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, v, (b, t)))
  weights = jnp.asarray(rng.uniform(0, 1, (b, t)), jnp.float32)

  def full(h, w):
    return loss_lib.token_logp_and_entropy(h @ w, targets, temperature=0.7)

  def chunked(h, w):
    return loss_lib.chunked_logp_and_entropy(
      h, targets, lambda x: x @ w, chunk=chunk, temperature=0.7
    )

  def scalar(fn):
    def f(h, w):
      logp, ent = fn(h, w)
      return jnp.sum(weights * logp) + 0.3 * jnp.sum(weights * ent)

    return jax.value_and_grad(f, argnums=(0, 1))

  for a, e in zip(chunked(hidden, w), full(hidden, w), strict=True):
    assert a.shape == (b, t) and a.dtype == jnp.float32
    np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)
  (val, grads) = jax.jit(scalar(chunked))(hidden, w)
  (val_ref, grads_ref) = jax.jit(scalar(full))(hidden, w)
  np.testing.assert_allclose(val, val_ref, rtol=1e-5)
  for g, g_ref in zip(grads, grads_ref, strict=True):
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match='chunk'):
    loss_lib.chunked_logp_and_entropy(hidden, targets, lambda x: x @ w, chunk=0)
