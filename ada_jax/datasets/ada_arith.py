r"""`ada_arith`: deterministic synthetic arithmetic with a difficulty ladder.

The tiny task of ada_jax. A ~1M-parameter transformer trained for minutes
should get the first levels almost always right (one-digit sums), the middle
ones sometimes (two-digit sums and differences, small products) and the last
ones rarely or never (multi-digit products, chained operations): exactly the
spread of pass rates that adaptive sampling feeds on.

Problems are short expressions (`37-85`, `(12+7)*3`) and references are plain
integers (`-48`, `57`), the form the verifier reads from `\boxed{...}`.
Train and test never share a problem text; both are a pure function of
(num_train, num_test, seed).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import math
from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from ada_jax.datasets import schema


@dataclasses.dataclass(frozen=True)
class Level:
  """One rung of the ladder: operands with `digits` digits put into `form`."""

  name: str
  form: str
  digits: tuple[int, ...]

  @property
  def pool_size(self) -> int:
    """Number of distinct problems of this level."""
    return math.prod(10 if d == 1 else 9 * 10 ** (d - 1) for d in self.digits)


# Ordered from easy to hard for a tiny model trained briefly. The level index
# is the `level` feature.
LEVELS: tuple[Level, ...] = (
  Level('1d+1d', '{}+{}', (1, 1)),
  Level('2d+1d', '{}+{}', (2, 1)),
  Level('2d+2d', '{}+{}', (2, 2)),
  Level('2d-2d', '{}-{}', (2, 2)),
  Level('1d*1d', '{}*{}', (1, 1)),
  Level('2d*1d', '{}*{}', (2, 1)),
  Level('1d+1d*1d', '{}+{}*{}', (1, 1, 1)),
  Level('(2d+1d)*1d', '({}+{})*{}', (2, 1, 1)),
  Level('2d*2d', '{}*{}', (2, 2)),
  Level('3d*2d', '{}*{}', (3, 2)),
  Level('(2d-2d)*2d', '({}-{})*{}', (2, 2, 2)),
)

# Small pools give at most this fraction of their problems to the test split,
# so that training still sees most one-digit problems.
_MAX_TEST_FRACTION = 0.2
# Pools up to this size are enumerated and permuted; larger ones are sampled
# with rejection of duplicates.
_ENUMERATE_LIMIT = 20_000


def evaluate(expression: str) -> int:
  """Integer value of an expression of integers, + - * and parentheses."""

  def value(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
      return node.value
    if isinstance(node, ast.BinOp):
      left, right = value(node.left), value(node.right)
      if isinstance(node.op, ast.Add):
        return left + right
      if isinstance(node.op, ast.Sub):
        return left - right
      if isinstance(node.op, ast.Mult):
        return left * right
    raise ValueError(f'Unsupported arithmetic expression: {expression!r}')

  return value(ast.parse(expression, mode='eval').body)


def _operand_range(digits: int) -> range:
  return range(10) if digits == 1 else range(10 ** (digits - 1), 10**digits)


def _unique_operands(
  level: Level, count: int, rng: np.random.Generator
) -> list[tuple[int, ...]]:
  """`count` distinct operand tuples of `level` in a seed-determined order."""
  count = min(count, level.pool_size)
  ranges = [_operand_range(d) for d in level.digits]
  if level.pool_size <= _ENUMERATE_LIMIT:
    pool = list(itertools.product(*ranges))
    return [pool[i] for i in rng.permutation(len(pool))[:count]]
  seen: dict[tuple[int, ...], None] = {}
  while len(seen) < count:
    draw = tuple(int(rng.integers(r.start, r.stop)) for r in ranges)
    seen.setdefault(draw, None)
  return list(seen)


def generate(
  num_train: int, num_test: int, seed: int
) -> dict[str, list[dict[str, object]]]:
  """The train and test rows of the task (pure function of its arguments).

  Each level gets an equal share of `num_train` and `num_test`, capped by the
  number of distinct problems the level has; the test problems of a level are
  drawn first and the train problems from the rest, so splits are disjoint.

  Args:
    num_train: target number of train problems over all levels.
    num_test: target number of test problems over all levels.
    seed: generator seed.

  Returns:
    {'train': rows, 'test': rows}, rows being dicts with the builder's
    features (problem, reference, prompt_key, level).
  """
  splits: dict[str, list[dict[str, object]]] = {'train': [], 'test': []}
  per_train = num_train // len(LEVELS)
  per_test = num_test // len(LEVELS)
  for index, level in enumerate(LEVELS):
    rng = np.random.default_rng([seed, index])
    n_test = min(per_test, int(level.pool_size * _MAX_TEST_FRACTION))
    n_train = min(per_train, level.pool_size - n_test)
    operands = _unique_operands(level, n_test + n_train, rng)
    for split, chunk in (('test', operands[:n_test]), ('train', operands[n_test:])):
      for ops in chunk:
        problem = level.form.format(*ops)
        splits[split].append(
          {
            'problem': problem,
            'reference': str(evaluate(problem)),
            'prompt_key': schema.prompt_key(problem),
            'level': index,
          }
        )
  return splits


class AdaArith(schema.SyntheticBuilder):
  """Synthetic arithmetic prompts with a difficulty ladder."""

  VERSION = tfds.core.Version('1.0.0')
  # TFDS derives this from the package's resources, which for an editable
  # install needs the `importlib_resources` backport; the file is enough.
  code_path = epath.Path(__file__)
  RELEASE_NOTES: ClassVar[dict[str, str]] = {
    '1.0.0': 'Eleven levels from 1d+1d to (2d-2d)*2d.'
  }
  BUILDER_CONFIGS: ClassVar[list[tfds.core.BuilderConfig]] = [
    schema.SyntheticConfig(name='default', num_train=8000, num_test=550)
  ]
  generate = staticmethod(generate)
