"""Tests of the adaptive sampling controller (`ada_jax.adaptive`).

Oracles: the reference's worked examples (§2.4), closed-form binomial exit
probabilities checked against many seeded simulations with tolerances from
the binomial std, the textbook GRPO formula, and small hand-traced cases for
the downsampling order, the refill slot split and the est budget split.

Fake draws: `ScriptedDraw` gives prompt i's k-th sample the reward
scripts[i][k] (a prefix script: a larger pool is always an extension of a
smaller one); `BernoulliDraw` gives Bernoulli(p_i) rewards.

Dimension legend: S slots, B prompts, R kept rows, n group size, M samples per
round, N max rounds.
"""

import io
import json
import math

import numpy as np
import pytest
from scipy import stats

from ada_jax import adaptive
from ada_jax.adaptive import rules as rules_lib
from ada_jax.adaptive import schedule as sched


class ScriptedDraw:
  """Prompt i's k-th sample (generation order) gets scripts[i][k]."""

  def __init__(self, scripts):
    self.scripts = [list(s) for s in scripts]
    self.used = [0] * len(scripts)
    self.calls = []

  def __call__(self, slot_prompt):
    self.calls.append(slot_prompt.copy())
    out = np.full(len(slot_prompt), np.nan)  # Idle rewards must be ignored.
    for slot, prompt in enumerate(slot_prompt):
      if prompt >= 0:
        out[slot] = self.scripts[prompt][self.used[prompt]]
        self.used[prompt] += 1
    return out


class BernoulliDraw:
  """Rewards ~ Bernoulli(p[prompt]), from a seeded generator."""

  def __init__(self, p, seed):
    self.p = np.asarray(p, np.float64)
    self.rng = np.random.default_rng(seed)
    self.calls = []

  def __call__(self, slot_prompt):
    self.calls.append(slot_prompt.copy())
    u = self.rng.random(len(slot_prompt))
    p = np.where(slot_prompt >= 0, self.p[np.maximum(slot_prompt, 0)], 0.0)
    return (u < p).astype(np.float64)


def ada(num_prompts, draw, **kw):
  args = dict(group_size=4, samples_per_round=8, max_rounds=4)
  args.update(kw)
  args.setdefault('slots', num_prompts * args['samples_per_round'])
  return adaptive.sample_groups(num_prompts, draw, **args)


def rows_of(groups, prompt):
  m = groups.prompt_index == prompt
  return groups.sample_id[m], groups.reward[m], groups.advantage[m]


# ---------------------------------------------------------------------------
# Reference §2.4 worked examples (n=4, M=8, N=4).

WORKED_SCRIPTS = [
  [0, 1, 0, 1, 0, 0, 1, 0] + [0] * 24,  # 3/5 in round 1.
  [1] * 32,  # All correct.
  [1, 0, 0, 0, 0, 0, 0, 0] + [0] * 24,  # 1/7, then 0/8.
  [0] * 32,  # All wrong.
  [1, 1, 1, 0, 1, 1, 1, 1] + [1, 1, 0, 1, 1, 0, 1, 1] + [1] * 16,  # 7/1, 6/2.
]

# Per rule, per prompt: (exit round, kept sample ids, advantages), traced by
# hand from the reference's table. Slots = 5·8: round r's layout puts the
# active prompts' 8 slots next to each other in prompt order.
WORKED_EXPECTED = {
  'balance': [
    (0, [1, 3, 0, 2], [0.625, 0.625, -0.375, -0.375]),
    (-1, [8, 9, 10, 11], [0.0] * 4),
    (-1, [16, 17, 18, 19], [1 - 1 / 32] + [-1 / 32] * 3),
    (-1, [24, 25, 26, 27], [0.0] * 4),
    # Round 2 (ids 40..) puts prompts 1..4 in slots 0..31: prompt 4 at 24..31.
    (1, [32, 33, 35, 40 + 24 + 2], [1 - 13 / 16] * 2 + [-13 / 16] * 2),
  ],
  'pos': [
    (0, [1, 3, 0, 2], [0.625, 0.625, -0.375, -0.375]),
    (0, [8, 9, 10, 11], [0.0] * 4),
    (0, [16, 17, 18, 19], [7 / 8] + [-1 / 8] * 3),
    (-1, [24, 25, 26, 27], [0.0] * 4),
    (0, [32, 33, 34, 35], [1 / 8] * 3 + [-7 / 8]),  # 3 ✓ topped up + 1 ✗.
  ],
}


@pytest.mark.parametrize('rule', ['balance', 'pos'])
def test_worked_examples(rule):
  draw = ScriptedDraw(WORKED_SCRIPTS)
  g = ada(5, draw, rule=rule)
  for prompt, (exit_round, ids, adv) in enumerate(WORKED_EXPECTED[rule]):
    got_ids, got_reward, got_adv = rows_of(g, prompt)
    assert g.exit_round[prompt] == exit_round, prompt
    np.testing.assert_array_equal(got_ids, ids, err_msg=str(prompt))
    np.testing.assert_allclose(got_adv, adv, atol=1e-12, err_msg=str(prompt))
    script = WORKED_SCRIPTS[prompt]
    np.testing.assert_array_equal(
      got_reward, [script[_index_in_pool(g, prompt, i)] for i in ids]
    )
  assert g.num_rows == 20 == g.max_rows
  # balance never exits prompts 1-3, so all 4 rounds run; pos still runs the
  # all-wrong prompt to the end.
  assert g.rounds == 4
  assert g.samples_drawn == sum(int((c >= 0).sum()) for c in draw.calls)


def _index_in_pool(g, prompt, sample_id):
  flat = g.slot_prompt.reshape(-1)
  return int((flat[:sample_id] == prompt).sum())


def test_worked_examples_metrics():
  g = ada(5, ScriptedDraw(WORKED_SCRIPTS), rule='balance')
  m = g.metrics
  assert m['exited_per_round'] == [1, 1, 0, 0]
  assert m['samples_drawn'] == 40 + 32 + 24 + 24
  assert m['slots_idle'] == 4 * 40 - m['samples_drawn']
  assert m['prompts_short_pos'] == 2  # 1/31 and 0/32 pools.
  assert m['prompts_short_neg'] == 1  # 32/0.
  assert m['zero_adv_frac'] == pytest.approx(0.4)
  # Round-1 mean over prompts: (3 + 8 + 1 + 0 + 7) / 8 / 5.
  assert m['reward_round1_mean'] == pytest.approx(19 / 40)


# ---------------------------------------------------------------------------
# Exit rounds vs closed-form binomial probabilities.


def _exit_by_round(rule, p, n, m, rounds, min_positives=1):
  """P(exited by the end of round k) for k = 1..rounds.

  The exit test is monotone in the pool, and after k rounds the pool holds
  Binomial(M·k, p) positives.
  """
  out = []
  for k in range(1, rounds + 1):
    size = m * k
    if rule == 'pos':
      out.append(stats.binom.sf(min_positives - 1, size, p))
    else:
      need_pos, need_neg = n // 2, n - n // 2
      # P(need_pos <= X <= size - need_neg).
      out.append(
        stats.binom.cdf(size - need_neg, size, p)
        - stats.binom.cdf(need_pos - 1, size, p)
      )
  return np.array(out)


@pytest.mark.parametrize(
  'rule,options', [('balance', {}), ('pos', {}), ('pos', {'min_positives': 2})]
)
def test_exit_round_distribution_matches_binomial(rule, options):
  rates = np.array([0.01, 0.05, 0.15, 0.5, 0.9, 0.98])
  per_rate = 250
  p = np.repeat(rates, per_rate)
  g = ada(len(p), BernoulliDraw(p, seed=7), rule=rule, **options)
  chi2 = 0.0
  dof = 0
  for j, rate in enumerate(rates):
    by_round = _exit_by_round(rule, rate, 4, 8, 4, options.get('min_positives', 1))
    probs = np.append(np.diff(by_round, prepend=0.0), 1 - by_round[-1])
    ex = g.exit_round[j * per_rate : (j + 1) * per_rate]
    counts = np.array([(ex == r).sum() for r in range(4)] + [(ex == -1).sum()])
    expected = per_rate * probs
    sd = np.sqrt(per_rate * probs * (1 - probs))
    # Per cell: 5 binomial sds (+1 for the discreteness of tiny cells).
    assert np.all(np.abs(counts - expected) <= 5 * sd + 1), (rate, counts, expected)
    keep = expected > 5
    chi2 += float(((counts - expected)[keep] ** 2 / expected[keep]).sum())
    dof += int(keep.sum())
  # Pooled Pearson statistic: a systematic shift that no single cell shows.
  assert stats.chi2.sf(chi2, dof) > 1e-4, (chi2, dof)


def test_exit_distribution_detects_a_wrong_rule():
  # The oracle has power: pos exits of p=0.15 do not fit balance's law.
  p = np.full(400, 0.15)
  g = ada(len(p), BernoulliDraw(p, seed=3), rule='pos')
  by_round = _exit_by_round('balance', 0.15, 4, 8, 4)
  frac_round1 = float((g.exit_round == 0).mean())
  assert abs(frac_round1 - by_round[0]) > 5 * math.sqrt(
    by_round[0] * (1 - by_round[0]) / 400
  )


# ---------------------------------------------------------------------------
# Downsampling and fallback order.


@pytest.mark.parametrize(
  'pos,neg,n,target,expected',
  [
    (3, 5, 4, None, (2, 2)),
    (7, 1, 4, None, (3, 1)),  # Topped up from the spare positives.
    (1, 31, 4, None, (1, 3)),
    (0, 32, 4, None, (0, 4)),  # Topped up from the negatives.
    (32, 0, 4, None, (4, 0)),
    (1, 1, 4, None, (1, 1)),  # Pool smaller than n: a smaller group.
    (2, 30, 4, 1, (1, 3)),
    (3, 2, 5, None, (3, 2)),  # Odd n: ⌊5/2⌋ positives, then top-up.
  ],
)
def test_downsample_counts(pos, neg, n, target, expected):
  assert rules_lib.downsample_counts(pos, neg, n, target) == expected


def test_pos_fallback_with_min_positives():
  # min_positives=2: a 1/31 pool never exits; the fallback takes
  # ceil(1/32·4) = 1 positive and 3 negatives, earliest first.
  script = [0, 0, 0, 1] + [0] * 28
  g = ada(1, ScriptedDraw([script]), rule='pos', min_positives=2)
  ids, _, adv = rows_of(g, 0)
  assert g.exit_round[0] == -1
  np.testing.assert_array_equal(ids, [3, 0, 1, 2])
  np.testing.assert_allclose(adv, [1 - 1 / 32] + [-1 / 32] * 3)
  assert rules_lib.pos_fallback_target(16, 16, 4) == 2
  assert rules_lib.pos_fallback_target(31, 1, 4) == 3  # Clamped to take - 1.


# ---------------------------------------------------------------------------
# Refill schedule.


def test_refill_hand_traced():
  # B=3, n=2, M=2, N=3 (cap 6), S=7, balance (1 ✓ and 1 ✗ to exit).
  scripts = [[1] * 6, [0, 0, 1, 0, 0, 0], [0] * 6]
  g = ada(
    3,
    ScriptedDraw(scripts),
    rule='balance',
    schedule='refill',
    group_size=2,
    samples_per_round=2,
    max_rounds=3,
    slots=7,
  )
  np.testing.assert_array_equal(
    g.slot_prompt,
    [
      [0, 0, 0, 1, 1, 2, 2],  # 7 = 2+2+2, remainder to the lowest index.
      [0, 0, 1, 1, 1, 2, 2],  # Pools 3,2,2: remainder to prompt 1 (smallest pool).
      [0, 2, 2, -1, -1, -1, -1],  # Rooms 1 and 2 under the cap; 4 idle.
    ],
  )
  np.testing.assert_array_equal(g.exit_round, [-1, 1, -1])
  ids, _, adv = rows_of(g, 1)
  np.testing.assert_array_equal(ids, [9, 3])  # First ✓ (round 2), first ✗.
  np.testing.assert_allclose(adv, [0.8, -0.2])
  np.testing.assert_array_equal(rows_of(g, 0)[0], [0, 1])
  np.testing.assert_array_equal(rows_of(g, 2)[0], [5, 6])
  assert g.metrics['slots_idle'] == 4
  np.testing.assert_array_equal(g.num_pos + g.num_neg, [6, 5, 6])


def _check_refill_round_invariants(g, cap, slots):
  pool = np.zeros(len(g.exit_round), np.int64)
  for r, sp in enumerate(g.slot_prompt):
    assert sp.shape == (slots,)
    active = (g.exit_round < 0) | (g.exit_round >= r)
    counts = np.bincount(sp[sp >= 0], minlength=len(pool))
    assert np.all(counts[~active] == 0)
    room = cap - pool
    assert np.all(counts <= room)  # The cap holds.
    if (sp < 0).any():  # Idle only when every active prompt is full.
      assert np.all(counts[active] == room[active]), r
    under = active & (counts < room)
    if under.any():  # Even split: the cap binds only below the level.
      assert counts[under].max() - counts[under].min() <= 1
      assert counts[active].max() <= counts[under].max()
    # Contiguous per prompt, in prompt order.
    live = sp[sp >= 0]
    assert np.all(np.diff(live) >= 0)
    pool += counts
  assert np.all(pool <= cap)


@pytest.mark.parametrize('slots_extra', [0, 13])
@pytest.mark.parametrize('rule', ['balance', 'pos'])
def test_refill_invariants(rule, slots_extra):
  rng = np.random.default_rng(1)
  p = rng.beta(0.3, 0.9, size=60)
  slots = 60 * 8 + slots_extra
  g = ada(60, BernoulliDraw(p, seed=2), rule=rule, schedule='refill', slots=slots)
  _check_refill_round_invariants(g, cap=32, slots=slots)
  assert g.num_rows == 60 * 4


def test_refill_needs_no_more_rounds_than_paper():
  # With a prefix script the refill pool at each round extends the paper
  # pool, and the exit test is monotone: no prompt exits later.
  rng = np.random.default_rng(5)
  p = rng.beta(0.3, 0.9, size=40)
  scripts = (rng.random((40, 32)) < p[:, None]).astype(float)

  def late(exit_round):
    return np.where(exit_round < 0, 99, exit_round)

  for rule in ('balance', 'pos'):
    paper = ada(40, ScriptedDraw(scripts), rule=rule, schedule='paper')
    refill = ada(40, ScriptedDraw(scripts), rule=rule, schedule='refill')
    assert np.all(late(refill.exit_round) <= late(paper.exit_round))
    assert refill.rounds <= paper.rounds
    assert refill.metrics['prompts_not_exited'] <= paper.metrics['prompts_not_exited']
  # And it does help on this script: some prompt exits strictly earlier.
  assert np.any(late(refill.exit_round) < late(paper.exit_round))


def test_round_one_same_for_both_schedules():
  p = np.linspace(0.0, 1.0, 30)
  paper = ada(30, BernoulliDraw(p, seed=0), rule='balance', schedule='paper')
  refill = ada(30, BernoulliDraw(p, seed=0), rule='balance', schedule='refill')
  np.testing.assert_array_equal(paper.slot_prompt[0], refill.slot_prompt[0])
  np.testing.assert_array_equal(paper.slot_prompt[0], np.repeat(np.arange(30), 8))


def test_paper_schedule_layout():
  p = np.array([0.0, 0.5, 1.0])
  g = ada(3, BernoulliDraw(p, seed=0), rule='balance', slots=30)
  for r, sp in enumerate(g.slot_prompt):
    active = np.flatnonzero((g.exit_round < 0) | (g.exit_round >= r))
    expected = np.concatenate([np.repeat(active, 8), np.full(30 - 8 * len(active), -1)])
    np.testing.assert_array_equal(sp, expected)


def test_refill_counts_unit():
  active = np.array([True, True, True, False])
  pool = np.array([4, 0, 2, 0])
  # Room 2, 6, 4: level 3 gives 2+3+3 = 8 of 9; remainder to prompt 1 (pool 0).
  np.testing.assert_array_equal(sched.refill_counts(active, pool, 6, 9), [2, 4, 3, 0])
  np.testing.assert_array_equal(sched.refill_counts(active, pool, 6, 100), [2, 6, 4, 0])


# ---------------------------------------------------------------------------
# grpo, dapo, est.


def test_grpo_local_is_textbook_formula():
  rng = np.random.default_rng(0)
  rewards = rng.choice([0.0, 0.3, 1.0], size=(6, 4))
  rewards[0] = 1.0  # A uniform group: advantage exactly 0.
  g = adaptive.sample_groups(
    6,
    ScriptedDraw(rewards),
    rule='grpo',
    group_size=4,
    samples_per_round=8,
    max_rounds=4,
    slots=30,
  )
  assert g.rounds == 1 and g.num_rows == 24 == g.max_rows
  np.testing.assert_array_equal(g.sample_id, np.arange(24))
  np.testing.assert_array_equal(g.slot_prompt[0][24:], -1)
  for i in range(6):
    r = rewards[i]
    expected = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(rows_of(g, i)[2], expected, atol=1e-12)
  assert g.metrics['slots_idle'] == 6
  # Explicit global advantages use the group as the pool (binarised).
  glob = adaptive.sample_groups(
    6,
    ScriptedDraw(rewards),
    rule='grpo',
    group_size=4,
    samples_per_round=8,
    max_rounds=4,
    slots=24,
    advantage='global',
  )
  pass_rate = (rewards > 0.7).mean(axis=1)
  np.testing.assert_allclose(glob.advantage, (rewards - pass_rate[:, None]).ravel())


def test_dapo_hand_traced():
  scripts = [[1, 1], [0, 1], [0, 0], [1, 0], [0, 1], [1, 0], [0, 1], [1, 1]]
  g = adaptive.sample_groups(
    8,
    ScriptedDraw(scripts),
    rule='dapo',
    group_size=2,
    samples_per_round=8,
    max_rounds=10,
    slots=5,  # 2 candidates per round, one idle slot.
    target_groups=3,
  )
  # Round 0 tries 0,1 (keeps 1); round 1 tries 2,3 (keeps 3); round 2 tries
  # 4,5, both mixed, keeps only 4: the target is reached.
  assert g.rounds == 3
  np.testing.assert_array_equal(g.exit_round, [-1, 0, -1, 1, 2, -1, -1, -1])
  np.testing.assert_array_equal(g.prompt_index, [1, 1, 3, 3, 4, 4])
  np.testing.assert_array_equal(g.sample_id, [2, 3, 7, 8, 10, 11])
  a = 0.5 / (math.sqrt(0.5) + 1e-6)
  np.testing.assert_allclose(g.advantage, [-a, a, a, -a, -a, a])
  np.testing.assert_array_equal(g.slot_prompt[:, 4], -1)
  assert g.max_rows == 6 and g.metrics['prompts_tried'] == 6


def test_dapo_keeps_only_mixed_groups():
  rng = np.random.default_rng(0)
  p = rng.beta(0.4, 1.0, size=256)
  g = adaptive.sample_groups(
    256,
    BernoulliDraw(p, seed=1),
    rule='dapo',
    group_size=4,
    samples_per_round=8,
    max_rounds=3,
    slots=256,
    target_groups=128,
  )
  assert g.num_rows <= g.max_rows == 128 * 4
  assert g.num_rows % 4 == 0
  kept = np.unique(g.prompt_index)
  assert np.all((g.num_pos[kept] > 0) & (g.num_neg[kept] > 0))
  # Every tried candidate that is mixed was kept unless the target was full.
  tried = (g.num_pos + g.num_neg) > 0
  mixed = tried & (g.num_pos > 0) & (g.num_neg > 0)
  if len(kept) < 128:
    np.testing.assert_array_equal(np.flatnonzero(mixed), kept)
  assert g.rounds == 3 and g.metrics['zero_adv_frac'] == 0.0


def test_est_allocation_hand_computed_and_history():
  # Key 'a' has p̂ = (1+15)/(17+15) = 0.5 (w=2), new key 'b' p̂ = 1/17 (w=17).
  # 8 extra slots: shares 0.84 and 7.16 -> floors 0, 7; remainder to 'a'.
  hist = {
    'keys': np.array(['a']),
    'n_pos': np.array([15.0]),
    'n_total': np.array([15.0]),
  }
  draw = ScriptedDraw([[1, 0], [0] * 7 + [1]])
  g = adaptive.sample_groups(
    2,
    draw,
    rule='est',
    group_size=4,
    samples_per_round=8,
    max_rounds=1,
    slots=10,
    prompt_keys=['a', 'b'],
    history=hist,
  )
  np.testing.assert_array_equal(g.slot_prompt[0], [0, 0] + [1] * 8)
  assert g.num_rows == 10 == g.max_rows
  np.testing.assert_allclose(g.advantage, [0.5, -0.5] + [-1 / 8] * 7 + [7 / 8])
  h = g.history
  assert h['keys'].tolist() == ['a', 'b']
  np.testing.assert_allclose(h['n_pos'], [0.9 * 15 + 1, 1])
  np.testing.assert_allclose(h['n_total'], [0.9 * 15 + 2, 8])
  assert hist['n_pos'][0] == 15.0  # The input is not modified.
  # The history persists through a checkpoint round-trip (npz) and decays.
  buf = io.BytesIO()
  np.savez(buf, **h)
  buf.seek(0)
  restored = dict(np.load(buf))
  g2 = adaptive.sample_groups(
    3,
    ScriptedDraw([[0] * 20] * 3),
    rule='est',
    group_size=4,
    samples_per_round=8,
    max_rounds=1,
    slots=20,
    prompt_keys=['b', 'c', 'a'],
    history=restored,
  )
  n_pos = np.array([1, 0, 14.5])
  n_total = np.array([8, 0, 15.5])
  expected = sched.est_counts((1 + n_pos) / (17 + n_total), 20)
  np.testing.assert_array_equal(np.bincount(g2.slot_prompt[0], minlength=3), expected)
  # Prompt a (highest p̂) gets the fewest, c (prior only) the most.
  assert expected[2] < expected[0] < expected[1]
  count = np.bincount(g2.slot_prompt[0], minlength=3)
  assert g2.history['keys'].tolist() == ['a', 'b', 'c']
  np.testing.assert_allclose(
    g2.history['n_total'], [0.9 * 15.5 + count[2], 0.9 * 8 + count[0], count[1]]
  )


def test_est_allocates_more_to_harder_prompts():
  rng = np.random.default_rng(0)
  hist_pos = rng.integers(0, 20, size=50).astype(float)
  hist = {'keys': np.arange(50), 'n_pos': hist_pos, 'n_total': np.full(50, 20.0)}
  g = adaptive.sample_groups(
    50,
    BernoulliDraw(np.full(50, 0.5), 0),
    rule='est',
    group_size=4,
    samples_per_round=8,
    max_rounds=1,
    slots=400,
    history=hist,
  )
  counts = np.bincount(g.slot_prompt[0], minlength=50)
  assert counts.sum() == 400 and counts.min() >= 1
  order = np.argsort(hist_pos, kind='stable')
  assert np.all(np.diff(counts[order]) <= 0)  # Non-increasing in p̂.
  p_hat = (1 + hist_pos) / 37
  share = 350 / p_hat / (1 / p_hat).sum()
  assert np.all(np.abs(counts - 1 - share) < 1)  # Largest remainder.


def test_est_pool_of_one_has_zero_baseline():
  g = adaptive.sample_groups(
    3,
    ScriptedDraw([[1], [0], [1]]),
    rule='est',
    group_size=4,
    samples_per_round=8,
    max_rounds=1,
    slots=3,
    normalize_std=True,
  )
  np.testing.assert_allclose(g.advantage, [1 / (1 + 1e-6), 0, 1 / (1 + 1e-6)])


# ---------------------------------------------------------------------------
# Advantages, metrics, determinism, shapes, errors.


def test_global_advantage_normalize_std():
  script = [0, 1, 0, 1, 0, 0, 1, 0]
  g = ada(1, ScriptedDraw([script + [0] * 24]), rule='balance', normalize_std=True)
  pool = np.array(script, float)
  expected = (g.reward - 3 / 8) / (pool.std(ddof=1) + 1e-6)
  np.testing.assert_allclose(g.advantage, expected)
  # A uniform pool: σ clamped at 1e-6, advantage exactly 0.
  g = ada(1, ScriptedDraw([[1] * 32]), rule='balance', normalize_std=True)
  np.testing.assert_array_equal(g.advantage, 0.0)


def test_reward_round1_mean_is_unbiased():
  rng = np.random.default_rng(4)
  p = rng.beta(0.3, 0.8, size=300)
  g = ada(
    300,
    BernoulliDraw(p, seed=9),
    rule='balance',
    schedule='refill',
    slots=300 * 8 + 150,
  )
  sp, sr = g.slot_prompt[0], g.slot_reward[0]
  per_prompt = [sr[sp == i].mean() for i in range(300)]
  assert g.metrics['reward_round1_mean'] == pytest.approx(np.mean(per_prompt))
  # E = mean(p); sd of the mean of per-prompt means of ≥ 8 Bernoullis.
  sd = math.sqrt(np.sum(p * (1 - p) / 8)) / 300
  assert abs(g.metrics['reward_round1_mean'] - p.mean()) < 5 * sd
  # The batch mean is biased toward 0.5 by the balanced groups.
  assert abs(g.metrics['reward_batch_mean'] - 0.5) < abs(p.mean() - 0.5)


@pytest.mark.parametrize(
  'rule,schedule,options',
  [
    ('grpo', 'paper', {}),
    ('pos', 'paper', {}),
    ('balance', 'refill', {}),
    ('dapo', 'paper', {'target_groups': 20}),
    ('est', 'paper', {}),
  ],
)
def test_deterministic_shapes_and_metrics(rule, schedule, options):
  p = np.linspace(0.02, 0.98, 40)

  def run():
    return ada(40, BernoulliDraw(p, 11), rule=rule, schedule=schedule, **options)

  a, b = run(), run()
  for field in (
    'prompt_index',
    'sample_id',
    'reward',
    'advantage',
    'exit_round',
    'slot_prompt',
  ):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
  assert a.metrics == b.metrics
  r_max = adaptive.max_rows(40, rule=rule, group_size=4, slots=320, **options)
  assert a.max_rows == r_max and a.num_rows <= r_max
  if rule in ('grpo', 'pos', 'balance'):
    assert a.num_rows == 160
  pad = a.padded()
  assert all(v.shape == (r_max,) for v in pad.values())
  assert pad['weight'].sum() == a.num_rows
  assert np.all(pad['advantage'][a.num_rows :] == 0)
  np.testing.assert_array_equal(pad['sample_id'][: a.num_rows], a.sample_id)
  # Sample ids index the [rounds, S] buffers: round id // S, slot id % S.
  flat_prompt = a.slot_prompt.reshape(-1)
  np.testing.assert_array_equal(flat_prompt[a.sample_id], a.prompt_index)
  np.testing.assert_array_equal(a.slot_reward.reshape(-1)[a.sample_id], a.reward)
  assert len(set(a.sample_id.tolist())) == a.num_rows
  # Metrics are plain Python numbers (JSON-able), consistent with the fields.
  json.dumps(a.metrics)
  for key, value in a.metrics.items():
    if key == 'exited_per_round':
      assert all(type(v) is int for v in value)
    else:
      assert type(value) in (int, float), key
  assert a.metrics['rounds'] == a.rounds == len(a.slot_prompt)
  assert (
    a.metrics['samples_drawn'] == a.samples_drawn == int((a.slot_prompt >= 0).sum())
  )
  assert sum(a.metrics['exited_per_round']) == a.metrics['prompts_exited']


@pytest.mark.parametrize(
  'kwargs,match',
  [
    ({'rule': 'nope'}, 'unknown rule'),
    ({'rule': 'balance', 'schedule': 'fast'}, 'unknown schedule'),
    ({'rule': 'grpo', 'schedule': 'refill'}, 'defines its own rounds'),
    ({'rule': 'est', 'schedule': 'refill'}, 'defines its own rounds'),
    ({'rule': 'balance', 'slots': 79}, 'slots'),
    ({'rule': 'pos', 'samples_per_round': 2, 'slots': 100}, 'samples_per_round'),
    ({'rule': 'grpo', 'slots': 39}, 'slots'),
    ({'rule': 'est', 'slots': 9}, 'slots'),
    ({'rule': 'balance', 'min_positives': 2}, 'unknown options'),
    ({'rule': 'pos', 'advantage': 'other'}, 'unknown advantage'),
    ({'rule': 'pos', 'group_size': 0}, 'group_size'),
  ],
)
def test_argument_errors(kwargs, match):
  args = dict(group_size=4, samples_per_round=8, max_rounds=4, slots=80)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    adaptive.sample_groups(10, BernoulliDraw(np.full(10, 0.5), 0), **args)


def test_bad_draw_results():
  with pytest.raises(ValueError, match='shape'):
    ada(2, lambda sp: np.zeros(3), rule='balance')
  with pytest.raises(ValueError, match='non-finite'):
    ada(2, lambda sp: np.full(len(sp), np.nan), rule='balance')


def test_est_history_with_integer_keys_round_trips():
  keys = np.array([101, 7, 55], np.int64)
  kw = dict(rule='est', group_size=4, samples_per_round=8, max_rounds=1, slots=12)
  g1 = adaptive.sample_groups(
    3, ScriptedDraw([[1] * 12, [0] * 12, [1, 0] * 6]), prompt_keys=keys, **kw
  )
  assert g1.history['keys'].dtype == np.int64
  buf = io.BytesIO()
  np.savez(buf, **g1.history)
  buf.seek(0)
  restored = dict(np.load(buf))
  # Same prompts again, in another order: the all-correct one (101) gets the
  # fewest slots, the all-wrong one (7) the most.
  g2 = adaptive.sample_groups(
    3,
    ScriptedDraw([[0] * 12] * 3),
    prompt_keys=keys[::-1].tolist(),
    history=restored,
    **kw,
  )
  counts = np.bincount(g2.slot_prompt[0], minlength=3)  # Keys 55, 7, 101.
  assert counts[2] < counts[0] < counts[1]
  np.testing.assert_array_equal(g2.history['keys'], [101, 7, 55])


# ControllerSettings: a run's settings, checked once, calling sample_groups.


@pytest.mark.parametrize(
  'kwargs,match',
  [
    ({'rule': 'nope'}, 'unknown rule'),
    ({'rule': 'balance', 'schedule': 'fast'}, 'unknown schedule'),
    ({'rule': 'grpo', 'schedule': 'refill'}, 'defines its own rounds'),
    ({'rule': 'est', 'schedule': 'refill'}, 'defines its own rounds'),
    ({'rule': 'pos', 'samples_per_round': 2, 'slots': 100}, 'samples_per_round'),
    ({'rule': 'balance', 'min_positives': 2}, 'unknown options'),
    ({'rule': 'pos', 'advantage': 'other'}, 'unknown advantage'),
    ({'rule': 'pos', 'group_size': 0}, 'group_size'),
    ({'rule': 'dapo', 'slots': 3}, 'group_size'),
    ({'rule': 'dapo', 'target_groups': 0}, 'target_groups'),
    ({'rule': 'est', 'decay': 2.0}, 'decay'),
  ],
)
def test_settings_errors_are_sample_groups_errors(kwargs, match):
  args = dict(group_size=4, samples_per_round=8, max_rounds=4, slots=80)
  args.update(kwargs)
  fields = {f for f in adaptive.ControllerSettings.__dataclass_fields__}
  options = {k: args.pop(k) for k in list(args) if k not in fields}
  with pytest.raises(ValueError, match=match) as built:
    adaptive.ControllerSettings(**args, rule_options=options)
  with pytest.raises(ValueError, match=match) as called:
    adaptive.sample_groups(10, BernoulliDraw(np.full(10, 0.5), 0), **args, **options)
  assert str(built.value) == str(called.value)


@pytest.mark.parametrize(
  'rule, schedule, options',
  [
    ('grpo', 'paper', {}),
    ('balance', 'refill', {}),
    ('pos', 'paper', {'min_positives': 2}),
    ('dapo', 'paper', {'target_groups': 6}),
    ('est', 'paper', {'decay': 0.5}),
  ],
)
def test_settings_call_sample_groups(rule, schedule, options):
  p = np.linspace(0.02, 0.98, 40)
  kw = dict(group_size=4, samples_per_round=8, max_rounds=4, slots=320)
  settings = adaptive.ControllerSettings(
    rule=rule, schedule=schedule, rule_options=options, **kw
  )
  a = settings.sample_groups(40, BernoulliDraw(p, 3))
  b = adaptive.sample_groups(
    40, BernoulliDraw(p, 3), rule=rule, schedule=schedule, **kw, **options
  )
  np.testing.assert_array_equal(a.sample_id, b.sample_id)
  np.testing.assert_array_equal(a.advantage, b.advantage)
  assert a.metrics == b.metrics
  assert (
    settings.max_rows(40)
    == a.max_rows
    == adaptive.max_rows(
      40,
      rule=rule,
      group_size=4,
      slots=320,
      target_groups=options.get('target_groups'),
    )
  )
  # The checks that need the step's prompts run with it: 400 do not fit.
  if rule in ('grpo', 'balance', 'est'):
    with pytest.raises(ValueError, match='slots'):
      settings.sample_groups(400, BernoulliDraw(np.full(400, 0.5), 0))


def test_settings_are_frozen_with_their_own_options():
  options = {'target_groups': 3}
  settings = adaptive.ControllerSettings(
    rule='dapo',
    group_size=4,
    samples_per_round=4,
    max_rounds=4,
    slots=16,
    rule_options=options,
  )
  options['target_groups'] = 5
  assert settings.max_rows(10) == 12
  with pytest.raises(AttributeError):
    settings.slots = 8


@pytest.mark.parametrize(
  'rule, schedule, slots, expected',
  [
    ('balance', 'paper', 320, 8),
    ('pos', 'paper', 320, 8),
    ('grpo', 'paper', 320, 4),
    ('dapo', 'paper', 320, 4),
    ('balance', 'refill', 320, 1),
    ('est', 'paper', 320, 1),
    ('balance', 'paper', 324, 1),  # S not a multiple of M: no groups.
  ],
)
def test_slot_group_holds_for_every_round_the_rule_lays_out(
  rule, schedule, slots, expected
):
  # The sampler reads a prompt's keys once per aligned run of slot_group
  # slots: every run must continue one prompt (or idle), in every round.
  settings = adaptive.ControllerSettings(
    rule=rule,
    schedule=schedule,
    group_size=4,
    samples_per_round=8,
    max_rounds=4,
    slots=slots,
  )
  assert settings.slot_group == expected
  g = settings.sample_groups(40, BernoulliDraw(np.linspace(0.02, 0.98, 40), 5))
  m = settings.slot_group
  for sp in g.slot_prompt:
    runs = sp.reshape(-1, m)
    first = runs.max(axis=1, keepdims=True)
    assert ((runs == first) | (runs < 0)).all(), sp
  if expected > 1:  # The rounds do mix prompts in smaller runs than the next size.
    runs = g.slot_prompt[0].reshape(-1, 2 * m)
    assert (runs[:, :1] != runs).any()
