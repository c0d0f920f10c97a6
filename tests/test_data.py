"""Tests for ada_jax.data, ada_jax.prompts and the TFDS builders."""

import json
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ada_jax import data
from ada_jax import prompts as prompts_lib
from ada_jax import tokenizer as tokenizer_lib
from ada_jax.datasets import ada_arith, ada_math_local, prompt_key

_CHATML = (
  '{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}'
  '{% if add_generation_prompt %}<|assistant|>{% endif %}'
)


@pytest.fixture(scope='module')
def tiny_tok(tmp_path_factory):
  return tokenizer_lib.build_tiny_tokenizer(tmp_path_factory.mktemp('tiny_tok'))


@pytest.fixture(scope='module')
def chat_tok(tmp_path_factory):
  # The tiny tokenizer plus a chat template: enough to check the chat path.
  out = tmp_path_factory.mktemp('chat_tok')
  tokenizer_lib.build_tiny_tokenizer(out)
  (out / 'chat_template.jinja').write_text(_CHATML)
  return tokenizer_lib.load_tokenizer(out)


def _write_jsonl(path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(
    ''.join(r if isinstance(r, str) else json.dumps(r) + '\n' for r in rows)
  )


# --- ada_arith ------------------------------------------------------------


def test_arith_generator_is_deterministic_disjoint_and_correct(tiny_tok):
  a = ada_arith.generate(550, 110, seed=3)
  assert a == ada_arith.generate(550, 110, seed=3)
  assert a != ada_arith.generate(550, 110, seed=4)
  train = {r['problem'] for r in a['train']}
  test = {r['problem'] for r in a['test']}
  assert len(train) == len(a['train']) and len(test) == len(a['test'])
  assert not train & test
  assert {r['level'] for r in a['train']} == set(range(len(ada_arith.LEVELS)))
  for row in a['train'] + a['test']:
    assert row['reference'] == str(eval(row['problem']))  # Trusted text.
    assert row['prompt_key'] == prompt_key(row['problem'])
  # Short enough for the tiny model: prompt <= 24, response <= 10 tokens, also
  # for the longest operands of every level.
  widest = [lv.form.format(*(10**d - 1 for d in lv.digits)) for lv in ada_arith.LEVELS]
  for problem in widest + [r['problem'] for r in a['train']]:
    assert len(tiny_tok.encode(prompts_lib.tiny_prompt(problem))) <= 24, problem
    response = f'\\boxed{{-{abs(ada_arith.evaluate(problem))}}}'
    assert len(tiny_tok.encode(response)) + 1 <= 10, problem


def test_arith_builder_reads_back_the_generator(tmp_path, tiny_tok):
  kw = {'data_dir': tmp_path, 'num_train': 220, 'num_test': 55, 'seed': 1}
  train = data.load_examples('ada_arith', 'train', **kw)
  test = data.load_examples('ada_arith', 'test', **kw)
  rows = ada_arith.generate(220, 55, 1)
  assert sorted(e.problem for e in train) == sorted(r['problem'] for r in rows['train'])
  assert sorted(e.problem for e in test) == sorted(r['problem'] for r in rows['test'])
  by_problem = {r['problem']: r for r in rows['train']}
  for e in train:
    assert e.prompt == f'Q:{e.problem}='
    assert e.reference == by_problem[e.problem]['reference']
    assert e.level == by_problem[e.problem]['level']
    assert e.prompt_key == prompt_key(e.problem)
    assert e.source == 'ada_arith'
  # A second load reads the prepared files and gives the same order.
  assert data.load_examples('ada_arith', 'train', **kw) == train
  hist = data.level_histogram(train)
  assert sum(hist.values()) == len(train) and list(hist) == sorted(hist)


# --- ada_math_local -------------------------------------------------------


def test_math_local_prompt_set_from_parquet_and_jsonl(tmp_path, chat_tok):
  manual = tmp_path / 'manual'
  folder = manual / 'hard_7b' / 'data'
  folder.mkdir(parents=True)
  pq.write_table(
    pa.table({'problem': ['1+1?', '2+2?'], 'gt': ['2', '4']}),
    folder / 'train-00000-of-00001.parquet',
  )
  _write_jsonl(folder / 'extra.jsonl', [{'problem': 'x', 'gt': 7, 'level': 'Level 3'}])
  pq.write_table(
    pa.table({'problem': ['held out'], 'gt': ['0']}),
    folder / 'test-00000-of-00001.parquet',
  )
  kw = {'data_dir': tmp_path / 'tfds', 'manual_dir': manual, 'tokenizer': chat_tok}
  train = data.load_examples('ada_math_local/hard_7b', 'train', **kw)
  got = {e.problem: e for e in train}
  assert {p: e.reference for p, e in got.items()} == {
    '1+1?': '2',
    '2+2?': '4',
    'x': '7',
  }
  assert got['x'].level == 3 and got['1+1?'].level == -1
  assert got['1+1?'].prompt == (
    f'<|system|>{prompts_lib.SYSTEM_PROMPT}\n'
    f'<|user|>1+1?{prompts_lib.USER_SUFFIX}\n<|assistant|>'
  )
  assert got['1+1?'].source == 'ada_math_local/hard_7b'
  test = data.load_examples('ada_math_local/hard_7b', 'test', **kw)
  assert [e.problem for e in test] == ['held out']
  # Once built, the manual files are no longer needed.
  kw['manual_dir'] = tmp_path / 'gone'
  assert data.load_examples('ada_math_local/hard_7b', 'train', **kw) == train


def test_math_local_eval_answer_and_solution_fields(tmp_path, tiny_tok):
  manual = tmp_path / 'manual'
  _write_jsonl(
    manual / 'math500' / 'test.jsonl',
    [{'problem': 'Half?', 'answer': '\\frac{1}{2}', 'solution': 'ignored'}],
  )
  solution = 'So \\boxed{3} is wrong; in fact \\boxed{\\frac{1}{\\sqrt{2}}}.'
  _write_jsonl(
    manual / 'custom' / 'raw.jsonl', [{'prompt': 'Q?', 'solution': solution}]
  )
  kw = {
    'data_dir': tmp_path / 'tfds',
    'manual_dir': manual,
    'tokenizer': tiny_tok,
    'template': 'plain',
  }
  (ex,) = data.load_examples('ada_math_local/math500', 'test', **kw)
  assert ex.reference == '\\frac{1}{2}'
  assert ex.prompt == prompts_lib.plain_prompt('Half?')
  (ex,) = data.load_examples('ada_math_local/custom', 'train', **kw)
  assert (ex.problem, ex.reference) == ('Q?', '\\frac{1}{\\sqrt{2}}')
  # Dotted field names reach into verl-style nested columns.
  _write_jsonl(
    manual / 'validate' / 'v.jsonl',
    [{'question': 'Q2', 'reward_model': {'ground_truth': '5'}}],
  )
  (ex,) = data.load_examples(
    'ada_math_local/validate',
    'test',
    field_overrides={
      'problem_fields': ['question'],
      'answer_fields': ['reward_model.ground_truth'],
    },
    **kw,
  )
  assert (ex.problem, ex.reference) == ('Q2', '5')


def test_bad_rows_are_skipped_counted_and_named_in_one_warning(tmp_path, tiny_tok):
  manual = tmp_path / 'manual'
  path = manual / 'easy_7b' / 'rows.jsonl'
  _write_jsonl(
    path,
    [
      {'problem': 'ok', 'gt': '1'},  # line 1
      {'problem': 'no answer'},  # line 2
      {'problem': '  ', 'gt': '3'},  # line 3
      '{not json\n',  # line 4
      {'problem': 'ok too', 'gt': ''},  # line 5: empty answer
      {'problem': 'fine', 'gt': '6'},  # line 6
    ],
  )
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    examples = data.load_examples(
      'ada_math_local/easy_7b',
      'train',
      data_dir=tmp_path / 'tfds',
      manual_dir=manual,
      tokenizer=tiny_tok,
    )
  assert sorted(e.problem for e in examples) == ['fine', 'ok']
  ours = [w for w in caught if 'bad rows' in str(w.message)]
  assert len(ours) == 1
  message = str(ours[0].message)
  assert 'skipped 4 bad rows' in message
  for line in (2, 3, 4, 5):
    assert f'{path}:{line} (' in message
  assert f'{path}:1 ' not in message and f'{path}:6 ' not in message


def test_zero_valid_rows_fails_naming_the_files(tmp_path, tiny_tok):
  manual = tmp_path / 'manual'
  path = manual / 'hard_llama' / 'rows.jsonl'
  _write_jsonl(path, [{'question': 'q', 'gt': '1'}, {'question': 'r', 'gt': '2'}])
  with pytest.raises(ValueError, match='zero valid rows') as info:
    data.load_examples(
      'ada_math_local/hard_llama',
      'train',
      data_dir=tmp_path / 'tfds',
      manual_dir=manual,
      tokenizer=tiny_tok,
    )
  assert str(path) in str(info.value)
  assert "'question'" in str(info.value)  # The columns it did find.


def test_missing_manual_dir_names_path_and_contents(tmp_path, tiny_tok):
  kw = {'data_dir': tmp_path / 'tfds', 'tokenizer': tiny_tok}
  missing = tmp_path / 'nowhere'
  with pytest.raises(FileNotFoundError) as info:
    data.load_examples('ada_math_local/hard_1p5b', 'train', manual_dir=missing, **kw)
  message = str(info.value)
  assert str(missing / 'hard_1p5b') in message
  assert 'RLHFlow/reinforce_ada_hard_prompt_1-5b' in message
  assert 'hf download' in message
  with pytest.raises(FileNotFoundError, match='no manual_dir'):
    data.load_examples('ada_math_local/math500', 'test', **kw)
  with pytest.raises(ValueError, match='Unknown ada_math_local config'):
    data.load_examples('ada_math_local/nope', 'test', **kw)


def _load_math_local(tmp_path, tok, config, split, **kw):
  """Builds `config` from `tmp_path/manual`; returns (examples, our warnings)."""
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter('always')
    examples = data.load_examples(
      f'ada_math_local/{config}',
      split,
      data_dir=tmp_path / 'tfds',
      manual_dir=tmp_path / 'manual',
      tokenizer=tok,
      **kw,
    )
  return examples, [str(w.message) for w in caught if 'bad rows' in str(w.message)]


def _load_error(tmp_path, tok, config, split, **kw) -> str:
  """The message of the ValueError that building `config` stops with."""
  with pytest.raises(ValueError) as info:
    _load_math_local(tmp_path, tok, config, split, **kw)
  message = str(info.value)
  assert '\n' not in message.strip(), message  # One line, as the user sees it.
  return message


def test_non_utf8_line_is_a_bad_row_and_the_rest_of_the_file_loads(tmp_path, tiny_tok):
  path = tmp_path / 'manual' / 'hard_1p5b' / 'rows.jsonl'
  path.parent.mkdir(parents=True)
  path.write_bytes(
    b'\xef\xbb\xbf{"problem": "first", "gt": "1"}\n'  # A BOM is not a bad byte.
    b'{"problem": "b\xff", "gt": "2"}\n'  # Latin-1 residue: 0xff at column 15.
    b'{"problem": "caf\xc3\xa9", "gt": "3"}\r\n'  # Valid UTF-8, CRLF ending.
  )
  examples, ours = _load_math_local(tmp_path, tiny_tok, 'hard_1p5b', 'train')
  assert sorted(e.problem for e in examples) == ['café', 'first']
  assert len(ours) == 1 and '\n' not in ours[0]
  assert 'skipped 1 bad rows' in ours[0]
  assert f'{path}:2 (not UTF-8 (byte 0xff at column 15))' in ours[0]


def test_malformed_json_array_fails_naming_file_line_and_column(tmp_path, tiny_tok):
  path = tmp_path / 'manual' / 'math500' / 'test.json'
  path.parent.mkdir(parents=True)
  # A copy cut short after the second element's key.
  path.write_text('[{"problem": "a", "answer": "1"},\n {"problem": "b", "answer": ')
  message = _load_error(tmp_path, tiny_tok, 'math500', 'test')
  assert message.startswith('ada_math_local/math500: ')
  assert str(path) in message and 'line 2 column 29' in message
  # The same for a .json that is neither an array nor JSONL.
  path.write_text('{\n  "problem": "a",\n  "answer": 1,,\n}\n')
  message = _load_error(tmp_path, tiny_tok, 'math500', 'test')
  assert str(path) in message and 'line 3 column 15' in message
  # And for an array with a byte that is not UTF-8.
  path.write_bytes(b'[\n {"problem": "\xe9", "answer": "1"}\n]\n')
  message = _load_error(tmp_path, tiny_tok, 'math500', 'test')
  assert str(path) in message and 'byte 0xe9 at line 2 column 15' in message


def test_json_file_in_jsonl_form_counts_its_bad_lines(tmp_path, tiny_tok):
  path = tmp_path / 'manual' / 'math500' / 'test.json'
  _write_jsonl(path, [{'problem': 'a', 'answer': '1'}, '{"problem": "b",\n'])
  examples, ours = _load_math_local(tmp_path, tiny_tok, 'math500', 'test')
  assert [e.problem for e in examples] == ['a']
  assert len(ours) == 1 and f'{path}:2 (invalid JSON (' in ours[0]


def test_metadata_json_object_is_reported_naming_the_file(tmp_path, tiny_tok):
  folder = tmp_path / 'manual' / 'math500'
  _write_jsonl(folder / 'data' / 'test.jsonl', [{'problem': 'a', 'answer': '1'}])
  meta = folder / 'dataset_infos.json'
  # As HF writes it: one object over many lines, no row fields.
  meta.write_text(json.dumps({'default': {'features': {'problem': {}}}}, indent=2))
  examples, ours = _load_math_local(tmp_path, tiny_tok, 'math500', 'test')
  assert [e.problem for e in examples] == ['a']
  assert len(ours) == 1 and '\n' not in ours[0]
  assert 'skipped 1 bad rows' in ours[0]  # The file, not each of its lines.
  assert f'{meta}:1 (' in ours[0] and 'metadata' in ours[0] and 'delete' in ours[0]
  # Alone, it stops the build with the same advice.
  (folder / 'data' / 'test.jsonl').unlink()
  message = _load_error(tmp_path, tiny_tok, 'math500', 'test', rebuild=True)
  assert 'zero valid rows' in message and f'{meta}:1 (' in message
  assert 'delete' in message


@pytest.mark.parametrize('damage', ['garbage', 'truncated', 'corrupt_page'])
def test_unreadable_parquet_fails_naming_the_file(tmp_path, tiny_tok, damage):
  path = tmp_path / 'manual' / 'hard_7b' / 'train-00000-of-00001.parquet'
  path.parent.mkdir(parents=True)
  pq.write_table(pa.table({'problem': ['1+1?'] * 50, 'gt': ['2'] * 50}), path)
  good = path.read_bytes()
  first_page = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
  path.write_bytes(
    {
      'garbage': b'not parquet at all\n',
      'truncated': good[: len(good) // 2],
      # Footer intact, a page header overwritten: pyarrow's error has no path.
      'corrupt_page': (good[:first_page] + b'\xab' * 30 + good[first_page + 30 :]),
    }[damage]
  )
  message = _load_error(tmp_path, tiny_tok, 'hard_7b', 'train')
  assert message.startswith('ada_math_local/hard_7b: ')
  assert str(path) in message and 'Parquet' in message


def test_last_boxed():
  assert ada_math_local.last_boxed('a \\boxed{1} b \\boxed{x^{2}}') == 'x^{2}'
  assert ada_math_local.last_boxed('no box') is None
  assert ada_math_local.last_boxed('\\boxed{unclosed') is None


def test_format_prompts_splices_only_when_faithful(tmp_path):
  problems = ['a b', 'What is 2+2?', 'x', '']
  for name, template in (
    ('verbatim', _CHATML),
    ('upper', '{{ messages[-1].content | upper }}'),
  ):
    out = tmp_path / name
    tokenizer_lib.build_tiny_tokenizer(out)
    (out / 'chat_template.jinja').write_text(template)
    tok = tokenizer_lib.load_tokenizer(out)
    expected = [prompts_lib.chat_prompt(tok, p) for p in problems]
    assert prompts_lib.format_prompts(problems, 'chat', tok) == expected, name
  with pytest.raises(ValueError, match='needs a tokenizer'):
    prompts_lib.resolve('auto', 'ada_math_local/math500', None)
  assert prompts_lib.resolve('auto', 'ada_arith', None) == 'tiny'


# --- encoding -------------------------------------------------------------


def test_encode_prompts_left_pads_and_drops_long(tiny_tok):
  prompts = ['Q:1+1=', 'Q:123*45=', 'Q:(12-34)*56+789=', 'Q:9=']
  enc = data.encode_prompts(tiny_tok, prompts, bucket=10)
  assert enc.tokens.dtype == np.int32 and enc.mask.dtype == np.int32
  assert enc.kept.tolist() == [0, 1, 3] and enc.dropped == 1
  assert enc.tokens.shape == enc.mask.shape == (3, 10)
  for row, i in enumerate(enc.kept):
    ids = tiny_tok.encode(prompts[i])
    n = len(ids)
    assert enc.tokens[row, 10 - n :].tolist() == ids
    assert (enc.tokens[row, : 10 - n] == tiny_tok.pad_id).all()
    assert enc.mask[row].tolist() == [0] * (10 - n) + [1] * n
  ex = [data.Example(p, p, '0', 0, 0, 't') for p in prompts]
  kept, dropped = data.drop_long_prompts(tiny_tok, ex, bucket=10)
  assert [e.prompt for e in kept] == [prompts[0], prompts[1], prompts[3]]
  assert dropped == 1


# --- iteration ------------------------------------------------------------


def _examples(n):
  return [data.Example(str(i), str(i), str(i), i, 0, 't') for i in range(n)]


def test_iterator_epochs_shuffle_and_cover():
  examples = _examples(12)
  it = data.PromptIterator(examples, prompts_per_step=4, seed=0)
  assert it.steps_per_epoch == 3
  epochs = [[e.prompt_key for _ in range(3) for e in next(it)] for _ in range(3)]
  for epoch in epochs:
    assert sorted(epoch) == list(range(12))
  assert epochs[0] != epochs[1]  # Reshuffled every epoch.
  again = data.PromptIterator(examples, prompts_per_step=4, seed=0)
  assert [e.prompt_key for _ in range(3) for e in next(again)] == epochs[0]
  other = data.PromptIterator(examples, prompts_per_step=4, seed=1)
  assert [e.prompt_key for _ in range(3) for e in next(other)] != epochs[0]


def test_iterator_host_slices_are_disjoint_and_cover():
  examples = _examples(50)
  single = data.PromptIterator(examples, prompts_per_step=8, seed=5)
  hosts = [data.PromptIterator(examples, 8, seed=5, process_index=i, process_count=4)
           for i in range(4)]  # fmt: skip
  for _ in range(14):  # Crosses two epoch boundaries (6 steps per epoch).
    whole = single.next_indices().tolist()
    parts = [h.next_indices().tolist() for h in hosts]
    assert all(len(p) == 2 for p in parts)
    assert [i for part in parts for i in part] == whole
    assert len(set(whole)) == 8
  with pytest.raises(ValueError, match='does not divide'):
    data.PromptIterator(examples, 6, seed=0, process_index=0, process_count=4)


def test_restored_iterator_continues_exactly():
  examples = _examples(23)
  it = data.PromptIterator(examples, prompts_per_step=5, seed=7)
  for _ in range(6):  # Into the second epoch (4 steps per epoch).
    next(it)
  state = it.state()
  assert all(type(v) is int for v in state.values())
  expected = [[e.prompt_key for e in next(it)] for _ in range(9)]
  # A fresh iterator (as after a restart) restored from a JSON round trip.
  fresh = data.PromptIterator(examples, prompts_per_step=5, seed=7)
  fresh.restore(json.loads(json.dumps(state)))
  assert [[e.prompt_key for e in next(fresh)] for _ in range(9)] == expected
  # Restoring into another data set or seed is refused, not silently wrong.
  with pytest.raises(ValueError, match='num_examples'):
    data.PromptIterator(_examples(24), 5, seed=7).restore(state)
  with pytest.raises(ValueError, match='seed'):
    data.PromptIterator(examples, 5, seed=8).restore(state)


def _levelled(counts: dict[int, int]) -> list[data.Example]:
  return [
    data.Example(f'{lv}_{i}', f'{lv}_{i}', '0', i, lv, 't')
    for lv, n in counts.items()
    for i in range(n)
  ]


def test_parse_and_select_levels():
  assert data.parse_levels('') is None
  assert data.parse_levels('0, 1,4-7') == {0, 1, 4, 5, 6, 7}
  ex = _levelled({0: 2, 3: 1, 5: 4})
  assert [e.level for e in data.select_levels(ex, '3-5')] == [3, 5, 5, 5, 5]
  assert data.select_levels(ex, '') == ex
  for bad in ('a', '3-1', '1,,2', '-2'):
    with pytest.raises(ValueError, match=r'data\.levels'):
      data.parse_levels(bad)


def test_balance_levels_repeats_small_levels_whole():
  ex = _levelled({0: 2, 1: 7, 2: 3})
  out = data.balance_levels(ex)
  assert data.level_histogram(out) == {0: 8, 1: 7, 2: 9}  # ceil(7/2)*2, 7, ceil(7/3)*3
  # Every problem of a level equally often.
  for lv in (0, 2):
    names = [e.problem for e in out if e.level == lv]
    assert len(set(names)) == len([e for e in ex if e.level == lv])
    assert len({names.count(n) for n in names}) == 1
  assert data.balance_levels([]) == []


def test_split_share_is_disjoint_per_level_and_seeded():
  ex = _levelled({0: 10, 1: 40, 2: 6})
  rest, share = data.split_share(ex, 0.5, seed=3)
  assert data.level_histogram(share) == {0: 5, 1: 20, 2: 3}
  assert sorted(e.problem for e in rest + share) == sorted(e.problem for e in ex)
  assert not {e.problem for e in rest} & {e.problem for e in share}
  assert data.split_share(ex, 0.5, seed=3) == (rest, share)
  assert data.split_share(ex, 0.5, seed=4) != (rest, share)
