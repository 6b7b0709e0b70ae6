"""Every row of tx/config/choices.py has its implementation one level up and builds a model.

Every position scheme also runs in every family in test_families.py (its POSITIONS is the
table's keys); here: the builders table matches the kinds, and every FFN activation runs in
a dense and an MoE decoder.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.config.choices import BIAS, EMBEDDING, FFN_ACTIVATIONS, POSITION_KINDS
from tx.config.model import ModelConfig, MoEConfig
from tx.layers.common import ACTIVATIONS, activation
from tx.models.layer_configs import POSITION_BUILDERS, attention_config


def test_every_position_scheme_has_a_builder_for_its_kind():
  assert POSITION_BUILDERS.keys() == POSITION_KINDS.keys()
  for name, kind in POSITION_KINDS.items():
    assert (POSITION_BUILDERS[name] is not None) == (kind in (EMBEDDING, BIAS)), name


@pytest.mark.parametrize('position', POSITION_KINDS)
def test_each_kind_enters_the_model_where_it_should(tm, position):
  cfg = tm.tiny('decoder', position=position)
  params = str(jax.tree_util.tree_structure(tm.build(cfg)[1]['params']))
  assert attention_config(cfg).rope == (cfg.position_kind == 'rotary')
  assert not attention_config(cfg, cross=True).rope
  assert ('position_embedding' in params) == (position == 'learned')  # sinusoidal: no params
  assert ('relative_bias' in params) == (position == 't5')


def test_every_activation_name_has_a_function():
  for name, a in FFN_ACTIVATIONS.items():
    assert activation(name) == (ACTIVATIONS[a.fn], a.gated)
  mlm = {f.name: f for f in dataclasses.fields(ModelConfig)}['mlm_activation']
  assert set(mlm.metadata['choices']) <= set(ACTIVATIONS)


@pytest.mark.parametrize('num_experts', [0, 2], ids=['dense', 'moe'])
@pytest.mark.parametrize('ffn', FFN_ACTIVATIONS)
def test_every_ffn_activation_builds_a_working_model(tm, ffn, num_experts):
  cfg = tm.tiny('decoder', ffn=ffn, moe=MoEConfig(num_experts=num_experts, top_k=1))
  model, variables = tm.build(cfg)
  logits = model.apply(variables, *tm.inputs(cfg))
  assert logits.shape == (*tm.TOKENS.shape, tm.VOCAB) and logits.dtype == jnp.float32
  assert np.isfinite(np.asarray(logits)).all()
  params = str(jax.tree_util.tree_structure(variables['params']))
  assert ('wi_0' in params and 'wi_1' in params) == FFN_ACTIVATIONS[ffn].gated
