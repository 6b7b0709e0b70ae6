"""tx.train.optimizer: schedules against their formulas, the decay mask, decay, clipping."""

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import tx
from tx.config import ConfigError, OptimConfig, override
from tx.train.optimizer import learning_rate_schedule, make_optimizer, weight_decay_mask

D = 64


def lr_at(cfg, steps, total_steps=1000):
  schedule = learning_rate_schedule(cfg, total_steps=total_steps, d_model=D)
  return np.array([float(schedule(s)) for s in steps])


# --- schedules --------------------------------------------------------------------------

def test_constant_warms_up_linearly_then_holds():
  cfg = OptimConfig(schedule='constant', learning_rate=0.1, warmup_steps=10)
  np.testing.assert_allclose(lr_at(cfg, [0, 5, 10, 11, 999, 5000]),
                             [0.0, 0.05, 0.1, 0.1, 0.1, 0.1], rtol=1e-6)
  np.testing.assert_allclose(lr_at(cfg.replace(warmup_steps=0), [0, 7]), [0.1, 0.1], rtol=1e-6)


def test_cosine_matches_formula_and_holds_floor():
  peak, floor, w, d = 0.1, 0.01, 10, 110
  cfg = OptimConfig(schedule='cosine', learning_rate=peak, min_learning_rate=floor,
                    warmup_steps=w, decay_steps=d)
  steps = [0, 5, 10, 35, 60, 97, 110, 111, 10_000]
  def formula(t):
    if t < w:
      return peak * t / w
    progress = min(t - w, d - w) / (d - w)
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
  got = lr_at(cfg, steps)
  np.testing.assert_allclose(got, [formula(t) for t in steps], rtol=1e-5, atol=1e-9)
  assert got[4] == pytest.approx((peak + floor) / 2, rel=1e-5)  # midpoint of the decay
  assert got[6] == got[-1] == pytest.approx(floor, rel=1e-6)


def test_decay_steps_defaults_to_total_steps():
  cfg = OptimConfig(schedule='cosine', learning_rate=1.0, min_learning_rate=0.0, warmup_steps=0)
  assert lr_at(cfg, [250], total_steps=500)[0] == pytest.approx(0.5, abs=1e-6)
  assert lr_at(cfg, [500], total_steps=500)[0] == pytest.approx(0.0, abs=1e-7)


def test_run_shorter_than_warmup_stays_in_warmup():
  cfg = OptimConfig(schedule='cosine', learning_rate=1.0, warmup_steps=100)
  np.testing.assert_allclose(lr_at(cfg, [0, 10], total_steps=20), [0.0, 0.1], rtol=1e-6)


def test_nanogpt_cosine_setting():
  cfg = OptimConfig(name='adamw', learning_rate=1e-3, b2=0.99, weight_decay=0.1, schedule='cosine',
                    warmup_steps=100, min_learning_rate=1e-4)
  got = lr_at(cfg, [0, 50, 100, 2000, 2500], total_steps=2000)
  np.testing.assert_allclose(got, [0.0, 5e-4, 1e-3, 1e-4, 1e-4], rtol=1e-5)


def test_linear_decays_to_floor_and_holds():
  cfg = OptimConfig(schedule='linear', learning_rate=1.0, min_learning_rate=0.2, warmup_steps=4,
                    decay_steps=24)
  np.testing.assert_allclose(lr_at(cfg, [0, 2, 4, 14, 24, 100]), [0, 0.5, 1.0, 0.6, 0.2, 0.2],
                             rtol=1e-6, atol=1e-7)


def test_inverse_sqrt_is_the_paper_formula():
  w = 40
  cfg = OptimConfig(name='adam', learning_rate=1.0, b2=0.98, eps=1e-9, schedule='inverse_sqrt',
                    warmup_steps=w)
  counts = np.arange(0, 400)
  got = lr_at(cfg, counts)
  paper_step = counts + 1.0  # optax count 0 is the paper's step 1
  expected = D ** -0.5 * np.minimum(paper_step ** -0.5, paper_step * w ** -1.5)
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  assert np.isfinite(got[0]) and got[0] > 0
  assert np.argmax(got) == w - 1  # paper step == warmup
  assert got.max() == pytest.approx(D ** -0.5 * w ** -0.5, rel=1e-6)
  assert got[4 * w - 1] / got[w - 1] == pytest.approx(0.5, rel=1e-5)  # decays as step^-0.5
  doubled = lr_at(cfg.replace(learning_rate=2.0), [w - 1])[0]
  assert doubled == pytest.approx(2 * got[w - 1], rel=1e-6)


# --- weight-decay mask ------------------------------------------------------------------

def _tiny_params(**kw):
  """Boxed abstract params (shapes only: eval_shape skips the slow op-by-op init)."""
  base = dict(vocab_size=40, d_model=16, num_heads=2, d_ff=32, num_layers=1, max_len=16)
  base.update(kw)
  cfg = tx.ModelConfig(**base)
  return jax.eval_shape(lambda: tx.init_params(cfg, jax.random.key(0)))


def _kind(path):
  names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
  if names[-2].endswith('_norm'):
    return 'norm'
  if names[-1] in ('bias', 'bi', 'bo'):
    return 'bias'
  if 'embedding' in names[-1]:
    return 'embedding'
  return 'other'


@pytest.fixture(scope='module')
def trees():
  return [
      _tiny_params(position='learned', embed_norm=True, tie_embeddings=False),
      _tiny_params(family='encoder', type_vocab_size=2, embed_norm=True),
      _tiny_params(family='encoder_decoder', position='t5', norm='rmsnorm',
                   moe=tx.MoEConfig(num_experts=2)),
      _tiny_params(num_layers=2, scan_layers=True),
  ]


def test_mask_excludes_norms_biases_embeddings_by_default(trees):
  seen = set()
  for boxed in trees:
    params = nn.unbox(boxed)
    mask = weight_decay_mask(params, OptimConfig())
    for path, decay in jax.tree_util.tree_leaves_with_path(mask):
      kind = _kind(path)
      seen.add(kind)
      assert decay == (kind == 'other'), jax.tree_util.keystr(path)
    all_on = OptimConfig(decay_norms=True, decay_biases=True, decay_embeddings=True)
    assert all(jax.tree_util.tree_leaves(weight_decay_mask(params, all_on)))
  assert seen == {'norm', 'bias', 'embedding', 'other'}


def test_each_flag_turns_on_its_own_group(trees):
  params = nn.unbox(trees[1])
  for flag, kind in (('decay_norms', 'norm'), ('decay_biases', 'bias'),
                     ('decay_embeddings', 'embedding')):
    mask = weight_decay_mask(params, OptimConfig(**{flag: True}))
    for path, decay in jax.tree_util.tree_leaves_with_path(mask):
      assert decay == (_kind(path) in ('other', kind)), (flag, jax.tree_util.keystr(path))


def test_mask_keeps_the_structure_of_boxed_and_unboxed_params(trees):
  boxed = trees[0]
  unboxed = nn.unbox(boxed)
  cfg = OptimConfig()
  mask_boxed, mask_unboxed = weight_decay_mask(boxed, cfg), weight_decay_mask(unboxed, cfg)
  assert jax.tree_util.tree_structure(mask_boxed) == jax.tree_util.tree_structure(boxed)
  assert jax.tree_util.tree_structure(mask_unboxed) == jax.tree_util.tree_structure(unboxed)
  assert nn.unbox(mask_boxed) == mask_unboxed


# --- the optimizer ----------------------------------------------------------------------

def _toy_params():
  return {'ffn': {'wi': {'kernel': jnp.ones((3, 4)), 'bias': jnp.ones(4)}},
          'ffn_norm': {'scale': jnp.ones(4)}, 'embed': {'embedding': jnp.ones((5, 4))}}


def _one_update(cfg, params, grads, total_steps=10):
  """Params after the first update (jitted: one compile instead of one per op)."""
  optimizer, _ = make_optimizer(cfg, total_steps=total_steps, d_model=D)

  @jax.jit
  def update(params, grads):
    updates, _ = optimizer.update(grads, optimizer.init(params), params)
    return optax.apply_updates(params, updates)

  return update(params, grads)


@pytest.mark.parametrize('name', ['adamw', 'adafactor', 'sgd'])
def test_decoupled_decay_shrinks_kernels_only(name):
  lr, wd = 0.1, 0.5
  cfg = OptimConfig(name=name, learning_rate=lr, weight_decay=wd, schedule='constant')
  params = _toy_params()
  new = _one_update(cfg, params, jax.tree_util.tree_map(jnp.zeros_like, params))
  np.testing.assert_allclose(new['ffn']['wi']['kernel'], 1 - lr * wd, rtol=1e-6)
  for kept in (new['ffn']['wi']['bias'], new['ffn_norm']['scale'], new['embed']['embedding']):
    np.testing.assert_array_equal(kept, 1.0)


def test_clipping_bounds_the_gradient_norm():
  cfg = OptimConfig(name='sgd', b1=0.0, learning_rate=1.0, schedule='constant', clip_norm=1.0)
  params = {'w': jnp.zeros(3), 'v': jnp.zeros((2, 2))}
  direction = {'w': jnp.array([1.0, -2.0, 2.0]), 'v': jnp.array([[0.0, 4.0], [0.0, 0.0]])}
  unit = jax.tree_util.tree_map(lambda g: g / optax.tree.norm(direction), direction)
  huge = jax.tree_util.tree_map(lambda g: 1e6 * g, direction)
  clipped = _one_update(cfg, params, huge)
  np.testing.assert_allclose(optax.tree.norm(clipped), 1.0, rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(clipped),
                  jax.tree_util.tree_leaves(_one_update(cfg, params, unit))):
    np.testing.assert_allclose(a, b, rtol=1e-6)
  for off in (None, 0.0):
    unclipped = _one_update(cfg.replace(clip_norm=off), params, huge)
    assert float(optax.tree.norm(unclipped)) == pytest.approx(1e6 * 5.0, rel=1e-6)


@pytest.mark.parametrize('name', ['adafactor', 'sgd', 'adamw', 'adam'])
def test_one_update_on_a_tiny_model(name, trees):
  shapes = nn.unbox(trees[0])  # decoder with learned positions, embed norm, untied head
  params = jax.tree_util.tree_map(lambda s: jnp.full(s.shape, 0.5, s.dtype), shapes)
  wd = 0.0 if name == 'adam' else 0.01
  cfg = OptimConfig(name=name, learning_rate=1e-2, weight_decay=wd, warmup_steps=0)
  grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.1), params)
  new = _one_update(cfg, params, grads)
  assert jax.tree_util.tree_structure(new) == jax.tree_util.tree_structure(params)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree_util.tree_leaves(new))
  changed = [not np.allclose(a, b) for a, b in
             zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(params))]
  assert all(changed)


# --- config errors ----------------------------------------------------------------------

@pytest.mark.parametrize('kwargs, key', [
    (dict(name='adam', weight_decay=0.1), 'optim.weight_decay'),
    (dict(schedule='inverse_sqrt', warmup_steps=0), 'optim.warmup_steps'),
    (dict(name='lion'), 'optim.name'),
    (dict(schedule='exponential'), 'optim.schedule'),
    (dict(learning_rate=0.0), 'optim.learning_rate'),
    (dict(b2=1.0), 'optim.b2'),
    (dict(warmup_steps=100, decay_steps=50), 'optim.decay_steps'),
    (dict(learning_rate=1e-3, min_learning_rate=1e-2), 'optim.min_learning_rate'),
    (dict(clip_norm=-1.0), 'optim.clip_norm'),
    (dict(grad_accum_steps=0), 'optim.grad_accum_steps'),
])
def test_bad_values_raise_config_error_naming_the_field(kwargs, key):
  with pytest.raises(ConfigError, match=f'^{key}:'):
    OptimConfig(**kwargs)


def test_overrides_are_validated_with_optim_keys():
  cfg = override(OptimConfig(), {'name': 'sgd', 'clip_norm': 'None', 'warmup_steps': '10'})
  assert cfg.name == 'sgd' and cfg.clip_norm is None and cfg.warmup_steps == 10
  with pytest.raises(ConfigError, match='^optim.name:.*adamw'):
    override(OptimConfig(), {'name': 'lion'})
  with pytest.raises(ConfigError, match='^optim.weight_decay:'):
    override(OptimConfig(), {'name': 'adam', 'weight_decay': 0.1})


# --- independent weight decay, muon -----------------------------------------------------

def _model_params(**kw):
  from tx.config.model import ModelConfig  # the model-shaped tree muon's rule reads
  from tx.models.build import init_params
  cfg = ModelConfig(**dict(dict(d_model=32, num_heads=2, d_ff=64, num_layers=1, vocab_size=40,
                                max_len=16), **kw))
  return nn.unbox(init_params(cfg, jax.random.key(0)))


@pytest.mark.parametrize('name', ['adamw', 'sgd', 'adafactor', 'muon'])
def test_independent_decay_does_not_depend_on_the_learning_rate(name):
  """Zero gradients: the only change is the decay, wd * lr(t)/peak * param (peak rate out)."""
  params = _model_params()
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  changes = []
  for lr in (1e-3, 0.5):
    cfg = OptimConfig(name=name, learning_rate=lr, weight_decay=0.1, schedule='cosine',
                      warmup_steps=2, independent_weight_decay=True)
    opt, _ = make_optimizer(cfg, total_steps=10, d_model=32)
    state, p = opt.init(params), params
    for _ in range(3):  # count 0 (lr 0 in warmup), 1 (half), 2 (peak)
      updates, state = opt.update(zeros, state, p)
      p = optax.apply_updates(p, updates)
    changes.append(jax.tree_util.tree_map(jnp.subtract, p, params))
  jax.tree_util.tree_map(functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-9),
                         *changes)
  kernel = params['decoder']['stack']['layer_0']['ffn']['wi']['kernel']
  moved = changes[0]['decoder']['stack']['layer_0']['ffn']['wi']['kernel']
  np.testing.assert_allclose(moved, kernel * ((1 - 0.05) * (1 - 0.1) - 1), rtol=1e-5)
  assert not np.any(changes[0]['embed']['embedding'])  # same mask: embeddings never decay


def test_coupled_decay_still_scales_with_the_learning_rate():
  params = _model_params()
  zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
  moved = []
  for lr in (1e-2, 1e-1):
    opt, _ = make_optimizer(OptimConfig(learning_rate=lr, weight_decay=0.1, schedule='constant'),
                            total_steps=10, d_model=32)
    u, _ = opt.update(zeros, opt.init(params), params)
    moved.append(u['decoder']['stack']['layer_0']['ffn']['wi']['kernel'])
  np.testing.assert_allclose(moved[1], 10 * moved[0], rtol=1e-5)


def test_independent_decay_with_zero_weight_decay_is_adam_and_a_no_op():
  cfg = OptimConfig(name='adam', weight_decay=0.0, independent_weight_decay=True)
  params = _model_params()
  opt, _ = make_optimizer(cfg, total_steps=10, d_model=32)
  updates, _ = opt.update(jax.tree_util.tree_map(jnp.zeros_like, params), opt.init(params), params)
  assert not any(np.any(u) for u in jax.tree_util.tree_leaves(updates))
  with pytest.raises(ConfigError, match='^optim.weight_decay:'):
    OptimConfig(name='adam', weight_decay=0.1, independent_weight_decay=True)


@pytest.mark.parametrize('scan', [False, True])
def test_muon_orthogonalises_hidden_kernels_and_adams_the_rest(scan):
  params = _model_params(scan_layers=scan, tie_embeddings=False)
  grads = jax.tree_util.tree_map(
      lambda x: jax.random.normal(jax.random.key(x.size), x.shape), params)
  opt, _ = make_optimizer(OptimConfig(name='muon', learning_rate=1.0, clip_norm=None),
                          total_steps=10, d_model=32)
  updates, _ = opt.update(grads, opt.init(params), params)
  stack = updates['decoder']['stack']
  layer = jax.tree_util.tree_map(lambda x: x[0], stack['layers']) if scan else stack['layer_0']
  for path, as_matrix in [(('ffn', 'wi'), lambda k: k), (('self_attention', 'query'),
                          lambda k: k.reshape(32, -1)), (('self_attention', 'out'),
                          lambda k: k.reshape(-1, 32))]:
    k = as_matrix(layer[path[0]][path[1]]['kernel'])
    s = np.linalg.svd(np.asarray(k), compute_uv=False)
    assert s.min() > 0.5 * s.max(), path  # Newton-Schulz: singular values all near one value
  # Adam on the rest: the first step is -lr * sign(g) (up to eps) on embeddings and biases.
  for u, g in [(updates['embed']['embedding'], grads['embed']['embedding']),
               (layer['ffn']['wi']['bias'], (jax.tree_util.tree_map(lambda x: x[0], grads[
                   'decoder']['stack']['layers']) if scan else grads['decoder']['stack'][
                       'layer_0'])['ffn']['wi']['bias'])]:
    np.testing.assert_allclose(u, -np.sign(g), rtol=1e-3)
  adam_kernel = updates['head']['lm_head']['kernel']  # a 2-D head stays with Adam too
  np.testing.assert_allclose(adam_kernel, -np.sign(grads["head"]["lm_head"]["kernel"]), rtol=1e-3)
