"""μP (tx/train/mup.py, model side in tx/models): the table, base width = standard, and the
coordinate check (tx/runs/mup_check.py) flat under μP, growing under standard."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.config.model import ModelConfig
from tx.config.optim import OptimConfig
from tx.models.build import build_model, dummy_inputs, init_params
from tx.models.layer_configs import attention_config
from tx.train import mup
from tx.train.optimizer import make_optimizer

BASE = 32


def tiny(d_model=BASE, parametrization='mup', **kw):
  kw = dict(dict(family='decoder', d_model=d_model, num_heads=2, d_ff=4 * d_model, num_layers=2,
                 vocab_size=61, max_len=16, tie_embeddings=False,
                 parametrization=parametrization, mup_base_width=BASE), **kw)
  return ModelConfig(**kw)


def flat(tree):
  return {'/'.join(str(getattr(k, 'key', k)) for k in p): x
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize('width', [64, 128])
def test_lr_multipliers_match_the_table(width):
  m = width / BASE
  t = mup.table(tiny(width))
  for path, (kind, mult) in t.items():
    leaf = path.split('/')[-1]
    hidden = leaf == 'kernel' and ('attention' in path or '/ffn/' in path)
    assert kind == ('matrix' if hidden else 'vector'), path
    assert mult == pytest.approx(1 / m if hidden else 1.0), path
  assert t['embed/embedding'] == ('vector', 1.0)
  assert t['head/lm_head/kernel'] == ('vector', 1.0)
  sgd = mup.table(tiny(width), 'sgd')
  assert sgd['embed/embedding'][1] == pytest.approx(m)  # MuSGD: vector-like x width_mult
  assert sgd['decoder/stack/layer_0/ffn/wi/kernel'][1] == 1.0


@pytest.mark.parametrize('width', [64, 128])
def test_init_scales_match_the_table(width):
  """Embeddings: std constant in width (μP) vs d^-1/2 (standard). Hidden kernels: var x fan_in
  constant (xavier with both fans growing). Attention: sqrt(base head_dim / head_dim)."""
  for param in ('mup', 'standard'):
    p = flat(nn.unbox(init_params(tiny(width, param), jax.random.key(0))))
    emb_std = float(jnp.std(p['embed/embedding']))
    want = BASE ** -0.5 if param == 'mup' else width ** -0.5
    assert emb_std == pytest.approx(want, rel=0.1)
    wi = p['decoder/stack/layer_0/ffn/wi/kernel']
    assert float(jnp.var(wi)) * width == pytest.approx(2 / 5, rel=0.1)  # 2/(D + 4D) x D
  assert attention_config(tiny(width)).scale_multiplier == pytest.approx((BASE / width) ** 0.5)
  assert attention_config(tiny(width, 'standard')).scale_multiplier == 1.0
  assert attention_config(tiny(width)).score_scale == pytest.approx(
      (BASE / 2) ** 0.5 / (width / 2))  # 1/head_dim matched at the base width


@pytest.mark.parametrize('tie', [False, True])
def test_mup_at_base_width_is_standard(tie):
  std, mu = tiny(BASE, 'standard', tie_embeddings=tie), tiny(BASE, 'mup', tie_embeddings=tie)
  p_std = nn.unbox(init_params(std, jax.random.key(1)))
  p_mu = nn.unbox(init_params(mu, jax.random.key(1)))
  jax.tree.map(np.testing.assert_array_equal, p_std, p_mu)
  tokens = jax.random.randint(jax.random.key(2), (2, 8), 1, 61)
  out = [build_model(c).apply({'params': p_std}, tokens) for c in (std, mu)]
  np.testing.assert_array_equal(out[0], out[1])
  grads = jax.tree.map(lambda x: jnp.full_like(x, 0.3), p_std)
  ups = []
  for c in (std, mu):
    opt, _ = make_optimizer(OptimConfig(weight_decay=0.1), total_steps=10, d_model=BASE, model=c)
    ups.append(opt.update(grads, opt.init(p_std), p_std)[0])
  jax.tree.map(np.testing.assert_array_equal, ups[0], ups[1])


def test_mup_updates_scale_hidden_rates_only():
  """Same gradients at width 64 (m = 2): the hidden kernels move half as far as standard's."""
  cfg = tiny(64)
  p = nn.unbox(init_params(cfg, jax.random.key(0)))
  grads = jax.tree.map(jnp.ones_like, p)
  ups = {}
  for c in (cfg, cfg.replace(parametrization='standard')):
    opt, _ = make_optimizer(OptimConfig(clip_norm=None), total_steps=10, d_model=64, model=c)
    ups[c.parametrization] = flat(opt.update(grads, opt.init(p), p)[0])
  for path, u in ups['mup'].items():
    ratio = float(jnp.abs(u).max() / jnp.abs(ups['standard'][path]).max())
    hidden = path.endswith('kernel') and ('attention' in path or '/ffn/' in path)
    assert ratio == pytest.approx(0.5 if hidden else 1.0, rel=1e-5), path


def _lm_batches(vocab=61, batch=8, length=16, seed=0):
  rng = np.random.default_rng(seed)
  while True:
    x = rng.integers(1, vocab, (batch, length + 1)).astype(np.int32)
    yield {'inputs': x[:, :-1], 'targets': x[:, 1:],
           'weights': np.ones((batch, length), np.float32)}


def test_coordinate_check_is_flat_under_mup_and_grows_under_standard():
  """Widths 32 and 128 (base 32; the growth is their ratio), 3 Adam steps at lr 3e-2.
  Measured (RMS at 128 / at 32, step 3, 2 layers): standard x4.9 attention, x5.5 FFN, x4.2
  block, x2.4 logits (Adam's Θ(1) entry-wise updates summed over a growing fan-in); μP
  x0.97, x0.79, x0.90, x0.85. The μP logits shrink a little (their init part falls as
  width^-1/2 under the 1/width output multiplier). Thresholds sit halfway (in log) between
  the two."""
  from tx.config.experiment import ExperimentConfig
  from tx.runs import mup_check
  cfg = ExperimentConfig(model=tiny(BASE, tie_embeddings=True),
                         optim=OptimConfig(learning_rate=3e-2, schedule='constant'))
  result = mup_check.coord_check(cfg, [32, 128], 3, batches=_lm_batches)
  for kind in ('attention', 'ffn', 'block'):
    assert 0.5 < mup_check.growth(result, 'mup', kind, 3) < 1.6, kind
    assert mup_check.growth(result, 'standard', kind, 3) > 2.5, kind
  assert 0.5 < mup_check.growth(result, 'mup', 'logits', 3) < 1.4
  assert mup_check.growth(result, 'standard', 'logits', 3) > 1.6
  assert mup_check.growth(result, 'mup', 'embedding', 3) == pytest.approx(1.0, abs=0.3)


def test_lr_multipliers_of_a_scanned_local_global_pattern():
  """A scanned group's stack/layers/block_i parameters get the multipliers of layer_i."""
  cfg = tiny(64, scan_layers=True, attention_window=4, attention_pattern='local,global')
  shapes = jax.eval_shape(lambda: nn.unbox(init_params(cfg, jax.random.key(0))))
  mults = flat(mup.lr_multipliers(shapes, cfg, 'adamw'))
  assert mults['decoder/stack/layers/block_1/ffn/wi/kernel'] == pytest.approx(0.5)
  assert mults['decoder/stack/layers/block_0/self_attention_norm/scale'] == 1.0
