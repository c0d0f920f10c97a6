"""Per-call deadline of the answer verifier: a cooperative timer and SIGALRM.

``verifier.verify`` starts a deadline per call; the comparison code calls
``check()`` between steps (each parse, numeric evaluation and probe), which
raises VerifyTimeoutError once the deadline has passed. Sympy can still spend
long inside one step, so ``Alarm`` adds an interval timer as a second line,
but only on the main thread and only when nobody else uses SIGALRM. The hard
deadline that needs neither is the process pool (``pool``).
"""

from __future__ import annotations

import signal
import threading
import time


class VerifyTimeoutError(Exception):
  """The verification ran past its deadline."""


class _Deadline:
  def __init__(self, seconds: float):
    self.end = time.monotonic() + seconds

  def check(self) -> None:
    if time.monotonic() > self.end:
      raise VerifyTimeoutError('verify deadline')


_state = threading.local()  # each thread's current _Deadline (or none)


def start(seconds: float) -> None:
  """Starts this thread's cooperative deadline, ``seconds`` from now."""
  _state.deadline = _Deadline(seconds)


def clear() -> None:
  """Removes this thread's deadline (``check`` then never raises)."""
  _state.deadline = None


def check() -> None:
  """Raises VerifyTimeoutError if this thread's deadline has passed."""
  deadline = getattr(_state, 'deadline', None)
  if deadline is not None:
    deadline.check()


class Alarm:
  """SIGALRM timer on the main thread, only when nobody else uses SIGALRM."""

  def __init__(self, seconds: float):
    self.seconds = seconds
    self.armed = False

  def __enter__(self) -> Alarm:
    if threading.current_thread() is not threading.main_thread() or not hasattr(
      signal, 'setitimer'
    ):
      return self
    if (
      signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None)
      or signal.getitimer(signal.ITIMER_REAL)[0]
    ):
      return self
    signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, self.seconds)
    self.armed = True
    return self

  def __exit__(self, *exc: object) -> None:
    if self.armed:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _raise_timeout(signum: int, frame: object) -> None:
  raise VerifyTimeoutError('verify alarm')
