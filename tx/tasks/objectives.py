"""The three objectives: causal LM, masked LM (BERT) and seq2seq (teacher forcing)."""

from __future__ import annotations

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
  """
  name = 'mlm'
  generates = False

  def model_args(self, batch):
    return (batch['inputs'],), {'positions': batch.get('positions'),
                                'segment_ids': batch.get('segment_ids')}


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
  return TASKS[exp_cfg.task_name](exp_cfg.model, exp_cfg.task)
