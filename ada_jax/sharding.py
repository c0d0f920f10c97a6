"""The policy's layouts on the mesh, and a model born in one.

The public sharding API (`ada_jax.sharding.make_mesh`,
`create_sharded_model`): the mesh machinery itself is `infra.mesh`,
re-exported here; this module adds what depends on the model, the rule
tables from its logical axes to mesh axes:

  TRAIN_RULES: weights split on fsdp x tensor (memory for the update);
  SAMPLE_RULES: weights split on tensor only, replicated over data/fsdp,
                because decoding from FSDP-sharded weights all-gathers
                every weight at every generated token.

`infra.resharder.Resharder(mesh, SAMPLE_RULES)` moves params between the
two, checked by a checksum.
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
from flax import nnx
from jax.sharding import Mesh

from ada_jax import model as model_lib
from ada_jax.infra.mesh import (
  BATCH_AXES,
  MESH_AXES,
  batch_sharding,
  data_parallel_size,
  logical_to_spec,
  make_mesh,
  replicated,
  state_shardings,
)

__all__ = [
  'BATCH_AXES',
  'MESH_AXES',
  'SAMPLE_RULES',
  'TRAIN_RULES',
  'abstract_model',
  'batch_sharding',
  'create_sharded_model',
  'data_parallel_size',
  'logical_to_spec',
  'make_mesh',
  'replicated',
  'state_shardings',
]

TRAIN_RULES: dict[str, str | None] = {
  model_lib.VOCAB: 'tensor',
  model_lib.EMBED: 'fsdp',
  model_lib.Q_HEADS: 'tensor',
  model_lib.KV_HEADS: 'tensor',
  model_lib.HEAD_DIM: None,
  model_lib.MLP: 'tensor',
  model_lib.NORM: None,
}
SAMPLE_RULES: dict[str, str | None] = {**TRAIN_RULES, model_lib.EMBED: None}


def abstract_model(
  config: model_lib.ModelConfig,
  mesh: Mesh,
  rules: Mapping[str, str | None] = TRAIN_RULES,
) -> tuple[nnx.GraphDef, nnx.State]:
  """(graphdef, params as ShapeDtypeStructs with their shardings): no memory.

  The restore target of a checkpoint (params land straight in `rules`'
  layout) and the skeleton of a born-sharded model.
  """
  abstract = nnx.eval_shape(lambda: model_lib.Transformer(config, rngs=nnx.Rngs(0)))
  graphdef, abs_state = nnx.split(abstract)
  shardings = state_shardings(abs_state, mesh, rules)
  target = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
    abs_state,
    shardings,
  )
  return graphdef, target


def create_sharded_model(
  config: model_lib.ModelConfig,
  mesh: Mesh,
  rules: Mapping[str, str | None] = TRAIN_RULES,
  seed: int = 0,
) -> model_lib.Transformer:
  """A random model born sharded: eval_shape, then init under jit with out_shardings."""
  graphdef, target = abstract_model(config, mesh, rules)
  shardings = jax.tree.map(lambda x: x.sharding, target)

  def init():
    return nnx.state(model_lib.Transformer(config, rngs=nnx.Rngs(seed)))

  return nnx.merge(graphdef, jax.jit(init, out_shardings=shardings)())
