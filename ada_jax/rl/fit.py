"""The run: SFT warm start, evaluation, RL steps, final evaluation and plots.

`fit(trainer)` drives a `trainer_lib.Trainer` from wherever its checkpoint left
off to the end of the run, writing DIR/summary.json, the metrics rows, PNG
plots and a summary table on stdout (process 0).

A stop request (SIGTERM, JAX's preemption notice, SIGINT; polled by every
host alike, `Checkpointer.poll_stop`) ends the run at once with the last
completed step: during a step's sampling (polled before each round and after
the last) the step is dropped and the one before it is saved; during an
update, the update finishes and its step is saved (an in-run evaluation due
there is skipped: it would outlast the notice). A preemption whose
checkpoint write does not fit the notice (`Checkpointer.save_on_preemption`,
from `planner.checkpoint_time`) saves nothing and stops at once with one line
naming the step the run resumes from. Either way summary.json records
`preempted_at` (the last completed RL step; 0 during SFT), `preempted_phase`,
`preempted_saved` and `resumes_from`, and rerunning resumes (the main job
then exits 75, `exit_codes.STOPPED`). Between stops, checkpoints every
`checkpoint.every` steps and every `checkpoint.every_minutes` (counted from
the start of the RL loop). A checkpoint that fails to write raises
`CheckpointSaveError` at the next step at the latest, and always before the
summary says the run saved.

A dead run fails loudly: `max_nonfinite_steps` steps in a row whose every
update was non-finite (skipped) raise `DeadRunError` (the main job exits 1)
after summary.json records `failed` with the one-line cause. A collapse is
a warning and a `collapse` flag in the metrics row (`CollapseWatch`). A
resumed run whose metrics rows were lost before its checkpoint's step
counts them in the summary (`lost_metrics_rows`).
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from typing import Any

import jax
from etils import epath

from ada_jax.infra import checkpoint as checkpoint_lib
from ada_jax.infra import lease as lease_lib
from ada_jax.infra import metrics as metrics_lib
from ada_jax.infra import multihost, progress, run_dir
from ada_jax.rl import scoring
from ada_jax.rl import trainer as trainer_lib


class DeadRunError(RuntimeError):
  """Every update non-finite for several steps in a row; one line."""


class CollapseWatch:
  """Flags a policy that collapsed, from the metrics rows of its steps.

  A collapse is (a) the mean token entropy above `entropy_share` of ln V
  for `patience` steps in a row after it had been below (a policy gone
  uniform), or (b) the share of boxed (readable) answers at 0 for
  `patience` steps in a row after it had been at least `boxed_floor` (a
  policy that forgot the format). A policy that never boxed anything (a
  random one in a smoke run) is not a collapse.
  """

  def __init__(
    self,
    vocab_size: int,
    patience: int = 3,
    entropy_share: float = 0.98,
    boxed_floor: float = 0.2,
  ):
    self.limit = entropy_share * math.log(max(vocab_size, 2))
    self.patience = patience
    self.boxed_floor = boxed_floor
    self._was_below = False
    self._high = 0
    self._had_boxed = False
    self._unboxed = 0
    self.warned = False

  def update(self, row: dict[str, Any]) -> str | None:
    """The collapse seen at this row, or None."""
    entropy, boxed = row.get('entropy'), row.get('boxed_frac')
    why = None
    if entropy is not None and math.isfinite(entropy):
      if entropy > self.limit:
        self._high = self._high + 1 if self._was_below else 0
      else:
        self._was_below, self._high = True, 0
      if self._high >= self.patience:
        why = (
          f'entropy {entropy:.3f} above 0.98 ln V = {self.limit:.3f} for '
          f'{self._high} steps'
        )
    if boxed is not None:
      if boxed >= self.boxed_floor:
        self._had_boxed = True
      self._unboxed = self._unboxed + 1 if self._had_boxed and boxed == 0 else 0
      if self._unboxed >= self.patience and why is None:
        why = (
          f'no boxed answer for {self._unboxed} steps (it had been >= '
          f'{self.boxed_floor:.0%})'
        )
    return why


def fit(
  trainer: trainer_lib.Trainer,
  *,
  lease_lost: Callable[[], bool] | None = None,
  max_nonfinite_steps: int = 3,
) -> dict[str, Any]:
  """SFT (if configured), evaluation, RL steps, final evaluation and plots.

  Returns the summary (also written to DIR/summary.json): greedy accuracy
  and pass-rate histograms after SFT and after RL, steps run, and whether the
  run stopped for preemption.

  Args:
    trainer: the run.
    lease_lost: whether this process lost the run's lease (process 0's
      `Lease.lost`); checked on every host at each step.
    max_nonfinite_steps: consecutive all-non-finite steps that stop the run.

  Raises:
    DeadRunError: `max_nonfinite_steps` steps in a row had every update
      non-finite (summary.json says `failed` first).
    lease.LeaseLostError: another process took the run over.
  """
  rl = trainer.rl
  writer = trainer.writer
  summary_path = epath.Path(writer.workdir) / run_dir.SUMMARY_FILE
  summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
  if trainer.ckpt is not None:
    trainer.ckpt.install_signal_handlers()
  is_main = jax.process_index() == 0
  if trainer.writer.lost_rows:
    summary['lost_metrics_rows'] = summary.get('lost_metrics_rows', 0) + len(
      trainer.writer.lost_rows
    )
  watch = CollapseWatch(trainer.config.vocab_size)
  nonfinite = 0

  def stopped(phase: str, step: int, resumes_from: int | None = None) -> dict[str, Any]:
    summary.update(
      preempted_at=step,
      preempted_phase=phase,
      preempted_saved=resumes_from is None,
      resumes_from=step if resumes_from is None else resumes_from,
    )
    writer.flush()
    if is_main:
      summary_path.write_text(json.dumps(summary, indent=2))
    return summary

  def stop_rl(step: int) -> dict[str, Any]:
    """Saves `step` (the last completed) if the stop allows it, and stops."""
    ckpt = trainer.ckpt
    if not ckpt.saves_on_stop():
      # The write would not finish inside the notice: stop now, and say
      # from where the rerun starts (a save still in flight may yet land).
      ckpt.check_if_finished()  # A save done in the background counts.
      resumes_from = ckpt.committed_step or 0
      pending = ckpt.pending_step
      if is_main:
        print(
          'preempted: exiting without a checkpoint; the run resumes from step '
          f'{resumes_from}'
          + (f' (or {pending}, if its save in flight finishes)' if pending else ''),
          flush=True,
        )
      return stopped('rl', step, resumes_from)
    if trainer.save(force=True):
      writer.flush()  # The rows up to the checkpoint reach storage with it.
    ckpt.check()  # The checkpoint is on disk before we say so.
    logging.warning('stopping at step %d after its checkpoint (%s)', step, ckpt.stop)
    return stopped('rl', step)

  try:
    trainer.run_sft()
    if not trainer.sft_done:  # Preempted during SFT: nothing to save yet.
      return stopped('sft', 0, resumes_from=0)
    # Process 0's summary decides: every host must run the same evaluations
    # (their sampling is collective), whatever its own disk holds.
    if multihost.broadcast_from_main('before_rl' not in summary):
      summary['before_rl'] = {
        **trainer.evaluate(detail=True),
        'pass_rate_histogram': trainer.pass_rate_histogram(),
      }
      if is_main:
        summary_path.write_text(json.dumps(summary, indent=2))
        print(
          scoring.format_histogram(
            'pass rates before RL (train prompts):',
            summary['before_rl']['pass_rate_histogram'],
          )
        )
        print(f'greedy test accuracy before RL: {_accuracy(summary["before_rl"])}')
        print(_by_level(summary['before_rl']))
    if trainer.ckpt is not None:
      # every_minutes counts RL time: SFT and the evaluation before RL are
      # kept by their own save and summary.json.
      trainer.ckpt.start_timer()
    bar = progress.progress(
      range(trainer.step + 1, rl.steps + 1),
      desc=f'rl/{rl.controller.rule}',
      total=rl.steps,
      initial=trainer.step,  # A resumed run counts from its checkpoint.
      disable=not is_main,
    )
    for step in bar:
      if lease_lost is not None and multihost.any_host(lease_lost()):
        raise lease_lib.LeaseLostError(
          f'{writer.workdir}: another process took this run over at step {step} '
          '(this one looked dead); stopped without writing more'
        )
      try:
        row = trainer.rl_step()
      except trainer_lib.PreemptedError as e:
        logging.warning('%s: dropped', e)
        return stop_rl(trainer.step)
      collapse = watch.update(row)
      row['collapse'] = collapse is not None
      if collapse is not None and not watch.warned:
        logging.warning('step %d: the policy collapsed: %s', step, collapse)
        watch.warned = True
      updates = row.get('updates', 0)
      nonfinite = nonfinite + 1 if updates and row['skipped_updates'] >= updates else 0
      # Polled here, before the evaluation: one that arrived during the
      # update stops the run now, not after an evaluation.
      stop = trainer.ckpt is not None and trainer.ckpt.poll_stop() is not None
      if rl.eval_every and step % rl.eval_every == 0 and step != rl.steps and not stop:
        row.update(trainer.evaluate())
      writer.write(step, row, phase='rl')
      if nonfinite >= max_nonfinite_steps:
        cause = (
          f'every update was non-finite for {nonfinite} steps in a row (steps '
          f'{step - nonfinite + 1}-{step}): the run diverged (e.g. rl.lr={rl.lr:g} '
          'too high); stopped'
        )
        summary['failed'] = {'step': step, 'cause': cause}
        writer.flush()
        if is_main:
          summary_path.write_text(json.dumps(summary, indent=2))
        raise DeadRunError(cause)
      bar.set_postfix(
        r1=f'{row["reward_round1_mean"]:.2f}',
        rounds=row['rounds'],
        zero_adv=f'{row["zero_adv_frac"]:.2f}',
      )
      if stop:
        return stop_rl(step)
      if trainer.save():
        # The rows up to the checkpoint's step reach storage with it: on
        # gs:// they are otherwise rewritten only every remote_flush_s, and
        # a run killed after its checkpoint would resume with a gap.
        writer.flush()
      if trainer.ckpt is not None and trainer.ckpt.stop_requested:
        return stop_rl(step)  # The stop came after the poll above.
    for key in ('preempted_at', 'preempted_phase', 'preempted_saved', 'resumes_from'):
      summary.pop(key, None)
    summary['after_rl'] = {
      **trainer.evaluate(detail=True),
      'pass_rate_histogram': trainer.pass_rate_histogram(),
    }
    summary['steps'] = trainer.step
    summary['verifier_backend'] = trainer.scorer.backend
    trainer.save(force=True)
    if trainer.ckpt is not None:
      trainer.ckpt.check()  # Saved, or CheckpointSaveError before any summary.
    writer.flush()
    if is_main:
      summary_path.write_text(json.dumps(summary, indent=2))
      metrics_lib.plot_run(writer.workdir)
      metrics_lib.plot_before_after(writer.workdir, summary)
      rows = metrics_lib.read_rows(
        epath.Path(writer.workdir) / 'metrics.jsonl', phase='rl'
      )
      print(metrics_lib.summary_table(rows))
      print(
        scoring.format_histogram(
          'pass rates after RL (train prompts):',
          summary['after_rl']['pass_rate_histogram'],
        )
      )
      print(
        f'greedy test accuracy: before RL {_accuracy(summary["before_rl"])}'
        f' -> after RL {_accuracy(summary["after_rl"])}'
      )
      print(_by_level(summary['before_rl'], summary['after_rl']))
    return summary
  finally:
    writer.flush()
    if trainer.ckpt is not None:
      trainer.ckpt.restore_signal_handlers()
      try:
        trainer.ckpt.wait()
      except checkpoint_lib.CheckpointSaveError as e:
        if sys.exc_info()[1] is None:  # Nothing else is on its way up.
          raise
        logging.error('%s', e)


def _accuracy(result: dict[str, float]) -> str:
  """`0.312 (boxed 97%)`: accuracy with the share of readable answers."""
  boxed = result.get('eval_boxed_frac')  # Absent in summaries of older runs.
  tail = '' if boxed is None else f' (boxed {boxed:.0%})'
  return f'{result["eval_accuracy"]:.3f}{tail}'


def _by_level(before: dict[str, Any], after: dict[str, Any] | None = None) -> str:
  """Held-out accuracy per level (greedy; sampled when measured), before -> after.

  Level is the dataset's difficulty (ada_columns: the number of carries).
  """
  lines = ['held-out accuracy by level' + (' (before -> after RL):' if after else ':')]
  keys = [('greedy', 'eval_accuracy_by_level', 'eval_accuracy')]
  if 'eval_sampled_accuracy' in before:
    keys.append(('sampled', 'eval_sampled_accuracy_by_level', 'eval_sampled_accuracy'))
  for name, by, total in keys:
    if by not in before:  # Summaries of older runs.
      continue
    levels = [*before[by], 'all']
    cells = []
    for lv in levels:
      a = before[total] if lv == 'all' else before[by][lv]
      cell = f'{a:.3f}'
      if after is not None:
        b = after[total] if lv == 'all' else after[by].get(lv, float('nan'))
        cell += f' -> {b:.3f}'
      cells.append(f'{lv}: {cell}')
    lines.append(f'  {name:<8} ' + ', '.join(cells))
  return '\n'.join(lines)
