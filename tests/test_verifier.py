"""Tests for the math answer verifier (ada_jax.verifier)."""

import collections
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ada_jax import verifier
from tests.verifier_cases import CASES, b

DEADLINE_S = 2.0


@pytest.mark.parametrize(('category', 'response', 'reference', 'expected'), CASES)
def test_table(category, response, reference, expected):
  assert verifier.verify(response, reference) is expected, (
    category,
    response,
    reference,
  )


def test_table_covers_every_category():
  counts = collections.Counter(c[0] for c in CASES)
  assert len(CASES) >= 150
  survey = [
    'integer',
    'negative',
    'decimal_fraction',
    'dfrac_tfrac',
    'sqrt',
    'pi',
    'degrees',
    'percent',
    'thousands_separator',
    'multiple_choice',
    'text_answer',
    'tuple',
    'set',
    'interval',
    'equation',
    'expression',
    'scientific_notation',
    'units',
    'matrix',
    'no_answer',
    'multiple_boxed',
    'nested_braces',
    'complex',
    'numeric_precision',
  ]
  assert all(counts[c] >= 5 for c in survey), counts


_MARKERS = ('/tmp/verifier_pwned', '/tmp/verifierpwned2', '/tmp/verifierpwned3')

ADVERSARIAL = [
  # Power towers and huge values: guards trip, never evaluated.
  (b('9^{9^{9^{9}}}'), '0', False),
  (b('2^{2^{2^{2^{2^{2}}}}}'), '4', False),
  (b('10^{10^{10}}'), '1', False),
  (b('10^{-10^{10}}'), '0', False),
  (b('x^{x^{x^{x^{x}}}}'), 'x', False),
  (b('x^{1000000}'), 'x', False),
  (b('e^{e^{e^{e^{10}}}}'), '1', False),
  (b('e^{10^{6}}'), '1', False),
  # Huge factorials and binomials.
  (b('(10^{10})!'), '1', False),
  (b('100000!'), '1', False),
  (b('((3!)!)!!'), '1', False),
  (b('\\binom{10^{9}}{5 \\cdot 10^8}'), '1', False),
  # 5,000-digit literals (too long for a box, and over the literal cap).
  (b('1' * 5000), '1' * 5000, False),
  (b('9' * 5000), '5', False),
  (b('1.' + '0' * 990 + '1'), '1', False),
  # 3,000-deep nesting and 500-deep fractions.
  (b('(' * 3000 + '1' + ')' * 3000), '1', False),
  (b('{' * 3000 + '1' + '}' * 3000), '1', False),
  ('\\boxed{' * 3000 + '1' + '}' * 3000, '1', False),
  (b('\\frac{' * 500 + '1' + '}{2}' * 500), '1', False),
  (b('\\sqrt' * 300 + '{2}'), '2', False),
  (b('\\left(' * 400 + 'x' + '\\right)' * 400), 'x', False),
  # Regex bait and long symbols.
  ('$' * 20000 + '\\boxed{1}', '2', False),
  ('$' * 20000, '1', False),
  ('\\boxed{' + '{' * 20000, '1', False),
  (b('x' * 20000), 'x', False),
  (b('a' * 900), 'a', False),
  (b('\\text{' * 200 + '5' + '}' * 200), '5', False),
  # Garbage followed by the right number: never the trailing number.
  (b('@#!% 7'), '7', False),
  (b('x^2 \\neq\\neq 4'), '4', False),
  (b('\\unknowncmd{12} 7'), '7', False),
  # Code-injection probes: must not run.
  (b("__import__('os').system('touch /tmp/verifier_pwned')"), '0', False),
  (b("open('/tmp/verifierpwned2','w').close() or \\pi"), '\\pi', False),
  (b("abs(0*len(open('/tmp/verifierpwned3','w').name))"), '0', False),
  (b("\\pi\\;\\text{or}\\;eval(\"open('/tmp/verifier_pwned','w')\")"), '\\pi', False),
  # Division by zero and friends.
  (b('\\frac{1}{0}'), '\\infty', False),
  (b('0^{-1}'), '\\infty', False),
  # Legitimate huge controls: these are True.
  ('\\boxed{1} ' * 5000 + ' so \\boxed{42}', '42', True),
  ('x ' * 56000 + '\\boxed{7}', '7', True),
  ('\\boxed{' * 5000 + ' so \\boxed{42}', '42', True),
  ('\\boxed{' + '{' * 50000 + '\\boxed{42}', '42', True),
  (b('2^{100}'), '1267650600228229401496703205376', True),
  (b('1+' * 240 + '1'), '241', True),
]


@pytest.mark.parametrize(('response', 'reference', 'expected'), ADVERSARIAL)
def test_adversarial_within_deadline(response, reference, expected):
  start = time.monotonic()
  got = verifier.verify(response, reference)
  elapsed = time.monotonic() - start
  assert got is expected
  assert elapsed < DEADLINE_S, elapsed
  assert not any(os.path.exists(m) for m in _MARKERS)


def test_injection_probes_create_no_files():
  for marker in _MARKERS:
    assert not os.path.exists(marker)
  payloads = [
    "__import__('os').system('touch /tmp/verifier_pwned')",
    "open('/tmp/verifierpwned2','w').close() or \\pi",
    "abs(0*len(open('/tmp/verifierpwned3','w').name))",
  ]
  for payload in payloads:
    for reference in ('0', '\\pi', payload):
      assert verifier.equivalent(payload, reference) is (payload == reference)
  assert not any(os.path.exists(m) for m in _MARKERS)


def test_no_string_evaluation_in_the_verifier_sources():
  # The parser builds sympy objects itself: no eval-like entry point may appear.
  root = pathlib.Path(verifier.__file__).parent
  forbidden = re.compile(
    r'\b(sympify|parse_expr|parse_latex|latex2sympy|eval|exec)\s*\('
  )
  # Every module of the verifier package.
  paths = sorted(root.glob('*.py'))
  names = {path.name for path in paths}
  assert {
    '__init__.py',
    'normalize.py',
    'nodes.py',
    'build.py',
    'guards.py',
    'lexer.py',
    'parser.py',
    'grade.py',
    'compare.py',
    'deadline.py',
    'pool.py',
    'scalars.py',
    'values.py',
  } <= names, names
  for path in paths:
    assert not forbidden.search(path.read_text()), path.name


def test_import_does_not_pull_in_jax():
  code = 'import sys, ada_jax.verifier; assert "jax" not in sys.modules'
  root = pathlib.Path(verifier.__file__).parents[2]
  subprocess.run([sys.executable, '-c', code], check=True, cwd=root, timeout=60)


def test_extract():
  assert verifier.extract('a \\boxed{1} b \\boxed{\\frac{1}{2}} c') == '\\frac{1}{2}'
  assert verifier.extract('\\fbox{7}') == '7'
  assert verifier.extract('\\boxed{\\{1, 2\\}}') == '\\{1, 2\\}'
  assert verifier.extract('\\boxed{\\boxed{3}}') == '\\boxed{3}'
  assert verifier.extract('\\boxed{a}{b}') == 'a'
  assert verifier.extract('no box') is None
  assert verifier.extract('\\boxed{1') is None
  assert verifier.extract('\\boxed{}') is None
  assert verifier.extract('\\boxed 5') is None
  assert verifier.extract('\\boxed{' + '1' * 1001 + '}') is None


def test_extract_is_linear_on_huge_input():
  text = '\\boxed{1}' * 200_000 + '\\boxed{2}'
  start = time.monotonic()
  assert verifier.extract(text) == '2'
  assert time.monotonic() - start < 0.5


def test_answer_is_fallback_is_eval_only():
  response = 'Adding up, the answer is 12. Done'
  assert verifier.verify(response, '12') is False
  assert verifier.verify(response, '12', allow_answer_is=True) is True
  assert verifier.verify(response, '13', allow_answer_is=True) is False


def test_never_raises_on_bad_types():
  assert verifier.verify(None, '1') is False  # type: ignore[arg-type]
  assert verifier.verify('\\boxed{1}', None) is False  # type: ignore[arg-type]
  assert verifier.verify(b'\\boxed{1}', '1') is False  # type: ignore[arg-type]
  assert verifier.equivalent('1', 1) is False  # type: ignore[arg-type]


def test_equivalent_is_reference_directed():
  # A prediction interval answers a reference inequality; against a reference
  # interval only a solved inequality (the bare symbol) is an answer, never
  # the question's own unsolved inequality.
  assert verifier.equivalent('(1, 2)', '1 < x < 2')
  assert verifier.equivalent('1 < x < 2', '(1, 2)')
  assert verifier.equivalent('3 < 2x + 1 < 5', '1 < x < 2')
  assert not verifier.equivalent('3 < 2x + 1 < 5', '(1, 2)')


def test_counters_track_guard_trips_and_parse_failures():
  verifier.reset_counters()
  assert verifier.verify(b('9^{9^{9^{9}}}'), '1') is False
  assert verifier.verify(b('@#!% 7'), '7') is False
  assert verifier.verify(b('3'), '3') is True
  counts = verifier.counters()
  assert counts['calls'] == 3
  assert counts['guard_trips'] == 1
  assert counts['parse_failures'] == 1
  assert counts['timeouts'] == 0


def test_verify_from_a_thread():
  out = []
  thread = threading.Thread(
    target=lambda: out.append(verifier.verify(b('\\frac{2}{4}'), '0.5'))
  )
  thread.start()
  thread.join(timeout=10)
  assert out == [True]


def test_verify_batch_matches_verify():
  cases = CASES[::6] + ADVERSARIAL[:3]
  responses = [c[-3] for c in cases]
  references = [c[-2] for c in cases]
  expected = np.array([c[-1] for c in cases])
  got = verifier.verify_batch(responses, references, timeout_s=5.0, workers=2)
  assert got.dtype == bool
  np.testing.assert_array_equal(got, expected)


def test_verify_batch_counts_worker_guard_trips_and_parse_failures():
  verifier.reset_counters()
  got = verifier.verify_batch(
    [b('9^{9^{9^{9}}}'), b('@#!% 7'), b('3'), 'no box'], ['1', '7', '3', '3'], workers=2
  )
  assert got.tolist() == [False, False, True, False]
  counts = verifier.counters()
  assert counts['calls'] == 4
  assert counts['guard_trips'] == 1
  assert counts['parse_failures'] == 1


def test_verify_batch_kills_overrunning_workers():
  responses = [b('\\frac{x^2-1}{x-1}')] * 4
  references = ['x+1'] * 4
  verifier.reset_counters()
  got = verifier.verify_batch(responses, references, timeout_s=1e-4, workers=2)
  assert not got.any()
  assert verifier.counters()['timeouts'] == 4
  # The replaced workers serve the next batch normally, also off the main thread.
  out = []
  thread = threading.Thread(
    target=lambda: out.append(
      verifier.verify_batch(responses, references, timeout_s=5.0, workers=2)
    )
  )
  thread.start()
  thread.join(timeout=60)
  assert len(out) == 1 and out[0].all()


def test_verify_batch_replaces_dead_workers():
  from ada_jax.verifier import pool

  assert verifier.verify_batch([b('1')], ['1'], workers=2).all()
  for worker in pool._POOL.workers:  # simulate crashed workers (OOM kill)
    worker.proc.kill()
    worker.proc.join()
  got = verifier.verify_batch([b('1'), b('2')] * 4, ['1', '2'] * 4, workers=2)
  assert got.all()


def test_verify_batch_rejects_length_mismatch():
  with pytest.raises(ValueError):
    verifier.verify_batch(['a'], ['a', 'b'])


def test_verify_batch_slow_worker_start_is_not_a_timeout():
  # A worker that takes longer to start than an item may take (a loaded
  # machine: forkserver respawn + imports) must not time items out.
  from ada_jax.verifier import pool

  pool = pool._Pool(2, start_delay_s=1.5)
  try:
    tasks = [(k, str(k), str(k)) for k in range(6)]
    got, stats = pool.run(tasks, 6, timeout_s=0.5)
    assert got == [True] * 6 and stats.get('timeouts', 0) == 0
    # A replaced worker (an overrun kills it) starts slowly too: the next
    # items still get their full time once it is up.
    got, stats = pool.run([(0, '\\frac{x^2-1}{x-1}', 'x+1')], 1, timeout_s=1e-4)
    assert got == [False] and stats['timeouts'] == 1
    got, stats = pool.run(tasks, 6, timeout_s=0.5)
    assert got == [True] * 6 and stats.get('timeouts', 0) == 0
  finally:
    pool.close()
