"""Data, FSDP and tensor parallelism on 8 simulated CPU devices (one child process).

The child sets XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is
imported, trains the reference tiny decoder (the session's `decoder_run`, 1 device)
under three meshes and reports losses and the shardings of the final state.
"""

import json
import subprocess

import jax
import pytest

CHILD = r'''
import json, sys
from pathlib import Path
import jax
from tx.config.base import ConfigError, from_dict, override
from tx.config.experiment import ExperimentConfig
from tx.train.loop import train

assert jax.device_count() == 8, jax.devices()
jobs = json.loads(Path(sys.argv[1]).read_text())
base = from_dict(ExperimentConfig, jobs['config'])
out = {}


def spec(x):
  return [a if a is None or isinstance(a, str) else list(a) for a in x.sharding.spec]


def adam_moments(opt_state):
  found = [s for s in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda s: hasattr(s, 'mu'))
           if hasattr(s, 'mu')]
  assert len(found) == 1, found
  return found[0]


for label, mesh in jobs['meshes'].items():
  cfg = override(base, {f'mesh.{k}': v for k, v in mesh.items()})
  workdir = Path(jobs['workdir']) / label
  result = train(cfg, workdir, quiet=True)
  state = result.state
  rows = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  flat = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_leaves_with_path(state.params)}
  adam = adam_moments(state.opt_state)
  mu_same = all(m.sharding == p.sharding and n.sharding == p.sharding
                for p, m, n in zip(jax.tree_util.tree_leaves(state.params),
                                   jax.tree_util.tree_leaves(adam.mu),
                                   jax.tree_util.tree_leaves(adam.nu)))
  out[label] = {
      'mesh': dict(result.state.step.sharding.mesh.shape),
      'losses': [r['loss'] for r in rows if 'loss' in r],
      'eval_loss': result.summary['eval']['loss'],
      'specs': {k: spec(x) for k, x in flat.items()},
      'replicated': {k: x.sharding.is_fully_replicated for k, x in flat.items()},
      'shard_shapes': {k: list(x.addressable_shards[0].data.shape) for k, x in flat.items()},
      'mu_follows_params': mu_same,
      'scalars_replicated': all(x.sharding.is_fully_replicated
                                for x in (state.step, state.rng, adam.count)),
      'devices': result.summary['devices'],
  }

# A parameter dimension the mesh does not divide is a config error naming it, raised
# before anything is written.
bad = override(base, {'model.d_model': 36, 'model.num_heads': 2, 'mesh.data': 1,
                      'mesh.fsdp': 8})
bad_dir = Path(jobs['workdir']) / 'indivisible'
try:
  train(bad, bad_dir, quiet=True)
  out['indivisible'] = {'error': None}
except ConfigError as e:
  out['indivisible'] = {'error': str(e), 'workdir_exists': bad_dir.exists()}
Path(jobs['out']).write_text(json.dumps(out))
'''

MESHES = {'dp': {'data': -1}, 'fsdp': {'data': 1, 'fsdp': 8},
          'dp_fsdp_tp': {'data': 2, 'fsdp': 2, 'tensor': 2}}
QUERY = "['decoder']['stack']['layer_0']['self_attention']['query']['kernel']"  # embed heads kv
OUT = "['decoder']['stack']['layer_0']['self_attention']['out']['kernel']"  # heads kv embed
WI = "['decoder']['stack']['layer_0']['ffn']['wi']['kernel']"  # embed mlp
WO = "['decoder']['stack']['layer_0']['ffn']['wo']['kernel']"  # mlp embed
NORM = "['decoder']['stack']['final_norm']['scale']"  # embed
EMBED = "['embed']['embedding']"  # vocab embed


@pytest.fixture(scope='module')
def sharded(tt, decoder_run, tmp_path_factory):
  workdir, reference = decoder_run
  tmp = tmp_path_factory.mktemp('sharding')
  jobs = {'config': json.loads(tt.config_json(reference.config)), 'meshes': MESHES,
          'workdir': str(tmp / 'runs'), 'out': str(tmp / 'out.json')}
  (tmp / 'jobs.json').write_text(json.dumps(jobs))
  (tmp / 'child.py').write_text(CHILD)
  proc = subprocess.run([tt.python, str(tmp / 'child.py'), str(tmp / 'jobs.json')],
                        env=tt.env(devices=8), capture_output=True, text=True, timeout=400)
  assert proc.returncode == 0, proc.stderr[-4000:]
  ref_rows, _ = tt.rows(workdir)
  return json.loads((tmp / 'out.json').read_text()), ref_rows, reference


def test_reference_run_is_single_device(sharded):
  _, _, reference = sharded
  assert reference.summary['devices'] == 1


def _needs_cpu_reference():
  if jax.default_backend() != 'cpu':
    pytest.skip(f'the reference run is on {jax.default_backend()}; the 8-device runs are on CPU')


@pytest.mark.parametrize('label', list(MESHES))
def test_losses_match_one_device(sharded, label):
  out, ref_rows, reference = sharded
  run = out[label]
  assert run['devices'] == 8
  _needs_cpu_reference()
  ref = [r['loss'] for r in ref_rows]
  assert len(run['losses']) == len(ref) == 6
  assert run['losses'] == pytest.approx(ref, rel=1e-5)
  assert run['eval_loss'] == pytest.approx(reference.summary['eval']['loss'], rel=1e-5)


def test_mesh_shapes(sharded):
  out, _, _ = sharded
  assert out['dp']['mesh'] == {'data': 8, 'fsdp': 1, 'tensor': 1}
  assert out['fsdp']['mesh'] == {'data': 1, 'fsdp': 8, 'tensor': 1}
  assert out['dp_fsdp_tp']['mesh'] == {'data': 2, 'fsdp': 2, 'tensor': 2}


def test_data_parallel_replicates_parameters(sharded):
  out, _, _ = sharded
  assert all(out['dp']['replicated'].values())


def test_fsdp_shards_the_embed_axis(sharded):
  run = sharded[0]['fsdp']
  specs, shapes = run['specs'], run['shard_shapes']
  assert specs[WI][0] == 'fsdp' and shapes[WI] == [32 // 8, 64]
  assert specs[WO][1] == 'fsdp' and shapes[WO] == [64, 32 // 8]
  assert specs[QUERY][0] == 'fsdp' and shapes[QUERY] == [32 // 8, 4, 8]
  assert specs[OUT][2] == 'fsdp'
  assert specs[EMBED][1] == 'fsdp' and shapes[EMBED] == [38, 32 // 8]
  # Norm scales are ('embed',) too: d_model 32 divides by 8, so they are sharded as well
  # (an indivisible dimension is an error, never a silent replication: see below).
  assert specs[NORM] == ['fsdp'] and shapes[NORM] == [32 // 8]
  # Exactly the parameters without an 'embed' axis are replicated (the tiny decoder has no
  # biases, so every parameter has one here).
  for name, spec in specs.items():
    assert run['replicated'][name] == ('fsdp' not in spec), (name, spec)


def test_tensor_parallel_splits_heads_and_mlp(sharded):
  run = sharded[0]['dp_fsdp_tp']
  specs, shapes = run['specs'], run['shard_shapes']
  assert specs[QUERY] == ['fsdp', 'tensor', None] and shapes[QUERY] == [16, 2, 8]
  assert specs[OUT][:2] == ['tensor', None] and specs[OUT][2] == 'fsdp'
  assert specs[WI] == ['fsdp', 'tensor'] and shapes[WI] == [16, 32]
  assert specs[WO] == ['tensor', 'fsdp'] and shapes[WO] == [32, 16]
  assert specs[EMBED] == ['tensor', 'fsdp'] and shapes[EMBED] == [19, 16]
  assert specs[NORM] == ['fsdp']


@pytest.mark.parametrize('label', list(MESHES))
def test_optimizer_state_follows_parameters(sharded, label):
  run = sharded[0][label]
  assert run['mu_follows_params']
  assert run['scalars_replicated']


def test_indivisible_dimension_is_a_config_error(sharded):
  bad = sharded[0]['indivisible']
  assert bad['error'] is not None, 'd_model=36 on fsdp=8 trained instead of failing'
  assert 'mesh' in bad['error'] and '36' in bad['error'] and "['decoder']" in bad['error']
  assert not bad['workdir_exists'], 'the failed run left a workdir behind'
