"""Properties of the MoE feed-forward layer (routing, capacity, padding, losses, scan)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.config.base import ConfigError
from tx.layers.moe import (MoEFeedForward, MoELayerConfig, assign_slots, expert_capacity,
                           top_k_gates, total_aux_loss)

# One shape family (D = F = 8, E = 4) for every test, so eager primitives compile once.
B, L, D, E = 2, 8, 8, 4
MUTABLE = ['losses', 'metrics']


def _cfg(**kw):
  base = dict(d_model=D, d_ff=D, activation='relu', num_experts=E, top_k=2)
  return MoELayerConfig(**{**base, **kw})


# numpy randomness and eval_shape: eager jax.random / init would compile dozens of
# tiny XLA programs per shape, which dominates the run time of this file on CPU.
def _x(seed=0, shape=(B, L, D)):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def _init(cfg, x, seed=1, module=None):
  """Random params with the shapes `init` gives (scaled by 1/sqrt(fan_in))."""
  module = MoEFeedForward(cfg) if module is None else module
  boxed = jax.eval_shape(module.init, jax.random.key(0), x)['params']
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda s: jnp.asarray(rng.normal(size=s.shape) / np.sqrt(s.shape[-2]), s.dtype),
      nn.meta.unbox(boxed))


# Eager on purpose: on CPU, op-by-op dispatch of these tiny shapes (primitives are
# compiled once and cached) is cheaper than compiling every config under jit.
def _apply(cfg, params, x, **kw):
  return MoEFeedForward(cfg).apply({'params': params}, x, mutable=MUTABLE, **kw)


def _crafted_params(router_kernel):
  """Given router [D, E]; expert e computes (e + 1) · relu(x) (D = F)."""
  eye = jnp.eye(D)
  return {'router': {'kernel': router_kernel},
          'wi': jnp.broadcast_to(eye, (E, D, D)),
          'wo': jnp.arange(1.0, E + 1)[:, None, None] * eye}


@pytest.mark.parametrize('kw', [dict(), dict(capacity_factor=0.0, activation='swiglu',
                                                use_bias=True)])
def test_shapes_and_collections(kw):
  cfg, x = _cfg(**kw), _x()
  boxed = jax.eval_shape(MoEFeedForward(cfg).init, jax.random.key(0), x)['params']
  names = jax.tree.map(lambda b: b.names, boxed,
                       is_leaf=lambda b: isinstance(b, nn.LogicallyPartitioned))
  assert names['router']['kernel'] == ('embed', 'expert')
  assert names['wo'] == ('expert', 'mlp', 'embed')
  assert names['wi_0' if cfg.gated else 'wi'] == ('expert', 'embed', 'mlp')
  assert nn.meta.unbox(boxed)['wo'].shape == (E, cfg.d_ff, D)
  y, state = _apply(cfg, _init(cfg, x), x)
  assert y.shape == x.shape and y.dtype == jnp.float32
  assert state['losses']['moe_aux_loss'].shape == ()
  assert 'moe_z_loss' not in state['losses']
  np.testing.assert_allclose(state['metrics']['moe_expert_load'].sum(), 1.0, rtol=1e-6)
  assert 0.0 <= state['metrics']['moe_dropped_fraction'] <= 1.0


@pytest.mark.parametrize('activation,use_bias,capacity_factor',
                         [('relu', False, 0.0), ('swiglu', True, 1.0)])
def test_single_expert_equals_dense_ffn(activation, use_bias, capacity_factor):
  cfg = _cfg(num_experts=1, top_k=1, capacity_factor=capacity_factor,
             activation=activation, use_bias=use_bias)
  x = _x()
  p = _init(cfg, x)
  y, state = _apply(cfg, p, x)
  if activation == 'relu':
    h = jax.nn.relu(x @ p['wi'][0])
  else:
    h = jax.nn.silu(x @ p['wi_0'][0] + p['bi_0'][0]) * (x @ p['wi_1'][0] + p['bi_1'][0])
  want = h @ p['wo'][0] + (p['bo'][0] if use_bias else 0)
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
  assert state['metrics']['moe_dropped_fraction'] == 0


def test_capacity_and_dropless_paths_agree():
  cfg, x = _cfg(activation='geglu', use_bias=True, top_k=2), _x()
  p = _init(cfg, x)
  valid = jnp.arange(L)[None, :] < jnp.array([[L], [5]])
  y_big, s_big = _apply(cfg.replace(capacity_factor=100.0), p, x, valid_BL=valid)
  y_free, s_free = _apply(cfg.replace(capacity_factor=0.0), p, x, valid_BL=valid)
  np.testing.assert_allclose(y_big, y_free, rtol=1e-5, atol=1e-6)
  assert s_big['metrics']['moe_dropped_fraction'] == 0
  np.testing.assert_allclose(s_big['losses']['moe_aux_loss'], s_free['losses']['moe_aux_loss'])


def test_top_k_gates_pick_largest_probabilities():
  logits = _x(3, (B, L, E))
  probs, gates, experts = top_k_gates(logits, 3)
  want = np.argsort(-np.asarray(probs), axis=-1)[..., :3]
  np.testing.assert_array_equal(experts, want)
  top = np.take_along_axis(np.asarray(probs), want, axis=-1)
  np.testing.assert_allclose(gates, top / top.sum(-1, keepdims=True), rtol=1e-6)
  _, gates1, _ = top_k_gates(logits, 1)  # top-1: the raw probability (Switch)
  np.testing.assert_allclose(gates1[..., 0], np.asarray(probs).max(-1), rtol=1e-6)


@pytest.mark.parametrize('capacity_factor', [0.0, 2.0])
def test_dispatch_on_crafted_router(capacity_factor):
  """Expert e multiplies relu(x) by e + 1, so y / x reveals which experts were used."""
  cfg = _cfg(top_k=2, capacity_factor=capacity_factor)
  x = jnp.abs(_x(4)) + 0.1
  y, _ = _apply(cfg, _crafted_params(3.0 * jnp.eye(D, E)), x)  # logits = 3·x[:, :E]
  probs = np.asarray(jax.nn.softmax(3.0 * x[..., :E], axis=-1))
  top2 = np.argsort(-probs, axis=-1)[..., :2]
  g = np.take_along_axis(probs, top2, axis=-1)
  want = ((g / g.sum(-1, keepdims=True)) * (top2 + 1)).sum(-1, keepdims=True) * np.asarray(x)
  np.testing.assert_allclose(y, want, rtol=1e-5)


def test_assign_slots_respects_capacity_in_token_order():
  G, S, K, C = B, L, 2, 3
  rng = np.random.default_rng(5)
  first = rng.integers(0, E, (G, S))
  experts = np.stack([first, (first + rng.integers(1, E, (G, S))) % E], -1)  # distinct
  valid = rng.random((G, S)) < 0.8
  pos, keep = assign_slots(jnp.asarray(experts), jnp.asarray(valid), E, C)
  ex, va, pos, keep = map(np.asarray, (experts, valid, pos, keep))
  for g in range(G):
    seen = np.zeros(E, int)
    for s in range(S):
      for k in range(K):
        e = ex[g, s, k]
        assert keep[g, s, k] == (va[g, s] and seen[e] < C)
        if va[g, s]:
          assert pos[g, s, k] == seen[e]
          seen[e] += 1
    counts = np.zeros(E, int)
    np.add.at(counts, ex[g][keep[g]], 1)
    assert counts.max() <= C
  assert (va[..., None] & ~keep).any()  # the case is not trivial: something was dropped
  assert expert_capacity(_cfg(capacity_factor=1.25), 16) == 10  # ceil(1.25·2·16/4)
  assert expert_capacity(_cfg(capacity_factor=0.0), 16) == 16


def test_full_expert_drops_later_tokens_and_dropless_keeps_all():
  """All 8 tokens of a row pick expert 0, which has room for C = 2."""
  cfg = _cfg(top_k=1, capacity_factor=1.0)
  assert expert_capacity(cfg, L) == 2
  params = _crafted_params(jnp.ones((D, E)).at[:, 1:].set(-1.0))  # every token -> expert 0
  x = jnp.abs(_x(7)) + 0.1
  y, state = _apply(cfg, params, x)
  assert np.all(np.abs(y[:, :2]) > 0)
  assert np.all(y[:, 2:] == 0)  # dropped: exactly zero, the residual carries them
  np.testing.assert_allclose(state['metrics']['moe_dropped_fraction'], 6 / 8)
  np.testing.assert_allclose(state['metrics']['moe_expert_load'], [1.0, 0.0, 0.0, 0.0])
  y0, state0 = _apply(cfg.replace(capacity_factor=0.0), params, x)
  assert np.all(np.abs(y0) > 0) and state0['metrics']['moe_dropped_fraction'] == 0


def test_padding_is_not_routed():
  """Row 0 has the pads after the real tokens, row 1 the same pads before them."""
  cfg = _cfg(top_k=1, capacity_factor=1.0)  # C = 2 per row and expert
  n_pad, n_real = 3, L - 3
  real, pad = _x(8, (1, n_real, D)), 5.0 * _x(9, (1, n_pad, D))
  x = jnp.concatenate([jnp.concatenate([real, pad], 1), jnp.concatenate([pad, real], 1)], 0)
  pad_end = jnp.arange(L) >= n_real
  valid = jnp.stack([~pad_end, ~pad_end[::-1]])
  p = _init(cfg, x)
  y, _ = _apply(cfg, p, x, valid_BL=valid)
  # Pads in front would otherwise take capacity away from the real tokens.
  np.testing.assert_allclose(y[0, :n_real], y[1, n_pad:], rtol=1e-6)
  assert np.all(y[0, n_real:] == 0) and np.all(y[1, :n_pad] == 0)
  x_other_pads = jnp.where(valid[:, :, None], x, -7.0)
  for cf in (0.0, 1.0):  # outputs, losses and metrics ignore the pads' contents
    c = cfg.replace(capacity_factor=cf)
    a, sa = _apply(c, p, x, valid_BL=valid)
    b, sb = _apply(c, p, x_other_pads, valid_BL=valid)
    np.testing.assert_array_equal(a, b)
    assert np.all(np.asarray(a)[~np.asarray(valid)] == 0)
    jax.tree.map(np.testing.assert_array_equal, sa, sb)


def test_aux_and_z_loss_formulas():
  cfg = _cfg(num_experts=4, top_k=2, aux_loss_weight=0.3, router_z_loss_weight=0.02)
  x = _x(10)
  p = _init(cfg, x)
  valid = jnp.arange(L)[None, :] < jnp.array([[L], [6]])
  _, state = _apply(cfg, p, x, valid_BL=valid)
  logits = np.asarray(x @ p['router']['kernel'], np.float64)[np.asarray(valid)]  # [T, E]
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  top2 = np.argsort(-probs, -1)[:, :2]
  f = np.bincount(top2.ravel(), minlength=4) / top2.size
  want_aux = 0.3 * 4 * np.sum(f * probs.mean(0))
  lse = np.log(np.exp(logits).sum(-1))
  np.testing.assert_allclose(state['losses']['moe_aux_loss'], want_aux, rtol=1e-5)
  np.testing.assert_allclose(state['losses']['moe_z_loss'], 0.02 * np.mean(lse ** 2), rtol=1e-5)
  np.testing.assert_allclose(total_aux_loss(state), want_aux + 0.02 * np.mean(lse ** 2),
                             rtol=1e-5)

  uniform = {**p, 'router': {'kernel': jnp.zeros_like(p['router']['kernel'])}}
  _, state_u = _apply(cfg.replace(router_z_loss_weight=0.0), uniform, x)
  np.testing.assert_allclose(state_u['losses']['moe_aux_loss'], 0.3 * 1.0, rtol=1e-6)


@pytest.mark.parametrize('top_k', [1, 2])
def test_router_receives_gradients(top_k):
  """Both the task loss (through the gates) and the aux loss reach the router."""
  cfg = _cfg(top_k=top_k)
  x = _x(11)
  p = _init(cfg, x)

  def task_and_aux(params):
    y, state = _apply(cfg, params, x)
    return jnp.stack([jnp.mean(y ** 2), total_aux_loss(state)])

  jac = jax.jit(jax.jacrev(task_and_aux))(p)  # leaves [2, ...]: d task, d aux
  assert np.all(np.abs(jac['router']['kernel']).sum((1, 2)) > 0)
  assert np.abs(jac['wo'][0]).sum() > 0 and np.all(jac['wo'][1] == 0)


def test_jit_matches_eager_and_dropout():
  cfg = _cfg(activation='gelu_tanh', dropout=0.5)
  x = _x(12)
  p = _init(cfg, x)
  eager = _apply(cfg, p, x)

  @jax.jit
  def jitted(p, x, rng):
    dropped, _ = _apply(cfg, p, x, deterministic=False, rngs={'dropout': rng})
    return _apply(cfg, p, x), dropped

  out, dropped = jitted(p, x, jax.random.key(0))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), eager, out)
  assert not np.allclose(dropped, eager[0])


@pytest.mark.parametrize('capacity_factor', [0.0, 1.25])
def test_bf16_compute_close_to_fp32(capacity_factor):
  cfg = _cfg(activation='swiglu', capacity_factor=capacity_factor)
  x = _x(13)
  p = _init(cfg, x)
  y32, s32 = _apply(cfg, p, x)
  y16, s16 = _apply(cfg.replace(dtype='bfloat16'), p, x)
  assert y16.dtype == jnp.bfloat16
  assert s16['losses']['moe_aux_loss'].dtype == jnp.float32
  np.testing.assert_allclose(y16.astype(jnp.float32), y32, rtol=5e-2, atol=5e-2)
  np.testing.assert_allclose(s16['losses']['moe_aux_loss'], s32['losses']['moe_aux_loss'])


class _Layer(nn.Module):
  cfg: MoELayerConfig

  @nn.compact
  def __call__(self, x, _):
    return x + MoEFeedForward(self.cfg, name='moe')(x), None


class _Stack(nn.Module):
  cfg: MoELayerConfig

  @nn.compact
  def __call__(self, x):
    layer = nn.scan(nn.remat(_Layer), variable_axes={'params': 0, 'losses': 0, 'metrics': 0},
                    split_rngs={'params': True}, length=2,
                    metadata_params={nn.PARTITION_NAME: 'layers'})
    return layer(self.cfg, name='layers')(x, None)[0]


def test_scan_remat_stacks_losses():
  cfg = _cfg(router_z_loss_weight=0.01)
  x = _x(14)
  params = _init(cfg, x, seed=2, module=_Stack(cfg))

  def loss(p):  # one compile for forward and (rematerialised) backward
    y, state = _Stack(cfg).apply({'params': p}, x, mutable=MUTABLE)
    return jnp.mean(y ** 2) + total_aux_loss(state), (y, state)

  (_, (y, state)), g = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  losses = state['losses']['layers']['moe']
  assert losses['moe_aux_loss'].shape == (2,) and losses['moe_z_loss'].shape == (2,)
  assert state['metrics']['layers']['moe']['moe_expert_load'].shape == (2, E)
  assert np.all(np.abs(g['layers']['moe']['router']['kernel']).sum((1, 2)) > 0)
  h, total = x, 0.0
  for i in range(2):  # the same two layers, applied one by one
    p_i = jax.tree.map(lambda a: a[i], params['layers']['moe'])
    out, s = _apply(cfg, p_i, h)
    h, total = h + out, total + total_aux_loss(s)
  np.testing.assert_allclose(y, h, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(total_aux_loss(state), total, rtol=1e-5)
  np.testing.assert_allclose(total_aux_loss(state['losses']), total, rtol=1e-5)


def test_config_validation_names_the_key():
  with pytest.raises(ConfigError, match='top_k'):
    _cfg(num_experts=2, top_k=3)
  with pytest.raises(ConfigError, match='activation'):
    _cfg(activation='tanh')
  with pytest.raises(ConfigError, match='capacity_factor'):
    _cfg(capacity_factor=-1.0)
