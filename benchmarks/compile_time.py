"""Compile time of the training forward+backward: attention, remat, scanned layers.

What it measures (issue "the paper's setups must fit the pods", item 3): the
jit lower and compile times, on CPU, of value_and_grad of a masked mean
cross-entropy (the SFT loss) w.r.t. all params, for an L-layer small-width
model (default L=28, D=256, H=4, G=2, K=64, F=512, V=1024, B=8, T=256, left
padded rows), in these variants:

  head              ada_jax/model.py at git revision --rev (default HEAD;
                    once this change is committed, pass the commit before
                    it), loaded from `git show`, unrolled layers;
  dense/none ...    this tree, attention x remat in {dense, chunked} x
                    {none, block}, unrolled layers (a Python loop);
  scan/none|block   a prototype that stacks the layers' params at call time
                    and runs them with lax.scan (dense attention): the
                    compile-time gain scanning could buy, measured before
                    deciding whether to change the model.

Also printed: the process CPU seconds of lower+compile (steadier than wall
time on a shared machine) and the compiled program's temp bytes
(memory_analysis), which show what remat and chunking do to activation
memory.

Each variant is lowered and compiled once, in a fresh Python process (no
warm caches, no persistent compilation cache). Wall times vary with the
machine's load; the CPU seconds are the steadier figure on a shared machine.

Measured (jax 0.10.2, CPU, 2 cores shared with other jobs at load 12-14, so
wall times are not comparable; CPU seconds of lower+compile, two runs, and
temp MiB):

  head           11.4-11.7 s   1785     dense/none     11.9-12.0 s   1785
  dense/block    15.5-17.4 s   1673     chunked/none   13.6-16.4 s   1616
  chunked/block  17.6-20.7 s   1393     scan/none      15.5-16.9 s   1811
  scan/block     15.2-15.6 s    260

Scanning the layers does not shorten the compile here (it costs more CPU
than the unrolled loop), so the model keeps its unrolled layers and its
param tree. The scan's temp figure with remat shows what XLA on CPU does to
unrolled remat (see model._remat_block), not a compile-time gain.

Run: python benchmarks/compile_time.py [--layers 28] [--seq 256] [--batch 8]
       [--variants head,dense/none,...] [--rev GIT_REVISION]

Dimension legend: B rows, T tokens, L layers, D width, H query heads, G KV
heads, K head dim, F MLP width, V vocab.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

_ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT))

from ada_jax import attention as attention_lib  # noqa: E402
from ada_jax import model as model_lib  # noqa: E402

VARIANTS = (
  'head',
  'dense/none',
  'dense/block',
  'chunked/none',
  'chunked/block',
  'scan/none',
  'scan/block',
)


def _head_model_module(rev: str = 'HEAD'):
  """ada_jax/model.py at git revision `rev`, imported as a standalone module.

  Only revisions whose model.py imports nothing from ada_jax load this way
  (true of every revision before ada_jax/attention.py existed).
  """
  src = subprocess.run(
    ['git', 'show', f'{rev}:ada_jax/model.py'],
    cwd=_ROOT,
    check=True,
    capture_output=True,
    text=True,
  ).stdout
  path = pathlib.Path(tempfile.mkdtemp()) / 'head_model.py'
  path.write_text(src)
  spec = importlib.util.spec_from_file_location('head_model', path)
  module = importlib.util.module_from_spec(spec)
  sys.modules['head_model'] = module
  spec.loader.exec_module(module)
  return module


def _config_kwargs(args) -> dict[str, Any]:
  return dict(
    model_type='qwen2',
    vocab_size=args.vocab,
    hidden_size=args.hidden,
    intermediate_size=2 * args.hidden,
    num_layers=args.layers,
    num_heads=args.heads,
    num_kv_heads=args.kv_heads,
    head_dim=args.hidden // args.heads,
    qkv_bias=True,
  )


def _scan_forward(model: model_lib.Transformer, tokens, mask, remat: bool):
  """Logits of `model` with its layers stacked at call time and scanned."""
  c = model.config
  b, t = tokens.shape
  impl = attention_lib.resolve('dense', t, t)
  valid = mask.astype(jnp.bool_)
  query_index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None], (b, t))
  attn_mask = attention_lib.make_mask(query_index, valid, impl)
  rope = model_lib.rope_tables(
    model_lib.positions_from_mask(mask), model_lib.rope_inv_freq(c)
  )
  cache = model_lib.init_cache(c, b, t)
  graphdef, _ = nnx.split(model.layers[0])
  states = [nnx.split(layer)[1] for layer in model.layers]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)

  def body(x, state):
    layer = nnx.merge(graphdef, state)
    x, _, _ = layer(x, rope, attn_mask, cache.k[0], cache.v[0], jnp.int32(0), impl)
    return x, None

  if remat:
    body = jax.checkpoint(body, policy=jax.checkpoint_policies.nothing_saveable)
  x = jnp.take(model.embed[...], tokens, axis=0).astype(c.dtype)
  x, _ = jax.lax.scan(body, x, stacked)
  return model.project(model.final_norm(x))


def _loss_fn(variant: str, graphdef):
  def loss(state, tokens, mask):
    model = nnx.merge(graphdef, state)
    if variant.startswith('scan/'):
      logits = _scan_forward(model, tokens, mask, variant.endswith('block'))
    else:
      logits = model.forward(tokens, mask)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    tgt = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    w = mask[:, 1:].astype(jnp.float32)
    return -jnp.sum(tgt * w) / jnp.maximum(jnp.sum(w), 1.0)

  return jax.value_and_grad(loss)


def _model(variant: str, args):
  kwargs = _config_kwargs(args)
  if variant == 'head':
    head = _head_model_module(args.rev)
    return head.Transformer(head.ModelConfig(**kwargs), rngs=nnx.Rngs(0))
  attention, remat = variant.split('/')
  if attention == 'scan':
    attention, remat = 'dense', 'none'  # _scan_forward applies its own remat.
  config = model_lib.ModelConfig(**kwargs, attention=attention, remat=remat)
  return model_lib.Transformer(config, rngs=nnx.Rngs(0))


def measure(variant: str, args) -> dict[str, float]:
  """Lower and compile seconds and temp MiB of one variant's train step."""
  graphdef, state = nnx.split(_model(variant, args))
  rng = np.random.RandomState(0)
  b, t = args.batch, args.seq
  mask = np.zeros((b, t), np.int32)
  for i, n in enumerate(rng.randint(t // 2, t + 1, b)):
    mask[i, t - n :] = 1
  tokens = rng.randint(0, args.vocab, (b, t)).astype(np.int32) * mask
  fn = jax.jit(_loss_fn(variant, graphdef))
  t0, c0 = time.perf_counter(), time.process_time()
  lowered = fn.lower(state, tokens, mask)
  t1 = time.perf_counter()
  compiled = lowered.compile()
  t2, c2 = time.perf_counter(), time.process_time()
  mem = compiled.memory_analysis()
  temp = mem.temp_size_in_bytes / 2**20 if mem is not None else float('nan')
  return dict(lower_s=t1 - t0, compile_s=t2 - t1, cpu_s=c2 - c0, temp_mib=temp)


def main(argv: list[str] | None = None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--layers', type=int, default=28)
  p.add_argument('--hidden', type=int, default=256)
  p.add_argument('--heads', type=int, default=4)
  p.add_argument('--kv-heads', type=int, default=2)
  p.add_argument('--vocab', type=int, default=1024)
  p.add_argument('--seq', type=int, default=256)
  p.add_argument('--batch', type=int, default=8)
  p.add_argument('--variants', default=','.join(VARIANTS))
  p.add_argument('--rev', default='HEAD', help="git revision of 'head'")
  p.add_argument('--one', help='measure one variant here, print JSON (internal)')
  args = p.parse_args(argv)
  if args.one:
    print(json.dumps(measure(args.one, args)))
    return
  variants = args.variants.split(',')
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    p.error(f'unknown variants {unknown}; choose from {VARIANTS}')
  print(
    f'jax {jax.__version__} on {jax.default_backend()}; L={args.layers} '
    f'D={args.hidden} H={args.heads} G={args.kv_heads} B={args.batch} T={args.seq}'
  )
  print(
    f'{"variant":<15}{"lower_s":>9}{"compile_s":>11}{"total_s":>9}{"cpu_s":>8}'
    f'{"temp_MiB":>10}'
  )
  shape = [f'--{k.replace("_", "-")}={v}' for k, v in vars(args).items()]
  shape = [a for a in shape if not a.startswith(('--variants=', '--one='))]
  for variant in variants:
    out = subprocess.run(
      [sys.executable, __file__, *shape, f'--one={variant}'],
      check=True,
      capture_output=True,
      text=True,
    ).stdout
    r = json.loads(out.strip().splitlines()[-1])
    total = r['lower_s'] + r['compile_s']
    print(
      f'{variant:<15}{r["lower_s"]:>9.2f}{r["compile_s"]:>11.2f}{total:>9.2f}'
      f'{r["cpu_s"]:>8.2f}{r["temp_mib"]:>10.1f}',
      flush=True,
    )


if __name__ == '__main__':
  main()
