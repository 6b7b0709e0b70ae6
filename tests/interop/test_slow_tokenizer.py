"""`tx convert` of checkpoints that ship a slow tokenizer's files instead of tokenizer.json.

GPT-2-style vocab.json + merges.txt and a T5-style sentencepiece spiece.model (both built
offline) are converted through transformers' AutoTokenizer; the run must encode exactly as
`AutoTokenizer.from_pretrained(DIR)` does, with the checkpoint's special ids.
"""

import json
import sys

import pytest

torch = pytest.importorskip('torch')
hf = pytest.importorskip('transformers')
tokenizers = pytest.importorskip('tokenizers')

from tx import cli  # pylint: disable=g-import-not-at-top
from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
from tx.data.tokenizers import load_hf_tokenizer  # pylint: disable=g-import-not-at-top
from tx.interop.convert import convert  # pylint: disable=g-import-not-at-top

TEXTS = ['Hello world! This is a test.', 'The quick brown fox jumps over the lazy dog!',
         'a dog runs .', 'ein hund läuft .'] * 20
PROBES = ['Hello world!', 'a dog runs . The fox', 'naïve café']


def gpt2_slow(path, build_reference):
  """vocab.json + merges.txt of a byte-level BPE, <|endoftext|> last, beside a GPT-2."""
  from tokenizers import (  # pylint: disable=g-import-not-at-top
      decoders, models, pre_tokenizers, trainers)
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
      vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  size = tok.get_vocab_size()
  build_reference('gpt2', size + 1, bos_token_id=size, eos_token_id=size).save_pretrained(path)
  tok.model.save(str(path))
  vocab = json.loads((path / 'vocab.json').read_text())
  vocab['<|endoftext|>'] = size
  (path / 'vocab.json').write_text(json.dumps(vocab))
  return size


def t5_slow(path, build_reference):
  """A sentencepiece unigram spiece.model with T5's <pad> </s> <unk> = 0 1 2, beside a T5."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(TEXTS), model_prefix=str(path / 'spiece'), vocab_size=40,
      model_type='unigram', pad_id=0, eos_id=1, unk_id=2, bos_id=-1, pad_piece='<pad>',
      eos_piece='</s>', unk_piece='<unk>', minloglevel=2)
  (path / 'spiece.vocab').unlink()
  # transformers' T5 tokenizer appends 100 <extra_id_N> sentinels to the 40 pieces
  build_reference('t5_relu', 140, pad_token_id=0, eos_token_id=1,
                  decoder_start_token_id=0).save_pretrained(path)


@pytest.mark.parametrize('arch', ['gpt2', 't5'])
def test_slow_tokenizer_files_are_converted(arch, tmp_path, build_reference, capsys):
  ckpt = tmp_path / 'ckpt'
  ckpt.mkdir()
  (gpt2_slow if arch == 'gpt2' else t5_slow)(ckpt, build_reference)
  assert not (ckpt / 'tokenizer.json').exists()
  reference = hf.AutoTokenizer.from_pretrained(str(ckpt))
  assert cli.main(['convert', '--hf', str(ckpt), '--workdir', str(tmp_path / 'run')]) == 0
  assert 'data.tokenizer=hf' in capsys.readouterr().out
  tok = load_hf_tokenizer(tmp_path / 'run' / 'tokenizer')
  for text in PROBES:
    ids = reference(text)['input_ids']
    assert list(tok.prefix_ids) + tok.encode(text) + list(tok.suffix_ids) == ids
    assert tok.decode(ids) == reference.decode(ids, skip_special_tokens=True)
  if arch == 'gpt2':
    assert tok.eos_id == tok.bos_id == reference.eos_token_id == 300
  else:
    assert (tok.eos_id, tok.decoder_start_id, tok.suffix_ids) == (1, 0, (1,))
  assert cli.main(['generate', '--workdir', str(tmp_path / 'run'), '--prompt', 'a dog',
                   '--set', 'decode.max_len=4']) == 0


def test_without_transformers_a_slow_tokenizer_is_a_one_line_error(tmp_path, build_reference,
                                                                   monkeypatch):
  ckpt = tmp_path / 'ckpt'
  ckpt.mkdir()
  t5_slow(ckpt, build_reference)
  monkeypatch.setitem(sys.modules, 'transformers', None)
  with pytest.raises(ConfigError, match=r'only spiece.model.*pip install -e "\.\[interop\]"') as e:
    convert(ckpt, tmp_path / 'run')
  assert '\n' not in str(e.value)
  assert not (tmp_path / 'run').exists()  # nothing half-written


def test_a_tokenizer_larger_than_the_model_names_the_checkpoint_files(tmp_path, build_reference):
  ckpt = tmp_path / 'ckpt'
  ckpt.mkdir()
  t5_slow(ckpt, build_reference)
  build_reference('t5_relu', 100).save_pretrained(ckpt)  # 140 token ids do not fit 100 rows
  with pytest.raises(ConfigError, match=r'ckpt/spiece.model: 140 token ids but the model only '
                                        r'100') as e:
    convert(ckpt, tmp_path / 'run')
  assert '\n' not in str(e.value) and not (tmp_path / 'run').exists()
