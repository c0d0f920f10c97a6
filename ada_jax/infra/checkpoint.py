"""Checkpoints that survive preemption: params, optimizer state and host extras.

One `Checkpointer` over an orbax CheckpointManager in `WORKDIR/checkpoints`
(local or gs://). Each step holds four items: `params` and `opt_state` as
nested dicts keyed by tree path (nnx Variables stored as their values), so
restore lands straight in the shardings of any abstract pytree with the same
paths; `extras_arrays`, the numpy arrays found in `extras`; and `meta` (JSON:
the extras with array references, leaf paths, shapes and checksums).

Why checksums: orbax finishes a step atomically (a renamed tmp dir locally,
`commit_success.txt` on GCS), but a garbled data file restores silently as
wrong numbers. Each leaf gets a position-weighted uint32 sum of its bits,
computed on device; wrap-around integer sums are exact in any reduction order,
so any target sharding reproduces it (the on-disk form, checksums included,
is `checkpoint_format`). A step that fails to read or verify is
moved to `WORKDIR/checkpoints.corrupt/` with a warning and the previous one is
tried; one whose paths or shapes differ from the target raises instead (a
changed config, not a broken file).

Failed saves stop the run: a save first proves the directory writable (a
small probe file: orbax's background threads would otherwise wait minutes
for a step directory that was never made), and `check()`, which the trainer
calls at the next step and before anything that claims the run saved (its
summary, a preemption exit), waits for the save in flight and raises
`CheckpointSaveError` if it did not commit. After that error the
Checkpointer no longer waits on orbax, so the process can exit at once.

Readers of another run (`restore_params`, `read_only=True`) never write:
no directory creation, no cleanup of unfinished saves, no quarantine. They
refuse params that are not finite (`NonFiniteParamsError`, one line): a
diverged run is not evaluated, exported or warm-started from.

When to save: every `every_steps` steps, and (`every_minutes` > 0) at the
first step after `every_minutes` have passed since the last save or
`start_timer()`, by process 0's clock (injectable: `clock`), broadcast so
every host saves at the same step. The last `keep` checkpoints on the step
interval are kept, and the newest checkpoint whatever its step (a save by
time, by preemption or at the end): time-based saves never evict the interval
checkpoints an evaluation protocol reads (`keep=8` keeps all of 50..400).

Preemption: `install_signal_handlers()` makes SIGTERM/SIGINT set a flag, and
`poll_stop()` is the sync point, called by every host at the same places
(each step boundary, each sampling round): it gathers the flags of all
hosts (one tiny collective) and asks JAX's preemption sync manager (which
under `jax.distributed` owns SIGTERM; its sync ids are the polls, counted
alike on every host), so every host sees the stop at the same poll and none
saves alone. SIGTERM or JAX's notice is a `PREEMPTION` (the VM stops soon);
SIGINT alone an `INTERRUPT` (a user, no deadline). `save_on_preemption`
(the caller's estimate: does a write fit the notice?) says whether a
preemption still saves: `saves_on_stop()`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from etils import epath

from ada_jax.infra import checkpoint_format as fmt
from ada_jax.infra import checksum, multihost, run_dir, storage

PyTree = Any
_COMMIT_MARKER = 'commit_success.txt'  # orbax's marker, in every finished step dir.
_FORMAT = 1
# What `poll_stop` reports: a VM about to stop (SIGTERM, JAX's preemption
# notice) or a user's Ctrl-C (SIGINT), which has no deadline.
PREEMPTION = 'preemption'
INTERRUPT = 'interrupt'


class CorruptCheckpointError(RuntimeError):
  """A step directory that is incomplete or does not match its checksums."""


class StepNotKeptError(FileNotFoundError):
  """The asked step is not among the run's kept checkpoints; one line listing them."""


class CheckpointMismatchError(ValueError):
  """A checkpoint whose leaf paths or shapes differ from the restore target."""


class CheckpointSaveError(RuntimeError):
  """A checkpoint that could not be written; the run must stop (one line)."""


class FailedRunError(ValueError):
  """The run that wrote the checkpoint died (summary.json `failed`); one line."""


class NonFiniteParamsError(ValueError):
  """Params holding NaN or inf (a diverged run); the message is one line."""


def nonfinite_leaves(params: PyTree) -> tuple[list[str], int]:
  """(paths of the float leaves holding NaN or inf, number of float leaves).

  One small jitted reduction per leaf; every host calls it (global arrays).
  """
  import jax.numpy as jnp

  flat = [
    (jax.tree_util.keystr(path), leaf)
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
    if jnp.issubdtype(getattr(leaf, 'dtype', np.int32), jnp.inexact)
  ]
  oks = [jnp.all(jnp.isfinite(leaf)) for _, leaf in flat]
  return [name for (name, _), ok in zip(flat, oks, strict=True) if not bool(ok)], len(
    flat
  )


def check_finite(params: PyTree, where: str) -> None:
  """Raises `NonFiniteParamsError` naming `where` if any param is NaN or inf."""
  bad, total = nonfinite_leaves(params)
  if bad:
    raise NonFiniteParamsError(
      f'{where}: params are non-finite ({len(bad)} of {total} tensors hold NaN '
      f'or inf, e.g. {bad[0]}): the run diverged; nothing to evaluate or export'
    )


# Who owns SIGTERM.


def _preemption_service_owns_sigterm() -> bool:
  try:  # Private, hence guarded: JAX's C++ notifier is SIGTERM's handler then.
    from jax._src import distributed

    return distributed.global_state.preemption_sync_manager is not None
  except (ImportError, AttributeError):
    return False


def abstract_opt_state(
  tx: optax.GradientTransformation, abstract_params: PyTree
) -> PyTree:
  """ShapeDtypeStructs of `tx.init(params)`, each sharded like its param.

  Per-param state (Adam's mu, nu) takes its param's sharding; the rest (step
  counts) is replicated on the params' mesh. Serves as the restore target, and
  its shardings as out_shardings of a jitted `tx.init` on a fresh start.
  """
  mesh = jax.tree_util.tree_leaves(abstract_params)[0].sharding.mesh
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return optax.tree_map_params(
    tx,
    lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=p.sharding),
    jax.eval_shape(tx.init, abstract_params),
    abstract_params,
    transform_non_params=lambda s: jax.ShapeDtypeStruct(
      s.shape, s.dtype, sharding=replicated
    ),
  )


def _pytree_handler() -> ocp.PyTreeCheckpointHandler:
  # Replica-parallel writing (orbax's default) slices replicated shards with
  # one jit per shape and device: a burst of compiles at the first save,
  # mid-run, which the trainer's zero-recompile rule forbids. Without it the
  # first replica of each shard writes it whole.
  scalar = ocp.type_handlers.ScalarHandler()
  registry = ocp.type_handlers.create_type_handler_registry(
    (jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False)),
    (np.ndarray, ocp.type_handlers.NumpyHandler()),
    (np.number, scalar),
    (int, scalar),
    (float, scalar),
  )
  return ocp.PyTreeCheckpointHandler(type_handler_registry=registry)


def restore_params(
  workdir: str | epath.PathLike, abstract_params: PyTree, step: int | None = None
) -> tuple[int, PyTree, dict[str, Any]]:
  """(step, params, extras) of another run's latest usable checkpoint (or `step`'s).

  For readers of a finished or running run (evaluation, export, prompt
  selection, warm starts): params only, placed as `abstract_params`'
  shardings say; nothing in `workdir` is written (a read-only reader).

  Raises:
    FileNotFoundError: `workdir` has no usable checkpoint
      (`StepNotKeptError`: `step` is not one of its kept checkpoints).
    CorruptCheckpointError: `step`'s checkpoint is unusable.
    NonFiniteParamsError: its params hold NaN or inf (a diverged run).
    FailedRunError: the run stopped as dead (its summary.json records
      `failed`, e.g. every update non-finite): its last params may be finite
      yet meaningless (rl.lr=1e30 leaves weights near 1e30).
  """
  failed = run_dir.failure(workdir)
  if failed is not None:
    raise FailedRunError(
      f'{os.fspath(workdir)}: the run failed at step {failed.get("step")} '
      f'({failed.get("cause", "see summary.json")}); its checkpoints are not '
      'evaluated, exported or trained from'
    )
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    if step is None:
      got = ckpt.restore_latest(abstract_params)
    else:
      got = ckpt.restore_step(step, abstract_params)
  finally:
    ckpt.close()
  if got is None:
    raise FileNotFoundError(f'no usable checkpoint in {workdir}/checkpoints')
  step, params, _, extras = got
  check_finite(params, f'{os.fspath(workdir)} step {step}')
  return step, params, extras


def kept_steps(workdir: str | epath.PathLike) -> list[int]:
  """Steps of a run's finished checkpoints, ascending (read-only)."""
  ckpt = Checkpointer(workdir, read_only=True)
  try:
    return ckpt.steps()
  finally:
    ckpt.close()


def parse_step(text: str) -> int | str:
  """`--step`: a step number, 'latest' or 'all' (ValueError naming the flag otherwise)."""
  if text in ('latest', 'all'):
    return text
  try:
    step = int(text)
  except ValueError:
    step = -1
  if step < 0:
    raise ValueError(f'--step {text!r}: a step number, latest or all')
  return step


@dataclasses.dataclass
class _KeepPolicy:
  """Orbax preservation: the last `keep` interval steps, and the newest step.

  Interval steps are the multiples of `every` (step 0 included); the others
  (saves by time, by preemption, at the end of a run) are kept only while
  they are the newest, so they never push out the interval checkpoints an
  evaluation protocol reads.
  """

  keep: int
  every: int

  def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
    del context
    steps = [int(c.step) for c in checkpoints]
    interval = sorted(s for s in steps if s % self.every == 0)[-self.keep :]
    newest = max(steps, default=None)
    return [s == newest or s in interval for s in steps]


def set_aside_step(directory: epath.Path, step: int) -> epath.Path | None:
  """Moves `directory/<step>` to `directory/../checkpoints.corrupt/<step>.<time>`.

  Local or gs:// alike (`storage.move`: on an object store each file is
  copied, then deleted; etils' rename needed the folder to exist there and
  the step was deleted instead). Returns the new place, or None where the
  move failed and the step was deleted (left in place, it would clash with
  a new save).
  """
  src = directory / str(step)
  dst_dir = directory.parent / 'checkpoints.corrupt'
  storage.makedirs(dst_dir)
  dst = dst_dir / f'{step}.{int(time.time())}'
  try:
    storage.move(src, dst)
  except Exception as e:  # Any failure: delete instead.
    logging.warning('checkpoint: could not move %s (%s); deleting it', src, e)
    src.rmtree(missing_ok=True)
    return None
  logging.warning('checkpoint: moved step %d to %s', step, dst)
  return dst


class Checkpointer:
  """Saves and restores the trainer's state under `workdir/checkpoints`.

  Every host of a multi-host run constructs one and calls every method in the
  same order (they contain collectives); orbax writes each shard from the host
  that owns it and the host data (meta, extras arrays) from process 0, so
  `extras` must be the same on every host (key per-host state by process).

  Usage in the trainer::

    ckpt = Checkpointer(workdir, keep=3, every_steps=50, every_minutes=30)
    ckpt.install_signal_handlers()
    abs_opt = abstract_opt_state(tx, abs_params)  # abs_params: sharded SDS
    resumed = ckpt.restore_latest(abs_params, abs_opt)  # None: fresh start
    step, params, opt_state, extras = resumed or (0, init_p, init_o, {})
    ckpt.start_timer()
    while step < num_steps:
      ...; step += 1
      ckpt.save(step, params=params, opt_state=opt_state, extras={...})
      if ckpt.stop_requested: break      # preempted: saved (if it fits) here
    ckpt.save(step, params=params, opt_state=opt_state, extras={...}, force=True)
    ckpt.close()                         # waits for the writes
  """

  def __init__(
    self,
    workdir: str | epath.PathLike,
    *,
    keep: int = 3,
    every_steps: int = 100,
    every_minutes: float = 0.0,
    save_on_preemption: bool = True,
    clock: Callable[[], float] = time.monotonic,
    async_save: bool = True,
    read_only: bool = False,
  ):
    """Opens (creating, unless read-only) the checkpoint directory.

    Args:
      workdir: run directory, local or gs://.
      keep: number of most recent checkpoints on the step interval kept
        (the newest checkpoint is kept too, whatever its step).
      every_steps: `should_save` says yes when `step % every_steps == 0`.
      every_minutes: `should_save` also says yes at the first step this many
        minutes after the last save (or `start_timer`); 0: off.
      save_on_preemption: whether a checkpoint write fits the preemption
        notice (the caller's estimate, `planner.checkpoint_time`); False: a
        preemption stops without saving (`saves_on_stop`).
      clock: seconds, monotonic, for `every_minutes` (tests pass a fake one).
      async_save: write in a background thread; `save` returns once the
        arrays are copied to host, so the caller may donate them right after.
      read_only: only restore: nothing in the directory is created, cleaned,
        moved or written (another run's checkpoints, maybe still training).
    """
    if keep < 1 or every_steps < 1 or every_minutes < 0:
      raise ValueError(
        f'checkpoint: keep={keep}, every_steps={every_steps} must be >= 1 and '
        f'every_minutes={every_minutes} >= 0'
      )
    # storage.path: gs:// through the filesystem infra.storage configures.
    self.directory = storage.path(workdir) / 'checkpoints'
    self.every_steps = every_steps
    self.every_minutes = float(every_minutes)
    self.save_on_preemption = save_on_preemption
    self.clock = clock
    self._last_save_s = clock()
    self.read_only = read_only
    # Listed before orbax starts, since it removes them in a background thread.
    self._unfinished = self._list_unfinished()
    self._manager = ocp.CheckpointManager(
      self.directory,
      item_handlers={
        'params': _pytree_handler(),
        'opt_state': _pytree_handler(),
        'extras_arrays': _pytree_handler(),
        'meta': ocp.JsonCheckpointHandler(),
      },
      options=ocp.CheckpointManagerOptions(
        # A reader deletes nothing (LatestN(None): all).
        preservation_policy=ocp.checkpoint_managers.LatestN(None)
        if read_only
        else _KeepPolicy(keep, every_steps),
        create=not read_only,
        # Leftovers of a crash mid-save; a reader must not touch them (they
        # may be a save in progress).
        cleanup_tmp_directories=not read_only,
        enable_async_checkpointing=async_save,
        read_only=read_only,
      ),
    )
    self._pending: int | None = None  # A step whose save may still run.
    self.unusable: list[int] = []  # Steps restore_latest found corrupt.
    self.failed: CheckpointSaveError | None = None
    self._signal_flag = False
    self._signals: set[int] = set()  # Handled signals received on this host.
    self._polls = 0  # poll_stop calls: JAX's preemption sync ids.
    self.stop: str | None = None  # PREEMPTION or INTERRUPT, agreed by all hosts.
    # The newest step known to be on disk: restored, or a save that committed.
    self.committed_step: int | None = None
    self._old_handlers: dict[int, Any] = {}
    self._decisions: dict[int, bool] = {}
    self._checksum_fns: dict[Any, Callable] = {}
    self.stop_requested = False  # Set, on every host alike, by a preemption save.

  # Preemption.

  def install_signal_handlers(
    self, signals: Sequence[int] = (signal.SIGTERM, signal.SIGINT)
  ) -> None:
    """Makes the signals set a flag read by `should_save` (call from the main thread).

    A second SIGINT raises KeyboardInterrupt, so Ctrl-C twice still stops a
    hung run. SIGTERM is left to JAX's preemption service when it runs.
    """
    for sig in signals:
      if sig == signal.SIGTERM and _preemption_service_owns_sigterm():
        logging.info('checkpoint: SIGTERM left to the JAX preemption service')
        continue
      self._old_handlers.setdefault(sig, signal.getsignal(sig))
      signal.signal(sig, self._on_signal)

  def _on_signal(self, signum: int, frame: types.FrameType | None) -> None:
    # No I/O here: the handler may interrupt a write in progress.
    if signum == signal.SIGINT and self._signal_flag:
      raise KeyboardInterrupt
    self._signals.add(signum)
    self._signal_flag = True

  @property
  def signal_received(self) -> bool:
    """Whether a handled signal arrived on this host (not yet a decision)."""
    return self._signal_flag

  def poll_stop(self) -> str | None:
    """The stop request of any host: None, `PREEMPTION` or `INTERRUPT`.

    A collective: every host calls it at the same points (step boundaries,
    sampling rounds), so all get the same answer at the same call. Once set
    it stays (a SIGTERM after a SIGINT makes it a preemption).
    """
    self._polls += 1
    got = multihost.sum_over_hosts(
      {
        'term': int(signal.SIGTERM in self._signals),
        'int': int(signal.SIGINT in self._signals),
      }
    )
    # JAX's notice (it owns SIGTERM under jax.distributed); False without it.
    notice = self._manager.reached_preemption(self._polls)
    stop = self.stop
    if got['term'] or notice:
      stop = PREEMPTION
    elif got['int'] and stop is None:
      stop = INTERRUPT
    if stop != self.stop:
      logging.warning('checkpoint: stop requested (%s)', stop)
      self.stop = stop
    return stop

  def saves_on_stop(self) -> bool:
    """Whether the agreed stop saves: an interrupt, or a fitting preemption.

    A preemption saves if the write fits the notice (`save_on_preemption`).
    """
    return self.stop == INTERRUPT or (
      self.stop == PREEMPTION and self.save_on_preemption
    )

  def start_timer(self) -> None:
    """Counts `every_minutes` from now (the start of the work it protects)."""
    self._last_save_s = self.clock()

  def _time_due(self) -> bool:
    """Whether `every_minutes` have passed since the last save, by process 0."""
    if self.every_minutes <= 0:  # The config's: the same on every host.
      return False
    due = self.clock() - self._last_save_s >= self.every_minutes * 60
    # Process 0's clock decides: the hosts' clocks and save times differ a
    # little, and a save that some hosts start alone would hang the others.
    return bool(multihost.broadcast_from_main(int(due)))

  def restore_signal_handlers(self) -> None:
    """Puts back the handlers that `install_signal_handlers` replaced."""
    for sig, handler in self._old_handlers.items():
      signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    self._old_handlers.clear()

  def should_save(self, step: int) -> bool:
    """Whether to save at this step; every host must call it at every step.

    The same answer on every host: the interval is arithmetic, the time is
    process 0's, and the stop is `poll_stop`'s. A stop saves if
    `saves_on_stop()`; one that does not (a preemption whose write would not
    fit the notice) saves nothing, not even on the interval. Repeated calls
    for one step return the first answer.
    """
    if step in self._decisions:
      return self._decisions[step]
    stop = self.poll_stop()
    latest = self._manager.latest_step()
    done = latest is not None and latest >= step
    if stop is not None:
      self.stop_requested = True
      decision = not done and self.saves_on_stop()
      logging.warning(
        'checkpoint: %s at step %d; %s and stopping',
        stop,
        step,
        'saving' if decision else 'not saving',
      )
    else:
      due = step % self.every_steps == 0 or self._time_due()
      decision = not done and due
    self._decisions = {step: decision}
    return decision

  # Save.

  def _checksums(self, leaves: Sequence[Any], compile_only: bool = False) -> list[int]:
    """Per-leaf checksums, one jitted call per set of devices the leaves use.

    An eagerly made optax `count` may sit on one device while the rest spans
    the mesh, and one jit cannot take both.
    """
    groups: dict[Any, list[int]] = {}
    for i, x in enumerate(leaves):
      devices = getattr(x, 'sharding', None)
      key = None if devices is None else tuple(sorted(d.id for d in devices.device_set))
      groups.setdefault(key, []).append(i)
    out = [0] * len(leaves)
    for index in groups.values():
      part = [leaves[i] for i in index]
      key = fmt.leaf_signature(part)
      if compile_only:  # at start-up, so that a save later adds no compile.
        if key not in self._checksum_fns:
          self._checksum_fns[key] = checksum.checksums_jit.lower(part).compile()
        continue
      try:
        values = self._checksum_fns.get(key, checksum.checksums_jit)(part)
      except TypeError:  # a precompiled function rejects other avals.
        values = checksum.checksums_jit(part)
      for i, v in zip(index, jax.device_get(values), strict=True):
        out[i] = int(v)
    return out

  def save(
    self,
    step: int,
    *,
    params: PyTree,
    opt_state: PyTree,
    extras: Mapping[str, Any] | None = None,
    force: bool = False,
  ) -> bool:
    """Writes a checkpoint if `should_save(step)` or `force`; all hosts call it.

    Args:
      step: the number of finished training steps.
      params: pytree of jax arrays (an nnx.State is fine), sharded or not.
        Multi-host, every array must be global (on the mesh): orbax cannot
        write a host-local one such as the `count` of an eager `tx.init`.
      opt_state: optax state (namedtuples, nnx.State inside are fine).
      extras: JSON-able host data (str keys; tuples come back as lists) with
        numeric numpy arrays or typed PRNG keys anywhere inside.
      force: save even off the interval (end of training, preemption).

    Returns:
      Whether a checkpoint was started (it is complete after `wait()`).
    """
    if self.read_only:
      raise ValueError(f'checkpoint: {self.directory} was opened read-only')
    # The previous save first, at every step: a failed one stops the run at
    # the next step at the latest, not at the next interval.
    self.check()
    if not force and not self.should_save(step):
      return False
    if step in self._manager.all_steps():
      return False
    self._probe(step)
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {
      'format': _FORMAT,
      'step': int(step),
      'time': time.time(),
      'extras': fmt.encode_extras(dict(extras or {}), (), arrays),
      'extras_arrays': {k: fmt.host_checksum(v) for k, v in arrays.items()},
    }
    items: dict[str, Any] = {}
    flats = {'params': fmt.flat(params)[0], 'opt_state': fmt.flat(opt_state)[0]}
    # One call over both trees: the function restore_latest compiled.
    sums = self._checksums([x for named in flats.values() for x in named.values()])
    for name, named in flats.items():
      meta[name] = {
        'paths': ['/'.join(p) for p in named],
        'shapes': [list(np.shape(x)) for x in named.values()],
        'checksums': sums[: len(named)],
      }
      sums = sums[len(named) :]
      if named:  # orbax cannot write an empty tree (optax's EmptyState).
        items[name] = ocp.args.PyTreeSave(ocp.tree.from_flat_dict(named))
    if arrays:
      items['extras_arrays'] = ocp.args.PyTreeSave(arrays)
    items['meta'] = ocp.args.JsonSave(meta)
    try:
      saved = self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    except Exception as e:
      raise self._fail(step, e) from e
    logging.info('checkpoint: saving step %d to %s', step, self.directory)
    if saved:
      self._pending = step
      self._last_save_s = self.clock()  # every_minutes counts from here.
    return bool(saved)

  def _fail(self, step: int, cause: BaseException | str) -> CheckpointSaveError:
    """Records and returns the error that stops the run (one line)."""
    if isinstance(cause, BaseException):
      text = ' '.join(f'{type(cause).__name__}: {cause}'.split())[:400]
    else:
      text = cause
    self.failed = CheckpointSaveError(
      f'checkpoint: saving step {step} to {self.directory} failed ({text})'
    )
    self._pending = None
    return self.failed

  def _probe(self, step: int) -> None:
    """Raises CheckpointSaveError unless the directory takes a file now.

    Orbax makes the step directory in a background thread, and when that
    fails the other threads wait for it until a 300 s coordination timeout:
    a save into an unwritable directory would hang the run that long.
    """
    if jax.process_index() == 0:
      probe = self.directory / f'.write_probe.{os.getpid()}'
      try:
        self.directory.mkdir(parents=True, exist_ok=True)
        probe.write_text('')
        probe.unlink()
        problem = ''
      except OSError as e:
        problem = f'{type(e).__name__}: {e.strerror or e}'
    else:
      problem = ''
    if multihost.any_host(bool(problem)):
      raise self._fail(step, problem or 'not writable on process 0')

  def check(self) -> None:
    """Waits for the save in flight, if any; raises if it did not commit.

    Every host calls it at the same points (it may sync hosts). Called by
    `save` before the next save, and by the trainer at each step boundary and
    before a summary or preemption exit says the run is saved.

    Raises:
      CheckpointSaveError: the step's save failed (also kept in `failed`).
    """
    if self.failed is not None:
      raise self.failed
    step = self._pending
    if step is None:
      return
    try:
      self._manager.wait_until_finished()
      self._manager.check_for_errors()
    except Exception as e:
      raise self._fail(step, e) from e
    self._pending = None
    committed = (self.directory / str(step) / _COMMIT_MARKER).exists()
    if multihost.any_host(not committed):
      raise self._fail(step, 'the step did not commit (see the log above)')
    self.committed_step = step

  def check_if_finished(self) -> None:
    """`check` without waiting: only where no host still writes the save.

    Every host calls it at the same point (the in-flight state is agreed).
    """
    if self._pending is None or self.failed is not None:
      return
    if not multihost.any_host(self._manager.is_saving_in_progress()):
      self.check()

  @property
  def pending_step(self) -> int | None:
    """The step whose save was started and not yet checked (`check`)."""
    return self._pending

  # Restore.

  def steps(self) -> list[int]:
    """Steps of the finished checkpoints on disk, ascending."""
    self._manager.reload()
    return list(self._manager.all_steps())

  def restore_latest(
    self, abstract_params: PyTree, abstract_opt_state: PyTree | None = None
  ) -> tuple[int, PyTree, PyTree, dict[str, Any]] | None:
    """Restores the newest complete checkpoint, or returns None if there is none.

    Args:
      abstract_params: pytree (e.g. nnx.State) of jax.ShapeDtypeStruct whose
        `sharding` says where each restored array goes.
      abstract_opt_state: the same for the optimizer state; None skips it
        (export needs params only) and returns None in its place.

    Returns:
      (step, params, opt_state, extras), params and opt_state with the
      targets' structure (Variables and namedtuples included) and shardings.

    Raises:
      CheckpointMismatchError: (a ValueError) a checkpoint's leaf paths or
        shapes differ from the target: a changed config, not a corrupt file.
    """
    targets = self._targets(abstract_params, abstract_opt_state)
    if not self.read_only:  # A reader may be looking at a save in progress.
      self._warn_unfinished()
    for step in reversed(self.steps()):
      out, reason = self._try_step(step, targets)
      if out is not None:
        return out
      logging.warning(
        'checkpoint: step %d in %s is unusable (%s); trying the previous one',
        step,
        self.directory,
        reason,
      )
      self.unusable.append(step)
      if not self.read_only:
        self._quarantine(step)
    return None

  def restore_step(
    self, step: int, abstract_params: PyTree, abstract_opt_state: PyTree | None = None
  ) -> tuple[int, PyTree, PyTree, dict[str, Any]]:
    """Restores the checkpoint of `step` (as `restore_latest`, no fallback).

    Raises:
      StepNotKeptError: `step` is not a finished checkpoint here (the message
        lists the kept steps).
      CorruptCheckpointError: it is there but unreadable or fails its checks.
    """
    kept = self.steps()
    if step not in kept:
      listed = ', '.join(map(str, kept)) or 'none'
      raise StepNotKeptError(
        f'{self.directory}: step {step} is not a kept checkpoint (kept: {listed})'
      )
    out, reason = self._try_step(
      step, self._targets(abstract_params, abstract_opt_state)
    )
    if out is None:
      raise CorruptCheckpointError(
        f'{self.directory}: step {step} is unusable ({reason})'
      )
    return out

  def _targets(
    self, abstract_params: PyTree, abstract_opt_state: PyTree | None
  ) -> dict:
    targets = {'params': fmt.flat(abstract_params)}
    if abstract_opt_state is not None:
      targets['opt_state'] = fmt.flat(abstract_opt_state)
    self._checksums([x for named, _ in targets.values() for x in named.values()], True)
    return targets

  def _try_step(self, step: int, targets: dict[str, tuple]) -> tuple[Any, str]:
    """(restored tuple, '') or (None, why the step is unusable), agreed by all hosts."""
    out, reason = None, 'failed on another host'
    try:
      out = self._restore_step(step, targets)
    except CheckpointMismatchError:
      raise
    except Exception as e:  # Any read failure means a corrupt step.
      reason = f'{type(e).__name__}: {e}'[:500]
    # All hosts agree before going on: each one reads only some shards.
    if not multihost.any_host(out is None):
      return self._verify(step, *out)
    return None, reason

  def _restore_step(self, step: int, targets: dict[str, tuple]) -> tuple:
    if not (self.directory / str(step) / _COMMIT_MARKER).exists():
      raise CorruptCheckpointError(f'no {_COMMIT_MARKER}: an unfinished save')
    meta = self._manager.restore(
      step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
    )['meta']
    if not isinstance(meta, dict) or meta.get('format') != _FORMAT:
      raise CorruptCheckpointError(
        f'meta unreadable or of another format: {meta!r:.200}'
      )
    items = {}
    for name, (named, _) in targets.items():
      ours = {'/'.join(p): list(x.shape) for p, x in named.items()}
      theirs = dict(zip(meta[name]['paths'], meta[name]['shapes'], strict=True))
      diff = sorted(k for k in ours.keys() | theirs if ours.get(k) != theirs.get(k))
      if diff:
        raise CheckpointMismatchError(
          f'checkpoint step {step}: {name} differs from the target (a changed '
          f'config?): {[(k, ours.get(k), theirs.get(k)) for k in diff[:4]]}'
        )
      if named:
        target = ocp.tree.from_flat_dict(named)
        restore_args = ocp.checkpoint_utils.construct_restore_args(target)
        items[name] = ocp.args.PyTreeRestore(target, restore_args=restore_args)
    if meta['extras_arrays']:
      items['extras_arrays'] = ocp.args.PyTreeRestore()
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    trees = {}
    for name, (named, treedef) in targets.items():
      values = ocp.tree.to_flat_dict(restored[name]) if named else {}
      trees[name] = treedef.unflatten([values[p] for p in named])
    arrays = dict(restored['extras_arrays']) if meta['extras_arrays'] else {}
    for key, crc in meta['extras_arrays'].items():
      if key not in arrays or fmt.host_checksum(np.asarray(arrays[key])) != crc:
        raise CorruptCheckpointError(f'extras array {key} does not match its checksum')
    extras = fmt.decode_extras(meta['extras'], arrays)
    return trees, meta, extras

  def _verify(self, step: int, trees: dict, meta: dict, extras: dict) -> tuple:
    """(result, '') if every leaf matches its checksum, else (None, reason)."""
    want = [c for name in trees for c in meta[name]['checksums']]
    paths = [f'{name}/{p}' for name in trees for p in meta[name]['paths']]
    got = self._checksums([x for t in trees.values() for x in jax.tree.leaves(t)])
    bad = [p for p, a, b in zip(paths, got, want, strict=True) if a != b]
    if bad:
      return None, f'checksum mismatch in {bad[0]} ({len(bad)} leaves)'
    logging.info('checkpoint: restored step %d from %s', step, self.directory)
    self.committed_step = step
    return (step, trees['params'], trees.get('opt_state'), extras), ''

  def _list_unfinished(self) -> list[tuple[int, epath.Path]]:
    """(step, path) of orbax temporary directories a crash mid-save left."""
    found = []
    for path in self.directory.iterdir() if self.directory.exists() else []:
      head = path.name.split('.', 1)[0]
      if head.isdigit() and head != path.name:  # 'STEP.orbax-checkpoint-tmp-T'
        found.append((int(head), path))
    return sorted(found)

  def _warn_unfinished(self) -> None:
    latest = max(self.steps(), default=-1)
    for step, path in self._unfinished:
      if step > latest:
        logging.warning(
          'checkpoint: %s is an unfinished save (crash mid-save?); resuming from %s',
          path,
          latest if latest >= 0 else 'scratch',
        )

  def _quarantine(self, step: int) -> None:
    # Moved, not deleted: it may hold most of a long run, worth salvaging.
    if jax.process_index() == 0:
      set_aside_step(self.directory, step)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils

      multihost_utils.sync_global_devices(f'ada_jax_checkpoint_quarantine_{step}')
    self._manager.reload()

  # Lifetime.

  def wait(self) -> None:
    """Blocks until a background save is complete on disk (see `check`).

    After a failed save it returns at once: orbax's threads for that save
    may wait minutes on each other, and the run is stopping anyway.
    """
    if self.failed is None:
      self.check()

  def close(self) -> None:
    """Finishes pending writes and puts back the signal handlers."""
    self.restore_signal_handlers()
    if self.failed is None:
      self.check()
      self._manager.close()

  def __enter__(self) -> Checkpointer:
    return self

  def __exit__(self, *exc: object) -> None:
    self.close()
