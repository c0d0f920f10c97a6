"""One process of the two-process CPU runs in test_multihost.py.

The test starts two of these with 4 fake CPU devices each and ADA_COORDINATOR
/ ADA_NUM_PROCESSES / ADA_PROCESS_ID set, so `multihost.init_distributed` joins
them (gloo collectives) into one 8-device mesh. Each runs the tiny config's
RL steps through `from_config.trainer` and `fit_lib.fit`, records what every
step sampled (rewards of all slots, tokens of the training rows, number of
rounds) and the final params, all gathered to every host, and writes them to
`--out` as .npz (one file per process). `record_run` is also what the test
calls in its own 8-device process for the single-process reference.

Rewards are hash-based (test_train.hash_verify), except at the steps in
`exit_steps` (default: step 2): there every prompt of the first half of the
step's batch (host 0's rows) keeps its hash rewards, mixed, so it exits in
round 1, and every prompt of the second half (host 1's) is always wrong and
never exits, running all rounds: the hosts' prompts exit in different rollout.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import signal
import sys
import time
import zlib
from collections.abc import Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from ada_jax import data, from_config  # noqa: E402  # noqa: E402
from ada_jax import tokenizer as tokenizer_lib  # noqa: E402
from ada_jax.infra import multihost  # noqa: E402  # noqa: E402
from ada_jax.rl import fit as fit_lib  # noqa: E402  # noqa: E402
from ada_jax.rl import rollout  # noqa: E402  # noqa: E402
from ada_jax.rl import trainer as trainer_lib  # noqa: E402  # noqa: E402
from tests import test_train  # noqa: E402

_HOST0, _HOST1 = 'h0:', 'h1:'


def config(data_dir: str, steps: int = 2):
  """The shrunk tiny config (test_train): no SFT, no mid-run evaluation."""
  c = test_train.tiny_config(data_dir, steps=steps, eval_every=0, warmup=0)
  # 40 of the 64 eval slots: both hosts hold some (process 0 holds 0..31).
  c.rl.eval_max_prompts, c.rl.histogram_prompts = 40, 8
  return c


def tag_by_half(trainer: trainer_lib.Trainer, steps: Sequence[int]) -> None:
  """Prefixes each reference of these steps with its half of the step's batch.

  In place: the trainer's iterator reads the same list. The iterator's
  order is a function of the seed only, so a fresh global iterator over
  the same examples names every step's prompts.
  """
  ex = trainer.train_examples
  b = trainer.rl.prompts_per_step
  order = data.PromptIterator(ex, b, trainer.seed)
  for step in range(1, max(steps, default=0) + 1):
    idx = order.next_indices()
    if step in steps:
      for k, i in enumerate(idx):
        tag = _HOST0 if k < b // 2 else _HOST1
        ex[i] = dataclasses.replace(ex[i], reference=tag + ex[i].reference)


def box_some_eval_answers(trainer: trainer_lib.Trainer) -> None:
  """Boxes about half the decoded answers (by content) during evaluations.

  A random policy never writes `\\boxed{`, so the boxed share would be 0
  on one host and on two alike; with some boxed, a host counting only its
  own slots shows.
  """
  evaluate = trainer.evaluate
  decode = tokenizer_lib.Tokenizer.decode

  def some_boxed(self, ids, **kw):
    text = decode(self, ids, **kw)
    return f'\\boxed{{{text}}}' if zlib.crc32(text.encode()) % 2 else text

  def evaluate_boxing_some(**kw):
    tokenizer_lib.Tokenizer.decode = some_boxed
    try:
      return evaluate(**kw)
    finally:
      tokenizer_lib.Tokenizer.decode = decode

  trainer.evaluate = evaluate_boxing_some


def verify(responses, references, *, timeout_s=2.0, workers=None):
  """Hash rewards; a reference tagged for host 1's half is never right."""
  hashed = np.asarray(test_train.hash_verify(responses, references), bool)
  wrong = np.array([r.startswith(_HOST1) for r in references], bool)
  return hashed & ~wrong


def _gather(x) -> np.ndarray:
  if x.is_fully_addressable:
    return np.asarray(x)
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def record_run(
  c,
  workdir: str,
  *,
  exit_steps: Sequence[int] = (2,),
  kill_at_step: int | None = None,
  kill_process: int = 1,
) -> dict[str, np.ndarray]:
  """build_trainer + fit, recording each step's samples and the final params.

  Args:
    c: config (see `config`).
    workdir: run directory (a second call with the same one resumes).
    exit_steps: steps whose hosts' prompts exit in different rollout.
    kill_at_step: send SIGTERM to process `kill_process` while it verifies
      the samples of this step (0: the evaluation before RL).
    kill_process: which process gets the signal.
  """
  holder: dict = {}

  def verify_fn(responses, references, **kw):
    t = holder.get('trainer')
    if (
      kill_at_step is not None
      and t is not None
      and t.step == kill_at_step
      and jax.process_index() == kill_process
      and not holder.get('killed')
    ):
      holder['killed'] = True
      os.kill(os.getpid(), signal.SIGTERM)
      # JAX's preemption service tells the other process in the background
      # (through the coordination service), and the hosts then agree on a
      # poll. A round on a pod takes seconds, here milliseconds: without
      # these seconds the poll agreed on could come after the step's
      # update (also correct, but not the stop mid-sampling checked here).
      time.sleep(3)
    return verify(responses, references, **kw)

  from_config.validate(c)
  trainer = from_config.trainer(c, workdir, verify_fn=verify_fn)
  holder['trainer'] = trainer
  box_some_eval_answers(trainer)
  tag_by_half(trainer, exit_steps)
  record: dict[str, np.ndarray] = {}
  run_step = rollout.run_step

  def recorded_run_step(*args, **kwargs):
    out = run_step(*args, **kwargs)
    step = trainer.step
    record[f'rewards_{step}'] = out.rewards
    record[f'lengths_{step}'] = out.lengths
    record[f'tokens_{step}'] = _gather(out.batch['tokens'])
    record[f'rounds_{step}'] = np.asarray(len(out.rewards))
    record[f'references_{step}'] = np.asarray(args[4])
    return out

  for i, leaf in enumerate(jax.tree.leaves(trainer.state)):
    record[f'init_param_{i}'] = _gather(leaf)
  rollout.run_step = recorded_run_step
  try:
    summary = fit_lib.fit(trainer)
  finally:
    rollout.run_step = run_step
  for i, leaf in enumerate(jax.tree.leaves(trainer.state)):
    record[f'param_{i}'] = _gather(leaf)
  record['steps_done'] = np.asarray(trainer.step)
  record['preempted_at'] = np.asarray(summary.get('preempted_at', -1))
  record['ckpt_steps'] = np.asarray(trainer.ckpt.steps())
  record['process_index'] = np.asarray(jax.process_index())
  record['workdir'] = np.asarray(str(workdir))
  return record


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--exit_steps', default='2', help='comma separated')
  parser.add_argument('--workdir', required=True)
  parser.add_argument('--data_dir', required=True)
  parser.add_argument('--out', required=True)
  parser.add_argument('--steps', type=int, default=2)
  parser.add_argument('--kill_at_step', type=int, default=None)
  parser.add_argument('--cache_dir', default=None)
  args = parser.parse_args()
  if args.cache_dir:
    jax.config.update('jax_compilation_cache_dir', args.cache_dir)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  multihost.init_distributed()
  assert jax.process_count() == int(os.environ['ADA_NUM_PROCESSES'])
  c = config(args.data_dir, args.steps)
  exit_steps = tuple(int(s) for s in args.exit_steps.split(',') if s)
  rec = record_run(
    c, args.workdir, exit_steps=exit_steps, kill_at_step=args.kill_at_step
  )
  np.savez(args.out, **rec)


if __name__ == '__main__':
  main()
