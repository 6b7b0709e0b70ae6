"""Model FLOPs per step against the formula worked by hand (tx/train/flops.py)."""

import flax.linen as nn
import jax
import pytest

import tx
from tx.config.model import MoEConfig
from tx.models.build import dummy_inputs
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
