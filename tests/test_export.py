"""`python -m ada_jax.export`: a short run's checkpoint reloads in transformers."""

import os
import pathlib
import subprocess
import sys

import numpy as np
import tokenizers
import torch
import transformers

from ada_jax import export, from_config, prompts
from ada_jax import model as model_lib
from ada_jax.infra import storage
from tests import test_train
from tests.test_train import data_dir  # noqa: F401  (the shared TFDS dir)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_export_reloads_in_transformers(data_dir, tmp_path, gcs_dir):  # noqa: F811
  c = test_train.tiny_config(data_dir, steps=1, eval_every=0, warmup=0)
  workdir = str(tmp_path / 'run')
  from_config.validate(c)
  trainer = from_config.trainer(c, workdir, verify_fn=test_train.hash_verify)
  before = test_train.host(trainer.state)
  trainer.rl_step()  # A short run: one RL step, then a checkpoint.
  trainer.save(force=True)
  trainer.ckpt.wait()
  assert not test_train.same_params(before, test_train.host(trainer.state))

  out = str(tmp_path / 'hf')
  proc = subprocess.run(
    [sys.executable, '-m', 'ada_jax.export', '--workdir', workdir, '--out', out],
    cwd=ROOT,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': ''},
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'exported step 1' in proc.stdout
  for name in ('config.json', 'tokenizer.json', 'tokenizer_config.json'):
    assert os.path.exists(os.path.join(out, name)), name

  # Same logits as our model on a batch.
  hf_model = transformers.AutoModelForCausalLM.from_pretrained(
    out, dtype=torch.float32
  ).eval()
  examples = trainer.train_examples[:4]
  tokens, mask = trainer.encode(examples)
  ours = np.asarray(model_lib.logits(trainer.model, tokens, mask))
  for i in range(len(examples)):
    real = mask[i] > 0  # HF gets each prompt unpadded.
    with torch.no_grad():
      theirs = hf_model(torch.tensor(tokens[i][real][None], dtype=torch.long)).logits
    vocab = theirs.shape[-1]
    np.testing.assert_allclose(
      ours[i][real][:, :vocab], theirs[0].numpy(), atol=1e-4, rtol=1e-4
    )

  # The tokenizer and its chat template give the training prompts.
  hf_tok = transformers.PreTrainedTokenizerFast.from_pretrained(out)
  for e in examples:
    assert hf_tok.encode(e.prompt, add_special_tokens=False) == trainer.tok.encode(
      e.prompt
    )
    chat = hf_tok.apply_chat_template(
      [{'role': 'user', 'content': e.problem}],
      tokenize=False,
      add_generation_prompt=True,
    )
    assert chat == e.prompt
  assert hf_tok.eos_token_id in trainer.tok.eos_ids

  # To gs:// (the emulator): the same files, byte for byte. The old code
  # wrote a local folder named 'gs:' and reported success.
  remote = f'{gcs_dir}/hf'
  proc = subprocess.run(
    [sys.executable, '-m', 'ada_jax.export', '--workdir', workdir, '--out', remote],
    cwd=tmp_path,
    env={
      **os.environ,
      'JAX_PLATFORMS': 'cpu',
      'XLA_FLAGS': '',
      'PYTHONPATH': str(ROOT),
    },
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert not (tmp_path / 'gs:').exists()
  got = storage.path(remote)
  assert sorted(p.name for p in got.iterdir()) == sorted(os.listdir(out))
  for name in os.listdir(out):
    assert (got / name).read_bytes() == pathlib.Path(out, name).read_bytes(), name


def test_plain_chat_template_matches_the_plain_prompt():
  tok = transformers.PreTrainedTokenizerFast(
    tokenizer_object=tokenizers.Tokenizer(
      tokenizers.models.WordLevel({'<s>': 0, '<unk>': 1}, '<unk>')
    ),
    bos_token='<s>',
    unk_token='<unk>',
  )
  tok.chat_template = export.chat_template_for('plain')
  problem = 'What is $1+1$?'
  got = tok.apply_chat_template(
    [{'role': 'user', 'content': problem}], tokenize=False, add_generation_prompt=True
  )
  assert got == prompts.plain_prompt(problem, '<s>')
