"""Qwen3, Mistral and LLaMA 3.1 (and the other RoPE scalings) against `transformers`.

Reference models: 2 layers, d 32, 4 query heads sharing 2 key/value heads, vocab 101,
random weights (norm scales too, so a swapped or dropped norm shows), built offline:
  qwen3    q/k RMSNorm, head_dim 16 (not d / heads), tied head, a window of 4 on layer 1
           only (use_sliding_window, max_window_layers=1 -> layer_types full, sliding);
  mistral  a window of 4 on every layer;
  llama31  rope_type llama3 from an original context of 8 to 32 (factor 4).
Logits agree within 1e-4 on right-padded batches of lengths 13, 9, 5 (past the window and
the original context); greedy generation with tx's KV cache equals `generate` token for
token on left-padded prompts over 16 new tokens (past both too); export -> import is
bitwise and `transformers` reloads the export with the very same logits.

transformers' sliding-window mask counts key indices over the padded row
(`kv_idx > q_idx - W`), tx counts positions over real tokens: the two agree whenever a
row's real tokens are contiguous (right padding in a forward pass, left padding in
generate, the only layouts tx produces), which is what these tests use.
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
from tx.decode import generate_lm, left_pad  # pylint: disable=g-import-not-at-top
from tx.interop import export_hf, load_hf  # pylint: disable=g-import-not-at-top

NAMES = ('qwen3', 'mistral', 'llama31')
COMMON = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, vocab_size=101, rms_norm_eps=1e-5, initializer_range=0.2,
              bos_token_id=None, eos_token_id=None)  # no EOS: generation runs its full length
LLAMA3 = dict(rope_type='llama3', rope_theta=10000.0, factor=4.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=8)
LENGTHS, WIDTH = (13, 9, 5), 13
MAX_NEW = 16


def build(name: str):
  """A `transformers` reference model `name` (see the module docstring), in eval mode."""
  torch.manual_seed(NAMES.index(name))
  if name == 'qwen3':
    model = hf.Qwen3ForCausalLM(hf.Qwen3Config(
        **COMMON, head_dim=16, use_sliding_window=True, sliding_window=4, max_window_layers=1,
        tie_word_embeddings=True))
  elif name == 'mistral':
    model = hf.MistralForCausalLM(hf.MistralConfig(**COMMON, sliding_window=4))
  else:
    model = hf.LlamaForCausalLM(hf.LlamaConfig(**COMMON, max_position_embeddings=32,
                                               rope_parameters=dict(LLAMA3)))
  with torch.no_grad():
    for key, value in model.named_parameters():
      if key.endswith('norm.weight'):
        value.copy_(1 + 0.3 * torch.randn_like(value))
  return model.eval()


@pytest.fixture(scope='session')
def family(saved):
  """family(name) -> (transformers model, directory it was saved to), built once."""
  return lambda name: saved(build, name)


def _hf_logits(model, tokens, mask):
  with torch.no_grad():
    return model(input_ids=torch.as_tensor(tokens),
                 attention_mask=torch.as_tensor(mask.astype(np.int64))).logits.numpy()


def _tx_logits(cfg, params, tokens):
  return np.asarray(tx.build_model(cfg).apply({'params': params}, jnp.asarray(tokens)))


def _close(ref, out, mask):
  assert ref[mask].std() > 0.3, 'reference logits are too small for a meaningful comparison'
  assert np.abs(ref - out)[mask].max() < 1e-4


@pytest.mark.parametrize('name', NAMES)
def test_logits_match_past_the_window(family, batch, name):
  model, path = family(name)
  cfg, params = load_hf(path)
  expected = {'qwen3': (4, 'global,local', 'rmsnorm', 'none'),
              'mistral': (4, 'local', 'none', 'none'),
              'llama31': (0, 'local', 'none', 'llama3')}[name]
  assert (cfg.attention_window, cfg.attention_pattern, cfg.qk_norm,
          cfg.rope_scaling.kind) == expected
  tokens, mask = batch(LENGTHS, WIDTH)
  _close(_hf_logits(model, tokens, mask), _tx_logits(cfg, params, tokens), mask)


@pytest.mark.parametrize('name', NAMES)
def test_greedy_matches_past_the_window(family, name, hf_greedy):
  model, path = family(name)
  cfg, params = load_hf(path)
  rng = np.random.default_rng(4)
  prompt = np.array(left_pad([list(rng.integers(1, 101, n)) for n in (7, 5, 2)]))
  ref = hf_greedy(model, prompt, MAX_NEW)
  out = generate_lm(cfg, params, jnp.asarray(prompt), jax.random.key(0), max_new=MAX_NEW,
                    eos_id=-1)
  assert ref.shape == (3, MAX_NEW) and np.array_equal(np.asarray(out), ref)


@pytest.mark.parametrize('name', NAMES)
def test_import_export_import_is_bitwise(family, batch, tmp_path, name, same_tree):
  model, path = family(name)
  cfg, params = load_hf(path)
  export_hf(cfg, params, tmp_path)  # the default layout: qwen3 / mistral / llama
  assert json.loads((tmp_path / 'config.json').read_text())['model_type'] == (
      'llama' if name == 'llama31' else name)
  cfg2, params2 = load_hf(tmp_path)
  assert cfg2 == cfg and same_tree(params, params2)
  reloaded = type(model).from_pretrained(tmp_path).eval()
  tokens, mask = batch((9, 6), 9)
  with torch.no_grad():
    args = dict(input_ids=torch.as_tensor(tokens), attention_mask=torch.as_tensor(mask * 1))
    assert torch.equal(reloaded(**args).logits, model(**args).logits)


RESCALED = {  # the llama31 weights under each other HF rope_type
    'linear': dict(rope_parameters=dict(rope_type='linear', rope_theta=10000.0, factor=4.0)),
    'dynamic': dict(max_position_embeddings=8,  # the NTK base grows past 8 positions
                    rope_parameters=dict(rope_type='dynamic', rope_theta=10000.0, factor=4.0)),
    'yarn': dict(rope_parameters=dict(rope_type='yarn', rope_theta=10000.0, factor=4.0,
                                      original_max_position_embeddings=8, beta_fast=8.0,
                                      beta_slow=2.0, mscale=0.8, mscale_all_dim=1.0)),
}


def test_other_rope_scalings_match_and_round_trip(family, batch, tmp_path):
  """linear, dynamic (NTK) and yarn (with DeepSeek's mscale / mscale_all_dim) from config.json:
  logits within 1e-4 past the original context, and export -> import gives the same config."""
  model, path = family('llama31')
  tokens, mask = batch(LENGTHS, WIDTH)
  for kind, changes in RESCALED.items():
    ckpt = tmp_path / kind
    shutil.copytree(path, ckpt)
    data = json.loads((ckpt / 'config.json').read_text())
    data.update(changes)
    (ckpt / 'config.json').write_text(json.dumps(data))
    ref = _hf_logits(hf.LlamaForCausalLM.from_pretrained(ckpt).eval(), tokens, mask)
    cfg, params = load_hf(ckpt)
    assert cfg.rope_scaling.kind == kind
    _close(ref, _tx_logits(cfg, params, tokens), mask)
    assert np.abs(ref - _hf_logits(model, tokens, mask))[mask].max() > 1e-3, kind  # it acts
    export_hf(cfg, params, tmp_path / f'{kind}_out')
    assert load_hf(tmp_path / f'{kind}_out')[0] == cfg


@pytest.mark.parametrize('kw', [
    dict(qk_norm='rmsnorm', head_dim=16, attention_window=3, attention_pattern='local,global',
         rope_scaling=dict(kind='yarn', factor=2.0, original_max_len=8)),
    dict(num_kv_heads=1, attention_window=5, rope_scaling=dict(kind='linear', factor=2.0)),
], ids=['qwen3', 'mistral'])
def test_tx_model_exports_to_transformers(batch, tmp_path, kw, same_tree):
  """A tx-initialised model with the knobs, exported, gives the same logits in transformers."""
  cfg = tx.ModelConfig(family='decoder', vocab_size=101, d_model=32, num_heads=4, d_ff=64,
                       num_layers=2, max_len=16, position='rope', norm='rmsnorm',
                       ffn='swiglu', use_bias=False, tie_embeddings=False, **kw)
  params = nn.unbox(tx.models.init_params(cfg, jax.random.key(1)))
  export_hf(cfg, params, tmp_path)
  cfg2, params2 = load_hf(tmp_path)
  assert cfg2 == cfg and same_tree(params, params2)
  model = hf.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
  assert model.config.model_type == ('qwen3' if 'qk_norm' in kw else 'mistral')
  tokens, mask = batch(LENGTHS, WIDTH)
  ref = _hf_logits(model, tokens, mask)
  assert np.abs(ref - _tx_logits(cfg, params, tokens))[mask].max() < 1e-4


def test_convert_then_generate_cli_matches_transformers(family, tmp_path, capsys):
  """`tx convert` of the windowed Qwen3 (with a word-level tokenizer.json), then `tx generate`
  prints transformers' greedy continuation."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  model, path = family('qwen3')
  ckpt = tmp_path / 'ckpt'
  shutil.copytree(path, ckpt)
  vocab = {'<unk>': 0, '<s>': 1, '</s>': 2, **{f'w{i}': i for i in range(3, 101)}}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token='<unk>'))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  fast = hf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token='<s>', eos_token='</s>',
                                    unk_token='<unk>')
  fast.save_pretrained(ckpt)
  prompt = 'w5 w17 w33 w8 w9 w44 w71'
  ids = fast(prompt)['input_ids']
  with torch.no_grad():
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                         dtype=torch.long), max_new_tokens=MAX_NEW, do_sample=False,
                         eos_token_id=2, pad_token_id=2)[0].tolist()
  new = out[len(ids):]
  new = new[:new.index(2)] if 2 in new else new
  assert len(new) > 8  # past the window of 4
  run = tmp_path / 'run'
  assert cli.main(['convert', '--hf', str(ckpt), '--workdir', str(run),
                   '--set', f'data.data_dir={tmp_path / "tfds"}']) == 0
  capsys.readouterr()
  assert cli.main(['generate', '--workdir', str(run), '--prompt', prompt,
                   '--set', f'decode.max_len={MAX_NEW}']) == 0
  assert capsys.readouterr().out == fast.decode(ids + new, skip_special_tokens=True) + '\n'
