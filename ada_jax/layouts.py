"""Training vs sampling layout: the per-step reshard, its checksum, and the HLO proof.

The params live in the training layout (EMBED on fsdp, heads/MLP/vocab on
tensor). Before the rounds of a step they are copied into the sampling
layout (replicated over data and fsdp, tensor only) by one jitted identity
with `out_shardings` (`Resharder`). A weight sync that silently scrambles
shards makes "coherent garbage" samples with no error, so every reshard is
checked: a bit-exact checksum of the training params and of the resharded
copy, computed on device in one call, must match; it is logged at INFO and a
mismatch raises.

Why reshard at all, from the compiled decode round (`decode_hlo`,
`analyze_hlo`; benchmarks/reshard.py prints the counts): with FSDP-sharded
weights the SPMD partitioner either all-gathers the weights inside the
decode loop, once per generated token (the tiny model with S=256 slots: 13
weight all-gathers over fsdp per token), or, with few slots (S=64), keeps
the weights sharded and moves the activations over fsdp at every token
instead. XLA:CPU then hoists the loop-invariant weight gathers out of the
loop, which keeps a second, gathered copy of the weights for the whole round
(other pipelines may not hoist). The sampling layout needs neither: no
weight all-gather anywhere in the round, and across the slots' axes the loop
only agrees on when to stop (scalars). `hoist_invariants=False` compiles
without XLA's while-loop invariant code motion, so the HLO shows where the
partitioner put each gather, i.e. what it asks to run per token.

Dimension legend: S slots, N new tokens, D model dim, F MLP dim, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from ada_jax import model as model_lib
from ada_jax import sampler
from ada_jax import sharding as sharding_lib

_LICM_PASS = 'while-loop-invariant-code-motion'
_COLLECTIVES = (
  'all-gather',
  'all-reduce',
  'reduce-scatter',
  'all-to-all',
  'collective-permute',
)


# Checksums.


def _leaf_checksum(x: jax.Array) -> jax.Array:
  """uint32 sum of the leaf's bit patterns weighted by odd positions.

  Integer sums wrap exactly in any reduction order, so any sharding of the
  same values gives the same number; the position weights catch shards that
  land in the wrong place, which a plain sum would not.
  """
  unsigned = {1: jnp.uint8, 2: jnp.uint16}.get(x.dtype.itemsize, jnp.uint32)
  words = jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32).reshape(-1)
  weights = jax.lax.iota(jnp.uint32, words.size) * jnp.uint32(2) + jnp.uint32(1)
  return jnp.sum(words * weights, dtype=jnp.uint32)


def _tree_checksum(tree) -> jax.Array:
  leaves = jax.tree.leaves(tree)
  sums = [_leaf_checksum(x) * jnp.uint32(2 * i + 1) for i, x in enumerate(leaves)]
  return functools.reduce(jnp.add, sums, jnp.uint32(0))


@jax.jit
def _pair_checksums(a, b) -> tuple[jax.Array, jax.Array]:
  return _tree_checksum(a), _tree_checksum(b)


def checksum(tree) -> int:
  """Layout-independent uint32 checksum of a pytree of arrays."""
  return int(jax.device_get(jax.jit(_tree_checksum)(tree)))


class ReshardError(RuntimeError):
  """The resharded params differ from the training params."""


class Resharder:
  """Params from their (training) layout into `rules`' layout, one jitted call.

  The output shardings are derived on the first call and the jitted copy is
  reused, so a run compiles it (and its checksum) once.
  """

  def __init__(
    self,
    mesh: Mesh,
    rules: Mapping[str, str | None] = sharding_lib.SAMPLE_RULES,
    *,
    check: bool = True,
    name: str = 'sampling',
  ):
    self.mesh, self.rules, self.check, self.name = mesh, rules, check, name
    self._copy = None

  def __call__(self, state: nnx.State) -> nnx.State:
    """The same values in the target layout; raises ReshardError on a mismatch."""
    if self._copy is None:
      shardings = sharding_lib.state_shardings(state, self.mesh, self.rules)
      self._copy = jax.jit(lambda s: s, out_shardings=shardings)
    out = self._copy(state)
    if self.check:
      before, after = (int(v) for v in jax.device_get(_pair_checksums(state, out)))
      if before != after:
        raise ReshardError(
          f'resharded params to {self.name} layout: checksum {before:08x} != '
          f'{after:08x}; the copy is corrupt'
        )
      logging.info(
        'resharded params to %s layout: checksum %08x == %08x',
        self.name,
        before,
        after,
      )
    return out


# HLO inspection.


@dataclasses.dataclass(frozen=True)
class Collective:
  """One collective of a compiled program.

  Attributes:
    op: 'all-gather', 'all-reduce', 'reduce-scatter', 'all-to-all' or
      'collective-permute'.
    shape: per-device result shape.
    axes: mesh axes its device groups span ('?' when the groups are in a
      format this parser does not read).
    in_loop: inside the decode loop (runs once per generated token).
    weight: an all-gather whose result is a gathered form of a weight.
  """

  op: str
  shape: tuple[int, ...]
  axes: tuple[str, ...]
  in_loop: bool
  weight: bool


def _computations(hlo: str) -> dict[str, list[str]]:
  comps: dict[str, list[str]] = {}
  current = None
  for line in hlo.splitlines():
    head = re.match(r'^(?:ENTRY )?%?([\w.\-]+) \(.*\{\s*$', line)
    if head:
      current = head.group(1)
      comps[current] = []
    elif line.startswith('}'):
      current = None
    elif current is not None:
      comps[current].append(line)
  return comps


def _callees(line: str) -> list[str]:
  refs = re.findall(
    r'(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)',
    line,
  )
  for group in re.findall(r'branch_computations=\{([^}]*)\}', line):
    refs += [x.strip().lstrip('%') for x in group.split(',')]
  return refs


def _closure(comps: dict[str, list[str]], roots: Sequence[str]) -> set[str]:
  seen: set[str] = set()
  todo = list(roots)
  while todo:
    name = todo.pop()
    if name in seen or name not in comps:
      continue
    seen.add(name)
    for line in comps[name]:
      todo += _callees(line)
  return seen


def _device_groups(line: str, n: int) -> list[list[int]] | None:
  """Logical device groups of a collective line; None if unreadable."""
  m = re.search(r'(?:replica_groups|source_target_pairs)=(\{(?:\{[\d,]*\},?)*\})', line)
  if m:
    return [
      [int(v) for v in g.split(',') if v]
      for g in re.findall(r'\{([\d,]*)\}', m.group(1))
    ]
  m = re.search(r'replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?', line)
  if m:
    dims = [int(v) for v in m.group(3).split(',')]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if m.group(4):
      ids = ids.transpose([int(v) for v in m.group(4).split(',')])
    return ids.reshape(int(m.group(1)), int(m.group(2))).tolist()
  # mesh[axes] [, device_ids=([dims]T(perm))] {chosen axes}: groups vary the
  # chosen axes of a mesh laid over the (optionally permuted) device iota.
  m = re.search(
    r'replica_groups=mesh\[([^\]]*)\]'
    r'(?:, device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\))? \{([^}]*)\}',
    line,
  )
  if m:
    names = re.findall(r"'(\w+)'=(\d+)", m.group(1))
    sizes = [int(s) for _, s in names]
    if math.prod(sizes) != n:
      return None
    ids = np.arange(n)
    if m.group(2):
      dims = [int(v) for v in m.group(2).split(',')]
      ids = ids.reshape(dims)
      if m.group(3):
        ids = ids.transpose([int(v) for v in m.group(3).split(',')])
    chosen = [i for i, (a, _) in enumerate(names) if f"'{a}'" in m.group(4)]
    rest = [i for i in range(len(names)) if i not in chosen]
    ids = ids.reshape(sizes).transpose(rest + chosen)
    return ids.reshape(-1, math.prod(sizes[i] for i in chosen)).tolist()
  return None


def _axes(groups: list[list[int]] | None, mesh: Mesh) -> tuple[str, ...]:
  """Mesh axes along which the devices of some group differ."""
  if groups is None:
    return ('?',)
  shape = mesh.devices.shape
  varying: set[int] = set()
  for g in groups:
    coords = np.stack(np.unravel_index(np.asarray(g, np.int64), shape), axis=1)
    varying |= {a for a in range(len(shape)) if len(set(coords[:, a])) > 1}
  return tuple(mesh.axis_names[a] for a in sorted(varying))


def _gathered_forms(state: nnx.State) -> set[tuple[int, ...]]:
  """Shapes an all-gather of some weight could produce (some dims regathered)."""
  forms: set[tuple[int, ...]] = set()
  for x in jax.tree.leaves(state):
    full = tuple(x.shape)
    local = tuple(x.sharding.shard_shape(full))
    options = [sorted({a, b}) for a, b in zip(local, full, strict=True)]
    for shape in _product(options):
      if shape != local:
        forms.add(shape)
  return forms


def _product(options: list[list[int]]) -> list[tuple[int, ...]]:
  out: list[tuple[int, ...]] = [()]
  for opts in options:
    out = [(*prefix, o) for prefix in out for o in opts]
  return out


def analyze_hlo(hlo: str, mesh: Mesh, state: nnx.State) -> list[Collective]:
  """Every collective of a compiled decode program, located and classified.

  The decode loop is the `while` whose body (with everything it calls) is
  largest; the sampler's other loops (threefry) are a few ops each.

  Args:
    hlo: `compiled.as_text()` of the round program.
    mesh: the mesh it was compiled for (logical device i = mesh.devices.flat[i]).
    state: the params it was compiled with (concrete or ShapeDtypeStructs
      with shardings), to recognise weight all-gathers by shape.
  """
  comps = _computations(hlo)
  bodies = []
  for lines in comps.values():
    for line in lines:
      m = re.search(r' while\(.*body=%?([\w.\-]+)', line)
      if m:
        cond = re.search(r'condition=%?([\w.\-]+)', line)
        bodies.append([m.group(1)] + ([cond.group(1)] if cond else []))
  if not bodies:
    raise ValueError('no while loop in this HLO: not a decode program')
  loops = [_closure(comps, b) for b in bodies]
  loop = max(loops, key=lambda c: sum(len(comps[n]) for n in c))
  forms = _gathered_forms(state)
  pattern = re.compile(
    r'^\s*(?:ROOT )?%?[\w.\-]+ = \(?(\w+)\[([\d,]*)\][^ ]* ('
    + '|'.join(_COLLECTIVES)
    + r')(?:-start)?\('
  )
  out = []
  for name, lines in comps.items():
    for line in lines:
      m = pattern.match(line)
      if not m:
        continue
      shape = tuple(int(v) for v in m.group(2).split(',') if v)
      op = m.group(3)
      out.append(
        Collective(
          op=op,
          shape=shape,
          axes=_axes(_device_groups(line, mesh.size), mesh),
          in_loop=name in loop,
          weight=op == 'all-gather' and shape in forms,
        )
      )
  return out


def decode_hlo(
  model: model_lib.Transformer,
  *,
  slots: int,
  prompts: int,
  prompt_len: int,
  max_new_tokens: int,
  hoist_invariants: bool = True,
) -> str:
  """The compiled HLO text of one decode round for the model's current layout.

  A dummy prompt batch is prefilled so that the prompt cache has the
  shardings a run gives it; the round is then lowered exactly as
  `sampler.sample_round` calls it.

  Args:
    model: the policy, in the layout to inspect.
    slots: S.
    prompts: B, prompts of the step.
    prompt_len: P, the prompt bucket.
    max_new_tokens: N.
    hoist_invariants: False compiles without XLA's while-loop invariant code
      motion (see the module docstring).
  """
  tokens = np.ones((prompts, prompt_len), np.int32)
  cache = sampler.prefill(model, tokens, np.ones_like(tokens))
  lowered = sampler.lower_round(
    model, cache, slots=slots, max_new_tokens=max_new_tokens
  )
  options = None if hoist_invariants else {'xla_disable_hlo_passes': _LICM_PASS}
  return lowered.compile(compiler_options=options).as_text()


def summarize(collectives: Sequence[Collective]) -> dict[str, int]:
  """Counts: weight all-gathers in/outside the loop, loop collectives by axes."""
  out = {
    'loop_weight_all_gathers': sum(c.weight and c.in_loop for c in collectives),
    'round_weight_all_gathers': sum(c.weight and not c.in_loop for c in collectives),
  }
  for c in collectives:
    if c.in_loop:
      key = f'loop_{c.op}_over_{"+".join(c.axes) or "none"}'
      out[key] = out.get(key, 0) + 1
  return out
