"""The Hugging Face Hub ids of the paper's models and sets: the one table.

`configs/common.py` records a paper config's model id (`model.hub_id`),
`datasets/ada_math_local.py` names each set's source by it, and
`python -m ada_jax.stage` downloads from it. Plain data: importing it
costs nothing (the configs read it).
"""

from __future__ import annotations

# Config module -> the released policy it trains.
MODELS: dict[str, str] = {
  'qwen25_math_1p5b': 'Qwen/Qwen2.5-Math-1.5B',
  'qwen25_math_7b': 'Qwen/Qwen2.5-Math-7B',
  'qwen3_4b_instruct': 'Qwen/Qwen3-4B-Instruct-2507',
  'llama32_3b_instruct': 'meta-llama/Llama-3.2-3B-Instruct',
}
# Models whose download needs an accepted licence and a token (HF_TOKEN).
GATED: frozenset[str] = frozenset({'meta-llama/Llama-3.2-3B-Instruct'})

# ada_math_local config -> the dataset it is read from.
DATASETS: dict[str, str] = {
  'simple_1p5b': 'RLHFlow/reinforce_ada_simple_prompt_1-5b',
  'hard_1p5b': 'RLHFlow/reinforce_ada_hard_prompt_1-5b',
  'easy_7b': 'RLHFlow/reinforce_ada_easy_prompt',
  'hard_7b': 'RLHFlow/reinforce_ada_hard_prompt',
  'hard_llama': 'RLHFlow/reinforce_ada_hard_prompt_llama',
  'validate': 'weqweasdas/validate',
  'math500': 'weqweasdas/math500',
  'minerva_math': 'weqweasdas/minerva_math',
  'olympiadbench': 'weqweasdas/olympiadbench',
  'aime_like': 'weqweasdas/aime_hmmt_brumo_cmimc_amc23',
}
# The evaluation sets every paper config is evaluated on (and validated on).
EVAL_SETS: tuple[str, ...] = (
  'validate',
  'math500',
  'minerva_math',
  'olympiadbench',
  'aime_like',
)
