r"""The main job: `python -m ada_jax.main --config CONFIG[:arg] --workdir DIR`.

Loads and validates the config (`from_config`: before anything is
written), builds the run, then runs SFT (if configured) and the RL steps,
evaluating on the held-out split, checkpointing, and writing
`DIR/metrics.jsonl`, `DIR/samples.jsonl`, TensorBoard events and PNG plots.
Re-running with the same workdir resumes from the latest checkpoint.

One writer per run: the job takes the workdir's lease before it writes
anything (`infra.lease`); a second job on a workdir whose holder is alive
exits 73 with one line naming it. The run's config is its identity: a rerun
that changes a key that alters what the run computes (`config_rules`
classifies every key; the model by content) is refused with one line naming
the keys and both values (exit 2, nothing written); the other keys (paths,
logging, cadence, mesh, micro-batch, attention, remat, slots, verifier
workers and timeouts) may change, each change recorded with its step in
`config_history.jsonl` beside `config.json`, which is never rewritten.
`--extend-steps N` runs a finished or running run on to RL step N (N above
its recorded rl.steps): the added steps get a new learning-rate schedule,
`rl.lr_schedule` from `rl.lr` over the added steps without warmup
(constant: rl.lr; cosine: from rl.lr to 0 at step N); rerun with the same
flag to resume it.

  python -m ada_jax.main --config configs/tiny_arith.py --workdir /tmp/tiny \
      [--config.rl.steps=10 ...]

Exit codes (`ada_jax.infra.exit_codes`): 0 finished; 1 failed (e.g. a checkpoint
could not be written, or `rl.max_nonfinite_steps` steps in a row with every
update non-finite); 2 bad input found before anything was written; 73 busy
(another live process holds the workdir); 75
stopped by SIGTERM/SIGINT (or a TPU preemption) after a checkpoint of the last
completed step, or, where that write would not fit the preemption notice, at
once without one (the line names the step it resumes from): rerun the same
command to resume.

Multi-host: with ADA_DISTRIBUTED=1 (set by launch_tpu.sh; on GPU clusters by
the batch script) every process calls jax.distributed.initialize(), which
detects a TPU pod, SLURM or Open MPI; with ADA_COORDINATOR,
ADA_NUM_PROCESSES and ADA_PROCESS_ID it initialises explicitly (plain ssh
launches, the CPU tests); the explicit variables win where both are set
(`infra.multihost.distributed_init_kwargs`, README "Multi-node GPU").
What process 0 decides alone (the config checks, the workdir and its lease,
a restart, an optional import) is agreed across processes, so every process
exits with the same code and none waits in a collective.
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
  """--config, --workdir, --extend-steps; `--config.key=value` overrides pass through."""
  p = argparse.ArgumentParser(
    prog='python -m ada_jax.main',
    description=__doc__.splitlines()[0],
    epilog='Overrides: --config.KEY=VALUE (e.g. --config.rl.steps=10), any number.',
  )
  p.add_argument('--config', required=True, help='configs/NAME.py[:arg]')
  p.add_argument('--workdir', required=True, help='run directory (local or gs://)')
  p.add_argument(
    '--extend-steps',
    type=int,
    default=None,
    metavar='N',
    help='run a finished (or running) run on to RL step N (above its rl.steps); '
    'the added steps get a new learning-rate schedule of rl.lr_schedule from '
    'rl.lr, without warmup',
  )
  return p


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
  """(args, overrides) of a command line; anything else is a usage error."""
  return from_config.parse_command_line(parser(), argv)


def _error(message: str, code: int) -> int:
  print(f'error: {message}', file=sys.stderr, flush=True)
  return code


def run(argv: Sequence[str]) -> int:
  """The job; returns its exit code (see the module docstring)."""
  logging.getLogger().setLevel(logging.INFO)
  # orbax and TFDS log every file operation at INFO through absl.
  from absl import logging as absl_logging

  absl_logging.set_verbosity(absl_logging.WARNING)
  args, overrides = parse(argv)
  from ada_jax.infra import lease as lease_lib
  from ada_jax.infra import multihost, run_dir

  # Joined first: every check below ends in an agreement, so that a process
  # that refuses takes the others with it instead of leaving them waiting.
  multihost.init_distributed()
  import jax

  is_main = jax.process_index() == 0
  lease = None
  try:
    with multihost.agreed({from_config.ConfigError: exit_codes.BAD_INPUT}):
      c = from_config.load(args.config, overrides)
      from_config.validate(c)
    # Process 0 alone: the workdir, its lease (before anything is written),
    # the config against the run's recorded one.
    ident = None
    with multihost.agreed(
      {
        lease_lib.LeaseBusyError: exit_codes.BUSY,
        from_config.ConfigError: exit_codes.BAD_INPUT,
        run_dir.WorkdirError: exit_codes.BAD_INPUT,
      }
    ):
      if is_main:
        run_dir.check_writable(args.workdir)
        lease = lease_lib.Lease(
          lease_lib.store_for(args.workdir),
          where=f'--workdir {args.workdir}',
          command=' '.join(['python -m ada_jax.main', *argv]),
        )
        lease.acquire()
        ident = from_config.identity(c, args.workdir, args.extend_steps).to_json()
    ident = from_config.Identity.from_json(multihost.broadcast_json_from_main(ident))
    with c.unlocked():
      c.rl.steps = ident.steps
    from ada_jax.infra import checkpoint as checkpoint_lib
    from ada_jax.rl import fit as fit_lib

    try:
      trainer = from_config.trainer(c, args.workdir, schedule_ends=ident.schedule_ends)
    except (from_config.ConfigError, run_dir.WorkdirError, FileNotFoundError) as e:
      return _error(str(e), exit_codes.BAD_INPUT)
    if is_main:
      _record_identity(args.workdir, ident, trainer.step)
    try:
      summary = fit_lib.fit(
        trainer,
        lease_lost=(lambda: lease.lost) if lease is not None else None,
        max_nonfinite_steps=c.rl.get('max_nonfinite_steps', 3),
      )
    except (
      checkpoint_lib.CheckpointSaveError,
      fit_lib.DeadRunError,
      lease_lib.LeaseLostError,
    ) as e:
      return _error(str(e), exit_codes.FAILED)
  except multihost.AgreedError as e:
    return _error(str(e), e.code)
  finally:
    if lease is not None:
      lease.release()
  if 'preempted_at' in summary:
    if summary['preempted_phase'] == 'rl' and not summary.get('preempted_saved', True):
      return exit_codes.STOPPED  # fit said so at once, naming the resume step.
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


def _record_identity(workdir: str, ident, step: int) -> None:
  """The run's first history record, then each change with its step."""
  from ada_jax.infra import run_dir

  if not run_dir.read_history(workdir):
    run_dir.append_history(
      workdir, {'step': 0, 'event': 'start', 'identity': ident.derived}
    )
  elif ident.changes:
    run_dir.append_history(
      workdir,
      {
        'step': step + 1,
        'event': 'extend' if 'rl.steps' in ident.changes else 'change',
        'changes': {k: list(v) for k, v in ident.changes.items()},
      },
    )
    for key, (old, new) in ident.changes.items():
      print(f'config {key}: {old!r} -> {new!r} from step {step + 1}', flush=True)


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
