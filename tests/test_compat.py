"""tx/compat.py: each entry still holds on the installed libraries.

Every failure names the entry and the versions it was checked against: an upgrade that
breaks one fails here, not somewhere deep in a training run.
"""

import argparse
import asyncio
import contextlib
import gc
import inspect
import logging
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tx import compat

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def entry(name):
  """Turns any failure inside into one naming the compat entry and its checked versions."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    pytest.fail(f'tx.compat entry {name!r} (checked against {compat.CHECKED_AGAINST[name]}) '
                f'no longer holds: {type(e).__name__}: {e}; update tx/compat.py (and its users)')


def _python(code, timeout=120, **env):
  return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], cwd=REPO, timeout=timeout,
                        capture_output=True, text=True, env={**os.environ, **env})


def test_every_entry_records_its_versions():
  assert all(versions for versions in compat.CHECKED_AGAINST.values())


# --------------------------------------------------------------------------- jax._src.distributed

def test_coordination_client_and_its_barrier():
  with entry('jax._src.distributed'):
    from jax._src import distributed
    from jax._src.lib import _jax
    assert hasattr(distributed.global_state, 'client'), 'global_state.client is gone'
    doc = _jax.DistributedRuntimeClient.wait_at_barrier.__doc__ or ''
    assert 'barrier_id' in doc and 'timeout_in_ms' in doc, f'wait_at_barrier is now: {doc}'
    with socket.socket() as s:
      s.bind(('localhost', 0))
      port = s.getsockname()[1]
    out = _python(f'''
        import jax
        from tx import compat
        assert not compat.has_coordination_client()
        jax.distributed.initialize('localhost:{port}', num_processes=1, process_id=0,
                                   initialization_timeout=60)
        assert compat.has_coordination_client()
        compat.wait_at_barrier('tx-compat:0', 30)
        compat.wait_at_barrier('tx-compat:1', 30)
        print('met')
        ''', JAX_PLATFORMS='cpu')
    assert out.stdout.strip() == 'met', out.stderr[-2000:]


# ---------------------------------------------------------------------------- jax._src.xla_bridge

def test_backends_started_reads_without_starting():
  with entry('jax._src.xla_bridge'):
    from jax._src import xla_bridge
    started = getattr(xla_bridge, 'backends_are_initialized', None)
    assert callable(started), 'xla_bridge.backends_are_initialized is gone'
    assert not inspect.signature(started).parameters, inspect.signature(started)
    out = _python('''
        import jax
        from tx import compat
        before = compat.backends_started()
        jax.devices()
        print(before, compat.backends_started())
        ''', JAX_PLATFORMS='cpu')
    assert out.stdout.strip() == 'False True', (out.stdout, out.stderr[-2000:])


# ---------------------------------------------------------------------------- argparse subparsers

def test_subcommand_parser_finds_each_command():
  with entry('argparse subparsers'):
    assert isinstance(argparse._SubParsersAction, type)  # pylint: disable=protected-access
    parser = argparse.ArgumentParser(prog='tx')
    sub = parser.add_subparsers(dest='command', required=True)
    train = sub.add_parser('train')
    plan = sub.add_parser('plan', aliases=['p'])
    assert compat.subcommand_parser(parser, 'train') is train
    assert compat.subcommand_parser(parser, 'plan') is plan
    assert compat.subcommand_parser(parser, 'p') is plan
  with pytest.raises(ValueError, match='no subcommands'):
    compat.subcommand_parser(argparse.ArgumentParser(prog='x'), 'train')


# --------------------------------------------------------------------- Orbax CheckpointManager

def test_unreadable_metrics_leave_the_step_unranked(tmp_path):
  with entry('orbax CheckpointManager.metrics'):
    import orbax.checkpoint as ocp
    params = list(inspect.signature(ocp.CheckpointManager.metrics).parameters)
    assert params == ['self', 'step'], f'CheckpointManager.metrics{params}'
    seen = []

    def manager():
      options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False,
                                             best_fn=lambda m: m['loss'], best_mode='min')
      return compat.checkpoint_manager(
          tmp_path, unreadable_metrics=lambda step, e: seen.append(step),
          item_handlers={'meta': ocp.JsonCheckpointHandler()}, options=options)

    m = manager()
    m.save(1, args=ocp.args.Composite(meta=ocp.args.JsonSave({'a': 1})), metrics={'loss': 1.0})
    m.close()
    files = [p for p in (tmp_path / '1' / 'metrics').rglob('*') if p.name == 'metrics']
    assert files, f'no metrics file in {sorted(tmp_path.rglob("*"))}'
    files[0].write_text('{not json')
    m = manager()  # plain Orbax raises here: it reads every step's metrics on opening
    assert seen == [1], f'the start-up read no longer goes through metrics(): {seen}'
    assert m.metrics(1) is None and m.all_steps() == [1]
    m.close()


# ------------------------------------------------------------------------------ orphaned reads

@pytest.fixture(scope='module')
def orbax_read_error(tmp_path_factory):
  """The error of a real Orbax read of a step whose array files are cut short."""
  import jax.numpy as jnp
  import orbax.checkpoint as ocp
  path = tmp_path_factory.mktemp('damaged') / 'step'
  state = {'w0': jnp.arange(4096.0), 'w1': jnp.arange(4096.0) + 1}
  with ocp.StandardCheckpointer() as ckpt:
    ckpt.save(path, state)
    ckpt.wait_until_finished()
    for f in (p for p in path.rglob('*') if p.is_file() and p.stat().st_size > 4096):
      f.write_bytes(f.read_bytes()[:100])
    try:
      ckpt.restore(path, state)
    except Exception as e:  # pylint: disable=broad-except
      return e
  pytest.fail('a damaged Orbax step read back without an error')


def test_orbax_and_tensorstore_read_errors_are_recognised(orbax_read_error):
  with entry('orphaned reads'):
    orbax_text, tensorstore_text = compat.ORBAX_READ_ERRORS
    assert orbax_text in str(orbax_read_error), str(orbax_read_error)[:300]
    cause = orbax_read_error.__cause__ or orbax_read_error.__context__
    assert cause is not None and tensorstore_text in str(cause), str(cause)[:300]
    assert compat.is_orbax_read_error(orbax_read_error) and compat.is_orbax_read_error(cause)
    assert not compat.is_orbax_read_error(ValueError('a real bug'))


def test_never_retrieved_exceptions_reach_the_asyncio_filter():
  seen = []

  class Record(logging.Filter):

    def filter(self, record):
      seen.append((record.getMessage().split('\n', 1)[0], record.exc_info))
      return False

  error = ValueError('Encountered error while reading array index: (slice(0, 8, 1),)')

  async def fail():
    raise error

  record = Record()
  asyncio_log = logging.getLogger('asyncio')
  installed = list(asyncio_log.filters)  # tx's own filter (if an earlier test installed it)
  for f in installed:  # would drop these records before ours sees them
    asyncio_log.removeFilter(f)
  with entry('orphaned reads'):
    compat.add_asyncio_log_filter(record)
    try:
      loop = asyncio.new_event_loop()
      future = loop.create_future()
      future.set_exception(error)
      task = loop.create_task(fail())
      loop.run_until_complete(asyncio.sleep(0))
      loop.close()
      del future, task
      gc.collect()
    finally:
      asyncio_log.removeFilter(record)
      for f in installed:
        asyncio_log.addFilter(f)
    kinds = sorted(line.split()[0] for line, _ in seen if compat.NEVER_RETRIEVED in line)
    assert kinds == ['Future', 'Task'], seen
    assert all(info and info[1] is error for _, info in seen), seen


def test_a_callback_into_a_closed_loop_is_recognised():
  with entry('orphaned reads'):
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError) as raised:
      loop.call_soon_threadsafe(lambda: None)
    assert compat.is_callback_into_closed_loop(raised.value, raised.value.__traceback__), (
        f'{raised.value!r} from {raised.traceback}')
  assert not compat.is_callback_into_closed_loop(RuntimeError('Event loop is closed'), None)


def test_a_failed_orbax_save_thread_logs_on_the_filtered_logger():
  """Orbax's background threads report their failure with absl's logging.exception, i.e. on
  the Python logger add_orbax_log_filter filters, with the error as exc_info."""
  seen = []

  class Record(logging.Filter):

    def filter(self, record):
      seen.append(record.exc_info[1] if record.exc_info else None)
      return False

  error = OSError(28, 'No space left on device')
  with entry('orbax save-thread log'):
    from orbax.checkpoint._src.futures import future  # pylint: disable=g-import-not-at-top
    thread = future._SignalingThread(  # pylint: disable=protected-access
        send_signals=[], receive_signals=[], target=lambda: (_ for _ in ()).throw(error))
    record = Record()
    absl_log = logging.getLogger('absl')
    installed = list(absl_log.filters)  # tx's own filter (if an earlier test installed it)
    for f in installed:  # would drop this disk-full record before ours sees it
      absl_log.removeFilter(f)
    compat.add_orbax_log_filter(record)
    try:
      thread.start()
      with pytest.raises(OSError):  # join() re-raises the thread's error
        thread.join()
    finally:
      absl_log.removeFilter(record)
      for f in installed:
        absl_log.addFilter(f)
    assert error in seen, seen


def test_drop_unraisable_chains_the_previous_hook(monkeypatch):
  passed = []
  monkeypatch.setattr(sys, 'unraisablehook', lambda u: passed.append(u.exc_value))

  class Dies:

    def __init__(self, error):
      self.error = error

    def __del__(self):
      raise self.error

  noise, bug = ValueError('noise'), ValueError('a bug')
  with entry('orphaned reads'):
    compat.drop_unraisable(lambda u: u.exc_value is noise)
    Dies(noise)
    Dies(bug)
    gc.collect()
    assert passed == [bug], passed


# ------------------------------------------------------------------------------- without_torch

def test_without_torch_hides_torch_and_restores_sys_modules(monkeypatch):
  monkeypatch.delitem(sys.modules, 'torch', raising=False)  # as if never imported
  with entry('without_torch'):
    with compat.without_torch():
      with pytest.raises(ImportError):
        import torch  # pylint: disable=unused-import,g-import-not-at-top  # noqa: F401
    assert 'torch' not in sys.modules
  present = object()
  monkeypatch.setitem(sys.modules, 'torch', present)
  with compat.without_torch():  # already imported: left alone
    assert sys.modules['torch'] is present
  assert sys.modules['torch'] is present


def test_tensorboardx_imports_without_torch():
  with entry('without_torch'):
    out = _python('''
        import sys
        from tx.compat import without_torch
        with without_torch():
          from tensorboardX import SummaryWriter
        print('torch' in sys.modules, SummaryWriter.__name__)
        ''')
    assert out.stdout.strip() == 'False SummaryWriter', (out.stdout, out.stderr[-2000:])


# ------------------------------------------------------------------------------ cuDNN refusals

def test_cudnn_refusals_are_recognised():
  import jax
  import jax.numpy as jnp
  q = jnp.ones((1, 8, 2, 12), jnp.bfloat16)  # head dim 12: not a multiple of 8
  with entry('cudnn refusals'):
    # No cuDNN here (a CPU jaxlib) raises RuntimeError; on a GPU the head dim is refused.
    with pytest.raises(Exception) as raised:
      jax.nn.dot_product_attention(q, q, q, implementation='cudnn')
    assert compat.is_cudnn_refusal(raised.value), repr(raised.value)
    from jax._src.cudnn import fused_attention_stablehlo as fused
    with pytest.raises(NotImplementedError):
      fused.check_is_flash_attention(q, q, q, fused.AttentionLayout.BTNH.value, 91000,
                                     False, False)
  assert not compat.is_cudnn_refusal(RuntimeError('INTERNAL: an XLA failure'))
  assert not compat.is_cudnn_refusal(TypeError('a bug'))


def test_detected_cluster_reads_a_slurm_environment(monkeypatch):
  for var in ('OMPI_COMM_WORLD_SIZE', 'KUBERNETES_SERVICE_HOST', 'TPU_WORKER_HOSTNAMES'):
    monkeypatch.delenv(var, raising=False)
  with entry('jax._src.clusters'):
    for var in ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_NTASKS', 'SLURM_PROCID',
                'SLURM_LOCALID'):
      monkeypatch.delenv(var, raising=False)
    assert compat.detected_cluster() is None
    monkeypatch.setenv('SLURM_JOB_ID', '7')
    monkeypatch.setenv('SLURM_STEP_NODELIST', 'node[001-004]')
    monkeypatch.setenv('SLURM_NTASKS', '4')
    monkeypatch.setenv('SLURM_PROCID', '3')
    monkeypatch.setenv('SLURM_LOCALID', '0')
    assert compat.detected_cluster() == ('slurm', 4, 3)
