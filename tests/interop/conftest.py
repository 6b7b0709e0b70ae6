"""Tiny reference models built with `transformers` (random weights, offline), saved once.

Weights are initialised with a larger spread than the libraries' defaults so the logits
are O(1): a 1e-4 agreement then means something. torch runs on one thread (CI has 2 cores).
"""

import numpy as np
import pytest

VOCAB = 101
ARCHS = ('gpt2', 'llama', 'bloom', 'bert', 't5_relu', 't5_gated')


def build(arch: str, vocab: int = VOCAB, **special_ids):
  """A 2-layer `transformers` model of `arch` with seeded random weights, in eval mode.

  gpt2 / llama / bert / t5 take a vocabulary size and special ids (bos_token_id=...,
  eos_token_id=..., pad_token_id=...) to match a tokenizer (tests/interop/test_tokenizer.py,
  test_t5_tokenizer.py).
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers as hf  # pylint: disable=g-import-not-at-top
  torch.manual_seed(ARCHS.index(arch))
  if arch == 'gpt2':
    model = hf.GPT2LMHeadModel(hf.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=vocab, n_positions=48, initializer_range=0.2,
        **special_ids))
  elif arch == 'llama':  # grouped-query attention: 4 query heads share 2 key/value heads
    model = hf.LlamaForCausalLM(hf.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=vocab, rope_theta=5000.0, rms_norm_eps=1e-5,
        initializer_range=0.2, **special_ids))
  elif arch == 'bloom':  # 6 heads: ALiBi slopes of a non-power-of-two head count
    model = hf.BloomForCausalLM(hf.BloomConfig(
        n_layer=2, hidden_size=48, n_head=6, vocab_size=VOCAB, initializer_range=0.2))
  elif arch == 'bert':
    model = hf.BertForMaskedLM(hf.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
        vocab_size=vocab, max_position_embeddings=40, initializer_range=0.2, **special_ids))
  else:  # T5 v1.0 (relu, tied head scaled by d_model^-0.5) and v1.1 (gated gelu_tanh, no scale)
    gated = arch == 't5_gated'
    model = hf.T5ForConditionalGeneration(hf.T5Config(
        num_layers=2, d_model=32, num_heads=4, d_kv=8, d_ff=64, vocab_size=vocab,
        feed_forward_proj='gated-gelu' if gated else 'relu', tie_word_embeddings=not gated,
        relative_attention_num_buckets=8, relative_attention_max_distance=16,
        initializer_factor=1.0, **special_ids))
  return model.eval()


@pytest.fixture(scope='session')
def saved(tmp_path_factory):
  """saved(build_fn, name) -> (the model build_fn(name), the directory it was saved to),
  built and saved once per session (test files pass their own builders)."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(1)
  cache = {}

  def get(build_fn, name):
    if (build_fn, name) not in cache:
      model = build_fn(name)
      path = tmp_path_factory.mktemp(name)
      model.save_pretrained(path)
      cache[build_fn, name] = (model, path)
    return cache[build_fn, name]
  return get


@pytest.fixture(scope='session')
def reference(saved):
  """reference(arch) -> (transformers model, directory it was saved to), built once."""
  return lambda arch: saved(build, arch)


def padded_batch(lengths, width, seed=0):
  """int64 [B, width] right-padded random tokens in 1..VOCAB-1 (pad 0), and the bool mask."""
  rng = np.random.default_rng(seed)
  mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
  return np.where(mask, rng.integers(1, VOCAB, (len(lengths), width)), 0), mask


@pytest.fixture(scope='session')
def batch():
  """batch(lengths, width, seed) -> (tokens [B, width], mask [B, width]); see padded_batch."""
  return padded_batch


@pytest.fixture(scope='session')
def build_reference():
  """build_reference(arch, vocab, **special_ids) -> a fresh `transformers` model; see build."""
  return build


@pytest.fixture(scope='session')
def same_tree():
  """same_tree(a, b) -> True iff two param trees have one structure and bitwise-equal leaves
  of the same dtypes (export/import round trips)."""
  import jax  # pylint: disable=g-import-not-at-top

  def same(a, b) -> bool:
    if jax.tree_util.tree_structure(a) != jax.tree_util.tree_structure(b):
      return False
    return all(np.array_equal(x, y) and x.dtype == y.dtype
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))
  return same


@pytest.fixture(scope='session')
def hf_greedy():
  """hf_greedy(model, prompt [B, L] left-padded, max_new, **generate_kwargs) -> the new tokens
  [B, <=max_new] of transformers' greedy `generate` (pad id 0, never emitted)."""
  import torch  # pylint: disable=g-import-not-at-top

  def greedy(model, prompt, max_new, **kwargs):
    with torch.no_grad():
      out = model.generate(input_ids=torch.as_tensor(prompt),
                           attention_mask=torch.as_tensor((prompt != 0).astype(np.int64)),
                           max_new_tokens=max_new, do_sample=False, suppress_tokens=[0],
                           pad_token_id=0, **kwargs)
    return out.numpy()[:, prompt.shape[1]:]
  return greedy
