"""The four paper policies' shapes, so the planner needs no download.

`PAPER_MODELS` holds the fields of each model's HF config.json the planner
uses, keyed by the config module that trains it; `model_config` turns one
into a `ModelConfig` (compute and master dtypes from the run's config).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from ada_jax import model as model_lib

# The four paper policies (their HF config.json values), so no download is
# needed. Keyed by the config module that trains them.
PAPER_MODELS: dict[str, dict[str, Any]] = {
  'qwen25_math_1p5b': dict(  # Qwen/Qwen2.5-Math-1.5B
    model_type='qwen2',
    vocab_size=151936,
    hidden_size=1536,
    intermediate_size=8960,
    num_layers=28,
    num_heads=12,
    num_kv_heads=2,
    head_dim=128,
    rope_theta=10000.0,
    tie_embeddings=True,
    qkv_bias=True,
    max_position_embeddings=4096,
  ),
  'qwen25_math_7b': dict(  # Qwen/Qwen2.5-Math-7B
    model_type='qwen2',
    vocab_size=152064,
    hidden_size=3584,
    intermediate_size=18944,
    num_layers=28,
    num_heads=28,
    num_kv_heads=4,
    head_dim=128,
    rope_theta=10000.0,
    tie_embeddings=False,
    qkv_bias=True,
    max_position_embeddings=4096,
  ),
  'qwen3_4b_instruct': dict(  # Qwen/Qwen3-4B-Instruct-2507
    model_type='qwen3',
    vocab_size=151936,
    hidden_size=2560,
    intermediate_size=9728,
    num_layers=36,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=5000000.0,
    tie_embeddings=True,
    qk_norm=True,
    max_position_embeddings=262144,
  ),
  'llama32_3b_instruct': dict(  # meta-llama/Llama-3.2-3B-Instruct
    model_type='llama',
    vocab_size=128256,
    hidden_size=3072,
    intermediate_size=8192,
    num_layers=28,
    num_heads=24,
    num_kv_heads=8,
    head_dim=128,
    rope_theta=500000.0,
    rope_scaling=(
      ('factor', 32.0),
      ('high_freq_factor', 4.0),
      ('low_freq_factor', 1.0),
      ('original_max_position_embeddings', 8192),
      ('rope_type', 'llama3'),
    ),
    rms_norm_eps=1e-5,
    tie_embeddings=True,
    max_position_embeddings=131072,
  ),
}


def model_config(name: str, dtype: Any, param_dtype: Any) -> model_lib.ModelConfig:
  """The ModelConfig of a paper model (key of PAPER_MODELS)."""
  return model_lib.ModelConfig(
    **PAPER_MODELS[name], dtype=jnp.dtype(dtype), param_dtype=jnp.dtype(param_dtype)
  )
