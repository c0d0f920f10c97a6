"""The verifier on the answer kinds of issue 19 (tests/verifier_kind_cases.py)."""

import collections
import time

import pytest

from ada_jax import verifier
from ada_jax.verifier import warmup
from tests.verifier_kind_cases import KIND_CASES

KINDS = (
  'multi_box',
  'double_backslash',
  'labelled',
  'relation',
  'approx',
  'percent_word',
  'thousands_spacing',
  'matrix_arith',
  'set_duplicate',
  'sum',
)


@pytest.fixture(scope='module', autouse=True)
def _warm_sympy():
  # As the pool's forkserver does for its workers (verifier.warmup).
  warmup.run()


@pytest.mark.parametrize(('kind', 'response', 'reference', 'expected'), KIND_CASES)
def test_kind_cases(kind, response, reference, expected):
  start = time.monotonic()
  got = verifier.verify(response, reference)
  assert got is expected, (kind, response, reference)
  assert time.monotonic() - start < 2.0


def test_every_kind_has_positives_and_negatives():
  counts = collections.Counter((c[0], c[3]) for c in KIND_CASES)
  for kind in KINDS:
    assert counts[kind, True] >= 3 and counts[kind, False] >= 3, (kind, counts)
  assert {c[0] for c in KIND_CASES} == set(KINDS)


def test_hostile_sums_and_matrix_powers_score_false_quickly():
  # The new grammar (\sum, matrix powers, linear inequalities) stays guarded.
  hostile = [
    '\\sum_{k=1}^{\\infty} k^k',
    '\\sum_{k=1}^{10^{7}} 1',
    '\\sum_{k=1}^{200} \\frac{1}{k^{50}}',
    '\\sum_{k=1}^{n} k^{1000}',
    '\\sum_{k=1}^{n} \\frac{k^{20}}{k^3+k+1}',
    '\\sum_{k=1}^{\\infty} \\frac{k^{10}}{3^k}',
    '\\sum_{i=1}^{9}\\sum_{j=1}^{9} ij',
    '\\sum_{k=1}^{n} \\frac{1}{(4k+9)(4k-9)}',
    '\\sum_{k=1}^{\\infty} \\frac{1}{k(k+1)(k+2)}',
    '\\begin{pmatrix}x&1\\\\1&x\\end{pmatrix}^{20}',
    '\\begin{pmatrix}1&1\\\\1&0\\end{pmatrix}^{1000}',
    '(x+1)^{1000} < 5',
  ]
  for answer in hostile:
    start = time.monotonic()
    assert verifier.verify(f'\\boxed{{{answer}}}', '1') is False, answer
    assert time.monotonic() - start < 1.0, answer
