r"""The main job: `python -m ada_jax.main --config CONFIG[:arg] --workdir DIR`.

Builds mesh, tokenizer, data and model from the config (the only place,
with the other command-line modules, that reads a ConfigDict), validates the
config before anything compiles, then runs SFT (if configured) and the RL
steps, evaluating on the held-out split, checkpointing, and writing
`DIR/metrics.jsonl`, `DIR/samples.jsonl`, TensorBoard events and PNG plots.
Re-running with the same workdir resumes from the latest checkpoint.

  python -m ada_jax.main --config configs/tiny_arith.py --workdir /tmp/tiny \
      [--config.rl.steps=10 ...]

Multi-host: with ADA_DISTRIBUTED=1 (set by launch_tpu.sh) every process calls
jax.distributed.initialize() (TPU auto-detection); with ADA_COORDINATOR,
ADA_NUM_PROCESSES and ADA_PROCESS_ID it initialises explicitly (CPU tests).
"""

from __future__ import annotations

import logging
import os
import sys

from absl import app, flags
from ml_collections import config_flags


def define_flags() -> None:
  """Defines --config and --workdir, once.

  Not at import: other entry modules define a --config flag too, and tests
  import several of them into one process.
  """
  if 'config' not in flags.FLAGS:
    config_flags.DEFINE_config_file(
      'config', None, 'Config file[:arg].', lock_config=True
    )
  if 'workdir' not in flags.FLAGS:
    flags.DEFINE_string('workdir', None, 'Run directory (local or gs://).')


def init_distributed() -> None:
  """jax.distributed from the environment (see the module docstring)."""
  import jax

  if os.environ.get('ADA_COORDINATOR'):
    missing = [
      k for k in ('ADA_NUM_PROCESSES', 'ADA_PROCESS_ID') if not os.environ.get(k)
    ]
    if missing:
      raise ValueError(f'ADA_COORDINATOR is set but {missing} are not')
    if (
      jax.config.jax_platforms in (None, '', 'cpu')
      or os.environ.get('JAX_PLATFORMS') == 'cpu'
    ):
      # CPU cross-process collectives (the two-process tests).
      jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(
      os.environ['ADA_COORDINATOR'],
      num_processes=int(os.environ['ADA_NUM_PROCESSES']),
      process_id=int(os.environ['ADA_PROCESS_ID']),
    )
  elif os.environ.get('ADA_DISTRIBUTED') == '1':
    jax.distributed.initialize()
  else:
    return
  logging.info(
    'jax.distributed: process %d of %d, %d local of %d devices',
    jax.process_index(),
    jax.process_count(),
    jax.local_device_count(),
    jax.device_count(),
  )


def validate(c) -> None:
  """Config errors before any compile; each names the key at fault."""
  import jax
  from etils import epath

  from ada_jax import adaptive, data, update

  data.parse_levels(c.data.get('levels', ''))  # Names data.levels if malformed.
  if not 0.0 <= c.data.get('sft_share', 0.0) < 1.0:
    raise ValueError(f'config data.sft_share={c.data.sft_share} must be in [0, 1)')
  init_from = c.model.get('init_from', '')
  if init_from and not (epath.Path(init_from) / 'checkpoints').is_dir():
    raise ValueError(
      f'config model.init_from={init_from!r}: no checkpoints/ directory there '
      '(pass the workdir of a finished run)'
    )
  # An empty hf_path builds the random tiny model with the tiny task's
  # tokenizer, which only reads the `tiny` template: any other template
  # means a real model was meant and its directory is missing.
  if not c.model.hf_path and c.data.template != 'tiny':
    raise ValueError(
      'config model.hf_path is empty: pass --config.model.hf_path=/path/to/'
      f'<HF model dir> (data.template={c.data.template!r} needs a real '
      "model's tokenizer), or use the config's runlocal arg for a tiny model"
    )
  rl = c.rl
  if rl.rule not in adaptive.RULES:
    raise ValueError(
      f'config rl.rule={rl.rule!r}: unknown rule (one of {adaptive.RULES})'
    )
  if rl.schedule not in adaptive.SCHEDULES:
    raise ValueError(
      f'config rl.schedule={rl.schedule!r}: unknown schedule (one of {adaptive.SCHEDULES})'
    )
  for key, value in (
    ('rl.lr_schedule', rl.lr_schedule),
    ('sft.lr_schedule', c.sft.get('lr_schedule', 'constant')),
  ):
    if value not in update.LR_SCHEDULES:
      raise ValueError(
        f'config {key}={value!r}: unknown learning-rate schedule '
        f'(one of {update.LR_SCHEDULES})'
      )
  boxed_share = c.sft.get('boxed_share', 1.0)
  if not 0.0 < boxed_share <= 1.0:
    raise ValueError(
      f'config sft.boxed_share={boxed_share}: the share of boxed SFT '
      'demonstrations must be in (0, 1]'
    )
  if rl.rule == 'balance' and rl.group_size % 2:
    raise ValueError(
      f'config rl.group_size={rl.group_size}: balance needs an even group size'
    )
  if rl.rule in ('pos', 'balance') and rl.samples_per_round < rl.group_size:
    raise ValueError(
      f'config rl.samples_per_round={rl.samples_per_round} is smaller than rl.group_size={rl.group_size}'
    )
  dp = _dp_size(c)
  if rl.slots % dp:
    raise ValueError(
      f'config rl.slots={rl.slots} does not divide by the data-parallel size {dp}'
    )
  if rl.prompts_per_step % jax.process_count():
    raise ValueError(
      f'config rl.prompts_per_step={rl.prompts_per_step} does not divide across '
      f'{jax.process_count()} hosts'
    )
  limit = _max_positions(c)
  total = c.data.prompt_bucket + c.sampling.max_new_tokens
  if total > limit:
    raise ValueError(
      f'config data.prompt_bucket + sampling.max_new_tokens = {total} exceeds the '
      f"model's position limit {limit}"
    )
  rows = adaptive.max_rows(
    rl.prompts_per_step,
    rule=rl.rule,
    group_size=rl.group_size,
    slots=rl.slots,
    target_groups=rl.target_groups or None,
  )
  if rows % rl.mini_batch_rows or rl.mini_batch_rows % rl.micro_batch_rows:
    raise ValueError(
      f'config rl.mini_batch_rows={rl.mini_batch_rows} must divide the {rows} training rows '
      f'and be a multiple of rl.micro_batch_rows={rl.micro_batch_rows}'
    )


def _dp_size(c) -> int:
  import jax

  n = jax.device_count()
  shape = [c.mesh.data, c.mesh.fsdp, c.mesh.tensor]
  known = 1
  for s in shape:
    known *= s if s != -1 else 1
  data = c.mesh.data if c.mesh.data != -1 else n // known
  fsdp = c.mesh.fsdp if c.mesh.fsdp != -1 else n // known
  return data * fsdp


def _max_positions(c) -> int:
  if c.model.hf_path:
    from ada_jax import hf

    return int(hf.read_hf_config(c.model.hf_path).get('max_position_embeddings', 4096))
  return int(c.model.tiny.max_positions)


def _opt(value, cast):
  """'' / 0 / None in a config mean "the default" (None)."""
  return None if value in ('', None) else cast(value)


def load_tokenizer(c, workdir: str):
  """The run's tokenizer: the HF one, or the tiny task's (written to the workdir)."""
  from ada_jax import tokenizer as tokenizer_lib

  if c.model.hf_path:
    return tokenizer_lib.load_tokenizer(c.model.tokenizer_path or c.model.hf_path)
  import tempfile

  import jax

  # Only process 0 writes into the workdir: hosts sharing a disk would
  # otherwise read each other's half-written files. The others (and a gs://
  # workdir) build the same files in a private temp dir.
  if jax.process_index() == 0 and not workdir.startswith('gs://'):
    tok_dir = os.path.join(workdir, 'tokenizer')
  else:
    tok_dir = tempfile.mkdtemp(prefix='ada_tiny_tok_')
  return tokenizer_lib.build_tiny_tokenizer(tok_dir)


def model_config(c, tok=None):
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
    return hf.config_from_hf(
      hf.read_hf_config(c.model.hf_path),
      dtype=dtype,
      param_dtype=param_dtype,
      where=os.path.join(c.model.hf_path, 'config.json'),
    )
  t = c.model.tiny
  family = t.get('family', 'qwen2')
  if family not in ('qwen2', 'qwen3', 'llama'):
    raise ValueError(f'config model.tiny.family={family!r}: one of qwen2, qwen3, llama')
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
    max_position_embeddings=t.max_positions,
    eos_token_id=tok.eos_ids[0] if tok is not None else None,
    param_dtype=param_dtype,
    dtype=dtype,
  )


def build_trainer(c, workdir: str, *, verify_fn=None):
  """Mesh, tokenizer, data, model, settings and the Trainer from a config."""
  import jax
  import jax.numpy as jnp
  from etils import epath

  from ada_jax import checkpoint as checkpoint_lib
  from ada_jax import data, hf, multihost, rounds, sharding, train, update
  from ada_jax import metrics as metrics_lib

  wd = epath.Path(workdir)
  wd.mkdir(parents=True, exist_ok=True)
  mesh = sharding.make_mesh(dict(c.mesh))
  dtype, param_dtype = jnp.dtype(c.model.dtype), jnp.dtype(c.model.param_dtype)
  tok = load_tokenizer(c, workdir)
  data_dir = c.data.data_dir or os.path.join(workdir, 'tfds')
  load = dict(
    data_dir=data_dir,
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
      raise ValueError(
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
  train_ex, dropped = data.drop_long_prompts(tok, train_ex, c.data.prompt_bucket)
  eval_ex, dropped_eval = data.drop_long_prompts(tok, eval_ex, c.data.prompt_bucket)
  if dropped or dropped_eval:
    logging.warning(
      'data: dropped %d train / %d eval prompts longer than data.prompt_bucket=%d',
      dropped,
      dropped_eval,
      c.data.prompt_bucket,
    )
  if c.model.hf_path:
    model = hf.load_model(
      c.model.hf_path, dtype=dtype, param_dtype=param_dtype, mesh=mesh
    )
  else:
    cfg = model_config(c, tok)
    model = sharding.create_sharded_model(cfg, mesh, sharding.TRAIN_RULES, seed=c.seed)
  rl = c.rl
  controller = dict(
    rule=rl.rule,
    group_size=rl.group_size,
    samples_per_round=rl.samples_per_round,
    positive_threshold=rl.positive_threshold,
    advantage=_opt(rl.advantage, str),
    normalize_std=_opt(
      rl.normalize_std, lambda v: str(v).lower() in ('1', 'true', 'yes')
    ),
  )
  if rl.rule in ('pos', 'balance'):  # The other rules define their own rounds.
    controller['schedule'] = rl.schedule
  if rl.rule == 'dapo' and rl.target_groups:
    controller['target_groups'] = rl.target_groups
  round_settings = rounds.RoundSettings(
    slots=rl.slots,
    max_rounds=rl.max_rounds,
    max_new_tokens=c.sampling.max_new_tokens,
    temperature=c.sampling.temperature,
    top_p=c.sampling.top_p,
    top_k=c.sampling.top_k,
    eos_ids=tuple(tok.eos_ids),
    verifier_timeout_s=c.verifier.timeout_s,
    verifier_workers=c.verifier.workers or None,
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
  rl_settings = train.RLSettings(
    steps=rl.steps,
    prompts_per_step=rl.prompts_per_step,
    controller=controller,
    rounds=round_settings,
    update=update_settings,
    lr=rl.lr,
    warmup=rl.warmup,
    lr_schedule=rl.lr_schedule,
    eval_every=rl.eval_every,
    eval_max_prompts=rl.eval_max_prompts,
    histogram_prompts=rl.histogram_prompts,
    histogram_k=rl.histogram_k,
    samples_to_log=c.log.samples_per_step,
  )
  sft = train.SFTSettings(**dict(c.sft))
  tx = update.make_optimizer(weight_decay=rl.weight_decay)
  ckpt = checkpoint_lib.Checkpointer(
    workdir, keep=c.checkpoint.keep, every_steps=c.checkpoint.every
  )
  trainer = train.Trainer(
    model=model,
    mesh=mesh,
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
    verify_fn=verify_fn,
  )
  resumed = trainer.restore()
  if not resumed and c.model.get('init_from', ''):
    trainer.init_from(c.model.init_from)
  trainer.writer = metrics_lib.MetricsWriter(
    workdir,
    process_index=jax.process_index(),
    tensorboard=c.log.tensorboard,
    wandb_project=c.log.wandb_project or None,
    config=c,
    resume_step=trainer.step + 1 if resumed else None,
  )
  return trainer


def main(argv) -> None:
  """Entry point (absl app)."""
  del argv
  logging.getLogger().setLevel(logging.INFO)
  # orbax and TFDS log every file operation at INFO through absl.
  from absl import logging as absl_logging

  absl_logging.set_verbosity(absl_logging.WARNING)
  init_distributed()
  from ada_jax import loop

  c, workdir = flags.FLAGS.config, flags.FLAGS.workdir
  if c is None or not workdir:
    sys.exit('usage: python -m ada_jax.main --config CONFIG[:arg] --workdir DIR')
  validate(c)
  trainer = build_trainer(c, workdir)
  loop.fit(trainer)


if __name__ == '__main__':
  define_flags()
  app.run(main)
