"""The `tx` command line, run as `python -m tx` in subprocesses.

User errors exit with status 2 and one line on stderr that names the key and the fix, with
no traceback and nothing created in the workdir. A tiny run goes through train, eval and
generate end to end. Prepared data goes to a temporary $TFDS_DATA_DIR.
"""

import json
import math
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tx import registry

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ('demo', 'lm_shakespeare_char', 'mt_multi30k_en_de', 'mlm_shakespeare')
WORDS = 'the a quick brown fox jumps over lazy dog cat runs home fast slow red blue'.split()


@pytest.fixture(scope='module')
def cli(tmp_path_factory):
  """run(*args) -> CompletedProcess; start(*args) -> Popen (for running several at once)."""
  tmp = tmp_path_factory.mktemp('cli')
  env = dict(os.environ, TFDS_DATA_DIR=str(tmp / 'tfds'), JAX_PLATFORMS='cpu')
  env['PYTHONPATH'] = os.pathsep.join([str(ROOT), env.get('PYTHONPATH', '')]).rstrip(os.pathsep)
  env.pop('TX_RAW_DATA', None)

  def start(*args):
    return subprocess.Popen([sys.executable, '-m', 'tx', *map(str, args)], env=env, cwd=tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  def run(*args, timeout=300):
    p = start(*args)
    out, err = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)

  rng = random.Random(0)
  corpus = tmp / 'corpus.txt'
  corpus.write_text('\n'.join(' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 8)))
                              for _ in range(400)) + '\n')
  return type('Cli', (), dict(run=staticmethod(run), start=staticmethod(start), tmp=tmp,
                              corpus=corpus))


def tiny_sets(corpus):
  return ['data.dataset=text', f'data.files={corpus}', 'data.tokenizer=char', 'data.seq_len=16',
          'model.d_model=32', 'model.num_heads=4', 'model.d_ff=64', 'model.num_layers=1',
          'model.max_len=32', 'train.steps=10', 'train.batch_size=8', 'train.eval_every=10',
          'train.eval_batches=2', 'train.log_every=5', 'train.checkpoint_every=10',
          'train.sample_tokens=0']


def test_list(cli):
  r = cli.run('list')
  assert r.returncode == 0, r.stderr
  lines = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
  for name in EXPERIMENTS:
    description = registry.entry(name).description
    assert description
    assert name in lines and lines[name].split(None, 1)[1].strip() == description


# --- user errors --------------------------------------------------------------------------

# (id, arguments after `tx` with {W} = a fresh workdir, substrings the one line must hold)
ERRORS = [
    ('unknown_key', ['train', 'demo', '--workdir', '{W}', '--set', 'model.dmodel=3'],
     ['model.dmodel', 'unknown key', 'model.d_model']),
    ('wrong_type', ['train', 'demo', '--workdir', '{W}', '--set', 'model.d_model=abc'],
     ['model.d_model', 'integer', 'abc']),
    ('bad_choice', ['train', 'demo', '--workdir', '{W}', '--set', 'model.position=foo'],
     ['model.position', 'foo', 'sinusoidal', 'rope', 'alibi', 't5', 'none']),
    ('divisibility', ['train', 'demo', '--workdir', '{W}', '--set', 'model.d_model=30',
                      'model.num_heads=4'], ['model.d_model', '30', 'model.num_heads', 'head_dim']),
    ('top_k', ['train', 'demo', '--workdir', '{W}', '--set', 'model.moe.num_experts=2',
               'model.moe.top_k=3'], ['model.moe.top_k', 'model.moe.num_experts=2', '3']),
    ('not_key_value', ['train', 'demo', '--workdir', '{W}', '--set', 'model.d_model'],
     ['model.d_model', 'key=value']),
    ('unknown_experiment', ['train', 'no_such_experiment', '--workdir', '{W}'],
     ['no_such_experiment', 'tx list', *EXPERIMENTS]),
    ('unknown_command', ['frobnicate'], ['frobnicate', 'list', 'train', 'eval', 'generate']),
    ('missing_workdir_flag', ['train', 'demo'], ['--workdir']),
    ('eval_without_run', ['eval', '--workdir', '{E}'], ['--workdir', 'config.json', 'tx train']),
    ('other_experiment', ['train', 'demo', '--workdir', '{O}'],
     ['--workdir', 'lm_shakespeare_char', 'demo']),
]


@pytest.fixture(scope='module')
def launched(cli):
  """Starts the tiny training run and every error case at once (they are independent)."""
  empty = cli.tmp / 'empty'
  empty.mkdir()
  other = cli.tmp / 'other'
  other.mkdir()
  (other / 'config.json').write_text(json.dumps({'name': 'lm_shakespeare_char'}))
  workdir = cli.tmp / 'run'
  train = cli.start('train', 'demo', '--workdir', workdir, '--quiet', '--set',
                    *tiny_sets(cli.corpus))
  procs = {}
  for name, args, _ in ERRORS:
    w = cli.tmp / f'w_{name}'
    procs[name] = cli.start(*[a.format(W=w, E=empty, O=other) for a in args]), w
  yield {'train': (train, workdir), 'errors': procs, 'empty': empty, 'other': other}
  for p, _ in [(train, None), *procs.values()]:
    if p.poll() is None:
      p.kill()
      p.communicate()


@pytest.fixture(scope='module')
def errors(launched):
  """{id: (CompletedProcess, workdir)}, empty dir, dir of another experiment's run."""
  out = {}
  for name, (p, workdir) in launched['errors'].items():
    stdout, stderr = p.communicate(timeout=120)
    out[name] = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr), workdir
  return out, launched['empty'], launched['other']


@pytest.mark.parametrize('name,expected', [(n, e) for n, _, e in ERRORS],
                         ids=[n for n, _, _ in ERRORS])
def test_user_error_is_one_line(errors, name, expected):
  results, empty, other = errors
  r, workdir = results[name]
  assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
  lines = [line for line in r.stderr.splitlines() if line.strip()]
  assert len(lines) == 1, r.stderr
  assert 'Traceback' not in r.stderr
  assert 'error' in lines[0]
  for text in expected:
    assert text in lines[0], (text, lines[0])
  assert not workdir.exists(), f'{name} created {workdir}'
  assert list(empty.iterdir()) == []
  assert sorted(p.name for p in other.iterdir()) == ['config.json']


def test_unwritable_workdir(cli):
  locked = cli.tmp / 'locked'
  locked.mkdir()
  locked.chmod(0o500)
  try:
    if os.access(locked, os.W_OK):
      pytest.skip('running as a user (root?) who can write into a read-only directory')
    r = cli.run('train', 'demo', '--workdir', locked / 'run')
    assert r.returncode == 2
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and '--workdir' in lines[0] and 'not writable' in lines[0], r.stderr
    assert not (locked / 'run').exists()
  finally:
    locked.chmod(0o700)


def test_workdir_that_is_a_file(cli):
  path = cli.tmp / 'a_file'
  path.write_text('x')
  r = cli.run('train', 'demo', '--workdir', path)
  assert r.returncode == 2
  lines = [line for line in r.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and '--workdir' in lines[0] and 'not a directory' in lines[0], r.stderr
  assert path.read_text() == 'x'


# --- train, eval, generate end to end ------------------------------------------------------


@pytest.fixture(scope='module')
def trained(launched):
  p, workdir = launched['train']
  out, err = p.communicate(timeout=300)
  assert p.returncode == 0, err[-4000:]
  return workdir, subprocess.CompletedProcess(p.args, p.returncode, out, err)


def test_train(trained):
  workdir, r = trained
  assert 'demo: step 10, eval loss' in r.stdout
  assert 'Traceback' not in r.stderr
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['experiment'] == 'demo' and summary['steps'] == 10
  assert math.isfinite(summary['eval']['loss'])
  assert (workdir / 'checkpoints' / '10').is_dir()


def test_eval_and_generate(cli, trained):
  workdir, _ = trained
  ev = cli.start('eval', '--workdir', workdir, '--batches', 2, '--extrapolation', 'none')
  gen = cli.start('generate', '--workdir', workdir, '--prompt', 'ab', '--set',
                  'decode.strategy=greedy', 'decode.max_len=5')
  bad = cli.start('generate', '--workdir', workdir, '--prompt', 'ab', '--set', 'model.d_model=8')
  (ev_out, ev_err), (gen_out, gen_err), (_, bad_err) = (
      p.communicate(timeout=300) for p in (ev, gen, bad))
  # eval: JSON with the loss; on the same batches it is the training run's final eval.
  assert ev.returncode == 0, ev_err[-4000:]
  result, _ = json.JSONDecoder().raw_decode(ev_out)  # the JSON document comes first
  summary = json.loads((workdir / 'summary.json').read_text())
  assert result['step'] == 10 and result['split'] == 'validation'
  assert result['loss'] == pytest.approx(summary['eval']['loss'], rel=1e-6)
  assert 'bits_per_byte' in result
  assert json.loads((workdir / 'eval_validation_10.json').read_text())['loss'] == result['loss']
  # generate: the prompt and at most 5 greedy characters on one line.
  assert gen.returncode == 0, gen_err[-4000:]
  lines = gen_out.splitlines()
  assert len(lines) == 1 and lines[0].startswith('ab') and len(lines[0]) <= 2 + 5, gen_out
  # generate takes decode.* overrides only
  assert bad.returncode == 2
  assert [l for l in bad_err.splitlines() if l.strip()] == [
      'tx generate: error: model.d_model: tx generate only takes decode.* overrides']


def test_eval_and_generate_on_a_corrupt_checkpoint_say_so_in_one_line(cli, trained):
  workdir, _ = trained
  damaged = cli.tmp / 'damaged'
  shutil.copytree(workdir, damaged)
  files = sorted((p for p in (damaged / 'checkpoints' / '10' / 'state').rglob('*') if p.is_file()),
                 key=lambda p: p.stat().st_size)
  with open(files[-1], 'r+b') as f:  # the biggest file: the array data
    f.truncate(files[-1].stat().st_size // 2)
  ev = cli.start('eval', '--workdir', damaged, '--batches', 1, '--extrapolation', 'none')
  gen = cli.start('generate', '--workdir', damaged, '--prompt', 'ab')
  for name, p in (('eval', ev), ('generate', gen)):
    _, err = p.communicate(timeout=300)
    lines = [l for l in err.splitlines() if l.strip()]
    assert p.returncode == 2, err[-3000:]
    assert 'Traceback' not in err
    assert len(lines) == 1, err
    assert lines[0].startswith(f'tx {name}: error: ') and 'step 10' in lines[0], lines[0]
    assert 'checkpoint' in lines[0] and 'delete the damaged step' in lines[0], lines[0]
