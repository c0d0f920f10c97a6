"""The SFT warm start's data: teacher-forced rows of prompt + answer + EOS.

The tiny task's warm start imitates `\\boxed{reference}` followed by EOS
after each left-padded prompt; the loss sees only the response tokens. An
imperfect teacher (`SFTSettings.boxed_share` < 1) is built from two aligned
row sets, boxed and bare (`boxed=False`: the reference without the box the
verifier reads), mixed draw by draw: the warm-start policy then forgets the
format at random on every problem, as base models do, and RL has a
behaviour shared by all problems to learn.

The `ada_columns` task's teacher (`demonstration_rows`) writes worked column
solutions, noting every carry but forgetting to add each one with a
probability: every solution it can write is a row, drawn with the
probability the teacher writes it, so the warm start learns the teacher's
slips as a distribution, on every problem.

Dimension legend: E examples kept, D demonstrations (rows of all examples),
B batch rows, P prompt bucket, N max new tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from ada_jax import data
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.datasets import ada_columns

Rows = tuple[np.ndarray, np.ndarray, np.ndarray]


def _row(
  prompt: list[int], response: list[int], pad_id: int, prompt_len: int, width: int
):
  """(tokens, attention mask, target mask) [P+N] of one left-padded example."""
  row = np.full(width, pad_id, np.int32)
  mask = np.zeros(width, np.int32)
  row[prompt_len - len(prompt) : prompt_len + len(response)] = prompt + response
  mask[prompt_len - len(prompt) : prompt_len + len(response)] = 1
  target = np.zeros_like(mask)
  target[prompt_len : prompt_len + len(response)] = 1
  return row, mask, target


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
    row, mask, target = _row(p, r, tok.pad_id, prompt_len, width)
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


class Demonstrations(NamedTuple):
  """The column teacher's rows and how likely it writes each.

  Attributes:
    rows: (tokens, attention mask, target mask), each int32 [D, P+N],
      grouped by example.
    bounds: float64 [D]: example index + cumulative probability of the row
      within its example (the last row of example e is exactly e + 1), so
      that one `searchsorted` draws a row of any example.
    examples: E, the number of examples with rows.
  """

  rows: Rows
  bounds: np.ndarray
  examples: int


def demonstration_rows(
  tok: tokenizer_lib.Tokenizer,
  examples: Sequence[data.Example],
  *,
  drop: float,
  prompt_len: int,
  max_new_tokens: int,
) -> Demonstrations:
  """Every worked solution the column teacher writes, as teacher-forced rows.

  Args:
    tok: the tokenizer.
    examples: `ada_columns` problems.
    drop: chance that the teacher forgets a carry (0: always right).
    prompt_len: prompt bucket P.
    max_new_tokens: response budget N.

  Raises:
    ValueError: no example fits, or an example is not an ada_columns problem.
  """
  eos = tok.eos_ids[0]
  width = prompt_len + max_new_tokens
  cols: list[list[np.ndarray]] = [[], [], []]
  bounds: list[float] = []
  kept = 0
  for e in examples:
    p = tok.encode(e.prompt)
    demos = ada_columns.demonstrations(e.problem, drop)
    responses = [[*tok.encode(s.text), eos] for s, _ in demos]
    if len(p) > prompt_len or max(map(len, responses)) > max_new_tokens:
      continue
    cum = np.cumsum([q for _, q in demos])
    cum[-1] = 1.0  # Exactly: the next example's rows start above it.
    for r, c in zip(responses, cum, strict=True):
      for col, a in zip(cols, _row(p, r, tok.pad_id, prompt_len, width), strict=True):
        col.append(a)
      bounds.append(kept + float(c))
    kept += 1
  if not kept:
    raise ValueError(
      f'SFT: none of {len(examples)} examples fits prompt_len={prompt_len} '
      f'and max_new_tokens={max_new_tokens}'
    )
  rows = tuple(np.stack(c) for c in cols)
  return Demonstrations(rows, np.asarray(bounds, np.float64), kept)


def draw_demonstrations(
  rs: np.random.RandomState, demos: Demonstrations, batch_size: int
) -> Rows:
  """B rows: examples uniformly, then a solution as likely as the teacher's.

  Returns:
    (tokens, attention mask, target mask), each [B, P+N].
  """
  example = rs.randint(0, demos.examples, batch_size)
  u = rs.random_sample(batch_size)
  idx = np.searchsorted(demos.bounds, example + u, side='right')
  return tuple(a[idx] for a in demos.rows)
