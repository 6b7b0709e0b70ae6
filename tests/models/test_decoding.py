"""Grouped-query attention and KV-cached decoding against the full forward pass."""

import importlib.util

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.config.choices import POSITION_KINDS

POSITIONS = tuple(POSITION_KINDS)  # every row of the table
ATOL = 1e-5


# ---------------------------------------------------------------------- GQA / MQA

def test_gqa_with_as_many_kv_heads_as_heads_is_mha(tm):
  mha = tm.tiny('decoder', position='rope')  # 4 heads
  model, variables = tm.build(mha)
  gqa = tx.build_model(mha.replace(num_kv_heads=4))
  np.testing.assert_array_equal(gqa.apply(variables, tm.TOKENS), model.apply(variables, tm.TOKENS))


def _repeat_kv_heads(params, groups):
  """MHA params from GQA params: each kv head copied to the `groups` query heads it serves."""
  def visit(tree):
    out = {}
    for k, v in tree.items():
      if k in ('key', 'value'):
        out[k] = {n: np.repeat(x, groups, axis=-2)  # kernel [D, K, d], bias [K, d]
                  for n, x in v.items()}
      elif isinstance(v, dict):
        out[k] = visit(v)
      else:
        out[k] = v
    return out
  return visit(params)


@pytest.mark.parametrize('kv_heads', [1, 2])
def test_gqa_equals_mha_with_shared_kv_heads(tm, kv_heads):
  """Query head h reads kv head h // (H // K): GQA == MHA whose kv heads are repeated."""
  cfg = tm.tiny('decoder', position='rope', num_kv_heads=kv_heads)  # 4 query heads
  model, variables = tm.build(cfg)
  params = nn.unbox(variables['params'])
  key_kernel = params['decoder']['stack']['layer_0']['self_attention']['key']['kernel']
  assert key_kernel.shape == (16, kv_heads, 4)  # [D, K, head_dim]
  mha = tx.build_model(cfg.replace(num_kv_heads=None))
  expanded = _repeat_kv_heads(params, 4 // kv_heads)
  np.testing.assert_allclose(model.apply(variables, tm.TOKENS),
                             mha.apply({'params': expanded}, tm.TOKENS), atol=ATOL)


# ------------------------------------------------------------------- cached decoding

def _cached_logits(tm, model, params, tokens, src, prefill=3):
  """Prefill `prefill` tokens, then one token per step; logits [B, L, V]."""
  b, length = tokens.shape
  # Op by op, except a scanned stack: eager nn.scan would recompile on every step.
  apply = tm.jitted(model) if model.cfg.scan_layers else model.apply
  mutable = ('cache',) if model.cfg.scan_layers else ['cache']
  if model.cfg.family == 'encoder_decoder':
    cache = tm.init_cache(model, src, jnp.zeros((b, length), jnp.int32))
    encoded, valid = apply({'params': params}, src, method='encode')
    step = lambda cache, chunk: apply({'params': params, 'cache': cache}, encoded, valid, chunk,
                                      method='decode_step', mutable=mutable)
  else:
    cache = tm.init_cache(model, jnp.zeros((b, length), jnp.int32))
    step = lambda cache, chunk: apply({'params': params, 'cache': cache}, chunk,
                                      mutable=mutable)
  outs = []
  for start, stop in [(0, prefill)] + [(t, t + 1) for t in range(prefill, length)]:
    logits, state = step(cache, tokens[:, start:stop])
    cache = state['cache']
    outs.append(logits)
  return jnp.concatenate(outs, axis=1)


CASES = [dict(position=p) for p in POSITIONS] + [
    # GQA (4 query heads) with scanned layers; slow: jit compiles of encode, prefill and step
    pytest.param(dict(position='rope', num_kv_heads=2, scan_layers=True),
                 marks=pytest.mark.slow),
    # torch's CPU kernels in the config: the full forward runs them, cached decoding XLA's
    # (test_cached_decoding_runs_xlas_kernels)
    pytest.param(dict(position='rope', num_kv_heads=2, attention_impl='torch',
                      matmul_impl='torch'),
                 marks=pytest.mark.skipif(importlib.util.find_spec('torch') is None,
                                          reason='needs torch (the interop extra)')),
]


@pytest.mark.parametrize('extra', CASES, ids=lambda d: '-'.join(f'{k}={v}' for k, v in d.items()))
@pytest.mark.parametrize('family', ['decoder', 'encoder_decoder'])
def test_cached_decoding_equals_full_forward(tm, family, extra):
  """Row 1 of the tokens ends in padding: the cache must mask those slots too."""
  cfg = tm.tiny(family, **extra)
  model, variables = tm.build(cfg)
  full = (tm.jitted(model) if cfg.scan_layers else model.apply)(variables, *tm.inputs(cfg))
  cached = _cached_logits(tm, tx.build_model(cfg, decode=True), variables['params'], tm.TOKENS,
                          tm.SOURCE)
  np.testing.assert_allclose(cached, full, atol=ATOL)


def test_cached_decoding_runs_xlas_kernels(tm):
  """A config whose training step runs torch's kernels (`tx tune`'s choice) decodes with
  XLA's: no host callback in the cached step, whatever the config says."""
  pytest.importorskip('torch')
  cfg = tm.tiny('decoder', attention_impl='torch', matmul_impl='torch', norm_impl='torch')
  model = tx.build_model(cfg, decode=True)
  assert (model.cfg.attention_impl, model.cfg.matmul_impl, model.cfg.norm_impl) == ('auto',) * 3
  widened = tm.tiny('decoder', attention_impl='torch_float32', matmul_impl='torch_float32')
  assert tx.build_model(widened, decode=True).cfg.attention_impl == 'auto'
  assert tx.build_model(widened, decode=True).cfg.matmul_impl == 'auto'
  _, variables = tm.build(cfg)
  from tx.decode.generate import generate_lm  # pylint: disable=import-outside-toplevel
  jaxpr = str(jax.make_jaxpr(lambda p: generate_lm(cfg, p, tm.TOKENS, jax.random.key(0),
                                                   max_new=2))(variables['params']))
  assert 'callback' not in jaxpr
  assert 'callback' in str(jax.make_jaxpr(tx.build_model(cfg).apply)(variables, tm.TOKENS))
