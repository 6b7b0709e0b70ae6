"""`tx bench --profile`: each side's step profiled by category, on toy cases."""

import gc
import json
import os

import pytest

from tx import cli
from tx.bench import cases, profile, suite, tuned

BERT = next(c for c in cases.QUICK if c.name == 'bert_mini')


def _tx_profile(**settings):
  return profile.tx_step(dict(BERT.spec, threads=2, profile_calls=1, **settings))


@pytest.fixture(scope='module')
def xla_profile():
  return _tx_profile()


def test_tx_profile_sorts_the_steps_thunks_into_categories(xla_profile):
  got = xla_profile
  assert set(got['per_category_ms']) == set(profile.CATEGORIES)
  for kind in ('dense GEMM', 'attention', 'optimizer'):
    assert got['per_category_ms'][kind] > 0, (kind, got['per_category_ms'])
    assert got['top'][kind], kind
  # XLA's attention: its batched products and softmax, under the attention layer, not its
  # projections
  details = [detail for _, _, detail in got['top']['attention']]
  assert all('self_attention' in d and '_proj/' not in d for d in details), details
  assert got['unprofiled_step_s'] > 0 and got['step_s'] > 0
  assert got['system_s'] >= 0 and got['faults'] >= 0
  # some op running is no more than the profiled step's time, and no less than any category
  step_ms = got['step_s'] * 1e3
  assert max(got['per_category_ms'].values()) <= got['all_ops_ms'] <= step_ms * 1.01
  assert got['all_ops_ms'] > 0.2 * step_ms  # the trace's thunks are found in the HLO
  assert all(isinstance(name, str) and ms >= 0 for name, ms in got['unmatched'])
  assert isinstance(got['async_dots'], int) and got['async_dots'] >= 0
  assert got['busy_ms'] and all(b > 0 for b in got['busy_ms'])
  json.dumps(got)


def test_torchs_kernels_in_the_step_land_in_their_categories(xla_profile):
  pytest.importorskip('torch')
  got = _tx_profile(attention_impl='torch', matmul_impl='torch', steps_per_call=2)
  ops = {kind: [op for op, _, _ in got['top'].get(kind, [])] for kind in profile.CATEGORIES}
  assert ops['attention'] and all(o.startswith('buffer_callback') for o in ops['attention'])
  assert ops['dense GEMM'] and all(o.startswith('buffer_callback') for o in ops['dense GEMM'])
  assert got['per_category_ms']['optimizer'] > 0  # inside the loop over the call's steps
  assert not any(o.startswith('buffer_callback') for o, _, _ in xla_profile['top']['dense GEMM'])


def _category(instruction: str, op_name: str) -> str:
  """The category of the one-instruction HLO module `instruction` (named `%op.1`) under
  `op_name`."""
  line = f'  %op.1 = f32[8,4]{{1,0}} {instruction}, metadata={{op_name="{op_name}"}}'
  hlo = 'ENTRY %main (a: f32[8,4]) -> f32[8,4] {\n' + line + '\n}\n'
  return profile.hlo_categories(hlo)['op.1'][0]


def test_a_custom_call_is_sorted_by_the_layer_that_makes_it():
  callback = ('custom-call(%a, %b), custom_call_target="xla_buffer_python_cpu_callback"')
  under = lambda layer: _category(callback, f'jit(step)/jvp(M)/encoder/{layer}/buffer_callback')
  assert under('layer_0/ffn/wi') == 'dense GEMM'
  assert under('layer_0/self_attention') == 'attention'
  assert under('layer_0/self_attention/self_attention._proj') == 'dense GEMM'
  assert under('layer_0/self_attention_norm') == 'norm'  # torch's LayerNorm


def test_the_norm_beside_attention_is_a_norm():
  under = lambda layer: _category('add(%a, %a)', f'jit(step)/jvp(M)/encoder/layer_0/{layer}/add')
  assert under('layer_0._residual/self_attention_norm') == 'norm'
  assert under('layer_0._residual/self_attention') == 'attention'


def test_an_op_without_an_op_name_takes_its_operands_category():
  """XLA's layout copies and converts carry no op_name: each belongs where the op whose
  output it moves does, through chains of them; with nothing to follow it stays 'other'."""
  attention = 'metadata={op_name="jit(step)/jvp(M)/decoder/layer_0/self_attention/exp"}'
  hlo = '\n'.join([
      'ENTRY %main (a: f32[8,4]) -> f32[8,4] {',
      '  %a = f32[8,4]{1,0} parameter(0)',
      f'  %exp.1 = f32[8,4]{{1,0}} exponential(%a), {attention}',
      '  %copy.1 = f32[8,4]{0,1} copy(%exp.1)',
      '  %convert.1 = bf16[8,4]{0,1} convert(%copy.1)',
      '  %copy.2 = f32[8,4]{0,1} copy(%a)',
      '  %dot.1 = f32[8,8]{1,0} dot(%exp.1, %a), lhs_contracting_dims={1}, '
      'rhs_contracting_dims={1}',
      '  %copy.3 = f32[8,8]{0,1} copy(%dot.1)',
      '  ROOT %add.1 = f32[8,4]{1,0} add(%a, %exp.1)',
      '}', ''])
  got = profile.hlo_categories(hlo)
  assert got['exp.1'][0] == 'attention'
  assert got['copy.1'] == ('attention', '') and got['convert.1'] == ('attention', '')
  assert got['copy.2'][0] == 'other'
  # a product keeps its own category, and a copy of it takes that
  assert got['dot.1'][0] == got['copy.3'][0] == 'dense GEMM'
  assert got['add.1'][0] == 'attention'  # its first operand with a category


def test_products_in_xlas_own_dot_thunk_are_counted_since_their_spans_read_short():
  """A `dot` instruction's thunk completes asynchronously (jax 0.10): its span is the launch.
  The report counts the traced ones and says that their rows read short; a dot inside a
  fusion (YNNPACK's) is timed whole and not counted."""
  hlo = '\n'.join([
      '%fused_dot (p0: f32[8,4], p1: f32[8,4]) -> f32[8,8] {',
      '  %p0 = f32[8,4]{1,0} parameter(0)',
      '  %p1 = f32[8,4]{1,0} parameter(1)',
      '  ROOT %dot.2 = f32[8,8]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, '
      'rhs_contracting_dims={1}',
      '}',
      'ENTRY %main (a: f32[8,4]) -> (f32[8,8], f32[8,8]) {',
      '  %a = f32[8,4]{1,0} parameter(0)',
      '  %ynn_fusion.1 = f32[8,8]{1,0} fusion(%a, %a), kind=kCustom, calls=%fused_dot',
      '  %dot.1 = f32[8,8]{1,0} dot(%a, %a), lhs_contracting_dims={1}, rhs_contracting_dims={1}',
      '  ROOT %t = (f32[8,8]{1,0}, f32[8,8]{1,0}) tuple(%ynn_fusion.1, %dot.1)',
      '}', ''])
  assert profile.async_dots(hlo, {'ynn_fusion.1', 'dot.1'}) == 1
  assert profile.async_dots(hlo, {'ynn_fusion.1'}) == 0
  tx = {'step_s': 0.01, 'unprofiled_step_s': 0.01, 'system_s': 0.0, 'faults': 0.0,
        'per_category_ms': dict.fromkeys(profile.CATEGORIES, 1.0), 'all_ops_ms': 4.0,
        'busy_ms': [4.0], 'top': {}, 'unmatched': [], 'async_dots': 1}
  doc = {'machine': {'host': {}, 'threads': 2}, 'cases': {'c': {'tx': tx}}}
  assert ("1 products ran in XLA's own dot thunk, whose spans cover the launch only: the dense "
          'GEMM and attention rows read short, and no op was traced for 6.0 ms of the step'
          in profile.table(doc))
  tx['async_dots'] = 0
  assert "XLA's own dot thunk" not in profile.table(doc)


def test_a_step_that_profiling_slowed_is_flagged_in_the_table():
  """Where the profiled step runs over 1.3x the unprofiled one, the table says so per side
  (its split is then the profiled step's); a step profiled at its own speed gets no line."""
  def side(profiled, plain):
    return {'step_s': profiled, 'unprofiled_step_s': plain, 'system_s': 0.0, 'faults': 0.0,
            'per_category_ms': dict.fromkeys(profile.CATEGORIES, 1.0), 'all_ops_ms': 4.0,
            'busy_ms': [4.0], 'top': {}, 'unmatched': []}
  doc = {'machine': {'host': {}, 'threads': 2},
         'cases': {'c': {'tx': side(0.1212, 0.0468), 'peer': side(0.070, 0.068)}}}
  text = profile.table(doc)
  assert 'tx: profiling slowed the step 2.6x (121.2 against 46.8 ms)' in text
  assert 'peer: profiling slowed' not in text
  doc['cases']['c']['tx'] = side(0.0468, 0.0468)
  assert 'profiling slowed' not in profile.table(doc)


@pytest.mark.parametrize('key, parents, kind', [
    ('aten::mm', ['autograd::engine::evaluate_function: MmBackward0'], 'dense GEMM'),
    ('aten::addmm', [], 'dense GEMM'),
    ('aten::_scaled_dot_product_flash_attention_for_cpu_backward', [], 'attention'),
    ('aten::native_layer_norm_backward', [], 'norm'),
    ('aten::mul_', ['Optimizer.step#AdamW.step'], 'optimizer'),
    ('aten::linalg_vector_norm', [], 'optimizer'),  # clip_grad_norm_
    ('aten::_log_softmax_backward_data', [], 'other'),  # the loss, not attention
    ('aten::gelu', [], 'other'),
])
def test_the_peers_ops_are_sorted_by_name_and_by_what_they_run_inside(key, parents, kind):
  assert profile.peer_category(key, parents) == kind


def test_bench_profile_runs_each_side_in_its_process_and_prints_a_table(capsys, tmp_path):
  pytest.importorskip('torch')
  pytest.importorskip('transformers')
  out = tmp_path / 'p.json'
  assert cli.main(['bench', '--quick', '--only', 'bert_mini', '--profile', '--quiet',
                   '--json', str(out)]) == 0
  text = capsys.readouterr().out
  assert 'bert_mini: ms per step' in text and 'aten::' in text and 'dense GEMM' in text
  doc = json.loads(out.read_text())
  got = doc['cases']['bert_mini']
  assert got['tx']['per_category_ms']['dense GEMM'] > 0
  assert got['peer']['per_category_ms']['dense GEMM'] > 0
  assert doc['machine']['host']


def test_the_peers_profile_leaves_no_profiler_session_alive():
  """A torch profiler session lives in a reference cycle and holds memory until the garbage
  collector frees it (GBs a step on the 6-layer cases); automatic collection is off here, so
  only `peer_step`'s own collection can free the sessions."""
  torch = pytest.importorskip('torch')
  pytest.importorskip('transformers')
  sessions = lambda: sum(type(o) is torch.profiler.profile for o in gc.get_objects())
  gc.collect()
  before = sessions()
  gc.disable()
  try:
    got = profile.peer_step(dict(BERT.spec, threads=2, profile_calls=2))
    alive = sessions()
  finally:
    gc.enable()
  assert got['per_category_ms']['dense GEMM'] > 0 and got['step_s'] > 0
  assert alive == before


@pytest.mark.parametrize('argv', [
    ['--platform', 'gpu'], ['--rounds', '2'], ['--ablate-attention'], ['--peer-compile']])
def test_bench_profile_refuses_what_it_does_not_do_in_one_line(argv, capsys):
  assert cli.main(['bench', '--quick', '--profile', *argv]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and '--profile' in err[0]


def test_bench_profile_of_no_training_case_is_a_user_error():
  with pytest.raises(Exception, match='no training case'):
    suite.profiles([c for c in cases.QUICK if c.kinds == ('compile',)], say=lambda m: None)


def test_bench_profile_with_tune_profiles_tx_with_the_choice_and_the_peer_as_many_steps(
    monkeypatch):
  entry = {'choice': 'torch_attention_4_per_call', 'xla_flags': '--xla_x=1',
           'model_overrides': {'attention_impl': 'torch'},
           'train_overrides': {'steps_per_call': 4}, 'timings': {}}
  monkeypatch.setattr(tuned.tune, 'tune', lambda cfg, **kw: entry)
  calls = []

  def fake_run(target, spec, *, threads, env=None, platform='cpu'):
    del threads, platform
    calls.append((target.split(':')[1], spec, env))
    return {'unprofiled_step_s': 1.0, 'per_category_ms': dict.fromkeys(profile.CATEGORIES, 1.0)}

  monkeypatch.setattr(suite, 'run_isolated', fake_run)
  doc = suite.profiles([BERT], say=lambda m: None, tune=True)
  by = {name: (spec, env) for name, spec, env in calls}
  assert by['tx_step'][0] == dict(BERT.spec, profile_calls=2, attention_impl='torch',
                                  steps_per_call=4)
  assert by['tx_step'][1] == {'XLA_FLAGS': '--xla_x=1'}
  assert by['peer_step'][0]['steps_per_call'] == 4 and by['peer_step'][1] is None
  assert 'attention_impl' not in by['peer_step'][0]
  assert doc['cases']['bert_mini']['tuned']['choice'] == 'torch_attention_4_per_call'


TINY = ['model.d_model=32', 'model.num_heads=2', 'model.d_ff=64', 'model.num_layers=1',
        'model.max_len=16', 'data.seq_len=16', 'train.batch_size=4']


def test_tx_profile_profiles_an_experiments_step_with_its_tuned_choice(
    capsys, tmp_path, monkeypatch):
  """`tx profile`: the experiment's own step (overrides included) in a process of its own,
  with `tx tune`'s cached model and loop settings unless --no-tune."""
  from tx.bench import host as host_lib  # pylint: disable=g-import-not-at-top
  from tx import registry  # pylint: disable=g-import-not-at-top
  from tx.config.base import parse_overrides  # pylint: disable=g-import-not-at-top
  from tx.runs import tune  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv('TX_CACHE_DIR', str(tmp_path))
  cfg = registry.get('demo', parse_overrides(TINY))
  path = tune.entry_path(cfg, host_lib.probe(dict(os.environ)), dict(os.environ))
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps({'choice': 'onednn_2_per_call', 'timings': {},
                              'xla_flags': '--xla_cpu_use_onednn=true',
                              'train_overrides': {'steps_per_call': 2}}))
  seen, flags = [], []
  real = suite.run_isolated

  def spy(target, spec, **kw):
    seen.append(spec)
    flags.append(kw['env']['XLA_FLAGS'])
    return real(target, spec, **kw)

  monkeypatch.setattr('tx.bench.worker.run_isolated', spy)
  out = tmp_path / 'p.json'
  assert cli.main(['profile', 'demo', '--set', *TINY, '--calls', '1', '--json', str(out)]) == 0
  captured = capsys.readouterr()
  assert 'demo: ms per step' in captured.out and 'dense GEMM' in captured.out
  assert 'train.steps_per_call=2, chosen by `tx tune`' in captured.err
  got = json.loads(out.read_text())['cases']['demo']['tx']
  assert got['per_category_ms']['dense GEMM'] > 0 and got['per_category_ms']['attention'] > 0
  assert seen[-1]['config']['train']['steps_per_call'] == 2
  assert seen[-1]['config']['model']['d_model'] == 32
  assert '--xla_cpu_use_onednn=true' in flags[-1]  # the worker's XLA, not this process's
  assert cli.main(['profile', 'demo', '--set', *TINY, '--calls', '1', '--no-tune']) == 0
  assert seen[-1]['config']['train']['steps_per_call'] is None  # the defaults: 1 a call
  assert '--xla_cpu_use_onednn=true' not in flags[-1]


@pytest.mark.parametrize('argv, says', [
    (['profile', 'demo', '--calls', '0'], '--calls and --top must be >= 1'),
    (['profile', 'demo', '--threads', '0'], '--threads must be >= 1'),
    (['profile', 'demo', '--json', '/nonexistent/dir/p.json'], 'directory does not exist'),
    (['profile', 'nosuch'], 'nosuch'),
])
def test_tx_profile_errors_are_one_line(argv, says, capsys):
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and says in err[0]
