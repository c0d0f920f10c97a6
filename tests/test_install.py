"""The install extras agree with requirements.txt.

The `cuda` extra of pyproject.toml (`pip install -e '.[cuda]'` on NVIDIA
GPUs) pins `jax[cuda12]`, whose plugin wheels only load into the jaxlib of
their own version. CI never installs the extra, so nothing else would notice
a bump of `jax==` in requirements.txt that leaves the extra behind: GPU users
would get a resolver conflict, or a plugin that does not load.
"""

from __future__ import annotations

import pathlib
import re
import tomllib

from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parent.parent


def pins(requirements: str) -> dict[str, str]:
  """Package name -> its exact `==` version, of a requirements.txt text."""
  out = {}
  for line in requirements.splitlines():
    line = line.split('#', 1)[0].strip()
    if not line or line.startswith('-'):
      continue
    req = Requirement(line)
    exact = [s.version for s in req.specifier if s.operator == '==']
    if exact:
      out[req.name.lower()] = exact[0]
  return out


def cuda_extra_problems(pyproject: str, requirements: str) -> list[str]:
  """What is wrong with the `cuda` extra against requirements.txt (empty: fine)."""
  extras = tomllib.loads(pyproject)['project'].get('optional-dependencies', {})
  if 'cuda' not in extras:
    return ['pyproject.toml has no `cuda` extra']
  reqs = [Requirement(r) for r in extras['cuda']]
  jax_reqs = [r for r in reqs if r.name.lower() == 'jax']
  if len(jax_reqs) != 1:
    return [f'the cuda extra must name jax once: {extras["cuda"]}']
  (req,) = jax_reqs
  problems = []
  if req.extras != {'cuda12'}:
    problems.append(f'the cuda extra is {req}, not jax[cuda12]')
  exact = [s.version for s in req.specifier if s.operator == '==']
  want = pins(requirements).get('jax')
  if want is None:
    problems.append('requirements.txt pins no jax==')
  elif exact != [want] or len(req.specifier) != 1:
    problems.append(f'the cuda extra pins {req} but requirements.txt pins jax=={want}')
  return problems


def test_the_cuda_extra_pins_the_jax_of_requirements_txt():
  pyproject = (ROOT / 'pyproject.toml').read_text()
  requirements = (ROOT / 'requirements.txt').read_text()
  assert cuda_extra_problems(pyproject, requirements) == []


def test_requirements_txt_pins_jaxlib_with_jax():
  """jax[cuda12]==V pulls jaxlib==V: requirements.txt's jaxlib must be V too."""
  got = pins((ROOT / 'requirements.txt').read_text())
  assert got['jax'] == got['jaxlib']


def test_a_bump_of_one_side_fails():
  """The check itself: a version moved on one side only is reported."""
  requirements = (ROOT / 'requirements.txt').read_text()
  pyproject = (ROOT / 'pyproject.toml').read_text()
  version = pins(requirements)['jax']
  assert f'jax[cuda12]=={version}' in pyproject
  bumped = f'{version}.post1'
  assert cuda_extra_problems(
    pyproject, requirements.replace(f'jax=={version}', f'jax=={bumped}')
  ) == [
    f'the cuda extra pins jax[cuda12]=={version} but requirements.txt '
    f'pins jax=={bumped}'
  ]
  assert cuda_extra_problems(
    pyproject.replace(f'jax[cuda12]=={version}', f'jax[cuda12]=={bumped}'),
    requirements,
  )
  assert cuda_extra_problems(
    pyproject.replace('jax[cuda12]==', 'jax[cuda13]=='), requirements
  ) == [f'the cuda extra is jax[cuda13]=={version}, not jax[cuda12]']
  assert cuda_extra_problems(
    pyproject.replace(f'jax[cuda12]=={version}', 'jax[cuda12]>=0.1'), requirements
  )
  assert cuda_extra_problems('[project]\nname = "x"\n', requirements) == [
    'pyproject.toml has no `cuda` extra'
  ]


def test_the_readme_names_the_extra():
  """The install section tells GPU users how to get it."""
  readme = (ROOT / 'README.md').read_text()
  install = readme[readme.index('## Install') :].split('\n## ', 1)[0]
  assert re.search(r"pip install -r requirements\.txt -e '\.\[cuda\]'", install)
