"""Greedy generation with tx's KV cache equals `transformers` generate, token for token.

Decoder prompts are left-padded with odd lengths (tx and transformers both count positions
over real tokens only); T5 sources are right-padded and decoding starts from id 0. tx never
emits the pad id 0, so the reference suppresses it too.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip('torch')
pytest.importorskip('transformers')

from tx.decode import generate_lm, generate_seq2seq, left_pad  # pylint: disable=g-import-not-at-top
from tx.interop import load_hf  # pylint: disable=g-import-not-at-top

MAX_NEW = 8


def _pad_to(tokens, width):
  return np.pad(tokens, ((0, 0), (0, width - tokens.shape[1])))


@pytest.mark.parametrize('arch', ['gpt2', 'llama', 'bloom'])
def test_decoder_greedy_matches(reference, arch, hf_greedy):
  model, path = reference(arch)
  cfg, params = load_hf(path)
  rng = np.random.default_rng(4)
  prompt = np.array(left_pad([list(rng.integers(1, 101, n)) for n in (5, 3, 1)]))
  ref = hf_greedy(model, prompt, MAX_NEW, eos_token_id=2)
  out = generate_lm(cfg, params, jnp.asarray(prompt), jax.random.key(0), max_new=MAX_NEW,
                    eos_id=2)
  assert np.array_equal(np.asarray(out), _pad_to(ref, MAX_NEW))


@pytest.mark.parametrize('arch', ['t5_relu', 't5_gated'])
def test_t5_greedy_matches(reference, batch, arch):
  model, path = reference(arch)
  cfg, params = load_hf(path)
  src, mask = batch((6, 3), 6, seed=5)
  with torch.no_grad():
    ref = model.generate(input_ids=torch.as_tensor(src),
                         attention_mask=torch.as_tensor(mask.astype(np.int64)),
                         max_new_tokens=MAX_NEW, do_sample=False, suppress_tokens=[0],
                         eos_token_id=1, pad_token_id=0, decoder_start_token_id=0).numpy()[:, 1:]
  out = generate_seq2seq(cfg, params, jnp.asarray(src), jax.random.key(0), max_new=MAX_NEW,
                         eos_id=1, bos_id=0)
  assert np.array_equal(np.asarray(out), _pad_to(ref, MAX_NEW))
