"""Real TPU topologies on a CPU host: meshes, per-host feeding, TPU programs.

libtpu (requirements-test.txt) describes a pod's devices without a chip
(`infra.tpu_pods`): their `process_index` and physical coordinates, and the
TPU compiler compiles for them ahead of time. The platform is set
explicitly here (the programs' target is `ModelConfig.platform='tpu'`; the
host backend stays CPU), and libtpu's complaints about a missing TPU VM are
quieted by `tpu_pods`, so the CPU suite is unaffected.

- Every preset of every paper config and of the tiny config builds its mesh
  on the pod's real devices, and every process feeds exactly its devices'
  rows (simulated per process from the devices' `process_index`), for the
  example pods and for every size of each generation.
- TPU-target programs of a reduced model compile for one topology per
  generation; a paper config's programs use splash and the stacked decode
  cache in the TPU-compiled HLO, the tiny config's T = 26 stays dense.
"""

import dataclasses
import itertools
import re

import jax.numpy as jnp
import numpy as np
import pytest

from ada_jax import attention, from_config, plan, sharding
from ada_jax import model as model_lib
from ada_jax.infra import multihost, tpu_pods
from ada_jax.planner import chips
from ada_jax.planner import memory as memory_plan
from configs import common

PAPER = (
  'qwen25_math_1p5b',
  'llama32_3b_instruct',
  'qwen3_4b_instruct',
  'qwen25_math_7b',
)
# Every size the generations offer, small to large (the example pods first).
SIZES = {
  'v4': ('v4-8', 'v4-16', 'v4-32', 'v4-64', 'v4-128', 'v4-256'),
  'v5p': ('v5p-8', 'v5p-16', 'v5p-32', 'v5p-64', 'v5p-128', 'v5p-256'),
  'v5e': ('v5litepod-1', 'v5litepod-4', 'v5litepod-8', 'v5e-16', 'v5e-32', 'v5e-64',
          'v5e-128', 'v5e-256'),
  'v6e': ('v6e-8', 'v6e-16', 'v6e-32', 'v6e-64', 'v6e-128', 'v6e-256'),
}  # fmt: skip


def _feeds_every_row(mesh, rows: int) -> list[list[tuple[int, int]]]:
  """Simulates each process's `multihost.global_rows` on a pod's mesh.

  For each process, the blocks its devices take from the whole host array
  (every process holds all rows) must be exactly those devices' rows; all
  processes together cover every row on every replica. Returns each
  process's row blocks.
  """
  sh = multihost.rows_sharding(mesh, rows)
  host = np.arange(rows)
  index_map = sh.devices_indices_map((rows,))
  per_process = []
  seen = np.zeros(rows, int)
  for p in sorted({d.process_index for d in mesh.devices.flat}):
    mine = {d: ix for d, ix in index_map.items() if d.process_index == p}
    assert mine, p
    for ix in mine.values():
      block = host[ix]  # What the callback hands the device.
      np.testing.assert_array_equal(block, np.arange(rows)[ix])
      seen[block] += 1
    blocks = multihost.row_blocks(sh, rows, process_index=p)
    held = np.concatenate([np.arange(lo, hi) for lo, hi in blocks])
    assert set(held) == set(np.concatenate([host[ix] for ix in mine.values()]))
    per_process.append(blocks)
  # Every row on as many devices as hold any row (tensor replicas).
  block = len(host[next(iter(index_map.values()))])
  assert (seen == len(index_map) * block // rows).all()
  return per_process


def test_pods_by_accelerator_type():
  p = tpu_pods.pod('v5p-64')
  assert (p.generation, p.chips, p.topology, p.hosts) == ('v5p', 32, 'v5p:2x4x4', 8)
  assert tpu_pods.pod('v4-32').topology == 'v4:2x2x4'
  assert tpu_pods.pod('v5litepod-16') == dataclasses.replace(
    tpu_pods.pod('v5e-16'), accelerator='v5litepod-16'
  )
  assert (tpu_pods.pod('v6e-8').hosts, tpu_pods.pod('v6e-64').hosts) == (1, 16)
  for bad in ('v3-8', 'v5p-6', 'v4-4', 'v6e-512', 'tpu'):
    with pytest.raises(ValueError, match=re.escape(repr(bad))):
      tpu_pods.pod(bad)
  for gen, names in SIZES.items():
    for name in names:
      pod = tpu_pods.pod(name)
      devs = tpu_pods.devices(pod)
      assert len(devs) == pod.chips and pod.generation == gen
      hosts = sorted({d.process_index for d in devs})
      assert hosts == list(range(pod.hosts)), name
      assert all(
        sum(d.process_index == h for d in devs) == pod.chips_per_host_count
        for h in hosts
      )
  assert set(SIZES) <= set(chips.CHIPS)  # The planner knows every generation.


@pytest.mark.parametrize('name', [*PAPER, 'tiny_arith'])
def test_every_preset_meshes_and_feeds_on_the_real_topology(name):
  """The rule's mesh on the example pods' devices; every host feeds its rows."""
  variants = ('balance', 'dapo', 'grpo') if name != 'tiny_arith' else ('balance',)
  for pod_name, variant in itertools.product(common.EXAMPLE_PODS, variants):
    c = from_config.load(f'configs/{name}.py:tpu={pod_name},variant={variant}')
    pod = tpu_pods.pod(pod_name)
    cfg = plan.model_config(c, name)
    hbm = chips.CHIPS[pod.generation].hbm_gib * 2**30
    from_config.resolve_layout(c, cfg, pod.chips, hbm, 'tpu', refuse=False)
    shape = memory_plan.resolve_mesh(dict(c.mesh), pod.chips)
    mesh = sharding.make_mesh(shape, tpu_pods.devices(pod))
    assert mesh.devices.size == pod.chips
    dp = shape[0] * shape[1]
    assert c.rl.micro_batch_rows % dp == 0 and c.rl.slots % dp == 0
    assert cfg.num_kv_heads % shape[2] == 0
    blocks = _feeds_every_row(mesh, c.rl.prompts_per_step)
    _feeds_every_row(mesh, c.rl.slots)
    if (name, pod_name, variant, shape[2]) == (
      'qwen25_math_1p5b',
      'v5p-64',
      'balance',
      1,
    ):
      # The case the old per-host slicing refused: host 0's rows in 4 blocks.
      assert blocks[0] == [(0, 16), (64, 80), (256, 272), (320, 336)]


@pytest.mark.parametrize('gen', sorted(SIZES))
def test_meshes_on_every_pod_size(gen):
  """1.5B and 7B layouts, any tensor axis the rule may pick, on every size."""
  for name in SIZES[gen]:
    pod = tpu_pods.pod(name)
    devs = tpu_pods.devices(pod)
    for tensor in (1, 2, 4):
      if pod.chips % tensor:
        continue
      mesh = sharding.make_mesh((1, -1, tensor), devs)
      _feeds_every_row(mesh, 512)


def _count_mosaic(compiled) -> int:
  return len(re.findall(r'custom_call_target="tpu_custom_call"', compiled.as_text()))


_REDUCED = model_lib.ModelConfig(
  model_type='qwen2',
  vocab_size=1024,
  hidden_size=256,
  intermediate_size=512,
  num_layers=1,
  num_heads=2,
  num_kv_heads=2,
  head_dim=128,
  qkv_bias=True,
  dtype=jnp.bfloat16,
  remat='block',
  platform='tpu',
  max_position_embeddings=1024,
)


@pytest.mark.parametrize('pod_name', ['v4-8', 'v5p-8', 'v5litepod-4', 'v6e-8'])
def test_reduced_model_compiles_for_each_generation(pod_name):
  """A 1-layer model's update, old-logp, prefill and round, TPU-compiled per chip.

  T = 512 (splash in the training forward) and N = 256 (4 decode blocks: the
  stacked response cache).
  """
  pod = tpu_pods.pod(pod_name)
  mesh = sharding.make_mesh((1, -1, 1), tpu_pods.devices(pod))
  dp = mesh.shape['fsdp']
  shapes = memory_plan.StepShapes(
    prompts=2 * dp,
    prompt_len=256,
    new_tokens=256,
    slots=4 * dp,
    max_rounds=1,
    rows=4 * dp,
    mini_batch_rows=2 * dp,
    micro_batch_rows=dp,
  )
  assert attention.resolve('auto', 512, 512, 'tpu') == 'splash'
  programs = plan.compiled_programs(
    _REDUCED, shapes, mesh, ('old_logp', 'update', 'prefill', 'sampling')
  )
  assert _count_mosaic(programs['old_logp']) >= 1
  assert _count_mosaic(programs['update']) >= 2  # Forward and backward kernels.
  assert _count_mosaic(programs['sampling']) == 0  # Decode is plain XLA.
  for compiled in programs.values():
    assert plan._memory(compiled).total > 0


def test_a_program_larger_than_the_chip_is_refused_with_its_figures():
  """The TPU compiler refuses a program whose temporaries exceed HBM: it says so.

  The reduced model's prefill of 32,768 prompts x 1,024 tokens on v5e-4
  (16 GiB chips): `compiled_phases` returns the refusal's figures (it used
  to raise), and the plan agrees with them.
  """
  pod = tpu_pods.pod('v5litepod-4')
  mesh = sharding.make_mesh((1, -1, 1), tpu_pods.devices(pod))
  shapes = memory_plan.StepShapes(
    prompts=32768,
    prompt_len=1024,
    new_tokens=256,
    slots=32768,
    max_rounds=1,
    rows=16,
    mini_batch_rows=16,
    micro_batch_rows=4,
  )
  got = plan.compiled_phases(_REDUCED, shapes, mesh, ('prefill',))['prefill']
  hbm = chips.CHIPS[pod.generation].hbm_gib * 2**30
  assert got.refused and got.temp > hbm, got
  planned = memory_plan.plan(_REDUCED, shapes, (1, 4, 1), backend='tpu')
  ratio = planned.program_bytes('prefill') / got.total
  assert 0.75 <= ratio <= 1.25, ratio


@pytest.mark.parametrize(
  'name,pod_name,shape',
  [
    ('qwen25_math_1p5b', 'v5p-64', (1, 32, 1)),  # The preset: 32-way gathers.
    ('qwen25_math_7b', 'v4-32', (1, 4, 4)),  # Its preset: 4-way, untied head.
    ('qwen25_math_1p5b', 'v4-32', (16, 1, 1)),  # Nothing to gather.
  ],
)
def test_the_reshard_is_compiled_into_the_copy_the_rounds_take(name, pod_name, shape):
  """The step's reshard, TPU-compiled at 2 layers of a paper model, as planned.

  `plan.compile_reshard` lowers the trainer's own `Resharder` (SAMPLE_RULES,
  cast to the compute dtype) on the training layout's params: its outputs
  are the sampling copy the prefill and the rounds are compiled for (same
  shardings, compute-dtype weights), and the plan's reshard phase is within
  0.75-1.25 of the program (a phase the plan did not have: it planned
  nothing for it).
  """
  import jax
  from flax import nnx

  pod = tpu_pods.pod(pod_name)
  c = from_config.load(f'configs/{name}.py:tpu={pod_name}')
  cfg = dataclasses.replace(plan.model_config(c, name), num_layers=2, platform='tpu')
  mesh = sharding.make_mesh(shape, tpu_pods.devices(pod))
  exe = plan.compile_reshard(cfg, mesh)
  out = jax.tree.leaves(exe.out_info[0])
  want = jax.tree.leaves(nnx.state(plan.sampling_model(cfg, mesh)))
  assert [(o.shape, o.dtype) for o in out] == [(w.shape, w.dtype) for w in want]
  assert jnp.dtype(jnp.bfloat16) in {o.dtype for o in out}
  got_sh = jax.tree.leaves(exe.output_shardings[0])
  for sh, w in zip(got_sh, want, strict=True):
    assert sh.is_equivalent_to(w.sharding, len(w.shape)), (sh, w.sharding)
  got = plan._memory(exe)
  shapes = dataclasses.replace(
    from_config.step_shapes(c, cfg), micro_batch_rows=shape[0] * shape[1]
  )
  planned = memory_plan.plan(cfg, shapes, shape, backend='tpu')
  ratio = planned.program_bytes('reshard') / got.total
  assert 0.75 <= ratio <= 1.25, ratio


def test_top_p_filter_sorts_whole_rows_on_a_tensor_split_vocab():
  """The filter costs a round a few [S/dp, V/tensor] copies, whatever the vocab.

  Qwen3's 151,936-entry vocab split over tensor 8 (v4-32 at (1, 2, 8)): with
  the sort left on the vocab-split logits, the filter added about 39 such
  fp32 copies to a round (libtpu gathered the whole vocab for the sort); with
  the slots moved over the tensor axis for the sort
  (sampler._filter_sharding), about 9.
  """
  cfg = dataclasses.replace(
    _REDUCED, vocab_size=151936, num_heads=8, num_kv_heads=8, hidden_size=512
  )
  mesh = sharding.make_mesh((1, 2, 8), tpu_pods.devices(tpu_pods.pod('v4-32')))
  slots, new = 512, 16
  total = {}
  for filt in (False, True):
    compiled = plan.compile_round(
      cfg, mesh, prompts=8, prompt_len=128, slots=slots, new_tokens=new,
      filter_logits=filt,
    )  # fmt: skip
    total[filt] = plan._memory(compiled).total
  share = (slots // 2) * (cfg.vocab_size // 8) * 4  # one fp32 [S/dp, V/tensor]
  assert (total[True] - total[False]) / share < 12


def test_paper_config_targets_splash_and_the_stacked_cache():
  """`--target tpu` at a paper config's lengths, 1 layer, a smaller batch.

  T = 1024 + 2048 resolves to splash on TPU (Mosaic calls in the compiled
  old-logp pass), the 2048-token response is held stacked [S, G, N, K] (its
  shape in the compiled round); on CPU the same config resolves to chunked
  attention and a cache in blocks. The tiny config's T = 26 is dense on
  every platform and compiles no Mosaic call.
  """
  c = from_config.load(
    'configs/qwen25_math_1p5b.py:tpu=v5p-8',
    [
      '--config.rl.prompts_per_step=8',
      '--config.rl.slots=64',
      '--config.rl.mini_batch_rows=16',
      '--config.rl.micro_batch_rows=4',
      '--config.mesh.tensor=1',
    ],
  )
  cfg = dataclasses.replace(
    plan.model_config(c, 'qwen25_math_1p5b'), num_layers=1, platform='tpu'
  )
  shapes = from_config.step_shapes(c, cfg)
  pod = tpu_pods.pod('v5p-8')
  mesh = sharding.make_mesh((1, 4, 1), tpu_pods.devices(pod))
  t = shapes.prompt_len + shapes.new_tokens
  assert attention.resolve(cfg.attention, t, t, 'tpu') == 'splash'
  assert attention.resolve(cfg.attention, t, t, 'cpu') == 'chunked'
  n = shapes.new_tokens
  assert not attention.round_cache_blocked(n, 'tpu')
  assert attention.round_cache_blocked(n, 'cpu')
  programs = plan.compiled_programs(cfg, shapes, mesh, ('old_logp', 'sampling'))
  assert _count_mosaic(programs['old_logp']) >= 1
  s_dev = shapes.slots // 4
  stacked = f'bf16[{s_dev},{cfg.num_kv_heads},{n},{cfg.head_dim}]'
  assert stacked in programs['sampling'].as_text()

  tiny = from_config.load('configs/tiny_arith.py:tpu=v5p-8')
  tcfg = dataclasses.replace(plan.model_config(tiny, 'tiny_arith'), platform='tpu')
  tt = tiny.data.prompt_bucket + tiny.sampling.max_new_tokens
  for platform in ('tpu', 'gpu', 'cpu'):
    assert attention.resolve(tcfg.attention, tt, tt, platform) == 'dense'
  tshapes = dataclasses.replace(
    from_config.step_shapes(tiny, tcfg), micro_batch_rows=4, mini_batch_rows=64
  )
  got = plan.compiled_programs(tcfg, tshapes, mesh, ('old_logp',))['old_logp']
  assert _count_mosaic(got) == 0


@pytest.mark.parametrize('name', PAPER)
def test_pod_check_on_every_process_of_the_example_pods(name):
  """`plan --pod-check`'s function, run here for each process of each pod.

  What fits passes on every process; a pod where nothing fits fails on every
  process with the plan's line, and passes (reported) with --ignore-plan.
  """
  for pod_name in common.EXAMPLE_PODS:
    pod = tpu_pods.pod(pod_name)
    devs = tpu_pods.devices(pod)
    hbm = chips.CHIPS[pod.generation].hbm_gib * 2**30
    spec = f'configs/{name}.py:tpu={pod_name}'
    fits = None
    for process in range(pod.hosts):
      done, problems = plan.pod_check(from_config.load(spec), spec, devs, process, hbm)
      if fits is None:
        fits = not problems
      assert fits == (not problems), (pod_name, process, problems)
      if fits:
        assert done[0].startswith('mesh (') and done[-1].endswith('fits'), done
        assert any(f'of {512} prompt rows' in d for d in done), done
      else:
        (line,) = problems
        assert line.startswith('config mesh.tensor=0: the step does not fit')
    if not fits:
      done, problems = plan.pod_check(
        from_config.load(spec), spec, devs, 0, hbm, ignore_plan=True
      )
      assert not problems and 'does NOT fit (--ignore-plan)' in done[-1], done
  wrong = tpu_pods.devices(tpu_pods.pod('v5p-8'))
  spec = f'configs/{name}.py:tpu=v5p-64'
  _, problems = plan.pod_check(from_config.load(spec), spec, wrong, 0, 95 * 2**30)
  assert problems == ['v5p-64 has 32 chips; this pod has 4 devices']


def test_missing_libtpu_is_one_line_naming_the_install(monkeypatch):
  import sys

  monkeypatch.setitem(sys.modules, 'libtpu', None)  # `import libtpu` fails.
  with pytest.raises(RuntimeError, match=r"needs libtpu: pip install 'libtpu==") as e:
    tpu_pods.devices.__wrapped__(tpu_pods.pod('v5p-64'))
  assert len(str(e.value).splitlines()) == 1
  c = from_config.load('configs/qwen25_math_1p5b.py:tpu=v5p-64')
  monkeypatch.setattr(tpu_pods, 'devices', tpu_pods.devices.__wrapped__)
  with pytest.raises(ValueError, match=r'^compiling for TPU v5p-64 needs libtpu'):
    plan.check_devices(c, 32, 'tpu')
