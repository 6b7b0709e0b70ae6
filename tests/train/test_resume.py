"""Kill -9 and resume reproduces the uninterrupted run bitwise (CPU).

Run A: `tx train demo` with tiny overrides, 12 steps, async checkpoints every 4, dropout on
(so the RNG must resume too). Run B: the same command, SIGKILLed once checkpoint 8 is
committed and step 9 has run (a test hook parks the process when it asks for batch 10),
then started again with the same command line. Both runs go through the real CLI.
"""

import json
import os
import signal
import subprocess
import time

import pytest

STEPS, EVERY, HANG_AT = 12, 4, 9  # park when asked for the batch after step 9

HOOK = r'''
import sys, time
from pathlib import Path
from tx.data import pipeline

marker, hang_at = Path(sys.argv[1]), int(sys.argv[2])
_next = pipeline.BatchIterator.__next__


def parked_next(self):
  if self._pipe.train and self._step >= hang_at:
    marker.write_text(str(self._step))
    time.sleep(3600)  # until the test kills us
  return _next(self)


pipeline.BatchIterator.__next__ = parked_next
from tx.cli import main
sys.exit(main(sys.argv[3:]))
'''


@pytest.fixture(scope='module')
def runs(tt, tmp_path_factory):
  tmp = tmp_path_factory.mktemp('resume')
  cfg = tt.config('decoder', name='demo', model=dict(dropout=0.1),
                  optim=dict(schedule='cosine', warmup_steps=2),
                  train=dict(steps=STEPS, checkpoint_every=EVERY, eval_every=EVERY,
                             eval_batches=1, log_every=1, async_checkpoint=True))
  sets = tt.demo_overrides(cfg)
  env = tt.env()
  a, b = tmp / 'A', tmp / 'B'
  command = lambda workdir: ['train', 'demo', '--workdir', str(workdir), '--quiet', '--set',
                             *sets]
  (tmp / 'hook.py').write_text(HOOK)
  marker = tmp / 'parked'
  procs = []
  try:
    run_a = subprocess.Popen([tt.python, '-m', 'tx', *command(a)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp)
    procs.append(run_a)
    run_b = subprocess.Popen([tt.python, str(tmp / 'hook.py'), str(marker), str(HANG_AT),
                              *command(b)], env=env, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, cwd=tmp)
    procs.append(run_b)
    deadline = time.time() + 240
    committed = b / 'checkpoints' / str(2 * EVERY)
    while not (marker.exists() and committed.is_dir()):
      if run_b.poll() is not None:
        pytest.fail(f'run B exited early ({run_b.returncode}):\n{run_b.stderr.read()[-3000:]}')
      if time.time() > deadline:
        pytest.fail('run B never reached checkpoint 8')
      time.sleep(0.05)
    time.sleep(0.2)  # nothing is pending: checkpoint 8 committed, the process is parked
    os.kill(run_b.pid, signal.SIGKILL)
    killed = tt.finish(run_b, 30)
    ckpts_after_kill = sorted(int(p.name) for p in (b / 'checkpoints').iterdir()
                              if p.name.isdigit())
    restart = subprocess.run([tt.python, '-m', 'tx', *command(b)], env=env, text=True,
                             capture_output=True, timeout=240, cwd=tmp)
    a_result = tt.finish(run_a, 240)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  return {'a': a, 'b': b, 'a_result': a_result, 'killed': killed, 'restart': restart,
          'ckpts_after_kill': ckpts_after_kill, 'parked_at': int(marker.read_text())}


def _rows(workdir):
  """{step: row} with the LAST row of each step (a resumed run re-logs the lost steps)."""
  rows = {}
  for line in (workdir / 'metrics.jsonl').read_text().splitlines():
    r = json.loads(line)
    key = ('eval', r['step']) if 'eval/loss' in r else ('train', r['step'])
    rows[key] = r
  return rows


def test_both_runs_finish(runs):
  a_result = runs['a_result']
  assert a_result.returncode == 0, a_result.stderr[-3000:]
  assert runs['killed'].returncode == -signal.SIGKILL
  assert runs['parked_at'] == HANG_AT
  assert runs['ckpts_after_kill'] == [EVERY, 2 * EVERY]
  assert runs['restart'].returncode == 0, runs['restart'].stderr[-3000:]
  assert f'step {STEPS}' in runs['restart'].stdout


def test_restart_says_it_resumed(runs):
  err = runs['restart'].stderr
  assert f'resuming from checkpoint at step {2 * EVERY}' in err, err[-3000:]
  assert 'resuming' not in runs['a_result'].stderr


def test_final_state_is_bitwise_identical(tt, runs):
  cfg = tt.same_final_state(runs['a'], runs['b'], STEPS)
  assert cfg.model.dropout == 0.1


def test_metrics_after_the_resume_point_are_identical(runs):
  a, b = _rows(runs['a']), _rows(runs['b'])
  assert set(a) == set(b)
  assert sorted(s for kind, s in a if kind == 'train') == list(range(1, STEPS + 1))
  for key in sorted(a):
    for metric in ('loss', 'grad_norm', 'learning_rate', 'eval/loss'):
      if metric in a[key]:
        assert a[key][metric] == b[key][metric], (key, metric)
  summary_a = json.loads((runs['a'] / 'summary.json').read_text())
  summary_b = json.loads((runs['b'] / 'summary.json').read_text())
  assert summary_a['eval'] == summary_b['eval']
  assert summary_a['steps'] == summary_b['steps'] == STEPS


def test_a_finished_run_is_not_trained_or_evaluated_again(tt, tmp_path, capsys):
  """Running a finished run again changes nothing in it; with summary.json gone, the final
  evaluation runs again and writes it."""
  from tx.train.loop import train  # pylint: disable=g-import-not-at-top
  cfg = tt.config('decoder', name='tiny_finished', train=dict(steps=10))
  workdir = tmp_path / 'run'
  first = train(cfg, workdir, quiet=True)
  files = {p: p.read_bytes() for p in (workdir / 'summary.json', workdir / 'metrics.jsonl')}
  capsys.readouterr()
  again = train(cfg, workdir, quiet=True)
  assert 'already finished at step 10' in capsys.readouterr().err
  assert again.summary == first.summary
  assert {p: p.read_bytes() for p in files} == files
  (workdir / 'summary.json').unlink()
  rerun = train(cfg, workdir, quiet=True)
  assert 'already finished' not in capsys.readouterr().err
  assert rerun.summary['eval']['loss'] == first.summary['eval']['loss']
  assert (workdir / 'summary.json').exists()
