"""Adaptive sampling controller: elimination rounds over fixed sampling slots.

`sample_groups` runs one training step's sampling. It decides which prompt
fills which of the S slots of each round, calls `draw(slot_prompt)` (the
sampler and verifier, or a fake in tests) for the rewards, applies the
rule's exit test, and returns the training groups with their advantages as
`Groups`. It is pure numpy and deterministic for a given draw: every choice
is made in generation order (increasing sample id = round·S + slot), as in
the reference (`../shared/docs/reinforce_ada_reference.md` §2-4, §11).

Rules:
  grpo: one round, n samples per prompt, all kept, local (GRPO) advantages.
  pos / balance: Reinforce-Ada; up to N rounds of M samples per active
    prompt; a prompt exits once its pool holds ≥ min_positives positives
    (pos) or ≥ ⌊n/2⌋ positives and ≥ n − ⌊n/2⌋ negatives (balance); its group
    is then downsampled to n, and prompts that never exit fall back to the
    best group their pool allows; pool-baseline ("global") advantages.
  dapo: passive filtering; the prompts are candidates, tried n at a time in
    index order, and only mixed groups are kept, up to target_groups.
  est: one round, slots ∝ 1/p̂ from a Beta prior and a decayed per-prompt
    history; every sample kept.

Row budget: R ≤ `max_rows(...)` (B·n, target_groups·n or S); the trainer pads
to it with zero-weight rows (`Groups.padded`), so device shapes never change.

`ControllerSettings` holds a run's rule and knobs (checked once, when it is
built) and calls `sample_groups` and `max_rows` with them.

Modules of this package: `rounds` (round loops), `schedule` (slot layouts),
`rules` (exit tests, downsampling, advantages, est prior).

Dimension legend:
  S: slots per round.   B: prompts in the step.   R: kept training rows.
  n (group_size), M (samples_per_round), N (max_rounds).
"""

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ada_jax.adaptive import rounds as rounds_lib
from ada_jax.adaptive import rules as rules_lib

RULES = ('grpo', 'pos', 'balance', 'dapo', 'est')
SCHEDULES = ('paper', 'refill')
ADVANTAGES = ('global', 'local')

# Per-rule keyword options and their defaults (`**rule_options`).
RULE_OPTIONS: dict[str, dict[str, Any]] = {
  'grpo': {},
  'pos': {'min_positives': 1},
  'balance': {},
  'dapo': {'target_groups': None},  # None: half the candidates.
  'est': {'prior_alpha': 1.0, 'prior_beta': 16.0, 'decay': 0.9},
}

DrawFn = rounds_lib.DrawFn


@dataclasses.dataclass(frozen=True)
class Groups:
  """One step's training rows and sampling statistics.

  Attributes:
    prompt_index: int [R], prompt of each kept row. Rows are grouped by
      prompt in prompt order; within a group, pos/balance put the positives
      first (the reference's order, generation order within a side), the
      other rules keep generation order.
    sample_id: int [R], round·S + slot of each row: the trainer gathers the
      row from its [N, S, ...] rollout buffer at (id // S, id % S).
    reward: float [R], raw reward of each row.
    advantage: float [R].
    num_pos: int [B], positives in each prompt's whole pool.
    num_neg: int [B], negatives in each prompt's whole pool.
    exit_round: int [B], 0-based round in which the prompt completed (exit
      test passed; for grpo/est the single round; for dapo the round its
      group was kept), -1 if it never did (fallback, filtered or untried).
    rounds: rounds run (draw calls).
    samples_drawn: live slots over all rounds (the inference cost).
    max_rows: R_max, the fixed row budget the trainer pads to.
    slot_prompt: int [rounds, S], the schedule that was drawn (-1 idle).
    slot_reward: float [rounds, S], the rewards drawn (0 on idle slots).
    metrics: per-step metrics; Python ints and floats, except
      `exited_per_round`, a list of ints.
    history: the updated est history (see `rules.empty_history`);
      for other rules the `history` argument, unchanged.
  """

  prompt_index: np.ndarray
  sample_id: np.ndarray
  reward: np.ndarray
  advantage: np.ndarray
  num_pos: np.ndarray
  num_neg: np.ndarray
  exit_round: np.ndarray
  rounds: int
  samples_drawn: int
  max_rows: int
  slot_prompt: np.ndarray
  slot_reward: np.ndarray
  metrics: dict[str, Any]
  history: dict[str, np.ndarray] | None

  @property
  def num_rows(self) -> int:
    """R, the number of real training rows."""
    return len(self.prompt_index)

  def padded(self, max_rows: int | None = None) -> dict[str, np.ndarray]:
    """Rows padded to a fixed count with zero-weight rows.

    Padding rows point at sample 0 of prompt 0 (valid gather indices) with
    advantage 0 and weight 0, so a loss that multiplies by `weight` ignores
    them.

    Args:
      max_rows: rows to pad to; default `self.max_rows`.

    Returns:
      Dict of [max_rows] arrays: `prompt_index`, `sample_id` (int32),
      `reward`, `advantage`, `weight` (float32).
    """
    size = self.max_rows if max_rows is None else max_rows
    if self.num_rows > size:
      raise ValueError(f'{self.num_rows} rows do not fit in {size}')
    pad = size - self.num_rows

    def fill(x: np.ndarray, dtype: Any) -> np.ndarray:
      return np.concatenate([x.astype(dtype), np.zeros(pad, dtype)])

    return {
      'prompt_index': fill(self.prompt_index, np.int32),
      'sample_id': fill(self.sample_id, np.int32),
      'reward': fill(self.reward, np.float32),
      'advantage': fill(self.advantage, np.float32),
      'weight': fill(np.ones(self.num_rows), np.float32),
    }


def max_rows(
  num_prompts: int,
  *,
  rule: str,
  group_size: int,
  slots: int,
  target_groups: int | None = None,
) -> int:
  """R_max: the most training rows `sample_groups` can return.

  B·n for grpo, pos and balance (exactly that: no prompt is dropped),
  target_groups·n for dapo, S for est.
  """
  if rule == 'dapo':
    return _target_groups(num_prompts, target_groups) * group_size
  if rule == 'est':
    return slots
  if rule in RULES:
    return num_prompts * group_size
  raise ValueError(f'unknown rule {rule!r}; expected one of {RULES}')


def slot_group(
  rule: str, schedule: str, samples_per_round: int, group_size: int, slots: int
) -> int:
  """`ControllerSettings.slot_group` of these settings (see there)."""
  if rule in ('pos', 'balance') and schedule == 'paper':
    m = samples_per_round
  elif rule in ('grpo', 'dapo'):
    m = group_size
  else:
    m = 1
  return m if slots % m == 0 else 1


def sample_groups(
  num_prompts: int,
  draw: DrawFn,
  *,
  rule: str,
  group_size: int,
  samples_per_round: int,
  max_rounds: int,
  slots: int,
  schedule: str = 'paper',
  advantage: str | None = None,
  normalize_std: bool | None = None,
  positive_threshold: float = 0.7,
  seed: int = 0,
  prompt_keys: Sequence[Any] | None = None,
  history: dict[str, Any] | None = None,
  **rule_options: Any,
) -> Groups:
  """Runs one step of adaptive sampling and returns the training groups.

  Args:
    num_prompts: B, the prompts of the step (dapo: the candidates).
    draw: called once per round with int [S] `slot_prompt` (the prompt each
      slot samples, -1 idle); returns float [S] rewards (idle ones ignored).
      A reward > `positive_threshold` is a positive.
    rule: 'grpo', 'pos', 'balance', 'dapo' or 'est'.
    group_size: n, rows kept per prompt (grpo, pos, balance, dapo).
    samples_per_round: M, samples per active prompt per round (pos, balance).
    max_rounds: N, most rounds (pos, balance, dapo); the refill cap is N·M.
    slots: S, sampling slots per round.
    schedule: 'paper' (M slots per active prompt, the rest idle) or
      'refill' (every round, round 1 included, all S slots shared evenly
      among the active prompts up to the N·M cap; with S = B·M its round 1
      is paper's). pos and balance only.
    advantage: 'global' (pool baseline) or 'local' (GRPO, kept group); None
      picks the rule's default: local for grpo and dapo, global otherwise.
    normalize_std: divide advantages by the std + 1e-6; None picks the
      reference default: True for local, False for global.
    positive_threshold: τ.
    seed: accepted for reproducibility of the contract; every choice the
      current rules make is deterministic in generation order, so no rule
      draws random numbers.
    prompt_keys: stable keys of the prompts (est history); default 0..B-1.
    history: est history from a previous call (`Groups.history`).
    **rule_options: pos: `min_positives` (1); dapo: `target_groups` (B // 2);
      est: `prior_alpha` (1), `prior_beta` (16), `decay` (0.9).

  Returns:
    The `Groups` of the step.

  Raises:
    ValueError: an unknown rule, schedule, advantage or option, a slot
      budget too small for the rule, or a malformed draw result.
  """
  del seed  # See the docstring: no rule is randomised.
  opts = _check_args(
    num_prompts,
    rule,
    group_size,
    samples_per_round,
    max_rounds,
    slots,
    schedule,
    advantage,
    rule_options,
  )
  if advantage is None:
    advantage = 'local' if rule in ('grpo', 'dapo') else 'global'
  if normalize_std is None:
    normalize_std = advantage == 'local'
  rec = rounds_lib.Recorder(draw, num_prompts, slots, positive_threshold)
  out_history = history
  if rule in ('pos', 'balance'):
    groups, exit_round = rounds_lib.run_elimination(
      rec, rule, group_size, samples_per_round, max_rounds, schedule, opts
    )
    planned = max_rounds
  elif rule == 'grpo':
    groups = rounds_lib.run_grpo(rec, group_size)
    exit_round = np.zeros(num_prompts, np.int64)
    planned = 1
  elif rule == 'dapo':
    target = _target_groups(num_prompts, opts['target_groups'])
    groups, exit_round = rounds_lib.run_dapo(rec, group_size, max_rounds, target)
    planned = max_rounds
  else:
    groups, out_history = rounds_lib.run_est(rec, prompt_keys, history, opts)
    exit_round = np.zeros(num_prompts, np.int64)
    planned = 1
  return _finish(
    rec,
    rule,
    groups,
    exit_round,
    advantage,
    normalize_std,
    planned,
    group_size,
    opts.get('min_positives', 1),
    max_rows(
      num_prompts,
      rule=rule,
      group_size=group_size,
      slots=slots,
      target_groups=opts.get('target_groups'),
    ),
    out_history,
  )


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
  """A run's controller: the rule and its knobs, the same at every step.

  The keyword arguments of `sample_groups` that do not change between steps
  (see there for their meaning); `rule_options` are its `**rule_options`.
  Checked on construction with the errors `sample_groups` gives; the checks
  that need the number of prompts (slot budgets) run with the step, in
  `sample_groups`.
  """

  rule: str
  group_size: int
  samples_per_round: int
  max_rounds: int
  slots: int
  schedule: str = 'paper'
  advantage: str | None = None
  normalize_std: bool | None = None
  positive_threshold: float = 0.7
  rule_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self) -> None:
    _check_args(
      None,
      self.rule,
      self.group_size,
      self.samples_per_round,
      self.max_rounds,
      self.slots,
      self.schedule,
      self.advantage,
      dict(self.rule_options),
    )
    # A copy of its own: the caller's dict may change, these settings not.
    object.__setattr__(self, 'rule_options', dict(self.rule_options))

  @property
  def slot_group(self) -> int:
    """m: every round's slots come in runs of m per prompt, aligned at 0, m, 2m...

    The sampler's `group` (a prompt's keys read once per m slots). The
    layouts put each prompt's slots side by side in prompt order: the paper
    schedule gives every active prompt M slots, grpo and dapo n, so each
    aligned run of m slots continues one prompt or idles. refill and est
    give prompts uneven counts: 1.
    """
    return slot_group(
      self.rule, self.schedule, self.samples_per_round, self.group_size, self.slots
    )

  def max_rows(self, num_prompts: int) -> int:
    """R_max of a step of `num_prompts` prompts (see `max_rows`)."""
    return max_rows(
      num_prompts,
      rule=self.rule,
      group_size=self.group_size,
      slots=self.slots,
      target_groups=self.rule_options.get('target_groups'),
    )

  def sample_groups(
    self,
    num_prompts: int,
    draw: DrawFn,
    *,
    seed: int = 0,
    prompt_keys: Sequence[Any] | None = None,
    history: dict[str, Any] | None = None,
  ) -> Groups:
    """`sample_groups` with these settings: one step's training groups."""
    return sample_groups(
      num_prompts,
      draw,
      rule=self.rule,
      group_size=self.group_size,
      samples_per_round=self.samples_per_round,
      max_rounds=self.max_rounds,
      slots=self.slots,
      schedule=self.schedule,
      advantage=self.advantage,
      normalize_std=self.normalize_std,
      positive_threshold=self.positive_threshold,
      seed=seed,
      prompt_keys=prompt_keys,
      history=history,
      **self.rule_options,
    )


def _finish(
  rec: rounds_lib.Recorder,
  rule: str,
  groups: list[rounds_lib.Group],
  exit_round: np.ndarray,
  advantage: str,
  normalize_std: bool,
  planned_rounds: int,
  group_size: int,
  min_positives: int,
  row_budget: int,
  history: dict[str, Any] | None,
) -> Groups:
  """Advantages, flat rows and metrics from the kept groups."""
  num_pos, num_neg = rec.counts()
  sample_id = np.concatenate([np.zeros(0, np.int64)] + [g for _, g in groups])
  prompt_index = np.concatenate(
    [np.zeros(0, np.int64)] + [np.full(len(g), i, np.int64) for i, g in groups]
  )
  reward = rec.reward_of(sample_id)
  if advantage == 'global':
    adv = rules_lib.global_advantage(
      reward,
      num_pos[prompt_index].astype(np.float64),
      num_neg[prompt_index].astype(np.float64),
      normalize_std,
    )
  else:
    parts = [
      rules_lib.local_advantage(rec.reward_of(g), normalize_std) for _, g in groups
    ]
    adv = np.concatenate([np.zeros(0), *parts])
  slot_prompt = np.stack(rec.slot_prompt)
  slot_reward = np.stack(rec.slot_reward)
  metrics = _metrics(
    rec,
    rule,
    slot_prompt,
    slot_reward,
    groups,
    adv,
    reward,
    exit_round,
    planned_rounds,
    rules_lib.exit_requirement(rule, group_size, min_positives),
    row_budget,
  )
  return Groups(
    prompt_index=prompt_index,
    sample_id=sample_id,
    reward=reward,
    advantage=adv,
    num_pos=num_pos,
    num_neg=num_neg,
    exit_round=exit_round,
    rounds=len(slot_prompt),
    samples_drawn=int((slot_prompt >= 0).sum()),
    max_rows=row_budget,
    slot_prompt=slot_prompt,
    slot_reward=slot_reward,
    metrics=metrics,
    history=history,
  )


def _metrics(
  rec: rounds_lib.Recorder,
  rule: str,
  slot_prompt: np.ndarray,
  slot_reward: np.ndarray,
  groups: list[rounds_lib.Group],
  adv: np.ndarray,
  reward: np.ndarray,
  exit_round: np.ndarray,
  planned_rounds: int,
  need: tuple[int, int],
  row_budget: int,
) -> dict[str, Any]:
  """Reference §8.1 counters under honest names, as Python numbers."""
  num_pos, num_neg = rec.counts()
  pool = num_pos + num_neg
  tried = pool > 0
  rounds, slots = slot_prompt.shape
  live = int((slot_prompt >= 0).sum())
  # Round-1 samples are i.i.d. from the policy and every prompt drawn in
  # round 1 counts once, whatever its share of slots: unbiased for every rule.
  first = slot_prompt[0] >= 0
  per_prompt_sum = np.bincount(
    slot_prompt[0][first], slot_reward[0][first], minlength=rec.num_prompts
  )
  per_prompt_n = np.bincount(slot_prompt[0][first], minlength=rec.num_prompts)
  drawn = per_prompt_n > 0
  zero = np.abs(adv) <= 1e-12
  zero_groups, start = 0, 0
  for _, g in groups:
    zero_groups += bool(zero[start : start + len(g)].all())
    start += len(g)
  exited = [int((exit_round == r).sum()) for r in range(planned_rounds)]
  return {
    'rounds': rounds,
    'samples_drawn': live,
    'slots_live': live,
    'slots_idle': rounds * slots - live,
    'slot_utilization': live / max(rounds * slots, 1),
    'exited_per_round': exited,
    'prompts': rec.num_prompts,
    'prompts_tried': int(tried.sum()),
    'prompts_exited': int((exit_round >= 0).sum()),
    'prompts_not_exited': int((tried & (exit_round < 0)).sum()),
    'prompts_short_pos': int((tried & (num_pos < need[0])).sum()),
    'prompts_short_neg': int((tried & (num_neg < need[1])).sum()),
    'prompts_no_pos': int((tried & (num_pos == 0)).sum()),
    'prompts_no_neg': int((tried & (num_neg == 0)).sum()),
    'pool_size_mean': float(pool[tried].mean()) if tried.any() else 0.0,
    'reward_round1_mean': float(np.mean(per_prompt_sum[drawn] / per_prompt_n[drawn])),
    'reward_batch_mean': float(reward.mean()) if len(reward) else 0.0,
    'rows': len(reward),
    'rows_max': row_budget,
    'groups': len(groups),
    'zero_adv_frac': float(zero.mean()) if len(zero) else 0.0,
    'zero_adv_group_frac': zero_groups / max(len(groups), 1),
    'adv_abs_mean': float(np.abs(adv).mean()) if len(adv) else 0.0,
  }


def _target_groups(num_prompts: int, target_groups: int | None) -> int:
  return max(1, num_prompts // 2) if target_groups is None else int(target_groups)


def _check_args(
  num_prompts: int | None,
  rule: str,
  group_size: int,
  samples_per_round: int,
  max_rounds: int,
  slots: int,
  schedule: str,
  advantage: str | None,
  rule_options: dict[str, Any],
) -> dict[str, Any]:
  """Validates the arguments; returns the rule's options with defaults.

  `num_prompts` None (settings without a step): the checks that need it
  are skipped.
  """
  if rule not in RULES:
    raise ValueError(f'unknown rule {rule!r}; expected one of {RULES}')
  if schedule not in SCHEDULES:
    raise ValueError(f'unknown schedule {schedule!r}; expected one of {SCHEDULES}')
  if advantage is not None and advantage not in ADVANTAGES:
    raise ValueError(f'unknown advantage {advantage!r}; expected one of {ADVANTAGES}')
  unknown = set(rule_options) - set(RULE_OPTIONS[rule])
  if unknown:
    raise ValueError(
      f'unknown options {sorted(unknown)} for rule {rule!r}; '
      f'it takes {sorted(RULE_OPTIONS[rule])}'
    )
  opts = {**RULE_OPTIONS[rule], **rule_options}
  sizes = [] if num_prompts is None else [('num_prompts', num_prompts)]
  for name, value in [
    *sizes,
    ('group_size', group_size),
    ('max_rounds', max_rounds),
    ('slots', slots),
    ('samples_per_round', samples_per_round),
  ]:
    if int(value) != value or value < 1:
      raise ValueError(f'{name} must be a positive integer, got {value!r}')
  if rule in ('pos', 'balance'):
    if samples_per_round < group_size:
      raise ValueError(
        f'samples_per_round ({samples_per_round}) must be >= group_size '
        f'({group_size}) so every exit can fill a group'
      )
    if num_prompts is not None and slots < num_prompts * samples_per_round:
      raise ValueError(
        f'slots ({slots}) must be >= num_prompts * samples_per_round '
        f'({num_prompts} * {samples_per_round}) for rule {rule!r}'
      )
    if int(opts.get('min_positives', 1)) < 1:
      raise ValueError('min_positives must be >= 1')
    return opts
  if schedule != 'paper':
    raise ValueError(
      f"rule {rule!r} defines its own rounds; schedule must be 'paper', got {schedule!r}"
    )
  step = num_prompts is not None
  if rule == 'grpo' and step and slots < num_prompts * group_size:
    raise ValueError(
      f'slots ({slots}) must be >= num_prompts * group_size '
      f'({num_prompts} * {group_size}) for rule grpo'
    )
  if rule == 'dapo':
    if slots < group_size:
      raise ValueError(f'slots ({slots}) must be >= group_size ({group_size}) for dapo')
    given = opts['target_groups'] is not None
    if (step or given) and _target_groups(num_prompts or 0, opts['target_groups']) < 1:
      raise ValueError('target_groups must be >= 1')
  if rule == 'est':
    if step and slots < num_prompts:
      raise ValueError(
        f'slots ({slots}) must be >= num_prompts ({num_prompts}) for est'
      )
    if not 0.0 <= opts['decay'] <= 1.0:
      raise ValueError(f'decay must be in [0, 1], got {opts["decay"]}')
  return opts
