"""Tests for ada_jax.tokenizer: tiny tokenizer, loading, EOS set, chat prompts."""

import json
import os
import string

import pytest
import tokenizers
import transformers

from ada_jax import tokenizer as tokenizer_lib

# A Qwen-style ChatML template, small enough to read.
_CHATML = (
  '{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n'
  '{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
)


def _write_fake_hf_dir(
  path, *, specials, tokenizer_config, generation_config=None, config=None
):
  """A character-level HF tokenizer dir with the given special tokens/configs."""
  os.makedirs(path, exist_ok=True)
  chars = list(dict.fromkeys(string.printable))
  vocab = {t: i for i, t in enumerate(['<unk>', *chars])}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token='<unk>'))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(
    tokenizers.Regex(r'[\s\S]'), behavior='isolated'
  )
  tok.decoder = tokenizers.decoders.Fuse()
  tok.add_special_tokens(specials)
  tok.save(os.path.join(path, 'tokenizer.json'))
  files = {'tokenizer_config.json': tokenizer_config}
  if generation_config is not None:
    files['generation_config.json'] = generation_config
  if config is not None:
    files['config.json'] = config
  for name, data in files.items():
    with open(os.path.join(path, name), 'w') as f:
      json.dump(data, f)
  return tok


def test_tiny_tokenizer_vocab_and_roundtrip(tmp_path):
  tok = tokenizer_lib.build_tiny_tokenizer(tmp_path / 'tiny')
  assert tok.vocab_size <= 64
  assert not tok.has_chat_template
  text = 'Q:(12+3)*4-7=\\boxed{-53}'
  ids = tok.encode(text)
  pieces = tok.hf.convert_ids_to_tokens(ids)
  assert pieces.count('\\boxed{') == 1  # One token, not seven characters.
  assert len(ids) == len(text) - len('\\boxed{') + 1
  assert tok.decode(ids) == text
  eos = tok.token_id('<eos>')
  pad = tok.token_id('<pad>')
  assert tok.eos_ids == (eos,)
  assert tok.pad_id == pad != eos
  # Special tokens vanish on decode unless asked for.
  assert tok.decode([*ids, eos, pad]) == text
  assert tok.decode([*ids, eos], skip_special_tokens=False) == text + '<eos>'
  # Unknown characters do not disappear silently: they become <unk>.
  assert tok.encode('x') == [tok.token_id('<unk>')]
  assert tok.encode_batch(['1+1', '22']) == [tok.encode('1+1'), tok.encode('22')]


def test_tiny_tokenizer_dir_is_a_regular_hf_dir(tmp_path):
  out = tmp_path / 'tiny'
  tok = tokenizer_lib.build_tiny_tokenizer(out)
  for name in (
    'tokenizer.json',
    'tokenizer_config.json',
    'special_tokens_map.json',
    'generation_config.json',
  ):
    assert (out / name).exists(), name
  config = json.loads((out / 'tokenizer_config.json').read_text())
  assert config['tokenizer_class'] == 'PreTrainedTokenizerFast'
  gen = json.loads((out / 'generation_config.json').read_text())
  assert gen['eos_token_id'] == list(tok.eos_ids)
  # Without a model config.json, plain AutoTokenizer agrees with us.
  auto = transformers.AutoTokenizer.from_pretrained(out)
  text = '7*8=\\boxed{56}'
  assert auto.encode(text, add_special_tokens=False) == tok.encode(text)


def test_load_survives_qwen2_model_type_gotcha(tmp_path):
  out = tmp_path / 'tiny_model'
  built = tokenizer_lib.build_tiny_tokenizer(out)
  (out / 'config.json').write_text(json.dumps({'model_type': 'qwen2'}))
  tok = tokenizer_lib.load_tokenizer(out)
  text = '12+34=\\boxed{46}'
  assert tok.encode(text) == built.encode(text)
  assert tok.decode(tok.encode(text)) == text


def test_qwen_like_eos_set_and_chat_prompt(tmp_path):
  out = tmp_path / 'qwen'
  specials = ['<|endoftext|>', '<|im_start|>', '<|im_end|>', '<|stop|>']
  raw = _write_fake_hf_dir(
    out,
    specials=specials,
    tokenizer_config={
      'tokenizer_class': 'Qwen2Tokenizer',
      'eos_token': '<|endoftext|>',
      'pad_token': '<|endoftext|>',
      'chat_template': _CHATML,
    },
    config={'model_type': 'qwen2'},
  )
  stop = raw.token_to_id('<|stop|>')
  (out / 'generation_config.json').write_text(json.dumps({'eos_token_id': stop}))
  tok = tokenizer_lib.load_tokenizer(out)
  endoftext = raw.token_to_id('<|endoftext|>')
  im_end = raw.token_to_id('<|im_end|>')
  assert tok.eos_ids == tuple(sorted({endoftext, im_end, stop}))
  assert tok.pad_id == endoftext
  assert tok.has_chat_template
  prompt = tok.chat_prompt('What is 1+1?', system='Be brief.')
  assert prompt == (
    '<|im_start|>system\nBe brief.<|im_end|>\n'
    '<|im_start|>user\nWhat is 1+1?<|im_end|>\n<|im_start|>assistant\n'
  )
  ids = tok.encode(prompt)
  assert ids == raw.encode(prompt).ids
  assert ids.count(im_end) == 2  # Special tokens are single ids.
  assert tok.chat_prompt('hi').startswith('<|im_start|>user\nhi')


def test_llama_like_no_pad_token_and_generation_eos_list(tmp_path):
  out = tmp_path / 'llama'
  specials = ['<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|eom_id|>']
  raw = _write_fake_hf_dir(
    out,
    specials=specials,
    tokenizer_config={
      'bos_token': '<|begin_of_text|>',
      'eos_token': '<|eot_id|>',
    },
  )
  eom = raw.token_to_id('<|eom_id|>')
  (out / 'generation_config.json').write_text(json.dumps({'eos_token_id': [eom]}))
  (out / 'chat_template.jinja').write_text(_CHATML)
  tok = tokenizer_lib.load_tokenizer(out)
  expected = {raw.token_to_id(t) for t in specials[1:]}
  assert tok.eos_ids == tuple(sorted(expected))
  assert tok.pad_id in tok.eos_ids  # No pad token: padding reuses an EOS id.
  assert tok.bos_token == '<|begin_of_text|>'
  assert tok.has_chat_template  # Read from chat_template.jinja.


def test_chat_prompt_without_template_and_missing_dir(tmp_path):
  tok = tokenizer_lib.build_tiny_tokenizer(tmp_path / 'tiny')
  with pytest.raises(ValueError, match='no chat template'):
    tok.chat_prompt('1+1')
  missing = tmp_path / 'nope'
  with pytest.raises(FileNotFoundError, match=str(missing)):
    tokenizer_lib.load_tokenizer(missing)


def _qwen_base_dir(path):
  """A Qwen-base-like dir: EOS <|endoftext|>, ChatML turns end on <|im_end|>."""
  return _write_fake_hf_dir(
    path,
    specials=['<|endoftext|>', '<|im_start|>', '<|im_end|>'],
    tokenizer_config={'eos_token': '<|endoftext|>', 'chat_template': _CHATML},
    generation_config={'eos_token_id': 0},
  )


def test_stop_ids_default_model_and_list(tmp_path, caplog):
  raw = _qwen_base_dir(tmp_path / 'q')
  endoftext, im_end = raw.token_to_id('<|endoftext|>'), raw.token_to_id('<|im_end|>')
  default = tokenizer_lib.load_tokenizer(tmp_path / 'q')
  assert default.eos_ids == tuple(sorted({0, endoftext, im_end}))
  with caplog.at_level('WARNING'):
    model = tokenizer_lib.load_tokenizer(tmp_path / 'q', stop_ids='model')
  # The reference's vLLM: the tokenizer's EOS and the generation config's ids.
  assert model.eos_ids == tuple(sorted({0, endoftext}))
  assert 'ends turns with <|im_end|>' in caplog.text
  assert tokenizer_lib.load_tokenizer(tmp_path / 'q', stop_ids=[5, 3]).eos_ids == (3, 5)
  with pytest.raises(ValueError, match=r'stop_ids: \[100000\] outside the vocabulary'):
    tokenizer_lib.load_tokenizer(tmp_path / 'q', stop_ids=[100000])
  with pytest.raises(ValueError, match="stop_ids: 'eos'"):
    tokenizer_lib.load_tokenizer(tmp_path / 'q', stop_ids='eos')


def test_stop_ids_model_does_not_warn_when_turns_end_on_eos(tmp_path, caplog):
  _write_fake_hf_dir(
    tmp_path / 'i',
    specials=['<|endoftext|>', '<|im_start|>', '<|im_end|>'],
    tokenizer_config={'eos_token': '<|im_end|>', 'chat_template': _CHATML},
  )
  with caplog.at_level('WARNING'):
    tokenizer_lib.load_tokenizer(tmp_path / 'i', stop_ids='model')
  assert 'stop_ids' not in caplog.text
