"""Round loops of the adaptive controller: draw, record, test, select.

`Recorder` calls the user's `draw` one round at a time, checks the rewards
and keeps every round's slots, rewards and the per-prompt pools (sample ids
in generation order). One `run_*` function per family of rules drives the
rounds and returns the kept groups as (prompt, sample ids) pairs; the
advantages and metrics are computed from them in `controller.py`.

Dimension legend:
  S: slots per round.   B: prompts in the step.
  P: samples in one prompt's pool.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ada_jax.adaptive import rules as rules_lib
from ada_jax.adaptive import schedule as sched

DrawFn = Callable[[np.ndarray], Any]
Group = tuple[int, np.ndarray]


class Recorder:
  """Calls `draw`, checks its result and keeps every round's slots and rewards."""

  def __init__(self, draw: DrawFn, num_prompts: int, slots: int, threshold: float):
    self.draw = draw
    self.num_prompts = num_prompts
    self.slots = slots
    self.threshold = threshold
    self.slot_prompt: list[np.ndarray] = []
    self.slot_reward: list[np.ndarray] = []
    # Per-prompt pools: sample ids and rewards in generation order.
    self.ids: list[list[int]] = [[] for _ in range(num_prompts)]
    self.rewards: list[list[float]] = [[] for _ in range(num_prompts)]
    self._flat: np.ndarray | None = None

  def round(self, slot_prompt: np.ndarray) -> np.ndarray:
    """Draws one round; returns float [S] rewards with idle slots zeroed."""
    reward = np.asarray(self.draw(slot_prompt.copy()), np.float64)
    if reward.shape != (self.slots,):
      raise ValueError(f'draw returned shape {reward.shape}, expected ({self.slots},)')
    live = slot_prompt >= 0
    if not np.all(np.isfinite(reward[live])):
      raise ValueError('draw returned a non-finite reward for a live slot')
    reward = np.where(live, reward, 0.0)
    base = len(self.slot_prompt) * self.slots
    for slot in np.flatnonzero(live):
      prompt = slot_prompt[slot]
      self.ids[prompt].append(base + int(slot))
      self.rewards[prompt].append(float(reward[slot]))
    self.slot_prompt.append(slot_prompt)
    self.slot_reward.append(reward)
    return reward

  def pool(self, prompt: int) -> np.ndarray:
    """The prompt's sample ids in generation order (int [P])."""
    return np.asarray(self.ids[prompt], np.int64)

  def counts(self) -> tuple[np.ndarray, np.ndarray]:
    """Positives and negatives over all pools so far (int [B] each)."""
    pos = np.array([sum(r > self.threshold for r in rs) for rs in self.rewards])
    size = np.array([len(rs) for rs in self.rewards])
    return pos.astype(np.int64), (size - pos).astype(np.int64)

  def reward_of(self, ids: np.ndarray) -> np.ndarray:
    """The rewards of the given sample ids (float, same shape as ids)."""
    if self._flat is None or len(self._flat) != len(self.slot_reward) * self.slots:
      self._flat = np.concatenate([np.zeros(0), *self.slot_reward])
    return self._flat[ids]


def run_grpo(rec: Recorder, group_size: int) -> list[Group]:
  """GRPO: one round, n slots per prompt (the rest idle), every sample kept."""
  counts = np.full(rec.num_prompts, group_size, np.int64)
  rec.round(sched.layout(counts, rec.slots))
  return [(i, rec.pool(i)) for i in range(rec.num_prompts)]


def run_elimination(
  rec: Recorder,
  rule: str,
  group_size: int,
  samples_per_round: int,
  max_rounds: int,
  schedule: str,
  opts: dict[str, Any],
) -> tuple[list[Group], np.ndarray]:
  """Reinforce-Ada rounds (pos, balance): exit tests, then downsampling."""
  num_prompts = rec.num_prompts
  active = np.ones(num_prompts, bool)
  exit_round = np.full(num_prompts, -1, np.int64)
  cap = max_rounds * samples_per_round
  min_pos = opts.get('min_positives', 1)
  for r in range(max_rounds):
    if not active.any():
      break
    num_pos, num_neg = rec.counts()
    if schedule == 'paper':
      counts = sched.paper_counts(active, samples_per_round)
    else:
      counts = sched.refill_counts(active, num_pos + num_neg, cap, rec.slots)
    if counts.sum() == 0:
      break  # Every active prompt is at its cap: more rounds draw nothing.
    rec.round(sched.layout(counts, rec.slots))
    num_pos, num_neg = rec.counts()
    # The test runs on the whole pool after all of the round's samples.
    done = active & rules_lib.exits(rule, num_pos, num_neg, group_size, min_pos)
    exit_round[done] = r
    active &= ~done
  num_pos, num_neg = rec.counts()
  groups = []
  for i in range(num_prompts):
    ids = rec.pool(i)
    target_pos = None
    if rule == 'pos' and exit_round[i] < 0:
      target_pos = rules_lib.pos_fallback_target(num_pos[i], num_neg[i], group_size)
    positive = rec.reward_of(ids) > rec.threshold
    groups.append((i, rules_lib.select_group(ids, positive, group_size, target_pos)))
  return groups, exit_round


def run_dapo(
  rec: Recorder, group_size: int, max_rounds: int, target: int
) -> tuple[list[Group], np.ndarray]:
  """DAPO dynamic sampling: try candidates n at a time, keep mixed groups."""
  num_prompts = rec.num_prompts
  exit_round = np.full(num_prompts, -1, np.int64)
  per_round = rec.slots // group_size
  groups: list[Group] = []
  next_candidate = 0
  for r in range(max_rounds):
    if len(groups) >= target or next_candidate >= num_prompts:
      break
    tried = np.arange(next_candidate, min(num_prompts, next_candidate + per_round))
    next_candidate += len(tried)
    counts = np.zeros(num_prompts, np.int64)
    counts[tried] = group_size
    rec.round(sched.layout(counts, rec.slots))
    num_pos, num_neg = rec.counts()
    for i in tried:
      if len(groups) < target and num_pos[i] > 0 and num_neg[i] > 0:
        groups.append((int(i), rec.pool(i)))
        exit_round[i] = r
  return groups, exit_round


def run_est(
  rec: Recorder,
  prompt_keys: Sequence[Any] | None,
  history: dict[str, Any] | None,
  opts: dict[str, Any],
) -> tuple[list[Group], dict[str, np.ndarray]]:
  """Est: one round with slots ∝ 1/p̂, then the history update."""
  num_prompts = rec.num_prompts
  keys = list(range(num_prompts)) if prompt_keys is None else list(prompt_keys)
  if len(keys) != num_prompts:
    raise ValueError(f'{len(keys)} prompt_keys for {num_prompts} prompts')
  n_pos, n_total = rules_lib.history_lookup(history, keys)
  p_hat = rules_lib.estimated_pass_rate(
    n_pos, n_total, opts['prior_alpha'], opts['prior_beta']
  )
  rec.round(sched.layout(sched.est_counts(p_hat, rec.slots), rec.slots))
  call_pos, call_neg = rec.counts()
  new_history = rules_lib.history_update(
    history, keys, call_pos, call_pos + call_neg, opts['decay']
  )
  return [(i, rec.pool(i)) for i in range(num_prompts)], new_history
