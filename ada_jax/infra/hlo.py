"""Reading a compiled program's HLO text: its collectives, where they run.

`analyze_hlo(compiled.as_text(), mesh, state)` lists every collective of a
compiled program with its mesh axes, whether it sits inside the program's
main `while` loop (a decode round: once per generated token) and whether it
all-gathers a weight (recognised by shape among the params' gathered
forms); `summarize` counts them. The layout checks (tests/test_layouts.py),
the reshard benchmark and the memory work use it with
`sampler.decode_round_hlo`. XLA's HLO text is not a stable API: the parser
reads the three device-group forms XLA prints today and reports '?' axes for
any other.

What it shows for the decode round: with FSDP-sharded weights the SPMD
partitioner either all-gathers the weights inside the decode loop, once per
generated token (the tiny model with S=256 slots: 13 weight all-gathers over
fsdp per token), or, with few slots (S=64), keeps the weights sharded and
moves the activations over fsdp at every token instead. XLA:CPU then hoists
the loop-invariant weight gathers out of the loop, which keeps a second,
gathered copy of the weights for the whole round (other pipelines may not
hoist); compiling without that pass (`LICM_PASS`) shows where the
partitioner put each gather, i.e. what it asks to run per token. The
sampling layout needs neither: no weight all-gather anywhere in the round,
and across the slots' axes the loop only agrees on when to stop (scalars).

`weight_converts(text, state)` lists the element-type conversions of
weight-shaped arrays (a weight shard's per-device shape) and whether each
runs inside the decode loop: with fp32 params and bf16 compute, XLA hoists a
bf16 convert of every weight out of the loop (a second copy of the weights
for the whole round), which a bf16 sampling copy (`Resharder(...,
dtype=jnp.bfloat16)`) avoids. XLA:CPU has no bf16 matmul: it computes bf16
dots in fp32 and converts bf16 weights back up (bf16 -> f32), hoisted too;
TPU's MXU takes bf16 operands, so that conversion is a CPU artifact.

Dimension legend: none (text analysis).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

# The XLA pass that hoists loop invariants; `sampler.decode_round_hlo` can
# disable it to show where the partitioner placed each gather.
LICM_PASS = 'while-loop-invariant-code-motion'
_COLLECTIVES = (
  'all-gather',
  'all-reduce',
  'reduce-scatter',
  'all-to-all',
  'collective-permute',
)


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


def _decode_loop(comps: dict[str, list[str]]) -> set[str]:
  """The computations of the program's main while loop (body, condition, callees).

  The decode loop is the `while` whose body (with everything it calls) is
  largest; the sampler's other loops (threefry, the slot gather's ring) are
  a few ops each.
  """
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
  return max(loops, key=lambda c: sum(len(comps[n]) for n in c))


def analyze_hlo(hlo: str, mesh: Mesh, state: nnx.State) -> list[Collective]:
  """Every collective of a compiled decode program, located and classified.

  The decode loop is found by `_decode_loop`.

  Args:
    hlo: `compiled.as_text()` of the round program.
    mesh: the mesh it was compiled for (logical device i = mesh.devices.flat[i]).
    state: the params it was compiled with (concrete or ShapeDtypeStructs
      with shardings), to recognise weight all-gathers by shape.
  """
  comps = _computations(hlo)
  loop = _decode_loop(comps)
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


@dataclasses.dataclass(frozen=True)
class Convert:
  """One element-type conversion of a weight-shaped array.

  Attributes:
    source: operand element type as HLO prints it ('f32', 'bf16', ...).
    target: result element type.
    shape: per-device shape (a weight shard's).
    in_loop: inside the decode loop (runs once per generated token); outside
      it, the converted array is held for the whole round.
  """

  source: str
  target: str
  shape: tuple[int, ...]
  in_loop: bool


_INSTRUCTION = re.compile(
  r'^\s*(?:ROOT )?%?([\w.\-]+) = (\w+)\[([\d,]*)\]\S* ([\w\-]+)\((.*)$'
)


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
  """Without size-1 dims (bitcasts add and drop them freely)."""
  return tuple(d for d in shape if d != 1)


def weight_converts(hlo: str, state: nnx.State) -> list[Convert]:
  """Every element-type convert of a weight-shaped array in a compiled program.

  A convert counts when its result has the per-device shape of a weight
  shard of `state` (leaves of 2+ dims; size-1 dims ignored). Activations of
  the same shape would count too; the decode round has none (its activations
  are [S/dp, ...]).

  Args:
    hlo: `compiled.as_text()` of a decode round.
    state: the params it was compiled with (concrete or ShapeDtypeStructs
      with shardings).
  """
  weights = {
    _squeezed(x.sharding.shard_shape(tuple(x.shape)))
    for x in jax.tree.leaves(state)
    if len(x.shape) >= 2
  }
  comps = _computations(hlo)
  loop = _decode_loop(comps)
  out = []
  for name, lines in comps.items():
    types = {}
    parsed = []
    for line in lines:
      m = _INSTRUCTION.match(line)
      if m:
        types[m.group(1)] = m.group(2)
        parsed.append(m)
    for m in parsed:
      if m.group(4) != 'convert':
        continue
      shape = tuple(int(v) for v in m.group(3).split(',') if v)
      if _squeezed(shape) not in weights:
        continue
      operand = re.match(r'%?([\w.\-]+)', m.group(5))
      source = types.get(operand.group(1), '?') if operand else '?'
      out.append(Convert(source, m.group(2), shape, name in loop))
  return out
