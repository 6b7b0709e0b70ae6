"""Two processes on localhost (`jax.distributed`, one CPU device each) train one run.

Both processes train the session's reference tiny decoder (`decoder_run`: one process,
one device) with a data-parallel mesh over the two processes' devices into one shared
workdir. The global batch is the same rows whatever the topology, so the losses must
equal the single-process ones within float tolerance.
"""

import json
import math
import subprocess
import time

import jax
import pytest

CHILD = r'''
import json, os, sys, time
from pathlib import Path
import jax

port, process_id, workdir, config = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.distributed.initialize(coordinator_address=f'127.0.0.1:{port}', num_processes=2,
                           process_id=process_id, initialization_timeout=120)
# By hand, TX_TEST_LATE_S=45 makes process 1 reach train() late (after the devices are
# known): slow host-side work must not make the other process time out.
jax.devices()
time.sleep(float(os.environ.get('TX_TEST_LATE_S', 0)) * process_id)
from tx.config.base import from_dict
from tx.config.experiment import ExperimentConfig
from tx.train.loop import train

cfg = from_dict(ExperimentConfig, json.loads(Path(config).read_text()))
result = train(cfg, workdir, quiet=True)
print('RESULT ' + json.dumps({
    'process': jax.process_index(), 'processes': jax.process_count(),
    'devices': jax.device_count(), 'local_devices': jax.local_device_count(),
    'step': int(result.state.step), 'eval': result.summary['eval'],
    'summary_processes': result.summary['processes']}), flush=True)
jax.distributed.shutdown()
'''

TIMEOUT = 180


@pytest.fixture(scope='module')
def two_processes(tt, decoder_run, tmp_path_factory):
  _, reference = decoder_run
  tmp = tmp_path_factory.mktemp('multiprocess')
  (tmp / 'child.py').write_text(CHILD)
  # A fresh data dir: both processes prepare the dataset and tokenizer at the same time, as
  # on the first run of a job on a shared filesystem.
  config = json.loads(tt.config_json(reference.config))
  config['data']['data_dir'] = str(tmp / 'tfds')
  (tmp / 'config.json').write_text(json.dumps(config))
  workdir = tmp / 'run'
  port = tt.free_port()
  procs = [subprocess.Popen([tt.python, str(tmp / 'child.py'), str(port), str(i), str(workdir),
                             str(tmp / 'config.json')], env=tt.env(devices=1), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp)
           for i in range(2)]
  outputs = []
  deadline = time.time() + TIMEOUT
  try:
    for p in procs:
      out, err = p.communicate(timeout=max(1, deadline - time.time()))
      outputs.append((p.returncode, out, err))
  except subprocess.TimeoutExpired:
    pytest.fail(f'the two-process run did not finish in {TIMEOUT}s')
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  return workdir, outputs, decoder_run


def _result(out: str) -> dict:
  lines = [l for l in out.splitlines() if l.startswith('RESULT ')]
  assert lines, out[-2000:]
  return json.loads(lines[-1][len('RESULT '):])


def test_both_processes_exit_cleanly(two_processes):
  _, outputs, _ = two_processes
  for i, (rc, out, err) in enumerate(outputs):
    assert rc == 0, f'process {i}:\n{err[-4000:]}'
    r = _result(out)
    assert r['process'] == i and r['processes'] == 2 == r['summary_processes']
    assert r['devices'] == 2 and r['local_devices'] == 1
    assert r['step'] == 30


def test_losses_decrease_and_match_one_process(tt, two_processes):
  workdir, outputs, (ref_dir, reference) = two_processes
  rows, eval_rows = tt.rows(workdir)
  ref_rows, _ = tt.rows(ref_dir)
  losses = [r['loss'] for r in rows]
  assert len(losses) == 6 and all(math.isfinite(l) for l in losses)
  assert losses[-1] < losses[0] - 0.2
  if jax.default_backend() != 'cpu':
    pytest.skip(f'the reference run is on {jax.default_backend()}; the two processes on CPU')
  assert losses == pytest.approx([r['loss'] for r in ref_rows], rel=1e-5)
  # Both processes computed the same evaluation (over both shards of the split).
  evals = [_result(out)['eval'] for _, out, _ in outputs]
  assert evals[0] == evals[1]
  assert evals[0]['loss'] == pytest.approx(reference.summary['eval']['loss'], rel=1e-5)
  assert evals[0]['bits_per_byte'] == pytest.approx(reference.summary['eval']['bits_per_byte'],
                                                    rel=1e-5)
  assert [r['step'] for r in eval_rows] == [30]


def test_shared_workdir_is_one_run(two_processes):
  workdir, _, _ = two_processes
  # process 0 writes config.json, metrics.jsonl and summary.json; checkpoints are collective.
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['processes'] == 2 and summary['devices'] == 2
  steps = sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit())
  assert steps == [20, 30]
  assert not [p for p in (workdir / 'checkpoints').iterdir() if 'tmp' in p.name]
  lines = (workdir / 'metrics.jsonl').read_text().splitlines()
  assert len(lines) == len({line for line in lines})  # no row written twice
