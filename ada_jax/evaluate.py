r"""Ave@k and pass@k of a policy on benchmark sets (reference section 8.2).

  python -m ada_jax.evaluate --config CONFIG[:arg] --checkpoint DIR \
      --datasets math500,minerva_math,olympiadbench,aime_like --k 32 \
      [--out DIR] [--max-new-tokens N] [--temperature 1.0] [--slots S] \
      [--graders ada,reference] [--step N|latest|all] [--config.key=value ...]

DIR is a run workdir (its latest checkpoint's params, or those of a kept
step: `--step N`, or each kept step into OUT/step_N with `--step all`; a
step not kept is one line listing the kept ones, exit 2; restored
read-only through `from_config.policy`, so the config must describe the
run's model; nothing in DIR is written but OUT) or a Hugging Face directory
(config.json + safetensors; its tokenizer unless `model.tokenizer_path` is
set). Every problem gets k samples at temperature
1.0 (the reference: K=32, 4096 new tokens), all through
`scoring.sample_and_score`, i.e. the run's fixed-shape sampler in chunks
of S slots: one compile for the whole evaluation. New tokens default to
4096, capped (with a warning) by the model's position limit minus the
prompt bucket: Qwen2.5-Math has 4096 positions, so 1024 + 3072.

Datasets: `math500`, `minerva_math`, `olympiadbench`, `aime_like`,
`validate`, `custom` or any `ada_math_local/<config>` (their default
split), `ada_arith` or `ada_columns` (their test split); `NAME:SPLIT` picks
another split.
The run's own dataset (`data.name`, e.g. ada_arith) is evaluated on the
band of levels the run used (`data.levels`), as its in-run evaluation was.
Graders (`--graders`, a comma list): `ada` grades every set with
`ada_jax.verifier`; `reference` grades as the reference's evaluation does
(the paper's Table 1): minerva_math with a Qwen2.5-Math-style grader (the
"answer is" / last-number fallback and a 1e-4 relative tolerance, on our
safe parser) and every other set with Math-Verify on the last box,
re-boxed (the `math_verify` extra, which `launch_tpu.sh setup` installs).
The default is `ada,reference` where that extra is installed, else `ada`
with a warning. With both, the samples are drawn once and each grader
checks the same responses. Datasets are read from `data.data_dir`, else
from the run's `tfds/` when already built there, else built into OUT/tfds.

Writes OUT/eval.json and OUT/eval.md (OUT defaults to CHECKPOINT/eval).
eval.json:

  checkpoint, step, k, temperature, max_new_tokens, seed
  graders            ["ada", "reference"]: the graders, in order
  paper_graders      "reference": the ones the paper's Table 1 used
  datasets.SET       problems, split, dropped (prompts over the bucket),
                     by_grader.MODE = {grader (the backend), ave_at_k,
                     pass_at {"1": ..., "2": ..., ..., "k": ...}},
                     and the first grader's grader / ave_at_k / pass_at
  weighted           the first grader's size-weighted average over the sets
                     (weights: 500/272/675/230 for the paper's four
                     benchmarks, the number of problems otherwise)
  weighted_by_grader.MODE   the same per grader

Ave@k is the mean accuracy over problems x k samples; pass@j the unbiased
estimate for j = 1, 2, 4, ... k. eval.md is the same as a table, one row
per set and grader, the paper's graders marked. `--temperature 0 --k 1`
gives the reference's greedy validation (`--datasets validate`).

Dimension legend: Q problems, k samples per problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ada_jax import from_config
from ada_jax.infra import exit_codes

# Reference section 8.2: Table 1's weighted average uses the set sizes.
PAPER_WEIGHTS = {
  'math500': 500,
  'minerva_math': 272,
  'olympiadbench': 675,
  'aime_like': 230,
}
DEFAULT_MAX_NEW_TOKENS = 4096
GRADER_MODES = ('ada', 'reference')
# What the report calls each grader (`verifier.backends.GRADERS`).
GRADER_NAMES = {
  'ada': 'ada_jax.verifier',
  'math_verify': 'Math-Verify (last box)',
  'math_verify_eval': 'Math-Verify',
  'qwen': 'Qwen2.5-Math-style',
}


# The graders the paper's Table 1 used: the reference's evaluation.
PAPER_GRADERS = 'reference'


def parse_graders(text: str | None) -> list[str]:
  """`--graders`: a comma list of GRADER_MODES; None: every installed one.

  The default is `ada,reference` where the reference's graders (the
  `math_verify` extra) are installed, else `ada` with a warning saying so.
  """
  from ada_jax.verifier import backends

  if text is None:
    try:
      backends.require()
    except ImportError:
      logging.warning(
        "graders: ada only; the reference's graders (the paper's Table 1) need "
        'the math_verify extra: pip install -e .[math_verify]'
      )
      return ['ada']
    return ['ada', 'reference']
  modes = [m.strip() for m in text.split(',') if m.strip()]
  for m in modes:
    if m not in GRADER_MODES:
      raise ValueError(f'--graders: {m!r} is not one of {GRADER_MODES}')
  if not modes or len(set(modes)) != len(modes):
    raise ValueError(f'--graders {text!r}: a comma list of distinct {GRADER_MODES}')
  return modes


def grader_for(name: str, mode: str) -> str:
  """The grader (`verify_batch` backend) of set `name` under `--graders mode`.

  `reference`: Qwen2.5-Math-style for minerva_math, Math-Verify on the
  last box (re-boxed) for every other set, as the reference's final
  evaluation does.
  """
  if mode not in GRADER_MODES:
    raise ValueError(f'--graders: {mode!r} is not one of {GRADER_MODES}')
  if mode == 'ada':
    return 'ada'
  short = name.partition(':')[0].removeprefix('ada_math_local/')
  return 'qwen' if short == 'minerva_math' else 'math_verify_eval'


def pass_at_k(num_samples: int, num_correct: np.ndarray, k: int) -> np.ndarray:
  """Unbiased pass@k per problem: 1 - C(n - c, k) / C(n, k) (Chen et al. 2021).

  Args:
    num_samples: n samples drawn per problem (n >= k).
    num_correct: int [Q], correct samples c per problem.
    k: the budget.
  """
  if not 1 <= k <= num_samples:
    raise ValueError(f'pass@{k} needs 1 <= k <= n={num_samples}')
  c = np.asarray(num_correct, np.int64)
  out = np.ones(c.shape, np.float64)
  for i, ci in enumerate(c.ravel()):
    if num_samples - ci >= k:  # Otherwise every k-subset holds a correct one.
      out.flat[i] = 1.0 - math.comb(num_samples - ci, k) / math.comb(num_samples, k)
  return out


def pass_budgets(k: int) -> list[int]:
  """1, 2, 4, ... up to k, and k itself."""
  out = [j for j in (2**i for i in range(k.bit_length())) if j <= k]
  return out if out[-1] == k else [*out, k]


def score_set(correct_QxK: np.ndarray) -> dict[str, Any]:
  """Ave@k and pass@j of one set from its correctness matrix bool [Q, k]."""
  q, k = correct_QxK.shape
  counts = correct_QxK.sum(axis=1)
  return {
    'problems': int(q),
    'ave_at_k': float(correct_QxK.mean()) if q else float('nan'),
    'pass_at': {
      str(j): float(pass_at_k(k, counts, j).mean()) if q else float('nan')
      for j in pass_budgets(k)
    },
  }


def weighted(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
  """Size-weighted average of Ave@k and pass@j over the sets."""
  weights = {
    name: PAPER_WEIGHTS.get(name, r['problems'])
    for name, r in results.items()
    if r['problems']
  }
  total = sum(weights.values())
  if not total:
    return {'weights': weights, 'ave_at_k': float('nan'), 'pass_at': {}}
  first = next(iter(results.values()))

  def avg(get):
    return sum(w * get(results[n]) for n, w in weights.items()) / total

  return {
    'weights': weights,
    'ave_at_k': avg(lambda r: r['ave_at_k']),
    'pass_at': {j: avg(lambda r, j=j: r['pass_at'][j]) for j in first['pass_at']},
  }


def markdown(report: Mapping[str, Any]) -> str:
  """The results as a markdown table (percent)."""
  k = report['k']
  budgets = list(report['weighted']['pass_at']) or [str(j) for j in pass_budgets(k)]
  head = ['set', 'grader', 'problems', f'Ave@{k}', *[f'pass@{j}' for j in budgets]]
  lines = [
    f'Checkpoint `{report["checkpoint"]}` (step {report["step"]}), k={k}, '
    f'temperature {report["temperature"]}, {report["max_new_tokens"]} new tokens, '
    f'graders: {", ".join(_modes(report))}.',
    '',
    '| ' + ' | '.join(head) + ' |',
    '|' + '---|' * len(head),
  ]

  def row(name, grader, problems, r):
    vals = [r['ave_at_k'], *[r['pass_at'].get(j, float('nan')) for j in budgets]]
    cells = ' | '.join(f'{100 * v:.1f}' for v in vals)
    return f'| {name} | {grader} | {problems} | {cells} |'

  modes = _modes(report)

  def label(mode, grader):
    name = GRADER_NAMES.get(grader, grader)
    return f'{name} (paper)' if mode == report.get('paper_graders') else name

  for name, r in report['datasets'].items():
    for mode in modes:
      g = r['by_grader'][mode] if 'by_grader' in r else r
      lines.append(row(name, label(mode, g.get('grader', mode)), r['problems'], g))
  total = sum(r['problems'] for r in report['datasets'].values())
  for mode in modes:
    w = (
      report['weighted_by_grader'][mode]
      if 'weighted_by_grader' in report
      else (report['weighted'])
    )
    lines.append(row('weighted avg', mode if len(modes) > 1 else '', total, w))
  if len(modes) > 1:
    lines += [
      '',
      f'Each set is graded by {" and ".join(modes)} on the same samples; '
      f'"(paper)" marks the graders the paper\'s Table 1 used.',
    ]
  return '\n'.join(lines) + '\n'


def _modes(report: Mapping[str, Any]) -> list[str]:
  graders = report.get('graders', 'ada')
  return [graders] if isinstance(graders, str) else list(graders)


def _side_by_side(scorers: Sequence[Any]) -> Any:
  """One scorer for several graders: bit b of its value is grader b's verdict.

  The samples are drawn once and each grader checks the same responses, so
  the graders' figures differ by grading alone.
  """
  if len(scorers) == 1:
    return scorers[0]

  def verify(responses, references, *, timeout_s=None, workers=None):
    del timeout_s, workers  # Each scorer applies its own.
    out = np.zeros(len(responses), np.int64)
    for b, scorer in enumerate(scorers):
      out += (np.asarray(scorer.verify(responses, references)) > 0).astype(
        np.int64
      ) << b
    return out.astype(np.float32)

  return dataclasses.replace(scorers[0], verify_fn=verify, backend='side_by_side')


def dataset_split(name: str) -> tuple[str, str]:
  """`math500` -> (`ada_math_local/math500`, `test`); `NAME:SPLIT` overrides."""
  from ada_jax.datasets import ada_math_local

  name, _, split = name.partition(':')
  configs = {c.name: c for c in ada_math_local.CONFIGS}
  if name in ('ada_arith', 'ada_columns'):
    return name, split or 'test'
  short = name.removeprefix('ada_math_local/')
  if short not in configs:
    raise ValueError(
      f'--datasets: unknown set {name!r}; use ada_arith, ada_columns or one of '
      f'{sorted(configs)}'
    )
  return f'ada_math_local/{short}', split or configs[short].split


def evaluate(
  c,
  checkpoint: str,
  datasets: Sequence[str],
  *,
  k: int,
  out_dir: str,
  max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
  temperature: float = 1.0,
  slots: int | None = None,
  seed: int = 42,
  verify_fn=None,
  graders: str | Sequence[str] = 'ada',
  step: int | None = None,
) -> dict[str, Any]:
  """Samples and scores every set; writes OUT/eval.json and OUT/eval.md.

  Args:
    c: the run's ConfigDict (mesh, model, data, sampling, verifier).
    checkpoint: a run workdir or an HF directory.
    datasets: set names (see the module docstring).
    k: samples per problem.
    out_dir: where the JSON and markdown go (created).
    max_new_tokens: capped by the position limit minus `data.prompt_bucket`.
    temperature: 1.0 for Ave@k; 0 for greedy (then use k=1).
    slots: slots per sampler chunk; default `rl.slots`, halved until the
      plan's evaluation phase fits a device (`from_config.command_slots`);
      given, a chunk the plan says does not fit is refused
      (`from_config.command_slots_problem`).
    seed: PRNG seed of the samples (the reference: 42).
    verify_fn: replaces `verifier.verify_batch` (tests); called with
      `backend=` for any grader but ours.
    graders: `ada` (ours everywhere), `reference` (`grader_for`), or a list
      of both: every set is then graded by each, on the same samples, and
      the report gives each one's figures side by side (the first one's also
      as the set's own `ave_at_k` / `pass_at`).
    step: a kept checkpoint's step (None: the latest usable one).

  Returns:
    The report written to eval.json.
  """
  import jax
  from etils import epath

  from ada_jax import data, from_config
  from ada_jax.infra import run_dir
  from ada_jax.rl import scoring
  from ada_jax.verifier import backends

  sets = [dataset_split(name) for name in datasets]
  modes = [graders] if isinstance(graders, str) else list(graders)
  set_graders = {m: [grader_for(name, m) for name in datasets] for m in modes}
  needed = {g for per_set in set_graders.values() for g in per_set}
  for grader in sorted(needed):  # A missing extra fails before any work.
    backends.check(grader)
  if out_dir != os.path.join(checkpoint, 'eval'):
    run_dir.refuse_run_dir(out_dir, '--out')
  policy = from_config.policy(c, checkpoint, step)
  model, tok, step = policy.model, policy.tok, policy.step
  positions = policy.max_positions
  bucket = c.data.prompt_bucket
  limit = positions - bucket
  if max_new_tokens > limit:
    logging.warning(
      'max_new_tokens=%d capped at %d: the model has %d positions and the '
      'prompt bucket (data.prompt_bucket) takes %d',
      max_new_tokens,
      limit,
      positions,
      bucket,
    )
    max_new_tokens = limit
  slots = from_config.command_chunk(
    c, model.config, 'evaluation', max_new_tokens, slots, 'evaluate'
  )
  scorers = {g: from_config.scorer(c, tok, verify_fn, backend=g) for g in needed}
  results, dropped = {}, {}
  for i, (name, split) in enumerate(sets):  # Keyed by the name as given.
    ex = data.load_examples(
      name,
      split,
      data_dir=from_config.data_dir(c, name, policy.run, out_dir),
      manual_dir=c.data.manual_dir or None,
      tokenizer=tok,
      template=c.data.template,
    )
    if name == c.data.name:  # The run's own task: the band it trained on.
      ex = data.select_levels(ex, c.data.get('levels', ''))
    ex, dropped[name] = data.drop_long_prompts(tok, ex, bucket)
    if dropped[name]:
      logging.warning(
        '%s: %d problems longer than data.prompt_bucket=%d are not scored',
        name,
        dropped[name],
        bucket,
      )
    values, _ = scoring.score_examples(
      model,
      _side_by_side([scorers[set_graders[m][i]] for m in modes]),
      ex,
      prompt_bucket=bucket,
      slots=slots,
      k=k,
      max_new_tokens=max_new_tokens,
      rng=jax.random.fold_in(jax.random.key(seed), i),
      temperature=temperature,
      top_p=c.sampling.top_p,
      top_k=c.sampling.top_k,
      eos_ids=tok.eos_ids,
      progress=name,
      rewards=True,
    )
    bits = np.rint(values).astype(np.int64)  # Bit b: grader b accepted.
    scores = [score_set((bits >> b) & 1 > 0) for b in range(len(modes))]
    by_grader = {
      m: {
        'grader': set_graders[m][i],
        'ave_at_k': r['ave_at_k'],
        'pass_at': r['pass_at'],
      }
      for m, r in zip(modes, scores, strict=True)
    }
    first = by_grader[modes[0]]
    key = datasets[i].removeprefix('ada_math_local/')
    results[key] = {
      'problems': scores[0]['problems'],
      'ave_at_k': first['ave_at_k'],
      'pass_at': first['pass_at'],
      'split': split,
      'dropped': dropped[name],
      'grader': first['grader'],
      'by_grader': by_grader,
    }
  report = {
    'checkpoint': checkpoint,
    'step': step,
    'k': k,
    'temperature': temperature,
    'max_new_tokens': max_new_tokens,
    'seed': seed,
    'graders': modes,
    'paper_graders': PAPER_GRADERS,
    'datasets': results,
    'weighted': weighted(results),
    'weighted_by_grader': {
      m: weighted(
        {
          n: {**r['by_grader'][m], 'problems': r['problems']}
          for n, r in results.items()
        }
      )
      for m in modes
    },
  }
  if jax.process_index() == 0:
    out = epath.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'eval.json').write_text(json.dumps(report, indent=2))
    (out / 'eval.md').write_text(markdown(report))
    print(markdown(report))
  return report


def parser() -> argparse.ArgumentParser:
  """The command line's options; `--config.x=v` overrides are passed through."""
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--config', required=True, help='configs/NAME.py[:arg]')
  p.add_argument('--checkpoint', required=True, help='run workdir or HF dir')
  p.add_argument('--datasets', default='math500,minerva_math,olympiadbench,aime_like')
  p.add_argument('--k', type=int, default=32)
  p.add_argument(
    '--out', default=None, help='default: CHECKPOINT/eval (with --step all: /step_N)'
  )
  p.add_argument(
    '--step',
    default='latest',
    help="a run's kept checkpoint: its step, latest, or all (one report each)",
  )
  p.add_argument('--max-new-tokens', type=int, default=DEFAULT_MAX_NEW_TOKENS)
  p.add_argument('--temperature', type=float, default=1.0)
  p.add_argument(
    '--slots',
    type=int,
    default=None,
    help="default: rl.slots, halved until the plan's evaluation fits the chip",
  )
  p.add_argument('--seed', type=int, default=42)
  p.add_argument(
    '--graders',
    default=None,
    help='comma list of ada (ours on every set) and reference (Math-Verify, and '
    "Qwen2.5-Math's for minerva_math: the paper's Table 1), graded side by side "
    'on the same samples; default: ada,reference where the math_verify extra is '
    'installed, else ada',
  )
  return p


def main(argv: Sequence[str] | None = None) -> None:
  """Command line (see the module docstring)."""
  parser_ = parser()
  args, rest = from_config.parse_command_line(parser_, argv)
  logging.getLogger().setLevel(logging.INFO)
  from ada_jax.infra import checkpoint as checkpoint_lib
  from ada_jax.infra import multihost, run_dir

  try:
    c = from_config.load(args.config, rest)
  except from_config.ConfigError as e:
    sys.exit(f'error: {e}')
  multihost.init_distributed()
  if not c.model.hf_path and from_config.is_hf_dir(args.checkpoint):
    with c.unlocked():
      c.model.hf_path = args.checkpoint
  try:
    from_config.validate(c)
    graders = parse_graders(args.graders)
    which = checkpoint_lib.parse_step(args.step)
    out = args.out or os.path.join(args.checkpoint, 'eval')
    runs = [(None if which == 'latest' else which, out)]
    if which == 'all':
      kept = checkpoint_lib.kept_steps(args.checkpoint)
      if not kept:
        raise FileNotFoundError(f'--step all: no kept checkpoint in {args.checkpoint}')
      runs = [(s, os.path.join(out, f'step_{s}')) for s in kept]
    for step, out_dir in runs:
      evaluate(
        c,
        args.checkpoint,
        [d.strip() for d in args.datasets.split(',') if d.strip()],
        k=args.k,
        out_dir=out_dir,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        slots=args.slots,
        seed=args.seed,
        graders=graders,
        step=step,
      )
  except from_config.ConfigError as e:  # Bad input (e.g. the vocabulary): 2.
    print(f'error: {e}', file=sys.stderr)
    sys.exit(exit_codes.BAD_INPUT)
  except checkpoint_lib.StepNotKeptError as e:  # Bad input: 2, listing the steps.
    print(f'error: {e}', file=sys.stderr)
    sys.exit(exit_codes.BAD_INPUT)
  except (FileNotFoundError, ImportError, ValueError, run_dir.WorkdirError) as e:
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  main()
