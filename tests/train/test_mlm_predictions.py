"""data.mlm_max_predictions: the masking keeps at most P selected positions a row, and the
MLM head then runs only at P positions a row with the same loss and gradients."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.config import DataConfig
from tx.config.base import ConfigError
from tx.config.experiment import ExperimentConfig
from tx.config.train import TaskConfig
from tx.data.mlm import Masking, mask_tokens
from tx.data.tokenizers.specials import NUM_SPECIALS
from tx.models.build import build_model
from tx.tasks import make_task
from tx.tasks.objectives import MLMTask
from tx.train.flops import flops_per_step, mlm_head_positions

V = 64


def test_the_cap_keeps_a_random_subset_of_each_rows_selection():
  rng = np.random.default_rng(0)
  tokens = rng.integers(NUM_SPECIALS, V, (64, 128)).astype(np.int32)
  keys = np.arange(64) * 3 + 1
  free = mask_tokens(tokens, keys, Masking(V, seed=2, probability=0.3))
  capped = mask_tokens(tokens, keys, Masking(V, seed=2, probability=0.3, max_predictions=30))
  n_free, n_capped = free['weights'].sum(1), capped['weights'].sum(1)
  assert n_free.max() > 30 and n_free.min() < 30  # the cap binds on some rows, not on all
  np.testing.assert_array_equal(n_capped, np.minimum(n_free, 30))
  assert not (capped['weights'] > free['weights']).any()  # a subset of the draws
  kept = n_free <= 30  # rows under the cap keep their masking exactly
  for key in ('inputs', 'weights'):
    np.testing.assert_array_equal(capped[key][kept], free[key][kept])
  dropped = (free['weights'] > 0) & (capped['weights'] == 0)
  np.testing.assert_array_equal(capped['inputs'][dropped], tokens[dropped])  # left unmasked
  # not the first positions of a row: the lowest draws, spread over the row
  assert np.flatnonzero(capped['weights'][~kept].sum(0)).max() > 100


def test_the_cap_is_checked_against_the_row_length():
  with pytest.raises(ConfigError, match='mlm_max_predictions'):
    DataConfig(seq_len=16, mlm_max_predictions=17).validate()
  with pytest.raises(ConfigError, match='mlm_max_predictions'):
    DataConfig(mlm_max_predictions=-1).validate()


@pytest.fixture(scope='module')
def encoder():
  cfg = tx.ModelConfig(family='encoder', vocab_size=V, d_model=16, num_heads=2, d_ff=32,
                       num_layers=2, max_len=16, position='learned')
  params = nn.unbox(tx.init_params(cfg, jax.random.key(0), batch=3, length=16))
  rng = np.random.default_rng(1)
  tokens = rng.integers(NUM_SPECIALS, V, (3, 16)).astype(np.int32)
  weights = np.zeros((3, 16), np.float32)
  weights[0, [1, 5, 9]] = weights[1, [0, 15]] = weights[2, 7] = 1  # at most 3 a row
  batch = {'inputs': jnp.asarray(tokens), 'targets': jnp.asarray(np.roll(tokens, 1, 1)),
           'weights': jnp.asarray(weights)}
  return cfg, params, batch


@pytest.mark.parametrize('cap', [3, 5])
def test_the_head_at_the_selected_positions_gives_the_same_loss_and_gradients(encoder, cap):
  cfg, params, batch = encoder
  model = build_model(cfg)

  def loss(task):
    return jax.jit(jax.value_and_grad(lambda p: task.loss(model, p, batch)[0]))(params)

  full_loss, full_grads = loss(MLMTask(cfg, TaskConfig()))
  task = MLMTask(cfg, TaskConfig(), max_predictions=cap)
  gathered_loss, gathered_grads = loss(task)
  np.testing.assert_allclose(gathered_loss, full_loss, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(gathered_grads), jax.tree.leaves(full_grads)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
  logits, _ = task.logits(model, params, batch)
  assert logits.shape == (3, cap, V)  # only P positions a row reach the head
  labels, weights = task.targets(batch)
  assert float(weights.sum()) == 6.0 and labels.shape == (3, cap)


def test_an_experiment_wires_the_cap_into_its_task_and_flops(encoder):
  cfg = encoder[0]
  exp = ExperimentConfig(name='t', model=cfg, data=DataConfig(seq_len=16, mlm_max_predictions=4))
  assert make_task(exp).max_predictions == 4 and mlm_head_positions(exp) == 4
  assert mlm_head_positions(exp.replace(data=DataConfig(seq_len=16))) is None
  params = tx.init_params(cfg, jax.random.key(0), batch=1, length=16)
  full = flops_per_step(cfg, params, batch=2, length=16)
  fewer = flops_per_step(cfg, params, batch=2, length=16, head_positions=4)
  assert 0 < fewer < full
