"""Tests for the ada_columns task: the column method, its teacher, its rows."""

import collections

import numpy as np
import pytest

from ada_jax import data, verifier
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.datasets import ada_columns
from ada_jax.rl import sft_rows as sft_lib


@pytest.fixture(scope='module')
def tok(tmp_path_factory):
  return tokenizer_lib.build_tiny_tokenizer(tmp_path_factory.mktemp('tok'))


def test_worked_solution_writes_carries_then_the_boxed_result():
  # 1+2 no carry, 7+5 carries into the tens, 4+8+1 into the hundreds (the
  # carries row is least significant first: tens, hundreds, thousands).
  assert ada_columns.solve('3471+2852').text == '011\\boxed{6323}'
  assert ada_columns.solve('1236+1045').text == '100\\boxed{2281}'
  assert ada_columns.solve('8023-4657').text == '111\\boxed{3366}'
  assert ada_columns.solve('1234+4321').text == '000\\boxed{5555}'
  assert ada_columns.carries('8023-4657') == 3
  with pytest.raises(ValueError, match='Not an ada_columns problem'):
    ada_columns.parse('12*3')


def test_solution_and_carries_agree_with_arithmetic_on_random_problems():
  rng = np.random.default_rng(0)
  for op in ada_columns.OPS:
    for _ in range(300):
      a, b = ada_columns._draw_operands(op, rng)
      problem = f'{a}{op}{b}'
      sol = ada_columns.solve(problem)
      assert sol.result == (a + b if op == '+' else a - b)
      assert 1000 <= sol.result <= 9999
      # A carry goes into column i+1 exactly when the lower i+1 columns
      # overflow (or, subtracting, go below zero).
      for i in range(1, 4):
        low = a % 10**i + b % 10**i if op == '+' else a % 10**i - b % 10**i
        want = int(low >= 10**i) if op == '+' else int(low < 0)
        assert sol.carries[i - 1] == want, (problem, sol)


def test_teacher_forgets_each_carry_with_its_probability():
  demos = dict(ada_columns.demonstrations('8023-4657', 0.6))
  assert sum(demos.values()) == pytest.approx(1.0)
  right = ada_columns.solve('8023-4657')
  assert demos[right] == pytest.approx(0.4**3)
  assert len(demos) == 8
  # The carries row stays right; a forgotten carry changes only its digit,
  # even where the column sum is 9 and the carry goes on (1999+1001).
  chain = dict(ada_columns.demonstrations('1999+1001', 0.6))
  assert chain[ada_columns.Solution((1, 1, 1), 2990)] == pytest.approx(0.6**3)
  assert chain[ada_columns.Solution((1, 1, 1), 3090)] == pytest.approx(0.6 * 0.4**2)
  assert sum(chain.values()) == pytest.approx(1.0)
  assert {s.carries for s in [*demos, *chain]} == {(1, 1, 1)}
  # Every slip still reads as a four-digit answer, just a wrong one.
  for sol in [*demos, *chain]:
    assert 1000 <= sol.result <= 9999
  assert ada_columns.demonstrations('3471+2852', 0.0) == [
    (ada_columns.solve('3471+2852'), 1.0)
  ]


def test_generator_is_balanced_disjoint_and_deterministic():
  rows = ada_columns.generate(160, 40, 3)
  assert rows == ada_columns.generate(160, 40, 3)
  train = {r['problem'] for r in rows['train']}
  test = {r['problem'] for r in rows['test']}
  assert len(train) == 160 and len(test) == 40 and not train & test
  cells = collections.Counter(
    ('+' if '+' in r['problem'] else '-', r['level']) for r in rows['train']
  )
  assert set(cells.values()) == {20} and len(cells) == 8
  for r in rows['train'] + rows['test']:
    assert r['level'] == ada_columns.carries(r['problem'])
    assert r['reference'] == str(ada_columns.solve(r['problem']).result)


def test_builder_reads_back_levels_by_carries(tmp_path, tok):
  kw = {'data_dir': tmp_path, 'num_train': 80, 'num_test': 16, 'seed': 1}
  test = data.load_examples('ada_columns', 'test', tokenizer=tok, **kw)
  assert sorted(e.problem for e in test) == sorted(
    r['problem'] for r in ada_columns.generate(80, 16, 1)['test']
  )
  assert data.level_histogram(test) == {0: 4, 1: 4, 2: 4, 3: 4}
  assert all(e.prompt == f'Q:{e.problem}=' for e in test)


def _example(problem):
  return data.Example(
    problem=problem,
    prompt=f'Q:{problem}=',
    reference=str(ada_columns.solve(problem).result),
    prompt_key=hash(problem),
    level=ada_columns.carries(problem),
    source='test',
  )


def test_demonstration_rows_are_drawn_as_often_as_the_teacher_writes_them(tok):
  ex = [_example('3471+2852'), _example('1234+4321')]
  demos = sft_lib.demonstration_rows(
    tok, ex, drop=0.6, prompt_len=16, max_new_tokens=10
  )
  assert demos.rows[0].shape == (5, 26) and demos.examples == 2
  seqs, _, targets = sft_lib.draw_demonstrations(np.random.RandomState(0), demos, 4000)
  texts = collections.Counter(
    tok.decode([int(t) for t in s[m == 1]]) for s, m in zip(seqs, targets, strict=True)
  )
  assert texts['000\\boxed{5555}'] == pytest.approx(2000, abs=120)
  assert texts['011\\boxed{6323}'] == pytest.approx(2000 * 0.16, abs=60)
  assert texts['011\\boxed{5223}'] == pytest.approx(2000 * 0.36, abs=80)
  # The verifier reads the last box: right only for the right solution.
  for text in texts:
    want = text.endswith('{6323}') or text.endswith('{5555}')
    ref = '6323' if '5555' not in text else '5555'
    assert bool(verifier.verify(text, ref)) == want, text
