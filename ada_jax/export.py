r"""Exports a run's latest checkpoint as a Hugging Face directory.

  python -m ada_jax.export --workdir DIR --out HF_DIR [--step N|latest] \
      [--config configs/tiny_arith.py[:arg] [--config.key=value ...]]

The run's config comes from `DIR/config.json` (written by the trainer's
MetricsWriter) unless `--config` is given. Nothing in DIR is written: the
params are restored read-only, and HF_DIR may not be a run directory
(`--out DIR` would overwrite the run's config.json). The model skeleton is rebuilt from
it (the HF architecture of `model.hf_path`, or the tiny model), the params of
the latest complete checkpoint are restored into it (no optimizer state), and
`HF_DIR` gets what `ada_jax.hf.save_model` writes (config.json,
generation_config.json, safetensors) plus the tokenizer files and a chat
template, so that

  transformers.AutoModelForCausalLM.from_pretrained(HF_DIR)
  transformers.PreTrainedTokenizerFast.from_pretrained(HF_DIR)

load the trained policy. A tokenizer without a chat template (the tiny
task's, base models) gets one that renders the run's prompt template around
the user message, so `apply_chat_template(..., add_generation_prompt=True)`
gives exactly the prompts the policy was trained on.

HF_DIR may be a gs:// folder (`infra.storage`): the files are written into a
local temporary folder, then copied up (the model's size in local disk
space), and an unreachable bucket is one line before the restore.

Export from a finished, paused or running run: the reader leaves
unfinished (tmp) saves alone and takes the latest complete step.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from ada_jax import from_config

# Files of a HF tokenizer directory; config.json and generation_config.json
# are the model's and come from save_model.
TOKENIZER_FILES = (
  'tokenizer.json',
  'tokenizer_config.json',
  'special_tokens_map.json',
  'added_tokens.json',
  'vocab.json',
  'merges.txt',
  'tokenizer.model',
  'chat_template.jinja',
  'chat_template.json',
)

# Chat templates that render the run's prompt template around the last user
# message (the `tiny` and `plain` templates of ada_jax.prompts).
_TINY_TEMPLATE = (
  "{%- for m in messages %}{%- if m['role'] == 'user' %}Q:{{ m['content'] }}="
  "{%- elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
  '{%- endif %}{%- endfor %}'
)


def _plain_template() -> str:
  from ada_jax import prompts

  def lit(text: str) -> str:  # A jinja string literal.
    return json.dumps(text)

  return (
    "{%- for m in messages %}{%- if m['role'] == 'user' %}"
    '{{ bos_token or "" }}'
    '{{ ' + lit(prompts.SYSTEM_PROMPT + '\n\n') + " }}{{ m['content'] }}"
    '{{ ' + lit(prompts.USER_SUFFIX + '\n') + ' }}'
    "{%- elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}"
    '{%- endif %}{%- endfor %}'
  )


def chat_template_for(template: str) -> str | None:
  """A chat template reproducing a concrete prompt template, or None (`chat`)."""
  if template == 'tiny':
    return _TINY_TEMPLATE
  if template == 'plain':
    return _plain_template()
  return None


def read_config(workdir: str) -> Any:
  """The run's ConfigDict from WORKDIR/config.json.

  Raises:
    FileNotFoundError: no config.json there.
    ValueError: a config.json that is not a run's (one line naming it).
  """
  import ml_collections
  from etils import epath

  from ada_jax.infra import run_dir

  path = epath.Path(workdir) / run_dir.CONFIG_FILE
  if not path.exists():
    raise FileNotFoundError(f'{path} not found: pass --config CONFIG[:arg]')
  try:
    raw = json.loads(path.read_text())
  except ValueError as e:
    raise ValueError(f'{path}: not valid JSON ({e}); pass --config') from None
  if not isinstance(raw, dict) or not {'model', 'data'} <= set(raw):
    raise ValueError(
      f'{path} is not a run config (no model/data keys; an HF config.json?): '
      'pass --config CONFIG[:arg]'
    )
  return ml_collections.ConfigDict(raw)


def write_tokenizer(tok, out: str, template: str) -> None:
  """Copies the tokenizer files to `out` and adds a chat template if needed."""
  for name in TOKENIZER_FILES:
    src = os.path.join(tok.path, name)
    if os.path.exists(src):
      shutil.copyfile(src, os.path.join(out, name))
  if tok.has_chat_template:
    return
  chat = chat_template_for(template)
  if chat is None:
    return
  with open(os.path.join(out, 'chat_template.jinja'), 'w') as f:
    f.write(chat)
  config_path = os.path.join(out, 'tokenizer_config.json')
  config = {}
  if os.path.exists(config_path):
    with open(config_path) as f:
      config = json.load(f)
  config['chat_template'] = chat
  with open(config_path, 'w') as f:
    json.dump(config, f, indent=2, sort_keys=True)


def export(c, workdir: str, out: str, step: int | None = None) -> int:
  """Writes the latest checkpoint of `workdir` (or `step`'s) as an HF directory.

  Args:
    c: the run's config (ConfigDict).
    workdir: run directory holding `checkpoints/`.
    out: output directory (created; local or gs://).
    step: a kept checkpoint's step (None: the latest usable one).

  Returns:
    The exported checkpoint's step.

  Raises:
    FileNotFoundError: the workdir has no usable checkpoint.
  """
  import jax
  from flax import nnx

  from ada_jax import hf, prompts, sharding
  from ada_jax.infra import checkpoint as checkpoint_lib
  from ada_jax.infra import run_dir, storage

  if os.path.abspath(out) == os.path.abspath(workdir):
    raise run_dir.WorkdirError(f'--out {out} is the run itself: pass another directory')
  run_dir.refuse_run_dir(out, '--out')
  tok = from_config.tokenizer(c)  # The tiny one in a temp dir: DIR stays as it is.
  config = from_config.model_config(c, tok)
  # Params split over all devices (fsdp): any mesh restores any checkpoint.
  mesh = sharding.make_mesh((1, -1, 1))
  graphdef, target = sharding.abstract_model(config, mesh, sharding.TRAIN_RULES)
  storage.require(out)  # gs://: gcsfs and credentials, before the restore.
  step, params, _ = checkpoint_lib.restore_params(workdir, target, step)
  # safetensors and the tokenizer write local files: a gs:// export is
  # written into a local folder, then copied up.
  with tempfile.TemporaryDirectory(prefix='ada_export_') as tmp:
    local = os.path.join(tmp, 'hf') if storage.is_remote(out) else out
    hf.save_model(nnx.merge(graphdef, params), local)
    if jax.process_index() == 0:
      template = prompts.resolve(c.data.template, c.data.name, tok)
      write_tokenizer(tok, local, template)
      if local != out:
        storage.upload_dir(local, out)
  logging.info('export: step %d of %s -> %s', step, workdir, out)
  return step


def parser() -> argparse.ArgumentParser:
  """--workdir, --out, optional --config; `--config.key=value` pass through."""
  p = argparse.ArgumentParser(
    prog='python -m ada_jax.export', description=__doc__.splitlines()[0]
  )
  p.add_argument('--workdir', required=True, help='the run directory')
  p.add_argument('--out', required=True, help='the HF directory to write')
  p.add_argument('--step', default='latest', help="a kept checkpoint's step, or latest")
  p.add_argument(
    '--config', default=None, help='configs/NAME.py[:arg] (default: DIR/config.json)'
  )
  return p


def main(argv: Sequence[str] | None = None) -> None:
  """Command line (see the module docstring)."""
  p = parser()
  args, rest = from_config.parse_command_line(p, argv)
  if rest and args.config is None:
    p.error('--config.KEY=VALUE overrides need --config')
  logging.getLogger().setLevel(logging.INFO)
  from ada_jax.infra import checkpoint as checkpoint_lib
  from ada_jax.infra import exit_codes, multihost

  # On a pod (`launch_tpu.sh export`, ADA_DISTRIBUTED=1) every worker runs
  # this: the params are restored over all hosts' chips and gathered, and
  # process 0 alone writes (hf.save_model).
  multihost.init_distributed()
  try:
    c = (
      from_config.load(args.config, rest)
      if args.config is not None
      else read_config(args.workdir)
    )
    which = checkpoint_lib.parse_step(args.step)
    if which == 'all':
      raise ValueError('--step all: export takes one step (a number, or latest)')
    step = export(c, args.workdir, args.out, None if which == 'latest' else which)
  except checkpoint_lib.StepNotKeptError as e:  # Bad input: 2, listing the steps.
    print(f'error: {e}', file=sys.stderr)
    sys.exit(exit_codes.BAD_INPUT)
  except (FileNotFoundError, ValueError, OSError) as e:  # WorkdirError, StorageError
    sys.exit(f'error: {e}')
  print(f'exported step {step} of {args.workdir} to {args.out}')


if __name__ == '__main__':
  main()
