"""The PyTorch peers of `tx bench` run on a tiny config and return finite, positive numbers."""

import json
import math

import pytest

pytest.importorskip('torch')
pytest.importorskip('transformers')

from tx.bench import torch_peers  # pylint: disable=g-import-not-at-top

TINY = dict(layers=2, heads=2, d_model=32, d_ff=64, vocab=37, ctx=16, batch=2, steps=2,
            warmup=1, threads=1, repeats=2, prompt_len=4, new=6, enc_layers=2, dec_layers=2,
            src_len=16, tgt_len=16)
TRAIN = ('step_time_s', 'step_time_min_s', 'tokens_per_s', 'first_step_s', 'warmup_calls',
         'params', 'loss')
DECODE = ('new_tokens_per_s', 'new_tokens_per_s_median', 'time_s', 'generated_tokens')


def _check(result, keys):
  for key in keys:
    assert math.isfinite(result[key]) and result[key] > 0, (key, result[key])
  assert all(isinstance(v, (int, float)) for v in result.values()), result


@pytest.mark.parametrize('name', ['gpt2_train', 'bert_train', 'seq2seq_train'])
def test_train_peers(name):
  result = getattr(torch_peers, name)(TINY)
  _check(result, TRAIN)
  assert result['step_time_min_s'] <= result['step_time_s']


def test_gpt2_train_attention_choice():
  assert torch_peers.gpt2_train(TINY)['sdpa'] == 1.0  # the default
  assert torch_peers.gpt2_train(dict(TINY, attn_implementation='eager'))['sdpa'] == 0.0


def test_gpt2_params_count_the_tied_embedding_once():
  d, v, ctx, ff = TINY['d_model'], TINY['vocab'], TINY['ctx'], TINY['d_ff']
  block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d)
  assert torch_peers.gpt2_train(TINY)['params'] == v * d + ctx * d + 2 * block + 2 * d


@pytest.mark.parametrize('name', ['gpt2_generate', 'seq2seq_decode'])
def test_decode_peers_generate_exactly_new_tokens(name):
  result = getattr(torch_peers, name)(TINY)
  _check(result, DECODE)
  assert result['generated_tokens'] == TINY['new']
  assert result['new_tokens_per_s'] >= result['new_tokens_per_s_median']


def test_gpt2_generate_past_the_training_ctx():  # n_positions grows to prompt_len + new
  result = torch_peers.gpt2_generate(dict(TINY, ctx=8, prompt_len=6, new=5, repeats=1))
  assert result['generated_tokens'] == 5


def test_cli_prints_one_json_line(capsys):
  torch_peers.main(['seq2seq_decode', '{"layers": 1, "heads": 2, "d_model": 16, "d_ff": 32, '
                    '"vocab": 11, "batch": 1, "threads": 1, "repeats": 1, "new": 2, '
                    '"enc_layers": 1, "dec_layers": 1, "src_len": 4}'])
  result = json.loads(capsys.readouterr().out)
  assert result['peak_rss_bytes'] > 0 and result['generated_tokens'] == 2


def test_gpt2_train_in_bf16_autocast():
  result = torch_peers.gpt2_train(dict(TINY, dtype='bfloat16'))
  _check(result, TRAIN)
  with pytest.raises(ValueError, match='float32 or bfloat16'):
    torch_peers.gpt2_train(dict(TINY, dtype='float16'))


def test_ceiling_reports_both_dtypes():
  result = torch_peers.ceiling({'threads': 1, 'n': 64, 'repeats': 2})
  _check(result, ('float32_flops', 'bfloat16_flops', 'float32_flops_best'))


def test_ceiling_times_only_the_dtypes_asked_for():
  """A host without bf16 arithmetic asks for float32 alone (torch emulates bf16 there)."""
  result = torch_peers.ceiling({'threads': 1, 'n': 64, 'repeats': 2, 'dtypes': ['float32'],
                                'gemms': [['g', 8, 16, 8, False]],
                                'attention': [['a', 1, 8, 2, 4, True]]})
  assert result['float32_flops'] > 0 and 'bfloat16_flops' not in result
  assert list(result['gemms']['g']) == ['float32'] and list(result['attention']['a']) == [
      'float32']
  assert result['gemms_best']['g']['float32'] >= result['gemms']['g']['float32']
