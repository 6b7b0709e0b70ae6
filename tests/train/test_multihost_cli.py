"""Several processes started through the `tx` command itself (tx.runs.distributed).

Two local processes (one CPU device each) train the session's reference tiny decoder
(`decoder_run`, one process) from its config.json: once with --coordinator / --num-processes /
--process-id, once from a SLURM-style environment (the variables JAX's cluster detection
reads, set here; loopback only) with 4 training steps per compiled call. Both must equal the
single-process run within float tolerance, with only process 0 printing. A config that
differs between the processes and a coordinator nobody answers are one-line errors, not
hangs.
"""

import json
import os
import subprocess
import time

import pytest

TIMEOUT = 240


def _start(tt, cwd, argv_of, env_of):
  return [subprocess.Popen([tt.python, '-m', 'tx.cli', *argv_of(i)], cwd=cwd, text=True,
                           env={**tt.env(devices=1), **env_of(i)}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE) for i in range(2)]


def _finish(procs):
  deadline, outputs = time.time() + TIMEOUT, []
  try:
    for p in procs:
      out, err = p.communicate(timeout=max(1, deadline - time.time()))
      outputs.append((p.returncode, out, err))
  except subprocess.TimeoutExpired:
    pytest.fail(f'the two processes did not finish in {TIMEOUT} s (a hang?)')
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  return outputs


@pytest.fixture(scope='module')
def reference_config(tt, decoder_run, tmp_path_factory):
  ref_dir, reference = decoder_run
  tmp = tmp_path_factory.mktemp('multihost_cli')
  config = json.loads(tt.config_json(reference.config))
  config['data']['data_dir'] = str(tmp / 'tfds')  # both processes prepare it at once
  (tmp / 'config.json').write_text(json.dumps(config))
  return tmp, tmp / 'config.json', ref_dir, reference


def _train_argv(config, workdir, *extra):
  return ['train', str(config), '--workdir', str(workdir), '--quiet', *extra]


def _check_equals_one_process(tt, workdir, outputs, ref_dir, reference):
  for i, (rc, _, err) in enumerate(outputs):
    assert rc == 0, f'process {i}:\n{err[-4000:]}'
  assert 'eval loss' in outputs[0][1] and outputs[1][1] == '', 'only process 0 prints'
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['processes'] == 2 and summary['devices'] == 2
  rows, _ = tt.rows(workdir)
  ref_rows, _ = tt.rows(ref_dir)
  assert [r['loss'] for r in rows] == pytest.approx([r['loss'] for r in ref_rows], rel=1e-5)
  assert summary['eval']['loss'] == pytest.approx(reference.summary['eval']['loss'], rel=1e-5)


def test_two_processes_by_flags_equal_one(tt, reference_config):
  tmp, config, ref_dir, reference = reference_config
  port, workdir = tt.free_port(), tmp / 'flags'
  procs = _start(tt, tmp, lambda i: _train_argv(
      config, workdir, '--coordinator', f'127.0.0.1:{port}', '--num-processes', '2',
      '--process-id', str(i), '--coordinator-timeout', '120'), lambda i: {})
  _check_equals_one_process(tt, workdir, _finish(procs), ref_dir, reference)
  # Run again: every process agrees the run is finished; nothing in it changes.
  summary, port = (workdir / 'summary.json').read_bytes(), tt.free_port()
  again = _finish(_start(tt, tmp, lambda i: _train_argv(
      config, workdir, '--coordinator', f'127.0.0.1:{port}', '--num-processes', '2',
      '--process-id', str(i), '--coordinator-timeout', '120'), lambda i: {}))
  assert [rc for rc, _, _ in again] == [0, 0], again[0][2][-3000:] + again[1][2][-3000:]
  assert 'already finished' in again[0][2]
  assert (workdir / 'summary.json').read_bytes() == summary


def test_a_slurm_environment_is_detected(tt, reference_config):
  tmp, config, ref_dir, reference = reference_config
  port, workdir = tt.free_port(), tmp / 'slurm'
  slurm = lambda i: {'SLURM_JOB_ID': '4242', 'SLURM_STEP_NODELIST': 'localhost',
                     'SLURM_NTASKS': '2', 'SLURM_PROCID': str(i), 'SLURM_LOCALID': '0',
                     'JAX_COORDINATOR_PORT': str(port)}
  # ... with 4 training steps per call (each process's rows of 4 batches in one call)
  procs = _start(tt, tmp, lambda i: _train_argv(config, workdir, '--set',
                                                'train.steps_per_call=4'), slurm)
  _check_equals_one_process(tt, workdir, _finish(procs), ref_dir, reference)


def test_processes_with_different_configs_stop_in_one_line(tt, reference_config):
  tmp, config, _, _ = reference_config
  port, workdir = tt.free_port(), tmp / 'mismatch'
  procs = _start(tt, tmp, lambda i: _train_argv(
      config, workdir, '--coordinator', f'127.0.0.1:{port}', '--num-processes', '2',
      '--process-id', str(i), '--coordinator-timeout', '120',
      *(['--set', 'train.steps=31'] if i else [])), lambda i: {})
  outputs = _finish(procs)
  for i, (rc, _, err) in enumerate(outputs):
    errors = [l for l in err.splitlines() if 'error' in l.lower()]
    assert rc == 2 and len(errors) == 1 and 'Traceback' not in err, f'process {i}:\n{err[-3000:]}'
    assert 'resolved a different config than process 0' in errors[0]
  assert not (workdir / 'checkpoints').exists()


def _process_zero_chose_torch_attention(tt, prefix, config, train_overrides) -> list:
  """Two tune cache folders (process 0's, process 1's), only process 0's with an entry for
  `config`'s step on this host choosing torch's attention (and `train_overrides`)."""
  from tx.bench import host as host_lib  # pylint: disable=import-outside-toplevel
  from tx.runs import tune  # pylint: disable=import-outside-toplevel
  from tx.train.run_dir import load_config_file  # pylint: disable=import-outside-toplevel
  caches = [prefix.with_name(f'{prefix.name}_{i}') for i in range(2)]
  env0 = {**tt.env(devices=1), 'TX_CACHE_DIR': str(caches[0])}
  entry = tune.entry_path(load_config_file(str(config)), host_lib.probe(env0), env0)
  entry.parent.mkdir(parents=True)
  entry.write_text(json.dumps({'choice': 'torch_attention', 'xla_flags': '', 'timings': {},
                               'model_overrides': {'attention_impl': 'torch'},
                               'train_overrides': train_overrides}))
  return caches


def test_every_process_takes_process_zeros_tuned_model_setting(tt, reference_config):
  """Hosts of one job may have cached different `tx tune` choices (here: process 0's cache
  chose torch's attention kernel at 4 steps per call, process 1 has none): every process
  compiles process 0's, where the two would otherwise stop at the config check."""
  pytest.importorskip('torch')
  tmp, config, ref_dir, reference = reference_config
  caches = _process_zero_chose_torch_attention(tt, tmp / 'tune_cache', config,
                                               {'steps_per_call': 4})
  port, workdir = tt.free_port(), tmp / 'tuned'
  procs = _start(tt, tmp, lambda i: _train_argv(
      config, workdir, '--coordinator', f'127.0.0.1:{port}', '--num-processes', '2',
      '--process-id', str(i), '--coordinator-timeout', '120'),
                 lambda i: {'TX_CACHE_DIR': str(caches[i])})
  outputs = _finish(procs)
  for i, (rc, _, err) in enumerate(outputs):
    assert rc == 0, f'process {i}:\n{err[-4000:]}'
  said = 'model.attention_impl=torch, train.steps_per_call=4, chosen by `tx tune`'
  assert said in outputs[0][1]
  written = json.loads((workdir / 'config.json').read_text())
  assert written['model']['attention_impl'] == 'torch' and written['train']['steps_per_call'] == 4
  rows, _ = tt.rows(workdir)
  ref_rows, _ = tt.rows(ref_dir)  # torch's kernel against XLA's attention: float tolerance
  assert [r['loss'] for r in rows] == pytest.approx([r['loss'] for r in ref_rows], rel=1e-4)


def test_a_tuned_torch_kernel_falls_back_to_xla_in_every_process_where_one_lacks_torch(
    tt, reference_config):
  """Process 0's cache chose torch's attention; process 1 has no PyTorch (blocked at start-up):
  both compile XLA's attention, with one line from process 0, where process 1 alone would fail
  at its first step (or, dropping it alone, compile another program than process 0's)."""
  pytest.importorskip('torch')
  tmp, config, ref_dir, reference = reference_config
  caches = _process_zero_chose_torch_attention(tt, tmp / 'no_torch_cache', config, {})
  blocker = tmp / 'no_torch'  # a sitecustomize that hides torch from find_spec and import
  blocker.mkdir(exist_ok=True)
  (blocker / 'sitecustomize.py').write_text("import sys\nsys.modules['torch'] = None\n")
  pythonpath = lambda i: (os.pathsep.join([str(blocker), tt.env()['PYTHONPATH']]) if i
                          else tt.env()['PYTHONPATH'])
  port, workdir = tt.free_port(), tmp / 'no_torch_run'
  procs = _start(tt, tmp, lambda i: _train_argv(
      config, workdir, '--coordinator', f'127.0.0.1:{port}', '--num-processes', '2',
      '--process-id', str(i), '--coordinator-timeout', '120'),
                 lambda i: {'TX_CACHE_DIR': str(caches[i]), 'PYTHONPATH': pythonpath(i)})
  outputs = _finish(procs)
  _check_equals_one_process(tt, workdir, outputs, ref_dir, reference)
  assert "'torch_attention' runs PyTorch's kernels" in outputs[0][1]
  assert 'a process of this job has no PyTorch' in outputs[0][1]
  written = json.loads((workdir / 'config.json').read_text())
  assert written['model']['attention_impl'] == 'auto'


def test_an_unreachable_coordinator_is_one_line_within_the_timeout(tt, tmp_path):
  start = time.time()
  done = subprocess.run(
      [tt.python, '-m', 'tx.cli', 'train', 'demo', '--workdir', str(tmp_path / 'w'),
       '--coordinator', f'127.0.0.1:{tt.free_port()}', '--num-processes', '2', '--process-id',
       '1', '--coordinator-timeout', '3'], env=tt.env(devices=1), capture_output=True,
      text=True, timeout=120, check=False)
  assert done.returncode == 2, done.stderr[-3000:]
  lines = done.stderr.strip().splitlines()
  assert len(lines) == 1 and 'not every process connected' in lines[0], done.stderr[-3000:]
  assert time.time() - start < 60
  assert not (tmp_path / 'w').exists()
