"""`tx bench`: the report's arithmetic, one real side-by-side run, scan keeps compiles flat."""

import json
import math
import os

import jax
import pytest

from tx import cli
from tx.bench import cases, host, report, suite, torch_peers, tuned, tx_side, worker
from tx.compare import stats
from tx.config.base import ConfigError
from tx.timing import (calls_per_sample, process_usage, resident_bytes, sample_seconds,
                       usage_per_step, warm_until_steady)


def _doc(tx_tokens, peer_tokens, tx_rss, peer_rss, step_s=2.0, flops=100e9, ceiling=100e9):
  train = lambda tokens, rss, s: {'tokens_per_s': tokens, 'step_time_s': s, 'peak_rss_bytes': rss,
                                  'flops_per_step': flops, 'compile_s': 1.0, 'first_step_s': 1.0}
  doc = {'ceiling': {'float32': ceiling, 'bfloat16': ceiling / 2}, 'cases': {
      'gpt_6l': {'spec': {'family': 'decoder'}, 'tx_train': train(tx_tokens, tx_rss, step_s),
                 'peer_train': train(peer_tokens, peer_rss, 2 * step_s),
                 'tx_decode_b1': {'new_tokens_per_s': 300.0},
                 'peer_decode_b1': {'new_tokens_per_s': 100.0}},
      'compile_2l': {'spec': {}, 'tx_compile': {'compile_s': 10.0}},
      'compile_24l': {'spec': {}, 'tx_compile': {'compile_s': 14.0}},
      'broken': {'spec': {}, 'error': 'boom'}}}
  doc['rows'] = report.rows(doc)
  doc['targets'] = report.targets(doc)
  return doc


def test_report_ratios_mfu_and_targets():
  doc = _doc(tx_tokens=2000.0, peer_tokens=1000.0, tx_rss=3e9, peer_rss=10e9)
  by = {(r['case'], r['metric']): r for r in doc['rows']}
  assert by['gpt_6l', 'train tokens/s']['ratio'] == pytest.approx(2.0)
  assert by['gpt_6l', 'train peak RSS GB']['ratio'] == pytest.approx(0.3)
  # 100 GFLOP per step in 2 s against a 100 GFLOP/s ceiling; the peer takes 4 s.
  assert by['gpt_6l', 'train MFU']['tx'] == pytest.approx(0.5)
  assert by['gpt_6l', 'train MFU']['peer'] == pytest.approx(0.25)
  assert by['compile_24l', 'compile s / 2-layer']['tx'] == pytest.approx(1.4)
  met = {t['target']: t['met'] for t in doc['targets']}
  assert met['decoder train tokens/s >= 1.5x peer (6L)'] is True
  assert met['decoder train tokens/s >= 1.0x peer (6L, float32)'] is True
  assert met['decoder train tokens/s >= 1.0x peer (baby, float32)'] is None  # not measured
  assert met['train peak memory <= 0.6x peer (6L)'] is True
  assert met['cached decode >= 2x generate (batch 1)'] is True
  assert met['cached decode >= 2x generate (batch 8)'] is None  # not measured
  assert met['24-layer scanned compile <= 1.3x 2-layer'] is False
  assert met['MFU of the 6-layer model >= 55% (float32)'] is False
  text = report.table(dict(doc, machine={'processor': 'cpu', 'platform': 'x', 'cpu_count': 2,
                                         'threads': 2, 'jax': '0'}))
  assert 'MISSED' in text and 'broken' in text and 'FAILED: boom' in text


def test_a_value_that_missed_its_bound_never_prints_as_the_bound():
  assert report._target_value(0.347, 0.35) == '0.347'
  assert report._target_value(0.3499, 0.35) == '0.3499'
  assert report._target_value(1.33, 1.0) == '1.33' and report._target_value(1.0, 1.0) == '1.00'


def test_the_own_ceiling_row_names_the_gemm_it_was_timed_on():
  """XLA's dot and torch's mm differ by up to 40 % on one host (NOTES attempt 89), so the
  row says which one an MFU was divided by; a result without the key timed XLA's."""
  doc = _doc(tx_tokens=2000.0, peer_tokens=1000.0, tx_rss=3e9, peer_rss=10e9)
  train = doc['cases']['gpt_6l']['tx_train']
  for kernel, name in ((None, 'XLA dot'), ('xla', 'XLA dot'), ('torch', 'torch mm')):
    own = dict(train, own_ceiling_flops=200e9, **({'own_ceiling_kernel': kernel} if kernel else {}))
    case = dict(doc['cases']['gpt_6l'], tx_train=own)
    by = {(r['case'], r['metric']): r for r in report.rows(dict(doc, cases={'gpt_6l': case}))}
    assert by['gpt_6l', f'train MFU (own {name} ceiling)']['tx'] == pytest.approx(0.25)
    assert not [m for c, m in by if '(own ' in m and name not in m]


def test_report_flags_a_slower_tx():
  doc = _doc(tx_tokens=1000.0, peer_tokens=1000.0, tx_rss=9e9, peer_rss=10e9)
  met = {t['target']: t['met'] for t in doc['targets']}
  assert met['decoder train tokens/s >= 1.5x peer (6L)'] is False
  assert met['train peak memory <= 0.6x peer (6L)'] is False


def test_the_encoder_is_held_to_the_float32_floor_and_gets_the_arithmetic():
  doc = _doc(tx_tokens=2000.0, peer_tokens=1000.0, tx_rss=3e9, peer_rss=10e9)
  train = lambda tokens, s: {'tokens_per_s': tokens, 'step_time_s': s, 'peak_rss_bytes': 1e9,
                             'flops_per_step': 100e9, 'compile_s': 1.0, 'first_step_s': 1.0}
  doc['cases']['bert_6l'] = {'spec': {'family': 'encoder'}, 'tx_train': train(900.0, 2.0),
                             'peer_train': train(1000.0, 1.8)}
  doc['peer_ceiling'] = {'float32': 120e9, 'bfloat16': 60e9}
  doc['rows'] = report.rows(doc)
  met = {t['target']: t['met'] for t in report.targets(doc)}
  assert met['encoder train tokens/s >= 1.0x peer (6L, float32)'] is False  # 0.9x
  lines = [l for l in report.ceiling_arithmetic(doc) if l.startswith('bert_6l')]
  # the peer: 100 GFLOP in 1.8 s = 55.6 GFLOP/s; 1.5x = 83 of XLA's 100 -> 83 %
  assert len(lines) == 1 and '83%' in lines[0] and 'under the ceiling' in lines[0]
  # the suite times the 6-layer encoder's own products too
  assert [g[0] for g in cases.gemm_cases(cases.SUITE)['bert_6l']] == [
      g[0] for g in cases.step_gemms(dict(cases.SUITE[0].spec))]


def test_side_by_side_run_measures_tx_and_the_peer():
  """One tiny case through the real machinery: separate processes, ceilings, peer, ratios."""
  peers = suite.torch_available()
  spec = dict(cases.QUICK[1].spec)
  case = cases.Case('gpt_6l', spec, kinds=('train', 'decode'), decode_batches=(1,))
  doc = suite.run([case], peers=peers, ceiling_n=256, say=lambda m: None,
                  ablate_attention=True)
  got = doc['cases']['gpt_6l']
  assert 'error' not in got, got
  assert got['tx_train']['tokens_per_s'] > 0 and got['tx_train']['peak_rss_bytes'] > 1e7
  for side in ('tx', 'peer') if peers else ('tx',):  # both warm up until steady (>= 2 calls)
    assert got[f'{side}_train']['warmup_calls'] >= max(spec['warmup'] - 1, 2), side
  for side in ('tx', 'peer') if peers else ('tx',):  # CPU time and faults per timed step
    # (>= 0 only: a toy step can finish inside one accounting tick; the mmap test below
    # checks that fresh memory does show up)
    usage = got[f'{side}_train']
    assert all(usage[f'{k}_per_step'] >= 0 for k in ('user_s', 'system_s', 'minor_faults')), side
  for side in ('tx', 'peer') if peers else ('tx',):  # the stand-in changed each side's model
    assert got[f'{side}_train_ablated']['loss'] != got[f'{side}_train']['loss'], side
  assert got['tx_decode_b1']['generated_tokens'] == spec['new']
  assert len(doc['ceilings']) == 2 and doc['ceiling']['float32'] > 0
  by = {(r['case'], r['metric']): r for r in doc['rows']}
  mfu = by['gpt_6l', 'train MFU']['tx']
  assert 0 < mfu < 1.5  # a ceiling far off the step's FLOP rate would show here
  sides = ('tx', 'peer') if peers else ('tx',)
  for side in sides:  # each of the step's products timed alone, per dtype (torch's bf16
    # only where the host has bf16 arithmetic: it emulates it elsewhere)
    dtypes = ('float32', 'bfloat16') if side == 'tx' or report.has_bf16_arithmetic(
        doc) is not False else ('float32',)
    rates = doc['gemms'][side]
    assert list(rates) == [f'gpt_6l: {g[0]}' for g in cases.step_gemms(spec)], rates
    assert all(tuple(r) == dtypes and all(r[d] > 0 for d in dtypes) for r in rates.values())
    times = doc['attention'][side]  # and its self-attention, forward + backward
    assert list(times) == ['gpt_6l'] and tuple(times['gpt_6l']) == dtypes
    assert all(times['gpt_6l'][d] > 0 for d in dtypes)
  assert doc['step_attention']['gpt_6l'] == list(cases.step_attention(spec))
  assert by['gpt_6l', 'train system s/step']['tx'] >= 0
  # MFU against a matmul timed inside tx's own training process, beside the run's ceilings
  own = got['tx_train']['own_ceiling_flops']
  assert own > 0 and by['gpt_6l', 'train MFU (own XLA dot ceiling)']['tx'] == pytest.approx(
      got['tx_train']['model_flops_per_s'] / own)
  if peers:
    assert got['peer_decode_b1']['generated_tokens'] == spec['new']
    assert by['gpt_6l', 'train tokens/s']['ratio'] > 0
  json.dumps(doc)  # the document is JSON


@pytest.mark.parametrize('argv, says', [
    (['bench', '--only', 'nosuch'], 'matches no case'),
    (['bench', '--json', '/nonexistent/dir/x.json'], 'directory does not exist'),
    (['bench', '--threads', '0'], '--threads must be >= 1'),
    (['bench', '--rounds', '0'], '--rounds must be >= 1'),
    (['bench', '--peer-compile', '--no-peers'], 'drop --no-peers'),
    (['bench', '--tune', '--platform', 'gpu'], 'CPU suite only'),
])
def test_bench_user_errors_are_one_line(argv, says, capsys):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and says in err[0]


def test_rounds_alternate_the_sides_and_report_each_sides_median_run(monkeypatch):
  """--rounds N --order tx-first: tx, peer, tx, peer ... per measurement; each side's median
  run is the one reported, every round's number is kept, and the paired ratios give the
  spread."""
  calls, tokens = [], {'tx': iter([300.0, 100.0, 200.0, 90.0, 30.0, 60.0]),
                       'peer': iter([100.0, 100.0, 160.0, 40.0, 20.0, 25.0])}

  def fake_run(target, spec, *, threads, platform):
    side = 'tx' if target.startswith(suite.TX) else 'peer'
    calls.append((side, target.split(':')[1], spec.get('batch')))
    value = next(tokens[side])
    return ({'tokens_per_s': value, 'step_time_s': 1 / value} if 'train' in target
            else {'new_tokens_per_s': value})

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  case = cases.Case('gpt_6l', dict(cases.QUICK[1].spec, batch=4), kinds=('train', 'decode'),
                    decode_batches=(1,))
  got = suite._measure_case(case, peers=True, threads=2, say=lambda m: None, rounds=3,
                            order='tx-first')
  assert [c[0] for c in calls] == ['tx', 'peer'] * 6  # side by side, round after round
  assert [c[1] for c in calls[:6]] == ['train', 'gpt2_train'] * 3
  assert got['tx_train_rounds'] == [300.0, 100.0, 200.0]
  assert got['peer_train_rounds'] == [100.0, 100.0, 160.0]
  assert got['tx_train']['tokens_per_s'] == 200.0 and got['peer_train']['tokens_per_s'] == 100.0
  assert got['tx_decode_b1']['new_tokens_per_s'] == 60.0  # of 90, 30, 60
  assert {c[2] for c in calls[6:]} == {1}
  doc = {'ceiling': {'float32': 1e12, 'bfloat16': 1e12}, 'rounds': 3, 'cases': {
      'gpt_6l': dict(got, tx_train=dict(got['tx_train'], flops_per_step=1.0, peak_rss_bytes=1.0,
                                        compile_s=1.0),
                     peer_train=dict(got['peer_train'], peak_rss_bytes=1.0, first_step_s=1.0))}}
  doc['rows'] = report.rows(doc)
  row = next(r for r in doc['rows'] if r['metric'] == 'train tokens/s')
  assert row['ratio'] == pytest.approx(2.0)  # the medians: 200 / 100
  assert row['ratio_rounds'] == pytest.approx([3.0, 1.0, 1.25])
  doc['targets'] = report.targets(doc)
  target = next(t for t in doc['targets'] if t['target'].endswith('(6L)')
                and 'train tokens/s' in t['target'])
  assert (target['met'], target['rounds'], target['rounds_met']) == (True, 3, 1)
  floor = next(t for t in doc['targets'] if t['target'].endswith('(6L, float32)')
               and t['target'].startswith('decoder'))
  assert (floor['met'], floor['rounds'], floor['rounds_met']) == (True, 3, 3)
  text = report.table(dict(doc, machine={'processor': 'cpu', 'platform': 'x', 'cpu_count': 2,
                                         'threads': 2, 'jax': '0'}))
  assert 'gpt_6l decode b1 tokens/s: tx 30.0-90.0, peer 20.0-40.0, tx/peer 1.50-2.40x' in text
  # the paired rounds' geometric mean with its t-interval (the logs' by hand: scipy's
  # ttest_1samp on log 3, log 1, log 1.25 gives 0.367-6.574)
  assert row['ratio_interval'] == pytest.approx([3.75 ** (1 / 3), 0.36717, 6.57381], rel=1e-4)
  assert ('gpt_6l train tokens/s: tx 100-300, peer 100-160, tx/peer 1.00-3.00x, geometric mean '
          '1.55x (95 % interval 0.37-6.57x)') in text
  assert ('decoder train tokens/s >= 1.5x peer (6L): 2.00 (>= 1.5, held in 1 of 3 rounds; '
          'geometric mean 1.55x (95 % interval 0.37-6.57x, either side of 1.5))') in text


def test_the_default_order_puts_each_side_first_in_every_second_round(monkeypatch):
  """--rounds N (order 'alternate'): tx, peer, peer, tx, tx, peer ..., each round's pair kept
  together, which side ran first recorded, and the ratio's geometric mean given apart for
  the rounds each side ran first (an order effect shows as two different means)."""
  calls, tokens = [], {'tx': iter([100.0, 120.0, 110.0, 130.0]),
                       'peer': iter([100.0, 100.0, 100.0, 100.0])}

  def fake_run(target, spec, *, threads, platform):
    side = 'tx' if target.startswith(suite.TX) else 'peer'
    calls.append(side)
    value = next(tokens[side])
    return {'tokens_per_s': value, 'step_time_s': 1 / value}

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  case = cases.Case('bert_6l', dict(cases.QUICK[1].spec, family='encoder'), kinds=('train',))
  got = suite._measure_case(case, peers=True, threads=2, say=lambda m: None, rounds=4)
  assert calls == ['tx', 'peer', 'peer', 'tx', 'tx', 'peer', 'peer', 'tx']
  assert got['train_first_rounds'] == ['tx', 'peer', 'tx', 'peer']
  assert got['tx_train_rounds'] == [100.0, 120.0, 110.0, 130.0]
  assert [suite.first_side(i, 'tx-first') for i in range(3)] == ['tx'] * 3
  with pytest.raises(ValueError, match='one of alternate, tx-first'):
    suite.first_side(0, 'peer-first')
  train = {'flops_per_step': 1.0, 'peak_rss_bytes': 1.0, 'compile_s': 1.0, 'first_step_s': 1.0}
  doc = {'ceiling': {'float32': 1e12, 'bfloat16': 1e12}, 'rounds': 4, 'order': 'alternate',
         'cases': {'bert_6l': dict(got, tx_train=dict(got['tx_train'], **train),
                                   peer_train=dict(got['peer_train'], **train))}}
  doc['rows'] = report.rows(doc)
  row = next(r for r in doc['rows'] if r['metric'] == 'train tokens/s')
  assert row['first_rounds'] == ['tx', 'peer', 'tx', 'peer']
  for side, ratios in (('tx', [1.0, 1.1]), ('peer', [1.2, 1.3])):
    want = stats.ratio_interval(ratios)
    assert row['order_intervals'][side] == pytest.approx([want.diff, want.low, want.high])
  line = next(l for l in report.rounds_lines(doc) if l.startswith('bert_6l train tokens/s'))
  assert 'tx first 1.05x (95 % interval' in line and 'peer first 1.25x (95 % interval' in line
  # the order effect: the two geometric means' ratio, sqrt(1.1) / sqrt(1.56), with the Welch
  # interval of the logs (scipy's ttest_ind(equal_var=False) on them: -0.4503 to 0.1009)
  assert row['order_effect'] == pytest.approx([0.83972, 0.63746, 1.10615], rel=1e-4)
  assert ('order effect (tx first / peer first) 0.84x (95 % interval 0.64-1.11x, either side '
          'of 1.0)') in line
  doc['targets'] = report.targets(doc)
  text = report.table(dict(doc, machine={'processor': 'cpu', 'platform': 'x', 'cpu_count': 2,
                                         'threads': 2, 'jax': '0'}))
  assert 'Over 4 rounds, tx and the peer in turn, each first in every second round' in text
  # a side that ran first in one round only: no interval of its own
  assert 'order_intervals' not in report._intervals([1.0, 1.1, 1.2], ['tx', 'tx', 'peer'])


def _pooled_ratio_module():
  """benchmarks/pooled_ratio.py, a script outside the package, as a module."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  path = os.path.join(os.path.dirname(__file__), '..', '..', 'benchmarks', 'pooled_ratio.py')
  module_spec = importlib.util.spec_from_file_location('pooled_ratio', path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module


def test_pooled_rounds_split_by_the_side_that_ran_first(tmp_path, capsys):
  """benchmarks/pooled_ratio.py --by-order: runs that recorded no order ran tx first."""
  pooled_ratio = _pooled_ratio_module()
  row = {'case': 'bert_6l', 'metric': 'train tokens/s', 'ratio_rounds': [0.9, 1.0, 0.8, 1.1]}
  new = {'rows': [dict(row, first_rounds=['tx', 'peer', 'tx', 'peer'])],
         'cases': {'bert_6l': {'spec': {}}}}
  old = {'rows': [dict(row, ratio_rounds=[0.7, 0.75])], 'cases': {'bert_6l': {'spec': {}}}}
  sweep = {'case': 'bert_6l', 'tx': {}, 'runs': {'1024': [
      {'tx': {'tokens_per_s': 2.0}, 'peer': {'tokens_per_s': 1.0}, 'first': 'peer'}]}}
  files = []
  for name, doc in (('new', new), ('old', old), ('sweep', sweep)):
    files.append(str(tmp_path / f'{name}.json'))
    with open(files[-1], 'w', encoding='utf-8') as f:
      json.dump(doc, f)
  split = pooled_ratio.pooled(files, by_order=True)
  assert split['bert_6l', 'train tokens/s', 'defaults, tx first']['ratios'] == [0.9, 0.8, 0.7,
                                                                                 0.75]
  assert split['bert_6l', 'train tokens/s', 'defaults, peer first']['ratios'] == [1.0, 1.1]
  assert split['bert_6l d1024', 'train tokens/s', 'defaults, peer first']['ratios'] == [2.0]
  together = pooled_ratio.pooled(files)
  assert together['bert_6l', 'train tokens/s', 'defaults']['ratios'] == [0.9, 1.0, 0.8, 1.1,
                                                                         0.7, 0.75]
  assert pooled_ratio.main(files[:2] + ['--by-order', '--case', 'bert_6l']) == 0
  printed = capsys.readouterr().out
  assert '[defaults, tx first]: 4 rounds from 2 runs' in printed
  assert '[defaults, peer first]: 2 rounds from 1 run,' in printed
  # the two groups' geometric means' ratio with its Welch interval (scipy's ttest_ind on the
  # logs, equal_var=False: 0.7476, 0.6028-0.9273): an order effect where it excludes 1
  assert ('bert_6l train tokens/s [defaults]: order effect (tx first / peer first) 0.748x, '
          '95 % interval 0.603-0.927x (all below 1.0)') in printed
  # over two runs or more, the runs as the draws too: each run's geometric mean
  runs = stats.ratio_interval([(0.9 * 0.8) ** 0.5, (0.7 * 0.75) ** 0.5])
  assert (f'; runs as draws {runs.diff:.3f}x, 95 % interval {runs.low:.3f}-{runs.high:.3f}x'
          in printed.splitlines()[1])


def test_pooled_decoding_rounds_ignore_the_runs_training_tune(tmp_path):
  """`tx bench --tune` tunes the training step only, so a tuned run's decoding rounds pool with
  an untuned run's; its training rounds stay apart under the tune's setting."""
  pooled_ratio = _pooled_ratio_module()
  tuned = {'choice': 'x', 'model_overrides': {'attention_impl': 'torch'},
           'train_overrides': {'steps_per_call': 4}, 'xla_flags': '--xla_cpu_use_onednn=true'}
  rows = [{'case': 'gpt_6l', 'metric': 'decode b8 tokens/s', 'ratio_rounds': [2.1, 1.9]},
          {'case': 'gpt_6l', 'metric': 'train tokens/s', 'ratio_rounds': [1.2, 1.1]}]
  files = []
  for name, case in (('tuned', {'spec': {}, 'tuned': tuned}), ('plain', {'spec': {}})):
    files.append(str(tmp_path / f'{name}.json'))
    with open(files[-1], 'w', encoding='utf-8') as f:
      json.dump({'rows': rows, 'cases': {'gpt_6l': case}}, f)
  groups = pooled_ratio.pooled(files)
  assert groups['gpt_6l', 'decode b8 tokens/s', 'defaults']['ratios'] == [2.1, 1.9, 2.1, 1.9]
  assert groups['gpt_6l', 'train tokens/s', 'defaults']['ratios'] == [1.2, 1.1]
  assert groups['gpt_6l', 'train tokens/s', 'attention_impl=torch steps_per_call=4 '
                '--xla_cpu_use_onednn=true']['ratios'] == [1.2, 1.1]


def test_pooled_rounds_say_how_many_draws_would_settle_an_interval_across_the_bound(capsys):
  """An interval either side of the bound: the least N whose t-interval at the same mean and
  spread of logs would exclude it; none for a mean at the bound."""
  pooled_ratio = _pooled_ratio_module()
  ratios = [1.3, 1.6, 1.4, 1.5]
  logs = [math.log(r) for r in ratios]
  gap, sd = abs(stats.mean(logs) - math.log(1.5)), stats.std(logs)
  half = lambda n: stats.t_quantile(0.975, n - 1) * sd / math.sqrt(n)
  n = pooled_ratio.draws_to_settle(ratios, 1.5)
  assert half(n) < gap <= half(n - 1) and n > len(ratios)
  assert pooled_ratio.draws_to_settle([0.9, 1.0 / 0.9], 1.0) is None  # geometric mean 1.0
  interval = stats.ratio_interval(ratios)
  assert f'~{n:,} rounds would settle it' in pooled_ratio._to_settle(ratios, interval, 1.5,
                                                                      'rounds')
  assert pooled_ratio._to_settle(ratios, interval, 1.0, 'rounds') == ''  # all above 1.0


def test_a_targets_interval_says_which_side_of_its_bound_it_lies():
  """A target is settled on a host only where the paired rounds' interval clears its bound."""
  assert report._interval([0.95, 0.91, 0.99], 1.0).endswith('0.91-0.99x, all below 1.0)')
  assert report._interval([1.07, 1.01, 1.14], 1.0).endswith('1.01-1.14x, all above 1.0)')
  assert report._interval([0.6, 0.55, 0.7], 0.6).endswith('either side of 0.6)')
  assert report._interval([0.95, 0.91, 0.99]) == '0.95x (95 % interval 0.91-0.99x)'


def test_a_specs_model_key_sets_tx_sides_model_fields_over_the_peers_architecture():
  """`model` in a spec (in-process A/Bs, benchmarks/step_ab.py) overrides the architecture
  copied from the peer on tx's side only; without it tx's model stays the peer's."""
  spec = dict(cases.QUICK[0].spec)
  assert tx_side.model_config(spec).ffn == 'gelu_tanh'
  changed = tx_side.model_config(dict(spec, model={'ffn': 'relu', 'norm': 'rmsnorm'}))
  assert (changed.ffn, changed.norm, changed.use_bias) == ('relu', 'rmsnorm', True)
  assert tx_side.model_config(dict(spec, model={'dtype': 'bfloat16'})).dtype == 'bfloat16'
  with pytest.raises(ValueError, match="'model': fnn not ModelConfig fields"):
    tx_side.model_config(dict(spec, model={'fnn': 'relu'}))


def test_ablate_attention_takes_effect_in_the_compiled_step_itself(monkeypatch):
  """`compiled_train_step` (what benchmarks/step_ab.py compiles its variants with) traces the
  stand-in under ablate_attention, not only `train`; without the key, tx's attention."""
  calls = []
  stand_in = tx_side.attention_stand_in
  monkeypatch.setattr(tx_side, 'attention_stand_in',
                      lambda *a, **k: calls.append(1) or stand_in(*a, **k))
  spec = dict(cases.QUICK[0].spec, layers=1)
  tx_side.compiled_train_step(spec)
  assert not calls
  tx_side.compiled_train_step(dict(spec, ablate_attention=True))
  assert calls


def _hlo_size(layers: int) -> int:
  spec = dict(cases.QUICK[0].spec, layers=layers, scan=True, batch=2)
  cfg = tx_side.experiment(spec)
  lowered = tx_side.lowered_train_step(cfg, spec)
  return len(lowered.as_text())


def test_scanned_layers_keep_the_program_size_flat():
  """What keeps a 24-layer compile near a 2-layer one: with model.scan_layers the lowered
  program does not grow with depth (unrolled, 24 layers lower to ~10x the 2-layer text)."""
  two, many = _hlo_size(2), _hlo_size(24)
  assert many <= 1.05 * two, (two, many)


def _bf16_doc(isa):
  doc = _doc(tx_tokens=2000.0, peer_tokens=1000.0, tx_rss=3e9, peer_rss=10e9)
  train = lambda tokens, s: {'tokens_per_s': tokens, 'step_time_s': s, 'peak_rss_bytes': 1e9,
                             'flops_per_step': 100e9, 'compile_s': 1.0, 'first_step_s': 1.0}
  doc['cases']['gpt_6l_bf16'] = {
      'spec': {'family': 'decoder', 'dtype': 'bfloat16', 'float32_case': 'gpt_6l'},
      'tx_train': train(3200.0, 1.25), 'peer_train': train(1600.0, 2.5)}
  doc['machine'] = {'processor': 'cpu', 'platform': 'x', 'cpu_count': 2, 'threads': 2,
                    'jax': '0', 'host': {'isa': isa}}
  doc['peer_ceiling'] = {'float32': 120e9, 'bfloat16': 60e9}
  doc['rows'] = report.rows(doc)
  doc['targets'] = report.targets(doc)
  return doc


def test_bf16_rows_targets_and_the_ceiling_arithmetic():
  doc = _bf16_doc({'avx512_bf16': True, 'amx_bf16': False})
  by = {(r['case'], r['metric']): r for r in doc['rows']}
  assert by['gpt_6l_bf16', 'bf16 / float32 tokens/s']['tx'] == pytest.approx(1.6)  # 3200/2000
  assert by['gpt_6l_bf16', 'bf16 / float32 tokens/s']['peer'] == pytest.approx(1.6)
  # 100 GFLOP in 1.25 s against the bf16 ceiling of 50 GFLOP/s
  assert by['gpt_6l_bf16', 'train MFU']['tx'] == pytest.approx(1.6)
  met = {t['target']: t['met'] for t in doc['targets']}
  assert met['bf16 train >= 1.5x tx float32 (6L)'] is True
  assert met['bf16 train tokens/s >= 1.0x peer in bf16 (6L)'] is True
  lines = report.ceiling_arithmetic(doc)
  # float32: the peer runs 100 GFLOP in 4 s = 25 GFLOP/s; 1.5x = 37.5 of XLA's 100 -> 38 %
  assert 'float32' in lines[0] and '38%' in lines[0] and 'under the ceiling' in lines[0]
  # bf16: 100 GFLOP in 2.5 s = 40 GFLOP/s; 1.5x = 60 of XLA's 50 -> 120 %
  assert '120%' in lines[1] and 'ruled out' in lines[1]
  assert 'GEMM ceilings and the 1.5x target' in report.table(doc)


def test_the_steps_own_gemms_bound_the_1_5x_target():
  doc = _bf16_doc({'avx512_bf16': True})
  # one product of 2·1000·1000·20000 = 40 GFLOP twice a step: 80 GFLOP of the step's 100
  doc['step_gemms'] = {'gpt_6l': [['ffn in, forward', 1000, 1000, 20000, 2]]}
  doc['gemms'] = {'tx': {'gpt_6l: ffn in, forward': {'float32': 40e9, 'bfloat16': 20e9}}}
  doc['cases']['gpt_6l']['tx_train']['step_time_s'] = 2.5  # slower than its products alone
  f32, bf16 = report.ceiling_arithmetic(doc)[1::2]
  # float32: 80 / 40 = 2 s of GEMMs, the other 20 GFLOP at the 100 GFLOP/s ceiling 0.2 s;
  # the peer's 4 s step / 1.5 = 2.67 s allowed, so 0.47 s are left for the rest
  assert '2.00 s' in f32 and '200.0 ms' in f32 and '2.20 s of the 2.67 s' in f32
  assert 'leaving 466.7 ms' in f32 and 'takes 300.0 ms now: within it already' in f32
  doc['cases']['gpt_6l']['tx_train']['step_time_s'] = 3.135  # the rest 935 ms: 2x too slow
  assert 'takes 935.0 ms now: 2.0x faster needed' in report.ceiling_arithmetic(doc)[1]
  # bf16: 80 / 20 = 4 s, more than the 2.5 / 1.5 = 1.67 s allowed, but tx's step takes
  # 1.25 s: its products ran faster in the step than alone, so these rates bound nothing
  assert '4.40 s of the 1.67 s' in bf16 and 'no bound' in bf16 and 'ruled out' not in bf16
  doc['cases']['gpt_6l_bf16']['tx_train']['step_time_s'] = 5.0
  bf16 = report.ceiling_arithmetic(doc)[3]
  assert '4.40 s of the 1.67 s' in bf16 and 'ruled out by the kernels' in bf16
  del doc['gemms']['tx']['gpt_6l: ffn in, forward']['bfloat16']  # not timed: no bound
  lines = report.ceiling_arithmetic(doc)
  assert len(lines) == 4 and "over tx's float32" in lines[-1]


def test_the_bound_takes_each_products_fastest_sample():
  """A bound on the time the kernels need holds only at their best rate: products timed at a
  slow moment (median 20 GFLOP/s, best 40) must not rule out a step the kernels allow."""
  doc = _bf16_doc({'avx512_bf16': True})
  doc['step_gemms'] = {'gpt_6l': [['ffn in, forward', 1000, 1000, 20000, 2]]}
  doc['gemms'] = {'tx': {'gpt_6l: ffn in, forward': {'float32': 20e9}}}
  doc['gemms_best'] = {'tx': {'gpt_6l: ffn in, forward': {'float32': 40e9}}}
  doc['cases']['gpt_6l']['tx_train']['step_time_s'] = 2.5
  f32 = report.ceiling_arithmetic(doc)[1]
  # 80 GFLOP at the best 40 GFLOP/s = 2 s (at the median's 20: 4 s, "ruled out")
  assert "XLA's best rates take 2.00 s" in f32 and 'leaving 466.7 ms' in f32, f32
  tuned = {'choice': 'onednn_dots', 'xla_flags': '--x=1', 'ceiling': {'float32': 100e9},
           'gemms': {'gpt_6l: ffn in, forward': {'float32': 20e9}},
           'gemms_best': {'gpt_6l: ffn in, forward': {'float32': 80e9}}}
  doc['cases']['gpt_6l']['tuned'] = tuned
  assert "tuned XLA's best rates take 1.00 s" in report.ceiling_arithmetic(doc)[1]
  del tuned['gemms_best'], doc['gemms_best']  # a JSON from before: the medians
  assert "tuned XLA's best rates take 4.00 s" in report.ceiling_arithmetic(doc)[1]


def test_a_tuned_step_is_bounded_by_xlas_rates_under_its_flags():
  """Where `tx tune`'s choice set XLA flags (oneDNN's dots), the arithmetic takes the
  ceiling and the products' rates timed under those flags, not the defaults'."""
  doc = _bf16_doc({'avx512_bf16': True})
  doc['step_gemms'] = {'gpt_6l': [['ffn in, forward', 1000, 1000, 20000, 2]]}
  doc['gemms'] = {'tx': {'gpt_6l: ffn in, forward': {'float32': 40e9, 'bfloat16': 20e9}}}
  doc['cases']['gpt_6l_bf16']['tuned'] = {
      'choice': 'onednn_dots', 'xla_flags': '--x=1', 'ceiling': {'bfloat16': 100e9},
      'gemms': {'gpt_6l: ffn in, forward': {'bfloat16': 80e9}}}
  lines = report.ceiling_arithmetic(doc)
  bf16, kernels = [l for l in lines if l.startswith('gpt_6l_bf16 (bfloat16)')][:2]
  # the peer's 40 GFLOP/s x 1.5 = 60 of the flags' 100 GFLOP/s ceiling (the defaults': 50)
  assert "XLA 50 (100 under `tx tune`'s flags)" in bf16
  assert "60% of tuned XLA's ceiling: under the ceiling" in bf16
  # 80 GFLOP at 80 GFLOP/s = 1 s, the other 20 at the flags' ceiling 200 ms, of 1.67 s
  assert "tuned XLA's best rates take 1.00 s" in kernels and '1.20 s of the 1.67 s' in kernels
  own = [l for l in lines if "over tx's float32" in l]
  assert "the faster bf16 GEMM, tuned XLA's, peaks at 100" in own[0]
  assert report.tuned_rates(doc['cases']['gpt_6l'], 'float32') is None


def test_the_tuned_ceiling_is_the_fastest_of_the_square_and_the_steps_own_products():
  """Under oneDNN's dot fusion the n^3 product can run slower than the step's own products:
  the 1.5x line then takes the fastest of them as the ceiling, not the n^3 product alone."""
  doc = _bf16_doc({'avx512_bf16': True})
  doc['cases']['gpt_6l_bf16']['tuned'] = {
      'choice': 'onednn_dots', 'xla_flags': '--x=1', 'ceiling': {'bfloat16': 50e9},
      'gemms': {'gpt_6l: ffn in, forward': {'bfloat16': 150e9, 'float32': 900e9}}}
  assert report.tuned_rates(doc['cases']['gpt_6l_bf16'], 'bfloat16')[0] == 150e9
  bf16 = next(l for l in report.ceiling_arithmetic(doc) if l.startswith('gpt_6l_bf16'))
  # the peer's 40 GFLOP/s x 1.5 = 60 of 150 (of the square's 50 alone: 120 %, ruled out)
  assert "(150 under `tx tune`'s flags)" in bf16
  assert "40% of tuned XLA's ceiling: under the ceiling" in bf16


def test_bench_times_the_steps_products_under_the_tuned_flags(monkeypatch):
  """`tx bench --tune`: a case whose choice sets XLA flags gets its step's products and
  the n^3 ceiling timed again under them, in its dtype; one without flags does not."""
  calls = []
  def fake(target, spec, *, threads, env=None, platform='cpu'):
    calls.append((target, spec, env))
    return {'bfloat16_flops': 9e9, 'gemms': {spec['gemms'][0][0]: {'bfloat16': 8e9}},
            'gemms_best': {spec['gemms'][0][0]: {'bfloat16': 9e9}}}
  monkeypatch.setattr(suite, 'run_isolated', fake)
  case = next(c for c in cases.SUITE if c.name == 'gpt_6l_bf16')
  step_gemms = cases.gemm_cases(cases.SUITE)
  result = {'tuned': {'choice': 'onednn_dots', 'xla_flags': '--x=1'}}
  suite._time_under_tuned_flags(case, result, step_gemms, {'n': 64, 'repeats': 1}, 2)
  (target, spec, env), = calls
  assert env == {'XLA_FLAGS': '--x=1'} and spec['dtypes'] == ('bfloat16',)
  assert [g[0] for g in spec['gemms']] == [f'gpt_6l: {p[0]}' for p in step_gemms['gpt_6l']]
  assert result['tuned']['ceiling'] == {'bfloat16': 9e9}
  assert result['tuned']['gemms'] == {spec['gemms'][0][0]: {'bfloat16': 8e9}}
  assert result['tuned']['gemms_best'] == {spec['gemms'][0][0]: {'bfloat16': 9e9}}
  suite._time_under_tuned_flags(case, {'tuned': {'xla_flags': ''}}, step_gemms, {}, 2)
  suite._time_under_tuned_flags(case, {'error': 'failed'}, step_gemms, {}, 2)
  assert len(calls) == 1


def test_bf16_over_tx_float32_is_ruled_out_where_bf16_gemms_are_no_faster():
  """avx512_bf16 without AMX: bf16 products run below float32's ceiling, so no bf16 step
  can train at 1.5x tx's float32 one; the report shows the arithmetic and says why."""
  doc = _bf16_doc({'avx512_bf16': True, 'amx_bf16': False})
  doc['cases']['gpt_6l_bf16']['tx_train']['tokens_per_s'] = 2200.0  # 1.1x float32's 2000
  doc['rows'] = report.rows(doc)
  doc['targets'] = report.targets(doc)
  own = [l for l in report.ceiling_arithmetic(doc) if "over tx's float32" in l]
  # float32: 100 GFLOP in 2 s = 50 GFLOP/s; bf16 ceilings XLA 50, torch 60: torch's is the
  # faster, 0.60x XLA's float32 100; 1.5 x 50 / 60 = 125 %
  assert len(own) == 1 and "torch's, peaks at 60" in own[0] and '(0.60x' in own[0]
  assert '125%' in own[0] and 'ruled out by the ceilings' in own[0]
  target = {t['target']: t for t in doc['targets']}['bf16 train >= 1.5x tx float32 (6L)']
  assert target['met'] is False and '125% of torch' in target['note']
  doc['peer_ceiling']['bfloat16'] = 200e9  # AMX-like bf16 GEMMs: 1.5x fits, the miss stands
  doc['targets'] = report.targets(doc)
  own = [l for l in report.ceiling_arithmetic(doc) if "over tx's float32" in l]
  assert '38%' in own[0] and 'under the ceiling' in own[0]
  target = {t['target']: t for t in doc['targets']}['bf16 train >= 1.5x tx float32 (6L)']
  assert target['met'] is False and 'note' not in target


def test_a_step_that_runs_torchs_gemm_is_bounded_by_torchs_rates():
  doc = _bf16_doc({'avx512_bf16': True})
  doc['step_gemms'] = {'gpt_6l': [['ffn in, forward', 1000, 1000, 20000, 2]]}
  doc['gemms'] = {'tx': {'gpt_6l: ffn in, forward': {'float32': 40e9}},
                  'peer': {'gpt_6l: ffn in, forward': {'float32': 80e9}}}
  xla = report.ceiling_arithmetic(doc)[:2]
  doc['cases']['gpt_6l']['tuned'] = {'choice': 'torch_matmul',
                                     'model_overrides': {'matmul_impl': 'torch'}}
  torch = report.ceiling_arithmetic(doc)[:2]
  # the peer's 25 GFLOP/s x 1.5 against XLA's 100 GFLOP/s ceiling, then torch's 120
  assert "38% of XLA's ceiling: under" in xla[0]
  assert "31% of torch's ceiling (tx's step runs torch's GEMM): under" in torch[0]
  # 80 GFLOP at torch's 80 GFLOP/s = 1 s, the other 20 at its 120 GFLOP/s ceiling 166.7 ms
  assert "GEMMs at XLA's best rates take 2.00 s" in xla[1]
  assert "GEMMs at torch's best rates take 1.00 s" in torch[1] and '166.7 ms' in torch[1]
  assert report.runs_torch_gemm({'spec': {'matmul_impl': 'torch'}})
  assert not report.runs_torch_gemm({'spec': {}, 'tuned': {'model_overrides': None}})
  doc['cases']['gpt_6l']['tuned'] = {'model_overrides': {'matmul_impl': 'torch_float32'}}
  doc['cases']['gpt_6l']['spec']['dtype'] = 'bfloat16'  # bf16 operands, torch's float32 rates
  doc['ceiling']['bfloat16'] = doc['peer_ceiling']['bfloat16'] = 10e9
  widened = report.ceiling_arithmetic(doc)[:2]
  assert "31% of torch's ceiling (tx's step runs torch's GEMM) in float32, 120 GFLOP/s" in (
      widened[0]) and "GEMMs at torch's best rates take 1.00 s" in widened[1]
  widened = {'spec': {}, 'tuned': {'model_overrides': {'matmul_impl': 'torch_float32'}}}
  assert report.runs_torch_gemm(widened) and report.runs_torch_float32_gemm(widened)
  assert not report.runs_torch_float32_gemm({'spec': {'matmul_impl': 'torch'}})


def test_attention_timed_alone_is_set_against_the_step_gap():
  doc = _bf16_doc({'avx512_bf16': True})  # float32 steps: tx 2 s, the peer 4 s
  doc['step_attention'] = {'gpt_6l': [4, 16, 2, 8, True, 6]}
  doc['attention'] = {'tx': {'gpt_6l': {'float32': 0.05, 'bfloat16': 0.04}},
                      'peer': {'gpt_6l': {'float32': 0.02}}}
  doc['cases']['gpt_6l']['tx_train']['step_time_s'] = 4.5  # tx now 0.5 s slower
  lines = [l for l in report.ceiling_arithmetic(doc) if 'self-attention' in l]
  # 6 layers x 50 ms = 300 ms against 6 x 20 = 120 ms: 180 ms of the 500 ms gap
  assert len(lines) == 1 and '300.0 ms in tx against 120.0 ms' in lines[0], lines
  assert '180.0 ms of the 500.0 ms by which tx\'s step is slower' in lines[0]
  doc['attention']['peer']['gpt_6l']['float32'] = 0.06  # tx's attention the faster
  line = [l for l in report.ceiling_arithmetic(doc) if 'self-attention' in l][0]
  assert "tx's 60.0 ms faster, so the 500.0 ms by which its step is slower lies elsewhere" in line
  doc['attention']['peer']['gpt_6l']['float32'] = 0.02
  doc['cases']['gpt_6l']['tuned'] = {'model_overrides': {'attention_impl': 'torch'}}
  line = [l for l in report.ceiling_arithmetic(doc) if 'self-attention' in l][0]
  # a step that runs torch's kernel is not set against tx's XLA path
  assert "tx's step runs torch's kernel, 120.0 ms alone as in the peer" in line, line
  assert 'of the 500.0 ms' not in line and "(tx's XLA path: 300.0 ms)" in line
  del doc['cases']['gpt_6l']['tuned']
  table = report.attention_lines(doc)  # bf16 has no peer time: tx's alone
  assert table == ['gpt_6l: float32 50.0 / 20.0 (2.50x the time), bfloat16 40.0']
  assert 'Self-attention of one layer' in report.table(doc)


def test_attention_ablated_inside_the_step_is_set_against_the_step_gap():
  """--ablate-attention: each side's step again with attention stubbed out; the difference
  is what attention costs inside each step."""
  doc = _bf16_doc({'avx512_bf16': True})  # float32 steps: tx 2 s, the peer 4 s
  case = doc['cases']['gpt_6l']
  case['tx_train']['step_time_s'] = 4.5  # tx 0.5 s slower
  case['tx_train_ablated'] = {'tokens_per_s': 1000.0, 'step_time_s': 3.6}
  case['peer_train_ablated'] = {'tokens_per_s': 950.0, 'step_time_s': 3.8}
  doc['rows'] = report.rows(doc)
  by = {(r['case'], r['metric']): r for r in doc['rows']}
  assert by['gpt_6l', 'tokens/s w/o attention']['ratio'] == pytest.approx(1000 / 950)
  lines = [l for l in report.ceiling_arithmetic(doc) if 'inside the step' in l]
  # tx 4.5 - 3.6 = 900 ms against torch's 4.0 - 3.8 = 200 ms: 700 ms of the 500 ms gap
  assert len(lines) == 1 and '900.0 ms of tx\'s step against 200.0 ms of torch\'s' in lines[0]
  assert '700.0 ms of the 500.0 ms by which tx\'s step is slower' in lines[0]
  assert 'tx trains at 1.06x the peer\'s speed' in lines[0]  # 3.8 / 3.6 without it
  case['peer_train_ablated']['step_time_s'] = 4.1  # the peer no faster without attention
  line = [l for l in report.ceiling_arithmetic(doc) if 'inside the step' in l][0]
  assert "-100.0 ms of torch's: a step no faster without it, so attention's share is below" in line
  case['peer_train_ablated']['step_time_s'] = 3.8
  del case['peer_train_ablated']  # one side alone says nothing
  assert not [l for l in report.ceiling_arithmetic(doc) if 'inside the step' in l]


def test_the_attention_stand_in_keeps_every_projection_in_the_step():
  """out = v (each query head reading its kv head), q and k kept on the gradient path."""
  k0, k1, k2 = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(k0, (2, 5, 4, 8))
  k, v = jax.random.normal(k1, (2, 5, 2, 8)), jax.random.normal(k2, (2, 5, 2, 8))
  out = tx_side.attention_stand_in(q, k, v, mask=None, causal_blocks=2)
  assert (out == jax.numpy.repeat(v, 2, axis=2)).all()
  grads = jax.grad(lambda q, k, v: tx_side.attention_stand_in(q, k, v).sum(),
                   argnums=(0, 1, 2))(q, k, v)
  assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]
  assert float(abs(grads[2] - 2.0).max()) == 0.0  # two query heads read each value head


def test_the_peer_refuses_an_ablation_its_attention_would_ignore(monkeypatch):
  """Only sdpa is stubbed: an eager peer fails before it trains, not with a silent no-op."""
  pytest.importorskip('transformers')
  import torch  # pylint: disable=g-import-not-at-top
  from tx.bench import torch_peers  # pylint: disable=g-import-not-at-top
  # the peers run in worker processes and stub sdpa for good; here it is put back afterwards
  monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention',
                      torch.nn.functional.scaled_dot_product_attention)
  spec = dict(cases.QUICK[3].spec, threads=1, ablate_attention=True,
              attn_implementation='eager')
  monkeypatch.setattr(torch_peers, '_train', lambda *a: pytest.fail('trained first'))
  with pytest.raises(ValueError, match="replaces the sdpa attention; this model runs 'eager'"):
    torch_peers.bert_train(spec)


def test_small_products_are_timed_over_many_calls():
  """A sample lasts ~20 ms: one call of an n^3 ceiling, many of a product whose single call
  would time mostly its dispatch (both frameworks' GEMM rates use this)."""
  assert calls_per_sample(0.1) == 1 and calls_per_sample(1e-4) == 200
  assert calls_per_sample(0.0) == 1000


def test_a_sample_ends_by_waiting_for_its_last_call():
  """sample_seconds: one untimed call, one that sizes the samples, then each sample's calls
  back to back and one wait on the last result (asynchronous work counted once a sample)."""
  calls, waited = [], []

  def call():
    calls.append(len(calls))
    return calls[-1]

  samples = sample_seconds(call, waited.append, reps=3)
  assert len(samples) == 3 and all(s > 0 for s in samples)
  per_sample = (len(calls) - 2) // 3
  assert per_sample >= 1 and len(calls) == 2 + 3 * per_sample
  assert waited == [0, 1] + [1 + per_sample * i for i in (1, 2, 3)]


def test_usage_per_step_counts_the_kernels_share_of_fresh_memory():
  """A step that maps and touches fresh memory shows it as system time and page faults."""
  import mmap  # pylint: disable=g-import-not-at-top
  before = process_usage()
  for _ in range(4):
    with mmap.mmap(-1, 128 << 20) as fresh:  # 128 MiB, touched page by page
      fresh[::4096] = b'x' * (128 << 20 >> 12)
  usage = usage_per_step(before, process_usage(), steps=4)
  assert usage['minor_faults_per_step'] >= 64  # 32,768 4 KiB pages, or 64 huge pages
  assert usage['system_s_per_step'] > 0 and usage['user_s_per_step'] >= 0


def test_warm_until_steady_stops_once_the_process_stops_growing():
  """Calls run while the resident memory grows (here at calls 2 and 4) and until it stays
  put `flat` calls in a row; `most` bounds them; a real process's growth is seen too (each
  step 5 % of what it holds)."""
  sizes = iter([1.0, 1.0, 1.8, 1.8, 2.7, 2.7, 2.7, 2.7, 2.7])
  calls = []
  n = warm_until_steady(lambda: calls.append(1), resident=lambda: next(sizes))
  assert n == len(calls) == 6  # growth at 2 and 4, then 5 and 6 flat
  flat_from_start = warm_until_steady(lambda: None, resident=lambda: 1.0)
  assert flat_from_start == 2
  assert warm_until_steady(lambda: None, most=3, resident=iter(range(1, 10)).__next__) == 3
  # a protocol's fixed warm-up runs in full, flat or not; growth after it still counts
  assert warm_until_steady(lambda: None, least=4, resident=lambda: 1.0) == 4
  assert warm_until_steady(lambda: None, least=3,
                           resident=iter([1.0, 1.0, 1.0, 1.5, 1.5, 1.5, 1.5]).__next__) == 5
  held, size = [], max(64 << 20, resident_bytes() // 20)  # well above the 1 % tolerance
  assert warm_until_steady(lambda: held.append(bytearray(size)) if len(held) < 2 else None,
                           tolerance=0.01) == 4  # two steps of growth, then 2 flat


def test_step_gemms_are_reported_side_by_side():
  doc = _bf16_doc({'avx512_bf16': True})
  doc['gemms'] = {'tx': {'ffn in, forward': {'float32': 180e9, 'bfloat16': 320e9}},
                  'peer': {'ffn in, forward': {'float32': 200e9, 'bfloat16': 400e9}}}
  assert report.gemm_lines(doc) == [
      'ffn in, forward: float32 180 / 200 (0.90x), bfloat16 320 / 400 (0.80x)']
  assert 'GEMMs of the training steps timed alone' in report.table(doc)
  del doc['gemms']['peer']  # --no-peers: XLA's rates alone
  assert report.gemm_lines(doc) == ['ffn in, forward: float32 180, bfloat16 320']


def test_bf16_targets_are_not_judged_without_bf16_arithmetic():
  doc = _bf16_doc({'avx2': True, 'avx512_bf16': False, 'amx_bf16': False})
  bf16 = [t for t in doc['targets'] if t['target'] in {b[0] for b in report.BF16_TARGETS}]
  assert len(bf16) == 3 and all(t['met'] is None and t['note'] == report.NO_BF16 for t in bf16)
  assert 'no bf16 arithmetic on this host' in report.table(doc)
  # measured over rounds, a target that is not judged gets no count of rounds held either
  doc['cases']['gpt_6l_bf16'].update(tx_train_rounds=[3200.0, 3100.0],
                                     peer_train_rounds=[1600.0, 3300.0])
  doc['rows'] = report.rows(doc)
  doc['targets'] = report.targets(doc)
  peer_target = next(t for t in doc['targets'] if t['target'].endswith('peer in bf16 (6L)'))
  assert 'rounds' not in peer_target
  assert not [l for l in report.table(doc).splitlines() if 'bf16 (6L)' in l and 'held in' in l]


def test_a_host_without_bf16_arithmetic_measures_bf16_cases_on_tx_only(monkeypatch):
  """The peer's bf16 autocast is emulated there (an hour a case on the AVX2 host) and its
  ratio is not judged: bf16 cases time tx alone and say so; float32 cases keep their peer,
  and a bf16 host keeps the bf16 peer."""
  targets = []

  def fake_run(target, spec, *, threads, platform):
    targets.append((target.split(':')[1], spec.get('dtype', 'float32')))
    return {'tokens_per_s': 1.0, 'step_time_s': 1.0}

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  bf16_case = cases.Case('gpt_6l_bf16', dict(cases.QUICK[1].spec, dtype='bfloat16'))
  float32_case = cases.Case('gpt_6l', dict(cases.QUICK[1].spec))
  said = []
  got = suite._measure_case(bf16_case, peers=True, threads=2, say=said.append,
                            bf16_host=False)
  assert targets == [('train', 'bfloat16')] and 'peer_train' not in got
  assert got['peer_skipped'] == report.NO_BF16_PEER
  assert said[0] == f'gpt_6l_bf16: {report.NO_BF16_PEER}'  # before tx's progress line
  doc = _bf16_doc({'avx2': True, 'avx512_bf16': False, 'amx_bf16': False})
  doc['cases']['gpt_6l_bf16']['peer_skipped'] = got['peer_skipped']
  assert f'gpt_6l_bf16{" " * 12}{report.NO_BF16_PEER}' in report.table(doc)
  # torch's bf16 GEMM in tx's step is emulated there too: the case is skipped, and said so
  targets.clear()
  torch_case = cases.Case('gpt_6l_bf16_torch_matmul',
                          dict(bf16_case.spec, matmul_impl='torch'))
  got = suite._measure_case(torch_case, peers=True, threads=2, say=lambda m: None,
                            bf16_host=False)
  assert targets == [] and got['skipped'] == report.NO_BF16_TORCH
  doc['cases']['gpt_6l_bf16_torch_matmul'] = got
  doc['rows'] = report.rows(doc)
  assert report.NO_BF16_TORCH in report.table(doc)
  for case, host_has_bf16 in ((float32_case, False), (bf16_case, True), (bf16_case, None),
                              (torch_case, True)):
    targets.clear()
    got = suite._measure_case(case, peers=True, threads=2, say=lambda m: None,
                              bf16_host=host_has_bf16)
    assert [t[0] for t in targets] == ['train', 'gpt2_train'] and 'peer_skipped' not in got


def test_a_host_without_bf16_arithmetic_times_the_peers_ceiling_in_float32_only(monkeypatch):
  peer_specs = []

  def fake_run(target, spec, *, threads, platform):
    if target == f'{suite.PEERS}:ceiling':
      peer_specs.append(spec)
      return {f'{d}_flops': 2e9 for d in spec['dtypes']}
    if target.endswith(':ceiling'):
      return {'float32_flops': 1e9, 'bfloat16_flops': 1e9}
    return {'tokens_per_s': 1.0, 'step_time_s': 1.0, 'flops_per_step': 1.0,
            'peak_rss_bytes': 1.0, 'compile_s': 1.0, 'first_step_s': 1.0}

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  for isa, dtypes in (({'avx2': True}, ('float32',)),
                      ({'avx512_bf16': True}, ('float32', 'bfloat16'))):
    info = {'host': {'isa': isa}, 'processor': 'cpu', 'platform': 'x', 'cpu_count': 2,
            'threads': 2, 'jax': '0'}
    monkeypatch.setattr(suite, 'machine', lambda threads, platform, info=info: dict(info))
    said = []
    doc = suite.run([cases.Case('gpt_6l', dict(cases.QUICK[1].spec))], say=said.append)
    assert peer_specs.pop()['dtypes'] == dtypes
    assert doc['peer_ceiling'] == {'float32': 2e9,
                                   'bfloat16': 2e9 if 'bfloat16' in dtypes else None}
    assert ('bf16 not timed' in said[-1]) == (dtypes == ('float32',))


def test_both_sides_time_the_steps_products_back_to_back_at_the_end(monkeypatch):
  """XLA's products and attention are timed alone in the run's last tx ceiling, right before
  torch's (the host's speed moves within minutes), not in the first one."""
  calls = []

  def fake_run(target, spec, *, threads, platform):
    calls.append((target, 'gemms' in spec, 'attention' in spec))
    if target.endswith(':ceiling'):
      rates = {'gemms': {g[0]: {'float32': 3e9} for g in spec.get('gemms', [])},
               'gemms_best': {g[0]: {'float32': 4e9} for g in spec.get('gemms', [])}}
      return {'float32_flops': 1e9, 'bfloat16_flops': 1e9, **rates}
    return {'tokens_per_s': 1.0, 'step_time_s': 1.0, 'flops_per_step': 1.0,
            'peak_rss_bytes': 1.0, 'compile_s': 1.0, 'first_step_s': 1.0}

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  info = {'host': {'isa': {'avx2': True}}, 'processor': 'cpu', 'platform': 'x',
          'cpu_count': 2, 'threads': 2, 'jax': '0'}
  monkeypatch.setattr(suite, 'machine', lambda threads, platform: dict(info))
  doc = suite.run([cases.Case('gpt_6l', dict(cases.QUICK[1].spec))], say=lambda m: None)
  ceilings = [c for c in calls if c[0].endswith(':ceiling')]
  assert calls[0] == (f'{suite.TX}:ceiling', False, False)
  assert calls[-2:] == [(f'{suite.TX}:ceiling', True, True), (f'{suite.PEERS}:ceiling', True,
                                                                True)]
  assert len(ceilings) == 3 and 'gemms' not in doc['ceilings'][-1]
  assert set(doc['gemms']) == {'tx', 'peer'} and all(
      r == {'float32': 3e9} for side in doc['gemms'].values() for r in side.values())
  assert set(doc['gemms_best']) == {'tx', 'peer'} and all(
      r == {'float32': 4e9} for side in doc['gemms_best'].values() for r in side.values())


def test_a_gpu_run_reports_the_datasheet_mfu_and_device_memory_and_judges_no_cpu_target():
  doc = _bf16_doc({'avx512_bf16': True, 'amx_bf16': False})
  doc['machine'].update(measured_on='gpu', device='NVIDIA H100 80GB HBM3')
  doc['cases']['gpt_6l_bf16']['tx_train']['device_peak_bytes'] = 2e9
  doc['cases']['gpt_6l_bf16']['peer_train']['device_peak_bytes'] = 4e9
  doc['rows'] = report.rows(doc)
  doc['targets'] = report.targets(doc)
  by = {(r['case'], r['metric']): r for r in doc['rows']}
  # 100 GFLOP per step in 1.25 s against the H100's 989.4 TFLOP/s bf16 datasheet peak
  assert by['gpt_6l_bf16', 'train MFU (datasheet)']['tx'] == pytest.approx(80e9 / 989.4e12)
  assert by['gpt_6l', 'train MFU (datasheet)']['tx'] == pytest.approx(50e9 / 494.7e12)  # TF32
  assert by['gpt_6l_bf16', 'train peak device GB']['ratio'] == pytest.approx(0.5)
  # an XLA-attention twin of the cuDNN case: its speed as a fraction of the cuDNN case's
  doc['cases']['gpt_6l_bf16_xla'] = {
      'spec': {'family': 'decoder', 'dtype': 'bfloat16', 'attention_impl': 'xla',
               'attention_case': 'gpt_6l_bf16'},
      'tx_train': dict(doc['cases']['gpt_6l_bf16']['tx_train'], tokens_per_s=2400.0)}
  by = {(r['case'], r['metric']): r for r in report.rows(doc)}
  assert by['gpt_6l_bf16_xla', 'tokens/s / cuDNN case']['tx'] == pytest.approx(0.75)
  assert doc['targets'] == []
  text = report.table(doc)
  assert 'measured on the GPU: NVIDIA H100 80GB HBM3' in text and '989 TFLOP/s bf16' in text
  assert "none judged: issue 9's and 24's targets are CPU targets" in text
  assert 'GEMM ceilings and the 1.5x target' not in text
  doc['machine']['device'] = 'a GPU tx has no datasheet for'
  assert report.gpu_peak(doc) is None
  assert not [r for r in report.rows(doc) if r['metric'] == 'train MFU (datasheet)']


def test_the_gpu_platform_picks_the_gpu_suite_and_environment():
  assert suite.select(False, None, 'gpu') == cases.GPU
  assert suite.select(True, None, 'gpu') == cases.QUICK  # --quick: toy sizes anywhere
  assert {c.spec.get('attention_impl', 'auto') for c in cases.GPU} == {'auto', 'xla'}
  assert worker.thread_env(2, 'gpu')['JAX_PLATFORMS'] == 'cuda'
  assert worker.thread_env(2)['JAX_PLATFORMS'] in ('cpu', os.environ.get('JAX_PLATFORMS'))
  with pytest.raises(ValueError, match='platform must be one of'):
    worker.thread_env(2, 'tpu')


def test_measurements_run_without_a_persistent_compilation_cache(monkeypatch, tmp_path):
  # a cached program would time its load as the compile (the test session sets a cache)
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', str(tmp_path))
  assert 'JAX_COMPILATION_CACHE_DIR' not in worker.thread_env(2)


def test_a_gpu_measurement_refuses_to_time_the_cpu():
  spec = dict(cases.QUICK[0].spec, platform='gpu', threads=2)
  with pytest.raises(RuntimeError, match='platform gpu: jax runs on'):
    tx_side.train(spec)


def test_bench_platform_gpu_without_a_gpu_is_one_line(monkeypatch, capsys):
  def no_gpu(target, spec, *, threads, platform):
    raise suite.BenchError(f'{target} failed (exit 1): RuntimeError: no cuda')
  monkeypatch.setattr(suite, 'run_isolated', no_gpu)
  assert cli.main(['bench', '--platform', 'gpu', '--no-peers', '--quiet']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and '--platform gpu: the first GPU measurement failed' in err[0]


def test_peer_compile_reaches_the_training_peers_only(monkeypatch):
  specs = []

  def fake_run(target, spec, *, threads, platform):
    specs.append((target.split(':')[1], spec))
    return {'tokens_per_s': 1.0, 'step_time_s': 1.0, 'new_tokens_per_s': 1.0}

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  suite._measure_case(cases.QUICK[1], peers=True, threads=2, say=lambda m: None,
                      peer_compile=True)
  compiled = {name for name, spec in specs if spec.get('torch_compile')}
  assert compiled == {'gpt2_train'} and {name for name, _ in specs} == {
      'train', 'gpt2_train', 'decode', 'gpt2_generate'}


def test_the_peer_compiles_its_forward_and_loss_once_and_trains_the_same(monkeypatch):
  """torch.compile wraps the forward and loss; the step's numbers stay the eager peer's."""
  torch = pytest.importorskip('torch')
  from tx.bench import torch_peers
  calls = []
  monkeypatch.setattr(torch, 'compile', lambda fn: calls.append(fn) or fn)  # no inductor build
  spec = dict(cases.QUICK[0].spec, threads=1)
  eager = torch_peers.gpt2_train(spec)
  compiled = torch_peers.gpt2_train(dict(spec, torch_compile=True))
  assert len(calls) == 1 and compiled['loss'] == pytest.approx(eager['loss'])


def test_the_peers_train_with_tx_sides_optimizer_settings():
  """Each family's optimizer, rate, moments, decay and clipping are the same on both sides."""
  from tx.bench import torch_peers  # pylint: disable=g-import-not-at-top
  assert set(torch_peers.OPTIMIZERS) == set(tx_side._OPTIM)  # pylint: disable=protected-access
  for family, (name, kwargs, clip) in torch_peers.OPTIMIZERS.items():
    mine = tx_side._OPTIM[family]  # pylint: disable=protected-access
    assert name.lower() == mine.name, family
    assert (kwargs['lr'], kwargs['betas'], kwargs['eps']) == (
        mine.learning_rate, (mine.b1, mine.b2), mine.eps), family
    assert kwargs.get('weight_decay', 0.0) == mine.weight_decay and clip == mine.clip_norm, family


def test_a_case_with_several_steps_per_call_times_one_step():
  """steps_per_call=3: each timed call runs 3 steps of the same batch; tokens/s and the step
  time are per step, and the loss after 3 more steps per call is lower."""
  spec = dict(cases.QUICK[0].spec, batch=2, steps=1, warmup=1)
  one = tx_side.train(spec)
  three = tx_side.train(dict(spec, steps_per_call=3))
  assert three['tokens_per_s'] == pytest.approx(spec['batch'] * spec['ctx']
                                                / three['step_time_s'])
  assert three['loss'] < one['loss']  # 3 x (warmup + timed + final) updates against 1 x 3
  assert set(cases.gemm_cases([cases.Case('x', spec)])) == {'x'}  # timed part by part ...
  assert set(cases.gemm_cases([cases.Case('x', dict(spec, steps_per_call=3))])) == set()  # ... once


def test_a_case_with_micro_batches_trains_the_same_step():
  """spec['grad_accum_steps']=2 splits each step's batch into two micro-batches (a scan in
  the compiled step) and takes the same update: loss and gradient norm as in one pass."""
  spec = dict(cases.QUICK[0].spec, batch=4, steps=1, warmup=1)
  metrics = {}
  for accum in (1, 2):
    compiled, state, batch, cfg, _, _ = tx_side.compiled_train_step(
        dict(spec, grad_accum_steps=accum))
    assert cfg.optim.grad_accum_steps == accum
    metrics[accum] = jax.device_get(compiled(state, batch)[1])
    assert ('while' in compiled.as_text()) == (accum > 1)
  for key in ('loss_sum', 'grad_norm'):
    assert metrics[2][key] == pytest.approx(metrics[1][key], rel=1e-5), key
  with pytest.raises(ConfigError, match='3 does not divide train.batch_size=4'):
    tx_side.experiment(dict(spec, grad_accum_steps=3))  # before anything compiles


def test_the_own_ceiling_is_timed_after_the_steps_never_before(monkeypatch):
  """A matmul timed in tx's process before its timed steps slowed some steps (NOTES attempt
  79), so the in-process ceiling comes after the last timed step and before nothing."""
  events = []
  timed = tx_side._timed  # pylint: disable=protected-access
  monkeypatch.setattr(tx_side, '_timed', lambda fn, n: events.append(('steps', n)) or timed(fn, n))
  monkeypatch.setattr(tx_side, '_own_ceiling',
                      lambda spec: events.append(('ceiling', 0)) or {'own_ceiling_flops': 1e9})
  out = tx_side.train(dict(cases.QUICK[0].spec, batch=2, steps=2, warmup=2))
  assert out['own_ceiling_flops'] == 1e9
  warm = [('steps', 1)] * int(out['warmup_calls'])  # warmup - 1 calls, more while growing
  assert out['warmup_calls'] >= 1
  assert events == [('steps', 1), *warm, ('steps', 2), ('ceiling', 0)]


def test_the_own_ceiling_times_the_gemm_the_step_runs_on(monkeypatch):
  """A step whose dense products run in torch's GEMM (matmul_impl='torch', as `tx tune`
  chooses on some hosts) is measured against torch's matmul, not XLA's: against XLA's
  it read 112 % on the AVX2 host (NOTES attempt 89)."""
  timed = []
  monkeypatch.setattr(tx_side, 'gemm_rates', lambda dtype, m, k, n, rhs_transposed, reps:
                      timed.append(('xla', dtype, m)) or [1.0] * reps)
  monkeypatch.setattr(torch_peers, 'gemm_mm_rates', lambda torch, dtype, m, k, n, t, reps:
                      timed.append(('torch', dtype, m)) or [2.0] * reps)
  own_ceiling = tx_side._own_ceiling  # pylint: disable=protected-access
  assert own_ceiling({'ceiling_n': 64}) == {'own_ceiling_flops': 1.0, 'own_ceiling_kernel': 'xla',
                                            'own_ceiling_product': 'n^3'}
  assert own_ceiling({'ceiling_n': 64, 'matmul_impl': 'torch'}) == {
      'own_ceiling_flops': 2.0, 'own_ceiling_kernel': 'torch', 'own_ceiling_product': 'n^3'}
  # bf16 operands widened for torch's float32 GEMM: its float32 rate is the step's ceiling
  own_ceiling({'ceiling_n': 64, 'dtype': 'bfloat16', 'matmul_impl': 'torch_float32'})
  assert timed == [('xla', 'float32', 64), ('torch', 'float32', 64), ('torch', 'float32', 64)]


def test_the_own_ceiling_is_the_fastest_of_the_square_and_the_steps_own_products(monkeypatch):
  """Under oneDNN's dots (a `tx tune` choice) XLA's n^3 product ran slower than the step's own
  products and an MFU against it read 160 % (NOTES attempt 101): the step's products count
  too, in the kernel they run on, and the JSON names the one that set the ceiling."""
  spec = dict(cases.QUICK[0].spec, ceiling_n=64)
  labels = [g[0] for g in cases.step_gemms(spec)]
  fast = labels[2]
  shapes = {tuple(g[1:5]): g[0] for g in cases.step_gemms(spec)}
  rate = lambda m, k, n, t: 3.0 if shapes.get((m, k, n, t)) == fast else 1.0
  monkeypatch.setattr(tx_side, 'gemm_rates', lambda dtype, m, k, n, rhs_transposed, reps:
                      [rate(m, k, n, rhs_transposed)] * reps)
  monkeypatch.setattr(torch_peers, 'gemm_mm_rates', lambda torch, dtype, m, k, n, t, reps:
                      [2 * rate(m, k, n, t)] * reps)
  own_ceiling = tx_side._own_ceiling  # pylint: disable=protected-access
  assert own_ceiling(spec) == {'own_ceiling_flops': 3.0, 'own_ceiling_kernel': 'xla',
                               'own_ceiling_product': fast}
  assert own_ceiling(dict(spec, matmul_impl='torch')) == {
      'own_ceiling_flops': 6.0, 'own_ceiling_kernel': 'torch', 'own_ceiling_product': fast}
  # a seq2seq step has no `step_gemms`: the square alone
  s2s = next(c.spec for c in cases.QUICK if c.spec['family'] == 'encoder_decoder')
  assert own_ceiling(dict(s2s, ceiling_n=64))['own_ceiling_product'] == 'n^3'


def test_torchs_gemm_with_a_transposed_operand_is_timed():
  torch = pytest.importorskip('torch')
  rates = torch_peers.gemm_mm_rates(torch, 'float32', 8, 16, 4, True, 2)
  assert len(rates) == 2 and all(r > 0 for r in rates)


def test_torchs_square_matmul_is_timed_in_the_dtype_asked(monkeypatch):
  torch = pytest.importorskip('torch')
  rates = torch_peers.square_mm_rates(torch, 'float32', 32, 2)
  assert len(rates) == 2 and all(r > 0 for r in rates)
  seen = []
  monkeypatch.setattr(torch_peers, '_mm_rates', lambda torch, a, b, reps: seen.append(
      (a.dtype, tuple(a.shape), reps)) or [1.0] * reps)
  assert torch_peers.square_mm_rates(torch, 'bfloat16', 16, 3) == [1.0] * 3
  assert seen == [(torch.bfloat16, (16, 16), 3)]


def test_xla_options_reach_the_steps_compile_only():
  """spec['xla_options'] are XLA debug options for that one compile: YNNPACK off leaves no
  YNNPACK fusion in the step, the process's own setting is untouched, and a misspelt value
  fails the compile."""
  spec = dict(cases.QUICK[0].spec, batch=2, steps=1, warmup=1)
  ynn_fusions = lambda options: tx_side.compiled_train_step(
      dict(spec, xla_options=options))[0].as_text().count('ynn_fusion')
  assert ynn_fusions(None) > 0  # the pinned jaxlib's CPU step (pyproject.toml)
  assert ynn_fusions({'xla_cpu_experimental_ynn_fusion_type': ''}) == 0
  assert ynn_fusions(None) > 0
  with pytest.raises(Exception, match='not a valid enum value'):
    ynn_fusions({'xla_cpu_experimental_ynn_fusion_type': 'dot'})  # the XLA_FLAGS spelling


def test_bench_tune_trains_tx_with_the_tuned_choice_and_leaves_the_peer_alone(monkeypatch):
  """--tune: tx's training runs get the tune entry's model and loop settings (where the case
  leaves them to tx) and its XLA flags; the peer and tx's decoding keep the case's spec, and
  the report names the choice."""
  entry = {'choice': 'torch_attention_4_per_call', 'xla_flags': '--xla_x=1',
           'model_overrides': {'attention_impl': 'torch'},
           'train_overrides': {'steps_per_call': 4}, 'timings': {
               'default': 2.0, 'torch_attention_4_per_call': 1.6}}
  tuned_configs, calls = [], []
  monkeypatch.setattr(tuned.tune, 'tune', lambda cfg, **kw: tuned_configs.append(cfg) or entry)

  def fake_run(target, spec, *, threads, platform, env=None):
    calls.append((target.split(':')[1], spec, env))
    return {'tokens_per_s': 1.0, 'step_time_s': 1.0, 'new_tokens_per_s': 1.0}

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  case = cases.QUICK[1]  # gpt_6l at toy sizes: training and decoding
  got = suite._measure_case(case, peers=True, threads=2, say=lambda m: None, tune=True)
  by = {name: (spec, env) for name, spec, env in calls}
  assert by['train'][0] == dict(case.spec, attention_impl='torch', steps_per_call=4)
  assert by['train'][1] == {'XLA_FLAGS': '--xla_x=1'}
  for other in ('gpt2_train', 'decode', 'gpt2_generate'):
    assert 'steps_per_call' not in by[other][0] and by[other][1] is None, other
  assert tuned_configs[0].train.steps_per_call is None  # left to tune
  assert tuned_configs[0].train.batch_size == case.spec['batch']
  assert got['tuned']['choice'] == 'torch_attention_4_per_call'
  assert report.tuned_lines({'cases': {'gpt_6l': got}}) == [
      'gpt_6l: torch_attention_4_per_call (--xla_x=1, model.attention_impl=torch, '
      "train.steps_per_call=4; 1.25x the defaults' step in the tune)"]
  calls.clear()  # the ablated run (attention stubbed out) takes the tuned settings too
  suite._measure_case(case, peers=False, threads=2, say=lambda m: None, tune=True, ablate=True)
  trained = [spec for name, spec, _ in calls if name == 'train']
  assert trained == [dict(case.spec, attention_impl='torch', steps_per_call=4),
                     dict(case.spec, attention_impl='torch', steps_per_call=4,
                          ablate_attention=True)]
  untuned = suite._measure_case(case, peers=False, threads=2, say=lambda m: None)
  assert 'tuned' not in untuned and report.tuned_lines({'cases': {'x': untuned}}) == []


def test_a_case_that_names_a_setting_keeps_it_under_tune():
  entry = {'model_overrides': {'attention_impl': 'torch', 'matmul_impl': 'torch'},
           'train_overrides': {'steps_per_call': 4}}
  spec = dict(cases.QUICK[1].spec, attention_impl='xla', steps_per_call=2)
  assert tuned.with_choice(spec, entry) == dict(spec, matmul_impl='torch')
  assert tuned.step_config(spec).train.steps_per_call == 2


def test_tune_times_the_step_bench_measures_without_diagnostics():
  # the peers compute no stability diagnostics; a tune of a case timed with them would pick
  # settings for a step `tx bench` does not run
  spec = cases.QUICK[1].spec
  assert tuned.step_config(spec).train.diagnostics is False
  assert tx_side.experiment(spec).train.diagnostics is False


@pytest.mark.parametrize('case', [c for c in cases.SUITE + cases.QUICK if 'train' in c.kinds],
                         ids=lambda c: c.name)
def test_tune_times_the_model_bench_measures(case):
  """`tx tune` resolves the config as `tx train` would (the vocabulary from the tokenizer):
  every case's tuned step must still be the case's model, vocabulary included."""
  from tx.config.base import to_dict  # pylint: disable=g-import-not-at-top
  from tx.runs import tune  # pylint: disable=g-import-not-at-top
  timed = tune.one_device_config(tuned.step_config(case.spec))
  assert timed.model.vocab_size == case.spec['vocab']
  assert to_dict(timed.model) == to_dict(tx_side.experiment(case.spec).model)


def test_a_tune_that_fails_fails_its_case_and_the_run_goes_on(monkeypatch):
  from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top

  def failing_tune(cfg, **unused):
    raise ConfigError('tx tune: every candidate failed: {...}')

  monkeypatch.setattr(tuned.tune, 'tune', failing_tune)
  monkeypatch.setattr(suite, 'run_isolated', lambda target, spec, **kw: {
      'float32_flops': 1e9, 'bfloat16_flops': 1e9, 'tokens_per_s': 1.0, 'step_time_s': 1.0})
  doc = suite.run([cases.QUICK[1]], peers=False, say=lambda m: None, tune=True)
  assert 'every candidate failed' in doc['cases']['gpt_6l']['error']


def test_a_run_cut_short_keeps_the_cases_it_measured(monkeypatch, tmp_path):
  """The JSON is written after every case, so a run killed before its report (a time limit
  on a lent machine) still leaves each finished case's numbers on disk, marked partial."""
  ceilings = iter([{'float32_flops': 1e9, 'bfloat16_flops': 1e9}])

  def fake_run(target, spec, *, threads, platform):
    if target.endswith(':ceiling'):
      return next(ceilings)  # the second (closing) ceiling is where the run gets cut
    return {'tokens_per_s': 7.0, 'step_time_s': 1.0, 'flops_per_step': 1.0}

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  path = tmp_path / 'cut.json'
  with pytest.raises(StopIteration):
    cli.main(['bench', '--quick', '--only', 'gpt_baby', 'bert_mini', '--no-peers', '--quiet',
              '--json', str(path)])
  doc = json.loads(path.read_text())
  assert doc['partial'] is True
  assert {name: c['tx_train']['tokens_per_s'] for name, c in doc['cases'].items()} == {
      'gpt_baby': 7.0, 'bert_mini': 7.0}
  assert os.listdir(tmp_path) == ['cut.json']  # no temporary file left beside it


def test_without_json_each_run_writes_its_own_file_under_runs_bench(monkeypatch, tmp_path):
  """No --json: a new runs/bench/bench-<time>.json per run (folder created), never an earlier
  run's file and never the current folder's root."""
  monkeypatch.setattr(suite, 'run_isolated', lambda target, spec, *, threads, platform: {
      'float32_flops': 1e9, 'bfloat16_flops': 1e9, 'compile_s': 1.0, 'tokens_per_s': 7.0,
      'step_time_s': 1.0, 'flops_per_step': 1.0, 'peak_rss_bytes': 1e8, 'first_step_s': 1.0})
  monkeypatch.chdir(tmp_path)
  assert cli.main(['bench', '--quick', '--no-peers', '--profile', '--rounds', '2']) != 0
  assert not (tmp_path / 'runs').exists()  # a refused run makes nothing
  argv = ['bench', '--quick', '--only', 'gpt_baby', '--no-peers', '--quiet']
  assert cli.main(argv) == 0
  assert cli.main(argv) == 0  # within the same second, too
  written = sorted(os.listdir(tmp_path / 'runs' / 'bench'))
  assert os.listdir(tmp_path) == ['runs']
  assert len(written) == 2 and all(n.startswith('bench-') and n.endswith('.json')
                                   for n in written)
  for name in written:
    doc = json.loads((tmp_path / 'runs' / 'bench' / name).read_text())
    assert doc['cases']['gpt_baby']['tx_train']['tokens_per_s'] == 7.0
  assert suite.default_json_path(profile=True).startswith(
      os.path.join('runs', 'bench', 'bench-profile-'))


def test_the_ceiling_keeps_each_products_median_and_fastest_sample(monkeypatch):
  """The medians compare XLA's kernels with torch's; the fastest sample is what the 1.5x
  bound takes (`report.bound_rates`)."""
  monkeypatch.setattr(tx_side, 'gemm_rates', lambda dtype, m, k, n, rhs_transposed, reps:
                      [1.0, 3.0, 2.0][:reps])
  out = tx_side.ceiling({'n': 32, 'repeats': 1, 'dtypes': ('float32',), 'gemm_repeats': 3,
                         'gemms': [['g', 8, 16, 8, False]]})
  assert out['gemms'] == {'g': {'float32': 2.0}} and out['gemms_best'] == {'g': {'float32': 3.0}}


@pytest.mark.parametrize('usable, given, expected', [
    (8, None, 2), (1, None, 1), (None, None, 2), (1, 4, 4)])
def test_threads_default_to_two_or_the_usable_cpus_where_fewer(monkeypatch, tmp_path, usable,
                                                                given, expected):
  """Without --threads every measurement gets the suite's 2 threads, or the CPUs this process
  may use where fewer (a `taskset -c 0` run is not timed at two threads on one CPU); a given
  --threads always wins."""
  probed = dict(host.probe(), usable_cpus=usable)
  monkeypatch.setattr(host, 'probe', lambda env=None: dict(probed))
  seen = set()

  def fake_run(target, spec, *, threads, platform):
    seen.add(threads)
    return {'float32_flops': 1e9, 'bfloat16_flops': 1e9, 'compile_s': 1.0, 'tokens_per_s': 7.0,
            'step_time_s': 1.0, 'flops_per_step': 1.0, 'peak_rss_bytes': 1e8,
            'first_step_s': 1.0}

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  argv = ['bench', '--quick', '--only', 'gpt_baby', '--no-peers', '--quiet',
          '--json', str(tmp_path / 'b.json')] + ([] if given is None else ['--threads', str(given)])
  assert cli.main(argv) == 0
  assert seen == {expected}
  assert json.loads((tmp_path / 'b.json').read_text())['machine']['threads'] == expected
