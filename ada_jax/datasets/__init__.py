"""TFDS builders of ada_jax (array_record files, no TensorFlow needed).

- `ada_arith`: synthetic arithmetic with a difficulty ladder (the tiny
  format task).
- `ada_columns`: four-digit column addition and subtraction, levels by
  carries (the tiny task where RL improves answers).
- `ada_math_local`: the reference's prompt sets and eval sets, read from
  JSONL/Parquet files that the user placed in a manual directory.

Every builder writes the same features, so `ada_jax.data` reads them alike:
`problem` (text), `reference` (the answer the verifier compares to),
`prompt_key` (int64 hash of the problem) and `level` (difficulty, -1 if
unknown), defined in `schema`. Importing this package registers the
builders with TFDS.
"""

from ada_jax.datasets import ada_arith, ada_columns, ada_math_local
from ada_jax.datasets.schema import features, prompt_key

__all__ = ['ada_arith', 'ada_columns', 'ada_math_local', 'features', 'prompt_key']
