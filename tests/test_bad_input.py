"""Bad configs, overrides and command lines, table-driven, through `tx.cli.main` in-process.

Each case must exit non-zero (2) with exactly one stderr line that names the field, flag or
path and says what would be accepted, with no traceback, no XLA compilation and nothing
written (the workdir is not created; an existing one is left as it was). test_cli.py runs a
further set through real `python -m tx` subprocesses.
"""

import json

import jax
import pytest

from tx.cli import main

# (id, arguments after `tx`, substrings the one line must hold). {W}: a fresh workdir;
# {E}: an empty directory; {B}: a directory whose config.json is not JSON; {R}: a folder of raw
# data that lacks every dataset.
CASES = [
    ('train_no_experiment_no_run', ['train', '--workdir', '{W}'],
     ['no experiment named', 'config.json', 'tx list']),
    ('steps_negative', ['train', 'demo', '--workdir', '{W}', '--set', 'train.steps=-5'],
     ['train.steps', 'must be > 0', '-5']),
    ('steps_float', ['train', 'demo', '--workdir', '{W}', '--set', 'train.steps=1.5'],
     ['train.steps', 'integer', '1.5']),
    ('steps_bool', ['train', 'demo', '--workdir', '{W}', '--set', 'train.steps=true'],
     ['train.steps', 'integer']),
    ('d_model_float', ['train', 'demo', '--workdir', '{W}', '--set', 'model.d_model=1e9'],
     ['model.d_model', 'integer']),
    ('batch_zero', ['train', 'demo', '--workdir', '{W}', '--set', 'train.batch_size=0'],
     ['train.batch_size', 'must be > 0']),
    ('dropout_range', ['train', 'demo', '--workdir', '{W}', '--set', 'model.dropout=1.5'],
     ['model.dropout', '[0, 1)', '1.5']),
    ('learning_rate', ['train', 'demo', '--workdir', '{W}', '--set', 'optim.learning_rate=-1'],
     ['optim.learning_rate', 'must be > 0']),
    ('warmup_negative', ['train', 'demo', '--workdir', '{W}', '--set', 'optim.warmup_steps=-1'],
     ['optim.warmup_steps', '>= 0']),
    ('clip_norm', ['train', 'demo', '--workdir', '{W}', '--set', 'optim.clip_norm=-1'],
     ['optim.clip_norm', '> 0', 'no clipping']),
    ('tokenizer_choice', ['train', 'demo', '--workdir', '{W}', '--set', 'data.tokenizer=wordz'],
     ['data.tokenizer', 'wordz', 'byte', 'char', 'bpe', 'unigram']),
    ('schedule_choice', ['train', 'demo', '--workdir', '{W}', '--set', 'optim.schedule=linearr'],
     ['optim.schedule', 'linearr', 'cosine', 'inverse_sqrt']),
    ('ffn_choice', ['train', 'demo', '--workdir', '{W}', '--set', 'model.ffn=tanh'],
     ['model.ffn', 'tanh', 'swiglu']),
    ('dtype_choice', ['train', 'demo', '--workdir', '{W}', '--set', 'model.dtype=float8'],
     ['model.dtype', 'float8', 'bfloat16']),
    ('norm_position', ['train', 'demo', '--workdir', '{W}', '--set', 'model.norm_position=mid'],
     ['model.norm_position', 'pre', 'post']),
    ('nan_policy', ['train', 'demo', '--workdir', '{W}', '--set', 'train.nan_policy=ignore'],
     ['train.nan_policy', 'stop', 'skip']),
    ('decode_strategy', ['train', 'demo', '--workdir', '{W}', '--set', 'decode.strategy=magic'],
     ['decode.strategy', 'greedy', 'sample', 'beam']),
    ('top_p_range', ['train', 'demo', '--workdir', '{W}', '--set', 'decode.top_p=1.5'],
     ['decode.top_p', '(0, 1]']),
    ('beam_size', ['train', 'demo', '--workdir', '{W}', '--set', 'decode.beam_size=0'],
     ['decode.beam_size', '>= 1']),
    ('kv_heads_divide', ['train', 'demo', '--workdir', '{W}', '--set', 'model.num_kv_heads=3'],
     ['model.num_kv_heads', 'divide', 'model.num_heads']),
    ('accum_divides_batch', ['train', 'demo', '--workdir', '{W}', '--set',
                             'optim.grad_accum_steps=3'],
     ['optim.grad_accum_steps', 'divide', 'train.batch_size']),
    ('experts_negative', ['train', 'demo', '--workdir', '{W}', '--set',
                          'model.moe.num_experts=-1'], ['model.moe.num_experts', '>= 0']),
    ('extrapolation_factor', ['train', 'demo', '--workdir', '{W}', '--set',
                              'train.extrapolation=[0]'], ['train.extrapolation', '> 0']),
    ('learned_positions_too_short', ['train', 'demo', '--workdir', '{W}', '--set',
                                     'model.position=learned', 'data.seq_len=1024'],
     ['model.max_len', '1024', 'learned']),
    ('seq2seq_needs_parallel_data', ['train', 'demo', '--workdir', '{W}', '--set',
                                     'model.family=encoder_decoder'],
     ['data.dataset', 'parallel', 'stdlib']),
    ('mesh_too_big', ['train', 'demo', '--workdir', '{W}', '--set', 'mesh.data=1024'],
     ['mesh.data', 'devices', '-1']),
    ('mesh_not_dividing', ['train', 'demo', '--workdir', '{W}', '--set', 'mesh.tensor=1023'],
     ['mesh', 'devices', 'mesh.tensor']),
    ('section_as_value', ['train', 'demo', '--workdir', '{W}', '--set', 'model=3'],
     ['model', 'ModelConfig']),
    ('value_as_section', ['train', 'demo', '--workdir', '{W}', '--set', 'train.steps.x=1'],
     ['train.steps', 'not a section', 'train.steps=VALUE']),
    ('empty_key', ['train', 'demo', '--workdir', '{W}', '--set', '=3'], ['=3', 'key']),
    ('unknown_dataset', ['train', 'demo', '--workdir', '{W}', '--set', 'data.dataset=nosuch'],
     ['data.dataset', 'nosuch', 'tinyshakespeare', 'tfds:NAME']),
    ('no_matching_files', ['train', 'demo', '--workdir', '{W}', '--set', 'data.dataset=text',
                           'data.files=/nonexistent/*.txt'], ['data.files', 'matches no files']),
    ('raw_dir_missing', ['train', 'demo', '--workdir', '{W}', '--set',
                         'data.dataset=tinyshakespeare', 'data.raw_dir=/nonexistent'],
     ['data.raw_dir', '/nonexistent', 'folder']),
    ('raw_file_missing', ['train', 'demo', '--workdir', '{W}', '--set', 'data.dataset=multi30k',
                          'model.family=encoder_decoder',
                          'data.raw_dir={R}'], ['data.raw_dir', 'multi30k/train.en.gz']),
    ('unreadable_run_config', ['train', 'demo', '--workdir', '{B}'],
     ['--workdir', 'config.json', 'unreadable', 'another workdir']),
    ('eval_empty_dir', ['eval', '--workdir', '{E}'], ['--workdir', 'config.json', 'tx train']),
    ('eval_bad_split', ['eval', '--workdir', '{E}', '--split', 'dev'],
     ['--split', 'dev', 'validation']),
    ('generate_without_text', ['generate', '--workdir', '{E}'], ['--prompt', '--input']),
    ('generate_missing_input', ['generate', '--workdir', '{E}', '--input', '/nonexistent.txt'],
     ['--input', '/nonexistent.txt', 'existing file']),
    ('sweep_unknown', ['sweep', 'no_such_sweep', '--workdir', '{W}'],
     ['no_such_sweep', 'ablate_ffn', 'tx list']),
    ('sweep_zero_seeds', ['sweep', 'ablate_ffn', '--workdir', '{W}', '--seeds', '0'],
     ['--seeds', '>= 1']),
    ('sweep_only_matches_nothing', ['sweep', 'ablate_ffn', '--workdir', '{W}', '--only', 'zzz'],
     ['--only', 'zzz', 'ffn=relu']),
    ('compare_missing_dir', ['compare', '/nonexistent/dir'], ['/nonexistent/dir', 'directory']),
    ('compare_no_runs', ['compare', '{E}'], ['no runs found', 'tx sweep --workdir']),
    ('train_bad_flag', ['train', 'demo', '--workdir', '{W}', '--steps', '5'],
     ['--steps', 'tx train --help']),
]


@pytest.fixture(scope='module')
def places(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('bad_input')
  (tmp / 'empty').mkdir()
  (tmp / 'raw').mkdir()
  (tmp / 'broken').mkdir()
  (tmp / 'broken' / 'config.json').write_text('{not json')
  return tmp


@pytest.fixture
def compiles():
  """Names of XLA compilations that happen while the test runs."""
  seen = []

  def listener(event, duration, **kwargs):
    if 'compile' in event:
      seen.append(event)

  jax.monitoring.register_event_duration_secs_listener(listener)
  yield seen
  jax.monitoring.unregister_event_duration_listener(listener)


def test_the_table_is_big_enough():
  assert len(CASES) >= 25 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize('name,args,expected', CASES, ids=[c[0] for c in CASES])
def test_refused_with_one_line(name, args, expected, places, compiles, capsys, monkeypatch):
  monkeypatch.delenv('TX_RAW_DATA', raising=False)
  monkeypatch.setenv('TFDS_DATA_DIR', str(places / f'tfds_{name}'))
  workdir = places / f'w_{name}'
  before = {p: p.read_bytes() for p in places.rglob('*') if p.is_file()}
  argv = [a.format(W=workdir, E=places / 'empty', B=places / 'broken', R=places / 'raw')
          for a in args]
  try:
    code = main(argv)
  except SystemExit as e:  # argparse's own usage errors
    code = e.code
  out, err = capsys.readouterr()
  lines = [line for line in err.splitlines() if line.strip()]
  assert code == 2, (code, err[-2000:])
  assert len(lines) == 1, err
  assert 'Traceback' not in err and out == ''
  assert 'error' in lines[0]
  for text in expected:
    assert text in lines[0], (text, lines[0])
  assert not compiles, compiles
  assert not workdir.exists(), f'{name} created {workdir}'
  after = {p: p.read_bytes() for p in places.rglob('*') if p.is_file()}
  assert after == before, sorted(set(after) ^ set(before))
  assert not (places / f'tfds_{name}').exists()
