"""Learning-rate sweeps in `tx compare --x` / `--curves` and `lr_grid`: the definitions in
tx/compare/lr_curves.py against hand computations, and synthetic sweep directories
(config.json + summary.json + metrics.jsonl written by hand; nothing is trained).
"""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tx.cli import main
from tx.compare import lr_curves
from tx.compare.cli import run
from tx.compare.lr_curves import Point
from tx.config.base import ConfigError, override, to_dict
from tx.config.experiment import ExperimentConfig
from tx.sweep import axis, lr_grid, product

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
INIT = 5.5  # the synthetic runs' loss at step 1


# ----------------------------------------------------------------------------- lr_grid

def test_lr_grid_values():
  grid = lr_grid(1e-4, 3e-1, per_decade=3)
  assert grid[:4] == [1e-4, 2.15e-4, 4.64e-4, 1e-3]
  assert grid[-2:] == [1e-1, 2.15e-1] and len(grid) == 11  # 4.64e-1 > hi
  assert lr_grid(1e-4, 1e-1)[-1] == 1e-1  # hi kept when it is on the grid
  assert lr_grid(1e-3, 1e-1, per_decade=1) == [1e-3, 1e-2, 1e-1]
  assert lr_grid(3e-4, 3e-4) == [3e-4]
  ratios = np.diff(np.log10(lr_grid(1e-5, 1.0, per_decade=4)))
  assert np.allclose(ratios, 0.25, atol=0.005)  # log-spaced up to 3-digit rounding
  names = [v for (_, v), in axis('optim.learning_rate', grid).variants]
  assert names == grid
  from tx import registry
  assert registry.lr_grid is lr_grid


@pytest.mark.parametrize('args, match', [((0, 1e-1), 'lo must be > 0'),
                                         ((-1e-3, 1e-1), 'lo must be > 0'),
                                         ((1e-1, 1e-3), 'below lo'),
                                         ((1e-4, 1e-1, 0), 'per_decade'),
                                         ((1e-4, 1e-1, 1.5), 'per_decade')])
def test_lr_grid_errors(args, match):
  with pytest.raises(ConfigError, match=match):
    lr_grid(*args)


# ----------------------------------------------------------------------------- pure

def test_sensitivity_equals_hand_computation():
  xs = [1e-3, 1e-2, 1e-1, 1.0]
  seed0 = [3.0, 2.0, 2.5, None]  # diverged at x = 1: counts as its init loss 4.0
  seed1 = [3.2, 2.2, 2.4, 5.0]  # finite but above init 4.0: min(5.0, 4.0)
  points = ([Point(x, 0, v, diverged=v is None, init_loss=4.0) for x, v in zip(xs, seed0)]
            + [Point(x, 1, v, init_loss=4.0) for x, v in zip(xs, seed1)])
  c = lr_curves.analyze('c', points, fallback=None)
  # seed 0: mean(3, 2, 2.5, 4) - 2 = 0.875; seed 1: mean(3.2, 2.2, 2.4, 4) - 2.2 = 0.75
  assert c.sensitivities == [pytest.approx(0.875), pytest.approx(0.75)]
  assert c.sensitivity.mean == pytest.approx(0.8125)
  assert c.sensitivity.std == pytest.approx(np.std([0.875, 0.75], ddof=1))
  assert c.best_x == 1e-2 and c.best_x_seeds == (1e-2, 1e-2)
  assert c.best_values == [2.0, 2.2] and c.best_loss.mean == pytest.approx(2.1)
  assert c.failed == [0, 0, 0, 1] and c.mean[-1] == pytest.approx(4.0)
  assert lr_curves.sensitivity([1.0, 1.0, 1.0]) == 0  # a flat curve


def test_capping_of_diverged_runs():
  pts = [Point(0.1, 0, None, diverged=True, init_loss=5.0),  # missing value: its own init
         Point(0.1, 1, 2.0, diverged=True, init_loss=5.0),  # diverged: the cap, not 2.0
         Point(0.1, 2, float('nan')),  # no init of its own: the curve's mean init 5.0
         Point(0.1, 3, 7.0, init_loss=6.0),  # above its init: min(7, 6)
         Point(0.1, 4, 1.5, init_loss=6.0)]  # below: unchanged
  assert lr_curves.capped(pts, fallback=99.0) == [5.0, 5.0, 5.5, 6.0, 1.5]
  assert [p.failed for p in pts] == [True, True, True, False, False]
  # Without any loss at init the cap is 1.1 x the largest finite value on the plot.
  plain = [Point(0.1, 0, 2.0), Point(1.0, 0, float('inf')), Point(0.01, 0, 3.0)]
  fb = lr_curves.fallback_cap(plain)
  assert fb == pytest.approx(3.3)
  assert lr_curves.capped(plain, fb) == [2.0, pytest.approx(3.3), 3.0]
  with pytest.raises(ValueError):
    lr_curves.capped([Point(0.1, 0, None, diverged=True)], fallback=None)


def test_basin_width_of_known_curves():
  xs = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
  assert lr_curves.basin_width(xs, [3.0, 2.05, 2.0, 2.09, 2.5]) == pytest.approx(2.0)
  # 2.05 at 1e-4 is within 0.1 but not contiguous with the best (2.5 lies between).
  assert lr_curves.basin_width(xs, [2.05, 2.5, 2.0, 2.09, 3.0]) == pytest.approx(1.0)
  assert lr_curves.basin_width(xs, [3.0, 2.5, 2.0, 2.5, 3.0]) == 0.0  # only the best
  assert lr_curves.basin_width(xs, [2.0] * 5) == pytest.approx(4.0)  # whole grid
  assert lr_curves.basin_width([0.0, 1.0, 2.0], [2.0, 1.0, 2.0]) is None  # linear axis
  c = lr_curves.analyze('c', [Point(x, 0, v) for x, v in zip(xs, [3.0, 2.05, 2.0, 2.09, 2.5])],
                        fallback=None)
  assert c.basin == (1e-3, 1e-1) and not c.at_edge and c.log_x


def _bowl(width: float, seeds=3, noise=0.01):
  """Loss = 2 + width * (log10 lr + 2)^2 on lr 1e-4..1, a little seed noise."""
  xs = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
  return [Point(x, s, 2.0 + width * (math.log10(x) + 2) ** 2 + noise * (s - 1) * (1 + i % 2),
                init_loss=INIT) for s in range(seeds) for i, x in enumerate(xs)]


def test_welch_sign_when_one_curve_is_flatter():
  flat = lr_curves.analyze('flat', _bowl(0.05), None)
  sharp = lr_curves.analyze('sharp', _bowl(0.5), None)
  best, sens = lr_curves.differences(flat, sharp)
  assert sens.high < 0 and sens.excludes_zero  # flat - sharp: clearly less sensitive
  assert best.low < 0 < best.high  # the same best loss (2.0) up to seed noise
  best, sens = lr_curves.differences(sharp, flat)
  assert sens.low > 0
  one = lr_curves.analyze('one', _bowl(0.5, seeds=1), None)
  assert lr_curves.differences(one, flat) == (None, None)  # one seed: no interval


# ----------------------------------------------------------------------------- sweep dirs

def _loss(norm_position: str, lr: float, seed: int) -> float:
  """pre: a wide basin; post: a narrow one (loss rises 4x faster in log lr)."""
  width = 0.1 if norm_position == 'pre' else 0.4
  return 2.0 + width * (math.log10(lr) + 2.5) ** 2 + 0.01 * seed


def write_lr_sweep(root: Path, *, seeds=3, diverge=(('post', 1e-1),), old=(), nan=(),
                   vocab=256) -> Path:
  """A finished `tx sweep` of model.norm_position x optim.learning_rate.

  `diverge`: (norm_position, lr) whose runs diverged (status 'diverged', eval loss NaN);
  `old`: ... whose summaries predate status / init_loss; `nan`: ... that finished 'done'
  with a NaN eval loss.
  """
  axes = product(axis('model.norm_position', ['pre', 'post']),
                 axis('optim.learning_rate', [1e-4, 1e-3, 1e-2, 1e-1]))
  runs, variants = [], []
  for variant in axes.variants:
    over = dict(variant)
    name = (f'norm_position={over["model.norm_position"]},'
            f'learning_rate={over["optim.learning_rate"]!r}')
    variants.append({'name': name, 'overrides': over})
    case = (over['model.norm_position'], over['optim.learning_rate'])
    for seed in range(seeds):
      rel = f'{name}/seed_{seed}'
      runs.append({'variant': name, 'seed': seed, 'dir': rel,
                   'overrides': {**over, 'train.seed': seed}})
      path = root / rel
      path.mkdir(parents=True)
      cfg = override(ExperimentConfig(name='lm_fake'),
                     {**over, 'train.seed': seed, 'model.vocab_size': vocab})
      (path / 'config.json').write_text(json.dumps(to_dict(cfg)))
      loss = _loss(*case, seed)
      summary = {'experiment': 'lm_fake', 'params': 1000, 'steps': 30, 'wall_time_s': 1.0,
                 'tokens_per_s': 10.0, 'eval': {'loss': loss, 'accuracy': 1 / loss},
                 'best_eval': {'loss': loss - 0.05, 'step': 30},
                 'status': 'done', 'diverged_at': None, 'init_loss': INIT}
      train_loss = [INIT, loss + 0.5, loss + 0.2]
      if case in diverge:
        summary.update(status='diverged', diverged_at=20, eval={'loss': float('nan')})
        summary['best_eval']['loss'] = float('nan')
        train_loss = [INIT, 9.0, float('nan')]
      if case in nan:
        summary['eval'] = {}
      if case in old:
        for k in ('status', 'diverged_at', 'init_loss'):
          del summary[k]
      (path / 'summary.json').write_text(json.dumps(summary))
      rows = [{'step': s, 'time': 100.0 + s, 'loss': v, 'grad_norm': 1.0 / s,
               'diag/attn_logit_max': 3.0 + s * case[1]}
              for s, v in zip((1, 10, 20), train_loss)]
      rows.append({'step': 20, 'time': 121.0, 'eval/loss': loss})
      (path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))
  (root / 'sweep.json').write_text(json.dumps({
      'name': 'fake_lr', 'base': 'lm_fake', 'description': 'LR x norm position, fake numbers',
      'axes': axes.spec, 'seeds': list(range(seeds)),
      'baseline': 'norm_position=pre,learning_rate=0.001', 'variants': variants,
      'runs': runs}))
  return root


def test_lr_sweep_end_to_end(tmp_path):
  root = write_lr_sweep(tmp_path / 'lr')
  r = run([str(root)], x='optim.learning_rate')
  curves = {c.label: c for c in r.lr.curves}
  assert set(curves) == {'norm_position=pre', 'norm_position=post'}
  assert r.lr.baseline == 'norm_position=pre'  # holds the sweep's baseline variant
  pre, post = curves['norm_position=pre'], curves['norm_position=post']
  assert pre.xs == [1e-4, 1e-3, 1e-2, 1e-1]
  # The diverged post runs at 1e-1 count as their init loss, drawn as failed points.
  assert post.failed == [0, 0, 0, 3] and post.mean[-1] == pytest.approx(INIT)
  assert [v for x, v, f in post.points if f] == [INIT] * 3
  assert pre.failed == [0, 0, 0, 0]
  # Sensitivity per seed by hand for pre (the seed offset cancels in mean - min).
  pre_grid = [_loss('pre', x, 0) for x in pre.xs]
  assert pre.sensitivities == [pytest.approx(np.mean(pre_grid) - min(pre_grid))] * 3
  # post: the capped point (INIT) does not move with the seed offset, so each seed differs.
  by_hand = []
  for seed in range(3):
    grid = [_loss('post', x, seed) for x in post.xs[:3]] + [INIT]
    by_hand.append(np.mean(grid) - min(grid))
  assert post.sensitivities == pytest.approx(by_hand)
  assert post.sensitivity.mean == pytest.approx(np.mean(by_hand))
  assert post.sensitivity.std == pytest.approx(np.std(by_hand, ddof=1))
  # Best x: 1e-3 for both (the bowl's bottom is at 10^-2.5, equidistant; ties -> smaller).
  assert pre.best_x == 1e-3 and post.best_x == 1e-3 and pre.best_x_seeds == (1e-3, 1e-3)
  assert pre.best_loss.mean == pytest.approx(_loss('pre', 1e-3, 1))
  # Basin: pre's neighbours 1e-2 (within 0.1) and 1e-4 (0.1 * 1.5^2 - 0.1 * 0.25 = 0.2 above).
  assert pre.basin == (1e-3, 1e-2) and pre.basin_width == pytest.approx(1.0)
  assert post.basin_width == pytest.approx(1.0)
  best, sens = r.lr.diffs['norm_position=post']
  assert sens.low > 0  # post is clearly more sensitive
  assert best.diff == pytest.approx(0.4 * 0.25 - 0.1 * 0.25)
  # Files: the plot, the Markdown and CSV tables, linked from compare.md.
  png = root / 'eval.loss_vs_optim.learning_rate.png'
  assert png.read_bytes()[:8] == PNG_MAGIC and png in r.files
  md = (root / 'lr_curves.md').read_text()
  assert '`norm_position=post`' in md and '| 0.1: 3/3 |' in md
  assert '(baseline)' in md and 'ln(model.vocab_size)' not in md
  assert f'![{png.stem}]({png.name})' in (root / 'compare.md').read_text()
  with open(root / 'lr_curves.csv') as f:
    rows = {row['curve']: row for row in csv.DictReader(f)}
  assert float(rows['norm_position=post']['sensitivity_ci_low']) > 0
  assert float(rows['norm_position=pre']['best_x']) == 1e-3
  assert rows['norm_position=pre']['sensitivity_diff'] == ''  # the baseline


def test_old_summaries_and_nan_metric(tmp_path):
  # Older summaries (no status / init_loss) fall back to ln(vocab_size) and say so; a
  # 'done' run without a finite eval loss is capped like a diverged one.
  root = write_lr_sweep(tmp_path / 'lr', diverge=(), old=(('pre', 1e-4),),
                        nan=(('post', 1e-1),), vocab=100)
  r = run([str(root)], x='optim.learning_rate')
  curves = {c.label: c for c in r.lr.curves}
  assert r.lr.init_from_vocab == 3
  pre, post = curves['norm_position=pre'], curves['norm_position=post']
  assert pre.mean[0] == pytest.approx(np.mean([_loss('pre', 1e-4, s) for s in range(3)]))
  assert post.failed[-1] == 3 and post.mean[-1] == pytest.approx(INIT)
  assert 'ln(model.vocab_size)' in r.lr_text
  # An old run that diverged by the sweep runner (no summary, an error) is capped at ln(100).
  entry = json.loads((root / 'sweep.json').read_text())
  e = next(e for e in entry['runs']
           if e['dir'].startswith('norm_position=pre,learning_rate=0.0001/'))
  e['error'] = 'step 7: non-finite loss nan'
  # The current runner records a divergence as the entry's status instead.
  e2 = next(e for e in entry['runs'] if e['dir'] == 'norm_position=post,learning_rate=0.01/seed_1')
  e2['status'] = 'diverged at step 5'
  (root / 'sweep.json').write_text(json.dumps(entry))
  (root / e['dir'] / 'summary.json').unlink()
  (root / e2['dir'] / 'summary.json').unlink()
  r = run([str(root)], x='optim.learning_rate')
  pre, post = r.lr.curves
  assert pre.failed[0] == 1 and math.log(100) in [v for _, v, f in pre.points if f]
  assert post.failed == [0, 0, 1, 3] and (0.01, math.log(100), True) in post.points


def test_best_eval_metric_and_cli(tmp_path, capsys):
  root = write_lr_sweep(tmp_path / 'lr')
  assert main(['compare', str(root), '--x', 'optim.learning_rate',
               '--metric', 'best_eval.loss', '--curves', 'loss', 'diag/attn_logit_max']) == 0
  out = capsys.readouterr().out
  assert 'LR sensitivity' in out and '| `norm_position=post` |' in out
  for name in ('best_eval.loss_vs_optim.learning_rate.png', 'curve_loss.png',
               'curve_diag_attn_logit_max.png', 'lr_curves.md', 'lr_curves.csv'):
    assert (root / name).exists() and name in out
  assert (root / 'curve_loss.png').read_bytes()[:8] == PNG_MAGIC


def test_x_errors(tmp_path, capsys):
  root = write_lr_sweep(tmp_path / 'lr')
  with pytest.raises(ConfigError, match='every run has the same value.*learning_rate'):
    run([str(root)], x='model.d_model')  # numeric, but never varies
  with pytest.raises(ConfigError, match='no run'):
    run([str(root)], x='optim.learning_rat')
  with pytest.raises(ConfigError, match='not numeric'):
    run([str(root)], x='model.norm_position')
  with pytest.raises(ConfigError, match='need a loss'):
    run([str(root)], x='optim.learning_rate', metric='eval.accuracy')
  assert not (root / 'lr_curves.md').exists()
  assert main(['compare', str(root), '--x', 'train.steps']) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and '--x train.steps' in err


def test_curves_unknown_key_names_logged_keys(tmp_path):
  root = write_lr_sweep(tmp_path / 'lr')
  with pytest.raises(ConfigError, match='diag/attn_logit_max, eval/loss, grad_norm, loss'):
    run([str(root)], curves=['diag/log_z_mean'])
  r = run([str(root)], curves=['grad_norm'])
  assert root / 'curve_grad_norm.png' in r.files and r.lr is None
