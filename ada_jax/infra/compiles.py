"""Counts backend compilations, to prove "no recompiles after warm-up".

Every time jit needs an executable that is not in its in-memory cache, JAX
records one BACKEND_COMPILE event (a real XLA compile or a load from the
persistent compilation cache; both mean a retrace happened). The trainer logs
the running total as `num_compiles`; tests assert it stays flat.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from jax import monitoring

_EVENT = '/jax/core/compile/backend_compile_duration'
_lock = threading.Lock()
_count = 0
_names: list[str] = []


def _listener(event: str, duration: float, **kwargs) -> None:
  del duration
  if event != _EVENT:
    return
  global _count
  with _lock:
    _count += 1
    _names.append(str(kwargs.get('fun_name', '?')))


monitoring.register_event_duration_secs_listener(_listener)


def num_compiles() -> int:
  """Backend compiles in this process so far."""
  return _count


def compiled_names(since: int = 0) -> list[str]:
  """Names of the functions compiled, from the `since`-th compile on."""
  with _lock:
    return list(_names[since:])


@contextlib.contextmanager
def assert_no_compiles(what: str = '') -> Iterator[None]:
  """Raises AssertionError naming the functions if anything compiles inside."""
  start = num_compiles()
  yield
  new = compiled_names(start)
  if new:
    raise AssertionError(f'{what}: {len(new)} unexpected compile(s): {new}')
