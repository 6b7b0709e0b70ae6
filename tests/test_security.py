"""No code path that reads user files or strings may deserialize or execute code.

Scans every module of the tx package with `ast`: no calls to eval / exec / compile, no
pickle / marshal / shelve / dill imports, no numpy loads with allow_pickle=True, no
yaml.load (unsafe loader) and no torch.load without weights_only=True.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / 'tx'
FORBIDDEN_CALLS = {'eval', 'exec', 'compile', '__import__'}
FORBIDDEN_MODULES = {'pickle', 'cPickle', 'marshal', 'shelve', 'dill', 'cloudpickle', 'joblib'}


def _modules():
  return sorted(PACKAGE.rglob('*.py'))


def _problems(path: Path, root: Path = PACKAGE.parent) -> list[str]:
  tree = ast.parse(path.read_text(), filename=str(path))
  found = []
  for node in ast.walk(tree):
    where = f'{path.relative_to(root)}:{getattr(node, "lineno", "?")}'
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or '']
      for name in names:
        if name.split('.')[0] in FORBIDDEN_MODULES:
          found.append(f'{where}: imports {name}')
    if isinstance(node, ast.Call):
      func = node.func
      name = func.id if isinstance(func, ast.Name) else getattr(func, 'attr', '')
      if isinstance(func, ast.Name) and name in FORBIDDEN_CALLS:
        found.append(f'{where}: calls {name}()')
      keywords = {k.arg: k.value for k in node.keywords}
      if name == 'load' and 'allow_pickle' in keywords:
        value = keywords['allow_pickle']
        if not (isinstance(value, ast.Constant) and value.value is False):
          found.append(f'{where}: numpy load with allow_pickle')
      owner = getattr(func, 'value', None)
      owner_name = owner.id if isinstance(owner, ast.Name) else ''
      if owner_name == 'yaml' and name == 'load':
        found.append(f'{where}: yaml.load (use yaml.safe_load)')
      if owner_name == 'torch' and name == 'load':
        value = keywords.get('weights_only')
        if not (isinstance(value, ast.Constant) and value.value is True):
          found.append(f'{where}: torch.load without weights_only=True')
  return found


def test_package_has_modules():
  assert len(_modules()) > 20


@pytest.mark.parametrize('path', _modules(), ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_unsafe_deserialization_or_eval(path):
  assert _problems(path) == []


def test_scanner_catches_what_it_should(tmp_path):
  bad = tmp_path / 'bad.py'
  bad.write_text('import pickle\nx = eval("1")\nimport numpy as np\n'
                 'np.load("f", allow_pickle=True)\nimport yaml\nyaml.load("a")\n')
  problems = ' '.join(_problems(bad, tmp_path))
  for expected in ('imports pickle', 'calls eval()', 'allow_pickle', 'yaml.load'):
    assert expected in problems
