"""Per-prompt rules of the adaptive controller: exit tests, groups, advantages.

Everything here works on one prompt's pool (all samples it drew in one step,
in generation order) or on per-prompt count vectors, and is pure numpy. The
round loop and the slot layout live in `rounds.py` and
`schedule.py`.

The downsampler and the fallback are verl's `downsample_cache` and the code
after its round loop (reference doc §2.3, §3); the advantages are verl's
GRPO advantage with and without the pool ("global") statistics (§4.1); the
estimation-based prior and its EMA history are the `hanze` branch's (§2.7).

Dimension legend:
  B: prompts in the step.
  K: prompts in the history.
  P: samples in one prompt's pool; G: rows kept from it (at most group_size).
"""

from collections.abc import Sequence
from typing import Any

import numpy as np

# Added to the std before dividing, and the floor of the pool std (verl).
STD_EPS = 1e-6


def exit_requirement(
  rule: str, group_size: int, min_positives: int = 1
) -> tuple[int, int]:
  """Positives and negatives a pool needs before the prompt may exit.

  For `balance` and `pos` this is the exit test itself. For the rules without
  an exit test (grpo, dapo, est) it is what makes a group informative: at
  least one sample of each side. The metrics count prompts short of either.

  Args:
    rule: the sampling rule.
    group_size: n, the final group size.
    min_positives: the `pos` exit threshold.

  Returns:
    (positives needed, negatives needed).
  """
  if rule == 'balance':
    return group_size // 2, group_size - group_size // 2
  if rule == 'pos':
    # pos needs no negative to exit; one is still needed for a nonzero
    # advantage, so "short of negatives" keeps its zero-gradient meaning.
    return min_positives, 1
  return 1, 1


def exits(
  rule: str,
  num_pos: np.ndarray,
  num_neg: np.ndarray,
  group_size: int,
  min_positives: int,
) -> np.ndarray:
  """The exit test on whole pools (bool [B]); monotone in the pool counts."""
  need_pos, need_neg = exit_requirement(rule, group_size, min_positives)
  if rule == 'pos':
    return num_pos >= need_pos
  return (num_pos >= need_pos) & (num_neg >= need_neg)


def downsample_counts(
  num_pos: int, num_neg: int, group_size: int, target_pos: int | None = None
) -> tuple[int, int]:
  """How many positives and negatives a group takes from a pool (verl §3).

  First `target_pos` positives (default ⌊n/2⌋) and as many negatives as fill
  the group, then, if the group is still short, a top-up from the positives
  when there are spare ones, else from the negatives.

  Args:
    num_pos: positives in the pool.
    num_neg: negatives in the pool.
    group_size: n.
    target_pos: positives wanted before the top-up.

  Returns:
    (positives taken, negatives taken); they sum to min(n, pool).
  """
  take = min(group_size, num_pos + num_neg)
  if target_pos is None:
    target_pos = group_size // 2
  tp = min(target_pos, num_pos)
  tn = min(take - tp, num_neg)
  if tp + tn < take:
    if num_pos > tp:
      tp = min(num_pos, take - tn)
    else:
      tn = min(num_neg, take - tp)
  return tp, tn


def pos_fallback_target(num_pos: int, num_neg: int, group_size: int) -> int:
  """Positives the pos fallback wants: ∝ the pool's pass rate, in [1, take-1].

  In practice the pool of a prompt that never exited under `pos` with the
  default threshold has no positive, so this ends in n negatives; it matters
  when `min_positives` > 1 (the co-author fork, §2.5).
  """
  pool = num_pos + num_neg
  take = min(group_size, pool)
  target = -(-num_pos * group_size // pool)  # ceil(pos / pool * n), exact.
  # torch.clamp(min=1, max=take-1) applies the upper bound last.
  return max(0, min(max(target, 1), take - 1))


def select_group(
  pool_ids: np.ndarray,
  positive: np.ndarray,
  group_size: int,
  target_pos: int | None = None,
) -> np.ndarray:
  """The kept sample ids of one prompt: positives first, then negatives.

  Args:
    pool_ids: int [P], the prompt's sample ids in generation order.
    positive: bool [P], which of them are positives.
    group_size: n.
    target_pos: see `downsample_counts`.

  Returns:
    int [G], the earliest `tp` positives followed by the earliest `tn`
    negatives, as the reference caches and slices them.
  """
  pos_ids = pool_ids[positive]
  neg_ids = pool_ids[~positive]
  tp, tn = downsample_counts(len(pos_ids), len(neg_ids), group_size, target_pos)
  return np.concatenate([pos_ids[:tp], neg_ids[:tn]])


def global_advantage(
  reward: np.ndarray,
  pool_pos: np.ndarray,
  pool_neg: np.ndarray,
  normalize_std: bool,
) -> np.ndarray:
  """Advantages against the whole pool of each row's prompt (verl global path).

  Args:
    reward: float [R], raw rewards of the kept rows.
    pool_pos: float [R], P of each row's prompt pool (binarised labels).
    pool_neg: float [R], Q of each row's prompt pool.
    normalize_std: divide by the pool's unbiased std (clamped) + eps.

  Returns:
    float [R]: r − P/(P+Q), optionally over (σ + 1e-6). A pool of at most one
    sample has μ = 0 and σ = 1, as in verl.
  """
  pool = pool_pos + pool_neg
  big = pool > 1
  safe = np.where(big, pool, 2.0)
  mean = np.where(big, pool_pos / safe, 0.0)
  # Unbiased std of P ones and Q zeros, in closed form.
  std = np.sqrt(pool_pos * pool_neg / (safe * (safe - 1.0)))
  std = np.where(big, np.maximum(std, STD_EPS), 1.0)
  adv = reward - mean
  if normalize_std:
    adv = adv / (std + STD_EPS)
  return adv


def local_advantage(reward: np.ndarray, normalize_std: bool) -> np.ndarray:
  """GRPO advantages within one kept group (verl local path, σ not clamped).

  Args:
    reward: float [G], raw rewards of one prompt's kept rows.
    normalize_std: divide by the group's unbiased std + eps.

  Returns:
    float [G]: (r − mean) / (std + 1e-6); a singleton group has μ = 0, σ = 1.
  """
  if len(reward) <= 1:
    mean, std = 0.0, 1.0
  else:
    mean, std = float(np.mean(reward)), float(np.std(reward, ddof=1))
  adv = reward - mean
  if normalize_std:
    adv = adv / (std + STD_EPS)
  return adv


# ---------------------------------------------------------------------------
# Estimation-based allocation (Est, §2.7): Beta prior + decayed history.


def empty_history() -> dict[str, np.ndarray]:
  """A history with no prompts: the format `sample_groups` reads and returns.

  Keys: `keys` [K] (the prompt keys, ints or strings), `n_pos` and `n_total`
  (float64 [K], decayed counts). Plain numpy arrays, so it checkpoints as is
  (for orbax use integer keys, e.g. a hash of the prompt tokens).
  """
  return {
    'keys': np.zeros((0,), np.int64),
    'n_pos': np.zeros((0,), np.float64),
    'n_total': np.zeros((0,), np.float64),
  }


def history_lookup(
  history: dict[str, Any] | None, keys: Sequence[Any]
) -> tuple[np.ndarray, np.ndarray]:
  """Decayed (n_pos, n_total) of each key (float [B]); unseen keys get zeros."""
  n_pos = np.zeros(len(keys), np.float64)
  n_total = np.zeros(len(keys), np.float64)
  if history is None or len(history['keys']) == 0:
    return n_pos, n_total
  index = {k: j for j, k in enumerate(np.asarray(history['keys']).tolist())}
  hist_pos = np.asarray(history['n_pos'], np.float64)
  hist_total = np.asarray(history['n_total'], np.float64)
  for i, key in enumerate(keys):
    j = index.get(key)
    if j is not None:
      n_pos[i], n_total[i] = hist_pos[j], hist_total[j]
  return n_pos, n_total


def history_update(
  history: dict[str, Any] | None,
  keys: Sequence[Any],
  call_pos: np.ndarray,
  call_total: np.ndarray,
  decay: float,
) -> dict[str, np.ndarray]:
  """Decays and adds: n ← decay·n_prev + n_call for this call's keys only.

  A key listed twice in one call is decayed once and gets both counts. Only
  the prompts seen in the call decay, as in the reference's per-uid loop:
  decaying every stored prompt at every step would erase a prompt's history
  between two epochs.

  Returns:
    A new history dict (the input is not modified); existing keys keep their
    order and new keys are appended in first-seen order.
  """
  old = empty_history() if history is None else history
  old_keys = np.asarray(old['keys']).tolist()
  n_pos = [float(x) for x in np.asarray(old['n_pos'])]
  n_total = [float(x) for x in np.asarray(old['n_total'])]
  index = {k: j for j, k in enumerate(old_keys)}
  decayed = set()
  for key, pos, total in zip(keys, call_pos, call_total, strict=True):
    j = index.get(key)
    if j is None:
      j = index[key] = len(old_keys)
      old_keys.append(key)
      n_pos.append(0.0)
      n_total.append(0.0)
    if j not in decayed:
      decayed.add(j)
      n_pos[j] *= decay
      n_total[j] *= decay
    n_pos[j] += float(pos)
    n_total[j] += float(total)
  keys_array = np.asarray(old_keys) if old_keys else empty_history()['keys']
  return {
    'keys': keys_array,
    'n_pos': np.asarray(n_pos, np.float64),
    'n_total': np.asarray(n_total, np.float64),
  }


def estimated_pass_rate(
  n_pos: np.ndarray, n_total: np.ndarray, prior_alpha: float, prior_beta: float
) -> np.ndarray:
  """Posterior mean p̂ = (α + n_pos) / (α + β + n_total) (float [B])."""
  return (prior_alpha + n_pos) / (prior_alpha + prior_beta + n_total)
