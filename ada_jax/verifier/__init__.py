"""The reward: is a model's answer equal to the reference? Pure Python + sympy.

Owns everything between a response's text and its 0/1 reward: extracting
the last boxed answer (`normalize`), a hand-written LaTeX lexer and parser
into guarded AST nodes (`lexer`, `parser`, `guards`, `nodes`, `build`: model
text is never handed to sympify or eval), comparable values and the
comparison cascade (`values`, `compare`, `scalars`), cooperative and hard
deadlines (`deadline`), the grading policy (`grade`) and the worker-process
pool with a per-item deadline (`pool`). `backends` puts the reference's
graders behind the same pool (`verify_batch(..., backend=...)`): Math-Verify
(the optional `math_verify` extra) and a Qwen2.5-Math-style grader (`qwen`)
on our parser, for evaluation.

May import: nothing of ada_jax outside this package, and never JAX (a
test checks), so the reward runs anywhere, in cheap worker processes;
Math-Verify only when a backend asks for it.

Public API: `verify`, `verify_batch`, `extract`, `equivalent`,
`reference_parses`, `counters`, `reset_counters`.
"""

from ada_jax.verifier.grade import (
  counters,
  equivalent,
  extract,
  reference_parses,
  reset_counters,
  verify,
)
from ada_jax.verifier.pool import verify_batch

__all__ = [
  'counters',
  'equivalent',
  'extract',
  'reference_parses',
  'reset_counters',
  'verify',
  'verify_batch',
]
