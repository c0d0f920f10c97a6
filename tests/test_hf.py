"""HF import/export: round trips through transformers, sharded files, bad input."""

import json
import os
import shutil
import tracemalloc

import jax.numpy as jnp
import numpy as np
import pytest
import safetensors
import safetensors.numpy
from flax import nnx

from ada_jax import hf
from ada_jax import model as model_lib
from ada_jax import sharding as sharding_lib
from tests import hf_fixtures


def _batch():
  return hf_fixtures.left_padded_batch(np.random.RandomState(5), [10, 3], 10)


@pytest.mark.parametrize('variant', ['qwen2_tied', 'qwen3', 'llama3_tied'])
def test_save_then_transformers_reload_same_logits(hf_models, tmp_path, variant):
  import transformers

  model = hf.load_model(hf_models[variant][0])
  hf.save_model(model, tmp_path / 'out')
  reloaded = (
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'out').float().eval()
  )
  tokens, mask = _batch()
  ours = np.asarray(model_lib.logits(model, tokens, mask))
  ref = hf_fixtures.torch_logits(reloaded, tokens, mask)
  assert np.abs(ours - ref)[mask.astype(bool)].max() <= 1e-4
  gen = json.loads((tmp_path / 'out' / 'generation_config.json').read_text())
  assert gen['eos_token_id'] == 2


def test_sharded_index_save_and_load(hf_models, tmp_path):
  import transformers

  model = hf.load_model(hf_models['qwen2_untied'][0])
  hf.save_model(model, tmp_path / 'sharded', max_shard_bytes=40_000)
  files = sorted(os.listdir(tmp_path / 'sharded'))
  assert 'model.safetensors.index.json' in files
  assert sum(f.endswith('.safetensors') for f in files) > 2
  again = hf.load_model(tmp_path / 'sharded')
  tokens, mask = _batch()
  a = np.asarray(model_lib.logits(model, tokens, mask))
  b = np.asarray(model_lib.logits(again, tokens, mask))
  np.testing.assert_array_equal(a, b)
  ref = hf_fixtures.torch_logits(
    transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'sharded')
    .float()
    .eval(),
    tokens,
    mask,
  )
  assert np.abs(a - ref)[mask.astype(bool)].max() <= 1e-4


def test_transformers5_rope_parameters_form(hf_models, tmp_path):
  src = hf_models['llama3_tied'][0]
  shutil.copytree(src, tmp_path / 'm')
  cfg = json.loads((tmp_path / 'm' / 'config.json').read_text())
  legacy = dict(cfg)
  params = legacy.pop('rope_parameters', None)
  if params is None:  # Written in hub form: convert to the transformers-5 form.
    params = dict(legacy.pop('rope_scaling')) | {'rope_theta': legacy.pop('rope_theta')}
    cfg = legacy | {'rope_parameters': params}
  else:  # Written in transformers-5 form: convert to the hub form.
    theta = params.pop('rope_theta')
    cfg = legacy | {'rope_theta': theta, 'rope_scaling': params}
  (tmp_path / 'm' / 'config.json').write_text(json.dumps(cfg))
  a = hf.load_model(src).config
  b = hf.load_model(tmp_path / 'm').config
  assert a.rope_theta == b.rope_theta == 500000.0
  assert (
    a.rope_scaling == b.rope_scaling and dict(a.rope_scaling)['rope_type'] == 'llama3'
  )


def _copy(hf_models, tmp_path, variant='qwen2_tied'):
  dst = tmp_path / 'bad'
  shutil.copytree(hf_models[variant][0], dst)
  return dst


def _edit_config(path, **changes):
  cfg = json.loads((path / 'config.json').read_text())
  cfg.update(changes)
  (path / 'config.json').write_text(json.dumps(cfg))


def _rewrite_tensors(path, fn):
  tensors = fn(safetensors.numpy.load_file(path / 'model.safetensors'))
  safetensors.numpy.save_file(tensors, path / 'model.safetensors')


def test_error_unsupported_model_type(hf_models, tmp_path):
  path = _copy(hf_models, tmp_path)
  _edit_config(path, model_type='gpt2')
  with pytest.raises(ValueError, match=r"config.json.*model_type 'gpt2'"):
    hf.load_model(path)


def test_error_unsupported_rope_type(hf_models, tmp_path):
  path = _copy(hf_models, tmp_path)
  _edit_config(
    path, rope_parameters=None, rope_scaling={'rope_type': 'yarn', 'factor': 4.0}
  )
  with pytest.raises(ValueError, match="rope_scaling type 'yarn'"):
    hf.load_model(path)


def test_error_missing_tensor(hf_models, tmp_path):
  path = _copy(hf_models, tmp_path)
  _rewrite_tensors(
    path, lambda t: {k: v for k, v in t.items() if 'layers.1.mlp.up_proj' not in k}
  )
  with pytest.raises(
    ValueError, match=r"missing tensor 'model.layers.1.mlp.up_proj.weight'"
  ):
    hf.load_model(path)


def test_error_unexpected_tensor(hf_models, tmp_path):
  path = _copy(hf_models, tmp_path)
  _rewrite_tensors(
    path, lambda t: t | {'model.layers.0.extra.weight': np.zeros(3, np.float32)}
  )
  with pytest.raises(
    ValueError, match=r'unexpected tensors.*model.layers.0.extra.weight'
  ):
    hf.load_model(path)


def test_error_wrong_shape(hf_models, tmp_path):
  path = _copy(hf_models, tmp_path)
  name = 'model.layers.0.self_attn.k_proj.weight'
  _rewrite_tensors(path, lambda t: t | {name: np.zeros((5, 64), np.float32)})
  with pytest.raises(
    ValueError, match=rf"'{name}' has shape \(5, 64\), expected \(32, 64\)"
  ):
    hf.load_model(path)


def test_error_missing_files(hf_models, tmp_path):
  path = _copy(hf_models, tmp_path)
  os.remove(path / 'model.safetensors')
  with pytest.raises(FileNotFoundError, match=r'no model\.safetensors'):
    hf.load_model(path)
  os.remove(path / 'config.json')
  with pytest.raises(FileNotFoundError, match=r'no config\.json'):
    hf.load_model(path)


def test_error_index_names_missing_shard(hf_models, tmp_path):
  model = hf.load_model(hf_models['qwen2_tied'][0])
  hf.save_model(model, tmp_path / 's', max_shard_bytes=40_000)
  shard = sorted(f for f in os.listdir(tmp_path / 's') if f.endswith('.safetensors'))[1]
  os.remove(tmp_path / 's' / shard)
  with pytest.raises(FileNotFoundError, match=shard):
    hf.load_model(tmp_path / 's')


def test_sharded_load_peak_host_memory(tmp_path):
  # Enough layers that the whole model is many times its largest tensor, so a
  # loader that held all tensors on the host at once would fail the bound.
  hf_fixtures.make_hf_model(
    str(tmp_path / 'src'), 'qwen2_untied', num_hidden_layers=8, intermediate_size=512
  )
  model = hf.load_model(tmp_path / 'src')
  hf.save_model(model, tmp_path / 'big', max_shard_bytes=300_000)
  index = json.loads((tmp_path / 'big' / 'model.safetensors.index.json').read_text())
  sizes = []
  for name, shard in index['weight_map'].items():
    with safetensors.safe_open(tmp_path / 'big' / shard, framework='numpy') as f:
      sizes.append(int(np.prod(f.get_slice(name).get_shape())) * 4)
  total, largest = sum(sizes), max(sizes)
  assert total > 8 * largest
  tracemalloc.start()
  loaded = hf.load_model(tmp_path / 'big')
  _, peak = tracemalloc.get_traced_memory()
  tracemalloc.stop()
  # Host allocations only (device buffers are not traced): the bound of the
  # issue is result + 2 x largest; we hold ourselves to 2 x largest + 1 MiB.
  assert peak <= 2 * largest + (1 << 20), (peak, largest, total)
  tokens, mask = _batch()
  np.testing.assert_array_equal(
    np.asarray(model_lib.logits(model, tokens, mask)),
    np.asarray(model_lib.logits(loaded, tokens, mask)),
  )


def _params(model) -> dict[tuple, np.ndarray]:
  return {
    p: np.asarray(v.get_value())
    for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))
  }


def test_bf16_params_round_trip_bitwise(hf_models, tmp_path):
  import torch
  import transformers

  src, torch_model = hf_models['qwen2_tied']
  model = hf.load_model(src, param_dtype=jnp.bfloat16)
  hf.save_model(model, tmp_path / 'bf16')
  file = tmp_path / 'bf16' / 'model.safetensors'
  with safetensors.safe_open(file, framework='numpy') as f:
    assert f.metadata() == {'format': 'pt'}
    assert {f.get_slice(k).get_dtype() for k in f.keys()} == {'BF16'}  # noqa: SIM118
  want = _params(model)
  again = _params(hf.load_model(tmp_path / 'bf16', param_dtype=jnp.bfloat16))
  assert again.keys() == want.keys()
  for k, v in want.items():
    assert again[k].dtype == jnp.bfloat16, k
    np.testing.assert_array_equal(again[k].view(np.uint16), v.view(np.uint16), str(k))
  # A bf16 file into fp32 params: the exact upcast.
  wide = _params(hf.load_model(tmp_path / 'bf16', param_dtype=jnp.float32))
  for k, v in want.items():
    np.testing.assert_array_equal(wide[k], v.astype(np.float32), str(k))
  # transformers reads the bits torch's own fp32 -> bf16 cast of the source
  # gives (both round to nearest even), whatever dtype it loads into.
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / 'bf16')
  got, ref = reloaded.state_dict(), torch_model.state_dict()
  assert got.keys() == ref.keys()
  for k, v in ref.items():
    a = got[k].to(torch.bfloat16).view(torch.int16)
    assert torch.equal(a, v.to(torch.bfloat16).view(torch.int16)), k


def test_error_truncated_file_names_file_and_tensor(hf_models, tmp_path):
  path = _copy(hf_models, tmp_path)
  file = path / 'model.safetensors'
  data = file.read_bytes()
  cut = int(len(data) * 0.6)
  file.write_bytes(data[:cut])
  n = int.from_bytes(data[:8], 'little')
  header = json.loads(data[8 : 8 + n])
  header.pop('__metadata__', None)
  # The tensor that the cut goes through.
  (name,) = [
    k
    for k, v in header.items()
    if 8 + n + v['data_offsets'][0] < cut < 8 + n + v['data_offsets'][1]
  ]
  with pytest.raises(ValueError) as e:
    hf.load_model(path)
  msg = str(e.value)
  assert '\n' not in msg
  assert str(file) in msg and repr(name) in msg and 'truncated' in msg, msg


@pytest.mark.parametrize('where', ['json', 'length'])
def test_error_garbage_header_names_file(hf_models, tmp_path, where):
  path = _copy(hf_models, tmp_path)
  file = path / 'model.safetensors'
  data = bytearray(file.read_bytes())
  if where == 'json':
    data[8:40] = b'#' * 32
  else:
    data[:8] = b'\xff' * 8
  file.write_bytes(bytes(data))
  with pytest.raises(ValueError, match='not a valid safetensors file') as e:
    hf.load_model(path)
  msg = str(e.value)
  assert str(file) in msg and '\n' not in msg, msg


@pytest.mark.parametrize(
  'text',
  ['{"model_type": "qwen2",', '[1, 2]', b'\xff\xfe{}'],
  ids=['cut', 'list', 'utf8'],
)
def test_error_bad_config_json_names_it(hf_models, tmp_path, text):
  path = _copy(hf_models, tmp_path)
  cfg = path / 'config.json'
  if isinstance(text, bytes):
    cfg.write_bytes(text)
  else:
    cfg.write_text(text)
  for read in (hf.read_hf_config, hf.load_model):
    with pytest.raises(ValueError) as e:
      read(path)
    msg = str(e.value)
    assert msg.startswith(f'{cfg}: ') and '\n' not in msg, msg


def test_error_bad_index_json_names_it(hf_models, tmp_path):
  model = hf.load_model(hf_models['qwen2_tied'][0])
  hf.save_model(model, tmp_path / 's', max_shard_bytes=40_000)
  index = tmp_path / 's' / 'model.safetensors.index.json'
  index.write_text(index.read_text()[:50])
  with pytest.raises(ValueError) as e:
    hf.load_model(tmp_path / 's')
  msg = str(e.value)
  assert msg.startswith(f'{index}: not valid JSON') and '\n' not in msg, msg


def test_sharded_load_reads_only_each_device_block(hf_models, tmp_path, monkeypatch):
  src = hf_models['qwen2_untied'][0]
  want = _params(hf.load_model(src))
  reads: dict[str, list[tuple[tuple[slice, ...], int]]] = {}
  real_read = hf._TensorFiles.read

  def recording_read(self, name, index):
    out = real_read(self, name, index)
    reads.setdefault(name, []).append((index, out.size))
    return out

  monkeypatch.setattr(hf._TensorFiles, 'read', recording_read)
  # data x fsdp x tensor over the 8 fake CPU devices: every block is held by
  # the 2 devices of the data axis.
  mesh = sharding_lib.make_mesh((2, 2, 2))
  model = hf.load_model(src, mesh=mesh)
  sharded = []
  for var_path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    arr = v.get_value()
    name = hf._hf_entry(var_path)[0]
    sizes = [size for _, size in reads[name]]
    # Each block is read once, and the blocks add up to the tensor.
    assert sum(sizes) == arr.size, (name, reads[name])
    if arr.sharding.shard_shape(arr.shape) != arr.shape:
      sharded.append(name)
      assert max(sizes) < arr.size, (name, reads[name])
    np.testing.assert_array_equal(np.asarray(arr), want[var_path], name)
  # The matrices (q/k/v/o, MLP, embed, lm_head) are sharded in this layout.
  assert len(sharded) >= 7 * 2 + 2, sharded
  assert 'model.layers.0.self_attn.q_proj.weight' in sharded


@pytest.mark.parametrize(
  'var_path',
  [
    ('layers', 0, 'attn', 'q'),
    ('layers', 0, 'attn', 'o'),
    ('layers', 0, 'attn', 'q_bias'),
    ('layers', 0, 'mlp', 'down'),
    ('embed',),
  ],
)
def test_read_block_matches_whole_tensor_transform(var_path):
  # Every block of ours, incl. ones that split an inner merged dim (head_dim),
  # which our rules never do, so the sharded load test does not reach it.
  _, layout = hf._hf_entry(var_path)
  ndim = sum(len(g) for g in layout)
  shape = (4, 6, 5)[:ndim]
  ours = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  theirs = hf._to_hf(ours, layout)
  rng = np.random.RandomState(0)
  for _ in range(20):
    bounds = tuple(tuple(sorted(rng.choice(n + 1, 2, replace=False))) for n in shape)
    block = hf._read_block(lambda index: theirs[index], shape, layout, bounds)
    np.testing.assert_array_equal(block, ours[tuple(slice(*b) for b in bounds)])
