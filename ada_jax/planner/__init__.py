"""Planning a run before launch: memory per device, step time, compiled check.

Owns what a researcher asks before spending a pod: will this config fit
(`memory`: per-device bytes of every buffer of one RL step, from shapes and
shardings alone), which mesh and micro-batch a pod gets (`layout`: the
smallest tensor axis dividing the KV heads whose plan fits), how long will
a step take at best (`step_time`: FLOPs and
HBM bytes per phase against the chips' peaks in `chips`), and does the
compiled program agree (the `--check` of `python -m ada_jax.plan`; its
TPU terms are fitted to the TPU compiler, `--check --target tpu`). The
paper models' shapes are in `models`, so no download is needed.

May import: the policy layer (model, sharding), `adaptive` and `infra`.
"""
