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
