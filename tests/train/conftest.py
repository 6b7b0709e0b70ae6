"""Tiny corpora and configs shared by the training tests (fixtures only, nothing autouse).

Everything is tiny (d_model 32, 1 layer, seq_len 16, batch 8, a char vocabulary of 38)
so that a whole training run is dominated by one XLA compile. Prepared data always goes
under a session temporary directory (data.data_dir and $TFDS_DATA_DIR), never
~/tensorflow_datasets.
"""

import json
import os
import random
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tx.config import DataConfig, ModelConfig
from tx.config.base import to_dict
from tx.config.experiment import ExperimentConfig
from tx.config.optim import OptimConfig
from tx.config.train import TrainConfig

# 33 distinct characters (+ 5 specials = an even vocabulary of 38, so that 'vocab' can be
# split over a tensor axis of 2), some of them several UTF-8 bytes long (bits per byte).
WORDS = ('the a quick brown fox jumps over lazy dog cat runs home fast slow red blue café '
         'über 東京').split()
ROOT = Path(__file__).resolve().parents[2]


def write_corpus(path: Path, lines: int = 600, seed: int = 0) -> Path:
  rng = random.Random(seed)
  text = '\n'.join(' '.join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) + '.'
                   for _ in range(lines)) + '\n'
  path.write_text(text, encoding='utf-8')
  return path


# A toy translation: each word maps to a fixed "German" word, order reversed.
LEXICON = {'the': 'der', 'a': 'ein', 'quick': 'schnell', 'brown': 'braun', 'fox': 'fuchs',
           'dog': 'hund', 'cat': 'katze', 'runs': 'rennt', 'red': 'rot', 'blue': 'blau'}


def write_parallel(folder: Path, seed: int = 0) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(source_files, target_files) = ((train.en, val.en), (train.de, val.de))."""
  rng = random.Random(seed)
  words = sorted(LEXICON)
  folder.mkdir(parents=True, exist_ok=True)
  out = {}
  for split, n in (('train', 400), ('val', 40)):
    src = [[rng.choice(words) for _ in range(rng.randint(1, 3))] for _ in range(n)]
    (folder / f'{split}.en').write_text('\n'.join(' '.join(s) for s in src) + '\n')
    (folder / f'{split}.de').write_text(
        '\n'.join(' '.join(LEXICON[w] for w in reversed(s)) for s in src) + '\n')
    out[split] = (str(folder / f'{split}.en'), str(folder / f'{split}.de'))
  return (out['train'][0], out['val'][0]), (out['train'][1], out['val'][1])


def tiny_config(family: str, *, corpus: Path | None = None, parallel=None, data_dir: Path,
                name: str = 'tiny', **sections) -> ExperimentConfig:
  """A tiny experiment of `family` on the test corpus; `sections` replace whole fields,
  e.g. train=dict(steps=12), optim=dict(schedule='constant') (merged into the defaults)."""
  # The decoder is LLaMA-style (RoPE, RMSNorm, no biases: fewer parameter leaves, so less
  # to compile in the many runs that use it); the others keep the defaults (LayerNorm,
  # biases) with learned positions.
  if family == 'decoder':
    model = dict(position='rope', norm='rmsnorm', use_bias=False)
  else:
    model = dict(position='learned')
  model.update(family=family, d_model=32, num_heads=4, d_ff=64, num_layers=1, max_len=32)
  data = dict(tokenizer='char', seq_len=16, target_len=16, data_dir=str(data_dir))
  if family == 'encoder_decoder':
    src, tgt = parallel
    data.update(dataset='parallel', source_files=src, target_files=tgt)
  else:
    data.update(dataset='text', files=str(corpus))
  optim = dict(learning_rate=3e-3, warmup_steps=0, schedule='constant', clip_norm=1.0)
  train = dict(steps=30, batch_size=8, eval_every=30, eval_batches=2, log_every=5,
               checkpoint_every=10, sample_tokens=0)
  model.update(sections.pop('model', {}))
  data.update(sections.pop('data', {}))
  optim.update(sections.pop('optim', {}))
  train.update(sections.pop('train', {}))
  cfg = ExperimentConfig(name=name, model=ModelConfig(**model), data=DataConfig(**data),
                         optim=OptimConfig(**optim), train=TrainConfig(**train))
  if sections:
    from tx.config.base import override  # pylint: disable=g-import-not-at-top
    flat = {f'{sec}.{k}': v for sec, kv in sections.items() for k, v in kv.items()}
    cfg = override(cfg, flat)
  return cfg


def demo_overrides(cfg) -> list[str]:
  """`--set` arguments turning the registered `demo` into `cfg` (for `tx train demo` children)."""
  from tx import registry  # pylint: disable=g-import-not-at-top
  from tx.config.base import flatten  # pylint: disable=g-import-not-at-top
  base = flatten(registry.get('demo'))
  return [f'{k}={v!r}' for k, v in flatten(cfg).items() if k != 'name' and base[k] != v]


def assert_same_final_state(a: Path, b: Path, steps: int):
  """Both runs' latest checkpoints are at `steps`, with equal configs and bitwise-equal state;
  returns the config."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tx.runs.restore import load_run  # pylint: disable=g-import-not-at-top
  cfg_a, state_a, _, step_a = load_run(a)
  cfg_b, state_b, _, step_b = load_run(b)
  assert step_a == step_b == steps and cfg_a == cfg_b
  leaves_a = jax.tree_util.tree_leaves_with_path(state_a)
  leaves_b = jax.tree_util.tree_leaves(state_b)
  assert len(leaves_a) == len(leaves_b)
  for (path, x), y in zip(leaves_a, leaves_b):
    assert np.array_equal(np.asarray(x), np.asarray(y)), jax.tree_util.keystr(path)
  return cfg_a


def finish_child(proc, timeout: float) -> subprocess.CompletedProcess:
  """Waits for a child started with text pipes; kills it and fails the test on timeout."""
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    out, err = proc.communicate()
    pytest.fail(f'timed out:\n{err[-3000:]}')
  return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def config_json(cfg) -> str:
  return json.dumps(to_dict(cfg))


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def child_env(data_dir: Path, devices: int | None = None) -> dict:
  """Environment of a child python: tx importable, data cache in tmp, N CPU devices."""
  env = dict(os.environ)
  env['TFDS_DATA_DIR'] = str(data_dir)
  env['PYTHONPATH'] = os.pathsep.join([str(ROOT), env.get('PYTHONPATH', '')]).rstrip(os.pathsep)
  env['JAX_PLATFORMS'] = 'cpu'
  flags = [f for f in env.get('XLA_FLAGS', '').split()
           if not f.startswith('--xla_force_host_platform_device_count')]
  if devices is not None:
    flags.append(f'--xla_force_host_platform_device_count={devices}')
  env['XLA_FLAGS'] = ' '.join(flags)
  return env


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """Prepared-data cache of the session; also $TFDS_DATA_DIR while the session runs."""
  path = tmp_path_factory.mktemp('tfds')
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('TFDS_DATA_DIR', str(path))
    yield path


@pytest.fixture(scope='session')
def corpus(tmp_path_factory):
  return write_corpus(tmp_path_factory.mktemp('corpus') / 'corpus.txt')


@pytest.fixture(scope='session')
def parallel(tmp_path_factory):
  return write_parallel(tmp_path_factory.mktemp('parallel'))


@pytest.fixture(scope='session')
def tt(corpus, parallel, data_dir):
  """The helpers above ("tiny training"), bound to the session's corpora and data dir."""
  def config(family='decoder', **kw):
    return tiny_config(family, corpus=corpus, parallel=parallel, data_dir=data_dir, **kw)
  return types.SimpleNamespace(config=config, corpus=corpus, parallel=parallel,
                               data_dir=data_dir, config_json=config_json, rows=metric_rows,
                               demo_overrides=demo_overrides,
                               same_final_state=assert_same_final_state, finish=finish_child,
                               free_port=free_port, env=lambda devices=None: child_env(
                                   data_dir, devices), python=sys.executable, root=ROOT)


@pytest.fixture(scope='session')
def decoder_run(tt, tmp_path_factory):
  """(workdir, RunResult) of the reference tiny decoder run (30 steps, 1 process, this
  process's devices); test_training checks it, the sharding and multi-process tests
  compare against its losses."""
  from tx.train.loop import train  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp('run_decoder')
  return workdir, train(tt.config('decoder', name='tiny_decoder'), workdir, quiet=True)


@pytest.fixture(scope='session')
def family_runs(tt, decoder_run, tmp_path_factory):
  """{family: (workdir, RunResult)} of a 30-step tiny run per family (checkpoints kept at
  steps 20 and 30); the seq2seq run uses label smoothing 0.1."""
  from tx.train.loop import train  # pylint: disable=g-import-not-at-top
  out = {'decoder': decoder_run}
  for family in ('encoder', 'encoder_decoder'):
    task = {'label_smoothing': 0.1} if family == 'encoder_decoder' else {}
    cfg = tt.config(family, name=f'tiny_{family}', task=task)
    workdir = tmp_path_factory.mktemp(f'run_{family}')
    out[family] = workdir, train(cfg, workdir, quiet=True)
  return out


def metric_rows(workdir: Path) -> tuple[list[dict], list[dict]]:
  """(train rows, eval rows) of a run's metrics.jsonl."""
  rows = [json.loads(line) for line in (Path(workdir) / 'metrics.jsonl').read_text().splitlines()]
  return [r for r in rows if 'loss' in r], [r for r in rows if 'eval/loss' in r]
