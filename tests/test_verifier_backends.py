"""The reference's graders behind `verify_batch(backend=...)`: Math-Verify, Qwen-style."""

import pathlib

import numpy as np
import pytest

from ada_jax import config_rules, from_config, select_prompts, verifier
from ada_jax.verifier import backends, qwen
from tests.verifier_cases import b

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_reference_last_box_is_the_reference_extraction():
  assert backends.reference_last_box('a \\boxed{1} b \\boxed{ \\frac{1}{2} } c') == (
    '\\frac{1}{2}'
  )
  # The reference reads only '\boxed{' (no \fbox, no joined boxes, no space).
  assert backends.reference_last_box('\\boxed{-1}, \\boxed{4}') == '4'
  assert backends.reference_last_box('\\fbox{7}') is None
  assert backends.reference_last_box('\\boxed {7}') is None
  assert backends.reference_last_box('\\boxed{7') is None
  assert backends.reference_last_box('\\boxed{ }') is None


def test_math_verify_backend_in_the_pool():
  responses = [b('\\frac12'), b('3'), b('x = 2'), 'no box: 0.5', b('0.5')]
  references = ['0.5', '2', '2', '0.5', '\\frac{1}{2}']
  got = verifier.verify_batch(
    responses, references, timeout_s=20.0, workers=1, backend='math_verify'
  )
  assert got.tolist() == [True, False, True, False, True]
  # The same calls in this process agree with the pool.
  pairs = zip(responses, references, strict=True)
  assert [backends.verify(r, f, 'math_verify') for r, f in pairs] == got.tolist()
  # Our hard deadline holds (Math-Verify's own SIGALRM timeout is off).
  verifier.reset_counters()
  late = verifier.verify_batch(
    responses[:2], references[:2], timeout_s=1e-4, workers=1, backend='math_verify'
  )
  assert not late.any() and verifier.counters()['timeouts'] == 2


def test_missing_extra_is_one_clear_error(monkeypatch):
  def missing():
    raise ImportError("No module named 'math_verify'")

  monkeypatch.setattr(backends, '_math_verify', missing)
  with pytest.raises(ImportError, match=r"pip install -e '\.\[math_verify\]'"):
    verifier.verify_batch([b('1')], ['1'], backend='math_verify')
  with pytest.raises(ValueError, match='unknown verifier backend'):
    verifier.verify_batch([b('1')], ['1'], backend='sympy')


def test_config_key_binds_the_backend_into_the_scorer():
  c = from_config.load(
    str(ROOT / 'configs' / 'tiny_arith.py'), ['--config.verifier.backend=math_verify']
  )
  config_rules.check_keys(c)
  seen = []

  def fake(responses, references, **kw):
    seen.append(kw)
    return np.ones(len(responses), bool)

  scorer = from_config.scorer(c, tok=None, verify_fn=fake)
  assert scorer.verify(['a'], ['1']).all()
  assert seen[0]['backend'] == 'math_verify'
  assert scorer.backend == 'math_verify'  # What summary.json and samples record.
  c.verifier.backend = 'ada'
  seen.clear()
  from_config.scorer(c, tok=None, verify_fn=fake).verify(['a'], ['1'])
  assert 'backend' not in seen[0]
  c.verifier.backend = 'sympy'
  with pytest.raises(config_rules.ConfigError, match=r'verifier\.backend'):
    config_rules.check_keys(c)


def test_select_prompts_filters_with_the_chosen_backend():
  refs = ['2', '(((', '\\frac{1}{2}', '']
  # Math-Verify reads '(((' (as a string); ours does not.
  assert select_prompts.prefilter([1, 2, 3, 4], refs, 'math_verify') == (
    [0, 1, 2],
    0,
    1,
  )
  assert select_prompts.prefilter([1, 2, 3, 4], refs) == ([0, 2], 0, 2)


@pytest.mark.parametrize(
  ('response', 'reference', 'expected'),
  [
    # Minerva's format first, then the last box, "answer is", the last number.
    ('The final answer is $4.2\\times10^{3}$. I hope it is correct.', '4200', True),
    ('... so \\boxed{6.02 \\times 10^{23}}', '6.0201\\times10^{23}', True),
    ('The answer is 1.00009e3.\nDone.', '1000', True),
    ('The answer is 1.0002e3.\nDone.', '1000', False),
    ('we get 3 and then 17', '17', True),
    ('we get 17 and then 3', '17', False),
    ('in all 1,250 apples', '1250', True),
    ('\\boxed{25}', '0.25', True),  # Qwen's percentage rule (r * 100)
    ('\\boxed{x^2+1}', '1+x^2', True),  # symbolic: our policy
    ('\\boxed{x^2+1.0001}', 'x^2+1', False),  # no tolerance for expressions
    ("\\boxed{__import__('os')}", '0', False),
    ('nothing here', '1', False),
  ],
)
def test_qwen_style_grader(response, reference, expected):
  assert qwen.verify(response, reference) is expected


@pytest.mark.parametrize(
  'response, box',
  [
    ('so \\boxed{\\frac{1}{2}} done', '\\frac{1}{2}'),
    ('first \\boxed{1} then \\boxed{\\boxed{3}}', '\\boxed{3}'),  # Last to close.
    ('x \\boxed{2} }', ''),  # An unmatched brace empties it, as the reference.
    ('the \\boxed 7 end', '7'),
    ('\\boxed{4', ''),
    ('no box: 3', ''),
  ],
)
def test_reference_eval_box(response, box):
  assert backends.reference_eval_box(response) == box


def test_eval_grader_reads_the_last_box_not_the_whole_response():
  # The reference's final eval/compute_score.py: last box, re-boxed.
  assert backends.verify('so \\boxed{\\frac12}', '0.5', 'math_verify_eval')
  assert not backends.verify('the answer is 3', '3', 'math_verify_eval')
  assert not backends.verify('\\boxed{3} }', '3', 'math_verify_eval')
