"""Experiments from one's own project, against a normal (not editable) install of tx.

tx is built into a wheel and installed with `pip install --target` (no dependencies: they
come from this environment) into a temporary directory, and every command runs from a
project folder outside the repository that has its own `experiments/` package, as most
research repositories do. Covered: `--experiments FILE` and `--experiments MODULE`,
$TX_EXPERIMENTS, an installed package's `tx.experiments` entry point, a name registered twice
(one line naming both files), and `tx train path/config.json` reproducing a run bitwise.
"""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MINE = '''
from pathlib import Path

from tx.registry import axis, derive, experiment, sweep

HERE = Path(__file__).resolve().parent


@experiment
def my_tiny():
  """The demo at one layer, 4 steps, on the project's own small corpus."""
  return derive('demo', {'model.num_layers': 1, 'model.d_model': 32, 'model.num_heads': 2,
                         'model.d_ff': 64, 'data.seq_len': 16, 'data.dataset': 'text',
                         'data.files': str(HERE / 'corpus.txt'), 'data.tokenizer': 'char',
                         'train.steps': 4, 'train.batch_size': 4, 'train.eval_every': 4,
                         'train.eval_batches': 1, 'train.checkpoint_every': 4,
                         'train.sample_tokens': 0})


sweep('my_sweep', base='my_tiny', axes=axis('model.d_model', [32, 64]), description='mine')
'''

PLUGIN = '''
from tx.registry import derive, experiment


@experiment
def plugin_tiny():
  """Registered by an installed package's entry point."""
  return derive('demo', {'model.num_layers': 1})
'''


def _pip_install(source: Path, target: Path):
  subprocess.run([sys.executable, '-m', 'pip', 'install', '-q', '--no-deps',
                  '--no-build-isolation', '--target', str(target), str(source)], check=True,
                 capture_output=True, text=True, timeout=300)


@pytest.fixture(scope='module')
def project(tmp_path_factory):
  """(project dir, env): tx and a plugin package installed into site/, a project outside."""
  tmp = tmp_path_factory.mktemp('own')
  src = tmp / 'tx_src'  # a copy, so that building writes nothing into the repository
  src.mkdir()
  shutil.copytree(ROOT / 'tx', src / 'tx', ignore=shutil.ignore_patterns('__pycache__'))
  for name in ('pyproject.toml', 'README.md'):
    shutil.copy(ROOT / name, src / name)
  site = tmp / 'site'
  _pip_install(src, site)
  plugin = tmp / 'plugin_src'
  (plugin / 'tx_plugin_demo').mkdir(parents=True)
  (plugin / 'tx_plugin_demo' / '__init__.py').write_text('')
  (plugin / 'tx_plugin_demo' / 'experiments.py').write_text(PLUGIN)
  (plugin / 'pyproject.toml').write_text(textwrap.dedent('''
      [build-system]
      requires = ["setuptools>=68"]
      build-backend = "setuptools.build_meta"
      [project]
      name = "tx-plugin-demo"
      version = "0.0.1"
      [project.entry-points."tx.experiments"]
      demo_plugin = "tx_plugin_demo.experiments"
      [tool.setuptools]
      packages = ["tx_plugin_demo"]
      '''))
  _pip_install(plugin, site)
  proj = tmp / 'my_project'
  (proj / 'experiments').mkdir(parents=True)
  (proj / 'experiments' / '__init__.py').write_text('')
  (proj / 'experiments' / 'mine.py').write_text(MINE)
  (proj / 'experiments' / 'corpus.txt').write_text('the quick brown fox jumps over it.\n' * 300)
  env = {k: v for k, v in os.environ.items() if k not in ('PYTHONPATH', 'TX_EXPERIMENTS')}
  env.update(PYTHONPATH=os.pathsep.join([str(site), str(proj)]), JAX_PLATFORMS='cpu',
             TFDS_DATA_DIR=str(tmp / 'tfds'))
  return proj, env


def _tx(project, *args, env=None, check=True):
  proj, base_env = project
  done = subprocess.run([sys.executable, '-m', 'tx.cli', *args], cwd=proj,
                        env={**base_env, **(env or {})}, capture_output=True, text=True,
                        timeout=300)
  if check:
    assert done.returncode == 0, done.stderr[-3000:]
  return done


def test_tx_is_the_installed_copy_and_leaves_experiments_to_the_project(project):
  proj, env = project
  code = ('import tx, experiments, tx.experiments; '
          'print(tx.__file__); print(experiments.__file__); print(tx.experiments.__file__)')
  out = subprocess.run([sys.executable, '-c', code], cwd=proj, env=env, capture_output=True,
                       text=True, check=True).stdout.split()
  assert 'site' in Path(out[0]).parts and not out[0].startswith(str(ROOT)), out
  assert out[1] == str(proj / 'experiments' / '__init__.py')
  assert 'site' in Path(out[2]).parts


def test_file_module_env_and_entry_point_sources(project):
  proj, _ = project
  listed = _tx(project, 'list', '--experiments', 'experiments/mine.py').stdout
  assert 'my_tiny' in listed and 'my_sweep' in listed and 'demo' in listed
  assert 'plugin_tiny' in listed  # the installed package's entry point
  assert 'my_tiny' in _tx(project, 'list', '--experiments', 'experiments.mine').stdout
  by_env = _tx(project, 'list', env={'TX_EXPERIMENTS': str(proj / 'experiments' / 'mine.py')})
  assert 'my_sweep' in by_env.stdout
  assert 'my_tiny' not in _tx(project, 'list').stdout
  commands = _tx(project, 'sweep', 'my_sweep', '--experiments', 'experiments/mine.py',
                 '--workdir', 'runs', '--commands').stdout.splitlines()
  assert len(commands) == 2 and all('--experiments' in c and 'my_tiny' in c for c in commands)


def test_a_name_registered_twice_names_both_sources(project):
  proj, _ = project
  (proj / 'again.py').write_text(MINE.replace('HERE / ', 'HERE / "experiments" / '))
  done = _tx(project, 'list', '--experiments', 'experiments/mine.py', '--experiments',
             'again.py', check=False)
  assert done.returncode == 2
  line = done.stderr.strip()
  assert '\n' not in line and 'registered twice' in line
  assert str(proj / 'experiments' / 'mine.py') in line and str(proj / 'again.py') in line
  missing = _tx(project, 'list', '--experiments', 'nothing_here', check=False)
  assert missing.returncode == 2 and 'nothing_here' in missing.stderr


def test_a_config_json_is_an_experiment_that_reproduces_the_run(project):
  proj, _ = project
  _tx(project, 'train', 'my_tiny', '--experiments', 'experiments/mine.py', '--workdir', 'a',
      '--quiet')
  shutil.copy(proj / 'a' / 'config.json', proj / 'colleague.json')
  _tx(project, 'train', 'colleague.json', '--workdir', 'b', '--quiet')
  code = textwrap.dedent(f'''
      import jax, numpy as np
      from tx.runs.restore import load_run
      (ca, sa, _, ka), (cb, sb, _, kb) = (load_run({str(proj / 'a')!r}),
                                          load_run({str(proj / 'b')!r}))
      assert ka == kb == 4 and ca == cb, (ka, kb)
      assert all(np.array_equal(x, y) for x, y in zip(jax.tree_util.tree_leaves(sa),
                                                      jax.tree_util.tree_leaves(sb)))
      print('same')
      ''')
  _, env = project
  out = subprocess.run([sys.executable, '-c', code], cwd=proj, env=env, capture_output=True,
                       text=True, timeout=300)
  assert out.stdout.strip() == 'same', out.stderr[-3000:]
