"""The measurement worker's process handling (tx/bench/worker.py)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tx.bench import worker


def _running(pid: int) -> bool:
  """Alive and not a zombie (a container's init may not reap an orphan)."""
  try:
    with open(f'/proc/{pid}/stat', encoding='utf-8') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='prctl is Linux only')
def test_a_worker_stops_when_the_process_that_started_it_is_killed(tmp_path):
  """SIGTERM to `tx bench` (say, from `timeout`) reaches the parent alone: its worker must
  not go on measuring on the same cores."""
  (tmp_path / 'sleeper.py').write_text(
      'import os, time\n'
      'def run(spec):\n'
      '  open(spec["pidfile"], "w").write(str(os.getpid()))\n'
      '  time.sleep(120)\n'
      '  return {}\n', encoding='utf-8')
  pidfile = tmp_path / 'pid'
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(tmp_path), os.getcwd()] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
  parent = subprocess.Popen(
      [sys.executable, '-c', 'import sys; from tx.bench import worker; '
       f'worker.run_isolated("sleeper:run", {{"pidfile": {str(pidfile)!r}}}, threads=1)'],
      env=env)
  pid = None
  try:
    for _ in range(600):
      if pidfile.exists() and pidfile.read_text():
        pid = int(pidfile.read_text())
        break
      time.sleep(0.1)
    assert pid, 'the worker did not start'
    parent.send_signal(signal.SIGTERM)
    parent.wait(timeout=30)
    for _ in range(100):
      if not _running(pid):
        break
      time.sleep(0.1)
    assert not _running(pid), 'the worker outlived the process that started it'
  finally:
    parent.kill()
    if pid and _running(pid):
      os.kill(pid, signal.SIGKILL)


def test_a_worker_started_by_hand_runs_without_a_parent_record(monkeypatch):
  """`python -m tx.bench.worker ...` from a shell has no TX_BENCH_PARENT: nothing to watch."""
  monkeypatch.delenv('TX_BENCH_PARENT', raising=False)
  worker._stop_with_parent()  # returns, does not exit
