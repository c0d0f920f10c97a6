"""tunix side of benchmarks/sampler.py; runs inside the tunix venv, prints JSON.

Not imported by ada_jax: `benchmarks/sampler.py` starts it with the python of
a separate virtual environment holding `google-tunix==0.1.7` (which brings its
own jax and flax), passes the HF model directory and an .npz of prompts, and
reads one JSON object from the last line of stdout.

The model is built with tunix's own qwen2 safetensors loader and sampled with
its vanilla `tunix.generate.sampler.Sampler`, called the way tunix's rollout
calls it: prompt strings (here space-separated token ids, through a minimal id
codec that implements tunix's tokenizer protocol), left-padded to a fixed
`max_prompt_length`, a KV cache of exactly prompt + generation length,
`echo=False`, `temperature=1.0, top_p=1.0` (tunix's fast path: categorical
over the full vocabulary). The EOS id is set to `vocab_size`, which is never
sampled, so every row runs the full budget.

Each timed call is the whole `Sampler.__call__` (host tokenization, prefill,
decode loop, host post-processing into per-row lists), after one warm-up call
of the same shapes that pays for compilation.

Dimension legend: B rows, P prompt length, N new tokens, V vocab.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np


class _IdCodec:
  """tunix tokenizer protocol over space-separated token ids (no BOS)."""

  def __init__(self, pad_id: int, eos_id: int):
    self._pad, self._eos = pad_id, eos_id

  def encode(self, text: str, **unused) -> list[int]:
    return [int(t) for t in text.split()]

  def decode(self, ids: list[int], **unused) -> str:
    return ' '.join(str(int(t)) for t in ids)

  def bos_id(self) -> None:
    return None

  def eos_id(self) -> int:
    return self._eos

  def pad_id(self) -> int:
    return self._pad


def _as_strings(tokens_BxP: np.ndarray, mask_BxP: np.ndarray) -> list[str]:
  return [
    ' '.join(map(str, t[m.astype(bool)]))
    for t, m in zip(tokens_BxP, mask_BxP, strict=True)
  ]


def _load_model(model_dir: str) -> tuple[Any, Any]:
  """Qwen2 config from config.json, weights through tunix's qwen2 loader."""
  from tunix.models.qwen2 import model as qwen2_model
  from tunix.models.qwen2 import params as qwen2_params

  with open(os.path.join(model_dir, 'config.json')) as f:
    hf = json.load(f)
  rope = hf.get('rope_parameters') or {}
  heads = hf['num_attention_heads']
  config = qwen2_model.ModelConfig(
    num_layers=hf['num_hidden_layers'],
    vocab_size=hf['vocab_size'],
    embed_dim=hf['hidden_size'],
    hidden_dim=hf['intermediate_size'],
    num_heads=heads,
    head_dim=hf.get('head_dim') or hf['hidden_size'] // heads,
    num_kv_heads=hf['num_key_value_heads'],
    rope_theta=int(hf.get('rope_theta') or rope.get('rope_theta', 10000)),
    norm_eps=hf['rms_norm_eps'],
    use_tied_embedding=hf.get('tie_word_embeddings', False),
  )
  model = qwen2_params.create_model_from_safe_tensors(model_dir, config)
  return model, config


def _prefill_logits(
  model: Any, tokens_BxP: np.ndarray, mask_BxP: np.ndarray
) -> np.ndarray:
  """Logits [B, V] at the last prompt position, as tunix's prefill computes them."""
  import jax.numpy as jnp
  from tunix.generate import utils

  mask = jnp.asarray(mask_BxP, bool)
  positions = utils.build_positions_from_mask(mask)
  attn = utils.make_causal_attn_mask(mask, tokens_BxP.shape[1])
  logits, _ = model(jnp.asarray(tokens_BxP), positions, None, attn)
  return np.asarray(logits[:, -1])


_START = time.perf_counter()


def _log(msg: str) -> None:
  print(
    f'[tunix {time.perf_counter() - _START:5.0f} s] {msg}', file=sys.stderr, flush=True
  )


def _timed(
  fn: Callable[[int], int], repeats: int, warmup: Callable[[], Any] | None = None
) -> dict[str, Any]:
  """Warm-up (default fn(0); compiles), then `repeats` timed calls fn(1..).

  fn returns the number of generated tokens; wall and process CPU seconds are
  recorded per timed call.
  """
  warmup() if warmup else fn(0)
  times, cpu, tokens = [], [], 0
  for r in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = fn(r + 1)
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  return {'times': times, 'cpu': cpu, 'tokens': int(tokens)}


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--model', required=True, help='HF model directory')
  p.add_argument('--inputs', required=True, help='.npz of prompts (see sampler.py)')
  p.add_argument('--new-tokens', type=int, default=64)
  p.add_argument('--rounds', type=int, default=4)
  p.add_argument('--samples', type=int, default=8)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--rl-repeats', type=int, default=1)
  p.add_argument('--sanity-new', type=int, default=8)
  args = p.parse_args(argv)

  warnings.filterwarnings('ignore')
  logging.disable(logging.WARNING)
  import flax
  import jax
  import tunix
  from tunix.generate import sampler as sampler_lib

  data = np.load(args.inputs)
  model, config = _load_model(args.model)
  codec = _IdCodec(pad_id=0, eos_id=config.vocab_size)
  never = [config.vocab_size]  # an EOS id outside the vocabulary: no early stop
  n = args.new_tokens
  out = {
    'versions': {
      'tunix': getattr(tunix, '__version__', '?'),
      'jax': jax.__version__,
      'flax': flax.__version__,
      'python': sys.version.split()[0],
    },
    'tunix_path': os.path.dirname(tunix.__file__),
  }

  def make(p_len: int) -> sampler_lib.Sampler:
    cache = sampler_lib.CacheConfig(
      cache_size=p_len + n,
      num_layers=config.num_layers,
      num_kv_heads=config.num_kv_heads,
      head_dim=config.head_dim,
    )
    return sampler_lib.Sampler(model, codec, cache)

  _log('model loaded; sanity')
  # Sanity: prefill logits and greedy tokens on the first rows of case A.
  s_tok, s_mask = data['sanity_tokens'], data['sanity_mask']
  p_len = s_tok.shape[1]
  greedy = make(p_len)(
    _as_strings(s_tok, s_mask),
    max_generation_steps=args.sanity_new,
    max_prompt_length=p_len,
    eos_tokens=never,
    temperature=0.0,
  )
  out['sanity'] = {
    'last_logits': _prefill_logits(model, s_tok, s_mask).tolist(),
    'greedy': [np.asarray(t)[: args.sanity_new].tolist() for t in greedy.tokens],
  }

  # Case A (keys a<B>_tokens): one call of B left-padded prompts, N new tokens.
  case_a = [
    k[: -len('_tokens')] for k in data.files if k[0] == 'a' and k.endswith('_tokens')
  ]
  for name in sorted(case_a, key=lambda k: int(k[1:])):
    tok, mask = data[f'{name}_tokens'], data[f'{name}_mask']
    sampler = make(tok.shape[1])
    prompts = _as_strings(tok, mask)

    def call(seed: int, sampler=sampler, prompts=prompts, p_len=tok.shape[1]) -> int:
      res = sampler(
        prompts,
        max_generation_steps=n,
        max_prompt_length=p_len,
        eos_tokens=never,
        temperature=1.0,
        top_p=1.0,
        seed=seed,
      )
      return sum(len(t) for t in res.tokens)

    _log(f'case A, B={tok.shape[0]}')
    out[name] = _timed(call, args.repeats)

  # Case B: each round one call with every prompt repeated `samples` times.
  if 'b_tokens' in data:
    tok = np.repeat(data['b_tokens'], args.samples, axis=0)
    mask = np.repeat(data['b_mask'], args.samples, axis=0)
    sampler = make(tok.shape[1])
    prompts = _as_strings(tok, mask)

    def one_round(seed: int) -> int:
      res = sampler(
        prompts,
        max_generation_steps=n,
        max_prompt_length=tok.shape[1],
        eos_tokens=never,
        temperature=1.0,
        top_p=1.0,
        seed=seed,
      )
      return sum(len(t) for t in res.tokens)

    def rl_step(seed: int) -> int:
      return sum(one_round(seed * args.rounds + k) for k in range(args.rounds))

    _log(f'case B, {tok.shape[0]} rows per round')
    out['b'] = _timed(rl_step, args.rl_repeats, warmup=lambda: one_round(0))

  print(json.dumps(out))


if __name__ == '__main__':
  main(sys.argv[1:])
