"""Cached generation with the issue-20 knobs (RoPE layout and static scaling, sandwich and
parallel blocks, query scalar, norm offset) equals one full forward pass over the result.

(Dynamic NTK is not here: its base depends on each call's largest position, so a cache
filled step by step differs from one full pass by design; see `ops.apply_rope`.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx
from tx.decode.generate import generate_lm, generate_seq2seq
from tx.decode.steps import prompt_positions

COMMON = dict(position='rope', rope_interleaved=True, sandwich_norm=True, norm_scale_offset=True,
              query_pre_attn_scalar=4.0, norm='rmsnorm')
CASES = {
    'decoder': dict(COMMON, parallel_block='shared_norm', qk_norm='rmsnorm',
                    rope_scaling=dict(kind='yarn', factor=4.0, original_max_len=4)),
    'encoder_decoder': dict(COMMON, rope_scaling=dict(kind='llama3', factor=4.0,
                                                      original_max_len=4)),
}


def _teacher_forced(model, params, inputs, tokens_BT):
  if model.cfg.family == 'decoder':
    p = inputs.shape[1]
    seq = jnp.concatenate([inputs, tokens_BT[:, :-1]], axis=1)
    new_pos = jnp.sum(inputs != 0, axis=1)[:, None] + jnp.arange(tokens_BT.shape[1] - 1)
    positions = jnp.concatenate([prompt_positions(inputs), new_pos], axis=1)
    return model.apply({'params': params}, seq, positions=positions)[:, p - 1:]
  bos = jnp.ones((tokens_BT.shape[0], 1), jnp.int32)
  return model.apply({'params': params}, inputs, jnp.concatenate([bos, tokens_BT[:, :-1]], 1))


@pytest.mark.parametrize('family', list(CASES))
def test_cached_greedy_with_knobs_equals_full_forward(dm, family):
  cfg = dm.tiny(family, **CASES[family])
  generate = generate_lm if family == 'decoder' else generate_seq2seq
  model = tx.build_model(cfg)

  def check(params, inputs):
    tokens, logits = generate(cfg, params, inputs, jax.random.key(0), max_new=6, eos_id=-1,
                              return_logits=True)
    return tokens, logits, _teacher_forced(model, params, inputs, tokens)

  tokens, logits, ref = dm.quick_jit(check)(dm.params(cfg), dm.inputs(cfg))
  np.testing.assert_allclose(logits, ref, atol=2e-5)
  np.testing.assert_array_equal(tokens, jnp.argmax(ref.at[..., 0].set(-jnp.inf), axis=-1))
