"""tx.ops.dot_product_attention: both paths against each other and against numpy."""

import jax
import jax.extend
import jax.numpy as jnp
import re

import numpy as np
import pytest

from tx.ops import causal_mask, combine_masks, dot_product_attention, key_padding_mask

B, L, S, D = 2, 4, 5, 8
# Jitted once per signature: far fewer compiles than op-by-op dispatch.
attention = jax.jit(dot_product_attention,
                    static_argnames=('scale', 'implementation', 'return_weights', 'dropout_rate'))


def _qkv(H, K, seed=0, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.standard_normal(shape, np.float32), dtype)
               for shape in [(B, L, H, D), (B, S, K, D), (B, S, K, D)])


def _mask_and_bias(H):
  """A causal-with-offset mask plus key padding, and a per-head bias [1, H, L, S]."""
  valid_BS = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
  mask = combine_masks(causal_mask(L, S, offset=S - L), key_padding_mask(valid_BS))
  bias = jnp.asarray(np.random.default_rng(7).standard_normal((1, H, L, S), np.float32) * 0.5)
  return mask, bias


def _numpy_attention(q, k, v, mask=None, bias=None, scale=None):
  """Per-head loop in float64: softmax(q k^T scale + bias) masked, times v."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  b_, l_, h_, d_ = q.shape
  s_, kh = k.shape[1], k.shape[2]
  scale = 1 / np.sqrt(d_) if scale is None else scale
  mask = (np.ones((b_, h_, l_, s_), bool) if mask is None
          else np.broadcast_to(mask, (b_, h_, l_, s_)))
  bias = (np.zeros((b_, h_, l_, s_)) if bias is None
          else np.broadcast_to(np.asarray(bias, np.float64), (b_, h_, l_, s_)))
  out = np.zeros_like(q)
  for b in range(b_):
    for h in range(h_):
      kvh = h // (h_ // kh)
      for i in range(l_):
        if not mask[b, h, i].any():
          continue  # fully masked row: zeros
        logits = q[b, i, h] @ k[b, :, kvh].T * scale + bias[b, h, i]
        logits = np.where(mask[b, h, i], logits, -np.inf)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        out[b, i, h] = p @ v[b, :, kvh]
  return out


@pytest.mark.parametrize('H,K', [(4, 4), (4, 2), (4, 1)], ids=['mha', 'gqa', 'mqa'])
def test_einsum_equals_jax_nn_and_numpy(H, K):
  q, k, v = _qkv(H, K)
  mask, bias = _mask_and_bias(H)
  out_einsum = attention(q, k, v, mask=mask, bias=bias, implementation='einsum')
  out_xla = attention(q, k, v, mask=mask, bias=bias, implementation='xla')
  assert out_einsum.shape == (B, L, H, D) and out_einsum.dtype == jnp.float32
  np.testing.assert_allclose(out_einsum, out_xla, atol=1e-5)
  np.testing.assert_allclose(out_einsum, _numpy_attention(q, k, v, mask, bias), atol=1e-5)


def test_scale_one_matches_formula_and_differs_from_default():
  q, k, v = _qkv(2, 2)
  out_default = attention(q, k, v, implementation='einsum')
  for impl in ('einsum', 'xla'):
    out_one = attention(q, k, v, scale=1.0, implementation=impl)
    np.testing.assert_allclose(out_one, _numpy_attention(q, k, v, scale=1.0), atol=1e-5)
    assert not np.allclose(out_one, out_default, atol=1e-3)
  np.testing.assert_allclose(out_default, _numpy_attention(q, k, v), atol=1e-5)


@pytest.mark.parametrize('impl', ['einsum', 'xla'])
def test_gqa_equals_mha_with_repeated_kv_heads(impl):
  H, K = 4, 2
  q, k, v = _qkv(H, K, seed=1)
  mask, bias = _mask_and_bias(H)
  out_gqa = attention(q, k, v, mask=mask, bias=bias, implementation=impl)
  k_rep, v_rep = jnp.repeat(k, H // K, axis=2), jnp.repeat(v, H // K, axis=2)
  out_mha = attention(q, k_rep, v_rep, mask=mask, bias=bias, implementation=impl)
  np.testing.assert_allclose(out_gqa, out_mha, atol=1e-6)
  # K == H through the grouped code is plain per-head MHA.
  np.testing.assert_allclose(out_mha, _numpy_attention(q, k_rep, v_rep, mask, bias), atol=1e-5)


@pytest.mark.parametrize('impl', ['einsum', 'xla'])
def test_fully_masked_rows_are_zero_and_gradients_finite(impl):
  H, K = 2, 1
  q, k, v = _qkv(H, K, seed=2)
  mask = np.ones((B, H, L, S), bool)
  mask[0, :, 1] = False      # whole query row, all heads
  mask[1, 1, 3] = False      # one head only
  mask = jnp.asarray(mask)
  bias = jnp.zeros((1, 1, L, S))

  def f(q, k, v, bias):
    return attention(q, k, v, mask=mask, bias=bias, implementation=impl)

  out = f(q, k, v, bias)
  assert np.all(np.asarray(out[0, 1]) == 0.0)
  assert np.all(np.asarray(out[1, 3, 1]) == 0.0)
  assert np.any(np.asarray(out[1, 3, 0]) != 0.0)
  assert np.isfinite(np.asarray(out)).all()
  grads = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2, 3)))(q, k, v, bias)
  for g in grads:
    assert np.isfinite(np.asarray(g)).all()
  # No gradient leaks into a query that sees nothing.
  assert np.all(np.asarray(grads[0][0, 1]) == 0.0)


@pytest.mark.parametrize('impl', ['einsum', 'xla'])
def test_bf16_inputs_give_bf16_output_close_to_f32(impl):
  H, K = 4, 2
  q, k, v = _qkv(H, K, seed=3)
  mask, bias = _mask_and_bias(H)
  out32 = attention(q, k, v, mask=mask, bias=bias, implementation=impl)
  q16, k16, v16 = (x.astype(jnp.bfloat16) for x in (q, k, v))
  out16 = attention(q16, k16, v16, mask=mask, bias=bias, implementation=impl)
  assert out16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(out16, np.float32), out32, atol=5e-2)


def test_weights_are_float32_rows_sum_to_one_and_padded_keys_get_zero():
  H, K = 2, 2
  q, k, v = _qkv(H, K, seed=4, dtype=jnp.bfloat16)
  valid_BS = jnp.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)
  mask = np.array(jnp.broadcast_to(key_padding_mask(valid_BS), (B, H, L, S)))
  mask[0, 0, 2] = False  # one fully masked row
  out, w = attention(q, k, v, mask=jnp.asarray(mask), return_weights=True)
  assert out.dtype == jnp.bfloat16 and w.dtype == jnp.float32 and w.shape == (B, H, L, S)
  sums = np.asarray(w.sum(-1))
  np.testing.assert_allclose(sums[mask.any(-1)], 1.0, atol=1e-6)
  assert np.all(sums[~mask.any(-1)] == 0.0)
  assert np.all(np.asarray(w[1, :, :, 2:]) == 0.0)  # padded keys


def test_dropout_changes_output_and_is_deterministic_per_rng():
  q, k, v = _qkv(2, 2, seed=5)
  plain = attention(q, k, v)
  rng_a, rng_b = jax.random.PRNGKey(0), jax.random.PRNGKey(1)
  # One signature (one compile) for all dropout calls.
  out_a, w_a = attention(q, k, v, dropout_rate=0.5, dropout_rng=rng_a, return_weights=True)
  out_a2, _ = attention(q, k, v, dropout_rate=0.5, dropout_rng=rng_a, return_weights=True)
  out_b, _ = attention(q, k, v, dropout_rate=0.5, dropout_rng=rng_b, return_weights=True)
  assert not np.allclose(out_a, plain, atol=1e-3)
  np.testing.assert_array_equal(out_a, out_a2)
  assert not np.allclose(out_a, out_b, atol=1e-3)
  # Returned weights are the softmax before dropout; no rng means no dropout.
  np.testing.assert_allclose(w_a.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(attention(q, k, v, dropout_rate=0.5), plain, atol=1e-6)


def test_auto_under_jit_with_low_rank_mask():
  q, k, v = _qkv(2, 1, seed=6)
  mask_LS = jnp.tril(jnp.ones((L, S), bool))  # 2-D, left-padded to [1, 1, L, S]
  f = jax.jit(lambda q, k, v: dot_product_attention(q, k, v, mask=mask_LS))  # 'auto'
  np.testing.assert_allclose(f(q, k, v), _numpy_attention(q, k, v, mask_LS), atol=1e-5)


def _auto_with_cudnn_raising(monkeypatch, error):
  """'auto' on a (pretend) GPU whose cuDNN call raises `error` (None: the real jax call)."""
  from tx.ops import attention as module
  monkeypatch.setattr(module, '_wants_cudnn', lambda q: True)
  if error is not None:
    def refuse(*args, **kwargs):
      raise error
    monkeypatch.setattr(module, '_cudnn_attention', refuse)
  q, k, v = _qkv(2, 1, seed=8)
  mask, bias = _mask_and_bias(2)
  out = dot_product_attention(q, k, v, mask=mask, bias=bias)  # eager: a jit cache would hide it
  np.testing.assert_allclose(out, _numpy_attention(q, k, v, mask, bias), atol=1e-5)


@pytest.mark.parametrize('error', [
    None,  # on CPU, jax 0.10.2 raises RuntimeError('cuDNN is not detected.')
    NotImplementedError('The head dim must be <= 128 and a multiple of 8, but got 12.'),
    ValueError('Q must have a rank of 4, got 3'),
    RuntimeError('cuDNN is not detected.')])
def test_auto_falls_back_to_xla_when_cudnn_refuses(monkeypatch, error):
  _auto_with_cudnn_raising(monkeypatch, error)


@pytest.mark.parametrize('error', [TypeError('a bug'), KeyError('a bug'),
                                   RuntimeError('INTERNAL: an XLA failure'), MemoryError()])
def test_auto_lets_any_other_cudnn_error_through(monkeypatch, error):
  with pytest.raises(type(error)):
    _auto_with_cudnn_raising(monkeypatch, error)


@pytest.mark.parametrize('causal_blocks, is_causal', [(1, False), (4, True)])
def test_a_causal_promise_runs_cudnns_causal_mode_with_the_mask_on_top(
    monkeypatch, causal_blocks, is_causal):
  """causal_blocks > 1 promises a causal mask: the cuDNN path asks jax.nn for is_causal (cuDNN
  then skips the hidden tiles) and still passes the mask (padding on top of causality)."""
  calls = []

  def recorder(q, k, v, **kw):
    calls.append(kw)
    kw = dict(kw, implementation='xla')
    return original(q, k, v, **kw)

  original = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention', recorder)
  q, k, v = (x[:, :L] for x in _qkv(2, 2, seed=9))  # self-attention: L keys
  mask = jnp.tril(jnp.ones((L, L), bool))[None, None] & jnp.ones((B, 1, 1, L), bool).at[
      0, 0, 0, -2:].set(False)
  out = dot_product_attention(q, k, v, mask=mask, implementation='cudnn',
                              causal_blocks=causal_blocks)
  assert calls[-1]['is_causal'] is is_causal and calls[-1]['mask'] is not None
  np.testing.assert_allclose(out, _numpy_attention(q, k, v, mask), atol=1e-5)


def test_user_errors_raise_value_error():
  q, k, v = _qkv(3, 2)
  with pytest.raises(ValueError, match='k_BSKD'):
    dot_product_attention(q, k, v)
  q, k, v = _qkv(2, 2)
  with pytest.raises(ValueError, match='mask'):
    dot_product_attention(q, k, v, mask=jnp.ones((B, 1, L, S), jnp.float32))
  with pytest.raises(ValueError, match='mask'):
    dot_product_attention(q, k, v, mask=jnp.ones((B, 1, L, S + 1), bool))
  with pytest.raises(ValueError, match='bias'):
    dot_product_attention(q, k, v, bias=jnp.zeros((B, 3, L, S)))
  with pytest.raises(ValueError, match='implementation'):
    dot_product_attention(q, k, v, implementation='xla', return_weights=True)
  with pytest.raises(ValueError, match='implementation'):
    dot_product_attention(q, k, v, implementation='flash')
  with pytest.raises(ValueError, match='dropout_rate'):
    dot_product_attention(q, k, v, dropout_rate=1.0, dropout_rng=jax.random.PRNGKey(0))


def test_causal_blocks_skip_hidden_keys_and_change_nothing_else():
  """3 uneven query blocks over L = S = 7 (GQA, key padding that empties row 0 of the
  second sequence, a per-head bias): outputs and gradients equal the one-block path,
  and each block's scores cover only the keys up to its last query."""
  H, K, n = 4, 2, 7
  rng = np.random.default_rng(8)
  q, k, v = (jnp.asarray(rng.standard_normal(s, np.float32))
             for s in [(B, n, H, D), (B, n, K, D), (B, n, K, D)])
  valid_BS = jnp.array([[1] * n, [0] + [1] * (n - 1)], bool)
  mask = combine_masks(causal_mask(n), key_padding_mask(valid_BS))
  bias = jnp.asarray(rng.standard_normal((1, H, n, n), np.float32))

  def loss(blocks, q, k, v, bias):
    out = dot_product_attention(q, k, v, mask=mask, bias=bias, implementation='xla',
                                causal_blocks=blocks)
    return jnp.sum(jnp.sin(out)), out

  results = [jax.jit(jax.value_and_grad(lambda *a, b=b: loss(b, *a), argnums=(0, 1, 2, 3),
                                        has_aux=True))(q, k, v, bias) for b in (1, 3)]
  (_, one), grads_one = results[0]
  (_, blocked), grads_blocked = results[1]
  np.testing.assert_allclose(blocked, one, atol=1e-6)
  np.testing.assert_allclose(blocked, _numpy_attention(q, k, v, mask, bias), atol=1e-5)
  assert np.all(np.asarray(blocked[1, 0]) == 0.0)  # the emptied row
  for g_blocked, g_one in zip(grads_blocked, grads_one):
    np.testing.assert_allclose(g_blocked, g_one, atol=1e-5)
  full_scores = B * H * n * n
  for blocks, dots in ((1, 2), (3, 6)):
    jaxpr = str(jax.make_jaxpr(lambda *a, b=blocks: loss(b, *a)[1])(q, k, v, bias))
    sizes = [np.prod([int(d) for d in shape.split(',')])
             for shape in re.findall(r'f32\[([\d,]+)\] = dot_general', jaxpr)]
    assert len(sizes) == dots and (full_scores in sizes) == (blocks == 1), sizes


def test_causal_blocks_errors():
  q, k, v = _qkv(2, 2)
  with pytest.raises(ValueError, match='L == S'):
    dot_product_attention(q, k, v, causal_blocks=2)
  with pytest.raises(ValueError, match='causal_blocks must be an int >= 1'):
    dot_product_attention(q, k, v, causal_blocks=0)


def test_bf16_causal_blocks_are_as_accurate_as_one_block():
  """In bf16 the blocks' key and value gradients are summed in float32 and rounded once,
  so blocking adds (almost) no error: against float32 gradients of the same bf16-valued
  inputs, 4 blocks stay within 15 % of the one-block path's relative error (measured
  1.00-1.09x over six seeds). Summing the blocks' bf16 gradients instead, rounding every
  partial sum, gave 1.27-1.44x."""
  H, n = 4, 128
  rng = np.random.default_rng(11)
  q, k, v, cotangent = (jnp.asarray(rng.standard_normal((B, n, H, D), np.float32),
                                    jnp.bfloat16) for _ in range(4))

  def grads(dtype, blocks):
    f = lambda q, k, v: jnp.sum(dot_product_attention(
        q, k, v, mask=causal_mask(n), implementation='xla', causal_blocks=blocks
    ).astype(jnp.float32) * cotangent.astype(jnp.float32))
    return jax.jit(jax.grad(f, argnums=(1, 2)))(*(x.astype(dtype) for x in (q, k, v)))

  def error(g, ref):
    return float(jnp.linalg.norm(g.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))

  reference, one, blocked = grads(jnp.float32, 1), grads(jnp.bfloat16, 1), grads(jnp.bfloat16, 4)
  for g_blocked, g_one, ref in zip(blocked, one, reference):
    assert g_blocked.dtype == jnp.bfloat16
    assert error(g_blocked, ref) <= 1.15 * error(g_one, ref), (error(g_blocked, ref),
                                                               error(g_one, ref))


def test_xla_attention_checks_its_blocks():
  from tx.ops.xla_attention import xla_attention  # pylint: disable=g-import-not-at-top
  q, k, v = _qkv(2, 2)
  with pytest.raises(ValueError, match='cover the queries'):
    xla_attention(q, k, v, None, None, 1.0, -1e9, blocks=[(0, 2, 0, S), (3, L, 0, S)])


@pytest.mark.parametrize('H,K', [(4, 4), (4, 2), (4, 1)], ids=['mha', 'gqa', 'mqa'])
def test_xla_backward_equals_autodiff_of_einsum(H, K):
  """The XLA path's hand-written backward (probabilities recomputed from the log-sum-exp)
  against autodiff of the einsum path: gradients of q, k, v and a per-head bias, with a
  causal-with-offset + padding mask and one query row that sees nothing."""
  q, k, v = _qkv(H, K, seed=9)
  mask, bias = _mask_and_bias(H)
  mask = np.array(jnp.broadcast_to(mask, (B, H, L, S)))
  mask[1, 0, 2] = False  # one fully masked row (one head)
  mask = jnp.asarray(mask)
  cotangent = jnp.asarray(np.random.default_rng(10).standard_normal((B, L, H, D), np.float32))

  def grads(impl):
    f = lambda q, k, v, bias: jnp.sum(
        dot_product_attention(q, k, v, mask=mask, bias=bias, implementation=impl) * cotangent)
    return jax.jit(jax.grad(f, argnums=(0, 1, 2, 3)))(q, k, v, bias)

  for g_xla, g_einsum in zip(grads('xla'), grads('einsum')):
    assert g_xla.shape == g_einsum.shape and g_xla.dtype == g_einsum.dtype
    np.testing.assert_allclose(g_xla, g_einsum, atol=2e-5)
  assert np.all(np.asarray(grads('xla')[0][1, 2, 0]) == 0.0)  # the row that sees nothing


def test_the_forward_takes_one_exp_over_the_scores():
  """The values are weighted by the unnormalised exp and the [B, H, L, D] result divided by
  the row sums: one exp over the [B, H, L, S] scores, not a second for the weights."""
  q, k, v = _qkv(4, 4)
  mask = jnp.ones((B, 1, L, S), bool)
  jaxpr = jax.make_jaxpr(lambda q, k, v: dot_product_attention(
      q, k, v, mask=mask, implementation='xla'))(q, k, v)

  def exps(eqns):
    for e in eqns:
      if e.primitive.name == 'exp' and e.outvars[0].aval.shape[-1] == S:
        yield e
      for sub in jax.extend.core.jaxprs_in_params(e.params):
        yield from exps(sub.eqns)
  assert len(list(exps(jaxpr.jaxpr.eqns))) == 1
