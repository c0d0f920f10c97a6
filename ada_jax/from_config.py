r"""The config boundary: a ConfigDict in, the run's objects out.

Every command (`main`, `evaluate`, `export`, `select_prompts`, `plan`,
`sweep`) goes through here; below this module nothing reads a ConfigDict,
everything takes typed settings. In order of use:

- `load(spec, overrides)`: `configs/NAME.py[:arg]` plus `--config.key=value`
  overrides -> a locked ConfigDict; a missing file, an unknown key or a bad
  value is a one-line `ConfigError`.
- `validate(c)`: every key and combination (`config_rules`), before
  anything is written.
- `tokenizer(c, ...)`, `model_config(c, ...)`: the policy's tokenizer and
  shapes.
- `scorer(c, tok)`: the verifier's settings bound once (`scoring.Scorer`),
  for the trainer and the commands that score samples; `verifier_backend(c)`
  the grader it uses.
- `identity(c, workdir, extend_steps)`: a rerun against the run's recorded
  config: a changed computation key is a ConfigError naming the keys and
  both values; the other keys' changes and `--extend-steps` come back to be
  recorded in `config_history.jsonl`.
- `trainer(c, workdir)`: mesh, data, model, settings (the controller's as
  `adaptive.ControllerSettings`) and the Trainer, resumed from the
  workdir's latest checkpoint, or started over with the earlier run files
  set aside (`run_dir.set_aside`).
- `policy(c, checkpoint)`: a run's latest params (or an HF directory) in the
  sampling layout for evaluation and prompt selection, read-only: nothing in
  the run directory is written.

Dimension legend: none (no arrays here).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import importlib.util
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ada_jax import config_rules
from ada_jax.config_rules import ConfigError
from ada_jax.infra import run_dir

if TYPE_CHECKING:  # jax and the model are imported lazily: `--help` stays fast.
  from ada_jax import adaptive
  from ada_jax import model as model_lib
  from ada_jax import tokenizer as tokenizer_lib
  from ada_jax.rl import scoring
  from ada_jax.rl import trainer as trainer_lib

__all__ = ['ConfigError']

_TRUE, _FALSE = ('true', 't', '1', 'yes'), ('false', 'f', '0', 'no')


def _module(path: str) -> Any:
  spec = importlib.util.spec_from_file_location(
    f'ada_config_{os.path.splitext(os.path.basename(path))[0]}', path
  )
  if spec is None or spec.loader is None:
    raise ConfigError(f'--config {path}: not a Python file')
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
  except Exception as e:
    raise ConfigError(
      f'--config {path}: cannot import it ({type(e).__name__}: {e})'
    ) from None
  if not callable(getattr(module, 'get_config', None)):
    raise ConfigError(f'--config {path}: defines no get_config()')
  return module


def _parse(key: str, text: str, old: Any) -> Any:
  """`text` as the type of the value it replaces (as ml_collections does)."""
  if isinstance(old, bool):
    if text.lower() in _TRUE:
      return True
    if text.lower() in _FALSE:
      return False
    raise ConfigError(f'--config.{key}={text}: expected true or false')
  if isinstance(old, int | float) or old is None or isinstance(old, tuple | list):
    try:
      if isinstance(old, int):
        return int(text)
      if isinstance(old, float):
        return float(text)
      return ast.literal_eval(text)
    except (ValueError, SyntaxError):
      want = type(old).__name__ if old is not None else 'a Python literal'
      raise ConfigError(f'--config.{key}={text}: expected {want}') from None
  return text


def apply_override(c: Any, flag: str) -> None:
  """One `--config.a.b=value` onto ConfigDict `c` (unknown key: ConfigError)."""
  body = flag.removeprefix('--')
  if not body.startswith('config.') or '=' not in body:
    raise ConfigError(f'{flag}: expected --config.KEY=VALUE')
  dotted, _, text = body.removeprefix('config.').partition('=')
  *parents, leaf = dotted.split('.')
  node, walked = c, []
  for name in parents:
    child = node.get(name) if hasattr(node, 'get') else None
    if child is None or not hasattr(child, 'items'):
      where = '.'.join(walked) or 'the config'
      raise ConfigError(f'--config.{dotted}: unknown key ({where} has no {name!r})')
    node, walked = child, [*walked, name]
  if leaf not in node:
    where = '.'.join(walked) or 'the config'
    raise ConfigError(
      f'--config.{dotted}: unknown key ({where} has no {leaf!r}; it has '
      f'{sorted(node.keys())})'
    )
  if hasattr(node[leaf], 'items'):
    raise ConfigError(f'--config.{dotted}: a group, not a value; set its keys')
  with node.unlocked():
    node[leaf] = _parse(dotted, text, node[leaf])


def parse_command_line(
  parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> tuple[argparse.Namespace, list[str]]:
  """A command's (args, `--config.KEY=VALUE` overrides); anything else is a usage error."""
  args, rest = parser.parse_known_args(argv)
  bad = [a for a in rest if not a.startswith('--config.')]
  if bad:
    parser.error(f'unknown arguments {bad} (only --config.KEY=VALUE pass through)')
  return args, rest


def load(spec: str, overrides: Sequence[str] = ()) -> Any:
  """The locked ConfigDict of `configs/NAME.py[:arg]` with overrides applied.

  Raises:
    ConfigError: (a ValueError) a missing or broken file, an arg the config
      rejects, an unknown key or a value of the wrong type; one line.
  """
  path, sep, arg = spec.partition(':')
  if not os.path.isfile(path):
    raise ConfigError(f'--config {path}: no such file')
  module = _module(path)
  try:
    c = module.get_config(arg) if sep else module.get_config()
  except (ValueError, KeyError, TypeError) as e:
    raise ConfigError(' '.join(str(e).split())) from None
  for flag in overrides:
    apply_override(c, flag)
  c.lock()
  return c


def validate(c: Any, refuse: bool = True) -> Any:
  """All of `config_rules` (one line naming the key); nothing is written.

  The layout keys left to the plan's rule (`mesh.tensor` or
  `rl.micro_batch_rows` of 0) are resolved in place first, on this
  machine's devices (`resolve_layout`). refuse=False: a layout that fits
  nowhere is taken, not refused (`launch_tpu.sh`'s check, where the plan's
  verdict, or `--ignore-plan`, decides). Returns the rule's Layout, None
  when the config sets the layout keys.
  """
  chosen = []

  def resolve(config: Any) -> None:
    chosen.append(resolve_layout(config, refuse=refuse))

  config_rules.validate(c, resolve=resolve)
  return chosen[0] if chosen else None


def step_shapes(c: Any, cfg: Any = None, eval_new_tokens: int = 4096) -> Any:
  """The planner's StepShapes of a config (R from the controller's max_rows).

  eval_new_tokens: what `python -m ada_jax.evaluate` generates, capped by
  the model's positions minus the prompt bucket.
  """
  from ada_jax import sampler
  from ada_jax.planner import memory as memory_plan
  from ada_jax.rl import update

  rl = c.rl
  settings = controller(c)
  rows = settings.max_rows(rl.prompts_per_step)
  bucket = c.data.prompt_bucket
  if cfg is not None:
    eval_new_tokens = min(eval_new_tokens, cfg.max_position_embeddings - bucket)
  return memory_plan.StepShapes(
    prompts=rl.prompts_per_step,
    prompt_len=bucket,
    new_tokens=c.sampling.max_new_tokens,
    slots=rl.slots,
    max_rounds=rl.max_rounds,
    rows=rows,
    mini_batch_rows=rl.mini_batch_rows,
    micro_batch_rows=rl.micro_batch_rows,
    eval_new_tokens=eval_new_tokens,
    logit_chunk=update.LOGIT_CHUNK,
    histogram_k=rl.histogram_k,
    greedy_eval=bool(c.data.eval_split),
    slot_group=settings.slot_group,
    filter_logits=sampler.needs_filter(c.sampling.top_p, c.sampling.top_k),
    waves=max(int(c.sampling.get('waves', 0)), 1),
  )


@dataclasses.dataclass(frozen=True)
class Preset:
  """The chips a config's `tpu=` (`pod` key) or `gpu=` (`gpu` key) preset names.

  Attributes:
    name: as the config holds it: 'v5p-64' or '8xh100'.
    key: the config key holding it: 'pod' or 'gpu'.
    chip: its `planner.chips` key ('v5p', 'h100').
    devices: JAX devices (TPU chips, GPUs).
    devices_per_host: what one host holds (each host writes its share of a
      checkpoint).
  """

  name: str
  key: str
  chip: str
  devices: int
  devices_per_host: int

  @property
  def platform(self) -> str:
    """The chip's platform ('tpu', 'gpu'): the target the plan assumes."""
    from ada_jax.planner import chips

    return chips.CHIPS[self.chip].platform


def preset(c: Any) -> Preset | None:
  """The config's `tpu=` or `gpu=` preset, None without one.

  Raises:
    ConfigError: both `pod` and `gpu` are set (naming both keys), or one
      does not name a known slice or GPU preset.
  """
  pod, gpu = c.get('pod', ''), c.get('gpu', '')
  if pod and gpu:
    raise ConfigError(
      f'config pod={pod!r} and gpu={gpu!r}: a config plans for a TPU slice (tpu=) '
      'or for GPUs (gpu=), not both'
    )
  try:
    if pod:
      from ada_jax.infra import tpu_pods

      p = tpu_pods.pod(pod)
      return Preset(pod, 'pod', p.generation, p.chips, p.chips_per_host_count)
    if gpu:
      from ada_jax.infra import gpu_hosts

      g = gpu_hosts.hosts(gpu)
      return Preset(g.name, 'gpu', g.chip, g.gpus, g.gpus_per_host)
  except ValueError as e:
    raise ConfigError(f'config {"pod" if pod else "gpu"}: {e}') from None
  return None


def _devices_and_platform(
  target: Preset | None, devices: int | None
) -> tuple[int, str]:
  """(devices, platform) a plan assumes.

  Devices: the given count, else the preset's, else this machine's.
  Platform: the preset chip's, else '' (the running backend).
  """
  if devices is None:
    if target is not None:
      devices = target.devices
    else:
      import jax

      devices = jax.device_count()
  return devices, target.platform if target is not None else ''


def pod_memory(c: Any) -> tuple[str | None, float | None]:
  """(chip, memory bytes per device) the layout rule plans for.

  The preset's chip when the config has one (`preset`): a TPU's whole HBM,
  a GPU's allocatable share (`planner.chips.allocatable_gib`: HBM x
  XLA_PYTHON_CLIENT_MEM_FRACTION or its default, read from this process's
  environment, which is the one the run's JAX allocates with), else the
  attached devices' own limit (`memory_stats`, which on GPU already is
  that share), else none (a CPU host: nothing is refused).
  """
  p = preset(c)
  if p is not None:
    from ada_jax.planner import chips

    return p.chip, chips.allocatable_gib(chips.CHIPS[p.chip]) * 2**30
  import jax

  # This host's device: jax.devices()[0] is another host's on all but process 0.
  stats = jax.local_devices()[0].memory_stats() or {}
  limit = stats.get('bytes_limit')
  return None, float(limit) if limit else None


def resolve_layout(
  c: Any,
  cfg: Any = None,
  devices: int | None = None,
  hbm_bytes: float | None = None,
  platform: str = '',
  refuse: bool = True,
) -> Any:
  """Fills `mesh.tensor` / `rl.micro_batch_rows` / `sampling.waves` left to the rule (0).

  In place. The rule is the planner's (`planner.layout.choose`): the
  smallest tensor axis dividing the KV heads whose plan fits, one row per
  batch shard per micro-batch, one slot wave where that fits (else the
  fewest of 2, 4, 8). Devices: the preset's (`tpu=` / `gpu=`), else this
  machine's; memory: `pod_memory`; platform: the preset chip's. Returns the
  planner's Layout (None when nothing was left to the rule). refuse=False
  (the plan command) takes the last layout tried when none fits, so the
  plan can print why.

  Raises:
    ConfigError: no tensor axis fits (refuse): the plan's line, naming the key.
  """
  waves = int(c.sampling.get('waves', 0))
  if c.mesh.tensor != 0 and c.rl.micro_batch_rows != 0 and waves != 0:
    return None
  from ada_jax.infra import platforms
  from ada_jax.planner import layout as layout_lib

  target = preset(c)
  devices, preset_platform = _devices_and_platform(target, devices)
  if hbm_bytes is None:
    _, hbm_bytes = pod_memory(c)
  cfg = cfg if cfg is not None else model_config(c)
  platform = platform or preset_platform
  chosen = layout_lib.choose(
    cfg,
    step_shapes(c, cfg),
    devices,
    hbm_bytes,
    data=int(c.mesh.data),
    fsdp=int(c.mesh.fsdp),
    tensor=int(c.mesh.tensor),
    waves=waves,
    backend=platforms.name(platform),
  )
  if refuse and not chosen.fits:
    where = f'{target.name} ' if target is not None else ''
    key = 'mesh.tensor=0' if c.mesh.tensor == 0 else 'sampling.waves=0'
    axes = (
      f'at any tensor axis dividing the {cfg.num_kv_heads} KV heads (tried '
      f'{", ".join(map(str, chosen.tried))})'
      if c.mesh.tensor == 0
      else f'at mesh.tensor={c.mesh.tensor}'
    )
    waves_tried = 'in up to 8 slot waves' if waves == 0 else f'in {waves} slot waves'
    raise ConfigError(
      f'config {key}: the step does not fit {where}({devices} devices x '
      f'{hbm_bytes / 2**30:g} GiB) {axes} {waves_tried}: '
      f'{chosen.plan.peak / 2**30:.2f} GiB at {chosen.mesh}, {chosen.waves} '
      f'wave(s) (peak: {chosen.plan.peak_phase}); see python -m ada_jax.plan for '
      'the smallest change'
    )
  with c.unlocked():
    if c.mesh.tensor == 0:
      c.mesh.tensor = chosen.mesh[2]
    if c.rl.micro_batch_rows == 0:
      c.rl.micro_batch_rows = chosen.micro_batch_rows
    if waves == 0:
      c.sampling.waves = chosen.waves
  return chosen


def command_slots(
  c: Any,
  cfg: Any,
  phase: str,
  new_tokens: int,
  *,
  hbm: float | None = None,
  devices: int | None = None,
) -> int:
  """Slots per chunk of evaluate ('evaluation'), select_prompts ('selection'), the trainer's scoring ('pass_rates').

  `rl.slots`, halved (keeping a multiple of the data-parallel size) until
  the command's phase of the plan fits a device's HBM (`pod_memory`) with
  `planner.layout.HEADROOM` of it free (or no smaller chunk is left): the
  commands generate longer answers than the RL rounds (evaluate: 4096 new
  tokens), so the run's slot count does not fit every pod. Fewer slots
  only mean more chunks; the samples are the same. Without a known memory
  (a CPU host) `rl.slots` as it is. `hbm` (bytes) and `devices` default to
  the config's preset (`pod_memory`), else this machine.
  """
  from ada_jax.planner import layout as layout_lib

  slots = int(c.rl.slots)
  setup = _command_plan(c, cfg, new_tokens, hbm, devices)
  if setup is None:
    return slots
  hbm, dp, phase_bytes = setup
  # The chunk leaves the layout rule's headroom free where a smaller chunk
  # can: the plan is within about 20% of the compiled programs, and a
  # smaller chunk only means more chunks.
  roomy = (1 - layout_lib.HEADROOM) * hbm
  while True:
    got = phase_bytes(phase, slots)
    half = slots // 2
    if got <= roomy or half < dp or half % dp:
      break
    slots = half
  if got > hbm:
    logging.warning(
      '%s: %.1f GiB per device even at %d slots per chunk, over the %.0f GiB '
      'of HBM (see python -m ada_jax.plan)',
      phase,
      got / 2**30,
      slots,
      hbm / 2**30,
    )
  elif slots != c.rl.slots:
    logging.info(
      '%s: %d slots per chunk (rl.slots=%d does not fit %.0f GiB per device)',
      phase,
      slots,
      c.rl.slots,
      hbm / 2**30,
    )
  return slots


def command_chunk(
  c: Any, cfg: Any, phase: str, new_tokens: int, slots: int | None, command: str
) -> int:
  """The slots per chunk a command samples with: the user's, checked, else the rule's.

  None: the largest chunk whose plan fits a device (`command_slots`).
  Given: refused before any sampling where the plan says it does not fit
  (`command_slots_problem`).

  Raises:
    ConfigError: `command` and the user's chunk's problem, in one line.
  """
  if slots is None:
    return command_slots(c, cfg, phase, new_tokens)
  problem = command_slots_problem(c, cfg, phase, new_tokens, slots)
  if problem:
    raise ConfigError(f'{command} {problem}')
  return slots


def command_slots_problem(
  c: Any,
  cfg: Any,
  phase: str,
  new_tokens: int,
  slots: int,
  *,
  hbm: float | None = None,
  devices: int | None = None,
) -> str | None:
  """Why a user's `--slots` per chunk will not run, or None.

  The slots split over the data x fsdp shards, and the command's phase of
  the plan at that chunk must fit a device's memory (`command_slots` picks
  the largest chunk that does when `--slots` is not given). None where the
  memory is not known (a CPU host). `hbm` and `devices` as `command_slots`.
  """
  setup = _command_plan(c, cfg, new_tokens, hbm, devices)
  if setup is None:
    return None
  hbm, dp, phase_bytes = setup
  if slots < dp or slots % dp:
    return f'--slots {slots}: not a multiple of the data-parallel size {dp}'
  got = phase_bytes(phase, slots)
  if got <= hbm:
    return None
  fits = command_slots(c, cfg, phase, new_tokens, hbm=hbm, devices=devices)
  return (
    f'--slots {slots}: {got / 2**30:.1f} GiB per device does NOT fit '
    f'{hbm / 2**30:.1f} GiB (plan, {phase} phase); {fits} slots per chunk fit '
    '(leave --slots out to take them)'
  )


def _command_plan(
  c: Any, cfg: Any, new_tokens: int, hbm: float | None, devices: int | None
) -> tuple[float, int, Callable[[str, int], float]] | None:
  """(HBM bytes, data-parallel size, the phase's bytes at a chunk), or None.

  None where the memory is not known (a CPU host without a preset).
  """
  from ada_jax.infra import platforms
  from ada_jax.planner import memory as memory_plan

  if hbm is None:
    _, hbm = pod_memory(c)
  if hbm is None:
    return None
  devices, platform = _devices_and_platform(preset(c), devices)
  mesh = memory_plan.resolve_mesh(dict(c.mesh), devices)
  shapes = step_shapes(c, cfg, new_tokens)
  backend = platforms.name(platform)

  def phase_bytes(phase: str, slots: int) -> float:
    chunk = dataclasses.replace(shapes, slots=slots)
    return memory_plan.plan(cfg, chunk, mesh, backend=backend).phase_bytes(phase)

  return hbm, mesh[0] * mesh[1], phase_bytes


def _opt(value, cast):
  """'' / 0 / None in a config mean "the default" (None)."""
  return None if value in ('', None) else cast(value)


def tokenizer(c: Any, workdir: str | None = None) -> tokenizer_lib.Tokenizer:
  """The run's tokenizer: the HF one, or the tiny task's.

  The tiny tokenizer is written to `workdir/tokenizer` when given (the main
  job, process 0, local disk: hosts sharing a disk would read each other's
  half-written files) and to a private temp dir otherwise (readers of a
  run, other hosts, gs:// workdirs); the files are the same.
  """
  from ada_jax import tokenizer as tokenizer_lib

  if c.model.hf_path:
    return tokenizer_lib.load_tokenizer(
      c.model.tokenizer_path or c.model.hf_path,
      stop_ids=tokenizer_lib.parse_stop_ids(c.sampling.get('stop_ids', 'default')),
    )
  import jax

  if workdir and jax.process_index() == 0 and not workdir.startswith('gs://'):
    tok_dir = os.path.join(workdir, 'tokenizer')
  else:
    tok_dir = tempfile.mkdtemp(prefix='ada_tiny_tok_')
  return tokenizer_lib.build_tiny_tokenizer(tok_dir)


def execution(c: Any) -> dict[str, Any]:
  """How the model runs, not what it is: `model.attention`, `model.remat`.

  Also `model.max_position_embeddings` when set (> 0): it replaces the
  checkpoint's position limit, as the reference's
  `override_config.max_position_embeddings=32768` does for Qwen2.5-Math.
  """
  out: dict[str, Any] = {
    'attention': c.model.get('attention', 'auto'),
    'remat': c.model.get('remat', 'none'),
  }
  if c.model.get('max_position_embeddings', 0):
    out['max_position_embeddings'] = int(c.model.max_position_embeddings)
  return out


def model_config(c: Any, tok: tokenizer_lib.Tokenizer | None = None):
  """The policy's ModelConfig: from model.hf_path, else the tiny model's.

  `tok` gives the tiny model's vocab size and EOS id; without it (the memory
  planner, which needs shapes only) the tiny tokenizer's vocab is used.
  """
  import jax.numpy as jnp

  from ada_jax import hf
  from ada_jax import model as model_lib
  from ada_jax import tokenizer as tokenizer_lib

  dtype, param_dtype = jnp.dtype(c.model.dtype), jnp.dtype(c.model.param_dtype)
  if c.model.hf_path:
    return dataclasses.replace(
      hf.config_from_hf(
        hf.read_hf_config(c.model.hf_path),
        dtype=dtype,
        param_dtype=param_dtype,
        where=os.path.join(c.model.hf_path, 'config.json'),
      ),
      **execution(c),
    )
  t = c.model.tiny
  family = t.get('family', 'qwen2')
  vocab = tok.vocab_size if tok is not None else len(tokenizer_lib._tiny_vocab())
  return model_lib.ModelConfig(
    model_type=family,
    vocab_size=-(-vocab // 8) * 8,
    hidden_size=t.hidden,
    intermediate_size=t.mlp,
    num_layers=t.layers,
    num_heads=t.heads,
    num_kv_heads=t.kv_heads,
    head_dim=t.head_dim,
    qkv_bias=family == 'qwen2',
    qk_norm=family == 'qwen3',
    tie_embeddings=True,
    eos_token_id=tok.eos_ids[0] if tok is not None else None,
    param_dtype=param_dtype,
    dtype=dtype,
    **{'max_position_embeddings': t.max_positions, **execution(c)},
  )


def mesh(c: Any):
  """The run's device mesh (data, fsdp, tensor)."""
  from ada_jax import sharding

  return sharding.make_mesh(dict(c.mesh))


def scorer(
  c: Any,
  tok: tokenizer_lib.Tokenizer,
  verify_fn: Callable[..., Any] | None = None,
  backend: str | None = None,
) -> scoring.Scorer:
  """The verifier's settings (`verifier.*`) with the tokenizer, bound once.

  `verify_fn` replaces `verifier.verify_batch` (tests, benchmarks). A
  `verifier.backend` other than 'ada' (default), or `backend` when given
  (evaluate's per-set graders), is bound into the call and checked here: a
  missing Math-Verify extra fails before any work starts.
  """
  from ada_jax.rl import scoring

  backend = backend or verifier_backend(c)
  if backend != 'ada':
    from ada_jax import verifier
    from ada_jax.verifier import backends

    backends.check(backend)
    verify_fn = functools.partial(verify_fn or verifier.verify_batch, backend=backend)
  return scoring.Scorer(
    tok=tok,
    timeout_s=c.verifier.timeout_s,
    workers=c.verifier.workers or None,
    verify_fn=verify_fn,
    backend=backend,
  )


def verifier_backend(c: Any) -> str:
  """`verifier.backend`: 'ada' (ours, the default) or 'math_verify'."""
  return c.verifier.get('backend', 'ada') or 'ada'


def controller(c: Any) -> adaptive.ControllerSettings:
  """The controller's settings from `rl.*`."""
  from ada_jax import adaptive

  rl = c.rl
  options = {}
  if rl.rule == 'dapo' and rl.target_groups:
    options['target_groups'] = rl.target_groups
  return adaptive.ControllerSettings(
    rule=rl.rule,
    group_size=rl.group_size,
    samples_per_round=rl.samples_per_round,
    max_rounds=rl.max_rounds,
    slots=rl.slots,
    # The other rules define their own rounds.
    schedule=rl.schedule if rl.rule in ('pos', 'balance') else 'paper',
    advantage=_opt(rl.advantage, str),
    normalize_std=_opt(
      rl.normalize_std, lambda v: str(v).lower() in ('1', 'true', 'yes')
    ),
    positive_threshold=rl.positive_threshold,
    rule_options=options,
  )


def _examples(c: Any, workdir: str, tok) -> tuple[list, list | None, list]:
  """(RL train, SFT or None, eval) examples as the config selects them."""
  from ada_jax import data
  from ada_jax.infra import multihost

  load = dict(
    data_dir=c.data.data_dir or os.path.join(workdir, 'tfds'),
    manual_dir=c.data.manual_dir or None,
    tokenizer=tok,
    template=c.data.template,
  )
  # The first load builds the dataset into data_dir, which hosts may share.
  with multihost.main_first('ada_jax_load_examples'):
    train_ex = data.load_examples(c.data.name, c.data.train_split, **load)
    eval_ex = (
      data.load_examples(c.data.name, c.data.eval_split, **load)
      if c.data.eval_split
      else []
    )
  # A band of the ladder (e.g. the tiny run's learnable levels), train and test.
  if c.data.get('levels', ''):
    kept = data.select_levels(train_ex, c.data.levels)
    if not kept:
      raise ConfigError(
        f'config data.levels={c.data.levels!r} keeps no example of '
        f'{c.data.name}:{c.data.train_split} (its levels: '
        f'{sorted(data.level_histogram(train_ex))}); '
        "pass --config.data.levels='' for all"
      )
    train_ex = kept
    eval_ex = data.select_levels(eval_ex, c.data.levels)
  sft_ex = None
  if c.data.get('sft_share', 0.0):
    train_ex, sft_ex = data.split_share(train_ex, c.data.sft_share, seed=c.seed)
  if c.data.get('balance_levels', False):
    train_ex = data.balance_levels(train_ex)
    sft_ex = data.balance_levels(sft_ex) if sft_ex is not None else None
  max_problem = c.data.get('max_problem_tokens', 0)
  train_ex, too_long = data.drop_long_problems(tok, train_ex, max_problem)
  if too_long:
    logging.warning(
      'data: dropped %d train problems longer than data.max_problem_tokens=%d '
      '(evaluation sets are not filtered)',
      too_long,
      max_problem,
    )
  train_ex, dropped = data.drop_long_prompts(tok, train_ex, c.data.prompt_bucket)
  eval_ex, dropped_eval = data.drop_long_prompts(tok, eval_ex, c.data.prompt_bucket)
  if dropped or dropped_eval:
    logging.warning(
      'data: dropped %d train / %d eval prompts longer than data.prompt_bucket=%d',
      dropped,
      dropped_eval,
      c.data.prompt_bucket,
    )
  return train_ex, sft_ex, eval_ex


def trainer(
  c: Any,
  workdir: str,
  *,
  verify_fn: Callable[..., Any] | None = None,
  announce: Callable[[str], None] = print,
  schedule_ends: tuple[int, ...] = (),
) -> trainer_lib.Trainer:
  """Mesh, tokenizer, data, model, settings and the Trainer from a config.

  `verify_fn` replaces `verifier.verify_batch` in the trainer's `scorer`;
  `schedule_ends` are `Identity.schedule_ends` (an extended run's schedules).

  Resumes from the workdir's latest usable checkpoint and truncates each
  phase's metrics rows to it; with none usable but earlier run files there
  (all checkpoints corrupt, or killed during SFT), starts over and sets
  those files aside. `announce` gets the one line saying which (process 0).

  Raises:
    ConfigError: a config value found bad only with the data at hand.
    run_dir.WorkdirError: the workdir is not writable.
    multihost.AgreedError: process 0 failed to set the earlier files aside or
      to open the metrics writer (e.g. wandb missing): raised on every
      process, with one exit code.
  """
  import jax
  import jax.numpy as jnp

  from ada_jax import model as model_lib
  from ada_jax import sharding
  from ada_jax.infra import checkpoint as checkpoint_lib
  from ada_jax.infra import metrics as metrics_lib
  from ada_jax.infra import multihost
  from ada_jax.rl import rollout, update
  from ada_jax.rl import trainer as trainer_lib

  is_main = jax.process_index() == 0
  if is_main:
    run_dir.check_writable(workdir)
  mesh_ = mesh(c)
  dtype, param_dtype = jnp.dtype(c.model.dtype), jnp.dtype(c.model.param_dtype)
  tok = tokenizer(c, workdir)
  train_ex, sft_ex, eval_ex = _examples(c, workdir, tok)
  if c.model.hf_path:
    model = model_lib.with_config(
      _load_hf(
        c.model.hf_path,
        c.model.tokenizer_path or None,
        dtype=dtype,
        param_dtype=param_dtype,
        mesh=mesh_,
      ),
      **execution(c),
    )
  else:
    model = sharding.create_sharded_model(
      model_config(c, tok), mesh_, sharding.TRAIN_RULES, seed=c.seed
    )
  rl = c.rl
  sampling = rollout.SamplingSettings(
    max_new_tokens=c.sampling.max_new_tokens,
    temperature=c.sampling.temperature,
    top_p=c.sampling.top_p,
    top_k=c.sampling.top_k,
    eos_ids=tuple(tok.eos_ids),
    waves=max(int(c.sampling.get('waves', 0)), 1),
  )
  update_settings = update.UpdateSettings(
    prompt_len=c.data.prompt_bucket,
    mini_batch_rows=rl.mini_batch_rows,
    micro_batch_rows=rl.micro_batch_rows,
    epochs=rl.epochs,
    temperature=c.sampling.temperature,
    clip_low=rl.clip_low,
    clip_high=rl.clip_high,
    clip_ratio_c=rl.clip_ratio_c or None,
    loss_agg_mode=rl.loss_agg_mode,
    entropy_coef=rl.entropy_coef,
    grad_clip=rl.grad_clip,
  )
  rl_settings = trainer_lib.RLSettings(
    steps=rl.steps,
    prompts_per_step=rl.prompts_per_step,
    controller=controller(c),
    sampling=sampling,
    update=update_settings,
    lr=rl.lr,
    warmup=rl.warmup,
    lr_schedule=rl.lr_schedule,
    eval_every=rl.eval_every,
    eval_max_prompts=rl.eval_max_prompts,
    histogram_prompts=rl.histogram_prompts,
    histogram_k=rl.histogram_k,
    eval_sampled_k=rl.get('eval_sampled_k', 0),
    # The histogram and evaluations score S prompts' samples per chunk: the
    # largest S that fits beside the training state (the plan's pass_rates).
    score_slots=command_slots(c, model.config, 'pass_rates', c.sampling.max_new_tokens),
    samples_to_log=c.log.samples_per_step,
    schedule_ends=tuple(schedule_ends),
  )
  sft = trainer_lib.SFTSettings(**dict(c.sft))
  tx = update.make_optimizer(weight_decay=rl.weight_decay)
  ckpt = checkpoint_lib.Checkpointer(
    workdir,
    keep=c.checkpoint.keep,
    every_steps=c.checkpoint.every,
    every_minutes=c.checkpoint.get('every_minutes', 0.0),
    save_on_preemption=_preemption_write(model.config, announce if is_main else None),
  )
  t = trainer_lib.Trainer(
    model=model,
    mesh=mesh_,
    tok=tok,
    train_examples=train_ex,
    sft_examples=sft_ex,
    eval_examples=eval_ex,
    prompt_bucket=c.data.prompt_bucket,
    rl=rl_settings,
    sft=sft,
    tx=tx,
    writer=None,
    checkpointer=ckpt,
    seed=c.seed,
    scorer=scorer(c, tok, verify_fn),
  )
  resumed = t.restore()
  keep = None
  if resumed:
    # Each phase is cut at its own restored position: RL at the checkpoint's
    # step; SFT is whole in every checkpoint (saved when it ended).
    keep = {'rl': t.step}
    if is_main:
      announce(f'resumed from step {t.step} of {rl.steps} ({ckpt.directory})')
  # Process 0 alone sets files aside and opens the writer (wandb is an
  # optional import): every process learns whether it failed.
  with multihost.agreed(
    {run_dir.WorkdirError: 2, ImportError: 2, OSError: 1, ValueError: 1}
  ):
    if not resumed and is_main and run_dir.progress_files(workdir):
      moved = run_dir.set_aside(workdir)
      why = (
        f'its checkpoints {ckpt.unusable} are unusable (moved to '
        f'{run_dir.CORRUPT_DIR}/)'
        if ckpt.unusable
        else 'it has no checkpoint (stopped before its first one, e.g. during SFT)'
      )
      announce(f'starting {workdir} over: {why}; its earlier files are kept in {moved}')
    t.writer = metrics_lib.MetricsWriter(
      workdir,
      process_index=jax.process_index(),
      tensorboard=c.log.tensorboard,
      wandb_project=c.log.wandb_project or None,
      config=c,
      keep=keep,
    )
  if not resumed and c.model.get('init_from', ''):
    t.init_from(c.model.init_from)
  if is_main and t.writer.lost_rows:
    logging.warning(
      'metrics: rows lost before the checkpoint at step %d: %s (the metrics '
      'file was cut, e.g. by a power loss; counted in summary.json)',
      t.step,
      ', '.join(f'{p} step {s}' for p, s in t.writer.lost_rows),
    )
  return t


def _preemption_write(config: Any, announce: Callable[[str], None] | None) -> bool:
  """Whether this model's checkpoint write fits the preemption notice, by the plan.

  `planner.checkpoint_time` at its assumed per-host bandwidth over
  jax.process_count() hosts (the same on every host); the module's
  constants are read at call time, so a test can change them.
  """
  import jax

  from ada_jax.planner import checkpoint_time

  write = checkpoint_time.write_seconds(
    config,
    jax.process_count(),
    checkpoint_time.WRITE_GBPS,
    checkpoint_time.PREEMPTION_NOTICE_S,
  )
  if not write.fits_notice and announce is not None:
    announce(f'{write.line()}: on SIGTERM the run exits at once without a checkpoint')
  return write.fits_notice


def _load_hf(path: str, tokenizer_dir: str | None, **kw: Any):
  """`hf.load_model`; a tokenizer id outside the embedding is a ConfigError."""
  from ada_jax import hf

  try:
    return hf.load_model(path, tokenizer_dir=tokenizer_dir, **kw)
  except hf.VocabError as e:
    raise ConfigError(str(e)) from None


@dataclasses.dataclass(frozen=True)
class Identity:
  """A run's identity check (`identity`).

  Attributes:
    fresh: the workdir records no config: a new run.
    derived: identity entries not in the config (`model.fingerprint`).
    changes: key -> (recorded, given) of the keys that may change and did,
      `rl.steps` included when extended; recorded with their step.
    steps: the rl.steps this run goes to.
    schedule_ends: the last step of each schedule: the run's rl.steps, then
      each extension's (`RLSettings.schedule_ends`).
  """

  fresh: bool
  derived: dict[str, Any]
  changes: dict[str, tuple[Any, Any]]
  steps: int
  schedule_ends: tuple[int, ...]

  def to_json(self) -> dict[str, Any]:
    """Plain JSON (it is broadcast from process 0 to the others)."""
    return {
      **dataclasses.asdict(self),
      'changes': {k: list(v) for k, v in self.changes.items()},
    }

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> Identity:
    """The inverse of `to_json`."""
    return cls(
      fresh=bool(d['fresh']),
      derived=dict(d['derived']),
      changes={k: tuple(v) for k, v in d['changes'].items()},
      steps=int(d['steps']),
      schedule_ends=tuple(int(x) for x in d['schedule_ends']),
    )


def derived_identity(c: Any) -> dict[str, Any]:
  """The model by content: a fingerprint of its HF directory (not its path)."""
  from ada_jax import hf
  from ada_jax.infra import storage

  path = c.model.hf_path
  if path and (storage.is_remote(path) or os.path.isdir(path)):
    return {'model.fingerprint': hf.fingerprint(path)}  # gs://: its local copy.
  return {}


def flat_config(c: Any) -> dict[str, Any]:
  """{dotted key: value} of a ConfigDict or a config.json, as JSON writes it."""
  from ada_jax.infra import metrics as metrics_lib

  return dict(config_rules.leaves(metrics_lib.config_json(c)))


def identity_conflicts(recorded: dict[str, Any], given: dict[str, Any]) -> list[str]:
  """`key: R recorded, G given` for each computation key whose value differs.

  Both are flat (`flat_config`); keys only one side has are not compared
  (a key added to the code later keeps its default there).
  """
  classes = config_rules.key_classes()
  return [
    f'{k}: {recorded[k]!r} recorded, {given[k]!r} given'
    for k in sorted(set(recorded) & set(given))
    if classes.get(k, config_rules.COMPUTATION) == config_rules.COMPUTATION
    and recorded[k] != given[k]
  ]


def recorded_config(workdir: str) -> dict[str, Any] | None:
  """The run's config as it stands: config.json with its history replayed."""
  raw = run_dir.read_config(workdir)
  if raw is None:
    return None
  flat = dict(config_rules.leaves(raw))
  for record in run_dir.read_history(workdir):
    flat.update(record.get('identity', {}))
    flat.update({k: v[1] for k, v in record.get('changes', {}).items()})
  return flat


def identity(c: Any, workdir: str, extend_steps: int | None = None) -> Identity:
  """Checks a (re)run's config against the run `workdir` records.

  A computation key (`config_rules.key_classes`; the model by its
  fingerprint) that differs from the recorded value is refused. With
  `extend_steps` N the run goes on to step N: N must be above the recorded
  rl.steps (or equal to an extension already recorded: a resume); the
  learning rate of the added steps follows a new schedule of `rl.lr_schedule`
  from `rl.lr` over the added steps, with no warmup (constant: `rl.lr`
  again; cosine: a new cosine from `rl.lr` to 0 at step N). Nothing is written.

  Raises:
    ConfigError: one line naming each changed key with both values, or a bad
      `--extend-steps`.
  """
  given = {**flat_config(c), **derived_identity(c)}
  recorded = recorded_config(workdir)
  if recorded is None:
    if extend_steps is not None:
      raise ConfigError(
        f'--extend-steps {extend_steps}: {workdir} holds no run to extend'
      )
    return Identity(True, derived_identity(c), {}, c.rl.steps, (c.rl.steps,))
  history = run_dir.read_history(workdir)
  original = int(recorded.get('rl.steps', c.rl.steps))
  raw = run_dir.read_config(workdir) or {}
  original = int(raw.get('rl', {}).get('steps', original))
  ends = [original] + [
    int(r['changes']['rl.steps'][1])
    for r in history
    if 'rl.steps' in r.get('changes', {})
  ]
  current = int(recorded.get('rl.steps', original))
  target = int(given['rl.steps'])
  if extend_steps is not None:
    if extend_steps < current or extend_steps <= original:
      raise ConfigError(
        f"--extend-steps {extend_steps}: must be above the run's rl.steps={current}"
      )
    given['rl.steps'], target = current, extend_steps
  conflicts = identity_conflicts(recorded, given)
  if conflicts:
    hint = (
      ' (the run was extended: pass --extend-steps ' + str(current) + ')'
      if current != original and any(x.startswith('rl.steps:') for x in conflicts)
      else ''
    )
    raise ConfigError(
      f'--workdir {workdir} holds a run of another config: {"; ".join(conflicts)}'
      f'{hint}: use another --workdir (or --extend-steps N for more RL steps); '
      'only paths, logging, cadence, mesh, micro-batch, attention, remat, slots '
      'and verifier workers/timeouts may change'
    )
  classes = config_rules.key_classes()
  changes: dict[str, tuple[Any, Any]] = {
    k: (recorded[k], given[k])
    for k in sorted(set(recorded) & set(given))
    if classes.get(k) == config_rules.EXECUTION and recorded[k] != given[k]
  }
  if target != current:
    changes['rl.steps'] = (current, target)
    ends.append(target)
  return Identity(False, derived_identity(c), changes, target, tuple(ends))


@dataclasses.dataclass(frozen=True)
class Policy:
  """A policy to sample from, for evaluation and prompt selection.

  Attributes:
    model: the Transformer in the sampling layout (params split on tensor).
    tok: its tokenizer.
    step: the checkpoint's step (0 for an HF directory).
    max_positions: the model's position limit.
    run: the run workdir it came from, or None for an HF directory.
  """

  model: model_lib.Transformer
  tok: tokenizer_lib.Tokenizer
  step: int
  max_positions: int
  run: str | None


def is_hf_dir(path: str) -> bool:
  """config.json next to safetensors (a run workdir has a config.json too)."""
  from ada_jax.infra import storage

  p = storage.path(path)
  return p.joinpath('config.json').is_file() and any(
    p.joinpath(f).is_file()
    for f in ('model.safetensors', 'model.safetensors.index.json')
  )


def policy(c: Any, checkpoint: str, step: int | None = None) -> Policy:
  """The params of a run's latest checkpoint, or `step`'s (or an HF dir), read-only.

  Nothing in `checkpoint` is written: the params are restored through a
  read-only reader, and the tiny tokenizer is built in a temp dir. Safe on
  a run that is still training. The params are read in the training layout
  (fsdp x tensor: a 1/devices share each) and copied into the sampling
  layout in the compute dtype, as the trainer's sampling copy is
  (`infra.resharder`; the forward's values do not change, the model casts
  every weight at its use): restored whole in their own dtype (fp32),
  7B's would take 28.4 GiB of every device, more than a v6e chip holds
  beside a round.

  Raises:
    FileNotFoundError: neither an HF directory nor a run with a usable
      checkpoint.
  """
  import jax.numpy as jnp
  from etils import epath
  from flax import nnx

  from ada_jax import model as model_lib
  from ada_jax import sharding
  from ada_jax.infra import checkpoint as checkpoint_lib

  mesh_ = mesh(c)
  if is_hf_dir(checkpoint):
    from ada_jax import tokenizer as tokenizer_lib

    if step is not None:
      raise ValueError(f'--step {step}: {checkpoint} is an HF directory, not a run')

    model = _sampling_copy(
      model_lib.with_config(
        _load_hf(
          checkpoint,
          c.model.tokenizer_path or None,
          dtype=jnp.dtype(c.model.dtype),
          param_dtype=jnp.dtype(c.model.param_dtype),
          mesh=mesh_,
          rules=sharding.TRAIN_RULES,
        ),
        **execution(c),
      ),
      mesh_,
    )
    tok = tokenizer_lib.load_tokenizer(
      c.model.tokenizer_path or checkpoint,
      stop_ids=tokenizer_lib.parse_stop_ids(c.sampling.get('stop_ids', 'default')),
    )
    return Policy(model, tok, 0, model.config.max_position_embeddings, None)
  if not (epath.Path(checkpoint) / run_dir.CHECKPOINT_DIR).exists():
    raise FileNotFoundError(
      f'--checkpoint {checkpoint}: no checkpoint under {checkpoint}/checkpoints '
      'and no config.json + safetensors (not an HF directory either)'
    )
  tok = tokenizer(c)
  config = model_config(c, tok)
  graphdef, target = sharding.abstract_model(config, mesh_, sharding.TRAIN_RULES)
  step, params, _ = checkpoint_lib.restore_params(checkpoint, target, step)
  model = _sampling_copy(nnx.merge(graphdef, params), mesh_)
  return Policy(model, tok, step, config.max_position_embeddings, checkpoint)


def _sampling_copy(model: Any, mesh_: Any) -> Any:
  """`model` in the sampling layout and compute dtype (the trainer's copy)."""
  from flax import nnx

  from ada_jax import sharding
  from ada_jax.infra import resharder

  graphdef, state = nnx.split(model)
  copy = resharder.Resharder(mesh_, sharding.SAMPLE_RULES, dtype=model.config.dtype)
  return nnx.merge(graphdef, copy(state))


def data_dir(c: Any, name: str, source: str | None, out_dir: str) -> str:
  """Where a reader (evaluation, prompt selection) keeps dataset `name`.

  `data.data_dir` when set; else the run's own `tfds/` if `name` is already
  built there (read, never written); else `out_dir/tfds`, which the
  command owns.
  """
  from ada_jax import data

  if c.data.data_dir:
    return c.data.data_dir
  if source is not None:
    own = os.path.join(source, 'tfds')
    if data.is_prepared(name, own):
      return own
  return os.path.join(out_dir, 'tfds')
