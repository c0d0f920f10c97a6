"""Slot scheduling for the adaptive controller: which prompt fills which slot.

A round is a fixed number of sampling slots S (the sampler's static batch).
Each function returns the per-prompt slot counts of one round; `layout` turns
counts into the int [S] `slot_prompt` vector the sampler reads, giving every
prompt a contiguous run of slots in prompt order (so a prompt's samples sit
next to each other, as in the reference's interleaved repeat) and marking the
unused tail idle (-1).

- `paper`: every active prompt gets exactly M slots, the rest idle
  (reference §2.2: the per-round batch shrinks; here it is padded instead).
- `refill`: all S slots shared as evenly as possible among the active
  prompts, capped per prompt, so no slot idles while a prompt can still use
  it: on a fixed-shape accelerator an idle slot costs as much as a live one.
- `est`: one round; every prompt one slot, the rest ∝ 1/p̂ (§2.7).

Dimension legend:
  S: slots per round.
  B: prompts in the step.
"""

import numpy as np

IDLE = -1


def layout(counts: np.ndarray, slots: int) -> np.ndarray:
  """Slot layout, int [S]: prompt i repeated counts[i] times, then idle."""
  used = int(counts.sum())
  if used > slots:
    raise ValueError(f'schedule asked for {used} slots, only {slots} exist')
  live = np.repeat(np.arange(len(counts)), counts)
  return np.concatenate([live, np.full(slots - used, IDLE)]).astype(np.int64)


def paper_counts(active: np.ndarray, samples_per_round: int) -> np.ndarray:
  """Paper schedule: M slots for each active prompt, none for the others."""
  return np.where(active, samples_per_round, 0).astype(np.int64)


def refill_counts(
  active: np.ndarray, pool_size: np.ndarray, cap: int, slots: int
) -> np.ndarray:
  """Refill schedule: all slots shared evenly among active prompts, capped.

  Water-filling: every active prompt gets min(room, L) slots for the largest
  level L that fits, where room = cap − pool; the slots left over (fewer
  than the prompts still under their cap) go one each to those prompts with
  the smallest pool, then the lowest index. So counts differ by at most one
  among uncapped prompts, and a slot idles only if every active prompt is at
  its cap.

  Args:
    active: bool [B], prompts that have not exited.
    pool_size: int [B], samples each prompt drew so far this step.
    cap: most samples one prompt may draw in a step.
    slots: S.
  """
  room = np.where(active, np.maximum(cap - pool_size, 0), 0).astype(np.int64)
  if room.sum() <= slots:
    return room
  # Largest level L with sum(min(room, L)) <= slots, by bisection on [0, S].
  lo, hi = 0, slots
  while lo < hi:
    mid = (lo + hi + 1) // 2
    if np.minimum(room, mid).sum() <= slots:
      lo = mid
    else:
      hi = mid - 1
  counts = np.minimum(room, lo)
  leftover = slots - int(counts.sum())
  under = np.flatnonzero(room > lo)
  # lexsort: last key is primary, so this orders by (pool size, index).
  order = under[np.lexsort((under, pool_size[under]))]
  counts[order[:leftover]] += 1
  return counts


def est_counts(pass_rate: np.ndarray, slots: int) -> np.ndarray:
  """Est budget: one slot each, the other S − B ∝ 1/max(p̂, 1e-6).

  Integer parts first, then one slot each by largest fractional part (ties
  to the lowest index), as the reference's budget split.

  Args:
    pass_rate: float [B], the estimated pass rate p̂ of each prompt.
    slots: S, at least B.
  """
  num_prompts = len(pass_rate)
  extra = slots - num_prompts
  weight = 1.0 / np.maximum(pass_rate, 1e-6)
  share = extra * weight / weight.sum()
  counts = np.floor(share).astype(np.int64)
  # Guard against float rounding pushing the floors past the budget.
  while counts.sum() > extra:
    counts[np.argmax(counts)] -= 1
  leftover = extra - int(counts.sum())
  frac = share - counts
  order = np.argsort(-frac, kind='stable')
  counts[order[:leftover]] += 1
  return counts + 1
