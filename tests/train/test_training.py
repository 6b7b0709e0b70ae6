"""Training of the three families end to end, the run directory, and the step's arithmetic.

One session-scoped run per family (conftest's family_runs) (30 steps, tiny model, char tokenizer on
a tiny corpus); the other tests reuse those runs or call the step / evaluation functions directly.
"""

import itertools
import json
import math
import struct

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.config.optim import OptimConfig
from tx.config.train import TaskConfig
from tx.data.tokenizers.specials import EOS_ID, NUM_SPECIALS, PAD_ID, UNK_ID
from tx.models.build import build_model, count_params
from tx.tasks import make_task, summarize
from tx.train import run_dir
from tx.train.evaluate import evaluate
from tx.train.loop import make_pipelines, train
from tx.train.mesh import make_mesh
from tx.train.optimizer import make_optimizer
from tx.runs.restore import load_run
from tx.train.state import TrainState
from tx.train.step import make_eval_step, make_train_step

FAMILIES = ('decoder', 'encoder', 'encoder_decoder')
ROW_KEYS = ('step', 'loss', 'learning_rate', 'grad_norm', 'tokens_per_s', 'step_time_s', 'mfu')


@pytest.fixture(scope='module')
def runs(family_runs):
  return family_runs


def _rows(workdir):
  lines = (workdir / run_dir.METRICS).read_text().splitlines()
  rows = [json.loads(line) for line in lines]
  return [r for r in rows if 'loss' in r], [r for r in rows if 'eval/loss' in r]


@pytest.mark.parametrize('family', FAMILIES)
def test_training_lowers_the_loss(runs, family):
  workdir, result = runs[family]
  train_rows, eval_rows = _rows(workdir)
  assert [r['step'] for r in train_rows] == [5, 10, 15, 20, 25, 30]
  first, last = train_rows[0]['loss'], train_rows[-1]['loss']
  assert last < first - 0.2, (family, first, last)
  assert math.isfinite(result.summary['eval']['loss'])
  assert [r['step'] for r in eval_rows] == [30]
  assert eval_rows[0]['eval/loss'] == pytest.approx(result.summary['eval']['loss'])


@pytest.mark.parametrize('family', FAMILIES)
def test_run_directory(runs, family):
  workdir, result = runs[family]
  # config.json: the resolved config (vocabulary from the tokenizer), loadable.
  cfg = run_dir.load_run_config(workdir)
  assert cfg == result.config
  assert cfg.model.vocab_size == result.tokenizer.vocab_size
  if family != 'encoder_decoder':
    assert cfg.model.vocab_size == NUM_SPECIALS + 33  # the corpus' characters
  # metrics.jsonl: one row per log step with the throughput fields.
  train_rows, _ = _rows(workdir)
  for row in train_rows:
    for key in ROW_KEYS:
      assert key in row and math.isfinite(row[key]), (key, row)
    assert row['learning_rate'] == pytest.approx(3e-3)
    assert row['tokens_per_s'] > 0 and row['step_time_s'] > 0 and 0 < row['mfu'] < 1
  # TensorBoard mirrors the same scalars.
  events = list((workdir / 'tensorboard').glob('events.out.tfevents*'))
  assert events
  scalars = _tensorboard_scalars(events)
  assert [s for s, _ in scalars['loss']] == [r['step'] for r in train_rows]
  np.testing.assert_allclose([v for _, v in scalars['loss']], [r['loss'] for r in train_rows],
                             rtol=1e-6)
  assert 'eval/loss' in scalars
  # checkpoints: the latest N complete steps; the last one restores the final state exactly.
  steps = sorted(int(p.name) for p in (workdir / 'checkpoints').iterdir() if p.name.isdigit())
  assert steps == [20, 30]
  _, state, _, step = load_run(workdir)
  assert step == 30
  for a, b in zip(jax.tree_util.tree_leaves(state.params),
                  jax.tree_util.tree_leaves(result.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  # summary.json
  summary = json.loads((workdir / run_dir.SUMMARY).read_text())
  assert summary['experiment'] == f'tiny_{family}'
  assert summary['params'] == count_params(result.state.params) > 0
  assert summary['steps'] == 30
  for key in ('wall_time_s', 'compile_time_s', 'tokens_per_s'):
    assert summary[key] > 0, key
  assert summary['compile_time_s'] < summary['wall_time_s']
  assert math.isfinite(summary['eval']['loss'])
  assert summary['best_eval']['step'] == 30
  assert summary['best_eval']['loss'] == summary['eval']['loss']


def _tensorboard_scalars(paths) -> dict:
  """{tag: [(step, value)]} from TFRecord event files (tensorboardX's own protos)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  out = {}
  for path in paths:
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack('<Q', data[pos:pos + 8])
      record = data[pos + 12:pos + 12 + length]
      pos += 12 + length + 4
      event = event_pb2.Event.FromString(record)
      for value in event.summary.value:
        out.setdefault(value.tag, []).append((event.step, value.simple_value))
  return {k: sorted(v) for k, v in out.items()}


# --- gradient accumulation ------------------------------------------------------------------


def test_grad_accumulation_matches_one_shot(decoder_run):
  _, run = decoder_run
  cfg, params = run.config, run.state.params  # any parameters will do: the trained ones
  pipe, _ = make_pipelines(cfg, 'causal_lm')
  batch = dict(next(pipe.iterator()))
  # Uneven real-token counts across the two micro-batches (rows 0-3 vs 4-7), so a mean of
  # per-micro-batch means would differ from the one-shot loss.
  weights = np.array(batch['weights'], np.float32)
  for i in range(4, 8):
    weights[i, 2 * (i - 3):] = 0
  batch = {k: jnp.asarray(v) for k, v in dict(batch, weights=weights).items()}
  model = build_model(cfg.model)
  task = make_task(cfg)
  # Plain SGD: the update is lr * gradient, so equal params mean equal gradients (Adam's
  # first step is ~lr * sign(g) and would hide a wrongly scaled gradient).
  optim = OptimConfig(name='sgd', learning_rate=0.5, b1=0.0, schedule='constant',
                      clip_norm=None)
  optimizer, _ = make_optimizer(optim, total_steps=1, d_model=cfg.model.d_model)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(params),
                     rng=jax.random.key_data(jax.random.key(1)), skips=jnp.zeros((), jnp.int32))
  out = {}
  for accum in (1, 2):
    step = jax.jit(make_train_step(model, task, optimizer, accum_steps=accum, dropout=False))
    out[accum] = step(state, batch)
  (new1, m1), (new2, m2) = out[1], out[2]
  assert float(m2['weight_sum']) == float(m1['weight_sum']) == float(weights.sum())
  assert float(m2['loss_sum'] / m2['weight_sum']) == pytest.approx(
      float(m1['loss_sum'] / m1['weight_sum']), rel=1e-6)
  assert float(m2['grad_norm']) == pytest.approx(float(m1['grad_norm']), rel=1e-5)
  for a, b in zip(jax.tree_util.tree_leaves(new2.params), jax.tree_util.tree_leaves(new1.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
  assert int(new2.step) == int(new1.step) == 1
  # ... and the step did something to every parameter.
  for a, b in zip(jax.tree_util.tree_leaves(new1.params), jax.tree_util.tree_leaves(params)):
    assert not np.allclose(a, b)


# --- label smoothing --------------------------------------------------------------------------


def test_label_smoothing_changes_training_loss_but_eval_reports_nll(runs):
  workdir, result = runs['encoder_decoder']
  cfg = result.config
  assert cfg.task.label_smoothing == 0.1
  train_rows, eval_rows = _rows(workdir)
  for row in train_rows:  # the optimised (smoothed) loss is logged, and differs from nll
    assert abs(row['loss'] - row['nll']) > 1e-3, row
  assert eval_rows[0]['eval/loss'] == eval_rows[0]['eval/nll']
  # Evaluating the final params without smoothing gives the loss the run reported.
  _, valid = make_pipelines(cfg, 'seq2seq')
  mesh = make_mesh(cfg.mesh)
  model = build_model(cfg.model)
  plain = cfg.replace(task=TaskConfig(label_smoothing=0.0))
  with jax.set_mesh(mesh):
    eval_step = jax.jit(make_eval_step(model, make_task(plain)))
    unsmoothed = evaluate(eval_step, result.state.params, valid, mesh,
                          max_batches=cfg.train.eval_batches)
  assert unsmoothed['loss'] == pytest.approx(result.summary['eval']['loss'], rel=1e-6)
  # On one batch, the smoothed task's loss_sum differs while its nll_sum is the plain loss.
  batch = next(valid.iterator())

  @jax.jit
  def both(params, batch):
    smoothed, unsmoothed = make_task(cfg), make_task(plain)
    logits, aux = smoothed.logits(model, params, batch)
    return smoothed.metric_sums(logits, batch, aux), unsmoothed.metric_sums(logits, batch, aux)

  s, p = both(result.state.params, batch)
  assert float(s['nll_sum']) == pytest.approx(float(p['loss_sum']), rel=1e-6)
  assert float(p['nll_sum']) == float(p['loss_sum'])
  assert abs(float(s['loss_sum']) - float(p['loss_sum'])) > 1e-2


# --- bits per byte ----------------------------------------------------------------------------


def test_bits_per_byte_of_the_run_is_hand_checked(runs):
  workdir, result = runs['decoder']
  cfg, tok = result.config, result.tokenizer
  ev = result.summary['eval']
  assert 'bits_per_byte' in ev
  _, valid = make_pipelines(cfg, 'causal_lm')
  tokens = nbytes = 0
  for batch in itertools.islice(valid.iterator(), cfg.train.eval_batches):
    targets, weights = batch['targets'], batch['weights']
    assert not (targets[weights > 0] == UNK_ID).any()
    for t, w in zip(targets.ravel().tolist(), weights.ravel().tolist()):
      if w:
        tokens += w
        nbytes += w * len(tok.decode([t]).encode('utf-8'))  # EOS decodes to '' (0 bytes)
  assert tokens == ev['tokens']
  assert nbytes != tokens  # the corpus has multi-byte characters: the check is not trivial
  assert ev['bits_per_byte'] == pytest.approx(ev['nll'] * tokens / (math.log(2) * nbytes),
                                              rel=1e-6)


def test_bits_per_byte_on_a_handmade_batch(tt):
  """'café 東京' is 7 chars but 12 UTF-8 bytes; EOS counts 0 bytes, padding nothing."""
  cfg = tt.config('decoder')
  for tokenizer, expected_tokens in (('char', 7), ('byte', 12)):
    c = cfg.replace(data=cfg.data.replace(tokenizer=tokenizer))
    _, valid = make_pipelines(c, 'causal_lm')
    ids = valid.tokenizer.encode('café 東京')
    assert len(ids) == expected_tokens
    targets = np.array([ids + [EOS_ID, PAD_ID]], np.int32)
    weights = np.array([[1.0] * (len(ids) + 1) + [0.0]], np.float32)
    batch = {'inputs': targets, 'targets': targets, 'weights': weights}
    assert valid.batch_bytes(batch) == 12
    nll = 1.7  # nats per token, say
    sums = {'loss_sum': nll * weights.sum(), 'nll_sum': nll * weights.sum(),
            'weight_sum': weights.sum(), 'correct_sum': 0.0, 'bytes': 12.0}
    bpb = summarize(sums)['bits_per_byte']
    assert bpb == pytest.approx(nll / math.log(2) * (len(ids) + 1) / 12)


def test_evaluate_reports_bits_per_byte_for_byte_tokens(tt):
  """With a constant nll c per token, evaluate() gives c / ln2 / (bytes per token)."""
  cfg = tt.config('decoder', data=dict(tokenizer='byte'))
  _, valid = make_pipelines(cfg, 'causal_lm')
  mesh = make_mesh(cfg.mesh)
  c = 2.5

  def eval_step(params, batch):
    del params
    w = batch['weights'].sum()
    return {'loss_sum': c * w, 'nll_sum': c * w, 'weight_sum': w, 'correct_sum': 0.0 * w}

  with jax.set_mesh(mesh):
    out = evaluate(eval_step, None, valid, mesh, max_batches=3)
  tokens = nbytes = 0.0
  for batch in itertools.islice(valid.iterator(), 3):
    real = batch['weights'] * (batch['targets'] >= NUM_SPECIALS)
    tokens += batch['weights'].sum()
    nbytes += real.sum()  # byte tokens: one byte each, EOS none
  assert out['tokens'] == tokens
  assert out['loss'] == out['nll'] == pytest.approx(c)
  assert out['bits_per_byte'] == pytest.approx(c / math.log(2) * tokens / nbytes, rel=1e-6)
