"""What every builder writes: the features and the stable prompt key.

One place, so builders cannot drift: `problem` (text), `reference` (the
answer the verifier compares to), `prompt_key` (int64 hash of the problem)
and `level` (difficulty, -1 if unknown).
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


def info(builder: tfds.core.DatasetBuilder, description: str) -> tfds.core.DatasetInfo:
  """A builder's DatasetInfo: its description and the shared `features`."""
  return tfds.core.DatasetInfo(
    builder=builder, description=description, features=features()
  )
