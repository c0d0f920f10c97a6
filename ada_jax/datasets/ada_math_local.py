r"""`ada_math_local`: the reference's prompt sets and eval sets, from local files.

TPU VMs often cannot reach the HF hub, so this builder never downloads: the
user copies JSONL or Parquet files into `<manual_dir>/<config name>/` (any
depth below it) and TFDS turns them into array_record files once.

One config per published set (see `CONFIGS`). Field names are configurable
because the sets disagree: prompt sets have `problem`/`gt`, the validation
set `problem`/`answer`, raw sources `prompt`/`solution`, where the reference
is the last `\boxed{...}` of the solution. Dotted names reach into nested
columns (`reward_model.ground_truth` in verl parquet files).

Formats: `.jsonl` holds one JSON object per line; `.json` holds a JSON array
of rows, a single row, or JSONL (as `datasets`' `to_json` writes it);
`.parquet` is read whole with pyarrow. JSON text is UTF-8 (a leading BOM is
ignored).

Bad input costs only what is bad, and is always reported:

- A bad row is skipped: missing or empty problem or answer, or a JSONL line
  that is not UTF-8 or not JSON (a `.json` in JSONL form included). All are
  counted in one warning, each with `file:line` and the reason; zero valid
  rows is an error that names the files and the first bad rows.
- A `.json` that is one JSON object but not a row (metadata such as
  `dataset_infos.json`) is one such bad row, reported with the advice to
  delete the file, not one per line of it.
- A file that cannot be read as a whole stops the build with a one-line error
  naming it: a Parquet file pyarrow rejects (truncated, damaged, not Parquet),
  a JSON array that does not parse (with the line and column of the first
  error), a `.json` that is neither JSON nor JSONL. These stop rather than
  skip because TFDS caches the prepared set: a build that quietly left out a
  cut-short copy would stay short on every later load. A JSON array is not
  read up to its first error for the same reason, and because what follows a
  syntax error cannot be split into rows reliably; JSONL can, so it is the
  format to prefer for hand-made files.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import tensorflow_datasets as tfds
from etils import epath

from ada_jax import hub_ids
from ada_jax.datasets import schema

_EXTENSIONS = ('.jsonl', '.json', '.parquet')
# Bad-row locations listed in the warning; the count is always exact.
_MAX_LISTED = 20


@dataclasses.dataclass
class AdaMathLocalConfig(tfds.core.BuilderConfig):
  r"""Where one set comes from and which fields hold what.

  Attributes:
    hf_id: the HF dataset to fetch on a machine with internet.
    split: the split its rows go to ('train' for prompt sets, 'test' for
      eval sets); in prompt sets, files named `test-*`/`validation-*` (HF
      split files) go to those splits instead.
    problem_fields: candidates for the problem text, first present wins.
    answer_fields: candidates for the reference answer, first present wins.
    solution_fields: candidates for a worked solution whose last `\boxed{}`
      is the reference, used when no answer field is present.
    subdir: folder under the manual dir (default: the config name).
  """

  hf_id: str = ''
  split: str = 'train'
  problem_fields: tuple[str, ...] = ('problem',)
  answer_fields: tuple[str, ...] = ('gt', 'answer')
  solution_fields: tuple[str, ...] = ('solution',)
  subdir: str = ''


def _cfg(name: str, hf_id: str, split: str, **kw: Any) -> AdaMathLocalConfig:
  return AdaMathLocalConfig(
    name=name, hf_id=hf_id, split=split, description=f'{hf_id} ({split})', **kw
  )


# Reference section 6 and 8.2. The eval sets' answer column is not documented
# upstream, so they accept the common names in order.
_EVAL_ANSWERS = ('answer', 'gt', 'final_answer', 'ground_truth')
CONFIGS: tuple[AdaMathLocalConfig, ...] = (
  _cfg('simple_1p5b', hub_ids.DATASETS['simple_1p5b'], 'train'),
  _cfg('hard_1p5b', hub_ids.DATASETS['hard_1p5b'], 'train'),
  _cfg('easy_7b', hub_ids.DATASETS['easy_7b'], 'train'),
  _cfg('hard_7b', hub_ids.DATASETS['hard_7b'], 'train'),
  _cfg('hard_llama', hub_ids.DATASETS['hard_llama'], 'train'),
  _cfg('validate', hub_ids.DATASETS['validate'], 'test', answer_fields=_EVAL_ANSWERS),
  _cfg('math500', hub_ids.DATASETS['math500'], 'test', answer_fields=_EVAL_ANSWERS),
  _cfg(
    'minerva_math',
    hub_ids.DATASETS['minerva_math'],
    'test',
    answer_fields=_EVAL_ANSWERS,
  ),
  _cfg(
    'olympiadbench',
    hub_ids.DATASETS['olympiadbench'],
    'test',
    answer_fields=_EVAL_ANSWERS,
  ),
  _cfg(
    'aime_like',
    hub_ids.DATASETS['aime_like'],
    'test',
    answer_fields=_EVAL_ANSWERS,
  ),
  # Any other set, e.g. raw OpenR1-Math rows (`problem`/`solution`).
  _cfg(
    'custom',
    '',
    'train',
    problem_fields=('problem', 'prompt', 'question'),
    answer_fields=('gt', 'answer'),
    solution_fields=('solution',),
  ),
)


def instructions(config: AdaMathLocalConfig, manual_dir: str) -> str:
  """What to put where for `config`, for error messages."""
  folder = config.subdir or config.name
  where = os.path.join(manual_dir, folder)
  if not config.hf_id:
    return f'Put JSONL or Parquet files of your set under {where}/.'
  return (
    f'Put the JSONL or Parquet files of {config.hf_id} under {where}/, e.g. on '
    f'a machine with internet: hf download {config.hf_id} --repo-type dataset '
    f'--local-dir {folder}, then copy that folder to {where} (see README, '
    '"Data").'
  )


def last_boxed(text: str) -> str | None:
  r"""Content of the last `\boxed{...}` (or `\fbox{...}`), braces balanced."""
  start = max(text.rfind('\\boxed{'), text.rfind('\\fbox{'))
  if start < 0:
    return None
  i = text.index('{', start) + 1
  depth, begin = 1, i
  while i < len(text):
    if text[i] == '{':
      depth += 1
    elif text[i] == '}':
      depth -= 1
      if depth == 0:
        return text[begin:i]
    i += 1
  return None


def _get(row: dict[str, Any], dotted: str) -> Any:
  value: Any = row
  for part in dotted.split('.'):
    if not isinstance(value, dict) or part not in value:
      return None
    value = value[part]
  return value


def _as_text(value: Any) -> str | None:
  if isinstance(value, bool) or value is None:
    return None
  if isinstance(value, int | float):
    return str(value)
  if isinstance(value, list | tuple):
    parts = [_as_text(v) for v in value]
    return ', '.join(p for p in parts if p) or None
  if isinstance(value, str):
    return value.strip() or None
  return None


def _first(row: dict[str, Any], fields: Sequence[str]) -> str | None:
  for field in fields:
    text = _as_text(_get(row, field))
    if text:
      return text
  return None


def parse_row(
  row: Any, config: AdaMathLocalConfig
) -> tuple[dict[str, Any] | None, str]:
  """(features, '') for a good row, (None, reason) for a bad one."""
  if not isinstance(row, dict):
    return None, 'not a JSON object'
  problem = _first(row, config.problem_fields)
  if problem is None:
    return None, f'missing or empty {"/".join(config.problem_fields)}'
  reference = _first(row, config.answer_fields)
  if reference is None:
    solution = _first(row, config.solution_fields)
    reference = last_boxed(solution).strip() if solution else None
    reference = reference or None
  if reference is None:
    names = [
      *config.answer_fields,
      *(f'\\boxed in {f}' for f in config.solution_fields),
    ]
    return None, f'missing or empty {"/".join(names)}'
  level = re.search(r'\d+', str(row.get('level', '')))
  return {
    'problem': problem,
    'reference': reference,
    'prompt_key': schema.prompt_key(problem),
    'level': int(level.group()) if level else -1,
  }, ''


class BadFileError(ValueError):
  """A data file that cannot be read as a whole; the message names it."""


class _WholeFile(dict):
  """A `.json` file that is one JSON object, not an array or JSONL rows.

  Marks the row so that, if it is not a valid row, the report can say what
  the file probably is (metadata) and what to do (delete it).
  """


def _one_line(text: str) -> str:
  return ' '.join(text.split())


def _utf8_error_at(data: bytes, e: UnicodeDecodeError) -> str:
  """Where `data` stops being UTF-8, as `byte 0x.. at line L column C`."""
  line = data.count(b'\n', 0, e.start) + 1
  column = e.start - data.rfind(b'\n', 0, e.start)  # rfind is -1 on line 1.
  return f'byte 0x{data[e.start]:02x} at line {line} column {column}'


def _jsonl_rows(data: bytes) -> Iterator[tuple[int, Any]]:
  """(line, row) of JSONL bytes; a bad line's row is a `ValueError`."""
  # Split bytes, not text: a stray byte then costs its row, not the file, and
  # `str.splitlines` would also split inside JSON strings (U+2028, U+0085).
  for i, raw in enumerate(data.split(b'\n'), start=1):
    try:
      line = raw.decode('utf-8')
    except UnicodeDecodeError as e:
      where = f'byte 0x{raw[e.start]:02x} at column {e.start + 1}'
      yield i, ValueError(f'not UTF-8 ({where})')
      continue
    if not line.strip():
      continue
    try:
      yield i, json.loads(line)
    except json.JSONDecodeError as e:
      yield i, ValueError(f'invalid JSON ({e.msg})')


def _json_rows(path: str, data: bytes) -> Iterator[tuple[int, Any]]:
  """(row number, row) of a `.json` file: an array, one object, or JSONL."""
  try:
    document = json.loads(data.decode('utf-8'))
  except UnicodeDecodeError as e:
    where = f'not UTF-8: {_utf8_error_at(data, e)}'
  except json.JSONDecodeError as e:
    where = f'{e.msg} at line {e.lineno} column {e.colno}'
  else:
    if isinstance(document, list):
      yield from enumerate(document, start=1)
    else:
      yield 1, _WholeFile(document) if isinstance(document, dict) else document
    return
  if data.lstrip().startswith(b'['):
    raise BadFileError(
      f'cannot read {path}: invalid JSON array ({where}); an array is not '
      'read past its first error, so fix or re-copy the file, or save it as '
      'JSONL (one object per line)'
    )
  # Not one JSON value: JSONL under a .json name if any line is a row, so
  # that its bad lines are counted like a .jsonl file's.
  rows = list(_jsonl_rows(data))
  if not rows or any(isinstance(row, dict) for _, row in rows):
    yield from rows
    return
  raise BadFileError(
    f'cannot read {path}: neither JSON nor JSONL ({where}); fix or re-copy it'
  )


def _parquet_rows(path: str) -> list[dict[str, Any]]:
  import pyarrow as pa  # Imported here: only Parquet users pay for it.
  import pyarrow.parquet as pq

  try:
    return pq.read_table(path).to_pylist()
  # ArrowInvalid for a bad footer; OSError for a damaged page, whose message
  # spans lines and does not name the file.
  except (pa.ArrowException, OSError) as e:
    raise BadFileError(
      f'cannot read {path} as Parquet ({_one_line(str(e))}); re-copy it'
    ) from e


def read_rows(path: str) -> Iterator[tuple[int, Any]]:
  """(line or row number from 1, row) of a JSONL, JSON or Parquet file.

  A JSONL line that is not UTF-8 or does not parse yields a `ValueError` as
  its row, so the caller counts it with the other bad rows. A `.json` file
  that is a single JSON object yields it at line 1, as a `dict` subclass
  that `collect` recognizes.

  Raises:
    BadFileError: the file cannot be read as a whole: Parquet that pyarrow
      rejects, a JSON array that does not parse, a `.json` that is neither
      JSON nor JSONL. The one-line message names the file and, for JSON, the
      line and column of the first error.
  """
  if path.endswith('.parquet'):
    yield from enumerate(_parquet_rows(path), start=1)
    return
  with open(path, 'rb') as f:
    data = f.read().removeprefix(codecs.BOM_UTF8)  # Windows editors add one.
  if path.endswith('.json'):
    yield from _json_rows(path, data)
  else:
    yield from _jsonl_rows(data)


def find_files(root: str) -> list[str]:
  """Data files under `root`, sorted (any depth, hidden folders skipped)."""
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if not d.startswith('.'))
    # select_prompts writes its pass-rate report next to the prompts it keeps.
    found += [
      os.path.join(dirpath, n)
      for n in filenames
      if n.endswith(_EXTENSIONS) and not n.endswith('.histogram.json')
    ]
  return sorted(found)


def split_of(path: str, config: AdaMathLocalConfig) -> str:
  """The split a file's rows go to (HF split file names win in prompt sets)."""
  if config.split == 'train':
    name = os.path.basename(path)
    for split in ('test', 'validation'):
      if name.startswith(split):
        return split
  return config.split


def collect(
  root: str, config: AdaMathLocalConfig
) -> dict[str, list[tuple[str, dict[str, Any]]]]:
  """Valid rows of every file under `root`, by split, keyed `file:line`.

  Raises:
    FileNotFoundError: `root` is missing or holds no data file.
    BadFileError: a file cannot be read as a whole (see `read_rows`).
    ValueError: no file has a valid row (names the files, their columns and
      the first bad rows).
  """
  files = find_files(root) if os.path.isdir(root) else []
  if not files:
    raise FileNotFoundError(
      f'No .jsonl/.json/.parquet files found under {root}. '
      + instructions(config, os.path.dirname(root))
    )
  splits: dict[str, list[tuple[str, dict[str, Any]]]] = {}
  bad: list[str] = []
  columns: dict[str, list[str]] = {}
  for path in files:
    rel = os.path.relpath(path, root)
    try:
      rows = list(read_rows(path))
    except BadFileError as e:
      # TFDS passes it on unchanged; the prefix says which set was building.
      raise BadFileError(f'ada_math_local/{config.name}: {e}') from e
    for line, row in rows:
      if isinstance(row, dict) and path not in columns:
        columns[path] = sorted(row)
      features, reason = (
        (None, str(row)) if isinstance(row, Exception) else parse_row(row, config)
      )
      if features is None:
        if isinstance(row, _WholeFile):
          # The README's advice for dataset_infos.json and the like.
          reason += (
            '; the file is one JSON object, not rows: if it is metadata '
            '(e.g. dataset_infos.json), delete it'
          )
        bad.append(f'{path}:{line} ({reason})')
        continue
      splits.setdefault(split_of(path, config), []).append((f'{rel}:{line}', features))
  if not splits:
    seen = '; '.join(f'{p} has columns {c}' for p, c in columns.items())
    # The warning below is never reached, so the first reasons go here.
    examples = f', e.g. {"; ".join(bad[:3])}' if bad else ''
    raise ValueError(
      f'ada_math_local/{config.name}: zero valid rows in {", ".join(files)} '
      f'({len(bad)} bad rows{examples}; {seen or "no JSON objects"}). '
      f'Expected the problem in one of {list(config.problem_fields)} and the '
      f'answer in one of {list(config.answer_fields)} or a \\boxed{{}} in '
      f'{list(config.solution_fields)}.'
    )
  if bad:
    listed = '; '.join(bad[:_MAX_LISTED])
    more = f'; and {len(bad) - _MAX_LISTED} more' if len(bad) > _MAX_LISTED else ''
    warnings.warn(
      f'ada_math_local/{config.name}: skipped {len(bad)} bad rows: {listed}{more}',
      stacklevel=2,
    )
  return splits


class AdaMathLocal(tfds.core.GeneratorBasedBuilder):
  """Math prompt and eval sets from local JSONL/Parquet files."""

  VERSION = tfds.core.Version('1.0.0')
  # TFDS derives this from the package's resources, which for an editable
  # install needs the `importlib_resources` backport; the file is enough.
  code_path = epath.Path(__file__)
  RELEASE_NOTES: ClassVar[dict[str, str]] = {
    '1.0.0': 'Reference prompt sets and eval sets.'
  }
  BUILDER_CONFIGS: ClassVar[list[tfds.core.BuilderConfig]] = list(CONFIGS)
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    'Put each set in <manual_dir>/<config name>/ as JSONL or Parquet files; '
    'README "Data" lists the config names and fetch commands.'
  )

  def _info(self) -> tfds.core.DatasetInfo:
    return schema.info(self, __doc__)

  def _split_generators(self, dl_manager):
    try:
      manual_dir = os.fspath(dl_manager.manual_dir)
    except AssertionError as e:  # TFDS's way of saying it is missing or empty.
      raise FileNotFoundError(
        f'{e}\n{instructions(self.builder_config, "<manual_dir>")}'
      ) from e
    config = self.builder_config
    root = os.path.join(manual_dir, config.subdir or config.name)
    splits = collect(root, self.builder_config)
    return {split: self._generate_examples(rows) for split, rows in splits.items()}

  def _generate_examples(self, rows):
    # `file:line` keys are unique even when a problem repeats.
    yield from rows
