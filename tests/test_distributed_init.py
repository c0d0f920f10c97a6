"""How a process joins jax.distributed, by environment (no real cluster).

`multihost.init_distributed` is the first thing every command calls. These
tests replace `jax.distributed.initialize` (the attribute the code calls) with
a recorder, so each case checks which path the environment picks and with
what arguments, without starting a coordinator: the real two-process run is
tests/test_multihost.py.
"""

from __future__ import annotations

import jax
import pytest

from ada_jax.infra import multihost

VARS = ('ADA_DISTRIBUTED', 'ADA_COORDINATOR', 'ADA_NUM_PROCESSES', 'ADA_PROCESS_ID')
EXPLICIT = {
  'ADA_COORDINATOR': 'node0:12345',
  'ADA_NUM_PROCESSES': '4',
  'ADA_PROCESS_ID': '3',
}


@pytest.fixture
def calls(monkeypatch):
  """The recorded `jax.distributed.initialize` calls, in a clean environment."""
  for name in VARS:
    monkeypatch.delenv(name, raising=False)
  # The explicit path on CPU switches the CPU collectives to gloo: put the
  # flag back so later tests in this process see the value they started with.
  before = jax.config.jax_cpu_collectives_implementation
  recorded = []

  def initialize(*args, **kwargs):
    recorded.append((args, kwargs))

  monkeypatch.setattr(jax.distributed, 'initialize', initialize)
  yield recorded
  jax.config.update('jax_cpu_collectives_implementation', before)


def _set(monkeypatch, env):
  for name, value in env.items():
    monkeypatch.setenv(name, value)


def test_no_variables_is_a_single_process(calls):
  multihost.init_distributed()
  assert calls == []
  assert multihost.distributed_init_kwargs({}) is None


@pytest.mark.parametrize('value', ['', '0'])
def test_ada_distributed_off_is_a_single_process(calls, monkeypatch, value):
  monkeypatch.setenv('ADA_DISTRIBUTED', value)
  multihost.init_distributed()
  assert calls == []


def test_ada_distributed_calls_initialize_without_arguments(calls, monkeypatch):
  """No arguments: JAX detects the cluster (TPU pod, SLURM, Open MPI)."""
  monkeypatch.setenv('ADA_DISTRIBUTED', '1')
  multihost.init_distributed()
  assert calls == [((), {})]


def test_explicit_variables_are_passed_on(calls, monkeypatch):
  _set(monkeypatch, EXPLICIT)
  multihost.init_distributed()
  assert calls == [
    (
      (),
      {'coordinator_address': 'node0:12345', 'num_processes': 4, 'process_id': 3},
    )
  ]
  # On CPU (the tests' platform) the processes talk over gloo.
  assert jax.config.jax_cpu_collectives_implementation == 'gloo'


def test_explicit_wins_over_ada_distributed(calls, monkeypatch):
  """Both set: the explicit addresses, not auto-detection (README, Multi-node GPU)."""
  _set(monkeypatch, {**EXPLICIT, 'ADA_DISTRIBUTED': '1'})
  multihost.init_distributed()
  assert len(calls) == 1
  assert calls[0][1]['coordinator_address'] == 'node0:12345'
  assert calls[0][1]['process_id'] == 3


def test_explicit_ipv6_coordinator_is_accepted():
  env = {**EXPLICIT, 'ADA_COORDINATOR': '[fd00::1]:8476'}
  assert multihost.distributed_init_kwargs(env)['coordinator_address'] == (
    '[fd00::1]:8476'
  )


@pytest.mark.parametrize(
  'env,message',
  [
    (
      {'ADA_COORDINATOR': 'node0:12345'},
      'ADA_COORDINATOR set but ADA_NUM_PROCESSES, ADA_PROCESS_ID not',
    ),
    (
      {'ADA_COORDINATOR': 'node0:12345', 'ADA_NUM_PROCESSES': '2'},
      'ADA_COORDINATOR, ADA_NUM_PROCESSES set but ADA_PROCESS_ID not',
    ),
    (
      {'ADA_PROCESS_ID': '0', 'ADA_DISTRIBUTED': '1'},
      'ADA_PROCESS_ID set but ADA_COORDINATOR, ADA_NUM_PROCESSES not',
    ),
    ({**EXPLICIT, 'ADA_NUM_PROCESSES': 'four'}, "ADA_NUM_PROCESSES='four'"),
    ({**EXPLICIT, 'ADA_NUM_PROCESSES': '0'}, "ADA_NUM_PROCESSES='0'"),
    ({**EXPLICIT, 'ADA_PROCESS_ID': '1.5'}, "ADA_PROCESS_ID='1.5'"),
    ({**EXPLICIT, 'ADA_PROCESS_ID': '4'}, "ADA_PROCESS_ID='4'"),
    ({**EXPLICIT, 'ADA_PROCESS_ID': '-1'}, "ADA_PROCESS_ID='-1'"),
    ({**EXPLICIT, 'ADA_COORDINATOR': 'node0'}, "ADA_COORDINATOR='node0'"),
    ({**EXPLICIT, 'ADA_COORDINATOR': ':12345'}, "ADA_COORDINATOR=':12345'"),
    ({**EXPLICIT, 'ADA_COORDINATOR': 'node0:http'}, "ADA_COORDINATOR='node0:http'"),
    ({**EXPLICIT, 'ADA_COORDINATOR': 'node0:70000'}, "ADA_COORDINATOR='node0:70000'"),
    ({'ADA_DISTRIBUTED': 'true'}, "ADA_DISTRIBUTED='true'"),
  ],
)
def test_bad_values_fail_in_one_line_naming_the_variable(
  calls, monkeypatch, env, message
):
  _set(monkeypatch, env)
  with pytest.raises(ValueError) as e:
    multihost.init_distributed()
  text = str(e.value)
  assert text.startswith(message), text
  assert '\n' not in text
  assert calls == []  # Nothing joined before the error.


def test_process_id_range_names_the_count():
  with pytest.raises(ValueError, match=r'in \[0, 4\)'):
    multihost.distributed_init_kwargs({**EXPLICIT, 'ADA_PROCESS_ID': '4'})
