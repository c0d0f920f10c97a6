"""The verifier on the answer forms of issue 38 (tests/verifier_form_cases.py)."""

import collections
import time

import pytest

from ada_jax import verifier
from ada_jax.verifier import warmup
from tests.verifier_form_cases import FORM_CASES

FORMS = (
  'undefined',
  'time',
  'boxes_reference',
  'expression_label',
  'assignments',
  'glued_units',
  'latex_shorthand',
  'set_ops',
  'interval_inequality',
  'commuted_products',
)


@pytest.fixture(scope='module', autouse=True)
def _warm_sympy():
  # As the pool's forkserver does for its workers (verifier.warmup).
  warmup.run()


@pytest.mark.parametrize(('form', 'response', 'reference', 'expected'), FORM_CASES)
def test_form_cases(form, response, reference, expected):
  start = time.monotonic()
  got = verifier.verify(response, reference)
  assert got is expected, (form, response, reference)
  assert time.monotonic() - start < 2.0


def test_every_form_has_positives_and_negatives():
  counts = collections.Counter((c[0], c[3]) for c in FORM_CASES)
  for form in FORMS:
    assert counts[form, True] >= 3 and counts[form, False] >= 3, (form, counts)
  assert {c[0] for c in FORM_CASES} == set(FORMS)


def test_the_issue_false_positives_score_zero():
  # Each scored 1 before the fix: two undefined values compared equal.
  for answer, reference in [
    ('3:00', '10:00'),
    ('1/0', '2/0'),
    ('\\frac{5}{0}', '\\frac{2}{0}'),
    ('\\tan(\\pi/2)', '\\tan(3\\pi/2)'),
    ('\\log(0)', '\\log(0)+1'),
  ]:
    assert verifier.verify(f'\\boxed{{{answer}}}', reference) is False, answer
