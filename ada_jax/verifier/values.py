"""Comparable values of a parsed answer: scalars, sequences, intervals, relations.

The verifier interprets the guarded tuple AST of ``parser`` as one of a
few value classes before comparing: ``Scalar`` (an evaluated sympy number or
expression, with its decimal precision when written as a decimal), ``Seq``
(list, set, tuple, ``(a, b)`` pair, ``a : b`` ratio, or the two branches of a
``\\pm``), ``Intervals`` (a union of intervals with closure), ``Rel`` (an
equation, inequality, ``\\approx`` or ``\\in`` chain) and ``Matrix`` (also the
result of matrix arithmetic). Also here: which relations are assignments
(``x = 5``, ``PQ = 3``) and which inequalities read as intervals.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any

import sympy

from ada_jax.verifier import build, nodes
from ada_jax.verifier import deadline as vd

MAX_ITEMS = 20  # guard: a set or list with more items trips GuardError


@dataclasses.dataclass
class Scalar:
  """A number or expression; ``decimal`` is set when it was written as one."""

  expr: sympy.Expr
  decimal: tuple[int, int] | None = None  # (decimal places, significant digits)


@dataclasses.dataclass
class Seq:
  """An ordered or unordered collection of values.

  ``kind`` is list (a bare comma list), labelled (a list of assignments to
  distinct names, ``a = 3, b = 1``: ordered; ``x_1, x_2`` are one name), set, tuple, pair (``(a, b)``, a
  tuple or an interval), ratio (``a : b``) or pm (the two branches of a
  ``\\pm``); ``brackets`` are the opening and closing brackets of a tuple or
  pair.
  """

  kind: str
  items: list[Any]
  brackets: str = '()'


@dataclasses.dataclass
class Intervals:
  """A union of intervals, each ``(lo, hi, lo_closed, hi_closed)``."""

  parts: list[tuple[Any, Any, bool, bool]]  # (lo, hi, lo_closed, hi_closed)


@dataclasses.dataclass
class Rel:
  """A chain ``parts[0] ops[0] parts[1] ...`` of =, <, <=, >, >=, !=, in, ~=."""

  parts: list[Any]
  ops: list[str]


@dataclasses.dataclass
class Matrix:
  """A rectangular matrix of values, row by row."""

  rows: list[list[Any]]


def _decimal_meta(node: nodes.Node) -> tuple[int, int] | None:
  """(decimal places, significant digits) of a decimal literal, else None."""
  if node[0] == 'add' and len(node[1]) == 1 and node[1][0][0] == '-':
    node = node[1][0][1]
  if node[0] != 'num' or '.' not in node[1]:
    return None
  places = len(node[1].split('.')[1])
  return places, max(len(node[1].replace('.', '').lstrip('0')), 1)


def to_value(node: nodes.Node) -> Any:
  """Interprets a guarded AST as a comparable value."""
  vd.check()
  kind = node[0]
  if kind in ('list', 'set'):
    items, labels = [], []
    for item in node[1]:
      value = to_value(item)
      if isinstance(value, Rel) and is_assignment(value):
        labels.append(str(_label_key(value.parts[0])))
        value = value.parts[1]
      items.extend(
        value.items if isinstance(value, Seq) and value.kind == 'pm' else [value]
      )
    if len(items) > MAX_ITEMS:
      raise nodes.GuardError('too many items')
    bases = {label.split('_')[0] for label in labels}
    if (
      kind == 'list'
      and len(labels) == len(node[1]) > 1 == max(Counter(labels).values())
      and len(bases) > 1
    ):
      # a = 3, b = 1: distinct names, so the order counts; x_1 = 2, x_2 = 3
      # (one name, numbered) lists roots, in any order.
      kind = 'labelled'
    return Seq(kind, items)
  if kind == 'tuple':
    return Seq('tuple', [to_value(i) for i in node[1]], node[2])
  if kind == 'pair':
    return Seq('pair', [to_value(node[1]), to_value(node[2])], node[3] + node[4])
  if kind == 'union':
    values = [to_value(part) for part in node[1]]
    if all(isinstance(v, Seq) and v.kind == 'set' for v in values):
      # \{2, 5\} \cup \{1, 7\} is the set \{1, 2, 5, 7\}.
      items = [i for v in values for i in v.items]
      if len(items) > MAX_ITEMS:
        raise nodes.GuardError('too many items')
      return Seq('set', items)
    parts = []
    for value in values:
      intervals = as_intervals(value)
      if intervals is None:
        raise nodes.ParseError('union of non-intervals')
      parts.extend(intervals.parts)
    return Intervals(parts)
  if kind == 'setminus':
    return _set_minus(to_value(node[1]), to_value(node[2]))
  if kind == 'rel':
    return Rel([to_value(p) for p in node[1]], node[2])
  if kind == 'ratio':
    items = [to_value(p) for p in node[1]]
    if not all(isinstance(i, Scalar) for i in items):
      raise nodes.ParseError('ratio of non-scalars')
    return Seq('ratio', items)
  if kind == 'matrix':
    return Matrix([[to_value(c) for c in row] for row in node[1]])
  if build.has_matrix(node):
    value = build.evaluate_matrix(node)
    if isinstance(value, sympy.MatrixBase):
      return Matrix(
        [[Scalar(value[r, c]) for c in range(value.cols)] for r in range(value.rows)]
      )
    return Scalar(value)
  if kind == 'const' and node[1] == 'reals':
    return Intervals([(-sympy.oo, sympy.oo, False, False)])
  if kind == 'const' and node[1] == 'empty':
    return Seq('set', [])
  if build.has_pm(node):
    return Seq(
      'pm',
      [Scalar(build.evaluate(node, 1)), Scalar(build.evaluate(node, -1))],
    )
  return Scalar(build.evaluate(node), _decimal_meta(node))


def _set_minus(left: Any, right: Any) -> Intervals:
  """``\\mathbb{R} \\setminus \\{2\\}``: intervals with finitely many points removed."""
  intervals = as_intervals(left)
  points = right.items if isinstance(right, Seq) and right.kind == 'set' else None
  if intervals is None or points is None:
    raise nodes.ParseError('\\setminus needs intervals minus a finite set')
  if not all(isinstance(p, Scalar) and p.expr.is_real for p in points):
    raise nodes.ParseError('\\setminus of a non-real point')
  parts = list(intervals.parts)
  for point in points:
    x = point.expr
    out = []
    for lo, hi, lo_c, hi_c in parts:
      vd.check()
      inside = (lo < x or (lo_c and lo == x)) and (x < hi or (hi_c and hi == x))
      if inside != sympy.true and inside is not True:
        out.append((lo, hi, lo_c, hi_c))
        continue
      if lo != x:
        out.append((lo, x, lo_c, False))
      if hi != x:
        out.append((x, hi, False, hi_c))
    parts = out
  return Intervals(parts)


def _label_key(value: Any) -> Any:
  if isinstance(value, Scalar):
    return value.expr
  return tuple(_label_key(i) for i in value.items)


_CAPITAL = re.compile(r'[A-Z](?:_\w+)?')


def _is_name(value: Any) -> bool:
  """A label: a product of capitals without a coefficient (``PQ``, ``A_1B``).

  Lowercase products (``xy``) are variables: ``xy = 6`` is an equation.
  """
  if not isinstance(value, Scalar):
    return False
  expr = value.expr
  return expr.is_Mul and all(
    isinstance(a, sympy.Symbol) and _CAPITAL.fullmatch(a.name) for a in expr.args
  )


def is_assignment(rel: Rel) -> bool:
  """``x = ...``, ``x_1 = ...`` or ``(x, y) = ...`` whose right side lacks x.

  Also a label: ``PQ = 3`` or ``A_1 : A_2 = 5 : 9`` (a product or ratio of
  symbols) with a symbol-free right side.
  """
  if rel.ops not in (['='], ['~=']):
    return False
  lhs, rhs = rel.parts
  if _is_name(lhs) or (
    isinstance(lhs, Seq)
    and lhs.kind == 'ratio'
    and all(_is_name(i) or isinstance(i.expr, sympy.Symbol) for i in lhs.items)
  ):
    return not symbols_of(rhs)
  if isinstance(lhs, Scalar) and isinstance(lhs.expr, sympy.Symbol):
    names = {lhs.expr}
  elif (
    isinstance(lhs, Seq)
    and lhs.kind in ('pair', 'tuple')
    and all(
      isinstance(i, Scalar) and isinstance(i.expr, sympy.Symbol) for i in lhs.items
    )
  ):
    names = {i.expr for i in lhs.items}
  else:
    return False
  return not (names & symbols_of(rhs))


def symbols_of(value: Any) -> set[sympy.Symbol]:
  """The free symbols anywhere in a value."""
  if isinstance(value, Scalar):
    return set(value.expr.free_symbols)
  if isinstance(value, (Seq, Rel)):
    items = value.items if isinstance(value, Seq) else value.parts
    return set().union(*[symbols_of(i) for i in items]) if items else set()
  if isinstance(value, Matrix):
    return set().union(*[symbols_of(c) for row in value.rows for c in row])
  if isinstance(value, Intervals):
    return set().union(*[symbols_of(Scalar(e)) for p in value.parts for e in p[:2]])
  return set()


def as_intervals(value: Any) -> Intervals | None:
  """A value as intervals: itself, or a pair read as an interval; else None."""
  if isinstance(value, Intervals):
    return value
  if isinstance(value, Seq) and value.kind == 'pair':
    lo, hi = value.items
    if isinstance(lo, Scalar) and isinstance(hi, Scalar):
      return Intervals(
        [(lo.expr, hi.expr, value.brackets[0] == '[', value.brackets[1] == ']')]
      )
  return None


_FLIP = {'<': '>', '<=': '>=', '>': '<', '>=': '<='}


def _linear(expr: sympy.Expr, sym: sympy.Symbol) -> tuple[Any, Any] | None:
  """``(a, c)`` with ``expr = a * sym + c``, a a nonzero real number; else None."""
  vd.check()
  a = sympy.diff(expr, sym)  # constant exactly when expr is linear (no expand)
  if a.free_symbols or not (a.is_real and a.is_nonzero):
    return None
  c = expr.subs(sym, 0)
  if c.free_symbols or not c.is_real:
    return None
  return a, c


def inequality_intervals(rel: Rel, *, solved: bool = False) -> Intervals | None:
  """An inequality chain (or ``x \\ne a``) in one symbol as intervals.

  ``a < x <= b``, ``x > a``, ``a \\ge x``; unless ``solved``, also linear
  forms ``-y < 2`` and ``1 < 2x + 1 < 5`` (the symbol only in the middle of a
  double inequality). ``solved`` demands the bare symbol.
  """
  ops = rel.ops
  if ops == ['!=']:
    return _not_equal(rel, solved)
  if not ops or any(op not in ('<', '<=', '>', '>=') for op in ops) or len(ops) > 2:
    return None
  if not all(isinstance(p, Scalar) for p in rel.parts):
    return None
  exprs = [p.expr for p in rel.parts]
  if ops[0] in ('>', '>='):  # flip to an ascending chain
    exprs, ops = exprs[::-1], [{'>': '<', '>=': '<='}[o] for o in ops[::-1]]
  if any(o in ('>', '>=') for o in ops):
    return None
  if len(exprs) == 2 and any(isinstance(e, sympy.Abs) for e in exprs):
    return _abs_intervals(exprs, ops[0], solved)
  syms = [i for i, e in enumerate(exprs) if isinstance(e, sympy.Symbol)]
  if len(syms) != 1 or any(e.free_symbols for i, e in enumerate(exprs) if i != syms[0]):
    return None if solved else _linear_intervals(exprs, ops)
  k = syms[0]
  lo, lo_closed = (exprs[k - 1], ops[k - 1] == '<=') if k > 0 else (-sympy.oo, False)
  hi, hi_closed = (
    (exprs[k + 1], ops[k] == '<=') if k + 1 < len(exprs) else (sympy.oo, False)
  )
  return Intervals([(lo, hi, lo_closed, hi_closed)])


def _abs_intervals(exprs: list[Any], op: str, solved: bool) -> Intervals | None:
  """``|u| < c`` or ``c < |u|`` (u linear in one symbol, c > 0) as intervals.

  ``solved`` demands ``u = \\pm x + b``: ``|x - 1| \\ge 2`` is an answer,
  ``|2x - 1| \\ge 3`` still a question.
  """
  inside, c = (
    (exprs[0].args[0], exprs[1])
    if isinstance(exprs[0], sympy.Abs)
    else (
      exprs[1].args[0],
      exprs[0],
    )
  )
  if c.free_symbols or not c.is_positive or len(inside.free_symbols) != 1:
    return None
  sym = next(iter(inside.free_symbols))
  lin = _linear(inside, sym)
  if lin is None or (solved and abs(lin[0]) != 1):
    return None
  if isinstance(exprs[0], sympy.Abs):  # |u| < c: -c < u < c
    return _linear_intervals([-c, inside, c], [op, op])
  below = _linear_intervals([inside, -c], [op])  # u < -c or u > c
  above = _linear_intervals([c, inside], [op])
  if below is None or above is None:
    return None
  return Intervals(below.parts + above.parts)


def _linear_intervals(exprs: list[Any], ops: list[str]) -> Intervals | None:
  """An ascending chain with one symbol appearing linearly, solved for it."""
  free = set().union(*[e.free_symbols for e in exprs])
  if len(free) != 1:
    return None
  sym = next(iter(free))
  if len(exprs) == 2:
    # f < g  <=>  (a) sym + c < 0
    lin = _linear(sympy.Add(exprs[0], -exprs[1]), sym)
    if lin is None:
      return None
    a, c = lin
    bound = -c / a
    op = ops[0] if a > 0 else _FLIP[ops[0]]
    closed = op in ('<=', '>=')
    if op in ('<', '<='):
      return Intervals([(-sympy.oo, bound, False, closed)])
    return Intervals([(bound, sympy.oo, closed, False)])
  if exprs[0].free_symbols or exprs[2].free_symbols:
    return None
  lin = _linear(exprs[1], sym)
  if lin is None:
    return None
  a, c = lin
  ends = [(exprs[0] - c) / a, (exprs[2] - c) / a]
  closed = [ops[0] == '<=', ops[1] == '<=']
  if a < 0:
    ends, closed = ends[::-1], closed[::-1]
  return Intervals([(ends[0], ends[1], closed[0], closed[1])])


def _not_equal(rel: Rel, solved: bool) -> Intervals | None:
  """``x \\ne a`` as ``(-oo, a) U (a, oo)``."""
  if not all(isinstance(p, Scalar) for p in rel.parts):
    return None
  lhs, rhs = (p.expr for p in rel.parts)
  if isinstance(rhs, sympy.Symbol) and not lhs.free_symbols:
    lhs, rhs = rhs, lhs
  if isinstance(lhs, sympy.Symbol) and not rhs.free_symbols:
    point = rhs
  else:
    free = lhs.free_symbols | rhs.free_symbols
    if solved or len(free) != 1:
      return None
    lin = _linear(sympy.Add(lhs, -rhs), next(iter(free)))
    if lin is None:
      return None
    point = -lin[1] / lin[0]
  if not point.is_real:
    return None
  return Intervals([(-sympy.oo, point, False, False), (point, sympy.oo, False, False)])
