"""Where the sampler, the controller, the verifier and the update meet.

Owns one RL step and the run around it: `rollout` (a step's sampling:
the controller's rounds over the sampler, scored, into a fixed-shape
training batch), `scoring` (k samples per prompt through the sampler,
scored: evaluation, pass-rate histograms, prompt selection, and the
rollout's draws), `loss` (the clipped surrogate and its aggregation),
`update` (old log-probs and the micro-batched optimizer step),
`sft_rows` (teacher-forced demonstration rows for the warm start),
`trainer` (the `Trainer`: state, SFT, one RL step, evaluation,
checkpoints) and `fit` (a run from its checkpoint to its end: summary,
plots, preemption).

May import: the policy layer (model, sampler, tokenizer, data, sharding),
`adaptive`, `verifier` and `infra`; never `from_config` or a command.
Settings arrive as typed dataclasses, never as a ConfigDict.
"""
