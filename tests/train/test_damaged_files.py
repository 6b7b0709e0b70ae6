"""Files a person or a crash can damage: each gives one line naming the file and the fix (exit
status 2), never a traceback; a torn last line of metrics.jsonl is dropped on resume.

Each case copies the session's tiny decoder run (`decoder_run`), truncates one file in the
middle of its JSON, and runs a command through `tx.cli.main`.
"""

import json
import shutil
from pathlib import Path

import pytest

from tx.cli import main

# (id, file to damage (relative to the run; {step}: in every checkpoint step), command after
# `tx` ({W}: the run, {S}: a sweep directory holding it), text the line must hold besides the
# file; None: the damage is tolerated, the command succeeds).
CASES = [
    ('config_eval', 'config.json', ['eval', '--workdir', '{W}', '--batches', '1'], 'restore'),
    ('config_generate', 'config.json', ['generate', '--workdir', '{W}', '--prompt', 'the'],
     'restore'),
    ('config_continue', 'config.json', ['train', '--workdir', '{W}'], 'restore'),
    ('config_train_named', 'config.json', ['train', 'demo', '--workdir', '{W}'], 'another workdir'),
    ('config_compare', 'config.json', ['compare', '{W}'], 'repair'),
    ('config_sweep', 'config.json', ['sweep', 'ablate_ffn', '--workdir', '{S}', '--only',
                                     'ffn=gelu'], 'remove the run directory'),
    ('summary_compare', 'summary.json', ['compare', '{W}'], 'repair'),
    ('summary_eval', 'summary.json', ['eval', '--workdir', '{W}', '--batches', '1'], 'restore'),
    ('sweep_json_sweep', '../../sweep.json', ['sweep', 'ablate_ffn', '--workdir', '{S}'],
     'restore'),
    ('sweep_json_compare', '../../sweep.json', ['compare', '{S}'], 'repair'),
    # Orbax's step metadata: logged and rebuilt, the step still restores.
    ('checkpoint_metadata', 'checkpoints/{step}/_CHECKPOINT_METADATA',
     ['eval', '--workdir', '{W}', '--batches', '1', '--extrapolation', 'none'], None),
    ('checkpoint_state_metadata', 'checkpoints/{step}/state/_METADATA',
     ['eval', '--workdir', '{W}', '--batches', '1'], 'delete'),
    ('checkpoint_meta', 'checkpoints/{step}/meta/metadata',
     ['eval', '--workdir', '{W}', '--batches', '1'], 'delete'),
    ('tx_tokenizer', 'tokenizer/tx_tokenizer.json',
     ['generate', '--workdir', '{W}', '--prompt', 'the'], 'restore'),
]


def truncate(path: Path) -> None:
  data = path.read_bytes()
  path.write_bytes(data[:max(1, len(data) // 2)])


def _copy_run(source: Path, tmp: Path) -> tuple[Path, Path]:
  """(run, sweep dir): the run copied to tmp/sweep/ffn=gelu/seed_0, as `tx sweep ablate_ffn`
  would lay it out."""
  sweep = tmp / 'sweep'
  run = sweep / 'ffn=gelu' / 'seed_0'
  shutil.copytree(source, run, ignore=shutil.ignore_patterns('.tx.lock'))
  (sweep / 'sweep.json').write_text(json.dumps({
      'name': 'ablate_ffn', 'baseline': 'ffn=gelu', 'seeds': [0],
      'runs': [{'variant': 'ffn=gelu', 'seed': 0, 'dir': 'ffn=gelu/seed_0', 'overrides': {}}]}))
  return run, sweep


def _hf_tokenizer_run(run: Path) -> None:
  """Points the copied run at an hf tokenizer header (the file a `tx convert` run reads)."""
  folder = run / 'tokenizer'
  folder.mkdir()
  (folder / 'tx_tokenizer.json').write_text(json.dumps(
      {'format': 'tx-tokenizer', 'version': 1, 'kind': 'hf', 'file': 'tokenizer.json'}))
  config = json.loads((run / 'config.json').read_text())
  config['data'].update(tokenizer='hf', tokenizer_path='tokenizer/tx_tokenizer.json')
  (run / 'config.json').write_text(json.dumps(config))


@pytest.mark.parametrize('name,file,args,fix', CASES, ids=[c[0] for c in CASES])
def test_a_damaged_file_is_one_line(name, file, args, fix, decoder_run, tmp_path, capsys):
  run, sweep = _copy_run(decoder_run[0], tmp_path)
  if name == 'tx_tokenizer':
    _hf_tokenizer_run(run)
  if name == 'config_sweep':  # a partial run, which the sweep would resume
    (run / 'summary.json').unlink()
  steps = sorted(int(p.name) for p in (run / 'checkpoints').iterdir() if p.name.isdigit())
  damaged = [(run / file.format(step=step)).resolve() for step in steps]
  for path in damaged:
    assert path.is_file(), path
    truncate(path)
  capsys.readouterr()
  code = main([a.format(W=run, S=sweep) for a in args])
  out, err = capsys.readouterr()
  assert 'Traceback' not in err
  if fix is None:
    assert code == 0, err[-3000:]
    return
  lines = [line for line in err.splitlines() if line.strip()]
  assert code == 2, (code, err[-3000:])
  assert len(lines) == 1, err
  line = lines[0]
  assert str(damaged[-1]) in line, line
  assert fix in line, (fix, line)


def test_a_torn_last_metrics_line_is_dropped_on_resume(decoder_run, tmp_path, capsys):
  run, _ = _copy_run(decoder_run[0], tmp_path)
  metrics = run / 'metrics.jsonl'
  rows = metrics.read_text()
  metrics.write_text(rows + '{"step": 31, "loss": 2.')  # a kill in the middle of a write
  (run / 'summary.json').unlink()
  assert main(['train', '--workdir', str(run), '--quiet']) == 0, capsys.readouterr().err
  assert 'Traceback' not in capsys.readouterr().err
  assert metrics.read_text() == rows
