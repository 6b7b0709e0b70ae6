"""Gemma-2 and Gemma-3 (text) checkpoints in and out of tx, against `transformers`.

Reference models are tiny and random (seeded, offline): 4 query / 2 key-value heads of 16,
a window of 4 keys, soft-caps small enough to bite (attention 5, logits 3), a score scale
24^-1/2 (query_pre_attn_scalar != head_dim), and every Gemma RMSNorm weight drawn around 0
(transformers initialises them at 0, i.e. the identity, which would hide a missing 1 + w).
gemma2: 3 layers (sliding, full, sliding), untied head. gemma2_tied: 2 layers, tied head.
gemma3: 4 layers of layer_types (sliding, sliding, full, sliding), q/k norms, local RoPE
base 100, global base 10^4 with linear scaling 2, untied head. Batches are longer than the
window: right-padded odd lengths for logits (float32, max abs diff < 1e-4), left-padded
prompts for greedy generation (16 new tokens, past the window) with tx's KV cache (ring
buffers on the local layers) against `generate`, which never emits pad id 0 here, as tx.
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
from tx import cli  # pylint: disable=g-import-not-at-top
from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
from tx.decode import generate_lm, left_pad  # pylint: disable=g-import-not-at-top
from tx.interop import export_hf, gemma2, gemma3, load_hf  # pylint: disable=g-import-not-at-top
from tx.interop.hf_config import HFConfig  # pylint: disable=g-import-not-at-top

VOCAB, TOL, NEW = 101, 1e-4, 16
SLIDING, FULL = 'sliding_attention', 'full_attention'
COMMON = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=64, vocab_size=VOCAB, sliding_window=4,
              query_pre_attn_scalar=24, final_logit_softcapping=3.0, rms_norm_eps=1e-5,
              initializer_range=0.2)


def build(name: str):
  """The seeded `transformers` model `name` (see the module docstring), in eval mode."""
  torch.manual_seed(len(name))
  if name.startswith('gemma2'):
    tied = name == 'gemma2_tied'
    model = hf.Gemma2ForCausalLM(hf.Gemma2Config(
        **COMMON, num_hidden_layers=2 if tied else 3, attn_logit_softcapping=5.0,
        rope_theta=5000.0, tie_word_embeddings=tied))
  else:
    model = hf.Gemma3ForCausalLM(hf.Gemma3TextConfig(
        **COMMON, num_hidden_layers=4, layer_types=[SLIDING, SLIDING, FULL, SLIDING],
        tie_word_embeddings=False, rope_parameters={
            FULL: {'rope_type': 'linear', 'factor': 2.0, 'rope_theta': 10000.0},
            SLIDING: {'rope_type': 'default', 'rope_theta': 100.0}}))
  with torch.no_grad():
    for param_name, param in model.named_parameters():
      if 'norm' in param_name:
        param.normal_(0.0, 0.3)
  return model.eval()


@pytest.fixture(scope='module')
def gemma(tmp_path_factory):
  """gemma(name) -> (transformers model, directory it was saved to), built once."""
  torch.set_num_threads(1)
  cache = {}

  def get(name):
    if name not in cache:
      model = build(name)
      path = tmp_path_factory.mktemp(name)
      model.save_pretrained(path)
      cache[name] = (model, path)
    return cache[name]
  return get


def _batch(lengths, width, seed=0):
  rng = np.random.default_rng(seed)
  mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
  return np.where(mask, rng.integers(1, VOCAB, (len(lengths), width)), 0), mask


def _hf_logits(model, tokens, mask):
  with torch.no_grad():
    return model(input_ids=torch.as_tensor(tokens),
                 attention_mask=torch.as_tensor(mask.astype(np.int64))).logits.numpy()


def _compare(ref, out, mask):
  assert ref.shape == out.shape
  assert ref[mask].std() > 0.3, 'reference logits are too small for a meaningful comparison'
  assert np.abs(ref - out)[mask].max() < TOL


@pytest.mark.parametrize('name', ['gemma2', 'gemma2_tied', 'gemma3'])
def test_logits_match(gemma, name):
  model, path = gemma(name)
  cfg, params = load_hf(path)
  want = dict(gemma2=('local,global', None, 5.0), gemma2_tied=('local,global', None, 5.0),
              gemma3=('local,local,global', 100.0, 0.0))[name]
  assert (cfg.attention_pattern, cfg.rope_local_theta, cfg.attention_softcap) == want
  assert (cfg.attention_window, cfg.logits_softcap, cfg.query_pre_attn_scalar) == (4, 3.0, 24.0)
  tokens, mask = _batch((11, 7, 4), 11)
  out = np.asarray(tx.build_model(cfg).apply({'params': params}, jnp.asarray(tokens)))
  _compare(_hf_logits(model, tokens, mask), out, mask)


@pytest.mark.parametrize('name', ['gemma2', 'gemma3'])
def test_greedy_generation_matches_past_the_window(gemma, name, hf_greedy):
  model, path = gemma(name)
  cfg, params = load_hf(path)
  rng = np.random.default_rng(4)
  prompt = np.array(left_pad([list(rng.integers(1, VOCAB, n)) for n in (7, 3, 1)]))
  ref = hf_greedy(model, prompt, NEW, eos_token_id=1)
  out = np.asarray(generate_lm(cfg, params, jnp.asarray(prompt), jax.random.key(0),
                               max_new=NEW, eos_id=1))
  assert ref.shape == out.shape and min(len(set(row)) for row in ref) > 4  # not a loop
  assert np.array_equal(out, ref)


@pytest.mark.parametrize('name, arch', [('gemma2_tied', 'gemma2'), ('gemma3', 'gemma3')])
def test_import_export_import_is_bitwise(gemma, tmp_path, name, arch, same_tree):
  model, path = gemma(name)
  cfg, params = load_hf(path)
  export_hf(cfg, params, tmp_path / 'out')  # the default architecture is the Gemma layout
  assert json.loads((tmp_path / 'out' / 'config.json').read_text())['architectures'] == [
      type(model).__name__]
  cfg2, params2 = load_hf(tmp_path / 'out')
  assert cfg2 == cfg and same_tree(params, params2)
  reloaded = type(model).from_pretrained(tmp_path / 'out').eval()
  tokens, mask = _batch((9, 5), 9, seed=1)
  with torch.no_grad():
    args = dict(input_ids=torch.as_tensor(tokens), attention_mask=torch.as_tensor(mask * 1))
    assert torch.equal(reloaded(**args).logits, model(**args).logits)


TX_GEMMA = dict(family='decoder', vocab_size=VOCAB, d_model=32, num_heads=4, num_kv_heads=2,
                head_dim=16, d_ff=64, num_layers=3, max_len=64, position='rope',
                norm='rmsnorm', norm_eps=1e-5, norm_scale_offset=True, sandwich_norm=True,
                ffn='geglu_tanh', use_bias=False, scale_embeddings=True,
                query_pre_attn_scalar=24.0, logits_softcap=3.0, attention_window=4)


@pytest.mark.parametrize('arch, kw', [
    ('gemma2', dict(attention_softcap=5.0, attention_pattern='local,global')),
    ('gemma3', dict(qk_norm='rmsnorm', attention_pattern='local,local,global',
                    rope_local_theta=100.0, rope_scaling=dict(kind='linear', factor=2.0),
                    tie_embeddings=False)),
])
def test_tx_model_exports_to_transformers(tmp_path, arch, kw, same_tree):
  """A tx model with the Gemma knobs, exported with arch=None, gives the same logits in
  `transformers`. Its params are N(0, 0.2) in the shapes tx initialises (norm scales off 0)."""
  cfg = tx.ModelConfig(**TX_GEMMA, **kw)
  shapes = jax.eval_shape(lambda: nn.unbox(tx.models.init_params(cfg, jax.random.key(1))))
  rng = np.random.default_rng(2)
  params = jax.tree_util.tree_map(
      lambda x: rng.normal(0.0, 0.2, x.shape).astype(np.float32), shapes)
  export_hf(cfg, params, tmp_path)
  assert json.loads((tmp_path / 'config.json').read_text())['model_type'] == (
      'gemma2' if arch == 'gemma2' else 'gemma3_text')
  assert same_tree(params, load_hf(tmp_path)[1])
  model = hf.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
  tokens, mask = _batch((11, 6), 11, seed=3)
  out = np.asarray(tx.build_model(cfg).apply({'params': params}, jnp.asarray(tokens)))
  _compare(_hf_logits(model, tokens, mask), out, mask)


def test_released_config_json_layouts():
  """transformers-4 era config.json fields of google/gemma-2-2b and gemma-3-1b (no
  layer_types; Gemma-3's rope_theta / rope_local_base_freq / rope_scaling / pattern)."""
  g2 = gemma2.config_from_hf(HFConfig(dict(
      model_type='gemma2', num_hidden_layers=26, hidden_size=2304, num_attention_heads=8,
      num_key_value_heads=4, head_dim=256, intermediate_size=9216, vocab_size=256000,
      hidden_act='gelu_pytorch_tanh', hidden_activation='gelu_pytorch_tanh',
      query_pre_attn_scalar=256, rope_theta=10000.0, sliding_window=4096,
      attn_logit_softcapping=50.0, final_logit_softcapping=30.0, cache_implementation='hybrid',
      max_position_embeddings=8192, rms_norm_eps=1e-6), 'gemma-2-2b'))
  assert (g2.attention_window, g2.attention_pattern, g2.head_dim, g2.query_pre_attn_scalar,
          g2.attention_softcap, g2.logits_softcap, g2.ffn) == (
              4096, 'local,global', 256, None, 50.0, 30.0, 'geglu_tanh')
  g3 = dict(model_type='gemma3_text', num_hidden_layers=26, hidden_size=1152,
            num_attention_heads=4, num_key_value_heads=1, head_dim=256, intermediate_size=6912,
            vocab_size=262144, hidden_activation='gelu_pytorch_tanh', query_pre_attn_scalar=256,
            rope_theta=1000000.0, rope_local_base_freq=10000.0, rope_scaling=None,
            sliding_window=512, sliding_window_pattern=6, attn_logit_softcapping=None,
            final_logit_softcapping=None)
  cfg = gemma3.config_from_hf(HFConfig(g3, 'gemma-3-1b'))
  assert (cfg.attention_window, cfg.attention_pattern, cfg.layer_windows(26)[-3:]) == (
      512, ','.join(['local'] * 5 + ['global']), (0, 512, 512))  # layer 23 full
  assert (cfg.rope_theta, cfg.rope_local_theta, cfg.rope_scaling.kind, cfg.qk_norm,
          cfg.attention_softcap, cfg.logits_softcap) == (1e6, 1e4, 'none', 'rmsnorm', 0.0, 0.0)
  scaled = gemma3.config_from_hf(HFConfig(
      {**g3, 'rope_scaling': {'rope_type': 'linear', 'factor': 8.0}}, 'gemma-3-4b'))
  assert (scaled.rope_scaling.kind, scaled.rope_scaling.factor) == ('linear', 8.0)


@pytest.mark.parametrize('model_type, change, match', [
    ('gemma2', dict(attention_bias=True), 'attention_bias=True'),
    ('gemma2', dict(use_bidirectional_attention=True), 'use_bidirectional_attention=True'),
    ('gemma2', dict(layer_types=[SLIDING, 'chunked_attention']), 'layer_types='),
    ('gemma2', dict(hidden_activation='tanh'), "hidden_activation='tanh'"),
    ('gemma2', dict(rope_parameters={'rope_type': 'yarn', 'factor': 2.0}), "rope_type='yarn'"),
    ('gemma3_text', dict(rope_parameters={FULL: {'rope_type': 'default'},
                                          SLIDING: {'rope_type': 'linear', 'factor': 2.0}}),
     "sliding_attention rope_type='linear'"),
    ('gemma3_text', dict(rope_scaling={'rope_type': 'llama3', 'factor': 8.0}),
     "full_attention rope_type='llama3'"),
])
def test_unsupported_fields_are_one_line_errors(model_type, change, match):
  data = dict(model_type=model_type, num_hidden_layers=2, hidden_size=32,
              num_attention_heads=4, intermediate_size=64, vocab_size=VOCAB, sliding_window=4)
  module = gemma2 if model_type == 'gemma2' else gemma3
  with pytest.raises(ConfigError, match=match) as e:
    module.config_from_hf(HFConfig({**data, **change}, 'ckpt/config.json'))
  assert str(e.value).startswith('ckpt/config.json: ') and '\n' not in str(e.value)


@pytest.mark.parametrize('arch, change, field', [
    ('gemma2', dict(qk_norm='rmsnorm'), 'qk_norm'),
    ('gemma2', dict(norm_scale_offset=False), 'norm_scale_offset'),
    ('gemma2', dict(rope_local_theta=100.0), 'rope_local_theta'),
    ('gemma2', dict(ffn='gelu_tanh'), 'ffn'),
    ('gemma2', dict(query_pre_attn_scalar=24.5), 'query_pre_attn_scalar'),
    ('gemma3', dict(qk_norm='rmsnorm', attention_softcap=5.0), 'attention_softcap'),
    ('gemma3', dict(qk_norm='rmsnorm', rope_scaling=dict(kind='linear', factor=2.0)),
     'rope_local_theta'),
    ('mistral', dict(norm_scale_offset=False, sandwich_norm=False, ffn='swiglu',
                     scale_embeddings=False, query_pre_attn_scalar=None, logits_softcap=0.0,
                     rope_local_theta=100.0), 'rope_local_theta'),
])
def test_unexportable_knobs_are_one_line_errors(tmp_path, arch, change, field):
  cfg = tx.ModelConfig(**{**TX_GEMMA, **change})
  with pytest.raises(ConfigError, match=rf'^model\.{field}=.*export needs') as e:
    export_hf(cfg, {}, tmp_path, arch=arch)  # the config is checked before the params
  assert '\n' not in str(e.value)


def _word_tokenizer(path):
  """A word-level tokenizer.json with Gemma's special ids (<pad> <eos> <bos> <unk> = 0..3)
  and <bos> before every text, saved into `path`; returns the transformers tokenizer."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  vocab = {s: i for i, s in enumerate(['<pad>', '<eos>', '<bos>', '<unk>'])}
  vocab.update({f'w{i}': i for i in range(4, VOCAB)})
  tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(['<pad>', '<eos>', '<bos>', '<unk>'])
  tok.post_processor = processors.TemplateProcessing(single='<bos> $A',
                                                     special_tokens=[('<bos>', 2)])
  fast = hf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token='<pad>', eos_token='<eos>',
                                    bos_token='<bos>', unk_token='<unk>')
  fast.save_pretrained(path)
  return fast


def test_tx_convert_then_generate_prints_transformers_greedy_text(gemma, tmp_path, capsys):
  pytest.importorskip('tokenizers')
  model, path = gemma('gemma3')
  ckpt = tmp_path / 'ckpt'
  shutil.copytree(path, ckpt)
  fast = _word_tokenizer(ckpt)
  run = tmp_path / 'run'
  assert cli.main(['convert', '--hf', str(ckpt), '--workdir', str(run)]) == 0
  prompt = 'w5 w17 w40 w99 w64 w8'  # 7 ids with <bos>: longer than the window
  ids = fast(prompt)['input_ids']
  with torch.no_grad():
    new = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                         dtype=torch.long), max_new_tokens=12, do_sample=False,
                         suppress_tokens=[0], eos_token_id=1, pad_token_id=0)[0, len(ids):].tolist()
  new = new[:new.index(1)] if 1 in new else new
  capsys.readouterr()
  assert cli.main(['generate', '--workdir', str(run), '--prompt', prompt,
                   '--set', 'decode.max_len=12']) == 0
  assert capsys.readouterr().out == fast.decode(ids + new, skip_special_tokens=True) + '\n'
