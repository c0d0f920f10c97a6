"""k answers per prompt through the fixed-shape sampler, scored by the verifier.

Shared by the trainer's held-out evaluation (greedy, k=1), the pass-rate
histogram, Ave@k evaluation and prompt selection. Prompts are processed in
chunks of exactly S (the run's slot count; the last chunk padded with idle
slots), each chunk prefilled once and sampled k rounds from its prompt
cache, so these calls reuse one prefill and one decode program: nothing
compiles after the first chunk.

Dimension legend: Q prompts, S slots (= prompts per chunk), P prompt bucket,
k samples per prompt.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import jax
import numpy as np
from tqdm import tqdm

from ada_jax import model as model_lib
from ada_jax import sampler, verifier
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.infra import multihost


def sample_and_score(
  model: model_lib.Transformer,
  tok: tokenizer_lib.Tokenizer,
  prompt_tokens: np.ndarray,
  prompt_mask: np.ndarray,
  references: Sequence[str],
  *,
  slots: int,
  k: int,
  max_new_tokens: int,
  rng: jax.Array,
  temperature: float = 1.0,
  top_p: float = 1.0,
  top_k: int = 0,
  eos_ids: Sequence[int] = (),
  verifier_timeout_s: float = 2.0,
  verifier_workers: int | None = None,
  verify_fn: Callable[..., np.ndarray] | None = None,
  progress: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Correctness [Q, k] of k sampled answers per prompt, and which were boxed.

  Args:
    model: the policy (sampling layout).
    tok: tokenizer for decoding.
    prompt_tokens: int [Q, P] left-padded prompts.
    prompt_mask: int [Q, P].
    references: Q reference answers.
    slots: S, prompts per chunk (use the run's slot count).
    k: samples per prompt (1 with temperature 0 for greedy accuracy).
    max_new_tokens: N.
    rng: PRNG key.
    temperature: sampling temperature (0: greedy).
    top_p: nucleus mass.
    top_k: top-k (0: off).
    eos_ids: token ids ending a response.
    verifier_timeout_s: per-item `verify_batch` deadline.
    verifier_workers: `verify_batch` processes.
    verify_fn: replaces `verifier.verify_batch`.
    progress: a tqdm description, or None for no bar.

  Returns:
    (correct bool [Q, k], boxed bool [Q, k]): boxed marks a response with a
    `\\boxed{}` answer the verifier can read (a wrong answer in the right
    format). Each host decodes only the slots it holds; both arrays are
    all-gathered, so every host gets all of them.
  """
  verify_fn = verify_fn or verifier.verify_batch
  q, p = prompt_tokens.shape
  correct = np.zeros((q, k), bool)
  boxed = np.zeros((q, k), bool)
  eos = sampler.eos_array(eos_ids)
  starts = range(0, q, slots)
  for c, start in enumerate(
    tqdm(starts, desc=progress, disable=progress is None, leave=False)
  ):
    rows = np.arange(start, min(start + slots, q))
    tokens = np.full((slots, p), tok.pad_id, np.int32)
    mask = np.zeros((slots, p), np.int32)
    tokens[: len(rows)], mask[: len(rows)] = prompt_tokens[rows], prompt_mask[rows]
    mask[len(rows) :, -1] = 1  # Idle rows still need one real token.
    cache = sampler.prefill(model, tokens, mask)
    slot_prompt = np.where(np.arange(slots) < len(rows), np.arange(slots), -1).astype(
      np.int32
    )
    for j in range(k):
      r = sampler.sample_round(
        model,
        cache,
        slot_prompt,
        max_new_tokens=max_new_tokens,
        rng=jax.random.fold_in(rng, c * k + j),
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        eos_ids=eos,
      )
      # Each host scores the slots it holds; the scores are all-gathered.
      held, out = multihost.local_rows(r.tokens)
      _, lens = multihost.local_rows(r.lengths)
      mine = held < len(rows)
      resp = [
        tok.decode(t[:n].tolist()) for t, n in zip(out[mine], lens[mine], strict=True)
      ]
      scores = verify_fn(
        resp,
        [references[rows[i]] for i in held[mine]],
        timeout_s=verifier_timeout_s,
        workers=verifier_workers,
      )
      has_box = [verifier.extract(t) is not None for t in resp]
      # One collective for both: [slots held here, (score, boxed)].
      local = np.stack([np.asarray(scores, np.float32), np.asarray(has_box)], -1)
      merged = multihost.gather_rows(held[mine], local, slots)
      correct[rows, j] = merged[: len(rows), 0] > 0
      boxed[rows, j] = merged[: len(rows), 1] > 0
  return correct, boxed


def histogram(pass_rate: np.ndarray, bins: int = 8) -> list[tuple[str, int]]:
  """Counts of prompts by pass rate: exactly 0, then (a, b] bins, exactly 1."""
  out = [('0', int(np.sum(pass_rate == 0)))]
  edges = np.linspace(0, 1, bins + 1)
  for a, b in itertools.pairwise(edges):
    n = np.sum((pass_rate > a) & (pass_rate <= b) & (pass_rate < 1))
    out.append((f'({a:.2f},{b:.2f}]', int(n)))
  out.append(('1', int(np.sum(pass_rate == 1))))
  return out


def format_histogram(title: str, hist: list[tuple[str, int]]) -> str:
  """A text bar chart."""
  top = max(n for _, n in hist) or 1
  lines = [title]
  lines += [f'  {label:>12} {n:6d} {"#" * round(40 * n / top)}' for label, n in hist]
  return '\n'.join(lines)
