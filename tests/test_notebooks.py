"""The notebooks in notebooks/ run headless with small settings and show what they claim.

Each notebook opens with a code cell tagged `parameters`; like papermill, the test inserts
an `injected-parameters` cell right after it (SMALL = True, a temporary WORKDIR, SWEEP_DIR =
None). Kernels are this interpreter (a kernel spec written into a temporary folder, so nothing
needs installing); the selected notebooks run side by side, each in a temporary working directory,
with $TFDS_DATA_DIR in the session's tmp (the prepared stdlib corpus is shared by notebooks 02,
03 and 04): nothing is written into the repository. The committed notebooks carry no outputs.
"""

import json
import os
import re
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip('nbformat')
pytest.importorskip('nbclient')
pytest.importorskip('ipykernel')

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / 'notebooks'
NOTEBOOKS = sorted(p.name for p in NOTEBOOK_DIR.glob('*.ipynb'))
KERNEL = 'tx-notebooks-test'
CELL_TIMEOUT_S = 300


def test_the_expected_notebooks_exist():
  assert NOTEBOOKS == ['01_architecture.ipynb', '02_train_and_generate.ipynb',
                       '03_compare_ablations.ipynb', '04_lr_sensitivity.ipynb']


@pytest.mark.parametrize('name', NOTEBOOKS)
def test_committed_notebook_is_clean(name):
  """No outputs or execution counts are committed, and the first code cell is `parameters`."""
  nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
  nbformat.validate(nb)
  code = [c for c in nb.cells if c.cell_type == 'code']
  assert code and 'parameters' in code[0].metadata.get('tags', []), \
      f'{name}: the first code cell must be tagged "parameters"'
  for i, cell in enumerate(code):
    assert cell.outputs == [] and cell.execution_count is None, \
        f'{name}: code cell {i} has outputs; clear them before committing'
  assert (NOTEBOOK_DIR / name).stat().st_size < 40_000, f'{name}: keep notebooks small'


# test -> (notebook, injected parameters); a WORKDIR of None becomes a new tmp directory.
TESTS = {
    'test_01_architecture': ('01_architecture.ipynb', {'SMALL': True}),
    'test_02_train_and_generate': ('02_train_and_generate.ipynb',
                                   {'SMALL': True, 'WORKDIR': None}),
    'test_03_compare_ablations': ('03_compare_ablations.ipynb',
                                  {'SMALL': True, 'WORKDIR': None, 'SWEEP_DIR': None}),
    'test_04_lr_sensitivity': ('04_lr_sensitivity.ipynb',
                               {'SMALL': True, 'WORKDIR': None, 'SWEEP_DIR': None}),
}


@pytest.fixture(scope='session')
def executed(request, tmp_path_factory):
  """{notebook: (executed notebook or the exception it raised, its WORKDIR, seconds)}, plus
  'notebooks/ before and after': snapshots of the folder around the runs.

  The notebooks whose tests are selected run concurrently, each in a fresh kernel (this
  interpreter, from a kernel spec in tmp) with a temporary working directory and WORKDIR;
  $TFDS_DATA_DIR is shared, so the stdlib corpus is prepared once. On 2 cores most of a
  notebook's time is single-threaded XLA compilation, so running them side by side roughly
  halves the wall time.
  """
  import asyncio
  import time

  from jupyter_client.kernelspec import KernelSpecManager
  from jupyter_client.manager import AsyncKernelManager
  from nbclient import NotebookClient

  tmp = tmp_path_factory.mktemp('notebooks')
  spec_dir = tmp / 'kernels' / KERNEL
  spec_dir.mkdir(parents=True)
  pythonpath = os.pathsep.join([str(ROOT), os.environ.get('PYTHONPATH', '')]).rstrip(os.pathsep)
  (spec_dir / 'kernel.json').write_text(json.dumps({
      'argv': [sys.executable, '-m', 'ipykernel_launcher', '-f', '{connection_file}'],
      'display_name': 'tx (test)', 'language': 'python',
      'env': {'TFDS_DATA_DIR': str(tmp / 'tfds'), 'JAX_PLATFORMS': 'cpu',
              'PYTHONPATH': pythonpath, 'TQDM_DISABLE': '1'},
  }))
  specs = KernelSpecManager(kernel_dirs=[str(tmp / 'kernels')])
  selected = {item.originalname for item in request.session.items}

  async def run(name, params, cwd):
    nb = nbformat.read(NOTEBOOK_DIR / name, as_version=4)
    idx = next(i for i, c in enumerate(nb.cells)
               if c.cell_type == 'code' and 'parameters' in c.metadata.get('tags', []))
    injected = nbformat.v4.new_code_cell(
        '# Injected by tests/test_notebooks.py\n'
        + ''.join(f'{k} = {v!r}\n' for k, v in params.items()))
    injected.metadata['tags'] = ['injected-parameters']
    nb.cells.insert(idx + 1, injected)
    km = AsyncKernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT_S, allow_errors=False,
                            resources={'metadata': {'path': cwd}})
    t0 = time.time()
    try:
      await client.async_execute()
    except Exception as e:  # CellExecutionError carries the cell's traceback
      return e, time.time() - t0
    finally:  # nbclient leaves a kernel it was given running
      if km.has_kernel:
        await km.shutdown_kernel(now=True)
    return nb, time.time() - t0

  jobs = {}  # notebook -> (parameters, WORKDIR, working directory)
  for test, (name, params) in TESTS.items():
    if test in selected:
      stem = Path(name).stem
      work = tmp_path_factory.mktemp(f'work_{stem}')
      if 'WORKDIR' in params:
        params = dict(params, WORKDIR=str(work))
      jobs[name] = (params, work, str(tmp_path_factory.mktemp(f'cwd_{stem}')))

  async def run_all():
    return await asyncio.gather(*(run(name, params, cwd)
                                  for name, (params, _, cwd) in jobs.items()))

  before = _snapshot(NOTEBOOK_DIR)
  results = asyncio.run(run_all())
  out = {name: (nb, jobs[name][1], seconds) for name, (nb, seconds) in zip(jobs, results)}
  out['notebooks/ before and after'] = (before, _snapshot(NOTEBOOK_DIR))
  return out


def _snapshot(folder: Path) -> dict:
  return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob('*')}


def result_of(executed, name):
  """(executed notebook, workdir); re-raises the notebook's error in the calling test."""
  nb, workdir, seconds = executed[name]
  print(f'{name}: {seconds:.1f}s')
  if isinstance(nb, BaseException):
    raise nb
  return nb, workdir


def stdout(nb) -> str:
  return ''.join(o.get('text', '') for c in nb.cells if c.cell_type == 'code'
                 for o in c.outputs if o.output_type == 'stream' and o.name == 'stdout')


def outputs_of(nb, kind: str) -> list:
  return [o.data[kind] for c in nb.cells if c.cell_type == 'code' for o in c.outputs
          if o.output_type in ('display_data', 'execute_result') and kind in o.get('data', {})]


def checks(text: str) -> dict[str, str]:
  """'label: True' lines -> {label: 'True'}: every check a notebook prints."""
  return dict(re.findall(r'^(.*?):\s+(True|False)\s*$', text, flags=re.M))


@pytest.mark.slow
def test_01_architecture(executed):
  nb, _ = result_of(executed, '01_architecture.ipynb')
  found = checks(stdout(nb))
  assert found['RoPE relative property (q·k at (m, n) == at (m+s, n+s))'] == 'True'
  for label in ('padded keys get zero weight', 'causal upper triangle is zero',
                'by hand == MultiHeadAttention', 'the two rules differ',
                'probabilities sum to 1', 'logits == hidden @ E^T'):
    assert found[label] == 'True', label
  assert all(v == 'True' for v in found.values()), {k: v for k, v in found.items() if v != 'True'}
  assert len(outputs_of(nb, 'image/png')) >= 7  # sinusoids, masks, norms, FFN, RoPE, ALiBi, T5


@pytest.mark.slow
def test_02_train_and_generate(executed):
  nb, workdir = result_of(executed, '02_train_and_generate.ipynb')
  text = stdout(nb)
  first, last = map(float, re.search(r'train loss: first logged ([\d.]+) .*?last ([\d.]+)',
                                     text).groups())
  assert last < first, text
  assert checks(text)['loss decreased'] == 'True'
  assert ((workdir / 'demo' / 'metrics.jsonl').exists()
          and (workdir / 'demo' / 'summary.json').exists())
  assert outputs_of(nb, 'image/png'), 'the loss plot is missing'
  table = ''.join(outputs_of(nb, 'text/html'))
  for strategy in ('greedy', 'sample T=0.8', 'top-k 10', 'top-p 0.9', 'beam 4'):
    assert f'<td>{strategy}</td>' in table, strategy


@pytest.mark.slow
def test_03_compare_ablations(executed):
  nb, workdir = result_of(executed, '03_compare_ablations.ipynb')
  sweep = workdir / 'sweep'
  runs = sorted(p.parent.relative_to(sweep).as_posix() for p in sweep.glob('*/seed_*/summary.json'))
  assert runs == ['position=alibi/seed_0', 'position=alibi/seed_1',
                  'position=rope/seed_0', 'position=rope/seed_1']
  for name in ('compare.md', 'compare.csv', 'sweep.json'):
    assert (sweep / name).exists(), name
  table = ''.join(outputs_of(nb, 'text/markdown'))
  assert '`position=rope`' in table and '`position=alibi`' in table and 'baseline' in table
  assert checks(stdout(nb))['table means match summary.json'] == 'True'
  pngs = sorted(sweep.glob('*.png'))
  assert pngs and len(outputs_of(nb, 'image/png')) == len(pngs)


@pytest.mark.slow
def test_04_lr_sensitivity(executed):
  nb, workdir = result_of(executed, '04_lr_sensitivity.ipynb')
  sweep = workdir / 'sweep'
  summaries = {p.parent.relative_to(sweep).as_posix(): json.loads(p.read_text())
               for p in sweep.glob('*/seed_*/summary.json')}
  assert len(summaries) == 16, sorted(summaries)  # {pre, post} x 4 rates x 2 seeds
  assert any(s['status'] == 'diverged' for s in summaries.values()), \
      'no run diverged: the capped path is not exercised; raise the top learning rate'
  for name in ('lr_curves.md', 'lr_curves.csv', 'compare.md', 'sweep.json'):
    assert (sweep / name).exists(), name
  assert (sweep / 'eval.loss_vs_optim.learning_rate.png').exists()
  table = ''.join(outputs_of(nb, 'text/markdown'))
  assert '`norm_position=pre`' in table and '`norm_position=post`' in table, table
  assert 'LR sensitivity' in table
  found = checks(stdout(nb))
  for label in ('sensitivity matches a recomputation from summary.json',
                'a diverged run is drawn capped'):
    assert found.get(label) == 'True', (label, found)
  assert all(v == 'True' for v in found.values()), {k: v for k, v in found.items() if v != 'True'}
  assert len(outputs_of(nb, 'image/png')) >= 2  # loss vs LR, the diagnostics


def test_notebooks_leave_the_repository_alone(executed):
  """Running the notebooks writes nothing into notebooks/ (outputs go to tmp directories)."""
  before, after = executed['notebooks/ before and after']
  assert after == before
