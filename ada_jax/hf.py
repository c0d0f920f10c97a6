"""Hugging Face checkpoints <-> our NNX Transformer.

`load_model` reads config.json and model.safetensors (or a sharded
model.safetensors.index.json) with the `safetensors` package. Each file is
opened once with `safe_open(file, framework='numpy')`, which memory-maps it
and validates its header. Each param is then built with
`jax.make_array_from_callback`: the callback of a device reads only that
device's block, as `get_slice(name)[hf_index]` in HF coordinates (see
`_read_block`), and reshapes/transposes it to our layout. So the whole model
never sits on one device or in host memory (about one tensor at most), and a
host reads only the bytes of the shards it holds. BF16 tensors come back as
ml_dtypes.bfloat16 arrays: the numpy backend asks numpy for the dtype named
'bfloat16', which exists once ml_dtypes is imported.

`save_model` writes config.json, generation_config.json and safetensors
through `safetensors.numpy.save_file` (sharded past a size threshold, with
metadata {'format': 'pt'}) that
`transformers.AutoModelForCausalLM.from_pretrained` loads to the same logits.

Errors name the file, field or tensor at fault, on one line. A tokenizer
(`tokenizer.json` beside the weights) with an id, special tokens included,
outside the embedding is a `VocabError` naming both sizes and the directory
(an embedding larger than the tokenizer, as Qwen pads it, is fine). safetensors
rejects a truncated file at open without naming the tensor whose bytes are
missing, so on that path we read the header ourselves to name it.

Supported: model_type qwen2 (Qwen2 / Qwen2.5 incl. -Math), qwen3, llama
(3.x, rope_scaling 'llama3'). RoPE settings are read both in the hub form
(`rope_theta` + `rope_scaling`) and in the `rope_parameters` form that
transformers 5 writes.

_Layout (ours vs HF, D model, H heads, G KV heads, K head dim, F MLP, V vocab):
  q [D,H,K] <- q_proj.weight [H*K, D]     o [H,K,D] <- o_proj.weight [D, H*K]
  gate/up [D,F] <- [F,D]                  down [F,D] <- down_proj.weight [D,F]
  embed [V,D] <- embed_tokens.weight      lm_head [D,V] <- lm_head.weight [V,D]
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import struct
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  Registers 'bfloat16' with numpy (BF16 tensors).
import numpy as np
import safetensors
import safetensors.numpy
from flax import nnx
from jax.sharding import Mesh

from ada_jax import model as model_lib
from ada_jax import sharding as sharding_lib
from ada_jax.infra import storage

SUPPORTED_TYPES = ('qwen2', 'qwen3', 'llama')
_ARCHITECTURES = {
  'qwen2': 'Qwen2ForCausalLM',
  'qwen3': 'Qwen3ForCausalLM',
  'llama': 'LlamaForCausalLM',
}
_SUPPORTED_ROPE = ('default', 'llama3', 'linear')
# Tensors some checkpoints carry that hold nothing we need.
_IGNORED_SUFFIXES = ('rotary_emb.inv_freq',)


def _rope_from_hf(cfg: Mapping[str, Any], where: str) -> tuple[float, tuple | None]:
  params = cfg.get('rope_parameters')
  if params:  # transformers >= 5 form.
    scaling = dict(params)
    theta = float(scaling.pop('rope_theta', cfg.get('rope_theta', 10000.0)))
  else:
    theta = float(cfg.get('rope_theta', 10000.0))
    scaling = dict(cfg.get('rope_scaling') or {})
  kind = scaling.get('rope_type', scaling.get('type', 'default'))
  if kind not in _SUPPORTED_ROPE:
    raise ValueError(
      f'{where}: unsupported rope_scaling type {kind!r} (supported: {_SUPPORTED_ROPE})'
    )
  scaling.pop('type', None)
  scaling['rope_type'] = kind
  if kind == 'default':
    return theta, None
  return theta, tuple(sorted(scaling.items()))


def config_from_hf(
  cfg: Mapping[str, Any],
  *,
  dtype: Any = jnp.float32,
  param_dtype: Any = None,
  where: str = 'config.json',
) -> model_lib.ModelConfig:
  """ModelConfig from a parsed HF config.json dict; errors name the field at fault."""
  model_type = cfg.get('model_type')
  if model_type not in SUPPORTED_TYPES:
    raise ValueError(
      f'{where}: unsupported model_type {model_type!r} (supported: {SUPPORTED_TYPES})'
    )
  if cfg.get('use_sliding_window'):
    raise ValueError(f'{where}: use_sliding_window=true is not supported')
  if cfg.get('mlp_bias'):
    raise ValueError(f'{where}: mlp_bias=true is not supported')
  for key in (
    'vocab_size',
    'hidden_size',
    'intermediate_size',
    'num_hidden_layers',
    'num_attention_heads',
  ):
    if key not in cfg:
      raise ValueError(f'{where}: missing field {key!r}')
  theta, scaling = _rope_from_hf(cfg, where)
  heads = int(cfg['num_attention_heads'])
  attention_bias = bool(cfg.get('attention_bias', False))
  eos = cfg.get('eos_token_id')
  return model_lib.ModelConfig(
    model_type=model_type,
    vocab_size=int(cfg['vocab_size']),
    hidden_size=int(cfg['hidden_size']),
    intermediate_size=int(cfg['intermediate_size']),
    num_layers=int(cfg['num_hidden_layers']),
    num_heads=heads,
    num_kv_heads=int(cfg.get('num_key_value_heads') or heads),
    head_dim=int(cfg.get('head_dim') or cfg['hidden_size'] // heads),
    rope_theta=theta,
    rope_scaling=scaling,
    rms_norm_eps=float(cfg.get('rms_norm_eps', 1e-6)),
    tie_embeddings=bool(cfg.get('tie_word_embeddings', False)),
    qkv_bias=model_type == 'qwen2' or attention_bias,
    o_bias=model_type != 'qwen2' and attention_bias,
    qk_norm=model_type == 'qwen3',
    max_position_embeddings=int(cfg.get('max_position_embeddings', 4096)),
    bos_token_id=cfg.get('bos_token_id'),
    eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
    param_dtype=param_dtype or dtype,
    dtype=dtype,
  )


def config_to_hf(c: model_lib.ModelConfig) -> dict[str, Any]:
  """HF config.json dict (hub form: rope_theta + rope_scaling)."""
  attention_bias = c.o_bias if c.model_type != 'qwen2' else False
  eos = list(c.eos_token_id) if isinstance(c.eos_token_id, tuple) else c.eos_token_id
  out = {
    'architectures': [_ARCHITECTURES[c.model_type]],
    'model_type': c.model_type,
    'vocab_size': c.vocab_size,
    'hidden_size': c.hidden_size,
    'intermediate_size': c.intermediate_size,
    'num_hidden_layers': c.num_layers,
    'num_attention_heads': c.num_heads,
    'num_key_value_heads': c.num_kv_heads,
    'head_dim': c.head_dim,
    'hidden_act': 'silu',
    'rms_norm_eps': c.rms_norm_eps,
    'rope_theta': c.rope_theta,
    'rope_scaling': c.rope_scaling_dict,
    'tie_word_embeddings': c.tie_embeddings,
    'max_position_embeddings': c.max_position_embeddings,
    'bos_token_id': c.bos_token_id,
    'eos_token_id': eos,
    'torch_dtype': jnp.dtype(c.param_dtype).name,
    'use_cache': True,
  }
  if c.model_type == 'qwen2':
    out['use_sliding_window'] = False
  else:
    out['attention_bias'] = attention_bias
  if c.model_type == 'llama':
    out['mlp_bias'] = False
  return out


# How an HF tensor's dims are made of ours: HF dim i merges (row-major) the
# dims of ours listed in entry i, so to_hf is a transpose then a reshape. E.g.
# q [D,H,K] <- q_proj.weight [H*K, D] is ((1, 2), (0,)).
_Layout = tuple[tuple[int, ...], ...]
_SAME1: _Layout = ((0,),)
_SAME2: _Layout = ((0,), (1,))
_MERGED: _Layout = ((0, 1),)  # [H,K] <- [H*K]
_T: _Layout = ((1,), (0,))  # [A,B] <- [B,A]
_QKV: _Layout = ((1, 2), (0,))  # [D,H,K] <- [H*K, D]
_O: _Layout = ((2,), (0, 1))  # [H,K,D] <- [D, H*K]

_LAYER_MAP: dict[tuple[str, ...], tuple[str, _Layout]] = {
  ('attn', 'q'): ('self_attn.q_proj.weight', _QKV),
  ('attn', 'k'): ('self_attn.k_proj.weight', _QKV),
  ('attn', 'v'): ('self_attn.v_proj.weight', _QKV),
  ('attn', 'o'): ('self_attn.o_proj.weight', _O),
  ('attn', 'q_bias'): ('self_attn.q_proj.bias', _MERGED),
  ('attn', 'k_bias'): ('self_attn.k_proj.bias', _MERGED),
  ('attn', 'v_bias'): ('self_attn.v_proj.bias', _MERGED),
  ('attn', 'o_bias'): ('self_attn.o_proj.bias', _SAME1),
  ('attn', 'q_norm', 'scale'): ('self_attn.q_norm.weight', _SAME1),
  ('attn', 'k_norm', 'scale'): ('self_attn.k_norm.weight', _SAME1),
  ('attn_norm', 'scale'): ('input_layernorm.weight', _SAME1),
  ('mlp_norm', 'scale'): ('post_attention_layernorm.weight', _SAME1),
  ('mlp', 'gate'): ('mlp.gate_proj.weight', _T),
  ('mlp', 'up'): ('mlp.up_proj.weight', _T),
  ('mlp', 'down'): ('mlp.down_proj.weight', _T),
}
_TOP_MAP: dict[tuple[str, ...], tuple[str, _Layout]] = {
  ('embed',): ('model.embed_tokens.weight', _SAME2),
  ('final_norm', 'scale'): ('model.norm.weight', _SAME1),
  ('lm_head',): ('lm_head.weight', _T),
}


def _hf_entry(path: tuple) -> tuple[str, _Layout]:
  """(HF tensor name, layout) of the param at an nnx state path."""
  if path[0] == 'layers':
    name, layout = _LAYER_MAP[tuple(path[2:])]
    return f'model.layers.{path[1]}.{name}', layout
  return _TOP_MAP[tuple(path)]


def _hf_shape(shape: tuple[int, ...], layout: _Layout) -> tuple[int, ...]:
  return tuple(math.prod(shape[d] for d in group) for group in layout)


def _to_hf(a: np.ndarray, layout: _Layout) -> np.ndarray:
  order = [d for group in layout for d in group]
  return a.transpose(order).reshape(_hf_shape(a.shape, layout))


def _bounds(
  index: tuple[slice, ...], shape: tuple[int, ...]
) -> tuple[tuple[int, int], ...]:
  """(start, stop) per dim of a block index as make_array_from_callback gives it."""
  out = []
  for s, n in zip(index, shape, strict=True):
    start, stop, step = s.indices(n)
    if step != 1:
      raise ValueError(f'strided block index {index} (shape {shape})')
    out.append((start, stop))
  return tuple(out)


def _read_block(
  read: Callable[[tuple[slice, ...]], np.ndarray],
  shape: tuple[int, ...],
  layout: _Layout,
  bounds: tuple[tuple[int, int], ...],
) -> np.ndarray:
  """The block `bounds` of our array of `shape`, read from its HF tensor.

  A block of ours is a block of HF coordinates except inside a merged dim
  (H*K): there the rows of the outer dim's range are contiguous only with the
  inner dims whole, so those are read whole and cut here. Our rules never
  split an inner dim (head_dim), so in practice this reads exactly the block.

  Args:
    read: reads a block of the HF tensor, given as one slice per HF dim.
    shape: our full shape.
    layout: how the HF dims are made of ours.
    bounds: (start, stop) per dim of ours.
  """
  hf_index, read_shape, cut = [], [], []
  for outer, *inner in layout:
    start, stop = bounds[outer]
    per_row = math.prod(shape[d] for d in inner)
    hf_index.append(slice(start * per_row, stop * per_row))
    read_shape += [stop - start] + [shape[d] for d in inner]
    cut += [slice(None)] + [slice(*bounds[d]) for d in inner]
  block = read(tuple(hf_index)).reshape(read_shape)[tuple(cut)]
  order = [d for group in layout for d in group]
  return block.transpose(np.argsort(order))


def _one_line(e: BaseException) -> str:
  return ' '.join(str(e).split())


def _bad_file_message(file: str, err: BaseException) -> str:
  """One line naming `file` and, if it is cut short, the tensor that lost bytes.

  safetensors has validated the header and refused the file, but its message
  names neither; the header (u64 length, then JSON {name: {data_offsets}})
  says which tensor lies past the end.
  """
  size = os.path.getsize(file)
  header = None
  with contextlib.suppress(struct.error, ValueError), open(file, 'rb') as f:
    (n,) = struct.unpack('<Q', f.read(8))
    if 8 + n <= size:
      header = json.loads(f.read(n))
  if isinstance(header, dict):
    cut = []
    for name, info in header.items():
      with contextlib.suppress(TypeError, KeyError, ValueError):
        start, end = info['data_offsets']
        if 8 + n + end > size:
          cut.append((start, end, name))
    if cut:
      _, end, name = min(cut)
      more = f' (and {len(cut) - 1} more tensors past the end)' if len(cut) > 1 else ''
      return (
        f'{file}: truncated safetensors file: tensor {name!r} needs bytes up to '
        f'{8 + n + end}, the file has {size}{more}'
      )
  return f'{file}: not a valid safetensors file: {_one_line(err)}'


def _read_json(path: str) -> Any:
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f'{path}: not valid JSON: {_one_line(e)}') from e


class _TensorFiles:
  """The safetensors files of an HF directory; a context that closes them.

  `where` maps each tensor name to its file (one, or those of an index); a
  file is opened on the first read from it.
  """

  def __init__(self, root: str):
    self.root = root
    self._stack = contextlib.ExitStack()
    self._handles: dict[str, Any] = {}
    single = os.path.join(root, 'model.safetensors')
    index = os.path.join(root, 'model.safetensors.index.json')
    if os.path.exists(index):
      parsed = _read_json(index)
      weight_map = parsed.get('weight_map') if isinstance(parsed, dict) else None
      if not isinstance(weight_map, dict):
        raise ValueError(f'{index}: no "weight_map" object')
      self.where: dict[str, str] = dict(weight_map)
      for shard in sorted(set(weight_map.values())):
        shard_path = os.path.join(root, shard)
        if not os.path.exists(shard_path):
          raise FileNotFoundError(
            f'{index} names {shard}, which is missing: {shard_path}'
          )
    elif os.path.exists(single):
      self.where = dict.fromkeys(
        self._file('model.safetensors').keys(), 'model.safetensors'
      )
    else:
      raise FileNotFoundError(
        f'{root}: no model.safetensors or model.safetensors.index.json'
      )

  def __enter__(self) -> _TensorFiles:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self._stack.close()

  def _file(self, fname: str) -> Any:
    if fname not in self._handles:
      path = os.path.join(self.root, fname)
      try:
        handle = self._stack.enter_context(
          safetensors.safe_open(path, framework='numpy')
        )
      except safetensors.SafetensorError as e:
        raise ValueError(_bad_file_message(path, e)) from e
      self._handles[fname] = handle
    return self._handles[fname]

  def _slice(self, name: str) -> Any:
    fname = self.where[name]
    try:
      return self._file(fname).get_slice(name)
    # E.g. the index names a tensor that its file lacks.
    except safetensors.SafetensorError as e:
      raise ValueError(
        f'{os.path.join(self.root, fname)}: tensor {name!r}: {_one_line(e)}'
      ) from e

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self._slice(name).get_shape())

  def read(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
    """The block `index` (one slice per dim, HF coordinates) of tensor `name`."""
    try:
      return self._slice(name)[index]
    # Type/AttributeError: the numpy backend found no numpy dtype for the
    # tensor's (it asks np.dtype('bfloat16'), but np.float8_* for fp8 kinds).
    except (safetensors.SafetensorError, TypeError, AttributeError) as e:
      fname = os.path.join(self.root, self.where[name])
      raise ValueError(f'{fname}: tensor {name!r}: {_one_line(e)}') from e


class VocabError(ValueError):
  """A tokenizer id the embedding has no row for; the message is one line."""


def tokenizer_size(path: str | os.PathLike) -> int | None:
  """1 + the largest id of `path/tokenizer.json` (special tokens included).

  None when the directory has no tokenizer.json (a model saved without one).
  Reads the JSON only: the vocabulary (`model.vocab`, a dict of token -> id or
  a Unigram list) and `added_tokens`.
  """
  file = os.path.join(storage.localize(path, ('tokenizer.json',)), 'tokenizer.json')
  if not os.path.isfile(file):
    return None
  spec = _read_json(file)
  if not isinstance(spec, dict):
    return None
  ids = [-1]
  vocab = (spec.get('model') or {}).get('vocab')
  if isinstance(vocab, dict):
    ids.extend(int(i) for i in vocab.values())
  elif isinstance(vocab, list):
    ids.append(len(vocab) - 1)
  ids.extend(int(added['id']) for added in spec.get('added_tokens') or ())
  return max(ids) + 1


def check_vocab(
  path: str | os.PathLike, vocab_size: int, tokenizer_dir: str | None = None
) -> None:
  """Raises `VocabError` if the tokenizer has an id outside the embedding.

  `tokenizer_dir` (default: `path`) holds the tokenizer.json; without one
  there is nothing to check.
  """
  tokens = tokenizer_size(tokenizer_dir or path)
  if tokens is not None and tokens > vocab_size:
    raise VocabError(
      f'{os.fspath(tokenizer_dir or path)}: the tokenizer has ids up to '
      f'{tokens - 1} ({tokens} ids, special tokens included) but the model in '
      f'{os.fspath(path)} embeds {vocab_size} (vocab_size): those ids have no row'
    )


def fingerprint(path: str | os.PathLike, sample_bytes: int = 1 << 16) -> str:
  """A short content hash of an HF directory's model: not its path.

  SHA-256 over config.json and, for each safetensors file (name order), its
  name, size and first and last `sample_bytes`: the header names every
  tensor's shape and offsets, the samples catch other weights of the same
  shapes, and a multi-GB checkpoint is not read whole. A directory moved
  (e.g. to gs://, copied back) keeps its fingerprint.
  """
  import hashlib

  path = storage.localize(path, ('config.json', '*.safetensors'))
  h = hashlib.sha256()
  with open(os.path.join(path, 'config.json'), 'rb') as f:
    h.update(f.read())
  for name in sorted(n for n in os.listdir(path) if n.endswith('.safetensors')):
    file = os.path.join(path, name)
    size = os.path.getsize(file)
    h.update(f'{name}:{size}'.encode())
    with open(file, 'rb') as f:
      h.update(f.read(sample_bytes))
      f.seek(max(0, size - sample_bytes))
      h.update(f.read(sample_bytes))
  return h.hexdigest()[:16]


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
  """The parsed config.json of an HF directory.

  Raises:
    FileNotFoundError: naming the directory when it has no config.json.
    ValueError: naming config.json when it is not a JSON object.
  """
  where = os.fspath(path)
  cfg_path = os.path.join(storage.localize(path, ('config.json',)), 'config.json')
  if not os.path.exists(cfg_path):
    raise FileNotFoundError(f'no config.json in {where}')
  cfg = _read_json(cfg_path)
  if not isinstance(cfg, dict):
    raise ValueError(f'{cfg_path}: expected a JSON object, got {type(cfg).__name__}')
  return cfg


def load_model(
  path: str | os.PathLike,
  *,
  dtype: Any = jnp.float32,
  mesh: Mesh | None = None,
  param_dtype: Any = None,
  rules: Mapping[str, str | None] = sharding_lib.TRAIN_RULES,
  tokenizer_dir: str | None = None,
) -> model_lib.Transformer:
  """The NNX Transformer with the weights of the HF directory at `path`.

  Each host reads only the blocks of each tensor that its devices hold.

  Args:
    path: local HF directory (config.json + safetensors).
    dtype: compute dtype (bf16 on accelerators, fp32 in tests).
    mesh: target mesh; None puts everything on the first device.
    param_dtype: storage dtype of params (default: dtype).
    rules: logical-axis rules (sharding.TRAIN_RULES or SAMPLE_RULES).
    tokenizer_dir: where the tokenizer's tokenizer.json lives (default:
      `path`); checked against the embedding before any weight is read.

  Raises:
    FileNotFoundError / ValueError naming the file, field or tensor at fault.
    VocabError: a tokenizer id outside the embedding.
  """
  path = storage.localize(path)  # gs://: a local copy, downloaded once.
  config = config_from_hf(
    read_hf_config(path),
    dtype=dtype,
    param_dtype=param_dtype,
    where=os.path.join(path, 'config.json'),
  )
  check_vocab(path, config.vocab_size, tokenizer_dir)
  mesh = mesh or sharding_lib.make_mesh((1, 1, 1), jax.devices()[:1])
  abstract = nnx.eval_shape(lambda: model_lib.Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, abs_state = nnx.split(abstract)
  shardings = sharding_lib.state_shardings(abs_state, mesh, rules)
  used: set[str] = set()
  flat_sh = dict(nnx.to_flat_state(shardings))

  def load_one(
    tensors: _TensorFiles, var_path: tuple, var: nnx.Variable
  ) -> nnx.Variable:
    target = var.get_value()
    name, layout = _hf_entry(var_path)
    if name not in tensors.where:
      raise ValueError(f'{path}: missing tensor {name!r}')
    used.add(name)
    found, expected = tensors.shape(name), _hf_shape(target.shape, layout)
    if found != expected:
      raise ValueError(
        f'{path}: tensor {name!r} has shape {found}, expected {expected}'
      )
    # Devices that replicate a block ask for the same index: read it once and
    # hand them the same array, so host memory stays within one tensor.
    blocks: dict[tuple[tuple[int, int], ...], np.ndarray] = {}

    def block(index: tuple[slice, ...]) -> np.ndarray:
      key = _bounds(index, target.shape)
      if key not in blocks:
        ours = _read_block(
          lambda hf_index: tensors.read(name, hf_index), target.shape, layout, key
        )
        blocks[key] = np.asarray(ours, dtype=target.dtype)
      return blocks[key]

    sharding = flat_sh[var_path].get_value()
    return var.replace(jax.make_array_from_callback(target.shape, sharding, block))

  with _TensorFiles(path) as tensors:
    flat = [(p, load_one(tensors, p, v)) for p, v in nnx.to_flat_state(abs_state)]
    unexpected = [
      n
      for n in tensors.where
      if n not in used
      and not n.endswith(_IGNORED_SUFFIXES)
      and not (config.tie_embeddings and n == 'lm_head.weight')
    ]
  if unexpected:
    raise ValueError(
      f'{path}: unexpected tensors {sorted(unexpected)[:5]} ({len(unexpected)} in all)'
    )
  state = nnx.from_flat_state(flat)
  logging.info('loaded %s (%s) from %s', config.model_type, _count(flat), path)
  return nnx.merge(graphdef, state)


def _count(flat) -> str:
  n = sum(int(np.prod(v.get_value().shape)) for _, v in flat)
  return f'{n / 1e6:.1f}M params'


def _to_host(x: jax.Array) -> np.ndarray:
  if not x.is_fully_addressable:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def save_model(
  model: model_lib.Transformer,
  path: str | os.PathLike,
  *,
  dtype: Any = None,
  max_shard_bytes: int = 4 << 30,
) -> None:
  """Writes an HF directory that transformers loads to the same logits.

  Args:
    model: the policy (any sharding; multi-host arrays are gathered).
    path: output directory (created).
    dtype: dtype of the saved tensors (default: the params' dtype).
    max_shard_bytes: above this total, write model-0000k-of-0000n.safetensors
      files plus model.safetensors.index.json.
  """
  path = os.fspath(path)
  config = model.config
  is_writer = jax.process_index() == 0
  if is_writer:
    os.makedirs(path, exist_ok=True)
  # Stream: a shard is written as soon as it is full, so host memory holds at
  # most one shard; files get their final "-of-N" names at the end.
  shard: dict[str, np.ndarray] = {}
  written: list[tuple[str, list[str], int]] = []  # (temp file, names, bytes)

  def flush():
    if not shard:
      return
    tmp = os.path.join(path, f'.partial-{len(written):05d}.safetensors')
    if is_writer:
      # transformers refuses safetensors without format 'pt' in the metadata.
      safetensors.numpy.save_file(shard, tmp, metadata={'format': 'pt'})
    written.append((tmp, list(shard), sum(a.nbytes for a in shard.values())))
    shard.clear()

  for var_path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    name, layout = _hf_entry(var_path)
    arr = _to_host(var.get_value())  # All processes join multi-host gathers.
    if dtype is not None:
      arr = arr.astype(jnp.dtype(dtype))
    # save_file copies `nbytes` from the array's data pointer: it must be
    # C-contiguous, which the transpose of _to_hf is not.
    arr = np.ascontiguousarray(_to_hf(arr, layout))
    if shard and sum(a.nbytes for a in shard.values()) + arr.nbytes > max_shard_bytes:
      flush()
    shard[name] = arr
  flush()
  if not is_writer:
    return
  saved_dtype = jnp.dtype(dtype or config.param_dtype).name
  hf_cfg = config_to_hf(config) | {'torch_dtype': saved_dtype}
  with open(os.path.join(path, 'config.json'), 'w') as f:
    json.dump(hf_cfg, f, indent=2)
  gen = {'bos_token_id': config.bos_token_id, 'eos_token_id': hf_cfg['eos_token_id']}
  with open(os.path.join(path, 'generation_config.json'), 'w') as f:
    json.dump({k: v for k, v in gen.items() if v is not None}, f, indent=2)
  if len(written) == 1:
    os.replace(written[0][0], os.path.join(path, 'model.safetensors'))
    return
  weight_map, total = {}, 0
  for i, (tmp, names, nbytes) in enumerate(written):
    fname = f'model-{i + 1:05d}-of-{len(written):05d}.safetensors'
    os.replace(tmp, os.path.join(path, fname))
    weight_map |= dict.fromkeys(names, fname)
    total += nbytes
  with open(os.path.join(path, 'model.safetensors.index.json'), 'w') as f:
    json.dump(
      {'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=2
    )
