"""The run's time and cost before launch, the checkpoint write, and what plan prints.

`planner.run_time` adds steps x the step's roofline, the trainer's scoring
passes and the checkpoint writes; the sums here are written out by hand on
small cases. `planner.checkpoint_time` against a param count of its own.
The plan command must print the paper's step times of its own model only.
"""

import dataclasses
import math
import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from ada_jax import from_config, plan
from ada_jax import model as model_lib
from ada_jax.planner import checkpoint_time, chips, run_time, step_time

_TINY = model_lib.ModelConfig(
  'qwen2', 512, 128, 384, 2, 4, 2, 32, qkv_bias=True, tie_embeddings=True,
  max_position_embeddings=512,
)  # fmt: skip
_CHIP = chips.CHIPS['v5p']
_MESH = (1, 4, 2)
_SHAPE = dict(prompt_len=16, new_tokens=32, mesh=_MESH, chip=_CHIP)


def _round_parts(prompts: int, slots: int, rounds: int) -> float:
  """A chunk's prefill and rounds, from the step estimate's own phases."""
  phases = step_time.estimate(
    _TINY,
    prompts=prompts,
    slots=slots,
    rounds=rounds,
    rows=8,
    micro_batch_rows=8,
    mini_batch_rows=8,
    epochs=1,
    **_SHAPE,
  )
  by_name = {p.name: p.seconds for p in phases}
  return by_name['prefill'] + by_name['sampling rounds']


@pytest.mark.parametrize(
  'prompts, k, chunks, per, rounds',
  [
    (20, 8, 3, 8, 1),  # 64 // 8 = 8 prompts per chunk, k side by side.
    (100, 1, 2, 64, 1),  # Greedy: 64 prompts per chunk, one aligned round.
    (10, 128, 1, 64, 128),  # k > S: S prompts, k aligned rounds.
  ],
)
def test_a_scoring_pass_is_its_chunks_of_prefill_and_rounds(
  prompts, k, chunks, per, rounds
):
  got = run_time.scoring_seconds(_TINY, prompts=prompts, k=k, slots=64, **_SHAPE)
  assert got == pytest.approx(chunks * _round_parts(per, 64, rounds), rel=1e-12)
  assert run_time.scoring_seconds(_TINY, prompts=0, k=k, slots=64, **_SHAPE) == 0


@pytest.mark.parametrize(
  'steps, every, want', [(400, 50, 8), (400, 30, 14), (400, 400, 1), (10, 1000, 1)]
)
def test_checkpoints_follow_checkpoint_every(steps, every, want):
  # Every `every` steps, and a forced one at the end off the interval.
  assert run_time.checkpoint_count(steps, every) == want
  assert run_time.checkpoint_count(0, every) == 0


@pytest.mark.parametrize(
  'step_s, minutes, want',
  [
    (279.6, 30, 64),  # 7B on v4-32: steps 7, 14, .., 49, 50, 57, ..: 8 per 50.
    (103.5, 30, 24),  # 7B on v5p-64: steps 18, 36, 50, 68, ..: 3 per 50.
    (600.0, 30, 136),  # Steps 3, 6, .., 48, 50, 53, ..: 17 per 50.
    (1.0, 30, 8),  # Steps too short for the clock: the interval decides.
    (279.6, 0, 8),  # every_minutes off.
  ],
)
def test_checkpoints_also_follow_every_minutes(step_s, minutes, want):
  """A write at the first step boundary every_minutes after the last one."""
  assert run_time.checkpoint_count(400, 50, minutes, step_s) == want


def test_the_run_counts_the_timed_checkpoints():
  run = _run(steps=20, step_seconds=100.0, checkpoint_every=50)
  assert run.checkpoints == 1  # The end only.
  timed = _run(
    steps=20, step_seconds=100.0, checkpoint_every=50, checkpoint_every_minutes=5
  )
  assert timed.checkpoints == 7  # Steps 3, 6, .., 18 and the end.
  assert timed.checkpoint_seconds == pytest.approx(7 * run.write.seconds)


def test_in_run_evaluations_skip_the_last_step():
  assert run_time.in_run_evaluations(10, 4) == 2  # Steps 4 and 8.
  assert run_time.in_run_evaluations(8, 4) == 1  # 8 is the last: after RL.
  assert run_time.in_run_evaluations(8, 0) == 0


def _run(**kw) -> run_time.RunTime:
  """10 steps of 2.5 s, 100 eval prompts every 4 steps, a 20 x 8 histogram."""
  args = dict(
    steps=10,
    step_seconds=2.5,
    slots=64,
    eval_prompts=100,
    eval_every=4,
    eval_sampled_k=0,
    histogram_prompts=20,
    histogram_k=8,
    checkpoint_every=3,
    hosts=2,
    write_gbps=0.5,
    **_SHAPE,
  )
  return run_time.estimate(_TINY, **{**args, **kw})


def test_total_is_steps_plus_evaluations_plus_checkpoints():
  run = _run()
  greedy = 2 * _round_parts(64, 64, 1)  # 100 prompts: two chunks of 64.
  histogram = 3 * _round_parts(8, 64, 1)  # 20 prompts: three chunks of 8.
  write = checkpoint_time.write_seconds(_TINY, 2, 0.5).seconds
  # Before and after RL: the evaluation and the histogram; at steps 4 and
  # 8 the evaluation; checkpoints at 3, 6, 9 and the last step, 10.
  want = 10 * 2.5 + 2 * greedy + 2 * histogram + 2 * greedy + 4 * write
  assert run.checkpoints == 4
  assert run.total_seconds == pytest.approx(want, rel=1e-12)
  assert run.chips == 8
  assert run.chip_hours == pytest.approx(want * 8 / 3600, rel=1e-12)
  # Sampled evaluation before and after RL: 100 prompts x 4 samples, chunks
  # of 16 prompts side by side.
  sampled = _run(eval_sampled_k=4)
  extra = 2 * 7 * _round_parts(16, 64, 1)
  assert sampled.total_seconds == pytest.approx(want + extra, rel=1e-12)
  # No eval split (0 prompts): no evaluation is counted, the histogram is.
  no_eval = _run(eval_prompts=0, eval_sampled_k=4)
  assert [s.name for s in no_eval.scorings] == ['pass-rate histogram before/after RL']
  assert no_eval.total_seconds == pytest.approx(want - 4 * greedy, rel=1e-12)


def _param_count(c: model_lib.ModelConfig) -> int:
  """The model's own parameters (nnx.eval_shape: no memory), every leaf."""
  state = nnx.state(nnx.eval_shape(lambda: model_lib.create_model(c)), nnx.Param)
  return sum(math.prod(x.shape) for x in jax.tree.leaves(state))


def test_checkpoint_bytes_and_write_seconds():
  fp32 = _TINY  # param_dtype float32.
  assert checkpoint_time.checkpoint_bytes(fp32) == _param_count(fp32) * 4 * 3
  bf16 = dataclasses.replace(fp32, param_dtype=jnp.bfloat16)
  assert checkpoint_time.checkpoint_bytes(bf16) == _param_count(fp32) * 2 * 3
  one = checkpoint_time.write_seconds(fp32, 1, 1.0)
  assert one.seconds == pytest.approx(one.total_bytes / 1e9)
  assert checkpoint_time.write_seconds(fp32, 4, 1.0).seconds == pytest.approx(
    one.seconds / 4
  )
  assert checkpoint_time.write_seconds(fp32, 1, 2.0).seconds == pytest.approx(
    one.seconds / 2
  )
  assert one.fits_notice and one.margin_s == pytest.approx(30 - one.seconds)
  for gbps in (0, -1):
    with pytest.raises(ValueError, match='positive'):
      checkpoint_time.write_seconds(fp32, 1, gbps)


def _plan(capsys, *argv: str) -> str:
  plan.main(['--config', *argv])
  return capsys.readouterr().out


_OTHER_MODELS = ('236 s', '333 s', '375 s')  # The 7B's: never beside another model.


def test_plan_prints_the_run_estimate_and_the_1p5b_paper_times(capsys):
  out = _plan(capsys, 'configs/qwen25_math_1p5b.py:tpu=v5p-64')
  paper = next(line for line in out.splitlines() if line.startswith('paper step'))
  assert 'Qwen2.5-Math-1.5B' in paper and 'Table 2' in paper
  assert 'grpo 102 s, pos 228 s, balance 290 s' in paper
  assert not any(t in out for t in _OTHER_MODELS), paper
  assert '400 RL steps x ' in out
  assert 'pass-rate histogram before/after RL: 2 x 512 prompts x k=8' in out
  assert 'checkpoint writes: 8 x ' in out  # 400 steps, every 50.
  total = next(line for line in out.splitlines() if line.startswith('estimated run'))
  assert 'lower bound' in total and 'on 32 v5p chips' in total
  hours = float(re.search(r'at least ([\d.]+) h', total)[1])
  chip_hours = float(re.search(r'at least ([\d.]+) chip-hours', total)[1])
  assert chip_hours == pytest.approx(hours * 32, rel=0.01)
  assert out.rstrip().splitlines()[-2].startswith('fits: ')  # Then the layout.


def test_plan_prints_no_paper_times_for_a_model_the_paper_did_not_time(capsys):
  out = _plan(capsys, 'configs/tiny_arith.py:tpu=v4-32')
  paper = [line for line in out.splitlines() if line.startswith('paper step')]
  assert len(paper) == 1 and 'none' in paper[0], paper
  assert 'grpo ' not in out and not any(t in out for t in _OTHER_MODELS)
  # Its whole eval split is not counted (size unknown), and SFT is not.
  assert "whole 'test' split" in out and 'SFT (1200 steps)' in out


def _checkpoint_total(out: str) -> float:
  line = next(x for x in out.splitlines() if x.strip().startswith('checkpoint writes'))
  return float(line.split()[-2])


def test_write_gbps_halves_the_checkpoint_writes(capsys):
  spec = 'configs/qwen25_math_7b.py:tpu=v5p-64'
  base = _plan(capsys, spec)
  fast = _plan(capsys, spec, '--write-gbps', '2')
  assert 'at an assumed 1 GB/s per host' in base
  assert 'at an assumed 2 GB/s per host' in fast
  assert _checkpoint_total(fast) == pytest.approx(_checkpoint_total(base) / 2, abs=0.1)
  with pytest.raises(SystemExit, match='positive'):
    _plan(capsys, spec, '--write-gbps', '0')


def test_scoring_runs_at_the_trainers_score_slots(capsys):
  # The trainer scores at RLSettings.score_slots (from_config sizes it:
  # rl.slots halved until the pass_rates phase fits); the estimate too.
  spec = 'configs/qwen25_math_7b.py:tpu=v4-32'
  out = _plan(capsys, spec)
  c = from_config.load(spec)
  cfg = dataclasses.replace(plan.model_config(c, 'qwen25_math_7b'), platform='tpu')
  from_config.resolve_layout(c, cfg, platform='tpu', refuse=False)  # As a run.
  want = from_config.command_slots(c, cfg, 'pass_rates', c.sampling.max_new_tokens)
  line = next(x for x in out.splitlines() if 'pass-rate histogram before' in x)
  assert f'k=8, {want} slots' in line, line
