"""Model FLOPs per step against the formula worked by hand (tx/train/flops.py)."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

import tx
from tx.config.model import POSITIONS, MoEConfig
from tx.models.build import dummy_inputs
from tx.train import flops
from tx.train.flops import flops_per_step

D, FF, V, LAYERS, H, B, L = 32, 64, 100, 3, 4, 2, 16


def _flops(**kw):
  cfg = tx.ModelConfig(family='decoder', d_model=D, num_heads=H, d_ff=FF, num_layers=LAYERS,
                       vocab_size=V, max_len=L, position='learned', **kw)
  params = jax.eval_shape(
      lambda: nn.unbox(tx.build_model(cfg).init(jax.random.key(0), *dummy_inputs(cfg))['params']))
  return flops_per_step(cfg, params, batch=B, length=L)


ATTENTION = 12 * LAYERS * D * B * L * L
LAYER = 4 * D * D + 2 * D * FF  # q, k, v, out + FFN in / out


@pytest.mark.parametrize('scan', [False, True])
def test_tied_decoder(scan):
  assert _flops(scan_layers=scan) == 6 * (LAYERS * LAYER + V * D) * B * L + ATTENTION


def test_untied_counts_the_head_not_the_input_table():
  assert _flops(tie_embeddings=False) == 6 * (LAYERS * LAYER + D * V) * B * L + ATTENTION


def test_moe_counts_the_experts_a_token_visits():
  moe = MoEConfig(num_experts=4, top_k=2)
  router = D * 4
  expected = 6 * (LAYERS * (4 * D * D + router + 2 / 4 * 4 * 2 * D * FF) + V * D) * B * L
  assert _flops(moe=moe) == pytest.approx(expected + ATTENTION)


# Every kind of parameter the model families build, by the config fields that add one.
_FAMILY_EXTRAS = {
    'decoder': {},
    'encoder': dict(type_vocab_size=2, num_classes=3, embed_norm=True),
    'encoder_decoder': {},
}
_VARIANTS = [
    {}, dict(scan_layers=True), dict(tie_embeddings=False), dict(num_kv_heads=2),
    dict(use_bias=False, norm='rmsnorm'), dict(moe=MoEConfig(num_experts=4, top_k=2), ffn='swiglu'),
    dict(moe=MoEConfig(num_experts=4, top_k=1, every=2), num_layers=2),
    dict(scan_layers=True, moe=MoEConfig(num_experts=4, top_k=2)),
    dict(qk_norm='layernorm'), dict(qk_norm='rmsnorm', scan_layers=True),
]


def _configs():
  for family, extras in _FAMILY_EXTRAS.items():
    base = dict(family=family, d_model=D, num_heads=H, d_ff=FF, vocab_size=V, max_len=L,
                **extras)
    for position in POSITIONS:
      yield tx.ModelConfig(**base, num_layers=1, position=position)
    for variant in _VARIANTS:
      yield tx.ModelConfig(**{'num_layers': 1, **base, 'position': 'learned', **variant})
    if family == 'encoder_decoder':
      yield tx.ModelConfig(**base, num_layers=1, position='t5', share_embeddings=False,
                           src_vocab_size=V // 2, tie_embeddings=False)


def test_every_parameter_of_every_family_is_counted_or_excluded():
  """A new layer's weight must get a row in flops.ROLES, or it would drop out of the MFU."""
  rows_used = set()
  for cfg in _configs():
    for name, (role, axes) in flops.param_roles(cfg).items():
      assert role is not None, (
          f'{cfg.family} model (position={cfg.position}, scan={cfg.scan_layers}, '
          f'moe={cfg.moe.num_experts}): parameter {name} with logical axes {axes} is neither '
          'counted nor excluded; give its axes a row in ROLES in tx/train/flops.py')
      rows_used.add(tuple(a for a in axes if a != 'layers'))
  assert not set(flops.ROLES) - rows_used, (
      f'rows of flops.ROLES no model builds any more: {set(flops.ROLES) - rows_used}')


def test_boxed_and_plain_params_count_alike():
  cfg = tx.ModelConfig(family='encoder_decoder', d_model=D, num_heads=H, d_ff=FF, num_layers=2,
                       vocab_size=V, max_len=L, position='t5', scan_layers=True)
  boxed = jax.eval_shape(lambda: tx.init_params(cfg, jax.random.key(0)))
  plain = nn.unbox(boxed)
  assert (flops_per_step(cfg, boxed, batch=B, length=L, target_length=L // 2)
          == flops_per_step(cfg, plain, batch=B, length=L, target_length=L // 2))


def test_a_weight_with_unknown_axes_is_reported(caplog):
  cfg = tx.ModelConfig(family='decoder', d_model=D, num_heads=H, d_ff=FF, num_layers=1,
                       vocab_size=V, max_len=L, position='rope')
  boxed = jax.eval_shape(lambda: tx.init_params(cfg, jax.random.key(0)))
  known = flops_per_step(cfg, boxed, batch=B, length=L)
  new = nn.LogicallyPartitioned(jax.ShapeDtypeStruct((D, 7), jnp.float32), ('embed', 'novel'))
  boxed = {**boxed, 'adapter': {'w': new}}
  with caplog.at_level(logging.WARNING, logger='tx.train.flops'):
    assert flops_per_step(cfg, boxed, batch=B, length=L) == known
  assert any('adapter/w' in r.getMessage() and 'ROLES' in r.getMessage() for r in caplog.records)
