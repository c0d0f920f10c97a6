"""Tests for ada_jax.evaluate: the Ave@k / pass@k arithmetic, and end to end.

The end-to-end tests evaluate the tiny config's random model from a run
workdir checkpoint and from its Hugging Face export, on a five-row local
file (`ada_math_local/custom`), which is also the run's training set (so
no ada_arith build is needed).
"""

import json
import math
import pathlib

import numpy as np
import pytest
from flax import nnx

from ada_jax import evaluate, from_config, hf
from ada_jax.infra import storage

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORRECT = np.array(
  [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], bool
)  # Q=3 problems x k=4 samples.


def test_ave_and_pass_at_k_by_hand():
  r = evaluate.score_set(CORRECT)
  assert r['problems'] == 3
  assert r['ave_at_k'] == pytest.approx(6 / 12)
  # pass@j = 1 - C(n - c, j) / C(n, j) per problem, c = 2, 0, 4 of n = 4.
  assert r['pass_at']['1'] == pytest.approx((2 / 4 + 0 + 1) / 3)
  assert r['pass_at']['2'] == pytest.approx((1 - 1 / 6 + 0 + 1) / 3)
  assert r['pass_at']['4'] == pytest.approx((1 + 0 + 1) / 3)
  assert list(r['pass_at']) == ['1', '2', '4']
  assert evaluate.pass_budgets(32) == [1, 2, 4, 8, 16, 32]
  assert evaluate.pass_budgets(6) == [1, 2, 4, 6]
  three = evaluate.pass_at_k(6, np.array([1]), 3)
  assert three[0] == pytest.approx(1 - math.comb(5, 3) / math.comb(6, 3))
  with pytest.raises(ValueError, match='pass@5'):
    evaluate.pass_at_k(4, np.array([1]), 5)


def test_weighted_average_uses_paper_sizes():
  results = {
    'math500': evaluate.score_set(CORRECT),  # Ave 0.5, weight 500.
    'aime_like': evaluate.score_set(np.zeros((2, 4), bool)),  # 0.0, weight 230.
    'custom': evaluate.score_set(np.ones((5, 4), bool)),  # 1.0, weight 5 (size).
  }
  w = evaluate.weighted(results)
  assert w['weights'] == {'math500': 500, 'aime_like': 230, 'custom': 5}
  assert w['ave_at_k'] == pytest.approx((500 * 0.5 + 0 + 5 * 1.0) / 735)
  assert w['pass_at']['4'] == pytest.approx((500 * 2 / 3 + 0 + 5) / 735)
  # Table 1, Qwen2.5-Math-1.5B GRPO row: 74.2 / 34.4 / 38.4 / 16.2 -> 45.3
  # (the table's per-set values are rounded, so within 0.1).
  table = {
    name: {'problems': 1, 'ave_at_k': v, 'pass_at': {}}
    for name, v in zip(
      evaluate.PAPER_WEIGHTS, (0.742, 0.344, 0.384, 0.162), strict=True
    )
  }
  assert 100 * evaluate.weighted(table)['ave_at_k'] == pytest.approx(45.3, abs=0.1)


def test_dataset_names():
  assert evaluate.dataset_split('math500') == ('ada_math_local/math500', 'test')
  assert evaluate.dataset_split('custom') == ('ada_math_local/custom', 'train')
  assert evaluate.dataset_split('ada_arith') == ('ada_arith', 'test')
  assert evaluate.dataset_split('ada_arith:test[:4]') == ('ada_arith', 'test[:4]')
  with pytest.raises(ValueError, match='unknown set'):
    evaluate.dataset_split('gsm8k')


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """A tiny-config workdir with one checkpoint, its HF export, local data."""
  root = tmp_path_factory.mktemp('eval')
  manual = root / 'manual' / 'custom'
  manual.mkdir(parents=True)
  rows = [('2+3', '5'), ('7*6', '42'), ('9-4', '5'), ('8+8', '16'), ('3*3', '9')]
  (manual / 'rows.jsonl').write_text(
    ''.join(json.dumps({'problem': p, 'answer': a}) + '\n' for p, a in rows)
  )
  overrides = [
    f'--config.data.data_dir={root / "tfds"}',
    f'--config.data.manual_dir={root / "manual"}',
    '--config.data.name=ada_math_local/custom',
    '--config.data.eval_split=',
    '--config.data.levels=',  # The tiny task's band of ada_arith levels.
    '--config.rl.prompts_per_step=4',
    '--config.rl.mini_batch_rows=16',
    '--config.rl.micro_batch_rows=16',
  ]
  c = from_config.load(
    str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format', overrides
  )
  workdir = str(root / 'run')
  trainer = from_config.trainer(c, workdir)
  trainer.save(force=True)
  trainer.ckpt.wait()
  hf_dir = str(root / 'hf')
  hf.save_model(trainer.model, hf_dir)
  return {'root': root, 'workdir': workdir, 'hf': hf_dir, 'overrides': overrides}


def _argv(run, checkpoint, out, *extra):
  return [
    '--config',
    str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format',
    '--checkpoint',
    checkpoint,
    '--datasets',
    'custom,custom:train[:3]',
    '--k',
    '3',
    '--max-new-tokens',
    '8',
    '--slots',
    '8',
    '--out',
    str(out),
    *run['overrides'],
    *extra,
  ]


def test_graders_per_set():
  names = ['math500', 'minerva_math', 'ada_math_local/minerva_math:test[:5]']
  names += ['olympiadbench', 'aime_like', 'custom']
  assert [evaluate.grader_for(n, 'ada') for n in names] == ['ada'] * 6
  assert [evaluate.grader_for(n, 'reference') for n in names] == [
    'math_verify_eval',
    'qwen',
    'qwen',
    'math_verify_eval',
    'math_verify_eval',
    'math_verify_eval',
  ]
  with pytest.raises(ValueError, match='--graders'):
    evaluate.grader_for('math500', 'qwen')


def test_evaluate_workdir_writes_json_and_markdown(run, caplog):
  # The reference's graders: Math-Verify on both sets (neither is Minerva).
  out = run['root'] / 'out_workdir'
  evaluate.main(_argv(run, run['workdir'], out, '--graders', 'reference'))
  report = json.loads((out / 'eval.json').read_text())
  assert report['graders'] == ['reference'] and report['paper_graders'] == 'reference'
  assert {r['grader'] for r in report['datasets'].values()} == {'math_verify_eval'}
  assert {'checkpoint', 'step', 'k', 'temperature', 'max_new_tokens'} <= set(report)
  assert report['k'] == 3 and report['temperature'] == 1.0
  assert report['max_new_tokens'] == 8
  assert set(report['datasets']) == {'custom', 'custom:train[:3]'}
  custom = report['datasets']['custom']
  assert custom['problems'] == 5 and custom['split'] == 'train'
  assert report['datasets']['custom:train[:3]']['problems'] == 3
  assert set(custom['pass_at']) == {'1', '2', '3'}
  assert 0.0 <= custom['ave_at_k'] <= custom['pass_at']['3'] <= 1.0
  assert report['weighted']['weights'] == {'custom': 5, 'custom:train[:3]': 3}
  md = (out / 'eval.md').read_text()
  assert '| set | grader | problems | Ave@3 | pass@1 | pass@2 | pass@3 |' in md
  assert (
    '| custom | Math-Verify (paper) | 5 |' in md and '| weighted avg |  | 8 |' in md
  )
  assert 'graders: reference' in md


def test_evaluate_caps_new_tokens_and_matches_hf_export(run, caplog):
  c = from_config.load(
    str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format', run['overrides']
  )

  backends = []

  def even_length(responses, references, **kw):  # An oracle of the texts.
    backends.append(kw.get('backend', 'ada'))
    return np.array([len(r) % 2 == 0 for r in responses])

  kw = dict(k=2, slots=8, temperature=0.0, verify_fn=even_length)
  a = evaluate.evaluate(
    c, run['workdir'], ['custom'], out_dir=str(run['root'] / 'a'), **kw
  )
  assert 'capped at 48' in caplog.text  # 64 positions - 16 prompt bucket.
  assert a['max_new_tokens'] == 48
  c.model.hf_path = run['hf']
  c.model.tokenizer_path = str(pathlib.Path(run['workdir']) / 'tokenizer')
  b = evaluate.evaluate(c, run['hf'], ['custom'], out_dir=str(run['root'] / 'b'), **kw)
  assert b['step'] == 0
  assert b['datasets']['custom'] == a['datasets']['custom']
  assert set(backends) == {'ada'} and a['datasets']['custom']['grader'] == 'ada'


def test_users_slots_that_the_plan_says_do_not_fit_are_refused(run, monkeypatch):
  """A chunk (--slots) the plan says overflows the device: one line, no sampling."""
  c = from_config.load(
    str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format', run['overrides']
  )
  monkeypatch.setattr(from_config, 'pod_memory', lambda c: (None, 64.0 * 2**10))

  def never(*a, **kw):
    raise AssertionError('sampled although the chunk does not fit')

  with pytest.raises(from_config.ConfigError, match=r'^evaluate --slots 8: .* NOT fit'):
    evaluate.evaluate(
      c, run['workdir'], ['custom'], k=1, slots=8, out_dir=str(run['root'] / 'x'),
      verify_fn=never,
    )  # fmt: skip


def test_policy_is_a_compute_dtype_copy_in_the_sampling_layout(run):
  # evaluate / select_prompts read the checkpoint in the training layout and
  # sample from a copy in the compute dtype (fp32 params restored whole in
  # the sampling layout took 28.4 GiB per device for 7B): every weight
  # matrix cast, 1-D leaves (norm scales) as saved, values those of the
  # checkpoint, laid out by the sampling rules. The run and its HF export
  # alike.
  import jax
  import jax.numpy as jnp

  from ada_jax import sharding
  from ada_jax.infra import checkpoint as checkpoint_lib
  from ada_jax.infra import mesh as mesh_lib

  c = from_config.load(
    str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format',
    [*run['overrides'], '--config.model.dtype=bfloat16'],
  )
  saved = checkpoint_lib.restore_params(
    run['workdir'], nnx.state(hf.load_model(run['hf'], dtype=jnp.float32))
  )[1]
  for source in (run['workdir'], run['hf']):
    if source == run['hf']:
      c.model.hf_path = run['hf']
      c.model.tokenizer_path = str(pathlib.Path(run['workdir']) / 'tokenizer')
    state = nnx.state(from_config.policy(c, source).model)
    want = mesh_lib.state_shardings(state, from_config.mesh(c), sharding.SAMPLE_RULES)
    got_leaves = jax.tree.leaves(state)
    assert len(got_leaves) == len(jax.tree.leaves(saved))
    for x, ref, sh in zip(
      got_leaves, jax.tree.leaves(saved), jax.tree.leaves(want), strict=True
    ):
      assert x.dtype == (jnp.bfloat16 if x.ndim >= 2 else jnp.float32), source
      assert x.sharding.is_equivalent_to(sh, x.ndim), source
      np.testing.assert_array_equal(
        np.asarray(x), np.asarray(ref).astype(x.dtype), err_msg=source
      )


def test_graders_side_by_side_equal_each_grader_alone(run, caplog):
  """`--graders ada,reference`: one sampling, each grader's figures as alone.

  Graders stand in for ours and the reference's with different verdicts on
  the texts, so the two columns differ; the oracle is each grader's run on
  its own (same seed, same samples).
  """
  c = from_config.load(
    str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format', run['overrides']
  )

  def by_length(responses, references, backend='ada', **kw):
    mod = 2 if backend == 'ada' else 3  # The reference's: math_verify_eval.
    return np.array([len(r) % mod == 0 for r in responses])

  kw = dict(k=3, slots=8, max_new_tokens=8, verify_fn=by_length)
  sets = ['custom', 'custom:train[:3]']
  root = run['root']
  both = evaluate.evaluate(
    c,
    run['workdir'],
    sets,
    out_dir=str(root / 'both'),
    graders=['ada', 'reference'],
    **kw,
  )
  alone = {
    m: evaluate.evaluate(
      c, run['workdir'], sets, out_dir=str(root / m), graders=m, **kw
    )
    for m in ('ada', 'reference')
  }
  assert both['graders'] == ['ada', 'reference']
  for name in sets:
    for m in ('ada', 'reference'):
      got, want = both['datasets'][name]['by_grader'][m], alone[m]['datasets'][name]
      assert got == {k: want[k] for k in ('grader', 'ave_at_k', 'pass_at')}
    first = both['datasets'][name]
    assert first['ave_at_k'] == alone['ada']['datasets'][name]['ave_at_k']
  assert both['weighted_by_grader']['reference'] == alone['reference']['weighted']
  assert both['weighted'] == alone['ada']['weighted']
  ada, ref = (both['weighted_by_grader'][m]['ave_at_k'] for m in ('ada', 'reference'))
  assert ada != ref  # The columns are not copies of one another.
  md = (root / 'both' / 'eval.md').read_text()
  assert '| custom | ada_jax.verifier | 5 |' in md
  assert '| custom | Math-Verify (paper) | 5 |' in md
  assert '| weighted avg | reference | 8 |' in md


def test_parse_graders(monkeypatch, caplog):
  from ada_jax.verifier import backends

  assert evaluate.parse_graders(None) == ['ada', 'reference']  # The extra is here.
  assert evaluate.parse_graders('reference') == ['reference']
  for bad in ('ada,ada', 'qwen', ''):
    with pytest.raises(ValueError, match='--graders'):
      evaluate.parse_graders(bad)

  def missing():
    raise ImportError('no math_verify')

  monkeypatch.setattr(backends, 'require', missing)
  assert evaluate.parse_graders(None) == ['ada']
  assert 'need the math_verify extra' in caplog.text


def test_evaluate_reads_model_and_checkpoint_from_gs(
  run, gcs_dir, monkeypatch, tmp_path
):
  """model.hf_path, the tokenizer and --checkpoint on gs:// (the emulator).

  The same report as from the local directories; each host reads a local
  copy (ADA_LOCAL_CACHE) downloaded once. The old code refused a gs:// HF
  export ('not an HF directory either') and `model.hf_path=gs://...` ('no
  config.json there').
  """
  monkeypatch.setenv('ADA_LOCAL_CACHE', str(tmp_path / 'cache'))
  tok_dir = str(pathlib.Path(run['workdir']) / 'tokenizer')
  storage.upload_dir(run['hf'], f'{gcs_dir}/hf')
  storage.upload_dir(tok_dir, f'{gcs_dir}/tok')

  def verify(responses, references, **kw):  # An oracle of the texts.
    return np.array([len(r) % 2 == 0 for r in responses])

  kw = dict(k=2, slots=8, temperature=0.0, verify_fn=verify)
  reports = []
  for model_dir, tok in ((run['hf'], tok_dir), (f'{gcs_dir}/hf', f'{gcs_dir}/tok')):
    c = from_config.load(
      str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format', run['overrides']
    )
    c.model.hf_path, c.model.tokenizer_path = model_dir, tok
    from_config.validate(c)
    assert from_config.is_hf_dir(model_dir)
    out = str(tmp_path / f'out{len(reports)}')
    reports.append(evaluate.evaluate(c, model_dir, ['custom'], out_dir=out, **kw))
  assert reports[1]['datasets']['custom'] == reports[0]['datasets']['custom']
  cached = tmp_path / 'cache' / 'gs' / gcs_dir[len('gs://') :] / 'hf'
  assert (cached / 'model.safetensors').is_file()


def test_step_picks_a_kept_checkpoint_in_evaluate_and_export(run, tmp_path, capsys):
  """`--step N | latest | all`, the same in evaluate and export.

  A run with checkpoints at steps 0 and 1 (different params): export --step 0
  and --step 1 give those steps' weights (latest = 1); evaluate --step all
  writes one report per kept step; a step that is not kept is one line
  listing the kept ones, exit 2. Only the latest could be read before.
  """
  import jax

  from ada_jax import export
  from ada_jax.infra import checkpoint as checkpoint_lib

  c = from_config.load(
    str(ROOT / 'configs' / 'tiny_arith.py') + ':task=format', run['overrides']
  )
  workdir = str(tmp_path / 'run')
  trainer = from_config.trainer(c, workdir)
  trainer.save(force=True)
  trainer.ckpt.wait()
  trainer.step = 1
  trainer.state = jax.tree.map(lambda x: x * 0.5, trainer.state)
  trainer.save(force=True)
  trainer.ckpt.wait()
  assert checkpoint_lib.kept_steps(workdir) == [0, 1]

  weights = {}
  for step in ('0', '1', 'latest'):
    out = tmp_path / f'hf_{step}'
    export.main(['--workdir', workdir, '--out', str(out), '--step', step])
    weights[step] = hf.load_model(str(out))
  first, second, latest = (
    jax.tree.leaves(nnx.state(weights[s], nnx.Param)) for s in ('0', '1', 'latest')
  )
  for a, b, last in zip(first, second, latest, strict=True):
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a) * 0.5)
    np.testing.assert_array_equal(np.asarray(last), np.asarray(b))

  for command in (
    lambda: export.main(
      ['--workdir', workdir, '--out', str(tmp_path / 'x'), '--step', '7']
    ),
    lambda: evaluate.main(_argv(run, workdir, tmp_path / 'e7', '--step', '7')),
  ):
    with pytest.raises(SystemExit) as stop:
      command()
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith('step 7 is not a kept checkpoint (kept: 0, 1)'), err

  out = tmp_path / 'all'
  evaluate.main(_argv(run, workdir, out, '--step', 'all'))
  steps = {
    json.loads((out / f'step_{s}' / 'eval.json').read_text())['step'] for s in (0, 1)
  }
  assert steps == {0, 1}


def test_evaluate_without_checkpoint_fails(tmp_path, run):
  with pytest.raises(SystemExit, match='no checkpoint'):
    evaluate.main(_argv(run, str(tmp_path / 'empty'), tmp_path / 'o'))
