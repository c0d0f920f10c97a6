"""Hand-written labelled cases for the answer kinds of issue 19 (table-driven).

Each case is ``(kind, response, reference, expected)``. The kinds are the
answer forms real models write that the verifier used to miss: boxes split
over one answer, doubled backslashes, labelled answers, relations, an exact
value followed by its approximation, percent words, LaTeX-spaced thousands,
unevaluated matrix arithmetic, sets listing an element twice and ``\\sum``.
Every kind has negatives next to its positives: zero false positives comes
first. Labels follow the policy in the ``ada_jax.verifier.grade`` docstring.
"""

from tests.verifier_cases import b

KIND_CASES: list[tuple[str, str, str, bool]] = [
  # multi_box: one answer over several boxes; hedges and corrections differ.
  ('multi_box', 'The roots are $\\boxed{-1}, \\boxed{4}$.', '-1, 4', True),
  ('multi_box', 'The roots are $\\boxed{4}$ and $\\boxed{-1}$.', '\\{-1, 4\\}', True),
  ('multi_box', 'So $\\boxed{-1}, \\boxed{4}$.', '-1', False),
  ('multi_box', 'So $\\boxed{-1}, \\boxed{5}$.', '-1, 4', False),
  ('multi_box', 'It is $\\boxed{2}$ or $\\boxed{3}$.', '2', False),
  ('multi_box', 'It is $\\boxed{2}$ or $\\boxed{3}$.', '3', False),
  ('multi_box', 'It is \\boxed{2} or \\boxed{3}', '2, 3', True),
  ('multi_box', 'We get $a=\\boxed{3}$, $b=\\boxed{1}$.', '(3, 1)', True),
  ('multi_box', 'We get $a=\\boxed{1}$, $b=\\boxed{3}$.', '(3, 1)', False),
  ('multi_box', 'Wrong: \\boxed{6}. After checking, \\boxed{7}.', '7', True),
  ('multi_box', 'Wrong: \\boxed{6}. After checking, \\boxed{7}.', '6, 7', False),
  ('multi_box', b('7'), '\\boxed{3}, \\boxed{7}', False),
  ('multi_box', b('3, 7'), '\\boxed{3}, \\boxed{7}', True),
  ('multi_box', '\\boxed{x=5} ; \\boxed{y=-2}', '(5, -2)', True),
  ('multi_box', '\\boxed{8}, \\boxed{8}', '8', True),
  # double_backslash: JSON-escaped LaTeX.
  ('double_backslash', b('\\\\frac{1}{2}'), '\\frac12', True),
  ('double_backslash', b('\\\\frac{1}{3}'), '\\frac12', False),
  ('double_backslash', b('\\\\sqrt{3}'), '\\sqrt{3}', True),
  ('double_backslash', b('2\\\\pi'), '2\\pi', True),
  ('double_backslash', b('2\\\\pi'), '\\pi', False),
  ('double_backslash', b('\\frac{5}{7}'), '\\\\frac{5}{7}', True),
  ('double_backslash', b('\\frac{7}{5}'), '\\\\frac{5}{7}', False),
  ('double_backslash', '\\\\boxed{\\\\dfrac{9}{4}}', '\\frac{9}{4}', True),
  (
    'double_backslash',
    b('\\\\begin{pmatrix} 3 \\\\\\\\ 5 \\\\end{pmatrix}'),
    '\\begin{pmatrix}3\\\\5\\end{pmatrix}',
    True,
  ),
  (
    'double_backslash',
    b('\\\\begin{pmatrix} 5 \\\\\\\\ 3 \\\\end{pmatrix}'),
    '\\begin{pmatrix}3\\\\5\\end{pmatrix}',
    False,
  ),
  ('double_backslash', b('\\\\{2, 9\\\\}'), '\\{9, 2\\}', True),
  # labelled: named answers against bare values.
  ('labelled', b('MN = 4, ST = 11'), '4, 11', True),
  ('labelled', b('MN = 11, ST = 4'), '4, 11', False),
  ('labelled', b('BC = 13'), '13', True),
  ('labelled', b('BC = 12'), '13', False),
  ('labelled', b('P_1 : P_2 = 2 : 7'), '2:7', True),
  ('labelled', b('P_1 : P_2 = 7 : 2'), '2:7', False),
  ('labelled', b('4:14'), '2:7', True),
  ('labelled', b('2:7'), '\\frac{2}{7}', True),
  ('labelled', b('p = 6, q = -1'), '(6, -1)', True),
  ('labelled', b('p = -1, q = 6'), '(6, -1)', False),
  ('labelled', b('5m + k = 4'), '4', False),
  ('labelled', b('3y+w=2'), '2', False),
  ('labelled', b('xy = 6'), '6', True),
  ('labelled', b('2xy = 6'), '6', False),
  ('labelled', b('y = 2+2+1 = 4 = 9'), '9', False),
  ('labelled', b('y = 2+2+1 = 5'), '5', True),
  # relation: != and \neq, flipped inequalities, double inequality vs interval.
  ('relation', b('t \\neq 5'), 't \\ne 5', True),
  ('relation', b('t != 5'), 't \\neq 5', True),
  ('relation', b('t \\neq -5'), 't \\neq 5', False),
  ('relation', b('t \\neq 5'), '5', False),
  ('relation', b('t \\neq 5'), 't = 5', False),
  ('relation', b('(-\\infty, 5) \\cup (5, \\infty)'), 't \\neq 5', True),
  ('relation', b('-z < 4'), 'z > -4', True),
  ('relation', b('-z < 4'), 'z < -4', False),
  ('relation', b('2z \\geq 6'), 'z \\geq 3', True),
  ('relation', b('2z \\geq 6'), 'z > 3', False),
  ('relation', b('-3 \\le w < 8'), '[-3, 8)', True),
  ('relation', b('-3 < w < 8'), '[-3, 8)', False),
  ('relation', b('w > 1'), '(1, \\infty)', True),
  ('relation', b('w \\geq 1'), '(1, \\infty)', False),
  ('relation', b('2w + 1 > 3'), '(1, \\infty)', False),
  ('relation', b('8 > w \\ge -3'), '[-3, 8)', True),
  # approx: an exact value followed by its approximation.
  ('approx', b('\\frac{\\sqrt{3}}{2} \\approx 0.866'), '\\frac{\\sqrt3}{2}', True),
  ('approx', b('\\frac{\\sqrt{3}}{2} \\approx 0.866'), '\\frac{\\sqrt2}{2}', False),
  ('approx', b('\\frac{\\sqrt{3}}{2} \\approx 0.5'), '\\frac{\\sqrt3}{2}', False),
  ('approx', b('4\\pi \\approx 12.57'), '4\\pi', True),
  ('approx', b('4\\pi \\approx 12.57'), '12.57', True),
  ('approx', b('4\\pi \\approx 12.57'), '12.6', False),
  ('approx', b('r = \\sqrt{7} \\approx 2.6458'), '\\sqrt7', True),
  ('approx', b('\\sqrt{7} \\approx 2.65'), '\\sqrt{6}', False),
  ('approx', b('e^2 \\approx 7.39'), 'e^2', True),
  ('approx', b('\\approx 7.39'), 'e^2', False),
  ('approx', b('\\frac{22}{7} \\approx 3.14'), '\\pi', False),
  ('approx', b('y \\approx 1.73'), '\\sqrt{3}', False),
  # percent_word
  ('percent_word', b('35 \\text{ percentage}'), '35\\%', True),
  ('percent_word', b('35 pct'), '35\\%', True),
  ('percent_word', b('35 pct'), '0.35', True),
  ('percent_word', b('53 pct'), '35\\%', False),
  ('percent_word', b('0.35'), '35 \\text{ percent}', True),
  ('percent_word', b('3.5 \\text{ percentage}'), '35\\%', False),
  ('percent_word', b('35 \\text{ percentage points}'), '35', True),
  ('percent_word', b('35'), '3500', False),
  # thousands_spacing: LaTeX spacing inside a number.
  ('thousands_spacing', b('12\\, 400'), '12400', True),
  ('thousands_spacing', b('12 \\, 400'), '12400', True),
  ('thousands_spacing', b('12\\;400'), '12400', True),
  ('thousands_spacing', b('1\\ 234\\ 567'), '1234567', True),
  ('thousands_spacing', b('12{,} 400'), '12400', True),
  ('thousands_spacing', b('12 400'), '12400', True),
  ('thousands_spacing', b('12\\, 400'), '12401', False),
  ('thousands_spacing', b('12\\, 40'), '1240', False),
  ('thousands_spacing', b('12 400'), '0', False),
  ('thousands_spacing', b('12, 400'), '12400', False),
  ('thousands_spacing', b('3.141\\,59'), '3.14159', False),
  ('thousands_spacing', b('7\\,500 \\text{ dollars}'), '7500', True),
  # matrix_arith: unevaluated matrix arithmetic.
  (
    'matrix_arith',
    b('3\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}'),
    '\\begin{pmatrix}3\\\\-6\\end{pmatrix}',
    True,
  ),
  (
    'matrix_arith',
    b('3\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}'),
    '\\begin{pmatrix}3\\\\6\\end{pmatrix}',
    False,
  ),
  (
    'matrix_arith',
    b(
      '\\begin{pmatrix} 1 & 0 \\\\ 2 & 1 \\end{pmatrix} + \\begin{pmatrix} 0 & 5 \\\\ 0 & 0 \\end{pmatrix}'
    ),
    '\\begin{pmatrix}1&5\\\\2&1\\end{pmatrix}',
    True,
  ),
  (
    'matrix_arith',
    b(
      '\\begin{pmatrix} 1 & 1 \\\\ 0 & 1 \\end{pmatrix}\\begin{pmatrix} 2 \\\\ 3 \\end{pmatrix}'
    ),
    '\\begin{pmatrix}5\\\\3\\end{pmatrix}',
    True,
  ),
  (
    'matrix_arith',
    b(
      '\\begin{pmatrix} 2 \\\\ 3 \\end{pmatrix}\\begin{pmatrix} 1 & 1 \\\\ 0 & 1 \\end{pmatrix}'
    ),
    '\\begin{pmatrix}5\\\\3\\end{pmatrix}',
    False,
  ),
  (
    'matrix_arith',
    b('\\frac{1}{2}\\begin{pmatrix} 4 & 2 \\\\ 0 & 6 \\end{pmatrix}'),
    '\\begin{pmatrix}2&1\\\\0&3\\end{pmatrix}',
    True,
  ),
  (
    'matrix_arith',
    b('\\begin{pmatrix} 1 & 1 \\\\ 0 & 1 \\end{pmatrix}^{3}'),
    '\\begin{pmatrix}1&3\\\\0&1\\end{pmatrix}',
    True,
  ),
  (
    'matrix_arith',
    b('\\begin{pmatrix} 1 & 1 \\\\ 0 & 1 \\end{pmatrix}^{3}'),
    '\\begin{pmatrix}1&1\\\\0&1\\end{pmatrix}',
    False,
  ),
  (
    'matrix_arith',
    b(
      '\\begin{pmatrix} 4 \\\\ 1 \\end{pmatrix} - \\begin{pmatrix} 1 \\\\ 1 \\end{pmatrix}'
    ),
    '\\begin{pmatrix}3\\\\0\\end{pmatrix}',
    True,
  ),
  ('matrix_arith', b('2\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}'), '(2, 4)', False),
  # set_duplicate: a set that lists an element twice.
  ('set_duplicate', b('\\{3, 5, 3\\}'), '\\{3, 5\\}', True),
  ('set_duplicate', b('\\{3, 5\\}'), '\\{5, 3, 5\\}', True),
  ('set_duplicate', b('\\{3, 5, 3\\}'), '\\{3, 5, 7\\}', False),
  ('set_duplicate', b('\\{3, 3\\}'), '\\{3, 5\\}', False),
  ('set_duplicate', b('\\{2, \\frac{4}{2}, 6\\}'), '\\{2, 6\\}', True),
  ('set_duplicate', b('(3, 5, 3)'), '(3, 5)', False),
  ('set_duplicate', b('3, 5, 3'), '3, 5', False),
  # sum: \sum expressions.
  ('sum', b('\\sum_{k=1}^{10} k'), '55', True),
  ('sum', b('\\sum_{k=1}^{10} k'), '56', False),
  ('sum', b('\\sum_{j=1}^{4} j^2'), '30', True),
  ('sum', b('\\sum_{j=1}^{4} j^2 + 1'), '31', True),
  ('sum', b('\\sum_{j=1}^{4} j^2 + 1'), '\\sum_{j=1}^{4} (j^2 + 1)', False),
  ('sum', b('\\sum_{i=1}^{n} i'), '\\frac{n(n+1)}{2}', True),
  ('sum', b('\\sum_{i=1}^{n} i'), '\\frac{n(n-1)}{2}', False),
  ('sum', b('\\sum_{m=0}^{\\infty} \\frac{1}{3^m}'), '\\frac32', True),
  ('sum', b('\\sum_{m=0}^{\\infty} \\frac{1}{3^m}'), '3', False),
  ('sum', b('\\sum\\limits_{k=1}^{3} \\frac{1}{k}'), '\\frac{11}{6}', True),
  ('sum', b('\\sum_{k=1}^{10^{9}} k^{k}'), '1', False),
]
