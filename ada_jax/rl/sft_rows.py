"""The SFT warm start's data: teacher-forced rows of prompt + answer + EOS.

The tiny task's warm start imitates `\\boxed{reference}` followed by EOS
after each left-padded prompt; the loss sees only the response tokens. An
imperfect teacher (`SFTSettings.boxed_share` < 1) is built from two aligned
row sets, boxed and bare (`boxed=False`: the reference without the box the
verifier reads), mixed draw by draw: the warm-start policy then forgets the
format at random on every problem, as base models do, and RL has a
behaviour shared by all problems to learn.

Dimension legend: E examples kept, B batch rows, P prompt bucket, N max new
tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ada_jax import data
from ada_jax import tokenizer as tokenizer_lib

Rows = tuple[np.ndarray, np.ndarray, np.ndarray]


def teacher_forcing_rows(
  tok: tokenizer_lib.Tokenizer,
  examples: Sequence[data.Example],
  *,
  prompt_len: int,
  max_new_tokens: int,
  boxed: bool = True,
) -> Rows:
  """(tokens, attention mask, target mask), each int32 [E, P+N].

  The prompt ends at column P (left padding) and the response starts there,
  as in sampling. Examples whose prompt or boxed response does not fit are
  left out (the data layer already drops long prompts; a response longer
  than N cannot be imitated within the sampling budget either), the same
  ones for both forms, so boxed and bare rows line up example by example.

  Args:
    tok: the tokenizer.
    examples: the SFT problems with their references.
    prompt_len: prompt bucket P.
    max_new_tokens: response budget N.
    boxed: `\\boxed{reference}` (the verifier's format) or the bare reference.

  Raises:
    ValueError: no example fits.
  """
  eos = tok.eos_ids[0]
  width = prompt_len + max_new_tokens
  seqs, masks, targets = [], [], []
  for e in examples:
    p = tok.encode(e.prompt)
    r = [*tok.encode('\\boxed{' + e.reference + '}'), eos]
    if len(p) > prompt_len or len(r) > max_new_tokens:
      continue
    if not boxed:
      r = [*tok.encode(e.reference), eos]
    row = np.full(width, tok.pad_id, np.int32)
    mask = np.zeros(width, np.int32)
    row[prompt_len - len(p) : prompt_len + len(r)] = p + r
    mask[prompt_len - len(p) : prompt_len + len(r)] = 1
    target = np.zeros_like(mask)
    target[prompt_len : prompt_len + len(r)] = 1
    seqs.append(row), masks.append(mask), targets.append(target)
  if not seqs:
    raise ValueError(
      f'SFT: none of {len(examples)} examples fits prompt_len={prompt_len} '
      f'and max_new_tokens={max_new_tokens}'
    )
  return np.stack(seqs), np.stack(masks), np.stack(targets)


def draw_batch(
  rs: np.random.RandomState,
  boxed: Rows,
  bare: Rows | None,
  batch_size: int,
  boxed_share: float,
) -> Rows:
  """A batch of B rows drawn with replacement, each bare with 1 - boxed_share.

  Args:
    rs: the SFT's random stream (without `bare` it draws exactly as before
      imperfect teachers existed, so old runs replay).
    boxed: `teacher_forcing_rows(...)`.
    bare: `teacher_forcing_rows(..., boxed=False)`, or None: always boxed.
    batch_size: B.
    boxed_share: chance that a drawn row is boxed.

  Returns:
    (tokens, attention mask, target mask), each [B, P+N].
  """
  idx = rs.randint(0, len(boxed[0]), batch_size)
  batch = tuple(a[idx] for a in boxed)
  if bare is None:
    return batch
  use_bare = rs.random_sample(batch_size) >= boxed_share
  return tuple(
    np.where(use_bare[:, None], b[idx], a) for a, b in zip(batch, bare, strict=True)
  )
