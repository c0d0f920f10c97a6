"""A tokenizer with ids outside the model's embedding is refused at load.

Issue 39, item 5: `jnp.take` fills out-of-range embedding rows with NaN, so
such a directory used to evaluate to accuracy 0.0 with exit 0.
"""

import json

import pytest
from flax import nnx

from ada_jax import config_rules, from_config, hf
from ada_jax import model as model_lib


def _hf_dir(path, vocab: int, tokenizer_ids: int, special: int = 0) -> str:
  config = model_lib.ModelConfig('llama', vocab, 16, 16, 1, 2, 1, 8)
  hf.save_model(model_lib.Transformer(config, rngs=nnx.Rngs(0)), str(path))
  words = tokenizer_ids - special
  spec = {
    'model': {'type': 'WordLevel', 'vocab': {f't{i}': i for i in range(words)}},
    'added_tokens': [{'id': words + k, 'content': f'<s{k}>'} for k in range(special)],
  }
  (path / 'tokenizer.json').write_text(json.dumps(spec))
  return str(path)


def test_a_tokenizer_larger_than_the_embedding_is_one_line_naming_both(tmp_path):
  # 29 ids (3 of them special tokens) against an embedding of 16 rows.
  path = _hf_dir(tmp_path / 'm', vocab=16, tokenizer_ids=29, special=3)
  with pytest.raises(hf.VocabError) as e:
    hf.load_model(path)
  message = str(e.value)
  assert '\n' not in message
  assert '29 ids' in message and 'embeds 16' in message and path in message


def test_special_tokens_past_the_embedding_count(tmp_path):
  path = _hf_dir(tmp_path / 'm', vocab=16, tokenizer_ids=17, special=2)
  with pytest.raises(hf.VocabError):
    hf.load_model(path)


def test_an_embedding_larger_than_the_tokenizer_is_fine(tmp_path):
  # Qwen pads its embedding past the tokenizer's ids.
  path = _hf_dir(tmp_path / 'm', vocab=24, tokenizer_ids=20, special=2)
  assert hf.load_model(path).config.vocab_size == 24


def test_the_config_check_refuses_it_before_anything_is_written(tmp_path):
  path = _hf_dir(tmp_path / 'm', vocab=16, tokenizer_ids=29)
  c = from_config.load('configs/tiny_arith.py', [f'--config.model.hf_path={path}'])
  with pytest.raises(config_rules.ConfigError, match=r'model\.hf_path: .*29 ids'):
    from_config.validate(c)
