"""Equality of two scalar answers: exact numbers, decimals, percent, expressions.

The numeric policy of the verifier (see the ``ada_jax.verifier`` docstring):
exact comparison first; irrational values at 50 then 80 digits with relative
tolerance only; a decimal against an exact value only under the precision
rules; percent only where a ``%`` was written; expressions by sympy's
difference, then by probing at rational points; equations by proportional
``lhs - rhs``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import mpmath
import numpy as np
import sympy
from sympy.calculus.accumulationbounds import AccumBounds

from ada_jax.verifier import deadline as vd
from ada_jax.verifier import values as vv


@dataclasses.dataclass(frozen=True)
class Flags:
  """Whether each side wrote a ``%`` (or "percent"): enables the percent rule."""

  pred_percent: bool
  ref_percent: bool


def undefined(expr: Any) -> bool:
  """Whether ``expr`` has no value (the root of every "undefined" rule).

  Undefined: ``zoo`` (a zero denominator, ``\\tan(\\pi/2)``, ``\\log 0``),
  ``nan``, an accumulation bound (a limit that does not exist) or an
  infinity other than +oo and -oo. Undefined values never compare equal,
  not even to themselves (``\\frac{5}{0}`` is not ``\\frac{2}{0}``); +oo
  and -oo are ordinary values.
  """
  if not isinstance(expr, sympy.Basic):
    return False
  if expr.has(sympy.zoo, sympy.nan, AccumBounds):
    return True
  return bool(expr.is_number and expr.is_infinite and expr not in (sympy.oo, -sympy.oo))


def numeric(expr: sympy.Expr, digits: int) -> complex | None:
  """``expr`` as a finite complex at ``digits`` digits, or None."""
  vd.check()
  try:
    value = complex(expr.evalf(digits))
  except (TypeError, ValueError, ZeroDivisionError, OverflowError):
    return None
  return value if np.isfinite(value.real) and np.isfinite(value.imag) else None


def _mp_close(a: sympy.Expr, b: sympy.Expr, digits: int, rel: float) -> bool:
  """``|a - b| <= rel * max(|a|, |b|)`` at ``digits`` digits (mpmath numbers)."""
  vd.check()
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
  if undefined(a) or undefined(b):
    return False
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


def rounds_to(exact: vv.Scalar, dec: vv.Scalar) -> bool:
  """Whether ``exact`` rounded at the decimal's printed places is the decimal."""
  if not dec.decimal or exact.expr.free_symbols or not exact.expr.is_real:
    return False
  places = dec.decimal[0]
  rounded = sympy.Rational(round(sympy.N(exact.expr, 60) * 10**places), 10**places)
  return rounded == dec.expr


def approximates(dec: vv.Scalar, exact: vv.Scalar) -> bool:
  """Whether decimal ``dec`` is ``exact`` or within one unit of its last digit."""
  if not dec.decimal or exact.expr.free_symbols:
    return False
  if _exact_equal(dec.expr, exact.expr):
    return True
  return _decimal_close(dec.expr, dec.decimal[0], exact.expr)


def scalar_equiv(p: vv.Scalar, r: vv.Scalar, flags: Flags) -> bool:
  """Whether prediction ``p`` equals reference ``r`` under the numeric policy."""
  a, b = p.expr, r.expr
  if undefined(a) or undefined(b):
    return False
  if a.free_symbols or b.free_symbols:
    return _symbolic_equal(a, b)
  if _number_equal(p, r):
    return True
  if flags.pred_percent != flags.ref_percent:
    # 20% vs 0.2 or 0.2 vs 20%: only when one side wrote a %; two
    # percentages compare their numbers (0.44% is not 44%).
    if flags.pred_percent and _exact_equal(a / 100, b):
      return True
    if flags.ref_percent and _exact_equal(a, b / 100):
      return True
  return False


def _number_equal(p: vv.Scalar, r: vv.Scalar) -> bool:
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
  if undefined(a) or undefined(b):
    return False
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
  vd.check()
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


def proportional(f: sympy.Expr, g: sympy.Expr) -> bool:
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
