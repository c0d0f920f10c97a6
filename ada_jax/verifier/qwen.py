"""A Qwen2.5-Math-style grader on our safe parser (the reference's Minerva grader).

The reference grades minerva_math with Qwen2.5-Math's evaluation code; this
rebuilds its two rules on ``ada_jax.verifier``'s parser (no ``eval``, no
sympify of model text):

  * Extraction (``extract``): the text between "final answer is $" and
    "$. I hope" (Minerva's prompt format); else the last ``boxed`` (its
    braces, or up to the next ``$`` when no brace follows); else the text
    after the last "he answer is" or "final answer is" (up to the end of its
    sentence); else the last number in the response (commas removed first,
    so 1,000 is 1000).
  * Equality (``equal``): equal normalised strings; two numbers match within
    a relative tolerance of 1e-4, the reference also as a percentage
    (``r``, ``r/100``, ``r*100``, as Qwen's ``math_equal`` does); anything
    else is left to our verifier's symbolic policy (``grade.equivalent``).

Evaluation only (never the RL reward): the fallbacks and the tolerance accept
answers our reward would not.
"""

from __future__ import annotations

import math
import re

import sympy

from ada_jax.verifier import grade, nodes, parser
from ada_jax.verifier import normalize as an
from ada_jax.verifier import values as vv

REL_TOL = 1e-4
_LAST_NUMBER = re.compile(r'-?\d*\.?\d+')
_MAX_TAIL = 300  # characters read after "answer is"


def _sentence(text: str) -> str:
  text = text[:_MAX_TAIL].strip()
  return re.split(r'\.(?:\s|$)|\n', text, maxsplit=1)[0].strip().strip('$').strip()


def _boxed_tail(response: str) -> str | None:
  rest = response[response.rfind('boxed') + len('boxed') :]
  if not rest:
    return None
  if rest[0] != '{':
    return rest.split('$')[0].strip()
  depth = 0
  for i, c in enumerate(rest):
    if c == '{':
      depth += 1
    elif c == '}':
      depth -= 1
      if depth == 0:
        return rest[1:i]
  return None


def extract(response: str) -> str | None:
  """The answer Qwen2.5-Math's Minerva extraction reads from a response."""
  if 'final answer is $' in response and '$. I hope' in response:
    tail = response.split('final answer is $', 1)[1]
    return tail.split('$. I hope', 1)[0].strip() or None
  if 'boxed' in response:
    return _boxed_tail(response) or None
  for marker in ('he answer is', 'final answer is'):
    if marker in response:
      return _sentence(response.rsplit(marker, 1)[1]).lstrip(':').strip() or None
  numbers = _LAST_NUMBER.findall(response.replace(',', ''))
  return numbers[-1] if numbers else None


def _number(text: str) -> float | None:
  """A real, finite, symbol-free value of an answer, else None (guarded parse)."""
  norm = an.normalize(text)
  try:
    value = vv.to_value(parser.parse(norm.text))
  except (nodes.ParseError, nodes.GuardError):
    return None
  if not isinstance(value, vv.Scalar) or value.expr.free_symbols:
    return None
  try:
    number = complex(sympy.N(value.expr, 30))
  except (TypeError, ValueError, OverflowError):
    return None
  if number.imag or not math.isfinite(number.real):
    return None
  return number.real


def _equal(pred: str, reference: str) -> bool:
  ref = grade._ref_answer(reference)
  if an.normalize(pred).text.replace(' ', '') == an.normalize(ref).text.replace(
    ' ', ''
  ):
    return True
  p, r = _number(pred), _number(ref)
  if p is not None and r is not None:
    return any(math.isclose(p, r * f, rel_tol=REL_TOL) for f in (1.0, 0.01, 100.0))
  return grade._compare(pred, reference)


def equal(pred: str, reference: str) -> bool:
  """Qwen-style equality of an extracted answer and the reference. Never raises."""
  if not isinstance(pred, str) or not isinstance(reference, str):
    return False
  if len(pred) > an.MAX_BOX_CHARS:
    return False
  return grade._guarded(_equal, pred, reference)


def verify(response: str, reference: str) -> bool:
  """Extracts as Qwen2.5-Math does for Minerva, then ``equal``."""
  if not isinstance(response, str):
    return False
  pred = extract(response)
  return pred is not None and equal(pred, reference)
