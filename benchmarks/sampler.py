"""Sampler throughput: ada_jax.sampler vs tunix's JAX Sampler vs transformers.

One run measures all three systems on the same machine, on the same model
files: a random Qwen2-shaped model (4 layers, hidden 256, 4 heads of 64, 2 KV
heads, MLP 1024, vocab 2048, tied embeddings, fp32) built with transformers
(torch CPU, seeded) and saved as safetensors into a temp dir, which each
system then loads with its own loader.

Figures (tokens/s = generated tokens / wall time; every system warmed up once
with the same shapes, then the best of `--repeats` timed runs):
  * the machine's fp32 matmul peak (jitted `jnp.dot` of square matrices), and
    for each system the roofline fraction 2 * params * tokens / time / peak;
  * case A: B=64 rows (and B=256), prompts left-padded to 32 with real
    lengths 16..32, 64 new tokens, temperature 1, no early stop:
    ours (`sampler.sample`), tunix (`Sampler.__call__`), transformers
    (`generate`, do_sample, KV cache, min_new_tokens = max_new_tokens);
  * case B, the RL case: 64 prompts of 256 tokens, 4 rounds of 8 samples per
    prompt, 64 new tokens: ours = `prefill` once, then 4 x `sample_round` over
    512 slots, a prompt's 8 slots side by side as the controller's paper
    schedule lays them out (`group=8`: each prompt's keys read once per
    round step, not once per slot); tunix = one call per round with each
    prompt repeated 8 times;
  * a sanity check that tunix loaded the same weights: its prefill logits and
    greedy tokens against transformers (and ours, greedy, likewise);
  * ours only, the long response: 64 prompts of 256 tokens, 512 new tokens,
    no early stop (`sample`, aligned). Overall tokens/s is the whole call
    (prefill included). Steps cannot be timed inside the decode loop, so the
    first and last quarter are measured as the decode step itself:
    `sampler.decode_step` (the loop's body: the model's decode call and the
    token choice) jitted on its own with the round's real cache
    (`sampler.round_cache`), the cache donated so its writes are in place as in the
    loop, at four columns i, the middles of the quarter's fourths (cache
    validity marks the prompt and columns < i - 1 written, as the loop would
    have left it), the two quarters' columns measured alternately, 3 rounds,
    each column's best (`quarter_steps`); tokens/s = S / mean step time.
    With a cache read whole at every step the two quarters cost the same;
    with decode reading only the written part the last quarter is slower.
    The step excludes the loop's bookkeeping, so its tokens/s run above the
    overall figure. Beside it, the rate of the reads the last quarter adds:
    the response bytes its steps read beyond the first quarter's, over the
    added step time, against XLA:CPU's own row sum over 256 MB (a pure
    stream of reads) in a fresh process pinned to one core, and on all
    cores;
  * --profile (ours): where a decode step's time goes, case A (B=64) and the
    RL case, at column N/2: each piece jitted on its own with the step's
    shapes and dtypes, best of --profile-repeats (see `profile_pieces`).
Targets: ours >= 1.3x tunix in case A, >= 2x tunix in case B.
Ours runs with top_p = 1 and top_k = 0 throughout, compiled without the
top-p / top-k filter (`filter_logits=False`), as a run whose config turns
both off compiles it (`sampler.needs_filter`).

tunix (`google-tunix==0.1.7`) brings its own jax and flax, so it lives in a
separate venv and runs as a subprocess (`benchmarks/_tunix_peer.py`):
  python3 -m venv .venv-tunix && .venv-tunix/bin/pip install google-tunix==0.1.7
Without it the script says so and still reports ours vs transformers.

Dimension legend: B rows (case A) or prompts (case B), P prompt length,
N new tokens, S sampling slots (case B: B x samples per prompt).

Run: python benchmarks/sampler.py [--quick] [--skip-tunix] [--json out.json]
  [--ours-only] [--profile] [--skip-long]
About 10 minutes on 2 quiet cores (estimated; most of it tunix's case B,
five 512-row calls); --quick saves the case-A repeats. Other processes on the
cores slow every system: the `cores` column (CPU s / wall s) shows how much
of the machine each figure got.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

_ROOT = pathlib.Path(__file__).resolve().parents[1]
_PEER = _ROOT / 'benchmarks' / '_tunix_peer.py'
_TUNIX_VENV = _ROOT / '.venv-tunix'
_TUNIX_INSTALL = (
  'python3 -m venv .venv-tunix && .venv-tunix/bin/pip install google-tunix==0.1.7'
)

MODEL = dict(
  vocab_size=2048,
  hidden_size=256,
  intermediate_size=1024,
  num_hidden_layers=4,
  num_attention_heads=4,
  num_key_value_heads=2,
  head_dim=64,
  tie_word_embeddings=True,
  max_position_embeddings=1024,
  rope_theta=10000.0,
  bos_token_id=1,
  eos_token_id=2,
  pad_token_id=0,
)
PAD = 0
NEW_TOKENS = 64
CASE_A = dict(width=32, min_len=16, max_len=32, rows=(64, 256))
CASE_B = dict(prompts=64, width=256, rounds=4, samples=8)
SANITY_ROWS, SANITY_NEW = 8, 8
LONG = dict(prompts=64, width=256, new_tokens=512)
LONG_ROUNDS = 3
PROFILE_REPEATS = 15
TARGET_A, TARGET_B = 1.3, 2.0


# ----------------------------------------------------------------------------
# Model, prompts, machine peak.


def build_model(out_dir: str, seed: int = 0) -> int:
  """Writes the random Qwen2-shaped model to out_dir; returns its parameter count.

  Every parameter is perturbed from its init (biases and norm scales too), so
  a loader that drops a bias or a norm shows in the sanity check.
  """
  import torch
  import transformers

  torch.manual_seed(seed)
  config = transformers.Qwen2Config(**MODEL)
  model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
  gen = torch.Generator().manual_seed(seed + 1)
  with torch.no_grad():
    for p in model.parameters():
      p.add_(0.02 * torch.randn(p.shape, generator=gen))
  model.save_pretrained(out_dir)
  return sum(p.numel() for p in model.parameters())


def left_padded(
  rs: np.random.RandomState, rows: int, width: int, min_len: int, max_len: int
) -> tuple[np.ndarray, np.ndarray]:
  """Random prompt tokens and mask [rows, width], left-padded with PAD."""
  tokens = np.full((rows, width), PAD, np.int32)
  mask = np.zeros((rows, width), np.int32)
  for i, n in enumerate(rs.randint(min_len, max_len + 1, rows)):
    tokens[i, width - n :] = rs.randint(3, MODEL['vocab_size'], n)
    mask[i, width - n :] = 1
  return tokens, mask


def matmul_peak(n: int = 2048, repeats: int = 5) -> float:
  """Best fp32 FLOP/s of a jitted n x n matmul on the default JAX device."""
  import jax
  import jax.numpy as jnp

  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  dot = jax.jit(jnp.dot)
  dot(a, b).block_until_ready()
  best = min(_wall(lambda: dot(a, b).block_until_ready()) for _ in range(repeats))
  return 2 * n**3 / best


# XLA's row sum over arrays well past the caches: a stream of reads and
# nothing else, the rate a decode product that only reads could reach.
_STREAM = """
import os, sys, time
mb, cpu, arrays = int(sys.argv[1]), int(sys.argv[2]), 8
if cpu >= 0:
  os.sched_setaffinity(0, {cpu})  # before jax starts its threads
import jax, jax.numpy as jnp
xs = [jnp.full((mb * 2**20 // (4 * 64 * arrays), 64), j, jnp.float32) for j in range(arrays)]
f = jax.jit(lambda x: x.sum(-1))
for x in xs:
  f(x).block_until_ready()
best = float('inf')
for _ in range(5):
  t0 = time.perf_counter()
  for x in xs:
    y = f(x)
  y.block_until_ready()
  best = min(best, time.perf_counter() - t0)
print(len(os.sched_getaffinity(0)), sum(x.nbytes for x in xs) / best)
"""


def stream_rate(one_core: bool, mb: int = 256) -> float:
  """Bytes/s of XLA:CPU's row sum over mb MB, in a fresh process.

  one_core: the process pinned to one of this process's CPUs (XLA:CPU runs
  the decode products on one core; this is that core's own stream). The
  child pins itself: a preexec_fn would fork this multithreaded process.
  """
  cpu = min(os.sched_getaffinity(0)) if one_core else -1
  out = subprocess.run(
    [sys.executable, '-c', _STREAM, str(mb), str(cpu)],
    capture_output=True,
    text=True,
    check=True,
    env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
  )
  cpus, rate = out.stdout.split()[-2:]
  if one_core and int(cpus) != 1:
    raise RuntimeError(f'the stream process ran on {cpus} CPUs, not pinned to one')
  return float(rate)


_START = time.perf_counter()


def log(msg: str) -> None:
  """Progress line on stderr (the figures go to stdout)."""
  print(f'[{time.perf_counter() - _START:6.0f} s] {msg}', file=sys.stderr, flush=True)


def _wall(fn: Callable[[], Any]) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def timed(
  fn: Callable[[int], int], repeats: int, warmup: Callable[[], Any] | None = None
) -> dict[str, Any]:
  """Warm-up (default fn(0); compiles), then `repeats` timed calls fn(1..).

  fn returns the number of generated tokens. Besides wall times, records this
  process's CPU seconds per run: CPU / wall is how many cores the system
  actually got (2 on a quiet 2-core machine), a check on the figure.
  """
  warmup() if warmup else fn(0)
  times, cpu, tokens = [], [], 0
  for r in range(repeats):
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = fn(r + 1)
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  return {'times': times, 'cpu': cpu, 'tokens': tokens}


# ----------------------------------------------------------------------------
# The three systems. Each returns {case: {'times': [...], 'cpu': [...], 'tokens': n}}.


def run_ours(
  model_dir: str, data: dict[str, np.ndarray], args: argparse.Namespace
) -> dict[str, Any]:
  """ada_jax: `sample` for case A, `prefill` + `sample_round` rounds for case B."""
  import jax

  from ada_jax import hf, sampler

  model = hf.load_model(model_dir)
  res: dict[str, Any] = {}
  greedy = sampler.sample(
    model,
    data['sanity_tokens'],
    data['sanity_mask'],
    max_new_tokens=SANITY_NEW,
    rng=jax.random.key(0),
    temperature=0.0,
  )
  res['greedy'] = np.asarray(greedy.tokens).tolist()

  for rows in args.rows:
    log(f'ours: case A, B={rows}')
    res[f'a{rows}'] = ours_case_a(
      model, data[f'a{rows}_tokens'], data[f'a{rows}_mask'], args.repeats
    )

  if not args.skip_rl:
    log('ours: case B')
    res['b'] = ours_rl_case(model, data['b_tokens'], data['b_mask'], args.rl_repeats)
  return res


def ours_case_a(
  model: Any,
  tokens: np.ndarray,
  mask: np.ndarray,
  repeats: int,
  new_tokens: int = NEW_TOKENS,
) -> dict[str, Any]:
  """Case A for ours: `sample` of the [B, P] prompts, timed (see `timed`).

  Also the long response's overall figure (`run_long`).
  """
  import jax

  from ada_jax import sampler

  def call(seed: int) -> int:
    out = sampler.sample(
      model,
      tokens,
      mask,
      max_new_tokens=new_tokens,
      rng=jax.random.key(seed),
      temperature=1.0,
      filter_logits=False,
    )
    return int(np.asarray(jax.block_until_ready(out).lengths).sum())

  return timed(call, repeats)


def ours_rl_case(
  model: Any,
  tokens: np.ndarray,
  mask: np.ndarray,
  repeats: int,
  *,
  samples: int = CASE_B['samples'],
  rounds: int = CASE_B['rounds'],
  new_tokens: int = NEW_TOKENS,
) -> dict[str, Any]:
  """Case B for ours: `prefill` of the [B, P] prompts, then `rounds` rounds.

  Each round is one `sample_round` over B x samples slots; the warm-up is
  one round.
  """
  import jax

  from ada_jax import sampler

  slot_prompt = np.repeat(np.arange(len(tokens)), samples)

  def rl_step(seed: int, rounds: int = rounds) -> int:
    cache = sampler.prefill(model, tokens, mask)
    generated = 0
    for k in range(rounds):
      out = sampler.sample_round(
        model,
        cache,
        slot_prompt,
        max_new_tokens=new_tokens,
        rng=jax.random.key(seed * rounds + k),
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        eos_ids=(),
        filter_logits=False,
        # The controller's paper schedule: a prompt's M slots side by side.
        group=samples,
      )
      # The controller reads each round's results before the next round.
      generated += int(np.asarray(jax.block_until_ready(out).lengths).sum())
    return generated

  return timed(rl_step, repeats, lambda: rl_step(0, rounds=1))


def run_transformers(
  model_dir: str, data: dict[str, np.ndarray], args: argparse.Namespace
) -> dict[str, Any]:
  """Runs `transformers` generate (torch CPU, KV cache): case A and sanity refs."""
  import torch
  import transformers

  model = transformers.AutoModelForCausalLM.from_pretrained(model_dir).float().eval()
  res: dict[str, Any] = {'threads': torch.get_num_threads()}

  def generate(tok: np.ndarray, mask: np.ndarray, new: int, **kw) -> np.ndarray:
    with torch.no_grad():
      out = model.generate(
        input_ids=torch.tensor(tok, dtype=torch.long),
        attention_mask=torch.tensor(mask, dtype=torch.long),
        max_new_tokens=new,
        min_new_tokens=new,
        pad_token_id=PAD,
        use_cache=True,
        **kw,
      )
    return out[:, tok.shape[1] :].numpy()

  s_tok, s_mask = data['sanity_tokens'], data['sanity_mask']
  res['greedy'] = generate(s_tok, s_mask, SANITY_NEW, do_sample=False).tolist()
  with torch.no_grad():
    positions = np.maximum(np.cumsum(s_mask, -1) - 1, 0)
    logits = model(
      input_ids=torch.tensor(s_tok, dtype=torch.long),
      attention_mask=torch.tensor(s_mask, dtype=torch.long),
      position_ids=torch.tensor(positions, dtype=torch.long),
    ).logits
  res['last_logits'] = logits[:, -1].float().numpy()

  for rows in args.rows:
    tok, mask = data[f'a{rows}_tokens'], data[f'a{rows}_mask']

    def call(seed: int, tok=tok, mask=mask) -> int:
      torch.manual_seed(seed)
      out = generate(
        tok, mask, NEW_TOKENS, do_sample=True, temperature=1.0, top_p=1.0, top_k=0
      )
      return out.size

    log(f'transformers: case A, B={rows}')
    res[f'a{rows}'] = timed(call, args.repeats)
  return res


def tunix_python(args: argparse.Namespace) -> str:
  """--tunix-python, else $TUNIX_PYTHON, else .venv-tunix/bin/python."""
  exe = args.tunix_python or os.environ.get('TUNIX_PYTHON')
  return exe or str(_TUNIX_VENV / 'bin' / 'python')


def run_tunix(
  exe: str, model_dir: str, inputs: str, args: argparse.Namespace
) -> tuple[dict[str, Any] | None, str]:
  """Runs _tunix_peer.py with the tunix venv's python; (results, error text)."""
  cmd = [
    exe,
    str(_PEER),
    f'--model={model_dir}',
    f'--inputs={inputs}',
    f'--new-tokens={NEW_TOKENS}',
    f'--rounds={CASE_B["rounds"]}',
    f'--samples={CASE_B["samples"]}',
    f'--repeats={args.repeats}',
    f'--rl-repeats={args.rl_repeats}',
    f'--sanity-new={SANITY_NEW}',
  ]
  env = dict(os.environ, PYTHONWARNINGS='ignore', TF_CPP_MIN_LOG_LEVEL='3')
  # stderr passes through: the peer's progress lines, or its traceback.
  proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env, check=False)
  lines = proc.stdout.strip().splitlines()
  if proc.returncode or not lines:
    return None, f'exit status {proc.returncode}; see its stderr above'
  return json.loads(lines[-1]), ''


# ----------------------------------------------------------------------------
# Ours only: where a decode step's time goes, and a long response's steps.


def _best_of(fn: Callable[[], Any], repeats: int) -> float:
  """Best wall time of fn() (blocked on its result) after one warm-up call."""
  import jax

  jax.block_until_ready(fn())
  best = float('inf')
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return best


class _Round:
  """One round's decode state at column i, built as `sampler._round_jit` does.

  The prompt cache comes from the real `sampler.prefill`; the round's cache
  from the real `sampler.round_cache` (slots in groups of `group` sharing
  their prompt's keys), with columns 0..i-2 of the continuation marked
  written (cache validity is what decides which keys a query sees). The K/V
  values of those columns are the empty cache's zeros: a step's cost does not
  depend on them.
  """

  def __init__(self, model, tokens, mask, slot_prompt, n: int, group: int = 1):
    import jax
    import jax.numpy as jnp

    from ada_jax import sampler

    self.model, self.n, self.group = model, n, group
    self.slot_prompt = np.asarray(slot_prompt, np.int32)
    self.pc = sampler.prefill(model, tokens, mask)
    self.s = len(self.slot_prompt)
    self.p = tokens.shape[1]
    idx = jnp.asarray(np.maximum(self.slot_prompt, 0))
    self.start_pos = jnp.take(self.pc.lengths, idx)
    self.prev = jnp.zeros((self.s,), jnp.int32)
    self.knobs = tuple(
      jnp.full((self.s,), v, d)
      for v, d in ((1.0, jnp.float32), (1.0, jnp.float32), (0, jnp.int32))
    )
    self.rng = jax.random.key(0)
    # The cache `sample_round` starts from (the sampler's own builder).
    self._cache = jax.jit(
      lambda pc, sp: sampler.round_cache(model, pc, sp, n, group=group)
    )(self.pc, self.slot_prompt)
    # With a shared prefix the cache holds the response from index 0.
    self.offset = 0 if self._cache.prefix_valid is not None else self.p
    self._step = None

  def cache(self, i: int):
    """A fresh KVCache for step i (fresh buffers: the step donates them)."""
    import jax
    import jax.numpy as jnp

    c, o = self._cache, self.offset
    # jnp.array copies (an empty .at[].set at i = 1 may return its input).
    # Every buffer copied, the shared prefix too (aligned rounds hold the
    # prompt cache itself there, which a donated step would delete).
    # A tree map, not a tuple of jnp.array: a layer's cache may itself be a
    # tuple of block buffers (`attention.round_cache_blocked`).
    return c._replace(
      k=jax.tree.map(jnp.array, c.k),
      v=jax.tree.map(jnp.array, c.v),
      valid=jnp.array(c.valid.at[:, o : o + i - 1].set(True)),
      prefix_k=jax.tree.map(jnp.array, c.prefix_k),
      prefix_v=jax.tree.map(jnp.array, c.prefix_v),
      prefix_valid=None if c.prefix_valid is None else jnp.array(c.prefix_valid),
    )

  def step_fn(self):
    """The jitted decode step (`sampler.decode_step`), the cache donated.

    Donated like the loop's carry, so the cache writes are in place as in the
    loop and not a copy of the whole cache per call. Built once per round:
    the column is an argument, so every column runs the one executable.
    """
    if self._step is None:
      self._step = self._build_step()
    return self._step

  def _build_step(self):
    import functools

    import jax
    from flax import nnx

    from ada_jax import sampler

    graphdef, state = nnx.split(self.model)
    p = self.p

    @functools.partial(jax.jit, donate_argnums=1)
    def step(state, cache, prev, start_pos, i, rng, temperature, top_p, top_k):
      model = nnx.merge(graphdef, state)
      return sampler.decode_step(
        model,
        cache,
        prev,
        start_pos,
        i,
        p,
        rng,
        temperature,
        top_p,
        top_k,
        filter_logits=False,
      )

    return functools.partial(step, state)

  def read_bytes(self, i: int) -> int | None:
    """Bytes of the round's own cache that the step at column i reads.

    Blocks of tk keys up to the step's query (cache index offset + i - 1),
    keys and values of every layer; None for a cache read whole (the same
    bytes at every column).
    """
    k, v = self._cache.k, self._cache.v
    if not isinstance(k[0], tuple):
      return None
    tk = k[0][0].shape[-1]
    block = sum(kb[0].nbytes + vb[0].nbytes for kb, vb in zip(k, v, strict=True))
    return -(-(self.offset + i) // tk) * block

  def step_time(self, i: int, repeats: int) -> float:
    """Best time of one decode step at column i (cache donated and fed back)."""
    import jax.numpy as jnp

    step = self.step_fn()
    carry = {'cache': self.cache(i)}
    col = jnp.int32(i)

    def call():
      tok, lp, carry['cache'] = step(
        carry['cache'], self.prev, self.start_pos, col, self.rng, *self.knobs
      )
      return tok, lp

    return _best_of(call, repeats)


def profile_pieces(r: _Round, i: int, repeats: int) -> dict[str, float]:
  """Seconds per decode step of each piece at column i, timed in isolation.

  Each piece is jitted on its own with the shapes and dtypes of the decode
  loop's step (S slots, one query token, the round's cache from
  `sampler.round_cache`):
    proj+MLP   per layer: norms, Q/K/V projections, RoPE, output projection,
               SwiGLU MLP (the attention output replaced by Q, same shape);
    attention  the decode attention of every layer over the written cache
               (attention_lib.attend with the step's mask);
    cache      the K/V writes of every layer and the validity write (cache
               donated: in place, as in the loop);
    LM head    final norm and logits [S, V];
    sampling   `sampler.next_token`: temperature, log-probabilities, top-p /
               top-k switch, random numbers, the draw;
    step       `sampler.decode_step` (the loop's body minus its bookkeeping);
    loop       one round of the real `sample_round` / (N - 1), its gather,
               first token and bookkeeping included.
  Pieces are timed apart, so XLA fuses less across them than in the step:
  'other' = step - sum of pieces may come out negative.
  """
  import functools

  import jax
  import jax.numpy as jnp
  from flax import nnx

  from ada_jax import attention as attention_lib
  from ada_jax import model as model_lib
  from ada_jax import sampler

  model = r.model
  c = model.config
  dt = c.dtype
  graphdef, state = nnx.split(model)
  s, w = r.s, r.offset + i - 1
  keys = jax.random.split(jax.random.key(1), 4)
  x = jax.random.normal(keys[0], (s, 1, c.hidden_size), jnp.float32).astype(dt)
  q = jax.random.normal(keys[1], (s, 1, c.num_heads, c.head_dim), jnp.float32).astype(
    dt
  )
  new_kv = jax.random.normal(
    keys[2], (s, 1, c.num_kv_heads, c.head_dim), jnp.float32
  ).astype(dt)
  positions = (r.start_pos + i - 1)[:, None]
  windex = jnp.int32(w)
  cache = r.cache(i)
  impl = attention_lib.resolve(c.attention, 1, cache.valid.shape[-1])
  if cache.prefix_valid is not None:
    impl = 'decode'

  @jax.jit
  def proj_mlp(state, x, positions):
    m = nnx.merge(graphdef, state)
    rope = model_lib.rope_tables(positions, model_lib.rope_inv_freq(c))
    kvs = []
    for layer in m.layers:
      a = layer.attn
      h = layer.attn_norm(x)
      qh = jnp.einsum('btd,dhk->bthk', h, a.q[...].astype(dt))
      kh = jnp.einsum('btd,dgk->btgk', h, a.k[...].astype(dt))
      vh = jnp.einsum('btd,dgk->btgk', h, a.v[...].astype(dt))
      if c.qkv_bias:
        qh = qh + a.q_bias[...].astype(dt)
        kh = kh + a.k_bias[...].astype(dt)
        vh = vh + a.v_bias[...].astype(dt)
      if c.qk_norm:
        qh, kh = a.q_norm(qh), a.k_norm(kh)
      qh = model_lib.apply_rope(qh, rope)
      kvs.append((model_lib.apply_rope(kh, rope), vh))
      y = jnp.einsum('bthk,hkd->btd', qh, a.o[...].astype(dt))
      if c.o_bias:
        y = y + a.o_bias[...].astype(dt)
      x = x + y
      x = x + layer.mlp(layer.mlp_norm(x))
    return x, kvs

  @jax.jit
  def attention(q, cache, windex):
    query_index = jnp.full((s, 1), windex, jnp.int32)
    mask = attention_lib.make_mask(query_index, cache.valid, impl, cache.prefix_valid)
    shared = cache.prefix_valid is not None  # As the model's layer loop.
    return [
      attention_lib.attend(
        q,
        cache.k[layer],
        cache.v[layer],
        mask,
        impl,
        dt,
        (cache.prefix_k[layer], cache.prefix_v[layer]) if shared else None,
      )
      for layer in range(len(cache.k))
    ]

  @functools.partial(jax.jit, donate_argnums=0)
  def cache_write(cache, new_kv, windex):
    # As the model's layers write.
    keys_t = attention_lib.cache_keys_transposed(cache.valid, cache.prefix_valid)
    kv = [
      model_lib.write_kv(kc, vc, new_kv, new_kv, windex, keys_transposed=keys_t)
      for kc, vc in zip(cache.k, cache.v, strict=True)
    ]
    valid = model_lib.write_cache(cache.valid, jnp.ones((s, 1), jnp.bool_), windex)
    return cache._replace(
      k=tuple(x for x, _ in kv), v=tuple(x for _, x in kv), valid=valid
    )

  @jax.jit
  def lm_head(state, x):
    m = nnx.merge(graphdef, state)
    return m.project(m.final_norm(x))

  @jax.jit
  def sampling(logits, rng, col, temperature, top_p, top_k):
    return sampler.next_token(
      logits, rng, col, temperature, top_p, top_k, filter_logits=False
    )

  logits = lm_head(state, x)[:, 0]
  col = jnp.int32(i)
  written = {'cache': r.cache(i)}

  def write():
    written['cache'] = cache_write(written['cache'], new_kv, windex)
    return written['cache']

  out = {
    'proj+MLP': _best_of(lambda: proj_mlp(state, x, positions), repeats),
    'attention': _best_of(lambda: attention(q, cache, windex), repeats),
    'cache writes': _best_of(write, repeats),
    'LM head': _best_of(lambda: lm_head(state, x), repeats),
    'sampling': _best_of(lambda: sampling(logits, r.rng, col, *r.knobs), repeats),
  }
  noop = jax.jit(lambda a: a + 1)
  small = jnp.zeros((s,), jnp.int32)
  out['dispatch'] = _best_of(lambda: noop(small), repeats)
  out['step'] = r.step_time(i, repeats)
  return out


def round_step_time(r: _Round, repeats: int) -> float:
  """One real `sample_round` over the round's slots / (N - 1) decode steps."""
  import jax

  from ada_jax import sampler

  aligned = r.s == len(r.pc.lengths) and (r.slot_prompt == np.arange(r.s)).all()

  def call():
    return sampler.sample_round(
      r.model,
      r.pc,
      r.slot_prompt,
      max_new_tokens=r.n,
      rng=jax.random.key(0),
      temperature=1.0,
      filter_logits=False,
      aligned=bool(aligned),
      group=r.group,
    )

  return _best_of(call, max(1, repeats // 5)) / (r.n - 1)


def run_profile(
  model_dir: str, data: dict[str, np.ndarray], args: argparse.Namespace
) -> dict[str, Any]:
  """Per-piece decode-step times for case A (B=64) and the RL case."""
  from ada_jax import hf

  model = hf.load_model(model_dir)
  b = CASE_B
  cases = {
    f'A: B=64, P={CASE_A["width"]}, N={NEW_TOKENS}': (
      data['a64_tokens'],
      data['a64_mask'],
      np.arange(64),
    ),
    f'RL: {b["prompts"]}x{b["samples"]} slots, P={b["width"]}, N={NEW_TOKENS}': (
      data['b_tokens'],
      data['b_mask'],
      np.repeat(np.arange(b['prompts']), b['samples']),
    ),
  }
  res = {}
  for name, (tok, mask, slot_prompt) in cases.items():
    log(f'ours: profile, {name}')
    group = len(slot_prompt) // len(tok)  # The RL case: a prompt's slots side by side.
    r = _Round(model, tok, mask, slot_prompt, NEW_TOKENS, group)
    res[name] = profile_pieces(r, NEW_TOKENS // 2, args.profile_repeats)
    res[name]['loop'] = round_step_time(r, args.profile_repeats)
  return res


def print_profile(prof: dict[str, Any]) -> None:
  pieces = ('proj+MLP', 'attention', 'cache writes', 'LM head', 'sampling')
  for name, t in prof.items():
    step, loop = t['step'], t['loop']
    print(f'\ndecode step profile, {name} (column N/2; best of repeats, ms/step):')
    print(f'  {"piece":<34} {"ms/step":>8} {"share":>7}')
    for piece in pieces:
      print(f'  {piece:<34} {t[piece] * 1e3:>8.3f} {t[piece] / loop:>7.1%}')
    other = step - sum(t[piece] for piece in pieces)
    print(
      f'  {"other in the step (step - pieces)":<34} {other * 1e3:>8.3f} {other / loop:>7.1%}'
    )
    print(
      f'  {"loop overhead (loop - step)":<34} {(loop - step) * 1e3:>8.3f} {(loop - step) / loop:>7.1%}'
    )
    print(f'  {"= loop: real round / (N - 1)":<34} {loop * 1e3:>8.3f} {1:>7.1%}')
    print(
      f'  (step alone, `decode_step` jitted: {step * 1e3:.3f} ms; one jitted no-op'
      f' call: {t["dispatch"] * 1e3:.3f} ms, paid by every piece)'
    )


def run_long(
  model_dir: str, data: dict[str, np.ndarray], args: argparse.Namespace
) -> dict[str, Any]:
  """The long response: overall tokens/s, and of the first and last quarter's steps."""
  from ada_jax import hf

  model = hf.load_model(model_dir)
  tok, mask, n = data['long_tokens'], data['long_mask'], LONG['new_tokens']
  s = len(tok)
  log('ours: long response, whole rounds')
  res: dict[str, Any] = {'overall': ours_case_a(model, tok, mask, args.rl_repeats, n)}
  r = _Round(model, tok, mask, np.arange(s), n)
  res.update(quarter_steps(r, n, s, args.profile_repeats, LONG_ROUNDS))
  log('ours: long response, the stream rate of one core and of all')
  res['stream'] = {'one_core': stream_rate(True), 'all_cores': stream_rate(False)}
  return res


def quarter_steps(
  r: _Round, n: int, slots: int, repeats: int, rounds: int
) -> dict[str, dict[str, Any]]:
  """Step times at four columns of the first and of the last quarter of n.

  The columns are the middles of each quarter's fourths. The two quarters'
  columns are measured alternately (first, last, first, ...), `rounds`
  times over, and each column keeps its best, so that both quarters see
  the same spells of the machine. Measured one quarter after the other,
  once, three quiet runs of one tree gave ratios of 1.22, 1.41 and 1.34,
  the first quarter's step alone moving between 12.2 and 13.5 ms.
  """
  cols = {
    name: [first + (2 * j + 1) * n // 32 for j in range(4)]
    for name, first in (('first quarter', 1), ('last quarter', 1 + 3 * n // 4))
  }
  order = [c for pair in zip(*cols.values(), strict=True) for c in pair]
  best = dict.fromkeys(order, float('inf'))
  for k in range(rounds):
    log(f'ours: long response, steps at columns {order} ({k + 1} of {rounds})')
    for i in order:
      best[i] = min(best[i], r.step_time(i, repeats))
  out = {}
  for name, cs in cols.items():
    times = [best[i] for i in cs]
    out[name] = {
      'columns': cs,
      'step_s': times,
      'tok_s': slots / float(np.mean(times)),
      'read_bytes': [r.read_bytes(i) for i in cs],
    }
  return out


def read_rate(res: dict[str, Any]) -> tuple[float, float, float] | None:
  """(added bytes, added seconds, bytes/s) per step, first quarter to last.

  The rate at which the step's added response reads ran (the rest of a step
  does not grow with the column); None for a cache read whole.
  """
  first, last = res['first quarter'], res['last quarter']
  if None in first['read_bytes'] + last['read_bytes']:
    return None
  added = float(np.mean(last['read_bytes']) - np.mean(first['read_bytes']))
  secs = float(np.mean(last['step_s']) - np.mean(first['step_s']))
  return added, secs, added / secs


def print_long(res: dict[str, Any]) -> None:
  cfg = LONG
  o = res['overall']
  best = min(o['times'])
  print(
    f'\nlong response (ours): {cfg["prompts"]} prompts, P={cfg["width"]}, N={cfg["new_tokens"]},'
    f' no early stop'
  )
  print(
    f'  overall (`sample`, prefill included): {o["tokens"] / best:8.0f} tok/s'
    f' ({best:.2f} s for {o["tokens"]} tokens)'
  )
  for name in ('first quarter', 'last quarter'):
    q = res[name]
    print(
      f'  {name} (`decode_step` at columns {q["columns"]}): {q["tok_s"]:8.0f} tok/s'
      f' (step {np.mean(q["step_s"]) * 1e3:.2f} ms)'
    )
  rate, stream = read_rate(res), res.get('stream')
  if rate and stream:
    added, secs, bps = rate
    print(
      f'  last quarter over first: +{added / 1e6:.0f} MB of response read a step in'
      f" +{secs * 1e3:.2f} ms, {bps / 1e9:.1f} GB/s; XLA's row sum streams"
      f' {stream["one_core"] / 1e9:.1f} GB/s on one core, {stream["all_cores"] / 1e9:.1f}'
      f' on all {len(os.sched_getaffinity(0))}'
    )


# ----------------------------------------------------------------------------
# Report.

SYSTEMS = ('ours', 'tunix', 'transformers')


def case_names(args: argparse.Namespace) -> list[str]:
  return [f'a{r}' for r in args.rows] + ([] if args.skip_rl else ['b'])


def case_label(name: str) -> str:
  if name == 'b':
    b = CASE_B
    return (
      f'B: {b["prompts"]}x{b["samples"]} slots, P={b["width"]}, {b["rounds"]} rounds'
    )
  return f'A: B={name[1:]}, P={CASE_A["width"]}, N={NEW_TOKENS}'


def summarize(case: dict[str, Any] | None, n_params: int, peak: float) -> dict | None:
  """Best time, tokens/s and roofline fraction 2 * params * tokens / time / peak."""
  if not case:
    return None
  i = int(np.argmin(case['times']))
  best = case['times'][i]
  return {
    'times_s': case['times'],
    'best_s': best,
    'cores': case['cpu'][i] / best,
    'tokens': case['tokens'],
    'tok_s': case['tokens'] / best,
    'roofline': 2 * n_params * case['tokens'] / best / peak,
  }


def ratio(figures: dict, case: str, a: str, b: str) -> float | None:
  fa, fb = figures[a].get(case), figures[b].get(case)
  return fa['tok_s'] / fb['tok_s'] if fa and fb else None


def agreement(ref: list[list[int]], got: list[list[int]]) -> str:
  ref_a, got_a = np.asarray(ref), np.asarray(got)
  if ref_a.shape != got_a.shape:
    return f'shape {got_a.shape} vs {ref_a.shape}'
  same = ref_a == got_a
  prefix = int(np.cumprod(same, axis=1).sum(axis=1).min())
  return (
    f'{int(same.all(axis=1).sum())}/{len(ref_a)} rows identical'
    f' ({same.mean():.0%} of tokens; every row agrees on its first {prefix})'
  )


def report(
  figures: dict[str, dict[str, dict | None]], args: argparse.Namespace
) -> dict[str, Any]:
  """Prints the table and the ratios against the targets; returns the ratios."""
  print(
    f'\n{"case":<34} {"system":<13} {"tokens":>7} {"best s":>8} {"tok/s":>8}'
    f' {"roofline":>9} {"cores":>6}'
  )
  for case in case_names(args):
    label = case_label(case)
    for system in SYSTEMS:
      if case == 'b' and system == 'transformers':
        continue  # case B compares the two JAX samplers
      f = figures[system].get(case)
      cells = (
        f'{f["tokens"]:>7} {f["best_s"]:>8.2f} {f["tok_s"]:>8.0f}'
        f' {f["roofline"]:>9.1%} {f["cores"]:>6.2f}'
        if f
        else f'{"-":>7} {"-":>8} {"-":>8} {"-":>9} {"-":>6}  not measured'
      )
      print(f'{label:<34} {system:<13} {cells}')
      label = ''

  print()
  ratios: dict[str, Any] = {}
  for case in case_names(args):
    target = TARGET_B if case == 'b' else TARGET_A
    pairs = [('ours', 'tunix')]
    if case != 'b':
      pairs += [('ours', 'transformers'), ('tunix', 'transformers')]
    cells = []
    for a, b in pairs:
      r = ratio(figures, case, a, b)
      ratios[f'{case}:{a}/{b}'] = r
      cells.append(f'{a}/{b} ' + ('n/a' if r is None else f'{r:.2f}x'))
    r = ratios[f'{case}:ours/tunix']
    verdict = 'not measured' if r is None else ('PASS' if r >= target else 'FAIL')
    print(
      f'{case:<5} '
      + '   '.join(cells)
      + f'   target ours >= {target}x tunix: {verdict}'
    )
  return ratios


def _cpu_name() -> str:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def make_inputs(args: argparse.Namespace) -> dict[str, np.ndarray]:
  """The prompts of every case, fixed by seed 0 (tunix gets the same via .npz)."""
  rs = np.random.RandomState(0)
  a, b = CASE_A, CASE_B
  data: dict[str, np.ndarray] = {}
  for rows in args.rows:
    data[f'a{rows}_tokens'], data[f'a{rows}_mask'] = left_padded(
      rs, rows, a['width'], a['min_len'], a['max_len']
    )
  if not args.skip_rl or args.profile:
    w = b['width']
    data['b_tokens'], data['b_mask'] = left_padded(rs, b['prompts'], w, w, w)
  if not args.skip_long:
    w = LONG['width']
    data['long_tokens'], data['long_mask'] = left_padded(rs, LONG['prompts'], w, w, w)
  data['sanity_tokens'] = data[f'a{args.rows[0]}_tokens'][:SANITY_ROWS]
  data['sanity_mask'] = data[f'a{args.rows[0]}_mask'][:SANITY_ROWS]
  return data


def main(argv: list[str]) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--quick', action='store_true', help='one timed run per figure')
  p.add_argument('--skip-tunix', action='store_true', help='ours vs transformers only')
  p.add_argument('--skip-rl', action='store_true', help='case A only')
  p.add_argument('--repeats', type=int, default=None, help='timed runs, case A (3)')
  p.add_argument('--rl-repeats', type=int, default=1, help='timed runs, case B')
  p.add_argument('--tunix-python', default=None, help='python of the tunix venv')
  p.add_argument('--json', default=None, help='write all figures to this file')
  p.add_argument(
    '--ours-only', action='store_true', help='no tunix, no transformers (no sanity)'
  )
  p.add_argument('--skip-long', action='store_true', help='no long-response case')
  p.add_argument(
    '--profile', action='store_true', help='per-piece decode step times (ours)'
  )
  p.add_argument(
    '--profile-repeats',
    type=int,
    default=PROFILE_REPEATS,
    help='timed calls per piece / step (best taken)',
  )
  args = p.parse_args(argv)
  if args.repeats is None:
    args.repeats = 1 if args.quick else 3
  args.rows = list(CASE_A['rows'])

  import jax
  import torch
  import transformers

  transformers.utils.logging.disable_progress_bar()
  transformers.utils.logging.set_verbosity_error()
  load_start = os.getloadavg()[0]
  tmp = tempfile.TemporaryDirectory(prefix='sampler_bench_')
  model_dir = os.path.join(tmp.name, 'model')
  log('building the model')
  n_params = build_model(model_dir)
  data = make_inputs(args)
  inputs = os.path.join(tmp.name, 'inputs.npz')
  np.savez(inputs, **data)
  log('measuring the matmul peak')
  peak = matmul_peak()

  raw: dict[str, Any] = {}
  tunix_line = 'tunix: skipped (--skip-tunix)'
  args.skip_tunix |= args.ours_only
  exe = None if args.skip_tunix else tunix_python(args)
  if exe and not os.path.exists(exe):
    tunix_line = (
      f'tunix: not measured, no python at {exe}; create the venv (repo root) with\n'
      f'  {_TUNIX_INSTALL}\nor pass --tunix-python / set TUNIX_PYTHON'
    )
    exe = None
  elif exe is not None:
    # tunix first and alone: one process at a time on the cores.
    log(f'tunix: running {_PEER.name} with {exe}')
    raw['tunix'], err = run_tunix(exe, model_dir, inputs, args)
    if raw['tunix'] is None:
      tunix_line = f'tunix: FAILED with {exe} ({err})'
    else:
      v = raw['tunix']['versions']
      tunix_line = (
        f'tunix {v["tunix"]} (jax {v["jax"]}, flax {v["flax"]}) from'
        f' {raw["tunix"]["tunix_path"]}, run by {exe}'
      )

  if not args.ours_only:
    raw['transformers'] = run_transformers(model_dir, data, args)
  try:
    from ada_jax import sampler  # noqa: F401
  except ImportError as e:
    log(f'ours: not measured ({e})')
  else:
    raw['ours'] = run_ours(model_dir, data, args)
    if not args.skip_long:
      raw['long'] = run_long(model_dir, data, args)
    if args.profile:
      raw['profile'] = run_profile(model_dir, data, args)
  peak = max(peak, matmul_peak())  # once more at the end: the better of the two
  log('done')

  print(__doc__.splitlines()[0])
  print(
    f'machine: {_cpu_name()}, {os.cpu_count()} CPUs; load average {load_start:.1f}'
    f' at start, {os.getloadavg()[0]:.1f} at end (other processes skew every figure)'
  )
  print(
    f'ours: ada_jax.sampler on JAX {jax.__version__} ({jax.devices()[0].platform});'
    f' transformers {transformers.__version__} on torch {torch.__version__}'
    f' ({torch.get_num_threads()} threads)'
  )
  print(tunix_line)
  print(
    f'model: Qwen2-shaped, {MODEL["num_hidden_layers"]} layers, hidden'
    f' {MODEL["hidden_size"]}, {MODEL["num_attention_heads"]} heads of'
    f' {MODEL["head_dim"]}, {MODEL["num_key_value_heads"]} KV heads, MLP'
    f' {MODEL["intermediate_size"]}, vocab {MODEL["vocab_size"]}, tied, fp32:'
    f' {n_params / 1e6:.2f}M params (safetensors, loaded by each system)'
  )
  print(
    f'fp32 matmul peak (jitted jnp.dot 2048x2048, best of 2 x 5): {peak / 1e9:.1f}'
    f' GFLOP/s; roofline = 2 x params x generated tokens / time / peak'
  )
  print(
    f'timing: one warm-up call (compile), then best of {args.repeats} (case A) /'
    f' {args.rl_repeats} (case B) timed runs; case B warm-up is one round;'
    f' cores = CPU s / wall s of that run'
  )

  ref = raw.get('transformers') or {}
  if ref:
    print(f'\nsanity vs transformers, first {SANITY_ROWS} rows of case A:')
  if raw.get('tunix') and ref:
    got = raw['tunix']['sanity']
    diff = float(np.abs(np.asarray(got['last_logits']) - ref['last_logits']).max())
    print(f'  tunix: last-prompt-token logits max |diff| {diff:.1e}')
    print(
      f'  tunix: {SANITY_NEW} greedy tokens, {agreement(ref["greedy"], got["greedy"])}'
    )
  if raw.get('ours') and ref:
    print(
      f'  ours:  {SANITY_NEW} greedy tokens, {agreement(ref["greedy"], raw["ours"]["greedy"])}'
    )

  figures: dict[str, dict[str, dict | None]] = {s: {} for s in SYSTEMS}
  for system in SYSTEMS:
    for case in case_names(args):
      figures[system][case] = summarize(
        (raw.get(system) or {}).get(case), n_params, peak
      )
  ratios = report(figures, args)
  if raw.get('long'):
    print_long(raw['long'])
  if raw.get('profile'):
    print_profile(raw['profile'])

  if args.json:
    with open(args.json, 'w') as f:
      out = {
        'peak_flops': peak,
        'params': n_params,
        'figures': figures,
        'ratios': ratios,
        'long': raw.get('long'),
        'profile': raw.get('profile'),
        'load_average': os.getloadavg(),
      }
      json.dump(out, f, indent=1)
  tmp.cleanup()


if __name__ == '__main__':
  main(sys.argv[1:])
