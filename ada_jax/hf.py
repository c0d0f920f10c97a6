"""Hugging Face checkpoints <-> our NNX Transformer.

`load_model` reads config.json and model.safetensors (or a sharded
model.safetensors.index.json) tensor by tensor: each tensor is memory-mapped,
transformed to our layout and placed straight into its target sharding with
`jax.make_array_from_callback`, so the whole model never sits on one device
or in host memory. `save_model` writes config.json, generation_config.json
and safetensors (sharded past a size threshold) that
`transformers.AutoModelForCausalLM.from_pretrained` loads to the same logits.

Supported: model_type qwen2 (Qwen2 / Qwen2.5 incl. -Math), qwen3, llama
(3.x, rope_scaling 'llama3'). RoPE settings are read both in the hub form
(`rope_theta` + `rope_scaling`) and in the `rope_parameters` form that
transformers 5 writes.

Layout (ours vs HF, D model, H heads, G KV heads, K head dim, F MLP, V vocab):
  q [D,H,K] <- q_proj.weight [H*K, D]     o [H,K,D] <- o_proj.weight [D, H*K]
  gate/up [D,F] <- [F,D]                  down [F,D] <- down_proj.weight [D,F]
  embed [V,D] <- embed_tokens.weight      lm_head [D,V] <- lm_head.weight [V,D]
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from ada_jax import model as model_lib
from ada_jax import safetensors_io
from ada_jax import sharding as sharding_lib

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


# (our path suffix, HF name template, to_ours(hf_array, shape), to_hf(our_array))
def _t2(a, shape):
  return a.T.reshape(shape)


_LAYER_MAP: dict[tuple[str, ...], tuple[str, Callable, Callable]] = {
  ('attn', 'q'): (
    'self_attn.q_proj.weight',
    _t2,
    lambda a: a.reshape(a.shape[0], -1).T,
  ),
  ('attn', 'k'): (
    'self_attn.k_proj.weight',
    _t2,
    lambda a: a.reshape(a.shape[0], -1).T,
  ),
  ('attn', 'v'): (
    'self_attn.v_proj.weight',
    _t2,
    lambda a: a.reshape(a.shape[0], -1).T,
  ),
  ('attn', 'o'): (
    'self_attn.o_proj.weight',
    _t2,
    lambda a: a.reshape(-1, a.shape[-1]).T,
  ),
  ('attn', 'q_bias'): ('self_attn.q_proj.bias', np.reshape, lambda a: a.reshape(-1)),
  ('attn', 'k_bias'): ('self_attn.k_proj.bias', np.reshape, lambda a: a.reshape(-1)),
  ('attn', 'v_bias'): ('self_attn.v_proj.bias', np.reshape, lambda a: a.reshape(-1)),
  ('attn', 'o_bias'): ('self_attn.o_proj.bias', np.reshape, lambda a: a),
  ('attn', 'q_norm', 'scale'): ('self_attn.q_norm.weight', np.reshape, lambda a: a),
  ('attn', 'k_norm', 'scale'): ('self_attn.k_norm.weight', np.reshape, lambda a: a),
  ('attn_norm', 'scale'): ('input_layernorm.weight', np.reshape, lambda a: a),
  ('mlp_norm', 'scale'): ('post_attention_layernorm.weight', np.reshape, lambda a: a),
  ('mlp', 'gate'): ('mlp.gate_proj.weight', _t2, lambda a: a.T),
  ('mlp', 'up'): ('mlp.up_proj.weight', _t2, lambda a: a.T),
  ('mlp', 'down'): ('mlp.down_proj.weight', _t2, lambda a: a.T),
}
_TOP_MAP: dict[tuple[str, ...], tuple[str, Callable, Callable]] = {
  ('embed',): ('model.embed_tokens.weight', np.reshape, lambda a: a),
  ('final_norm', 'scale'): ('model.norm.weight', np.reshape, lambda a: a),
  ('lm_head',): ('lm_head.weight', _t2, lambda a: a.T),
}


def _hf_entry(path: tuple) -> tuple[str, Callable, Callable]:
  if path[0] == 'layers':
    name, to_ours, to_hf = _LAYER_MAP[tuple(path[2:])]
    return f'model.layers.{path[1]}.{name}', to_ours, to_hf
  return _TOP_MAP[tuple(path)]


class _TensorIndex:
  """name -> the file holding it, for a single file or a sharded index."""

  def __init__(self, path: str):
    single = os.path.join(path, 'model.safetensors')
    index = os.path.join(path, 'model.safetensors.index.json')
    self._files: dict[str, safetensors_io.SafetensorsFile] = {}
    if os.path.exists(index):
      with open(index) as f:
        weight_map = json.load(f).get('weight_map')
      if not isinstance(weight_map, dict):
        raise ValueError(f'{index}: no "weight_map" object')
      self.where = dict(weight_map)
      for shard in sorted(set(weight_map.values())):
        shard_path = os.path.join(path, shard)
        if not os.path.exists(shard_path):
          raise FileNotFoundError(
            f'{index} names {shard}, which is missing: {shard_path}'
          )
    elif os.path.exists(single):
      self.where = dict.fromkeys(
        self._file('model.safetensors', path).keys(), 'model.safetensors'
      )
    else:
      raise FileNotFoundError(
        f'{path}: no model.safetensors or model.safetensors.index.json'
      )
    self.root = path

  def _file(self, shard: str, root: str) -> safetensors_io.SafetensorsFile:
    if shard not in self._files:
      self._files[shard] = safetensors_io.SafetensorsFile(os.path.join(root, shard))
    return self._files[shard]

  def get(self, name: str) -> np.ndarray:
    return self._file(self.where[name], self.root).get(name)


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
  """The parsed config.json of an HF directory (error names the missing file)."""
  cfg_path = os.path.join(os.fspath(path), 'config.json')
  if not os.path.exists(cfg_path):
    raise FileNotFoundError(f'no config.json in {os.fspath(path)}')
  with open(cfg_path) as f:
    return json.load(f)


def load_model(
  path: str | os.PathLike,
  *,
  dtype: Any = jnp.float32,
  mesh: Mesh | None = None,
  param_dtype: Any = None,
  rules: Mapping[str, str | None] = sharding_lib.TRAIN_RULES,
) -> model_lib.Transformer:
  """The NNX Transformer with the weights of the HF directory at `path`.

  Args:
    path: local HF directory (config.json + safetensors).
    dtype: compute dtype (bf16 on accelerators, fp32 in tests).
    mesh: target mesh; None puts everything on the first device.
    param_dtype: storage dtype of params (default: dtype).
    rules: logical-axis rules (sharding.TRAIN_RULES or SAMPLE_RULES).

  Raises:
    FileNotFoundError / ValueError naming the file, field or tensor at fault.
  """
  path = os.fspath(path)
  config = config_from_hf(
    read_hf_config(path),
    dtype=dtype,
    param_dtype=param_dtype,
    where=os.path.join(path, 'config.json'),
  )
  mesh = mesh or sharding_lib.make_mesh((1, 1, 1), jax.devices()[:1])
  abstract = nnx.eval_shape(lambda: model_lib.Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, abs_state = nnx.split(abstract)
  shardings = sharding_lib.state_shardings(abs_state, mesh, rules)
  tensors = _TensorIndex(path)
  used: set[str] = set()
  flat_sh = dict(nnx.to_flat_state(shardings))

  def load_one(var_path, var):
    target = var.get_value()
    name, to_ours, _ = _hf_entry(var_path)
    if name not in tensors.where:
      raise ValueError(f'{path}: missing tensor {name!r}')
    used.add(name)
    src = tensors.get(name)
    expected = _hf_shape(var_path, target.shape)
    if tuple(src.shape) != expected:
      raise ValueError(
        f'{path}: tensor {name!r} has shape {tuple(src.shape)}, expected {expected}'
      )
    host = np.asarray(to_ours(src, target.shape), dtype=target.dtype)
    sharding = flat_sh[var_path].get_value()
    arr = jax.make_array_from_callback(target.shape, sharding, lambda idx: host[idx])
    return var.replace(arr)

  flat = [(p, load_one(p, v)) for p, v in nnx.to_flat_state(abs_state)]
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


def _hf_shape(var_path: tuple, shape: tuple[int, ...]) -> tuple[int, ...]:
  _, _, to_hf = _hf_entry(var_path)
  return tuple(to_hf(np.empty(shape, np.bool_)).shape)


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
  shard: list[tuple[str, np.ndarray]] = []
  written: list[tuple[str, list[str], int]] = []  # (temp file, names, bytes)

  def flush():
    if not shard:
      return
    tmp = os.path.join(path, f'.partial-{len(written):05d}.safetensors')
    if is_writer:
      safetensors_io.save_file(shard, tmp)
    written.append((tmp, [n for n, _ in shard], sum(a.nbytes for _, a in shard)))
    shard.clear()

  for var_path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    name, _, to_hf = _hf_entry(var_path)
    arr = _to_host(var.get_value())  # All processes join multi-host gathers.
    if dtype is not None:
      arr = arr.astype(jnp.dtype(dtype))
    arr = np.ascontiguousarray(to_hf(arr))
    if shard and sum(a.nbytes for _, a in shard) + arr.nbytes > max_shard_bytes:
      flush()
    shard.append((name, arr))
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
