"""Warms sympy's lazily built machinery once, before any item's clock runs.

Sympy builds parts of its summation code on first use: the first infinite
geometric ``\\sum`` takes about 0.7 s, later ones 0.02 s, so a cold first sum
could run into the verifier's 1 s cooperative deadline. Importing this module
runs ``run()``; the worker pool's forkserver imports it (``pool``), so every
worker starts warm at no cost per worker. Tests call ``run()`` directly.
"""

from __future__ import annotations

from ada_jax.verifier import grade

_WARM = (
  ('\\sum_{k=0}^{\\infty} \\frac{1}{2^k}', '2'),
  ('\\sum_{k=1}^{n} \\frac{1}{k(k+1)}', '\\frac{n}{n+1}'),
  ('2\\begin{pmatrix}1\\\\2\\end{pmatrix}', '\\begin{pmatrix}2\\\\4\\end{pmatrix}'),
  ('-z < 4', 'z > -4'),
)


def run() -> None:
  """Grades a few answers that touch the lazily built paths (results unused)."""
  for answer, reference in _WARM:
    grade.equivalent(answer, reference)


run()
