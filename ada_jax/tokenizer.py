"""Tokenizers: HF tokenizers from a local directory, and the tiny task's own.

`load_tokenizer(path)` wraps the HF fast tokenizer of a checkpoint directory in
a small typed `Tokenizer`: plain encode/decode (no special tokens added: chat
templates already carry them), every id that should end generation, a pad id
and the chat template with a generation prompt.

`build_tiny_tokenizer(out_dir)` writes the tokenizer of the synthetic
arithmetic task as an ordinary HF directory (built with the `tokenizers`
library), so the tiny path and the real path share all the code below.

Why not `transformers.AutoTokenizer`: when the directory's config.json says
`model_type: qwen2`, transformers 5 forces its Qwen2 BPE class whatever
tokenizer_config.json says, and a WordLevel tokenizer.json then encodes most
text to nothing. tokenizer.json is the canonical serialization of every fast
tokenizer (Qwen2.5, Qwen3, Llama 3 ship one), so we load it as is with
`PreTrainedTokenizerFast`, and only fall back to `AutoTokenizer` for
directories that have no tokenizer.json.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import tokenizers
import transformers

from ada_jax.infra import storage

# Tokens that end a turn or a document in the model families we support. They
# are added to the EOS set when present in the vocabulary: Qwen chat models
# end on <|im_end|> but base checkpoints may emit <|endoftext|> instead, and
# Llama 3 Instruct ends turns on <|eot_id|>. Missing one lets a response run
# on to the generation limit.
_KNOWN_END_TOKENS = ('<|im_end|>', '<|endoftext|>', '<|eot_id|>', '<|end_of_text|>')

# The tiny task's vocabulary. `\boxed{` is one token so that the answer format
# costs the tiny model one decision, not seven.
TINY_PAD = '<pad>'
TINY_EOS = '<eos>'
TINY_UNK = '<unk>'
TINY_BOXED = '\\boxed{'
_TINY_SPECIALS = (TINY_PAD, TINY_EOS, TINY_UNK)
_TINY_CHARS = '0123456789+-*/=()}.,:? QA'
# Each match of this regex is one pre-token; WordLevel maps it to one id.
_TINY_SPLIT = r'\\boxed\{|[\s\S]'


def _tiny_vocab() -> list[str]:
  return [*_TINY_SPECIALS, *_TINY_CHARS, TINY_BOXED]


@dataclasses.dataclass(frozen=True)
class Tokenizer:
  """A loaded tokenizer with the few facts the trainer and sampler need.

  Attributes:
    hf: the underlying transformers tokenizer (escape hatch).
    path: the directory it was loaded from.
    eos_ids: every id that ends generation, sorted, no duplicates.
    pad_id: id used for padding (masked out everywhere, so any id works; we
      prefer the tokenizer's pad token, then its EOS).
  """

  hf: Any
  path: str
  eos_ids: tuple[int, ...]
  pad_id: int

  @property
  def vocab_size(self) -> int:
    """Number of ids the tokenizer can produce (base vocab + added tokens).

    A checkpoint's embedding table may be larger (Qwen pads it to a multiple
    of 128); use the model config for the embedding size.
    """
    return len(self.hf)

  @property
  def has_chat_template(self) -> bool:
    """Whether `chat_prompt` is available (instruct and most math models)."""
    return bool(self.hf.chat_template)

  @property
  def bos_token(self) -> str | None:
    """BOS token text for plain templates of families that use one, else None."""
    return self.hf.bos_token

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, with no BOS/EOS added (templates carry them)."""
    return list(self.hf.encode(text, add_special_tokens=False))

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    """`encode` for many texts in one call to the Rust tokenizer."""
    if not texts:
      return []
    out = self.hf(list(texts), add_special_tokens=False)['input_ids']
    return [list(ids) for ids in out]

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Text of `ids`; special tokens (EOS, pad) are dropped by default."""
    return self.hf.decode(
      [int(i) for i in ids], skip_special_tokens=skip_special_tokens
    )

  def token_id(self, token: str) -> int | None:
    """Id of `token` if it is a single token of the vocabulary, else None."""
    tid = self.hf.convert_tokens_to_ids(token)
    if tid is None or (tid == self.hf.unk_token_id and token != self.hf.unk_token):
      return None
    return int(tid)

  def chat_prompt(self, user_text: str, system: str | None = None) -> str:
    """The chat-templated prompt string, ending with the assistant header.

    Args:
      user_text: content of the single user turn.
      system: optional system message (the reference uses one).

    Returns:
      The templated text; encode it with `encode` (the template already holds
      the BOS token where the family uses one).

    Raises:
      ValueError: the tokenizer has no chat template (use a plain template).
    """
    if not self.has_chat_template:
      raise ValueError(
        f'Tokenizer at {self.path} has no chat template; use a plain prompt '
        'template for base models.'
      )
    messages = []
    if system is not None:
      messages.append({'role': 'system', 'content': system})
    messages.append({'role': 'user', 'content': user_text})
    return self.hf.apply_chat_template(
      messages, tokenize=False, add_generation_prompt=True
    )


def _read_json(path: str) -> dict[str, Any]:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _as_id_list(value: Any) -> list[int]:
  if value is None:
    return []
  if isinstance(value, int):
    return [value]
  return [int(v) for v in value]


def _load_hf(path: str) -> Any:
  if os.path.exists(os.path.join(path, 'tokenizer.json')):
    hf = transformers.PreTrainedTokenizerFast.from_pretrained(path)
  else:
    hf = transformers.AutoTokenizer.from_pretrained(path)
  if not hf.chat_template:
    # Some exports keep the template only in chat_template.jinja.
    jinja = os.path.join(path, 'chat_template.jinja')
    if os.path.exists(jinja):
      with open(jinja) as f:
        hf.chat_template = f.read()
  return hf


def parse_stop_ids(spec: str) -> str | tuple[int, ...]:
  """`sampling.stop_ids`: 'default', 'model', or comma-separated token ids.

  Raises:
    ValueError: anything else (the message names the key).
  """
  spec = spec.strip()
  if spec in ('default', 'model'):
    return spec
  try:
    ids = tuple(int(x) for x in spec.split(','))
  except ValueError:
    ids = ()
  if not ids or min(ids) < 0:
    raise ValueError(
      f"sampling.stop_ids: {spec!r} is not 'default', 'model' or comma-separated "
      'token ids (e.g. "151643,151645")'
    )
  return ids


def load_tokenizer(
  path: str | os.PathLike[str], stop_ids: str | Sequence[int] = 'default'
) -> Tokenizer:
  """Loads the tokenizer of an HF directory (local or gs://).

  Args:
    path: directory with tokenizer.json (+ tokenizer_config.json), optionally
      generation_config.json whose `eos_token_id` (int or list) is merged into
      the EOS set.
    stop_ids: which ids end generation (`eos_ids`). 'default': the
      tokenizer's EOS, the generation config's `eos_token_id` and the known
      end-of-turn tokens present in the vocabulary (`_KNOWN_END_TOKENS`), so
      that a base model that ends a turn on <|im_end|> stops there. 'model':
      the tokenizer's EOS and the generation config's `eos_token_id` only, as
      the reference's vLLM sampler stops; a warning names the end-of-turn
      tokens of the chat template left out (a base model may then run to the
      full response budget). A list of ids: exactly those.

  Returns:
    The wrapped tokenizer.

  Raises:
    FileNotFoundError: `path` is not a directory.
    ValueError: no EOS id can be found, or the tokenizer encodes a probe
      text to nothing (the symptom of a wrongly chosen tokenizer class).
  """
  if storage.is_remote(path):  # A local copy of its files (no weights).
    path = storage.localize(path, ('*.json', '*.txt', '*.model', '*.jinja'))
  path = os.fspath(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f'Tokenizer directory not found: {path}')
  hf = _load_hf(path)

  eos = set(_as_id_list(hf.eos_token_id))
  gen_cfg = _read_json(os.path.join(path, 'generation_config.json'))
  eos.update(_as_id_list(gen_cfg.get('eos_token_id')))
  vocab = hf.get_vocab()
  known = {vocab[t] for t in _KNOWN_END_TOKENS if t in vocab}
  if stop_ids == 'default':
    eos.update(known)
  elif stop_ids == 'model':
    template = hf.chat_template if isinstance(hf.chat_template, str) else ''
    left_out = sorted(
      t
      for t in _KNOWN_END_TOKENS
      if t in vocab and vocab[t] not in eos and t in template
    )
    if left_out:
      logging.warning(
        'sampling.stop_ids=model: the chat template of %s ends turns with %s, '
        'which is not a stop id: a base model may run to the full response '
        "budget (stop_ids='default' adds it)",
        path,
        ', '.join(left_out),
      )
  elif isinstance(stop_ids, str):
    raise ValueError(
      f"stop_ids: {stop_ids!r} is not 'default', 'model' or a list of token ids"
    )
  else:
    eos = {int(i) for i in stop_ids}
    bad = sorted(i for i in eos if not 0 <= i < len(hf))
    if bad:
      raise ValueError(
        f'stop_ids: {bad} outside the vocabulary of {path} (0..{len(hf) - 1})'
      )
  if not eos:
    raise ValueError(
      f'No EOS token found for the tokenizer at {path}: set eos_token in '
      'tokenizer_config.json or eos_token_id in generation_config.json.'
    )
  eos_ids = tuple(sorted(eos))

  pad_id = hf.pad_token_id
  if pad_id is None:
    pad_id = _as_id_list(gen_cfg.get('pad_token_id'))[:1] or [eos_ids[0]]
    pad_id = pad_id[0]

  tok = Tokenizer(hf=hf, path=path, eos_ids=eos_ids, pad_id=int(pad_id))
  if not tok.encode('1+1=2'):
    raise ValueError(
      f'Tokenizer at {path} encodes "1+1=2" to no tokens; its tokenizer.json '
      'is probably not what the loader expected.'
    )
  return tok


def build_tiny_tokenizer(out_dir: str | os.PathLike[str]) -> Tokenizer:
  r"""Writes the tiny arithmetic task's tokenizer to `out_dir` and loads it.

  A character-level WordLevel tokenizer (digits, operators, a few
  punctuation marks and the letters of the tiny template) plus `\boxed{` as
  a single token. Unknown characters map to <unk>. The directory is a
  regular HF tokenizer directory: tokenizer.json, tokenizer_config.json
  (tokenizer_class set), special_tokens_map.json and generation_config.json
  (eos and pad ids), so `load_tokenizer` and `transformers` both read it.

  Args:
    out_dir: directory to create or overwrite files in.

  Returns:
    The loaded tokenizer (`vocab_size` <= 64, no chat template).
  """
  out_dir = os.fspath(out_dir)
  os.makedirs(out_dir, exist_ok=True)
  vocab = {t: i for i, t in enumerate(_tiny_vocab())}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=TINY_UNK))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(
    tokenizers.Regex(_TINY_SPLIT), behavior='isolated'
  )
  # Fuse joins tokens with no separator (WordLevel would insert spaces).
  tok.decoder = tokenizers.decoders.Fuse()
  tok.add_special_tokens(list(_TINY_SPECIALS))

  hf = transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok,
    pad_token=TINY_PAD,
    eos_token=TINY_EOS,
    unk_token=TINY_UNK,
    model_max_length=4096,
  )
  hf.save_pretrained(out_dir)

  # transformers 5 no longer writes these; older readers and other tools want
  # them, and PreTrainedTokenizerFast is the class name every version knows.
  config_path = os.path.join(out_dir, 'tokenizer_config.json')
  config = _read_json(config_path)
  config['tokenizer_class'] = 'PreTrainedTokenizerFast'
  specials = {'pad_token': TINY_PAD, 'eos_token': TINY_EOS, 'unk_token': TINY_UNK}
  config.update(specials)
  for name, data in (
    ('tokenizer_config.json', config),
    ('special_tokens_map.json', specials),
    (
      'generation_config.json',
      {'eos_token_id': [vocab[TINY_EOS]], 'pad_token_id': vocab[TINY_PAD]},
    ),
  ):
    with open(os.path.join(out_dir, name), 'w') as f:
      json.dump(data, f, indent=2, sort_keys=True)
  return load_tokenizer(out_dir)
