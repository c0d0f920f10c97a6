"""Throughput and agreement of the reward backends: ours and Math-Verify.

Measures, on one fixed mix of realistic (response, reference) pairs:
  * each backend in this process (verifications per second): ``ada``
    (``ada_jax.verifier``) and ``math_verify`` (the reference's reward:
    last box, then ``verify(parse(gold), parse(pred))``, as
    ``verifier.backends`` calls it);
  * each backend through ``verify_batch(backend=...)`` with ``--workers``
    processes (default 2), after a warm-up batch (pool start-up apart);
  * each backend's agreement with the mix's labels (false positives
    counted), the two backends' agreement with each other, and the same on
    the answer kinds of tests/verifier_kind_cases.py (through the pool, with
    a hard per-item deadline ``--timeout-s``: an item past it scores False);
  * the same on the property-based draws of
    tests/verifier_property_cases.py (``--draws`` per answer kind, labelled
    by the generators' own values): each backend's agreement and false
    positives, and where the two backends disagree, which one the
    generator's value says is right, per kind.

Math-Verify is the ``math_verify`` extra: pip install -e '.[math_verify]'.
Without it the script measures ours alone and says so.

Run: python benchmarks/verifier.py [--seconds 5] [--workers 2] [--draws 40]
     [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import pathlib
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


def _agreement(verdicts: list[bool], mix: list[tuple[str, str, bool]]) -> str:
  labels = [label for _, _, label in mix]
  right = sum(v == label for v, label in zip(verdicts, labels, strict=True))
  false_pos = sum(v and not label for v, label in zip(verdicts, labels, strict=True))
  return f'{right}/{len(mix)} ({false_pos} FP)'


def _disagreements(pairs, ada: list[bool], mv: list[bool]) -> str:
  """Per kind, where the backends disagree: how often each is right.

  Right means the verdict equals the generator's value (``Pair.equal``);
  ``kind: ada n / mv m`` counts the disagreements each one wins.
  """
  wins: dict[str, list[int]] = {}
  for p, a, m in zip(pairs, ada, mv, strict=True):
    if a != m:
      counts = wins.setdefault(p.kind, [0, 0])
      counts[0 if a == p.equal else 1] += 1
  if not wins:
    return 'none'
  return ', '.join(f'{k}: ada {a} / mv {m}' for k, (a, m) in sorted(wins.items()))


def _batch_rate(verifier, backend: str, reps: int, workers: int) -> tuple[float, float]:
  responses = [r for r, _, _ in MIX]
  references = [ref for _, ref, _ in MIX]
  start = time.perf_counter()
  verifier.verify_batch(responses, references, workers=workers, backend=backend)
  startup = time.perf_counter() - start
  start = time.perf_counter()
  verifier.verify_batch(
    responses * reps, references * reps, workers=workers, backend=backend
  )
  return len(responses) * reps / (time.perf_counter() - start), startup


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    '--seconds', type=float, default=5.0, help='measuring time per backend'
  )
  parser.add_argument('--workers', type=int, default=2, help='verify_batch processes')
  parser.add_argument(
    '--timeout-s', type=float, default=5.0, help='per-item deadline on the kinds'
  )
  parser.add_argument(
    '--draws', type=int, default=40, help='property-based draws per answer kind'
  )
  parser.add_argument('--json', help='also write the figures to this file')
  args = parser.parse_args()

  sys.path.insert(0, str(_ROOT))
  from ada_jax import verifier
  from ada_jax.verifier import backends
  from tests.verifier_kind_cases import KIND_CASES
  from tests.verifier_property_cases import draws as property_draws

  try:
    backends.require()
    names = backends.BACKENDS
  except ImportError as err:
    print(f'math_verify extra missing ({err}): measuring ours (ada) alone')
    names = (backends.ADA,)
  kinds = [(r, ref, label) for _, r, ref, label in KIND_CASES]
  pairs = property_draws(args.draws)
  drawn = [(p.response, p.reference, p.equal) for p in pairs]
  figures: dict[str, object] = {
    'mix_size': len(MIX),
    'kinds_size': len(kinds),
    'draws_size': f'{len(drawn)} ({args.draws} per kind)',
  }
  verdicts = {}
  for name in names:

    def fn(r, ref, name=name):
      return backends.verify(r, ref, name)

    rate, verdicts[name] = _rate(fn, MIX, args.seconds)
    reps = max(1, int(rate * args.seconds / len(MIX)))
    batch_rate, startup = _batch_rate(verifier, name, reps, args.workers)
    # In the pool: the hard deadline (Math-Verify's timeouts are off).
    kind_verdicts = verifier.verify_batch(
      [r for r, _, _ in kinds],
      [ref for _, ref, _ in kinds],
      timeout_s=args.timeout_s,
      workers=args.workers,
      backend=name,
    ).tolist()
    verdicts[name + '_kinds'] = kind_verdicts
    verdicts[name + '_draws'] = verifier.verify_batch(
      [r for r, _, _ in drawn],
      [ref for _, ref, _ in drawn],
      timeout_s=args.timeout_s,
      workers=args.workers,
      backend=name,
    ).tolist()
    figures[f'{name}_per_s'] = round(rate, 1)
    figures[f'{name}_batch_per_s'] = round(batch_rate, 1)
    figures[f'{name}_batch_startup_s'] = round(startup, 2)
    figures[f'{name}_agreement'] = _agreement(verdicts[name], MIX)
    figures[f'{name}_kinds_agreement'] = _agreement(kind_verdicts, kinds)
    figures[f'{name}_draws_agreement'] = _agreement(verdicts[name + '_draws'], drawn)
  figures['batch_workers'] = args.workers
  if len(names) > 1:
    figures['ratio_ada_over_math_verify'] = round(
      float(figures['ada_per_s']) / float(figures['math_verify_per_s']), 2
    )
    for suffix, mix in (('', MIX), ('_kinds', kinds), ('_draws', drawn)):
      a, m = verdicts['ada' + suffix], verdicts['math_verify' + suffix]
      same = sum(x == y for x, y in zip(a, m, strict=True))
      figures[f'backends_agree{suffix}'] = f'{same}/{len(mix)}'
    figures['draws_disagree_by_kind'] = _disagreements(
      pairs, verdicts['ada_draws'], verdicts['math_verify_draws']
    )
  else:
    figures['backends'] = 'ada only (math_verify extra not installed)'
  width = max(len(k) for k in figures)
  for key, value in figures.items():
    print(f'{key:<{width}}  {value}')
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(figures, indent=2) + '\n')


if __name__ == '__main__':
  main()
