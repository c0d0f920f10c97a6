"""A run's directory: what it holds, who writes it, and starting a run over.

A workdir belongs to the main job that trains in it (`python -m ada_jax.main
--workdir DIR`). Every other command only reads it: evaluation, export and
prompt selection restore params through a read-only checkpoint reader and
build what they need (the tiny tokenizer, datasets) elsewhere; their own
outputs go where they are told (`--out`), and `--out` may not be a run
directory (`refuse_run_dir`); the one exception is evaluate's default
`--out`, the run's own `eval/` subdirectory, which no run file lives in. This holds on gs:// workdirs too, which have
no atomic rename to lock with: nothing is locked, readers simply never
write.

Files of a run (process 0 writes them all but the checkpoints):

  lease.json       who writes the run now (`infra.lease`): one writer per run
  config.json      the run's config as first given, never rewritten (its
                   identity: a rerun that changes what it computes is refused)
  config_history.jsonl  the keys changed since (paths, mesh, cadence, more
                   steps), each with the step it took effect in
  metrics.jsonl    one row per (phase, step)
  samples.jsonl    decoded samples per (phase, step)
  summary.json     evaluations before/after RL, steps, preempted_at
  tb/<phase>/      TensorBoard events, one directory per phase
  *.png            plots
  checkpoints/     orbax steps (all hosts); checkpoints.corrupt/ holds the
                   steps that failed to read or verify
  tokenizer/, tfds/  the tiny task's tokenizer and datasets

Restart from scratch: a run whose checkpoints are all unusable (or that was
killed during SFT, which has no checkpoint) starts over. Its earlier files
are then moved to `restarts/<UTC time>/` (`set_aside`), never appended to.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from etils import epath

from ada_jax.infra import storage

CONFIG_FILE = 'config.json'
CONFIG_HISTORY_FILE = 'config_history.jsonl'
# The run's wandb run id: a resumed run logs to the same wandb run.
WANDB_ID_FILE = 'wandb_id'
METRICS_FILE = 'metrics.jsonl'
SAMPLES_FILE = 'samples.jsonl'
SUMMARY_FILE = 'summary.json'
TB_DIR = 'tb'
CHECKPOINT_DIR = 'checkpoints'
CORRUPT_DIR = 'checkpoints.corrupt'
RESTARTS_DIR = 'restarts'
# What a run's start over moves aside: everything that describes its
# progress. Datasets and the tokenizer are derived from the config and stay.
_PROGRESS_FILES = (
  METRICS_FILE,
  SAMPLES_FILE,
  SUMMARY_FILE,
  CONFIG_FILE,
  CONFIG_HISTORY_FILE,
  WANDB_ID_FILE,
  TB_DIR,
)
_MARKERS = (METRICS_FILE, SUMMARY_FILE, CHECKPOINT_DIR)


class WorkdirError(OSError):
  """A workdir (or output) that cannot be used; the message is one line."""


def is_run_dir(path: str | os.PathLike[str]) -> bool:
  """Whether `path` holds a run (metrics, a summary or checkpoints)."""
  p = epath.Path(path)
  return any((p / name).exists() for name in _MARKERS)


def refuse_run_dir(path: str | os.PathLike[str], flag: str) -> None:
  """Raises if a command's output `path` is a run directory it does not own.

  Raises:
    WorkdirError: naming the flag and the path.
  """
  if is_run_dir(path):
    raise WorkdirError(
      f'{flag} {os.fspath(path)} is a run directory (it holds '
      f'{", ".join(n for n in _MARKERS if (epath.Path(path) / n).exists())}): '
      'pass another output directory'
    )


def check_writable(workdir: str | os.PathLike[str]) -> None:
  """Creates the workdir and proves a file can be written there.

  Raises:
    WorkdirError: one line naming the workdir and the OS's reason.
  """
  try:
    storage.require(workdir)  # gs://: gcsfs and credentials, before any write.
  except storage.StorageError as e:
    raise WorkdirError(f'--workdir {e}') from None
  p = epath.Path(workdir)
  probe = p / f'.write_probe.{os.getpid()}'
  try:
    p.mkdir(parents=True, exist_ok=True)
    probe.write_text('')
    probe.unlink()
  except OSError as e:
    reason = e.strerror or type(e).__name__
    raise WorkdirError(
      f'--workdir {os.fspath(workdir)}: not writable ({reason})'
    ) from None


def progress_files(workdir: str | os.PathLike[str]) -> list[epath.Path]:
  """The run files a start over moves aside: progress files, old events, plots."""
  p = epath.Path(workdir)
  if not p.exists():
    return []
  found = [p / n for n in _PROGRESS_FILES if (p / n).exists()]
  for child in p.iterdir():
    # TensorBoard files of runs before tb/<phase>/, and the plots.
    if child.name.startswith('events.out.tfevents.') or child.name.endswith('.png'):
      found.append(child)
  return sorted(found)


def set_aside(workdir: str | os.PathLike[str]) -> epath.Path | None:
  """Moves the run's progress files to `restarts/<UTC time>/`; None if none.

  Renames locally; on object stores each file is copied then deleted
  (`storage.move`: no folder is assumed to exist), so an interrupted move
  leaves every file somewhere whole.
  """
  files = progress_files(workdir)
  if not files:
    return None
  stamp = time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())
  dest = epath.Path(workdir) / RESTARTS_DIR / stamp
  n = 0
  while dest.exists():  # Two restarts in one second.
    n += 1
    dest = epath.Path(workdir) / RESTARTS_DIR / f'{stamp}.{n}'
  storage.makedirs(dest)
  for f in files:
    storage.move(f, dest / f.name)
  return dest


def read_config(workdir: str | os.PathLike[str]) -> dict[str, Any] | None:
  """The run's recorded config.json as plain JSON; None when there is none."""
  path = epath.Path(workdir) / CONFIG_FILE
  if not path.exists():
    return None
  try:
    raw = json.loads(path.read_text())
  except ValueError as e:
    raise WorkdirError(f'{os.fspath(path)}: not valid JSON ({e})') from None
  return raw if isinstance(raw, dict) else None


def failure(workdir: str | os.PathLike[str]) -> dict[str, Any] | None:
  """summary.json's `failed` record ({'step', 'cause'}) of a run that died; else None.

  A summary that cannot be read says nothing (the checkpoints are checked on
  their own).
  """
  path = epath.Path(workdir) / SUMMARY_FILE
  try:
    raw = json.loads(path.read_text()) if path.exists() else None
  except ValueError:
    return None
  failed = raw.get('failed') if isinstance(raw, dict) else None
  return failed if isinstance(failed, dict) else None


def read_history(workdir: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """The records of `config_history.jsonl`, oldest first (a cut last line dropped)."""
  path = epath.Path(workdir) / CONFIG_HISTORY_FILE
  if not path.exists():
    return []
  out = []
  for line in path.read_text().splitlines():
    try:
      out.append(json.loads(line))
    except ValueError:
      continue
  return out


def append_history(workdir: str | os.PathLike[str], record: dict[str, Any]) -> None:
  """Appends one record to `config_history.jsonl` (process 0)."""
  path = epath.Path(workdir) / CONFIG_HISTORY_FILE
  line = json.dumps(record, sort_keys=True) + '\n'
  if '://' in os.fspath(path):  # Object stores cannot append.
    path.write_text((path.read_text() if path.exists() else '') + line)
    return
  with open(path, 'a') as f:
    f.write(line)
