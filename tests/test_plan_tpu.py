"""The memory plan's TPU terms against saved TPU-compiled figures.

`benchmarks/tpu_calibration.py` compiles the paper configs' real programs
with the TPU compiler for their pods' topologies (libtpu, no chip) and
saves XLA's per-device memory analysis; tests/data/tpu_compiled.json keeps
those figures (`--table`), one row per (config, pod, variant, layers, mesh,
micro-batch, phase) with the step's shapes and the model's execution
fields. Nothing is compiled here: the plan (`backend='tpu'`) is recomputed
for each row and must be within 0.75-1.25 of the compiled program
(arguments + outputs - aliased + temporaries), the check `plan --check
--target tpu` prints. The XLA:CPU-fitted plan missed these by up to 2.95x
(old-logp counted fp32 gathered weights; a round's gathered prompts of every
layer, not one array at a time, and three [S, V] arrays where the top-p
sort holds about nine).
"""

import dataclasses
import json
import pathlib

import jax.numpy as jnp
import pytest

from ada_jax.planner import memory, models

_TABLE = pathlib.Path(__file__).parent / 'data' / 'tpu_compiled.json'
_ROWS = json.loads(_TABLE.read_text())
_LOW, _HIGH = 0.75, 1.25
# Known misses (strict xfail: a planner that fixes one must drop it here).
_KNOWN = {
  # Qwen3 4B on v4-32's (1, 2, 8), one KV head per device: its rounds
  # compile 5 GiB more than Llama 3B's on the same layout (0.61-0.74).
  **{
    f'qwen3_4b_instruct-v4-32-balance-L2-1x2x8-{phase}': 'rounds at one KV head'
    for phase in ('sampling', 'pass_rates', 'evaluation', 'selection')
  },
  # Tensor 8, one row per device: a 0.25 GiB pass, 0.07 GiB over (1.29).
  'qwen3_4b_instruct-v4-32-balance-L2-1x2x8-old_logp': 'small pass, tensor 8',
  'llama32_3b_instruct-v4-32-balance-L2-1x2x8-old_logp': 'small pass, tensor 8',
  # 7B on v6e-64 at (1, 32, 2), a layout the rule no longer picks (1.48).
  'qwen25_math_7b-v6e-64-balance-L2-1x32x2-update': 'untied, tensor 2',
}


def _id(r: dict) -> str:
  mesh = 'x'.join(map(str, r['mesh']))
  return f'{r["config"]}-{r["pod"]}-{r["variant"]}-L{r["layers"]}-{mesh}-{r["phase"]}'


def _planned(r: dict) -> int:
  m = r['model']
  cfg = models.model_config(
    r['config'], jnp.dtype(m['dtype']), jnp.dtype(m['param_dtype'])
  )
  cfg = dataclasses.replace(
    cfg,
    num_layers=m['num_layers'],
    attention=m['attention'],
    remat=m['remat'],
    platform='tpu',
  )
  shapes = memory.StepShapes(**r['shapes'])
  p = memory.plan(cfg, shapes, tuple(r['mesh']), backend='tpu')
  return p.program_bytes(r['phase'])


def test_table_covers_the_paper_configs_and_pods():
  seen = {(r['config'], r['pod']) for r in _ROWS if r['layers'] == 2}
  assert {c for c, _ in seen} >= {'qwen25_math_1p5b', 'llama32_3b_instruct'}
  assert {p for _, p in seen} == {'v4-32', 'v5p-64', 'v6e-64'}
  assert {r['phase'] for r in _ROWS} == {
    'sampling',
    'old_logp',
    'update',
    'pass_rates',
    'evaluation',
    'selection',
  }


def _param(r: dict):
  reason = _KNOWN.get(_id(r))
  marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
  return pytest.param(r, id=_id(r), marks=marks)


@pytest.mark.parametrize('row', [_param(r) for r in _ROWS])
def test_tpu_plan_matches_compiled(row):
  got = row['arguments'] + row['outputs'] - row['aliased'] + row['temp']
  assert got == row['compiled']
  ratio = _planned(row) / got
  assert _LOW <= ratio <= _HIGH, f'plan / TPU-compiled = {ratio:.2f}'
