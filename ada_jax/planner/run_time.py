"""A lower bound on a whole run's time and chip-hours, before launch.

A training run (`rl/fit.py`) does, one after another:

  before RL:  the trainer's evaluation with detail (`Trainer.evaluate`:
              greedy, k = 1, on the held-out prompts when the config has an
              eval split; with `rl.eval_sampled_k` also that many samples per
              prompt at the run's temperature) and the pass-rate histogram
              (`Trainer.pass_rate_histogram`: `rl.histogram_prompts` train
              prompts x `rl.histogram_k` samples);
  the steps:  `rl.steps` RL steps, each at least the step's roofline
              (`step_time.estimate`); after every `rl.eval_every`-th step but
              the last, the greedy evaluation (no detail);
  checkpoints: one every `checkpoint.every` steps (`Checkpointer.should_save`),
              one at the first step boundary `checkpoint.every_minutes`
              after the last (steps at their roofline: a lower bound on
              the step time, so on these writes too, an upper bound on the
              steps between them) and a forced one at the end when the last
              step wrote none (`checkpoint_count`), each
              `checkpoint_time.write_seconds` at an assumed per-host write
              bandwidth. A write runs in the background while the next step
              runs; it is counted in full here, as the next save (or the end
              of the run) waits for it;
  after RL:   the evaluation with detail and the histogram again.

Every evaluation is a scoring pass (`rl.scoring.sample_and_score`) of Q
prompts x k samples: ceil(Q / q) chunks of q = `sampler.prompts_per_round(S,
k)` prompts, each a prefill of the q prompts and its rounds of S slots x N
steps (k > 1 and k <= S: one round, the k samples side by side; else k
aligned rounds of S prompts, one sample each), timed by `step_time`'s
prefill and sampling phases on the sampling copy, at the run's N (the
trainer's evaluation writes the config's `sampling.max_new_tokens`).

A lower bound: every part at its roofline (no collectives, host, verifier,
kernel efficiency), one after another. Not counted: SFT (`sft.steps`),
compiles, loading the weights and the data, the verifier, and the evaluation
of the whole eval split when its size is not known before the data is built
(`rl.eval_max_prompts` = 0); the printed plan says which of these apply.

Dimension legend: Q prompts scored, k samples per prompt, q prompts per
chunk, S slots, P prompt bucket, N new tokens.
"""

from __future__ import annotations

import dataclasses
import math

from ada_jax import model as model_lib
from ada_jax import sampler
from ada_jax.planner import checkpoint_time, step_time
from ada_jax.planner import chips as chips_lib


@dataclasses.dataclass(frozen=True)
class Scoring:
  """The scoring passes of one kind a run makes (`sample_and_score`)."""

  name: str
  runs: int  # Times the run makes this pass.
  prompts: int  # Q
  k: int
  seconds: float  # One pass, at the roofline.

  @property
  def total_seconds(self) -> float:
    return self.runs * self.seconds


@dataclasses.dataclass(frozen=True)
class RunTime:
  """A run's lower bound by part, and its chip-hours."""

  steps: int
  step_seconds: float  # One RL step's roofline (`step_time.total_seconds`).
  scorings: tuple[Scoring, ...]
  checkpoints: int  # Writes over the run.
  write: checkpoint_time.WriteTime  # One write.
  chips: int

  @property
  def steps_seconds(self) -> float:
    return self.steps * self.step_seconds

  @property
  def scoring_seconds(self) -> float:
    return sum(s.total_seconds for s in self.scorings)

  @property
  def checkpoint_seconds(self) -> float:
    return self.checkpoints * self.write.seconds

  @property
  def total_seconds(self) -> float:
    return self.steps_seconds + self.scoring_seconds + self.checkpoint_seconds

  @property
  def chip_hours(self) -> float:
    return self.total_seconds * self.chips / 3600


def scoring_seconds(
  c: model_lib.ModelConfig,
  *,
  prompts: int,
  k: int,
  slots: int,
  prompt_len: int,
  new_tokens: int,
  mesh: tuple[int, int, int],
  chip: chips_lib.Chip,
  attention: str = 'auto',
  sample_bytes: int = 2,
  kv_bytes: int = 2,
) -> float:
  """The roofline of one `sample_and_score` of Q = `prompts` prompts x k samples."""
  if prompts <= 0 or k <= 0:
    return 0.0
  per = sampler.prompts_per_round(slots, k)
  # As sample_and_score: a chunk of fewer prompts than slots holds their k
  # samples side by side in one round; a chunk of S prompts runs k rounds.
  rounds = k if per == slots else 1
  copy = dict(sample_bytes=sample_bytes, kv_bytes=kv_bytes)
  prefill = step_time.prefill_phase(
    c, prompts=per, prompt_len=prompt_len, mesh=mesh, chip=chip, **copy
  )
  # Scoring slots are not grouped by prompt: each reads its prompt's keys.
  rounds_phase = step_time.sampling_phase(
    c,
    prompt_len=prompt_len,
    new_tokens=new_tokens,
    slots=slots,
    rounds=rounds,
    mesh=mesh,
    chip=chip,
    attention=attention,
    **copy,
  )
  return math.ceil(prompts / per) * (prefill.seconds + rounds_phase.seconds)


def checkpoint_count(
  steps: int, every: int, every_minutes: float = 0.0, step_seconds: float = 0.0
) -> int:
  """Checkpoint writes of `steps` RL steps of `step_seconds` each.

  As `Checkpointer.should_save` decides them: at every `every`-th step, at
  the first step boundary `every_minutes` (> 0) after the last write (the
  clock starts with RL), and one at the end when the last step wrote none.
  """
  count, last = 0, 0.0
  for step in range(1, steps + 1):
    now = step * step_seconds
    timed = every_minutes > 0 and now - last >= every_minutes * 60
    if step % every == 0 or timed or step == steps:
      count, last = count + 1, now
  return count


def in_run_evaluations(steps: int, eval_every: int) -> int:
  """Greedy evaluations between the steps: every `eval_every`-th but the last."""
  return (steps - 1) // eval_every if eval_every > 0 and steps > 0 else 0


def estimate(
  c: model_lib.ModelConfig,
  *,
  steps: int,
  step_seconds: float,
  slots: int,
  prompt_len: int,
  new_tokens: int,
  mesh: tuple[int, int, int],
  chip: chips_lib.Chip,
  eval_prompts: int,
  eval_every: int,
  eval_sampled_k: int,
  histogram_prompts: int,
  histogram_k: int,
  checkpoint_every: int,
  hosts: int,
  checkpoint_every_minutes: float = 0.0,
  write_gbps: float = checkpoint_time.WRITE_GBPS,
  attention: str = 'auto',
  sample_bytes: int = 2,
  kv_bytes: int = 2,
) -> RunTime:
  """The lower bound of a run of `steps` RL steps (see the module docstring).

  Args:
    c: the policy.
    steps: RL steps.
    step_seconds: one step's roofline (`step_time.total_seconds`).
    slots: S of the trainer's scoring passes (`RLSettings.score_slots`: the
      run's slots, fewer where its scoring phase would not fit).
    prompt_len: P, the prompt bucket.
    new_tokens: N of the run (and of its evaluations).
    mesh: (data, fsdp, tensor) sizes.
    chip: the accelerator.
    eval_prompts: held-out prompts of each evaluation (0: none counted).
    eval_every: `rl.eval_every` (0: only before and after RL).
    eval_sampled_k: `rl.eval_sampled_k` (0: greedy only).
    histogram_prompts: prompts of the pass-rate histogram.
    histogram_k: its samples per prompt.
    checkpoint_every: `checkpoint.every`, in steps.
    checkpoint_every_minutes: `checkpoint.every_minutes` (0: off).
    hosts: the pod's hosts (each writes its share of a checkpoint).
    write_gbps: assumed per-host storage write bandwidth, GB/s.
    attention: the config's `model.attention`.
    sample_bytes: bytes per weight of the sampling copy.
    kv_bytes: bytes per KV-cache element.
  """
  shape = dict(
    slots=slots,
    prompt_len=prompt_len,
    new_tokens=new_tokens,
    mesh=mesh,
    chip=chip,
    attention=attention,
    sample_bytes=sample_bytes,
    kv_bytes=kv_bytes,
  )
  greedy = scoring_seconds(c, prompts=eval_prompts, k=1, **shape)
  sampled = scoring_seconds(c, prompts=eval_prompts, k=eval_sampled_k, **shape)
  histogram = scoring_seconds(c, prompts=histogram_prompts, k=histogram_k, **shape)
  scorings = (
    Scoring('evaluation before/after RL', 2, eval_prompts, 1, greedy),
    Scoring('sampled evaluation before/after RL', 2, eval_prompts, eval_sampled_k, sampled),
    Scoring('pass-rate histogram before/after RL', 2, histogram_prompts, histogram_k, histogram),
    Scoring('in-run evaluation', in_run_evaluations(steps, eval_every), eval_prompts, 1, greedy),
  )  # fmt: skip
  return RunTime(
    steps=steps,
    step_seconds=step_seconds,
    scorings=tuple(s for s in scorings if s.runs and s.prompts and s.k),
    checkpoints=checkpoint_count(
      steps, checkpoint_every, checkpoint_every_minutes, step_seconds
    ),
    write=checkpoint_time.write_seconds(c, hosts, write_gbps),
    chips=math.prod(mesh),
  )
