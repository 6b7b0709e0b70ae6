"""A disk that fills up during a checkpoint save: one line, the previous checkpoint kept,
and the same command resumes bitwise once there is space again.

The end-to-end test trains `tx train demo` (tiny) on a real tmpfs whose size holds one
checkpoint but not two (Orbax commits a step before deleting an old one), so the second save
fails inside TensorStore with ENOSPC. Mounting needs root (CI here runs as root); elsewhere that
test skips with the reason. The unit tests inject the error Orbax raises and run everywhere.
"""

import errno
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import jax.numpy as jnp
import pytest

from tx import cli
from tx.errors import DiskFullError, is_disk_full
from tx.train.checkpoint import Checkpointer

STEPS, EVERY = 12, 4
TENSORSTORE_ENOSPC = ('RESOURCE_EXHAUSTED: Error writing "params.w/0" in OCDBT database at local '
                      'file "/x/": Failed to write 4096 bytes to file 9: No space left on device '
                      "[os_error_code='28']")


def test_disk_full_is_recognised_by_errno_text_and_cause():
  assert is_disk_full(OSError(errno.ENOSPC, 'No space left on device'))
  assert is_disk_full(OSError(errno.EDQUOT, 'Disk quota exceeded'))
  assert is_disk_full(ValueError(TENSORSTORE_ENOSPC))
  try:
    try:
      raise OSError(errno.ENOSPC, 'full')
    except OSError as inner:
      raise RuntimeError('save failed') from inner
  except RuntimeError as outer:
    assert is_disk_full(outer)
  assert not is_disk_full(OSError(errno.EACCES, 'Permission denied'))
  assert not is_disk_full(ValueError('RESOURCE_EXHAUSTED: out of memory'))
  assert not is_disk_full(None)


def test_a_save_that_fills_the_disk_is_one_line_and_keeps_the_previous_step(tmp_path,
                                                                          monkeypatch):
  state = {'w': jnp.arange(4.0)}
  ckpt = Checkpointer(tmp_path / 'ckpt', async_save=False, best_metric=None)
  assert ckpt.save(1, state)
  manager_save = ckpt._manager.save  # pylint: disable=protected-access

  def full_disk_save(step, *args, **kwargs):
    (tmp_path / 'ckpt' / f'{step}.orbax-checkpoint-tmp' / 'state').mkdir(parents=True)
    raise ValueError(TENSORSTORE_ENOSPC)

  monkeypatch.setattr(ckpt._manager, 'save', full_disk_save)  # pylint: disable=protected-access
  with pytest.raises(DiskFullError) as e:
    ckpt.save(2, state)
  message = str(e.value)
  assert '\n' not in message
  assert 'checkpoint step 2 was not written' in message and 'step 1, is kept' in message
  assert 'rerun the same command' in message
  assert not list((tmp_path / 'ckpt').glob('*tmp*')), 'the half-written step must be removed'
  monkeypatch.setattr(ckpt._manager, 'save', manager_save)  # pylint: disable=protected-access
  ckpt.close()
  reopened = Checkpointer(tmp_path / 'ckpt', async_save=False, best_metric=None)
  assert reopened.latest_step() == 1 and reopened.verify(1)
  reopened.close()


def test_cli_turns_any_full_disk_write_into_one_line(monkeypatch, capsys):
  def full(args):
    raise OSError(errno.ENOSPC, 'No space left on device', 'metrics.jsonl')

  monkeypatch.setattr(cli, 'cmd_list', full)
  assert cli.main(['list']) == 1
  err = capsys.readouterr().err.strip()
  assert err.startswith('tx list: error: no space left on the device') and '\n' not in err


# ------------------------------------------------------------------ a real filesystem that fills up

@pytest.fixture
def small_fs(tmp_path):
  """A tmpfs mounted at tmp_path/fs (resizable with `resize(bytes)`), unmounted afterwards."""
  mount = tmp_path / 'fs'
  mount.mkdir()
  if os.geteuid() != 0 or not shutil.which('mount'):
    pytest.skip('needs root to mount a small tmpfs (CI runs as root)')
  made = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64m', f'tx-{uuid.uuid4().hex[:8]}',
                         str(mount)], capture_output=True, text=True, check=False)
  if made.returncode:
    pytest.skip(f'cannot mount a tmpfs here: {made.stderr.strip()}')

  def resize(size_bytes: int):
    subprocess.run(['mount', '-o', f'remount,size={size_bytes}', str(mount)], check=True)

  try:
    yield mount, resize
  finally:
    subprocess.run(['umount', '-l', str(mount)], check=False)


def _train(tt, cfg, workdir: Path):
  return subprocess.run(
      [tt.python, '-m', 'tx.cli', 'train', 'demo', '--workdir', str(workdir), '--quiet', '--set',
       *tt.demo_overrides(cfg)], env=tt.env(), text=True, capture_output=True, timeout=300,
      check=False)


def _disk_bytes(path: Path) -> int:
  return sum(p.stat().st_blocks * 512 for p in path.rglob('*') if p.is_file())


def test_full_disk_mid_run_stops_in_one_line_and_resumes_bitwise(tt, tmp_path, small_fs):
  mount, resize = small_fs
  cfg = tt.config('decoder', name='demo', train=dict(
      steps=STEPS, checkpoint_every=EVERY, eval_every=STEPS, eval_batches=1, log_every=2,
      async_checkpoint=True, keep_checkpoints=2))
  reference = tmp_path / 'A'
  done = _train(tt, cfg, reference)
  assert done.returncode == 0, done.stderr[-3000:]
  one_step = _disk_bytes(reference / 'checkpoints' / str(STEPS))
  # Room for the run's small files and a checkpoint or two, not for all three saves.
  resize(one_step * 3 // 2 + 256 * 1024)
  run = mount / 'B'
  stopped = _train(tt, cfg, run)
  assert stopped.returncode == 1, stopped.stderr[-3000:]
  assert 'Traceback' not in stopped.stderr, stopped.stderr[-3000:]
  errors = [line for line in stopped.stderr.splitlines() if 'error' in line.lower()]
  assert len(errors) == 1 and errors[0].startswith('tx train: error: checkpoint step '), errors
  assert 'no space left on the device' in errors[0] and 'rerun the same command' in errors[0]
  ckpt = Checkpointer(run / 'checkpoints', async_save=False, best_metric=None)
  try:
    kept = ckpt.latest_step()
    assert kept is not None and kept < STEPS and ckpt.verify(kept)
  finally:
    ckpt.close()
  assert f'checkpoint step {kept + EVERY} was not written' in errors[0], errors[0]
  assert f'step {kept}, is kept' in errors[0], errors[0]
  assert not list((run / 'checkpoints').glob('*tmp*')), 'the failed step must not be left behind'

  resize(64 * 1024 * 1024)  # space freed
  resumed = _train(tt, cfg, run)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert f'resuming from checkpoint at step {kept}' in resumed.stderr
  tt.same_final_state(reference, run, STEPS)
