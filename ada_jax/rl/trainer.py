"""The training loop: optional SFT warm start, then RL steps with adaptive sampling.

Typed settings in, no ConfigDict (`from_config` builds them, and the
`scoring.Scorer` that binds the verifier's settings). One set of params
lives in the training layout; each RL step reshards it to the sampling
layout, prefills the step's prompts once, runs the controller's rounds over
the sampler and the scorer (rollout.py), assembles the fixed-shape batch,
recomputes old log-probs with the training forward and takes the clipped
surrogate updates (`update`); the batch is micro-batched [C, m, ...] from its
assembly on, so both passes run each micro-batch over all row shards.
Checkpoints at fixed intervals (steps and minutes) and on preemption; a
restarted run resumes from the latest complete checkpoint. A stop request
(`Checkpointer.poll_stop`) is polled before each sampling round and after
the sampling: the step is then dropped (`PreemptedError`) and the trainer
is left at the last completed step, whose state sampling never modifies, so
that step can be saved at once.

Dimension legend: B prompts per step, P prompt bucket, N new tokens,
S slots, R training rows, C micro-batches of m rows (R = C * m).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from ada_jax import adaptive, data, sharding
from ada_jax import model as model_lib
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.infra import checkpoint as checkpoint_lib
from ada_jax.infra import compiles, multihost, resharder
from ada_jax.infra import metrics as metrics_lib
from ada_jax.infra import progress as progress_lib
from ada_jax.rl import rollout, scoring, update
from ada_jax.rl import sft_rows as sft_lib


@dataclasses.dataclass(frozen=True)
class SFTSettings:
  """Teacher-forced warm start (the tiny task; 0 steps = off)."""

  steps: int = 0
  batch_size: int = 64
  lr: float = 1e-3
  warmup: int = 0
  lr_schedule: str = 'constant'  # or 'cosine' (to 0 at the last SFT step)
  # Share of drawn demonstrations with a boxed answer; the rest give the bare
  # answer (an imperfect teacher, see sft_rows.py). 1.0: always boxed.
  boxed_share: float = 1.0
  # 'answer': `\\boxed{reference}` (with boxed_share); 'columns': worked
  # column solutions of ada_columns problems whose teacher forgets to add
  # each carry with `carry_drop` (sft_rows.demonstration_rows).
  teacher: str = 'answer'
  carry_drop: float = 0.0


@dataclasses.dataclass(frozen=True)
class RLSettings:
  """Everything the RL loop needs besides the model and data."""

  steps: int
  prompts_per_step: int
  controller: adaptive.ControllerSettings  # rule, n, M, rounds, slots, ...
  sampling: rollout.SamplingSettings
  update: update.UpdateSettings
  lr: float = 1e-6
  warmup: int = 10
  lr_schedule: str = 'constant'
  eval_every: int = 0  # 0: only before and after RL.
  eval_max_prompts: int = 0  # 0: the whole eval split.
  histogram_prompts: int = 256
  histogram_k: int = 8
  # Samples per held-out prompt at the run's temperature in the evaluations
  # before and after RL (0: greedy only).
  eval_sampled_k: int = 0
  # Slots per chunk of the evaluations and the pass-rate histogram (0: the
  # controller's S): the plan's largest that fits (`from_config.command_slots`).
  score_slots: int = 0
  # The last step of each LR schedule: rl.steps as first run, then each
  # `--extend-steps` N (the added steps get a new schedule, no warmup).
  # Empty: one schedule over `steps`.
  schedule_ends: tuple[int, ...] = ()

  def lr_at(self, step: int) -> float:
    """The learning rate of RL step `step` (counted from 1)."""
    start = 0
    for end in self.schedule_ends or (self.steps,):
      if step <= end:
        break
      start = end
    else:
      end = max(self.schedule_ends[-1], step)
    return update.lr_at(
      step - start,
      peak=self.lr,
      warmup=self.warmup if start == 0 else 0,
      schedule=self.lr_schedule,
      total=end - start,
    )

  samples_to_log: int = 4


class PreemptedError(Exception):
  """A stop request arrived during a step's sampling; the step was dropped.

  The trainer is back at the last completed step (`Trainer.step`, the data
  order with it); its params and optimizer state are that step's.
  """


class Trainer:
  """Owns the model state, optimizer, data order, metrics and checkpoints."""

  def __init__(
    self,
    *,
    model: model_lib.Transformer,
    mesh: jax.sharding.Mesh,
    tok: tokenizer_lib.Tokenizer,
    train_examples: Sequence[data.Example],
    sft_examples: Sequence[data.Example] | None = None,
    eval_examples: Sequence[data.Example],
    prompt_bucket: int,
    rl: RLSettings,
    sft: SFTSettings,
    tx: optax.GradientTransformation,
    writer: metrics_lib.MetricsWriter,
    checkpointer: checkpoint_lib.Checkpointer | None,
    seed: int = 0,
    scorer: scoring.Scorer | None = None,
    batch_hook: Callable[[int, dict[str, Any]], dict[str, Any]] | None = None,
  ):
    """Wires the parts.

    `scorer` decodes and verifies every sample (default: `tok` and the
    verifier's defaults). `batch_hook(step, batch)`, if given, may replace
    the training batch right before the update (fault injection in tests).
    """
    self.graphdef, self.state = nnx.split(model)
    self.config = model.config
    self.mesh, self.tok, self.rl, self.sft, self.tx = mesh, tok, rl, sft, tx
    self.bucket = prompt_bucket
    self.writer, self.ckpt, self.seed = writer, checkpointer, seed
    self.scorer = scorer or scoring.Scorer(tok)
    self.batch_hook = batch_hook
    self.train_examples, self.eval_examples = list(train_examples), list(eval_examples)
    # SFT's own problems (None: the RL prompts themselves).
    self.sft_examples = list(sft_examples) if sft_examples is not None else None
    # Params and optimizer state keep these shardings for the whole run (the
    # updates pin their outputs to them), so nothing recompiles after step 1.
    self._state_shardings = jax.tree.map(lambda x: x.sharding, self.state)
    self._rl_update, self.opt_state = self._pinned_update(tx, update.rl_update_pinned)
    # The global order: every host knows the whole step's prompts (a slot
    # may continue any of them); each feeds only its rows (prompt_arrays).
    self.iterator = data.PromptIterator(
      self.train_examples,
      rl.prompts_per_step,
      seed,
      process_index=0,
      process_count=1,
    )
    self.history: dict[str, np.ndarray] | None = None
    self.step = 0  # RL steps done.
    self.sft_done = sft.steps == 0
    self.rng = jax.random.key(seed)
    self.rows = rl.controller.max_rows(rl.prompts_per_step)
    # The sampling copy in the compute dtype: with fp32 master params and bf16
    # compute, an fp32 copy would make XLA hoist a second, bf16 copy of every
    # weight out of the decode loop (infra.resharder).
    self._resharder = resharder.Resharder(
      mesh, sharding.SAMPLE_RULES, dtype=self.config.dtype
    )

  def _pinned_update(self, tx, pinned) -> tuple[Callable[..., Any], Any]:
    """(update fn with pinned output shardings, fresh optimizer state)."""
    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      self.state,
    )
    opt_shardings = jax.tree.map(
      lambda x: x.sharding, checkpoint_lib.abstract_opt_state(tx, abstract)
    )
    opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(self.state)
    return pinned(self._state_shardings, opt_shardings), opt_state

  # Model views.

  @property
  def model(self) -> model_lib.Transformer:
    return nnx.merge(self.graphdef, self.state)

  def sampling_model(self) -> model_lib.Transformer:
    """The params resharded to the sampling layout (tensor only), checksummed."""
    return nnx.merge(self.graphdef, self._resharder(self.state))

  # Checkpoints.

  def _extras(self) -> dict[str, Any]:
    return {
      'step': self.step,
      'sft_done': self.sft_done,
      'iterator': self.iterator.state(),
      'history': self.history,
    }

  def save(self, force: bool = False) -> bool:
    """Checkpoints if due (or `force`); whether a checkpoint was started."""
    if self.ckpt is None:
      return False
    return self.ckpt.save(
      self.step,
      params=self.state,
      opt_state=self.opt_state,
      extras=self._extras(),
      force=force,
    )

  def restore(self) -> bool:
    """Resumes from the latest complete checkpoint; False if there is none."""
    if self.ckpt is None:
      return False
    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      (self.state, self.opt_state),
    )
    got = self.ckpt.restore_latest(*abstract)
    if got is None:
      return False
    step, self.state, self.opt_state, extras = got
    self.step, self.sft_done = int(extras['step']), bool(extras['sft_done'])
    self.iterator.restore(extras['iterator'])
    self.history = extras.get('history')
    logging.info('resumed from step %d (sft_done=%s)', step, self.sft_done)
    return True

  def init_from(self, workdir: str) -> None:
    """Takes the params (and SFT status) of another run's latest checkpoint.

    A warm start shared by many runs: an SFT-only run (`rl.steps=0`) of one
    seed initializes every RL variant of that seed, so a sweep pays for SFT
    once. The optimizer state, data order and RNG stay fresh; they are what an
    SFT-then-RL run has at its first RL step too, so the result equals the
    run that did its own SFT.

    Raises:
      FileNotFoundError: `workdir` has no usable checkpoint.
    """
    abstract = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
      self.state,
    )
    try:
      step, self.state, extras = checkpoint_lib.restore_params(workdir, abstract)
    except FileNotFoundError as e:
      raise FileNotFoundError(f'model.init_from: {e}') from None
    self.sft_done = self.sft_done or bool(extras.get('sft_done', False))
    logging.info(
      'initialized from %s (its step %d, sft_done=%s)', workdir, step, self.sft_done
    )

  # Prompts.

  def encode(self, examples: Sequence[data.Example]) -> tuple[np.ndarray, np.ndarray]:
    enc = data.encode_prompts(self.tok, [e.prompt for e in examples], self.bucket)
    if enc.dropped:
      raise ValueError(
        f'{enc.dropped} prompts longer than the prompt bucket {self.bucket}'
      )
    return enc.tokens, enc.mask

  def prompt_arrays(
    self, examples: Sequence[data.Example]
  ) -> tuple[jax.Array, jax.Array]:
    """The step's prompts as global [B, P] token and mask arrays.

    Every host encodes the whole step and each device takes its rows
    (`multihost.global_rows`), whatever the mesh's device order.
    """
    sh = multihost.rows_sharding(self.mesh, len(examples))
    tokens, mask = self.encode(examples)
    return multihost.global_rows(tokens, sh), multihost.global_rows(mask, sh)

  # SFT.

  def run_sft(self) -> None:
    """Teacher-forced cross-entropy on prompt + response + EOS.

    The response is `\\boxed{answer}` (or the bare answer, `boxed_share`),
    or with `teacher='columns'` a worked column solution.
    """
    if self.sft_done:
      return
    rs = np.random.RandomState(self.seed + 1)
    examples = self.train_examples if self.sft_examples is None else self.sft_examples
    kw = dict(prompt_len=self.bucket, max_new_tokens=self.rl.sampling.max_new_tokens)
    if self.sft.teacher == 'columns':
      demos = sft_lib.demonstration_rows(
        self.tok, examples, drop=self.sft.carry_drop, **kw
      )

      def draw():
        return sft_lib.draw_demonstrations(rs, demos, self.sft.batch_size)

    else:
      boxed = sft_lib.teacher_forcing_rows(self.tok, examples, **kw)
      # The imperfect teacher: each drawn row is bare with 1 - boxed_share.
      bare = None
      if self.sft.boxed_share < 1:
        bare = sft_lib.teacher_forcing_rows(self.tok, examples, boxed=False, **kw)

      def draw():
        return sft_lib.draw_batch(
          rs, boxed, bare, self.sft.batch_size, self.sft.boxed_share
        )

    opt = update.make_optimizer()
    sft_update, opt_state = self._pinned_update(opt, update.sft_update_pinned)
    bar = progress_lib.progress(range(1, self.sft.steps + 1), desc='sft', leave=False)
    for step in bar:
      batch = draw()
      lr = update.lr_at(
        step,
        peak=self.sft.lr,
        warmup=self.sft.warmup,
        schedule=self.sft.lr_schedule,
        total=self.sft.steps,
      )
      self.state, opt_state, m = sft_update(
        self.graphdef,
        opt,
        self.state,
        opt_state,
        *batch,
        jnp.float32(lr),
      )
      if step % 25 == 0 or step == self.sft.steps:
        # SFT has no checkpoints of its own (minutes long): a preempted SFT
        # stops here and reruns from its start when the run resumes.
        if self.stop_requested():
          logging.warning(
            'preempted during SFT at step %d; it restarts on resume', step
          )
          return
        loss = float(m['loss'])
        bar.set_postfix(loss=f'{loss:.3f}')
        self.writer.write(
          step,
          {'loss': loss, 'grad_norm': float(m['grad_norm']), 'lr': lr},
          phase='sft',
        )
    self.sft_done = True
    self.save(force=True)
    if self.ckpt is not None:
      self.ckpt.check()  # Saved before anything (the evaluation) builds on it.

  # Evaluation.

  def _score(self, examples, *, k, temperature, rng, progress=None):
    return scoring.score_examples(
      self.sampling_model(),
      self.scorer,
      examples,
      prompt_bucket=self.bucket,
      slots=self.rl.score_slots or self.rl.controller.slots,
      k=k,
      max_new_tokens=self.rl.sampling.max_new_tokens,
      rng=rng,
      temperature=temperature,
      eos_ids=self.rl.sampling.eos_ids,
      progress=progress,
    )

  def evaluate(self, detail: bool = False) -> dict[str, Any]:
    """Greedy accuracy on the held-out split, and how often an answer was boxed.

    `eval_boxed_frac` (responses with a `\\boxed{}` answer the verifier can
    read) tells format failures from wrong answers. With `detail` (the
    evaluations before and after RL) also the greedy accuracy per level
    (`eval_accuracy_by_level`, {level: accuracy}; ada_columns' levels are
    carries), and with `RLSettings.eval_sampled_k` the mean accuracy of that
    many samples per prompt at the run's temperature, overall and per level:
    greedy decoding hides a policy's noise while its most likely token is
    right.
    """
    ex = self.eval_examples
    if self.rl.eval_max_prompts:
      ex = ex[: self.rl.eval_max_prompts]
    correct, boxed = self._score(
      ex, k=1, temperature=0.0, rng=jax.random.key(0), progress='eval'
    )
    out: dict[str, Any] = {
      'eval_accuracy': float(correct.mean()),
      'eval_boxed_frac': float(boxed.mean()),
    }
    if not detail:
      return out
    levels = np.asarray([e.level for e in ex])
    out['eval_accuracy_by_level'] = _by_level(correct[:, 0], levels)
    k = self.rl.eval_sampled_k
    if k:
      sampled, _ = self._score(
        ex,
        k=k,
        temperature=self.rl.sampling.temperature,
        rng=jax.random.key(2),
        progress='eval sampled',
      )
      out['eval_sampled_accuracy'] = float(sampled.mean())
      out['eval_sampled_accuracy_by_level'] = _by_level(sampled.mean(axis=1), levels)
    return out

  def pass_rate_histogram(self) -> list[tuple[str, int]]:
    """Pass rates of k samples (temperature of the run) on train prompts."""
    # A seeded sample of distinct prompts: the train list may be ordered by
    # level (and repeat levels, see data.balance_levels).
    unique = list({e.prompt_key: e for e in self.train_examples}.values())
    pick = np.random.RandomState(self.seed).permutation(len(unique))
    ex = [unique[i] for i in sorted(pick[: self.rl.histogram_prompts])]
    correct, _ = self._score(
      ex,
      k=self.rl.histogram_k,
      temperature=self.rl.sampling.temperature,
      rng=jax.random.key(1),
      progress='pass rates',
    )
    return scoring.histogram(correct.mean(axis=1), bins=self.rl.histogram_k)

  # RL.

  def stop_requested(self) -> bool:
    """Whether any host was asked to stop (a collective: all hosts call it)."""
    return self.ckpt is not None and self.ckpt.poll_stop() is not None

  def rl_step(self) -> dict[str, Any]:
    """One step: sample (rounds), update, return the metrics row.

    Raises:
      PreemptedError: a stop request came before a sampling round or right
        after the sampling; the trainer is left at the last completed step.
    """
    t0 = time.perf_counter()
    before = self.step, self.iterator.state()
    self.step += 1
    examples = next(self.iterator)
    tokens, mask = self.prompt_arrays(examples)
    rng = jax.random.fold_in(self.rng, self.step)
    sample_model = self.sampling_model()
    try:
      out = rollout.run_step(
        sample_model,
        self.scorer,
        tokens,
        mask,
        [e.reference for e in examples],
        controller=self.rl.controller,
        sampling=self.rl.sampling,
        rng=rng,
        prompt_keys=[e.prompt_key for e in examples],
        history=self.history,
        micro_batch_rows=self.rl.update.micro_batch_rows,
        stop=self.stop_requested,
      )
      if self.stop_requested():  # During the last round: skip the update too.
        raise rollout.StoppedError('stopped after sampling')
    except rollout.StoppedError as e:
      # Sampling modifies nothing of the trainer's: rewinding the step and
      # the data order leaves it at the last completed step.
      self.step = before[0]
      self.iterator.restore(before[1])
      raise PreemptedError(f'step {before[0] + 1}: {e}') from None
    self.history = out.groups.history
    del sample_model  # Free the sampling copy of the weights before the update.
    batch = out.batch
    t1 = time.perf_counter()
    u = self.rl.update
    # [C, m, N], laid out as the batch: every micro-batch on all row shards.
    old_logp, _ = update.logp_jit(
      self.graphdef,
      self.state,
      batch['tokens'],
      batch['attn_mask'],
      jnp.float32(u.temperature),
      prompt_len=u.prompt_len,
      logit_chunk=u.logit_chunk,
    )
    lr = self.rl.lr_at(self.step)
    train_batch = {
      k: batch[k] for k in ('tokens', 'attn_mask', 'resp_mask', 'advantages')
    }
    train_batch['old_logp'] = old_logp
    if self.batch_hook is not None:
      train_batch = self.batch_hook(self.step, train_batch)
    self.state, self.opt_state, um = self._rl_update(
      self.graphdef,
      self.tx,
      u,
      self.state,
      self.opt_state,
      train_batch,
      jnp.float32(lr),
    )
    um = jax.device_get(um)
    gap_max, gap_mean = (
      float(v)
      for v in jax.device_get(
        update.logp_gap(old_logp, batch['sampler_logp'], batch['resp_mask'])
      )
    )
    t2 = time.perf_counter()
    g = out.groups
    live = ~np.isnan(out.rewards)
    lengths = out.lengths[live]
    n = self.rl.sampling.max_new_tokens
    row = dict(g.metrics)
    row.update(
      step=self.step,
      entropy=float(um['entropy']),
      loss=float(um['loss']),
      pg_loss=float(um['pg_loss']),
      clip_frac=float(um['clip_frac']),
      approx_kl=float(um['approx_kl']),
      grad_norm=float(um['grad_norm']),
      skipped_updates=int(um['skipped']),
      # Optimizer updates this step: all of them skipped is a dead step.
      updates=u.epochs
      * (batch['tokens'].shape[0] * batch['tokens'].shape[1])
      // u.mini_batch_rows,
      boxed_frac=float(out.boxed[live].mean())
      if out.boxed is not None and live.any()
      else 0.0,
      lr=lr,
      response_len_mean=float(lengths.mean()) if lengths.size else 0.0,
      truncated_frac=float(np.mean(lengths >= n)) if lengths.size else 0.0,
      logp_gap_max=gap_max,
      logp_gap_mean=gap_mean,
      verifier_timeouts=out.verifier_counters.get('timeouts', 0),
      verifier_guard_trips=out.verifier_counters.get('guard_trips', 0),
      verifier_parse_failures=out.verifier_counters.get('parse_failures', 0),
      verifier_worker_deaths=out.verifier_counters.get('worker_deaths', 0),
      num_compiles=compiles.num_compiles(),
      time_sample_s=out.time_sample_s,
      time_verify_s=out.time_verify_s,
      time_update_s=t2 - t1,
      time_step_s=t2 - t0,
      tokens_per_s=float(lengths.sum()) / max(out.time_sample_s, 1e-9),
    )
    if int(um['skipped']):
      logging.warning(
        'step %d: %d non-finite update(s) skipped', self.step, int(um['skipped'])
      )
    self.writer.write_samples(
      self.step,
      (
        {**row, 'verifier_backend': self.scorer.backend}
        for row in rollout.sample_rows(out, examples, self.rl.samples_to_log)
      ),
    )
    return row


def _by_level(values: np.ndarray, levels: np.ndarray) -> dict[str, float]:
  """{level: mean of `values` [E] over its examples}, keys as JSON writes them."""
  return {str(lv): float(values[levels == lv].mean()) for lv in np.unique(levels)}
