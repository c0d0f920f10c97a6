"""Builds sympy objects from a guarded math-answer AST, without evaluating text.

``to_sympy`` maps each scalar node of the ``nodes`` tuple tree to the
matching sympy constructor with ``evaluate=False`` (no string ever reaches
sympy), applying the answer conventions: ``\\log`` without a base is base 10,
an odd root of a negative number is real (``\\sqrt[3]{-8}`` = -2), and a
``\\pm`` picks one branch per call, ``\\sum`` is a sympy ``Sum``. ``evaluate``
then runs ``doit()`` and ``evaluate_matrix`` does matrix arithmetic; call them
only on ASTs that passed ``guards.check_guards``.
"""

from __future__ import annotations

import sympy

from ada_jax.verifier import nodes


def has_pm(node: nodes.Node) -> bool:
  """Whether the scalar AST contains a \\pm or \\mp sign."""
  kind = node[0]
  if kind in ('num', 'sym', 'const'):
    return False
  if kind in ('add', 'mul'):
    return any(sign in ('pm', 'mp') or has_pm(child) for sign, child in node[1])
  if kind == 'func':
    return has_pm(node[2]) or (node[3] is not None and has_pm(node[3]))
  return any(has_pm(c) for c in node[1:] if isinstance(c, tuple))


_SYMPY_FUNCS = {
  'sin': sympy.sin,
  'cos': sympy.cos,
  'tan': sympy.tan,
  'cot': sympy.cot,
  'sec': sympy.sec,
  'csc': sympy.csc,
  'arcsin': sympy.asin,
  'arccos': sympy.acos,
  'arctan': sympy.atan,
  'sinh': sympy.sinh,
  'cosh': sympy.cosh,
  'tanh': sympy.tanh,
  'exp': sympy.exp,
  'ln': sympy.log,
}
_CONSTS = {'pi': sympy.pi, 'E': sympy.E, 'I': sympy.I, 'oo': sympy.oo}


def to_sympy(node: nodes.Node, pm_sign: int = 1) -> sympy.Expr:
  """Builds the (unevaluated, evaluate=False) sympy tree of a scalar AST.

  Only call on guarded ASTs. ``pm_sign`` picks the branch of a \\pm.
  Raises ParseError for structures (sets, tuples, ...).
  """
  kind = node[0]
  if kind == 'num':
    text = node[1]
    if '.' in text:
      whole, frac = text.split('.')
      return sympy.Rational(int(whole + frac), 10 ** len(frac))
    return sympy.Integer(int(text))
  if kind == 'sym':
    return sympy.Symbol(node[1])
  if kind == 'const':
    if node[1] not in _CONSTS:
      raise nodes.ParseError('not a scalar')
    return _CONSTS[node[1]]
  if kind == 'add':
    terms = []
    for sign, child in node[1]:
      value = to_sympy(child, pm_sign)
      negative = (
        sign == '-' or (sign == 'pm' and pm_sign < 0) or (sign == 'mp' and pm_sign > 0)
      )
      terms.append(sympy.Mul(-1, value, evaluate=False) if negative else value)
    return terms[0] if len(terms) == 1 else sympy.Add(*terms, evaluate=False)
  if kind == 'mul':
    factors = []
    for op, child in node[1]:
      value = to_sympy(child, pm_sign)
      factors.append(sympy.Pow(value, -1, evaluate=False) if op == '/' else value)
    return sympy.Mul(*factors, evaluate=False)
  if kind == 'frac':
    num, den = to_sympy(node[1], pm_sign), to_sympy(node[2], pm_sign)
    return sympy.Mul(num, sympy.Pow(den, -1, evaluate=False), evaluate=False)
  if kind == 'mixed':
    return sympy.Add(to_sympy(node[1]), to_sympy(node[2]), evaluate=False)
  if kind == 'pow':
    return sympy.Pow(
      to_sympy(node[1], pm_sign), to_sympy(node[2], pm_sign), evaluate=False
    )
  if kind == 'fact':
    return sympy.factorial(to_sympy(node[1], pm_sign), evaluate=False)
  if kind == 'binom':
    return sympy.binomial(
      to_sympy(node[1], pm_sign), to_sympy(node[2], pm_sign), evaluate=False
    )
  if kind == 'abs':
    return sympy.Abs(to_sympy(node[1], pm_sign), evaluate=False)
  if kind == 'floor':
    return sympy.floor(to_sympy(node[1], pm_sign), evaluate=False)
  if kind == 'ceil':
    return sympy.ceiling(to_sympy(node[1], pm_sign), evaluate=False)
  if kind == 'root':
    return _root(to_sympy(node[1], pm_sign), to_sympy(node[2], pm_sign))
  if kind == 'func':
    return _function(node, pm_sign)
  if kind == 'sum':
    index = sympy.Symbol(node[1])
    return sympy.Sum(
      to_sympy(node[4], pm_sign),
      (index, to_sympy(node[2], pm_sign), to_sympy(node[3], pm_sign)),
    )
  raise nodes.ParseError('not a scalar')


def _root(arg: sympy.Expr, index: sympy.Expr) -> sympy.Expr:
  inv = sympy.Pow(index, -1, evaluate=False)
  if index != 2 and not arg.free_symbols and index.is_odd:
    # \sqrt[3]{-8} is -2 in a math answer, not sympy's complex principal root.
    return sympy.Mul(
      sympy.sign(arg, evaluate=False),
      sympy.Pow(sympy.Abs(arg, evaluate=False), inv, evaluate=False),
      evaluate=False,
    )
  return sympy.Pow(arg, inv, evaluate=False)


def _function(node: nodes.Node, pm_sign: int) -> sympy.Expr:
  name, arg = node[1], to_sympy(node[2], pm_sign)
  if name == 'log':
    # Competition convention: \log without a base is base 10.
    base = to_sympy(node[3], pm_sign) if node[3] is not None else sympy.Integer(10)
    return sympy.Mul(
      sympy.log(arg, evaluate=False),
      sympy.Pow(sympy.log(base, evaluate=False), -1, evaluate=False),
      evaluate=False,
    )
  return _SYMPY_FUNCS[name](arg, evaluate=False)


def evaluate(node: nodes.Node, pm_sign: int = 1) -> sympy.Expr:
  """Builds and evaluates a guarded scalar AST.

  A ``\\sum`` without a closed form is a ParseError: sympy's numeric
  summation of what remains has no time bound.
  """
  value = to_sympy(node, pm_sign).doit()
  if isinstance(value, sympy.Basic) and value.has(sympy.Sum):
    raise nodes.ParseError('a sum without a closed form')
  return value


MAX_MATRIX_POWER = 20  # M^k: k an integer literal 1..20
MAX_MATRIX_POWER_SIZE = 4  # ... of a rational matrix with at most 4 rows


def has_matrix(node: nodes.Node) -> bool:
  """Whether a scalar-shaped AST (add, mul, frac, pow) holds a matrix."""
  kind = node[0]
  if kind == 'matrix':
    return True
  if kind in ('add', 'mul'):
    return any(has_matrix(child) for _, child in node[1])
  if kind in ('frac', 'pow'):
    return has_matrix(node[1]) or has_matrix(node[2])
  return False


def evaluate_matrix(node: nodes.Node) -> sympy.Expr | sympy.ImmutableMatrix:
  """Evaluates matrix arithmetic: sums, scalar and matrix products, powers.

  Division only by a scalar; ``^T`` transposes; other powers only of a
  rational square matrix of at most 4 rows by an integer literal 1..20. A
  shape mismatch (or any other operation on a matrix) is a ParseError.
  """
  kind = node[0]
  if not has_matrix(node):
    return evaluate(node)
  try:
    if kind == 'matrix':
      return sympy.ImmutableMatrix([[evaluate(c) for c in row] for row in node[1]])
    if kind == 'add':
      total = None
      for sign, child in node[1]:
        if sign not in ('+', '-'):
          raise nodes.ParseError('\\pm of a matrix')
        value = evaluate_matrix(child)
        value = -value if sign == '-' else value
        total = value if total is None else total + value
      return total
    if kind == 'mul':
      product = None
      for op, child in node[1]:
        value = evaluate_matrix(child)
        if op == '/':
          if isinstance(value, sympy.MatrixBase):
            raise nodes.ParseError('division by a matrix')
          value = 1 / value
        product = value if product is None else product * value
      return product
    if kind == 'frac':
      den = evaluate_matrix(node[2])
      if isinstance(den, sympy.MatrixBase):
        raise nodes.ParseError('division by a matrix')
      return evaluate_matrix(node[1]) / den
    if kind == 'pow':
      exponent = node[2]
      if exponent == ('sym', 'T'):  # M^T, M^{T}: the transpose
        base = evaluate_matrix(node[1])
        if not isinstance(base, sympy.MatrixBase):
          raise nodes.ParseError('transpose of a scalar')
        return base.T
      if exponent[0] != 'num' or not 1 <= int(exponent[1]) <= MAX_MATRIX_POWER:
        raise nodes.ParseError('matrix power')
      base = evaluate_matrix(node[1])
      if not isinstance(base, sympy.MatrixBase) or base.free_symbols:
        raise nodes.ParseError('power of a symbolic matrix')
      if base.rows > MAX_MATRIX_POWER_SIZE or not all(e.is_Rational for e in base):
        raise nodes.ParseError('power of a large or irrational matrix')
      return base ** int(exponent[1])
  except (sympy.ShapeError, sympy.NonSquareMatrixError, TypeError, ValueError) as err:
    raise nodes.ParseError(f'matrix arithmetic: {err}') from err
  raise nodes.ParseError('matrix operand')
