"""``verify_batch``: a worker-process pool with a hard per-item deadline.

Signals cannot bound a sympy call made off the main thread (Ray, async, thread
pools), so the batch path runs each item in a worker process and the parent
enforces the deadline with ``multiprocessing.connection.wait``: a worker still
busy when its item's time is up is killed (SIGKILL) and replaced by a fresh
one, and the item scores False. A worker that dies on its own (the OOM
killer, a crash in a native library) is not a verdict: its item is
re-verified once on a fresh worker, and only if that one dies too does it
score False, counted as `worker_deaths` (a timeout is not retried: an input
that hangs would cost its deadline twice). Workers come from a forkserver that preloaded
the verifier and warmed sympy once (``warmup``: cheap, warm respawns, and no
fork of a parent holding JAX threads). The parent extracts the boxed answer
itself (linear time), so only short strings cross the pipes (graders that
read the whole response, the Qwen-style one, get it all). The grader is ``backend``
(``backends``: ours, or the reference's Math-Verify and Qwen-style graders,
whose own signal timeouts are off: the kill is their deadline too). An item's
clock starts when a ready worker takes it: a worker first reports that it
has started (a respawn on a loaded machine can take seconds), so a slow start
never turns correct answers into timeouts.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ada_jax.verifier import backends, grade

_STAT_KEYS = ('calls', 'timeouts', 'guard_trips', 'parse_failures', 'worker_deaths')
_READY = 'ready'
# How long a worker may take to start; past it the machine is broken, not slow.
_START_TIMEOUT_S = 300.0


def _crash_if_asked(answer: str, crash: tuple[str, dict[str, int]] | None) -> None:
  """Test hook: the process exits on `answer` the first `times` it sees it.

  `crash` is (a directory, {answer: times}); each death leaves a file there,
  so the count holds across the fresh workers that replace the dead ones.
  """
  if crash is None or answer not in crash[1]:
    return
  directory, times = crash[0], crash[1][answer]
  died = [f for f in os.listdir(directory) if f.startswith(f'{answer}.')]
  if len(died) < times:
    with open(os.path.join(directory, f'{answer}.{len(died)}'), 'w'):
      pass
    os._exit(1)


def _worker_main(
  conn: Any,
  start_delay_s: float = 0.0,
  backend: str = 'ada',
  crash: tuple[str, dict[str, int]] | None = None,
) -> None:
  """Worker loop: runs chunks of (index, answer, reference) tasks.

  Loads and runs `backend` once, sends `_READY`, then one (index, ok,
  seconds, counter deltas) message per task when done. `start_delay_s`
  stands in for a slow start in tests, `crash` for a worker that dies
  (`_crash_if_asked`).
  """
  time.sleep(start_delay_s)
  backends.warm(backend)
  conn.send(_READY)
  while True:
    try:
      chunk = conn.recv()
    except (EOFError, OSError):
      return
    if chunk is None:
      return
    for index, answer, reference in chunk:
      _crash_if_asked(answer, crash)
      before = grade.counters()
      start = time.monotonic()
      ok = backends.equivalent(answer, reference, backend)
      elapsed = time.monotonic() - start
      after = grade.counters()
      conn.send((index, ok, elapsed, {k: after[k] - before[k] for k in after}))


class _Worker:
  def __init__(
    self,
    ctx: Any,
    start_delay_s: float = 0.0,
    backend: str = 'ada',
    crash: tuple[str, dict[str, int]] | None = None,
  ):
    self.conn, child = ctx.Pipe()
    self.proc = ctx.Process(
      target=_worker_main, args=(child, start_delay_s, backend, crash), daemon=True
    )
    self.proc.start()
    child.close()
    self.queue: collections.deque[tuple[int, str, str]] = collections.deque()
    self.started = 0.0  # when the task at the head of the queue started
    self.ready = False

  def wait_ready(self) -> None:
    """Blocks until the worker has started (its first message)."""
    if self.ready:
      return
    if not self.conn.poll(_START_TIMEOUT_S):
      raise RuntimeError(
        f'verifier worker (pid {self.proc.pid}) did not start in {_START_TIMEOUT_S:.0f} s'
      )
    if self.conn.recv() != _READY:
      raise RuntimeError('verifier worker: unexpected first message')
    self.ready = True

  def kill(self) -> None:
    self.proc.kill()
    self.proc.join(timeout=5)
    self.conn.close()

  def close(self) -> None:
    with contextlib.suppress(OSError, ValueError):
      self.conn.send(None)
    self.proc.join(timeout=1)
    if self.proc.is_alive():
      self.kill()
    else:
      self.conn.close()


class _Pool:
  def __init__(
    self,
    size: int,
    start_delay_s: float = 0.0,
    backend: str = 'ada',
    crash: tuple[str, dict[str, int]] | None = None,
  ):
    self.ctx = multiprocessing.get_context('forkserver')
    self.ctx.set_forkserver_preload(['ada_jax.verifier', 'ada_jax.verifier.warmup'])
    self.size = size
    self.start_delay_s = start_delay_s
    self.backend = backend
    self.crash = crash
    self.workers = [
      _Worker(self.ctx, start_delay_s, backend, crash) for _ in range(size)
    ]

  def close(self) -> None:
    for w in self.workers:
      w.close()
    self.workers = []

  def run(
    self, tasks: list[tuple[int, str, str]], n: int, timeout_s: float
  ) -> tuple[list[bool], dict[str, int]]:
    """Scores ``tasks``; each task gets ``timeout_s`` from the moment it starts.

    Tasks go out in small chunks (fewer pipe round trips); a worker starts a
    task when it reports the previous one, so the parent knows every task's
    start time and can kill the worker the moment its current task overruns.
    A worker that dies sends its current task back once (to the fresh
    worker that replaces it); a second death scores it False.
    """
    results = [False] * n
    retried: set[int] = set()
    stats: collections.Counter[str] = collections.Counter()
    pending = collections.deque(tasks)
    idle = list(self.workers)
    for w in idle:  # A new pool: all start before any item's clock does.
      with contextlib.suppress(EOFError, OSError):  # died: handled below
        w.wait_ready()
    busy: dict[Any, _Worker] = {}
    while pending or busy:
      while pending and idle:
        w = idle.pop()
        size = max(1, min(16, len(pending) // (2 * self.size)))
        chunk = [pending.popleft() for _ in range(size)]
        try:
          w.wait_ready()  # The item clocks start below, not during a start.
          w.conn.send(chunk)
        except (OSError, ValueError, EOFError):  # died idle: replace, resend
          pending.extendleft(reversed(chunk))
          idle.append(self._replace(w))
          continue
        w.queue.extend(chunk)
        w.started = time.monotonic()
        busy[w.conn] = w
      wait_s = min(w.started + timeout_s for w in busy.values()) - time.monotonic()
      for conn in multiprocessing.connection.wait(list(busy), timeout=max(wait_s, 0)):
        w = busy[conn]
        try:
          while conn.poll():
            index, ok, elapsed, deltas = conn.recv()
            stats.update(deltas)
            if elapsed > timeout_s:  # finished, but late: same verdict as a kill
              stats['timeouts'] += 1
              ok = False
            results[index] = bool(ok)
            w.queue.popleft()
            w.started = time.monotonic()
        except (EOFError, OSError):  # the worker died (not a timeout)
          del busy[conn]
          if w.queue:
            task = w.queue[0]
            if task[0] in retried:  # died twice: scores False, counted
              stats['calls'] += 1
              stats['worker_deaths'] += 1
              w.queue.popleft()
            else:  # once more, first in line for the fresh worker
              retried.add(task[0])
            pending.extendleft(reversed(w.queue))
          idle.append(self._replace(w))
          continue
        if not w.queue:
          del busy[conn]
          idle.append(w)
      now = time.monotonic()
      for conn, w in list(busy.items()):
        if now - w.started > timeout_s:
          del busy[conn]
          stats['timeouts'] += 1
          stats['calls'] += 1
          w.queue.popleft()
          pending.extendleft(reversed(w.queue))  # the rest of its chunk goes back
          idle.append(self._replace(w))
    return results, dict(stats)

  def _replace(self, w: _Worker) -> _Worker:
    w.kill()
    fresh = _Worker(self.ctx, self.start_delay_s, self.backend, self.crash)
    self.workers[self.workers.index(w)] = fresh
    return fresh


_POOL: _Pool | None = None
_POOL_LOCK = threading.Lock()


def _shutdown() -> None:
  global _POOL
  if _POOL is not None:
    _POOL.close()
    _POOL = None


atexit.register(_shutdown)


def run(
  responses: list[str],
  references: list[str],
  *,
  timeout_s: float,
  workers: int | None,
  backend: str = 'ada',
) -> tuple[list[bool], dict[str, int]]:
  """Scores pairs in the (persistent) pool; returns verdicts and counter deltas."""
  global _POOL
  size = workers or min(os.cpu_count() or 1, 16)
  tasks = []
  for k, (response, reference) in enumerate(zip(responses, references, strict=True)):
    answer = backends.extract(response, backend) if isinstance(response, str) else None
    if answer is not None and isinstance(reference, str):
      tasks.append((k, answer, reference))
  stats = {'calls': len(responses) - len(tasks)}
  if not tasks:
    return [False] * len(responses), stats
  with _POOL_LOCK:
    if _POOL is None or _POOL.size != size or _POOL.backend != backend:
      _shutdown()
      _POOL = _Pool(size, backend=backend)
    try:
      results, deltas = _POOL.run(tasks, len(responses), timeout_s)
    except BaseException:
      # Interrupted mid-batch: results may be in flight, so drop the pool.
      _shutdown()
      raise
  for key in _STAT_KEYS:
    stats[key] = stats.get(key, 0) + deltas.get(key, 0)
  return results, stats


def shutdown() -> None:
  """Stops the worker processes (they are also stopped at interpreter exit)."""
  with _POOL_LOCK:
    _shutdown()


def verify_batch(
  responses: Sequence[str],
  references: Sequence[str],
  *,
  timeout_s: float = 2.0,
  workers: int | None = None,
  backend: str = 'ada',
) -> np.ndarray:
  """Scores many (response, reference) pairs in worker processes.

  Each item gets ``timeout_s`` of worker time; a worker still busy after that
  is killed and replaced (no reliance on signals, so this works from any
  thread) and the item scores False. The pool persists between calls. The
  workers' counter increments are added to this process's ``counters()``.

  Args:
    responses: model responses.
    references: reference answers, one per response.
    timeout_s: hard per-item deadline in seconds.
    workers: number of worker processes (default: CPU count, at most 16).
    backend: the grader (``backends.GRADERS``): ``ada`` (ours), ``math_verify``
      (the reference's reward), ``math_verify_eval`` or ``qwen`` (the
      reference's evaluation graders). The pool restarts when it changes.

  Returns:
    A bool array of shape ``[len(responses)]``.

  Raises:
    ValueError: if the two sequences differ in length, or an unknown backend.
    ImportError: a Math-Verify backend without the ``math_verify`` extra.
  """
  if len(responses) != len(references):
    raise ValueError('responses and references differ in length')
  backends.check(backend)
  results, stats = run(
    list(responses),
    list(references),
    timeout_s=timeout_s,
    workers=workers,
    backend=backend,
  )
  grade.add_counts(stats)
  return np.asarray(results, dtype=bool)
