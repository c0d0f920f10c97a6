"""What every builder writes, and the base of the generated tasks.

One place, so builders cannot drift: `problem` (text), `reference` (the
answer the verifier compares to), `prompt_key` (int64 hash of the problem)
and `level` (difficulty, -1 if unknown). `SyntheticBuilder` is the builder
of a task made by a `generate(num_train, num_test, seed)` function
(ada_arith, ada_columns): its configs, splits and examples.
"""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from collections.abc import Callable
from typing import Any, ClassVar

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


@dataclasses.dataclass
class SyntheticConfig(tfds.core.BuilderConfig):
  """Sizes and seed of one materialization of a generated task."""

  num_train: int = 0
  num_test: int = 0
  seed: int = 0


class SyntheticBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A task whose splits come from `generate(num_train, num_test, seed)`.

  A subclass sets VERSION, RELEASE_NOTES, `code_path`, BUILDER_CONFIGS (its
  default `SyntheticConfig(name='default', ...)` first) and `generate` (a
  staticmethod returning {split: [row]}, rows with the `features` keys and
  problem texts unique within a split). Its description is its module's
  docstring.
  """

  generate: ClassVar[Callable[[int, int, int], dict[str, list[dict[str, Any]]]]]

  @classmethod
  def config_for(
    cls, num_train: int | None = None, num_test: int | None = None, seed: int = 0
  ) -> SyntheticConfig:
    """The config of these sizes (None: the default's); the default when equal."""
    default = cls.BUILDER_CONFIGS[0]
    num_train = default.num_train if num_train is None else num_train
    num_test = default.num_test if num_test is None else num_test
    if (num_train, num_test, seed) == (
      default.num_train,
      default.num_test,
      default.seed,
    ):
      return default
    return SyntheticConfig(
      name=f'n{num_train}_t{num_test}_s{seed}',
      num_train=num_train,
      num_test=num_test,
      seed=seed,
    )

  def _info(self) -> tfds.core.DatasetInfo:
    return info(self, sys.modules[type(self).__module__].__doc__ or '')

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    config = self.builder_config
    rows = self.generate(config.num_train, config.num_test, config.seed)
    return {split: self._generate_examples(r) for split, r in rows.items()}

  def _generate_examples(self, rows):
    for row in rows:
      # Problem texts are unique within a split, so they are valid keys.
      yield row['problem'], row
