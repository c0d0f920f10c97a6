"""rl.scoring.sample_and_score: k samples per prompt, chunked into rounds.

k > 1 runs S // k prompts per chunk with their k samples in one round (the
RL round's shape); k = 1 runs S prompts per chunk in an aligned round (slot i
continues prompt i, no gather). Oracles: greedy samples of a prompt are all
the same, so every column equals the k = 1 result; a reward that depends on
the reference catches any prompt/slot/reference mix-up.
"""

import jax
import numpy as np
import pytest

from ada_jax import model as model_lib
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.rl import scoring

_Q, _P, _N, _S = 7, 6, 5, 8


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
  tok = tokenizer_lib.build_tiny_tokenizer(tmp_path_factory.mktemp('tok'))
  cfg = model_lib.ModelConfig(
    'qwen2', -(-tok.vocab_size // 8) * 8, 32, 64, 1, 2, 1, 16, tie_embeddings=True
  )
  from flax import nnx

  model = model_lib.Transformer(cfg, rngs=nnx.Rngs(3))
  rs = np.random.RandomState(0)
  tokens = rs.randint(3, tok.vocab_size, (_Q, _P)).astype(np.int32)
  lengths = rs.randint(1, _P + 1, _Q)
  mask = (np.arange(_P)[None, :] >= _P - lengths[:, None]).astype(np.int32)
  return tok, model, tokens * mask, mask


def _run(setup, k, temperature, seen=None):
  tok, model, tokens, mask = setup

  def verify(responses, references, **kw):
    # Reward: the reference's parity XOR the response length's parity.
    if seen is not None:
      seen.extend(zip(responses, references, strict=True))
    return np.array(
      [(int(f) + len(r)) % 2 == 0 for r, f in zip(responses, references, strict=True)]
    )

  refs = [str(i) for i in range(_Q)]
  return scoring.sample_and_score(
    model,
    scoring.Scorer(tok, verify_fn=verify),
    tokens,
    mask,
    refs,
    slots=_S,
    k=k,
    max_new_tokens=_N,
    rng=jax.random.key(1),
    temperature=temperature,
  )


@pytest.mark.parametrize('k', [3, 4])
def test_greedy_k_samples_equal_the_one_sample_result(setup, k):
  one, one_boxed = _run(setup, 1, 0.0)
  many, many_boxed = _run(setup, k, 0.0)
  assert many.shape == (_Q, k)
  for j in range(k):
    np.testing.assert_array_equal(many[:, j], one[:, 0])
    np.testing.assert_array_equal(many_boxed[:, j], one_boxed[:, 0])
  assert 0 < one.sum() < _Q  # The oracle is not constant.


def test_sampled_k_scores_every_prompt_k_times_with_its_reference(setup):
  seen = []
  _run(setup, 4, 1.0, seen)
  assert len(seen) == _Q * 4
  counts = np.bincount([int(f) for _, f in seen], minlength=_Q)
  np.testing.assert_array_equal(counts, np.full(_Q, 4))
