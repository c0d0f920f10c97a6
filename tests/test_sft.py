"""Tests for ada_jax.rl.sft_rows: teacher-forced rows, boxed and bare."""

import dataclasses

import numpy as np
import pytest

from ada_jax import data, verifier
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.rl import sft_rows as sft_lib


@pytest.fixture(scope='module')
def tok(tmp_path_factory):
  return tokenizer_lib.build_tiny_tokenizer(tmp_path_factory.mktemp('tok'))


def _examples(n):
  out = []
  for i in range(n):
    problem = f'{i % 10}+{i // 10 % 10}'
    out.append(
      data.Example(
        problem=problem,
        prompt=f'Q:{problem}=',
        reference=str(i % 10 + i // 10 % 10),
        prompt_key=i,
        level=0,
        source='test',
      )
    )
  return out


def _responses(tok, seqs, targets):
  return [
    tok.decode([int(t) for t in s[m == 1]]) for s, m in zip(seqs, targets, strict=True)
  ]


def test_rows_imitate_boxed_answer_then_eos(tok):
  ex = _examples(5)
  seqs, masks, targets = sft_lib.teacher_forcing_rows(
    tok, ex, prompt_len=8, max_new_tokens=8
  )
  assert seqs.shape == masks.shape == targets.shape == (5, 16)
  eos = tok.eos_ids[0]
  for row, target, e in zip(seqs, targets, ex, strict=True):
    resp = row[target == 1]
    assert resp[-1] == eos  # The policy learns to stop.
    assert tok.decode([int(t) for t in resp[:-1]]) == '\\boxed{' + e.reference + '}'
    # The prompt sits left-padded right before column P = 8.
    assert tok.decode([int(t) for t in row[:8] if t != tok.pad_id]) == e.prompt
  assert (targets[:, :8] == 0).all()  # The loss never sees the prompt.
  assert ((targets == 1) <= (masks == 1)).all()


def test_bare_rows_line_up_with_boxed_ones_and_score_zero(tok):
  ex = _examples(30)
  ex.append(dataclasses.replace(ex[0], reference='1234567'))  # Fits only bare.
  kw = dict(prompt_len=8, max_new_tokens=8)
  boxed = sft_lib.teacher_forcing_rows(tok, ex, **kw)
  bare = sft_lib.teacher_forcing_rows(tok, ex, boxed=False, **kw)
  # Both forms keep the same examples (those whose boxed form fits), in order.
  assert boxed[0].shape == bare[0].shape == (30, 16)
  np.testing.assert_array_equal(boxed[0][:, :8], bare[0][:, :8])  # Prompts.
  boxed_texts = _responses(tok, boxed[0], boxed[2])
  bare_texts = _responses(tok, bare[0], bare[2])
  eos = tok.decode([tok.eos_ids[0]])
  for b, t, e in zip(boxed_texts, bare_texts, ex, strict=False):
    assert t == e.reference + eos
    assert b == '\\boxed{' + e.reference + '}' + eos
    # The verifier reads only the boxed form: a bare answer scores 0.
    assert verifier.verify(b, e.reference) and not verifier.verify(t, e.reference)


def test_no_fitting_example_is_an_error(tok):
  with pytest.raises(ValueError, match='none of 3 examples fits'):
    sft_lib.teacher_forcing_rows(tok, _examples(3), prompt_len=2, max_new_tokens=8)


def test_draw_batch_mixes_forms_at_the_boxed_share(tok):
  ex = _examples(50)
  kw = dict(prompt_len=8, max_new_tokens=8)
  boxed = sft_lib.teacher_forcing_rows(tok, ex, **kw)
  bare = sft_lib.teacher_forcing_rows(tok, ex, boxed=False, **kw)
  tokens, mask, target = sft_lib.draw_batch(
    np.random.RandomState(0), boxed, bare, 4000, 0.3
  )
  box_id = tok.encode('\\boxed{')[0]
  is_boxed = tokens[:, 8] == box_id  # The response's first token.
  assert 0.27 < is_boxed.mean() < 0.33  # 4000 draws at 0.3.
  # Every row is one whole row of its form (tokens and masks together).
  rows = {
    f: {tuple(np.concatenate(r)) for r in zip(*s, strict=True)}
    for f, s in (('boxed', boxed), ('bare', bare))
  }
  for t, m, g, b in zip(tokens, mask, target, is_boxed, strict=True):
    assert tuple(np.concatenate([t, m, g])) in rows['boxed' if b else 'bare']
  # Without bare rows the stream draws as before: the same indices, all boxed.
  rs_a, rs_b = np.random.RandomState(1), np.random.RandomState(1)
  only = sft_lib.draw_batch(rs_a, boxed, None, 64, 0.3)
  np.testing.assert_array_equal(only[0], boxed[0][rs_b.randint(0, 50, 64)])
