"""Tokenizer for normalised math answers (first stage of the verifier's parser).

Splits an answer string such as ``\\frac{1}{2} + \\sqrt{3}x`` into ``(kind,
text)`` tokens for ``parser``. Only a fixed vocabulary of LaTeX commands,
Greek letters and function names is accepted; anything else is a ParseError,
and the token count and literal length are guarded before parsing starts.
"""

from __future__ import annotations

from ada_jax.verifier import nodes

# Guards. A trip raises GuardError and the answer scores False.
MAX_TOKENS = 500
MAX_INT_DIGITS = 1000

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
# Function names, as commands (\sin) or bare words (sin); the parser reads
# their arguments.
FUNCS = frozenset(
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
  'approx': '~=',  # E \approx 0.7: a value, then its approximation
  'ne': '!=',
  'neq': '!=',
  'pm': 'pm',
  'mp': 'mp',
  'cup': 'cup',
  'setminus': 'setminus',
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
  [
    'frac',
    'sqrt',
    'binom',
    'lfloor',
    'rfloor',
    'lceil',
    'rceil',
    'begin',
    'end',
    'sum',
  ]
)
# Two-letter words that make an answer text rather than a product (n*o).
_SHORT_WORDS = frozenset(['no', 'is', 'of', 'to', 'it', 'by', 'be', 'on'])
_SINGLE = set('+-*/^_!()[]{},|=<>;&:')


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
        raise nodes.GuardError('literal too long')
      toks.append(('num', text[i:j]))
      i = j
    elif c.isascii() and c.isalpha():
      j = i
      while j < n and text[j].isascii() and text[j].isalpha():
        j += 1
      word = text[i:j]
      i = j
      if word in ('or', 'and'):
        if toks[-1:] != [('op', ',')]:  # 4, 9, and 16: one separator
          toks.append(('op', ','))
      elif word in FUNCS or word == 'sqrt':
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
          raise nodes.ParseError(f'unknown escape \\{nxt}')
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
      elif name in FUNCS or name in _STRUCT_CMDS:
        toks.append(('cmd', name))
      else:
        raise nodes.ParseError(f'unsupported command \\{name}')
    elif text.startswith(('<=', '>=', '!='), i):
      toks.append(('op', text[i : i + 2]))
      i += 2
    elif c in _SINGLE:
      toks.append(('op', c))
      i += 1
    else:
      raise nodes.ParseError(f'unexpected character {c!r}')
    if len(toks) > MAX_TOKENS:
      raise nodes.GuardError('too many tokens')
  return toks
