"""Math answer verifier: the binary reward r(response, reference) in {0, 1}.

``verify(response, reference)`` extracts the last boxed answer and decides
whether it is mathematically equivalent to the reference; ``verify_batch``
scores many pairs in a process pool with a hard per-item deadline. Pure Python
+ sympy; model text is parsed by ``ada_jax.math_parse`` (never sympify/eval).

Policy (every decision, written once; zero false positives comes first):

Extraction
  * The answer is the content of the LAST ``\\boxed{...}`` or ``\\fbox{...}``,
    even when the prose disagrees. No box, ``\\boxed`` without ``{``, an
    unclosed or empty box, or a box over 1,000 characters -> False. Boxes are
    never joined (a hedged ``\\boxed{2} or \\boxed{3}`` counts as ``3``).
  * No last-number / "the answer is" fallback in the reward; ``verify(...,
    allow_answer_is=True)`` enables "answer is X" for evaluation only.
  * The reference is authoritative but normalised by the same code; it may come
    boxed or in ``$...$``. An empty or unparseable reference never matches
    anything but an identical normalised string.

Normalisation (both sides)
  * Dropped: ``$``, ``\\(\\)``, ``\\[\\]``, ``\\left``/``\\right``, spacing
    commands, ``\\displaystyle``, outer braces and boxes (inner ``\\boxed{X}``
    becomes X), a trailing period, ``\\$``, a leading "the answer is", a
    function prefix ``f(x) =``. ``\\text``/``\\mathrm``/``\\mathbf``... are
    unwrapped. Two answers whose normalised strings are equal up to spaces
    are equivalent (checked first).
  * Thousands separators only as ``1,000`` (whole answer), ``1{,}000``,
    ``1\\,000``, ``1,\\!000``. Any other comma separates list items (``1,2`` is
    a list, never 12).
  * ``1.5e3`` is 1500; ``0.\\overline{3}`` is exactly 1/3; ``2\\frac{1}{2}`` (an
    integer followed by a numeric fraction) is the mixed number 5/2.
  * Units: after a number, a trailing ``\\text{...}`` of words (``3 \\text{
    apples}``, ``5\\,\\text{cm}^2``) or a unit from a fixed list separated by a
    space (``5 cm``, ``10 square units``, ``2 m/s``) is dropped, and so is a
    leading ``\\$``. "all real numbers" and ``\\mathbb{R}`` are the real line.

Numbers
  * Exact comparison first: ``2/4`` = ``1/2`` (unreduced fractions are
    accepted), ``6/2`` = ``3``, ``2.50`` = ``2.5``, ``2^{100}`` = its digits.
  * Irrational constants are compared numerically at 50 digits with relative
    tolerance 1e-12, then confirmed at 80 digits (1e-40), never with an
    absolute tolerance: ``1/2^{99}`` != ``1/2^{98}``, ``10^{-7}`` !=
    ``2*10^{-7}``, ``\\pi + 10^{-20}`` != ``\\pi``. A reference equal to 0 needs
    a prediction that evaluates exactly to 0.
  * A decimal prediction against a different exact reference is accepted only
    with >= 6 significant digits, strictly within one unit of its last digit,
    and only if the reference cannot be written exactly with that many
    decimals (``0.333333`` = 1/3 and ``0.666666`` = 2/3; ``0.333`` != 1/3;
    ``3.14`` != pi; ``1.0000001`` != 1).
  * An exact prediction against a decimal reference is accepted if it rounds
    to the reference at the reference's printed precision and the reference
    has >= 4 significant digits (``4\\pi`` = ``12.566``, ``\\sqrt2`` =
    ``1.414``; ``1/3`` != ``0.33``).
  * Two different decimals never match (``3.1416`` != ``3.14159``).
  * Percent: only if ``%`` (or "percent") appears on a side, ``v%`` also
    matches ``v`` and ``v/100`` (``20\\%`` = ``20`` = ``0.2``). No x100 rule.
  * Degrees: ``^\\circ``/"degrees" is dropped and numbers compared; no
    degree/radian conversion (``30^\\circ`` != ``\\pi/6``).
  * ``e`` and ``\\mathrm{e}`` are Euler's number, ``i`` is the imaginary unit,
    ``\\log`` without a base is base 10, ``\\sqrt[3]{-8}`` = -2, ``\\infty``
    follows sympy's extended arithmetic (``2\\infty`` = ``\\infty``).
  * ``\\pm`` makes a two-element set: ``1 \\pm \\sqrt2`` = ``{1+\\sqrt2, 1-\\sqrt2}``.

Expressions, equations, structures
  * Expressions are equal if sympy's evaluated difference is 0, or if at 4
    positive rational points (distinct per symbol, 50 digits, over the union
    of both sides' symbols, so ``\\sin^2 x + \\cos^2 x`` = 1) they agree to
    1e-30 relative, and at 2 negative points they do not disagree where both
    are finite and real (so ``|x|`` != ``x``, ``\\sqrt{x^2}`` != ``x``, while
    ``2\\ln x`` = ``\\ln x^2``).
  * An assignment ``x = 5`` (single or subscripted symbol, ``(x, y)``, or
    ``f(x)``) matches its right side; two assignments need the same left side.
    A consistent numeric chain ``2+3=5`` or ``a=2+3=5`` matches its last part
    (``2+2=5`` matches nothing). ``x \\in S`` is ``S``; ``\\approx`` reads as
    ``=`` (``x \\approx 3.14`` is ``3.14``, a decimal under the rules above).
  * Equations match if ``lhs - rhs`` of both are proportional (nonzero
    constant ratio at every probe point): ``y=2x+1`` = ``2x-y+1=0``.
  * Inequalities in one variable become intervals. A prediction interval
    matches a reference inequality; the reverse is rejected (a model must not
    be paid for copying the question's inequality).
  * Sets (``\\{...\\}``, bare comma lists, ``\\pm``, "or"/"and") are unordered
    multisets of equal size; tuples ``(a, b, c)`` and ``[a, b, c]`` are ordered;
    ``(a, b)`` is a tuple or an open interval and matches both; intervals
    compare closure and endpoints; unions are compared interval by interval.
    A bare list matches a tuple in order.
  * Matrices: same shape, element-wise. A vector tuple never equals a matrix.
  * Multiple choice: a reference letter A-E (``C``, ``(C)``, ``\\text{(C)}``,
    ``(C) 12``) matches the prediction's leading option letter,
    case-insensitively (``\\textbf{(C)} 12`` = ``C``); the option text after
    the letter is not checked; a letter never matches a number.
  * Text answers (any word of 3+ letters, or no/is/of/...): lower-cased,
    whitespace-collapsed string equality.
  * Anything that does not parse, or leaves input unconsumed -> False. There is
    no "number found inside a garbage answer" fallback.

Guards and deadlines
  * Before anything is evaluated: <= 500 tokens, depth <= 50, integer literals
    <= 1,000 digits, and every exact numeric intermediate bounded in log10
    space (<= 10^4 digits: towers, ``10000!``, ``10^{-10^{10}}`` trip). A guard
    trip -> False and is counted.
  * ``verify`` carries a cooperative deadline (checked between steps) and, on
    the main thread when SIGALRM is free, an interval timer as a second line.
  * ``verify_batch`` runs items in worker processes; an item over ``timeout_s``
    has its worker killed and replaced and scores False.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import mpmath
import numpy as np
import sympy

from ada_jax import answer_normalize as an
from ada_jax import math_parse as mp

_log = logging.getLogger(__name__)

DEADLINE_S = 1.0  # cooperative budget of one verify call
_ALARM_S = 1.5  # hard-ish second line on the main thread
MAX_ITEMS = 20

_COUNTERS: Counter[str] = Counter()
_lock = threading.Lock()


def counters() -> dict[str, int]:
  """Returns the counters since start or the last reset, for training metrics.

  Keys: calls, timeouts (deadline hits), guard_trips (size/depth/magnitude
  guards on a prediction), parse_failures (predictions outside the grammar).
  A rising guard_trips or timeouts rate is a sign of reward hacking.
  """
  with _lock:
    return {
      k: _COUNTERS[k] for k in ('calls', 'timeouts', 'guard_trips', 'parse_failures')
    }


def reset_counters() -> None:
  """Zeroes the counters (e.g. at the start of a training step)."""
  with _lock:
    _COUNTERS.clear()


def _count(name: str, n: int = 1) -> None:
  with _lock:
    _COUNTERS[name] += n


class VerifyTimeoutError(Exception):
  """The verification ran past its deadline."""


class _Deadline:
  def __init__(self, seconds: float):
    self.end = time.monotonic() + seconds

  def check(self) -> None:
    if time.monotonic() > self.end:
      raise VerifyTimeoutError('verify deadline')


_state = threading.local()


def _check() -> None:
  deadline = getattr(_state, 'deadline', None)
  if deadline is not None:
    deadline.check()


# ------------------------------------------------------------ values


@dataclasses.dataclass
class _Scalar:
  expr: sympy.Expr
  decimal: tuple[int, int] | None = None  # (decimal places, significant digits)


@dataclasses.dataclass
class _Seq:
  kind: str  # list | set | tuple | pair
  items: list[Any]
  brackets: str = '()'


@dataclasses.dataclass
class _Intervals:
  parts: list[tuple[Any, Any, bool, bool]]  # (lo, hi, lo_closed, hi_closed)


@dataclasses.dataclass
class _Rel:
  parts: list[Any]
  ops: list[str]


@dataclasses.dataclass
class _Matrix:
  rows: list[list[Any]]


def _decimal_meta(node: mp.Node) -> tuple[int, int] | None:
  if node[0] == 'add' and len(node[1]) == 1 and node[1][0][0] == '-':
    node = node[1][0][1]
  if node[0] != 'num' or '.' not in node[1]:
    return None
  places = len(node[1].split('.')[1])
  return places, max(len(node[1].replace('.', '').lstrip('0')), 1)


def _value(node: mp.Node) -> Any:
  """Interprets a guarded AST as a comparable value."""
  _check()
  kind = node[0]
  if kind in ('list', 'set'):
    items = []
    for item in node[1]:
      value = _value(item)
      if isinstance(value, _Rel) and _assignment(value):
        value = value.parts[1]
      items.extend(
        value.items if isinstance(value, _Seq) and value.kind == 'pm' else [value]
      )
    if len(items) > MAX_ITEMS:
      raise mp.GuardError('too many items')
    return _Seq(kind, items)
  if kind == 'tuple':
    return _Seq('tuple', [_value(i) for i in node[1]], node[2])
  if kind == 'pair':
    return _Seq('pair', [_value(node[1]), _value(node[2])], node[3] + node[4])
  if kind == 'union':
    parts = []
    for part in node[1]:
      value = _value(part)
      intervals = _as_intervals(value)
      if intervals is None:
        raise mp.ParseError('union of non-intervals')
      parts.extend(intervals.parts)
    return _Intervals(parts)
  if kind == 'rel':
    return _Rel([_value(p) for p in node[1]], node[2])
  if kind == 'matrix':
    return _Matrix([[_value(c) for c in row] for row in node[1]])
  if kind == 'const' and node[1] == 'reals':
    return _Intervals([(-sympy.oo, sympy.oo, False, False)])
  if kind == 'const' and node[1] == 'empty':
    return _Seq('set', [])
  if mp.has_pm(node):
    return _Seq('pm', [_Scalar(mp.evaluate(node, 1)), _Scalar(mp.evaluate(node, -1))])
  return _Scalar(mp.evaluate(node), _decimal_meta(node))


def _assignment(rel: _Rel) -> bool:
  """``x = ...``, ``x_1 = ...`` or ``(x, y) = ...`` with a symbol-free right side."""
  if rel.ops != ['=']:
    return False
  lhs, rhs = rel.parts
  if isinstance(lhs, _Scalar) and isinstance(lhs.expr, sympy.Symbol):
    names = {lhs.expr}
  elif (
    isinstance(lhs, _Seq)
    and lhs.kind in ('pair', 'tuple')
    and all(
      isinstance(i, _Scalar) and isinstance(i.expr, sympy.Symbol) for i in lhs.items
    )
  ):
    names = {i.expr for i in lhs.items}
  else:
    return False
  return not (names & _free(rhs))


def _free(value: Any) -> set[sympy.Symbol]:
  if isinstance(value, _Scalar):
    return set(value.expr.free_symbols)
  if isinstance(value, (_Seq, _Rel)):
    items = value.items if isinstance(value, _Seq) else value.parts
    return set().union(*[_free(i) for i in items]) if items else set()
  if isinstance(value, _Matrix):
    return set().union(*[_free(c) for row in value.rows for c in row])
  if isinstance(value, _Intervals):
    return set().union(*[_free(_Scalar(e)) for p in value.parts for e in p[:2]])
  return set()


def _as_intervals(value: Any) -> _Intervals | None:
  if isinstance(value, _Intervals):
    return value
  if isinstance(value, _Seq) and value.kind == 'pair':
    lo, hi = value.items
    if isinstance(lo, _Scalar) and isinstance(hi, _Scalar):
      return _Intervals(
        [(lo.expr, hi.expr, value.brackets[0] == '[', value.brackets[1] == ']')]
      )
  return None


def _inequality_intervals(rel: _Rel) -> _Intervals | None:
  """``a < x <= b``, ``x > a``, ``a \\ge x`` in one symbol as intervals."""
  ops = rel.ops
  if not ops or any(op not in ('<', '<=', '>', '>=') for op in ops) or len(ops) > 2:
    return None
  if not all(isinstance(p, _Scalar) for p in rel.parts):
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
  return _Intervals([(lo, hi, lo_closed, hi_closed)])


# ------------------------------------------------------------ comparison


@dataclasses.dataclass(frozen=True)
class _Flags:
  pred_percent: bool
  ref_percent: bool


def _numeric(expr: sympy.Expr, digits: int) -> complex | None:
  _check()
  try:
    value = complex(expr.evalf(digits))
  except (TypeError, ValueError, ZeroDivisionError, OverflowError):
    return None
  return value if np.isfinite(value.real) and np.isfinite(value.imag) else None


def _mp_close(a: sympy.Expr, b: sympy.Expr, digits: int, rel: float) -> bool:
  """``|a - b| <= rel * max(|a|, |b|)`` at ``digits`` digits (mpmath numbers)."""
  _check()
  av, bv = sympy.N(a, digits), sympy.N(b, digits)
  if not (av.is_number and bv.is_number):
    return False
  scale = max(abs(av), abs(bv))
  diff = abs(sympy.N(av - bv, digits))
  if scale == 0:
    return diff == 0
  if not (scale.is_finite and diff.is_finite):
    return False
  return bool(diff <= rel * scale)


def _exact_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
  """Equality of two symbol-free exact values (no absolute tolerance)."""
  if a == b:
    return True
  if not (a.is_finite and b.is_finite):
    return False  # oo, zoo, nan only match themselves
  if a.is_Rational and b.is_Rational:
    return False
  diff = sympy.Add(a, -b)
  if diff.is_Rational:
    return diff == 0
  if b == 0 or a == 0:
    return False  # zero needs exact zero (no tolerance around 0)
  return _mp_close(a, b, 50, 1e-12) and _mp_close(a, b, 80, 1e-40)


def _decimal_close(dec: sympy.Rational, places: int, exact: sympy.Expr) -> bool:
  """Whether ``exact`` lies strictly within one unit of the decimal's last digit.

  Only for values that this many decimals cannot write exactly (1/3, pi): a
  wrong decimal for a terminating value (1.0000001 for 1) is just wrong.
  """
  if exact.free_symbols or not exact.is_real:
    return False
  if exact.is_Rational and (exact * 10**places).is_Integer:
    return False
  unit = sympy.Rational(1, 10**places)
  diff = sympy.N(sympy.Abs(exact - dec), 60)
  return bool(diff.is_number and diff < sympy.N(unit, 60))


def _scalar_equiv(p: _Scalar, r: _Scalar, flags: _Flags) -> bool:
  a, b = p.expr, r.expr
  if a.free_symbols or b.free_symbols:
    return _symbolic_equal(a, b)
  if _number_equal(p, r):
    return True
  if flags.pred_percent or flags.ref_percent:
    # 20% vs 0.2 or 0.2 vs 20%: only when a % was written.
    if flags.pred_percent and _exact_equal(a / 100, b):
      return True
    if flags.ref_percent and _exact_equal(a, b / 100):
      return True
  return False


def _number_equal(p: _Scalar, r: _Scalar) -> bool:
  a, b = p.expr, r.expr
  if _exact_equal(a, b):
    return True
  if p.decimal and not r.decimal:
    places, sig = p.decimal
    return sig >= 6 and _decimal_close(a, places, b)
  if r.decimal and not p.decimal:
    places, sig = r.decimal
    if sig < 4 or not a.is_real:
      return False
    rounded = sympy.Rational(round(sympy.N(a, 60) * 10**places), 10**places)
    return rounded == b
  return False


_POS_POINTS = ((7, 5), (13, 6), (17, 23), (29, 11))
_NEG_POINTS = ((-9, 7), (-31, 13))


def _point(syms: list[Any], num: int, den: int) -> dict[Any, Any]:
  # Distinct values per symbol: (n + 5j) / (d + 2j) never repeat since 2n != 5d.
  step = 5 if num > 0 else -5
  return {s: sympy.Rational(num + step * j, den + 2 * j) for j, s in enumerate(syms)}


def _symbolic_equal(a: sympy.Expr, b: sympy.Expr) -> bool:
  if a == b:
    return True
  diff = sympy.Add(a, -b)
  if diff == 0:
    return True
  if diff.is_number:
    return False
  # Probe over the union of symbols: sin^2 x + cos^2 x equals 1.
  syms = sorted(a.free_symbols | b.free_symbols, key=str)
  agreed = 0
  for point in _POS_POINTS:
    subs = _point(syms, *point)
    va, vb = _probe(a, subs), _probe(b, subs)
    if va is None and vb is None:
      continue
    if va is None or vb is None or not _close(va, vb, 1e-30):
      return False
    agreed += 1
  for point in _NEG_POINTS:
    subs = _point(syms, *point)
    va, vb = _probe(a, subs), _probe(b, subs)
    if (
      va is not None
      and vb is not None
      and va.imag == 0
      and vb.imag == 0
      and not _close(va, vb, 1e-30)
    ):
      return False
  return agreed >= 2


_TINY = mpmath.mpf(10) ** -60  # evalf(subs=...) leaves ~1e-160 noise at exact zeros


def _probe(expr: sympy.Expr, subs: dict[Any, Any]) -> Any:
  """Value of ``expr`` at ``subs`` as a 50-digit mpmath complex; None if not finite."""
  _check()
  try:
    value = expr.evalf(50, subs=subs)
    if not value.is_number or value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
      return None
    re_, im_ = (sympy.N(part, 50) for part in value.as_real_imag())
    out = mpmath.mpc(re_._to_mpmath(170), im_._to_mpmath(170))
  except (TypeError, ValueError, ZeroDivisionError, OverflowError, AttributeError):
    return None
  if not mpmath.isfinite(out):
    return None
  return mpmath.mpc(0) if abs(out) < _TINY else out


def _close(x: Any, y: Any, rel: float) -> bool:
  scale = max(abs(x), abs(y))
  return bool(abs(x - y) <= rel * scale) if scale else True


def _proportional(f: sympy.Expr, g: sympy.Expr) -> bool:
  """Whether f = c * g for a nonzero constant c (probe-based)."""
  if f.free_symbols != g.free_symbols or not f.free_symbols:
    return False
  syms = sorted(f.free_symbols, key=str)
  ratios = []
  for k, point in enumerate(_POS_POINTS + _NEG_POINTS):
    subs = {
      s: sympy.Rational(point[0] + 2 * j + k, point[1]) for j, s in enumerate(syms)
    }
    vf, vg = _probe(f, subs), _probe(g, subs)
    if vf is None or vg is None:
      continue
    if (vf == 0) != (vg == 0):
      return False
    if vg != 0:
      ratios.append(vf / vg)
  if len(ratios) < 3:
    return False
  return all(_close(r, ratios[0], 1e-25) for r in ratios[1:])


def _equiv(p: Any, r: Any, flags: _Flags) -> bool:
  """Reference-directed equivalence of two interpreted values."""
  _check()
  if isinstance(r, _Rel):
    return _equiv_rel(p, r, flags)
  if isinstance(p, _Rel):
    if _assignment(p):
      return _equiv(p.parts[1], r, flags)
    if p.ops == ['in']:
      return _equiv(p.parts[1], r, flags)
    parts = p.parts
    if isinstance(parts[0], _Scalar) and isinstance(parts[0].expr, sympy.Symbol):
      parts = parts[1:]  # a = 5 \cdot 20 + 1 = 101
    if all(o == '=' for o in p.ops) and not any(_free(x) for x in parts):
      # A numeric chain 2+3=5 answers with its last part, if it is consistent.
      last = parts[-1]
      return all(_equiv(x, last, flags) for x in parts[:-1]) and _equiv(last, r, flags)
    return False
  if isinstance(r, _Scalar):
    return isinstance(p, _Scalar) and _scalar_equiv(p, r, flags)
  if isinstance(r, _Matrix):
    return (
      isinstance(p, _Matrix)
      and len(p.rows) == len(r.rows)
      and all(len(pr) == len(rr) for pr, rr in zip(p.rows, r.rows, strict=True))
      and all(
        _equiv(pc, rc, flags)
        for pr, rr in zip(p.rows, r.rows, strict=True)
        for pc, rc in zip(pr, rr, strict=True)
      )
    )
  interval_ref = (
    isinstance(r, _Seq)
    and r.kind == 'pair'
    and (r.brackets != '()' or isinstance(p, _Intervals))
  )
  if isinstance(r, _Intervals) or interval_ref:
    pi, ri = _as_intervals(p), _as_intervals(r)
    return pi is not None and ri is not None and _intervals_equal(pi, ri, flags)
  if isinstance(r, _Seq):
    return _equiv_seq(p, r, flags)
  return False


def _equiv_rel(p: Any, r: _Rel, flags: _Flags) -> bool:
  if r.ops == ['in']:
    return _equiv(p, r.parts[1], flags)
  ref_iv = _inequality_intervals(r)
  if ref_iv is not None:
    pred_iv = _inequality_intervals(p) if isinstance(p, _Rel) else _as_intervals(p)
    return pred_iv is not None and _intervals_equal(pred_iv, ref_iv, flags)
  if _assignment(r):
    if isinstance(p, _Rel) and _assignment(p) and _same_lhs(p.parts[0], r.parts[0]):
      return _equiv(p.parts[1], r.parts[1], flags)
    if not isinstance(p, _Rel):
      return _equiv(p, r.parts[1], flags)
  if r.ops == ['='] and isinstance(p, _Rel) and p.ops == ['=']:
    parts = p.parts + r.parts
    if all(isinstance(x, _Scalar) for x in parts):
      f = sympy.Add(parts[0].expr, -parts[1].expr)
      g = sympy.Add(parts[2].expr, -parts[3].expr)
      return _proportional(f, g)
  return False


def _same_lhs(a: Any, b: Any) -> bool:
  if isinstance(a, _Scalar) and isinstance(b, _Scalar):
    return a.expr == b.expr
  return (
    isinstance(a, _Seq)
    and isinstance(b, _Seq)
    and [i.expr for i in a.items] == [i.expr for i in b.items]
  )


def _equiv_seq(p: Any, r: _Seq, flags: _Flags) -> bool:
  if not isinstance(p, _Seq):
    return False
  if r.kind in ('set', 'list', 'pm'):
    ordered = r.kind == 'list' and p.kind in ('tuple', 'pair')
    if p.kind in ('tuple', 'pair') and not ordered:
      return False
    if ordered:
      return _ordered(p.items, r.items, flags)
    return _unordered(p.items, r.items, flags)
  # Reference tuple or neutral (a, b) pair.
  if p.kind in ('tuple', 'pair') and p.brackets != r.brackets:
    return False
  if p.kind not in ('tuple', 'pair', 'list'):
    return False
  return _ordered(p.items, r.items, flags)


def _ordered(ps: list[Any], rs: list[Any], flags: _Flags) -> bool:
  return len(ps) == len(rs) and all(
    _equiv(p, r, flags) for p, r in zip(ps, rs, strict=True)
  )


def _unordered(ps: list[Any], rs: list[Any], flags: _Flags) -> bool:
  if len(ps) != len(rs):
    return False
  remaining = list(ps)
  for r in rs:
    for k, p in enumerate(remaining):
      if _equiv(p, r, flags):
        del remaining[k]
        break
    else:
      return False
  return True


def _intervals_equal(p: _Intervals, r: _Intervals, flags: _Flags) -> bool:
  if len(p.parts) != len(r.parts):
    return False

  def key(part: tuple[Any, Any, bool, bool]) -> float:
    value = _numeric(part[0], 15) if part[0] != -sympy.oo else complex(-np.inf)
    return value.real if value is not None else np.nan

  ps, rs = sorted(p.parts, key=key), sorted(r.parts, key=key)
  for (plo, phi, plc, phc), (rlo, rhi, rlc, rhc) in zip(ps, rs, strict=True):
    if (plc, phc) != (rlc, rhc):
      return False
    for pe, re_ in ((plo, rlo), (phi, rhi)):
      if not (pe == re_ or _scalar_equiv(_Scalar(pe), _Scalar(re_), flags)):
        return False
  return True


# ------------------------------------------------------------ public API

_MC_REF = re.compile(r'^\(?([A-E])\)?$|^\(([A-E])\)\s.*$')
# The prediction's option letter: (C) anything, a lone C / C. / C), or C. 12;
# never a lowercase letter that starts an expression (a = 3, e^2).
_MC_PRED = re.compile(r'^\(([A-Ea-e])\)|^([A-Ea-e])[.:)]?$|^([A-E])[.:)]\s')


def _text_key(text: str) -> str:
  return re.sub(r'\s+', ' ', re.sub(r'[{}\\]', ' ', text)).strip().lower()


def _parse(text: str) -> Any:
  return _value(mp.parse(text))


@functools.lru_cache(maxsize=4096)
def _reference(reference: str) -> tuple[an.Normalized, str, Any]:
  """Normalised and parsed reference: ``(normalized, kind, value)``.

  kind is 'value', 'text' (words) or 'fail'. Cached: RL scores each
  reference for every sample of its group. Values are never mutated.
  """
  ref = an.normalize(an.unwrap(_ref_answer(reference)))
  if not ref.text or _MC_REF.match(ref.text):
    return ref, 'fail', None
  try:
    return ref, 'value', _parse(ref.text)
  except mp.TextAnswerError:
    return ref, 'text', None
  except (mp.ParseError, mp.GuardError):
    return ref, 'fail', None


def _compare(pred: str, reference: str) -> bool:
  ref, ref_kind, ref_value = _reference(reference)
  if not ref.text:
    return False
  pn = an.normalize(pred)
  if not pn.text:
    return False
  if pn.text.replace(' ', '') == ref.text.replace(' ', ''):
    return True
  mc = _MC_REF.match(ref.text)
  if mc:
    pm_ = _MC_PRED.match(pn.text)
    return bool(pm_) and (pm_.group(1) or pm_.group(2) or pm_.group(3)).upper() == (
      mc.group(1) or mc.group(2)
    )
  if ref_kind == 'text':
    return _text_key(pn.text) == _text_key(ref.text)
  if ref_kind != 'value':
    return False
  try:
    pred_value = _parse(pn.text)
  except (mp.ParseError, mp.GuardError) as err:
    _count('guard_trips' if isinstance(err, mp.GuardError) else 'parse_failures')
    if isinstance(err, mp.GuardError):
      _log.debug(
        'verifier guard trip %s: %s', hashlib.sha1(pred.encode()).hexdigest()[:12], err
      )
    return False
  return _equiv(pred_value, ref_value, _Flags(pn.percent, ref.percent))


def _ref_answer(reference: str) -> str:
  if len(reference) > an.MAX_REFERENCE_CHARS:
    return ''
  if '\\boxed' in reference or '\\fbox' in reference:
    return an.extract(reference, limit=an.MAX_REFERENCE_CHARS) or ''
  return reference


class _Alarm:
  """SIGALRM timer on the main thread, only when nobody else uses SIGALRM."""

  def __init__(self, seconds: float):
    self.seconds = seconds
    self.armed = False

  def __enter__(self) -> _Alarm:
    if threading.current_thread() is not threading.main_thread() or not hasattr(
      signal, 'setitimer'
    ):
      return self
    if (
      signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None)
      or signal.getitimer(signal.ITIMER_REAL)[0]
    ):
      return self
    signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, self.seconds)
    self.armed = True
    return self

  def __exit__(self, *exc: object) -> None:
    if self.armed:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _raise_timeout(signum: int, frame: object) -> None:
  raise VerifyTimeoutError('verify alarm')


def _guarded(fn: Any, *args: Any) -> bool:
  _count('calls')
  _state.deadline = _Deadline(DEADLINE_S)
  try:
    with _Alarm(_ALARM_S):
      return bool(fn(*args))
  except VerifyTimeoutError:
    _count('timeouts')
    return False
  except Exception as err:  # verify never raises: an unexpected error scores 0
    _log.debug('verifier error %r', err)
    return False
  finally:
    _state.deadline = None


def extract(response: str) -> str | None:
  """Returns the content of the last ``\\boxed{...}``/``\\fbox{...}`` of a response.

  Args:
    response: the model's full response text.

  Returns:
    The box content, or None when there is no box, the last box is not
    followed by ``{``, is unclosed, empty, or over 1,000 characters.
  """
  try:
    return an.extract(response)
  except Exception:  # extract never raises either
    return None


def equivalent(pred: str, ref: str) -> bool:
  """Decides whether an extracted answer is equivalent to the reference.

  Args:
    pred: the answer (box content), at most 1,000 characters.
    ref: the reference answer, plain, ``$...$`` or boxed.

  Returns:
    True only if equivalent under the module's policy. Never raises.
  """
  if (
    not isinstance(pred, str)
    or not isinstance(ref, str)
    or len(pred) > an.MAX_BOX_CHARS
  ):
    return False
  return _guarded(_compare, pred, ref)


def verify(response: str, reference: str, *, allow_answer_is: bool = False) -> bool:
  """The reward: is the last boxed answer of ``response`` equal to ``reference``?

  Args:
    response: the model's full response text (any length; extraction is linear).
    reference: the reference answer, plain, ``$...$`` or boxed.
    allow_answer_is: evaluation only: without a box, use the text after the
      last "answer is". Never set this for the RL reward.

  Returns:
    True or False. Never raises; returns within about 1.5 s on any input.
  """
  if not isinstance(response, str) or not isinstance(reference, str):
    return False
  pred = extract(response)
  if pred is None and allow_answer_is:
    pred = an.extract_answer_is(response)
  if pred is None or len(pred) > an.MAX_BOX_CHARS:
    return False
  return _guarded(_compare, pred, reference)


def verify_batch(
  responses: Sequence[str],
  references: Sequence[str],
  *,
  timeout_s: float = 2.0,
  workers: int | None = None,
) -> np.ndarray:
  """Scores many (response, reference) pairs in worker processes.

  Each item gets ``timeout_s`` of worker time; a worker still busy after that
  is killed and replaced (no reliance on signals, so this works from any
  thread) and the item scores False. The pool persists between calls. The
  workers' counter increments are added to this process's ``counters()``.

  Args:
    responses: model responses.
    references: reference answers, one per response.
    timeout_s: hard per-item deadline in seconds.
    workers: number of worker processes (default: CPU count, at most 16).

  Returns:
    A bool array of shape ``[len(responses)]``.

  Raises:
    ValueError: if the two sequences differ in length.
  """
  from ada_jax import verifier_pool

  if len(responses) != len(references):
    raise ValueError('responses and references differ in length')
  results, stats = verifier_pool.run(
    list(responses), list(references), timeout_s=timeout_s, workers=workers
  )
  with _lock:
    _COUNTERS.update(stats)
  return np.asarray(results, dtype=bool)
