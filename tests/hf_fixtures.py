"""Tiny random HF checkpoints (made with transformers on torch CPU) for the tests.

Every float parameter is perturbed away from its init (biases and norm scales
included) so a missed bias, norm or transpose shows up in the logits.
"""

from __future__ import annotations

import os

import numpy as np

VOCAB = 96

# name -> (transformers config class, kwargs). Each covers a family feature.
VARIANTS: dict[str, tuple[str, dict]] = {
  # Qwen2.5-Math-1.5B-like: q/k/v biases, tied embeddings, 2 KV heads.
  'qwen2_tied': ('Qwen2Config', dict(tie_word_embeddings=True, rope_theta=10000.0)),
  # Qwen2.5-Math-7B-like: untied embeddings, another rope_theta.
  'qwen2_untied': ('Qwen2Config', dict(tie_word_embeddings=False, rope_theta=300.0)),
  # Qwen3: q/k norm, head_dim != hidden / heads, no biases.
  'qwen3': ('Qwen3Config', dict(head_dim=24, tie_word_embeddings=False)),
  # Llama 3.2-like: llama3 rope scaling, tied embeddings.
  'llama3_tied': (
    'LlamaConfig',
    dict(
      tie_word_embeddings=True,
      rope_theta=500000.0,
      max_position_embeddings=1024,
      rope_scaling=dict(
        rope_type='llama3',
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=16,
      ),
    ),
  ),
  # Llama 3.1-like: untied.
  'llama3_untied': ('LlamaConfig', dict(tie_word_embeddings=False)),
}


def make_hf_model(out_dir: str, variant: str, seed: int = 0, **overrides):
  """Writes a tiny random HF checkpoint to out_dir; returns the torch model."""
  import torch
  import transformers

  cls_name, kwargs = VARIANTS[variant]
  base = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    bos_token_id=1,
    eos_token_id=2,
  )
  cfg = getattr(transformers, cls_name)(**(base | kwargs | overrides))
  torch.manual_seed(seed)
  model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.05 * torch.randn(p.shape, generator=gen))
  model.save_pretrained(out_dir)
  return model


def torch_logits(model, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """Reference fp32 logits [B, T, V] from the transformers model."""
  import torch

  with torch.no_grad():
    out = model(
      input_ids=torch.tensor(tokens, dtype=torch.long),
      attention_mask=torch.tensor(mask, dtype=torch.long),
    )
  return out.logits.float().numpy()


def left_padded_batch(
  rng: np.random.RandomState, lengths: list[int], width: int, vocab: int = VOCAB
) -> tuple[np.ndarray, np.ndarray]:
  """Random tokens [B, width] left-padded (pad id 0) to the given real lengths."""
  tokens = np.zeros((len(lengths), width), np.int32)
  mask = np.zeros((len(lengths), width), np.int32)
  for i, n in enumerate(lengths):
    tokens[i, width - n :] = rng.randint(3, vocab, n)
    mask[i, width - n :] = 1
  return tokens, mask


def hf_dir(root: str, variant: str) -> str:
  return os.path.join(root, variant)
