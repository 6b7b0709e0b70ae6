"""GPT-NeoX / Pythia against `transformers`: logits, greedy generation, export, errors.

Reference models (2 layers, vocab 101, 4 heads, random weights with LayerNorm scales and
biases randomised too, so a swapped or dropped norm shows), built offline once:
  parallel    d 64 (head 16), rotary_pct 0.25 (4 of 16 dims rotate), use_parallel_residual
              (x + attn(ln1 x) + mlp(ln2 x)), untied embed_out, gelu (exact);
  sequential  d 32 (head 8), rotary_pct 0.5, rotary_emb_base 5000, sequential pre-norm,
              tied head, yarn RoPE scaling (factor 4 from an original context of 8).
Logits agree within 1e-4 on right-padded batches of odd lengths; greedy generation with
tx's KV cache equals `generate` on left-padded prompts; export -> import is bitwise and
`transformers` reloads the export with the very same logits.
"""

import json
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')
hf = pytest.importorskip('transformers')

import tx  # pylint: disable=g-import-not-at-top
from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
from tx.decode import generate_lm, left_pad  # pylint: disable=g-import-not-at-top
from tx.interop import export_hf, load_hf, read_hf_config  # pylint: disable=g-import-not-at-top

NAMES = ('parallel', 'sequential')
COMMON = dict(num_hidden_layers=2, num_attention_heads=4, vocab_size=101, initializer_range=0.2)
YARN = dict(rope_type='yarn', factor=4.0, original_max_position_embeddings=8)
LENGTHS, WIDTH = (11, 7, 3), 11
MAX_NEW = 10


def build(name: str):
  """A `transformers` GPT-NeoX reference model `name` (see the module docstring)."""
  torch.manual_seed(NAMES.index(name))
  if name == 'parallel':
    config = hf.GPTNeoXConfig(**COMMON, hidden_size=64, intermediate_size=128, rotary_pct=0.25,
                              use_parallel_residual=True)
  else:
    config = hf.GPTNeoXConfig(**COMMON, hidden_size=32, intermediate_size=64, rotary_pct=0.5,
                              rotary_emb_base=5000, use_parallel_residual=False,
                              tie_word_embeddings=True, max_position_embeddings=32,
                              rope_scaling=dict(YARN))
  model = hf.GPTNeoXForCausalLM(config)
  with torch.no_grad():
    for key, value in model.named_parameters():
      if 'layernorm' in key or 'layer_norm' in key:
        value.copy_((1.0 if key.endswith('weight') else 0.0) + 0.3 * torch.randn_like(value))
  return model.eval()


@pytest.fixture(scope='session')
def neox(tmp_path_factory):
  """neox(name) -> (transformers model, directory it was saved to), built once."""
  torch.set_num_threads(1)
  cache = {}

  def get(name):
    if name not in cache:
      model = build(name)
      path = tmp_path_factory.mktemp(f'neox_{name}')
      model.save_pretrained(path)
      cache[name] = (model, path)
    return cache[name]
  return get


def _hf_logits(model, tokens, mask):
  with torch.no_grad():
    return model(input_ids=torch.as_tensor(tokens),
                 attention_mask=torch.as_tensor(mask.astype(np.int64))).logits.numpy()


def _tx_logits(cfg, params, tokens):
  return np.asarray(tx.build_model(cfg).apply({'params': params}, jnp.asarray(tokens)))


@pytest.mark.parametrize('name', NAMES)
def test_logits_match(neox, batch, name):
  model, path = neox(name)
  cfg, params = load_hf(path)
  expected = {'parallel': ('two_norms', 0.25, 10000.0, 'none', False),
              'sequential': ('none', 0.5, 5000.0, 'yarn', True)}[name]
  assert (cfg.parallel_block, cfg.rope_fraction, cfg.rope_theta, cfg.rope_scaling.kind,
          cfg.tie_embeddings) == expected
  assert (cfg.norm, cfg.ffn, cfg.use_bias) == ('layernorm', 'gelu', True)
  tokens, mask = batch(LENGTHS, WIDTH)
  ref = _hf_logits(model, tokens, mask)
  assert ref[mask].std() > 0.3, 'reference logits are too small for a meaningful comparison'
  assert np.abs(ref - _tx_logits(cfg, params, tokens))[mask].max() < 1e-4


@pytest.mark.parametrize('name', NAMES)
def test_greedy_matches(neox, name, hf_greedy):
  model, path = neox(name)
  cfg, params = load_hf(path)
  rng = np.random.default_rng(4)
  prompt = np.array(left_pad([list(rng.integers(1, 101, n)) for n in (7, 4, 1)]))
  ref = hf_greedy(model, prompt, MAX_NEW, bos_token_id=None, eos_token_id=None)
  out = generate_lm(cfg, params, jnp.asarray(prompt), jax.random.key(0), max_new=MAX_NEW,
                    eos_id=-1)
  assert ref.shape == (3, MAX_NEW) and np.array_equal(np.asarray(out), ref)


@pytest.mark.parametrize('name', NAMES)
def test_import_export_import_is_bitwise(neox, batch, tmp_path, name, same_tree):
  model, path = neox(name)
  cfg, params = load_hf(path)
  export_hf(cfg, params, tmp_path)  # the default layout for RoPE + LayerNorm: gpt_neox
  assert json.loads((tmp_path / 'config.json').read_text())['model_type'] == 'gpt_neox'
  cfg2, params2 = load_hf(tmp_path)
  assert cfg2 == cfg and same_tree(params, params2)
  reloaded = hf.GPTNeoXForCausalLM.from_pretrained(tmp_path).eval()
  tokens, mask = batch((9, 6), 9)
  with torch.no_grad():
    args = dict(input_ids=torch.as_tensor(tokens), attention_mask=torch.as_tensor(mask * 1))
    assert torch.equal(reloaded(**args).logits, model(**args).logits)


def test_tx_model_exports_to_transformers(batch, tmp_path, same_tree):
  """A tx model with parallel_block=two_norms and partial RoPE, exported, gives the same
  logits in transformers (norm params perturbed so that swapping ln1 / ln2 would show)."""
  cfg = tx.ModelConfig(family='decoder', vocab_size=101, d_model=64, num_heads=4, d_ff=128,
                       num_layers=2, max_len=16, position='rope', rope_fraction=0.25,
                       parallel_block='two_norms', norm='layernorm', norm_eps=1e-5, ffn='gelu',
                       tie_embeddings=False)
  init = jax.jit(lambda key: nn.unbox(tx.models.init_params(cfg, key)))  # one compile
  rng = np.random.default_rng(2)
  params = jax.tree_util.tree_map_with_path(
      lambda k, v: v + np.float32(0.3) * rng.standard_normal(v.shape, np.float32)
      if 'norm' in jax.tree_util.keystr(k) else v, jax.device_get(init(jax.random.key(1))))
  export_hf(cfg, params, tmp_path)
  cfg2, params2 = load_hf(tmp_path)
  assert cfg2 == cfg and same_tree(params, params2)
  model = hf.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
  assert model.config.use_parallel_residual
  tokens, mask = batch(LENGTHS, WIDTH)
  ref = _hf_logits(model, tokens, mask)
  assert np.abs(ref - _tx_logits(cfg, params, tokens))[mask].max() < 1e-4


def test_legacy_field_and_tensor_names(neox, batch, tmp_path, same_tree):
  """Pythia-era files: rotary_pct / rotary_emb_base instead of rope_parameters, saved
  buffers (attention.bias, masked_bias, rotary_emb.inv_freq); and the head under its module
  name lm_head (transformers 5 saves it as embed_out, as the older files do)."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  model, path = neox('parallel')
  cfg, params = load_hf(path)
  ckpt = tmp_path / 'old'
  shutil.copytree(path, ckpt)
  data = json.loads((ckpt / 'config.json').read_text())
  del data['rope_parameters']
  data.update(rotary_pct=0.25, rotary_emb_base=10000, rope_scaling=None)
  (ckpt / 'config.json').write_text(json.dumps(data))
  tensors = load_file(str(ckpt / 'model.safetensors'))
  tensors['lm_head.weight'] = tensors.pop('embed_out.weight')
  for i in range(2):
    tensors[f'gpt_neox.layers.{i}.attention.bias'] = np.tril(np.ones((1, 1, 4, 4), bool))
    tensors[f'gpt_neox.layers.{i}.attention.masked_bias'] = np.array(-1e9, np.float32)
    tensors[f'gpt_neox.layers.{i}.attention.rotary_emb.inv_freq'] = np.ones(2, np.float32)
  save_file(tensors, str(ckpt / 'model.safetensors'))
  cfg2, params2 = load_hf(ckpt)
  assert cfg2 == cfg and same_tree(params, params2)
  tokens, mask = batch((5, 3), 5)  # transformers reads the old file the same way
  old = hf.GPTNeoXForCausalLM.from_pretrained(ckpt).eval()
  assert np.array_equal(_hf_logits(old, tokens, mask), _hf_logits(model, tokens, mask))


@pytest.mark.parametrize('change, match', [
    (dict(attention_bias=False), 'attention_bias=False is not supported'),
    (dict(rope_parameters=dict(rope_type='default', rope_theta=1e4, partial_rotary_factor=0.2)),
     r'rotary_pct=0.2 gives 3 rotated dims'),
    (dict(rope_parameters=dict(rope_type='longrope', factor=2.0)),
     "rope_type='longrope' is not supported"),
    (dict(hidden_act='quick_gelu'), "hidden_act='quick_gelu' is not supported"),
])
def test_unsupported_fields_are_one_line_errors(neox, tmp_path, change, match):
  _, path = neox('parallel')
  shutil.copytree(path, tmp_path / 'ckpt')
  data = json.loads((tmp_path / 'ckpt' / 'config.json').read_text())
  (tmp_path / 'ckpt' / 'config.json').write_text(json.dumps({**data, **change}))
  with pytest.raises(ConfigError, match=match) as e:
    read_hf_config(tmp_path / 'ckpt')
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('knob, name', [
    (dict(parallel_block='shared_norm'), 'parallel_block'), (dict(norm='rmsnorm'), 'norm'),
    (dict(rope_interleaved=True), 'rope_interleaved'), (dict(use_bias=False), 'use_bias'),
    (dict(ffn='swiglu'), 'ffn'), (dict(num_kv_heads=2), 'num_kv_heads'),
])
def test_unexportable_knobs_are_refused_in_one_line(tmp_path, knob, name):
  cfg = tx.ModelConfig(**{**dict(family='decoder', vocab_size=50, d_model=16, num_heads=4,
                                  d_ff=32, num_layers=1, position='rope', rope_fraction=0.5,
                                  norm='layernorm'), **knob})
  with pytest.raises(ConfigError, match=rf'^model\.{name}=.*GPT-NeoX export needs') as e:
    export_hf(cfg, {}, tmp_path, arch='gpt_neox')
  assert '\n' not in str(e.value)
