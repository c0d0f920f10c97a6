r"""Stages a paper config's model and data into a bucket, once, for every host.

  python -m ada_jax.stage --config configs/qwen25_math_7b.py[:data=easy] \
      --to gs://BUCKET/ada_assets [--sets hard_7b,math500,...]
  ./launch_tpu.sh stage --config ... --to gs://...        # the same, here

Run it on a machine with internet (a laptop, a VM): it downloads the
config's released model (`model.hub_id`, from `ada_jax.hub_ids`) and its
prompt set plus the evaluation sets (`hub_ids.EVAL_SETS`) with
huggingface_hub, then copies them to

  TO/models/<repo name>/          config.json, safetensors, tokenizer files
  TO/manual/<set>/                the sets' parquet / JSONL files

and prints the overrides that read them from there on every host
(`model.hf_path=TO/models/...`, `data.manual_dir=TO/manual`): each host
downloads a local copy once (`infra.storage.localize`), so nothing is
copied by hand and a re-created pod needs nothing again. What is already
staged (the same repo revision, `TO/.../STAGED.txt`) is skipped.

A token comes from `HF_TOKEN` (huggingface_hub's variable). A gated model
(Llama 3.2: accept its licence on the Hub first) without one, or with one
that has no access, is one line naming the model and the variable, exit 2.
`HF_ENDPOINT` points huggingface_hub at another server (the tests run a
local one).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence

from ada_jax import from_config, hub_ids
from ada_jax.infra import exit_codes

# What a policy needs of its repository (no other formats, no READMEs).
MODEL_FILES = (
  '*.json',
  '*.safetensors',
  'tokenizer*',
  'vocab.*',
  'merges.txt',
  '*.model',
  '*.jinja',
)
SET_FILES = ('*.parquet', '*.jsonl', '*.json')
MARKER = 'STAGED.txt'  # JSON, named so no reader takes it for data.


class StageError(RuntimeError):
  """A download that cannot be done; the message is one line."""


def _hub_errors(repo_id: str, what: str, token: str | None):
  """A context that turns huggingface_hub's errors into one-line StageErrors."""
  import contextlib

  import huggingface_hub
  from huggingface_hub import errors

  @contextlib.contextmanager
  def ctx():
    try:
      yield
    except errors.GatedRepoError:
      have = 'HF_TOKEN has no access to it' if token else 'HF_TOKEN is not set'
      raise StageError(
        f'{what} {repo_id} is gated and {have}: accept its licence on the Hub, '
        'then export HF_TOKEN=<a token of that account>'
      ) from None
    except errors.RepositoryNotFoundError:
      raise StageError(
        f'{what} {repo_id}: not found on {huggingface_hub.constants.ENDPOINT} '
        '(or private: set HF_TOKEN)'
      ) from None
    except errors.HfHubHTTPError as e:
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise StageError(f'{what} {repo_id}: {first}') from None

  return ctx()


def _staged_sha(dest: str) -> str | None:
  from ada_jax.infra import storage

  marker = storage.path(f'{dest}/{MARKER}')
  if not marker.exists():
    return None
  return json.loads(marker.read_text()).get('sha')


def stage_repo(
  repo_id: str, repo_type: str, dest: str, patterns: Sequence[str], work: str
) -> bool:
  """Downloads one repository and copies it to `dest`; False if already there.

  One `repo_info` call gives the revision: compared with the staged one,
  then pinned for the download (a push in between cannot mix revisions).
  """
  import huggingface_hub

  from ada_jax.infra import storage

  token = os.environ.get('HF_TOKEN') or None
  what = 'model' if repo_type == 'model' else 'dataset'
  with _hub_errors(repo_id, what, token):
    sha = str(
      huggingface_hub.HfApi(token=token).repo_info(repo_id, repo_type=repo_type).sha
    )
    if _staged_sha(dest) == sha:
      print(f'{repo_id}: already staged at {dest} (revision {sha[:12]})', flush=True)
      return False
    local = os.path.join(work, repo_type, repo_id.replace('/', '__'))
    huggingface_hub.snapshot_download(
      repo_id,
      repo_type=repo_type,
      revision=sha,
      local_dir=local,
      allow_patterns=list(patterns),
      token=token,
    )
  storage.makedirs(dest)
  storage.upload_dir(local, dest, skip_dirs=('.cache',))  # huggingface_hub's
  storage.path(f'{dest}/{MARKER}').write_text(
    json.dumps({'repo': repo_id, 'repo_type': repo_type, 'sha': sha})
  )
  print(f'{repo_id}: staged at {dest} (revision {sha[:12]})', flush=True)
  return True


def sets_of(c) -> list[str]:
  """The config's prompt set and the evaluation sets, as ada_math_local names."""
  name = c.data.name.removeprefix('ada_math_local/')
  out = [name] if name in hub_ids.DATASETS else []
  return out + [s for s in hub_ids.EVAL_SETS if s not in out]


def stage(
  c, to: str, sets: Sequence[str] | None = None, work: str | None = None
) -> str:
  """Stages the config's model and sets below `to`; returns the overrides."""
  to = to.rstrip('/')
  hub_id = c.model.get('hub_id', '')
  if not hub_id:
    raise StageError('the config has no model.hub_id: stage takes a paper config')
  sets = list(sets) if sets else sets_of(c)
  unknown = [s for s in sets if s not in hub_ids.DATASETS]
  if unknown:
    raise StageError(f'--sets: unknown {unknown}; known: {sorted(hub_ids.DATASETS)}')
  model_dest = f'{to}/models/{hub_id.split("/")[-1]}'
  with tempfile.TemporaryDirectory(prefix='ada_stage_', dir=work) as tmp:
    stage_repo(hub_id, 'model', model_dest, MODEL_FILES, tmp)
    for s in sets:
      stage_repo(hub_ids.DATASETS[s], 'dataset', f'{to}/manual/{s}', SET_FILES, tmp)
  return f'--config.model.hf_path={model_dest} --config.data.manual_dir={to}/manual'


def main(argv: Sequence[str] | None = None) -> None:
  """Command line (see the module docstring)."""
  p = argparse.ArgumentParser(
    prog='python -m ada_jax.stage', description=__doc__.splitlines()[0]
  )
  p.add_argument('--config', required=True, help='configs/NAME.py[:arg]')
  p.add_argument('--to', required=True, help='gs://BUCKET/DIR (or a local folder)')
  p.add_argument('--sets', default='', help='default: the prompt set + eval sets')
  args, rest = from_config.parse_command_line(p, argv)
  logging.getLogger().setLevel(logging.WARNING)
  try:
    c = from_config.load(args.config, rest)
    from ada_jax.infra import storage

    storage.require(args.to)
    sets = [s.strip() for s in args.sets.split(',') if s.strip()] or None
    overrides = stage(c, args.to, sets)
  except (StageError, from_config.ConfigError, OSError) as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(exit_codes.BAD_INPUT)
  print(f'staged; run with: {overrides}')


if __name__ == '__main__':
  main()
