"""The README is true: its Python snippets run and what it names exists.

- Every ```python block of README.md is executed, with its placeholder paths
  (`'/path/to/...'`) replaced by test fixtures: a tiny random HF model, a
  tokenizer directory, temp output directories; HOME, the working directory
  and TFDS's default data dir point into a temp dir, so `~/ada_manual` and
  `~/tensorflow_datasets` resolve there. A name a snippet reads but never
  defines is given only if it is one of `GIVEN` (the library snippet's
  `tokens` and `mask`); any other missing name, module or attribute fails.
  The data snippet reads `~/ada_manual/hard_7b/`: the test puts rows there
  (the README's way to get them, `stage`, is tested in test_stage.py).
- Every `python -m ada_jax.<command>` named in README.md, docs/design.md,
  configs/*.py and experiments/README.md answers `--help` with exit 0 and a
  usage line (found by regex: a command added to the docs is tested too).
- Every `python benchmarks/<name>.py` of README.md exists, every dotted
  `ada_jax.x.y` name of README.md and docs/design.md resolves (and the
  names in the README's architecture figure), and every repository path
  they name exists.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from tests import hf_fixtures

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / 'README.md'
DESIGN = ROOT / 'docs' / 'design.md'
DOCS = (README, DESIGN)
COMMAND_SOURCES = (*DOCS, *sorted((ROOT / 'configs').glob('*.py')))
COMMAND_SOURCES += (ROOT / 'experiments' / 'README.md',)

# The hard_7b prompt set of the Data section, as the stand-in `datasets`
# returns it and the manual dir holds it (>= 512 rows: one step of the
# snippet's PromptIterator).
ROWS = [
  {'problem': f'What is {a} + {a + 7}?', 'gt': str(2 * a + 7)} for a in range(600)
]

# ChatML, as Qwen's tokenizers carry it (the data snippet's `chat` template).
CHATML = (
  '{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n'
  '{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}'
)


# --- the README's Python snippets ------------------------------------------


def python_blocks(text: str) -> list[tuple[str, str]]:
  """(section heading, code) of every ```python block, in order."""
  out, heading = [], ''
  lines = iter(text.splitlines())
  for line in lines:
    if line.startswith('#'):
      heading = line.lstrip('#').strip()
    elif line.strip() == '```python':
      code = []
      for body in lines:
        if body.strip() == '```':
          break
        code.append(body)
      out.append((heading, '\n'.join(code) + '\n'))
  return out


BLOCKS = python_blocks(README.read_text())


def free_names(code: str) -> set[str]:
  """Names the snippet reads but never binds (assignment, import, def, loop)."""
  tree = ast.parse(code)
  bound, read = set(), set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
    elif isinstance(node, ast.alias):
      bound.add((node.asname or node.name).split('.')[0])
    elif isinstance(node, ast.FunctionDef | ast.ClassDef):
      bound.add(node.name)
    elif isinstance(node, ast.arg):
      bound.add(node.arg)
  return read - bound - set(dir(builtins))


@functools.cache
def _given_tokens_mask() -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.RandomState(0)
  return hf_fixtures.left_padded_batch(rng, [5, 9, 12], 12)


# Names a snippet may use without defining them (the reader supplies them).
GIVEN = {
  'tokens': lambda: _given_tokens_mask()[0],
  'mask': lambda: _given_tokens_mask()[1],
}


class _Split:
  """Rows written as JSON Lines (one object per line), as the sets come."""

  def __init__(self, rows):
    self.rows = rows

  def to_json(self, path):
    # datasets writes JSON Lines by default: one object per line.
    with open(path, 'w', encoding='utf-8') as f:
      f.writelines(json.dumps(r) + '\n' for r in self.rows)


@pytest.fixture
def home(tmp_path, monkeypatch):
  """A temp HOME (also the working directory) with TFDS's default data dir in it."""
  from tensorflow_datasets.core import constants

  home = tmp_path / 'home'
  home.mkdir()
  monkeypatch.setenv('HOME', str(home))
  monkeypatch.chdir(home)
  # TFDS reads its default data dir once, at import: point it into HOME.
  monkeypatch.setattr(constants, 'DATA_DIR', str(home / 'tensorflow_datasets'))
  return home


@pytest.fixture
def placeholders(hf_models, tmp_path):
  """'/path/to/...' of the README -> a local fixture."""
  from ada_jax import tokenizer

  tok_dir = tmp_path / 'Qwen2.5-Math-7B'  # A tokenizer dir with a chat template.
  tokenizer.build_tiny_tokenizer(tok_dir)
  (tok_dir / 'chat_template.jinja').write_text(CHATML)
  return {
    '/path/to/Qwen2.5-Math-1.5B': hf_models['qwen2_tied'][0],
    '/path/to/export': str(tmp_path / 'export'),
    '/path/to/Qwen2.5-Math-7B': str(tok_dir),
  }


def _check_library(ns, paths, hf_models):
  """The logits are fp32 [B, T, V]; the export loads in transformers, same weights."""
  import transformers

  tokens, mask = ns['tokens'], ns['mask']
  logits = np.asarray(ns['logits'])
  torch_model = hf_models['qwen2_tied'][1]
  assert logits.dtype == np.float32
  assert logits.shape == (*tokens.shape, torch_model.config.vocab_size)
  want = hf_fixtures.torch_logits(torch_model, tokens, mask)
  real = mask.astype(bool)  # bf16 compute: close, not equal, on real tokens.
  np.testing.assert_allclose(logits[real], want[real], atol=0.05, rtol=0)
  back = transformers.AutoModelForCausalLM.from_pretrained(paths['/path/to/export'])
  got = hf_fixtures.torch_logits(back.float().eval(), tokens, mask)
  np.testing.assert_allclose(got[real], want[real], atol=1e-5, rtol=1e-5)


def _check_data(ns, home):
  """One step of 512 prompts, encoded into the 1024 bucket; built under ~."""
  assert ns['dropped'] == 0 and len(ns['train']) == len(ROWS)
  state = ns['it'].state()  # 600 rows: one step per epoch.
  assert len(ns['batch']) == 512 and (state['epoch'], state['position']) == (1, 0)
  assert ns['enc'].tokens.shape == (512, 1024) and ns['enc'].dropped == 0
  assert ns['batch'][0].prompt.startswith('<|im_start|>')  # The chat template.
  assert (
    home / 'tensorflow_datasets' / 'ada_math_local' / 'hard_7b' / '1.0.0'
  ).is_dir()


@pytest.mark.parametrize(
  'heading,code', BLOCKS, ids=[f'{i}:{h}' for i, (h, _) in enumerate(BLOCKS)]
)
def test_readme_python_snippet_runs(heading, code, home, placeholders, hf_models):
  home_dir = home
  for path in re.findall(r"'(/path/to/[^']*)'", code):
    if path not in placeholders:
      pytest.fail(
        f'README ({heading}): give {path!r} a fixture in tests/test_readme.py'
      )
    code = code.replace(f"'{path}'", repr(placeholders[path]))
  if '~/ada_manual' in code:  # Rows where the snippet reads them.
    manual = home_dir / 'ada_manual' / 'hard_7b'
    manual.mkdir(parents=True)
    _Split(ROWS).to_json(manual / 'train.jsonl')
  ns = {'__name__': '__readme__'}
  ns.update({k: GIVEN[k]() for k in free_names(code) if k in GIVEN})
  exec(compile(code, f'README.md ({heading})', 'exec'), ns)
  if 'hf.save_model' in code:
    _check_library(ns, placeholders, hf_models)
  if 'encode_prompts' in code:
    _check_data(ns, home_dir)


def test_readme_has_the_snippets_this_test_checks():
  """The checks above stay attached: each one matches a README snippet."""
  codes = [c for _, c in BLOCKS]
  for marker in ('hf.save_model', 'encode_prompts'):
    assert any(marker in c for c in codes), marker


def test_a_missing_name_fails_the_snippet():
  """The harness itself: an undefined name is not silently supplied."""
  code = 'from ada_jax import model\nmodel.no_such_function(tokens)\n'
  assert free_names(code) == {'tokens'}
  with pytest.raises(AttributeError):
    exec(code, {'tokens': 0})
  with pytest.raises(NameError):
    exec('policy = undefined_name\n', {})


# --- commands, benchmarks, names and paths ---------------------------------


def _commands() -> list[str]:
  found = set()
  for path in COMMAND_SOURCES:
    found |= set(re.findall(r'python3? -m ada_jax\.([a-z_]+)', path.read_text()))
  return sorted(found)


COMMANDS = _commands()

# Commands known not to meet the --help contract yet (strict: fixing one
# makes its case fail until it leaves this table).


def test_the_docs_name_the_commands():
  assert {'main', 'evaluate', 'export', 'plan', 'sweep', 'select_prompts'} <= set(
    COMMANDS
  )


@pytest.fixture(scope='module')
def help_outputs() -> dict[str, tuple[int | None, str]]:
  """Each command's `--help` (exit code or None on timeout, output), run side by side."""
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  procs = {
    c: subprocess.Popen(
      [sys.executable, '-m', f'ada_jax.{c}', '--help'],
      cwd=ROOT,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for c in COMMANDS
  }
  out = {}
  for c, p in procs.items():
    try:
      text = p.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
      p.kill()
      out[c] = (None, p.communicate()[0])
      continue
    out[c] = (p.returncode, text)
  return out


# Under xdist (--dist=loadfile) a module's tests share a worker: the module
# fixture runs every --help once.
@pytest.mark.parametrize(
  'command',
  [c for c in COMMANDS],
)
def test_command_answers_help(command, help_outputs):
  code, out = help_outputs[command]
  assert code == 0, f'python -m ada_jax.{command} --help: exit {code}\n{out}'
  assert re.search(r'^usage:', out, re.M | re.I), out


def test_benchmarks_named_in_the_readme_exist():
  named = set(re.findall(r'python3? (benchmarks/[\w/]+\.py)', README.read_text()))
  assert named
  missing = sorted(p for p in named if not (ROOT / p).is_file())
  assert not missing, missing


def _resolve(dotted: str) -> object:
  """The module or attribute a dotted `ada_jax.x.y` name refers to."""
  parts = dotted.split('.')
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module('.'.join(parts[:i]))
    except ModuleNotFoundError as e:
      if e.name is None or not '.'.join(parts[:i]).startswith(e.name):
        raise
      continue
    for attr in parts[i:]:
      obj = getattr(obj, attr)
    return obj
  raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize('doc', DOCS, ids=lambda p: p.name)
def test_dotted_names_resolve(doc):
  names = set(re.findall(r'\bada_jax(?:\.[A-Za-z_]\w*)+', doc.read_text()))
  assert names
  bad = []
  for name in sorted(names):
    try:
      _resolve(name)
    except (ImportError, AttributeError) as e:
      bad.append(f'{name}: {type(e).__name__}: {e}')
  assert not bad, '\n'.join(bad)


def test_architecture_figure_names_resolve():
  """The figure's `module.name`s exist, relative to ada_jax, its rl and infra, or jax."""
  text = README.read_text()
  figure = text[text.index('## Architecture') :].split('```')[1]
  names = set(re.findall(r'\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+', figure))
  names = {n for n in names if n.rsplit('.', 1)[1] not in ('json', 'jsonl', 'png')}
  assert len(names) > 10
  bad = []
  for name in sorted(names):
    for root in ('ada_jax', 'ada_jax.rl', 'ada_jax.infra', 'jax'):
      try:
        _resolve(f'{root}.{name}')
        break
      except (ImportError, AttributeError):
        pass
    else:
      bad.append(name)
  assert not bad, bad


@pytest.mark.parametrize('doc', DOCS, ids=lambda p: p.name)
def test_repository_paths_exist(doc):
  top = r'(?:ada_jax|configs|experiments|benchmarks|tests|docs)'
  paths = set(re.findall(rf'(?<![\w/.~-]){top}/[\w./-]*\w', doc.read_text()))
  assert paths
  missing = sorted(p for p in paths if not (ROOT / p).exists())
  assert not missing, missing
