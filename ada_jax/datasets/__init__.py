"""TFDS builders of ada_jax (array_record files, no TensorFlow needed).

- `ada_arith`: synthetic arithmetic with a difficulty ladder (the tiny task).
- `ada_math_local`: the reference's prompt sets and eval sets, read from
  JSONL/Parquet files that the user placed in a manual directory.

Every builder writes the same features, so `ada_jax.data` reads them alike:
`problem` (text), `reference` (the answer the verifier compares to),
`prompt_key` (int64 hash of the problem) and `level` (difficulty, -1 if
unknown). Importing this package registers the builders with TFDS.
"""

import hashlib

import numpy as np
import tensorflow_datasets as tfds


def prompt_key(problem: str) -> int:
  """Stable, process-independent int64 key of a problem text.

  Python's `hash` is salted per process; a per-prompt statistic must survive
  restarts and agree across hosts, so we use 63 bits of BLAKE2b instead
  (non-negative, fits int64 arrays and JSON).
  """
  digest = hashlib.blake2b(problem.strip().encode('utf-8'), digest_size=8).digest()
  return int.from_bytes(digest, 'big') >> 1


def features() -> tfds.features.FeaturesDict:
  """The features every builder writes (one place, so builders cannot drift)."""
  return tfds.features.FeaturesDict(
    {
      'problem': tfds.features.Text(),
      'reference': tfds.features.Text(),
      'prompt_key': np.int64,
      'level': np.int32,
    }
  )


# Imported last: the builder modules use the helpers above.
from ada_jax.datasets import ada_arith, ada_math_local  # noqa: E402

__all__ = ['ada_arith', 'ada_math_local', 'features', 'prompt_key']
