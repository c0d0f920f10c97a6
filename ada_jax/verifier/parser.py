"""Recursive-descent parser from a normalised math answer to a tuple AST.

Model text is never handed to ``sympify``/``parse_expr``/``eval`` (they run
Python code). ``parse`` tokenizes the answer (``lexer``), parses it with a
small depth-guarded grammar into the plain tuple AST described in
``nodes``, and checks the size and magnitude guards (``guards``)
before anything is evaluated; ``build`` then turns a guarded AST into
sympy objects with ``evaluate=False``.

Grammar, loosest binding first: items (``,`` ``;``), relation (``= < <= > >=
!= \\in \\approx``), ratio (``a : b``), union (``\\cup``, ``\\setminus``), sum (``+ - \\pm
\\mp``), product (``* /`` and juxtaposition, with ``2\\frac{1}{2}`` a mixed
number), power and factorial, atoms (numbers, symbols, constants, brackets,
``\\{...\\}``, ``|x|``, ``\\frac``, ``\\sqrt``, ``\\binom``, floor/ceil,
functions, matrices, ``\\sum_{k=a}^{b}`` over the product that follows).
"""

from __future__ import annotations

from ada_jax.verifier import guards, lexer, nodes

MAX_DEPTH = 50  # guard: deeper nesting raises GuardError

_MATRIX_ENVS = frozenset(
  ['pmatrix', 'bmatrix', 'Bmatrix', 'matrix', 'smallmatrix', 'array']
)
_REL_OPS = frozenset(['=', '<', '>', '<=', '>=', '!=', 'in', '~='])


class _Parser:
  """Recursive-descent parser over the token list (depth-guarded)."""

  def __init__(self, toks: list[tuple[str, str]]):
    self.toks = toks
    self.i = 0
    self.depth = 0
    self.bound: set[str] = set()  # summation indices (i, e are not constants)

  def peek(self) -> tuple[str, str]:
    return self.toks[self.i] if self.i < len(self.toks) else ('end', '')

  def take(self) -> tuple[str, str]:
    tok = self.peek()
    if tok[0] == 'end':
      raise nodes.ParseError('unexpected end')
    self.i += 1
    return tok

  def is_op(self, *ops: str) -> bool:
    kind, text = self.peek()
    return kind == 'op' and text in ops

  def expect(self, op: str) -> None:
    if not self.is_op(op):
      raise nodes.ParseError(f'expected {op}, got {self.peek()[1]!r}')
    self.i += 1

  def enter(self) -> None:
    self.depth += 1
    if self.depth > MAX_DEPTH:
      raise nodes.GuardError('nesting too deep')

  def leave(self) -> None:
    self.depth -= 1

  def parse(self) -> nodes.Node:
    items = self.items()
    if self.peek()[0] != 'end':
      raise nodes.ParseError(f'unconsumed input at {self.peek()[1]!r}')
    return items[0] if len(items) == 1 else ('list', items)

  def items(self) -> list[nodes.Node]:
    groups = [[self.relation()]]
    while self.is_op(',', ';'):
      if self.take()[1] == ';':
        groups.append([])
      groups[-1].append(self.relation())
    if len(groups) > 1 and len({len(g) for g in groups}) == 1 and len(groups[0]) > 1:
      # a=1, b=4; a=3, b=2: semicolons between solutions of equal length.
      return [('list', g) for g in groups]
    return [item for g in groups for item in g]

  def relation(self) -> nodes.Node:
    parts, ops = [self.ratio()], []
    while self.peek()[0] == 'op' and self.peek()[1] in _REL_OPS:
      ops.append(self.take()[1])
      parts.append(self.ratio())
    return ('rel', parts, ops) if ops else parts[0]

  def ratio(self) -> nodes.Node:
    parts = [self.union()]
    while self.is_op(':'):
      self.i += 1
      parts.append(self.union())
    return ('ratio', parts) if len(parts) > 1 else parts[0]

  def union(self) -> nodes.Node:
    parts = [self.add()]
    while self.is_op('cup', 'setminus'):
      op = self.take()[1]
      rhs = self.add()
      if op == 'cup':
        parts.append(rhs)
      else:  # A \setminus B, left to right
        left = ('union', parts) if len(parts) > 1 else parts[0]
        parts = [('setminus', left, rhs)]
    return ('union', parts) if len(parts) > 1 else parts[0]

  def add(self) -> nodes.Node:
    self.enter()
    terms: list[tuple[str, nodes.Node]] = []
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

  def term(self) -> nodes.Node:
    factors: list[tuple[str, nodes.Node]] = [('*', self.factor())]
    while True:
      if self.is_op('*', '/'):
        op = self.take()[1]
        factors.append((op, self.factor()))
      elif self.starts_implicit() or (
        self.peek()[0] == 'num' and _has_symbol(factors[-1][1])
      ):
        # n 2^{n-1} is a product; 12 40 (two numbers) never is.
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

  def factor(self) -> nodes.Node:
    base = self.atom()
    while self.is_op('!'):
      self.i += 1
      base = ('fact', base)
    if self.is_op('^'):
      self.i += 1
      base = ('pow', base, self.script_arg())
      if self.is_op('^'):
        raise nodes.ParseError('double superscript')
      while self.is_op('!'):
        self.i += 1
        base = ('fact', base)
    return base

  def script_arg(self) -> nodes.Node:
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
      raise nodes.ParseError(f'bad argument {text!r}')
    finally:
      self.leave()

  def atom(self) -> nodes.Node:
    kind, text = self.take()
    if kind == 'num':
      return ('num', text)
    if kind == 'letter':
      name = text
      if self.is_op('_'):
        self.i += 1
        name = f'{name}_{self.subscript()}'
      elif text in self.bound:
        return ('sym', name)
      elif text == 'e':
        return ('const', 'E')
      elif text == 'i':
        return ('const', 'I')
      return ('sym', name)
    if kind == 'const':
      return ('const', text)
    if kind == 'word':
      raise nodes.TextAnswerError(text)
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
      raise nodes.ParseError(f'unexpected {text!r}')
    if kind == 'cmd':
      return self.command(text)
    raise nodes.ParseError(f'unexpected {text!r}')

  def subscript(self) -> str:
    kind, text = self.take()
    if kind in ('num', 'letter'):
      return text
    if kind == 'op' and text == '{':
      parts = []
      while not self.is_op('}'):
        k, t = self.take()
        if k not in ('num', 'letter', 'word') and (k, t) not in (
          ('op', '+'),
          ('op', '-'),
        ):
          raise nodes.ParseError('bad subscript')
        parts.append(t)  # a_{n-1}, S_{ABC}: one name
      self.i += 1
      return ''.join(parts)
    raise nodes.ParseError('bad subscript')

  def group(self, opener: str) -> nodes.Node:
    items = self.items()
    closer = self.take()
    if closer[0] != 'op' or closer[1] not in (')', ']'):
      raise nodes.ParseError('unclosed bracket')
    matched = (opener, closer[1]) in (('(', ')'), ('[', ']'))
    if len(items) == 1:
      if not matched:
        raise nodes.ParseError('half-open bracket around one item')
      return items[0]
    if len(items) == 2:
      return ('pair', items[0], items[1], opener, closer[1])
    if not matched:
      raise nodes.ParseError('mixed brackets around a tuple')
    return ('tuple', items, opener)

  def command(self, name: str) -> nodes.Node:
    if name == 'frac':
      return ('frac', self.script_arg(), self.script_arg())
    if name == 'binom':
      return ('binom', self.script_arg(), self.script_arg())
    if name == 'sqrt':
      index: nodes.Node = ('num', '2')
      if self.is_op('['):
        self.i += 1
        index = self.add()
        self.expect(']')
      return ('root', self.script_arg(), index)
    if name in ('lfloor', 'lceil'):
      inner = self.add()
      closer = self.take()
      if closer != ('cmd', 'r' + name[1:]):
        raise nodes.ParseError('unclosed floor/ceil')
      return ('floor' if name == 'lfloor' else 'ceil', inner)
    if name in lexer.FUNCS:
      return self.function(name)
    if name == 'begin':
      return self.matrix()
    if name == 'sum':
      return self.summation()
    raise nodes.ParseError(f'unexpected \\{name}')

  def function(self, name: str) -> nodes.Node:
    self.enter()
    try:
      return self._function(name)
    finally:
      self.leave()

  def _function(self, name: str) -> nodes.Node:
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
        if self.peek()[0] == 'cmd' and self.peek()[1] in lexer.FUNCS:
          break
        factors.append(('*', self.factor()))
      arg = factors[0][1] if len(factors) == 1 else ('mul', factors)
    node: nodes.Node = ('func', name, arg, base)
    return ('pow', node, power) if power is not None else node

  def summation(self) -> nodes.Node:
    """``\\sum_{k=a}^{b}`` and the implicit product after it (its body)."""
    self.enter()
    try:
      self.expect('_')
      self.expect('{')
      kind, var = self.take()
      if kind != 'letter':
        raise nodes.ParseError('bad summation index')
      self.expect('=')
      lower = self.add()
      self.expect('}')
      self.expect('^')
      upper = self.script_arg()
      shadowed = var in self.bound
      self.bound.add(var)
      factors = [('*', self.factor())]
      while self.starts_implicit():
        factors.append(('*', self.factor()))
      if not shadowed:
        self.bound.discard(var)
      body = factors[0][1] if len(factors) == 1 else ('mul', factors)
      return ('sum', var, lower, upper, body)
    finally:
      self.leave()

  def env_name(self) -> str:
    self.expect('{')
    parts = []
    while not self.is_op('}'):
      parts.append(self.take()[1])
    self.i += 1
    return ''.join(parts)

  def matrix(self) -> nodes.Node:
    env = self.env_name()
    if env not in _MATRIX_ENVS:
      raise nodes.ParseError(f'unsupported environment {env}')
    if env == 'array' and self.is_op('{'):
      self.env_name()  # column spec such as {cc}
    rows: list[list[nodes.Node]] = [[]]
    while True:
      if self.peek() == ('cmd', 'end'):
        self.i += 1
        if self.env_name() != env:
          raise nodes.ParseError('mismatched \\end')
        break
      rows[-1].append(self.add())
      if self.is_op('&'):
        self.i += 1
      elif self.is_op('\\\\'):
        self.i += 1
        if self.peek() != ('cmd', 'end'):
          rows.append([])
      elif self.peek() != ('cmd', 'end'):
        raise nodes.ParseError('bad matrix cell')
    if not rows[0] or any(len(r) != len(rows[0]) for r in rows):
      raise nodes.ParseError('ragged matrix')
    return ('matrix', rows)


def _has_symbol(node: object) -> bool:
  if isinstance(node, tuple):
    return (len(node) > 1 and node[0] == 'sym') or any(_has_symbol(c) for c in node)
  if isinstance(node, list):
    return any(_has_symbol(c) for c in node)
  return False


def _is_int_literal(node: nodes.Node) -> bool:
  return node[0] == 'num' and '.' not in node[1]


def parse(text: str) -> nodes.Node:
  """Parses a normalised answer string into an AST and checks the guards.

  Raises:
    nodes.TextAnswerError: the answer contains words (compare as text).
    nodes.ParseError: not in the grammar, or unconsumed input.
    nodes.GuardError: a size, depth or magnitude guard tripped.
  """
  toks = lexer.tokenize(text)
  for k, (kind, word) in enumerate(toks):
    # A word is text, unless it names an environment or is a subscript: S_{ABC}.
    if kind == 'word' and not (
      k >= 2 and toks[k - 2] in (('cmd', 'begin'), ('cmd', 'end'), ('op', '_'))
    ):
      raise nodes.TextAnswerError(word)
  node = _Parser(toks).parse()
  guards.check_guards(node)
  return node
