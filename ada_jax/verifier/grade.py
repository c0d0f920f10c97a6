"""Math answer verifier: the binary reward r(response, reference) in {0, 1}.

``verify(response, reference)`` extracts the last boxed answer and decides
whether it is mathematically equivalent to the reference (``pool.verify_batch``
scores many pairs in a process pool with a hard per-item deadline). Pure
Python + sympy; model text is parsed by ``parser`` (never sympify/eval).

The parts (all in ``ada_jax.verifier``): ``normalize`` (extraction,
normalisation), ``lexer`` -> ``parser`` -> ``guards`` -> ``build`` (text to
guarded AST ``nodes`` to sympy), ``values`` (AST to comparable values),
``compare`` and ``scalars`` (the comparison cascade), ``deadline`` and
``pool`` (deadlines). This module is the grading policy.

Policy (every decision, written once; zero false positives comes first):

Extraction
  * The answer is the content of the LAST ``\\boxed{...}`` or ``\\fbox{...}``,
    even when the prose disagrees. No box, ``\\boxed`` without ``{``, an
    unclosed or empty box, or a box over 1,000 characters -> False.
  * Boxes split over one answer: boxes right before the last one join it
    into a list when only list glue stands between them (``,`` ``;`` "and"
    "or", ``$``, spacing, a label such as ``b =``): ``\\boxed{-1}, \\boxed{4}``
    is ``-1, 4``, ``a=\\boxed{3}, b=\\boxed{1}`` is ``3, 1``, and a hedge
    ``\\boxed{2} or \\boxed{3}`` is ``2, 3`` (so it never matches ``2`` or ``3``
    alone). Any other words between boxes (a correction) leave the last box
    alone; identical boxes count once, and boxes that all equal a single
    reference value (``\\boxed{\\frac12}`` or ``\\boxed{0.5}``) match it.
    References are read the same way, and boxes side by side in a reference
    (``\\boxed{3}\\boxed{5}``) are a list too. JSON-escaped boxes
    (``\\\\boxed{3}, \\\\boxed{5}``) join like the others.
  * Several answers: a list is unordered when the reference lists solutions
    (a bare list, a set, several boxes: ``-7, 2`` = ``2, -7``) and ordered
    when it is a tuple or a sequence (``(1, 4)``, a labelled list ``a = 1,
    b = 4``). Solutions written as assignments and separated by ``;`` are
    tuples: ``a=1,b=4;a=3,b=2`` = ``(1,4),(3,2)`` = ``(3,2),(1,4)``.
  * No last-number / "the answer is" fallback in the reward; ``verify(...,
    allow_answer_is=True)`` enables "answer is X" for evaluation only.
  * The reference is authoritative but normalised by the same code; it may come
    boxed or in ``$...$``. An empty or unparseable reference never matches
    anything but an identical normalised string.

Normalisation (both sides)
  * Doubled backslashes (JSON-escaped LaTeX, ``\\\\frac{1}{2}``) are halved
    when every backslash run has even length and one starts a command or a
    spacing command (``1\\\\,+\\\\,x``).
  * Dropped: ``$``, ``\\(\\)``, ``\\[\\]``, ``\\left``/``\\right``, spacing
    commands, ``\\displaystyle``, ``\\limits``, outer braces and boxes (inner
    ``\\boxed{X}`` becomes X), a trailing period, ``\\$``, a leading "the
    answer is", a function prefix ``f(x) =`` or ``f(2) =`` (numeric arguments
    only), dots after a decimal (``0.707\\ldots`` is 0.707), ``\\angle``,
    ``\\triangle``, and a leading label in words (``\\text{Area} = 12``), a
    name of 3-4 capitals (``ABC = 30``) or an expression of point names:
    ``\\frac{AM}{MC} =``, ``|PQ| =``, ``[ABCD] =``, ``S_{ABC} =``,
    ``\\overline{AB} =`` (``2|PQ| = 8`` and ``|x| = 4`` stay equations).
    ``\\text``/``\\mathrm``/``\\mathbf``... are unwrapped. Two answers whose
    normalised strings are equal up to spaces are equivalent (checked first);
    a space between two digits counts (``12 40`` is not ``1240``).
  * Thousands separators only as ``1,000`` (whole answer), ``1{,}000``,
    ``1,\\!000``, a LaTeX space before exactly three digits with optional
    spaces around it (``12\\,400``, ``12 \\, 400``, ``1\\ 234\\ 567``,
    ``12{,} 400``, ``23{ , }417``), or plain spaces when the whole answer is digit groups
    (``12 400``). Any other comma separates list items (``1,2`` is a list,
    never 12; ``12, 400`` is a list).
  * ``1.5e3`` is 1500; ``0.\\overline{3}`` is exactly 1/3; ``2\\frac{1}{2}`` (an
    integer followed by a numeric fraction) is the mixed number 5/2.
  * Units: after a number, a trailing ``\\text{...}`` of words (``3 \\text{
    apples}``, ``5\\,\\text{cm}^2``) or a unit from a fixed list separated by a
    space (``5 cm``, ``10 square units``, ``2 m/s``) is dropped, and so is a
    leading ``\\$`` (a trailing a.m./p.m. stays: it is part of a time). A
    unit of two or more letters may be glued to the number (``12.5cm³``,
    ``36cm^2``; ``5m`` stays a product), and a ``$`` after it is dropped
    (``2,500.50$`` is 2500.50). When both sides name a physical unit
    (length, mass, time, volume, speed, dollars, cents; spellings such as
    cm and centimeters are one unit), it must be the same one, power
    included: ``5 m`` != ``5 cm``, ``40 cm^2`` != ``40 cm``. A unit on one
    side only is dropped; other words (3 apples) are labels.
    "all real numbers" and ``\\mathbb{R}`` are the real line.

Numbers
  * Exact comparison first: ``2/4`` = ``1/2`` (unreduced fractions are
    accepted), ``6/2`` = ``3``, ``2.50`` = ``2.5``, ``2^{100}`` = its digits.
  * Irrational constants are compared numerically at 50 digits with relative
    tolerance 1e-12, then confirmed at 80 digits (1e-40), never with an
    absolute tolerance: ``1/2^{99}`` != ``1/2^{98}``, ``10^{-7}`` !=
    ``2*10^{-7}``, ``\\pi + 10^{-20}`` != ``\\pi``. A reference equal to 0 needs
    a prediction that evaluates exactly to 0.
  * A decimal prediction against a different exact reference is accepted only
    with >= 6 significant digits, strictly within one unit of its last digit,
    and only if the reference cannot be written exactly with that many
    decimals (``0.333333`` = 1/3 and ``0.666666`` = 2/3; ``0.333`` != 1/3;
    ``3.14`` != pi; ``1.0000001`` != 1).
  * An exact prediction against a decimal reference is accepted if it rounds
    to the reference at the reference's printed precision and the reference
    has >= 4 significant digits (``4\\pi`` = ``12.566``, ``\\sqrt2`` =
    ``1.414``; ``1/3`` != ``0.33``).
  * Two different decimals never match (``3.1416`` != ``3.14159``).
  * Percent: only if ``%`` (or the words percent, per cent, percentage,
    pct) appears on one side, ``v%`` also matches ``v`` and ``v/100``
    (``20\\%`` = ``20`` = ``0.2``). Two percentages compare their numbers
    (``0.44\\%`` != ``44\\%``). No x100 rule.
  * Degrees: ``^\\circ``/"degrees" is dropped and numbers compared; no
    degree/radian conversion (``30^\\circ`` != ``\\pi/6``).
  * ``e`` and ``\\mathrm{e}`` are Euler's number, ``i`` is the imaginary unit,
    ``\\log`` without a base is base 10, ``\\sqrt[3]{-8}`` = -2, ``\\infty``
    follows sympy's extended arithmetic (``2\\infty`` = ``\\infty``).
  * ``\\pm`` makes a two-element set: ``1 \\pm \\sqrt2`` = ``{1+\\sqrt2, 1-\\sqrt2}``.
  * Undefined values are equal to nothing, not even to each other: a zero
    denominator, a ratio with a zero term, sympy's ``zoo`` and ``nan``, a limit
    that does not exist (``\\frac{5}{0}`` != ``\\frac{2}{0}``, ``1/0`` !=
    ``2/0``, ``\\tan(\\pi/2)`` != ``\\tan(3\\pi/2)``, ``\\log 0`` !=
    ``\\log 0 + 1``). ``\\infty`` and ``-\\infty`` are ordinary values. An
    undefined reference (``\\frac{7}{0}``, ``\\text{undefined}``, DNE) is
    matched only by the same normalised text or by words that say so
    (undefined, not defined, does not exist, DNE, no solution).
  * Times of day: when both sides have the form h:mm (two-digit minutes
    below 60, an optional am/pm), they are equal exactly when hours, minutes
    and am/pm are (``03:00`` = ``3:00``; ``3:00`` != ``10:00``; ``3:00 pm``
    != ``3:00``). Otherwise ``a:b`` is a ratio (``3:00`` against ``3`` is the
    undefined ratio 3 : 0).

Expressions, equations, structures
  * Products commute wherever they stand (``a_n = n 2^{n-1}`` = ``a_n =
    2^{n-1} n``; a number after a factor with a symbol multiplies it, two
    numbers never do); ``a_{n+1}``, ``S_{ABC}`` are names.
  * Expressions are equal if sympy's evaluated difference is 0, or if at 4
    positive rational points (distinct per symbol, 50 digits, over the union
    of both sides' symbols, so ``\\sin^2 x + \\cos^2 x`` = 1) they agree to
    1e-30 relative, and at 2 negative points they do not disagree where both
    are finite and real (so ``|x|`` != ``x``, ``\\sqrt{x^2}`` != ``x``, while
    ``2\\ln x`` = ``\\ln x^2``).
  * An assignment ``x = 5`` (single or subscripted symbol, ``(x, y)``, or
    ``f(x)``) matches its right side; two assignments need the same left side.
    A consistent numeric chain ``2+3=5`` or ``a=2+3=5`` matches its last part
    (``2+2=5`` and ``y = 2+2+1 = 4 = 9`` match nothing). ``x \\in S`` is ``S``.
  * Labels: a product of capitals without a coefficient (``PQ``, ``A_1B``)
    or a ratio of symbols (``A_1 : A_2``) equal to a symbol-free value is an
    assignment too: ``PQ = 3`` is ``3``. ``3y + w = 2``, ``xy = 6`` (lowercase:
    variables) or ``2PQ = 6`` is an equation, never its right side. A list of assignments to distinct names
    (``MN = 4, ST = 11``, ``a = 3, b = 1``) is ordered: it matches a bare list
    or a tuple in order (``x = 2, x = 3`` or ``x_1 = 2, x_2 = 3``, one name,
    stays a set).
  * Ratios ``a : b`` match proportional ratios (``4:14`` = ``2:7``) and a
    two-part ratio matches its quotient (``2:7`` = ``\\frac27``); a ratio
    with a zero term is undefined (above).
  * Approximation: ``E \\approx d`` (E exact, d a decimal) answers with E,
    or with d against a decimal reference that E rounds to (``\\frac13
    \\approx 0.34`` never answers 0.34), but only if every decimal after
    ``\\approx`` is within one unit of its last digit of E (``\\frac{\\sqrt3}{2} \\approx 0.866`` is
    ``\\frac{\\sqrt3}{2}``; ``\\approx 0.5`` after it matches nothing). A bare
    label before ``\\approx`` is no exact part: ``x \\approx 3.14`` is the
    decimal 3.14 under the rules above. A reference ``E \\approx d`` is E.
  * Equations match if ``lhs - rhs`` of both are proportional (nonzero
    constant ratio at every probe point): ``y=2x+1`` = ``2x-y+1=0``.
  * Inequalities in one variable become intervals, as does ``x \\ne a`` (and
    ``!=``): ``(-\\infty, a) \\cup (a, \\infty)``, and ``S \\setminus \\{a, ...\\}``
    (intervals minus finitely many real points, ``\\mathbb{R} \\setminus \\{a\\}``). Against a reference
    inequality, a prediction interval or any inequality linear in the one
    variable matches (``-y < 2`` = ``y > -2``, ``2z \\ge 6`` = ``z \\ge 3``).
    Against a reference interval only a solved inequality (the bare symbol,
    ``x < 3``, ``-3 \\le w < 8``, ``8 > w \\ge -3``) matches: a model is not
    paid for copying the question's unsolved inequality (``2x+1 < 7``).
    Solved inequalities joined by "or" or commas are a union
    (``x < -1 or x > 3``). A function's value in an inequality is the bare
    symbol (a range: ``-1 < g(x) < 3`` = ``(-1, 3)``). An inequality on an
    absolute value is the union it denotes (``|x| > 2`` = ``(-\\infty, -2)
    \\cup (2, \\infty)``, ``|x - 1| \\ge 2`` = ``(-\\infty, -1] \\cup [3,
    \\infty)``); against a reference interval it counts as solved only when
    the symbol's coefficient is +-1 (``|2x - 1| < 5`` is the question).
  * Sets (``\\{...\\}``, bare comma lists, ``\\pm``, "or"/"and", ``, and``)
    are unordered; a union of written sets is a set (``\\{2,5\\} \\cup
    \\{1,7\\}`` = ``\\{1,2,5,7\\}``).
    A written set ``\\{...\\}`` (on either side) is a set: an element listed
    twice counts once (``\\{3, 5, 3\\}`` = ``\\{3, 5\\}``). Otherwise they are
    multisets of equal size; tuples ``(a, b, c)`` and ``[a, b, c]`` are ordered;
    ``(a, b)`` is a tuple or an open interval and matches both; intervals
    compare closure and endpoints; unions are compared interval by interval.
    A bare list matches a tuple in order.
  * Matrices: same shape, element-wise. A vector tuple never equals a matrix.
    Unevaluated matrix arithmetic is evaluated first: sums, differences,
    scalar multiples and quotients, matrix products (shapes must agree),
    transposes ``M^T``, and
    powers of a rational square matrix of <= 4 rows by an integer 1..20.
  * ``\\sum_{k=a}^{b} body`` (the body is the product that follows, so
    ``\\sum_{j=1}^{4} j^2 + 1`` is 31) is evaluated: numeric bounds with <= 200
    terms; symbolic or infinite bounds only for a polynomial body (powers of
    the index <= 10, never divided by it), a geometric one (the index only
    in exponents) or a telescoping or zeta fraction: ``c / ((a k + b)(a k +
    d))`` (a <= 4 dividing d - b, |b|, |d| <= 10) or ``c / k^p`` (p <= 4). A sum sympy leaves without a closed form -> False.
  * Multiple choice: a reference letter A-E (``C``, ``(C)``, ``\\text{(C)}``,
    ``(C) 12``) matches the prediction's leading option letter,
    case-insensitively (``\\textbf{(C)} 12`` = ``C``); the option text after
    the letter is not checked; a letter never matches a number.
  * Text answers (any word of 3+ letters, or no/is/of/...): lower-cased,
    whitespace-collapsed string equality.
  * Anything that does not parse, or leaves input unconsumed -> False. There is
    no "number found inside a garbage answer" fallback.

Guards and deadlines
  * Before anything is evaluated: <= 500 tokens, depth <= 50, integer literals
    <= 1,000 digits, and every exact numeric intermediate bounded in log10
    space (<= 10^4 digits: towers, ``10000!``, ``10^{-10^{10}}`` trip). A guard
    trip -> False and is counted.
  * ``verify`` carries a cooperative deadline (checked between steps) and, on
    the main thread when SIGALRM is free, an interval timer as a second line.
  * ``verify_batch`` runs items in worker processes; an item over ``timeout_s``
    has its worker killed and replaced and scores False.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import threading
from collections import Counter
from typing import Any

from ada_jax.verifier import compare as vc
from ada_jax.verifier import deadline as vd
from ada_jax.verifier import nodes, parser
from ada_jax.verifier import normalize as an
from ada_jax.verifier import scalars as vs
from ada_jax.verifier import values as vv

_log = logging.getLogger(__name__)

DEADLINE_S = 1.0  # cooperative budget of one verify call
_ALARM_S = 1.5  # hard-ish second line on the main thread
MAX_ITEMS = vv.MAX_ITEMS  # most items in a set or list answer (a guard)
VerifyTimeoutError = vd.VerifyTimeoutError  # a verification ran past its deadline

_COUNTERS: Counter[str] = Counter()
_lock = threading.Lock()


def counters() -> dict[str, int]:
  """Returns the counters since start or the last reset, for training metrics.

  Keys: calls, timeouts (deadline hits), guard_trips (size/depth/magnitude
  guards on a prediction), parse_failures (predictions outside the grammar),
  worker_deaths (items whose pool worker died twice: scored 0, see `pool`).
  A rising guard_trips or timeouts rate is a sign of reward hacking.
  """
  keys = ('calls', 'timeouts', 'guard_trips', 'parse_failures', 'worker_deaths')
  with _lock:
    return {k: _COUNTERS[k] for k in keys}


def reset_counters() -> None:
  """Zeroes the counters (e.g. at the start of a training step)."""
  with _lock:
    _COUNTERS.clear()


def _count(name: str, n: int = 1) -> None:
  with _lock:
    _COUNTERS[name] += n


def add_counts(counts: dict[str, int]) -> None:
  """Adds counter increments made elsewhere (the pool's worker processes)."""
  with _lock:
    _COUNTERS.update(counts)


_MC_REF = re.compile(r'^\(?([A-E])\)?$|^\(([A-E])\)\s.*$')
# The prediction's option letter: (C) anything, a lone C / C. / C), or C. 12;
# never a lowercase letter that starts an expression (a = 3, e^2).
_MC_PRED = re.compile(r'^\(([A-Ea-e])\)|^([A-Ea-e])[.:)]?$|^([A-E])[.:)]\s')


def _text_key(text: str) -> str:
  return re.sub(r'\s+', ' ', re.sub(r'[{}\\]', ' ', text)).strip().lower()


def _space_key(text: str) -> str:
  """The text without spaces, except between digits (``12 40`` is not 1240)."""
  return re.sub(r'(?<!\d) +| +(?!\d)', '', text)


# A time of day: h:mm, two-digit minutes below 60, an optional am/pm.
_TIME = re.compile(r'^(\d{1,2}):([0-5]\d)(?:\s*([ap])\.?\s*m\.?)?$', re.IGNORECASE)
# An undefined value said in words.
_UNDEFINED_WORDS = re.compile(
  r'^(?:(?:the\s+)?(?:limit|value|answer|it)\s+)?(?:is\s+)?'
  r'(?:undefined|not\s+defined|does\s*n[o\']t\s+exist|dne|'
  r'(?:there\s+is\s+)?no\s+(?:real\s+)?solutions?)$'
)


def _time(text: str) -> tuple[int, int, str] | None:
  """``(hours, minutes, 'a' | 'p' | '')`` of a time of day h:mm, else None."""
  match = _TIME.match(text.strip())
  if not match:
    return None
  hours, minutes, half = int(match.group(1)), int(match.group(2)), match.group(3)
  half = (half or '').lower()
  if hours > (12 if half else 23) or (half and hours == 0):
    return None
  return hours, minutes, half


def _says_undefined(text: str) -> bool:
  return bool(_UNDEFINED_WORDS.match(_text_key(text).rstrip('.')))


def _parse(text: str) -> Any:
  return vv.to_value(parser.parse(text))


@functools.lru_cache(maxsize=4096)
def _reference(reference: str) -> tuple[an.Normalized, str, Any]:
  """Normalised and parsed reference: ``(normalized, kind, value)``.

  kind is 'value', 'text' (words) or 'fail'. Cached: RL scores each
  reference for every sample of its group. Values are never mutated.
  """
  ref = an.normalize(an.unwrap(_ref_answer(reference)))
  if not ref.text or _MC_REF.match(ref.text):
    return ref, 'fail', None
  try:
    return ref, 'value', _parse(ref.text)
  except nodes.TextAnswerError:
    return ref, 'text', None
  except (nodes.ParseError, nodes.GuardError):
    return ref, 'fail', None


def reference_parses(reference: str) -> bool:
  """Whether a reference reads as a value, a text answer or a choice letter.

  The paper dropped prompts whose answer Math-Verify cannot parse; ours
  would compare such a reference only by its normalized string.
  """
  ref, kind, _ = _reference(reference)
  return bool(ref.text) and (kind != 'fail' or bool(_MC_REF.match(ref.text)))


def _compare(pred: str, reference: str) -> bool:
  ref, ref_kind, ref_value = _reference(reference)
  if not ref.text:
    return False
  pn = an.normalize(pred)
  if not pn.text:
    return False
  if pn.unit and ref.unit and pn.unit != ref.unit:
    return False  # 5 cm is not 5 m: both sides named a unit, not the same one
  if _space_key(pn.text) == _space_key(ref.text):
    return True
  mc = _MC_REF.match(ref.text)
  if mc:
    pm_ = _MC_PRED.match(pn.text)
    return bool(pm_) and (pm_.group(1) or pm_.group(2) or pm_.group(3)).upper() == (
      mc.group(1) or mc.group(2)
    )
  ref_time, pred_time = _time(ref.text), _time(pn.text)
  if ref_time is not None and pred_time is not None:
    # Both times of day: the same time (03:00 = 3:00), am/pm given alike.
    return pred_time == ref_time
  if (ref_kind == 'text' and _says_undefined(ref.text)) or (
    ref_kind == 'value' and vc.undefined_value(ref_value)
  ):
    # An undefined reference (7/0, DNE): only the same words or text.
    return _says_undefined(pn.text)
  if ref_kind == 'text':
    return _text_key(pn.text) == _text_key(ref.text)
  if ref_kind != 'value':
    return False
  try:
    pred_value = _parse(pn.text)
  except (nodes.ParseError, nodes.GuardError) as err:
    _count('guard_trips' if isinstance(err, nodes.GuardError) else 'parse_failures')
    if isinstance(err, nodes.GuardError):
      _log.debug(
        'verifier guard trip %s: %s', hashlib.sha1(pred.encode()).hexdigest()[:12], err
      )
    return False
  return vc.equiv(pred_value, ref_value, vs.Flags(pn.percent, ref.percent))


def _ref_answer(reference: str) -> str:
  if len(reference) > an.MAX_REFERENCE_CHARS:
    return ''
  if '\\boxed' in reference or '\\fbox' in reference:
    return an.extract(reference, limit=an.MAX_REFERENCE_CHARS, side_by_side=True) or ''
  return reference


def _guarded(fn: Any, *args: Any) -> bool:
  _count('calls')
  vd.start(DEADLINE_S)
  try:
    with vd.Alarm(_ALARM_S):
      return bool(fn(*args))
  except VerifyTimeoutError:
    _count('timeouts')
    return False
  except Exception as err:  # verify never raises: an unexpected error scores 0
    _log.debug('verifier error %r', err)
    return False
  finally:
    vd.clear()


def extract(response: str) -> str | None:
  """Returns the content of the last ``\\boxed{...}``/``\\fbox{...}`` of a response.

  Args:
    response: the model's full response text.

  Returns:
    The box content, or None when there is no box, the last box is not
    followed by ``{``, is unclosed, empty, or over 1,000 characters.
  """
  try:
    return an.extract(response)
  except Exception:  # extract never raises either
    return None


def equivalent(pred: str, ref: str) -> bool:
  """Decides whether an extracted answer is equivalent to the reference.

  Args:
    pred: the answer (box content), at most 1,000 characters.
    ref: the reference answer, plain, ``$...$`` or boxed.

  Returns:
    True only if equivalent under the module's policy. Never raises.
  """
  if (
    not isinstance(pred, str)
    or not isinstance(ref, str)
    or len(pred) > an.MAX_BOX_CHARS
  ):
    return False
  return _guarded(_compare, pred, ref)


def verify(response: str, reference: str, *, allow_answer_is: bool = False) -> bool:
  """The reward: is the last boxed answer of ``response`` equal to ``reference``?

  Args:
    response: the model's full response text (any length; extraction is linear).
    reference: the reference answer, plain, ``$...$`` or boxed.
    allow_answer_is: evaluation only: without a box, use the text after the
      last "answer is". Never set this for the RL reward.

  Returns:
    True or False. Never raises; returns within about 1.5 s on any input.
  """
  if not isinstance(response, str) or not isinstance(reference, str):
    return False
  pred = extract(response)
  if pred is None and allow_answer_is:
    pred = an.extract_answer_is(response)
  if pred is None or len(pred) > an.MAX_BOX_CHARS:
    return False
  return _guarded(_compare, pred, reference)
