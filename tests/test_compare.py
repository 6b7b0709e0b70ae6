"""tx compare: statistics against hand computations and scipy, tables, CSV, plots, grouping.

Run directories are written by hand (config.json + summary.json + metrics.jsonl), so these
tests train nothing.
"""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from tx.cli import main
from tx.compare import stats
from tx.compare.cli import compare
from tx.config.base import ConfigError, override, to_dict
from tx.config.experiment import ExperimentConfig

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'
# Final eval losses per variant and seed: rope is well separated from the baseline,
# alibi overlaps it.
LOSSES = {'position=sinusoidal': [2.0, 2.1, 2.2],
          'position=rope': [1.5, 1.6, 1.55],
          'position=alibi': [2.05, 2.25, 1.95]}


# ----------------------------------------------------------------------------- stats

def test_mean_and_sample_std():
  xs = [2, 4, 4, 4, 5, 5, 7, 9]
  s = stats.summarize(xs)
  assert (s.n, s.mean, s.min, s.max) == (8, 5.0, 2.0, 9.0)
  assert s.std == pytest.approx(math.sqrt(32 / 7))  # ddof = 1
  assert stats.std([3.0]) is None


def test_welch_interval_by_hand():
  # Equal sizes and variances: df = 2n - 2 = 4, se = sqrt(1/3 + 1/3), t(0.975, 4) = 2.776445.
  ci = stats.welch_interval([1, 2, 3], [4, 5, 6])
  half = 2.7764451051977987 * math.sqrt(2 / 3)
  assert ci.diff == -3
  assert ci.df == pytest.approx(4)
  assert (ci.low, ci.high) == (pytest.approx(-3 - half), pytest.approx(-3 + half))
  assert ci.excludes_zero


def test_welch_interval_matches_scipy():
  from scipy import stats as sps
  a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0, 10.0]
  ci = stats.welch_interval(a, b)
  ref = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
  assert (ci.low, ci.high) == (pytest.approx(ref.low), pytest.approx(ref.high))
  va, vb = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 5  # Welch-Satterthwaite by hand
  assert ci.df == pytest.approx((va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 4))


def test_ratio_interval_is_a_t_interval_on_the_logs():
  from scipy import stats as sps
  ratios = [0.84, 1.08, 0.92, 0.95, 0.89]
  ci = stats.ratio_interval(ratios)
  logs = [math.log(r) for r in ratios]
  ref = sps.ttest_1samp(logs, 0.0).confidence_interval(0.95)
  assert ci.diff == pytest.approx(math.prod(ratios) ** (1 / 5))  # the geometric mean
  assert (ci.low, ci.high) == (pytest.approx(math.exp(ref.low)), pytest.approx(math.exp(ref.high)))
  assert ci.df == 4
  even = stats.ratio_interval([0.8, 1.25])  # as far below 1 as above it
  assert even.diff == pytest.approx(1.0) and even.low * even.high == pytest.approx(1.0)
  assert stats.ratio_interval([1.1, 1.1, 1.1]).low == pytest.approx(1.1)  # no spread: a point
  assert stats.ratio_interval([0.9]) is None  # one round: no interval
  with pytest.raises(ValueError, match='positive'):
    stats.ratio_interval([1.0, 0.0])


def test_interval_excludes_zero_only_for_separated_samples():
  assert stats.welch_interval(LOSSES['position=rope'], LOSSES['position=sinusoidal']).excludes_zero
  overlap = stats.welch_interval(LOSSES['position=alibi'], LOSSES['position=sinusoidal'])
  assert overlap.low < 0 < overlap.high and not overlap.excludes_zero
  assert stats.welch_interval([1.0], [1.0, 2.0]) is None  # one seed: no interval


# ----------------------------------------------------------------------------- fake runs

def write_run(path: Path, *, experiment='lm_fake', overrides=None, loss=2.0, best=None,
              params=1000, tokens_per_s=500.0, wall=60.0, extrapolation=None, seed=0,
              steps=(10, 20, 30)):
  """A finished run directory as `tx train` leaves it (what compare reads)."""
  path.mkdir(parents=True, exist_ok=True)
  cfg = override(ExperimentConfig(name=experiment), {**(overrides or {}), 'train.seed': seed})
  (path / 'config.json').write_text(json.dumps(to_dict(cfg)))
  ev = {'loss': loss, 'perplexity': math.exp(loss), 'accuracy': 1 / loss,
        'bits_per_byte': loss / math.log(2)}
  if extrapolation:
    ev['extrapolation'] = {str(k): v for k, v in extrapolation.items()}
  summary = {'experiment': experiment, 'params': params, 'steps': steps[-1],
             'wall_time_s': wall, 'compile_time_s': 1.0, 'tokens_per_s': tokens_per_s,
             'eval': ev, 'best_eval': {'loss': loss if best is None else best, 'step': steps[-1]}}
  (path / 'summary.json').write_text(json.dumps(summary))
  rows = []
  for i, step in enumerate(steps):
    rows.append({'step': step, 'time': 1000.0 + 10 * i, 'loss': loss + 1})
    rows.append({'step': step, 'time': 1000.0 + 10 * i + 1,
                 'eval/loss': loss + (len(steps) - 1 - i) * 0.5})
  (path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in rows))


def write_sweep(root: Path, losses=LOSSES, failed=None, extrapolation=True) -> Path:
  runs = []
  for variant, values in losses.items():
    position = variant.split('=')[1]
    for k, loss in enumerate(values):
      rel = f'{variant}/seed_{k}'
      entry = {'variant': variant, 'seed': k, 'dir': rel,
               'overrides': {'model.position': position, 'train.seed': k}}
      if failed and (variant, k) == failed:
        entry['error'] = 'step 7: non-finite loss'
        runs.append(entry)
        continue
      runs.append(entry)
      table = {64: math.exp(loss), 128: math.exp(loss) * (1 + k / 10), 256: math.exp(2 * loss)}
      write_run(root / rel, overrides={'model.position': position}, loss=loss, best=loss - 0.1,
                seed=k, extrapolation=table if extrapolation else None,
                tokens_per_s=100.0 * (k + 1), params=5000)
  (root / 'sweep.json').write_text(json.dumps({
      'name': 'fake_positions', 'base': 'lm_fake', 'description': 'positions, fake numbers',
      'axes': {'axis': 'model.position', 'values': ['sinusoidal', 'rope', 'alibi']},
      'seeds': [0, 1, 2], 'baseline': 'position=sinusoidal',
      'variants': [{'name': v, 'overrides': {'model.position': v.split('=')[1]}}
                   for v in losses], 'runs': runs}))
  return root


@pytest.fixture
def sweep_dir(tmp_path):
  return write_sweep(tmp_path / 'sweep')


# ----------------------------------------------------------------------------- table

def test_table_numbers_equal_hand_computation(sweep_dir):
  t, text, _ = compare([str(sweep_dir)])
  rows = {r.variant: r for r in t.rows}
  assert [r.variant for r in t.rows] == list(LOSSES)
  assert t.baseline == 'position=sinusoidal' and t.metric == 'eval.loss'
  base = LOSSES['position=sinusoidal']
  for variant, xs in LOSSES.items():
    r = rows[variant]
    assert r.n == 3
    assert r.metric.mean == pytest.approx(sum(xs) / 3)
    assert r.metric.std == pytest.approx(np.std(xs, ddof=1))
    assert r.best.mean == pytest.approx(sum(xs) / 3 - 0.1)
    assert r.params == 5000 and r.tokens_per_s == pytest.approx(200.0)
    if variant != t.baseline:
      va, vb = np.var(xs, ddof=1) / 3, np.var(base, ddof=1) / 3
      df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
      from scipy import stats as sps
      half = sps.t.ppf(0.975, df) * math.sqrt(va + vb)
      diff = np.mean(xs) - np.mean(base)
      assert r.diff == pytest.approx(diff)
      assert (r.interval.low, r.interval.high) == (pytest.approx(diff - half),
                                                   pytest.approx(diff + half))
  assert rows['position=rope'].verdict == 'better'
  assert rows['position=alibi'].verdict == 'within noise'
  assert rows['position=sinusoidal'].verdict == 'baseline'
  lines = {line.split('|')[1].strip(): line for line in text.splitlines() if line.startswith('| `')}
  assert lines['`position=rope`'].count(' *') == 1
  assert ' *' not in lines['`position=alibi`']
  assert '±' in lines['`position=rope`'] and not any('n/a' in line for line in lines.values())


def test_markdown_and_csv_written(sweep_dir):
  compare([str(sweep_dir)])
  md = (sweep_dir / 'compare.md').read_text()
  assert md.startswith('# Sweep fake_positions (base lm_fake)')
  assert '![eval_loss_vs_step](eval_loss_vs_step.png)' in md
  with open(sweep_dir / 'compare.csv') as f:
    rows = {r['variant']: r for r in csv.DictReader(f)}
  assert set(rows) == set(LOSSES)
  rope = rows['position=rope']
  assert float(rope['eval.loss_mean']) == pytest.approx(np.mean(LOSSES['position=rope']))
  assert float(rope['eval.loss_std']) == pytest.approx(np.std(LOSSES['position=rope'], ddof=1))
  assert rope['excludes_zero'] == 'True' and rope['verdict'] == 'better'
  assert rows['position=sinusoidal']['ci_low'] == ''  # the baseline has no interval


def test_png_plots_are_valid(sweep_dir):
  import matplotlib.image as mpimg
  _, _, files = compare([str(sweep_dir)])
  names = {f.name for f in files}
  assert {'eval_loss_vs_step.png', 'eval_loss_vs_time.png', 'extrapolation.png'} <= names
  for name in ('eval_loss_vs_step.png', 'eval_loss_vs_time.png', 'extrapolation.png'):
    path = sweep_dir / name
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = mpimg.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_no_extrapolation_plot_without_extrapolation(tmp_path):
  root = write_sweep(tmp_path / 's', extrapolation=False)
  _, _, files = compare([str(root)])
  assert 'extrapolation.png' not in {f.name for f in files}


def test_other_metrics_and_direction(sweep_dir):
  t, _, _ = compare([str(sweep_dir)], metric='eval.extrapolation.256')
  rope = next(r for r in t.rows if r.variant == 'position=rope')
  assert rope.metric.mean == pytest.approx(np.mean(np.exp(2 * np.array(LOSSES['position=rope']))))
  assert t.best_metric == 'best_eval.extrapolation.256' and rope.best is None
  t, _, _ = compare([str(sweep_dir)], metric='accuracy')  # bare name = eval.accuracy
  assert t.metric == 'eval.accuracy' and t.higher_is_better
  assert next(r for r in t.rows if r.variant == 'position=rope').verdict == 'better'
  with pytest.raises(ConfigError, match='eval.bits_per_byte'):
    compare([str(sweep_dir)], metric='eval.bleu')


def test_baseline_choice(sweep_dir):
  t, _, _ = compare([str(sweep_dir)], baseline='rope')  # a unique substring
  assert t.baseline == 'position=rope'
  assert next(r for r in t.rows if r.variant == 'position=sinusoidal').verdict == 'worse'
  with pytest.raises(ConfigError, match='matches no variant'):
    compare([str(sweep_dir)], baseline='t5')
  with pytest.raises(ConfigError, match='several'):
    compare([str(sweep_dir)], baseline='i')


def test_one_seed_and_failed_runs(tmp_path):
  root = write_sweep(tmp_path / 's', losses={'position=sinusoidal': [2.0, 2.1],
                                             'position=rope': [1.5, 1.4]},
                     failed=('position=rope', 1))
  t, text, _ = compare([str(root)])
  rope = next(r for r in t.rows if r.variant == 'position=rope')
  assert (rope.n, rope.planned, rope.failed) == (1, 2, 1)
  assert rope.interval is None and rope.verdict == 'n/a (1 seed)'
  assert '1/2 (1 failed)' in text and '(CI n/a)' in text
  assert 'non-finite loss' in text


def test_grouping_without_sweep_json(tmp_path):
  for position, losses in (('rope', [1.5, 1.6]), ('alibi', [1.9, 2.0])):
    for seed, loss in enumerate(losses):
      write_run(tmp_path / 'runs' / f'{position}{seed}', overrides={'model.position': position},
                loss=loss, seed=seed)
  t, _, files = compare([str(tmp_path / 'runs')], baseline='position=alibi')
  rows = {r.variant: r for r in t.rows}
  assert set(rows) == {'position=rope', 'position=alibi'}  # seeds grouped, names as in sweeps
  assert rows['position=rope'].n == 2
  assert rows['position=rope'].metric.mean == pytest.approx(1.55)
  assert rows['position=rope'].verdict == 'better'
  assert (tmp_path / 'runs' / 'compare.md').exists() and all(f.exists() for f in files)


def test_grouping_several_experiments_and_dirs(tmp_path):
  write_run(tmp_path / 'a' / 'r0', experiment='lm_a', loss=1.0, seed=0)
  write_run(tmp_path / 'a' / 'r1', experiment='lm_a', loss=1.2, seed=1)
  write_run(tmp_path / 'b' / 'r0', experiment='lm_b', overrides={'model.ffn': 'relu'}, loss=2.0)
  write_run(tmp_path / 'b' / 'r1', experiment='lm_b', overrides={'model.ffn': 'swiglu'}, loss=2.5)
  t, _, _ = compare([str(tmp_path / 'a'), str(tmp_path / 'b')], out=str(tmp_path / 'out'))
  assert [r.variant for r in t.rows] == ['lm_a', 'lm_b:ffn=relu', 'lm_b:ffn=swiglu']
  assert t.rows[0].n == 2
  assert (tmp_path / 'out' / 'compare.csv').exists()


def test_cli_prints_table_and_errors_in_one_line(sweep_dir, tmp_path, capsys):
  assert main(['compare', str(sweep_dir), '--metric', 'eval.bits_per_byte']) == 0
  out = capsys.readouterr().out
  assert '| `position=rope` |' in out and 'eval.bits_per_byte' in out and 'compare.md' in out
  empty = tmp_path / 'empty'
  (empty / 'sub').mkdir(parents=True)
  assert main(['compare', str(empty)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and 'no runs found' in err
  assert main(['compare', str(tmp_path / 'missing')]) == 2
  assert 'no such directory' in capsys.readouterr().err
