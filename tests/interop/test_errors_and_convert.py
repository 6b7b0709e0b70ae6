"""User errors are one-line errors naming the file/key; `tx convert` writes a usable run."""

import json
import shutil

import jax
import numpy as np
import pytest

pytest.importorskip('torch')
pytest.importorskip('transformers')

from tx import cli  # pylint: disable=g-import-not-at-top
from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
from tx.interop import load_hf  # pylint: disable=g-import-not-at-top
from tx.train.errors import CheckpointError  # pylint: disable=g-import-not-at-top


def _copy(path, tmp_path):
  out = tmp_path / 'ckpt'
  shutil.copytree(path, out)
  return out


def _edit_tensors(path, fn):
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  tensors = load_file(str(path / 'model.safetensors'))
  fn(tensors)
  save_file(tensors, str(path / 'model.safetensors'))


def _edit_config(path, **changes):
  data = json.loads((path / 'config.json').read_text())
  data.update(changes)
  (path / 'config.json').write_text(json.dumps(data))


@pytest.mark.parametrize('damage, error, match', [
    ('no_dir', CheckpointError, 'no such directory'),
    ('no_config', CheckpointError, 'config.json: not found'),
    ('no_weights', CheckpointError, 'no model.safetensors'),
    ('model_type', ConfigError, "model_type='gptj' is not supported"),
    ('rope_scaling', ConfigError, "rope_type='longrope' is not supported"),
    ('missing', CheckpointError, 'tensor model.norm.weight is missing'),
    ('extra', CheckpointError, 'unexpected tensor model.extra.weight'),
    ('shape', CheckpointError, r'embed_tokens.weight has shape \(101, 31\)'),
])
def test_bad_checkpoints_are_one_line_errors(reference, tmp_path, damage, error, match):
  _, path = reference('llama')
  ckpt = _copy(path, tmp_path)
  if damage == 'no_dir':
    ckpt = tmp_path / 'absent'
  elif damage == 'no_config':
    (ckpt / 'config.json').unlink()
  elif damage == 'no_weights':
    (ckpt / 'model.safetensors').unlink()
  elif damage == 'model_type':
    _edit_config(ckpt, model_type='gptj')
  elif damage == 'rope_scaling':
    _edit_config(ckpt, rope_parameters={'rope_type': 'longrope', 'factor': 2.0})
  elif damage == 'missing':
    _edit_tensors(ckpt, lambda t: t.pop('model.norm.weight'))
  elif damage == 'extra':
    _edit_tensors(ckpt, lambda t: t.update({'model.extra.weight': np.zeros(3, np.float32)}))
  elif damage == 'shape':
    _edit_tensors(ckpt, lambda t: t.update(
        {'model.embed_tokens.weight': t['model.embed_tokens.weight'][:, :31].copy()}))
  with pytest.raises(error, match=match) as info:
    load_hf(ckpt)
  assert '\n' not in str(info.value)


def test_cli_convert_bad_dir_exits_2(tmp_path, capsys):
  assert cli.main(['convert', '--hf', str(tmp_path / 'absent'), '--workdir',
                   str(tmp_path / 'run')]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('tx convert: error:') and 'no such directory' in err and '\n' not in err
  assert not (tmp_path / 'run').exists()


def test_convert_writes_a_run_that_load_run_restores(reference, tmp_path, capsys):
  from tx.runs.restore import load_run  # pylint: disable=g-import-not-at-top
  _, path = reference('gpt2')
  cfg, params = load_hf(path)
  run = tmp_path / 'run'
  assert cli.main(['convert', '--hf', str(path), '--workdir', str(run),
                   '--set', 'train.steps=10', 'model.dropout=0.1']) == 0
  assert 'checkpoint at step 0' in capsys.readouterr().out
  run_cfg, state, _, step = load_run(run)
  assert step == 0 and run_cfg.train.steps == 10
  assert run_cfg.model == cfg.replace(dropout=0.1)
  assert run_cfg.data.seq_len <= cfg.max_len  # learned positions: windows fit the table
  same = jax.tree_util.tree_map(lambda a, b: bool(np.array_equal(a, b)), state.params, params)
  assert all(jax.tree_util.tree_leaves(same))
  # The architecture comes from the checkpoint; a shape-changing override is refused.
  assert cli.main(['convert', '--hf', str(path), '--workdir', str(tmp_path / 'run2'),
                   '--set', 'model.d_model=64']) == 2
  assert 'model.d_model' in capsys.readouterr().err
