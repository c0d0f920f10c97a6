r"""Reinforce-Ada on Llama-3.2-3B-Instruct: the paper's setup (reference section 5.2).

RL from the released model on the reference's prompt set with the
run_reinforce_ada.sh values (B=512 prompts, n=4, M=8, N=4, τ=0.7, AdamW
lr 1e-6, 10 warmup steps, clip 0.2/0.28, dual clip c=10, wd 0, token-mean,
4 mini-batches per step, prompt 1024 / response 2048 tokens, temperature 1,
400 steps, checkpoints every 50). `variant=grpo` (and dapo, its filtering
cousin) take run_grpo.sh's instead: c=3, wd 0.01, no warmup, local
advantages with std. Where script and paper disagree we take the script,
which produced the released checkpoints and the curves: entropy
coefficient 0 (paper: 1e-4; `--config.rl.entropy_coef=1e-4`) and 400 steps
(paper text: 600; `--config.rl.steps=600`). Shared values and the mesh
presets live in configs/common.py.

Memory by the plan (ada_jax.plan; peak per chip, the Ada-balance step; the
table in configs/common.py has every model and pod): v5p-64 38.9 GiB and
v6e-64 22.4 GiB fit in one slot wave; v4-32 fits the paper's step unchanged
in 4 slot waves per round at (1, 16, 1): 26.8 GiB of 32 (the round's KV
cache shrinks 4-fold; the rule picks the waves: `sampling.waves=0`). On GPUs (gpu=,
at JAX's default 0.75 of HBM): 8xH100 in 4 slot waves at (1, 4, 2): 44.7
GiB of 59.7; 8xH200 in 2 at (1, 8, 1): 77.6 GiB of 105.3.

Data: `data=hard` only: `ada_math_local/hard_llama`; `data=easy` is an
error. Stage the model and the sets into a bucket once, from a machine with
internet: `./launch_tpu.sh stage --config configs/llama32_3b_instruct.py --to
gs://BUCKET/assets` (README "Data"); every worker reads them from there.
Llama-3.2 has 131072 positions: evaluation runs the full 4096 new
tokens.

Commands (from the repo root):
  CPU, ~1 min of CPU time, mostly compiles (random tiny llama model,
  ada_arith data, 3 steps; a smoke test: the random model earns no reward):
        python -m ada_jax.main --config configs/llama32_3b_instruct.py:runlocal --workdir /tmp/ada/l3b_local
  CPU, GRPO:
        python -m ada_jax.main --config configs/llama32_3b_instruct.py:runlocal,variant=grpo --workdir /tmp/ada/l3b_local_grpo
  TPU (v5p-64; model and sets staged into the bucket, see above):
        ./launch_tpu.sh run configs/llama32_3b_instruct.py:tpu=v5p-64 \
            --workdir gs://BUCKET/ada/l3b_balance_hard \
            --config.model.hf_path=gs://BUCKET/assets/models/Llama-3.2-3B-Instruct --config.data.manual_dir=gs://BUCKET/assets/manual
  TPU, GRPO baseline:
        ./launch_tpu.sh run configs/llama32_3b_instruct.py:tpu=v5p-64,variant=grpo \
            --workdir gs://BUCKET/ada/l3b_grpo_hard \
            --config.model.hf_path=gs://BUCKET/assets/models/Llama-3.2-3B-Instruct --config.data.manual_dir=gs://BUCKET/assets/manual
  Evaluate each kept checkpoint of a run on the pod (Ave@32 on the four
  benchmarks, graded by ours and the reference's; the chunk is sized to the
  chip):
        ./launch_tpu.sh eval --config configs/llama32_3b_instruct.py:tpu=v5p-64 \
            --config.model.hf_path=gs://BUCKET/assets/models/Llama-3.2-3B-Instruct --config.data.manual_dir=gs://BUCKET/assets/manual \
            --checkpoint gs://BUCKET/ada/l3b_balance_hard \
            --step all --datasets math500,minerva_math,olympiadbench,aime_like --k 32

Arg keys (comma separated): variant=grpo|pos|balance|dapo|est (default
balance), schedule=paper|refill (pos/balance; default paper),
data=hard (default hard), tpu=v4-32|v5p-64|v6e-64 or
gpu=8xh100|8xh200|1xh100 (mesh preset, one of the two; default full FSDP
over all devices), seed=INT, runlocal.

Expected (paper Table 1, Ave@32 weighted; not yet reproduced with
ada_jax): GRPO 27.9, Ada-pos 28.8, Ada-balance 29.1.
"""

import os
import sys

import ml_collections

try:
  from configs import common
except ImportError:  # Loaded from outside the repo root.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  from configs import common

CONFIG = 'configs/llama32_3b_instruct.py'
DATASETS = {'hard': 'hard_llama'}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The Llama-3.2-3B-Instruct config; see the module docstring."""
  args = common.paper_args(arg, CONFIG, DATASETS)
  return common.paper_config(
    args,
    config_name=CONFIG,
    family='llama',
    size='3b',
    dataset=DATASETS[args['data']],
  )
