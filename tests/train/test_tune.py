"""`tx tune`: the selection runs (each candidate timed in its own process), is cached per host
and step, is applied by `tx train`, and can be turned off. No timing thresholds: which
candidate wins is the machine's business; the tests check the selection rule on the recorded
(or, for the rule itself, fixed) timings and that each candidate's flags reach its step."""

import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

import pytest

from tx import compat, registry
from tx.bench import host as host_lib
from tx.bench import worker
from tx.cli import main
from tx.config.base import ConfigError, parse_overrides
from tx.runs import tune, tune_step

TINY = ['model.d_model=32', 'model.num_heads=2', 'model.d_ff=64', 'model.num_layers=1',
        'model.max_len=16', 'data.seq_len=16', 'train.batch_size=4', 'model.norm=layernorm']
ONEDNN = '--xla_cpu_use_onednn=true'


def _cfg(*extra):
  return registry.get('demo', parse_overrides(TINY + list(extra)))


@pytest.fixture(scope='module')
def tuned(tmp_path_factory):
  """One real selection: two candidates, one step each, in fresh processes."""
  env = dict(os.environ, TX_CACHE_DIR=str(tmp_path_factory.mktemp('cache')))
  said = []
  candidates = {'default': '', 'onednn': ONEDNN}
  if importlib.util.find_spec('torch'):
    candidates.update(tune.MODEL_CANDIDATES)  # torch_attention, torch_matmul, both, + norms
    for name in ('torch_matmul_norm', 'torch_float32_matmul', 'torch_float32_attention_matmul',
                 'torch_block_matmul', 'torch_block_matmul_norm'):
      del candidates[name]  # their settings reach the step as the others' do
  candidates['default_4_per_call'] = tune.known_candidates()['default_4_per_call']
  entry = tune.tune(_cfg(), candidates=candidates, steps=1, warmup=0, rounds=1, env=env,
                    say=said.append)
  return entry, env, said


def test_the_fastest_measured_candidate_is_chosen_and_cached(tuned):
  entry, env, said = tuned
  assert {'default', 'onednn'} <= set(entry['timings']) and not entry['failed']
  assert entry['choice'] == tune.choose(entry['timings'], entry['margin'],
                                        entry['rounds_timings'])
  assert entry['xla_flags'] == {'onednn': ONEDNN}.get(entry['choice'], '')
  assert entry['model_overrides'] == (
      tune.MODEL_CANDIDATES.get(entry['choice'], {}).get('model', {}))
  # each candidate's flags reached its measuring process
  assert ONEDNN in entry['details']['onednn']['xla_flags']
  assert ONEDNN not in entry['details']['default']['xla_flags']
  path = tune.entry_path(_cfg(), host_lib.probe(env), env)
  assert path.parent == tune.cache_dir(env) and json.loads(path.read_text()) == entry
  assert any('chose' in line for line in said)


def test_a_cached_choice_is_reused_without_measuring(tuned, monkeypatch):
  entry, env, _ = tuned
  def refuse(*a, **k):
    raise AssertionError('measured again')
  monkeypatch.setattr(worker, 'run_isolated', refuse)
  said = []
  # the candidates it was measured with, or some of them: nothing new to time
  assert tune.tune(_cfg(), candidates=entry['candidates'], env=env, say=said.append) == entry
  assert tune.tune(_cfg(), candidates={'default': ''}, env=env, say=said.append) == entry
  assert 'cached choice' in said[0]
  with pytest.raises(AssertionError, match='measured again'):
    tune.tune(_cfg(), candidates={'default': ''}, env=env, force=True, say=said.append)
  with pytest.raises(AssertionError, match='measured again'):  # today's set has more
    tune.tune(_cfg(), env=env, say=said.append)
  assert 'predates' in said[-1]


def test_an_entry_older_than_a_candidate_times_only_the_new_ones_against_its_choice(
    tmp_path, monkeypatch):
  """An entry measured before 'c' existed: the next tune times 'c' against the entry's
  choice 'a' and the defaults ('b' lost to 'a' then and is not timed again), records every
  candidate as considered and keeps the earlier measurement; then nothing is new."""
  times = {'default': [1.0, 1.0, 1.0, 1.0], 'a': [0.8, 0.8, 0.8, 0.8], 'b': [0.9, 0.9],
           'c': [0.7, 0.7]}
  flags = {'a': '--a=1', 'b': '--b=1', 'c': '--c=1'}
  order = _scripted_timings(monkeypatch, times, flags)
  env, said = {'TX_CACHE_DIR': str(tmp_path)}, []
  old = tune.tune(_cfg(), candidates={'default': '', 'a': flags['a'], 'b': flags['b']},
                  rounds=2, env=env, say=said.append)
  assert old['choice'] == 'a' and len(order) == 6
  order.clear()
  entry = tune.tune(_cfg(), candidates={'default': '', **flags}, rounds=2, env=env,
                    say=said.append)
  assert sorted(order) == ['a', 'a', 'c', 'c', 'default', 'default']
  assert any("choice 'a'" in line and 'predates c; timing default, a, c' in line
             for line in said)
  assert entry['choice'] == 'c' and set(entry['timings']) == {'default', 'a', 'c'}
  assert entry['candidates'] == {'default': '', **flags}
  assert entry['earlier']['choice'] == 'a' and entry['earlier']['timings'] == old['timings']
  assert tune.lookup(_cfg(), host_lib.probe(env), env) == json.loads(json.dumps(entry))
  order.clear()
  assert tune.tune(_cfg(), candidates={'default': '', **flags}, env=env, say=said.append)[
      'choice'] == 'c' and not order
  # a candidate whose setting changed counts as new
  assert tune.untimed(entry, {'default': '', 'a': '--a=2'}) == ['a']
  # asked for a few candidates, the update still times the entry's choice against the new
  # one and keeps the record of the others
  order.clear()
  flags['d'] = '--d=1'
  times.update(default=[1.0], d=[0.9], c=[0.7])
  entry = tune.tune(_cfg(), candidates={'default': '', 'd': '--d=1'}, rounds=1, env=env,
                    say=said.append)
  assert sorted(order) == ['c', 'd', 'default'] and entry['choice'] == 'c'
  assert entry['candidates'] == {'default': '', **flags}


def test_an_update_times_the_twins_and_falls_back_to_the_whole_set():
  known = tune.known_candidates()
  pick = lambda *names: {n: known[n] for n in names}
  entry = {'choice': 'onednn_dots', 'candidates': pick('default', 'default_4_per_call',
                                                        'onednn', 'onednn_dots')}
  now = pick('default', 'default_4_per_call', 'onednn', 'onednn_dots', 'onednn_dots_4_per_call',
             'ynn_off', 'ynn_off_4_per_call')
  new = tune.untimed(entry, now)
  assert new == ['onednn_dots_4_per_call', 'ynn_off', 'ynn_off_4_per_call']
  assert list(tune.update_set(entry, now, new)) == [
      'default', 'default_4_per_call', 'onednn_dots', 'onednn_dots_4_per_call', 'ynn_off',
      'ynn_off_4_per_call']  # 'onednn' lost to 'onednn_dots' and is not timed again
  # the entry's choice is no longer a candidate (or the baseline is missing): all of them
  assert tune.update_set(dict(entry, choice='gone'), now, new) == now
  assert tune.update_set(entry, pick('onednn_dots', 'ynn_off'), ['ynn_off']) == pick(
      'onednn_dots', 'ynn_off')
  assert tune.untimed({}, now) == list(now)  # an entry from before candidates were recorded


def test_the_cache_key_separates_hosts_jax_versions_and_step_shapes(tmp_path):
  env = {'TX_CACHE_DIR': str(tmp_path)}
  host = host_lib.probe(env)
  path = tune.entry_path(_cfg(), host, env)
  assert tune.entry_path(_cfg(), dict(host), env) == path
  assert tune.entry_path(_cfg('train.batch_size=8'), host, env) != path
  assert tune.entry_path(_cfg('model.dtype=bfloat16'), host, env) != path
  assert tune.entry_path(_cfg('train.steps=7'), host, env) == path  # not part of the step
  # steps_per_call set by the user (even to 1) is; left to tx (None) it is what tune times
  assert tune.entry_path(_cfg('train.steps_per_call=1'), host, env) != path
  assert tune.entry_path(_cfg('train.steps_per_call=4'), host, env) != path
  assert tune.entry_path(_cfg(), dict(host, model_name='Other CPU'), env) != path
  assert tune.entry_path(_cfg(), dict(host, jax='0.0.1'), env) != path
  assert tune.cache_dir({'XDG_CACHE_HOME': '/x'}).as_posix() == '/x/tx/tune'


def _write_entry(cfg, env, flags=ONEDNN):
  path = tune.entry_path(cfg, host_lib.probe(env), env)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({'choice': 'onednn', 'xla_flags': flags, 'timings': {}}))


def test_apply_appends_the_choice_unless_turned_off(tmp_path, monkeypatch):
  monkeypatch.setattr(compat, 'backends_started', lambda: False)
  env = {'TX_CACHE_DIR': str(tmp_path), 'XLA_FLAGS': '--xla_force_host_platform_device_count=2'}
  assert tune.apply(_cfg(), env=env, say=lambda m: None) is None  # nothing cached
  _write_entry(_cfg(), env)
  said = []
  assert tune.apply(_cfg(), env=env, say=said.append)['choice'] == 'onednn'
  assert env['XLA_FLAGS'] == f'--xla_force_host_platform_device_count=2 {ONEDNN}'
  assert 'TX_TUNE=0' in said[0]
  off = {'TX_CACHE_DIR': str(tmp_path), 'TX_TUNE': '0'}
  assert tune.apply(_cfg(), env=off, say=said.append) is None and 'XLA_FLAGS' not in off
  monkeypatch.setattr(compat, 'backends_started', lambda: True)
  late = {'TX_CACHE_DIR': str(tmp_path)}
  assert tune.apply(_cfg(), env=late, say=said.append) is None and 'XLA_FLAGS' not in late
  assert 'not applied' in said[-1]


def test_apply_says_when_the_entry_predates_a_candidate_and_tune_updates_it(
    tmp_path, monkeypatch):
  """`tx train` keeps using an entry that lacks some of today's candidates, with a line
  naming them; with --tune (`tune_if_missing`) it times them first."""
  monkeypatch.setattr(compat, 'backends_started', lambda: False)
  env = {'TX_CACHE_DIR': str(tmp_path)}
  _write_entry(_cfg(), env)  # no 'candidates': measured before any were recorded
  said = []
  assert tune.apply(_cfg(), env=env, say=said.append)['choice'] == 'onednn'
  assert 'TX_TUNE=0' in said[0] and ONEDNN in env['XLA_FLAGS']
  assert said[1].startswith('tx: that `tx tune` choice was measured before default, onednn, ')
  assert 'more; `tx tune` (or --tune) times them' in said[1]
  host = host_lib.probe(env)
  current = tune.default_candidates(_cfg(), host)
  path = tune.entry_path(_cfg(), host, env)
  path.write_text(json.dumps({'choice': 'onednn', 'xla_flags': ONEDNN, 'candidates': current}))
  said.clear()
  assert tune.apply(_cfg(), env=dict(env), say=said.append)['choice'] == 'onednn'
  assert not any('measured before' in line for line in said)
  path.write_text(json.dumps({'choice': 'onednn', 'xla_flags': ONEDNN,
                              'candidates': dict(current, onednn='--old=1')}))
  updated = []
  monkeypatch.setattr(tune, 'tune', lambda cfg, say, env: updated.append(cfg) or {
      'choice': 'default', 'xla_flags': ''})
  assert tune.apply(_cfg(), env=dict(env), say=said.append, tune_if_missing=True) == {
      'choice': 'default', 'xla_flags': ''} and len(updated) == 1


def test_a_flag_the_user_set_wins():
  assert tune.merge_flags('--a=1 --b=2', '--b=3 --c=4') == '--a=1 --b=2 --c=4'
  assert tune.merge_flags('', ONEDNN) == ONEDNN


def test_tx_train_applies_the_cached_choice(tmp_path):
  """A real `tx train` process: the line naming the tuned settings, and none with --no-tune."""
  env = dict(os.environ, TX_CACHE_DIR=str(tmp_path / 'cache'))
  sets = TINY + ['train.steps=1', 'train.eval_batches=1', 'train.sample_tokens=0',
                 'train.checkpoint_every=1']
  _write_entry(_cfg(*sets[len(TINY):]), env)
  base = [sys.executable, '-m', 'tx', 'train', 'demo', '--set', *sets, '--quiet']
  on = subprocess.run(base + ['--workdir', str(tmp_path / 'a')], env=env, capture_output=True,
                      text=True, check=False)
  assert on.returncode == 0, on.stderr[-2000:]
  assert f"XLA settings 'onednn' ({ONEDNN})" in on.stdout
  off = subprocess.run(base + ['--workdir', str(tmp_path / 'b'), '--no-tune'], env=env,
                       capture_output=True, text=True, check=False)
  assert off.returncode == 0 and 'XLA settings' not in off.stdout


def test_candidates_may_name_a_model_setting_under_flags():
  """`tx tune --candidates` names what the cross stage times: '<model>_<flags>', and its
  4-steps-per-call twin."""
  known = tune.known_candidates()
  pair = known['torch_float32_attention_matmul_onednn_dots_ynn_reduce_4_per_call']
  assert pair == {'xla_flags': tune.CANDIDATES['onednn_dots_ynn_reduce'],
                  'model': {'attention_impl': 'torch_float32', 'matmul_impl': 'torch_float32'},
                  'train': {'steps_per_call': 4}}
  assert known['torch_attention_ynn_off'] == {
      'xla_flags': tune.CANDIDATES['ynn_off'], 'model': {'attention_impl': 'torch'}}
  assert 'torch_attention_default' not in known  # the defaults set no flags: the setting alone


@pytest.mark.parametrize('argv, says', [
    (['tune', 'demo', '--candidates', 'nosuch'], 'unknown nosuch'),
    (['tune', 'demo', '--steps', '0'], '--steps and --rounds must be >= 1'),
    (['tune', 'demo', '--margin', '1.5'], '--margin in [0, 1)'),
])
def test_cli_errors_are_one_line(argv, says, capsys, tmp_path, monkeypatch):
  monkeypatch.setenv('TX_CACHE_DIR', str(tmp_path))
  assert main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert says in err and len(err.splitlines()) == 1


def test_rounds_rotate_and_the_defaults_stay_unless_clearly_beaten(tmp_path, monkeypatch):
  """The selection rule on fixed timings (no machine involved): medians over rounds, each
  round in a rotated order, and a candidate must beat the defaults by more than the margin."""
  order, times = [], {'default': [1.00, 1.00], 'a': [0.99, 0.98], 'b': [0.90, 1.30]}
  def fake(target, spec, *, threads, env):
    name = next((n for n, f in {'a': '--a=1', 'b': '--b=1'}.items() if f in env['XLA_FLAGS']),
                'default')
    order.append(name)
    return {'step_time_s': times[name][order.count(name) - 1], 'compile_s': 0.0}
  monkeypatch.setattr(worker, 'run_isolated', fake)
  env = {'TX_CACHE_DIR': str(tmp_path)}
  entry = tune.tune(_cfg(), candidates={'default': '', 'a': '--a=1', 'b': '--b=1'}, rounds=2,
                    margin=0.03, env=env, say=lambda m: None)
  assert order == ['default', 'a', 'b', 'a', 'b', 'default']
  assert entry['timings'] == pytest.approx({'default': 1.0, 'a': 0.985, 'b': 1.10})
  assert entry['choice'] == 'default'  # 'a' is only 1.5 % faster
  assert tune.choose({'default': 1.0, 'a': 0.9}, 0.03) == 'a'
  assert tune.choose({'a': 0.9, 'b': 0.8}, 0.03) == 'b'  # no defaults measured
  # a median that beats the defaults by a round that did not (noise) is not enough
  medians = {'default': 2.11, 'a': 2.03, 'b': 2.05}
  rounds = {'default': [2.02, 2.12, 2.11], 'a': [2.03, 2.02, 2.07], 'b': [1.99, 2.05, 2.06]}
  assert tune.choose(medians, 0.02, rounds) == 'b' and tune.choose(medians, 0.02) == 'a'
  assert tune.choose(medians, 0.02, dict(rounds, b=[2.03, 2.05, 2.06])) == 'default'


def _scripted_timings(monkeypatch, times: dict, flags: dict) -> list:
  """Replaces the measuring process: the candidate whose flag is in XLA_FLAGS ('default'
  without one) takes the next of its `times`; returns the list of candidates in timing order."""
  order = []
  def fake(target, spec, *, threads, env):
    name = next((n for n, f in flags.items() if f in env['XLA_FLAGS']), 'default')
    order.append(name)
    return {'step_time_s': times[name][order.count(name) - 1], 'compile_s': 0.0}
  monkeypatch.setattr(worker, 'run_isolated', fake)
  return order


def test_a_candidate_that_lost_a_round_to_the_defaults_is_not_timed_again(tmp_path, monkeypatch):
  """The rule needs a win in every round, so a loss ends a candidate's timing: the same choice
  as timing every round, fewer processes. 'slow' loses round 1, 'late' round 2."""
  times = {'default': [1.0, 1.0, 1.0], 'slow': [1.2, 0.5, 0.5], 'late': [0.9, 1.1, 0.5],
           'fast': [0.8, 0.8, 0.8]}
  flags = {'slow': '--slow=1', 'late': '--late=1', 'fast': '--fast=1'}
  order = _scripted_timings(monkeypatch, times, flags)
  said = []
  entry = tune.tune(_cfg(), candidates={'default': '', **flags}, rounds=3, margin=0.03,
                    env={'TX_CACHE_DIR': str(tmp_path)}, say=said.append)
  assert order.count('default') == order.count('fast') == 3
  assert order.count('slow') == 1 and order.count('late') == 2
  assert entry['skipped'] == {'slow': 1, 'late': 2}
  assert entry['rounds_timings']['late'] == [0.9, 1.1]
  medians = {name: sorted(t)[1] for name, t in times.items()}  # had every round been timed
  assert entry['choice'] == tune.choose(medians, 0.03, times) == 'fast'
  assert any('slow is slower than the defaults in round 1' in line for line in said)


def test_near_ties_get_a_runoff_and_the_rule_decides_on_all_their_rounds(tmp_path, monkeypatch):
  """'a' and 'b' both beat the defaults and lie within the margin of each other after the
  rounds ('a' ahead); the runoff times only those two again, and 'b' wins on all rounds.
  'c' beats the defaults by too little to be a contender."""
  times = {'default': [1.0, 1.0], 'a': [0.90, 0.90, 0.95, 0.95], 'b': [0.91, 0.91, 0.80, 0.80],
           'c': [0.99, 0.99]}
  flags = {'a': '--a=1', 'b': '--b=1', 'c': '--c=1'}
  order = _scripted_timings(monkeypatch, times, flags)
  said = []
  entry = tune.tune(_cfg(), candidates={'default': '', **flags}, rounds=2, margin=0.03,
                    env={'TX_CACHE_DIR': str(tmp_path)}, say=said.append)
  assert order[8:] == ['a', 'b', 'b', 'a']  # after the two rounds, only the contenders
  assert entry['runoff'] == ['a', 'b'] and entry['choice'] == 'b'
  assert entry['timings'] == pytest.approx({'default': 1.0, 'a': 0.925, 'b': 0.855, 'c': 0.99})
  assert entry['choice'] == tune.choose(entry['timings'], 0.03, entry['rounds_timings'])
  assert any('a, b within 3% of each other' in line for line in said)
  # without a near tie, no runoff: the clear winner stays after the rounds alone
  order.clear()
  times.update(b=[0.96, 0.96])
  entry = tune.tune(_cfg(), candidates={'default': '', **flags}, rounds=2, margin=0.03,
                    env={'TX_CACHE_DIR': str(tmp_path)}, force=True, say=said.append)
  assert len(order) == 8 and entry['runoff'] == [] and entry['choice'] == 'a'


def test_a_contender_with_one_slow_round_gets_the_runoff(tmp_path, monkeypatch):
  """'b' beat the defaults in both rounds but one of its rounds was slow, so its median (a
  mean of two) is outside the margin of 'a''s while its fastest round is ahead of a's: a
  near tie, timed again; on all four rounds 'b' is the faster."""
  times = {'default': [1.0, 1.0], 'a': [0.90, 0.90, 0.90, 0.90], 'b': [0.86, 0.99, 0.85, 0.85]}
  flags = {'a': '--a=1', 'b': '--b=1'}
  order = _scripted_timings(monkeypatch, times, flags)
  entry = tune.tune(_cfg(), candidates={'default': '', **flags}, rounds=2, margin=0.02,
                    env={'TX_CACHE_DIR': str(tmp_path)}, say=lambda line: None)
  assert sorted(order[6:]) == ['a', 'a', 'b', 'b']
  assert entry['runoff'] == ['a', 'b'] and entry['choice'] == 'b'
  # by the medians alone 'a' would have stayed: a near tie on neither statistic gets none
  assert tune.choose({'default': 1.0, 'a': 0.90, 'b': 0.925}, 0.02) == 'a'
  order.clear()
  times.update(b=[0.93, 0.99])
  entry = tune.tune(_cfg(), candidates={'default': '', **flags}, rounds=2, margin=0.02,
                    env={'TX_CACHE_DIR': str(tmp_path)}, force=True, say=lambda line: None)
  assert len(order) == 6 and entry['runoff'] == [] and entry['choice'] == 'a'


def test_processes_of_one_host_measure_once(tmp_path, monkeypatch):
  """Two callers at once (as the processes of a `tx train --tune` job on one host): the
  second waits for the first's measurement and reads its entry instead of timing again."""
  started, calls = threading.Event(), []
  def fake(target, spec, *, threads, env):
    calls.append(env['XLA_FLAGS'])
    started.set()
    time.sleep(0.3)  # the other caller arrives while this one measures
    return {'step_time_s': 1.0, 'compile_s': 0.0}
  monkeypatch.setattr(worker, 'run_isolated', fake)
  env, said, entries = {'TX_CACHE_DIR': str(tmp_path)}, [], []
  measure = lambda: entries.append(tune.tune(_cfg(), candidates={'default': '', 'a': '--a=1'},
                                             rounds=1, env=env, say=said.append))
  first = threading.Thread(target=measure)
  first.start()
  assert started.wait(60)
  measure()
  first.join()
  assert sorted(calls) == ['', '--a=1'] and entries[0] == entries[1]
  assert any('waiting for its choice' in line for line in said)
  assert any('cached choice' in line for line in said)


def test_an_unwritable_cache_is_a_one_line_error(tmp_path):
  blocked = tmp_path / 'file'
  blocked.write_text('')
  with pytest.raises(ConfigError, match='TX_CACHE_DIR to a writable folder'):
    tune.tune(_cfg(), env={'TX_CACHE_DIR': str(blocked)}, say=lambda m: None)


def test_tx_sweep_applies_the_first_runs_cached_choice(tmp_path, monkeypatch):
  """`tx sweep` looks up (or with --tune measures) the choice for its first run's step before
  any run; --no-tune skips it. The runs themselves are replaced: only the wiring is checked."""
  from tx.sweep import runner  # pylint: disable=g-import-not-at-top
  from tx.sweep.spec import plan  # pylint: disable=g-import-not-at-top
  applied, ran = [], []
  monkeypatch.setattr(tune, 'apply', lambda cfg, **kw: applied.append((cfg, kw)))
  monkeypatch.setattr(runner, 'run', lambda *a, **kw: ran.append(kw) or 0)
  argv = ['sweep', 'ablate_ffn', '--workdir', str(tmp_path), '--only', 'gelu', '--seeds', '1']
  assert main(argv) == 0 and main(argv + ['--tune']) == 0 and main(argv + ['--no-tune']) == 0
  assert len(ran) == 3 and len(applied) == 2
  first = [r for r in plan(registry.get_sweep('ablate_ffn'), tmp_path, resolve=registry.get,
                           seeds=1) if 'gelu' in r.variant][0]
  assert applied[0][0] == first.config and applied[0][1] == {'tune_if_missing': False}
  assert applied[1][1] == {'tune_if_missing': True}


def test_a_model_candidate_reaches_its_step(tuned):
  """torch_attention is timed with model.attention_impl=torch, torch_matmul with
  model.matmul_impl=torch, the others with the config's."""
  pytest.importorskip('torch')
  details = tuned[0]['details']
  assert details['torch_attention']['attention_impl'] == 'torch'
  assert details['torch_matmul']['matmul_impl'] == 'torch'
  assert details['torch_matmul']['attention_impl'] == 'auto'
  assert details['torch_attention']['matmul_impl'] == 'auto'
  both = details['torch_attention_matmul']
  assert both['attention_impl'] == both['matmul_impl'] == 'torch'
  assert both['norm_impl'] == 'auto'
  every = details['torch_attention_matmul_norm']
  assert every['attention_impl'] == every['matmul_impl'] == every['norm_impl'] == 'torch'
  for name in ('default', 'onednn'):
    assert details[name]['attention_impl'] == details[name]['matmul_impl'] == 'auto'
    assert details[name]['norm_impl'] == 'auto'


def test_model_candidates_are_timed_only_where_tx_chooses_the_setting(monkeypatch):
  pytest.importorskip('torch')
  assert set(tune.model_candidates(_cfg())) == {'torch_attention', 'torch_matmul',
                                                'torch_attention_matmul',
                                                'torch_attention_matmul_norm'}  # RoPE
  for setting in ('model.attention_impl=xla', 'model.position=alibi',
                  'model.attention_softcap=30', 'model.attention_dropout=0.1'):
    assert set(tune.model_candidates(_cfg(setting))) == {'torch_matmul',
                                                         'torch_matmul_norm'}, setting
  assert set(tune.model_candidates(_cfg('model.matmul_impl=xla'))) == {'torch_attention'}
  # torch's flash kernel takes no float16: attention in torch only in float32 on widened q, k, v
  assert set(tune.model_candidates(_cfg('model.dtype=float16'))) == {
      'torch_float32_matmul', 'torch_float32_attention_matmul'}
  # torch's norms only where tx chooses them and the norms are LayerNorms
  for setting in ('model.norm_impl=xla', 'model.norm=rmsnorm'):
    assert set(tune.model_candidates(_cfg(setting))) == {
        'torch_attention', 'torch_matmul', 'torch_attention_matmul'}, setting
  # the whole attention block where nothing comes between its projections and the kernel
  learned = 'model.position=learned'
  assert set(tune.model_candidates(_cfg(learned))) == {
      'torch_attention', 'torch_matmul', 'torch_attention_matmul', 'torch_attention_matmul_norm',
      'torch_block_matmul_norm'}
  assert 'torch_block_matmul' in tune.model_candidates(_cfg(learned, 'model.norm_impl=xla'))
  for setting in ('model.qk_norm=rmsnorm', 'model.num_kv_heads=1'):
    assert not {'torch_block_matmul', 'torch_block_matmul_norm'} & set(
        tune.model_candidates(_cfg(learned, setting))), setting
  # torch's bf16 GEMM only where the host has bf16 arithmetic (or its ISA is unknown)
  bf16 = _cfg('model.dtype=bfloat16')
  for isa, has in (({'avx2': True}, False), ({'avx512_bf16': True}, True),
                   ({'amx_bf16': True}, True), ({}, True)):
    got = set(tune.model_candidates(bf16, {'isa': isa}))
    assert ('torch_matmul' in got) == has and ('torch_attention_matmul' in got) == has, isa
  assert 'torch_matmul' in tune.model_candidates(_cfg(), {'isa': {'avx2': True}})  # float32
  # torch's float32 GEMM on widened operands for bf16 / f16 models, on any host
  for cfg, isa in ((bf16, {'avx2': True}), (bf16, {'avx512_bf16': True}),
                   (_cfg('model.dtype=float16'), {})):
    got = set(tune.model_candidates(cfg, {'isa': isa}))
    assert {'torch_float32_matmul', 'torch_float32_attention_matmul'} <= got, isa
  for cfg in (_cfg(), _cfg('model.dtype=bfloat16', 'model.matmul_impl=xla')):
    assert 'torch_float32_matmul' not in tune.model_candidates(cfg)
  assert 'torch_float32_attention_matmul' not in tune.model_candidates(
      _cfg('model.dtype=bfloat16', 'model.attention_impl=xla'))
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)  # torch not installed
  assert tune.model_candidates(_cfg()) == {}


def test_a_choice_of_torchs_kernels_falls_back_to_xla_where_torch_is_missing(monkeypatch):
  """A tune cache shared with an environment that had PyTorch: its torch-kernel choice is
  left out with one line naming the cause and the fix, not a failure at the first step; its
  other settings (steps per call) still apply."""
  entry = {'choice': 'torch_attention_matmul_4_per_call',
           'model_overrides': tune.MODEL_CANDIDATES['torch_attention_matmul']['model'],
           'train_overrides': {'steps_per_call': 4}}
  said = []
  assert tune.with_choice(_cfg(), entry, said.append).model.matmul_impl == 'torch'
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)  # torch not installed
  cfg = tune.with_choice(_cfg(), entry, said.append)
  assert (cfg.model.attention_impl, cfg.model.matmul_impl) == ('auto', 'auto')
  assert cfg.train.steps_per_call == 4
  missing, applied = said[-2:]
  assert "'torch_attention_matmul_4_per_call'" in missing and 'no PyTorch' in missing
  assert "pip install -e '.[interop]'" in missing and 'model.attention_impl=torch' in missing
  assert 'train.steps_per_call=4' in applied and 'torch' not in applied
  assert tune.with_choice(_cfg(), {'xla_flags': '--x'}, said.append) == _cfg()
  monkeypatch.undo()  # torch here, missing in another process of a multi-process job
  cfg = tune.with_choice(_cfg(), entry, said.append, torch_everywhere=False)
  assert cfg.model.matmul_impl == 'auto' and 'a process of this job' in said[-2]
  assert tune.with_choice(_cfg(), entry, said.append, torch_everywhere=True).model \
      .matmul_impl == 'torch'


def test_a_chosen_model_setting_is_cached_and_applied_by_train_unless_set(tmp_path, monkeypatch):
  """The choice's model settings go into the entry; `with_choice` applies them to a
  config that left the attention to tx ('auto'), with a line saying so, and only then."""
  seen = []
  def fake(target, spec, *, threads, env):
    seen.append(spec['model_overrides'])
    return {'step_time_s': 0.5 if spec['model_overrides'] else 1.0, 'compile_s': 0.0}
  monkeypatch.setattr(worker, 'run_isolated', fake)
  candidates = {'default': '', 'torch_attention': tune.MODEL_CANDIDATES['torch_attention']}
  entry = tune.tune(_cfg(), candidates=candidates, rounds=1, env={'TX_CACHE_DIR': str(tmp_path)},
                    say=lambda m: None)
  assert seen == [{}, {'attention_impl': 'torch'}]
  assert entry['choice'] == 'torch_attention' and entry['xla_flags'] == ''
  assert entry['model_overrides'] == {'attention_impl': 'torch'}
  said = []
  assert tune.with_choice(_cfg(), entry, said.append).model.attention_impl == 'torch'
  assert len(said) == 1 and 'model.attention_impl=torch' in said[0] and 'TX_TUNE=0' in said[0]
  chosen_by_user = _cfg('model.attention_impl=xla')
  assert tune.with_choice(chosen_by_user, entry, said.append) is chosen_by_user
  assert tune.with_choice(_cfg(), None, said.append).model.attention_impl == 'auto'
  assert len(said) == 1
  matmul = {'model_overrides': {'matmul_impl': 'torch'}}
  assert tune.with_choice(_cfg(), matmul, said.append).model.matmul_impl == 'torch'
  assert 'model.matmul_impl=torch' in said[-1]
  norms = {'model_overrides': tune.MODEL_CANDIDATES['torch_attention_matmul_norm']['model']}
  assert tune.with_choice(_cfg(), norms, said.append).model.norm_impl == 'torch'
  assert 'model.norm_impl=torch' in said[-1]
  assert tune.with_choice(_cfg('model.norm_impl=xla'), norms, said.append).model.norm_impl \
      == 'xla'
  both = {'model_overrides': tune.MODEL_CANDIDATES['torch_attention_matmul']['model']}
  assert tune.with_choice(_cfg('model.attention_impl=xla'), both, said.append).model \
      .attention_impl == 'xla'  # one of them set by the user: neither is applied
  chosen_by_user = _cfg('model.matmul_impl=xla')
  assert tune.with_choice(chosen_by_user, matmul, said.append) is chosen_by_user


def test_a_per_call_candidate_reaches_its_step(tuned):
  """default_4_per_call is timed at 4 steps per call, every other candidate at 1."""
  details = tuned[0]['details']
  assert details['default_4_per_call']['steps_per_call'] == 4
  assert {d['steps_per_call'] for n, d in details.items() if n != 'default_4_per_call'} == {1}


def test_per_call_candidates_are_timed_only_where_tx_chooses_the_setting(monkeypatch):
  monkeypatch.setattr(importlib.util, 'find_spec', lambda name: None)  # torch not installed
  names = lambda cfg: set(tune.CANDIDATES | tune.per_call_candidates(cfg, tune.CANDIDATES |
                                                                     tune.model_candidates(cfg)))
  assert names(_cfg()) == set(tune.CANDIDATES) | {f'{n}_4_per_call' for n in tune.CANDIDATES}
  for setting in ('train.steps_per_call=1', 'train.steps_per_call=2'):
    assert names(_cfg(setting)) == set(tune.CANDIDATES), setting
  both = tune.per_call_candidates(_cfg(), {'default': '', 'onednn': ONEDNN,
                                           **tune.MODEL_CANDIDATES})
  assert set(both) == {'default_4_per_call', 'onednn_4_per_call', 'torch_attention_4_per_call',
                       'torch_matmul_4_per_call', 'torch_attention_matmul_4_per_call',
                       'torch_matmul_norm_4_per_call', 'torch_attention_matmul_norm_4_per_call',
                       'torch_block_matmul_4_per_call', 'torch_block_matmul_norm_4_per_call',
                       'torch_float32_matmul_4_per_call',
                       'torch_float32_attention_matmul_4_per_call'}
  assert both['onednn_4_per_call'] == {'xla_flags': ONEDNN, 'model': {},
                                       'train': {'steps_per_call': 4}}
  twin = tune._twin  # pylint: disable=protected-access
  assert twin('onednn', {'onednn': ONEDNN, **both}) == 'onednn_4_per_call'
  assert both['torch_attention_4_per_call'] == {'xla_flags': '',
                                                'model': {'attention_impl': 'torch'},
                                                'train': {'steps_per_call': 4}}


def test_a_chosen_steps_per_call_is_cached_and_applied_by_train_unless_set(tmp_path, monkeypatch):
  """A per-call candidate that wins puts train.steps_per_call into the entry; `with_choice`
  applies it (with the model settings) where the config left it None, with a line saying so."""
  seen = []
  def fake(target, spec, *, threads, env):
    seen.append((target, spec['model_overrides'], spec.get('train_variants')))
    timing = lambda train: {'step_time_s': 0.5 if train else 1.0, 'compile_s': 0.0}
    if target == tune.TWIN_WORKER:
      return {'variants': [timing(train) for train in spec['train_variants']]}
    return timing(spec['train_overrides'])
  monkeypatch.setattr(worker, 'run_isolated', fake)
  known = tune.known_candidates()
  candidates = {n: known[n] for n in ('default', 'torch_attention', 'torch_attention_4_per_call')}
  entry = tune.tune(_cfg(), candidates=candidates, rounds=1, env={'TX_CACHE_DIR': str(tmp_path)},
                    say=lambda m: None)
  # torch's attention at 1 and at 4 steps per call: one process, one model setting
  assert seen == [(tune.WORKER, {}, None),
                  (tune.TWIN_WORKER, {'attention_impl': 'torch'}, [{}, {'steps_per_call': 4}])]
  assert entry['choice'] == 'torch_attention_4_per_call'
  assert entry['train_overrides'] == {'steps_per_call': 4}
  said = []
  chosen = tune.with_choice(_cfg(), entry, said.append)
  assert chosen.train.steps_per_call == 4 and chosen.model.attention_impl == 'torch'
  assert said == ['tx: model.attention_impl=torch, train.steps_per_call=4, chosen by `tx tune` '
                  'on this host for this step; TX_TUNE=0 turns this off']
  set_by_user = tune.with_choice(_cfg('train.steps_per_call=1'), entry, said.append)
  assert set_by_user.train.steps_per_call == 1 and set_by_user.model.attention_impl == 'torch'
  assert tune.with_choice(_cfg(), {'model_overrides': {}}, said.append).train.per_call == 1
  assert len(said) == 2


def _scripted_twins(monkeypatch, times: dict, settings: list[str]) -> tuple[list, dict]:
  """Replaces the measuring process for the defaults and `settings` (each an XLA flag
  --NAME=1), each with its per-call twin, timed in one process as `tune` runs them: every
  variant takes the next of its `times`. Returns the list that records each process's
  (worker, [names]) and the candidates."""
  calls = []
  def fake(target, spec, *, threads, env):
    trains = spec['train_variants'] if target == tune.TWIN_WORKER else [spec['train_overrides']]
    setting = next((n for n in settings if f'--{n}=1' in env['XLA_FLAGS']), 'default')
    names = [setting + ('_4_per_call' if train else '') for train in trains]
    calls.append((target, names))
    timed = [{'step_time_s': times[n][sum(n in c[1] for c in calls) - 1], 'compile_s': 0.0}
             for n in names]
    return {'variants': timed} if target == tune.TWIN_WORKER else timed[0]
  monkeypatch.setattr(worker, 'run_isolated', fake)
  candidates = {'default': '', 'default_4_per_call': tune.known_candidates()[
      'default_4_per_call']}
  for name in settings:
    candidates[name] = f'--{name}=1'
    candidates[f'{name}_4_per_call'] = {'xla_flags': f'--{name}=1',
                                        'train': {'steps_per_call': 4}}
  return calls, candidates


def test_a_setting_and_its_per_call_twin_are_timed_in_one_process(tuned, tmp_path, monkeypatch):
  """default and default_4_per_call share a process (`time_twins`) in each round, in the
  round's rotated order; a twin whose partner lost a round, or one whose settings differ in
  more than steps per call, is timed alone."""
  details = tuned[0]['details']  # the real worker: each variant's own step
  assert details['default']['steps_per_call'] == 1
  assert details['default_4_per_call']['steps_per_call'] == 4
  assert details['default']['pid'] == details['default_4_per_call']['pid']
  assert details['default']['pid'] != details['onednn']['pid']
  assert any('one process with default, default_4_per_call' in line for line in tuned[2])
  times = {'default': [1.0, 1.0, 1.0], 'default_4_per_call': [0.8, 0.8, 0.8],
           'slow': [1.2], 'slow_4_per_call': [0.75, 0.75, 0.75]}
  calls, candidates = _scripted_twins(monkeypatch, times, ['slow'])
  entry = tune.tune(_cfg(), candidates=candidates, rounds=3, margin=0.03,
                    env={'TX_CACHE_DIR': str(tmp_path)}, say=lambda m: None)
  assert calls == [
      (tune.TWIN_WORKER, ['default', 'default_4_per_call']),
      (tune.TWIN_WORKER, ['slow', 'slow_4_per_call']),
      (tune.TWIN_WORKER, ['default_4_per_call', 'default']),  # round 2 starts one later
      (tune.WORKER, ['slow_4_per_call']),  # 'slow' lost round 1: its twin alone
      (tune.WORKER, ['slow_4_per_call']),  # round 3 starts with 'slow': skipped
      (tune.TWIN_WORKER, ['default', 'default_4_per_call'])]
  assert entry['skipped'] == {'slow': 1} and entry['choice'] == 'slow_4_per_call'
  assert tune._twin('slow', candidates) == 'slow_4_per_call'
  assert tune._twin('default_4_per_call', candidates) == 'default'
  assert tune._twin('slow_4_per_call', dict(candidates, slow='--other=1')) is None
  assert tune._twin('default', {'default': ''}) is None


def test_a_per_call_twin_is_held_against_the_defaults_twin_too(tmp_path, monkeypatch):
  """A setting's 4-steps-per-call twin that beats the one-step defaults but not their own
  twin gains nothing the calls do not give: it loses that round and is not timed again.
  'flat' is the defaults' speed (and its twin loses to theirs), 'fast' beats both."""
  times = {'default': [1.0, 1.0], 'default_4_per_call': [0.80, 0.82],
           'flat': [1.01], 'flat_4_per_call': [0.85], 'fast': [0.9, 0.9],
           'fast_4_per_call': [0.70, 0.72]}
  calls, candidates = _scripted_twins(monkeypatch, times, ['flat', 'fast'])
  said = []
  entry = tune.tune(_cfg(), candidates=candidates, rounds=2, margin=0.03,
                    env={'TX_CACHE_DIR': str(tmp_path)}, say=said.append)
  assert sum('flat_4_per_call' in names for _, names in calls) == 1
  assert entry['skipped'] == {'flat': 1, 'flat_4_per_call': 1}
  assert any('flat_4_per_call is slower than default_4_per_call in round 1' in line
             for line in said)
  assert entry['choice'] == 'fast_4_per_call'
  assert tune.baselines('fast_4_per_call', times) == ['default', 'default_4_per_call']
  assert tune.baselines('fast_4_per_call', {'default': 1.0}) == ['default']
  assert tune.baselines('default_4_per_call', times) == ['default']
  assert tune.baselines('fast', times) == ['default'] and tune.baselines('default', times) == []
  # the margin too: a twin 2 % ahead of the defaults' twin leaves the choice to that twin
  medians = {'default': 1.0, 'default_4_per_call': 0.80, 'fast_4_per_call': 0.785}
  assert tune.choose(medians, 0.03) == 'default_4_per_call'
  assert tune.choose(dict(medians, fast_4_per_call=0.75), 0.03) == 'fast_4_per_call'


def _scripted_settings(monkeypatch, times: dict) -> list:
  """Replaces the measuring process: a step's name is built from what reached it, 'torch_x'
  for model overrides, 'fast' for the flag --f=1 ('default' for neither), '_4_per_call' for
  4 steps a call; each takes its fixed time. Returns the (names) of each process in turn."""
  calls = []
  def fake(target, spec, *, threads, env):
    trains = spec['train_variants'] if target == tune.TWIN_WORKER else [spec['train_overrides']]
    setting = '_'.join(['torch_x'] * bool(spec['model_overrides'])
                       + ['fast'] * ('--f=1' in env['XLA_FLAGS'])) or 'default'
    names = [setting + ('_4_per_call' if train else '') for train in trains]
    calls.append(names)
    timed = [{'step_time_s': times[n], 'compile_s': 0.0} for n in names]
    return {'variants': timed} if target == tune.TWIN_WORKER else timed[0]
  monkeypatch.setattr(worker, 'run_isolated', fake)
  return calls


def test_the_fastest_flags_and_model_setting_are_then_timed_together(tmp_path, monkeypatch):
  """With the default candidates, the fastest flag setting ('fast') and the fastest model
  setting ('torch_x'), each ahead of the defaults, are timed together afterwards, as an
  update against the choice and the defaults; the next tune has nothing to time. Named
  candidates are timed as they are, and a pair without a flag setting that beats the
  defaults is not made."""
  x = {'model': {'attention_impl': 'torch'}}
  small = {'default': '', 'fast': '--f=1', 'torch_x': x}
  small |= {f'{n}_4_per_call': tune._with_per_call(c) for n, c in small.items()}
  monkeypatch.setattr(tune, 'default_candidates', lambda cfg, host: dict(small))
  times = {'default': 1.0, 'default_4_per_call': 0.9, 'fast': 0.9, 'fast_4_per_call': 0.8,
           'torch_x': 0.8, 'torch_x_4_per_call': 0.7, 'torch_x_fast': 0.7,
           'torch_x_fast_4_per_call': 0.6}
  calls = _scripted_settings(monkeypatch, times)
  env, said = {'TX_CACHE_DIR': str(tmp_path)}, []
  entry = tune.tune(_cfg(), rounds=1, env=env, say=said.append)
  assert calls[3:] == [['default', 'default_4_per_call'], ['torch_x', 'torch_x_4_per_call'],
                       ['torch_x_fast', 'torch_x_fast_4_per_call']]
  assert any('the fastest flag setting under each model setting ahead of the defaults: '
             'torch_x_fast, '
             'torch_x_fast_4_per_call; timing default, torch_x, default_4_per_call, '
             'torch_x_4_per_call, torch_x_fast, torch_x_fast_4_per_call' in line
             for line in said), said
  assert entry['choice'] == 'torch_x_fast_4_per_call' and entry['xla_flags'] == '--f=1'
  assert entry['model_overrides'] == {'attention_impl': 'torch'}
  assert entry['train_overrides'] == {'steps_per_call': 4}
  assert entry['earlier']['choice'] == 'torch_x_4_per_call'
  assert set(entry['candidates']) == set(small) | {'torch_x_fast', 'torch_x_fast_4_per_call'}
  calls.clear()
  assert tune.tune(_cfg(), env=env, say=said.append) == entry and not calls
  assert 'cached choice' in said[-1]
  # the nominees may come from the entry the latest one updated (by their gain there)
  assert list(tune.crossed({'timings': {'default': 1.0, 'fast': 0.9},
                            'earlier': {'timings': {'default': 2.0, 'torch_x': 1.0}}},
                           small)) == ['torch_x_fast', 'torch_x_fast_4_per_call']
  # ... unless the latest measured them again and they no longer beat the defaults
  assert tune.crossed({'timings': {'default': 1.0, 'fast': 0.9, 'torch_x': 1.0},
                       'earlier': {'timings': {'default': 2.0, 'torch_x': 1.0}}}, small) == {}
  # named candidates: exactly those; no flag setting ahead of the defaults: no pair
  calls.clear()
  tune.tune(_cfg(), candidates=small, rounds=1, env=env, force=True, say=said.append)
  assert len(calls) == 3
  calls.clear()
  times.update(fast=1.0, fast_4_per_call=0.9)
  entry = tune.tune(_cfg(), rounds=1, env=env, force=True, say=said.append)
  assert len(calls) == 3 and entry['choice'] == 'torch_x_4_per_call'


def test_the_flags_are_crossed_with_every_model_setting_ahead_of_the_defaults():
  """Not the fastest model setting alone: each one faster than its baselines (itself or its
  twin) is paired with the fastest flag setting, the fastest first; one behind the defaults,
  and pairs timed already, are not."""
  flags = {'slow': '--s=1', 'fast': '--f=1'}
  models = {m: {'model': {'attention_impl': 'torch', 'matmul_impl': m}} for m in 'xyz'}
  small = {'default': ''} | flags | models
  small |= {f'{n}_4_per_call': tune._with_per_call(c) for n, c in small.items()}
  entry = {'timings': {'default': 1.0, 'default_4_per_call': 0.9, 'slow': 0.95, 'fast': 0.9,
                       'x': 0.8, 'y': 0.95, 'y_4_per_call': 0.92, 'z': 1.1,
                       'z_4_per_call': 0.95}}
  out = tune.crossed(entry, small)
  assert list(out) == ['x_fast', 'x_fast_4_per_call', 'y_fast', 'y_fast_4_per_call']
  assert out['y_fast'] == {'xla_flags': '--f=1', 'model': models['y']['model']}
  assert out['y_fast_4_per_call']['train'] == {'steps_per_call': 4}
  # z's twin is behind the defaults' twin (0.95 against 0.9); x's pairs were timed already
  assert list(tune.crossed(entry, small | {k: out[k] for k in ('x_fast', 'x_fast_4_per_call')}
                           )) == ['y_fast', 'y_fast_4_per_call']
  assert tune.crossed(dict(entry, timings=dict(entry['timings'], fast=1.0, slow=1.0)),
                      small) == {}


def test_the_whole_set_stays_on_record_through_several_updates(tmp_path, monkeypatch):
  """Each update keeps the entry it updated, with that one's own 'earlier': after two forced
  updates of one name, the first (whole-set) measurement still nominates the model setting
  that the cross stage pairs with the fastest flag setting."""
  small = {'default': '', 'fast': '--f=1', 'torch_x': {'model': {'attention_impl': 'torch'}}}
  monkeypatch.setattr(tune, 'default_candidates', lambda cfg, host: dict(small))
  times = {'default': 1.0, 'fast': 0.9, 'torch_x': 0.8, 'torch_x_fast': 0.7}
  _scripted_settings(monkeypatch, times)
  env = {'TX_CACHE_DIR': str(tmp_path)}
  first = tune.tune(_cfg(), candidates=small, rounds=1, env=env, say=lambda m: None)
  for _ in range(2):
    tune.tune(_cfg(), candidates={'default': ''}, rounds=1, env=env, force=True,
              say=lambda m: None)
  entry = json.loads(next(tmp_path.glob('tune/*.json')).read_text())
  assert set(entry['timings']) == {'default'}
  assert entry['earlier']['earlier']['timings'] == first['timings']
  assert [set(m['timings']) for m in tune.measurements(entry)] == [set(small), {'default'},
                                                                   {'default'}]
  assert list(tune.crossed(entry, small)) == ['torch_x_fast']


def test_forced_named_candidates_keep_the_entrys_record_of_the_rest(tmp_path, monkeypatch):
  """`tx tune --force --candidates A B` times A and B again; the entry still lists the
  candidates it considered before and keeps their measurement as 'earlier'."""
  small = {'default': '', 'fast': '--f=1'}
  small |= {f'{n}_4_per_call': tune._with_per_call(c) for n, c in small.items()}
  monkeypatch.setattr(tune, 'default_candidates', lambda cfg, host: dict(small))
  times = {'default': 1.0, 'default_4_per_call': 0.9, 'fast': 0.9, 'fast_4_per_call': 0.8}
  calls = _scripted_settings(monkeypatch, times)
  env = {'TX_CACHE_DIR': str(tmp_path)}
  first = tune.tune(_cfg(), rounds=1, env=env, say=lambda m: None)
  assert first['choice'] == 'fast_4_per_call'
  calls.clear()
  times.update(default=0.5)
  named = {n: small[n] for n in ('default', 'fast')}
  entry = tune.tune(_cfg(), candidates=named, rounds=1, env=env, force=True, say=lambda m: None)
  assert sorted(n for group in calls for n in group) == ['default', 'fast']
  assert entry['choice'] == 'default' and set(entry['timings']) == set(named)
  assert entry['candidates'] == json.loads(json.dumps(small))
  assert entry['earlier']['choice'] == 'fast_4_per_call'
  assert entry['earlier']['timings'] == first['timings']


def test_a_lone_candidate_gets_an_untimed_call_even_without_warmup(monkeypatch):
  """With --warmup 0 a program's first call (its buffers' first use) is still not timed, for
  a candidate timed alone as for twins (`time_twins`), so that the two are timed alike."""
  cfg, calls = _cfg(), []
  monkeypatch.setattr(tune_step, 'compiled_step', lambda spec: ('call', 'state', 'batch', cfg, 0.0))
  def timed_calls(compiled, state, batch, per_call, n):
    calls.append(n)
    return state, [1.0] * n
  monkeypatch.setattr(tune_step, '_timed_calls', timed_calls)
  assert tune_step.time_step({'steps': 3, 'warmup': 0})['step_times_s'] == [1.0] * 3
  assert tune_step.time_step({'steps': 3, 'warmup': 2})['step_times_s'] == [1.0] * 3
  assert calls == [1, 3, 2, 3]


def test_time_twins_times_both_programs_on_one_state():
  """The twin worker in this process, on the tiny model: each variant's own steps per call,
  its share of the timed calls in each of the two blocks, after its warmup."""
  from tx.config.base import to_dict  # pylint: disable=g-import-not-at-top
  spec = {'config': to_dict(tune.one_device_config(_cfg())), 'steps': 4, 'warmup': 1,
          'model_overrides': {}, 'train_variants': [{}, {'steps_per_call': 2}]}
  one, two = tune_step.time_twins(spec)['variants']
  assert (one['steps_per_call'], two['steps_per_call']) == (1, 2)
  assert len(one['step_times_s']) == 4 and len(two['step_times_s']) == 2  # 2 / 1 a block
  assert one['pid'] == two['pid'] and all(t > 0 for t in one['step_times_s'] + two['step_times_s'])
