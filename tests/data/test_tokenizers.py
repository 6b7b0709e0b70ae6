"""Properties of tx.data.tokenizers: exact round trips, fixed special ids, byte counts,
save/load equality, caching and one-line DataErrors."""

import gzip
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest

from tx.data.errors import DataError
from tx.data.tokenizers import (BOS_ID, EOS_ID, MASK_ID, NUM_SPECIALS, PAD_ID, SPECIAL_PIECES,
                                UNK_ID, ByteTokenizer, CharTokenizer, SentencePieceTokenizer,
                                build_tokenizer, cache_path, load_tokenizer)

ODD_TEXTS = ['', 'a', 'héllo wörld', 'emoji 😀🎉 ok', '世界 and Ελληνικά',
             '  two  spaces  ', 'line\nbreaks\n\n', '\ttab', 'literal <mask> and <s>',
             'marker \u2581 char', '\x00']


def _data_dir() -> Path:
  env = os.environ.get('TX_RAW_DATA')
  return Path(env) if env else Path(__file__).resolve().parents[2].parent / 'shared' / 'data'


def _need(rel: str) -> Path:
  path = _data_dir() / rel
  if not path.exists():
    pytest.skip(f'real data {path} absent (set $TX_RAW_DATA to the folder holding {rel})')
  return path


@pytest.fixture(scope='module')
def shakespeare() -> str:
  return _need('tinyshakespeare/input.txt').read_text(encoding='utf-8')


@pytest.fixture(scope='module')
def multi30k() -> list[str]:
  """Joint en + de training sentences (58,000)."""
  lines = []
  for lang in ('en', 'de'):
    with gzip.open(_need(f'multi30k/train.{lang}.gz'), 'rt', encoding='utf-8') as f:
      lines += [line.rstrip('\n') for line in f]
  return lines


@pytest.fixture(scope='module')
def spm_tokenizers(multi30k) -> dict:
  # bpe: the real setting (joint, 8000); unigram trains slower, so a subset and vocab 2000.
  return {'bpe': SentencePieceTokenizer.train(multi30k, kind='bpe', vocab_size=8000),
          'unigram': SentencePieceTokenizer.train(multi30k[::8], kind='unigram', vocab_size=2000)}


def _synthetic_corpus(n: int = 400) -> list[str]:
  rng = random.Random(0)
  words = 'the a dog cat runs sleeps on under red blue small big man woman child ball'.split()
  return [' '.join(rng.choice(words) for _ in range(rng.randint(3, 10))) + '.' for _ in range(n)]


# --- specials ----------------------------------------------------------------------------

def test_special_ids_are_fixed():
  assert (PAD_ID, BOS_ID, EOS_ID, UNK_ID, MASK_ID, NUM_SPECIALS) == (0, 1, 2, 3, 4, 5)
  assert SPECIAL_PIECES == ('<pad>', '<s>', '</s>', '<unk>', '<mask>')


@pytest.mark.parametrize('kind', ['bpe', 'unigram'])
def test_sentencepiece_special_pieces(spm_tokenizers, kind):
  tok = spm_tokenizers[kind]
  assert tuple(tok.id_to_piece(i) for i in range(5)) == SPECIAL_PIECES
  assert tok.vocab_size == {'bpe': 8000, 'unigram': 2000}[kind]
  # Text spelling a special is ordinary text: only the MLM masker emits MASK.
  ids = tok.encode('a <mask> b <s> </s> <pad> <unk>')
  assert min(ids) >= NUM_SPECIALS


# --- byte --------------------------------------------------------------------------------

@pytest.mark.parametrize('text', ODD_TEXTS)
def test_byte_round_trip_and_num_bytes(text):
  tok = ByteTokenizer()
  ids = tok.encode(text)
  assert tok.decode(ids) == text
  assert tok.num_bytes(ids) == len(text.encode('utf-8')) == len(ids)
  assert all(NUM_SPECIALS <= i < tok.vocab_size for i in ids)


def test_byte_layout_and_invalid_bytes():
  tok = ByteTokenizer()
  assert tok.vocab_size == 261
  assert tok.encode('A') == [ord('A') + NUM_SPECIALS]
  # A lone continuation byte (as a model might sample) decodes with a replacement char.
  assert tok.decode([0x80 + NUM_SPECIALS, ord('x') + NUM_SPECIALS]) == '\ufffdx'
  assert tok.decode(np.array([UNK_ID, 9999])) == '\ufffd\ufffd'


# --- char --------------------------------------------------------------------------------

def test_char_vocab_of_tiny_shakespeare(shakespeare):
  tok = CharTokenizer.train([shakespeare])
  assert tok.vocab_size == NUM_SPECIALS + 65 == 70
  assert list(tok.chars) == sorted(set(shakespeare))
  sample = shakespeare[:20_000]
  ids = tok.encode(sample)
  assert tok.decode(ids) == sample
  assert tok.num_bytes(ids) == len(sample.encode('utf-8'))
  assert min(ids) >= NUM_SPECIALS


def test_char_unknown_is_unk():
  tok = CharTokenizer.train(['abc ', 'cab'])
  assert tok.vocab_size == NUM_SPECIALS + 4
  assert tok.encode('a😀z') == [tok.encode('a')[0], UNK_ID, UNK_ID]
  assert tok.decode(tok.encode('a😀')) == 'a\ufffd'


# --- sentencepiece -----------------------------------------------------------------------

@pytest.mark.parametrize('kind', ['bpe', 'unigram'])
def test_sentencepiece_round_trip_is_exact(spm_tokenizers, multi30k, kind):
  # No normalisation (identity rule, whitespace kept, no dummy prefix) + byte
  # fallback: every text comes back unchanged and nothing becomes UNK.
  tok = spm_tokenizers[kind]
  for text in multi30k[::29] + ODD_TEXTS:
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.num_bytes(ids) == len(text.encode('utf-8'))
    assert UNK_ID not in ids


def test_bpe_compresses_multi30k(spm_tokenizers, multi30k):
  tok, sample = spm_tokenizers['bpe'], multi30k[::10]
  per_sentence = sum(len(tok.encode(s)) for s in sample) / len(sample)
  per_sentence_bytes = sum(len(s.encode()) for s in sample) / len(sample)
  assert per_sentence < per_sentence_bytes / 3  # ~14.6 vs ~66.4


def test_sentencepiece_training_is_deterministic(multi30k):
  corpus = multi30k[::20]
  for kind in ('bpe', 'unigram'):
    a = SentencePieceTokenizer.train(corpus, kind=kind, vocab_size=1000)
    b = SentencePieceTokenizer.train(corpus, kind=kind, vocab_size=1000)
    assert a.model_proto == b.model_proto


def test_num_bytes_is_additive_over_windows(spm_tokenizers, shakespeare):
  text = shakespeare[:5000]
  for tok in (ByteTokenizer(), CharTokenizer.train([text]), spm_tokenizers['bpe']):
    ids = tok.encode(text)
    windows = [ids[i:i + 64] for i in range(0, len(ids), 64)]
    assert sum(tok.num_bytes(w) for w in windows) == len(text.encode('utf-8'))
    table = tok.byte_lengths()
    assert (table.shape == (tok.vocab_size,)
            and int(table[np.array(ids)].sum()) == len(text.encode()))


def test_decode_skips_pad_bos_eos_mask_for_every_kind(spm_tokenizers):
  text = 'A dog runs, 😀.'
  for tok in (ByteTokenizer(), CharTokenizer.train([text]), *spm_tokenizers.values()):
    ids = [BOS_ID] + tok.encode(text) + [EOS_ID, PAD_ID, PAD_ID]
    assert tok.decode(ids) == text
    assert tok.decode([MASK_ID] + tok.encode(text)) == text
    assert tok.num_bytes(ids) == len(text.encode('utf-8'))
    assert tok.decode([]) == ''


# --- save / load / cache -----------------------------------------------------------------

def test_save_load_gives_identical_encodings(tmp_path, spm_tokenizers, multi30k):
  sample = multi30k[::500] + ODD_TEXTS
  tokenizers = [ByteTokenizer(), CharTokenizer.train(multi30k), *spm_tokenizers.values()]
  for i, tok in enumerate(tokenizers):
    path = tok.save(tmp_path / f'tok{i}.json')
    assert json.loads(path.read_text())['kind'] == tok.kind
    loaded = load_tokenizer(path)
    assert type(loaded) is type(tok) and loaded.vocab_size == tok.vocab_size
    assert [loaded.encode(s) for s in sample] == [tok.encode(s) for s in sample]
  assert load_tokenizer(tmp_path / 'tok2.model').kind == 'bpe'  # the .model finds its header
  assert not list(tmp_path.glob('*.tmp'))


@pytest.mark.parametrize('kind', ['char', 'bpe', 'unigram'])
def test_build_tokenizer_caches(tmp_path, kind):
  corpus, calls = _synthetic_corpus(), []

  def texts_fn():
    calls.append(1)
    return corpus

  first = build_tokenizer(kind, texts_fn, cache_dir=tmp_path, vocab_size=300)
  assert len(calls) == 1
  assert cache_path(kind, 300, tmp_path).is_file()
  if kind != 'char':
    assert (tmp_path / f'tokenizer-{kind}-300.model').is_file()
  second = build_tokenizer(kind, lambda: pytest.fail('texts_fn called on a cache hit'),
                           cache_dir=tmp_path, vocab_size=300)
  assert len(calls) == 1 and second.vocab_size == first.vocab_size
  assert [second.encode(s) for s in corpus[:50]] == [first.encode(s) for s in corpus[:50]]


def test_byte_build_needs_no_text(tmp_path):
  tok = build_tokenizer('byte', lambda: pytest.fail('byte needs no training'), cache_dir=tmp_path)
  assert tok.vocab_size == 261


def test_damaged_cache_is_retrained(tmp_path):
  corpus, calls = _synthetic_corpus(), []
  fn = lambda: calls.append(1) or corpus  # noqa: E731
  build_tokenizer('bpe', fn, cache_dir=tmp_path, vocab_size=300)
  (tmp_path / 'tokenizer-bpe-300.model').write_bytes(b'half written')
  with pytest.raises(DataError, match='does not match'):
    load_tokenizer(tmp_path / 'tokenizer-bpe-300.json')
  tok = build_tokenizer('bpe', fn, cache_dir=tmp_path, vocab_size=300)
  assert len(calls) == 2 and tok.decode(tok.encode(corpus[0])) == corpus[0]
  (tmp_path / 'tokenizer-bpe-300.json').write_text('{"kind": ')
  build_tokenizer('bpe', fn, cache_dir=tmp_path, vocab_size=300)
  assert len(calls) == 3


# --- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize('kind,vocab_size', [('bpe', 4), ('unigram', 5), ('bpe', 100),
                                             ('bpe', 262), ('unigram', 8000)])
def test_bad_vocab_size_is_a_data_error(tmp_path, kind, vocab_size):
  # 4/5: no room beside the specials; 100: no room for byte pieces; 262: too few for the
  # characters of the data; 8000: more pieces than 400 short sentences can give.
  with pytest.raises(DataError, match=r'data\.vocab_size') as err:
    build_tokenizer(kind, _synthetic_corpus, cache_dir=tmp_path, vocab_size=vocab_size)
  assert '\n' not in str(err.value)
  assert not list(tmp_path.iterdir())


def test_unknown_kind_and_empty_text_are_data_errors(tmp_path):
  with pytest.raises(DataError, match=r'data\.tokenizer'):
    build_tokenizer('wordpiece', list, cache_dir=tmp_path)
  for kind, texts in (('char', ['', '']), ('bpe', ['', '\n  \n'])):
    with pytest.raises(DataError, match='empty'):
      build_tokenizer(kind, lambda: texts, cache_dir=tmp_path)
  with pytest.raises(DataError, match='not found'):
    load_tokenizer(tmp_path / 'missing.json')
