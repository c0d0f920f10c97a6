"""Run metrics: JSONL rows, decoded samples, TensorBoard events, plots.

`MetricsWriter` writes, on process 0 only:
  - `DIR/metrics.jsonl`: one JSON object per (phase, step), with `step` and
    `phase`;
  - `DIR/samples.jsonl`: a few decoded samples per step (how reward hacking
    gets spotted);
  - TensorBoard scalars in `DIR/tb/<phase>/events.out.tfevents.*`, encoded
    here in a few lines of protobuf wire format so that no TensorFlow and no
    extra package is needed; one directory per phase, because phases count
    their own steps (SFT's step 40 and RL's step 40 are different rows);
  - optionally Weights & Biases (imported only when a project is given).

Workdirs may be local or gs:// (etils.epath). Object stores cannot append, so
remote files are kept in memory and rewritten at most every `remote_flush_s`
seconds and on flush()/close(); local files are appended and flushed at once.

Resuming: `MetricsWriter(..., keep={'rl': s})` drops the rows of phase `rl`
with step > s from both JSONL files (a killed run may have logged steps past
its last checkpoint), keeps every other phase's rows, and tells TensorBoard
to discard the `rl` events after step s (a SessionLog START at s + 1 in
`tb/rl/`, which TensorBoard applies to that directory only). A half-written
last line is dropped too. Rows missing at or before s (a gap, or a row cut
by a power loss with the checkpoint already saved) are listed in
`lost_rows`: the resumed run warns and its summary counts them.

`config.json` is written once, by the run's first start: it is the run's
identity and is never rewritten (`from_config.identity`; later changes go to
`config_history.jsonl`).
"""

import io
import json
import math
import os
import socket
import struct
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from ada_jax.infra import run_dir
from ada_jax.infra.run_dir import CONFIG_FILE, METRICS_FILE, SAMPLES_FILE

# What every RL row must hold (issue 7, item 6); the trainer's tests check it.
RL_KEYS: tuple[str, ...] = (
  'step', 'reward_round1_mean', 'reward_batch_mean', 'samples_drawn', 'slots_live',
  'slots_idle', 'rounds', 'exited_per_round', 'zero_adv_frac', 'entropy', 'loss',
  'clip_frac', 'approx_kl', 'grad_norm', 'lr', 'response_len_mean', 'truncated_frac',
  'verifier_timeouts', 'skipped_updates', 'num_compiles', 'time_sample_s',
  'time_verify_s', 'time_update_s', 'time_step_s', 'tokens_per_s',
)  # fmt: skip
# Curves drawn by `plot_run`: file name -> metrics on the same axes.
PLOTS: dict[str, tuple[str, ...]] = {
  'reward': ('reward_round1_mean', 'reward_batch_mean'),
  'entropy': ('entropy',),
  'samples': ('samples_drawn',),
}
SUMMARY_KEYS: tuple[str, ...] = (
  'reward_round1_mean', 'reward_batch_mean', 'samples_drawn', 'zero_adv_frac',
  'entropy', 'clip_frac', 'response_len_mean', 'time_step_s', 'tokens_per_s',
)  # fmt: skip


def to_python(value: Any) -> Any:
  """Converts numpy/jax scalars and arrays (nested) to plain JSON values.

  Non-finite floats become None, so that the files stay strict JSON.
  """
  if value is None or isinstance(value, str | bool):
    return value
  if isinstance(value, Mapping):
    return {str(k): to_python(v) for k, v in value.items()}
  if isinstance(value, list | tuple):
    return [to_python(v) for v in value]
  if hasattr(value, '__array__') and not isinstance(value, int | float):
    # numpy and jax arrays and scalars alike; jax is never imported here.
    arr = np.asarray(value)
    return to_python(arr.item() if arr.ndim == 0 else arr.tolist())
  if isinstance(value, int):
    return int(value)
  if isinstance(value, float):
    return float(value) if math.isfinite(value) else None
  raise TypeError(f'Cannot log a value of type {type(value).__name__}: {value!r}')


def config_json(config: Any) -> dict[str, Any]:
  """A run config (ConfigDict or dict) as the plain JSON `DIR/config.json` holds."""
  raw = config.to_dict() if hasattr(config, 'to_dict') else dict(config)
  try:
    return to_python(raw)
  except TypeError:  # e.g. a dtype in the config: keep its repr.
    return json.loads(json.dumps(raw, default=str))


# ------------------------------------------------------------------------------
# TensorBoard event records, written by hand.
# ------------------------------------------------------------------------------


def _crc32c_table() -> list[int]:
  table = []
  for n in range(256):
    c = n
    for _ in range(8):
      c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    table.append(c)
  return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli), as TFRecord framing needs."""
  crc = 0xFFFFFFFF
  for b in data:
    crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
  return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
  crc = crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord(data: bytes) -> bytes:
  header = struct.pack('<Q', len(data))
  return (
    header
    + struct.pack('<I', _masked_crc(header))
    + data
    + struct.pack('<I', _masked_crc(data))
  )


def _varint(n: int) -> bytes:
  out = bytearray()
  n &= (1 << 64) - 1  # int64 fields encode negatives as 10-byte varints.
  while True:
    bits, n = n & 0x7F, n >> 7
    out.append(bits | (0x80 if n else 0))
    if not n:
      return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
  """A length-delimited protobuf field (wire type 2)."""
  return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _event(
  step: int,
  *,
  file_version: str | None = None,
  scalars: Mapping[str, float] | None = None,
  session_start: bool = False,
) -> bytes:
  """Encodes a tensorflow.Event message (tensorboard/compat/proto/event.proto).

  Fields used: wall_time (1, double), step (2, int64), file_version (3),
  summary (5: Summary{value (1): Value{tag (1), simple_value (2, float)}}),
  session_log (7: SessionLog{status (1) = START (1)}); field numbers checked
  against tensorboard 2.21's event_pb2.
  """
  msg = b'\x09' + struct.pack('<d', time.time())
  if step:  # proto3 leaves default values out.
    msg += b'\x10' + _varint(step)
  if file_version is not None:
    msg += _field(3, file_version.encode())
  if scalars:
    values = b''.join(
      _field(1, _field(1, tag.encode()) + b'\x15' + struct.pack('<f', v))
      for tag, v in scalars.items()
    )
    msg += _field(5, values)
  if session_start:
    msg += _field(7, b'\x08\x01')
  return _tfrecord(msg)


# ------------------------------------------------------------------------------
# Files that append locally and rewrite remotely.
# ------------------------------------------------------------------------------


def _is_local(path: epath.Path) -> bool:
  return '://' not in os.fspath(path)


class _AppendFile:
  """Appends bytes to a local file or to a (rewritten) remote object."""

  def __init__(self, path: epath.Path, flush_every_s: float):
    self.path = path
    self._local = _is_local(path)
    self._flush_every_s = flush_every_s
    self._pending: list[bytes] = []
    self._content: bytes | None = None  # Remote only: what the object holds.
    self._last_flush = time.monotonic()

  def append(self, data: bytes) -> None:
    self._pending.append(data)
    if self._local or time.monotonic() - self._last_flush > self._flush_every_s:
      self.flush()

  def flush(self) -> None:
    self._last_flush = time.monotonic()
    if not self._pending:
      return
    data = b''.join(self._pending)
    if self._local:
      with open(self.path, 'ab') as f:
        f.write(data)
    else:
      if self._content is None:
        self._content = self.path.read_bytes() if self.path.exists() else b''
      self._content += data
      self.path.write_bytes(self._content)
    self._pending.clear()


def _truncate_jsonl(
  path: epath.Path, keep: Mapping[str, int], *, every_step: bool = False
) -> list[tuple[str, int]]:
  """Drops rows of phase p with step > keep[p]; other phases keep every row.

  A half-written line (the process was killed mid-write) is dropped too.
  With `every_step` (metrics.jsonl: one row per step of each kept phase),
  returns the (phase, step) rows missing at or before keep[p]: a gap, or a
  row cut short, that the checkpoint's step already counts as done.
  """
  if not path.exists():
    return []
  kept = []
  seen: dict[str, set[int]] = {p: set() for p in keep}
  for line in path.read_text().splitlines():
    try:
      row = json.loads(line)
    except json.JSONDecodeError:
      continue
    phase = row.get('phase', 'rl')
    last = keep.get(phase)
    if last is None or row.get('step', -1) <= last:
      kept.append(line + '\n')
      if last is not None:
        seen[phase].add(row.get('step', -1))
  path.write_text(''.join(kept))
  if not every_step:
    return []
  return [
    (phase, step)
    for phase, last in sorted(keep.items())
    for step in range(1, last + 1)
    if step not in seen[phase]
  ]


def _wandb_run(workdir: epath.Path, project: str, config: dict | None) -> Any:
  """The run's wandb run: one per workdir, continued when the run resumes.

  Its id is kept in `DIR/wandb_id` (set aside with the other progress files
  when the run starts over, so a fresh start is a fresh wandb run).

  Raises:
    ImportError: wandb is not installed (one line).
  """
  try:
    import wandb  # Imported only when asked for: a run without it never pays.
  except ImportError:
    raise ImportError(
      f'log.wandb_project={project!r} needs wandb: pip install -r '
      'requirements.txt (launch_tpu.sh setup installs it)'
    ) from None
  id_file = workdir / run_dir.WANDB_ID_FILE
  run_id = id_file.read_text().strip() if id_file.exists() else ''
  if not run_id:
    run_id = uuid.uuid4().hex[:12]
    id_file.write_text(run_id + '\n')
  return wandb.init(
    project=project, config=config, name=workdir.name, id=run_id, resume='allow'
  )


class MetricsWriter:
  """Writes one metrics row (and optional samples) per step; see module doc."""

  def __init__(
    self,
    workdir: str | os.PathLike[str],
    *,
    process_index: int = 0,
    tensorboard: bool = True,
    wandb_project: str | None = None,
    config: Any = None,
    keep: Mapping[str, int] | None = None,
    remote_flush_s: float = 60.0,
  ):
    """Opens the writer.

    Args:
      workdir: local path or gs:// URL; created if missing.
      process_index: only process 0 writes anything.
      tensorboard: write TensorBoard scalar events.
      wandb_project: Weights & Biases project; None (default) disables wandb
        and never imports it.
      config: run configuration (a dict or an ml_collections ConfigDict); written to
        `DIR/config.json` when the run has none yet, and given to wandb.
      keep: a resumed run's position per phase: rows of phase p with
        step > keep[p] are dropped from the existing files (and from
        TensorBoard's view); phases not listed keep all their rows.
      remote_flush_s: minimum seconds between rewrites of remote files.
    """
    self.workdir = epath.Path(workdir)
    self.active = process_index == 0
    self._keep = dict(keep or {})
    self._tensorboard = tensorboard
    self._remote_flush_s = remote_flush_s
    self._files: list[_AppendFile] = []
    self._tb: dict[str, _AppendFile] = {}
    self._wandb = None
    # Rows (phase, step) lost at or before the resumed checkpoint's step.
    self.lost_rows: list[tuple[str, int]] = []
    if not self.active:
      return
    self.workdir.mkdir(parents=True, exist_ok=True)
    if self._keep:
      self.lost_rows = _truncate_jsonl(
        self.workdir / METRICS_FILE, self._keep, every_step=True
      )
      _truncate_jsonl(self.workdir / SAMPLES_FILE, self._keep)
    self._metrics = _AppendFile(self.workdir / METRICS_FILE, remote_flush_s)
    self._samples = _AppendFile(self.workdir / SAMPLES_FILE, remote_flush_s)
    self._files = [self._metrics, self._samples]
    config_dict = None
    if config is not None:
      config_dict = config_json(config)
      if not (self.workdir / CONFIG_FILE).exists():  # The run's identity: kept.
        (self.workdir / CONFIG_FILE).write_text(json.dumps(config_dict, indent=2))
    if wandb_project:
      self._wandb = _wandb_run(self.workdir, wandb_project, config_dict)

  def _tb_file(self, phase: str) -> _AppendFile:
    """The phase's event file, opened at its first event."""
    if phase not in self._tb:
      # A fresh file per writer: TensorBoard reads all tfevents files of a
      # directory in name order, so a writer reopened within the same second
      # gets the next index.
      directory = self.workdir / run_dir.TB_DIR / phase
      directory.mkdir(parents=True, exist_ok=True)
      base = (
        f'events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}'
        f'.{os.getpid()}'
      )
      index = 0
      while (directory / f'{base}.{index:03d}.ada_jax').exists():
        index += 1
      f = _AppendFile(directory / f'{base}.{index:03d}.ada_jax', self._remote_flush_s)
      f.append(_event(0, file_version='brain.Event:2'))
      if phase in self._keep:
        # SessionLog.START at step s + 1 makes TensorBoard purge this
        # directory's older events with step > s: the TensorBoard side of
        # the JSONL truncation.
        f.append(_event(self._keep[phase] + 1, session_start=True))
      self._tb[phase] = f
      self._files.append(f)
    return self._tb[phase]

  def write(self, step: int, metrics: Mapping[str, Any], *, phase: str = 'rl') -> None:
    """Logs one row: `step`, `phase`, then the metrics in the given order.

    Args:
      step: the phase's step (rows are identified by (phase, step) on resume).
      metrics: name -> scalar or list of scalars (numpy/jax values fine).
      phase: e.g. `sft` or `rl`; also the TensorBoard directory and the
        TensorBoard/wandb tag prefix.
    """
    if not self.active:
      return
    row = {'step': int(step), 'phase': phase}
    row.update(to_python(dict(metrics)))
    self._metrics.append((json.dumps(row) + '\n').encode())
    scalars = dict(_scalars(row, phase))
    if self._tensorboard and scalars:
      self._tb_file(phase).append(_event(int(step), scalars=scalars))
    if self._wandb is not None:
      self._wandb.log(scalars, step=int(step))

  def write_samples(
    self, step: int, samples: Iterable[Mapping[str, Any]], *, phase: str = 'rl'
  ) -> None:
    """Logs decoded samples (prompt, response, reward, answer, ...) of a step."""
    if not self.active:
      return
    lines = [
      json.dumps({'step': int(step), 'phase': phase, **to_python(dict(s))}) + '\n'
      for s in samples
    ]
    if lines:
      self._samples.append(''.join(lines).encode())

  def flush(self) -> None:
    """Writes everything pending (remote files included)."""
    for f in self._files:
      f.flush()

  def close(self) -> None:
    """Flushes and finishes the wandb run; the writer is unusable after."""
    self.flush()
    if self._wandb is not None:
      self._wandb.finish()
      self._wandb = None
    self.active = False

  def __enter__(self) -> 'MetricsWriter':
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()


def _scalars(row: Mapping[str, Any], phase: str) -> Iterable[tuple[str, float]]:
  """Numeric entries of a row as (tag, value); lists become `key/i`."""
  for key, value in row.items():
    if key in ('step', 'phase'):
      continue
    if isinstance(value, list):
      items = [(f'{phase}/{key}/{i}', v) for i, v in enumerate(value)]
    else:
      items = [(f'{phase}/{key}', value)]
    for tag, v in items:
      if isinstance(v, int | float) and not isinstance(v, bool):
        yield tag, float(v)


# ------------------------------------------------------------------------------
# Reading back: rows, plots, summary table.
# ------------------------------------------------------------------------------


def read_rows(
  path: str | os.PathLike[str], *, phase: str | None = None
) -> list[dict[str, Any]]:
  """Rows of a JSONL file, or of `metrics.jsonl` when given a directory.

  Args:
    path: a workdir or a JSONL file, local or remote.
    phase: keep only rows of this phase.
  """
  path = epath.Path(path)
  if path.is_dir():
    path = path / METRICS_FILE
  rows = []
  for line in path.read_text().splitlines():
    if line.strip():
      row = json.loads(line)
      if phase is None or row.get('phase') == phase:
        rows.append(row)
  return rows


def plot_run(workdir: str | os.PathLike[str], *, phase: str = 'rl') -> list[epath.Path]:
  """Writes `DIR/<name>.png` for each curve group in `PLOTS` that has data.

  Returns:
    The written paths.
  """
  # Imported here: matplotlib is slow to import and only needed at the end.
  # A bare Figure draws on the Agg canvas without touching pyplot's state.
  from matplotlib.figure import Figure

  workdir = epath.Path(workdir)
  rows = read_rows(workdir, phase=phase)
  written = []
  for name, keys in PLOTS.items():
    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    drawn = False
    for key in keys:
      points = [(r['step'], r[key]) for r in rows if r.get(key) is not None]
      if points:
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, marker='.' if len(points) < 50 else None, label=key)
        drawn = True
    if not drawn:
      continue
    ax.set_xlabel('step')
    ax.set_title(f'{name} ({phase})')
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format='png')
    out = workdir / f'{name}.png'
    out.write_bytes(buf.getvalue())
    written.append(out)
  return written


def plot_before_after(
  workdir: str | os.PathLike[str], summary: Mapping[str, Any]
) -> list[epath.Path]:
  """`DIR/by_level.png` and `DIR/pass_rates.png`: the run before and after RL.

  by_level: held-out accuracy per level (greedy, and sampled where the
  summary has it), before and after RL. pass_rates: the histogram of train
  prompts' pass rates before and after RL. Either is skipped when the
  summary lacks its data (older runs).

  Args:
    workdir: the run directory.
    summary: the run's summary (`before_rl` and `after_rl` entries).

  Returns:
    The written paths.
  """
  from matplotlib.figure import Figure

  workdir = epath.Path(workdir)
  before, after = summary.get('before_rl', {}), summary.get('after_rl', {})
  written = []

  def save(fig: Any, name: str) -> None:
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format='png')
    out = workdir / f'{name}.png'
    out.write_bytes(buf.getvalue())
    written.append(out)

  series = [
    (f'{kind} {when}', result[key])
    for kind, key in (
      ('greedy', 'eval_accuracy_by_level'),
      ('sampled', 'eval_sampled_accuracy_by_level'),
    )
    for when, result in (('before', before), ('after', after))
    if key in result
  ]
  if series:
    levels = sorted({lv for _, by in series for lv in by}, key=int)
    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    width = 0.8 / len(series)
    for i, (label, by) in enumerate(series):
      x = [j + (i - (len(series) - 1) / 2) * width for j in range(len(levels))]
      ax.bar(x, [by.get(lv, 0.0) for lv in levels], width, label=label)
    ax.set_xticks(range(len(levels)), levels)
    ax.set_xlabel('level (ada_columns: carries)')
    ax.set_ylabel('held-out accuracy')
    ax.set_ylim(0, 1)
    ax.set_title('held-out accuracy by level, before and after RL')
    ax.grid(alpha=0.3, axis='y')
    ax.legend(fontsize=7)
    save(fig, 'by_level')
  hists = [
    (when, result['pass_rate_histogram'])
    for when, result in (('before RL', before), ('after RL', after))
    if 'pass_rate_histogram' in result
  ]
  if hists:
    labels = [label for label, _ in hists[0][1]]
    fig = Figure(figsize=(6, 3.5), dpi=100)
    ax = fig.add_subplot()
    width = 0.8 / len(hists)
    for i, (when, hist) in enumerate(hists):
      x = [j + (i - (len(hists) - 1) / 2) * width for j in range(len(labels))]
      ax.bar(x, [n for _, n in hist], width, label=when)
    ax.set_xticks(range(len(labels)), labels, rotation=45, fontsize=7)
    ax.set_xlabel('pass rate')
    ax.set_ylabel('train prompts')
    ax.set_title('pass rates of train prompts')
    ax.grid(alpha=0.3, axis='y')
    ax.legend()
    save(fig, 'pass_rates')
  return written


def summary_table(
  rows: Sequence[Mapping[str, Any]], keys: Sequence[str] = SUMMARY_KEYS
) -> str:
  """A short text table (first, last, min, mean, max per metric) for stdout."""
  if not rows:
    return '(no metrics rows)'
  steps = [r['step'] for r in rows if 'step' in r]
  lines = [
    f'{len(rows)} rows, steps {min(steps, default="?")}..{max(steps, default="?")}',
    f'{"metric":<22}{"first":>10}{"last":>10}{"min":>10}{"mean":>10}{"max":>10}',
  ]
  for key in keys:
    vals = [
      float(r[key])
      for r in rows
      if isinstance(r.get(key), int | float) and not isinstance(r.get(key), bool)
    ]
    if vals:
      stats = (vals[0], vals[-1], min(vals), sum(vals) / len(vals), max(vals))
      lines.append(f'{key:<22}' + ''.join(f'{v:>10.4g}' for v in stats))
  return '\n'.join(lines)
