"""Checkpoint averaging: `tx average` and train.average_last, for every family.

The session's tiny runs keep checkpoints at steps 20 and 30; their average must be the
element-wise mean of those two steps' parameters, written as a run directory that records
the steps and that `tx eval` reads like any run.
"""

import json
import types

import jax
import numpy as np
import pytest

from tx import cli
from tx.config.base import ConfigError
from tx.runs.restore import load_run
from tx.train import averaging, run_dir

FAMILIES = ('decoder', 'encoder', 'encoder_decoder')


def _params(workdir, step=None):
  _, state, _, got = load_run(workdir, step=step)
  return state.params, got


@pytest.mark.parametrize('family', FAMILIES)
def test_average_is_the_elementwise_mean_and_records_its_steps(family_runs, family, tmp_path,
                                                               capsys):
  workdir, _ = family_runs[family]
  out = tmp_path / 'avg'
  assert cli.main(['average', '--workdir', str(workdir), '--last', '2', '--out', str(out)]) == 0
  assert '[20, 30]' in capsys.readouterr().out
  p20, _ = _params(workdir, 20)
  p30, _ = _params(workdir, 30)
  averaged, step = _params(out)
  assert step == 30
  pairs = list(zip(jax.tree_util.tree_leaves_with_path(averaged),
                   jax.tree_util.tree_leaves(p20), jax.tree_util.tree_leaves(p30)))
  assert any(not np.array_equal(a, b) for _, a, b in pairs)  # else any step would pass
  for (path, got), a, b in pairs:
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(np.asarray(got), (a + b) / 2, rtol=1e-6, atol=1e-7,
                               err_msg=jax.tree_util.keystr(path))
  record = json.loads((out / averaging.AVERAGE_JSON).read_text())
  assert record == {'steps': [20, 30], 'source': str(workdir.resolve())}
  assert run_dir.load_run_config(out) == run_dir.load_run_config(workdir)
  assert not (tmp_path / 'avg.partial').exists()


def test_average_of_chosen_steps_and_eval_reads_it(family_runs, tmp_path, capsys):
  workdir, _ = family_runs['encoder_decoder']
  out = tmp_path / 'one'
  assert cli.main(['average', '--workdir', str(workdir), '--steps', '20', '--out',
                   str(out)]) == 0
  p20, _ = _params(workdir, 20)
  averaged, step = _params(out)
  assert step == 20
  for a, b in zip(jax.tree_util.tree_leaves(averaged), jax.tree_util.tree_leaves(p20)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  capsys.readouterr()
  assert cli.main(['eval', '--workdir', str(out), '--bleu-batches', '0']) == 0
  assert np.isfinite(json.loads((out / 'eval_validation_20.json').read_text())['loss'])


@pytest.mark.parametrize('args, expected', [
    (['--last', '3'], 'keeps only 2 checkpoints on its cadence ([20, 30])'),
    (['--last', '0'], '--last: must be >= 1'),
    (['--steps', '20', '25'], 'cannot average steps [25]: not in'),
])
def test_bad_requests_are_one_line(family_runs, tmp_path, capsys, args, expected):
  workdir, _ = family_runs['decoder']
  out = tmp_path / 'avg'
  assert cli.main(['average', '--workdir', str(workdir), *args, '--out', str(out)]) == 2
  err = capsys.readouterr().err
  assert expected in err and len(err.strip().splitlines()) == 1, err
  assert not out.exists()


def test_an_existing_average_is_not_overwritten(family_runs, tmp_path, capsys):
  workdir, _ = family_runs['decoder']
  out = tmp_path / 'avg'
  out.mkdir()
  (out / 'keep.txt').write_text('mine')
  assert cli.main(['average', '--workdir', str(workdir), '--last', '2', '--out', str(out)]) == 2
  assert 'already exists' in capsys.readouterr().err
  assert (out / 'keep.txt').read_text() == 'mine'


def test_cadence_steps_leave_out_off_cadence_saves():
  train_cfg = types.SimpleNamespace(checkpoint_every=10, steps=35)
  ckpt = types.SimpleNamespace(all_steps=lambda: [10, 20, 25, 30, 35])  # 25: a preemption save
  assert averaging.cadence_steps(ckpt, train_cfg, 3) == [20, 30, 35]
  assert averaging.cadence_steps(ckpt, train_cfg, 9) == [10, 20, 30, 35]


def test_average_last_needs_enough_kept_checkpoints(tt):
  with pytest.raises(ConfigError, match='keep_checkpoints >= 3'):
    tt.config('decoder', train=dict(average_last=3, keep_checkpoints=2))


def test_average_last_at_the_end_of_training(tt, tmp_path):
  from tx.train.loop import train  # pylint: disable=g-import-not-at-top
  cfg = tt.config('encoder', name='tiny_avg', train=dict(average_last=3, keep_checkpoints=3))
  workdir = tmp_path / 'run'
  result = train(cfg, workdir, quiet=True)
  average = result.summary['average']
  out = workdir / averaging.AVERAGE_DIR
  assert average['steps'] == [10, 20, 30] and average['dir'] == str(out)
  assert np.isfinite(average['eval']['loss'])
  assert average['eval']['loss'] != result.summary['eval']['loss']
  assert json.loads((workdir / run_dir.SUMMARY).read_text())['average'] == average
  assert json.loads((out / averaging.AVERAGE_JSON).read_text())['steps'] == [10, 20, 30]
  rows = [json.loads(line) for line in (workdir / run_dir.METRICS).read_text().splitlines()]
  assert [r['eval_average/loss'] for r in rows if 'eval_average/loss' in r] == [
      pytest.approx(average['eval']['loss'])]
  steps = [_params(workdir, s)[0] for s in (10, 20, 30)]
  averaged, step = _params(out)
  assert step == 30
  for got, *each in zip(*(jax.tree_util.tree_leaves(t) for t in [averaged] + steps)):
    np.testing.assert_allclose(np.asarray(got), sum(np.asarray(e) for e in each) / 3,
                               rtol=1e-5, atol=1e-7)
