"""RL step cost on the tiny config: grpo vs Reinforce-Ada-balance (paper, refill).

What it measures (issue 7's `benchmarks/step_cost.py`): on `configs/tiny_arith.py`
with the SAME prompts per step and group size for every variant (B=32, n=4;
balance draws M=8 samples per active prompt per round for at most 4 rounds;
slots S = B*M = 256 for balance, S = B*n = 128 for grpo, as the config has it)
and the same training rows R = B*n = 128:

  * time per RL step (`Trainer.rl_step`: prefill, rounds, decode, verify,
    batch assembly, old log-probs, update), mean and median;
  * wall time per LIVE generated token: step time divided by the sum over
    rounds of the live slots' response lengths (idle slots of a fixed-shape
    round cost compute but produce nothing, so they count as waste); given as
    total time / total tokens over the measured steps, and as the median of
    the per-step values; also the same for the sampling part alone
    (time_sample_s + time_verify_s), which leaves out the update that every
    variant pays once per step;
  * rounds per step, samples drawn, idle slot fraction;
  * the update's throughput alone: R*(P+N) training tokens / time_update_s
    (time_update_s covers the old-log-prob forward and the clipped-surrogate
    update);
  * the ratios balance/paper : grpo and balance/refill : grpo for step time
    and time per live token, next to the reference's 1.59x-2.8x step-time
    ratios (reference doc §9, Table 2: Ada-balance vs GRPO on 8xH100 with
    verl, Qwen2.5-Math-7B and -1.5B), and the target: wall time per live
    generated token of balance/refill within 1.15x of grpo (PASS/FAIL).

Method: one shared SFT warm start (so the policy's rewards are mixed); the
warmed params are kept and loaded into each variant's trainer, each with a
fresh optimizer. Every variant then runs a few warm-up RL steps (compiles;
step 1 also has lr 0), and K measured steps. The variants' steps are
interleaved (step i of every variant, in rotating order, before step i+1), so
load drift on a shared machine hits all variants alike; each variant sees the
same prompts at the same step (same data seed). Rewards come from an
in-process verifier (`verifier.verify` in a list comprehension, no process
pool), so pool start-up and IPC noise do not dominate the tiny task's
timings; a real run's verifier pool adds its own cost to every round.

Run: python benchmarks/step_cost.py [--steps K] [--sft-steps N] [--warmup W]
       [--quick] [--seed S] [--warm-params CACHE.npz] [--workdir DIR]
(defaults K=10, N=300, W=2: 3-6 minutes on 2 shared CPU cores, up to half
of it SFT; --quick: K=4, N=100, W=1, 2-3 minutes). Without --workdir the
scratch dir (data, tokenizer, SFT checkpoint) is a temp dir, removed at the
end. `--warm-params` keeps the
SFT-warmed params in an .npz and reuses them on the next run with the same
SFT steps and seed. After 300 SFT steps the round-1 reward is low (about 2%;
after the config's own 800 steps about 5%), so nearly every balance prompt
lacks positives and every balance step runs all 4 rounds: balance's costly
regime, with few idle slots under either schedule.

Reading the figures: every variant trains on the same R rows, so the update
costs about the same per step, and balance spreads it over about 8x more live
tokens; its larger sampling batch (S=256) is also cheaper per token on CPU.
Time per live token therefore favours balance by a wide margin here; the
sampling-only column is the stricter check that rounds do not waste work.

Dimension legend: B prompts per step, n group size, M samples per round,
S slots per round, P prompt bucket, N new tokens, R training rows, K measured
steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import platform
import shutil
import tempfile
import time
from typing import Any

import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parents[1]
_CONFIG = _ROOT / 'configs' / 'tiny_arith.py'

# (label, config arg)
VARIANTS = [
  ('grpo', 'variant=grpo'),
  ('balance/paper', 'variant=balance,schedule=paper'),
  ('balance/refill', 'variant=balance,schedule=refill'),
]
# Reference §9, Table 2: Ada-balance / GRPO wall time per update step.
REFERENCE_RATIOS = {'Qwen2.5-Math-7B': 1.59, 'Qwen2.5-Math-1.5B': 2.8}
TARGET = 1.15


def fast_verify(responses, references, **kw) -> np.ndarray:
  """In-process reward: `verifier.verify` per pair (no pool, no timeout)."""
  from ada_jax import verifier

  del kw
  return np.array(
    [verifier.verify(r, f) for r, f in zip(responses, references, strict=True)]
  )


def _tiny_config(arg: str):
  spec = importlib.util.spec_from_file_location('tiny_arith_config', _CONFIG)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(arg)


def make_config(arg: str, *, data_dir: str, sft_steps: int, rl_steps: int):
  """The tiny config for one variant, quiet (no eval, no TensorBoard)."""
  c = _tiny_config(arg)
  c.data.data_dir = data_dir
  c.sft.steps = sft_steps
  c.rl.steps = rl_steps
  c.rl.eval_every = 0
  c.checkpoint.every = 10**9
  c.log.tensorboard = False
  c.log.wandb_project = ''
  return c


def check_shapes(configs: dict[str, Any]) -> None:
  """Asserts the comparison is at equal B and n, with the slots as described."""
  g = configs['grpo'].rl
  for label, c in configs.items():
    rl = c.rl
    assert rl.prompts_per_step == g.prompts_per_step == 32, (label, rl)
    assert rl.group_size == g.group_size == 4, (label, rl)
    if label.startswith('balance'):
      assert rl.rule == 'balance' and rl.samples_per_round == 8, (label, rl)
      assert rl.max_rounds == 4, (label, rl)
      assert rl.slots == rl.prompts_per_step * rl.samples_per_round, (label, rl)
    else:
      assert rl.rule == 'grpo' and rl.max_rounds == 1, (label, rl)
      assert rl.slots == rl.prompts_per_step * rl.group_size, (label, rl)


def summarize(rows: list[dict[str, Any]], train_tokens: int) -> dict[str, float]:
  """Figures of one variant from its measured metrics rows."""

  def col(key):
    return np.array([float(r[key]) for r in rows])

  step = col('time_step_s')
  sample = col('time_sample_s') + col('time_verify_s')
  # response_len_mean is the mean over live samples; samples_drawn counts them.
  live_tokens = col('response_len_mean') * col('samples_drawn')
  live, idle = col('slots_live'), col('slots_idle')
  upd = col('time_update_s')
  return {
    'step_mean': step.mean(),
    'step_median': float(np.median(step)),
    'sample_mean': sample.mean(),
    'verify_mean': col('time_verify_s').mean(),
    'update_mean': upd.mean(),
    'live_tokens': live_tokens.mean(),
    'us_per_tok': 1e6 * step.sum() / live_tokens.sum(),
    'us_per_tok_median': 1e6 * float(np.median(step / live_tokens)),
    'sample_us_per_tok': 1e6 * sample.sum() / live_tokens.sum(),
    'rounds': col('rounds').mean(),
    'drawn': col('samples_drawn').mean(),
    'idle_frac': idle.sum() / (idle + live).sum(),
    'update_tok_s': train_tokens * len(upd) / upd.sum(),
    'reward_r1': col('reward_round1_mean').mean(),
    'zero_adv': col('zero_adv_frac').mean(),
    'resp_len': col('response_len_mean').mean(),
  }


def print_table(figs: dict[str, dict[str, float]]) -> None:
  cols = [
    ('step s mean', 'step_mean', '{:.3f}'),
    ('step s med', 'step_median', '{:.3f}'),
    ('sample+verify s', 'sample_mean', '{:.3f}'),
    ('verify s', 'verify_mean', '{:.3f}'),
    ('update s', 'update_mean', '{:.3f}'),
    ('live tokens/step', 'live_tokens', '{:.0f}'),
    ('us/live tok (sum)', 'us_per_tok', '{:.1f}'),
    ('us/live tok (med)', 'us_per_tok_median', '{:.1f}'),
    ('sampling us/live tok', 'sample_us_per_tok', '{:.1f}'),
    ('rounds/step', 'rounds', '{:.2f}'),
    ('samples drawn', 'drawn', '{:.1f}'),
    ('idle slot frac', 'idle_frac', '{:.3f}'),
    ('update tok/s', 'update_tok_s', '{:.0f}'),
    ('round-1 reward', 'reward_r1', '{:.3f}'),
    ('zero-adv frac', 'zero_adv', '{:.3f}'),
    ('resp len mean', 'resp_len', '{:.2f}'),
  ]
  labels = list(figs)
  width = max(len(c[0]) for c in cols) + 2
  print(''.ljust(width) + ''.join(f'{lab:>16}' for lab in labels))
  for name, key, fmt in cols:
    print(
      name.ljust(width) + ''.join(f'{fmt.format(figs[lab][key]):>16}' for lab in labels)
    )


def print_ratios(figs: dict[str, dict[str, float]]) -> bool:
  """Prints the ratios vs grpo and the target line; returns PASS."""
  g = figs['grpo']
  ref = ', '.join(f'{v:.2f}x ({k})' for k, v in REFERENCE_RATIOS.items())
  print(f'\nratios vs grpo (reference step-time ratio, balance : GRPO: {ref})')
  print(
    f'{"":18}{"step (mean)":>13}{"step (med)":>13}{"us/live tok":>13}'
    f'{"(median)":>11}{"sampling/tok":>14}'
  )
  for label in ('balance/paper', 'balance/refill'):
    f = figs[label]
    print(
      f'{label:18}'
      f'{f["step_mean"] / g["step_mean"]:>12.2f}x'
      f'{f["step_median"] / g["step_median"]:>12.2f}x'
      f'{f["us_per_tok"] / g["us_per_tok"]:>12.2f}x'
      f'{f["us_per_tok_median"] / g["us_per_tok_median"]:>10.2f}x'
      f'{f["sample_us_per_tok"] / g["sample_us_per_tok"]:>13.2f}x'
    )
  ratio = figs['balance/refill']['us_per_tok'] / g['us_per_tok']
  ok = ratio <= TARGET
  print(
    f'\ntarget: wall time per live generated token, balance/refill within '
    f'{TARGET:.2f}x of grpo: {ratio:.2f}x -> {"PASS" if ok else "FAIL"}'
  )
  return ok


def _warm_key(args: argparse.Namespace) -> str:
  return f'sft_steps={args.sft_steps},seed={args.seed}'


def load_warm(path: str, like: Any, args: argparse.Namespace) -> Any | None:
  """Warmed params from `path` (.npz) if it holds this SFT budget, else None."""
  import jax

  if not path or not pathlib.Path(path).exists():
    return None
  with np.load(path) as f:
    if str(f['key']) != _warm_key(args):
      print(f'  {path} holds {f["key"]}, not {_warm_key(args)}: running SFT')
      return None
    leaves = [f[f'p{i}'] for i in range(len(jax.tree.leaves(like)))]
  ref = jax.tree.leaves(like)
  if any(a.shape != b.shape for a, b in zip(leaves, ref, strict=True)):
    raise ValueError(f'{path}: parameter shapes do not match the tiny model')
  return jax.tree.unflatten(jax.tree.structure(like), leaves)


def save_warm(path: str, warm: Any, args: argparse.Namespace) -> None:
  import jax

  if path:
    leaves = {f'p{i}': np.asarray(x) for i, x in enumerate(jax.tree.leaves(warm))}
    np.savez(path, key=np.array(_warm_key(args)), **leaves)


def run(args: argparse.Namespace) -> None:
  import jax

  from ada_jax import from_config
  from ada_jax.infra import compiles

  t_start = time.perf_counter()
  root = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix='step_cost_'))
  data_dir = str(root / 'tfds')
  total_steps = args.warmup + args.steps
  configs = {
    label: make_config(
      f'{arg},seed={args.seed}',
      data_dir=data_dir,
      sft_steps=args.sft_steps,
      rl_steps=total_steps,
    )
    for label, arg in VARIANTS
  }
  check_shapes(configs)
  c0 = configs['grpo']
  print(
    'step_cost: tiny config (configs/tiny_arith.py), '
    f'B={c0.rl.prompts_per_step} prompts/step, n={c0.rl.group_size}; balance '
    f'M={configs["balance/paper"].rl.samples_per_round}, '
    f'{configs["balance/paper"].rl.max_rounds} rounds max; slots '
    + ', '.join(f'{k}={c.rl.slots}' for k, c in configs.items())
  )
  print(
    f'  P={c0.data.prompt_bucket} prompt bucket, N={c0.sampling.max_new_tokens} '
    f'new tokens, R={c0.rl.prompts_per_step * c0.rl.group_size} training rows; '
    f'SFT warm start {args.sft_steps} steps (shared), {args.warmup} warm-up + '
    f'{args.steps} measured RL steps per variant, interleaved'
  )
  print(
    '  verifier: IN-PROCESS (verifier.verify per sample, no process pool); '
    f'jax {jax.__version__}, {jax.device_count()} {jax.devices()[0].platform} '
    f'device(s), {platform.machine()}'
  )

  trainers = {}
  for label, c in configs.items():
    from_config.validate(c)
    trainers[label] = from_config.trainer(
      c, str(root / label.replace('/', '_')), verify_fn=fast_verify
    )

  t0 = time.perf_counter()
  warm = load_warm(args.warm_params, trainers['grpo'].state, args)
  if warm is None:
    sft = trainers['grpo']
    sft.run_sft()
    warm = jax.device_get(sft.state)
    save_warm(args.warm_params, warm, args)
    how = f'SFT warm start ({args.sft_steps} steps)'
  else:
    how = f'warm params loaded from {args.warm_params}'
  for t in trainers.values():
    t.state = jax.tree.map(lambda w, x: jax.device_put(w, x.sharding), warm, t.state)
    t.sft_done = True
  print(f'  {how}: {time.perf_counter() - t0:.1f}s')

  rows: dict[str, list[dict[str, Any]]] = {label: [] for label in trainers}
  labels = list(trainers)
  compiles_at_measure = None
  t0 = time.perf_counter()
  for i in range(total_steps):
    if i == args.warmup:
      compiles_at_measure = compiles.num_compiles()
      print(
        f'  warm-up ({args.warmup} steps x {len(labels)}): '
        f'{time.perf_counter() - t0:.1f}s'
      )
      t0 = time.perf_counter()
    order = labels[i % len(labels) :] + labels[: i % len(labels)]
    for label in order:
      row = trainers[label].rl_step()
      if i >= args.warmup:
        rows[label].append(row)
  compiles_measured = compiles.num_compiles() - compiles_at_measure
  print(
    f'  measured ({args.steps} steps x {len(labels)}): '
    f'{time.perf_counter() - t0:.1f}s; backend compiles during measured '
    f'steps: {compiles_measured}'
  )

  train_tokens = (
    c0.rl.prompts_per_step
    * c0.rl.group_size
    * (c0.data.prompt_bucket + c0.sampling.max_new_tokens)
  )
  figs = {label: summarize(r, train_tokens) for label, r in rows.items()}
  print()
  print_table(figs)
  print_ratios(figs)
  for t in trainers.values():
    if t.ckpt is not None:
      t.ckpt.wait()
  if args.workdir:
    print(f'\ntotal wall time {time.perf_counter() - t_start:.0f}s; workdir {root}')
  else:
    shutil.rmtree(root, ignore_errors=True)
    print(f'\ntotal wall time {time.perf_counter() - t_start:.0f}s')


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--steps', type=int, default=None, help='measured RL steps (K)')
  p.add_argument('--sft-steps', type=int, default=None, help='SFT warm-start steps')
  p.add_argument('--warmup', type=int, default=None, help='warm-up RL steps')
  p.add_argument('--quick', action='store_true', help='K=4, SFT 100, warm-up 1')
  p.add_argument('--workdir', default='', help='scratch dir (default: a temp dir)')
  p.add_argument('--seed', type=int, default=0, help='config seed (model, data order)')
  p.add_argument(
    '--warm-params',
    default='',
    help='.npz cache of the SFT-warmed params: loaded if it holds the same '
    'SFT steps and seed, else written after SFT',
  )
  args = p.parse_args()
  quick = dict(steps=4, sft_steps=100, warmup=1)
  full = dict(steps=10, sft_steps=300, warmup=2)
  for key, value in (quick if args.quick else full).items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  run(args)


if __name__ == '__main__':
  main()
