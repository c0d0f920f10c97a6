r"""The main job: `python -m ada_jax.main --config CONFIG[:arg] --workdir DIR`.

Loads and validates the config (`from_config`: before anything is
written), builds the run, then runs SFT (if configured) and the RL steps,
evaluating on the held-out split, checkpointing, and writing
`DIR/metrics.jsonl`, `DIR/samples.jsonl`, TensorBoard events and PNG plots.
Re-running with the same workdir resumes from the latest checkpoint.

  python -m ada_jax.main --config configs/tiny_arith.py --workdir /tmp/tiny \
      [--config.rl.steps=10 ...]

Exit codes (`ada_jax.infra.exit_codes`): 0 finished; 1 failed (e.g. a checkpoint
could not be written); 2 bad input found before anything was written; 75
stopped by SIGTERM/SIGINT (or a TPU preemption) after a checkpoint: rerun
the same command to resume.

Multi-host: with ADA_DISTRIBUTED=1 (set by launch_tpu.sh) every process calls
jax.distributed.initialize() (TPU auto-detection); with ADA_COORDINATOR,
ADA_NUM_PROCESSES and ADA_PROCESS_ID it initialises explicitly (CPU tests).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from ada_jax import from_config
from ada_jax.infra import exit_codes


def parser() -> argparse.ArgumentParser:
  """--config and --workdir; `--config.key=value` overrides pass through."""
  p = argparse.ArgumentParser(
    prog='python -m ada_jax.main',
    description=__doc__.splitlines()[0],
    epilog='Overrides: --config.KEY=VALUE (e.g. --config.rl.steps=10), any number.',
  )
  p.add_argument('--config', required=True, help='configs/NAME.py[:arg]')
  p.add_argument('--workdir', required=True, help='run directory (local or gs://)')
  return p


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """(args, overrides) of a command line; anything else is a usage error."""
  return from_config.parse_command_line(parser(), argv)


def run(argv: Sequence[str]) -> int:
  """The job; returns its exit code (see the module docstring)."""
  logging.getLogger().setLevel(logging.INFO)
  # orbax and TFDS log every file operation at INFO through absl.
  from absl import logging as absl_logging

  absl_logging.set_verbosity(absl_logging.WARNING)
  args, overrides = parse(argv)
  from ada_jax.infra import multihost, run_dir

  try:
    c = from_config.load(args.config, overrides)
  except from_config.ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    return exit_codes.BAD_INPUT
  multihost.init_distributed()
  from ada_jax.infra import checkpoint as checkpoint_lib
  from ada_jax.rl import fit as fit_lib

  try:
    from_config.validate(c)
    trainer = from_config.trainer(c, args.workdir)
  except (from_config.ConfigError, run_dir.WorkdirError, FileNotFoundError) as e:
    print(f'error: {e}', file=sys.stderr)
    return exit_codes.BAD_INPUT
  try:
    summary = fit_lib.fit(trainer)
  except checkpoint_lib.CheckpointSaveError as e:
    print(f'error: {e}', file=sys.stderr)
    return exit_codes.FAILED
  if 'preempted_at' in summary:
    where = (
      'during SFT (it has no checkpoints: it reruns when resumed)'
      if summary['preempted_phase'] == 'sft'
      else f'at RL step {summary["preempted_at"]} after its checkpoint'
    )
    print(
      f'stopped {where}: rerun the same command to resume (exit {exit_codes.STOPPED})',
      flush=True,
    )
    return exit_codes.STOPPED
  return exit_codes.OK


def main(argv: Sequence[str] | None = None) -> None:
  """Command line: exits with the job's code."""
  code = run(sys.argv[1:] if argv is None else argv)
  sys.stdout.flush()
  sys.stderr.flush()
  if code == exit_codes.FAILED:
    # A failed save can leave orbax threads waiting on each other for
    # minutes; the run is over and its last good checkpoint is on disk.
    os._exit(code)
  sys.exit(code)


if __name__ == '__main__':
  main()
