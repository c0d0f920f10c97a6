"""Tests for ada_jax.select_prompts: the pure steps by hand, then the command.

The selection rule on hand-built correctness matrices with closed-form
answers; deduplication and reference parsing on labelled cases; and one run
of the command line on the tiny model over a small local file with a
duplicate and an unparsable reference, scored by a recording stand-in
verifier, so the test rescores the very answers the command saw.
"""

import collections
import json
import pathlib
import shutil
import warnings
import zlib

import numpy as np
import pytest

from ada_jax import data, from_config, select_prompts, sweep, verifier
from ada_jax.datasets import prompt_key
from ada_jax.rl import scoring

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_select_by_hand():
  k = 16
  counts = np.arange(k + 1)  # One prompt per number of correct answers.
  correct = np.arange(k)[None, :] < counts[:, None]
  assert (correct.sum(axis=1) == counts).all()
  # Hard: 1-2 of 16 (0.125); easy/moderate: 1-5 of 16 (0.313).
  assert np.flatnonzero(select_prompts.select(correct, 0.125)).tolist() == [1, 2]
  assert np.flatnonzero(select_prompts.select(correct, 0.313)).tolist() == [
    1,
    2,
    3,
    4,
    5,
  ]
  assert select_prompts.select(correct, 1.0).tolist() == [False] + [True] * k
  # A bound that is a float rounding of a count keeps that count (1/3 of 3).
  third = np.array([[True, False, False], [True, True, False]])
  assert select_prompts.select(third, 1 / 3).tolist() == [True, False]
  # Order within a row does not matter, only the count.
  rng = np.random.default_rng(0)
  shuffled = np.array([rng.permutation(row) for row in correct])
  assert (
    select_prompts.select(shuffled, 0.125) == select_prompts.select(correct, 0.125)
  ).all()


@pytest.mark.parametrize(
  'reference, parses',
  [
    ('5', True),
    ('\\frac{1}{2}', True),
    ('$x = 3$', True),
    ('\\boxed{\\sqrt{2}}', True),
    ('(1, 2)', True),
    ('C', True),  # A multiple-choice letter.
    ('all real numbers', True),  # A text answer.
    ('(((', False),
    ('2+*3', False),
    ('', False),
    ('\\boxed{}', False),
  ],
)
def test_reference_parses(reference, parses):
  assert verifier.reference_parses(reference) == parses


def test_prefilter_dedups_first_then_parses():
  keys = [prompt_key(p) for p in ('1+1', '2+2', ' 1+1 ', '3+3', '4+4', '3+3')]
  refs = ['2', '(((', '(((', '6', '', '6']
  kept, duplicates, unparsable = select_prompts.prefilter(keys, refs)
  # '1+1' twice (the key strips spaces) and '3+3' twice; '2+2' and '4+4'
  # have references the verifier cannot read.
  assert (kept, duplicates, unparsable) == ([0, 3], 2, 2)


# The command line on the tiny model.

ROWS = [
  ('2+3', '5'),
  ('7*6', '42'),
  ('9-3', '6'),
  ('8+8', '16'),
  ('7*6', '42'),  # Duplicate of row 2.
  ('3*3', '((('),  # The verifier cannot parse the reference.
  ('6+7', '13'),
  ('9*9', '81'),
  ('5+5', '10'),
]


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  """A tiny-config checkpoint trained on nothing, over the local rows."""
  root = tmp_path_factory.mktemp('select')
  manual = root / 'manual' / 'custom'
  manual.mkdir(parents=True)
  (manual / 'rows.jsonl').write_text(
    ''.join(json.dumps({'problem': p, 'answer': a}) + '\n' for p, a in ROWS)
  )
  settings = {  # The local rows as the training set; 4 prompts per step fit.
    'data.name': 'ada_math_local/custom',
    'data.manual_dir': root / 'manual',
    'data.data_dir': root / 'tfds',
    'data.eval_split': '',
    'data.levels': '',  # The tiny task's band of ada_arith levels.
    'rl.prompts_per_step': 4,
    'rl.mini_batch_rows': 16,
    'rl.micro_batch_rows': 16,
  }
  overrides = [f'--config.{key}={value}' for key, value in settings.items()]
  c = sweep.build_config(
    str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format', overrides
  )
  trainer = from_config.trainer(c, str(root / 'run'))
  trainer.save(force=True)
  trainer.ckpt.wait()
  return {'root': root, 'run': str(root / 'run'), 'overrides': overrides}


def test_command_selects_by_the_rescored_answers(workdir, monkeypatch, capsys):
  seen = collections.defaultdict(list)  # reference -> scores, k per prompt.

  def recording_verify(responses, references, *, timeout_s=2.0, workers=None):
    scores = [
      zlib.crc32(f'{r}|{f}'.encode()) % 2 == 0
      for r, f in zip(responses, references, strict=True)
    ]
    for f, s in zip(references, scores, strict=True):
      seen[f].append(s)
    return np.array(scores)

  monkeypatch.setattr(verifier, 'verify_batch', recording_verify)
  out = workdir['root'] / 'selected' / 'sel.jsonl'
  k, bound = 4, 0.5
  select_prompts.main(
    [
      '--config',
      str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format',
      '--checkpoint',
      workdir['run'],
      '--k',
      str(k),
      '--max-pass-rate',
      str(bound),
      '--slots',
      '8',
      '--out',
      str(out),
      *workdir['overrides'],
    ]
  )
  printed = capsys.readouterr().out
  report = json.loads(out.with_name('sel.histogram.json').read_text())
  counts = report['counts']
  assert counts['input'] == len(ROWS)
  assert (counts['duplicates'], counts['unparsable_reference']) == (1, 1)
  assert counts['sampled'] == len(ROWS) - 2 == len(seen)
  assert '(((' not in seen
  # Independent scoring: each distinct reference was sampled k times.
  rates = {ref: np.mean(s) for ref, s in seen.items()}
  assert all(len(s) == k for s in seen.values())
  expected = {ref for ref, p in rates.items() if 0 < p <= bound}
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert {r['answer'] for r in rows} == expected
  assert 0 < counts['kept'] == len(rows) < counts['sampled']
  for r in rows:
    assert 0 < r['pass_rate'] == rates[r['answer']] <= bound
    assert r['correct'] == round(r['pass_rate'] * k) and r['k'] == k
  assert counts['no_correct_answer'] == sum(p == 0 for p in rates.values())
  assert report['pass_rate_histogram'] == [
    list(b) for b in scoring.histogram(np.array(list(rates.values())))
  ]
  assert f'kept: {counts["kept"]}' in printed and 'pass rates (4 samples' in printed
  # The data builder reads the output as a prompt set (copied as the
  # docstring says), without a bad row.
  manual = workdir['root'] / 'manual_selected'
  (manual / 'custom').mkdir(parents=True)
  shutil.copy(out, manual / 'custom')
  with warnings.catch_warnings():
    warnings.simplefilter('error', UserWarning)
    examples = data.load_examples(
      'ada_math_local/custom',
      'train',
      data_dir=workdir['root'] / 'tfds_selected',
      manual_dir=manual,
      template='tiny',
    )
  assert sorted(e.problem for e in examples) == sorted(r['problem'] for r in rows)
  assert sorted(e.reference for e in examples) == sorted(expected)


def test_command_rejects_bad_flags():
  with pytest.raises(SystemExit):
    select_prompts.main(
      ['--config', 'c.py', '--checkpoint', 'x', '--out', 'o', '--k', '0']
    )
  with pytest.raises(SystemExit):
    select_prompts.main(
      ['--config', 'c.py', '--checkpoint', 'x', '--out', 'o', '--bogus']
    )
