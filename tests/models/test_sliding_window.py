"""model.attention_window / model.attention_pattern: sliding-window (local) self-attention.

A local layer's query at position i sees positions i - W + 1 .. i (decoder) or
|i - j| < W (encoder); a window as long as the input is global attention; packed rows
window within their segment; a scanned local/global pattern equals the unrolled stack.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.config.base import override

L = 6
ROW = jnp.array([[5, 9, 3, 17, 22, 8]], jnp.int32)


def _receptive_field(tm, cfg):
  """bool [L, L]: [i, j] = changing token j changes the logits at position i (one batch
  of L perturbed copies of ROW, one forward)."""
  model, variables = tm.build(cfg)
  perturbed = jnp.tile(ROW, (L, 1)).at[jnp.arange(L), jnp.arange(L)].add(7)
  args = lambda t: (t,) if cfg.family != 'encoder_decoder' else (t, t)
  base = model.apply(variables, *args(ROW))
  out = model.apply(variables, *args(perturbed))  # [L (perturbed j), L (position i), V]
  return np.asarray(jnp.abs(out - base).max(-1) > 1e-5).T


@pytest.mark.parametrize('window', [1, 3])
def test_one_local_layer_sees_exactly_its_window(tm, window):
  """Decoder: i sees j iff 0 <= i - j < W. Encoder: |i - j| < W. (One layer: a deeper
  stack would widen the field by W - 1 per layer.)"""
  i, j = np.arange(L)[:, None], np.arange(L)[None, :]
  dec = tm.tiny('decoder', position='rope', num_layers=1, attention_window=window)
  np.testing.assert_array_equal(_receptive_field(tm, dec), (i - j >= 0) & (i - j < window))
  enc = tm.tiny('encoder', position='rope', num_layers=1, attention_window=window)
  np.testing.assert_array_equal(_receptive_field(tm, enc), np.abs(i - j) < window)


def test_two_local_layers_widen_the_field_and_global_layers_see_everything(tm):
  i, j = np.arange(L)[:, None], np.arange(L)[None, :]
  two = tm.tiny('decoder', position='rope', attention_window=2)
  np.testing.assert_array_equal(_receptive_field(tm, two), (i - j >= 0) & (i - j < 3))
  mixed = tm.tiny('decoder', position='rope', attention_window=2,
                  attention_pattern='local,global')
  np.testing.assert_array_equal(_receptive_field(tm, mixed), i - j >= 0)


@pytest.mark.parametrize('family,position', [('decoder', 'alibi'), ('encoder', 't5'),
                                             ('encoder_decoder', 'rope')])
def test_window_as_long_as_the_input_is_global_attention(tm, family, position):
  """Exactly (the same parameters; the window mask is all True)."""
  cfg = tm.tiny(family, position=position)
  model, variables = tm.build(cfg)
  local = tx.build_model(cfg.replace(attention_window=L, attention_pattern='local,global'))
  for m in (local, tx.build_model(cfg.replace(attention_window=L + 3))):
    np.testing.assert_array_equal(m.apply(variables, *tm.inputs(cfg)),
                                  model.apply(variables, *tm.inputs(cfg)))


def test_packed_rows_window_within_their_segment(tm):
  """Two sequences packed in one row give the logits each gives alone (positions restart
  per segment, so the window does too)."""
  cfg = tm.tiny('decoder', position='rope', attention_window=2,
                attention_pattern='local,global')
  model, variables = tm.build(cfg)
  packed = model.apply(variables, ROW, segment_ids=jnp.array([[1, 1, 1, 2, 2, 2]]))
  alone = model.apply(variables, jnp.array([[17, 22, 8, 0, 0, 0]], jnp.int32))
  np.testing.assert_allclose(packed[0, 3:], alone[0, :3], atol=1e-5)


def test_windowed_causal_blocks_equal_one_block(tm):
  """3 query blocks that skip the keys outside a window of 2 (ALiBi bias sliced along)."""
  cfg = tm.tiny('decoder', position='alibi', attention_window=2,
                attention_pattern='local,global', attention_causal_blocks=1)
  _, variables = tm.build(cfg)
  out = {n: jax.jit(tx.build_model(cfg.replace(attention_causal_blocks=n)).apply)(
      variables, tm.TOKENS) for n in (1, 3)}
  np.testing.assert_allclose(out[3], out[1], atol=1e-5)


def _restack_groups(stack, period):
  """Scanned group layout (layers/block_i with a leading [N / P] axis) -> layer_{g*P+i}."""
  groups = stack['layers']
  n = jax.tree_util.tree_leaves(groups)[0].shape[0]
  out = {k: v for k, v in stack.items() if k != 'layers'}
  for g in range(n):
    for i in range(period):
      out[f'layer_{g * period + i}'] = jax.tree_util.tree_map(
          lambda x, g=g: np.asarray(x)[g], groups[f'block_{i}'])
  return out


def test_scanned_pattern_equals_unrolled(tm):
  """4 layers local, global, local, global scanned as 2 groups of 2: the group's blocks
  are stack/layers/block_0 (local) and block_1 (global); restacked into layer_0..3 the
  unrolled model gives the same logits."""
  cfg = tm.tiny('decoder', position='rope', num_layers=4, scan_layers=True,
                attention_window=2, attention_pattern='local,global')
  scanned, variables = tm.build(cfg)
  params = nn.unbox(variables['params'])
  assert set(params['decoder']['stack']['layers']) == {'block_0', 'block_1'}
  unrolled_params = {**params, 'decoder': {**params['decoder'], 'stack': _restack_groups(
      params['decoder']['stack'], 2)}}
  unrolled = tx.build_model(cfg.replace(scan_layers=False))
  own = jax.eval_shape(unrolled.init, jax.random.key(0), tm.TOKENS)['params']
  assert (jax.tree_util.tree_structure(nn.unbox(own))
          == jax.tree_util.tree_structure(unrolled_params))
  np.testing.assert_allclose(tm.jitted(scanned)(variables, tm.TOKENS),
                             unrolled.apply({'params': unrolled_params}, tm.TOKENS), atol=1e-5)


def test_layer_windows_follow_the_pattern():
  cfg = tx.ModelConfig(attention_window=8, attention_pattern='local, local,global')
  assert cfg.layer_windows(7) == (8, 8, 0, 8, 8, 0, 8)
  assert cfg.attention_period == 3
  assert tx.ModelConfig(attention_window=8).layer_windows(3) == (8, 8, 8)
  assert tx.ModelConfig().layer_windows(2) == (0, 0)
  assert tx.ModelConfig(attention_window=8, attention_pattern='local,local').attention_period == 1


@pytest.mark.parametrize('kw,key', [
    (dict(attention_window=-1), 'model.attention_window'),
    (dict(attention_window=4, attention_pattern='local,sliding'), 'model.attention_pattern'),
    (dict(attention_window=4, attention_pattern='local,,global'), 'model.attention_pattern'),
    (dict(attention_window=4, attention_pattern='global'), 'model.attention_pattern'),
    (dict(attention_pattern='local,global'), 'model.attention_pattern'),  # no window
    (dict(attention_window=4, attention_pattern='local,global', num_layers=3,
          scan_layers=True), 'model.num_layers'),
    (dict(family='encoder_decoder', attention_window=4, attention_pattern='local,global',
          num_decoder_layers=3, scan_layers=True), 'model.num_decoder_layers'),
])
def test_impossible_window_configs_name_the_key(kw, key):
  with pytest.raises(tx.ConfigError, match=key):
    tx.ModelConfig(**kw)


def test_window_overrides_are_dotted_keys():
  cfg = override(tx.ModelConfig(num_layers=4, scan_layers=True), {
      'attention_window': '16', 'attention_pattern': 'local,global'})
  assert cfg.layer_windows(4) == (16, 0, 16, 0)
  tx.ModelConfig(attention_window=4, attention_pattern='local,global', num_layers=3)  # unrolled
