"""Generated answers for the verifier's property-based false-positive search.

Each kind of answer the verifier reads has a generator of the kind's OWN
value (Python ints, ``Fraction``, tuples, frozensets), a writer from that
value to LaTeX under a drawn ``Style`` (spacing, ``\\frac`` / ``\\dfrac`` /
``\\tfrac`` / ``/``, doubled backslashes, thousands separators, the order of
commuting terms, factors and set elements), and mutations from a value to
another value (a digit, a sign, an endpoint's openness, an element, an order
where order matters, a unit's scale). Whether two answers differ comes from
these values alone, never from the verifier's normaliser or parser; a
mutation that keeps the value (``-0``) is filtered by the same oracle.

``pair(kind)`` is a hypothesis strategy of ``Pair(kind, op, response,
reference, equal)``: a reference written in the plain style and a response
that is either a value-keeping rewrite (``op == 'rewrite'``) or a mutant.
tests/test_verifier_properties.py asserts the verifier on these pairs, and
benchmarks/verifier.py compares the two backends on them (``draws``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KINDS = (
  'integer',
  'decimal',
  'fraction',
  'radical',
  'expression',
  'interval',
  'set',
  'tuple',
  'matrix',
  'relation',
  'ratio',
  'time',
  'percent',
  'unit',
  'multi_box',
)


@dataclasses.dataclass(frozen=True)
class Style:
  """How a value is written; every style writes the same value."""

  space: str = ''  # around operators and after commas: '', ' ', '\\,'
  frac: str = 'frac'  # frac, dfrac, tfrac, slash
  doubled: bool = False  # every backslash doubled (JSON-escaped LaTeX)
  thousands: str = ''  # '', ',', '{,}', '\\,'
  seed: int = 0  # the order of commuting terms, factors and elements
  variant: int = 0  # a kind's own alternative spellings


PLAIN = Style()


@st.composite
def styles(draw: Any) -> Style:
  """Any style (the rewrites of a value)."""
  return Style(
    space=draw(st.sampled_from(['', ' ', '\\,', '  '])),
    frac=draw(st.sampled_from(['frac', 'dfrac', 'tfrac', 'slash'])),
    doubled=draw(st.booleans()),
    thousands=draw(st.sampled_from(['', ',', '{,}', '\\,'])),
    seed=draw(st.integers(0, 10**6)),
    variant=draw(st.integers(0, 5)),
  )


def _perm(items: list[Any], seed: int) -> list[Any]:
  """A permutation of ``items`` picked by ``seed`` (no randomness here)."""
  items = list(items)
  out = []
  while items:
    seed, k = divmod(seed, len(items))
    out.append(items.pop(k))
  return out


def _finish(text: str, style: Style) -> str:
  return text.replace('\\', '\\\\') if style.doubled else text


def _int(n: int, style: Style) -> str:
  digits = str(abs(n))
  if style.thousands and len(digits) > 3:
    groups = []
    while digits:
      groups.insert(0, digits[-3:])
      digits = digits[:-3]
    digits = style.thousands.join(groups)
  return ('-' if n < 0 else '') + digits


def _frac(q: Fraction, style: Style, *, allow_slash: bool = True) -> str:
  """A rational number: an integer, or a fraction in the style's command."""
  if q.denominator == 1:
    return _int(q.numerator, style)
  p, d = abs(q.numerator), q.denominator
  sign = '-' if q < 0 else ''
  if style.frac == 'slash' and allow_slash:
    return f'{sign}{p}/{d}'
  cmd = 'frac' if style.frac == 'slash' else style.frac
  if style.variant == 1 and p < 10 and d < 10:
    return f'{sign}\\{cmd}{p}{d}'  # \frac34
  if style.variant == 2 and d < 10:
    return f'{sign}\\{cmd}{{{p}}}{d}'  # \frac{3}4
  if style.variant == 3 and q < 0:
    return f'\\{cmd}{{-{p}}}{{{d}}}'
  return f'{sign}\\{cmd}{{{p}}}{{{d}}}'


def _digit_mutants(text: str) -> list[str]:
  """Every string with one digit of ``text`` replaced by another digit."""
  out = []
  for k, c in enumerate(text):
    if c.isdigit():
      out.extend(text[:k] + d + text[k + 1 :] for d in '0123456789' if d != c)
  return out


@dataclasses.dataclass(frozen=True)
class Kind:
  """A kind of answer: its values, its writer and its mutations."""

  values: st.SearchStrategy[Any]
  write: Callable[[Any, Style], str]
  mutate: Callable[[Any, Any], tuple[str, Any]]  # (draw, value) -> (op, value)


# integer ----------------------------------------------------------------


def _write_integer(n: int, style: Style) -> str:
  return _int(n, style)


def _mutate_integer(draw: Any, n: int) -> tuple[str, int]:
  op = draw(st.sampled_from(['digit', 'sign', 'add_digit', 'drop_digit', 'step']))
  if op == 'digit':
    return op, int(draw(st.sampled_from(_digit_mutants(str(n)))))
  if op == 'sign':
    return op, -n
  if op == 'add_digit':
    return op, n * 10 + draw(st.integers(0, 9)) * (1 if n >= 0 else -1)
  if op == 'drop_digit':
    return op, int(n / 10)
  return op, n + draw(st.sampled_from([-1, 1, 10, -10]))


INTEGER = Kind(st.integers(-(10**7), 10**7), _write_integer, _mutate_integer)

# decimal ----------------------------------------------------------------


def _decimals(value: Fraction) -> int:
  places = 0
  while (value * 10**places).denominator != 1:
    places += 1
  return places


def _write_decimal(v: tuple[Fraction, int], style: Style) -> str:
  value, places = v
  places += style.variant % 3  # 2.5, 2.50, 2.500
  scaled = abs(value) * 10**places
  digits = str(scaled.numerator // scaled.denominator).rjust(places + 1, '0')
  sign = '-' if value < 0 else ''
  return f'{sign}{_int(int(digits[:-places]), style)}.{digits[-places:]}'


def _mutate_decimal(draw: Any, v: tuple[Fraction, int]) -> tuple[str, Any]:
  op = draw(st.sampled_from(['digit', 'sign', 'shift']))
  text = _write_decimal(v, PLAIN)
  if op == 'digit':
    text = draw(st.sampled_from(_digit_mutants(text)))
  elif op == 'sign':
    text = text[1:] if text.startswith('-') else '-' + text
  else:  # the decimal point one place over
    k = text.index('.')
    if k + 2 <= len(text) - 1:
      text = text[:k] + text[k + 1] + '.' + text[k + 2 :]
  value = Fraction(text)
  return op, (value, max(_decimals(value), 1))


@st.composite
def _decimal_values(draw: Any) -> tuple[Fraction, int]:
  places = draw(st.integers(1, 4))
  value = Fraction(draw(st.integers(-(10**6), 10**6)), 10**places)
  return value, max(_decimals(value), 1)


DECIMAL = Kind(_decimal_values(), _write_decimal, _mutate_decimal)

# fraction ---------------------------------------------------------------


def _write_fraction(q: Fraction, style: Style) -> str:
  k = 1 + style.seed % 3 if style.variant == 4 else 1  # unreduced: 2/4
  if k > 1:
    p, d = q.numerator * k, q.denominator * k
    sign = '-' if p < 0 else ''
    return f'{sign}\\frac{{{abs(p)}}}{{{d}}}'
  return _frac(q, style)


def _mutate_fraction(draw: Any, q: Fraction) -> tuple[str, Fraction]:
  op = draw(st.sampled_from(['numerator', 'denominator', 'sign', 'reciprocal', 'step']))
  p, d = q.numerator, q.denominator
  if op == 'numerator':
    return op, Fraction(int(draw(st.sampled_from(_digit_mutants(str(p))))), d)
  if op == 'denominator':
    new = int(draw(st.sampled_from(_digit_mutants(str(d)))))
    return op, Fraction(p, new) if new else q
  if op == 'sign':
    return op, -q
  if op == 'reciprocal':
    return op, 1 / q
  return op, Fraction(p + draw(st.sampled_from([-1, 1])), d)


_FRACTIONS = st.builds(
  Fraction, st.integers(-300, 300).filter(bool), st.integers(2, 300)
).filter(lambda q: q.denominator > 1)
FRACTION = Kind(_FRACTIONS, _write_fraction, _mutate_fraction)

# radical: c + a sqrt(b), b square-free --------------------------------------

_SQUARE_FREE = (2, 3, 5, 6, 7, 10, 11, 13, 14, 15, 17, 19, 21)


def _write_radical(v: tuple[int, int, int], style: Style) -> str:
  c, a, b = v
  s = style.space
  if style.variant == 5 and a > 0:
    root = f'\\sqrt{{{a * a * b}}}'  # 2\sqrt{3} as \sqrt{12}
  elif a in (1, -1):
    root = ('-' if a < 0 else '') + f'\\sqrt{{{b}}}'
  elif style.variant == 4:
    root = ('-' if a < 0 else '') + f'\\sqrt{{{b}}}{s}\\cdot{s}{abs(a)}'
  else:
    root = f'{a}\\sqrt{{{b}}}'
  if c == 0:
    return root
  terms = [str(c), root]
  first, second = _perm(terms, style.seed)
  sep = '' if second.startswith('-') else '+'
  return f'{first}{s}{sep}{s}{second}'


def _mutate_radical(draw: Any, v: tuple[int, int, int]) -> tuple[str, Any]:
  c, a, b = v
  op = draw(st.sampled_from(['radicand', 'coefficient', 'constant', 'sign']))
  if op == 'radicand':
    return op, (c, a, draw(st.sampled_from([x for x in _SQUARE_FREE if x != b])))
  if op == 'coefficient':
    new = a + draw(st.sampled_from([-1, 1]))
    return op, (c, new, b) if new else (c, a, b)
  if op == 'constant':
    return op, (c + draw(st.sampled_from([-1, 1, 2])), a, b)
  return op, (c, -a, b)


RADICAL = Kind(
  st.tuples(
    st.integers(-20, 20),
    st.integers(-9, 9).filter(bool),
    st.sampled_from(_SQUARE_FREE),
  ),
  _write_radical,
  _mutate_radical,
)

# expression: a polynomial in one variable -------------------------------------


def _trim(coeffs: tuple[int, ...]) -> tuple[int, ...]:
  coeffs = list(coeffs)
  while len(coeffs) > 1 and coeffs[-1] == 0:
    coeffs.pop()
  return tuple(coeffs)


def _write_expression(v: tuple[str, tuple[int, ...]], style: Style) -> str:
  var, coeffs = v
  s = style.space
  terms = []
  for k, c in enumerate(coeffs):
    if c == 0:
      continue
    power = '' if k == 0 else var if k == 1 else f'{var}^{{{k}}}'
    if not power:
      terms.append(str(c))
    elif c in (1, -1):
      terms.append(('-' if c < 0 else '') + power)
    elif (style.seed >> k) % 2 and style.variant % 2:
      # A commuted product: x^2 \cdot 3.
      terms.append(('-' if c < 0 else '') + f'{power}{s}\\cdot{s}{abs(c)}')
    elif (style.seed >> k) % 2:
      terms.append(f'{c}{s}\\cdot{s or " "}{power}')
    else:
      terms.append(f'{c}{power}')
  if not terms:
    return '0'
  terms = _perm(terms, style.seed)
  out = terms[0]
  for t in terms[1:]:
    out += f'{s}-{s}{t[1:]}' if t.startswith('-') else f'{s}+{s}{t}'
  return out


def _mutate_expression(draw: Any, v: tuple[str, tuple[int, ...]]) -> tuple[str, Any]:
  var, coeffs = v
  op = draw(st.sampled_from(['coefficient', 'sign', 'exponent', 'variable']))
  k = draw(st.integers(0, len(coeffs) - 1))
  new = list(coeffs)
  if op == 'coefficient':
    new[k] += draw(st.sampled_from([-2, -1, 1, 2]))
  elif op == 'sign':
    new[k] = -new[k]
  elif op == 'exponent':
    j = draw(st.integers(0, len(coeffs)))
    new += [0] * (j + 1 - len(new))
    new[k], new[j] = new[j], new[k]
  else:
    return op, ({'x': 't', 't': 'y', 'y': 'x'}[var], coeffs)
  return op, (var, _trim(tuple(new)))


EXPRESSION = Kind(
  st.tuples(
    st.sampled_from(['x', 't', 'y']),
    st.lists(st.integers(-9, 9), min_size=2, max_size=4)
    .filter(lambda c: c[-1] != 0)
    .map(tuple),
  ),
  _write_expression,
  _mutate_expression,
)

# interval ----------------------------------------------------------------


def _end(e: int | None, low: bool) -> str:
  if e is None:
    return '-\\infty' if low else '\\infty'
  return str(e)


def _write_interval(v: tuple[Any, Any, bool, bool], style: Style) -> str:
  lo, hi, lc, hc = v
  s = style.space
  if style.variant in (1, 2, 3) and not (lo is None and hi is None):
    # A solved inequality: -3 \le x < 8, 8 > x \ge -3, x < 8.
    lt = {True: '\\le ', False: '<'}
    gt = {True: '\\ge ', False: '>'}
    if lo is None:
      return f'x{s}{lt[hc]}{s}{hi}'
    if hi is None:
      return f'x{s}{gt[lc]}{s}{lo}'
    if style.variant == 2:
      return f'{hi}{s}{gt[hc]}{s}x{s}{gt[lc]}{s}{lo}'
    return f'{lo}{s}{lt[lc]}{s}x{s}{lt[hc]}{s}{hi}'
  left = '[' if lc else '('
  right = ']' if hc else ')'
  sep = ',' + (' ' if style.space else '')
  return f'{left}{_end(lo, True)}{sep}{_end(hi, False)}{right}'


def _mutate_interval(draw: Any, v: tuple[Any, Any, bool, bool]) -> tuple[str, Any]:
  lo, hi, lc, hc = v
  op = draw(st.sampled_from(['openness', 'endpoint', 'sign', 'swap_ends']))
  if op == 'openness':
    if lo is not None and (hi is None or draw(st.booleans())):
      return op, (lo, hi, not lc, hc)
    if hi is not None:
      return op, (lo, hi, lc, not hc)
    return op, v
  if op == 'endpoint':
    step = draw(st.sampled_from([-2, -1, 1, 2]))
    if lo is not None and (hi is None or draw(st.booleans())):
      return op, (lo + step, hi, lc, hc)
    if hi is not None:
      return op, (lo, hi + step, lc, hc)
    return op, v
  if op == 'sign':
    if lo is not None and hi is not None:
      return op, (-hi, -lo, hc, lc) if draw(st.booleans()) else (lo, -hi, lc, hc)
    return op, (None if hi is None else -hi, None if lo is None else -lo, hc, lc)
  return op, (lo, hi, hc, lc)


@st.composite
def _interval_values(draw: Any) -> tuple[Any, Any, bool, bool]:
  lo, hi = sorted(
    draw(st.lists(st.integers(-20, 20), min_size=2, max_size=2, unique=True))
  )
  shape = draw(st.sampled_from(['finite', 'finite', 'left', 'right']))
  lc, hc = draw(st.booleans()), draw(st.booleans())
  if shape == 'left':
    return None, hi, False, hc
  if shape == 'right':
    return lo, None, lc, False
  return lo, hi, lc, hc


INTERVAL = Kind(_interval_values(), _write_interval, _mutate_interval)

# set, tuple, matrix ---------------------------------------------------------


def _join(items: list[str], style: Style) -> str:
  return (',' + (style.space or '')).join(items)


def _write_set(v: frozenset[int], style: Style) -> str:
  items = _perm(sorted(v), style.seed)
  return '\\{' + _join([str(i) for i in items], style) + '\\}'


def _mutate_set(draw: Any, v: frozenset[int]) -> tuple[str, Any]:
  op = draw(st.sampled_from(['element', 'drop', 'add', 'sign']))
  items = sorted(v)
  k = draw(st.integers(0, len(items) - 1))
  if op == 'element':
    items[k] += draw(st.sampled_from([-1, 1, 10]))
  elif op == 'drop' and len(items) > 1:
    items.pop(k)
  elif op == 'add':
    items.append(draw(st.integers(-30, 30)))
  else:
    items[k] = -items[k]
  return op, frozenset(items)


SET = Kind(
  st.frozensets(st.integers(-20, 20), min_size=2, max_size=5),
  _write_set,
  _mutate_set,
)


def _write_tuple(v: tuple[int, ...], style: Style) -> str:
  return '(' + _join([str(i) for i in v], style) + ')'


def _mutate_tuple(draw: Any, v: tuple[int, ...]) -> tuple[str, Any]:
  op = draw(st.sampled_from(['element', 'order', 'drop', 'sign']))
  items = list(v)
  k = draw(st.integers(0, len(items) - 1))
  if op == 'element':
    items[k] += draw(st.sampled_from([-1, 1, 10]))
  elif op == 'order':
    j = draw(st.integers(0, len(items) - 1))
    items[k], items[j] = items[j], items[k]
  elif op == 'drop' and len(items) > 2:
    items.pop(k)
  else:
    items[k] = -items[k]
  return op, tuple(items)


TUPLE = Kind(
  st.lists(st.integers(-20, 20), min_size=2, max_size=4).map(tuple),
  _write_tuple,
  _mutate_tuple,
)


def _write_matrix(v: tuple[tuple[int, ...], ...], style: Style) -> str:
  env = 'pmatrix' if style.variant % 2 == 0 else 'bmatrix'
  s = style.space
  rows = (f'{s}&{s}'.join(str(c) for c in row) for row in v)
  body = f'{s}\\\\{s}'.join(rows)
  return f'\\begin{{{env}}}{s}{body}{s}\\end{{{env}}}'


def _mutate_matrix(draw: Any, v: tuple[tuple[int, ...], ...]) -> tuple[str, Any]:
  op = draw(st.sampled_from(['cell', 'transpose', 'rows', 'sign']))
  rows = [list(r) for r in v]
  r = draw(st.integers(0, len(rows) - 1))
  c = draw(st.integers(0, len(rows[0]) - 1))
  if op == 'cell':
    rows[r][c] += draw(st.sampled_from([-1, 1, 5]))
  elif op == 'transpose':
    rows = [list(col) for col in zip(*rows, strict=True)]
  elif op == 'rows':
    rows.reverse()
  else:
    rows[r][c] = -rows[r][c]
  return op, tuple(tuple(row) for row in rows)


@st.composite
def _matrix_values(draw: Any) -> tuple[tuple[int, ...], ...]:
  n_rows, n_cols = draw(st.sampled_from([(2, 2), (2, 3), (3, 2), (3, 1), (3, 3)]))
  cells = st.integers(-9, 9)
  return tuple(tuple(draw(cells) for _ in range(n_cols)) for _ in range(n_rows))


MATRIX = Kind(_matrix_values(), _write_matrix, _mutate_matrix)

# relation: the line y = m x + c -------------------------------------------------


def _signed(terms: list[str], s: str) -> str:
  out = terms[0]
  for t in terms[1:]:
    out += f'{s}-{s}{t[1:]}' if t.startswith('-') else f'{s}+{s}{t}'
  return out


def _mx(m: int) -> str:
  return 'x' if m == 1 else '-x' if m == -1 else f'{m}x'


def _write_relation(v: tuple[int, int], style: Style) -> str:
  m, c = v
  s = style.space
  rhs = [t for t in (_mx(m) if m else '', str(c) if c else '') if t] or ['0']
  form = style.variant % 3
  if form == 0:
    return f'y{s}={s}' + _signed(_perm(rhs, style.seed), s)
  if form == 1:  # m x - y + c = 0
    terms = [t for t in (_mx(m) if m else '', '-y', str(c) if c else '') if t]
    return _signed(_perm(terms, style.seed), s) + f'{s}={s}0'
  return _signed(_perm(rhs, style.seed), s) + f'{s}={s}y'


def _mutate_relation(draw: Any, v: tuple[int, int]) -> tuple[str, Any]:
  m, c = v
  op = draw(st.sampled_from(['slope', 'intercept', 'sign', 'swap']))
  if op == 'slope':
    return op, (m + draw(st.sampled_from([-1, 1])), c)
  if op == 'intercept':
    return op, (m, c + draw(st.sampled_from([-1, 1, 3])))
  if op == 'sign':
    return op, (-m, c) if draw(st.booleans()) else (m, -c)
  return op, (c, m) if c else (m, c)


RELATION = Kind(
  st.tuples(st.integers(-9, 9).filter(bool), st.integers(-9, 9)),
  _write_relation,
  _mutate_relation,
)

# ratio, time, percent -------------------------------------------------------


def _write_ratio(v: tuple[int, int], style: Style) -> str:
  a, b = v
  k = 1 + style.variant % 3  # 2:7 = 4:14 = 6:21
  s = style.space
  if k > 1 and b * k >= 60:
    k = 1
  return f'{a * k}{s}:{s}{b * k}'


def _ratio_value(v: tuple[int, int]) -> Any:
  a, b = v
  return ('undefined', v) if a == 0 or b == 0 else Fraction(a, b)


def _mutate_ratio(draw: Any, v: tuple[int, int]) -> tuple[str, Any]:
  a, b = v
  op = draw(st.sampled_from(['swap', 'first', 'second']))
  if op == 'swap':
    return op, (b, a)
  step = draw(st.sampled_from([-1, 1, 2]))
  return op, (a + step, b) if op == 'first' else (a, b + step)


RATIO = Kind(
  st.tuples(st.integers(1, 30), st.integers(1, 9)), _write_ratio, _mutate_ratio
)

_HALVES = {
  'a': ['am', 'a.m.', 'AM', '\\text{ am}', '\\text{ a.m.}'],
  'p': ['pm', 'p.m.', 'PM', '\\text{ pm}', '\\text{ p.m.}'],
}


def _write_time(v: tuple[int, int, str], style: Style) -> str:
  h, m, half = v
  hours = f'{h:02d}' if style.variant == 1 else str(h)
  text = f'{hours}:{m:02d}'
  if half:
    written = _HALVES[half][style.seed % 5]
    text += written if written.startswith('\\') else ' ' + written
  return text


def _mutate_time(draw: Any, v: tuple[int, int, str]) -> tuple[str, Any]:
  h, m, half = v
  op = draw(st.sampled_from(['hour', 'minute', 'half']))
  if op == 'hour':
    new = draw(st.integers(1, 12) if half else st.integers(0, 23))
    return op, (new, m, half)
  if op == 'minute':
    return op, (h, draw(st.integers(0, 59)), half)
  if half:
    return op, (h, m, draw(st.sampled_from(['', 'a' if half == 'p' else 'p'])))
  return op, (h, m, 'a' if h <= 12 and h > 0 else half) if h else v


TIME = Kind(
  st.one_of(
    st.tuples(st.integers(1, 12), st.integers(0, 59), st.sampled_from(['a', 'p'])),
    st.tuples(st.integers(0, 23), st.integers(0, 59), st.just('')),
  ),
  _write_time,
  _mutate_time,
)


def _write_percent(v: Fraction, style: Style) -> str:
  text = _write_decimal((v, _decimals(v)), style) if v.denominator != 1 else str(v)
  s = style.space
  return text + [f'{s}\\%', '\\%', f'{s}\\text{{ percent}}', '%'][style.variant % 4]


def _mutate_percent(draw: Any, v: Fraction) -> tuple[str, Fraction]:
  op = draw(st.sampled_from(['digit', 'sign', 'scale']))
  if op == 'digit':
    text = _write_decimal((v, _decimals(v)), PLAIN) if v.denominator != 1 else str(v)
    return op, Fraction(draw(st.sampled_from(_digit_mutants(text))))
  if op == 'sign':
    return op, -v
  return op, v * draw(st.sampled_from([Fraction(1, 100), Fraction(1, 10), 10, 100]))


PERCENT = Kind(
  st.one_of(
    st.integers(1, 100).map(Fraction),
    st.integers(1, 999).map(lambda n: Fraction(n, 10)),
  ),
  _write_percent,
  _mutate_percent,
)

# unit: a number with a unit; the value is the quantity in base units -------------

_UNITS = {
  # name: (dimension, scale to the base unit, other spellings)
  'mm': ('length', Fraction(1, 1000), ['millimeters']),
  'cm': ('length', Fraction(1, 100), ['centimeters']),
  'm': ('length', Fraction(1), ['meters']),
  'km': ('length', Fraction(1000), ['kilometers']),
  'g': ('mass', Fraction(1), ['grams']),
  'kg': ('mass', Fraction(1000), ['kilograms']),
  's': ('time', Fraction(1), ['seconds']),
  'min': ('time', Fraction(60), ['minutes']),
}


def _write_unit(v: tuple[Fraction, str], style: Style) -> str:
  number, unit = v
  text = (
    _write_decimal((number, _decimals(number)), style)
    if number.denominator != 1
    else _int(number.numerator, style)
  )
  spelled = [unit, *_UNITS[unit][2]][style.seed % 2]
  s = style.space
  form = style.variant % 4
  if form == 0:
    return f'{text}\\text{{ {spelled}}}'
  if form == 1:
    return f'{text}\\,\\mathrm{{{unit}}}'
  if form == 2:
    return f'{text} {spelled}'
  return f'{text}{s}\\text{{{spelled}}}'


def _unit_value(v: tuple[Fraction, str]) -> tuple[str, Fraction]:
  number, unit = v
  return _UNITS[unit][0], number * _UNITS[unit][1]


def _mutate_unit(draw: Any, v: tuple[Fraction, str]) -> tuple[str, Any]:
  number, unit = v
  op = draw(st.sampled_from(['unit_scale', 'digit', 'sign']))
  if op == 'unit_scale':
    dim = _UNITS[unit][0]
    other = [u for u, spec in _UNITS.items() if spec[0] == dim and u != unit]
    return op, (number, draw(st.sampled_from(other)))
  if op == 'digit':
    text = (
      str(number.numerator)
      if number.denominator == 1
      else _write_decimal((number, _decimals(number)), PLAIN)
    )
    return op, (Fraction(draw(st.sampled_from(_digit_mutants(text)))), unit)
  return op, (-number, unit)


UNIT = Kind(
  st.tuples(
    st.one_of(
      st.integers(1, 5000).map(Fraction),
      st.integers(1, 9999).map(lambda n: Fraction(n, 10)),
    ),
    st.sampled_from(sorted(_UNITS)),
  ),
  _write_unit,
  _mutate_unit,
)

# multi_box: the solutions of an equation, one box each --------------------------


def _write_multi_box(v: frozenset[int], style: Style) -> str:
  """A full response (boxes joined by list glue); the reference is a list."""
  items = _perm(sorted(v), style.seed)
  glue = [', ', ' and ', '$, $', ',\\ ', ' \\text{ and } '][style.variant % 5]
  boxes = glue.join(f'\\boxed{{{i}}}' for i in items)
  return f'The solutions are ${boxes}$.'


def _write_multi_box_reference(v: frozenset[int], style: Style) -> str:
  items = sorted(v)
  form = style.variant % 3
  if form == 0:
    return ', '.join(str(i) for i in items)
  if form == 1:
    return ''.join(f'\\boxed{{{i}}}' for i in items)
  return ' and '.join(f'\\boxed{{{i}}}' for i in items)


MULTI_BOX = Kind(
  st.frozensets(st.integers(-20, 20), min_size=2, max_size=3),
  _write_multi_box,
  _mutate_set,
)

KIND_SPECS: dict[str, Kind] = {
  'integer': INTEGER,
  'decimal': DECIMAL,
  'fraction': FRACTION,
  'radical': RADICAL,
  'expression': EXPRESSION,
  'interval': INTERVAL,
  'set': SET,
  'tuple': TUPLE,
  'matrix': MATRIX,
  'relation': RELATION,
  'ratio': RATIO,
  'time': TIME,
  'percent': PERCENT,
  'unit': UNIT,
  'multi_box': MULTI_BOX,
}

# The oracle: the value an answer of a kind stands for.
_ORACLE: dict[str, Callable[[Any], Any]] = {
  'decimal': lambda v: v[0],
  'expression': lambda v: (v[0], _trim(v[1])),
  'ratio': _ratio_value,
  'unit': _unit_value,
}


def oracle(kind: str, value: Any) -> Any:
  """The generator's own value of an answer (what decides "differs")."""
  return _ORACLE.get(kind, lambda v: v)(value)


@dataclasses.dataclass(frozen=True)
class Pair:
  """A (response, reference) pair and whether their values are equal."""

  kind: str
  op: str  # 'rewrite' or the mutation
  response: str
  reference: str
  equal: bool


def box(answer: str) -> str:
  """A short response ending in a boxed answer."""
  return f'So the final answer is $\\boxed{{{answer}}}$.'


def _response(kind: str, value: Any, style: Style) -> str:
  spec = KIND_SPECS[kind]
  text = spec.write(value, style)
  if kind == 'multi_box':
    return _finish(text, style)
  return box(_finish(text, style))


def _reference(kind: str, value: Any, style: Style) -> str:
  if kind == 'multi_box':
    return _write_multi_box_reference(value, style)
  return KIND_SPECS[kind].write(value, PLAIN)


@st.composite
def pair(draw: Any, kind: str, *, mutant: bool | None = None) -> Pair:
  """A drawn pair of ``kind``: a rewrite or a mutant (both when None)."""
  spec = KIND_SPECS[kind]
  value = draw(spec.values)
  ref_style = Style(variant=draw(st.integers(0, 5)))
  reference = _reference(kind, value, ref_style)
  if mutant is None:
    mutant = draw(st.booleans())
  style = draw(styles())
  if not mutant:
    return Pair(kind, 'rewrite', _response(kind, value, style), reference, True)
  op, new = spec.mutate(draw, value)
  equal = oracle(kind, new) == oracle(kind, value)
  return Pair(kind, op, _response(kind, new, style), reference, equal)


def draws(n_per_kind: int) -> list[Pair]:
  """``n_per_kind`` pairs of every kind, the same on every call (derandomized)."""
  out: list[Pair] = []
  for kind in KINDS:

    @settings(
      max_examples=n_per_kind,
      database=None,
      deadline=None,
      derandomize=True,
      suppress_health_check=list(HealthCheck),
    )
    @given(pair(kind))
    def collect(p: Pair) -> None:
      out.append(p)

    collect()
  return out
