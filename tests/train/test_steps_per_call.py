"""train.steps_per_call: several training steps per compiled call (a scan over the batches),
the same run as one step per call."""

import json

import pytest

from tx.config.base import ConfigError
from tx.config.train import TrainConfig


def test_several_steps_per_call_train_the_same_run(tt, decoder_run, tmp_path):
  """4 steps per call against the reference run's 1: the logs come every 5 steps and the
  checkpoints every 10, so the run mixes calls of 4 steps and single steps; the same loss
  at every logged step, the same evaluation and the same checkpoints."""
  from tx.train.loop import train  # pylint: disable=import-outside-toplevel
  ref_dir, reference = decoder_run
  cfg = tt.config('decoder', name='tiny_decoder', train=dict(steps_per_call=4))
  result = train(cfg, tmp_path, quiet=True)
  rows, _ = tt.rows(tmp_path)
  ref_rows, _ = tt.rows(ref_dir)
  assert [r['step'] for r in rows] == [r['step'] for r in ref_rows] == list(range(5, 31, 5))
  for key in ('loss', 'grad_norm', 'learning_rate'):
    assert [r[key] for r in rows] == pytest.approx([r[key] for r in ref_rows], rel=1e-5), key
  assert result.summary['eval']['loss'] == pytest.approx(reference.summary['eval']['loss'],
                                                          rel=1e-5)
  assert result.summary['steps'] == 30
  saved = sorted(p.name for p in (tmp_path / 'checkpoints').iterdir() if p.name.isdigit())
  assert saved == sorted(p.name for p in (ref_dir / 'checkpoints').iterdir()
                         if p.name.isdigit())
  assert json.loads((tmp_path / 'config.json').read_text())['train']['steps_per_call'] == 4


def test_steps_per_call_must_be_positive():
  with pytest.raises(ConfigError, match='train.steps_per_call'):
    TrainConfig(steps_per_call=0).validate()
