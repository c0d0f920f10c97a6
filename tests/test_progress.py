"""Tests for ada_jax.infra.progress: plain lines off a terminal, tqdm on one.

Streams are StringIO objects, whose `isatty` says False (a log file) or,
patched, True (a terminal); the line count follows from `every` alone
(`interval_s=None`), or from `interval_s=0` (a line after every item).
"""

import io

import pytest
import tqdm

from ada_jax.infra import progress as progress_lib


class Terminal(io.StringIO):
  def isatty(self):
    return True


def lines_of(stream):
  text = stream.getvalue()
  assert '\r' not in text
  return text.splitlines()


def test_log_stream_gets_plain_lines_with_postfix():
  out = io.StringIO()
  bar = progress_lib.progress(
    range(10), desc='rl/balance', every=3, interval_s=None, file=out
  )
  assert not isinstance(bar, tqdm.tqdm)
  for i in bar:
    bar.set_postfix(r1=f'{i / 10:.2f}', rounds=4)
  lines = lines_of(out)
  # Every 3 steps, and the last one: 3, 6, 9, 10.
  assert [line.split(',')[0] for line in lines] == [
    'rl/balance: step 3/10 (30%)',
    'rl/balance: step 6/10 (60%)',
    'rl/balance: step 9/10 (90%)',
    'rl/balance: step 10/10 (100%)',
  ]
  assert lines[0].endswith('r1=0.20 rounds=4')  # The postfix of step 3.
  assert lines[-1].endswith('r1=0.90 rounds=4')
  assert all(' ms/step' in line or ' s/step' in line for line in lines)
  assert 'eta ' in lines[0] and 'took ' in lines[-1]


@pytest.mark.parametrize('steps, lines', [(250, 20), (100, 20), (7, 7), (41, 14)])
def test_default_is_at_most_twenty_lines_per_loop(steps, lines):
  out = io.StringIO()
  for _ in progress_lib.progress(range(steps), desc='x', interval_s=None, file=out):
    pass
  assert len(lines_of(out)) == lines


def test_resumed_loop_counts_from_initial():
  out = io.StringIO()
  for _ in progress_lib.progress(
    range(101, 251), desc='rl', total=250, initial=100, interval_s=None, file=out
  ):
    pass
  lines = lines_of(out)
  assert len(lines) == 19  # 150 steps, a line every 8 (ceil(150 / 20)), the last.
  assert lines[0].startswith('rl: step 108/250 (43%)')
  assert lines[-1].startswith('rl: step 250/250 (100%)')


def test_interval_gives_a_line_per_slow_step():
  out = io.StringIO()
  for _ in progress_lib.progress(
    iter(range(5)), desc='sft', every=100, interval_s=0.0, file=out
  ):
    pass
  lines = lines_of(out)
  assert [line.split(',')[0] for line in lines] == [
    f'sft: step {i}' for i in range(1, 6)
  ]


def test_disabled_and_empty():
  out = io.StringIO()
  for _ in progress_lib.progress(range(5), desc='x', disable=True, file=out):
    pass
  assert out.getvalue() == ''
  for _ in progress_lib.progress([], desc='eval', unit='chunk', file=out):
    pass
  assert lines_of(out) == ['eval: chunk 0']


def test_terminal_gets_the_bar():
  out = Terminal()
  bar = progress_lib.progress(range(5), desc='sft', file=out)
  assert isinstance(bar, tqdm.tqdm)
  for _ in bar:
    bar.set_postfix(loss='0.5')
  assert '\r' in out.getvalue() and 'loss=0.5' in out.getvalue()


def test_default_stream_is_stderr_at_call_time(capsys):
  for _ in progress_lib.progress(range(2), desc='x', interval_s=None):
    pass
  out, err = capsys.readouterr()
  assert out == '' and err.startswith('x: step 1/2') and '\r' not in err
