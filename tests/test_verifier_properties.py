"""Property-based false-positive search over generated answers of every kind.

The pairs come from tests/verifier_property_cases.py: a reference, and a
response that either rewrites the same value (spacing, fraction commands,
doubled backslashes, thousands separators, commuted terms and factors,
reordered sets) or mutates it. Whether the two differ comes from the
generator's own values, never from the verifier. Deterministic
(``derandomize=True``) and without hypothesis deadlines; the number of
draws per kind and property is ``VERIFIER_PROPERTY_EXAMPLES`` (default 300,
which keeps the whole file near a minute on two cores). Every
counterexample a search found is a fixed case in ``FOUND``.
"""

import os
import time

import pytest
from hypothesis import HealthCheck, given, settings

from ada_jax import verifier
from ada_jax.verifier import grade, warmup
from tests import verifier_property_cases as vp

EXAMPLES = int(os.environ.get('VERIFIER_PROPERTY_EXAMPLES', '300'))
SETTINGS = settings(
  max_examples=EXAMPLES,
  derandomize=True,
  deadline=None,
  database=None,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

# Counterexamples the searches found (kind, response, reference, expected),
# one per kind, outcome and mutation, fixed here for good; FP: a mutant
# accepted, FN: a value-keeping rewrite rejected.
FOUND: list[tuple[str, str, str, bool]] = [
  # The search on the tree before issue 38's fixes (3,000 draws per kind).
  (
    'decimal',
    'So the final answer is $\\boxed{1\\\\,944.10}$.',
    '1944.1',
    True,
  ),  # FN rewrite
  (
    'expression',
    'So the final answer is $\\boxed{2\\\\,+\\\\,6t}$.',
    '2+6t',
    True,
  ),  # FN rewrite
  (
    'integer',
    'So the final answer is $\\boxed{-12\\\\,074}$.',
    '-12074',
    True,
  ),  # FN rewrite
  (
    'interval',
    'So the final answer is $\\boxed{x\\\\,>\\\\,-8}$.',
    '(-8,\\infty)',
    True,
  ),  # FN rewrite
  (
    'multi_box',
    'The solutions are $\\\\boxed{-5}, \\\\boxed{-8}, \\\\boxed{-12}$.',
    '-12, -8, -5',
    True,
  ),  # FN rewrite
  (
    'multi_box',
    'The solutions are $\\\\boxed{-12}, \\\\boxed{3}, \\\\boxed{14}$.',
    '\\boxed{-12}\\boxed{14}',
    False,
  ),  # FP add
  (
    'multi_box',
    'The solutions are $\\\\boxed{3}, \\\\boxed{16}$.',
    '\\boxed{3}\\boxed{4}\\boxed{16}',
    False,
  ),  # FP drop
  (
    'multi_box',
    'The solutions are $\\\\boxed{10}$, $\\\\boxed{20}$.',
    '\\boxed{9}\\boxed{20}',
    False,
  ),  # FP element
  (
    'multi_box',
    'The solutions are $\\\\boxed{-12}, \\\\boxed{13}$.',
    '\\boxed{12}\\boxed{13}',
    False,
  ),  # FP sign
  (
    'percent',
    'So the final answer is $\\boxed{13\\\\,\\\\%}$.',
    '13\\%',
    True,
  ),  # FN rewrite
  (
    'percent',
    'So the final answer is $\\boxed{0.44\\\\%}$.',
    '44\\%',
    False,
  ),  # FP scale
  (
    'ratio',
    'So the final answer is $\\boxed{21\\\\,:\\\\,2}$.',
    '21:2',
    True,
  ),  # FN rewrite
  (
    'relation',
    'So the final answer is $\\boxed{y\\\\,=\\\\,-6\\\\,+\\\\,8x}$.',
    'y=8x-6',
    True,
  ),  # FN rewrite
  (
    'time',
    'So the final answer is $\\boxed{12:27\\\\text{ pm}}$.',
    '12:27 pm',
    True,
  ),  # FN rewrite
  (
    'time',
    'So the final answer is $\\boxed{6:49\\\\text{ a.m.}}$.',
    '6:49',
    False,
  ),  # FP half
  (
    'time',
    'So the final answer is $\\boxed{06:00\\text{ a.m.}}$.',
    '1:00 am',
    False,
  ),  # FP hour
  (
    'tuple',
    'So the final answer is $\\boxed{(-2,\\\\,-15)}$.',
    '(-2,-15)',
    True,
  ),  # FN rewrite
  (
    'unit',
    'So the final answer is $\\boxed{693.50\\,\\mathrm{kg}}$.',
    '693.5\\text{ g}',
    False,
  ),  # FP unit_scale
]


@pytest.fixture(scope='module', autouse=True)
def _warm_sympy():
  warmup.run()


def _check(p: vp.Pair) -> None:
  # A verdict the verifier's own deadline cut short (a loaded machine: the
  # suite runs beside other work) says nothing about the value; it is
  # retried, up to twice, and must then be right.
  for _ in range(3):
    before = grade.counters()['timeouts']
    start = time.monotonic()
    got = verifier.verify(p.response, p.reference)
    if grade.counters()['timeouts'] == before:
      break
  assert time.monotonic() - start < 2.0, p
  if p.equal:
    assert got, p
  else:
    assert not got, p


@pytest.mark.parametrize('kind', vp.KINDS)
def test_mutants_that_differ_in_value_are_rejected(kind):
  @SETTINGS
  @given(vp.pair(kind, mutant=True))
  def check(p):
    if not p.equal:  # a mutant that keeps the value is filtered by the oracle
      _check(p)

  check()


@pytest.mark.parametrize('kind', vp.KINDS)
def test_rewrites_that_keep_the_value_are_accepted(kind):
  @SETTINGS
  @given(vp.pair(kind, mutant=False))
  def check(p):
    _check(p)

  check()


@pytest.mark.parametrize(('kind', 'response', 'reference', 'expected'), FOUND)
def test_found_counterexamples(kind, response, reference, expected):
  assert verifier.verify(response, reference) is expected, (kind, response)


def test_the_generators_cover_every_kind_and_both_outcomes():
  pairs = vp.draws(12)
  assert {p.kind for p in pairs} == set(vp.KINDS)
  assert any(p.equal and p.op == 'rewrite' for p in pairs)
  assert any(not p.equal for p in pairs)
