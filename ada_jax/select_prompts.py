r"""Prompt selection by pass rate, as the reference built its prompt sets.

  python -m ada_jax.select_prompts --config CONFIG[:arg] --checkpoint DIR \
      --k 16 --max-pass-rate 0.125 --out ~/ada_select/hard.jsonl \
      [--split train] [--max-prompts 0] [--seed 42] [--max-new-tokens N] \
      [--slots S] [--config.key=value ...]

Reference section 6: the paper kept, per base model, the prompts that the
model answers correctly at least once in K=16 samples (temperature 1) and
at most a bound of the time: 0.125 gives the "hard" sets (1-2 of 16),
0.313 the "easy" ones (1-5 of 16). Here, in order:

1. read split SPLIT of the config's training set (`data.name`, with
   `data.manual_dir` for local files; `data.levels` as in training);
2. deduplicate by `datasets.prompt_key(problem)`, keeping the first;
3. drop prompts whose reference the verifier cannot parse (such a prompt
   can never be rewarded except by copying the reference's text); the
   verifier is `verifier.backend`: `--config.verifier.backend=math_verify`
   selects and filters with Math-Verify, as the reference did;
4. drop prompts longer than `data.prompt_bucket` (training drops them too),
   then keep the first --max-prompts (0: all);
5. sample k answers per prompt from the policy of CHECKPOINT (a run workdir,
   its latest checkpoint, or an HF directory) with the config's template,
   sampling settings and verifier, through the run's fixed-shape sampler
   (`scoring.sample_and_score`, one compile);
6. keep the prompts with 1 <= correct <= max_pass_rate·k (`select`).

Writes OUT, JSONL rows `problem`, `answer`, `level` (if known),
`pass_rate`, `correct`, `k`, which the `ada_math_local` builder reads, and
next to it `<OUT stem>.histogram.json`: the counts of every step and the
histogram of the sampled prompts' pass rates (both also printed). To train
on the selection, copy OUT alone into `<manual_dir>/custom/` (the builder
reads every .json file in that folder, so leave the histogram out) on every
worker and pass `--config.data.name=ada_math_local/custom
--config.data.manual_dir=<manual_dir>`.

Dimension legend: Q prompts, k samples per prompt.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ada_jax import from_config
from ada_jax.verifier import backends

DEFAULT_K = 16
DEFAULT_MAX_PASS_RATE = 0.125


def prefilter(
  keys: Sequence[int], references: Sequence[str], backend: str = 'ada'
) -> tuple[list[int], int, int]:
  """(indices kept, duplicates dropped, unparsable references dropped).

  Duplicates go first: the first occurrence of a key stands for all of
  them, whatever its reference. A reference is parsable if the grader
  `backend` reads it (`verifier.backends.reference_parses`).
  """
  seen: set[int] = set()
  kept, duplicates, unparsable = [], 0, 0
  for i, (key, reference) in enumerate(zip(keys, references, strict=True)):
    if key in seen:
      duplicates += 1
      continue
    seen.add(key)
    if not backends.reference_parses(reference, backend):
      unparsable += 1
      continue
    kept.append(i)
  return kept, duplicates, unparsable


def select(correct_QxK: np.ndarray, max_pass_rate: float) -> np.ndarray:
  """Which prompts to keep (bool [Q]): 1 <= correct <= the bound·k.

  Compared on counts (correct <= bound·k, with a little slack), so the
  reference's 0.125 keeps exactly 2 of 16 and 0.313 keeps 5 of 16.
  """
  correct = np.asarray(correct_QxK, bool).sum(axis=1)
  k = correct_QxK.shape[1]
  return (correct >= 1) & (correct <= max_pass_rate * k + 1e-9)


def _histogram_path(out: str) -> str:
  return os.path.splitext(out)[0] + '.histogram.json'


def run(
  c: Any,
  checkpoint: str,
  *,
  out: str,
  split: str = 'train',
  k: int = DEFAULT_K,
  max_pass_rate: float = DEFAULT_MAX_PASS_RATE,
  max_prompts: int = 0,
  max_new_tokens: int | None = None,
  slots: int | None = None,
  seed: int = 42,
  verify_fn: Callable[..., np.ndarray] | None = None,
) -> dict[str, Any]:
  """Selects prompts (module docstring) and writes OUT and its histogram.

  Args:
    c: the ConfigDict (data, model, sampling, verifier, rl.slots).
    checkpoint: a run workdir or an HF directory (`from_config.policy`,
      read-only).
    out: the JSONL file to write (its folder is created).
    split: the split of `data.name` to select from.
    k: samples per prompt.
    max_pass_rate: the bound on correct / k.
    max_prompts: sample at most this many prompts (0: all).
    max_new_tokens: default `sampling.max_new_tokens`, capped by the
      model's positions minus `data.prompt_bucket`.
    slots: slots per sampler chunk; default `rl.slots`, halved until the
      plan's selection phase fits a device (`from_config.command_slots`);
      given, a chunk the plan says does not fit is refused
      (`from_config.command_slots_problem`).
    seed: PRNG seed of the samples (the reference: 42).
    verify_fn: replaces `verifier.verify_batch` (tests).

  Returns:
    The report written next to OUT: counts, bound, k, histogram.
  """
  import jax
  from etils import epath

  from ada_jax import data, from_config
  from ada_jax.infra import run_dir

  # Imported here: the sampler stack (JAX, transformers) is slow to import,
  # and `--help` should not pay for it.
  from ada_jax.rl import scoring

  if epath.Path(out).is_dir():
    raise run_dir.WorkdirError(f'--out {out} is a directory: pass a .jsonl file')
  run_dir.refuse_run_dir(os.path.dirname(os.path.abspath(out)), '--out (its folder)')
  policy = from_config.policy(c, checkpoint)
  model, tok, step, positions = (
    policy.model,
    policy.tok,
    policy.step,
    policy.max_positions,
  )
  bucket = c.data.prompt_bucket
  max_new_tokens = max_new_tokens or c.sampling.max_new_tokens
  if max_new_tokens > positions - bucket:
    logging.warning(
      'max_new_tokens=%d capped at %d: the model has %d positions and the '
      'prompt bucket (data.prompt_bucket) takes %d',
      max_new_tokens,
      positions - bucket,
      positions,
      bucket,
    )
    max_new_tokens = positions - bucket
  slots = from_config.command_chunk(
    c, model.config, 'selection', max_new_tokens, slots, 'select_prompts'
  )
  examples = data.load_examples(
    c.data.name,
    split,
    data_dir=from_config.data_dir(
      c, c.data.name, policy.run, os.path.dirname(os.path.abspath(out))
    ),
    manual_dir=c.data.manual_dir or None,
    tokenizer=tok,
    template=c.data.template,
  )
  examples = data.select_levels(examples, c.data.get('levels', ''))
  counts = {'input': len(examples)}
  backend = from_config.verifier_backend(c)
  kept, counts['duplicates'], counts['unparsable_reference'] = prefilter(
    [e.prompt_key for e in examples], [e.reference for e in examples], backend
  )
  examples, counts['too_long'] = data.drop_long_prompts(
    tok, [examples[i] for i in kept], bucket
  )
  if max_prompts:
    counts['over_max_prompts'] = max(0, len(examples) - max_prompts)
    examples = examples[:max_prompts]
  counts['sampled'] = len(examples)
  correct, _ = scoring.score_examples(
    model,
    from_config.scorer(c, tok, verify_fn),
    examples,
    prompt_bucket=bucket,
    slots=slots,
    k=k,
    max_new_tokens=max_new_tokens,
    rng=jax.random.key(seed),
    temperature=c.sampling.temperature,
    top_p=c.sampling.top_p,
    top_k=c.sampling.top_k,
    eos_ids=tok.eos_ids,
    progress='select',
  )
  keep = select(correct, max_pass_rate)
  num_correct = correct.sum(axis=1)
  counts['no_correct_answer'] = int(np.sum(num_correct == 0))
  counts['above_max_pass_rate'] = int(np.sum(~keep & (num_correct > 0)))
  counts['kept'] = int(keep.sum())
  hist = scoring.histogram(correct.mean(axis=1))
  report = {
    'checkpoint': checkpoint,
    'step': step,
    'split': split,
    'k': k,
    'max_pass_rate': max_pass_rate,
    'max_new_tokens': max_new_tokens,
    'seed': seed,
    'verifier_backend': backend,
    'counts': counts,
    'pass_rate_histogram': hist,
  }
  if jax.process_index() == 0:
    epath.Path(out).parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for e, n, kept_i in zip(examples, num_correct, keep, strict=True):
      if kept_i:
        row = {'problem': e.problem, 'answer': e.reference}
        # The builder reads the first number of `level`: leave -1 out.
        row |= {'level': e.level} if e.level >= 0 else {}
        row |= {'pass_rate': float(n) / k, 'correct': int(n), 'k': k}
        rows.append(json.dumps(row, ensure_ascii=False) + '\n')
    epath.Path(out).write_text(''.join(rows))
    epath.Path(_histogram_path(out)).write_text(json.dumps(report, indent=2))
    print('\n'.join(f'{name:>22}: {n}' for name, n in counts.items()))
    title = f'pass rates ({k} samples per prompt, {len(examples)} prompts):'
    print(scoring.format_histogram(title, hist))
    print(f'wrote {counts["kept"]} prompts to {out}')
  return report


def main(argv: Sequence[str] | None = None) -> None:
  """Command line (see the module docstring)."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--config', required=True, help='configs/NAME.py[:arg]')
  p.add_argument('--checkpoint', required=True, help='run workdir or HF dir')
  p.add_argument('--out', required=True, help='the JSONL file to write')
  p.add_argument('--split', default='train')
  p.add_argument('--k', type=int, default=DEFAULT_K)
  p.add_argument('--max-pass-rate', type=float, default=DEFAULT_MAX_PASS_RATE)
  p.add_argument('--max-prompts', type=int, default=0, help='0: all')
  p.add_argument('--max-new-tokens', type=int, default=None)
  p.add_argument('--slots', type=int, default=None, help='default: rl.slots')
  p.add_argument('--seed', type=int, default=42)
  args, rest = from_config.parse_command_line(p, argv)
  if args.k < 1 or not 0 < args.max_pass_rate <= 1:
    p.error('need --k >= 1 and 0 < --max-pass-rate <= 1')
  logging.getLogger().setLevel(logging.INFO)
  from ada_jax.infra import multihost, run_dir

  options = vars(args)
  config, checkpoint = options.pop('config'), options.pop('checkpoint')
  try:
    c = from_config.load(config, rest)
  except from_config.ConfigError as e:
    sys.exit(f'error: {e}')
  multihost.init_distributed()
  if not c.model.hf_path and from_config.is_hf_dir(checkpoint):
    c.model.hf_path = checkpoint  # As evaluate does: the policy's own files.
  try:
    from_config.validate(c)
    run(c, checkpoint, **options)
  except (FileNotFoundError, ValueError, run_dir.WorkdirError) as e:
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  main()
