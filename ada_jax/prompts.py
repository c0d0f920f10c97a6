r"""Prompt templates: the reference's chat prompt, a plain one, the tiny task's.

- `chat`: the reference's system prompt, the problem plus its suffix as the
  user turn, then the tokenizer's chat template with a generation prompt
  (reference section 6; also used at evaluation).
- `plain`: the same instructions as plain text, for base models that ship no
  chat template (the BOS token is written out where the family uses one,
  because prompts are encoded without special tokens).
- `tiny`: `Q:<problem>=`, for the arithmetic task and its tiny tokenizer; the
  model is trained to answer `\boxed{<n>}` and stop.
- `auto`: `tiny` for ada_arith and ada_columns, else `chat` if the tokenizer has a chat
  template, else `plain`.
"""

from __future__ import annotations

from collections.abc import Sequence

from ada_jax import tokenizer as tokenizer_lib

SYSTEM_PROMPT = (
  'Please reason step by step, and put your final answer within \\boxed{}.'
)
USER_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."
TEMPLATES = ('auto', 'chat', 'plain', 'tiny')


def tiny_prompt(problem: str) -> str:
  """The tiny task's prompt: short, so a tiny model reads it in few tokens."""
  return f'Q:{problem}='


def plain_prompt(problem: str, bos_token: str | None = None) -> str:
  """The reference's instructions without a chat template (base models)."""
  return f'{bos_token or ""}{SYSTEM_PROMPT}\n\n{problem}{USER_SUFFIX}\n'


def chat_prompt(tokenizer: tokenizer_lib.Tokenizer, problem: str) -> str:
  """The reference's prompt through the tokenizer's chat template."""
  return tokenizer.chat_prompt(problem + USER_SUFFIX, system=SYSTEM_PROMPT)


def resolve(
  template: str, dataset: str, tokenizer: tokenizer_lib.Tokenizer | None
) -> str:
  """The concrete template (`chat`, `plain` or `tiny`) that `auto` stands for.

  Raises:
    ValueError: unknown template, or `chat` (or `auto` outside ada_arith)
      without a tokenizer.
  """
  if template not in TEMPLATES:
    raise ValueError(f'Unknown prompt template {template!r}; use one of {TEMPLATES}.')
  if template == 'auto':
    if dataset.split('/')[0] in ('ada_arith', 'ada_columns'):
      return 'tiny'
    if tokenizer is None:
      raise ValueError(f'Template auto for {dataset} needs a tokenizer.')
    return 'chat' if tokenizer.has_chat_template else 'plain'
  if template == 'chat' and tokenizer is None:
    raise ValueError('Template chat needs a tokenizer.')
  return template


def format_prompt(
  problem: str, template: str, tokenizer: tokenizer_lib.Tokenizer | None = None
) -> str:
  """The prompt text of `problem` under a concrete template (not `auto`)."""
  if template == 'tiny':
    return tiny_prompt(problem)
  if template == 'plain':
    return plain_prompt(problem, tokenizer.bos_token if tokenizer else None)
  if template == 'chat':
    if tokenizer is None:
      raise ValueError('Template chat needs a tokenizer.')
    return chat_prompt(tokenizer, problem)
  raise ValueError(f'Unknown prompt template {template!r}; use one of {TEMPLATES}.')


def format_prompts(
  problems: Sequence[str],
  template: str,
  tokenizer: tokenizer_lib.Tokenizer | None = None,
) -> list[str]:
  """`format_prompt` for many problems; fast for chat templates.

  Rendering a Jinja chat template costs ~0.2 ms, a minute for the 220k-row
  pool. Templates in practice put the user text in verbatim, so we render
  once around a placeholder and splice; we fall back to rendering each row
  when two placeholders do not give the same surroundings or a spliced
  prompt differs from the rendered one on the first rows.
  """
  if template != 'chat' or tokenizer is None or not problems:
    return [format_prompt(p, template, tokenizer) for p in problems]
  marks = ('\x00ADA_PROBLEM_A\x00', '\x00ADA_PROBLEM_B\x00')
  frames = [chat_prompt(tokenizer, m).split(m) for m in marks]
  if any(len(f) != 2 for f in frames) or frames[0] != frames[1]:
    return [chat_prompt(tokenizer, p) for p in problems]
  head, tail = frames[0]
  spliced = [head + p + tail for p in problems]
  checked = range(min(3, len(problems)))
  if any(spliced[i] != chat_prompt(tokenizer, problems[i]) for i in checked):
    return [chat_prompt(tokenizer, p) for p in problems]
  return spliced
