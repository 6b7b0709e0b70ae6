"""RoPE scaling kinds and layouts: frequencies equal Hugging Face's, linear scaling is
position interpolation, interleaved is half-split up to a permutation, and every
layout / scaling keeps RoPE's norm and relative-position properties."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx import ops
from tx.config.rope import ROPE_SCALING_KINDS, RopeScalingConfig

THETA = 500.0  # small, so the yarn ramp and llama3's three bands fall inside 16 frequencies
N = 64  # original context
NY = 1024  # yarn's: both ends of its ramp (dims 4 and 14 of 16) inside the frequencies
SCALINGS = {
    'none': ops.RopeScaling(),
    'linear': ops.RopeScaling('linear', factor=4.0, original_max_len=N),
    'dynamic': ops.RopeScaling('dynamic', factor=4.0, original_max_len=N),
    'yarn': ops.RopeScaling('yarn', factor=4.0, original_max_len=NY),
    'llama3': ops.RopeScaling('llama3', factor=8.0, original_max_len=N),
}


def _x(shape, seed=0):
  return jax.random.normal(jax.random.key(seed), shape)


def test_op_and_config_spell_the_same_fields_and_kinds():
  assert ops.RopeScaling._fields == tuple(f.name for f in dataclasses.fields(RopeScalingConfig))
  assert tuple(SCALINGS) == ROPE_SCALING_KINDS == ops.positions.ROPE_SCALING_KINDS


# ------------------------------------------------------------ Hugging Face parity

def _hf_config(kind, rot_fraction=1.0, **params):
  transformers = pytest.importorskip('transformers')
  pytest.importorskip('torch')
  return transformers.LlamaConfig(
      hidden_size=64, num_attention_heads=2, head_dim=32, max_position_embeddings=4 * N,
      rope_parameters={'rope_type': kind, 'rope_theta': THETA,
                       'partial_rotary_factor': rot_fraction, **params})


HF_CASES = [  # (tx scaling, HF rope_parameters, rotary fraction)
    (SCALINGS['linear'], dict(factor=4.0), 1.0),
    (ops.RopeScaling('dynamic', factor=4.0, original_max_len=4 * N), dict(factor=4.0), 1.0),
    (SCALINGS['yarn'], dict(factor=4.0, original_max_position_embeddings=NY), 1.0),
    (SCALINGS['yarn'], dict(factor=4.0, original_max_position_embeddings=NY), 0.5),
    (ops.RopeScaling('yarn', factor=8.0, original_max_len=NY, beta_fast=16.0, beta_slow=2.0,
                     attention_factor=1.5, truncate=False),
     dict(factor=8.0, original_max_position_embeddings=NY, beta_fast=16.0, beta_slow=2.0,
          attention_factor=1.5, truncate=False), 1.0),
    (SCALINGS['llama3'], dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                              original_max_position_embeddings=N), 1.0),
    (ops.RopeScaling('llama3', factor=4.0, original_max_len=N, low_freq_factor=2.0,
                     high_freq_factor=8.0),
     dict(factor=4.0, low_freq_factor=2.0, high_freq_factor=8.0,
          original_max_position_embeddings=N), 0.5),
]


@pytest.mark.parametrize('seq_len', [100, 400])  # dynamic: below and above its 4N
@pytest.mark.parametrize('scaling,hf_params,fraction', HF_CASES,
                         ids=lambda c: getattr(c, 'kind', None))
def test_frequencies_and_attention_factor_equal_transformers(scaling, hf_params, fraction,
                                                             seq_len):
  from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
  cfg = _hf_config(scaling.kind, fraction, **hf_params)
  ref, ref_factor = ROPE_INIT_FUNCTIONS[scaling.kind](cfg, 'cpu', seq_len=seq_len)
  rot = int(32 * fraction)
  inv_freq, factor = ops.rope_frequencies(rot, THETA, scaling, seq_len=seq_len)
  np.testing.assert_allclose(np.asarray(inv_freq), ref.numpy(), rtol=2e-6)
  assert factor == pytest.approx(float(ref_factor), rel=1e-12)
  plain, _ = ops.rope_frequencies(rot, THETA)
  assert not np.allclose(inv_freq, plain) or (scaling.kind == 'dynamic' and seq_len <= 4 * N)


@pytest.mark.parametrize('kind', ['yarn', 'dynamic'])
def test_rotated_queries_equal_transformers_llama_rotary(kind):
  """The whole op against LlamaRotaryEmbedding + apply_rotary_pos_emb: layout, yarn's
  attention factor on cos and sin, and dynamic's length = 1 + the largest position."""
  import torch
  from transformers.models.llama import modeling_llama as hf
  params = (dict(factor=4.0, original_max_position_embeddings=NY) if kind == 'yarn'
            else dict(factor=4.0))
  cfg = _hf_config(kind, **params)
  scaling = ops.RopeScaling(kind, factor=4.0, original_max_len=NY if kind == 'yarn' else 4 * N)
  pos = np.array([[3, 70, 150, 301], [0, 1, 2, 500]])  # max 500: past dynamic's 4N = 256
  q = np.array(_x((2, 4, 2, 32)))  # [B, L, H, D], writable for torch
  rotary = hf.LlamaRotaryEmbedding(cfg)
  q_t = torch.as_tensor(q).transpose(1, 2)
  cos, sin = rotary(q_t, torch.as_tensor(pos))
  ref, _ = hf.apply_rotary_pos_emb(q_t, q_t, cos, sin)
  out = ops.apply_rope(q, pos, THETA, scaling=scaling)
  np.testing.assert_allclose(np.asarray(out), ref.transpose(1, 2).numpy(), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------- properties

def test_linear_scaling_is_position_interpolation():
  x = _x((2, 6, 2, 16))
  pos = jnp.broadcast_to(jnp.arange(6) * 7 + 3, (2, 6))
  scaled = ops.apply_rope(x, pos, THETA, scaling=SCALINGS['linear'])
  np.testing.assert_allclose(scaled, ops.apply_rope(x, pos / 4.0, THETA), atol=1e-5)
  assert not np.allclose(scaled, ops.apply_rope(x, pos, THETA), atol=1e-3)


def test_dynamic_is_plain_rope_within_the_original_context():
  x, pos = _x((1, 5, 2, 16)), jnp.array([[0, 9, 20, 40, N - 1]])
  plain = ops.apply_rope(x, pos, THETA)
  np.testing.assert_array_equal(ops.apply_rope(x, pos, THETA, scaling=SCALINGS['dynamic']), plain)
  longer = pos.at[0, -1].set(3 * N)  # one position past n rescales the whole call
  np.testing.assert_allclose(ops.apply_rope(x, longer, THETA)[:, :4], plain[:, :4])
  assert not np.allclose(
      ops.apply_rope(x, longer, THETA, scaling=SCALINGS['dynamic'])[:, :4], plain[:, :4])


@pytest.mark.parametrize('scaling', [SCALINGS['none'], SCALINGS['yarn']], ids=['none', 'yarn'])
@pytest.mark.parametrize('fraction', [1.0, 0.5])
def test_interleaved_is_half_split_on_permuted_dims(fraction, scaling):
  d = 16
  rot = int(d * fraction)
  perm = np.concatenate([np.arange(0, rot, 2), np.arange(1, rot, 2), np.arange(rot, d)])
  x, pos = _x((2, 5, 3, d)), jnp.broadcast_to(jnp.arange(5) * 11, (2, 5))
  inter = ops.apply_rope(x, pos, THETA, fraction, scaling=scaling, interleaved=True)
  half = ops.apply_rope(x[..., perm], pos, THETA, fraction, scaling=scaling)
  np.testing.assert_allclose(inter[..., perm], half, atol=1e-6)
  assert not np.allclose(inter, ops.apply_rope(x, pos, THETA, fraction, scaling=scaling),
                         atol=1e-3)


@pytest.mark.parametrize('interleaved', [False, True], ids=['half', 'interleaved'])
@pytest.mark.parametrize('kind', ROPE_SCALING_KINDS)
def test_norms_and_relative_positions_are_kept(kind, interleaved):
  """|rope(x)| = |x| on the rotated dims (times yarn's factor), the rest unchanged; q·k
  depends only on the position difference. Both positions share the call's largest
  position (300), so dynamic uses one base for all of them."""
  scaling, d, rot = SCALINGS[kind], 16, 8
  rope = lambda x, p: ops.apply_rope(jnp.concatenate([x, x], 1), jnp.array([[p, 300]]), THETA,
                                     0.5, scaling=scaling, interleaved=interleaved)[:, :1]
  q, k = _x((1, 1, 2, d), 1), _x((1, 1, 2, d), 2)
  _, factor = ops.rope_frequencies(rot, THETA, scaling)
  q_rot = rope(q, 17)
  np.testing.assert_allclose(jnp.linalg.norm(q_rot[..., :rot], axis=-1),
                             factor * jnp.linalg.norm(q[..., :rot], axis=-1), rtol=1e-5)
  np.testing.assert_array_equal(q_rot[..., rot:], q[..., rot:])
  dot = lambda m, n: jnp.sum(rope(q, m) * rope(k, n), axis=-1)
  np.testing.assert_allclose(dot(40, 13), dot(40 + 150, 13 + 150), rtol=1e-4, atol=1e-3)
  assert not np.allclose(dot(40, 13), dot(41, 13), atol=1e-2)  # it does depend on m - n


def test_yarn_attention_factor_scales_scores_by_its_square():
  q, k = _x((1, 4, 2, 16), 3), _x((1, 4, 2, 16), 4)
  pos = jnp.array([[0, 5, 30, 90]])
  def scores(factor):
    s = ops.RopeScaling('yarn', factor=4.0, original_max_len=NY, attention_factor=factor)
    return jnp.einsum('blhd,bmhd->bhlm', ops.apply_rope(q, pos, THETA, scaling=s),
                      ops.apply_rope(k, pos, THETA, scaling=s))
  np.testing.assert_allclose(scores(1.5), 2.25 * scores(1.0), rtol=1e-5)
  assert ops.rope_frequencies(16, THETA, SCALINGS['yarn'])[1] == pytest.approx(
      0.1 * np.log(4.0) + 1)


def test_bad_arguments_raise():
  with pytest.raises(ValueError, match='original_max_len'):
    ops.rope_frequencies(16, THETA, ops.RopeScaling('linear', factor=2.0))
  with pytest.raises(ValueError, match='unknown RoPE scaling'):
    ops.rope_frequencies(16, THETA, ops.RopeScaling('ntk', original_max_len=N))
