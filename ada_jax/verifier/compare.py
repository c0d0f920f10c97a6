"""The verifier's comparison cascade over interpreted answer values.

``equiv(pred, ref, flags)`` is reference-directed: the reference's shape picks
the rule. Relations (assignments, numeric chains, ``\\in``, inequalities as
intervals, equations), scalars (``scalars``), matrices element-wise,
intervals with closure and unions part by part, written sets as sets and
bare lists as unordered multisets, tuples in order, ratios by proportion,
``\\approx`` chains by their exact head.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

from ada_jax.verifier import deadline as vd
from ada_jax.verifier import scalars as vs
from ada_jax.verifier import values as vv


def _is_label(value: Any) -> bool:
  return isinstance(value, vv.Scalar) and (
    isinstance(value.expr, sympy.Symbol) or vv._is_name(value)
  )


def _split_approx(rel: vv.Rel) -> tuple[Any, list[Any]] | None:
  """``E \\approx d1 \\approx d2``: (the exact head E or None, the decimals).

  The head is everything before the first ``\\approx`` (a bare label such as
  ``x`` counts as no head). Each decimal must approximate the head's value
  (strictly within one unit of its last digit); otherwise, or when a part
  after the first ``\\approx`` is not a plain decimal, returns None.
  """
  k = rel.ops.index('~=')
  head_parts, head_ops = rel.parts[: k + 1], rel.ops[:k]
  tail = rel.parts[k + 1 :]
  if any(o not in ('=', '~=') for o in rel.ops[k:]):
    return None
  if not all(isinstance(t, vv.Scalar) and t.decimal for t in tail):
    return None
  if len(head_parts) == 1 and _is_label(head_parts[0]):
    return None, tail
  head = head_parts[0] if len(head_parts) == 1 else vv.Rel(head_parts, head_ops)
  exact = head_parts[-1]
  if not isinstance(exact, vv.Scalar) or exact.expr.free_symbols:
    return None
  if not all(vs.approximates(t, exact) for t in tail):
    return None
  return head, tail


def undefined_value(value: Any) -> bool:
  """An undefined scalar (``vs.undefined``) or a ratio with a zero or undefined term."""
  if isinstance(value, vv.Scalar):
    return vs.undefined(value.expr)
  if isinstance(value, vv.Seq) and value.kind == 'ratio':
    return any(vs.undefined(i.expr) or i.expr.is_zero for i in value.items)
  return False


def equiv(p: Any, r: Any, flags: vs.Flags) -> bool:
  """Reference-directed equivalence of two interpreted values."""
  vd.check()
  if isinstance(r, vv.Rel) and '~=' in r.ops:
    split = _split_approx(r)
    if split is None:
      return False
    return equiv(p, split[0] if split[0] is not None else split[1][0], flags)
  if isinstance(p, vv.Rel) and '~=' in p.ops:
    split = _split_approx(p)
    if split is None:
      return False
    head, tail = split
    if head is None:  # x \approx 3.14: the decimal is the answer
      return equiv(tail[0], r, flags)
    if equiv(head, r, flags):
      return True
    # Or the written decimal, for a decimal reference the exact head rounds
    # to (1/3 \approx 0.34 never answers 0.34).
    exact = head.parts[-1] if isinstance(head, vv.Rel) else head
    return (
      isinstance(r, vv.Scalar)
      and r.decimal is not None
      and vs.rounds_to(exact, r)
      and equiv(tail[0], r, flags)
    )
  if isinstance(r, vv.Rel):
    return _equiv_rel(p, r, flags)
  if isinstance(p, vv.Rel):
    if vv.is_assignment(p):
      return equiv(p.parts[1], r, flags)
    if p.ops == ['in']:
      return equiv(p.parts[1], r, flags)
    ref_iv = vv.as_intervals(r)
    if ref_iv is not None:
      # A solved inequality (bare symbol) answers an interval: 1 < x < 5.
      pred_iv = vv.inequality_intervals(p, solved=True)
      return pred_iv is not None and _intervals_equal(pred_iv, ref_iv, flags)
    parts = p.parts
    if _is_label(parts[0]):
      parts = parts[1:]  # a = 5 \cdot 20 + 1 = 101
    if all(o == '=' for o in p.ops) and not any(vv.symbols_of(x) for x in parts):
      # A numeric chain 2+3=5 answers with its last part, if it is consistent.
      last = parts[-1]
      return all(equiv(x, last, flags) for x in parts[:-1]) and equiv(last, r, flags)
    return False
  if (isinstance(r, vv.Seq) and r.kind == 'ratio') or (
    isinstance(p, vv.Seq) and p.kind == 'ratio'
  ):
    return _equiv_ratio(p, r, flags)
  if isinstance(r, vv.Scalar):
    if isinstance(p, vv.Seq) and p.kind == 'list' and p.items:
      # The same value twice (two boxes, 1/2 or 0.5) is that value.
      return all(equiv(i, r, flags) for i in p.items)
    return isinstance(p, vv.Scalar) and vs.scalar_equiv(p, r, flags)
  if isinstance(r, vv.Matrix):
    return (
      isinstance(p, vv.Matrix)
      and len(p.rows) == len(r.rows)
      and all(len(pr) == len(rr) for pr, rr in zip(p.rows, r.rows, strict=True))
      and all(
        equiv(pc, rc, flags)
        for pr, rr in zip(p.rows, r.rows, strict=True)
        for pc, rc in zip(pr, rr, strict=True)
      )
    )
  interval_ref = (
    isinstance(r, vv.Seq)
    and r.kind == 'pair'
    and (r.brackets != '()' or isinstance(p, vv.Intervals))
  )
  if isinstance(r, vv.Intervals) or interval_ref:
    pi, ri = vv.as_intervals(p) or _inequality_union(p), vv.as_intervals(r)
    return pi is not None and ri is not None and _intervals_equal(pi, ri, flags)
  if isinstance(r, vv.Seq):
    return _equiv_seq(p, r, flags)
  return False


def _inequality_union(p: Any) -> vv.Intervals | None:
  """``x < -1 or x > 3`` (a list of solved inequalities) as one union."""
  if not (isinstance(p, vv.Seq) and p.kind == 'list' and p.items):
    return None
  parts = []
  for item in p.items:
    iv = (
      vv.inequality_intervals(item, solved=True) if isinstance(item, vv.Rel) else None
    )
    if iv is None:
      return None
    parts.extend(iv.parts)
  return vv.Intervals(parts)


def _equiv_rel(p: Any, r: vv.Rel, flags: vs.Flags) -> bool:
  if r.ops == ['in']:
    return equiv(p, r.parts[1], flags)
  ref_iv = vv.inequality_intervals(r)
  if ref_iv is not None:
    pred_iv = (
      vv.inequality_intervals(p) if isinstance(p, vv.Rel) else vv.as_intervals(p)
    )
    return pred_iv is not None and _intervals_equal(pred_iv, ref_iv, flags)
  if vv.is_assignment(r):
    if (
      isinstance(p, vv.Rel)
      and vv.is_assignment(p)
      and _same_lhs(p.parts[0], r.parts[0])
    ):
      return equiv(p.parts[1], r.parts[1], flags)
    if not isinstance(p, vv.Rel):
      return equiv(p, r.parts[1], flags)
  if r.ops == ['='] and isinstance(p, vv.Rel) and p.ops == ['=']:
    parts = p.parts + r.parts
    if all(isinstance(x, vv.Scalar) for x in parts):
      f = sympy.Add(parts[0].expr, -parts[1].expr)
      g = sympy.Add(parts[2].expr, -parts[3].expr)
      return vs.proportional(f, g)
  return False


def _same_lhs(a: Any, b: Any) -> bool:
  if isinstance(a, vv.Scalar) and isinstance(b, vv.Scalar):
    return a.expr == b.expr
  return (
    isinstance(a, vv.Seq)
    and isinstance(b, vv.Seq)
    and [i.expr for i in a.items] == [i.expr for i in b.items]
  )


def _equiv_ratio(p: Any, r: Any, flags: vs.Flags) -> bool:
  """Ratios match proportional ratios (4:14 = 2:7); a two-part ratio its quotient."""

  def quotient(v: Any) -> Any:
    if isinstance(v, vv.Seq) and v.kind == 'ratio':
      if len(v.items) != 2:
        return None
      return vv.Scalar(sympy.Mul(v.items[0].expr, sympy.Pow(v.items[1].expr, -1)))
    return v if isinstance(v, vv.Scalar) else None

  if undefined_value(p) or undefined_value(r):
    return False  # 3:0 is no ratio: never 6:0, 3, or another time 10:00
  p_ratio = isinstance(p, vv.Seq) and p.kind == 'ratio'
  r_ratio = isinstance(r, vv.Seq) and r.kind == 'ratio'
  if p_ratio and r_ratio:
    ps, rs = p.items, r.items
    if len(ps) != len(rs):
      return False
    return all(
      vs.scalar_equiv(
        vv.Scalar(sympy.Mul(pi.expr, rs[0].expr)),
        vv.Scalar(sympy.Mul(ri.expr, ps[0].expr)),
        vs.Flags(False, False),
      )
      for pi, ri in zip(ps[1:], rs[1:], strict=True)
    )
  pq, rq = quotient(p), quotient(r)
  if pq is None or rq is None:
    return False
  return vs.scalar_equiv(pq, rq, flags)


def _dedupe(items: list[Any], flags: vs.Flags) -> list[Any]:
  kept: list[Any] = []
  for item in items:
    if not any(equiv(item, k, flags) for k in kept):
      kept.append(item)
  return kept


def _equiv_seq(p: Any, r: vv.Seq, flags: vs.Flags) -> bool:
  if not isinstance(p, vv.Seq):
    return False
  if 'set' in (p.kind, r.kind) and p.kind not in ('tuple', 'pair'):
    # A written set {3, 5, 3} is the set {3, 5}: duplicates collapse.
    return _unordered(_dedupe(p.items, flags), _dedupe(r.items, flags), flags)
  if r.kind in ('set', 'list', 'pm'):
    ordered = r.kind == 'list' and p.kind in ('tuple', 'pair', 'labelled')
    if p.kind in ('tuple', 'pair') and not ordered:
      return False
    if ordered:
      return _ordered(p.items, r.items, flags)
    return _unordered(p.items, r.items, flags)
  # Reference tuple or neutral (a, b) pair.
  if p.kind in ('tuple', 'pair') and p.brackets != r.brackets:
    return False
  if p.kind not in ('tuple', 'pair', 'list', 'labelled'):
    return False
  return _ordered(p.items, r.items, flags)


def _ordered(ps: list[Any], rs: list[Any], flags: vs.Flags) -> bool:
  return len(ps) == len(rs) and all(
    equiv(p, r, flags) for p, r in zip(ps, rs, strict=True)
  )


def _unordered(ps: list[Any], rs: list[Any], flags: vs.Flags) -> bool:
  if len(ps) != len(rs):
    return False
  remaining = list(ps)
  for r in rs:
    for k, p in enumerate(remaining):
      if equiv(p, r, flags):
        del remaining[k]
        break
    else:
      return False
  return True


def _intervals_equal(p: vv.Intervals, r: vv.Intervals, flags: vs.Flags) -> bool:
  if len(p.parts) != len(r.parts):
    return False

  def key(part: tuple[Any, Any, bool, bool]) -> float:
    value = vs.numeric(part[0], 15) if part[0] != -sympy.oo else complex(-np.inf)
    return value.real if value is not None else np.nan

  ps, rs = sorted(p.parts, key=key), sorted(r.parts, key=key)
  for (plo, phi, plc, phc), (rlo, rhi, rlc, rhc) in zip(ps, rs, strict=True):
    if (plc, phc) != (rlc, rhc):
      return False
    for pe, re_ in ((plo, rlo), (phi, rhi)):
      if vs.undefined(pe) or vs.undefined(re_):
        return False
      if not (pe == re_ or vs.scalar_equiv(vv.Scalar(pe), vv.Scalar(re_), flags)):
        return False
  return True
