"""What a valid run config is: one rule per key, then the rules across keys.

`validate(c)` runs before a command writes anything (the main job, evaluate,
select_prompts), so a bad value costs a one-line error naming the key and
what it accepts, never a half-written run directory:

  config sampling.temperature=0.0: must be a float > 0 (the RL loss divides
  logits by it; greedy decoding is for evaluation)

`RULES` holds every leaf key a config in `configs/` may have; a leaf with no
rule is itself an error (tests/test_config_rules.py checks every config), so
a key added later has to say what it accepts. Keys missing from a config are
fine: the code reading them has a default. `CROSS_RULES` then check what no
single key can: divisibility of rows and slots, the mesh against the
devices, lengths against the model's positions, paths that must exist.

Part of the config boundary (`ada_jax.from_config`): the only modules
besides the commands that read a ConfigDict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any


class ConfigError(ValueError):
  """A config value (or a combination) that a run cannot use; one line."""


@dataclasses.dataclass(frozen=True)
class Rule:
  """What one key accepts.

  Attributes:
    kind: `int`, `float`, `str` or `bool` (an int is fine for a float).
    lo, hi: bounds; `lo_open` / `hi_open` exclude them.
    choices: the allowed values (strings compare case-sensitively).
    also: extra values allowed outside the bounds (e.g. -1 for a mesh axis).
    why: the reason, appended to the error.
    check: a further check, returning the problem or None.
  """

  kind: type
  lo: float | None = None
  hi: float | None = None
  lo_open: bool = False
  hi_open: bool = False
  choices: tuple[Any, ...] | None = None
  also: tuple[Any, ...] = ()
  why: str = ''
  check: Callable[[Any], str | None] | None = None

  def describe(self) -> str:
    """`an int >= 1`, `a float in (0, 1]`, `one of ('a', 'b')`, ..."""
    if self.choices is not None:
      return f'one of {self.choices}'
    article = 'an' if self.kind is int else 'a'
    name = f'{article} {self.kind.__name__}'
    if self.lo is not None and self.hi is not None:
      left, right = '(' if self.lo_open else '[', ')' if self.hi_open else ']'
      text = f'{name} in {left}{self.lo:g}, {self.hi:g}{right}'
    elif self.lo is not None:
      text = f'{name} {">" if self.lo_open else ">="} {self.lo:g}'
    elif self.hi is not None:
      text = f'{name} {"<" if self.hi_open else "<="} {self.hi:g}'
    else:
      text = name
    if self.also:
      text += ' or ' + ' or '.join(repr(a) for a in self.also)
    return text

  def problem(self, value: Any) -> str | None:
    """Why `value` breaks the rule, or None."""
    if value in self.also and type(value) is type(self.also[0]):
      return None
    ok_type = (
      isinstance(value, bool)
      if self.kind is bool
      else isinstance(value, int | float) and not isinstance(value, bool)
      if self.kind is float
      else isinstance(value, self.kind) and not isinstance(value, bool)
    )
    if not ok_type or (self.kind is float and not math.isfinite(value)):
      return f'must be {self.describe()}'
    if self.choices is not None and value not in self.choices:
      return f'must be {self.describe()}'
    too_low = self.lo is not None and (
      value <= self.lo if self.lo_open else value < self.lo
    )
    too_high = self.hi is not None and (
      value >= self.hi if self.hi_open else value > self.hi
    )
    if too_low or too_high:
      return f'must be {self.describe()}'
    return self.check(value) if self.check is not None else None


def _stop_ids_problem(value: str) -> str | None:
  from ada_jax import tokenizer as tokenizer_lib

  try:
    tokenizer_lib.parse_stop_ids(value)
  except ValueError:
    return "must be 'default', 'model' or comma-separated token ids"
  return None


def Int(lo: int | None = None, **kw: Any) -> Rule:  # noqa: N802 (a rule maker)
  """An int rule."""
  return Rule(int, lo=lo, **kw)


def Float(lo: float | None = None, hi: float | None = None, **kw: Any) -> Rule:  # noqa: N802
  """A float rule (ints accepted)."""
  return Rule(float, lo=lo, hi=hi, **kw)


def OneOf(*choices: Any, **kw: Any) -> Rule:  # noqa: N802
  """A rule accepting exactly these values."""
  return Rule(type(choices[0]), choices=tuple(choices), **kw)


STR = Rule(str)
BOOL = Rule(bool)


def _levels_check(value: str) -> str | None:
  from ada_jax import data

  try:
    data.parse_levels(value)
  except ValueError as e:
    return str(e).split(': ', 1)[-1]
  return None


def _rules() -> dict[str, Rule]:
  # Names of the allowed values live with their users; imported here, not at
  # module import, so that `--help` of the commands stays fast.
  from ada_jax import adaptive, attention, model, prompts
  from ada_jax.rl import loss, update
  from ada_jax.verifier import backends

  positive = Int(1)
  count = Int(0)
  axis = Int(1, also=(-1,), why='-1 takes the devices left over')
  return {
    'seed': Int(),
    'mesh.data': axis,
    'mesh.fsdp': axis,
    'mesh.tensor': Int(
      1,
      also=(-1, 0),
      why='-1 takes the devices left over; 0: the plan picks the smallest '
      'that fits (planner/layout.py)',
    ),
    'pod': Rule(str, why='a TPU slice (e.g. v5p-64) or empty', check=_pod_problem),
    'gpu': Rule(str, why='GPUs as NxCHIP (e.g. 8xh100) or empty', check=_gpu_problem),
    'model.max_position_embeddings': Int(0, why="0 keeps the checkpoint's"),
    'model.hf_path': STR,
    'model.tokenizer_path': STR,
    'model.hub_id': STR,  # Where `python -m ada_jax.stage` downloads it from.
    'model.init_from': STR,
    'model.dtype': OneOf('float32', 'bfloat16'),
    'model.param_dtype': OneOf('float32', 'bfloat16'),
    'model.attention': OneOf(*attention.IMPLEMENTATIONS),
    'model.remat': OneOf(*model.REMAT),
    'model.tiny.family': OneOf('qwen2', 'qwen3', 'llama'),
    'model.tiny.hidden': positive,
    'model.tiny.layers': positive,
    'model.tiny.heads': positive,
    'model.tiny.kv_heads': positive,
    'model.tiny.head_dim': Int(
      2, check=lambda v: 'must be even (RoPE)' if v % 2 else None
    ),
    'model.tiny.mlp': positive,
    'model.tiny.max_positions': positive,
    'data.max_problem_tokens': Int(0, why='0 keeps every problem'),
    'data.name': Rule(str, check=_dataset_check),
    'data.train_split': Rule(str, check=lambda v: None if v else 'must not be empty'),
    'data.eval_split': STR,
    'data.data_dir': STR,
    'data.manual_dir': STR,
    'data.template': OneOf(*prompts.TEMPLATES),
    'data.prompt_bucket': positive,
    'data.levels': Rule(str, check=_levels_check),
    'data.sft_share': Float(0.0, 1.0, hi_open=True),
    'data.balance_levels': BOOL,
    'rl.steps': count,
    'rl.rule': OneOf(*adaptive.RULES),
    'rl.schedule': OneOf(*adaptive.SCHEDULES),
    'rl.group_size': Int(2, why='a group of 1 has no baseline'),
    'rl.samples_per_round': positive,
    'rl.positive_threshold': Float(0.0, 1.0),
    'rl.prompts_per_step': positive,
    'rl.slots': positive,
    'rl.max_rounds': positive,
    'rl.target_groups': count,
    'rl.advantage': OneOf('', *adaptive.ADVANTAGES, why="'': the rule's default"),
    'rl.normalize_std': OneOf(
      '', 'true', 'false', '1', '0', 'yes', 'no', why="'': the rule's default"
    ),
    'rl.lr': Float(0.0),
    'rl.warmup': count,
    'rl.lr_schedule': OneOf(*update.LR_SCHEDULES),
    'rl.weight_decay': Float(0.0),
    'rl.grad_clip': Float(0.0, lo_open=True),
    'rl.mini_batch_rows': positive,
    'rl.micro_batch_rows': Int(0, why='0: one row per batch shard (data x fsdp)'),
    'rl.epochs': positive,
    'rl.clip_low': Float(0.0, 1.0, hi_open=True),
    'rl.clip_high': Float(0.0),
    'rl.clip_ratio_c': Float(
      1.0, lo_open=True, also=(0.0, 0), why='0 turns the dual clip off'
    ),
    'rl.loss_agg_mode': OneOf(*loss.AGG_MODES),
    'rl.entropy_coef': Float(),
    'rl.eval_every': count,
    'rl.eval_max_prompts': count,
    'rl.histogram_prompts': count,
    'rl.histogram_k': positive,
    'rl.eval_sampled_k': Int(0, why='0: greedy evaluation only'),
    'rl.max_nonfinite_steps': Int(
      1, why='consecutive steps with every update non-finite that stop the run'
    ),
    'sampling.max_new_tokens': positive,
    'sampling.temperature': Float(
      0.0,
      lo_open=True,
      why='the RL loss divides logits by it; greedy decoding is for evaluation',
    ),
    'sampling.top_p': Float(0.0, 1.0, lo_open=True),
    'sampling.top_k': Int(0, why='0 turns it off'),
    'sampling.stop_ids': Rule(str, check=_stop_ids_problem),
    'sampling.waves': Int(0, why="0: by the plan's rule (planner/layout.py)"),
    'sft.steps': count,
    'sft.batch_size': positive,
    'sft.lr': Float(0.0),
    'sft.warmup': count,
    'sft.lr_schedule': OneOf(*update.LR_SCHEDULES),
    'sft.boxed_share': Float(0.0, 1.0, lo_open=True),
    'sft.teacher': OneOf('answer', 'columns'),
    'sft.carry_drop': Float(0.0, 1.0, hi_open=True),
    'verifier.timeout_s': Float(0.0, lo_open=True),
    'verifier.workers': Int(0, why='0: one per CPU'),
    'verifier.backend': OneOf(
      *backends.BACKENDS, why="math_verify needs pip install -e '.[math_verify]'"
    ),
    'checkpoint.every': positive,
    'checkpoint.every_minutes': Float(
      0.0, why='minutes between time-based checkpoints; 0 turns them off'
    ),
    'checkpoint.keep': positive,
    'log.samples_per_step': count,
    'log.tensorboard': BOOL,
    'log.wandb_project': STR,
  }


def _dataset_check(name: str) -> str | None:
  from ada_jax.datasets import ada_math_local

  configs = [c.name for c in ada_math_local.CONFIGS]
  family, _, config = name.partition('/')
  if name in ('ada_arith', 'ada_columns') or (
    family == 'ada_math_local' and config in configs
  ):
    return None
  return f"must be 'ada_arith', 'ada_columns' or 'ada_math_local/<one of {configs}>'"


# The run's identity (issue 39): every key with a rule is in one class.
# COMPUTATION keys change what the run computes (the model's architecture
# and dtypes, the data by name, split, levels and filter, the variant and
# controller, the optimizer and schedule, lengths, sampling, SFT, the
# reward, the seed): a rerun of a run directory may not change them.
# Everything else (paths, logging, checkpoint and evaluation cadence, mesh,
# micro-batch, pod/gpu preset, attention implementation, remat, verifier workers and
# timeouts, stop guards) may change between the runs of one directory;
# each change is recorded in config_history.jsonl with its step. The model
# itself is compared by content (`from_config.identity`: a fingerprint of
# its config.json and weights), not by model.hf_path.
COMPUTATION = 'computation'
EXECUTION = 'execution'
_EXECUTION_KEYS = frozenset({
  'mesh.data', 'mesh.fsdp', 'mesh.tensor', 'pod', 'gpu',
  'model.hf_path', 'model.tokenizer_path', 'model.init_from', 'model.hub_id',
  'model.attention', 'model.remat',
  'data.data_dir', 'data.manual_dir',
  'rl.micro_batch_rows', 'rl.eval_every', 'rl.max_nonfinite_steps',
  'sampling.waves',
  'verifier.timeout_s', 'verifier.workers',
  'checkpoint.every', 'checkpoint.every_minutes', 'checkpoint.keep',
  'log.samples_per_step', 'log.tensorboard', 'log.wandb_project',
})  # fmt: skip


def key_classes() -> dict[str, str]:
  """Every key with a rule -> COMPUTATION or EXECUTION (see above)."""
  return {
    k: EXECUTION if k in _EXECUTION_KEYS else COMPUTATION for k in sorted(_rules())
  }


def leaves(c: Mapping[str, Any], prefix: str = '') -> Iterator[tuple[str, Any]]:
  """(dotted key, value) of every leaf of a (nested) config."""
  for key, value in c.items():
    if isinstance(value, Mapping) or hasattr(value, 'items'):
      yield from leaves(value, f'{prefix}{key}.')
    else:
      yield f'{prefix}{key}', value


def check_keys(c: Any) -> None:
  """Every leaf against its rule in `RULES`.

  Raises:
    ConfigError: the first bad value, or a leaf with no rule.
  """
  rules = _rules()
  for key, value in leaves(c):
    rule = rules.get(key)
    if rule is None:
      raise ConfigError(
        f'config {key}: no validation rule for this key (add one to '
        'ada_jax/config_rules.py)'
      )
    problem = rule.problem(value)
    if problem is not None:
      why = f' ({rule.why})' if rule.why and problem.startswith('must be') else ''
      raise ConfigError(f'config {key}={value!r}: {problem}{why}')


def rule_keys() -> frozenset[str]:
  """The keys that have a rule."""
  return frozenset(_rules())


# Rules across keys. Each takes the config and raises ConfigError.


def _mesh_sizes(c: Any, devices: int) -> dict[str, int]:
  """The mesh axes with -1 filled in; raises if they do not fit `devices`."""
  shape = {k: int(c.mesh[k]) for k in ('data', 'fsdp', 'tensor')}
  free = [k for k, v in shape.items() if v == -1]
  known = math.prod(v for v in shape.values() if v != -1)
  if len(free) > 1:
    raise ConfigError(
      f'config mesh: at most one axis may be -1, got {", ".join(f"mesh.{k}" for k in free)}'
    )
  if devices % known:
    raise ConfigError(
      f'config mesh={tuple(shape.values())}: the fixed axes ({known} devices) do '
      f'not divide the {devices} devices'
    )
  if free:
    shape[free[0]] = devices // known
  elif known != devices:
    raise ConfigError(
      f'config mesh={tuple(shape.values())} uses {known} devices; there are {devices}'
    )
  return shape


def dp_size(c: Any) -> int:
  """The data x fsdp size: row shards of a batch on this machine's devices."""
  import jax

  sizes = _mesh_sizes(c, jax.device_count())
  return sizes['data'] * sizes['fsdp']


def max_positions(c: Any) -> int:
  """The position limit: model.max_position_embeddings, HF config's, tiny's."""
  if c.model.get('max_position_embeddings', 0):
    return int(c.model.max_position_embeddings)
  if c.model.hf_path:
    from ada_jax import hf

    return int(hf.read_hf_config(c.model.hf_path).get('max_position_embeddings', 4096))
  return int(c.model.tiny.max_positions)


def _pod_problem(value: str) -> str | None:
  if not value:
    return None
  from ada_jax.infra import tpu_pods

  try:
    tpu_pods.pod(value)
  except ValueError as e:
    return str(e)
  return None


def _gpu_problem(value: str) -> str | None:
  if not value:
    return None
  from ada_jax.infra import gpu_hosts

  try:
    gpu_hosts.hosts(value)
  except ValueError as e:
    return str(e)
  return None


def _cross_model(c: Any) -> None:
  from etils import epath

  from ada_jax.infra import storage

  hf_path = c.model.hf_path
  if hf_path:
    try:
      found = storage.path(hf_path).joinpath('config.json').is_file()
    except storage.StorageError as e:
      raise ConfigError(f'config model.hf_path={hf_path!r}: {e}') from None
    if not found:
      raise ConfigError(
        f'config model.hf_path={hf_path!r}: no config.json there (pass a Hugging '
        'Face model directory, local or gs://)'
      )
  # An empty hf_path builds the random tiny model with the tiny task's
  # tokenizer, which only reads the `tiny` template: any other template
  # means a real model was meant and its directory is missing.
  if hf_path:
    from ada_jax import hf

    try:
      vocab = int(hf.read_hf_config(hf_path).get('vocab_size', 0))
      hf.check_vocab(hf_path, vocab, c.model.tokenizer_path or None)
    except hf.VocabError as e:
      raise ConfigError(f'config model.hf_path: {e}') from None
  if not hf_path and c.data.template != 'tiny':
    raise ConfigError(
      'config model.hf_path is empty: pass --config.model.hf_path=/path/to/'
      f'<HF model dir> (data.template={c.data.template!r} needs a real '
      "model's tokenizer), or use the config's runlocal arg for a tiny model"
    )
  if not hf_path:
    t = c.model.tiny
    if t.heads % t.kv_heads:
      raise ConfigError(
        f'config model.tiny.kv_heads={t.kv_heads}: must divide model.tiny.heads={t.heads}'
      )
  init_from = c.model.get('init_from', '')
  if init_from and not (epath.Path(init_from) / 'checkpoints').is_dir():
    raise ConfigError(
      f'config model.init_from={init_from!r}: no checkpoints/ directory there '
      '(pass the workdir of a finished run)'
    )


def _cross_data(c: Any) -> None:
  from ada_jax import data
  from ada_jax.datasets import ada_arith, ada_columns

  levels = data.parse_levels(c.data.get('levels', ''))
  ladders = {
    'ada_arith': len(ada_arith.LEVELS),
    'ada_columns': ada_columns.MAX_CARRIES + 1,
  }
  if levels is not None and c.data.name in ladders:
    known = set(range(ladders[c.data.name]))
    if not levels & known:
      raise ConfigError(
        f'config data.levels={c.data.levels!r} keeps no example of {c.data.name} '
        f'(its levels: {sorted(known)}); pass --config.data.levels= for all'
      )
  sft = c.get('sft') or {}
  if sft.get('teacher', 'answer') == 'columns' and c.data.name != 'ada_columns':
    raise ConfigError(
      "config sft.teacher='columns' writes worked solutions of ada_columns "
      f'problems; data.name is {c.data.name!r}'
    )
  limit = max_positions(c)
  total = c.data.prompt_bucket + c.sampling.max_new_tokens
  if total > limit:
    raise ConfigError(
      f'config data.prompt_bucket + sampling.max_new_tokens = {total} exceeds the '
      f"model's position limit {limit}"
    )


def _cross_rl(c: Any) -> None:
  import jax

  from ada_jax import adaptive

  rl = c.rl
  if rl.rule == 'balance' and rl.group_size % 2:
    raise ConfigError(
      f'config rl.group_size={rl.group_size}: balance needs an even group size'
    )
  if rl.rule in ('pos', 'balance') and rl.samples_per_round < rl.group_size:
    raise ConfigError(
      f'config rl.samples_per_round={rl.samples_per_round} is smaller than '
      f'rl.group_size={rl.group_size}'
    )
  dp = dp_size(c)
  if rl.slots % dp:
    raise ConfigError(
      f'config rl.slots={rl.slots} does not divide by the data-parallel size {dp}'
    )
  if rl.prompts_per_step % jax.process_count():
    raise ConfigError(
      f'config rl.prompts_per_step={rl.prompts_per_step} does not divide across '
      f'{jax.process_count()} hosts'
    )
  rows = adaptive.max_rows(
    rl.prompts_per_step,
    rule=rl.rule,
    group_size=rl.group_size,
    slots=rl.slots,
    target_groups=rl.target_groups or None,
  )
  if rows % rl.mini_batch_rows or rl.mini_batch_rows % rl.micro_batch_rows:
    raise ConfigError(
      f'config rl.mini_batch_rows={rl.mini_batch_rows} must divide the {rows} '
      f'training rows and be a multiple of rl.micro_batch_rows={rl.micro_batch_rows}'
    )
  # A round's slots in W waves (sampler.sample_round): each wave's S/W slots
  # split over the row shards and into whole prompt groups.
  waves = int(c.sampling.get('waves', 0))
  group = adaptive.slot_group(
    rl.rule, rl.schedule, rl.samples_per_round, rl.group_size, rl.slots
  )
  if waves > 1 and (rl.slots % waves or (rl.slots // waves) % math.lcm(dp, group)):
    raise ConfigError(
      f'config sampling.waves={waves}: rl.slots={rl.slots} must split into {waves} '
      f'waves of a multiple of the data-parallel size {dp} and of the {group} '
      'slots a prompt takes per round'
    )
  # Every micro-batch is split over the row shards (update.py): m/dp rows per
  # device. A remainder would leave the micro-batch replicated, every device
  # computing all of it.
  if rl.micro_batch_rows % dp:
    raise ConfigError(
      f'config rl.micro_batch_rows={rl.micro_batch_rows} must be a multiple of the '
      f'data-parallel size (mesh data x fsdp) {dp}'
    )


def target_platform(c: Any) -> str:
  """The platform a config's programs are built for (`infra.platforms` name).

  A `tpu=` preset's TPU, a `gpu=` preset's GPU, else the running backend.
  """
  from ada_jax.infra import platforms

  if c.get('pod', ''):
    return 'tpu'
  if c.get('gpu', ''):
    return 'gpu'
  return platforms.name('')


def _cross_platform(c: Any) -> None:
  from ada_jax.infra import platforms

  attention = c.model.get('attention', 'auto')
  need = platforms.KERNELS.get(attention)
  if need is None:
    return
  if attention == 'cudnn' and c.model.get('dtype', 'float32') == 'float32':
    raise ConfigError(
      "config model.attention='cudnn' needs model.dtype='bfloat16' (cuDNN's fused "
      "attention takes bf16/fp16 only); use 'auto', which takes chunked in fp32"
    )
  target = target_platform(c)
  if target != need:
    # Off its platform the kernel runs only as a test stand-in (Pallas
    # interpret mode, XLA's dense reference): far slower than 'chunked'.
    raise ConfigError(
      f'config model.attention={attention!r} is the {need.upper()} kernel; this '
      f"config's programs are built for {target} (no "
      f'{"tpu=" if need == "tpu" else "gpu="} preset, running on {platforms.name("")}): '
      "use 'auto'"
    )


CROSS_RULES: tuple[Callable[[Any], None], ...] = (
  _cross_platform,
  _cross_model,
  _cross_data,
  _cross_rl,
)


def validate(c: Any, resolve: Callable[[Any], None] | None = None) -> None:
  """Every key's rule, then the rules across keys; nothing is written.

  Args:
    c: the config.
    resolve: fills the keys left to a rule (`mesh.tensor` or
      `rl.micro_batch_rows` of 0: `from_config.resolve_layout`), after the
      keys' own rules and the model's, before the rules across keys.

  Raises:
    ConfigError: (a ValueError) one line naming the key and what it accepts.
  """
  check_keys(c)
  _cross_model(c)
  if resolve is not None:
    resolve(c)
  for rule in CROSS_RULES:
    rule(c)
