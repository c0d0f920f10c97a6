r"""An experiment's runs on the local and TPU grids, and its analysis entry points.

An experiment module declares its variants (name -> config arg and
overrides), the curves and table columns that decide its question, as one
`Experiment`, and exports its bound `sweep` and `analyze`, which
`python -m ada_jax.sweep` and the module's own command line call.

Local grid: `configs/tiny_arith.py`, 100 RL steps, seeds 0-2. SFT depends
only on the seed and the SFT settings, never on the RL variant, so each
seed's SFT runs once, as an SFT-only run `sft_s<seed>` (`rl.steps=0`) in
ROOT/warm_start/, and every RL run of that seed starts from its checkpoint
(`model.init_from`). The warm starts form one sweep group shared by all the
experiments: the first sweep to reach one runs it (about 4 minutes), the
others find it finished. Runs are listed seed by seed, each seed's warm
start first, so a sweep stopped early leaves whole seeds, all variants alike.

TPU grid: a paper config (default Qwen2.5-Math-1.5B, `configs/qwen25_math_1p5b.py`)
on a pod (default v5p-64) with its hyperparameters unchanged, no SFT, the
seeds asked for (default one: each run takes hours); the sweep command's
`--model`, `--tpu-type` and `--seeds` pick them, and `--set
model.hf_path=...` the model directory. TPU runs are named by their
settings, in one folder shared by all experiments (ROOT/tpu_runs/), so a
run two experiments share runs once.

Runs are named `<variant>_s<seed>`. `python -m experiments.NAME [--root ROOT]
[--out DIR] [--grid local|tpu] [--model M --tpu-type T --seeds S]` analyzes the runs of the grid found below
ROOT/NAME (ROOT: $ADA_SWEEP_ROOT or /tmp/ada_sweeps) into DIR (default
ROOT/NAME/analysis).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

from experiments import report

TINY = 'configs/tiny_arith.py'
# The worked-column task (ada_columns), the tiny config's default, named so
# the grids stay on it if the default moves. The tables before 2026-12-02
# were measured on the format task (`task=format`, ada_arith).
TINY_TASK = 'task=columns'
PAPER = 'configs/qwen25_math_1p5b.py'
POD = 'v5p-64'
SEEDS = (0, 1, 2)
TPU_SEEDS = (0,)
WARM_START = 'warm_start'  # The sweep group (folder below ROOT) of warm starts.
# RL steps of a local run: fewer than the tiny config's own run, so that the
# whole local set (4 experiments x 3 seeds) fits in about 2 hours on 2 cores.
LOCAL_RL_STEPS = 100
# B, prompts per step, of the two configs' balance variant: slots = B·M.
TINY_PROMPTS = 32
PAPER_PROMPTS = 512

# Variant name -> (config arg without seed, config overrides).
Variants = Mapping[str, tuple[str, Mapping[str, Any]]]


def _arg(*parts: str) -> str:
  return ','.join(p for p in parts if p)


def warm_start(seed: int) -> dict[str, Any]:
  """The SFT-only run of `seed` on the tiny config."""
  return dict(
    config=TINY,
    arg=_arg(TINY_TASK, f'seed={seed}'),
    overrides={'rl.steps': 0},
    name=f'sft_s{seed}',
    group=WARM_START,
  )


def local_runs(
  variants: Variants,
  seeds: Sequence[int] = SEEDS,
  rl_steps: int | None = LOCAL_RL_STEPS,
) -> list[dict[str, Any]]:
  """Every variant on the tiny config for each seed, after its warm start.

  rl_steps: RL steps of every run; None keeps the tiny config's own.
  """
  out = []
  for seed in seeds:
    out.append(warm_start(seed))
    init: dict[str, Any] = {'model.init_from': f'{{sweeps}}/{WARM_START}/sft_s{seed}'}
    if rl_steps is not None:
      init['rl.steps'] = rl_steps
    out += [
      dict(
        config=TINY,
        arg=_arg(TINY_TASK, arg, f'seed={seed}'),
        overrides={**init, **overrides},
        name=f'{name}_s{seed}',
      )
      for name, (arg, overrides) in variants.items()
    ]
  return out


TPU_GROUP = 'tpu_runs'  # The sweep group of every TPU run, all experiments.


def _settings(arg: str, overrides: Mapping[str, Any]) -> str:
  """A run's settings as a folder name: the same settings, the same name."""
  parts = sorted(p.replace('=', '-') for p in arg.split(',') if p)
  parts += [f'{k}-{v}' for k, v in sorted(overrides.items())]
  slug = '_'.join(parts) or 'default'
  return ''.join(ch if ch.isalnum() or ch in '-_.' else '-' for ch in slug)


def tpu_runs(
  variants: Variants,
  seeds: Sequence[int] = TPU_SEEDS,
  config: str = PAPER,
  pod: str = POD,
) -> list[dict[str, Any]]:
  """Every variant on a paper config for the pod, hyperparameters unchanged.

  A run is named by its model, pod, settings and seed, in one group shared
  by every experiment (`TPU_GROUP`): a run two experiments share (the
  default balance run is in all of them) runs once, and the next sweep finds
  it finished. `label` keeps the variant's name for the analysis.
  """
  model = os.path.splitext(os.path.basename(config))[0]
  return [
    dict(
      config=config,
      arg=_arg(arg, f'tpu={pod}', f'seed={seed}'),
      overrides=dict(overrides),
      name=f'{model}_{pod}_{_settings(arg, overrides)}_s{seed}',
      group=TPU_GROUP,
      label=f'{name}_s{seed}',
    )
    for seed in seeds
    for name, (arg, overrides) in variants.items()
  ]


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One question: its variants, and what decides between them.

  Attributes:
    name: the module's name (experiments/NAME.py), its workdir folder.
    variants: name -> (arg, overrides) on the tiny config; also the table and
      legend order.
    curves: plot name -> (x axis in `report.X_AXES`, metric).
    columns: the table's columns after variant and seeds.
    tpu_variants: the same on the paper config, if they differ.
    rl_steps: RL steps of a local run; None: the tiny config's own (the main
      job's).
    tables: more table(s) after the first: title -> columns.
  """

  name: str
  variants: Variants
  curves: Mapping[str, tuple[str, str]]
  columns: Sequence[report.Column]
  tpu_variants: Variants | None = None
  rl_steps: int | None = LOCAL_RL_STEPS
  tables: Mapping[str, Sequence[report.Column]] | None = None

  def sweep(
    self,
    local: bool = True,
    *,
    model: str = '',
    pod: str = '',
    seeds: Sequence[int] = (),
  ) -> list[dict[str, Any]]:
    """The `ada_jax.sweep` entries: the local grid, or the TPU one.

    model (a config's name, e.g. qwen25_math_7b), pod (an accelerator type)
    and seeds pick the TPU grid's (defaults: PAPER, POD, TPU_SEEDS).
    """
    if local:
      return local_runs(self.variants, seeds or SEEDS, rl_steps=self.rl_steps)
    config = f'configs/{model}.py' if model else PAPER
    return tpu_runs(
      self.tpu_variants or self.variants, seeds or TPU_SEEDS, config, pod or POD
    )

  def analyze(self, workdirs: Mapping[str, str], out_dir: str) -> str:
    """PNG curves and OUT/NAME.md from `{run name: workdir}`; returns the table."""
    return report.report(
      workdirs,
      out_dir,
      name=self.name,
      curves=self.curves,
      columns=self.columns,
      order=list(self.variants),
      tables=self.tables,
    )

  def main(self, argv: Sequence[str] | None = None) -> None:
    """The `python -m experiments.NAME` command line (module docstring)."""
    from ada_jax import sweep

    parser = argparse.ArgumentParser(description=f'Analyze the {self.name} sweep.')
    parser.add_argument(
      '--root', default=os.environ.get('ADA_SWEEP_ROOT') or sweep.DEFAULT_ROOT
    )
    parser.add_argument('--out', default=None, help='default: ROOT/NAME/analysis')
    parser.add_argument('--grid', choices=('local', 'tpu'), default='local')
    parser.add_argument('--model', default='', help='TPU grid: configs/MODEL.py')
    parser.add_argument('--tpu-type', default='', help='TPU grid: e.g. v6e-64')
    parser.add_argument('--seeds', default='', help='comma list, e.g. 0,1')
    args = parser.parse_args(argv)
    seeds = tuple(int(x) for x in args.seeds.split(',') if x.strip())
    root = args.root.rstrip('/')
    # Warm starts live in their own group, with no RL rows to compare.
    workdirs = {
      e.get('label', e['name']): f'{root}/{e.get("group") or self.name}/{e["name"]}'
      for e in self.sweep(
        args.grid == 'local', model=args.model, pod=args.tpu_type, seeds=seeds
      )
      if e.get('group') != WARM_START
    }
    folder = f'{root}/{self.name}'
    found = {n: wd for n, wd in workdirs.items() if epath.Path(wd).exists()}
    print(self.analyze(found, args.out or f'{folder}/analysis'))
