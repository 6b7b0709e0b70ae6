"""NaN / Inf: train.nan_policy=stop exits naming the step and the quantity and keeps the last
good checkpoint; nan_policy=skip drops the update (params and optimizer state unchanged),
counts it, and stops once more than train.max_skips updates were skipped.

A learning rate of 1e30 makes step 1's update blow the parameters up, so every step from 2
on has a non-finite gradient norm.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.cli import main
from tx.models.build import build_model
from tx.tasks import make_task
from tx.train.errors import NonFiniteError
from tx.train.loop import make_pipelines, train
from tx.train.optimizer import make_optimizer
from tx.runs.restore import load_run
from tx.train.state import TrainState
from tx.train.step import make_train_step

EXPLODE = dict(learning_rate=1e30)


def test_stop_names_step_and_quantity_and_keeps_the_last_good_checkpoint(tt, tmp_path, capsys):
  cfg = tt.config('decoder', name='demo', optim=EXPLODE,
                  train=dict(steps=6, log_every=1, checkpoint_every=1, eval_every=6))
  workdir = tmp_path / 'run'
  code = main(['train', 'demo', '--workdir', str(workdir), '--quiet', '--set',
               *tt.demo_overrides(cfg)])
  err = capsys.readouterr().err
  last = err.strip().splitlines()[-1]
  assert code == 1, err[-3000:]
  assert 'Traceback' not in err
  assert last.startswith('tx train: error: step 2: non-finite gradient norm nan'), last
  assert 'last good checkpoint is kept' in last and 'train.nan_policy=skip' in last
  assert sorted(p.name for p in (workdir / 'checkpoints').iterdir()) == ['1']
  assert [json.loads(l)['step']
          for l in (workdir / 'metrics.jsonl').read_text().splitlines()] == [1, 2]
  _, state, _, step = load_run(workdir)
  assert step == 1
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(state.params))


def test_skip_keeps_params_counts_skips_and_stops_past_max_skips(tt, tmp_path):
  cfg = tt.config('decoder', optim=EXPLODE,
                  train=dict(steps=8, log_every=1, checkpoint_every=1, eval_every=8,
                             keep_checkpoints=8, nan_policy='skip', max_skips=3))
  with pytest.raises(NonFiniteError, match=r'step 5: 4 updates skipped .* train\.max_skips=3'):
    train(cfg, tmp_path, quiet=True)
  rows = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [(r['step'], r['skipped']) for r in rows] == [(1, 0), (2, 1), (3, 1), (4, 1), (5, 1)]
  assert sorted(int(p.name) for p in (tmp_path / 'checkpoints').iterdir()) == [1, 2, 3, 4]
  _, at_1, _, _ = load_run(tmp_path, step=1)
  _, at_4, _, _ = load_run(tmp_path, step=4)
  assert int(at_4.skips) == 3 and int(at_1.skips) == 0 and int(at_4.step) == 4
  for a, b in zip(jax.tree_util.tree_leaves((at_1.params, at_1.opt_state)),
                  jax.tree_util.tree_leaves((at_4.params, at_4.opt_state))):
    assert np.array_equal(np.asarray(a), np.asarray(b))


def test_a_skipped_bad_batch_leaves_training_on_course(decoder_run):
  """A transient fault (a NaN in one batch) is skipped; the next good batch updates."""
  _, run = decoder_run
  cfg, params = run.config, run.state.params
  batch = {k: jnp.asarray(v)
           for k, v in next(make_pipelines(cfg, 'causal_lm')[0].iterator()).items()}
  bad = dict(batch, weights=batch['weights'].astype(jnp.float32).at[0, 0].set(jnp.nan))
  optimizer, _ = make_optimizer(cfg.optim, total_steps=10, d_model=cfg.model.d_model)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(params),
                     rng=jax.random.key_data(jax.random.key(1)), skips=jnp.zeros((), jnp.int32))
  step = jax.jit(make_train_step(build_model(cfg.model), make_task(cfg), optimizer,
                                 skip_nonfinite=True, dropout=False))
  after_bad, m_bad = step(state, bad)
  assert float(m_bad['finite']) == 0 and float(m_bad['skipped']) == 1
  assert int(after_bad.skips) == 1 and int(after_bad.step) == 1
  for a, b in zip(jax.tree_util.tree_leaves((state.params, state.opt_state)),
                  jax.tree_util.tree_leaves((after_bad.params, after_bad.opt_state))):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  after_good, m_good = step(after_bad, batch)
  assert float(m_good['finite']) == 1 and float(m_good['skipped']) == 0
  assert int(after_good.skips) == 1
  changed = [not np.array_equal(a, b) for a, b in zip(
      jax.tree_util.tree_leaves(after_bad.params), jax.tree_util.tree_leaves(after_good.params))]
  assert all(changed)
