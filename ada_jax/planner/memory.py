"""Per-device HBM plan of one RL step, from shapes and shardings alone.

No accelerator and no weights are needed: parameter shapes come from
`nnx.eval_shape` on the model constructor, their per-device shards from
`sharding.logical_to_spec` on an `AbstractMesh` of the pod's device count,
and every other buffer from the step's fixed shapes (B, P, N, S, M, R, m).
`ada_jax/plan.py` is the command line; `ada_jax.plan.compiled_phases` compiles the real
programs for the same shapes (the oracle, `plan --check`); the chips and the
paper models are `planner.chips` and `planner.models`.

What is alive when (ada_jax/rl/trainer.py). The training params (fp32
master, fsdp x tensor) and the AdamW moments live all run. Phases of a
training run:

  reshard:    `infra.resharder.Resharder`'s copy of the training params into
              the sampling copy (cast to the compute dtype, gathered over
              fsdp, split over tensor only): the training params in, the
              copy out, and the gathers' staging buffers;
  prefill:    the sampling copy, the B prompts [B, P] (rows over data x
              fsdp) and `sampler.prefill`'s program: the layers' forward
              over the device's B / (data x fsdp) x P prompt tokens, one
              layer at a time (nothing but the K and V it writes into the
              prompt cache, its output, outlives a layer), so its
              temporaries do not grow with depth;
  sampling:   the sampling copy (compute dtype, tensor only), the prompt
              cache [B, P], the rollout buffer [M, S, N] and one round
              program (`sampler._round_jit`: the KV cache carried by the
              decode loop, [S/m, P] prompt keys per group of m slots and
              [S, N] own keys (attention='dense': [S, P+N]), the prompt
              cache all-gathered over the data axes for the slot gather,
              per-token temporaries);
  old_logp:   the training batch [C, m, ...] (rows split over data x fsdp)
              and `update.logp_jit`: one micro-batch's forward at a time;
              the sampling copy is freed before it;
  update:     the batch, `rl_update`'s gradient accumulator, the optimizer's
              temporaries, the fsdp-gathered weights and one micro-batch's
              activations (m / (data x fsdp) rows per device);
  pass_rates: the trainer's own evaluation and pass-rate histogram
              (`trainer._score`: S // k prompts prefilled per chunk, then
              their round of S slots; the larger of the two programs).

Commands without the training state (their own verdicts):
  evaluation: `python -m ada_jax.evaluate`: the params restored in the
              training layout and copied into the sampling layout in the
              compute dtype (`from_config.policy`), S prompts per
              chunk (their prefill, all S at once, is often the larger
              program: its temporaries grow with S, not with depth), S
              slots, the evaluation's new tokens (k samples run one after
              another: k does not change the memory);
  selection:  `python -m ada_jax.select_prompts`: the same at the config's
              new tokens.

The activation and temporary terms are bytes per element of each array,
fitted to XLA's buffer assignment of the compiled programs (XLA:CPU, fake
devices; `benchmarks/plan_calibration.py` prints the full matrix of meshes,
remat and attention modes and doublings) and written in the compute dtype's
bytes a so they carry over to bf16. XLA:CPU says nothing certain about TPU
tiling (minor dims padded to 128 lanes, other fusions): read the plan as an
estimate there, and check it with `plan --check` on the TPU VM itself. At
paper scale on 32 fake CPU devices the plan matches the compiled programs
of the fp32 variants of the v5p-64 presets (plan / compiled, 1.5B:
sampling 1.02, update 0.96, old-logp 0.90; 7B: sampling 0.99; 1.5B on
v4-32's 16: sampling 0.99); bf16 ones compile larger on CPU (1.5B:
sampling 0.40, update 0.72), whose XLA has no native bf16 math and keeps
fp32 copies of bf16 buffers; TPU computes in bf16 (the plan's assumption).

On TPU (backend='tpu'; fitted to the TPU compiler's figures, FIT_TPU, and
checked against them without a chip: `plan --check --target tpu`,
`benchmarks/tpu_calibration.py`, tests/test_plan_tpu.py). Where libtpu's
buffer assignment differs from XLA:CPU's, the TPU plan follows it:
  round:      the slot gather's all-gathers (the B prompts' fp32 first-token
              logits [B, v], and each layer's prompt K and V [B, G, P, K],
              one layer's pair at a time) run before the empty response
              caches exist, so a round peaks either before its loop (the
              gathers and the prefixes) or in it: L layers' [S/m, G, P, K]
              prefixes and [S, G, N, K] response caches plus the token
              choice's fp32 [S, v] arrays (three; seven more with the top-p
              / top-k filter compiled, whose sort runs on whole rows with
              the slots moved over the tensor axis: `sampler._filter_sharding`);
  old_logp:   the fsdp all-gathers move each weight after its cast to the
              compute dtype (bf16), one layer's at a time; the pass peaks at
              the token lookup's gathered input embedding [v, D] (with one
              chunk of logits) or at a layer's weights and forward, the
              larger. With the vocab split over tensor and a micro-batch of
              fewer tokens than the table shard's rows, the partitioner
              leaves the weights in place and moves the activations;
  update:     as on CPU, but with untied embeddings the gathered weights
              are in the compute dtype (7B); tied ones stay fp32 (1.5B);
  prefill:    about 5.4 [n, D] activations per prompt token in the compute
              dtype (the residual stream, norms and the fp32 partial sums
              of the tensor-split projections) and 0.75 [n, f] ones (the
              MLP), n = B / (data x fsdp) x P; the same at 2, 4 and 28
              layers (0.91-1.10 plan / compiled over the paper configs'
              presets). It matters where the rows per device are many:
              Llama 3B at (1, 2, 8) on v4-32 holds 8.3 GiB of prefill
              temporaries at any depth, and an evaluation chunk of S = 4,096
              prompts eight times that (the chunk sizing is the every-pod
              issue's);
  reshard:    the gathers stage part of the copy (FIT_TPU's reshard terms:
              about 0.58 of it over 8 or more fsdp shards, the layers' copy
              over 2 or 4, nothing over 1). It holds the training params,
              the AdamW state, the copy and its staging at once: the step's
              peak where the copy is large beside the round (7B on v6e-64:
              23.7 GiB against a 23.6 GiB round).
Measured plan / TPU-compiled (tests/data/tpu_compiled.json, every phase of
the four paper configs on v4-32, v5p-64 and v6e-64 at the layouts the rule
picks, the rounds as the configs compile them and with the filter): at 2
layers the rounds 0.78-1.23 (0.82-1.18 with the filter), the old-logp pass
and the update 0.88-1.23, the reshard 1.00-1.09 (0.93-1.04 at full depth
on every pod); at full depth on v5p-64 0.95-1.01 (1.5B) and
0.96-1.12 (7B).
Programs compiled with memory to spare keep extra copies at small depths
(1.5B on v5p-64: 0.84 at 2 layers, 1.03 at 4); the plan counts the copies a
program needs.

Dimension legend:
  B: prompts per step     P: prompt bucket      N: max new tokens
  T: P + N                S: sampling slots     M: max rounds
  R: training rows        C: micro-batches      m: rows of a micro-batch
  b: rows of one micro-batch on one device (m / (data x fsdp))
  L: layers   D: hidden   H: query heads   G: KV heads   K: head dim
  F: MLP width            V: vocab
  h, g, f, v: H, G, F, V per device (split over tensor when they divide)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
from flax import nnx
from jax.sharding import AbstractMesh

from ada_jax import attention as attention_lib
from ada_jax import model as model_lib
from ada_jax import sampler
from ada_jax import sharding as sharding_lib

GIB = 1024**3


# One RL step: the verdict.
STEP_PHASES = ('reshard', 'prefill', 'sampling', 'old_logp', 'update')
TRAINING_PHASES = (*STEP_PHASES, 'pass_rates')  # With the resident state.
COMMAND_PHASES = ('evaluation', 'selection')


@dataclasses.dataclass(frozen=True)
class StepShapes:
  """The fixed shapes of one RL step (what the config decides)."""

  prompts: int  # B
  prompt_len: int  # P
  new_tokens: int  # N
  slots: int  # S
  max_rounds: int  # M
  rows: int  # R
  mini_batch_rows: int
  micro_batch_rows: int  # m
  eval_new_tokens: int = 0  # The evaluation's N (0: new_tokens).
  logit_chunk: int = 128  # update.UpdateSettings.logit_chunk
  histogram_k: int = 8  # Samples per prompt of the pass-rate histogram.
  greedy_eval: bool = False  # The trainer evaluates greedily (an eval split).
  # m: the RL rounds' slots per prompt group (ControllerSettings.slot_group):
  # the sampler holds and reads each prompt's keys once per m slots.
  slot_group: int = 1
  # The rounds compile the top-p / top-k filter (`sampler.needs_filter` of
  # the config's sampling knobs): its sort over the whole vocab.
  filter_logits: bool = True
  # W, slot waves: each RL round's S slots decoded in W waves of S/W
  # (`sampler.sample_round`'s `waves`): the round's KV cache, per-token
  # temporaries and outputs shrink W-fold; the prompt cache of all B
  # prompts, its all-gather for the slot gather and the rollout buffer
  # [M, S, N] do not.
  waves: int = 1
  # The commands (evaluate, select_prompts) sample from a copy of the params
  # in the compute dtype (`from_config.policy`); False: in the params' own
  # dtype, restored whole (before; the saved TPU rows were compiled so).
  command_cast: bool = True


@dataclasses.dataclass(frozen=True)
class Item:
  """One line of the plan: per-device bytes of one buffer (or group).

  `phase`: 'resident' (all of a training run) or one of TRAINING_PHASES /
  COMMAND_PHASES. `programs`: the phases whose compiled program holds it (as
  an argument, output or temporary); None: the item's own phase. What a
  phase holds outside its program (the rollout buffer during a round, the
  AdamW state during the old-logp pass) is in the phase total, not in the
  program's.
  """

  name: str
  phase: str
  bytes: int
  note: str = ''
  knob: str = ''  # the config key that shrinks it
  programs: tuple[str, ...] | None = None

  def in_program(self, phase: str) -> bool:
    return phase in (self.programs if self.programs is not None else (self.phase,))


@dataclasses.dataclass(frozen=True)
class Plan:
  """Per-device memory of a step; `peak` is the RL step's largest phase."""

  items: tuple[Item, ...]
  mesh: tuple[int, int, int]
  update_rows_per_device: int

  def phase_bytes(self, phase: str) -> int:
    """Bytes alive during a phase (training phases: with the resident state)."""
    keep = ('resident', phase) if phase in TRAINING_PHASES else (phase,)
    return sum(i.bytes for i in self.items if i.phase in keep)

  def program_bytes(self, phase: str) -> int:
    """The phase's compiled program: arguments + outputs + temporaries."""
    keep = ('resident', phase) if phase in TRAINING_PHASES else (phase,)
    return sum(i.bytes for i in self.items if i.phase in keep and i.in_program(phase))

  @property
  def phases(self) -> dict[str, int]:
    """The RL step's phases (what decides whether the step fits)."""
    return {p: self.phase_bytes(p) for p in STEP_PHASES}

  @property
  def peak_phase(self) -> str:
    return max(self.phases, key=self.phases.get)

  @property
  def peak(self) -> int:
    return self.phases[self.peak_phase]

  def get(self, name: str) -> int:
    """Bytes of the item called `name`."""
    return next(i.bytes for i in self.items if i.name == name)


def abstract_mesh(shape: tuple[int, int, int]) -> AbstractMesh:
  """A device-free mesh with axes ('data', 'fsdp', 'tensor')."""
  return AbstractMesh(tuple(shape), sharding_lib.MESH_AXES)


def resolve_mesh(mesh: Mapping[str, int], devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) with the -1 filled for `devices` devices."""
  shape = [int(mesh.get(a, 1)) for a in sharding_lib.MESH_AXES]
  known = math.prod(s for s in shape if s != -1)
  if shape.count(-1) > 1 or devices % known:
    raise ValueError(f'mesh {dict(mesh)} does not fit {devices} devices')
  shape = [devices // known if s == -1 else s for s in shape]
  if math.prod(shape) != devices:
    raise ValueError(f'mesh {shape} needs {math.prod(shape)} devices, have {devices}')
  return tuple(shape)


@functools.cache
def _param_shapes(
  config: model_lib.ModelConfig,
) -> tuple[tuple[str, tuple[int, ...], Any, tuple, int], ...]:
  """(name, shape, dtype, logical axes, copies) of every param.

  The blocks are identical, so one block is traced (eval_shape, no
  allocation) and counted L times: fast even for the 7B model.
  """
  one = dataclasses.replace(config, num_layers=1)
  abstract = nnx.eval_shape(lambda: model_lib.Transformer(one, rngs=nnx.Rngs(0)))
  out = []
  for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
    value = var.get_value()
    axes = var.get_metadata().get('axes') or (None,) * len(value.shape)
    copies = config.num_layers if path[0] == 'layers' else 1
    name = '/'.join(str(p) for p in path)
    out.append((name, tuple(value.shape), value.dtype, tuple(axes), copies))
  return tuple(out)


def count_params(config: model_lib.ModelConfig) -> int:
  """Number of parameters of the model."""
  return sum(math.prod(shape) * k for _, shape, _, _, k in _param_shapes(config))


def _param_bytes_by_name(
  config: model_lib.ModelConfig,
  mesh: tuple[int, int, int],
  rules: Mapping[str, str | None],
) -> list[tuple[str, int]]:
  """(name, per-device bytes over all layers) of every param in `rules`' layout."""
  amesh = abstract_mesh(mesh)
  out = []
  for name, shape, dtype, axes, copies in _param_shapes(config):
    spec = sharding_lib.logical_to_spec(axes, shape, amesh, rules, name)
    spec = tuple(spec) + (None,) * (len(shape) - len(spec))
    n = 1
    for dim, ax in zip(shape, spec, strict=True):
      n *= dim // (amesh.shape[ax] if ax else 1)
    out.append((name, n * jnp.dtype(dtype).itemsize * copies))
  return out


def param_bytes_per_device(
  config: model_lib.ModelConfig,
  mesh: tuple[int, int, int],
  rules: Mapping[str, str | None],
) -> int:
  """Per-device bytes of the params in the layout of `rules` (largest shard).

  Leaves of 2+ dims take `config.param_dtype`; 1-dim ones (norm scales,
  biases) keep theirs, as the sampling copy's cast does (`Resharder`).
  """
  return sum(b for _, b in _param_bytes_by_name(config, mesh, rules))


# Bytes per element (or multipliers) fitted to XLA's buffer assignment of the
# compiled programs: benchmarks/plan_calibration.py prints the matrix (and
# --fit refits these on its saved figures).
FIT: dict[str, float] = {
  # Gradients: the accumulator, one micro-batch's gradients and the
  # optimizer step's temporaries, in units of the training params.
  'grads': 2.0,
  # remat='block': bytes per [T, D] element (in units of a) each layer keeps.
  'block_kept': 2.0,
  # remat='block': layers of gathered weights alive at once.
  'weights_block': 2.0,
  # Copies of the KV cache the round keeps with one KV head per device and
  # dense decode attention (attention='dense'; the blockwise one keeps one).
  'kv_one_head': 1.8,
  # Dense attention: bytes per [h, T, T] element each layer keeps (remat
  # none), and the one recomputed layer's backward holds at its score peak
  # (remat block: fp32 scores, exponentials and their gradients; the plan
  # takes the larger of that and the layer's linear activations, as for
  # blockwise below).
  'dense_kept': 3.1,
  'dense_block': 13.2,
  # Blockwise attention (chunked, splash), remat none: the share of the
  # linear activations a layer keeps, bytes per [h, tq, tk] element kept per
  # layer and held by the one layer in its backward.
  'flash_linear': 0.56,
  'flash_blocks': 8.4,
  'flash_transient': 9.5,
  # Blockwise, remat block: the recomputed layer's backward peaks at one of
  # two points that do not overlap, and the plan takes the larger: its
  # linear activations (this share of them), or the attention backward's
  # fp32 score blocks (bytes per [h, tq, tk] element: about six fp32 arrays).
  # A sum of the two over-counts the change when T doubles at a fixed block
  # (2.47x at T = 384 -> 768); the max follows it (0.98-1.04 over T = 192 ..
  # 1,536 on (2, 2, 2), where the peak moves from the scores to the linear
  # activations between T = 512 and 1,536).
  'flash_block_linear': 1.0,
  'flash_block_scores': 24.0,
  # Old-logp (forward only): the share of one layer's linear activations,
  # bytes per score element of one layer (dense: two fp32 [h, T, T] arrays,
  # planned as the larger of these and the linear activations), and per
  # [T, h, K] element each unrolled blockwise layer keeps.
  'logp_linear': 0.56,
  'logp_dense': 8.4,
  'logp_flash': 5.0,
  'logp_flash_layer': 3.8,
  # Prefill (`sampler.prefill`: the B prompts' forward, one layer at a time,
  # writing the prompt cache): bytes per element (in units of a) of each
  # [n, D], [n, f] and [n, (h + 2g) K] activation alive at one layer's peak,
  # n = B / (data x fsdp) x P prompt tokens per device.
  'prefill_hidden': 1.0,
  'prefill_mlp': 3.5,
  'prefill_qkv': 1.0,
  # Reshard: the copy's temporaries in units of the sampling copy (fp32
  # tiny models on 8 devices: 0.57-0.66 of it on (1, 8, 1) and (2, 4, 1),
  # 0.89-1.26 with tensor 2; the plan's 1.0 keeps the program's total
  # within 0.90-1.19).
  'reshard': 1.0,
}

# The TPU compiler's (libtpu) buffer assignment differs from XLA:CPU's where
# the plan's target is 'tpu' (module doc, "On TPU"): bytes per element,
# fitted to the TPU-compiled paper programs at 1, 2 and 4 layers on v4-32,
# v5p-64 and v6e-64 (benchmarks/tpu_calibration.py; the saved figures are
# tests/data/tpu_compiled.json).
FIT_TPU: dict[str, float] = {
  # The token choice's temporaries of a round, fp32 per slot per entry of
  # the device's vocab shard: the scaled logits, their weights and the block
  # sums; the top-p / top-k filter's sort, its indices and cumulative sum on
  # top where the config turns it on.
  'choose_plain': 3.0,
  'choose_filter': 7.0,
  # Before the decode loop (the response cache not yet alive) two gathers
  # for the slot gather: the B prompts' first-token logits (fp32 [B, v]) and
  # one layer's prompt K and V. The larger is alive whole; the scheduler
  # keeps this share of the smaller beside it (none on 1.5B v6e-64 balance,
  # all of it on its DAPO preset's B = 1,024: a middle that keeps the
  # rounds of every saved row within 0.78-1.23).
  'gather_overlap': 0.4,
  # Old-logp: layers of fsdp-gathered compute-dtype weights alive at once.
  'logp_layers': 1.0,
  # Prefill, as FIT's prefill terms.
  'prefill_hidden': 5.4,
  'prefill_mlp': 0.75,
  'prefill_qkv': 0.4,
  # The same from params in their own dtype (fp32; the evaluate and
  # select_prompts commands): the casts change the fusions, fewer [n, D]
  # arrays and more [n, f] and q/k/v ones (fitted to their chunks' prefills
  # at 2 and 28 layers, 0.82-1.16).
  'prefill_own_hidden': 3.5,
  'prefill_own_mlp': 1.1,
  'prefill_own_qkv': 1.2,
  # Reshard (`Resharder`: each weight cast in the training layout, then
  # gathered over fsdp into the copy). The gathers' staging buffers, in
  # units of the copy's bytes, depend on how many ways they gather (measured
  # on the paper models at 2, 4 and full depth, fsdp 1 to 64, tensor 1 to
  # 8). Over 8 or more fsdp shards the scheduler stages about this share of
  # the copy at once at full depth (0.52-0.72), and never less than the
  # copy's embedding table and head (at 2 and 4 layers it stages the
  # gathered table whole, and nothing else):
  'reshard_wide': 0.58,
  # Over 2 or 4 shards it stages the layers' copy once (1.03-1.14 of the
  # copy at full depth), and the table and head beside it where the table
  # is whole (tensor 1) or untied; a tied table split over tensor is
  # gathered in place (Llama 3B at (1, 2, 8): 0.02 GiB at 2 layers). With
  # fsdp 1 nothing is gathered and the cast writes the copy itself. Plan /
  # compiled over the presets and 15 other layouts at 2, 4 and full depth
  # (tests/data/tpu_compiled.json): 0.85-1.09; the one layout left out is
  # 1.5B at (1, 8, 4) at full depth (1.28: its 2 KV heads do not divide
  # the tensor axis, a layout the rule never picks).
  'reshard_narrow': 1.0,
}


def _split(dim: int, ways: int) -> int:
  """Per-device size of a dim split `ways` ways (replicated if not dividing)."""
  return dim // ways if ways > 1 and dim % ways == 0 else dim


def _rows(rows: int, dp: int) -> int:
  """Rows per device of a [rows, ...] array split over data x fsdp when dividing."""
  return _split(rows, dp)


def micro_rows_per_device(micro: int, dp: int) -> int:
  """Rows of one micro-batch each device computes (update and old-logp pass).

  `rollout.assemble_batch` lays the batch out as [C, m, ...] with the m rows
  of every micro-batch split over data x fsdp; an m that does not divide is
  replicated (every device computes all of it).
  """
  return _split(micro, dp)


def _layer_params(c: model_lib.ModelConfig, w: int, tensor: int) -> int:
  """Bytes of one decoder layer's weights gathered over fsdp (split over tensor)."""
  h = _split(c.num_heads, tensor)
  g = _split(c.num_kv_heads, tensor)
  f = _split(c.intermediate_size, tensor)
  k, d = c.head_dim, c.hidden_size
  return w * (d * (h + 2 * g) * k + h * k * d + 3 * d * f)


def attention_impl(c: model_lib.ModelConfig, t: int, backend: str) -> str:
  """What `attention=` runs for a T-token training forward on `backend`."""
  return attention_lib.resolve(c.attention, t, t, backend, c.dtype, c.head_dim)


def _layer_bytes(
  c: model_lib.ModelConfig, t: int, tensor: int, impl: str
) -> tuple[int, int]:
  """(bytes per row one layer keeps for the backward, its backward transients).

  Per element of each activation, fitted to XLA's buffer assignment of the
  compiled update (fp32, a = 4) and written in the compute dtype's bytes a:
  the q/k/v projections with their fp32 RoPE copies (3a + 7 per element),
  the MLP's gate, up, silu and product (6a per [T, F] element), the residual
  stream and norms (4a per [T, D] element); dense attention keeps its fp32
  unnormalized softmax [H, T, T] (about 3 bytes per element, XLA reusing
  part of it, and as much again in the backward). Chunked and splash keep
  q, k, v, the output and the log-sum-exp (O(T), in the q/k/v term) and hold
  blocks of [tq, tk] fp32 scores (four arrays in the flash backward) for one
  layer at a time. With remat='block' the one recomputed layer's figure is
  the larger of its linear activations and its scores (blocks, or dense
  [H, T, T]), with no transient on top.
  """
  a = jnp.dtype(c.dtype).itemsize
  h = _split(c.num_heads, tensor)
  g = _split(c.num_kv_heads, tensor)
  f = _split(c.intermediate_size, tensor)
  kept = t * (h + 2 * g) * c.head_dim * (3 * a + 7) + 6 * a * t * f
  kept += 4 * a * t * c.hidden_size
  tq, _ = attention_lib.block_size(t, attention_lib.BLOCK_Q)
  tk, _ = attention_lib.block_size(t, attention_lib.BLOCK_K)
  if c.remat == 'block':
    # One recomputed layer at a time; its backward holds either its linear
    # activations or its attention's scores at the peak (FIT).
    if impl == 'dense':
      scores = FIT['dense_block'] * h * t * t
    else:
      scores = FIT['flash_block_scores'] * h * tq * tk
    return int(max(FIT['flash_block_linear'] * kept, scores)), 0
  if impl == 'dense':
    scores = FIT['dense_kept'] * h * t * t
    return int(kept + scores), int(scores)
  # Blockwise: per layer, XLA keeps a share of the linear activations and
  # ~`flash_blocks` bytes per [h, tq, tk] block element; the flash backward
  # holds a few fp32 blocks for one layer at a time.
  kept = FIT['flash_linear'] * kept + FIT['flash_blocks'] * h * tq * tk
  return int(kept), int(FIT['flash_transient'] * h * tq * tk)


def _logits_bytes(c: model_lib.ModelConfig, n: int, chunk: int, tensor: int) -> int:
  """Per row: fp32 logits of one response chunk, per-token fp32 arrays.

  About 4 copies of one chunk's logits (logits, log-softmax, its exp for the
  entropy, the gradient) and the log-probs, entropy and their gradients
  over all N tokens.
  """
  v = _split(c.vocab_size, tensor)
  return 16 * min(chunk, n) * v + 24 * n


def plan(
  config: model_lib.ModelConfig,
  shapes: StepShapes,
  mesh: tuple[int, int, int],
  *,
  kv_dtype: Any = None,
  backend: str = 'tpu',
) -> Plan:
  """The per-device memory of one RL step on a (data, fsdp, tensor) mesh.

  Args:
    config: the policy (its `attention` and `remat` fields included).
    shapes: the step's fixed shapes.
    mesh: (data, fsdp, tensor) sizes.
    kv_dtype: sampler KV-cache dtype (default: the compute dtype, as
      `sampler.prefill` does).
    backend: where it runs ('tpu', 'cpu', ...): `attention='auto'` resolves
      to splash on TPU and chunked elsewhere (both blockwise, planned alike);
      'tpu' plans the rounds and the old-logp pass as the TPU compiler
      assigns their buffers (FIT_TPU, the module doc's "On TPU"), any other
      backend as XLA:CPU does (FIT).
  """
  c, s = config, shapes
  tpu = backend == 'tpu'
  dp, tensor = mesh[0] * mesh[1], mesh[2]
  p, n = s.prompt_len, s.new_tokens
  t = p + n
  a = jnp.dtype(c.dtype).itemsize
  w = jnp.dtype(c.param_dtype).itemsize
  kv_bytes = jnp.dtype(kv_dtype or c.dtype).itemsize
  train = param_bytes_per_device(c, mesh, sharding_lib.TRAIN_RULES)
  sample = param_bytes_per_device(
    dataclasses.replace(c, param_dtype=c.dtype), mesh, sharding_lib.SAMPLE_RULES
  )
  sample_own = param_bytes_per_device(c, mesh, sharding_lib.SAMPLE_RULES)
  copy_layers = sum(
    b
    for name, b in _param_bytes_by_name(
      dataclasses.replace(c, param_dtype=c.dtype), mesh, sharding_lib.SAMPLE_RULES
    )
    if name.startswith('layers')
  )
  layer_g = _layer_params(c, w, tensor)
  layers_train = sum(
    b
    for name, b in _param_bytes_by_name(c, mesh, sharding_lib.TRAIN_RULES)
    if name.startswith('layers')
  )
  embed_g = w * _split(c.vocab_size, tensor) * c.hidden_size
  embed_g *= 1 if c.tie_embeddings else 2
  # AdamW mu and nu take the params' dtype and sharding; counts are scalars.
  opt = 2 * train

  # --- Reshard: the training params into the sampling copy (its output),
  # through the fsdp gathers' staging buffers (FIT_TPU's reshard terms).
  table = sample - copy_layers  # The copy's embedding table (and untied head).
  fsdp = mesh[1]
  if not tpu:
    reshard_tmp = int(FIT['reshard'] * sample)
  elif fsdp == 1:
    reshard_tmp = 0
  elif fsdp >= 8:
    reshard_tmp = int(max(table, FIT_TPU['reshard_wide'] * sample))
  else:
    whole = tensor == 1 or not c.tie_embeddings
    reshard_tmp = int(FIT_TPU['reshard_narrow'] * copy_layers) + (table if whole else 0)

  # --- Sampling: a round of S slots continuing B prompts.
  g_dev = _split(c.num_kv_heads, tensor)
  kv_layer = 2 * g_dev * c.head_dim * kv_bytes  # K and V, per token and layer
  v_dev = _split(c.vocab_size, tensor)

  def prompt_cache(b: int) -> int:
    b_dev = _rows(b, dp)
    return b_dev * (p * (c.num_layers * kv_layer + 1) + v_dev * 4 + 4)

  def prefill_program(b: int, own: bool = False) -> int:
    """Temporaries of the prefill of b prompts, and the prompts [b, P] in.

    One layer's forward over the device's b / dp prompts at a time (the
    layers write their K and V into the output cache, nothing else lives
    on): its activations per prompt token (hidden, MLP and q/k/v widths:
    `fit`), and the last tokens' fp32 logits [b, v]. own: from the params
    in their own dtype (the commands' restored params).
    """
    fit = FIT_TPU if tpu else FIT
    pre = 'prefill_own_' if own and tpu and w != a else 'prefill_'
    h_dev = _split(c.num_heads, tensor)
    width = fit[pre + 'hidden'] * c.hidden_size
    width += fit[pre + 'mlp'] * _split(c.intermediate_size, tensor)
    width += fit[pre + 'qkv'] * (h_dev + 2 * g_dev) * c.head_dim
    b_dev = _rows(b, dp)
    return int(b_dev * p * a * width) + b_dev * (v_dev * 4 + 2 * p * 4)

  def round_program(
    b: int, slots: int, new: int, aligned: bool = False, group: int = 1
  ) -> tuple[int, int]:
    """(KV cache and gathered prompts, other temporaries + outputs) of a round.

    `aligned`: slot i continues prompt i (the scoring chunks), no gather.
    `group`: slots per prompt group (`sampler.sample_round`'s `group`).
    """
    tt = p + new
    s_dev = _rows(slots, dp)
    decode = attention_lib.resolve(c.attention, 1, tt)
    # The slot gather all-gathers the row-split prompt cache over the data
    # axes: all B prompts' K and V on every device, every layer's before the
    # loop starts.
    gathered = 0 if aligned else b * p * kv_layer
    if decode == 'dense':
      # One [S, G, P + N, K] cache per slot, which reuses the gathered
      # buffer when it is the larger. With one KV head per device XLA keeps
      # a second copy of much of it through the loop (measured on XLA:CPU).
      copies = FIT['kv_one_head'] if g_dev == 1 else 1.0
      kv = copies * s_dev * tt * kv_layer
      cache = int(c.num_layers * max(kv, gathered)) + s_dev * tt
    else:
      # The prompt's keys once per group ([S/m, G, P, K]; when aligned the
      # prompt cache itself, plus a transposed copy of its keys: decode
      # reads a prefix whole), the slots' own [S, G, N, K] response cache
      # (N rounded up to whole blocks where it is held in blocks).
      group = sampler.group_on_mesh(slots, group, dp)
      g_rows = _rows(slots // group, dp)
      prefix = g_rows * p * kv_layer
      if aligned and group == 1:
        prefix = prefix // 2
      own = attention_lib.round_cache_len(new, backend)
      response = s_dev * own * kv_layer
      if tpu:
        # TPU: the gathers happen before the empty response caches exist
        # (one layer's gathered K and V at a time), see `pre` below.
        cache = int(c.num_layers * (prefix + response))
      else:
        cache = int(c.num_layers * (prefix + max(response, gathered)))
      cache += s_dev * own + g_rows * p
    # [S, V] first-token logits, per-token fp32 scores [S, h, 1, T] (dense)
    # or those of the whole prefix [S, h, 1, P] (the larger of them and the
    # response loop's [S, h, 1, tk]) and the loop's K/V block [S, g, tk, K],
    # logits [S, V], the outputs [S, N].
    h_dev = _split(c.num_heads, tensor)
    if decode == 'dense':
      scores = s_dev * h_dev * tt * 12
    else:
      tk, _ = attention_lib.decode_block(new)
      scores = s_dev * (h_dev * max(p, tk) * 12 + 2 * g_dev * tk * c.head_dim * 4)
    outputs = s_dev * (new * 12 + 4)
    if not tpu or decode == 'dense':
      return cache, s_dev * v_dev * 4 * 3 + scores + outputs
    # TPU: the loop's token choice holds several fp32 [S, V] arrays (the
    # top-p filter's sort among them); before the loop the B prompts'
    # first-token logits are all-gathered (fp32 [B, v]) and each layer's
    # prompt K and V in turn (one layer's [B, G, P, K] pair at a time),
    # while the response caches are not yet alive: the round peaks at the
    # larger.
    choose = FIT_TPU['choose_plain'] * v_dev
    if s.filter_logits:
      # The filter sorts whole rows, the slots moved over the tensor axis
      # (`sampler._filter_sharding`): per device s_dev / tensor rows of V,
      # as many entries as the [s_dev, v] logits; the whole vocab per slot
      # where the slots do not divide over every axis.
      spread = tensor == 1 or sampler.filter_rows_divide(slots, dp, tensor)
      choose += FIT_TPU['choose_filter'] * (v_dev if spread else c.vocab_size)
    choose = s_dev * 4 * choose
    loop = choose + scores
    first = b * v_dev * 4
    pre = 0
    if not aligned:
      pre = max(first, gathered) + FIT_TPU['gather_overlap'] * min(first, gathered)
    pre -= c.num_layers * response
    return cache, int(max(loop, pre)) + outputs

  rnd_kv, rnd_other = round_program(
    s.prompts, s.slots // s.waves, n, group=s.slot_group
  )
  buffer = s.max_rounds * _rows(s.slots, dp) * n * 12
  # Waves: the W waves' outputs [S/W, N] and the round's, joined, [S, N].
  joined = 2 * _rows(s.slots, dp) * (n * 12 + 4) if s.waves > 1 else 0

  # --- Training: [C, m, ...] batch, b rows of each micro-batch per device.
  b_dev = micro_rows_per_device(s.micro_batch_rows, dp)
  micros = s.rows // s.micro_batch_rows
  batch_in = micros * b_dev * 2 * t * 4  # tokens, attn_mask
  batch_f32 = micros * b_dev * n * 4  # one [C, m, N] fp32 leaf
  impl = attention_impl(c, t, backend)
  kept, transient = _layer_bytes(c, t, tensor, impl)
  logits = _logits_bytes(c, n, s.logit_chunk, tensor)
  if c.remat == 'block':
    # The scan keeps one block input [b, T, D] per layer (and its carry),
    # recomputes one block at a time; the layers' params are stacked for the
    # scan and so are their gradients (1x the layers' bytes each).
    act = b_dev * (
      c.num_layers * FIT['block_kept'] * a * t * c.hidden_size + kept + transient
    )
    weights = 2 * layers_train + FIT['weights_block'] * layer_g + embed_g
    if tpu and not c.tie_embeddings:
      # TPU, untied embeddings: the gathers move compute-dtype weights (7B
      # on v5p-64: 1.75 at 2 layers, 1.41 at 28 with fp32 ones; 1.12 and
      # 1.12 so). Tied ones stay fp32 there (1.5B: 0.95-1.03 as planned,
      # 0.75 with compute-dtype ones): the tied table's gradient sums the
      # lookup's and the head's.
      weights = (
        2 * layers_train + FIT['weights_block'] * layer_g * a // w + embed_g * a // w
      )
  else:
    act = b_dev * (c.num_layers * kept + transient)
    weights = c.num_layers * layer_g + embed_g
  act += b_dev * logits
  grads = int(FIT['grads'] * train)
  # Forward only (old-logp): one layer's forward at a time, blockwise or
  # dense scores, one chunk of logits.
  h = _split(c.num_heads, tensor)
  f = _split(c.intermediate_size, tensor)
  g = _split(c.num_kv_heads, tensor)
  fwd = FIT['logp_linear'] * 2 * a * t * (f + (h + 2 * g) * c.head_dim + c.hidden_size)
  if impl == 'dense':
    # The [h, T, T] scores are freed before the MLP's activations exist: a
    # layer peaks at one or the other.
    fwd = max(fwd, FIT['logp_dense'] * h * t * t)
  else:
    tq, _ = attention_lib.block_size(t, attention_lib.BLOCK_Q)
    tk, _ = attention_lib.block_size(t, attention_lib.BLOCK_K)
    fwd += FIT['logp_flash'] * h * tq * tk
  fwd += 8 * min(s.logit_chunk, n) * v_dev + 8 * n
  if tpu:
    # TPU: the fsdp gathers move the weights after their cast to the compute
    # dtype: one layer's at a time beside its forward, and the input
    # embedding table (gathered for the token lookup, before the layers
    # run: the pass peaks at the larger of the two), beside the scan's
    # stacked copy of the layers' own shards (1.5B and 7B at full depth:
    # 1.01 and 0.98; without it 0.83 and 0.71).
    layer_a = _layer_params(c, a, tensor)
    embed_in = a * _split(c.vocab_size, tensor) * c.hidden_size
    chunk_logits = b_dev * 4 * min(s.logit_chunk, n) * v_dev
    if tensor > 1 and s.micro_batch_rows * t < v_dev:
      # Measured (Llama 3B and Qwen3 4B at (1, 2, 8), 7B at (1, 4, 4)): with
      # the vocab split over tensor and a micro-batch's [m, T] tokens fewer
      # than the table shard's rows, libtpu's partitioner leaves the weights
      # in place (their own shards, cast) and moves the activations instead
      # of gathering the weights (1.18-1.29 planned as gathered).
      logp_tmp = train * a // w + b_dev * fwd
    else:
      logp_tmp = layers_train + int(
        max(embed_in + chunk_logits, FIT_TPU['logp_layers'] * layer_a + b_dev * fwd)
      )
  elif c.remat == 'block':
    logp_weights = layers_train + FIT['weights_block'] * layer_g + embed_g
  else:
    logp_weights = c.num_layers * layer_g + embed_g
    if impl != 'dense':  # Unrolled flash forwards keep their fp32 outputs.
      logp_weights += int(
        FIT['logp_flash_layer'] * c.num_layers * b_dev * t * h * c.head_dim
      )
  if not tpu:
    logp_tmp = int(b_dev * fwd + logp_weights)
  logp_out = 2 * batch_f32

  # --- Evaluation-like rounds: S prompts prefilled per chunk, S slots.
  eval_n = s.eval_new_tokens or n

  # Params in their own dtype (fp32, the commands'): every use casts them;
  # XLA hoists a compute-dtype copy out of the decode loop when the dtypes
  # differ (the round holds it; the prefill casts a layer at a time).
  hoisted = sample if w != a else 0

  def scoring_chunk(k: int, new: int, own: bool = False) -> tuple[int, int]:
    # (prompt cache, round) of one chunk of scoring.sample_and_score: S // k
    # prompts and their k samples in one round, or (k = 1) S prompts in an
    # aligned round. own: on the params in their own dtype.
    per = sampler.prompts_per_round(s.slots, k)
    kv, other = round_program(per, s.slots, new, aligned=per == s.slots)
    # The chunk's prefill holds the same params and cache (its output) and
    # its own temporaries: the larger program of the two.
    rnd = kv + other + (hoisted if own else 0)
    return prompt_cache(per), max(rnd, prefill_program(per, own))

  chunks = [scoring_chunk(s.histogram_k, n)]
  if s.greedy_eval:
    chunks.append(scoring_chunk(1, n))
  pr_cache, pr_round = max(chunks, key=sum)
  own = not s.command_cast
  cmd_params = sample_own if own else sample
  sel_cache, sel_round = scoring_chunk(s.histogram_k, n, own=own)
  ev_cache, ev_round = scoring_chunk(1, eval_n, own=own)

  knob_step = 'rl.slots / sampling.max_new_tokens'
  items = (
    Item(
      'sampling copy (reshard output)',
      'reshard',
      sample,
      f'{jnp.dtype(c.dtype).name}, tensor only: made once per step',
      'a larger tensor axis (mesh.tensor)',
    ),
    Item(
      'reshard temporaries',
      'reshard',
      reshard_tmp,
      "the fsdp gathers' staging",
      'a larger tensor axis (mesh.tensor)',
    ),
    Item(
      'params (sampling copy)  ',
      'prefill',
      sample,
      'as in sampling: made before the prefill',
      'a larger tensor axis (mesh.tensor)',
    ),
    Item(
      'prompt cache [B, P] (output)',
      'prefill',
      prompt_cache(s.prompts),
      '',
      'rl.prompts_per_step',
    ),
    Item(
      'prefill temporaries',
      'prefill',
      prefill_program(s.prompts),
      f'one layer of the B/dp prompts x P at a time ({_rows(s.prompts, dp)} '
      'rows/device)',
      'rl.prompts_per_step / data.prompt_bucket',
    ),
    Item(
      'params (training layout)',
      'resident',
      train,
      'fsdp x tensor',
      programs=('reshard', 'old_logp', 'update'),
    ),
    Item(
      'optimizer state (AdamW mu, nu)',
      'resident',
      opt,
      'fsdp x tensor',
      programs=('update',),
    ),
    Item(
      'params (sampling copy)',
      'sampling',
      sample,
      f'tensor only, {jnp.dtype(c.dtype).name}; freed before the update',
      'a larger tensor axis (mesh.tensor)',
    ),
    Item(
      'prompt cache [B, P]',
      'sampling',
      prompt_cache(s.prompts),
      '',
      'rl.prompts_per_step',
    ),
    Item(
      'rollout buffer [M, S, N]',
      'sampling',
      buffer,
      'outside the round program',
      'rl.max_rounds / rl.slots',
      programs=(),
    ),
    Item(
      'KV cache [S, P+N] / gathered prompts (round)',
      'sampling',
      rnd_kv,
      f'per layer: S/{s.slot_group} prompt groups x P + max(S/dp slots x N, '
      'all B prompts x P); dense attention: max(S/dp x (P+N), B x P)'
      + (
        f'; S = {s.slots // s.waves} per wave ({s.waves} waves)' if s.waves > 1 else ''
      ),
      'sampling.waves / ' + knob_step,
    ),
    Item(
      "waves' outputs, joined",
      'sampling',
      joined,
      f'{s.waves} waves of [S/W, N] tokens, logp, mask and the joined [S, N]',
      programs=(),
    ),
    Item(
      'round temporaries',
      'sampling',
      rnd_other,
      '[S, V] logits, per-token scores, outputs',
      'rl.prompts_per_step / rl.slots',
    ),
    Item(
      'training batch: tokens, mask',
      'old_logp',
      batch_in,
      f'[C={micros}, m={s.micro_batch_rows}, T] rows over data x fsdp',
    ),
    Item(
      'training batch: weights, advantages, sampler logp',
      'old_logp',
      3 * batch_f32,
      '',
      programs=(),
    ),
    Item(
      'old-logp pass (one micro-batch)',
      'old_logp',
      logp_tmp + logp_out,
      f'{b_dev} rows/device, gathered weights, logp/entropy out',
      'rl.micro_batch_rows',
    ),
    Item('training batch [C, m, ...]', 'update', batch_in + 3 * batch_f32),
    Item(
      'sampler logp [C, m, N]',
      'update',
      batch_f32,
      'kept for the gap metric',
      programs=(),
    ),
    Item(
      'gradients, optimizer temporaries',
      'update',
      grads,
      'fsdp x tensor',
    ),
    Item(
      'gathered weights',
      'update',
      weights,
      f'fsdp all-gathers (remat={c.remat})',
      'a larger tensor axis (mesh.tensor)',
    ),
    Item(
      'update activations',
      'update',
      act,
      f'{b_dev} rows/device per micro-batch, attention {impl}, remat {c.remat}',
      'rl.micro_batch_rows / model.remat',
    ),
    Item('params (sampling copy) ', 'pass_rates', sample, 'as in sampling'),
    Item(
      'prompt cache (one chunk)',
      'pass_rates',
      pr_cache,
      f'S/k prompts per chunk (k={s.histogram_k})'
      + (', or S greedy' if s.greedy_eval else ''),
    ),
    Item(
      'round of a chunk',
      'pass_rates',
      pr_round,
      "KV cache and temporaries (or the prefill's, the larger)",
      knob_step,
    ),
    Item(
      'params (restored, sampling layout)',
      'evaluation',
      cmd_params,
      f'{jnp.dtype(c.param_dtype if own else c.dtype).name}, tensor only',
      'a larger tensor axis (mesh.tensor)',
    ),
    Item('prompt cache [S, P] ', 'evaluation', ev_cache, 'S prompts per chunk (k=1)'),
    Item(
      f'round at N={eval_n}',
      'evaluation',
      ev_round,
      'k rounds one after another'
      + (
        '; with a hoisted compute-dtype copy of the params' if own and hoisted else ''
      ),
      '--max-new-tokens / --slots',
    ),
    Item(
      'params (restored, sampling layout) ',
      'selection',
      cmd_params,
      '',
      'a larger tensor axis (mesh.tensor)',
    ),
    Item(
      'prompt cache (one chunk) ',
      'selection',
      sel_cache,
      f'S/k prompts per chunk (k={s.histogram_k})',
    ),
    Item(f'round at N={n}', 'selection', sel_round, '', '--slots'),
  )
  return Plan(items, tuple(mesh), b_dev)


def smallest_change(
  config: model_lib.ModelConfig,
  shapes: StepShapes,
  mesh: tuple[int, int, int],
  hbm_bytes: float,
  *,
  backend: str = 'tpu',
) -> str:
  """The smallest change that makes the step fit, as advice (or that none does).

  Tried in order, each on top of the ones before that helped: one row per
  device per micro-batch, remat='block', blockwise attention (these keep the
  step as it is), then a larger tensor axis (fsdp shrinks to keep the device
  count), then slot waves (2, 4 or 8: the step unchanged), then the step
  halved (B, S, R and the mini-batch), then quartered.
  """
  dp, tensor = mesh[0] * mesh[1], mesh[2]
  c, s, m = config, shapes, tuple(mesh)

  def fits(c, s, m) -> bool:
    return plan(c, s, m, backend=backend).peak <= hbm_bytes

  done = []
  if s.micro_batch_rows > dp and s.micro_batch_rows % dp == 0:
    s = dataclasses.replace(s, micro_batch_rows=dp)
    done.append(f'--config.rl.micro_batch_rows={dp}')
    if fits(c, s, m):
      return 'fits with ' + ' '.join(done)
  if c.remat != 'block':
    c = dataclasses.replace(c, remat='block')
    done.append('--config.model.remat=block')
    if fits(c, s, m):
      return 'fits with ' + ' '.join(done)
  if c.attention == 'dense':
    c = dataclasses.replace(c, attention='auto')
    done.append('--config.model.attention=auto')
    if fits(c, s, m):
      return 'fits with ' + ' '.join(done)
  for factor in (2, 4, 8):
    t = tensor * factor
    if mesh[1] % factor or c.num_heads % t or c.intermediate_size % t:
      continue
    wider = (mesh[0], mesh[1] // factor, t)
    micro = max(s.micro_batch_rows, wider[0] * wider[1])
    s2 = dataclasses.replace(s, micro_batch_rows=micro)
    if s.mini_batch_rows % micro == 0 and fits(c, s2, wider):
      return 'fits with ' + ' '.join(
        [*done, f'--config.mesh.fsdp={wider[1]} --config.mesh.tensor={t}']
      )
  for waves in (2, 4, 8):
    # Slot waves: each round's S slots sampled in `waves` fixed-shape waves
    # of S / waves; the step itself unchanged.
    if s.waves >= waves or s.slots % (waves * dp):
      continue
    s2 = dataclasses.replace(s, waves=waves)
    if fits(c, s2, m):
      return 'fits with ' + ' '.join([*done, f'--config.sampling.waves={waves}'])
  s = dataclasses.replace(s, waves=max(s.waves, 1))
  for div, word in ((2, 'halved'), (4, 'quartered')):
    s2 = dataclasses.replace(
      s,
      prompts=s.prompts // div,
      slots=s.slots // div,
      rows=s.rows // div,
      mini_batch_rows=max(s.mini_batch_rows // div, s.micro_batch_rows),
    )
    if fits(c, s2, m):
      flags = ' '.join(
        [
          *done,
          f'--config.rl.prompts_per_step={s2.prompts}',
          f'--config.rl.slots={s2.slots}',
          f'--config.rl.mini_batch_rows={s2.mini_batch_rows}',
        ]
      )
      return (
        f"the paper's step does not fit this pod even in 8 slot waves; fits with "
        f'the step {word}: {flags}'
      )
  return 'the step does not fit even quartered: use a larger pod'


def biggest_knobs(p: Plan, count: int = 3) -> list[str]:
  """Config keys of the largest items of the peak phase, biggest first."""
  items = sorted(
    (i for i in p.items if i.phase in ('resident', p.peak_phase) and i.knob),
    key=lambda i: -i.bytes,
  )
  out = []
  for i in items:
    if i.knob not in out:
      out.append(i.knob)
  return out[:count]
