"""Throughput of the answer verifier, side by side with Math-Verify.

Measures, on one fixed mix of realistic (response, reference) pairs:
  * ``ada_jax.verifier.verify`` in this process (verifications per second);
  * Math-Verify configured as Reinforce-Ada trains with it (last box
    extracted, both sides re-boxed, ``math_metric`` with LaTeX gold and
    Expr+LaTeX prediction targets), in this process when ``math_verify``
    imports, otherwise in a subprocess running ``--mv-python`` (default
    ``$MATH_VERIFY_PYTHON`` or .venv-mathverify/bin/python);
  * ``ada_jax.verifier.verify_batch`` with ``--workers`` processes (default 2),
    after a warm-up batch (pool start-up is reported apart).
It also reports each verifier's agreement with the mix's labels.

Math-Verify is a benchmark-only dependency (not in requirements.txt):
  python -m venv .venv-mathverify && .venv-mathverify/bin/pip install math-verify

Run: python benchmarks/verifier.py [--seconds 5] [--workers 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

_ROOT = pathlib.Path(__file__).resolve().parents[1]

_REASONING = (
  "Let's think step by step. We set up the equation from the problem statement, "
  'substitute the known values and simplify. Expanding the product gives a quadratic, '
  'and checking both roots against the constraints leaves a single candidate. '
) * 6

# (boxed answer, reference, label): a mix weighted like math RL rollouts
# (mostly integers and fractions, some structured answers, ~40% wrong).
_ANSWERS = [
  ('42', '42', True),
  ('41', '42', False),
  ('7', '7', True),
  ('12', '18', False),
  ('1024', '2^{10}', True),
  ('-3', '-3', True),
  ('3', '-3', False),
  ('\\frac{1}{2}', '\\frac12', True),
  ('0.5', '\\frac{1}{2}', True),
  ('\\frac{3}{4}', '\\frac{2}{3}', False),
  ('\\dfrac{5}{12}', '\\frac{5}{12}', True),
  ('2\\sqrt{2}', '\\sqrt{8}', True),
  ('\\sqrt{3}', '\\sqrt{2}', False),
  ('\\frac{\\sqrt{3}}{2}', '\\frac{\\sqrt3}{2}', True),
  ('4\\pi', '4\\pi', True),
  ('8\\pi', '4\\pi', False),
  ('\\frac{\\pi}{3}', '\\frac{\\pi}{3}', True),
  ('30^\\circ', '30', True),
  ('20\\%', '20', True),
  ('1,000', '1000', True),
  ('(1, 2)', '(1,2)', True),
  ('(2, 1)', '(1,2)', False),
  ('[-1, 3)', '[-1,3)', True),
  ('(-1, 3]', '[-1,3)', False),
  ('\\{1, 2\\}', '\\{2,1\\}', True),
  ('x^2+2x+1', '(x+1)^2', True),
  ('x^2+1', '(x+1)^2', False),
  ('y = 2x + 3', 'y=2x+3', True),
  ('\\text{(C)}', 'C', True),
  ('B', 'C', False),
  ('3+4i', '3+4i', True),
  (
    '\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}',
    '\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}',
    True,
  ),
  ('5 \\text{ cm}', '5', True),
  ('\\frac{1}{2^{99}}', '\\frac{1}{2^{98}}', False),
  ('0.333', '\\frac13', False),
  ('x = 5', '5', True),
  ('2, 3', '3, 2', True),
  ('\\text{Monday}', '\\text{Monday}', True),
  ('17', '\\frac{34}{2}', True),
  ('100', '99', False),
]

MIX: list[tuple[str, str, bool]] = [
  (f'{_REASONING}Therefore the answer is $\\boxed{{{a}}}$.', ref, label)
  for a, ref, label in _ANSWERS
]


def _ra_extract(s: str) -> str | None:
  """Reinforce-Ada's extract_boxed_answer: last ``\\boxed{``, a depth counter."""
  i = s.rfind('\\boxed{')
  if i < 0:
    return None
  depth, j = 0, i + len('\\boxed')
  start = j + 1
  while j < len(s):
    if s[j] == '{':
      depth += 1
    elif s[j] == '}':
      depth -= 1
      if depth == 0:
        return s[start:j]
    j += 1
  return None


def _make_peer():
  """Math-Verify as Reinforce-Ada configures it (metric compiled once)."""
  from math_verify.metric import math_metric
  from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

  metric = math_metric(
    gold_extraction_target=(LatexExtractionConfig(),),
    pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()),
  )

  def score(response: str, reference: str) -> bool:
    content = _ra_extract(response)
    if not content:
      return False
    try:
      value, _ = metric(['\\boxed{' + reference + '}'], ['\\boxed{' + content + '}'])
    except BaseException:  # its TimeoutException is a BaseException
      return False
    return value > 0.5

  return score


def _rate(
  fn, mix: list[tuple[str, str, bool]], seconds: float
) -> tuple[float, list[bool]]:
  verdicts = [bool(fn(r, ref)) for r, ref, _ in mix]  # warm-up and labels
  n, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    for r, ref, _ in mix:
      fn(r, ref)
    n += len(mix)
  return n / (time.perf_counter() - start), verdicts


def _peer_worker() -> None:
  """Subprocess mode: mix and seconds as JSON on stdin, figures on stdout."""
  cfg = json.load(sys.stdin)
  mix = [tuple(c) for c in cfg['mix']]
  rate, verdicts = _rate(_make_peer(), mix, cfg['seconds'])
  print(json.dumps({'rate': rate, 'verdicts': verdicts}))


def _peer(seconds: float, python: str) -> dict[str, object]:
  try:
    score = _make_peer()
  except ImportError:
    if not pathlib.Path(python).exists():
      raise SystemExit(
        f'Math-Verify interpreter {python} not found (see the docstring)'
      ) from None
    out = subprocess.run(
      [python, __file__, '--peer-worker'],
      input=json.dumps({'mix': MIX, 'seconds': seconds}),
      capture_output=True,
      text=True,
      check=True,
      timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])
  rate, verdicts = _rate(score, MIX, seconds)
  return {'rate': rate, 'verdicts': verdicts}


def _agreement(verdicts: list[bool]) -> tuple[int, int]:
  right = sum(v == label for v, (_, _, label) in zip(verdicts, MIX, strict=True))
  false_pos = sum(
    v and not label for v, (_, _, label) in zip(verdicts, MIX, strict=True)
  )
  return right, false_pos


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    '--seconds', type=float, default=5.0, help='measuring time per verifier'
  )
  parser.add_argument('--workers', type=int, default=2, help='verify_batch processes')
  parser.add_argument(
    '--mv-python',
    default=os.environ.get(
      'MATH_VERIFY_PYTHON', str(_ROOT / '.venv-mathverify' / 'bin' / 'python')
    ),
    help='interpreter with math-verify installed (used when it does not import here)',
  )
  parser.add_argument('--json', help='also write the figures to this file')
  parser.add_argument('--peer-worker', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.peer_worker:
    _peer_worker()
    return

  # Imported here so that the --peer-worker mode needs only math-verify.
  sys.path.insert(0, str(_ROOT))
  from ada_jax import verifier

  ours_rate, ours_verdicts = _rate(verifier.verify, MIX, args.seconds)
  peer = _peer(args.seconds, args.mv_python)

  reps = max(1, int(ours_rate * args.seconds / len(MIX)))
  responses = [r for r, _, _ in MIX] * reps
  references = [ref for _, ref, _ in MIX] * reps
  start = time.perf_counter()
  verifier.verify_batch(
    responses[: len(MIX)], references[: len(MIX)], workers=args.workers
  )
  startup = time.perf_counter() - start
  start = time.perf_counter()
  batch = verifier.verify_batch(responses, references, workers=args.workers)
  batch_rate = len(responses) / (time.perf_counter() - start)
  assert batch[: len(MIX)].tolist() == ours_verdicts

  ours_right, ours_fp = _agreement(ours_verdicts)
  peer_right, peer_fp = _agreement(peer['verdicts'])  # type: ignore[arg-type]
  figures = {
    'mix_size': len(MIX),
    'verify_per_s': round(ours_rate, 1),
    'math_verify_per_s': round(float(peer['rate']), 1),  # type: ignore[arg-type]
    'ratio': round(ours_rate / float(peer['rate']), 2),  # type: ignore[arg-type]
    'verify_batch_per_s': round(batch_rate, 1),
    'verify_batch_workers': args.workers,
    'verify_batch_startup_s': round(startup, 2),
    'verify_agreement': f'{ours_right}/{len(MIX)} ({ours_fp} FP)',
    'math_verify_agreement': f'{peer_right}/{len(MIX)} ({peer_fp} FP)',
  }
  width = max(len(k) for k in figures)
  for key, value in figures.items():
    print(f'{key:<{width}}  {value}')
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(figures, indent=2) + '\n')


if __name__ == '__main__':
  main()
