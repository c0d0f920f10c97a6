"""Size and magnitude guards on a parsed answer, checked in log space.

Runs on the tuple AST from ``parser`` (the lexer and parser guard token
count and nesting depth) before any sympy value is built or evaluated: a node
count cap, then an upper bound on log10 of every exact numeric intermediate
(numerators and denominators, powers, factorials, binomials, ``exp``), so
power towers, ``10000!`` and ``10^{-10^{10}}`` trip a GuardError instead of
hanging the verifier. An exponent or factorial argument is itself evaluated
only once its bound is at most 8 digits (``_small_value``).
"""

from __future__ import annotations

import math

from ada_jax.verifier import build, nodes

# Guards. A trip raises GuardError and the answer scores False.
MAX_NODES = 2000
# Bound on log10 of any exact numeric value (numerator and denominator): legit
# answers like 2^{100} or 1/2006! stay far below; towers and 10^{-10^{10}} trip.
MAX_LOG10 = 10_000.0
# A symbolic base may carry at most this exponent (probing and expand stay cheap).
MAX_SYMBOLIC_EXPONENT = 1000
# Function arguments (sin, log, roots) above this many digits need huge
# precision or factoring; no real answer has them.
MAX_FUNC_ARG_LOG10 = 300.0
MAX_ROOT_INDEX = 100


def check_guards(node: nodes.Node) -> None:
  """Raises GuardError unless every numeric part of ``node`` is small enough."""
  count = [0]
  _log_size(node, count)


def _log_size(node: nodes.Node, count: list[int]) -> float | None:
  """Upper bound on log10 of the exact value's size; None if symbolic."""
  count[0] += 1
  if count[0] > MAX_NODES:
    raise nodes.GuardError('too many nodes')
  kind = node[0]
  if kind == 'num':
    digits = node[1].replace('.', '').lstrip('0')
    return max(len(digits), 1) + (len(node[1].split('.')[1]) if '.' in node[1] else 0)
  if kind == 'sym':
    return None
  if kind == 'const':
    return 1.0
  if kind in ('abs', 'floor', 'ceil'):
    return _log_size(node[1], count)
  if kind in ('add', 'mul'):
    sizes = [_log_size(child, count) for _, child in node[1]]
    return _sum_sizes(sizes)
  if kind in ('frac', 'mixed'):
    return _sum_sizes([_log_size(node[1], count), _log_size(node[2], count)])
  if kind == 'pow':
    return _pow_size(node, count)
  if kind == 'fact':
    arg = _log_size(node[1], count)
    if arg is None:
      return None
    n = _small_value(node[1], arg)
    size = math.lgamma(abs(n) + 1) / math.log(10) if abs(n) < 1e7 else math.inf
    return _bounded(size + 1)
  if kind == 'binom':
    top, bottom = _log_size(node[1], count), _log_size(node[2], count)
    if top is None or bottom is None:
      return None
    n = abs(_small_value(node[1], top))
    return _bounded(n * math.log10(2) + 1)
  if kind == 'root':
    arg, index = _log_size(node[1], count), _log_size(node[2], count)
    if index is None:
      raise nodes.GuardError('symbolic root index')
    k = _small_value(node[2], index)
    if not (float(k).is_integer() and 2 <= k <= MAX_ROOT_INDEX):
      raise nodes.GuardError('bad root index')
    if arg is not None and arg > MAX_FUNC_ARG_LOG10:
      raise nodes.GuardError('root of a huge number')
    return arg
  if kind == 'func':
    arg = _log_size(node[2], count)
    if node[3] is not None and _log_size(node[3], count) is None:
      return None
    if arg is None:
      return None
    if arg > MAX_FUNC_ARG_LOG10:
      raise nodes.GuardError('function of a huge number')
    if node[1] == 'exp':
      return _bounded(abs(_small_value(node[2], arg)) / math.log(10) + 1)
    return arg + 1
  # Structures: check every child, no numeric size of their own.
  for child in _children(node):
    _log_size(child, count)
  return None


def _children(node: nodes.Node) -> list[nodes.Node]:
  kind = node[0]
  if kind in ('list', 'set', 'tuple', 'union'):
    return list(node[1])
  if kind == 'pair':
    return [node[1], node[2]]
  if kind == 'rel':
    return list(node[1])
  if kind == 'matrix':
    return [cell for row in node[1] for cell in row]
  raise nodes.ParseError(f'unknown node {kind}')


def _sum_sizes(sizes: list[float | None]) -> float | None:
  if any(s is None for s in sizes):
    return None
  return _bounded(sum(sizes) + 1)  # type: ignore[arg-type]


def _bounded(size: float) -> float:
  if not size <= MAX_LOG10:
    raise nodes.GuardError('number too large')
  return size


def _small_value(node: nodes.Node, size: float) -> float:
  """Float value of a numeric node already known to be small (|v| <= 1e7)."""
  if size > 8:
    raise nodes.GuardError('exponent or argument too large')
  if node[0] == 'num':
    return float(node[1])  # the common case (x^2, 5!), without sympy
  value = build.to_sympy(node)
  if value.free_symbols:
    raise nodes.GuardError('unexpected symbol')
  try:
    result = complex(value.evalf(15))
  except (TypeError, ValueError) as err:
    raise nodes.GuardError('non-numeric') from err
  magnitude = abs(result)
  if not math.isfinite(magnitude) or magnitude > 1e7:
    raise nodes.GuardError('exponent or argument too large')
  return result.real if result.imag == 0 else magnitude


def _pow_size(node: nodes.Node, count: list[int]) -> float | None:
  base = _log_size(node[1], count)
  exponent = _log_size(node[2], count)
  if exponent is None:
    return None  # symbolic exponent: the probes evaluate it in floating point
  e = abs(_small_value(node[2], exponent))
  if base is None:
    if e > MAX_SYMBOLIC_EXPONENT:
      raise nodes.GuardError('exponent too large for a symbolic base')
    return None
  return _bounded(e * base + 1)
