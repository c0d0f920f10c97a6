"""Progress of a loop: a tqdm bar on a terminal, plain lines in a log file.

A tqdm bar redraws itself with carriage returns; written to a file (a job's
output redirected, a TPU worker's log) every redraw stays, and the log is
mostly bar. `progress(iterable, desc=...)` keeps the bar when its stream is
a terminal and otherwise prints one plain line now and then, and one at the
end, with the values the loop last set with `set_postfix`:

  rl/balance: step 50/250 (20%), 1.2 s/step, eta 4m00s, r1=0.21 rounds=4

When a line is due (non-terminal streams): every `every` steps (default:
the fewest that give at most 20 lines per loop, between 10 and 20 for a
long loop: enough to read a trend, few enough to find the rest of the log)
and, for slow loops, whenever `interval_s` seconds passed since the last
line (default 60: a log shows within a minute that a run is alive, even at
minutes per step); and after the last step.

This is the package's only user of tqdm.

Dimension legend: none (no arrays here).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, Generic, Protocol, TypeVar

import tqdm

T = TypeVar('T')
T_co = TypeVar('T_co', covariant=True)

LINES_PER_LOOP = 20
INTERVAL_S = 60.0


class Progress(Protocol[T_co]):
  """What a loop sees: the items, and `set_postfix` for the values shown."""

  def __iter__(self) -> Iterator[T_co]: ...

  def set_postfix(self, **values: Any) -> None: ...


def is_terminal(stream: IO[str]) -> bool:
  """Whether `stream` is a terminal (a closed or odd stream is not)."""
  try:
    return bool(stream.isatty())
  except (AttributeError, ValueError, OSError):
    return False


def progress(
  iterable: Iterable[T],
  *,
  desc: str | None = None,
  total: int | None = None,
  initial: int = 0,
  unit: str = 'step',
  every: int | None = None,
  interval_s: float | None = INTERVAL_S,
  disable: bool = False,
  leave: bool = True,
  file: IO[str] | None = None,
) -> Progress[T]:
  """The items of `iterable`, with progress shown on `file`.

  Args:
    iterable: the loop's items.
    desc: what the loop does (the bar's label, each line's start).
    total: items in the whole loop counting `initial` ones; default
      `initial + len(iterable)` when it has a length.
    initial: items done before this call (a resumed run's steps).
    unit: what an item is called.
    every: a line every this many items (non-terminal streams); default
      at most `LINES_PER_LOOP` lines per loop, every item when the length
      is unknown.
    interval_s: also a line once this many seconds passed since the last
      one; None: by count only.
    disable: show nothing (e.g. on all but one host).
    leave: keep the finished bar on a terminal (a log keeps its last line).
    file: the stream; default sys.stderr at call time (as tqdm).
  """
  stream = sys.stderr if file is None else file
  if total is None and hasattr(iterable, '__len__'):
    total = initial + len(iterable)  # type: ignore[arg-type]
  if not disable and is_terminal(stream):
    return tqdm.tqdm(
      iterable,
      desc=desc,
      total=total,
      initial=initial,
      unit=unit,
      leave=leave,
      file=stream,
    )
  return Lines(
    iterable,
    desc=desc,
    total=total,
    initial=initial,
    unit=unit,
    every=every,
    interval_s=interval_s,
    disable=disable,
    file=stream,
  )


class Lines(Generic[T]):
  """Progress as plain lines, for streams that are not terminals."""

  def __init__(
    self,
    iterable: Iterable[T],
    *,
    desc: str | None,
    total: int | None,
    initial: int,
    unit: str,
    every: int | None,
    interval_s: float | None,
    disable: bool,
    file: IO[str],
  ):
    if every is None:
      todo = None if total is None else total - initial
      every = 1 if not todo else math.ceil(todo / LINES_PER_LOOP)
    if every < 1:
      raise ValueError(f'every must be >= 1, got {every}')
    self.iterable, self.desc, self.total, self.initial = iterable, desc, total, initial
    self.unit = unit
    self.every, self.interval_s, self.disable = every, interval_s, disable
    self.file = file
    self.postfix: dict[str, Any] = {}

  def set_postfix(self, **values: Any) -> None:
    """The values shown at the end of the next lines (replacing the last)."""
    self.postfix = values

  def __iter__(self) -> Iterator[T]:
    start = last = time.monotonic()
    done = printed = 0  # Items finished in this loop; at the last line.
    for item in self.iterable:
      yield item  # The loop body runs (and sets the postfix) here.
      done += 1
      now = time.monotonic()
      due = done % self.every == 0 or (
        self.interval_s is not None and now - last >= self.interval_s
      )
      if due and not self.disable:
        self._line(done, now - start)
        last, printed = now, done
    if not self.disable and (printed < done or done == 0):
      self._line(done, time.monotonic() - start)

  def _line(self, done: int, elapsed_s: float) -> None:
    n = self.initial + done
    parts = [f'{self.unit} {n}']
    if self.total:
      parts = [f'{self.unit} {n}/{self.total} ({n / self.total:.0%})']
    if done:
      per = elapsed_s / done
      parts.append(f'{_per_item(per)}/{self.unit}')
      if self.total and n < self.total:
        parts.append(f'eta {_duration(per * (self.total - n))}')
      elif self.total:
        parts.append(f'took {_duration(elapsed_s)}')
    text = ', '.join(parts)
    if self.postfix:
      text += ', ' + ' '.join(f'{k}={v}' for k, v in self.postfix.items())
    self.file.write(f'{self.desc}: {text}\n' if self.desc else f'{text}\n')
    self.file.flush()


def _per_item(s: float) -> str:
  """`12 s`, `1.2 s`, `310 ms`: a time per item, to about two digits."""
  if s >= 10:
    return f'{s:.0f} s'
  return f'{s:.1f} s' if s >= 1 else f'{1000 * s:.0f} ms'


def _duration(s: float) -> str:
  """4m00s, 1h02m, 35s."""
  s = round(s)
  if s < 60:
    return f'{s}s'
  if s < 3600:
    return f'{s // 60}m{s % 60:02d}s'
  return f'{s // 3600}h{s % 3600 // 60:02d}m'
