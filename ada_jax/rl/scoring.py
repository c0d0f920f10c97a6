"""Sampled responses scored by the verifier: one round, or k per prompt.

`Scorer` binds the verifier's settings once per run (the tokenizer to
decode with, the per-item deadline, the pool's workers, and a stand-in
verify function for tests). `Scorer.score_round` is the one path from a
sampled round to rewards, shared by a training step's rounds
(`rollout.run_step`) and by `sample_and_score`: each host decodes the live
slots it holds (special tokens skipped), verifies them, marks the boxed
ones, and one collective gathers every host's rewards, boxed flags and
lengths, so every host sees all S of them. After round 1 the controller
packs the active prompts into the first slots, so a host may verify
another host's prompts: every host knows all the references.

`sample_and_score` (and `score_examples`, from examples) draws k answers
per prompt for the trainer's held-out evaluation (greedy, k=1), the
pass-rate histogram, Ave@k evaluation and prompt selection. Prompts are
processed in chunks of exactly S (the run's slot count; the last chunk
padded with idle slots), each chunk prefilled once and sampled k rounds
from its prompt cache, so these calls reuse one prefill and one decode
program: nothing compiles after the first chunk.

Dimension legend: Q prompts, S slots (= prompts per chunk), P prompt bucket,
N new tokens, k samples per prompt.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from ada_jax import data, sampler, verifier
from ada_jax import model as model_lib
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.infra import multihost
from ada_jax.infra import progress as progress_lib


@dataclasses.dataclass(frozen=True)
class RoundScores:
  """One sampled round, scored.

  Attributes:
    rewards: float32 [S], the verifier's 0/1 per slot, NaN on idle slots
      (all hosts' slots).
    boxed: bool [S], a `\\boxed{}` answer the verifier can read (a wrong
      answer in the right format); False on idle slots (all hosts').
    lengths: int32 [S], response lengths (all hosts').
    texts: slot -> decoded response, for the live slots this host holds.
    time_verify_s: this host's decoding and verifying time.
  """

  rewards: np.ndarray
  boxed: np.ndarray
  lengths: np.ndarray
  texts: dict[int, str]
  time_verify_s: float


@dataclasses.dataclass(frozen=True)
class Scorer:
  """The verifier's settings, bound once per run.

  Attributes:
    tok: the policy's tokenizer (decodes the responses).
    timeout_s: per-item deadline of `verifier.verify_batch`.
    workers: its worker processes (None: its default).
    verify_fn: replaces `verifier.verify_batch` (tests, fault injection);
      called as `verify_fn(responses, references, timeout_s=, workers=)`.
    backend: the reward's name as runs record it ('ada' | 'math_verify';
      `verify_fn` already calls it).
  """

  tok: tokenizer_lib.Tokenizer
  timeout_s: float = 2.0
  workers: int | None = None
  verify_fn: Callable[..., np.ndarray] | None = None
  backend: str = 'ada'

  def verify(self, responses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """0/1 (or bool) per response; the reference of each in `references`."""
    # Looked up at each call, not bound once: tests replace verify_batch.
    fn = self.verify_fn or verifier.verify_batch
    return fn(responses, references, timeout_s=self.timeout_s, workers=self.workers)

  def score_round(
    self,
    rollout: sampler.Rollout,
    slot_prompt: np.ndarray,
    references: Sequence[str],
  ) -> RoundScores:
    """Decodes, verifies and gathers one round (collective: every host calls).

    Args:
      rollout: the round's samples, global [S, N] arrays.
      slot_prompt: int [S], the prompt each slot continued (-1: idle).
      references: the reference answer of each prompt (by prompt index).
    """
    s = len(slot_prompt)
    idx, toks = multihost.local_rows(rollout.tokens)
    _, lens = multihost.local_rows(rollout.lengths)
    t0 = time.perf_counter()
    live = slot_prompt[idx] >= 0
    texts = [
      self.tok.decode(t[:n].tolist())
      for t, n in zip(toks[live], lens[live], strict=True)
    ]
    scores = self.verify(texts, [references[p] for p in slot_prompt[idx][live]])
    reward = np.full(idx.shape, np.nan, np.float32)
    reward[live] = np.asarray(scores, np.float32)
    boxed = np.zeros(idx.shape, np.float32)
    boxed[live] = [verifier.extract(t) is not None for t in texts]
    t_verify = time.perf_counter() - t0
    # One collective: [slots held here, (reward, boxed, length)].
    merged = multihost.gather_rows(idx, np.stack([reward, boxed, lens], axis=1), s)
    return RoundScores(
      rewards=merged[:, 0],
      boxed=merged[:, 1] > 0,
      lengths=np.nan_to_num(merged[:, 2]).astype(np.int32),
      texts=dict(zip(idx[live].tolist(), texts, strict=True)),
      time_verify_s=t_verify,
    )


def sample_and_score(
  model: model_lib.Transformer,
  scorer: Scorer,
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
  progress: str | None = None,
  rewards: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Correctness [Q, k] of k sampled answers per prompt, and which were boxed.

  Args:
    model: the policy (sampling layout).
    scorer: the verifier's settings and the tokenizer.
    prompt_tokens: int [Q, P] left-padded prompts.
    prompt_mask: int [Q, P].
    references: Q reference answers.
    slots: S, the round's slots (use the run's slot count): S // k prompts
      per chunk, their k samples in one round (k = 1: S prompts).
    k: samples per prompt (1 with temperature 0 for greedy accuracy).
    max_new_tokens: N.
    rng: PRNG key.
    temperature: sampling temperature (0: greedy).
    top_p: nucleus mass.
    top_k: top-k (0: off).
    eos_ids: token ids ending a response.
    progress: what to call the chunks' progress (`infra.progress`), or
      None for none.
    rewards: return the scorer's values (float [Q, k]) instead of their
      `> 0` (evaluate's graders side by side encode one bit each).

  Returns:
    (correct bool [Q, k], boxed bool [Q, k]), see `RoundScores`. Each host
    decodes only the slots it holds; both arrays are all-gathered, so every
    host gets all of them.
  """
  q, p = prompt_tokens.shape
  correct = np.zeros((q, k), np.float32 if rewards else bool)
  boxed = np.zeros((q, k), bool)
  eos = sampler.eos_array(eos_ids)
  # k > 1: S // k prompts per chunk, their k samples in one round of S slots
  # (the RL round's shape: B = S / M prompts, gathered for the slots). k = 1
  # (or k > S): S prompts per chunk and k aligned rounds, slot i continuing
  # prompt i (no gather). Either way no device holds more than the RL round
  # does of the prompt cache, or one chunk's own rows.
  per = sampler.prompts_per_round(slots, k)
  reps = k if per < slots else 1
  chunks = progress_lib.progress(
    range(0, q, per),
    desc=progress,
    unit='chunk',
    disable=progress is None,
    leave=False,
  )
  for c, start in enumerate(chunks):
    rows = np.arange(start, min(start + per, q))
    tokens = np.full((per, p), scorer.tok.pad_id, np.int32)
    mask = np.zeros((per, p), np.int32)
    tokens[: len(rows)], mask[: len(rows)] = prompt_tokens[rows], prompt_mask[rows]
    mask[len(rows) :, -1] = 1  # Idle rows still need one real token.
    cache = sampler.prefill(model, tokens, mask)
    # Slot j * per + i holds sample j of prompt i (idle: -1).
    prompt_of = np.tile(np.arange(per), reps)
    live = prompt_of < len(rows)
    slot_prompt = np.full(slots, -1, np.int32)
    slot_prompt[: len(prompt_of)] = np.where(live, prompt_of, -1)
    sample_of = np.repeat(np.arange(reps), per)
    chunk_references = [references[i] for i in rows]
    for j in range(k // reps):
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
        aligned=reps == 1,
        filter_logits=sampler.needs_filter(top_p, top_k),
      )
      scores = scorer.score_round(r, slot_prompt, chunk_references)
      got = np.flatnonzero(slot_prompt >= 0)
      prompt, sample = rows[slot_prompt[got]], sample_of[got] + j
      got_rewards = scores.rewards[got]
      correct[prompt, sample] = got_rewards if rewards else got_rewards > 0
      boxed[prompt, sample] = scores.boxed[got]
  return correct, boxed


def score_examples(
  model: model_lib.Transformer,
  scorer: Scorer,
  examples: Sequence[data.Example],
  *,
  prompt_bucket: int,
  slots: int,
  k: int,
  max_new_tokens: int,
  rng: jax.Array,
  temperature: float = 1.0,
  top_p: float = 1.0,
  top_k: int = 0,
  eos_ids: Sequence[int] = (),
  progress: str | None = None,
  rewards: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """`sample_and_score` of examples, their prompts encoded into the bucket.

  Raises:
    ValueError: a prompt is longer than `prompt_bucket` (filter them first
      with `data.drop_long_prompts`).
  """
  enc = data.encode_prompts(scorer.tok, [e.prompt for e in examples], prompt_bucket)
  if enc.dropped:
    raise ValueError(
      f'{enc.dropped} prompts longer than the prompt bucket {prompt_bucket}'
    )
  return sample_and_score(
    model,
    scorer,
    enc.tokens,
    enc.mask,
    [e.reference for e in examples],
    slots=slots,
    k=k,
    max_new_tokens=max_new_tokens,
    rng=rng,
    temperature=temperature,
    top_p=top_p,
    top_k=top_k,
    eos_ids=eos_ids,
    progress=progress,
    rewards=rewards,
  )


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
