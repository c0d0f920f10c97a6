"""The package's import graph: no cycles, no upward edges, no JAX below it.

Every import of every module of ada_jax counts, those inside functions too
(a lazy import hides a dependency, it does not remove it). The rules are
written once, here, as layers: a module may import its own layer and the
layers listed for it, nothing else.

  infra            the ground floor: only infra
  adaptive         the controller: only itself, and no JAX
  verifier         the reward: only itself, and no JAX
  policy           model, hf, tokenizer, prompts, sampler, sharding, data,
                   datasets, hub_ids: policy and infra
  planner          memory, step time, chips: policy, adaptive, infra
  rl               rollout, scoring, loss, update, trainer, fit: policy,
                   adaptive, verifier, infra
  boundary         from_config, config_rules: all of the above
  commands         main, evaluate, export, plan, sweep, select_prompts, stage:
                   the boundary and below, never another command
"""

import ast
import collections
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / 'ada_jax'
POLICY = {'model', 'hf', 'tokenizer', 'prompts', 'sampler', 'sharding', 'data'}
POLICY |= {'datasets', 'attention', 'hub_ids'}
COMMANDS = {'main', 'evaluate', 'export', 'plan', 'sweep', 'select_prompts', 'stage'}
BOUNDARY = {'from_config', 'config_rules'}
ALLOWED = {
  'infra': {'infra'},
  'adaptive': {'adaptive'},
  'verifier': {'verifier'},
  'policy': {'policy', 'infra'},
  'rl': {'rl', 'policy', 'adaptive', 'verifier', 'infra'},
  'planner': {'planner', 'policy', 'adaptive', 'infra'},
  'boundary': {'boundary', 'rl', 'planner', 'policy', 'adaptive', 'verifier', 'infra'},
  'commands': {'boundary', 'rl', 'planner', 'policy', 'adaptive', 'verifier', 'infra'},
}
NO_JAX = {'adaptive', 'verifier'}
JAX_FAMILY = ('jax', 'jaxlib', 'flax', 'optax', 'orbax')


def modules() -> dict[str, pathlib.Path]:
  """Dotted name -> file, for every module of the package."""
  out = {}
  for path in sorted(PACKAGE.rglob('*.py')):
    parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
    name = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
    out[name] = path
  return out


MODULES = modules()


def layer(name: str) -> str:
  """The layer of a dotted module name (ada_jax itself: its own)."""
  parts = name.split('.')
  if len(parts) == 1:
    return 'root'
  top = parts[1]
  if top in ('infra', 'adaptive', 'verifier', 'rl', 'planner'):
    return top
  if top in POLICY:
    return 'policy'
  if top in BOUNDARY:
    return 'boundary'
  if top in COMMANDS:
    return 'commands'
  raise AssertionError(f'{name}: no layer (add it to tests/test_architecture.py)')


def imports(path: pathlib.Path) -> list[tuple[str, int]]:
  """(imported module, line) for every import in the file, nested ones too.

  `from pkg import name` counts as importing `pkg.name` when that is a
  module of ours, else `pkg`.
  """
  found = []
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      found += [(a.name, node.lineno) for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      for a in node.names:
        sub = f'{node.module}.{a.name}'
        found.append((sub if sub in MODULES else node.module, node.lineno))
  return found


def graph() -> dict[str, set[str]]:
  edges = collections.defaultdict(set)
  for name, path in MODULES.items():
    for target, _ in imports(path):
      if target.startswith('ada_jax') and target != name:
        edges[name].add(target)
  return edges


def test_every_module_has_a_layer():
  for name in MODULES:
    if name != 'ada_jax':
      layer(name)


def test_no_import_cycles():
  edges = graph()
  # Depth-first search; a back edge is a cycle.
  state, stack_path = {}, []

  def visit(node):
    state[node] = 'open'
    stack_path.append(node)
    for nxt in sorted(edges.get(node, ())):
      if state.get(nxt) == 'open':
        cycle = [*stack_path[stack_path.index(nxt) :], nxt]
        pytest.fail('import cycle: ' + ' -> '.join(cycle))
      if nxt not in state:
        visit(nxt)
    stack_path.pop()
    state[node] = 'done'

  for node in sorted(MODULES):
    if node not in state:
      visit(node)


def test_imports_point_down():
  bad = []
  for name, path in MODULES.items():
    if name == 'ada_jax':
      continue
    mine = layer(name)
    for target, line in imports(path):
      if not target.startswith('ada_jax.'):
        continue
      theirs = layer(target)
      if theirs not in ALLOWED[mine]:  # Commands never import each other.
        bad.append(
          f'{path.relative_to(PACKAGE.parent)}:{line}: {mine} -> {theirs} ({target})'
        )
  assert not bad, '\n'.join(bad)


def test_controller_and_verifier_import_no_jax():
  bad = [
    f'{path.relative_to(PACKAGE.parent)}:{line}: {target}'
    for name, path in MODULES.items()
    if name != 'ada_jax' and layer(name) in NO_JAX
    for target, line in imports(path)
    if target.split('.')[0] in JAX_FAMILY
  ]
  assert not bad, '\n'.join(bad)


def test_the_rules_catch_an_upward_edge(tmp_path):
  """The checker itself: a planted infra -> rl import is reported."""
  planted = tmp_path / 'planted.py'
  planted.write_text('def f():\n  from ada_jax.rl import trainer\n')
  ((target, line),) = imports(planted)
  assert target == 'ada_jax.rl.trainer' and line == 2
  assert layer(target) not in ALLOWED[layer('ada_jax.infra.metrics')]
