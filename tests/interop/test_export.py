"""Export: tx params -> a directory `transformers` loads; export -> import is bitwise."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')
transformers = pytest.importorskip('transformers')

import tx  # pylint: disable=g-import-not-at-top
from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
from tx.interop import export_hf, load_hf  # pylint: disable=g-import-not-at-top


@pytest.mark.parametrize('arch', ['gpt2', 'llama'])
def test_import_export_import_is_bitwise(reference, batch, tmp_path, arch, same_tree):
  model, path = reference(arch)
  cfg, params = load_hf(path)
  export_hf(cfg, params, tmp_path / 'out')
  cfg2, params2 = load_hf(tmp_path / 'out')
  assert cfg2 == cfg and same_tree(params, params2)
  reloaded = type(model).from_pretrained(tmp_path / 'out').eval()
  tokens, mask = batch((6, 3), 6)
  with torch.no_grad():
    args = dict(input_ids=torch.as_tensor(tokens), attention_mask=torch.as_tensor(mask * 1))
    assert torch.equal(reloaded(**args).logits, model(**args).logits)


@pytest.mark.parametrize('kw', [
    dict(position='learned', norm='layernorm', ffn='gelu_tanh'),                      # GPT-2
    dict(position='rope', norm='rmsnorm', ffn='swiglu', use_bias=False, num_kv_heads=2,
         tie_embeddings=False),                                                       # LLaMA
], ids=['gpt2', 'llama'])
def test_tx_model_exports_to_transformers(batch, tmp_path, kw, same_tree):
  """A tx-initialised model, exported, gives the same logits in `transformers`."""
  cfg = tx.ModelConfig(family='decoder', vocab_size=101, d_model=32, num_heads=4, d_ff=64,
                       num_layers=2, max_len=16, **kw)
  params = nn.unbox(tx.models.init_params(cfg, jax.random.key(1)))
  export_hf(cfg, params, tmp_path)
  assert same_tree(params, load_hf(tmp_path)[1])
  model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
  tokens, mask = batch((7, 4), 7)
  with torch.no_grad():
    ref = model(input_ids=torch.as_tensor(tokens),
                attention_mask=torch.as_tensor(mask * 1)).logits.numpy()
  out = np.asarray(tx.build_model(cfg).apply({'params': params}, jnp.asarray(tokens)))
  assert np.abs(ref - out)[mask].max() < 1e-4


def test_unexportable_config_names_the_field(tmp_path):
  cfg = tx.ModelConfig(family='decoder', vocab_size=50, d_model=16, num_heads=2, d_ff=32,
                       num_layers=1, position='alibi')
  with pytest.raises(ConfigError, match='model.position'):
    export_hf(cfg, {}, tmp_path, arch='gpt2')  # the config is checked before the params


@pytest.mark.parametrize('knob', [dict(qk_norm='rmsnorm'), dict(attention_softcap=50.0),
                                  dict(logits_softcap=30.0), dict(parametrization='mup')])
@pytest.mark.parametrize('arch', ['gpt2', 'llama'])
def test_stability_knobs_no_layout_holds_are_refused_in_one_line(tmp_path, knob, arch):
  base = dict(position='learned', norm='layernorm', ffn='gelu') if arch == 'gpt2' else dict(
      position='rope', norm='rmsnorm', ffn='swiglu', use_bias=False)
  cfg = tx.ModelConfig(family='decoder', vocab_size=50, d_model=16, num_heads=2, d_ff=32,
                       num_layers=1, **base, **knob)
  name = next(iter(knob))
  with pytest.raises(ConfigError, match=rf'^model\.{name}=.*export needs') as e:
    export_hf(cfg, {}, tmp_path, arch=arch)
  assert '\n' not in str(e.value)
