"""Reward and evaluation graders other than ours: Math-Verify and a Qwen-style one.

``verify_batch(..., backend=NAME)`` grades with one of ``GRADERS``:

  * ``ada``: ours (``grade``), the default everywhere.
  * ``math_verify``: the reference's training reward (Reinforce-Ada's
    ``verl/utils/reward_score/math_verify.py``): the last ``\\boxed{`` of the
    response by a brace counter (``reference_last_box``), then both sides
    re-boxed and ``verify(parse(gold, [LaTeX]), parse(pred, [Expr, LaTeX]),
    6)``. A config may choose it (``verifier.backend``).
  * ``math_verify_eval``: the reference's evaluation of math500,
    olympiadbench and aime_like (its final ``eval/compute_score.py``): the
    last box by its own brace-stack scan (``reference_eval_box``: the last
    ``\boxed{...}`` to close; an unmatched ``}`` anywhere makes it empty;
    ``\boxed 2`` without braces as a fallback), re-boxed, then the same
    Math-Verify calls. (An earlier version of that file passed the whole
    response to Math-Verify.)
  * ``qwen``: the reference's Minerva grader rebuilt on our safe parser
    (``qwen``): "answer is" / last-number fallback, 1e-4 relative tolerance.

Math-Verify's own timeouts are SIGALRM-based and do nothing off the main
thread, so they are passed off here (``parsing_timeout=None``,
``timeout_seconds=None``): the hard per-item deadline is our process pool's
(``pool``), which kills a worker past it. Math-Verify is an optional extra
(``pip install -e '.[math_verify]'``); without it ``require`` raises an
ImportError naming the extra. Math-Verify's parser is not ours: it is only
used when a config or command asks for it.
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

from ada_jax.verifier import grade, normalize

ADA = 'ada'
MATH_VERIFY = 'math_verify'
MATH_VERIFY_EVAL = 'math_verify_eval'
QWEN = 'qwen'
BACKENDS = (ADA, MATH_VERIFY)  # what `verifier.backend` accepts
GRADERS = (ADA, MATH_VERIFY, MATH_VERIFY_EVAL, QWEN)
EXTRA = "pip install -e '.[math_verify]'"
_MV_PRECISION = 6  # math_metric's float_rounding


def check(backend: str) -> None:
  """Raises ValueError for an unknown grader, ImportError for a missing extra."""
  if backend not in GRADERS:
    raise ValueError(f'unknown verifier backend {backend!r}; use one of {GRADERS}')
  if backend in (MATH_VERIFY, MATH_VERIFY_EVAL):
    require()


def require() -> None:
  """Raises ImportError (one line, naming the extra) if Math-Verify is missing."""
  try:
    _math_verify()
  except ImportError as err:
    raise ImportError(
      f"verifier backend 'math_verify' needs Math-Verify: {EXTRA} ({err})"
    ) from None


@functools.cache
def _math_verify() -> Any:
  import math_verify
  from math_verify import parser as mv_parser

  # Its "timeout is disabled" warnings: our pool holds the deadline.
  logging.getLogger('math_verify').setLevel(logging.ERROR)
  return math_verify, mv_parser


def warm(backend: str) -> None:
  """Imports and runs the backend once (a worker does this before its items)."""
  if backend in (MATH_VERIFY, MATH_VERIFY_EVAL):
    _mv_equal('\\boxed{1}', '1')
  elif backend == QWEN:
    from ada_jax.verifier import qwen

    qwen.equal('1', '1')


def reference_last_box(response: str) -> str | None:
  """The reference's extraction: the last ``\\boxed{``, closed by a brace count.

  Content stripped; None without a box, unclosed, or empty (the reference
  scores those 0). Linear time.
  """
  start = response.rfind('\\boxed{')
  if start < 0:
    return None
  depth = 0
  for i in range(start + len('\\boxed'), len(response)):
    c = response[i]
    if c == '{':
      depth += 1
    elif c == '}':
      depth -= 1
      if depth == 0:
        content = response[start + len('\\boxed{') : i].strip()
        return content or None
  return None


_BARE_BOX = re.compile(r'\\boxed\s+([a-zA-Z0-9]+)')


def reference_eval_box(response: str) -> str:
  """The reference evaluation's extraction: the last ``\boxed{...}`` to close.

  Scans every brace with a stack; a ``}`` with nothing open ends the scan
  with '' (scored 0). Without a braced box, ``\boxed 2`` (letters and
  digits) is taken. '' when there is none. Linear time.
  """
  found = None
  opened: list[int] = []
  for i, c in enumerate(response):
    if c == '{':
      opened.append(i)
    elif c == '}':
      if not opened:
        return ''
      start = opened.pop()
      if response.endswith('\\boxed', 0, start):
        found = response[start + 1 : i]
  if found is not None:
    return found
  bare = _BARE_BOX.search(response)
  return bare.group(1) if bare else ''


def _mv_equal(pred_text: str, reference: str) -> bool:
  """``verify(parse(gold), parse(pred))`` as the reference's math_metric calls it."""
  math_verify, p = _math_verify()
  gold = math_verify.parse(
    '\\boxed{' + reference + '}', [p.LatexExtractionConfig()], parsing_timeout=None
  )
  if not gold:  # math_metric raises here; the reference scores it 0
    return False
  pred = math_verify.parse(
    pred_text,
    [p.ExprExtractionConfig(), p.LatexExtractionConfig()],
    parsing_timeout=None,
  )
  return bool(math_verify.verify(gold, pred, _MV_PRECISION, timeout_seconds=None))


def extract(response: str, backend: str) -> str | None:
  """What a grader's worker gets for one response (the parent extracts)."""
  if backend == ADA:
    return normalize.extract(response)
  if backend == MATH_VERIFY:
    return reference_last_box(response)
  if backend == MATH_VERIFY_EVAL:
    return reference_eval_box(response)
  return response  # qwen reads the whole response


def equivalent(answer: str, reference: str, backend: str) -> bool:
  """The verdict of ``backend`` on an extracted answer. Never raises."""
  if backend == ADA:
    return grade.equivalent(answer, reference)
  if backend == QWEN:
    from ada_jax.verifier import qwen

    return qwen.verify(answer, reference)
  grade.add_counts({'calls': 1})
  try:
    # Both Math-Verify graders re-box the extracted answer.
    return _mv_equal('\\boxed{' + answer + '}', reference)
  except Exception:  # a grader error scores 0, as in the reference
    return False


def verify(response: str, reference: str, backend: str) -> bool:
  """One response in this process (no hard deadline: benchmarks, tests)."""
  if not isinstance(response, str) or not isinstance(reference, str):
    return False
  answer = extract(response, backend)
  return answer is not None and equivalent(answer, reference, backend)


def reference_parses(reference: str, backend: str) -> bool:
  """Whether ``backend`` can read the reference (prompt selection's filter)."""
  if backend not in (MATH_VERIFY, MATH_VERIFY_EVAL):
    return grade.reference_parses(reference)
  math_verify, p = _math_verify()
  try:
    return bool(
      math_verify.parse(
        '\\boxed{' + reference + '}',
        [p.LatexExtractionConfig()],
        parsing_timeout=None,
      )
    )
  except Exception:
    return False
