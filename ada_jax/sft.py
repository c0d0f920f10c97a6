"""The SFT warm start's data: teacher-forced rows of prompt + answer + EOS.

The tiny task's warm start imitates `\\boxed{reference}` followed by EOS
after each left-padded prompt; the loss sees only the response tokens.

Dimension legend: E examples kept, P prompt bucket, N max new tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ada_jax import data
from ada_jax import tokenizer as tokenizer_lib


def teacher_forcing_rows(
  tok: tokenizer_lib.Tokenizer,
  examples: Sequence[data.Example],
  *,
  prompt_len: int,
  max_new_tokens: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(tokens, attention mask, target mask), each int32 [E, P+N].

  The prompt ends at column P (left padding) and the response starts there,
  as in sampling. Examples whose prompt or response does not fit are left
  out (the data layer already drops long prompts; a response longer than N
  cannot be imitated within the sampling budget either).

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
