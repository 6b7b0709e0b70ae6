"""`tx sweep --slurm`: the sbatch array script, checked without a scheduler.

The script's #SBATCH lines and array range; each task's command equal (argv for argv) to
the `tx sweep --commands` line of its run, seen through a stub `tx` on PATH; `bash -n`;
one task run for real by hand (SLURM_ARRAY_TASK_ID set, a tiny user-registered experiment)
leaving a finished run, and the same task again exiting 0 at once without retraining;
flag errors as one line. The experiment and sweep come from a user file (`--experiments`),
as a job on a cluster would load them.
"""

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tx import registry
from tx.cli import main
from tx.sweep import slurm

ROOT = Path(__file__).resolve().parents[1]
SWEEP = 'slurmtest_ffn'

EXPERIMENTS = '''
from pathlib import Path

from tx.config import DataConfig, ModelConfig
from tx.config.experiment import ExperimentConfig
from tx.config.optim import OptimConfig
from tx.config.train import TrainConfig
from tx.registry import axis, experiment, sweep

HERE = Path(__file__).resolve().parent


@experiment
def slurmtest_tiny():
  """Tiny byte-level LM for the --slurm tests."""
  return ExperimentConfig(
      model=ModelConfig(family='decoder', d_model=16, num_heads=2, d_ff=32, num_layers=1,
                        max_len=16, position='rope'),
      data=DataConfig(dataset='text', files=str(HERE / 'corpus.txt'), tokenizer='byte',
                      seq_len=8, data_dir=str(HERE / 'tfds')),
      optim=OptimConfig(learning_rate=1e-3, warmup_steps=0, schedule='constant'),
      train=TrainConfig(steps=2, batch_size=4, eval_every=2, eval_batches=1, log_every=1,
                        checkpoint_every=2, sample_tokens=0, async_checkpoint=False))


sweep('slurmtest_ffn', base='slurmtest_tiny', axes=axis('model.ffn', ['relu', 'gelu']),
      description='relu vs gelu (slurm test)')
'''


@pytest.fixture(scope='module')
def project(tmp_path_factory):
  """A user project (experiments file, corpus) and a registry restored afterwards."""
  proj = tmp_path_factory.mktemp('slurm_proj')
  (proj / 'corpus.txt').write_text('the quick brown fox jumps over the lazy dog\n' * 200)
  (proj / 'mine.py').write_text(EXPERIMENTS)
  registry.load_builtin()
  with pytest.MonkeyPatch.context() as mp:
    for name in ('_EXPERIMENTS', '_SWEEPS', '_SWEEP_ORIGINS'):
      mp.setattr(registry, name, dict(getattr(registry, name)))
    mp.setattr(registry, '_USER_SOURCES', list(registry._USER_SOURCES))
    mp.setenv('TFDS_DATA_DIR', str(proj / 'tfds'))
    mp.chdir(proj)
    yield proj


def _generate(project, workdir, *flags):
  return main(['sweep', SWEEP, '--experiments', str(project / 'mine.py'), '--workdir',
               str(workdir), *flags])


@pytest.fixture(scope='module')
def generated(project):
  workdir = project / 'w'
  assert _generate(project, workdir, '--slurm', '--partition', 'gpu', '--gpus-per-run', '1',
                   '--cpus-per-run', '4', '--time', '1-02:00:00', '--max-parallel', '1',
                   '--set', 'train.steps=2') == 0
  return workdir


def _commands(project, workdir, capsys):
  capsys.readouterr()
  assert _generate(project, workdir, '--commands', '--set', 'train.steps=2') == 0
  return capsys.readouterr().out.splitlines()


def _run_task(script: Path, task, path_dir: Path, **env):
  environ = dict(os.environ, SLURM_ARRAY_TASK_ID=str(task),
                 PATH=f'{path_dir}{os.pathsep}{os.environ["PATH"]}', **env)
  return subprocess.run(['bash', str(script)], env=environ, capture_output=True, text=True,
                        timeout=600, check=False)


def test_script_holds_the_array_and_the_resources(generated):
  text = (generated / slurm.SCRIPT).read_text()
  assert text.startswith('#!/bin/bash\n') and 'set -euo pipefail' in text
  sbatch = [l for l in text.splitlines() if l.startswith('#SBATCH ')]
  assert sbatch == [
      f'#SBATCH --job-name={SWEEP}', '#SBATCH --array=0-1%1',
      f'#SBATCH --output={generated}/slurm/%A_%a.out',
      f'#SBATCH --error={generated}/slurm/%A_%a.err', '#SBATCH --nodes=1',
      '#SBATCH --ntasks=1', '#SBATCH --partition=gpu', '#SBATCH --time=1-02:00:00',
      '#SBATCH --gres=gpu:1', '#SBATCH --cpus-per-task=4']
  assert subprocess.run(['bash', '-n', str(generated / slurm.SCRIPT)]).returncode == 0
  # Only the script, the (empty) log directory and the sweep record: no run directory.
  assert sorted(p.name for p in generated.iterdir()) == ['slurm', 'sweep.json', 'sweep.sbatch']
  assert not any((generated / 'slurm').iterdir())
  assert json.loads((generated / 'sweep.json').read_text())['name'] == SWEEP


def test_each_task_runs_its_commands_line(project, generated, capsys, tmp_path):
  lines = _commands(project, generated, capsys)
  assert len(lines) == 2
  text = (generated / slurm.SCRIPT).read_text()
  assert all(f'  {shlex.quote(line)}\n' in text for line in lines)
  stub = tmp_path / 'bin'
  stub.mkdir()
  (stub / 'tx').write_text(f'#!{sys.executable}\nimport json, sys\n'
                           'print(json.dumps(sys.argv[1:]))\n')
  (stub / 'tx').chmod(0o755)
  for task, line in enumerate(lines):
    done = _run_task(generated / slurm.SCRIPT, task, stub)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == shlex.split(line)[1:]
  wrong = _run_task(generated / slurm.SCRIPT, 2, stub)
  assert wrong.returncode == 2 and 'no task 2 (tasks are 0-1)' in wrong.stderr


def test_a_task_trains_its_run_and_a_second_time_skips_it(project, generated, tmp_path):
  shim = tmp_path / 'bin'
  shim.mkdir()
  (shim / 'tx').write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m tx "$@"\n')
  (shim / 'tx').chmod(0o755)
  env = dict(PYTHONPATH=str(ROOT), JAX_PLATFORMS='cpu')
  first = _run_task(generated / slurm.SCRIPT, 1, shim, **env)
  assert first.returncode == 0, first.stderr[-2000:]
  rundir = generated / 'ffn=gelu' / 'seed_0'
  summary = json.loads((rundir / 'summary.json').read_text())
  assert summary['status'] == 'done' and summary['steps'] == 2
  assert json.loads((rundir / 'config.json').read_text())['model']['ffn'] == 'gelu'
  assert not (generated / 'ffn=relu').exists()  # task 0 never ran
  mtime = (rundir / 'summary.json').stat().st_mtime_ns
  again = _run_task(generated / slurm.SCRIPT, 1, shim, **env)
  assert again.returncode == 0 and 'is done, skipped' in again.stdout
  assert (rundir / 'summary.json').stat().st_mtime_ns == mtime


@pytest.mark.parametrize('flags, message', [
    (['--slurm', '--time', '2h'], '--time: expected minutes'),
    (['--slurm', '--gpus-per-run', '-1'], '--gpus-per-run: must be >= 0'),
    (['--slurm', '--cpus-per-run', '0'], '--cpus-per-run: must be >= 1'),
    (['--slurm', '--max-parallel', '0'], '--max-parallel: must be >= 1'),
    (['--partition', 'gpu'], '--partition: only with --slurm'),
    (['--dry-run', '--time', '10'], '--time: only with --slurm'),
])
def test_bad_flags_are_one_line_errors(project, tmp_path, capsys, flags, message):
  assert _generate(project, tmp_path / 'w', *flags) == 2
  err = capsys.readouterr().err.strip()
  assert message in err and len(err.splitlines()) == 1
  assert not (tmp_path / 'w').exists()


def test_slurm_excludes_commands_and_dry_run(project, tmp_path, capsys):
  for other in ('--commands', '--dry-run'):
    with pytest.raises(SystemExit) as e:
      _generate(project, tmp_path / 'w', '--slurm', other)
    assert e.value.code == 2
    assert 'not allowed with argument' in capsys.readouterr().err


def test_time_formats():
  for ok in ('90', '30:00', '4:00:00', '1-0', '1-12:00', '2-00:00:00'):
    assert slurm.Resources(time=ok).check().time == ok
  for bad in ('', '4h', '1:2:3:4', '-1', '1-'):
    with pytest.raises(Exception, match='--time'):
      slurm.Resources(time=bad).check()
