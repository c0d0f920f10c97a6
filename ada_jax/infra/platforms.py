"""What differs by platform (TPU, GPU, CPU): one table, one explicit target.

Every backend-dependent choice of the policy reads this table for a *target*
platform, never `jax.default_backend()` in its own place: a program traced
for another target (`python -m ada_jax.plan --check --target tpu` on a CPU
host, the tests that build TPU programs) then gets that target's choices.
The target travels with the model as `ModelConfig.platform` (static, so a
program traced for one target is never reused for another); '' means the
running backend, which is the default everywhere.

| platform | 'auto' attention at T >= CHUNKED_MIN_T, S == T | round cache of a long response | splash kernel | fused kernel (attention='cudnn') | top-p sort |
|---|---|---|---|---|---|
| tpu | splash (Pallas/Mosaic kernel) | stacked [S, G, N, K], read by the decode loop's fused slices | compiled | XLA reference (tests only) | whole rows, slots over tensor too |
| gpu | cudnn where bf16/fp16 and head dim fit, else chunked | stacked [S, G, N, K] | interpret (tests only) | cuDNN flash attention | whole rows, slots over tensor too |
| cpu | chunked (plain JAX) | blocks of tk keys, one buffer each (XLA:CPU copies a loop's slice) | interpret (tests only) | XLA reference (tests only) | as the logits are laid out |

A config may name a kernel only for the platform it is compiled for
(`KERNELS`: attention='splash' needs a TPU target, 'cudnn' a GPU one): the
other rows run them only in tests (interpret mode, XLA's reference), far
slower than chunked attention, so `config_rules` refuses them there.

The reasons for each row live beside the code that uses it
(`attention.resolve`, `attention.round_cache_blocked`,
`attention.splash_attention`, `sampler._filter_sharding`). Chip peaks and
HBM per TPU generation are the planner's (`planner/chips.py`).
"""

from __future__ import annotations

import dataclasses

import jax

PLATFORMS = ('tpu', 'gpu', 'cpu')
# jax.default_backend() names -> our platform names.
_BACKEND_ALIASES = {'cuda': 'gpu', 'rocm': 'gpu'}


@dataclasses.dataclass(frozen=True)
class Platform:
  """One row of the table (module docstring)."""

  name: str
  # What attention='auto' runs for a long training forward or prefill
  # (T >= CHUNKED_MIN_T, no cache prefix): 'splash', 'cudnn' or 'chunked'.
  long_attention: str
  # A sampler round's own response cache, when the decode loop reads it
  # (more than DECODE_WHOLE_MAX_BLOCKS blocks), held as separate blocks.
  round_cache_blocked: bool
  # The splash kernel runs compiled (Mosaic); elsewhere in interpret mode.
  splash_compiled: bool
  # The top-p / top-k filter sorts whole vocab rows with the slots moved
  # over the tensor axis too (`sampler._filter_sharding`): the partitioner
  # gathers a tensor-split vocab for a sort, keeping a vocab-size-dependent
  # number of whole-vocab copies (libtpu: up to 4.4 per slot). XLA:CPU's
  # all-to-all costs more copies than its gather saves at test sizes.
  filter_rows_spread: bool
  # `jax.nn.dot_product_attention`'s implementation for attention='cudnn':
  # the cuDNN kernel on GPU; XLA's dense reference elsewhere (tests: the
  # left-aligning transform checked on CPU through the same call).
  fused_kernel: str = 'xla'


TABLE: dict[str, Platform] = {
  'tpu': Platform(
    'tpu',
    long_attention='splash',
    round_cache_blocked=False,
    splash_compiled=True,
    filter_rows_spread=True,
  ),
  'gpu': Platform(
    'gpu',
    long_attention='cudnn',
    round_cache_blocked=False,
    splash_compiled=False,
    filter_rows_spread=True,
    fused_kernel='cudnn',
  ),
  'cpu': Platform(
    'cpu',
    long_attention='chunked',
    round_cache_blocked=True,
    splash_compiled=False,
    filter_rows_spread=False,
  ),
}


# Attention kernels a config may name, by the platform they compile for.
KERNELS = {'splash': 'tpu', 'cudnn': 'gpu'}


def name(target: str | None = None) -> str:
  """The platform name of `target`; '' or None: the running backend.

  Raises:
    ValueError: naming the target when it is not one of PLATFORMS.
  """
  if not target:
    target = jax.default_backend()
  target = _BACKEND_ALIASES.get(target, target)
  if target not in TABLE:
    raise ValueError(f'platform {target!r} is not one of {PLATFORMS}')
  return target


def get(target: str | None = None) -> Platform:
  """The table row of `target` ('' or None: the running backend)."""
  return TABLE[name(target)]
