"""`ExperimentConfig`: everything a run needs, as dotted keys (`model.d_model`, `train.steps`)."""

from __future__ import annotations

from tx.config.base import config, fail, nested
from tx.config.data import PARALLEL_DATASETS, TEXT_DATASETS, DataConfig
from tx.config.model import ModelConfig
from tx.config.optim import OptimConfig
from tx.config.train import DecodeConfig, MeshConfig, TaskConfig, TrainConfig

TASK_FOR_FAMILY = {'decoder': 'causal_lm', 'encoder': 'mlm', 'encoder_decoder': 'seq2seq'}


@config
class ExperimentConfig:
  """A named, fully resolved experiment (the `config.json` of a run directory)."""
  name: str = 'unnamed'
  model: ModelConfig = nested(ModelConfig)
  data: DataConfig = nested(DataConfig)
  optim: OptimConfig = nested(OptimConfig)
  train: TrainConfig = nested(TrainConfig)
  task: TaskConfig = nested(TaskConfig)
  decode: DecodeConfig = nested(DecodeConfig)
  mesh: MeshConfig = nested(MeshConfig)

  def validate(self):
    task = self.task_name
    if TASK_FOR_FAMILY[self.model.family] != task:
      fail('task.name', f'{task} needs model.family={_family_for(task)}, '
           f'not {self.model.family}')
    if self.optim.grad_accum_steps > 1 and self.train.batch_size % self.optim.grad_accum_steps:
      fail('optim.grad_accum_steps', f'{self.optim.grad_accum_steps} does not divide '
           f'train.batch_size={self.train.batch_size}')
    if task == 'seq2seq' and self.data.dataset in TEXT_DATASETS:
      fail('data.dataset', f'objective seq2seq needs a parallel dataset '
           f'({", ".join(PARALLEL_DATASETS)}), got {self.data.dataset!r}')
    if task != 'seq2seq' and self.data.dataset in PARALLEL_DATASETS:
      fail('data.dataset', f'objective {task} needs a text dataset '
           f'({", ".join(TEXT_DATASETS)}), got the parallel dataset {self.data.dataset!r}')
    length = self.data.target_len if task == 'seq2seq' else self.data.seq_len
    if self.model.position == 'learned' and length > self.model.max_len:
      fail('model.max_len', f'{self.model.max_len} is shorter than the training length {length} '
           '(data.seq_len / data.target_len) with learned positions')

  @property
  def task_name(self) -> str:
    return TASK_FOR_FAMILY[self.model.family] if self.task.name == 'auto' else self.task.name


def _family_for(task: str) -> str:
  return {v: k for k, v in TASK_FOR_FAMILY.items()}[task]
