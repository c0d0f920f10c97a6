"""Comparable values of a parsed answer: scalars, sequences, intervals, relations.

The verifier interprets the guarded tuple AST of ``parser`` as one of a
few value classes before comparing: ``Scalar`` (an evaluated sympy number or
expression, with its decimal precision when written as a decimal), ``Seq``
(list, set, tuple, ``(a, b)`` pair, or the two branches of a ``\\pm``),
``Intervals`` (a union of intervals with closure), ``Rel`` (an equation,
inequality or ``\\in`` chain) and ``Matrix``. Also here: which relations are
assignments (``x = 5``) and which inequalities read as intervals.
"""

from __future__ import annotations

import dataclasses
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

  ``kind`` is list (a bare comma list), set, tuple, pair (``(a, b)``, a tuple
  or an interval) or pm (the two branches of a ``\\pm``); ``brackets`` are the
  opening and closing brackets of a tuple or pair.
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
  """A chain ``parts[0] ops[0] parts[1] ...`` of =, <, <=, >, >=, != or in."""

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
    items = []
    for item in node[1]:
      value = to_value(item)
      if isinstance(value, Rel) and is_assignment(value):
        value = value.parts[1]
      items.extend(
        value.items if isinstance(value, Seq) and value.kind == 'pm' else [value]
      )
    if len(items) > MAX_ITEMS:
      raise nodes.GuardError('too many items')
    return Seq(kind, items)
  if kind == 'tuple':
    return Seq('tuple', [to_value(i) for i in node[1]], node[2])
  if kind == 'pair':
    return Seq('pair', [to_value(node[1]), to_value(node[2])], node[3] + node[4])
  if kind == 'union':
    parts = []
    for part in node[1]:
      value = to_value(part)
      intervals = as_intervals(value)
      if intervals is None:
        raise nodes.ParseError('union of non-intervals')
      parts.extend(intervals.parts)
    return Intervals(parts)
  if kind == 'rel':
    return Rel([to_value(p) for p in node[1]], node[2])
  if kind == 'matrix':
    return Matrix([[to_value(c) for c in row] for row in node[1]])
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


def is_assignment(rel: Rel) -> bool:
  """``x = ...``, ``x_1 = ...`` or ``(x, y) = ...`` with a symbol-free right side."""
  if rel.ops != ['=']:
    return False
  lhs, rhs = rel.parts
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


def inequality_intervals(rel: Rel) -> Intervals | None:
  """``a < x <= b``, ``x > a``, ``a \\ge x`` in one symbol as intervals."""
  ops = rel.ops
  if not ops or any(op not in ('<', '<=', '>', '>=') for op in ops) or len(ops) > 2:
    return None
  if not all(isinstance(p, Scalar) for p in rel.parts):
    return None
  exprs = [p.expr for p in rel.parts]
  if ops[0] in ('>', '>='):  # flip to an ascending chain
    exprs, ops = exprs[::-1], [{'>': '<', '>=': '<='}[o] for o in ops[::-1]]
  if any(o in ('>', '>=') for o in ops):
    return None
  syms = [i for i, e in enumerate(exprs) if isinstance(e, sympy.Symbol)]
  if len(syms) != 1 or any(e.free_symbols for i, e in enumerate(exprs) if i != syms[0]):
    return None
  k = syms[0]
  lo, lo_closed = (exprs[k - 1], ops[k - 1] == '<=') if k > 0 else (-sympy.oo, False)
  hi, hi_closed = (
    (exprs[k + 1], ops[k] == '<=') if k + 1 < len(exprs) else (sympy.oo, False)
  )
  return Intervals([(lo, hi, lo_closed, hi_closed)])
