"""Size and magnitude guards on a parsed answer, checked in log space.

Runs on the tuple AST from ``parser`` (the lexer and parser guard token
count and nesting depth) before any sympy value is built or evaluated: a node
count cap, then an upper bound on log10 of every exact numeric intermediate
(numerators and denominators, powers, factorials, binomials, ``exp``, finite
``\\sum`` terms), so power towers, ``10000!`` and ``10^{-10^{10}}`` trip a
GuardError instead of hanging the verifier. An exponent or factorial
argument is itself evaluated only once its bound is at most 8 digits
(``_small_value``).
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
# A finite \sum with numeric bounds has at most this many terms.
MAX_SUM_TERMS = 200


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
  if kind == 'sum':
    return _sum_size(node, count)
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
  if kind in ('pair', 'setminus'):
    return [node[1], node[2]]
  if kind in ('rel', 'ratio'):
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


def _substitute(node: object, name: str, value: nodes.Node) -> object:
  """``node`` with every ``('sym', name)`` replaced by ``value``."""
  if node == ('sym', name):
    return value
  if isinstance(node, tuple):
    return tuple(_substitute(c, name, value) for c in node)
  if isinstance(node, list):
    return [_substitute(c, name, value) for c in node]
  return node


_SYMBOLIC_SUM_BANNED = ('func', 'fact', 'binom', 'floor', 'ceil', 'abs', 'root')


def _has_kind(node: object, kind: str) -> bool:
  if isinstance(node, tuple):
    return (bool(node) and node[0] == kind) or any(_has_kind(c, kind) for c in node)
  if isinstance(node, list):
    return any(_has_kind(c, kind) for c in node)
  return False


def _linear_coefficient(node: nodes.Node, var: str) -> tuple[int, int] | None:
  """(a, c) of ``a k + c`` (a <= 4, |c| <= 10 integers, ``k`` the index)."""
  index = ('sym', var)

  def small(term: nodes.Node, limit: int) -> bool:
    return term[0] == 'num' and term[1].isdigit() and int(term[1]) <= limit

  def coefficient(term: nodes.Node) -> int | None:
    if term == index:
      return 1
    if (
      term[0] == 'mul'
      and len(term[1]) == 2
      and term[1][0][0] == term[1][1][0] == '*'
      and small(term[1][0][1], 4)
      and term[1][1][1] == index
    ):
      return int(term[1][0][1][1])
    return None

  if coefficient(node) is not None:
    return coefficient(node), 0
  if node[0] != 'add' or len(node[1]) != 2:
    return None
  (s1, t1), (s2, t2) = node[1]
  if s1 != '+' or s2 not in ('+', '-'):
    return None
  if small(t2, 10) and coefficient(t1) is not None:
    return coefficient(t1), int(t2[1]) * (1 if s2 == '+' else -1)
  return None


def _telescoping(body: nodes.Node, var: str) -> bool:
  """A body ``c / k^p`` (p <= 4) or ``c / ((a k + b)(a k + d))``, a | d - b.

  Sympy sums these fast (zeta values, telescoping); anything else with the
  index in a denominator is refused by ``_index_use``.
  """
  index = ('sym', var)
  if body[0] != 'frac' or _has_kind_node(body[1], index):
    return False
  den = body[2]
  if den[0] == 'pow':
    exponent = den[2]
    return (
      den[1] == index
      and exponent[0] == 'num'
      and exponent[1].isdigit()
      and 1 <= int(exponent[1]) <= 4
    )
  if den[0] == 'mul' and len(den[1]) == 2 and all(op == '*' for op, _ in den[1]):
    f, g = (_linear_coefficient(x, var) for _, x in den[1])
    # Telescoping: the same coefficient, offsets a multiple of it apart.
    return (
      f is not None and g is not None and f[0] == g[0] and (f[1] - g[1]) % f[0] == 0
    )
  return False


def _index_use(node: nodes.Node, var: str) -> tuple[bool, bool]:
  """(index in a base or a plain term, index in an exponent) of a sum's body.

  Raises GuardError for an index in a denominator or under a power that is
  not an integer literal up to 10.
  """
  index = ('sym', var)
  if not _has_kind_node(node, index):
    return False, False
  kind = node[0]
  if node == index:
    return True, False
  if kind == 'pow':
    if _has_kind_node(node[2], index):
      if _has_kind_node(node[1], index):
        raise nodes.GuardError('index in a base and its exponent')
      return False, True
    exponent = node[2]
    if exponent[0] != 'num' or not exponent[1].isdigit() or int(exponent[1]) > 10:
      raise nodes.GuardError('symbolic sum: a large power of the index')
    return _index_use(node[1], var)
  if kind == 'frac':
    den = node[2]
    if _has_kind_node(den, index) and (
      den[0] != 'pow' or _has_kind_node(den[1], index)
    ):
      raise nodes.GuardError('symbolic sum: index in a denominator')
    uses = [_index_use(node[1], var), _index_use(den, var)]
  elif kind in ('add', 'mul'):
    if kind == 'mul' and any(
      op == '/' and _has_kind_node(c, index) and c[0] != 'pow' for op, c in node[1]
    ):
      raise nodes.GuardError('symbolic sum: index in a denominator')
    uses = [_index_use(c, var) for _, c in node[1]]
  else:
    raise nodes.GuardError('symbolic sum of a hard body')
  return any(u[0] for u in uses), any(u[1] for u in uses)


def _has_kind_node(node: object, target: nodes.Node) -> bool:
  if node == target:
    return True
  if isinstance(node, (tuple, list)):
    return any(_has_kind_node(c, target) for c in node)
  return False


def _sum_size(node: nodes.Node, count: list[int]) -> float | None:
  """A finite numeric sum: at most 200 terms, each bounded at the largest index.

  The body is sized with the index replaced by the bound of largest
  magnitude. Symbolic or infinite bounds (``\\sum_{k=1}^{n}``) take only a
  polynomial or geometric body (``_index_use``) or a telescoping fraction
  (``_telescoping``); no nested sums.
  """
  _, var, lower, upper, body = node
  lo, hi = _log_size(lower, count), _log_size(upper, count)
  body_size = _log_size(body, count)
  if _has_kind(body, 'sum'):
    raise nodes.GuardError('nested sum')
  if lo is None or hi is None or upper == ('const', 'oo'):
    if lo is not None:
      _small_value(lower, lo)
    # Only closed forms sympy finds fast: a polynomial in the index (powers
    # <= 10, never divided by it) or a geometric term (the index only in
    # exponents), and a small body (<= 100 digits at index 10).
    if any(_has_kind(body, k) for k in _SYMBOLIC_SUM_BANNED):
      raise nodes.GuardError('symbolic sum of a hard body')
    if _telescoping(body, var):
      return None
    in_base, in_exponent = _index_use(body, var)
    if in_base and in_exponent:
      raise nodes.GuardError('symbolic sum of a mixed body')
    ten = _substitute(body, var, ('num', '10'))
    at_ten = _log_size(ten, count)  # type: ignore[arg-type]
    if at_ten is not None and at_ten > 100:
      raise nodes.GuardError('symbolic sum of a large body')
    return None
  lo_v, hi_v = _small_value(lower, lo), _small_value(upper, hi)
  if not (float(lo_v).is_integer() and float(hi_v).is_integer()):
    raise nodes.GuardError('non-integer summation bounds')
  terms = int(hi_v) - int(lo_v) + 1
  if terms > MAX_SUM_TERMS:
    raise nodes.GuardError('too many summation terms')
  if terms <= 0:
    return 1.0
  big = ('num', str(int(max(abs(lo_v), abs(hi_v), 1))))
  size = _log_size(_substitute(body, var, big), count)  # type: ignore[arg-type]
  if size is None:
    return body_size
  return _bounded(size * terms + 1)  # a sum of fractions: the lcm grows


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
