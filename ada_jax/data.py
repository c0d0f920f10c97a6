"""Prompts for training and evaluation: loading, encoding, per-host order.

- `load_examples` builds (once) and reads a TFDS dataset in array_record
  format, with no TensorFlow: `ada_arith` (synthetic) or
  `ada_math_local/<config>` (local copies of the reference's sets), and
  templates each problem into a prompt.
- `encode_prompts` left-pads token ids into a fixed prompt bucket; prompts
  longer than the bucket are dropped and counted, never truncated.
- `PromptIterator` yields a fixed number of prompts per step, reshuffled
  every epoch by seed, sliced per host; its state (epoch, position) is two
  ints that a checkpoint stores and `restore` resumes exactly.

Run `python -m ada_jax.data --show ada_arith` to see a few prompts and the
difficulty histogram.

Dimensions: B batch of prompts, P prompt bucket (tokens).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow_datasets as tfds

from ada_jax import prompts as prompts_lib
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.datasets import ada_arith, ada_columns, ada_math_local
from ada_jax.infra import storage


@dataclasses.dataclass(frozen=True)
class Example:
  r"""One prompt.

  Attributes:
    problem: the problem text as in the source.
    prompt: the templated text the policy reads.
    reference: the answer the verifier compares with (`123`, `\frac{1}{2}`).
    prompt_key: stable int64 hash of `problem` (per-prompt statistics).
    level: difficulty level (ada_arith ladder, MATH level), -1 if unknown.
    source: dataset name, e.g. `ada_math_local/math500`.
  """

  problem: str
  prompt: str
  reference: str
  prompt_key: int
  level: int
  source: str


def _math_local_config(
  config_name: str, field_overrides: Mapping[str, Sequence[str]]
) -> ada_math_local.AdaMathLocalConfig:
  configs = {c.name: c for c in ada_math_local.CONFIGS}
  if config_name not in configs:
    raise ValueError(
      f'Unknown ada_math_local config {config_name!r}; one of {sorted(configs)}.'
    )
  config = configs[config_name]
  if not field_overrides:
    return config
  fields = {k: tuple(v) for k, v in sorted(field_overrides.items())}
  # Other fields make other data: give them their own TFDS directory, but
  # keep reading the same manual subdirectory.
  tag = hashlib.sha1(repr(fields).encode()).hexdigest()[:8]
  return dataclasses.replace(
    config, name=f'{config_name}_f{tag}', subdir=config.subdir or config_name, **fields
  )


def builder(
  name: str,
  *,
  data_dir: str | os.PathLike[str] | None = None,
  num_train: int | None = None,
  num_test: int | None = None,
  seed: int = 0,
  field_overrides: Mapping[str, Sequence[str]] | None = None,
) -> tfds.core.DatasetBuilder:
  """The TFDS builder of `name` (`ada_arith`, `ada_columns`, `ada_math_local/<config>`).

  Args:
    name: dataset name.
    data_dir: TFDS data dir (default: TFDS's, ~/tensorflow_datasets).
    num_train: ada_arith/ada_columns train size (default: the default config's).
    num_test: ada_arith/ada_columns test size.
    seed: ada_arith/ada_columns generator seed.
    field_overrides: ada_math_local field candidates to use instead of the
      config's: keys among `problem_fields`, `answer_fields`,
      `solution_fields`.
  """
  kwargs: dict[str, Any] = {'file_format': 'array_record'}
  if data_dir is not None:
    kwargs['data_dir'] = os.fspath(data_dir)
  family, _, config_name = name.partition('/')
  synthetic = {'ada_arith': ada_arith.AdaArith, 'ada_columns': ada_columns.AdaColumns}
  if family in synthetic:
    builder = synthetic[family]
    return builder(config=builder.config_for(num_train, num_test, seed), **kwargs)
  if family == 'ada_math_local':
    config = _math_local_config(config_name, field_overrides or {})
    return ada_math_local.AdaMathLocal(config=config, **kwargs)
  raise ValueError(
    f'Unknown dataset {name!r}: use ada_arith, ada_columns or '
    'ada_math_local/<config> with '
    f'config in {[c.name for c in ada_math_local.CONFIGS]}.'
  )


def is_prepared(name: str, data_dir: str | os.PathLike[str]) -> bool:
  """Whether dataset `name` (default builder settings) is built in `data_dir`."""
  if storage.is_remote(data_dir):
    data_dir = _local_data_dir(data_dir)
  if not os.path.isdir(os.fspath(data_dir)):
    return False
  return builder(name.partition(':')[0], data_dir=data_dir).is_prepared()


def _local_data_dir(data_dir: str | os.PathLike[str]) -> str:
  """The local copy of a gs:// TFDS data dir (`storage.localize`), maybe empty.

  TFDS's array_record files are written and read by a library that opens
  local files only: a gs:// data dir is read from its local copy, and a
  dataset built here is copied up (`load_examples`).
  """
  try:
    return storage.localize(data_dir)
  except FileNotFoundError:  # Nothing built there yet.
    local = storage.local_copy_path(data_dir)
    os.makedirs(local, exist_ok=True)
    return local


def load_examples(
  name: str,
  split: str,
  *,
  data_dir: str | os.PathLike[str] | None = None,
  manual_dir: str | os.PathLike[str] | None = None,
  tokenizer: tokenizer_lib.Tokenizer | None = None,
  template: str = 'auto',
  rebuild: bool = False,
  **builder_kwargs: Any,
) -> list[Example]:
  """Builds `name` if needed and returns the templated examples of `split`.

  Args:
    name: `ada_arith` or `ada_math_local/<config>` (configs in
      `ada_jax.datasets.ada_math_local.CONFIGS`).
    split: TFDS split, slices allowed (`train`, `test[:100]`).
    data_dir: where TFDS keeps the array_record files.
    manual_dir: for ada_math_local, the folder holding `<config>/` subfolders
      of JSONL/Parquet files; only read when the dataset is not built yet.
    tokenizer: needed by the `chat` and `plain` templates.
    template: `auto`, `chat`, `plain` or `tiny` (see `ada_jax.prompts`).
    rebuild: rebuild from the source even if already prepared (e.g. after
      fixing the local files).
    **builder_kwargs: passed to `builder` (ada_arith sizes and seed,
      ada_math_local field overrides).

  Returns:
    The examples, in the stored (seed-independent) order.

  Raises:
    FileNotFoundError: the manual dir is missing (names the path and what to
      put there).
    ValueError: unknown name or template; zero valid rows in the files.
  """
  concrete = prompts_lib.resolve(template, name, tokenizer)
  tfds.display_progress_bar(False)
  remote = data_dir is not None and storage.is_remote(data_dir)
  local_dir = _local_data_dir(data_dir) if remote else data_dir
  b = builder(name, data_dir=local_dir, **builder_kwargs)
  if rebuild or not b.is_prepared():
    if manual_dir is not None and storage.is_remote(manual_dir):
      manual_dir = storage.localize(manual_dir)  # The JSONL / Parquet files.
    if isinstance(b, ada_math_local.AdaMathLocal):
      _check_manual_dir(b.builder_config, manual_dir)
    b.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
        manual_dir=None if manual_dir is None else os.fspath(manual_dir),
        download_mode=(
          tfds.download.GenerateMode.FORCE_REDOWNLOAD
          if rebuild
          else tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS
        ),
        try_download_gcs=False,
      )
    )
    if remote:  # Built here: copied up for the other hosts and later runs.
      storage.upload_dir(local_dir, data_dir)
  records = b.as_data_source(split=split)
  rows = records.__getitems__(range(len(records))) if len(records) else []
  problems = [_text(row['problem']) for row in rows]
  prompts = prompts_lib.format_prompts(problems, concrete, tokenizer)
  return [
    Example(
      problem=problem,
      prompt=prompt,
      reference=_text(row['reference']),
      prompt_key=int(row['prompt_key']),
      level=int(row['level']),
      source=name,
    )
    for problem, prompt, row in zip(problems, prompts, rows, strict=True)
  ]


def _text(value: bytes | str) -> str:
  return value.decode('utf-8') if isinstance(value, bytes) else value


def _check_manual_dir(
  config: ada_math_local.AdaMathLocalConfig,
  manual_dir: str | os.PathLike[str] | None,
) -> None:
  if manual_dir is None:
    raise FileNotFoundError(
      f'ada_math_local/{config.name} is not built yet and no manual_dir was '
      'given. ' + ada_math_local.instructions(config, '<manual_dir>')
    )
  root = os.path.join(os.fspath(manual_dir), config.subdir or config.name)
  if not os.path.isdir(root):
    raise FileNotFoundError(
      f'Manual directory {root} does not exist. '
      + ada_math_local.instructions(config, os.fspath(manual_dir))
    )


def level_histogram(examples: Sequence[Example]) -> dict[int, int]:
  """Number of examples per level, sorted by level."""
  return dict(sorted(collections.Counter(e.level for e in examples).items()))


def parse_levels(spec: str, key: str = 'data.levels') -> frozenset[int] | None:
  """Levels named by `'0,1,4-7'`; None for `''` (every level).

  Raises:
    ValueError: a malformed spec, naming `key`.
  """
  if not spec.strip():
    return None
  levels = set()
  for part in spec.split(','):
    lo, sep, hi = part.strip().partition('-')
    try:
      first, last = int(lo), int(hi if sep else lo)
    except ValueError:
      raise ValueError(
        f'config {key}={spec!r}: expected levels like "0,1,4-7", got {part!r}'
      ) from None
    if first < 0 or last < first:
      raise ValueError(f'config {key}={spec!r}: bad range {part!r}')
    levels.update(range(first, last + 1))
  return frozenset(levels)


def select_levels(examples: Sequence[Example], spec: str) -> list[Example]:
  """The examples whose level `parse_levels(spec)` names (all for `''`)."""
  levels = parse_levels(spec)
  return (
    list(examples) if levels is None else [e for e in examples if e.level in levels]
  )


def split_share(
  examples: Sequence[Example], share: float, seed: int
) -> tuple[list[Example], list[Example]]:
  """(rest, share) of the examples: a seeded split, per level, order kept.

  The SFT warm start and RL draw from disjoint problems, as in practice: a
  policy that imitated a problem dozens of times has memorized its answer,
  and RL on it teaches nothing. Splitting each level keeps both halves
  covering the whole ladder.
  """
  rng = np.random.RandomState(seed)
  take = set()
  for level in level_histogram(examples):
    idx = [i for i, e in enumerate(examples) if e.level == level]
    take.update(idx[j] for j in rng.permutation(len(idx))[: round(share * len(idx))])
  rest = [e for i, e in enumerate(examples) if i not in take]
  return rest, [e for i, e in enumerate(examples) if i in take]


def balance_levels(examples: Sequence[Example]) -> list[Example]:
  """Repeats each level's examples until every level has about as many.

  The ada_arith ladder caps small levels by their pool (1d+1d has 100
  problems, 2d+2d thousands), so drawn uniformly a level of 80 train problems
  is 1% of the batches and a policy trained on them forgets it. Repeating
  each level ceil(largest / size) times (whole copies, order kept) makes the
  levels about equally likely while every problem keeps equal weight within
  its level.
  """
  counts = level_histogram(examples)
  if not counts:
    return list(examples)
  largest = max(counts.values())
  out = []
  for level in counts:
    rows = [e for e in examples if e.level == level]
    out.extend(rows * -(-largest // len(rows)))
  return out


class EncodedPrompts(NamedTuple):
  """Left-padded prompt batch.

  Attributes:
    tokens: int32 [B, P] ids, `pad_id` on the left of short prompts.
    mask: int32 [B, P], 1 on real tokens.
    kept: int64 [B] indices (into the input list) of the prompts kept.
    dropped: number of prompts dropped (longer than P, or empty).
  """

  tokens: np.ndarray
  mask: np.ndarray
  kept: np.ndarray
  dropped: int


def encode_prompts(
  tokenizer: tokenizer_lib.Tokenizer, prompts: Sequence[str], bucket: int
) -> EncodedPrompts:
  """Encodes prompts into a fixed bucket, left-padded, dropping long ones.

  Left padding keeps the last prompt token of every row at column P-1, so
  generation starts at the same column for the whole batch.

  Args:
    tokenizer: the policy's tokenizer.
    prompts: templated prompt texts.
    bucket: P, the prompt length every row is padded to.

  Returns:
    `EncodedPrompts` with B = number of prompts kept.
  """
  ids = tokenizer.encode_batch(list(prompts))
  kept = [i for i, seq in enumerate(ids) if 0 < len(seq) <= bucket]
  tokens_BxP = np.full((len(kept), bucket), tokenizer.pad_id, np.int32)
  mask_BxP = np.zeros((len(kept), bucket), np.int32)
  for row, i in enumerate(kept):
    n = len(ids[i])
    tokens_BxP[row, bucket - n :] = ids[i]
    mask_BxP[row, bucket - n :] = 1
  return EncodedPrompts(
    tokens_BxP, mask_BxP, np.asarray(kept, np.int64), len(prompts) - len(kept)
  )


def drop_long_prompts(
  tokenizer: tokenizer_lib.Tokenizer, examples: Sequence[Example], bucket: int
) -> tuple[list[Example], int]:
  """The examples whose prompt fits `bucket`, and how many did not.

  Filtering once before iteration keeps every step's batch full.
  """
  kept = encode_prompts(tokenizer, [e.prompt for e in examples], bucket).kept
  return [examples[i] for i in kept], len(examples) - len(kept)


def drop_long_problems(
  tokenizer: tokenizer_lib.Tokenizer, examples: Sequence[Example], max_tokens: int
) -> tuple[list[Example], int]:
  """The examples whose problem text is at most `max_tokens` tokens, and how many not.

  The reference's prompt preparation drops training problems over 700 tokens
  (the problem text, before the chat template). Training prompts only:
  evaluation sets are never filtered. `max_tokens` 0 keeps every example.
  """
  if not max_tokens:
    return list(examples), 0
  kept = [e for e in examples if len(tokenizer.encode(e.problem)) <= max_tokens]
  return kept, len(examples) - len(kept)


class PromptIterator(Iterator[list[Example]]):
  """Fixed-size prompt batches: epochs, seeded shuffle, per-host slices.

  Each step takes the next `prompts_per_step` indices of the epoch's
  permutation (a function of seed and epoch only); process i of n gets the
  i-th of n equal slices, so hosts are disjoint and together cover the step.
  The examples left over at the end of an epoch (fewer than a step) are
  skipped; the next epoch reshuffles all of them.

  The state is global (the same on every host), so a checkpoint written by
  any host restores all of them, even under another process count.
  """

  def __init__(
    self,
    examples: Sequence[Example],
    prompts_per_step: int,
    seed: int,
    process_index: int = 0,
    process_count: int = 1,
  ):
    if prompts_per_step % process_count:
      raise ValueError(
        f'prompts_per_step={prompts_per_step} does not divide by '
        f'process_count={process_count}.'
      )
    if not 0 < prompts_per_step <= len(examples):
      raise ValueError(
        f'prompts_per_step={prompts_per_step} must be in [1, {len(examples)}] '
        '(the number of examples).'
      )
    if not 0 <= process_index < process_count:
      raise ValueError(f'process_index={process_index} not in [0, {process_count}).')
    self._examples = examples
    self._per_step = prompts_per_step
    self._seed = seed
    self._per_host = prompts_per_step // process_count
    self._host_start = process_index * self._per_host
    self._epoch = 0
    self._position = 0
    self._order: tuple[int, np.ndarray] | None = None

  @property
  def steps_per_epoch(self) -> int:
    """Full steps in one pass over the examples."""
    return len(self._examples) // self._per_step

  def _permutation(self, epoch: int) -> np.ndarray:
    if self._order is None or self._order[0] != epoch:
      rng = np.random.default_rng([self._seed, epoch])
      self._order = (epoch, rng.permutation(len(self._examples)))
    return self._order[1]

  def next_indices(self) -> np.ndarray:
    """This host's example indices for the next step; advances the state."""
    start = self._position * self._per_step + self._host_start
    indices = self._permutation(self._epoch)[start : start + self._per_host]
    self._position += 1
    if self._position == self.steps_per_epoch:
      self._epoch, self._position = self._epoch + 1, 0
    return indices

  def __next__(self) -> list[Example]:
    return [self._examples[i] for i in self.next_indices()]

  def state(self) -> dict[str, int]:
    """Plain ints for a checkpoint; the last three guard `restore`."""
    return {
      'epoch': self._epoch,
      'position': self._position,
      'seed': self._seed,
      'num_examples': len(self._examples),
      'prompts_per_step': self._per_step,
    }

  def restore(self, state: Mapping[str, Any]) -> None:
    """Continues from `state`, exactly as the iterator that produced it.

    Raises:
      ValueError: the state belongs to other data, seed or step size.
    """
    for key in ('seed', 'num_examples', 'prompts_per_step'):
      if int(state[key]) != self.state()[key]:
        raise ValueError(
          f'Iterator state has {key}={int(state[key])} but this iterator has '
          f'{self.state()[key]}; restoring would give a different order.'
        )
    epoch, position = int(state['epoch']), int(state['position'])
    if epoch < 0 or not 0 <= position < self.steps_per_epoch:
      raise ValueError(f'Invalid iterator state epoch={epoch} position={position}.')
    self._epoch, self._position = epoch, position


def _show(args: argparse.Namespace) -> None:
  arith = args.show.split('/')[0] in ('ada_arith', 'ada_columns')
  tok = None
  if args.tokenizer:
    tok = tokenizer_lib.load_tokenizer(args.tokenizer)
  elif arith:
    tok = tokenizer_lib.build_tiny_tokenizer(tempfile.mkdtemp(prefix='ada_tiny_tok_'))
  template = 'auto' if tok is not None else 'plain'
  examples = load_examples(
    args.show,
    args.split,
    data_dir=args.data_dir,
    manual_dir=args.manual_dir,
    tokenizer=tok,
    template=template,
  )
  print(f'{args.show} {args.split}: {len(examples)} examples')
  sample = examples[:: max(1, len(examples) // args.num)][: args.num]
  for e in sorted(sample, key=lambda e: e.level):
    n_tokens = f' [{len(tok.encode(e.prompt))} tokens]' if tok else ''
    print(f'--- level {e.level} key {e.prompt_key}{n_tokens}')
    print(f'{e.prompt}\n=> reference: {e.reference}')
  if tok is not None:
    lengths = [len(ids) for ids in tok.encode_batch([e.prompt for e in examples])]
    print(f'prompt tokens: max {max(lengths)}, mean {np.mean(lengths):.1f}')
  if args.show == 'ada_columns':
    worked = [ada_columns.solve(e.problem).text for e in examples]
    print(f'worked solution: {examples[0].problem} -> {worked[0]}')
    answer = [len(tok.encode(w)) + 1 for w in worked]
    print(f'response tokens (worked solution + eos): max {max(answer)}')
  elif arith:
    answer = [len(tok.encode(f'\\boxed{{{e.reference}}}')) + 1 for e in examples]
    print(f'response tokens (\\boxed{{answer}} + eos): max {max(answer)}')
  print('difficulty histogram:')
  hist = level_histogram(examples)
  names = {}
  if args.show == 'ada_arith':
    names = {i: lv.name for i, lv in enumerate(ada_arith.LEVELS)}
  elif args.show == 'ada_columns':
    names = {c: f'{c} carries' for c in range(ada_columns.MAX_CARRIES + 1)}
  for level, count in hist.items():
    bar = '#' * max(1, round(40 * count / max(hist.values())))
    print(f'  {level:>3} {names.get(level, ""):<12} {count:>6} {bar}')


def main(argv: Sequence[str] | None = None) -> None:
  """Command line: `python -m ada_jax.data --show ada_arith`."""
  # argparse, not absl flags: this module is also a library, and absl flags
  # defined at import would collide with the trainer's.
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--show', required=True, help='dataset name')
  parser.add_argument('--split', default='train')
  parser.add_argument('--data_dir', default=None)
  parser.add_argument('--manual_dir', default=None)
  parser.add_argument('--tokenizer', default=None, help='HF tokenizer dir')
  parser.add_argument('--num', type=int, default=5, help='prompts to print')
  try:
    _show(parser.parse_args(argv))
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f'error: {e}') from e


if __name__ == '__main__':
  main()
