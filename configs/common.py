r"""Shared by the configs: arg strings, TPU and GPU mesh presets, variant settings.

Every config's `get_config(arg)` takes a comma-separated arg string
(`variant=grpo,tpu=v5p-64,runlocal`) that `parse_arg` checks against the
keys and values the config accepts; an unknown key or value is a ValueError
naming the config and the key. `paper_config` builds the reference setup
(`run_reinforce_ada.sh` / `run_grpo.sh`, reference doc section 5.2) that the
four paper configs share; each of them only adds its model and data.

Mesh presets (`tpu=POD`, any TPU slice: v4-8 .. v4-256, v5p-8 .. v5p-256,
v5litepod-1 .. 256, v6e-4 .. v6e-256; `infra/tpu_pods.py`): axes (data,
fsdp, tensor) = (1, -1, 0), the tensor axis left to the plan's rule
(planner/layout.py: the smallest that divides the model's KV heads and
whose plan fits the pod's chips), and `rl.micro_batch_rows = 0` (one row
per batch shard per micro-batch, data x fsdp). The config boundary
(`from_config.resolve_layout`) fills both when a command validates the
config; a pod where no tensor axis fits is refused there with the plan's
line. All paper configs run `model.attention=auto` (splash attention on
TPU) and `model.remat=block`.

What the rule picks for the paper's step (Ada-balance: B = 512 prompts, S =
B·M = 4096 slots, up to 4 rounds, P + N = 1024 + 2048, R = 2048 rows,
mini-batch 512), with the peak HBM per chip and its phase, by the plan for
TPU (planner/memory.py; `python -m ada_jax.plan --check --target tpu`
compiles the real programs with the TPU compiler for the pod's topology):

[plan tables]

| model | v4-32 (16 chips, 32 GiB) | v5p-64 (32 chips, 95 GiB) | v6e-64 (64 chips, 32 GiB) |
|---|---|---|---|
| 1.5B (Qwen2.5-Math-1.5B) | (1, -1, 1), m=16: 20.3 GiB (sampling) | (1, -1, 1), m=32: 11.6 GiB (sampling) | (1, -1, 1), m=64: 7.2 GiB (sampling) |
| 3B (Llama-3.2-3B-Instruct) | (1, -1, 1), m=16, 4 waves: 26.8 GiB (sampling) | (1, -1, 1), m=32: 38.9 GiB (sampling) | (1, -1, 1), m=64: 22.4 GiB (sampling) |
| 4B (Qwen3-4B-Instruct-2507) | (1, -1, 4), m=4, 4 waves: 28.6 GiB (sampling) | (1, -1, 1), m=32: 49.8 GiB (sampling) | (1, -1, 1), m=64: 28.6 GiB (sampling) |
| 7B (Qwen2.5-Math-7B) | (1, -1, 4), m=4, 2 waves: 26.0 GiB (sampling) | (1, -1, 1), m=32: 32.9 GiB (sampling) | (1, -1, 1), m=64: 23.7 GiB (reshard) |

Other variants where the rule differs: 3B dapo on v4-32: tensor 2, 2 wave(s); 3B grpo on v4-32: tensor 1, 2 wave(s); 4B dapo on v4-32: tensor 2, 4 wave(s); 4B grpo on v4-32: tensor 8, 2 wave(s); 7B dapo on v4-32: tensor 4, 1 wave(s); 7B grpo on v4-32: tensor 2, 1 wave(s).

Every phase by the plan (Ada-balance; GiB per chip; chunked phases at the largest chunk of slots that fits):

| model | pod | waves | RL step (peak phase) | histogram + in-run eval | evaluate (N=4096) | select_prompts |
|---|---|---|---|---|---|---|
| 1.5B | v4-32 | 1 | 20.3 (sampling) | 26.4 at 4096 slots | 22.5 at 2048 slots | 25.3 at 4096 slots |
| 1.5B | v5p-64 | 1 | 11.6 (sampling) | 14.6 at 4096 slots | 22.5 at 4096 slots | 14.1 at 4096 slots |
| 1.5B | v6e-64 | 1 | 7.2 (sampling) | 8.7 at 4096 slots | 12.7 at 4096 slots | 8.5 at 4096 slots |
| 3B | v4-32 | 4 | 26.8 (sampling) | 19.2 at 512 slots | 25.3 at 512 slots | 28.0 at 1024 slots |
| 3B | v5p-64 | 1 | 38.9 (sampling) | 51.2 at 4096 slots | 83.3 at 4096 slots | 50.0 at 4096 slots |
| 3B | v6e-64 | 1 | 22.4 (sampling) | 28.6 at 4096 slots | 25.3 at 2048 slots | 28.0 at 4096 slots |
| 4B | v4-32 | 4 | 28.6 (sampling) | 18.8 at 512 slots | 26.7 at 512 slots | 16.0 at 512 slots |
| 4B | v5p-64 | 1 | 49.8 (sampling) | 65.5 at 4096 slots | 57.2 at 2048 slots | 64.1 at 4096 slots |
| 4B | v6e-64 | 1 | 28.6 (sampling) | 22.3 at 2048 slots | 19.9 at 1024 slots | 21.6 at 2048 slots |
| 7B | v4-32 | 2 | 26.0 (sampling) | 20.0 at 1024 slots | 23.0 at 1024 slots | 25.7 at 2048 slots |
| 7B | v5p-64 | 1 | 32.9 (sampling) | 39.0 at 4096 slots | 53.1 at 4096 slots | 36.4 at 4096 slots |
| 7B | v6e-64 | 1 | 23.7 (reshard) | 26.6 at 4096 slots | 23.9 at 2048 slots | 25.3 at 4096 slots |

[end plan tables]

Why. With block remat, blockwise attention and micro-batches over every row
shard, the update and the old-logp pass are small. Memory is set by
sampling: the round's KV cache (each prompt's P keys once per group of its
M slots, and each slot's own N: S / (data x fsdp) slots, KV heads split
over tensor when they divide; sampler.round_cache) and, next to it, the
prompt cache of all B prompts that the round's slot gather all-gathers
onto every device (split over tensor only), plus the bf16 sampling copy of
the weights (split over tensor only). A larger tensor axis shrinks the
gathered prompts and the sampling copy but costs a collective per layer
per token, so the rule takes the smallest that fits. DAPO prefills 2B =
1024 prompts (its gathered prompt cache is twice the others').

Where a tensor axis alone cannot hold the paper's step, the rule samples
each round in slot waves (`sampling.waves`: W fixed-shape waves of S/W
slots from the same prompt cache, the same samples; the round's KV cache
shrinks W-fold, the gathered prompt cache of all B prompts does not),
leaving 10% of HBM free; beyond 8 waves `python -m ada_jax.plan` names the
step halved or quartered. Not part of the step: the trainer's pass-rate
histogram scores S // k prompts x k samples in one round of S slots;
greedy evaluation and the evaluate command (k = 1) run S prompts in an
aligned round (slot i continues prompt i, no gather); `plan` prints their
verdicts separately. The trainer's histogram and evaluations, evaluate and
select_prompts halve `rl.slots` for their chunks until their phase fits
the chip (`from_config.command_slots`; `plan` prints the chunk).

GPU presets (`gpu=NxCHIP`: N GPUs in all, 8 per host, CHIP h100 or h200;
`infra/gpu_hosts.py`): `gpu=8xh100` (the paper's hardware), `gpu=8xh200`,
`gpu=1xh100`. The same mesh (1, -1, 0), micro-batch (one row per batch
shard) and slot waves by the same rule, planned for the GPU platform
(blockwise attention there too) against what JAX may allocate per GPU: its
HBM times XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75: 59.7 of 79.6 GiB
on an H100, 105.3 of 140.4 GiB on an H200; `planner/chips.py`), so the
run's process needs the same fraction as the plan (export it before both
to give JAX more). `tpu=` and `gpu=` together are an error. The paper's
step on one host of 8 GPUs, at the default fraction:

[gpu plan tables]

| model | 8xh100 (8 GPUs, 59.7 of 79.6 GiB) | 8xh200 (8 GPUs, 105.3 of 140.4 GiB) |
|---|---|---|
| 1.5B (Qwen2.5-Math-1.5B) | (1, -1, 1), m=8: 37.6 GiB (sampling), 63% of it | (1, -1, 1), m=8: 37.6 GiB (sampling), 36% of it |
| 3B (Llama-3.2-3B-Instruct) | (1, -1, 2), m=4, 4 waves: 44.7 GiB (sampling), 75% of it | (1, -1, 1), m=8, 2 waves: 77.6 GiB (sampling), 74% of it |
| 4B (Qwen3-4B-Instruct-2507) | (1, -1, 4), m=2, 8 waves: 36.1 GiB (sampling), 60% of it | (1, -1, 4), m=2, 2 waves: 94.0 GiB (sampling), 89% of it |
| 7B (Qwen2.5-Math-7B) | (1, -1, 2), m=4, 2 waves: 51.8 GiB (sampling), 87% of it | (1, -1, 1), m=8: 89.1 GiB (sampling), 85% of it |

Other variants where the rule differs: 3B dapo on 8xh100: tensor 4, 2 wave(s); 3B grpo on 8xh100: tensor 2, 2 wave(s); 3B dapo on 8xh200: tensor 2, 1 wave(s); 3B grpo on 8xh200: tensor 1, 1 wave(s); 4B dapo on 8xh100: tensor 8, 4 wave(s); 4B grpo on 8xh100: tensor 4, 4 wave(s); 4B grpo on 8xh200: tensor 1, 1 wave(s); 7B dapo on 8xh100: tensor 2, 1 wave(s); 7B grpo on 8xh100: tensor 2, 1 wave(s).

Every phase by the plan (Ada-balance; GiB per GPU; chunked phases at the largest chunk of slots that fits):

| model | GPUs | waves | RL step (peak phase) | histogram + in-run eval | evaluate (N=4096) | select_prompts |
|---|---|---|---|---|---|---|
| 1.5B | 8xh100 | 1 | 37.6 (sampling) | 49.8 at 4096 slots | 42.0 at 2048 slots | 47.7 at 4096 slots |
| 1.5B | 8xh200 | 1 | 37.6 (sampling) | 49.8 at 4096 slots | 81.2 at 4096 slots | 47.7 at 4096 slots |
| 3B | 8xh100 | 4 | 44.7 (sampling) | 51.5 at 1024 slots | 41.7 at 512 slots | 47.0 at 1024 slots |
| 3B | 8xh200 | 2 | 77.6 (sampling) | 54.5 at 1024 slots | 83.3 at 1024 slots | 94.1 at 2048 slots |
| 4B | 8xh100 | 8 | 36.1 (sampling) | 35.8 at 512 slots | 51.6 at 512 slots | 30.2 at 512 slots |
| 4B | 8xh200 | 2 | 94.0 (sampling) | 64.1 at 1024 slots | 51.6 at 512 slots | 58.5 at 1024 slots |
| 7B | 8xh100 | 2 | 51.8 (sampling) | 39.9 at 1024 slots | 46.0 at 1024 slots | 51.5 at 2048 slots |
| 7B | 8xh200 | 1 | 89.1 (sampling) | 69.2 at 2048 slots | 91.9 at 2048 slots | 58.5 at 2048 slots |

[end gpu plan tables]

Every paper config fits 8xH100 with at least 10% of the allocatable memory
free in every phase (grpo, pos and balance; tests/test_gpu_plan.py), the
3B and 4B in slot waves; one H100 holds none of them (`plan` names the
smallest change). On 8xH100 `plan` sets its roofline step beside the
paper's measured step times as like for like; elsewhere they are the
paper's 8xH100 times.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import ml_collections

from ada_jax import hub_ids

VARIANTS = ('grpo', 'pos', 'balance', 'dapo', 'est')
SCHEDULES = ('paper', 'refill')
# The pods of the tables above (the paper configs' launch examples); `tpu=`
# takes any v4, v5p, v5e (v5litepod) or v6e accelerator type.
EXAMPLE_PODS = ('v4-32', 'v5p-64', 'v6e-64')
# The GPU presets of the docs (`gpu=` takes any NxCHIP of infra/gpu_hosts.py);
# the tables show the two 8-GPU hosts, the paper's 8xH100 first.
GPU_PRESETS = ('1xh100', '8xh100', '8xh200')
EXAMPLE_GPUS = ('8xh100', '8xh200')
# A `tpu=` preset's mesh: full FSDP with the tensor axis left to the plan's
# rule (planner/layout.py: the smallest one dividing the KV heads that fits).
RULE_MESH = {'data': 1, 'fsdp': -1, 'tensor': 0}
_FLAGS = ('runlocal',)  # Bare words; `runlocal` and `runlocal=1` both work.


def parse_arg(
  arg: str | None,
  config_name: str,
  choices: Mapping[str, Sequence[str] | None],
  defaults: Mapping[str, str],
) -> dict[str, str]:
  """'a=1,b=2,runlocal' -> {'a': '1', 'b': '2', 'runlocal': 'True', ...}.

  Args:
    arg: the string after `:` in `--config configs/x.py:arg` (None: empty).
    config_name: for error messages, e.g. `configs/qwen25_math_7b.py`.
    choices: the accepted keys; a key's allowed values, or None for free
      values (seed).
    defaults: values of the keys not given.

  Raises:
    ValueError: an unknown key, a value not allowed, or a key without a
      value; the message names the config and the key.
  """
  out = dict(defaults)
  for part in (arg or '').split(','):
    part = part.strip()
    if not part:
      continue
    key, eq, value = (s.strip() for s in part.partition('='))
    if key not in choices:
      raise ValueError(
        f'{config_name}: unknown arg key {key!r}; known keys: {sorted(choices)}'
      )
    if key in _FLAGS:
      if value.lower() not in ('', '1', 'true'):
        raise ValueError(f'{config_name}: arg key {key!r} takes no value')
      value = 'True'
    elif not eq or not value:
      raise ValueError(f'{config_name}: arg key {key!r} needs a value ({key}=...)')
    allowed = choices[key]
    if allowed is not None and value not in allowed:
      raise ValueError(
        f'{config_name}: arg {key}={value!r} is not one of {tuple(allowed)}'
      )
    out[key] = value
  if 'seed' in out and not str(out['seed']).lstrip('-').isdigit():
    raise ValueError(f'{config_name}: arg seed={out["seed"]!r} is not an integer')
  return out


def check_pod(tpu: str, config_name: str) -> str:
  """The `tpu=` arg when it names a TPU slice (e.g. v5p-64), else a ValueError."""
  from ada_jax.infra import tpu_pods

  try:
    tpu_pods.pod(tpu)
  except ValueError as e:
    raise ValueError(f'{config_name}: arg tpu={tpu!r}: {e}') from None
  return tpu


def check_gpus(gpu: str, config_name: str) -> str:
  """The `gpu=` arg when it names GPUs as NxCHIP (e.g. 8xh100), else a ValueError."""
  from ada_jax.infra import gpu_hosts

  try:
    gpu_hosts.hosts(gpu)
  except ValueError as e:
    raise ValueError(f'{config_name}: arg gpu={gpu!r}: {e}') from None
  return gpu


def check_presets(args: Mapping[str, str], config_name: str) -> None:
  """`tpu=` and `gpu=` each checked, and not both (a ValueError naming both)."""
  if args.get('tpu') and args.get('gpu'):
    raise ValueError(
      f'{config_name}: args tpu={args["tpu"]!r} and gpu={args["gpu"]!r}: one '
      'preset, a TPU slice or GPUs, not both'
    )
  if args.get('tpu'):
    check_pod(args['tpu'], config_name)
  if args.get('gpu'):
    check_gpus(args['gpu'], config_name)


def variant_rl(
  variant: str, *, prompts: int, group_size: int, samples_per_round: int, rounds: int
) -> dict[str, int]:
  """Prompts, slots, rounds and DAPO target of a variant at B prompts per step.

  grpo: one round of n per prompt (S = B·n). pos / balance: up to N rounds of
  M per active prompt (S = B·M, the paper's round 1). dapo: 2B candidates
  tried n at a time over 2 rounds of S = B·n slots, keeping the first B mixed
  groups (the same sampling budget as one Ada round). est: one round of
  S = B·M slots spread ∝ 1/p̂, every sample kept (the same budget).
  """
  b, n, m = prompts, group_size, samples_per_round
  if variant == 'grpo':
    return dict(prompts_per_step=b, slots=b * n, max_rounds=1, target_groups=0)
  if variant in ('pos', 'balance'):
    return dict(prompts_per_step=b, slots=b * m, max_rounds=rounds, target_groups=0)
  if variant == 'dapo':
    return dict(prompts_per_step=2 * b, slots=b * n, max_rounds=2, target_groups=b)
  if variant == 'est':
    return dict(prompts_per_step=b, slots=b * m, max_rounds=1, target_groups=0)
  raise ValueError(f'variant={variant!r} is not one of {VARIANTS}')


def train_rows(variant: str, rl: Mapping[str, int], group_size: int) -> int:
  """R, the training rows of one step (adaptive.max_rows, without jax)."""
  if variant == 'dapo':
    return rl['target_groups'] * group_size
  if variant == 'est':
    return rl['slots']
  return rl['prompts_per_step'] * group_size


PAPER_DEFAULTS = {
  'variant': 'balance',
  'schedule': 'paper',
  'data': 'hard',
  'tpu': '',
  'gpu': '',
  'seed': '0',
  'runlocal': '',
}


def paper_args(
  arg: str | None, config_name: str, datasets: Mapping[str, str]
) -> dict[str, str]:
  """`parse_arg` with the paper configs' keys; `datasets` maps data= values."""
  choices = {
    'variant': VARIANTS,
    'schedule': SCHEDULES,
    'data': None,  # Checked below, with the reason.
    'tpu': None,  # Checked below: any TPU slice.
    'gpu': None,  # Checked below: NxCHIP GPUs.
    'seed': None,
    'runlocal': None,
  }
  args = parse_arg(arg, config_name, choices, PAPER_DEFAULTS)
  check_presets(args, config_name)
  if args['data'] not in datasets:
    raise ValueError(
      f'{config_name}: arg data={args["data"]!r} is not one of {tuple(datasets)} '
      '(easy prompt sets exist only for Qwen2.5-Math-1.5B and -7B)'
    )
  return args


def paper_config(
  args: Mapping[str, str],
  *,
  config_name: str,
  family: str,
  size: str,
  dataset: str,
) -> ml_collections.ConfigDict:
  """The reference setup for one model; the caller has parsed `args`.

  Args:
    args: from `parse_arg`: variant, schedule, tpu and gpu ('' = none),
      seed, runlocal ('True' or '').
    config_name: for error messages.
    family: qwen2 | qwen3 | llama (the tiny model of runlocal).
    size: the model size, e.g. '7b' (for the tables).
    dataset: the `ada_math_local/<config>` training set.
  """
  variant, schedule = args['variant'], args['schedule']
  grpo_like = variant in ('grpo', 'dapo')  # run_grpo.sh optimizer settings.
  c = ml_collections.ConfigDict()
  # Run.
  c.seed = int(args['seed'])
  # Mesh: full FSDP by default; a `tpu=` pod or `gpu=` host leaves the
  # tensor axis to the plan's rule (module docstring), and `pod` / `gpu`
  # names the chips it plans for.
  c.pod = args['tpu']
  c.gpu = args.get('gpu', '')
  preset = args['tpu'] or c.gpu
  mesh = dict(RULE_MESH) if preset else {'data': 1, 'fsdp': -1, 'tensor': 1}
  c.mesh = ml_collections.ConfigDict(mesh)
  # Model: a local HF directory, required (config_rules names the key).
  c.model = ml_collections.ConfigDict()
  c.model.hf_path = ''  # --config.model.hf_path=/path/to/<HF model dir>.
  c.model.tokenizer_path = ''  # Empty: hf_path's tokenizer.
  # The released model (`python -m ada_jax.stage` fetches it into a bucket).
  c.model.hub_id = hub_ids.MODELS[os.path.splitext(os.path.basename(config_name))[0]]
  # A run's workdir whose latest checkpoint gives the initial params (e.g. a
  # shared SFT warm start); empty: none. A resumed run ignores it.
  c.model.init_from = ''
  # The position limit (0: the checkpoint's). The reference raises
  # Qwen2.5-Math's 4096 to 32768 (its run script's override_config), so its
  # evaluation writes 4096 new tokens after the 1024-token prompt bucket.
  c.model.max_position_embeddings = 32768 if 'qwen25_math' in config_name else 0
  c.model.dtype = 'bfloat16'  # Compute and KV cache.
  c.model.param_dtype = 'float32'  # Master weights: lr 1e-6 vanishes in bf16.
  # Training and prefill never build [H, T, T] scores (chunked; splash on TPU),
  # and the backward recomputes each block (the plan in the module docstring).
  c.model.attention = 'auto'
  c.model.remat = 'block'
  c.model.tiny = ml_collections.ConfigDict(  # Only read when hf_path is ''.
    dict(
      family=family,
      hidden=64,
      layers=2,
      heads=4,
      kv_heads=2,
      head_dim=16,
      mlp=128,
      max_positions=32,
    )
  )
  # Data: built once per worker from data.manual_dir (README "Data": the
  # stage command puts the sets in a bucket; point manual_dir there).
  c.data = ml_collections.ConfigDict()
  c.data.name = f'ada_math_local/{dataset}'
  c.data.train_split = 'train'
  # The prompt sets have no held-out split; validation runs with
  # `python -m ada_jax.evaluate --datasets validate` on the checkpoints.
  c.data.eval_split = ''
  c.data.data_dir = os.path.expanduser('~/tensorflow_datasets')
  c.data.manual_dir = os.path.expanduser('~/ada_manual')
  c.data.template = 'chat'  # The reference's system prompt + chat template.
  c.data.prompt_bucket = 1024  # Tokens; the reference's max prompt length.
  # The reference's prompt preparation drops training problems over 700
  # tokens (the problem text; evaluation sets are never filtered).
  c.data.max_problem_tokens = 700
  # Controller (n, M, N, τ) and per-variant slots.
  c.rl = ml_collections.ConfigDict()
  c.rl.steps = 400  # The script's; the paper text says 600.
  c.rl.rule = variant
  c.rl.schedule = schedule  # Read by pos/balance only.
  c.rl.group_size = 4  # n.
  c.rl.samples_per_round = 8  # M.
  c.rl.positive_threshold = 0.7  # τ.
  c.rl.update(
    variant_rl(variant, prompts=512, group_size=4, samples_per_round=8, rounds=4)
  )
  c.rl.advantage = ''  # The rule's default: global (Ada), local (grpo/dapo).
  c.rl.normalize_std = ''  # The rule's default: std only with local.
  # Optimizer: AdamW, grad clip 1; the two scripts differ here (section 5.2).
  c.rl.lr = 1e-6
  c.rl.warmup = 0 if grpo_like else 10  # Steps, linear from 0.
  c.rl.lr_schedule = 'constant'
  c.rl.weight_decay = 0.01 if grpo_like else 0.0
  c.rl.grad_clip = 1.0
  # Update: 4 mini-batches per step (128 prompts x n = 512 rows), 1 epoch.
  rows = train_rows(variant, c.rl, 4)
  c.rl.mini_batch_rows = rows // 4
  # 0: one row per batch shard (data x fsdp of the mesh), by the layout rule.
  c.rl.micro_batch_rows = 0
  c.rl.epochs = 1
  # Consecutive steps whose every update is non-finite before the run stops.
  c.rl.max_nonfinite_steps = 3
  # RL loss: clip-higher, dual clip, token-mean, no entropy bonus, no KL.
  c.rl.clip_low = 0.2
  c.rl.clip_high = 0.28
  c.rl.clip_ratio_c = 3.0 if grpo_like else 10.0
  c.rl.loss_agg_mode = 'token-mean'
  c.rl.entropy_coef = 0.0  # The script's; the paper text says 1e-4.
  # Evaluation during training (greedy; needs data.eval_split).
  c.rl.eval_every = 50
  c.rl.eval_max_prompts = 0
  c.rl.histogram_prompts = 512
  c.rl.histogram_k = 8
  # Sampler.
  c.sampling = ml_collections.ConfigDict()
  c.sampling.max_new_tokens = 2048
  c.sampling.temperature = 1.0
  c.sampling.top_p = 1.0
  c.sampling.top_k = 0
  # Stop ids: 'default' also stops on the known end-of-turn tokens in the
  # vocabulary (a base model may end a turn on <|im_end|>); 'model' stops on
  # the tokenizer's EOS and generation_config's eos_token_id only, as the
  # reference's vLLM does.
  c.sampling.stop_ids = 'default'
  # Slot waves: each round's S slots decoded in W waves of S/W, the step
  # unchanged; 0 = by the plan's rule (one wave where it fits, else 2, 4 or
  # 8: planner/layout.py).
  c.sampling.waves = 0
  # No SFT: RL starts from the released model.
  c.sft = ml_collections.ConfigDict(
    dict(steps=0, batch_size=64, lr=1e-5, warmup=0, lr_schedule='constant')
  )
  # Reward: the reference's 20 s per item, 16 processes (per host here).
  c.verifier = ml_collections.ConfigDict(
    dict(timeout_s=20.0, workers=16, backend='ada')
  )
  # Checkpoints every 50 steps; --config.checkpoint.keep=8 keeps all of
  # 50..400, as the reference's evaluation protocol reads them. And every 30
  # minutes: 50 steps are hours (the paper's step on 8xH100: 1.5B 102-290 s,
  # 7B 236-375 s), all lost to a preemption without it; a save costs one
  # asynchronous write of 1.2-23 s per host (planner/checkpoint_time.py: 7B
  # 91 GB on v4-32's 4 hosts at 1 GB/s each is the slowest), under 2% of 30
  # minutes even if it blocked, and a time-based checkpoint is kept only
  # while it is the newest, so storage holds one more at most. A SIGKILL then
  # loses at most 30 minutes and a step.
  c.checkpoint = ml_collections.ConfigDict(dict(every=50, every_minutes=30.0, keep=2))
  c.log = ml_collections.ConfigDict(
    dict(samples_per_step=4, wandb_project='', tensorboard=True)
  )
  if args['runlocal']:
    runlocal(c, variant)
  return c


def runlocal(c: ml_collections.ConfigDict, variant: str) -> None:
  """Shrinks a paper config in place to a ~1 minute CPU run.

  The model becomes a random tiny one of the same family (model.tiny) with
  the built-in tokenizer, the data the synthetic ada_arith task; the
  controller keeps n, M, N and τ, at B = 8 prompts.
  """
  c.mesh = ml_collections.ConfigDict({'data': -1, 'fsdp': 1, 'tensor': 1})
  c.model.hf_path = ''
  c.model.tokenizer_path = ''
  c.model.dtype = 'float32'
  c.model.max_position_embeddings = 0  # The tiny model's own.
  c.model.param_dtype = 'float32'
  c.data.name = 'ada_arith'
  c.data.train_split = 'train'
  c.data.eval_split = 'test'
  c.data.data_dir = ''  # WORKDIR/tfds.
  c.data.manual_dir = ''
  c.data.template = 'tiny'
  c.data.prompt_bucket = 16
  c.rl.steps = 3
  c.rl.update(
    variant_rl(variant, prompts=8, group_size=4, samples_per_round=8, rounds=4)
  )
  c.rl.mini_batch_rows = train_rows(variant, c.rl, 4) // 4
  c.rl.micro_batch_rows = c.rl.mini_batch_rows
  c.rl.lr = 2e-4
  c.rl.warmup = 1
  c.rl.eval_every = 0
  c.rl.eval_max_prompts = 32
  c.rl.histogram_prompts = 16
  c.rl.histogram_k = 4
  c.sampling.max_new_tokens = 8
  c.sft = ml_collections.ConfigDict(
    dict(steps=0, batch_size=32, lr=2e-3, warmup=0, lr_schedule='constant')
  )
  c.verifier = ml_collections.ConfigDict(dict(timeout_s=2.0, workers=2, backend='ada'))
  c.checkpoint = ml_collections.ConfigDict(dict(every=2, every_minutes=0.0, keep=1))
