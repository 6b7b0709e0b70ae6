"""Imported checkpoints give the reference logits (float32, max abs diff < 1e-4).

Batches are padded (right padding, odd lengths) and both sides get the mask; only real
positions are compared.
"""

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')
pytest.importorskip('transformers')

import tx  # pylint: disable=g-import-not-at-top
from tx.interop import load_hf  # pylint: disable=g-import-not-at-top

TOL = 1e-4
LENGTHS, WIDTH = (7, 5, 2), 7


def _hf_logits(model, **inputs):
  with torch.no_grad():
    return model(**{k: torch.as_tensor(np.asarray(v)) for k, v in inputs.items()}).logits.numpy()


def _compare(ref, out, mask):
  assert ref.shape == out.shape
  assert ref[mask].std() > 0.3, 'reference logits are too small for a meaningful comparison'
  assert np.abs(ref - out)[mask].max() < TOL


@pytest.mark.parametrize('arch', ['gpt2', 'llama', 'bloom'])
def test_decoder_logits_match(reference, batch, arch):
  model, path = reference(arch)
  cfg, params = load_hf(path)
  tokens, mask = batch(LENGTHS, WIDTH)
  ref = _hf_logits(model, input_ids=tokens, attention_mask=mask.astype(np.int64))
  out = np.asarray(tx.build_model(cfg).apply({'params': params}, jnp.asarray(tokens)))
  _compare(ref, out, mask)


def test_bert_mlm_logits_match_with_token_types(reference, batch):
  model, path = reference('bert')
  cfg, params = load_hf(path)
  assert (cfg.norm_position, cfg.norm_eps, cfg.ffn, cfg.embed_norm) == ('post', 1e-12, 'gelu', True)
  tokens, mask = batch(LENGTHS, WIDTH, seed=1)
  types = (np.arange(WIDTH)[None] >= 3).astype(np.int64) * mask
  ref = _hf_logits(model, input_ids=tokens, attention_mask=mask.astype(np.int64),
                   token_type_ids=types)
  out = np.asarray(tx.build_model(cfg).apply({'params': params}, jnp.asarray(tokens),
                                             token_types=jnp.asarray(types)))
  _compare(ref, out, mask)


@pytest.mark.parametrize('arch', ['t5_relu', 't5_gated'])
def test_t5_logits_match(reference, batch, arch):
  model, path = reference(arch)
  cfg, params = load_hf(path)
  assert cfg.logits_scale == (32 ** -0.5 if arch == 't5_relu' else 1.0)
  src, src_mask = batch(LENGTHS, WIDTH, seed=2)
  tgt, tgt_mask = batch((5, 3, 1), 5, seed=3)
  tgt[:, 0] = 0  # T5 starts from its pad id; segment ids mark it as a real token for tx
  ref = _hf_logits(model, input_ids=src, attention_mask=src_mask.astype(np.int64),
                   decoder_input_ids=tgt, decoder_attention_mask=tgt_mask.astype(np.int64))
  out = np.asarray(tx.build_model(cfg).apply(
      {'params': params}, jnp.asarray(src), jnp.asarray(tgt),
      tgt_segment_ids=jnp.asarray(tgt_mask.astype(np.int32))))
  _compare(ref, out, tgt_mask)


def test_pytorch_state_dict_and_bfloat16_import(reference, tmp_path):
  """pytorch_model.bin (read with weights_only) and bf16 safetensors give the same params."""
  import shutil  # pylint: disable=g-import-not-at-top
  model, path = reference('gpt2')
  _, params = load_hf(path)
  (tmp_path / 'bin').mkdir()
  shutil.copy(path / 'config.json', tmp_path / 'bin')
  torch.save(model.state_dict(), tmp_path / 'bin' / 'pytorch_model.bin')
  _, from_bin = load_hf(tmp_path / 'bin')
  assert _equal(params, from_bin)

  from safetensors.torch import save_file  # pylint: disable=g-import-not-at-top
  (tmp_path / 'bf16').mkdir()
  shutil.copy(path / 'config.json', tmp_path / 'bf16')
  state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()
           if k != 'lm_head.weight'}
  save_file(state, tmp_path / 'bf16' / 'model.safetensors')
  _, from_bf16 = load_hf(tmp_path / 'bf16')
  embedding = state['transformer.wte.weight'].float().numpy()
  assert np.array_equal(np.asarray(from_bf16['embed']['embedding']), embedding)


def _equal(a, b) -> bool:
  import jax  # pylint: disable=g-import-not-at-top
  same = jax.tree_util.tree_map(lambda x, y: bool(np.array_equal(x, y)), a, b)
  return jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b) and all(
      jax.tree_util.tree_leaves(same))
