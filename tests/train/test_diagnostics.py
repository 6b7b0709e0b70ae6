"""Stability diagnostics: each logged value equals a direct computation on a tiny model;
parameter groups cover every parameter of every family; a diverged run is a data point."""

import json
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tx
from tx.config.train import TaskConfig
from tx.models.build import build_model
from tx.tasks import TASKS
from tx.train import param_groups
from tx.train.errors import NonFiniteError
from tx.train.loop import train
from tx.train.state import TrainState
from tx.train.step import make_train_step

LR = 0.1


def tiny(family='decoder', **kw):
  base = dict(family=family, vocab_size=32, d_model=16, num_heads=2, d_ff=32, num_layers=2,
              max_len=16, position='learned')
  base.update(kw)
  return tx.ModelConfig(**base)


def batch_for(cfg):
  rng = np.random.default_rng(0)
  tokens = rng.integers(5, 32, (2, 8)).astype(np.int32)
  tokens[1, 6:] = 0
  weights = (tokens != 0).astype(np.float32)
  if cfg.family == 'encoder_decoder':
    return {'src': jnp.asarray(tokens), 'tgt_inputs': jnp.asarray(tokens),
            'targets': jnp.asarray(tokens), 'weights': jnp.asarray(weights)}
  return {'inputs': jnp.asarray(tokens), 'targets': jnp.asarray(np.roll(tokens, -1, 1)),
          'weights': jnp.asarray(weights)}


def step_and_state(cfg, accum_steps=1):
  name = {'decoder': 'causal_lm', 'encoder': 'mlm', 'encoder_decoder': 'seq2seq'}[cfg.family]
  task = TASKS[name](cfg, TaskConfig())
  model = build_model(cfg)
  params = nn.unbox(tx.init_params(cfg, jax.random.key(0), batch=2, length=8))
  opt = optax.sgd(LR)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt.init(params),
                     rng=jax.random.key_data(jax.random.key(1)), skips=jnp.zeros((), jnp.int32))
  step = jax.jit(make_train_step(model, task, opt, accum_steps=accum_steps, dropout=False,
                                 diagnostics=True))
  return step, state, model, task


@pytest.mark.parametrize('family', ['decoder', 'encoder_decoder'])
def test_every_diagnostic_equals_a_direct_computation(family):
  cfg = tiny(family)
  step, state, model, task = step_and_state(cfg)
  batch = batch_for(cfg)
  _, metrics = step(state, batch)
  diag = {k: float(v) for k, v in metrics['diag'].items()}

  # Output logits, directly.
  logits, _ = task.logits(model, state.params, batch)
  w = np.asarray(batch['weights'])
  lg = np.asarray(logits, np.float64)
  lse = np.log(np.exp(lg - lg.max(-1, keepdims=True)).sum(-1)) + lg.max(-1)
  real = w > 0
  assert diag['logits_max'] == pytest.approx(lg.max(-1)[real].max(), rel=1e-5)
  assert diag['log_z_mean'] == pytest.approx((lse * w).sum() / w.sum(), rel=1e-5)
  assert diag['logits_rms'] == pytest.approx(
      math.sqrt(((lg ** 2).mean(-1) * w).sum() / w.sum()), rel=1e-5)

  # Attention logits: q and k captured from the projections (learned positions: no RoPE).
  args, kwargs = task.model_args(batch)
  _, inter = model.apply({'params': state.params}, *args, capture_intermediates=True,
                         mutable=['intermediates'], **kwargs)
  flat = {'/'.join(str(getattr(k, 'key', k)) for k in p): x
          for p, x in jax.tree_util.tree_flatten_with_path(inter['intermediates'])[0]}
  per_layer = {}
  for path, q in flat.items():
    if not path.endswith('/query/__call__/[0]'):
      continue
    k = flat[path.replace('/query/', '/key/')]
    score = np.einsum('blhd,bshd->bhls', np.asarray(q), np.asarray(k)).max() / math.sqrt(8)
    stack, layer = path.split('/')[0], path.split('/')[2]
    name = layer if family == 'decoder' else f'{stack}_{layer}'
    per_layer[name] = max(per_layer.get(name, -np.inf), score)
  assert len(per_layer) == (2 if family == 'decoder' else 4)
  for name, value in per_layer.items():
    assert diag[f'attn_logit_max/{name}'] == pytest.approx(value, rel=1e-5), name
  assert diag['attn_logit_max'] == pytest.approx(max(per_layer.values()), rel=1e-5)

  # Per-group gradient norms and, under SGD, update/param RMS = lr * |g| / |p|.
  def loss(p):
    return task.loss(model, p, batch, deterministic=True)[0]
  grads = jax.grad(loss)(state.params)
  g2 = param_groups.sums_of_squares(grads)
  p2 = param_groups.sums_of_squares(state.params)
  assert set(g2) >= {'embeddings', 'attention', 'ffn', 'norms'}
  for group in g2:
    assert diag[f'grad_norm/{group}'] == pytest.approx(math.sqrt(float(g2[group])), rel=1e-4)
    assert diag[f'update_rms_ratio/{group}'] == pytest.approx(
        LR * math.sqrt(float(g2[group]) / float(p2[group])), rel=1e-4)


def test_micro_batches_give_the_same_diagnostics():
  cfg = tiny('decoder', scan_layers=True)
  one, state, _, _ = step_and_state(cfg, accum_steps=1)
  two, _, _, _ = step_and_state(cfg, accum_steps=2)
  batch = batch_for(cfg)
  d1, d2 = one(state, batch)[1]['diag'], two(state, batch)[1]['diag']
  assert set(d1) == set(d2) and 'attn_logit_max/layer_1' in d1  # scanned: per layer too
  for k in d1:
    assert float(d2[k]) == pytest.approx(float(d1[k]), rel=1e-4, abs=1e-6), k


def test_diagnostics_off_sows_nothing_and_evaluation_computes_none():
  cfg = tiny('decoder')
  model = build_model(cfg)
  params = tx.init_params(cfg, jax.random.key(0), batch=2, length=8)
  tokens = batch_for(cfg)['inputs']
  _, state = model.apply({'params': params}, tokens, mutable=['losses', 'metrics'])
  assert 'diagnostics' not in state
  _, state = model.apply({'params': params}, tokens, mutable=['diagnostics'])
  assert len(jax.tree_util.tree_leaves(state['diagnostics'])) == 2  # one max per layer


@pytest.mark.parametrize('family,kw', [
    ('decoder', {}), ('decoder', dict(position='t5', tie_embeddings=False)),
    ('decoder', dict(moe=tx.MoEConfig(num_experts=2, top_k=1))),
    ('decoder', dict(scan_layers=True)),
    ('encoder', dict(type_vocab_size=2, embed_norm=True)), ('encoder', dict(num_classes=3)),
    ('encoder_decoder', dict(position='t5')), ('encoder_decoder', {})])
def test_every_parameter_has_a_group(family, kw):
  params = tx.init_params(tiny(family, **kw), jax.random.key(0))
  groups = {param_groups.group_of(param_groups.path_names(p))
            for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]}
  assert groups <= set(param_groups.GROUPS) and {'attention', 'ffn', 'norms'} <= groups


def test_an_unknown_parameter_is_an_error_naming_it():
  with pytest.raises(ValueError, match='decoder/stack/layer_0/gizmo/kernel'):
    param_groups.group_of(('decoder', 'stack', 'layer_0', 'gizmo', 'kernel'))


def test_a_diverged_run_records_where_and_ends_as_a_data_point(tt, tmp_path):
  cfg = tt.config('decoder', optim=dict(learning_rate=1e30),
                  train=dict(steps=6, log_every=1, checkpoint_every=1, eval_every=6))
  with pytest.raises(NonFiniteError):
    train(cfg, tmp_path, quiet=True)
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['status'] == 'diverged' and summary['diverged_at'] == 2
  vocab = json.loads((tmp_path / 'config.json').read_text())['model']['vocab_size']
  assert summary['init_loss'] == pytest.approx(math.log(vocab), abs=0.5)  # ~uniform at init
  assert summary['eval'] == {}


def test_a_healthy_run_has_no_divergence(decoder_run):
  workdir, run = decoder_run
  s = json.loads((workdir / 'summary.json').read_text())
  assert s['status'] == 'done' and s['diverged_at'] is None and s['init_loss'] > s['eval']['loss']
  rows = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  train_rows = [r for r in rows if 'loss' in r]
  assert all('diag/attn_logit_max' in r and 'diag/log_z_mean' in r for r in train_rows)


def test_loop_train_says_it_skips_extrapolation_without_the_hook(tt, tmp_path, capsys):
  cfg = tt.config('decoder', train=dict(extrapolation=(1, 2)))
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a directory')
  with pytest.raises(tx.ConfigError):  # the workdir check stops it before any work
    train(cfg, blocker, quiet=True)
  assert 'tx.runs.train_run' in capsys.readouterr().err
