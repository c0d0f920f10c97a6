"""Hand-written labelled cases for the answer forms of issue 38 (table-driven).

Each case is ``(form, response, reference, expected)``. The first two forms
are the false positive's root cause (undefined values compared equal) and
the time-of-day rule that replaced it; the others are the answer forms the
verifier used to miss. Every form has negatives next to its positives: zero
false positives comes first. Labels follow the policy in the
``ada_jax.verifier.grade`` docstring; the cases were written for this
project, not taken from another grader's tests.
"""

from tests.verifier_cases import b

FORM_CASES: list[tuple[str, str, str, bool]] = [
  # undefined: no two undefined values are equal; only words match one.
  ('undefined', b('1/0'), '2/0', False),
  ('undefined', b('\\frac{5}{0}'), '\\frac{2}{0}', False),
  ('undefined', b('\\tan(\\pi/2)'), '\\tan(3\\pi/2)', False),
  ('undefined', b('\\log(0)'), '\\log(0)+1', False),
  ('undefined', b('\\frac{0}{0}'), '\\frac{3}{0}', False),
  ('undefined', b('\\frac{x}{0}'), '\\frac{2x}{0}', False),
  ('undefined', b('(\\frac{1}{0}, 2]'), '(\\frac{4}{0}, 2]', False),
  ('undefined', b('\\sin(\\infty)'), '\\cos(\\infty)', False),
  ('undefined', b('\\frac{1}{0}'), '\\infty', False),
  ('undefined', b('\\frac{9}{0}'), '\\text{undefined}', False),
  ('undefined', b('-\\infty'), '\\infty', False),
  ('undefined', b('5'), '\\frac{7}{0}', False),
  ('undefined', b('\\text{undefined}'), '5', False),
  ('undefined', b('\\text{undefined}'), '\\frac{7}{0}', True),
  ('undefined', b('\\text{does not exist}'), '\\text{undefined}', True),
  ('undefined', b('DNE'), '\\text{does not exist}', True),
  ('undefined', b('\\text{The limit does not exist}'), 'DNE', True),
  ('undefined', b('\\text{No solution}'), '\\text{undefined}', True),
  ('undefined', b('\\frac{7}{0}'), '\\frac{7}{0}', True),
  ('undefined', b('\\infty'), '\\infty', True),
  ('undefined', b('-\\infty'), '-\\infty', True),
  ('undefined', b('(-\\infty, 3]'), '(-\\infty, 3]', True),
  # time: h:mm against h:mm is a time; otherwise a:b is a ratio.
  ('time', b('3:00'), '10:00', False),
  ('time', b('10:00'), '3:00', False),
  ('time', b('3:00 \\text{ p.m.}'), '3:00 \\text{ a.m.}', False),
  ('time', b('3:00'), '3:00 \\text{ pm}', False),
  ('time', b('4:15'), '4:51', False),
  ('time', b('3'), '3:00', False),
  ('time', b('1:30'), '2:00', False),
  ('time', b('6:0'), '3:0', False),
  ('time', b('03:00'), '3:00', True),
  ('time', b('3:00'), '3:00', True),
  ('time', b('3:00 \\text{ p.m.}'), '3:00 PM', True),
  ('time', b('11:45 \\text{am}'), '11:45 a.m.', True),
  ('time', b('12:05'), '12:05', True),
  ('time', b('4:14'), '2:7', True),
  ('time', b('1:3'), '2:6', True),
]
