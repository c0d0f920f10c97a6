"""Answer extraction (last boxed answer) and string normalisation for the verifier.

Both sides of a comparison go through the same ``normalize``; the policy it
implements is written once in the ``ada_jax.verifier`` module docstring. All
regular expressions here run on a box content that is already capped in
length, and extraction itself is a linear scan (no regex over the response).
"""

from __future__ import annotations

import dataclasses
import re

MAX_BOX_CHARS = 1000
MAX_REFERENCE_CHARS = 2000

_BOX_CMDS = ('\\boxed', '\\fbox')


def _box_start(text: str, end: int) -> int:
  return max(text.rfind(cmd, 0, end) for cmd in _BOX_CMDS)


# Escapes (\\{, \\}, \\\\, any \\x) and braces: a scan jumps between these in C.
_BRACE_TOKENS = re.compile(r'\\.|[{}]', re.DOTALL)


def _closing_brace(text: str, i: int, end: int) -> int | None:
  """Index of the ``}`` closing the ``{`` at ``text[i]``, if it is before ``end``."""
  depth = 0
  for match in _BRACE_TOKENS.finditer(text, i, end):
    token = match.group()
    if token == '{':
      depth += 1
    elif token == '}':
      depth -= 1
      if depth == 0:
        return match.start()
  return None


def _open_brace(text: str, pos: int) -> int:
  """Index of the ``{`` after the box command at ``pos`` (-1 if there is none)."""
  i = pos + (len('\\boxed') if text.startswith('\\boxed', pos) else len('\\fbox'))
  n = len(text)
  while i < n and text[i] in ' \t\n':
    i += 1
  return i if i < n and text[i] == '{' else -1


def _box_span(text: str, pos: int, limit: int) -> tuple[int, int] | None:
  """(start, end) of the content of the box command at ``pos``, end = its ``}``.

  None if the command is not followed by ``{``, is unclosed, or its content
  exceeds ``limit`` characters (the scan stops there: linear time).
  """
  i = _open_brace(text, pos)
  if i < 0:
    return None
  close = _closing_brace(text, i, min(len(text), i + limit + 2))
  return None if close is None else (i + 1, close)


def _outermost_box(text: str, pos: int) -> int:
  """The box that encloses the last box command (``\\boxed{\\boxed{1}}``).

  A box ends after every box it contains, so the outermost one is the last
  box to close. An earlier box that never closes is debris, not an enclosing
  box. Returns -1 past 20 enclosing levels (nesting bait).
  """
  for _ in range(20):
    if pos < 0:
      return pos
    outer = _box_start(text, pos)
    if outer < 0:
      return pos
    brace = _open_brace(text, outer)
    if brace < 0 or brace >= pos or _closing_brace(text, brace, pos) is not None:
      return pos  # the earlier box closed before the last one started
    if _box_span(text, outer, len(text)) is None:
      return pos  # it never closes at all
    pos = outer
  return -1


def extract(
  response: str, *, limit: int = MAX_BOX_CHARS, side_by_side: bool = False
) -> str | None:
  """Content of the last ``\\boxed{...}``/``\\fbox{...}`` in ``response``.

  Returns None when there is no box, or the last box is not followed by ``{``,
  is unclosed, empty, or longer than ``limit`` characters. Linear time.
  ``side_by_side`` (references) also joins boxes with nothing but spaces or
  ``$`` between them (``\\boxed{3}\\boxed{5}``).
  """
  if not isinstance(response, str):
    return None
  pos = _outermost_box(response, _box_start(response, len(response)))
  if pos < 0:
    return None
  span = _box_span(response, pos, limit)
  if span is None:
    return None
  content = response[span[0] : span[1]]
  if not content.strip():
    return None
  return _joined_boxes(response, pos, content, limit, side_by_side)


# What may stand between two boxes of one answer: list separators (at least
# one of , ; and or), math delimiters, spacing and a label such as ``b =``.
_GLUE = re.compile(
  r'(?:\s|\$|\\[,;: ]|\\q?quad|\\text\{\s*(?:and|or)\s*\}|[,;]|\b(?:and|or)\b|'
  r'[A-Za-z](?:_\{?\w{1,3}\}?)?\s*=)*'
)
_GLUE_SEP = re.compile(r'[,;]|\b(?:and|or)\b')
# Boxes side by side in a reference (\\boxed{3}\\boxed{5}): one list.
_NO_GLUE = re.compile(r'[\s$]*')
_MAX_GLUE = 40
_MAX_JOINED = 10


def _joined_boxes(
  text: str, pos: int, content: str, limit: int, side_by_side: bool
) -> str:
  """Joins the boxes just before the last one when only list glue separates them.

  ``\\boxed{-1}, \\boxed{4}`` and ``\\boxed{2} or \\boxed{3}`` answer ``-1, 4``
  and ``2, 3`` (so a hedge never matches one of its values); boxes with any
  other words between them stay apart, and the last box alone is the answer.
  Identical boxes collapse into one. Bounded work: at most 10 boxes.
  """
  parts = [content]
  for _ in range(_MAX_JOINED - 1):
    prev = _box_start(text, pos)
    if prev < 0:
      break
    span = _box_span(text, prev, limit)
    if span is None or span[1] >= pos:
      break
    glue = text[span[1] + 1 : pos]
    if pos > 0 and text[pos - 1] == '\\':
      # JSON-escaped: \\boxed{3}, \\text{ and } \\boxed{5}; the glue is halved too.
      glue = glue[:-1]
      if any(len(r) % 2 for r in _BACKSLASH_RUN.findall(glue)):
        break
      glue = _BACKSLASH_RUN.sub(lambda m: '\\' * (len(m.group()) // 2), glue)
    if len(glue) > _MAX_GLUE or not _GLUE.fullmatch(glue):
      break
    if not (_GLUE_SEP.search(glue) or (side_by_side and _NO_GLUE.fullmatch(glue))):
      break
    inner = text[span[0] : span[1]]
    if not inner.strip():
      break
    parts.append(inner)
    pos = prev
  if len({p.strip() for p in parts}) == 1:
    return content
  joined = ', '.join(reversed(parts))
  return joined if len(joined) <= limit else content


_ANSWER_IS = re.compile(r'answer\s+is\s*:?\s*', re.IGNORECASE)


def extract_answer_is(response: str) -> str | None:
  """Eval-only fallback: the text after the last "answer is", up to a period."""
  pos = response.lower().rfind('answer is')
  if pos < 0:
    return None
  tail = response[pos : pos + 200]
  match = _ANSWER_IS.match(tail)
  rest = tail[match.end() :] if match else ''
  rest = re.split(r'\.(?:\s|$)|\n', rest, maxsplit=1)[0].strip().strip('$').strip()
  return rest or None


@dataclasses.dataclass(frozen=True)
class Normalized:
  """A normalised answer string and the flags stripped from it."""

  text: str
  percent: bool
  degrees: bool
  unit: str = ''  # the dropped unit's key (``unit_key``), '' if none or unknown


_UNICODE = {
  '°': '^\\circ',
  'π': '\\pi',
  '√': '\\sqrt',
  '−': '-',
  '–': '-',
  '×': '\\times',
  '·': '\\cdot',
  '∞': '\\infty',
  '≤': '\\le',
  '≥': '\\ge',
  '≠': '\\ne',
  '≈': '\\approx',
  '∪': '\\cup',
  '±': '\\pm',
  '∅': '\\emptyset',
  '\u00a0': ' ',
  '²': '^2',
  '³': '^3',
}
_TEXT_CMDS = 'text|textbf|textit|textrm|textnormal|mbox|hbox'
_MATH_CMDS = 'mathrm|mathbf|mathit|mathsf|mathnormal|boldsymbol|bm|operatorname'
_WRAP = re.compile(r'\\(' + _TEXT_CMDS + '|' + _MATH_CMDS + r')\s*\{([^{}]*)\}')
_OLD_FONT = re.compile(r'\{\\(?:bf|rm|it)\s+([^{}]*)\}')
_SPACING = re.compile(r'(?<!\\)\\(?:[,;:! ]|quad\b|qquad\b|hspace\*?\{[^{}]*\})|~')
_DELIMS = re.compile(r'\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)(?![a-zA-Z])\.?')
_PERCENT = re.compile(r'\\%|%|\bper\s?cent(?:age)?s?\b|\bpct\b', re.IGNORECASE)
_DEGREES = re.compile(
  r'\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\\degree\b|\bdegrees?\b', re.IGNORECASE
)
_UNITS = (
  r'units?|m/s|km/h|km/hr|mi/h|ft/s|cm|mm|km|m|meters?|metres?|centimeters?|millimeters?|kilometers?|inch|inches|'
  r'in|feet|foot|ft|yards?|yd|miles?|mi|kg|g|grams?|kilograms?|lbs?|pounds?|ounces?|oz|'
  r'seconds?|sec|s|minutes?|mins?|hours?|hrs?|hr|days?|weeks?|months?|years?|dollars?|'
  r'cents?|liters?|litres?|ml|mL|L|gallons?|mph|calories|people|students|ways|'
  r'square\s+units|sq\s+units|cubic\s+units|square\s+feet|square\s+meters|'
  r'square\s+inches|square\s+centimeters|cubic\s+feet|cubic\s+centimeters|'
  r'cubic\s+inches|cubic\s+meters'
)
_TRAILING_UNIT = re.compile(
  r'^(?P<v>.*[\d}).])\s+(?P<u>(?:(?:square|sq|cubic)\s+)?(?:'
  + _UNITS
  + r')(?:\s*\^\s*\{?[23]\}?)?)$'
)
# A unit of two or more letters glued to a number: 12.5cm, 3kg, 40cm^2 (one
# letter, 5m, stays a product: m may be a variable).
_GLUED_UNIT = re.compile(
  r'^(?P<v>-?\d[\d,.{}]*)\s*(?P<u>(?:cm|mm|km|kg|mg|ml|mL|ft|yd|mi|lbs?|oz|mph|'
  r'sec|min|hrs?|km/h|m/s)(?:\s*\^\s*\{?[23]\}?)?)$'
)
# Physical units and their keys: two answers that both name a unit must name
# the same one (5 cm is not 5 m). Other words after a number (3 apples) are
# labels, dropped without a key.
_UNIT_KEYS = {
  'mm': 'mm',
  'millimeter': 'mm',
  'millimetre': 'mm',
  'cm': 'cm',
  'centimeter': 'cm',
  'centimetre': 'cm',
  'm': 'm',
  'meter': 'm',
  'metre': 'm',
  'km': 'km',
  'kilometer': 'km',
  'kilometre': 'km',
  'in': 'in',
  'inch': 'in',
  'inche': 'in',
  'ft': 'ft',
  'foot': 'ft',
  'feet': 'ft',
  'yd': 'yd',
  'yard': 'yd',
  'mi': 'mi',
  'mile': 'mi',
  'mg': 'mg',
  'milligram': 'mg',
  'g': 'g',
  'gram': 'g',
  'kg': 'kg',
  'kilogram': 'kg',
  'lb': 'lb',
  'pound': 'lb',
  'oz': 'oz',
  'ounce': 'oz',
  's': 's',
  'sec': 's',
  'second': 's',
  'min': 'min',
  'minute': 'min',
  'h': 'h',
  'hr': 'h',
  'hour': 'h',
  'day': 'day',
  'week': 'week',
  'month': 'month',
  'year': 'year',
  'ml': 'ml',
  'milliliter': 'ml',
  'millilitre': 'ml',
  'l': 'l',
  'liter': 'l',
  'litre': 'l',
  'gallon': 'gal',
  'dollar': '$',
  '$': '$',
  'cent': 'cent',
  'm/s': 'm/s',
  'km/h': 'km/h',
  'km/hr': 'km/h',
  'mph': 'mph',
  'mi/h': 'mph',
  'ft/s': 'ft/s',
}


def unit_key(unit: str) -> str:
  """The key of a physical unit (``centimeters`` and ``cm^2`` -> cm, cm^2), else ''."""
  words = unit.strip().lower().replace('{', '').replace('}', '')
  power = ''
  match = re.search(r'\s*\^\s*([23])$', words)
  if match:
    power, words = '^' + match.group(1), words[: match.start()]
  for word, exponent in (('square ', '^2'), ('sq ', '^2'), ('cubic ', '^3')):
    if words.startswith(word):
      power, words = exponent, words[len(word) :]
  words = words.strip().rstrip('.')
  if words not in _UNIT_KEYS and words.endswith('s') and len(words) > 2:
    words = words[:-1]  # centimeters, hours, dollars, mins
  key = _UNIT_KEYS.get(words, '')
  return key + power if key else ''


# A trailing \text{words} after a number is a unit or a label: 3 \text{ apples}.
_TRAILING_TEXT = re.compile(
  r'^(?P<v>.*?[\d}])\s*\\(?:text|mbox|textrm|mathrm)\s*\{\s*(?P<w>[A-Za-z][A-Za-z ./]*)\}'
  r'(?:\s*\^\s*\{?[23]\}?)?\s*$'
)
# A leading label in words or a polygon's name: \text{Area} = 12, ABC = 30.
# Labels that are expressions of point names: \frac{AM}{MC} =, |PQ| =, [ABC] =,
# S_{ABC} = (\triangle dropped), \overline{AB} =.
_TEXT_LABEL = re.compile(
  r'^\s*(?:\\(?:text|mathrm)\s*\{[A-Za-z][A-Za-z ]{0,29}\}|[A-Z]{3,4}'
  r'|\\frac\{[A-Z]{1,4}\}\{[A-Z]{1,4}\}|\|[A-Z]{1,4}\||\[[A-Z]{2,4}\]'
  r'|\\overline\{[A-Z]{2}\}|[A-Z]_\{\s*[A-Z]{2,4}\}|[A-Z]_[A-Z])\s*=(?!=)'
)
# A function's value in an inequality: -1 < g(x) < 3 is a range (read as y).
_FUNC_IN_INEQUALITY = re.compile(r'(?<![A-Za-z\\])[fghFGH]\s*\(\s*[a-z]\s*\)')
_INEQUALITY = re.compile(r'[<>]|\\[lg]e(?:q|qslant)?(?![a-zA-Z])')
_ANGLE = re.compile(r'\\(?:(?:measured)?angle|triangle)(?![a-zA-Z])')
_REALS_WORDS = re.compile(r'^(?:all\s+)?real\s+numbers$', re.IGNORECASE)
_ANSWER_PREFIX = re.compile(
  r'^\s*(?:the\s+)?(?:final\s+)?answer\s*(?:is)?\s*[:=]?\s*', re.IGNORECASE
)
_FUNC_LHS = re.compile(
  r'^[a-zA-Z](?:\^\{?-1\}?|\')?\s*\(\s*[a-z](?:\s*,\s*[a-z])*\s*\)\s*=(?!=)'
)
# A function's value at numbers: f(2) = 5, P(-1, 0.5) = 3 (never x(x+1) = 6).
_FUNC_VALUE_LHS = re.compile(
  r'^[a-zA-Z]\s*\(\s*-?[\d.]+(?:\s*,\s*-?[\d.]+)*\s*\)\s*=(?!=)'
)
# A decimal trailing off: 0.707\ldots, 2.718... (the digits written).
_TRAILING_DOTS = re.compile(r'(\d)\s*(?:\\[lc]?dots|\.\.\.)(?![a-zA-Z])')
_THOUSANDS = re.compile(r'^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$')
_SCI = re.compile(r'^(-?\d+(?:\.\d+)?)[eE]([+-]?\d+)$')
_REPEAT = re.compile(r'(\d*)\.(\d*)\\overline\s*\{?(\d{1,20})\}?')


def _repeating(match: re.Match[str]) -> str:
  whole, fixed, rep = match.group(1) or '0', match.group(2), match.group(3)
  # x = whole.fixed(rep)(rep)... = (whole fixed rep - whole fixed) / (10^k (10^r - 1))
  num = int(whole + fixed + rep) - int(whole + fixed)
  den = (10 ** len(rep) - 1) * 10 ** len(fixed)
  return f'\\frac{{{num}}}{{{den}}}'


def _strip_outer(text: str, open_: str, close: str) -> str | None:
  """``text`` without one outer ``open_ ... close`` pair, if they match."""
  if not (text.startswith(open_) and text.endswith(close)):
    return None
  depth = 0
  body_end = len(text) - len(close)
  i = 0
  while i < len(text):
    if text.startswith('\\', i) and open_ == '{':
      i += 2
      continue
    if text.startswith(open_, i):
      depth += 1
      i += len(open_)
      continue
    if text.startswith(close, i):
      depth -= 1
      if depth == 0:
        return text[len(open_) : body_end] if i == body_end else None
      i += len(close)
      continue
    i += 1
  return None


def unwrap(text: str) -> str:
  """Strips math delimiters, outer braces and outer boxes from an answer."""
  for _ in range(10):
    before = text
    text = text.strip()
    if len(text) > 1 and text[0] == '$' and text[-1] == '$':
      text = text.strip('$')
    for open_, close in (('\\(', '\\)'), ('\\[', '\\]'), ('{', '}')):
      inner = _strip_outer(text, open_, close)
      if inner is not None:
        text = inner
    if text.startswith(_BOX_CMDS):
      span = _box_span(text, 0, len(text))
      if span is not None and span[1] == len(text) - 1:
        text = text[span[0] : span[1]]
    if text == before:
      break
  return text


def _inner_boxes(text: str) -> str:
  """Replaces every ``\\boxed{X}`` inside an answer by X."""
  for _ in range(20):
    pos = _box_start(text, len(text))
    span = _box_span(text, pos, len(text)) if pos >= 0 else None
    if span is None:
      return text
    text = text[:pos] + text[span[0] : span[1]] + text[span[1] + 1 :]
  return text


def _drop_trailing_text(match: re.Match[str], units: list[str]) -> str:
  words = match.group('w').strip(' .').lower()
  if words in ('or', 'and', 'e', 'i') or not re.search(r'\d', match.group('v')):
    return match.group(0)
  half = re.sub(r'[ .]', '', words)
  if half in ('am', 'pm'):  # 3:00 \text{ p.m.}: a time keeps its half of the day
    return f'{match.group("v")} {half}'
  power = re.search(r'\^\s*\{?([23])', match.group(0)[match.end('w') - match.start() :])
  units.append(words + (f'^{power.group(1)}' if power else ''))
  return match.group('v')


# LaTeX spacing between digit groups: 12\\,400, 1\\ 234\\ 567, 12{,} 400.
_SPACED_THOUSANDS = re.compile(
  r'(\d)\s*(?:\{\s*,\s*\}|\\[,;: !]|,\\!|~)\s*(?=\d{3}(?!\d))'
)
_PLAIN_SPACED_THOUSANDS = re.compile(r'^-?\d{1,3}(?: \d{3})+(?:\.\d+)?$')
_BACKSLASH_RUN = re.compile(r'\\+')


def _halve_backslashes(text: str) -> str:
  """``\\\\frac{1}{2}`` (JSON-escaped LaTeX) as ``\\frac{1}{2}``.

  Only when every run of backslashes has even length and one of them starts
  a command or escapes a brace, so a matrix row break ``\\\\`` in otherwise
  single-backslash LaTeX is kept.
  """
  if '\\\\' not in text:
    return text
  runs = _BACKSLASH_RUN.findall(text)
  if any(len(r) % 2 for r in runs) or not re.search(r'\\\\[a-zA-Z{},;:!]', text):
    return text
  return _BACKSLASH_RUN.sub(lambda m: '\\' * (len(m.group()) // 2), text)


def normalize(answer: str) -> Normalized:
  """Canonical string form of an answer plus its ``%`` and degree flags.

  Idempotent on its own output (up to the flags, which it reports once).
  """
  text = _halve_backslashes(answer)
  for key, value in _UNICODE.items():
    if key in text:
      text = text.replace(key, value)
  units: list[str] = ['dollar'] if '\\$' in text else []
  text = text.replace('\\$', ' ').replace('\\%', '\\% ')
  text = unwrap(text).replace('$', '')
  text = _inner_boxes(text)
  text = re.sub(r'\\[dtc]frac(?![a-zA-Z])', r'\\frac', text)
  text = re.sub(r'\\[dt]binom(?![a-zA-Z])', r'\\binom', text)
  text = re.sub(
    r'\\(?:displaystyle|textstyle|scriptstyle|limits|nolimits)(?![a-zA-Z])', '', text
  )
  text = _DELIMS.sub('', text)
  text = re.sub(r'\{([^{}]*)\\over([^{}]*)\}', r'\\frac{\1}{\2}', text)
  text = re.sub(r'^([^{}]*)\\over([^{}]*)$', r'\\frac{\1}{\2}', text)
  text = text.replace('\\mathbb{R}', '\\reals').replace('\\mathbb R', '\\reals')
  # Thousands separators in their unambiguous LaTeX spellings.
  text = _SPACED_THOUSANDS.sub(r'\1', text)
  percent = bool(_PERCENT.search(text))
  if percent:
    text = _PERCENT.sub(' ', text)
  text = _ANGLE.sub(' ', text)
  text = _TEXT_LABEL.sub('', text)
  text = _TRAILING_TEXT.sub(lambda m: _drop_trailing_text(m, units), text)
  for _ in range(20):
    # Spaces keep a unit apart from its number (5\\mathrm{cm} -> 5 cm).
    new = _WRAP.sub(r' \2 ', text)
    new = _OLD_FONT.sub(r'\1', new)
    if new == text:
      break
    text = new
  degrees = bool(_DEGREES.search(text))
  if degrees:
    text = _DEGREES.sub(' ', text)
  text = _SPACING.sub(' ', text)
  text = _ANSWER_PREFIX.sub('', text)
  text = re.sub(r'^\s*\\approx(?![a-zA-Z])', '', text)
  text = _FUNC_LHS.sub('', text)
  text = _FUNC_VALUE_LHS.sub('', text)
  text = _TRAILING_DOTS.sub(r'\1', text)
  if (
    _INEQUALITY.search(text)
    and len(_FUNC_IN_INEQUALITY.findall(text)) == 1
    and 'y' not in _FUNC_IN_INEQUALITY.sub('', text)
  ):
    text = _FUNC_IN_INEQUALITY.sub('y', text)
  text = _REALS_WORDS.sub(r'\\reals', text.strip())
  text = re.sub(r'\s+', ' ', text).strip()
  for _ in range(2):
    match = _TRAILING_UNIT.match(text) or _GLUED_UNIT.match(text)
    if match and re.search(r'\d', match.group('v')):
      text = match.group('v').strip()
      units.append(match.group('u'))
  text = text.rstrip(' .')
  text = unwrap(text).strip()
  text = _REPEAT.sub(_repeating, text)
  text = re.sub(r'_\{(\w)\}', r'_\1', text)  # x_{1} and x_1, 1011_{2} and 1011_2
  if _PLAIN_SPACED_THOUSANDS.match(text):
    text = text.replace(' ', '')
  if _THOUSANDS.match(text):
    text = text.replace(',', '')
  sci = _SCI.match(text)
  if sci:
    text = f'{sci.group(1)}\\times10^{{{sci.group(2)}}}'
  keys = {unit_key(u) for u in units} - {''}
  unit = keys.pop() if len(keys) == 1 else ''
  return Normalized(text=text, percent=percent, degrees=degrees, unit=unit)
