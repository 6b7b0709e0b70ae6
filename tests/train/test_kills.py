"""Kills and preemption: a run SIGKILLed five times, or stopped by SIGINT and SIGTERM, and
restarted each time with the same command, ends bitwise equal to an uninterrupted run (CPU).

All runs are `tx train demo` child processes with tiny overrides, checkpointing
asynchronously every 2 steps, and a hook that makes each training batch take DELAY seconds
so that a kill lands somewhere inside training rather than always in start-up.

Run A: uninterrupted. Run B: killed 5 times -- twice the moment an asynchronous save's
temporary directory appears (mid-save), once at a random moment of start-up (import, data,
compile), twice at a random moment of training -- then run to the end. After every kill the
latest step Orbax lists must be a complete, readable checkpoint. Run C: SIGINT, then SIGTERM
on the restart, then run to the end; each signal must save, exit 128+signal with a line
saying how to resume, and the restart must say where it resumed.
"""

import json
import os
import random
import signal
import subprocess
import time

import pytest

from tx.train.checkpoint import Checkpointer

STEPS, EVERY, DELAY = 60, 2, 0.02
KILLS = ('save', 'startup', 'random', 'save', 'random')

HOOK = r'''
import sys, time
from tx.data import pipeline

delay = float(sys.argv[1])
_next = pipeline.BatchIterator.__next__


def slow_next(self):
  if self._pipe.train:
    time.sleep(delay)
  return _next(self)


pipeline.BatchIterator.__next__ = slow_next
from tx.cli import main
sys.exit(main(sys.argv[2:]))
'''


class Runner:
  """Starts `tx train demo` (through HOOK) on a workdir; waits for moments inside a run."""

  def __init__(self, tt, tmp):
    cfg = tt.config('decoder', name='demo', model=dict(dropout=0.1),
                    optim=dict(schedule='cosine', warmup_steps=4),
                    train=dict(steps=STEPS, checkpoint_every=EVERY, eval_every=20,
                               eval_batches=1, log_every=1, async_checkpoint=True,
                               keep_checkpoints=3))
    self.sets, self.env, self.tt, self.tmp = tt.demo_overrides(cfg), tt.env(), tt, tmp
    (tmp / 'hook.py').write_text(HOOK)
    self.procs = []

  def start(self, workdir):
    p = subprocess.Popen([self.tt.python, str(self.tmp / 'hook.py'), str(DELAY), 'train', 'demo',
                          '--workdir', str(workdir), '--quiet', '--set', *self.sets],
                         env=self.env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=self.tmp)
    self.procs.append(p)
    return p

  @staticmethod
  def wait_for(proc, condition, what, timeout=240):
    deadline = time.time() + timeout
    while not condition():
      if proc.poll() is not None:
        pytest.fail(f'exited ({proc.returncode}) before {what}:\n{proc.stderr.read()[-3000:]}')
      if time.time() > deadline:
        pytest.fail(f'timed out waiting for {what}')
      time.sleep(0.001)

  def finish(self, proc, timeout=240):
    return self.tt.finish(proc, timeout)

  def close(self):
    for p in self.procs:
      if p.poll() is None:
        p.kill()
        p.communicate()


def _logged_steps(workdir):
  path = workdir / 'metrics.jsonl'
  if not path.exists():
    return 0
  steps = [json.loads(line)['step'] for line in path.read_text().splitlines()
           if line.endswith('}')]
  return max(steps, default=0)


def _tmp_dirs(workdir) -> set[str]:
  folder = workdir / 'checkpoints'
  return {p.name for p in folder.iterdir() if 'tmp' in p.name} if folder.is_dir() else set()


def _committed(workdir):
  """(latest step Orbax lists, whether it reads back completely, tmp dirs present)."""
  folder = workdir / 'checkpoints'
  if not folder.is_dir():
    return None, True, []
  tmp_dirs = sorted(p.name for p in folder.iterdir() if 'tmp' in p.name)
  ckpt = Checkpointer(folder, async_save=False, best_metric=None)
  try:
    latest = ckpt.latest_step()
    return latest, latest is None or ckpt.verify(latest), tmp_dirs
  finally:
    ckpt.close()


@pytest.fixture(scope='module')
def runs(tt, tmp_path_factory):
  tmp = tmp_path_factory.mktemp('kills')
  runner = Runner(tt, tmp)
  rng = random.Random(0)
  a, b, c = tmp / 'A', tmp / 'B', tmp / 'C'
  out = {'a': a, 'b': b, 'c': c, 'kills': [], 'signals': []}
  try:
    run_a = runner.start(a)
    for kind in KILLS:
      p = runner.start(b)
      before, stale = _logged_steps(b), _tmp_dirs(b)
      if kind == 'save':  # a save of this process has begun and not yet been committed
        runner.wait_for(p, lambda: _logged_steps(b) > before and _tmp_dirs(b) - stale,
                        'an async save')
      elif kind == 'startup':
        time.sleep(rng.uniform(0.5, 3.0))
      else:
        runner.wait_for(p, lambda: _logged_steps(b) > before, 'training')
        time.sleep(rng.uniform(0.0, 0.3))
      alive = p.poll() is None
      p.send_signal(signal.SIGKILL)
      killed = runner.finish(p, 30)
      out['kills'].append(dict(kind=kind, alive=alive, returncode=killed.returncode,
                               logged=_logged_steps(b), committed=_committed(b)))
    out['b_final'] = runner.finish(runner.start(b))
    for sig in (signal.SIGINT, signal.SIGTERM):
      p = runner.start(c)
      before = _logged_steps(c)
      runner.wait_for(p, lambda: _logged_steps(c) > before + 3, 'training')
      p.send_signal(sig)
      t0 = time.time()
      stopped = runner.finish(p, 60)
      out['signals'].append(dict(signal=sig, result=stopped, seconds=time.time() - t0,
                                 committed=_committed(c)))
    out['c_final'] = runner.finish(runner.start(c))
    out['a_result'] = runner.finish(run_a)
  finally:
    runner.close()
  return out


def _metric_log(workdir):
  """metrics.jsonl without its timing fields, in file order."""
  rows = []
  for line in (workdir / 'metrics.jsonl').read_text().splitlines():
    r = json.loads(line)
    rows.append({k: v for k, v in r.items()
                 if k not in ('time', 'tokens_per_s', 'step_time_s', 'mfu')})
  return rows


def test_every_kill_hit_a_live_run_and_left_a_readable_latest_checkpoint(runs):
  assert len(runs['kills']) == 5
  for k in runs['kills']:
    assert k['alive'] and k['returncode'] == -signal.SIGKILL, k
    latest, readable, _ = k['committed']
    assert readable, f'latest listed checkpoint {latest} does not read back after a {k}'


def test_a_kill_landed_inside_an_async_save(runs):
  """The half-written step (a tmp dir) exists after the kill, and is not the latest step."""
  mid_save = [k for k in runs['kills'] if k['kind'] == 'save' and k['committed'][2]]
  assert mid_save, runs['kills']
  for k in mid_save:
    latest, _, tmp_dirs = k['committed']
    for name in tmp_dirs:
      assert latest is None or int(name.split('.')[0]) > latest, (name, latest)


def test_killed_runs_make_progress_and_finish(runs):
  assert runs['a_result'].returncode == 0, runs['a_result'].stderr[-3000:]
  final = runs['b_final']
  assert final.returncode == 0, final.stderr[-3000:]
  assert f'step {STEPS}' in final.stdout
  steps = [k['committed'][0] or 0 for k in runs['kills']]
  assert steps == sorted(steps) and steps[-1] > 0, steps


def test_killed_run_equals_uninterrupted_run_bitwise(tt, runs):
  tt.same_final_state(runs['a'], runs['b'], STEPS)
  assert _metric_log(runs['a']) == _metric_log(runs['b'])
  summary_a = json.loads((runs['a'] / 'summary.json').read_text())
  summary_b = json.loads((runs['b'] / 'summary.json').read_text())
  assert summary_a['eval'] == summary_b['eval'] and summary_a['steps'] == summary_b['steps']


@pytest.mark.parametrize('index,name,code', [(0, 'SIGINT', 130), (1, 'SIGTERM', 143)])
def test_signal_saves_and_exits_with_a_resume_line(runs, index, name, code):
  s = runs['signals'][index]
  r = s['result']
  assert r.returncode == code, r.stderr[-3000:]
  assert 'Traceback' not in r.stderr
  last = r.stderr.strip().splitlines()[-1]
  assert last.startswith('tx train: stopped: ') and name in last, last
  assert 'run the same command again to resume' in last
  saved = int(last.split('checkpoint at step ')[1].split()[0])
  latest, readable, tmp_dirs = s['committed']
  assert latest == saved and readable and not tmp_dirs
  assert s['seconds'] < 30


def test_signalled_run_resumes_where_it_stopped_and_equals_the_uninterrupted_run(tt, runs):
  final = runs['c_final']
  assert final.returncode == 0, final.stderr[-3000:]
  second = runs['signals'][1]['result']
  saved = second.stderr.strip().splitlines()[-1].split('checkpoint at step ')[1].split()[0]
  assert f'resuming from checkpoint at step {saved}' in final.stderr
  tt.same_final_state(runs['a'], runs['c'], STEPS)
  assert _metric_log(runs['a']) == _metric_log(runs['c'])
