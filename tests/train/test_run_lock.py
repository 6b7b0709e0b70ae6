"""One writer per run directory (tx.train.run_lock): a second writer is refused with one line
naming the holder, and a killed holder leaves no stale lock."""

import json
import os
import signal
import socket
import subprocess

import pytest

from tx.cli import main
from tx.train.loop import make_pipelines
from tx.train.run_lock import LOCK_FILE, RunLock, RunLocked

# A holder that needs no training: it takes the lock, says so, and sleeps.
HOLDER = ('import sys, time\n'
          'from tx.train.run_lock import RunLock\n'
          'RunLock(sys.argv[1]).acquire()\n'
          'print("locked", flush=True)\n'
          'time.sleep(600)\n')


@pytest.fixture
def holder(tt, tmp_path):
  """(workdir, child process holding its lock)."""
  workdir = tmp_path / 'run'
  workdir.mkdir()
  proc = subprocess.Popen([tt.python, '-c', HOLDER, str(workdir)], env=tt.env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  line = proc.stdout.readline()
  assert line.strip() == 'locked', proc.stderr.read()
  yield workdir, proc
  if proc.poll() is None:
    proc.kill()
  proc.wait()
  proc.stdout.close()
  proc.stderr.close()


def test_the_lock_file_names_the_holder(holder):
  workdir, proc = holder
  record = json.loads((workdir / LOCK_FILE).read_text())
  assert record['pid'] == proc.pid and record['host'] == socket.gethostname()
  assert record['since']
  with pytest.raises(RunLocked, match=f'process {proc.pid} on host'):
    RunLock(workdir).acquire()


def test_a_second_train_is_refused_with_one_line(tt, holder, capsys):
  workdir, proc = holder
  cfg = tt.config(train=dict(steps=2))
  make_pipelines(cfg, 'causal_lm')  # the data the holder would have prepared (its progress bars)
  capsys.readouterr()
  args = ['train', 'demo', '--workdir', str(workdir), '--quiet', '--set', *tt.demo_overrides(cfg)]
  assert main(args) == 2
  lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(lines) == 1, lines
  line = lines[0]
  assert 'Traceback' not in line
  for text in (str(workdir), f'process {proc.pid}', socket.gethostname(), 'since',
               'another --workdir'):
    assert text in line, (text, line)
  assert sorted(p.name for p in workdir.iterdir()) == [LOCK_FILE]  # nothing written


def test_a_killed_holder_leaves_no_stale_lock(holder):
  workdir, proc = holder
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait(timeout=30)
  lock = RunLock(workdir).acquire()
  try:
    assert json.loads((workdir / LOCK_FILE).read_text())['pid'] == os.getpid()
  finally:
    lock.release()
  RunLock(workdir).acquire().release()  # released again: no stale lock from this one either
