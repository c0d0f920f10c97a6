"""The main job on a gs:// workdir, against the Cloud Storage emulator.

The pod journey's storage path end to end, as `launch_tpu.sh run` drives
it: the tiny config (shrunk to seconds, as in test_reliability) with its
workdir and its TFDS data dir on `gs://`, checkpoints through orbax and
tensorstore, metrics rewritten as objects. The run is SIGKILLed after a
checkpoint and resumed (every row once), restarted from scratch when its
checkpoints are gone (its progress files set aside under `restarts/` on
the bucket), then evaluated per kept step and exported, to `gs://` both.

The emulator is `tests/gcs_emulator.py` (gcp-storage-emulator plus the
generation header tensorstore reads); the job finds it by
`STORAGE_EMULATOR_HOST` alone.
"""

import json
import signal
import subprocess
import sys
import time

from ada_jax.infra import checkpoint as checkpoint_lib
from ada_jax.infra import storage
from tests import test_reliability as rel


def _rows(path: str) -> list[dict]:
  p = storage.path(path)
  if not p.exists():
    return []
  return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def _kept(workdir: str) -> list[int]:
  """The run's kept steps as the bucket holds them now (no cached listing)."""
  storage._filesystem().invalidate_cache()
  return checkpoint_lib.kept_steps(workdir)


def _env() -> dict[str, str]:
  """The commands' environment: STORAGE_EMULATOR_HOST alone names the emulator."""
  env = rel._env()
  for k in ('TENSORSTORE_GCS_HTTP_URL', 'GOOGLE_AUTH_TOKEN_FOR_TESTING'):
    env.pop(k, None)
  assert env['STORAGE_EMULATOR_HOST']
  return env


def _main(workdir: str, overrides: list[str]) -> subprocess.Popen:
  return subprocess.Popen(
    rel._argv(workdir, overrides),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=_env(),
  )


def _finish(proc: subprocess.Popen, timeout: float = 300) -> str:
  out, err = proc.communicate(timeout=timeout)
  assert proc.returncode == 0, err[-3000:]
  return out


def test_a_gs_run_is_killed_resumed_restarted_evaluated_and_exported(gcs_dir):
  workdir = f'{gcs_dir}/run'
  overrides = rel._overrides(f'{gcs_dir}/tfds')
  want = [('sft', 25), ('sft', 50)] + [('rl', s) for s in range(1, 5)]

  # Killed once its step-2 checkpoint is complete, then resumed.
  proc = _main(workdir, overrides)
  deadline = time.monotonic() + 400
  while 2 not in _kept(workdir):
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert time.monotonic() < deadline, 'no checkpoint 2'
    time.sleep(0.2)
  proc.send_signal(signal.SIGKILL)
  proc.communicate(timeout=60)
  out = _finish(_main(workdir, overrides))
  assert 'resumed from step' in out
  rows = _rows(f'{workdir}/metrics.jsonl')
  assert rel.keys(rows) == want  # Every row once.
  samples = [r['step'] for r in _rows(f'{workdir}/samples.jsonl') if r['phase'] == 'rl']
  per_step = {s: samples.count(s) for s in range(1, 5)}
  assert len(set(per_step.values())) == 1 and per_step[1] > 0, per_step  # None twice.
  assert not storage.path(f'{workdir}/lease.json').exists()

  # Its checkpoints gone: started over, the progress files set aside.
  storage._filesystem().rm(f'{workdir}/checkpoints'[len('gs://') :], recursive=True)
  out = _finish(_main(workdir, overrides))
  assert 'restarts/' in out
  (kept,) = list(storage.path(f'{workdir}/restarts').iterdir())
  assert rel.keys(_rows(f'{kept}/metrics.jsonl')) == want
  assert rel.keys(_rows(f'{workdir}/metrics.jsonl')) == want

  # Evaluated per kept step, and exported, to gs://.
  evaluate = [
    sys.executable, '-m', 'ada_jax.evaluate', '--config', rel.CONFIG,
    '--checkpoint', workdir, '--step', 'all', '--datasets', 'ada_arith:test[:4]',
    '--k', '2', '--max-new-tokens', '8', '--slots', '8',
    '--out', f'{gcs_dir}/eval', *overrides,
  ]  # fmt: skip
  # With the launcher's default compile cache, WORKDIR/jax_cache on gs://:
  # JAX writes its entries there through the same storage clients.
  cache = f'{workdir}/jax_cache'
  proc = subprocess.run(
    evaluate,
    capture_output=True,
    text=True,
    env=dict(_env(), JAX_COMPILATION_CACHE_DIR=cache),
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  storage._filesystem().invalidate_cache()
  entries = [p.name for p in storage.path(cache).iterdir()]
  assert any(name.startswith('jit_') for name in entries), entries
  kept_steps = _kept(workdir)
  assert kept_steps and max(kept_steps) == 4
  for step in kept_steps:
    report = json.loads(
      storage.path(f'{gcs_dir}/eval/step_{step}/eval.json').read_text()
    )
    assert report['step'] == step
  export = [
    sys.executable, '-m', 'ada_jax.export', '--workdir', workdir,
    '--out', f'{gcs_dir}/hf', '--step', 'latest',
  ]  # fmt: skip
  proc = subprocess.run(
    export, capture_output=True, text=True, env=_env(), timeout=300, check=False
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f'exported step 4 of {workdir}' in proc.stdout
  names = {p.name for p in storage.path(f'{gcs_dir}/hf').iterdir()}
  assert {'config.json', 'model.safetensors', 'tokenizer.json'} <= names, names
