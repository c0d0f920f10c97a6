"""benchmarks/sampler.py's harness on a tiny model: the pieces it times run.

The benchmark itself takes minutes and is not run here; its `_Round` (the
round's cache at column i, from `sampler.round_cache`, fed to a donated
`decode_step`), the profile's pieces and the real round are, for an aligned
round (the long case: the prompt cache itself is the shared prefix) and a
grouped one (the RL case), so that a change of the cache layout that breaks
the harness fails here and not in a benchmark run.
"""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from ada_jax import attention
from ada_jax import model as model_lib

_ROOT = str(Path(__file__).resolve().parents[1])
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)

from benchmarks import sampler as bench  # noqa: E402


@pytest.mark.parametrize(
  'slots, group, n',
  [(4, 1, 16), (8, 2, 16), (4, 1, 3 * attention.DECODE_BLOCK_K)],
)
def test_round_harness_runs_every_piece(slots, group, n):
  """With n = 3 blocks, the long case's layout: a response held in blocks on CPU."""
  cfg = model_lib.ModelConfig('qwen2', 256, 64, 128, 2, 4, 2, 16, tie_embeddings=True)
  model = model_lib.Transformer(cfg, rngs=nnx.Rngs(0))
  tokens = np.ones((4, 8), np.int32)
  slot_prompt = np.repeat(np.arange(4), slots // 4)
  r = bench._Round(model, tokens, tokens, slot_prompt, n, group)
  assert (r._cache.prefix_valid is not None) and r._cache.prefix_k[0].shape[0] == 4
  assert isinstance(r._cache.k[0], tuple) == attention.round_cache_blocked(n)
  # Steps at several columns reuse fresh copies of every buffer (donated).
  assert all(r.step_time(i, 2) > 0 for i in (1, 5, 9, 5, n - 1))
  pieces = bench.profile_pieces(r, 8, 2)
  assert {
    'proj+MLP',
    'attention',
    'cache writes',
    'LM head',
    'sampling',
    'step',
  } <= set(pieces)
  assert bench.round_step_time(r, 2) > 0


def test_read_bytes_follow_the_written_blocks():
  """The long case's read rate counts the blocks a step at column i sees.

  Step i queries the column it writes, cache index i - 1 (the response
  starts at 0 under a shared prefix; `sampler.decode_step`), so it reads
  blocks 0 .. (i - 1) // tk: one block's bytes more each time i passes a
  multiple of tk. A cache read whole has no growth to count.
  """
  tk = attention.DECODE_BLOCK_K
  cfg = model_lib.ModelConfig('qwen2', 256, 64, 128, 2, 4, 2, 16, tie_embeddings=True)
  model = model_lib.Transformer(cfg, rngs=nnx.Rngs(0))
  tokens = np.ones((4, 8), np.int32)
  r = bench._Round(model, tokens, tokens, np.arange(4), 3 * tk)
  # One block of every layer, keys and values: what a step at a new block
  # adds. layers x K/V x slots x G x K x tk x fp32; the cache holds 3.
  block = 2 * 2 * 4 * 2 * 16 * tk * 4
  assert sum(x.nbytes for x in jax.tree.leaves((r._cache.k, r._cache.v))) == 3 * block
  got = [r.read_bytes(i) for i in (1, tk, tk + 1, 2 * tk, 2 * tk + 1, 3 * tk)]
  assert got == [block, block, 2 * block, 2 * block, 3 * block, 3 * block]
  whole = bench._Round(model, tokens, tokens, np.arange(4), 16)
  assert whole.read_bytes(9) is None
  res = {
    'first quarter': {'read_bytes': [block, block], 'step_s': [1e-3, 1e-3]},
    'last quarter': {'read_bytes': [3 * block, 3 * block], 'step_s': [2e-3, 3e-3]},
  }
  assert bench.read_rate(res) == pytest.approx((2 * block, 1.5e-3, 2 * block / 1.5e-3))
  res['first quarter']['read_bytes'] = [None, None]
  assert bench.read_rate(res) is None


def test_stream_rate_runs_pinned_and_free():
  """The stream figure comes back from a fresh process, pinned or not."""
  assert bench.stream_rate(True, mb=8) > 1e8
  assert bench.stream_rate(False, mb=8) > 1e8


class _FakeRound:
  """Records the columns it is timed at; column i's k-th timing is times[i][k]."""

  def __init__(self, times):
    self.times, self.calls = times, []

  def step_time(self, i, repeats):
    self.calls.append(i)
    return self.times[i][self.calls.count(i) - 1]

  def read_bytes(self, i):
    return 10 * i


def test_quarter_steps_alternate_the_quarters_and_keep_each_columns_best():
  n, rounds = 64, 3
  first, last = [3, 7, 11, 15], [51, 55, 59, 63]
  # Column i: 1 ms + i us in rounds 1 and 3; round 2 is 0.5 ms faster.
  times = {
    i: [1e-3 + i * 1e-6, 0.5e-3 + i * 1e-6, 1e-3 + i * 1e-6] for i in first + last
  }
  r = _FakeRound(times)
  out = bench.quarter_steps(r, n, 8, 1, rounds)
  assert r.calls == [3, 51, 7, 55, 11, 59, 15, 63] * rounds
  assert out['first quarter']['columns'] == first
  assert out['last quarter']['columns'] == last
  assert out['first quarter']['step_s'] == [0.5e-3 + i * 1e-6 for i in first]
  assert out['last quarter']['read_bytes'] == [10 * i for i in last]
  assert out['last quarter']['tok_s'] == pytest.approx(8 / (0.5e-3 + 57e-6))
