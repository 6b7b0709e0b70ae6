"""The three objectives: causal LM, masked LM (BERT) and seq2seq (teacher forcing)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tx.tasks.base import Task


class CausalLMTask(Task):
  """Next-token prediction. Batch: inputs, targets, weights [B, L] (+ segment_ids, positions)."""
  name = 'causal_lm'
  generates = True

  def model_args(self, batch):
    return (batch['inputs'],), {'positions': batch.get('positions'),
                                'segment_ids': batch.get('segment_ids')}


class MLMTask(Task):
  """Masked LM: loss and accuracy on the selected positions only (weights 1 there).

  Batch: inputs (corrupted), targets (original), weights [B, L] (+ segment_ids, positions).
  `accuracy` is therefore masked-token accuracy.

  max_predictions P > 0 (`data.mlm_max_predictions`, whose masking selects at most P
  positions a row): the network's MLM head runs only at P positions a row, the selected ones
  first, so logits are [B, P, V] and the loss is the same without the other positions'
  logits (BERT's own pretraining code gathers them the same way). A row of a batch that
  selects more than P positions would lose the rest from its loss.
  """
  name = 'mlm'
  generates = False

  def __init__(self, model_cfg, task_cfg, max_predictions: int = 0):
    super().__init__(model_cfg, task_cfg)
    self.max_predictions = max_predictions

  def predicted(self, batch):
    """int32 [B, P]: where the head runs, each row's weighted positions first (in order,
    then the unweighted ones); None without a cap (the head at every position)."""
    if not self.max_predictions:
      return None
    return jax.lax.top_k(batch['weights'], self.max_predictions)[1]

  def model_args(self, batch):
    kwargs = {'positions': batch.get('positions'), 'segment_ids': batch.get('segment_ids')}
    at = self.predicted(batch)
    return (batch['inputs'],), kwargs if at is None else {**kwargs, 'predict_at': at}

  def targets(self, batch):
    at = self.predicted(batch)
    if at is None:
      return batch['targets'], batch['weights']
    return (jnp.take_along_axis(batch['targets'], at, axis=1),
            jnp.take_along_axis(batch['weights'], at, axis=1))


class Seq2SeqTask(Task):
  """Teacher forcing: decoder input BOS + target, labels target + EOS.

  Batch: src [B, S], tgt_inputs / targets / weights [B, L]
  (+ src_segment_ids, src_positions, tgt_segment_ids, tgt_positions when packed).
  """
  name = 'seq2seq'
  generates = True

  def model_args(self, batch):
    return (batch['src'], batch['tgt_inputs']), {
        'src_positions': batch.get('src_positions'),
        'tgt_positions': batch.get('tgt_positions'),
        'src_segment_ids': batch.get('src_segment_ids'),
        'tgt_segment_ids': batch.get('tgt_segment_ids'),
    }


TASKS = {t.name: t for t in (CausalLMTask, MLMTask, Seq2SeqTask)}


def make_task(exp_cfg) -> Task:
  """The task of an ExperimentConfig (`task.name`, or the family's default)."""
  if exp_cfg.task_name == 'mlm':
    return MLMTask(exp_cfg.model, exp_cfg.task, exp_cfg.data.mlm_max_predictions)
  return TASKS[exp_cfg.task_name](exp_cfg.model, exp_cfg.task)
