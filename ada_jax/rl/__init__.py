"""Where the sampler, the controller, the verifier and the update meet.

Owns one RL step and the run around it: `rollout` (a step's sampling:
the controller's rounds over the sampler, scored, into a fixed-shape
training batch), `scoring` (the `Scorer`, the verifier's settings bound
once, and its one path from a sampled round to gathered rewards, used by
the rollout's rounds and by k samples per prompt for evaluation,
pass-rate histograms and prompt selection), `loss` (the clipped
surrogate and its aggregation), `update` (old log-probs and the
micro-batched optimizer step), `sft_rows` (teacher-forced demonstration
rows for the warm start), `trainer` (the `Trainer`: state, SFT, one RL
step, evaluation, checkpoints) and `fit` (a run from its checkpoint to
its end: summary, plots, preemption).

May import: the policy layer (model, sampler, tokenizer, data, sharding),
`adaptive`, `verifier` and `infra`; never `from_config` or a command.
Settings arrive as typed dataclasses (`adaptive.ControllerSettings`,
`rollout.SamplingSettings`, `scoring.Scorer`, ...), never as a ConfigDict.
"""
