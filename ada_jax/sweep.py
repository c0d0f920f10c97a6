r"""Expands an experiment module's `sweep()` into training commands.

  python -m ada_jax.sweep experiments/NAME.py                  # print them
  python -m ada_jax.sweep experiments/NAME.py --run            # run here, in turn
  python -m ada_jax.sweep experiments/NAME.py --tpu POD \
      --workdir-root gs://BUCKET/ada [--run] \
      [--set model.hf_path=/home/USER/models/M]               # via launch_tpu.sh

`sweep(local: bool = True)` returns a list of dicts, one per run, in the
order they run:

  config     configs/<name>.py
  arg        the config's arg string ('' for none), e.g. 'variant=grpo'
  overrides  {'rl.steps': 20, 'seed': 1}: `--config.rl.steps=20 --config.seed=1`
  name       the run's workdir below ROOT/GROUP/
  group      optional folder below ROOT (default: the experiment's NAME); a
             run shared by several experiments (a warm start) names one
             group in all of them, so whichever sweep comes first runs it
             and the others find it finished

A string override may contain `{root}` (ROOT/NAME, the experiment's folder)
or `{sweeps}` (ROOT itself), replaced at expansion, so a run can point at
an earlier one of the same sweep: `{'model.init_from':
'{sweeps}/warm_start/sft_s0'}`. Runs execute in list order, so list such a
run after the one it reads.

Grids: `--grid local` (the default) calls `sweep(local=True)`, the tiny
config on this machine; `--grid tpu` (the default with `--tpu`) calls
`sweep(local=False)`, the paper configs. A `sweep()` without a `local`
parameter has one grid, used for both. `--set KEY=VALUE` (repeatable) adds
an override to every run, after the entry's own (the paper configs need
`model.hf_path`).

Every run's config is built (with its overrides) before anything is printed
or started, so a typo fails at once. Locally, `--run` skips runs whose
workdir already holds a finished summary.json made with the same config (a
different saved config.json stops the sweep, naming the keys) and resumes
the others (main resumes from the latest checkpoint). With `--tpu POD --run`, each run is
started with `./launch_tpu.sh --name POD run ...` and polled with `status`
until no worker holds a job; a finished run on gs:// is skipped the same
way, and a job that did not exit 0 stops the sweep with one line naming the
run and its exit code (75: resumable, the sweep exits 75; else 1).

`--model NAME --tpu-type TYPE --seeds 0,1,2` pick the TPU grid of the
experiments (default: qwen25_math_1p5b, v5p-64, seed 0). TPU runs are
named by their settings in one folder, ROOT/tpu_runs/, shared by every
experiment: a run two grids share (the default balance run) runs once.

A local `--run` stops at the first run that does not finish (exit codes:
ada_jax/exit_codes.py). A run stopped by a signal after its checkpoint
(exit 75: SIGTERM or SIGINT, which usually reach the whole process group,
the sweep too) stops the sweep with 75 and one line naming the run: rerun
the same sweep command, finished runs are skipped and that one resumes. The
sweep itself outlives a SIGTERM/SIGINT while a run is on, so that the run
can checkpoint; it then stops (75) even if that run finished meanwhile. A
second signal stops the sweep at once. Any other exit code stops it with one
line naming the run, its workdir and the code's meaning, and exit 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ada_jax.infra import exit_codes

DEFAULT_ROOT = '/tmp/ada_sweeps'


@dataclasses.dataclass(frozen=True)
class Run:
  """One expanded run.

  Attributes:
    name: workdir suffix from the sweep entry.
    workdir: ROOT/<group>/<name> (group: the experiment's name by default).
    config: `CONFIG[:arg]` as main's --config takes it.
    overrides: `--config.key=value` flags.
  """

  name: str
  workdir: str
  config: str
  overrides: tuple[str, ...]

  def main_argv(self) -> list[str]:
    """`python -m ada_jax.main ...` as an argv."""
    return [
      sys.executable,
      '-m',
      'ada_jax.main',
      f'--config={self.config}',
      f'--workdir={self.workdir}',
      *self.overrides,
    ]

  def tpu_argv(self, tpu: str) -> list[str]:
    """`./launch_tpu.sh --name POD run ...` as an argv."""
    return [
      './launch_tpu.sh',
      '--name',
      tpu,
      'run',
      self.config,
      '--workdir',
      self.workdir,
      *self.overrides,
    ]


def load_module(path: str) -> Any:
  """Imports an experiment module from its file path."""
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(f'ada_experiment_{name}', path)
  if spec is None or spec.loader is None:
    raise ValueError(f'{path}: not a Python module')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not callable(getattr(module, 'sweep', None)):
    raise ValueError(f'{path}: defines no sweep()')
  return module


def build_config(config: str, overrides: Sequence[str]) -> Any:
  """The ConfigDict main would build from `--config=CONFIG` and overrides."""
  from ada_jax import from_config

  return from_config.load(config, overrides)


def _flag(key: str, value: Any) -> str:
  if isinstance(value, bool):
    value = str(value).lower()
  return f'--config.{key}={value}'


def _fill(value: Any, places: Mapping[str, str]) -> Any:
  """`{root}` / `{sweeps}` in a string value; other values as they are.

  Plain replacement, not str.format: an override may hold other braces
  (a LaTeX template, a JSON string).
  """
  if not isinstance(value, str):
    return value
  for key, path in places.items():
    value = value.replace(f'{{{key}}}', path)
  return value


def _entries(
  module: Any, local: bool, grid: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
  """module.sweep()'s entries; `grid` (model, pod, seeds) where it takes them."""
  params = inspect.signature(module.sweep).parameters
  kwargs = {k: v for k, v in (grid or {}).items() if v}
  missing = sorted(set(kwargs) - set(params))
  if missing:
    raise ValueError(
      f'{module.__name__}.sweep() takes no {", ".join(missing)} (--model, '
      '--tpu-type, --seeds pick the grids of experiments/experiment.py)'
    )
  if 'local' in params:
    return list(module.sweep(local=local, **kwargs))
  return list(module.sweep(**kwargs))


def expand(
  path: str,
  *,
  root: str = DEFAULT_ROOT,
  check: bool = True,
  local: bool = True,
  extra: Mapping[str, Any] | None = None,
  grid: Mapping[str, Any] | None = None,
) -> list[Run]:
  """The runs of `path`'s sweep(), workdirs below ROOT/<group>/.

  Args:
    path: experiments/NAME.py.
    root: ROOT of the workdirs.
    check: build every config first.
    local: the local grid (`sweep(local=True)`) or the TPU one.
    extra: overrides added to every run, after the entry's own.
    grid: model / pod / seeds for a sweep() that takes them.

  Raises:
    ValueError: a malformed entry, a workdir used twice, or (check=True) a
      config that does not build with its arg and overrides.
  """
  module = load_module(path)
  experiment = os.path.splitext(os.path.basename(path))[0]
  root = root.rstrip('/')
  places = {'root': f'{root}/{experiment}', 'sweeps': root}
  runs, seen = [], set()
  for i, entry in enumerate(_entries(module, local, grid)):
    unknown = set(entry) - {'config', 'arg', 'overrides', 'name', 'group', 'label'}
    if unknown or 'config' not in entry or 'name' not in entry:
      raise ValueError(
        f'{path}: sweep()[{i}] needs config and name (optional arg, overrides, '
        f'group); unknown keys {sorted(unknown)}'
      )
    workdir = f'{root}/{entry.get("group") or experiment}/{entry["name"]}'
    if workdir in seen:
      raise ValueError(f'{path}: sweep() repeats the name {entry["name"]!r}')
    seen.add(workdir)
    arg = entry.get('arg', '')
    config = f'{entry["config"]}:{arg}' if arg else entry['config']
    overrides = {**entry.get('overrides', {}), **(extra or {})}
    flags = tuple(_flag(k, _fill(v, places)) for k, v in overrides.items())
    if check:
      try:
        build_config(config, flags)
      except Exception as e:  # absl wraps the config's own errors.
        raise ValueError(f'{path}: sweep()[{i}] {entry["name"]!r}: {e}') from e
    runs.append(Run(entry['name'], workdir, config, flags))
  return runs


def _parse_set(items: Sequence[str]) -> dict[str, str]:
  out = {}
  for item in items:
    key, eq, value = item.partition('=')
    if not eq or not key:
      raise ValueError(f'--set {item!r}: expected KEY=VALUE')
    out[key.removeprefix('config.')] = value
  return out


def _finished(workdir: str) -> bool:
  """Whether the run's summary.json says it finished (local or gs://)."""
  from ada_jax.infra import storage

  summary = storage.path(f'{workdir.rstrip("/")}/summary.json')
  if not summary.is_file():
    return False
  return 'after_rl' in json.loads(summary.read_text())


def _skip_if_finished(run: Run) -> bool:
  """True (and a line) for a finished run made with this config.

  Raises:
    ValueError: it finished with another config (the identity rule).
  """
  if not _finished(run.workdir):
    return False
  diff = config_mismatch(run)
  if diff:
    raise ValueError(
      f'{run.workdir} finished with another config than this sweep '
      f'builds ({"; ".join(diff[:5])}); move it away or pass another '
      '--workdir-root'
    )
  print(f'  {run.workdir} has a finished summary.json: skipped', flush=True)
  return True


def _diff(saved: Any, want: Any, prefix: str = '') -> list[str]:
  """Dotted keys whose values differ between two JSON-like trees."""
  if isinstance(saved, dict) and isinstance(want, dict):
    out = []
    for key in sorted(set(saved) | set(want)):
      out += _diff(
        saved.get(key, '<absent>'), want.get(key, '<absent>'), f'{prefix}{key}.'
      )
    return out
  return [] if saved == want else [f'{prefix[:-1]}: {saved!r} there, {want!r} now']


def config_mismatch(run: Run) -> list[str]:
  """How a finished run's recorded config differs from what `run` builds.

  A finished run is reused (a shared warm start, a rerun sweep) only when it
  was made with the same config; otherwise a changed default would be mixed
  silently with runs of the old one. The rule is the main job's own
  (`from_config.identity`): the keys that change what a run computes (the
  model by content) must match the recorded config with its history
  replayed; paths, cadence, mesh and the like may differ.
  """
  from ada_jax import from_config
  from ada_jax.infra import run_dir

  recorded = from_config.recorded_config(run.workdir)
  if recorded is None:
    return [f'{run_dir.CONFIG_FILE}: absent']
  c = build_config(run.config, run.overrides)
  given = {**from_config.flat_config(c), **from_config.derived_identity(c)}
  return from_config.identity_conflicts(recorded, given)


def _tpu_status(tpu: str, runner: Callable[..., Any]) -> str:
  out = runner(
    ['./launch_tpu.sh', '--name', tpu, 'status'], capture_output=True, text=True
  )
  return out.stdout or ''


def job_exit_code(status: str) -> int | None:
  """The pod job's exit code from `launch_tpu.sh status` (the workers' worst).

  Each worker's line says `exit 0: finished`, `exit 75: ...`, `exit 73:
  ...` or `failed (exit N)`; None when no worker recorded one.
  """
  codes = [int(m) for m in re.findall(r'\bexit (\d+)', status)]
  if not codes:
    return None
  failed = [c for c in codes if c not in (exit_codes.OK, exit_codes.STOPPED)]
  return failed[0] if failed else max(codes)


def _meaning(code: int) -> str:
  """What a run's exit code says (negative: killed by that signal)."""
  if code < 0:
    try:
      return f'killed by {signal.Signals(-code).name}'
    except ValueError:
      return f'killed by signal {-code}'
  return exit_codes.MEANINGS.get(code, 'failed')


class _Signals:
  """While a run is on: SIGINT/SIGTERM are noted, so the run can checkpoint.

  Both usually reach the whole process group (Ctrl-C, `kill -TERM -PGID`, a
  scheduler), the run too, which then saves and exits 75; dying at once, the
  sweep would not report it (and subprocess.run would SIGKILL the run on a
  KeyboardInterrupt). A second signal has its usual effect.
  """

  def __init__(self, run: Run):
    self.run = run
    self.name: str | None = None  # The signal caught, if any.
    self._old: dict[int, Any] = {}

  def __enter__(self) -> _Signals:
    if threading.current_thread() is threading.main_thread():
      for sig in (signal.SIGINT, signal.SIGTERM):
        self._old[sig] = signal.signal(sig, self._handle)
    return self

  def __exit__(self, *exc: object) -> None:
    for sig, old in self._old.items():
      signal.signal(sig, old)
    self._old = {}

  def _handle(self, signum: int, frame: Any) -> None:
    del frame
    if self.name is not None:
      self.__exit__()
      signal.raise_signal(signum)
      return
    self.name = signal.Signals(signum).name
    print(
      f'sweep: {self.name}: waiting for {self.run.name} to stop (a signal that '
      'reached it too makes it checkpoint and exit); again to stop at once',
      file=sys.stderr,
      flush=True,
    )


def run_all(
  runs: Sequence[Run],
  *,
  tpu: str | None = None,
  runner: Callable[..., Any] | None = None,
  poll_s: float = 60.0,
) -> int:
  """Runs each in turn: locally, or on the pod `tpu` (waiting for each job).

  Args:
    runs: from `expand`.
    tpu: a pod's name: run each with launch_tpu.sh there; None: here.
    runner: a stand-in for `subprocess.run` (the default); its result has
      `returncode`.
    poll_s: seconds between `launch_tpu.sh status` polls.

  Returns:
    The sweep's exit code: 0 (all finished), 75 (a run stopped after a
    checkpoint, or a signal came: rerun the sweep to resume) or 1 (a run
    failed). The last two print one line naming the run.
  """
  runner = runner or subprocess.run
  for i, run in enumerate(runs):
    print(f'[{i + 1}/{len(runs)}] {run.name}', flush=True)
    if _skip_if_finished(run):
      continue
    if tpu is None:
      with _Signals(run) as caught:
        code = runner(run.main_argv(), check=False).returncode
      if code == exit_codes.STOPPED:
        print(
          f'sweep: run {run.name} ({run.workdir}) stopped after a checkpoint: '
          'resumable: rerun the same sweep command (finished runs are skipped, '
          'this one resumes)',
          flush=True,
        )
        return exit_codes.STOPPED
      if code == exit_codes.OK and caught.name:
        print(
          f'sweep: stopped ({caught.name}) after run {run.name} finished: '
          'resumable: rerun the same sweep command (finished runs are skipped)',
          flush=True,
        )
        return exit_codes.STOPPED
      if code != exit_codes.OK:
        print(
          f'sweep: error: run {run.name} ({run.workdir}) exited {code}: '
          f'{_meaning(code)}; see its output above',
          file=sys.stderr,
          flush=True,
        )
        return exit_codes.FAILED
      continue
    code = runner(run.tpu_argv(tpu), check=False).returncode
    if code != exit_codes.OK:
      print(
        f'sweep: error: ./launch_tpu.sh run for {run.name} ({run.workdir}) '
        f'exited {code}',
        file=sys.stderr,
        flush=True,
      )
      return exit_codes.FAILED
    while 'running pid' in (status := _tpu_status(tpu, runner)):
      time.sleep(poll_s)
    code = job_exit_code(status)
    if code == exit_codes.STOPPED:
      print(
        f'sweep: run {run.name} ({run.workdir}) stopped after a checkpoint on '
        f'{tpu}: resumable: rerun the same sweep command',
        flush=True,
      )
      return exit_codes.STOPPED
    if code != exit_codes.OK:
      print(
        f'sweep: error: run {run.name} ({run.workdir}) on {tpu} ended with '
        f'{"no exit code" if code is None else f"exit {code}: {_meaning(code)}"}'
        f'; see ./launch_tpu.sh --name {tpu} logs',
        file=sys.stderr,
        flush=True,
      )
      return exit_codes.FAILED
  return exit_codes.OK


def main(argv: Sequence[str] | None = None) -> None:
  """Command line (see the module docstring)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('experiment', help='experiments/NAME.py')
  parser.add_argument('--run', action='store_true', help='run instead of printing')
  parser.add_argument('--tpu', default=None, help='TPU name for launch_tpu.sh')
  parser.add_argument(
    '--grid',
    choices=('local', 'tpu'),
    default=None,
    help='which grid of sweep(local=...) (default: tpu with --tpu, else local)',
  )
  parser.add_argument(
    '--set',
    action='append',
    default=[],
    metavar='KEY=VALUE',
    help='an override for every run, e.g. model.hf_path=/path (repeatable)',
  )
  parser.add_argument(
    '--workdir-root',
    default=os.environ.get('ADA_SWEEP_ROOT', ''),
    help=f'ROOT of the workdirs [ADA_SWEEP_ROOT] (default {DEFAULT_ROOT}; '
    'gs://... with --tpu)',
  )
  parser.add_argument(
    '--model', default='', help='TPU grid: configs/MODEL.py (e.g. qwen25_math_7b)'
  )
  parser.add_argument(
    '--tpu-type', default='', help='TPU grid: the accelerator type, e.g. v6e-64'
  )
  parser.add_argument('--seeds', default='', help='comma list, e.g. 0,1,2')
  args = parser.parse_args(argv)
  root = args.workdir_root or DEFAULT_ROOT
  try:
    seeds = tuple(int(x) for x in args.seeds.split(',') if x.strip())
  except ValueError:
    parser.error(f'--seeds {args.seeds!r}: a comma list of integers')
  if args.model and not os.path.isfile(f'configs/{args.model}.py'):
    parser.error(f'--model {args.model}: no configs/{args.model}.py')
  if args.tpu and not root.startswith('gs://'):
    parser.error('--tpu needs --workdir-root gs://BUCKET/DIR (or ADA_SWEEP_ROOT)')
  grid = args.grid or ('tpu' if args.tpu else 'local')
  try:
    runs = expand(
      args.experiment,
      root=root,
      local=grid == 'local',
      extra=_parse_set(args.set),
      grid={'model': args.model, 'pod': args.tpu_type, 'seeds': seeds},
    )
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f'error: {e}')
  if not args.run:
    for run in runs:
      argv_ = run.tpu_argv(args.tpu) if args.tpu else run.main_argv()
      if not args.tpu:
        argv_[0] = 'python'
      print(shlex.join(argv_))
    return
  try:
    sys.exit(run_all(runs, tpu=args.tpu))
  except ValueError as e:  # A finished run made with another config.
    sys.exit(f'error: {e}')


if __name__ == '__main__':
  main()
