"""A task = the batch it expects + how to feed it to a network + loss and metrics.

Tasks hold no network code (T5X's model/module split): the same network serves several
objectives and one decoder serves both generating families. Losses are normalised by
the number of real (non-pad) target tokens.

Metrics travel as *sums* (`loss_sum`, `nll_sum`, `weight_sum`, `correct_sum`, ...) so
they add up exactly across micro-batches, devices, hosts and evaluation batches;
`summarize` turns sums into means (loss, perplexity, accuracy, bits per byte).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from tx import ops
from tx.config.model import ModelConfig
from tx.config.train import TaskConfig
from tx.tasks.diagnostics import attention_logit_maxima, output_logit_stats

AUX_COLLECTIONS = ('losses', 'metrics')
# Sown by attention layers only when mutable (training with train.diagnostics on): each
# layer's maximum pre-softmax score, so evaluation and decoding compute none of it.
DIAGNOSTICS = 'diagnostics'


def sum_leaves(tree) -> jax.Array:
  """Sum of every leaf of a (possibly empty) pytree, as a float32 scalar."""
  leaves = jax.tree_util.tree_leaves(tree)
  return sum((jnp.sum(x).astype(jnp.float32) for x in leaves), jnp.zeros((), jnp.float32))


class Task:
  """Base class: subclasses define `name`, `model_args(batch)` and `targets(batch)`."""
  name = 'task'

  def __init__(self, model_cfg: ModelConfig, task_cfg: TaskConfig):
    self.model_cfg = model_cfg
    self.cfg = task_cfg

  def model_args(self, batch) -> tuple[tuple, dict]:
    """Positional and keyword arguments of `model.apply` for this batch."""
    raise NotImplementedError

  def targets(self, batch):
    """(labels [B, L] int, weights [B, L] float) the loss is computed on."""
    return batch['targets'], batch['weights']

  def logits(self, model, params, batch, *, deterministic=True, rngs=None):
    """Runs the network. Returns (logits [B, L, V] float32, auxiliary loss scalar)."""
    logits, state = self._apply(model, params, batch, deterministic, rngs, AUX_COLLECTIONS)
    return logits, sum_leaves(state.get('losses', {}))

  def _apply(self, model, params, batch, deterministic, rngs, collections):
    args, kwargs = self.model_args(batch)
    return model.apply({'params': params}, *args, deterministic=deterministic, rngs=rngs,
                       mutable=list(collections), **kwargs)

  def metric_sums(self, logits, batch, aux_loss) -> dict[str, jax.Array]:
    """Sums over the batch: loss (optimised, smoothed), nll, weights, correct, z-loss."""
    labels, weights = self.targets(batch)
    weights = weights.astype(jnp.float32)
    loss_BL, z_BL = ops.softmax_cross_entropy(logits, labels,
                                              label_smoothing=self.cfg.label_smoothing,
                                              z_loss=self.cfg.z_loss)
    if self.cfg.label_smoothing or self.cfg.z_loss:
      nll_BL, _ = ops.softmax_cross_entropy(logits, labels)
    else:
      nll_BL = loss_BL
    correct, _ = ops.token_accuracy(logits, labels, weights)
    return {
        'loss_sum': jnp.sum(loss_BL * weights),
        'nll_sum': jnp.sum(nll_BL * weights),
        'z_loss_sum': jnp.sum(z_BL * weights),
        'weight_sum': jnp.sum(weights),
        'correct_sum': correct,
        'aux_loss_sum': aux_loss,
        'examples': jnp.asarray(labels.shape[0], jnp.float32),
    }

  def loss(self, model, params, batch, *, deterministic=True, rngs=None, weight_total=None,
           aux_scale=1.0, diagnostics=False):
    """The training objective and its metric sums.

    loss = sum(w * ce) / weight_total + aux_scale * aux, where weight_total defaults to
    this batch's real target tokens (pass the full batch's count for micro-batches).
    diagnostics: sums['diag'] also holds `output_logit_stats` and the attention layers'
    `attention_logit_maxima` (tx.tasks.diagnostics), from this same forward pass.
    """
    collections = AUX_COLLECTIONS + ((DIAGNOSTICS,) if diagnostics else ())
    logits, state = self._apply(model, params, batch, deterministic, rngs, collections)
    aux = sum_leaves(state.get('losses', {}))
    sums = self.metric_sums(logits, batch, aux)
    if diagnostics:
      _, weights = self.targets(batch)
      sums['diag'] = {**output_logit_stats(logits, weights),
                      **attention_logit_maxima(state.get(DIAGNOSTICS, {}))}
    denom = sums['weight_sum'] if weight_total is None else weight_total
    loss = sums['loss_sum'] / jnp.maximum(denom, 1.0) + aux_scale * aux
    return loss, sums


def summarize(sums: dict, *, steps: int = 1) -> dict[str, float]:
  """Means from metric sums (host-side floats). `steps` divides the auxiliary loss."""
  s = {k: float(v) for k, v in sums.items()}
  w = max(s.get('weight_sum', 0.0), 1e-9)
  out = {
      'loss': s['loss_sum'] / w,
      'nll': s['nll_sum'] / w,
      'accuracy': s['correct_sum'] / w,
      'tokens': s['weight_sum'],
  }
  out['perplexity'] = math.exp(min(out['nll'], 50.0))
  if s.get('z_loss_sum'):
    out['z_loss'] = s['z_loss_sum'] / w
  if s.get('aux_loss_sum'):
    out['aux_loss'] = s['aux_loss_sum'] / max(steps, 1)
  if s.get('bytes'):
    out['bits_per_byte'] = s['nll_sum'] / (math.log(2) * s['bytes'])
  return out
