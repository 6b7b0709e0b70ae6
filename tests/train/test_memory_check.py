"""The memory check before the first step (tx.train.memory): a step that cannot fit is refused
with one line after compiling, before anything is allocated or left behind."""

import pytest

from tx.cli import main
from tx.train import memory
from tx.train.loop import make_pipelines

# 2^24 rows of 16 tokens: tens of GiB of logits alone, more than a test host has (CPU).
HUGE = dict(batch_size=2 ** 24, steps=2)


def test_a_step_that_cannot_fit_is_refused_with_one_line(tt, tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(memory, 'host_bytes', lambda: 8 * 1024 ** 3)  # the same on any host
  workdir = tmp_path / 'a' / 'run'
  cfg = tt.config(train=HUGE)
  make_pipelines(cfg, 'causal_lm')  # prepared once, so its progress bars are not in the way
  capsys.readouterr()
  args = ['train', 'demo', '--workdir', str(workdir), '--quiet', '--set', *tt.demo_overrides(cfg)]
  assert main(args) == 2
  lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(lines) == 1, lines
  for text in ('the step needs', 'per device', 'this host has 8.0 GiB', 'data.seq_len',
               'train.batch_size', 'model.remat', 'train.memory_check=false'):
    assert text in lines[0], (text, lines[0])
  assert not (tmp_path / 'a').exists()  # nothing half-made, not even the parent it created


def test_memory_check_false_skips_the_check(tt, tmp_path, monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError('the memory check ran')
  monkeypatch.setattr(memory, 'check_fits', refuse)
  with pytest.raises(AssertionError, match='memory check ran'):
    main(['train', 'demo', '--workdir', str(tmp_path / 'on'), '--quiet', '--set',
          *tt.demo_overrides(tt.config(train=dict(steps=1)))])
  args = ['train', 'demo', '--workdir', str(tmp_path / 'off'), '--quiet', '--set',
          *tt.demo_overrides(tt.config(train=dict(steps=1, memory_check=False)))]
  assert main(args) == 0


def test_the_step_bytes_are_tx_plans_total():
  class Analysis:
    argument_size_in_bytes, output_size_in_bytes, alias_size_in_bytes = 100, 90, 80
    temp_size_in_bytes, generated_code_size_in_bytes = 7, 3
  assert memory.step_bytes(Analysis()) == 100 + 90 - 80 + 7 + 3
  assert memory.format_bytes(9 * 1024 ** 4) == '9.0 TiB'
  assert memory.format_bytes(23 * 1024 ** 3) == '23.0 GiB'
