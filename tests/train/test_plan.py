"""`tx plan`: per-device memory follows the sharding, the CLI's output, verdict and errors.

One child process with 8 simulated CPU devices compiles a tiny decoder (2 layers, d 64, 4 heads,
d_ff 128, vocab 512, batch 16 x 32) for data=8, fsdp=8 and data=2 x fsdp=4; one `tx plan`
subprocess compiles fsdp=4 x tensor=2 and checks the table, --json and the verdict (five
compiles in all, one of them 4 steps per call). Every dimension is a multiple of 8, so every
parameter has an axis the fsdp rule ('embed' -> fsdp) splits: params and AdamW moments divide
by 8 exactly; the only replicated optimizer leaves are scalars (AdamW's step count), whose
bytes we bound by 64. Errors are checked in-process: no XLA compile (shapes are traced only).
"""

import json
import subprocess
import sys

import jax
import pytest

from tx.cli import main

SETS = ['model.d_model=64', 'model.num_heads=4', 'model.d_ff=128', 'model.num_layers=2',
        'model.max_len=32', 'data.tokenizer=bpe',
        'data.vocab_size=512', 'data.seq_len=32', 'train.batch_size=16']
MESHES = {'data8': {'data': 8}, 'fsdp8': {'fsdp': 8}, 'data2_fsdp4': {'data': 2, 'fsdp': 4}}
STATE_SCALARS = 4 + 8 + 4  # TrainState.step (int32), rng (2 x uint32), skips (int32)

CHILD = r'''
import json, sys
import jax
from tx import registry
from tx.config.base import parse_overrides
from tx.runs import plan as planning
from tx.runs.plan_cli import backend_started, ensure_devices, format_plan
imported_without_backend = not backend_started()
assert ensure_devices(8)
sets, meshes = json.loads(sys.argv[1]), json.loads(sys.argv[2])
cfg = registry.get('demo', parse_overrides(sets))
out = {'imported_without_backend': imported_without_backend}
for name, mesh in meshes.items():
  memory = planning.parse_bytes('1TB') if name == 'fsdp8' else None
  p = planning.plan(cfg, mesh, memory)
  out[name] = dict(p.to_json(), table=format_plan(p))
# The call of 4 steps that `tx train` compiles with train.steps_per_call=4
per_call = planning.plan(cfg.replace(train=cfg.train.replace(steps_per_call=4)), {'data': 8})
out['data8_4_per_call'] = dict(per_call.to_json(), table=format_plan(per_call))
# Per-leaf shard bytes without compiling: tensor=2 next to the same fsdp without it.
for name, mesh in (('leaves_data2_fsdp4', {'data': 2, 'fsdp': 4}),
                   ('leaves_fsdp4_tensor2', {'fsdp': 4, 'tensor': 2})):
  abstract, _ = planning.abstract_state(planning.check(planning.with_mesh(cfg, mesh)))
  out[name] = {jax.tree_util.keystr(k): [planning.shard_bytes(v), 'tensor' in str(v.sharding.spec)]
               for k, v in jax.tree_util.tree_leaves_with_path(abstract.params)}
print(json.dumps(out))
'''


@pytest.fixture(scope='module')
def plans(tt):
  r = subprocess.run([tt.python, '-c', CHILD, json.dumps(SETS), json.dumps(MESHES)],
                     env=tt.env(), capture_output=True, text=True, timeout=300, check=False)
  assert r.returncode == 0, r.stderr[-3000:]
  return dict(json.loads(r.stdout.splitlines()[-1]), stderr=r.stderr)


def test_importing_tx_leaves_the_backend_alone(plans):
  assert plans['imported_without_backend']


def test_fsdp_divides_params_and_optimizer_by_the_devices(plans):
  data, fsdp = plans['data8'], plans['fsdp8']
  assert data['num_params'] == fsdp['num_params'] and data['devices'] == fsdp['devices'] == 8
  assert data['param_bytes'] == 4 * data['num_params']  # fp32 params, replicated
  assert fsdp['param_bytes'] * 8 == data['param_bytes']  # exact: every leaf splits
  moments = 2 * data['param_bytes']  # AdamW mu and nu, shaped and sharded like the params
  scalars = data['optimizer_bytes'] - moments
  assert 0 < scalars <= 64
  assert fsdp['optimizer_bytes'] == moments // 8 + scalars
  # The compiled executable's arguments are exactly these shards (+ the batch and 3 scalars):
  # compile memory grows as the sharding predicts.
  for p in (data, fsdp):
    assert p['argument_bytes'] == (p['param_bytes'] + p['optimizer_bytes'] + p['batch_bytes']
                                   + STATE_SCALARS)
    assert p['alias_bytes'] >= p['param_bytes'] + p['optimizer_bytes']  # the state is donated
    assert p['total_bytes'] == (p['argument_bytes'] + p['output_bytes'] - p['alias_bytes']
                                + p['temp_bytes'] + p['code_bytes'])
  assert data['argument_bytes'] - fsdp['argument_bytes'] == (data['param_bytes'] + moments) * 7 // 8
  assert fsdp['total_bytes'] < data['total_bytes']


def test_data_and_fsdp_together_compile_without_a_full_rematerialization(plans):
  """Batch-sharded activations meet embed-sharded tables only through an all-gather: XLA
  would otherwise replicate whole activations (the embedding lookup and its gradient)."""
  assert plans['data2_fsdp4']['devices'] == 8
  assert 'Involuntary full rematerialization' not in plans['stderr'], plans['stderr'][-3000:]


def test_tensor_axis_halves_the_sharded_matrices(plans):
  without, with_t = plans['leaves_data2_fsdp4'], plans['leaves_fsdp4_tensor2']
  assert without.keys() == with_t.keys()
  # Every matrix has a 'heads', 'mlp' or 'vocab' axis (-> tensor); the norm scales have none.
  split = {k for k, (_, on_tensor) in with_t.items() if on_tensor}
  assert split == {k for k in with_t if "['scale']" not in k} and len(split) == 1 + 2 * 7
  for k, (size, on_tensor) in with_t.items():
    assert size * (2 if on_tensor else 1) == without[k][0], k


def test_flops_and_fits(plans):
  fsdp = plans['fsdp8']
  tokens = 16 * 32
  assert fsdp['flops_model'] >= 6 * fsdp['num_params'] * tokens * 0.9  # 6N per token (+ attention)
  assert fsdp['flops_compiled_per_device'] > 0 and fsdp['compile_s'] > 0
  assert fsdp['fits'] is True and fsdp['headroom_bytes'] == 1024 ** 4 - fsdp['total_bytes']
  assert 'yes' in fsdp['table'] and plans['data8']['fits'] is None


def test_steps_per_call_plans_the_call_tx_train_compiles(plans):
  one, four = plans['data8'], plans['data8_4_per_call']
  assert one['steps_per_call'] == 1 and four['steps_per_call'] == 4
  assert four['batch_bytes'] == 4 * one['batch_bytes']  # the call's 4 batches
  assert four['param_bytes'] == one['param_bytes'] and four['temp_bytes'] > 0
  assert four['flops_model'] == one['flops_model']  # per step
  assert '4 steps per call' in four['table'] and 'per call' not in one['table']


def test_cli_table_json_and_verdict(tt, tmp_path, plans):
  """`tx plan` from a process whose backend already runs with 1 device: re-runs in a child.
  The compiled fsdp=4 x tensor=2 step's arguments are the shards
  test_tensor_axis_halves_the_sharded_matrices computes."""
  out = tmp_path / 'plan.json'
  argv = ['plan', 'demo', '--mesh', 'fsdp=4,tensor=2', '--set', *SETS, '--device-memory', '1KB',
          '--json', str(out)]
  code = ('import sys, jax; assert jax.device_count() == 1; from tx.cli import main; '
          f'sys.exit(main({argv!r}))')
  r = subprocess.run([tt.python, '-c', code], env=tt.env(), capture_output=True, text=True,
                     timeout=300, check=False)
  assert r.returncode == 0, r.stderr[-3000:]
  for label in ('parameters', 'optimizer state', 'temporaries', 'total', 'FLOPs per step',
                'compile', 'mesh data=1 fsdp=4 tensor=2', '8 simulated cpu'):
    assert label in r.stdout, (label, r.stdout)
  assert 'NO,' in r.stdout.splitlines()[-1] and 'short' in r.stdout
  got = json.loads(out.read_text())
  for key in ('param_bytes', 'optimizer_bytes', 'temp_bytes', 'total_bytes', 'flops_model',
              'flops_compiled_per_device', 'compile_s', 'devices', 'mesh', 'num_params',
              'device_memory', 'headroom_bytes'):
    assert key in got, key
  assert got['fits'] is False and got['device_memory'] == 1024
  leaves = plans['leaves_fsdp4_tensor2']
  assert got['param_bytes'] == sum(size for size, _ in leaves.values())
  data = plans['data8']  # the same replicated optimizer scalars next to mu and nu
  assert got['optimizer_bytes'] - 2 * got['param_bytes'] == (data['optimizer_bytes']
                                                             - 2 * data['param_bytes'])
  assert got['argument_bytes'] == (got['param_bytes'] + got['optimizer_bytes']
                                   + got['batch_bytes'] + STATE_SCALARS)
  assert got['batch_bytes'] == plans['fsdp8']['batch_bytes'] * 2  # 4 data shards, not 8


ERRORS = [  # (id, arguments after `tx plan demo`, substrings of the one line)
    ('mesh_axis', ['--mesh', 'pipeline=2'], ['--mesh', 'pipeline=2', 'data, fsdp, tensor']),
    ('mesh_size', ['--mesh', 'data=x'], ['--mesh', 'data=x']),
    ('mesh_zero', ['--mesh', 'fsdp=0'], ['--mesh', 'SIZE >= 1']),
    ('mesh_twice', ['--mesh', 'data=2,data=4'], ['--mesh', 'each once']),
    ('mesh_huge', ['--mesh', 'data=100000'], ['--mesh', 'at most']),
    ('batch_not_divided', ['--mesh', 'data=3'], ['train.batch_size', '16', '3']),
    ('tensor_not_dividing', ['--mesh', 'tensor=3'], ['mesh', 'tensor', 'do not divide']),
    ('memory_unit', ['--mesh', 'fsdp=2', '--device-memory', '80XB'], ['--device-memory', '80XB']),
    ('memory_negative', ['--mesh', 'fsdp=2', '--device-memory=-1GB'], ['--device-memory', '-1GB']),
    ('bad_set', ['--mesh', 'fsdp=2', '--set', 'model.d_modl=8'], ['model.d_modl']),
    ('json_folder', ['--mesh', 'fsdp=2', '--json', '/nonexistent/x.json'], ['--json']),
]


@pytest.mark.parametrize('name,args,expected', ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_are_one_line_before_compiling(name, args, expected, capsys):
  del name
  seen = []
  listener = lambda event, duration, **kw: (
      seen.append(event) if 'backend_compile' in event else None)
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    code = main(['plan', 'demo', *args])
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  out, err = capsys.readouterr()
  lines = [line for line in err.splitlines() if line.strip()]
  assert code == 2 and out == '' and len(lines) == 1, err
  assert lines[0].startswith('tx plan: error:') and 'Traceback' not in err
  for text in expected:
    assert text in lines[0], (text, lines[0])
  assert not seen


def test_unknown_experiment_and_missing_mesh(capsys):
  assert main(['plan', 'no_such', '--mesh', 'fsdp=2']) == 2
  assert 'no_such' in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:
    main(['plan', 'demo'])
  assert e.value.code == 2 and '--mesh' in capsys.readouterr().err
