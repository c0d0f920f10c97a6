"""The tuple AST that the math-answer parser produces, and the pipeline's errors.

The answer verifier turns model text into sympy in stages: ``lexer``
(tokens), ``parser`` (this AST), ``guards`` (size checks in log space)
and ``build`` (sympy objects with ``evaluate=False``). This module holds
what the stages share: the node format and the three errors they raise.

AST nodes are tuples whose first element is the node kind:

  scalars:    num, sym, const, add, mul, frac, mixed, pow, fact, binom, abs,
              floor, ceil, root, func, sum (``('sum', var, lo, hi, body)``)
  structures: list, set, tuple, pair, union, setminus, rel, ratio, matrix (a matrix
              may also stand inside add/mul/frac/pow: matrix arithmetic)

``add`` holds ``(sign, term)`` pairs where sign is one of ``+ - pm mp``; a
``\\pm`` expands into two values (see ``build.has_pm`` and
``build.to_sympy(pm_sign=...)``).
"""

from __future__ import annotations

from typing import Any

Node = tuple[Any, ...]


class ParseError(Exception):
  """The answer is not in the supported grammar (scores False, never guessed)."""


class TextAnswerError(ParseError):
  """The answer contains words: the caller compares it as text."""


class GuardError(Exception):
  """The answer is too large, too deep or too big in magnitude to evaluate."""
