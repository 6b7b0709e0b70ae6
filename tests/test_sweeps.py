"""Sweeps: the axis language, variant names, up-front validation, the plan, `tx sweep`
(dry run, commands, skipping finished runs, resuming partial ones, --only) and `tx list`.

The runs use a tiny test-only experiment (byte tokenizer, d_model 16, 1 layer, 3 steps) on
a small text file; it and the test sweeps are registered for this module only.
"""

import json
import random
import shlex

import pytest

from tx import registry
from tx.cli import main
from tx.config import DataConfig, ModelConfig
from tx.config.base import ConfigError, parse_overrides
from tx.config.experiment import ExperimentConfig
from tx.config.optim import OptimConfig
from tx.config.train import TrainConfig
from tx.sweep import axis, cases, make_sweep, plan, product, short_keys, variant_name, zip_

BASE = 'sweeptest_tiny'
SWEEP = 'sweeptest_ffn'
BAD_SWEEP = 'sweeptest_bad'


@pytest.fixture(scope='module')
def env(tmp_path_factory):
  """Registers the tiny experiment and the test sweeps; data cache in tmp."""
  tmp = tmp_path_factory.mktemp('sweeps')
  rng = random.Random(0)
  words = 'the quick brown fox jumps over a lazy dog and runs home'.split()
  corpus = tmp / 'corpus.txt'
  corpus.write_text('\n'.join(' '.join(rng.choice(words) for _ in range(8))
                              for _ in range(300)) + '\n')
  data_dir = tmp / 'tfds'

  def sweeptest_tiny():
    """Tiny byte-level LM used by the sweep tests."""
    return ExperimentConfig(
        model=ModelConfig(family='decoder', d_model=16, num_heads=2, d_ff=32, num_layers=1,
                          max_len=16, position='rope'),
        data=DataConfig(dataset='text', files=str(corpus), tokenizer='byte', seq_len=8,
                        data_dir=str(data_dir)),
        optim=OptimConfig(learning_rate=1e-3, warmup_steps=0, schedule='constant'),
        train=TrainConfig(steps=3, batch_size=4, eval_every=3, eval_batches=1, log_every=1,
                          checkpoint_every=3, sample_tokens=0, async_checkpoint=False))

  registry.load_builtin()  # before the patch: loaded inside it, the built-ins would vanish after
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('TFDS_DATA_DIR', str(data_dir))
    mp.setitem(registry._EXPERIMENTS, BASE, registry.Entry(
        BASE, sweeptest_tiny, 'Tiny byte-level LM used by the sweep tests.', ''))
    mp.setattr(registry, '_SWEEPS', dict(registry._SWEEPS))
    registry.sweep(SWEEP, base=BASE, axes=axis('model.ffn', ['relu', 'gelu']), seeds=1,
                   baseline={'model.ffn': 'relu'}, description='relu vs gelu (test)')
    registry.sweep(BAD_SWEEP, base=BASE, axes=axis('model.position', ['rope', 'bogus']))
    yield tmp


# ----------------------------------------------------------------------------- language

def names(sweep):
  return [v.name for v in sweep.variants]


def test_product_zip_and_their_composition():
  p = make_sweep('p', base=BASE, axes=product(axis('model.norm', ['layernorm', 'rmsnorm']),
                                              axis('model.ffn', ['relu', 'gelu', 'swiglu'])))
  assert names(p) == ['norm=layernorm,ffn=relu', 'norm=layernorm,ffn=gelu',
                      'norm=layernorm,ffn=swiglu', 'norm=rmsnorm,ffn=relu',
                      'norm=rmsnorm,ffn=gelu', 'norm=rmsnorm,ffn=swiglu']
  z = zip_(axis('model.norm_position', ['pre', 'post']), axis('optim.warmup_steps', [0, 500]))
  assert names(make_sweep('z', base=BASE, axes=z)) == [
      'norm_position=pre,warmup_steps=0', 'norm_position=post,warmup_steps=500']
  pz = make_sweep('pz', base=BASE, axes=product(z, axis('model.norm', ['layernorm', 'rmsnorm'])))
  assert len(pz.variants) == 4
  assert pz.variants[3].overrides == {'model.norm_position': 'post', 'optim.warmup_steps': 500,
                                      'model.norm': 'rmsnorm'}
  assert names(make_sweep('m', base=BASE, axes=z * axis('model.ffn', ['relu']))) == [
      'norm_position=pre,warmup_steps=0,ffn=relu', 'norm_position=post,warmup_steps=500,ffn=relu']
  # A list of axes is their product; no axes is the base alone.
  assert len(make_sweep('l', base=BASE, axes=[axis('model.ffn', ['relu', 'gelu']),
                                              axis('train.batch_size', [4, 8])]).variants) == 4
  assert names(make_sweep('b', base=BASE, seeds=2)) == ['base']


def test_language_errors_name_the_problem():
  with pytest.raises(ConfigError, match='different lengths'):
    zip_(axis('model.norm', ['layernorm', 'rmsnorm']), axis('model.ffn', ['relu']))
  with pytest.raises(ConfigError, match='model.ffn appears in two axes'):
    product(axis('model.ffn', ['relu']), axis('model.ffn', ['gelu']))
  with pytest.raises(ConfigError, match='baseline .* matches no variant'):
    make_sweep('x', base=BASE, axes=axis('model.ffn', ['relu']), baseline={'model.ffn': 'gelu'})
  with pytest.raises(ConfigError, match='seeds'):
    make_sweep('x', base=BASE, seeds=0)


def test_variant_names_are_stable_and_readable():
  def build():
    return make_sweep('s', base=BASE, axes=product(
        axis('optim.learning_rate', [1e-3, 3e-4]), axis('model.tie_embeddings', [True]),
        axis('optim.b2', [0.99]), axis('train.eval_batches', [None])))
  assert names(build()) == names(build()) == [
      'learning_rate=0.001,tie_embeddings=True,b2=0.99,eval_batches=None',
      'learning_rate=0.0003,tie_embeddings=True,b2=0.99,eval_batches=None']
  # Same last component under two sections: the shortest distinguishing suffix.
  assert short_keys(['model.moe.top_k', 'decode.top_k', 'model.d_model']) == {
      'model.moe.top_k': 'moe.top_k', 'decode.top_k': 'decode.top_k', 'model.d_model': 'd_model'}
  assert variant_name({'data.files': 'a/b c.txt', 'optim.b': (0.9, 0.98)}) == (
      'files=a_b_c.txt,b=0.9_0.98')
  moe = make_sweep('moe', base=BASE, axes=cases({'model.moe.num_experts': 0},
                                                {'model.moe.num_experts': 4, 'model.moe.top_k': 2}))
  assert names(moe) == ['num_experts=0', 'num_experts=4,top_k=2']


def test_only_patterns_match_anywhere_in_the_name():
  from tx.sweep.spec import matches
  name = 'norm_position=post,warmup_steps=0,norm=rmsnorm'
  assert matches(name, ['post*rms']) and matches(name, ['warmup_steps=0'])
  assert matches(name, ['xyz', 'post']) and matches(name, None)
  assert not matches(name, ['pre']) and not matches(name, ['rms*post'])


def test_seeds_dirs_and_base_seed(env, tmp_path):
  s = make_sweep('s', base=BASE, axes=axis('model.ffn', ['relu', 'gelu']), seeds=3,
                 overrides={'train.seed': 10})
  runs = plan(s, tmp_path, resolve=registry.get)
  assert [(r.variant, r.seed, r.config.train.seed) for r in runs] == [
      ('ffn=relu', 0, 10), ('ffn=relu', 1, 11), ('ffn=relu', 2, 12),
      ('ffn=gelu', 0, 10), ('ffn=gelu', 1, 11), ('ffn=gelu', 2, 12)]
  assert runs[4].dir == tmp_path / 'ffn=gelu' / 'seed_1'
  assert runs[4].config.model.ffn == 'gelu' and runs[4].config.name == BASE
  assert len(plan(s, tmp_path, resolve=registry.get, seeds=1)) == 2


def test_invalid_variant_fails_up_front_naming_the_key(env, tmp_path, capsys):
  bad = registry.get_sweep(BAD_SWEEP)
  with pytest.raises(ConfigError, match=r'variant position=bogus: model\.position: .bogus.'):
    plan(bad, tmp_path, resolve=registry.get)
  typo = make_sweep('t', base=BASE, axes=axis('model.positon', ['rope']))
  with pytest.raises(ConfigError, match=r'model\.positon: unknown key'):
    plan(typo, tmp_path, resolve=registry.get)
  workdir = tmp_path / 'bad'
  assert main(['sweep', BAD_SWEEP, '--workdir', str(workdir)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and 'model.position' in err
  assert not workdir.exists()  # nothing ran, nothing was written
  assert main(['sweep', 'no_such_sweep', '--workdir', str(workdir)]) == 2
  assert 'not registered' in capsys.readouterr().err
  assert main(['sweep', SWEEP, '--workdir', str(workdir), '--set', 'model.ffn=gelu']) == 2
  assert 'is an axis' in capsys.readouterr().err
  assert main(['sweep', SWEEP, '--workdir', str(workdir), '--only', 'swiglu']) == 2
  assert 'matches no variant' in capsys.readouterr().err


def test_list_marks_sweeps(env, capsys):
  assert main(['list']) == 0
  lines = capsys.readouterr().out.splitlines()
  line = next(l for l in lines if l.startswith(SWEEP))
  assert f'[sweep: {BASE}, 2 variants x 1 seeds] relu vs gelu (test)' in line
  assert any(l.startswith(BASE) and '[sweep' not in l for l in lines)


def test_dry_run_prints_plan_and_writes_nothing(env, tmp_path, capsys):
  workdir = tmp_path / 'w'
  assert main(['sweep', SWEEP, '--workdir', str(workdir), '--seeds', '2', '--dry-run']) == 0
  out = capsys.readouterr().out
  assert 'sweep sweeptest_ffn: base sweeptest_tiny, 2 variant(s) x 2 seed(s) = 4 run(s)' in out
  rows = [l.split() for l in out.splitlines() if l.startswith('ffn=')]
  assert [(r[0], r[1], r[3]) for r in rows] == [
      ('ffn=relu', '0', 'new'), ('ffn=relu', '1', 'new'),
      ('ffn=gelu', '0', 'new'), ('ffn=gelu', '1', 'new')]
  assert rows[3][2] == str(workdir / 'ffn=gelu' / 'seed_1')
  assert not workdir.exists()


def test_commands_reproduce_each_run_and_write_nothing(env, tmp_path, capsys):
  workdir = tmp_path / 'w'
  assert main(['sweep', SWEEP, '--workdir', str(workdir), '--seeds', '2', '--only', 'gelu',
               '--commands', '--set', 'train.steps=5', 'optim.b2=0.95']) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2 and not workdir.exists()
  planned = plan(registry.get_sweep(SWEEP), workdir, resolve=registry.get, seeds=2,
                 extra={'train.steps': 5, 'optim.b2': 0.95})
  for line, run in zip(lines, [r for r in planned if r.variant == 'ffn=gelu']):
    argv = shlex.split(line)
    assert argv[:5] == ['tx', 'train', BASE, '--workdir', str(run.dir)]
    assert argv[5] == '--set'
    cfg = registry.get(BASE, parse_overrides(argv[6:]))
    assert cfg == run.config  # the command line trains exactly the planned config
    assert (cfg.model.ffn, cfg.train.steps, cfg.optim.b2) == ('gelu', 5, 0.95)


# ----------------------------------------------------------------------------- running

@pytest.fixture(scope='module')
def swept(env, tmp_path_factory):
  """A sweep run in two invocations: first --only relu, then everything."""
  from tx.train import loop
  workdir = tmp_path_factory.mktemp('swept')
  calls = []
  real = loop.train

  def counting(cfg, rundir, **kw):
    calls.append(str(rundir))
    return real(cfg, rundir, **kw)

  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(loop, 'train', counting)
    assert main(['sweep', SWEEP, '--workdir', str(workdir), '--only', 'relu']) == 0
    first = list(calls)
    relu_mtime = (workdir / 'ffn=relu' / 'seed_0' / 'summary.json').stat().st_mtime_ns
    gelu_existed = (workdir / 'ffn=gelu').exists()
    assert main(['sweep', SWEEP, '--workdir', str(workdir)]) == 0
    second = calls[len(first):]
  return dict(workdir=workdir, first=first, second=second, relu_mtime=relu_mtime,
              gelu_existed=gelu_existed, counting=counting, calls=calls)


def test_only_runs_matching_variants(swept):
  workdir = swept['workdir']
  assert swept['first'] == [str(workdir / 'ffn=relu' / 'seed_0')]
  assert not swept['gelu_existed']
  record = json.loads((workdir / 'sweep.json').read_text())
  assert record['name'] == SWEEP and record['base'] == BASE
  assert record['baseline'] == 'ffn=relu' and record['seeds'] == [0]
  assert record['axes'] == {'axis': 'model.ffn', 'values': ['relu', 'gelu']}
  assert [(r['variant'], r['dir']) for r in record['runs']] == [
      ('ffn=relu', 'ffn=relu/seed_0'), ('ffn=gelu', 'ffn=gelu/seed_0')]
  assert record['runs'][1]['overrides'] == {'model.ffn': 'gelu', 'train.seed': 0}


def test_second_invocation_skips_finished_runs(swept):
  workdir = swept['workdir']
  assert swept['second'] == [str(workdir / 'ffn=gelu' / 'seed_0')]  # relu not retrained
  summary = workdir / 'ffn=relu' / 'seed_0' / 'summary.json'
  assert summary.stat().st_mtime_ns == swept['relu_mtime']
  for variant, ffn in (('ffn=relu', 'relu'), ('ffn=gelu', 'gelu')):
    config = json.loads((workdir / variant / 'seed_0' / 'config.json').read_text())
    assert config['model']['ffn'] == ffn and config['name'] == BASE
    assert json.loads((workdir / variant / 'seed_0' / 'summary.json').read_text())['steps'] == 3


def test_partial_run_resumes(swept, capsys, monkeypatch):
  from tx.train import loop
  workdir = swept['workdir']
  rundir = workdir / 'ffn=gelu' / 'seed_0'
  rows_before = (rundir / 'metrics.jsonl').read_text().count('"loss"')
  (rundir / 'summary.json').unlink()  # as if killed after its last checkpoint
  assert main(['sweep', SWEEP, '--workdir', str(workdir), '--dry-run']) == 0
  out = capsys.readouterr().out
  assert 'partial' in next(l for l in out.splitlines() if l.startswith('ffn=gelu'))
  # A partial run with another config must not be resumed.
  assert main(['sweep', SWEEP, '--workdir', str(workdir), '--set', 'train.steps=4']) == 2
  assert 'train.steps: 3 -> 4' in capsys.readouterr().err
  monkeypatch.setattr(loop, 'train', swept['counting'])
  n = len(swept['calls'])
  assert main(['sweep', SWEEP, '--workdir', str(workdir)]) == 0
  assert swept['calls'][n:] == [str(rundir)]
  err = capsys.readouterr().err
  assert 'resuming from checkpoint at step 3' in err
  assert json.loads((rundir / 'summary.json').read_text())['steps'] == 3
  assert (rundir / 'metrics.jsonl').read_text().count('"loss"') == rows_before  # no retraining
  assert main(['sweep', SWEEP, '--workdir', str(workdir)]) == 0
  assert len(swept['calls']) == n + 1  # everything done: nothing trains


def test_compare_reads_a_real_sweep(swept, capsys):
  workdir = swept['workdir']
  assert main(['compare', str(workdir)]) == 0
  out = capsys.readouterr().out
  assert '| `ffn=relu` | 1 |' in out and 'n/a (1 seed)' in out
  assert (workdir / 'compare.md').exists() and (workdir / 'compare.csv').exists()
  assert (workdir / 'eval_loss_vs_step.png').read_bytes()[:4] == b'\x89PNG'


def test_diverged_run_is_a_data_point_and_the_sweep_goes_on(env, tmp_path, monkeypatch, capsys):
  from tx.train import loop

  def fake_train(cfg, rundir, **kw):
    rundir.mkdir(parents=True)
    diverged = cfg.model.ffn == 'relu'
    summary = {'experiment': BASE, 'params': 1, 'steps': 2 if diverged else 3,
               'wall_time_s': 1.0, 'status': 'diverged' if diverged else 'done',
               'diverged_at': 2 if diverged else None, 'init_loss': 3.6,
               'eval': {} if diverged else {'loss': 1.0}}
    (rundir / 'summary.json').write_text(json.dumps(summary))  # as the loop writes it
    if diverged:
      raise loop.NonFiniteError('step 2: non-finite loss (nan)')
    return type('Result', (), {'summary': summary})

  monkeypatch.setattr(loop, 'train', fake_train)
  workdir = tmp_path / 'w'
  assert main(['sweep', SWEEP, '--workdir', str(workdir)]) == 0
  assert '1 trained, 1 diverged, 0 already done' in capsys.readouterr().out
  runs = json.loads((workdir / 'sweep.json').read_text())['runs']
  assert runs[0]['status'] == 'diverged at step 2' and 'status' not in runs[1]
  assert main(['sweep', SWEEP, '--workdir', str(workdir)]) == 0  # counted as done
  assert '0 trained, 0 diverged, 2 already done' in capsys.readouterr().out
  assert main(['compare', str(workdir)]) == 0


def test_registered_sweeps_validate(env, tmp_path):
  """Every sweep registered (built-in ones included) plans without a config error."""
  for name in registry.sweep_names():
    if name != BAD_SWEEP:
      assert plan(registry.get_sweep(name), tmp_path, resolve=registry.get)
