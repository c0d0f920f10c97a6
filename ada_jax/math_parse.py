"""Hand-written LaTeX-to-sympy parser used by the answer verifier.

Model text is never handed to ``sympify``/``parse_expr``/``eval`` (they run
Python code). Instead this module tokenizes a normalised answer string, parses
it with a small recursive-descent grammar into a plain tuple AST, checks size,
depth and magnitude guards on that AST (in log space, without computing any
value), and only then builds sympy objects with ``evaluate=False`` and
evaluates them with ``doit()``.

AST nodes are tuples whose first element is the node kind:

  scalars:    num, sym, const, add, mul, frac, mixed, pow, fact, binom, abs,
              floor, ceil, root, func
  structures: list, set, tuple, pair, union, rel, matrix

``add`` holds ``(sign, term)`` pairs where sign is one of ``+ - pm mp``; a
``\\pm`` expands into two values (see ``has_pm``/``to_sympy(pm_sign=...)``).
"""

from __future__ import annotations

import math
from typing import Any

import sympy

# Guards. A trip raises GuardError and the answer scores False.
MAX_TOKENS = 500
MAX_DEPTH = 50
MAX_INT_DIGITS = 1000
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

Node = tuple[Any, ...]


class ParseError(Exception):
  """The answer is not in the supported grammar (scores False, never guessed)."""


class TextAnswerError(ParseError):
  """The answer contains words: the caller compares it as text."""


class GuardError(Exception):
  """The answer is too large, too deep or too big in magnitude to evaluate."""


_GREEK = frozenset(
  [
    'alpha',
    'beta',
    'gamma',
    'delta',
    'epsilon',
    'varepsilon',
    'zeta',
    'eta',
    'theta',
    'vartheta',
    'iota',
    'kappa',
    'lambda',
    'mu',
    'nu',
    'xi',
    'rho',
    'sigma',
    'tau',
    'upsilon',
    'phi',
    'varphi',
    'chi',
    'psi',
    'omega',
    'Gamma',
    'Delta',
    'Theta',
    'Lambda',
    'Xi',
    'Sigma',
    'Phi',
    'Psi',
    'Omega',
  ]
)
_FUNCS = frozenset(
  [
    'sin',
    'cos',
    'tan',
    'cot',
    'sec',
    'csc',
    'arcsin',
    'arccos',
    'arctan',
    'sinh',
    'cosh',
    'tanh',
    'ln',
    'log',
    'exp',
  ]
)
# Commands mapped to operator tokens.
_CMD_OPS = {
  'times': '*',
  'cdot': '*',
  'ast': '*',
  'div': '/',
  'le': '<=',
  'leq': '<=',
  'leqslant': '<=',
  'ge': '>=',
  'geq': '>=',
  'geqslant': '>=',
  'lt': '<',
  'gt': '>',
  'approx': '=',  # x \approx 3.14 states a value like x = 3.14
  'ne': '!=',
  'neq': '!=',
  'pm': 'pm',
  'mp': 'mp',
  'cup': 'cup',
  'in': 'in',
  'lbrace': '\\{',
  'rbrace': '\\}',
  'langle': '(',
  'rangle': ')',
  'vert': '|',
  'lvert': '|',
  'rvert': '|',
  'mid': '|',
}
_CMD_CONSTS = {
  'infty': 'oo',
  'pi': 'pi',
  'emptyset': 'empty',
  'varnothing': 'empty',
  'reals': 'reals',
}
_STRUCT_CMDS = frozenset(
  ['frac', 'sqrt', 'binom', 'lfloor', 'rfloor', 'lceil', 'rceil', 'begin', 'end']
)
# Two-letter words that make an answer text rather than a product (n*o).
_SHORT_WORDS = frozenset(['no', 'is', 'of', 'to', 'it', 'by', 'be', 'on'])
_SINGLE = set('+-*/^_!()[]{},|=<>;&')
_MATRIX_ENVS = frozenset(
  ['pmatrix', 'bmatrix', 'Bmatrix', 'matrix', 'smallmatrix', 'array']
)
_REL_OPS = frozenset(['=', '<', '>', '<=', '>=', '!=', 'in'])


def tokenize(text: str) -> list[tuple[str, str]]:
  """Splits a normalised answer into ``(kind, text)`` tokens.

  Kinds: num, letter (single letter or Greek name), const, cmd, word, op.
  Raises ParseError on unknown characters or commands, GuardError on size.
  """
  toks: list[tuple[str, str]] = []
  i, n = 0, len(text)
  while i < n:
    c = text[i]
    if c.isspace():
      i += 1
    elif (c.isascii() and c.isdigit()) or (
      c == '.' and i + 1 < n and text[i + 1].isdigit()
    ):
      j = i
      while j < n and text[j].isdigit():
        j += 1
      if j + 1 < n and text[j] == '.' and text[j + 1].isdigit():
        j += 1
        while j < n and text[j].isdigit():
          j += 1
      if j - i > MAX_INT_DIGITS:
        raise GuardError('literal too long')
      toks.append(('num', text[i:j]))
      i = j
    elif c.isascii() and c.isalpha():
      j = i
      while j < n and text[j].isascii() and text[j].isalpha():
        j += 1
      word = text[i:j]
      i = j
      if word in ('or', 'and'):
        toks.append(('op', ','))
      elif word in _FUNCS or word == 'sqrt':
        toks.append(('cmd', word))
      elif word == 'pi':
        toks.append(('const', 'pi'))
      elif word.lower() in _SHORT_WORDS:
        toks.append(('word', word))
      elif len(word) <= 2:
        toks.extend(('letter', ch) for ch in word)
      else:
        toks.append(('word', word))
    elif c == '\\':
      j = i + 1
      while j < n and text[j].isascii() and text[j].isalpha():
        j += 1
      if j == i + 1:
        nxt = text[i + 1 : i + 2]
        if nxt in ('{', '}'):
          toks.append(('op', '\\' + nxt))
        elif nxt == '\\':
          toks.append(('op', '\\\\'))
        elif nxt in (',', ';', ':', '!', ' ', ''):
          pass  # spacing commands the normaliser missed
        else:
          raise ParseError(f'unknown escape \\{nxt}')
        i += 2
        continue
      name = text[i + 1 : j]
      i = j
      if name in _CMD_OPS:
        toks.append(('op', _CMD_OPS[name]))
      elif name in _CMD_CONSTS:
        toks.append(('const', _CMD_CONSTS[name]))
      elif name in _GREEK:
        toks.append(('letter', name))
      elif name in _FUNCS or name in _STRUCT_CMDS:
        toks.append(('cmd', name))
      else:
        raise ParseError(f'unsupported command \\{name}')
    elif text.startswith(('<=', '>=', '!='), i):
      toks.append(('op', text[i : i + 2]))
      i += 2
    elif c in _SINGLE:
      toks.append(('op', c))
      i += 1
    else:
      raise ParseError(f'unexpected character {c!r}')
    if len(toks) > MAX_TOKENS:
      raise GuardError('too many tokens')
  return toks


class _Parser:
  """Recursive-descent parser over the token list (depth-guarded)."""

  def __init__(self, toks: list[tuple[str, str]]):
    self.toks = toks
    self.i = 0
    self.depth = 0

  def peek(self) -> tuple[str, str]:
    return self.toks[self.i] if self.i < len(self.toks) else ('end', '')

  def take(self) -> tuple[str, str]:
    tok = self.peek()
    if tok[0] == 'end':
      raise ParseError('unexpected end')
    self.i += 1
    return tok

  def is_op(self, *ops: str) -> bool:
    kind, text = self.peek()
    return kind == 'op' and text in ops

  def expect(self, op: str) -> None:
    if not self.is_op(op):
      raise ParseError(f'expected {op}, got {self.peek()[1]!r}')
    self.i += 1

  def enter(self) -> None:
    self.depth += 1
    if self.depth > MAX_DEPTH:
      raise GuardError('nesting too deep')

  def leave(self) -> None:
    self.depth -= 1

  def parse(self) -> Node:
    items = self.items()
    if self.peek()[0] != 'end':
      raise ParseError(f'unconsumed input at {self.peek()[1]!r}')
    return items[0] if len(items) == 1 else ('list', items)

  def items(self) -> list[Node]:
    out = [self.relation()]
    while self.is_op(',', ';'):
      self.i += 1
      out.append(self.relation())
    return out

  def relation(self) -> Node:
    parts, ops = [self.union()], []
    while self.peek()[0] == 'op' and self.peek()[1] in _REL_OPS:
      ops.append(self.take()[1])
      parts.append(self.union())
    return ('rel', parts, ops) if ops else parts[0]

  def union(self) -> Node:
    parts = [self.add()]
    while self.is_op('cup'):
      self.i += 1
      parts.append(self.add())
    return ('union', parts) if len(parts) > 1 else parts[0]

  def add(self) -> Node:
    self.enter()
    terms: list[tuple[str, Node]] = []
    sign = '+'
    if self.is_op('+', '-', 'pm', 'mp'):
      sign = self.take()[1]
    terms.append((sign, self.term()))
    while self.is_op('+', '-', 'pm', 'mp'):
      sign = self.take()[1]
      terms.append((sign, self.term()))
    self.leave()
    if len(terms) == 1 and terms[0][0] == '+':
      return terms[0][1]
    return ('add', terms)

  def starts_implicit(self) -> bool:
    kind, text = self.peek()
    if kind in ('letter', 'const'):
      return text not in ('empty', 'reals')
    if kind == 'cmd':
      return text not in ('rfloor', 'rceil', 'end')
    return kind == 'op' and text in ('(', '{')

  def term(self) -> Node:
    factors: list[tuple[str, Node]] = [('*', self.factor())]
    while True:
      if self.is_op('*', '/'):
        op = self.take()[1]
        factors.append((op, self.factor()))
      elif self.starts_implicit():
        nxt = self.factor()
        prev = factors[-1][1]
        if (
          len(factors) == 1
          and _is_int_literal(prev)
          and nxt[0] == 'frac'
          and _is_int_literal(nxt[1])
          and _is_int_literal(nxt[2])
        ):
          # A mixed number such as 2\frac{1}{2} (MATH writes these).
          factors[-1] = ('*', ('mixed', prev, nxt))
        else:
          factors.append(('*', nxt))
      else:
        break
    return factors[0][1] if len(factors) == 1 else ('mul', factors)

  def factor(self) -> Node:
    base = self.atom()
    while self.is_op('!'):
      self.i += 1
      base = ('fact', base)
    if self.is_op('^'):
      self.i += 1
      base = ('pow', base, self.script_arg())
      if self.is_op('^'):
        raise ParseError('double superscript')
      while self.is_op('!'):
        self.i += 1
        base = ('fact', base)
    return base

  def script_arg(self) -> Node:
    """Argument of ^, \\frac, \\sqrt, \\binom: a braced group or one token."""
    self.enter()
    try:
      if self.is_op('{'):
        self.i += 1
        node = self.add()
        self.expect('}')
        return node
      if self.is_op('-'):
        self.i += 1
        return ('add', [('-', self.script_arg())])
      kind, text = self.peek()
      if kind == 'num':
        # LaTeX reads one character: x^23 is x^2 * 3 and \frac12 is 1/2.
        if len(text) > 1:
          self.toks[self.i] = ('num', text[1:])
        else:
          self.i += 1
        return ('num', text[0])
      if kind in ('letter', 'const', 'cmd'):
        return self.atom()
      raise ParseError(f'bad argument {text!r}')
    finally:
      self.leave()

  def atom(self) -> Node:
    kind, text = self.take()
    if kind == 'num':
      return ('num', text)
    if kind == 'letter':
      name = text
      if self.is_op('_'):
        self.i += 1
        name = f'{name}_{self.subscript()}'
      elif text == 'e':
        return ('const', 'E')
      elif text == 'i':
        return ('const', 'I')
      return ('sym', name)
    if kind == 'const':
      return ('const', text)
    if kind == 'word':
      raise TextAnswerError(text)
    if kind == 'op':
      if text in ('(', '['):
        return self.group(text)
      if text == '\\{':
        if self.is_op('\\}'):
          self.i += 1
          return ('set', [])
        items = self.items()
        self.expect('\\}')
        return ('set', items)
      if text == '{':
        items = self.items()
        self.expect('}')
        return items[0] if len(items) == 1 else ('list', items)
      if text == '|':
        inner = self.add()
        self.expect('|')
        return ('abs', inner)
      raise ParseError(f'unexpected {text!r}')
    if kind == 'cmd':
      return self.command(text)
    raise ParseError(f'unexpected {text!r}')

  def subscript(self) -> str:
    kind, text = self.take()
    if kind in ('num', 'letter'):
      return text
    if kind == 'op' and text == '{':
      parts = []
      while not self.is_op('}'):
        k, t = self.take()
        if k not in ('num', 'letter', 'word'):
          raise ParseError('bad subscript')
        parts.append(t)
      self.i += 1
      return ''.join(parts)
    raise ParseError('bad subscript')

  def group(self, opener: str) -> Node:
    items = self.items()
    closer = self.take()
    if closer[0] != 'op' or closer[1] not in (')', ']'):
      raise ParseError('unclosed bracket')
    matched = (opener, closer[1]) in (('(', ')'), ('[', ']'))
    if len(items) == 1:
      if not matched:
        raise ParseError('half-open bracket around one item')
      return items[0]
    if len(items) == 2:
      return ('pair', items[0], items[1], opener, closer[1])
    if not matched:
      raise ParseError('mixed brackets around a tuple')
    return ('tuple', items, opener)

  def command(self, name: str) -> Node:
    if name == 'frac':
      return ('frac', self.script_arg(), self.script_arg())
    if name == 'binom':
      return ('binom', self.script_arg(), self.script_arg())
    if name == 'sqrt':
      index: Node = ('num', '2')
      if self.is_op('['):
        self.i += 1
        index = self.add()
        self.expect(']')
      return ('root', self.script_arg(), index)
    if name in ('lfloor', 'lceil'):
      inner = self.add()
      closer = self.take()
      if closer != ('cmd', 'r' + name[1:]):
        raise ParseError('unclosed floor/ceil')
      return ('floor' if name == 'lfloor' else 'ceil', inner)
    if name in _FUNCS:
      return self.function(name)
    if name == 'begin':
      return self.matrix()
    raise ParseError(f'unexpected \\{name}')

  def function(self, name: str) -> Node:
    self.enter()
    try:
      return self._function(name)
    finally:
      self.leave()

  def _function(self, name: str) -> Node:
    base = None
    if name == 'log' and self.is_op('_'):
      self.i += 1
      base = self.script_arg()
    power = None
    if self.is_op('^'):
      self.i += 1
      power = self.script_arg()
    if self.is_op('(', '{'):
      arg = self.atom()
    else:
      # \sin 2x means sin(2x): an implicit product of atoms, stopping at the
      # next function so that \sin x \cos x is a product of two calls.
      factors = [('*', self.factor())]
      while self.starts_implicit() and self.peek() != ('op', '('):
        if self.peek()[0] == 'cmd' and self.peek()[1] in _FUNCS:
          break
        factors.append(('*', self.factor()))
      arg = factors[0][1] if len(factors) == 1 else ('mul', factors)
    node: Node = ('func', name, arg, base)
    return ('pow', node, power) if power is not None else node

  def env_name(self) -> str:
    self.expect('{')
    parts = []
    while not self.is_op('}'):
      parts.append(self.take()[1])
    self.i += 1
    return ''.join(parts)

  def matrix(self) -> Node:
    env = self.env_name()
    if env not in _MATRIX_ENVS:
      raise ParseError(f'unsupported environment {env}')
    if env == 'array' and self.is_op('{'):
      self.env_name()  # column spec such as {cc}
    rows: list[list[Node]] = [[]]
    while True:
      if self.peek() == ('cmd', 'end'):
        self.i += 1
        if self.env_name() != env:
          raise ParseError('mismatched \\end')
        break
      rows[-1].append(self.add())
      if self.is_op('&'):
        self.i += 1
      elif self.is_op('\\\\'):
        self.i += 1
        if self.peek() != ('cmd', 'end'):
          rows.append([])
      elif self.peek() != ('cmd', 'end'):
        raise ParseError('bad matrix cell')
    if not rows[0] or any(len(r) != len(rows[0]) for r in rows):
      raise ParseError('ragged matrix')
    return ('matrix', rows)


def _is_int_literal(node: Node) -> bool:
  return node[0] == 'num' and '.' not in node[1]


def parse(text: str) -> Node:
  """Parses a normalised answer string into an AST and checks the guards.

  Raises:
    TextAnswerError: the answer contains words (compare as text).
    ParseError: not in the grammar, or unconsumed input.
    GuardError: a size, depth or magnitude guard tripped.
  """
  toks = tokenize(text)
  for k, (kind, word) in enumerate(toks):
    if kind == 'word' and not (
      k >= 2 and toks[k - 2] in (('cmd', 'begin'), ('cmd', 'end'))
    ):
      raise TextAnswerError(word)
  node = _Parser(toks).parse()
  check_guards(node)
  return node


# ---------------------------------------------------------------- guards


def check_guards(node: Node) -> None:
  """Raises GuardError unless every numeric part of ``node`` is small enough."""
  count = [0]
  _log_size(node, count)


def _log_size(node: Node, count: list[int]) -> float | None:
  """Upper bound on log10 of the exact value's size; None if symbolic."""
  count[0] += 1
  if count[0] > MAX_NODES:
    raise GuardError('too many nodes')
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
      raise GuardError('symbolic root index')
    k = _small_value(node[2], index)
    if not (float(k).is_integer() and 2 <= k <= MAX_ROOT_INDEX):
      raise GuardError('bad root index')
    if arg is not None and arg > MAX_FUNC_ARG_LOG10:
      raise GuardError('root of a huge number')
    return arg
  if kind == 'func':
    arg = _log_size(node[2], count)
    if node[3] is not None and _log_size(node[3], count) is None:
      return None
    if arg is None:
      return None
    if arg > MAX_FUNC_ARG_LOG10:
      raise GuardError('function of a huge number')
    if node[1] == 'exp':
      return _bounded(abs(_small_value(node[2], arg)) / math.log(10) + 1)
    return arg + 1
  # Structures: check every child, no numeric size of their own.
  for child in _children(node):
    _log_size(child, count)
  return None


def _children(node: Node) -> list[Node]:
  kind = node[0]
  if kind in ('list', 'set', 'tuple', 'union'):
    return list(node[1])
  if kind == 'pair':
    return [node[1], node[2]]
  if kind == 'rel':
    return list(node[1])
  if kind == 'matrix':
    return [cell for row in node[1] for cell in row]
  raise ParseError(f'unknown node {kind}')


def _sum_sizes(sizes: list[float | None]) -> float | None:
  if any(s is None for s in sizes):
    return None
  return _bounded(sum(sizes) + 1)  # type: ignore[arg-type]


def _bounded(size: float) -> float:
  if not size <= MAX_LOG10:
    raise GuardError('number too large')
  return size


def _small_value(node: Node, size: float) -> float:
  """Float value of a numeric node already known to be small (|v| <= 1e7)."""
  if size > 8:
    raise GuardError('exponent or argument too large')
  if node[0] == 'num':
    return float(node[1])  # the common case (x^2, 5!), without sympy
  value = to_sympy(node)
  if value.free_symbols:
    raise GuardError('unexpected symbol')
  try:
    result = complex(value.evalf(15))
  except (TypeError, ValueError) as err:
    raise GuardError('non-numeric') from err
  magnitude = abs(result)
  if not math.isfinite(magnitude) or magnitude > 1e7:
    raise GuardError('exponent or argument too large')
  return result.real if result.imag == 0 else magnitude


def _pow_size(node: Node, count: list[int]) -> float | None:
  base = _log_size(node[1], count)
  exponent = _log_size(node[2], count)
  if exponent is None:
    return None  # symbolic exponent: the probes evaluate it in floating point
  e = abs(_small_value(node[2], exponent))
  if base is None:
    if e > MAX_SYMBOLIC_EXPONENT:
      raise GuardError('exponent too large for a symbolic base')
    return None
  return _bounded(e * base + 1)


# ---------------------------------------------------------------- building


def has_pm(node: Node) -> bool:
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


def to_sympy(node: Node, pm_sign: int = 1) -> sympy.Expr:
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
      raise ParseError('not a scalar')
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
  raise ParseError('not a scalar')


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


def _function(node: Node, pm_sign: int) -> sympy.Expr:
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


def evaluate(node: Node, pm_sign: int = 1) -> sympy.Expr:
  """Builds and evaluates a guarded scalar AST."""
  return to_sympy(node, pm_sign).doit()
