r"""`ada_columns`: four-digit column addition and subtraction, by carries.

The tiny task on which RL can improve the answers themselves. Every problem
(`3471+2852`, `8023-4657`) is solved by the same procedure: the schoolbook
column method, one column at a time, each column's digit a function of its
two operand digits and the carry (or borrow) coming in from the column to its
right. A worked solution writes the carries first, then the result:

  3471+2852  ->  011\boxed{6323}

`011` are the carries into the tens, hundreds and thousands columns, in the
order the column method finds them (least significant first): each carry is
a function of its column's two operand digits and the carry just written
before it, so no token of the solution has to chain more than one column's
work. Each result digit then reads its operand digits and its carry. (The
first version wrote the carries most significant first, the order of the
result: its first token needed all three lower columns at once, and a
2-layer policy's SFT reached it late and unreliably: 2000 steps left
held-out accuracy anywhere from 0.02 to 0.26 by seed and machine.)
Operands and result have exactly
four digits (sums below 10000, differences of at least 1000), so every
problem has the same layout.

The difficulty of a problem (the `level` feature) is its number of carries
(borrows for subtraction), 0 to 3: an imperfect teacher that notes every
carry but forgets to add each one with some probability (`demonstrations`)
is right on a problem with c carries with probability (1 - drop)^c, a
built-in difficulty ladder. Its slips change only the result digits, so
what the warm start must learn from it stays a function of the prompt (a
teacher whose forgotten carry also vanished from the carries row made the
digits depend on the policy's own noisy carries, which a 2-layer policy did
not learn in 2000 SFT steps). Train and test are drawn with equal counts
per (operation, carries) cell, never share a problem, and are a pure
function of (num_train, num_test, seed).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from ada_jax.datasets import schema

DIGITS = 4
OPS = ('+', '-')
MAX_CARRIES = DIGITS - 1  # The top column never carries out (4-digit results).


@dataclasses.dataclass(frozen=True)
class Solution:
  """One worked solution: right, or with carries forgotten in the result.

  Attributes:
    carries: the carries (borrows) noted into the tens, hundreds and
      thousands columns, in that order (always the right ones).
    result: the result written, each forgotten carry left out of its digit.
  """

  carries: tuple[int, ...]
  result: int

  @property
  def text(self) -> str:
    r"""The worked solution: carries, then `\boxed{result}`."""
    return ''.join(map(str, self.carries)) + '\\boxed{' + str(self.result) + '}'


def parse(problem: str) -> tuple[int, str, int]:
  """(a, op, b) of `a+b` or `a-b`.

  Raises:
    ValueError: not a problem of this task.
  """
  for op in OPS:
    left, sep, right = problem.partition(op)
    if sep and left.isdigit() and right.isdigit():
      return int(left), op, int(right)
  raise ValueError(f'Not an ada_columns problem: {problem!r}')


def _digits(n: int) -> list[int]:
  """Least significant first, DIGITS of them."""
  return [(n // 10**i) % 10 for i in range(DIGITS)]


def _column(a: int, b: int, op: str, carry: int) -> tuple[int, int]:
  """(digit, carry out) of one column: a + b + carry, or a - b - borrow."""
  if op == '+':
    v = a + b + carry
    return v % 10, int(v >= 10)
  v = a - b - carry
  return v % 10, int(v < 0)


def _paths(problem: str, drop: float) -> list[tuple[Solution, float]]:
  """Every (solution, probability) of a teacher forgetting carries w.p. `drop`.

  Right to left. The carries row is always right; each carry that comes
  into a column is added to the column's digit with 1 - drop and forgotten
  with `drop` (the slip of a pupil who writes the carry above the column
  and then does not add it). A forgotten carry changes only its column's
  digit: the next carry follows from the true column sum, as noted above it.
  """
  a, op, b = parse(problem)
  da, db = _digits(a), _digits(b)
  out: list[tuple[Solution, float]] = []

  def walk(col: int, carry: int, used: tuple[int, ...], digits: tuple[int, ...], p):
    if p == 0:
      return
    if col == DIGITS:
      result = sum(d * 10**i for i, d in enumerate(digits))
      out.append((Solution(tuple(used), result), p))
      return
    _, nxt = _column(da[col], db[col], op, carry)
    options = [(carry, 1.0)]
    if carry:  # A carry comes in: the teacher may forget to add it.
      options = [(1, 1.0 - drop), (0, drop)]
    for c, q in options:
      digit, _ = _column(da[col], db[col], op, c)
      walk(col + 1, nxt, (*used, carry) if col else used, (*digits, digit), p * q)

  walk(0, 0, (), (), 1.0)
  return out


def solve(problem: str) -> Solution:
  """The right worked solution of `problem` (`a+b` or `a-b`)."""
  return _paths(problem, 0.0)[0][0]


def carries(problem: str) -> int:
  """The difficulty: carries (borrows) of the right solution, 0 to 3."""
  return sum(solve(problem).carries)


def demonstrations(problem: str, drop: float) -> list[tuple[Solution, float]]:
  """The worked solutions a teacher forgetting each carry with `drop` writes.

  (solution, probability) pairs with distinct solutions, probabilities
  summing to 1: 2^c of them for c carries, all with the right carries row.
  The right one has probability (1 - drop)^c; `drop` 0 gives only it.
  """
  merged: dict[Solution, float] = {}
  for sol, p in _paths(problem, drop):
    merged[sol] = merged.get(sol, 0.0) + p
  return list(merged.items())


def _draw_operands(op: str, rng: np.random.Generator) -> tuple[int, int]:
  lo, hi = 10 ** (DIGITS - 1), 10**DIGITS
  if op == '+':
    a = int(rng.integers(lo, hi - lo))
    return a, int(rng.integers(lo, hi - a))
  a = int(rng.integers(2 * lo, hi))
  return a, int(rng.integers(lo, a - lo + 1))


def generate(
  num_train: int, num_test: int, seed: int
) -> dict[str, list[dict[str, object]]]:
  """The train and test rows of the task (pure function of its arguments).

  Each (operation, carries) cell gets an equal share of `num_train` and
  `num_test`; test problems are drawn first, then train problems from the
  rest, so the splits are disjoint.

  Returns:
    {'train': rows, 'test': rows}, rows being dicts with the builder's
    features (problem, reference, prompt_key, level = carries).
  """
  cells = [(op, c) for op in OPS for c in range(MAX_CARRIES + 1)]
  splits: dict[str, list[dict[str, object]]] = {'train': [], 'test': []}
  for index, (op, level) in enumerate(cells):
    rng = np.random.default_rng([seed, index])
    want = {'test': num_test // len(cells), 'train': num_train // len(cells)}
    seen: set[str] = set()
    for split in ('test', 'train'):
      rows = []
      while len(rows) < want[split]:
        a, b = _draw_operands(op, rng)
        problem = f'{a}{op}{b}'
        if problem in seen or carries(problem) != level:
          continue
        seen.add(problem)
        rows.append(
          {
            'problem': problem,
            'reference': str(solve(problem).result),
            'prompt_key': schema.prompt_key(problem),
            'level': level,
          }
        )
      splits[split].extend(rows)
  return splits


class AdaColumns(schema.SyntheticBuilder):
  """Four-digit column addition and subtraction, levels by carries."""

  VERSION = tfds.core.Version('1.0.0')
  code_path = epath.Path(__file__)  # See ada_arith.AdaArith.code_path.
  RELEASE_NOTES: ClassVar[dict[str, str]] = {
    '1.0.0': '4d+4d and 4d-4d with 4-digit results, levels 0-3 by carries.'
  }
  BUILDER_CONFIGS: ClassVar[list[tfds.core.BuilderConfig]] = [
    schema.SyntheticConfig(name='default', num_train=4000, num_test=240)
  ]
  generate = staticmethod(generate)
