"""data.tokenizer=hf: a converted checkpoint's own tokenizer.json drives tx generate and tx eval.

Two tokenizers are trained offline with the `tokenizers` library, shaped like the real ones:
GPT-2's (byte-level BPE; <|endoftext|> = BOS = EOS is the last id; no pad; id 0 is "!") and
LLaMA's (BPE with byte fallback; <unk> <s> </s> = 0 1 2; a post-processor putting <s> before
every text; a decoder that drops the text's leading space). Each is saved beside a small
random model of its architecture with save_pretrained, converted with `tx convert`, and
`tx generate` (tx.cli.main, in-process) must print the text of transformers' greedy
`generate` on the same prompts, token for token. The GPT-2 model is nudged to emit "!", so
prompts and continuations hold id 0, which tx otherwise reserves for padding; `tx eval` on
that run must give transformers' loss on the very same windows. A BERT-like WordPiece
tokenizer ([PAD] [UNK] [CLS] [SEP] [MASK] = 0..4) beside a random BertForMaskedLM gives MLM
batches masked with its own ids and framed [CLS] ... [SEP]; `tx eval` must match
transformers' MLM loss on them.
"""

import json
import math

import jax
import numpy as np
import pytest

torch = pytest.importorskip('torch')
hf = pytest.importorskip('transformers')
tokenizers = pytest.importorskip('tokenizers')

from tx import cli  # pylint: disable=g-import-not-at-top
from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
from tx.config.data import DataConfig  # pylint: disable=g-import-not-at-top
from tx.data.errors import DataError  # pylint: disable=g-import-not-at-top
from tx.data.tokenizers import (  # pylint: disable=g-import-not-at-top
    HfTokenizer, load_hf_tokenizer, load_tokenizer)
from tx.decode.texts import source_rows  # pylint: disable=g-import-not-at-top

EOT = '<|endoftext|>'
TEXTS = ['Hello world! This is a test.', 'The quick brown fox jumps over the lazy dog!',
         'Wow!! Such tokens, much bytes: naive cafe.'] * 3
PROMPTS = {'gpt2': ['Hello! world!', '!', 'Wow!! Such', ''],
           'llama': ['Hello world!', 'The quick brown fox', '', 'naïve 東京!']}
NEW = 12
PROBES = ['Hello world!', '  two  spaces\nand a newline!', 'naïve café — 東京 ½', '']
# Text that spells a special token encodes to that token, as in transformers (so it does
# not survive decoding); sentencepiece's '▁' in the text decodes as a space (LLaMA).
SPELLED = 'a <s> b </s> c <|endoftext|> d ▁ e'



def gpt2_tokenizer():
  """Byte-level BPE like GPT-2's: 256 byte symbols ("!" first), merges, then <|endoftext|>."""
  from tokenizers import (  # pylint: disable=g-import-not-at-top
      decoders, models, pre_tokenizers, trainers)
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
      vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
  tok.add_special_tokens([EOT])
  return tok


def llama_tokenizer():
  """LLaMA-2's layout: <unk> <s> </s>, 256 byte pieces, BPE merges over '▁'-joined words."""
  from tokenizers import (  # pylint: disable=g-import-not-at-top
      AddedToken, decoders, models, normalizers, processors, trainers)
  normalizer = normalizers.Sequence([normalizers.Prepend('▁'), normalizers.Replace(' ', '▁')])
  trained = tokenizers.Tokenizer(models.BPE())
  trained.normalizer = normalizer
  trained.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=120, show_progress=False))
  learned = json.loads(trained.to_str())['model']
  vocab = {'<unk>': 0, '<s>': 1, '</s>': 2, **{f'<0x{b:02X}>': 3 + b for b in range(256)}}
  for piece in sorted(learned['vocab'], key=learned['vocab'].get):
    vocab.setdefault(piece, len(vocab))
  merges = [tuple(m.split(' ')) if isinstance(m, str) else tuple(m) for m in learned['merges']]
  tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token='<unk>',
                                        byte_fallback=True, fuse_unk=True))
  tok.normalizer = normalizer
  tok.decoder = decoders.Sequence([decoders.Replace('▁', ' '), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(' ', 1, 0)])
  tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                          for s in ('<unk>', '<s>', '</s>')])
  tok.post_processor = processors.TemplateProcessing(
      single='<s> $A', pair='<s> $A <s> $B', special_tokens=[('<s>', 1)])
  return tok


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory, build_reference):
  """checkpoint(name) -> (transformers model, PreTrainedTokenizerFast, its directory)."""
  import torch  # pylint: disable=g-import-not-at-top,redefined-outer-name
  torch.set_num_threads(1)
  cache = {}

  def get(name):
    if name not in cache:
      if name == 'gpt2':
        tok = gpt2_tokenizer()
        eot = tok.token_to_id(EOT)
        fast = hf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT,
                                          unk_token=EOT)
        model = build_reference('gpt2', tok.get_vocab_size(), bos_token_id=eot,
                                eos_token_id=eot)
        with torch.no_grad():  # pull the final hidden states towards "!" (id 0)
          wte = model.transformer.wte.weight
          model.transformer.ln_f.bias += 3.0 * wte[0] / wte[0].norm()
      else:
        tok = llama_tokenizer()
        fast = hf.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token='<s>',
                                          eos_token='</s>', unk_token='<unk>')
        model = build_reference('llama', tok.get_vocab_size(), bos_token_id=1, eos_token_id=2)
      path = tmp_path_factory.mktemp(f'{name}_checkpoint')
      model.save_pretrained(path)
      fast.save_pretrained(path)
      cache[name] = (model, fast, path)
    return cache[name]
  return get


@pytest.fixture(scope='module')
def converted(checkpoint, tmp_path_factory):
  """converted(name) -> a run directory made by `tx convert` (GPT-2: with a text dataset)."""
  cache = {}

  def get(name):
    if name not in cache:
      _, _, path = checkpoint(name)
      tmp = tmp_path_factory.mktemp(f'{name}_run')
      convert_with_corpus(path, tmp, TEXTS * 3, TEXTS[:2], TEXTS[2:5])
      cache[name] = tmp / 'run'
    return cache[name]
  return get


def convert_with_corpus(checkpoint_dir, tmp, train, valid_a, valid_b):
  """`tx convert` into tmp/run with a text dataset split by file name: one train and two
  validation documents (windows of 16 tokens, batches of 4)."""
  corpus = tmp / 'corpus'
  corpus.mkdir()
  for file, texts in (('a.train.txt', train), ('b.valid.txt', valid_a), ('c.valid.txt', valid_b)):
    (corpus / file).write_text('\n'.join(texts) + '\n')
  sets = [f'data.data_dir={tmp / "tfds"}', 'data.dataset=text', f'data.files={corpus}',
          'data.seq_len=16', 'train.batch_size=4']
  assert cli.main(['convert', '--hf', str(checkpoint_dir), '--workdir', str(tmp / 'run'),
                   '--set', *sets]) == 0


def reference_continuation(model, fast, prompt: str) -> tuple[list[int], list[int]]:
  """(prompt ids, greedy new ids up to EOS) from transformers, as a user would run it."""
  ids = fast(prompt)['input_ids'] or [fast.eos_token_id]  # GPT-2: an empty prompt starts at EOT
  with torch.no_grad():
    out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                         dtype=torch.long), max_new_tokens=NEW, do_sample=False,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.eos_token_id)
  new = out[0, len(ids):].tolist()
  return ids, new[:new.index(fast.eos_token_id)] if fast.eos_token_id in new else new


@pytest.mark.parametrize('name', ['gpt2', 'llama'])
def test_generate_matches_transformers(checkpoint, converted, name, tmp_path, capsys):
  model, fast, _ = checkpoint(name)
  run = converted(name)
  prompts = PROMPTS[name]
  refs = [reference_continuation(model, fast, p) for p in prompts]
  expected = ''.join(fast.decode(ids + new, skip_special_tokens=True) + '\n' for ids, new in refs)
  inputs = tmp_path / 'prompts.txt'
  inputs.write_text(''.join(p + '\n' for p in prompts))
  capsys.readouterr()
  # one batch: the prompts are left-padded to the longest, so padding and real ids meet
  assert cli.main(['generate', '--workdir', str(run), '--input', str(inputs),
                   '--set', f'decode.max_len={NEW}']) == 0
  assert capsys.readouterr().out == expected
  if name == 'gpt2':  # the comparison covers "!" (id 0) in prompts and in continuations
    assert any(0 in ids for ids, _ in refs) and any(0 in new for _, new in refs)
  else:  # transformers starts each prompt with <s>; the continuation keeps its leading space
    assert all(ids[0] == 1 for ids, _ in refs)


def test_eval_matches_transformers(checkpoint, converted, capsys):
  """tx eval's loss on the validation windows equals transformers' on the same batches."""
  from tx.data import make_pipeline  # pylint: disable=g-import-not-at-top
  from tx.train.run_dir import load_run_config  # pylint: disable=g-import-not-at-top
  model, _, _ = checkpoint('gpt2')
  run = converted('gpt2')
  assert cli.main(['eval', '--workdir', str(run), '--extrapolation', 'none']) == 0
  capsys.readouterr()
  result = json.loads((run / 'eval_validation_0.json').read_text())
  cfg = load_run_config(run)
  pipe = make_pipeline(cfg.data, 'causal_lm', 'validation', batch_size=cfg.train.batch_size,
                       seed=cfg.train.seed, train=False)
  nll = weight = 0.0
  saw_zero = False
  for batch in pipe.iterator():
    inputs, mask = torch.as_tensor(batch['inputs']), torch.as_tensor(batch['segment_ids'])
    with torch.no_grad():
      logits = model(input_ids=inputs, attention_mask=mask).logits.double()
    losses = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), torch.as_tensor(batch['targets']).long(), reduction='none')
    w = torch.as_tensor(batch['weights']).double()
    nll += float((losses * w).sum())
    weight += float(w.sum())
    saw_zero |= bool(((batch['inputs'] == 0) & (batch['segment_ids'] == 1)).any())
  assert saw_zero  # "!" is an input the model must attend to, not padding
  assert math.isclose(result['loss'], nll / weight, rel_tol=1e-4)
  stream = pipe.rows.windows.stream  # documents are joined by the checkpoint's EOS
  assert pipe.tokenizer.eos_id == 300 and (stream == 300).any()


@pytest.mark.parametrize('name', ['gpt2', 'llama'])
def test_encoding_and_special_ids_match_transformers(checkpoint, name, tmp_path):
  _, fast, path = checkpoint(name)
  tok = load_hf_tokenizer(path)
  assert tok.vocab_size == len(fast)
  assert (tok.bos_id, tok.eos_id) == (fast.bos_token_id, fast.eos_token_id)
  assert tok.special_ids['pad'] is None and fast.pad_token_id is None
  assert tok.zero_is_token == (name == 'gpt2')  # GPT-2's id 0 is "!"; LLaMA's is <unk>
  assert tok.prefix_ids == ((1,) if name == 'llama' else ())
  for text in PROBES:
    ids = tok.encode(text)
    assert ids == fast(text, add_special_tokens=False)['input_ids']
    assert list(tok.prefix_ids) + ids == fast(text)['input_ids']
    assert tok.decode(ids) == fast.decode(ids, skip_special_tokens=True) == text
    assert tok.decode([*tok.prefix_ids, *ids, tok.eos_id]) == text  # specials are dropped
    if name == 'gpt2':  # byte-level: bytes per token add up exactly (bits per byte)
      assert tok.num_bytes(ids) == len(text.encode())
  ids = tok.encode(SPELLED)
  assert ids == fast(SPELLED, add_special_tokens=False)['input_ids']
  assert tok.decode(ids) == fast.decode(ids, skip_special_tokens=True)
  assert tok.decode([tok.vocab_size + 5]) == '\ufffd'
  # the saved header records the special ids and reloads the same tokenizer
  saved = tok.save(tmp_path / 'tx_tokenizer.json')
  header = json.loads(saved.read_text())
  assert header['kind'] == 'hf' and header['special_ids']['eos'] == fast.eos_token_id
  assert header['zero_is_token'] == (name == 'gpt2')
  again = load_tokenizer(saved)
  assert again.encode(PROBES[2]) == tok.encode(PROBES[2]) and again.header() == tok.header()
  assert load_hf_tokenizer(tmp_path).header() == tok.header()  # a folder holding the header


def test_convert_copies_the_tokenizer_and_records_its_ids(converted):
  run = converted('gpt2')
  config = json.loads((run / 'config.json').read_text())['data']
  assert config['tokenizer'] == 'hf'
  assert config['tokenizer_path'] == 'tokenizer/tx_tokenizer.json'  # relative to the run
  assert {p.name for p in (run / 'tokenizer').iterdir()} >= {
      'tokenizer.json', 'tokenizer_config.json', 'tx_tokenizer.json'}
  header = json.loads((run / 'tokenizer' / 'tx_tokenizer.json').read_text())
  assert header['special_ids'] == {'pad': None, 'bos': 300, 'eos': 300, 'unk': 300, 'mask': None,
                                   'cls': None, 'sep': None, 'decoder_start': None}
  # transformers reads the copied folder too
  fast = hf.PreTrainedTokenizerFast.from_pretrained(run / 'tokenizer')
  assert fast('Hi!')['input_ids'] == load_hf_tokenizer(run / 'tokenizer').encode('Hi!')


def test_t5_like_sources_end_with_eos_and_decoding_starts_at_pad(tmp_path):
  """T5: no BOS, the post-processor appends </s>, config.json says decoding starts at 0."""
  from tokenizers import models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  words = ['<pad>', '</s>', '<unk>', 'a', 'dog', 'runs', '.']
  tok = tokenizers.Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)},
                                              unk_token='<unk>'))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.add_special_tokens(['<pad>', '</s>', '<unk>'])
  tok.post_processor = processors.TemplateProcessing(single='$A </s>', special_tokens=[('</s>', 1)])
  tok.save(str(tmp_path / 'tokenizer.json'))
  (tmp_path / 'special_tokens_map.json').write_text(json.dumps(
      {'eos_token': '</s>', 'pad_token': {'content': '<pad>'}, 'unk_token': '<unk>'}))
  (tmp_path / 'config.json').write_text(json.dumps({'decoder_start_token_id': 0}))
  t5 = load_hf_tokenizer(tmp_path / 'tokenizer.json')
  assert (t5.bos_id, t5.eos_id, t5.decoder_start_id) == (-1, 1, 0)
  assert t5.suffix_ids == (1,) and t5.prefix_ids == () and not t5.zero_is_token
  assert source_rows(t5, ['a dog runs .', 'a dog'], 4).tolist() == [[3, 4, 5, 1], [3, 4, 1, 0]]


def test_missing_tokenizer_json_is_a_one_line_error(reference, tmp_path, capsys):
  """A checkpoint without tokenizer.json converts; generate then says what to do."""
  _, path = reference('gpt2')  # saved without a tokenizer
  run = tmp_path / 'run'
  assert cli.main(['convert', '--hf', str(path), '--workdir', str(run),
                   '--set', f'data.data_dir={tmp_path / "tfds"}']) == 0
  assert f'{path} has no tokenizer.json' in capsys.readouterr().out
  assert cli.main(['generate', '--workdir', str(run), '--prompt', 'hi']) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('tx generate: error: model.vocab_size=101') and '\n' not in err
  assert 'put its tokenizer.json in the checkpoint directory' in err


def test_bad_tokenizer_settings_are_one_line_errors(checkpoint, tmp_path, monkeypatch):
  with pytest.raises(ConfigError, match='data.tokenizer_path: data.tokenizer=hf reads'):
    DataConfig(tokenizer='hf')
  with pytest.raises(ConfigError, match="data.tokenizer_path: is read only by data.tokenizer=hf"):
    DataConfig(tokenizer='byte', tokenizer_path='x')
  with pytest.raises(DataError, match='holds no tokenizer.json') as info:
    load_hf_tokenizer(tmp_path)
  assert '\n' not in str(info.value)
  # MLM needs a mask token (GPT-2 has none)
  from tx.data import make_pipeline  # pylint: disable=g-import-not-at-top
  _, _, path = checkpoint('gpt2')
  data = DataConfig(tokenizer='hf', tokenizer_path=str(path), seq_len=4)
  for cfg in (data, data.replace(lm_sampling='packed')):
    with pytest.raises(DataError, match='objective mlm needs a mask token') as info:
      make_pipeline(cfg, 'mlm', 'validation', batch_size=1, seed=0,
                    source=lambda split: [{'text': 'Hello world! ' * 4}])
    assert '\n' not in str(info.value)
  # the saved header pins the tokenizer.json next to it
  saved = load_hf_tokenizer(path).save(tmp_path / 'tx_tokenizer.json')
  (tmp_path / 'tokenizer.json').write_text('{}')
  with pytest.raises(DataError, match='sha256 differs'):
    load_tokenizer(saved)
  # without the interop extra: a one-line error naming the install command
  monkeypatch.setitem(__import__('sys').modules, 'tokenizers', None)
  with pytest.raises(DataError, match=r'pip install -e "\.\[interop\]"'):
    HfTokenizer(b'{}')


@pytest.mark.parametrize('name', ['gpt2', 'llama'])
def test_packed_lm_rows_frame_documents_with_the_checkpoint_ids(checkpoint, name):
  """data.lm_sampling=packed: each document is the checkpoint's BOS + ids + EOS (GPT-2: both
  <|endoftext|>; LLaMA: <s> ... </s>), with segment ids, so id 0 ("!") stays a real token."""
  from tx.data import make_pipeline  # pylint: disable=g-import-not-at-top
  _, fast, path = checkpoint(name)
  data = DataConfig(tokenizer='hf', tokenizer_path=str(path), seq_len=24, lm_sampling='packed')
  docs = ['Hello! world!', 'Wow!! Such tokens', 'The quick brown fox!']
  batches = list(make_pipeline(data, 'causal_lm', 'validation', batch_size=1, seed=0,
                               train=False, source=lambda split: [{'text': t} for t in docs]
                               ).iterator())
  pieces = []
  for b in batches:
    seg = b['segment_ids'][0]
    assert (b['weights'][0] == (seg > 0)).all()
    pieces += [(b['inputs'][0][seg == k].tolist(), b['targets'][0][seg == k].tolist())
               for k in range(1, seg.max() + 1)]
  bos, eos = fast.bos_token_id, fast.eos_token_id
  expected = [fast(t, add_special_tokens=False)['input_ids'] for t in docs]
  assert pieces == [([bos] + ids, ids + [eos]) for ids in expected]
  if name == 'gpt2':
    assert 0 in expected[0]  # "!" is id 0, and a real token here


def test_packed_mlm_rows_are_framed_cls_sep(bert_run):
  from tx.data import make_pipeline  # pylint: disable=g-import-not-at-top
  from tx.train.run_dir import load_run_config  # pylint: disable=g-import-not-at-top
  _, fast, run = bert_run
  data = load_run_config(run).data.replace(lm_sampling='packed', seq_len=32)
  batch = next(make_pipeline(data, 'mlm', 'validation', batch_size=2, seed=0, train=False,
                             source=lambda split: [{'text': t} for t in BERT_TEXTS[:4]]
                             ).iterator())
  for row, seg in zip(batch['targets'], batch['segment_ids']):
    for k in range(1, seg.max() + 1):
      piece = row[seg == k]
      assert piece[0] == fast.cls_token_id and piece[-1] == fast.sep_token_id
  masked = batch['weights'] > 0
  assert masked.any() and not np.isin(batch['targets'][masked], fast.all_special_ids).any()


def test_train_without_an_experiment_fine_tunes_a_converted_run(converted, tmp_path, capsys):
  """`tx train --workdir OUT` continues the converted run with its own config: it resumes
  from the imported step-0 checkpoint, updates the params and keeps the checkpoint's ids."""
  import shutil  # pylint: disable=g-import-not-at-top
  from tx.runs.restore import load_run  # pylint: disable=g-import-not-at-top
  run = tmp_path / 'run'
  shutil.copytree(converted('gpt2'), run)
  _, before, _, _ = load_run(run)
  capsys.readouterr()
  assert cli.main(['train', '--workdir', str(run), '--quiet', '--set', 'train.steps=2',
                   'train.eval_every=2', 'train.checkpoint_every=2', 'train.eval_batches=1',
                   'train.sample_tokens=8', 'optim.warmup_steps=0']) == 0
  out = capsys.readouterr()
  assert 'resuming from checkpoint at step 0' in out.err + out.out
  cfg, after, _, step = load_run(run)
  assert step == 2 and cfg.data.tokenizer == 'hf'
  # the copied directory reads its own tokenizer, and keeps it run-relative
  assert cfg.data.tokenizer_path == str(run.resolve() / 'tokenizer' / 'tx_tokenizer.json')
  assert json.loads((run / 'config.json').read_text())['data']['tokenizer_path'] == (
      'tokenizer/tx_tokenizer.json')
  moved = jax.tree_util.tree_map(lambda a, b: not np.array_equal(a, b), before.params,
                                 after.params)
  assert all(jax.tree_util.tree_leaves(moved))
  # Another experiment's name is still refused for this directory.
  assert cli.main(['train', 'demo', '--workdir', str(run)]) == 2


# --- BERT: MLM batches with the checkpoint's own special ids ---------------------------------

BERT_SPECIALS = ('[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]')
BERT_WORDS = ('the quick brown fox jumps over lazy dog hello world this is a test wow such '
              'tokens much bytes naive cafe and then it ran far away from home to sleep').split()
BERT_TEXTS = ['the quick brown fox jumps over the lazy dog', 'hello world this is a test',
              'wow such tokens much bytes', 'naive cafe and then it ran far away from home',
              'the dog ran to sleep', 'a fox is a dog'] * 2


def bert_tokenizer():
  """BERT's layout: [PAD] [UNK] [CLS] [SEP] [MASK] = 0..4, WordPiece words (+ ##pieces),
  a post-processor framing a text as [CLS] ... [SEP]."""
  from tokenizers import (  # pylint: disable=g-import-not-at-top
      decoders, models, normalizers, pre_tokenizers, processors)
  vocab = {t: i for i, t in enumerate(BERT_SPECIALS)}
  for w in [*BERT_WORDS, '##s', '##ed', '##ing']:
    vocab.setdefault(w, len(vocab))
  tok = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token='[UNK]'))
  tok.normalizer = normalizers.BertNormalizer(lowercase=True)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece()
  tok.add_special_tokens(list(BERT_SPECIALS))
  tok.post_processor = processors.BertProcessing(('[SEP]', 3), ('[CLS]', 2))
  return tok


@pytest.fixture(scope='module')
def bert_run(tmp_path_factory, build_reference):
  """(transformers BertForMaskedLM, its tokenizer, a `tx convert` run with a text dataset)."""
  import torch  # pylint: disable=g-import-not-at-top,redefined-outer-name
  torch.set_num_threads(1)
  tok = bert_tokenizer()
  fast = hf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token='[PAD]', unk_token='[UNK]',
                                    cls_token='[CLS]', sep_token='[SEP]', mask_token='[MASK]')
  model = build_reference('bert', tok.get_vocab_size(), pad_token_id=0)
  tmp = tmp_path_factory.mktemp('bert')
  model.save_pretrained(tmp / 'ckpt')
  fast.save_pretrained(tmp / 'ckpt')
  convert_with_corpus(tmp / 'ckpt', tmp, BERT_TEXTS * 2, BERT_TEXTS[:4], BERT_TEXTS[4:9])
  return model, fast, tmp / 'run'


def test_bert_mlm_batches_use_the_checkpoint_specials(bert_run):
  """Masked positions never hold a special; [MASK] is the checkpoint's; rows are [CLS] ... [SEP]."""
  from tx.data import make_pipeline  # pylint: disable=g-import-not-at-top
  from tx.train.run_dir import load_run_config  # pylint: disable=g-import-not-at-top
  _, fast, run = bert_run
  cfg = load_run_config(run)
  assert cfg.data.tokenizer == 'hf'
  pipe = make_pipeline(cfg.data, 'mlm', 'train', batch_size=64, seed=3)
  specials = set(fast.all_special_ids)
  assert specials == {0, 1, 2, 3, 4} and fast.mask_token_id == 4
  x, y, w = [], [], []
  it = pipe.iterator()
  for _ in range(8):
    b = next(it)
    x.append(b['inputs']), y.append(b['targets']), w.append(b['weights'])
  x, y, w = np.concatenate(x), np.concatenate(y), np.concatenate(w)
  sel = w > 0
  assert (y[:, 0] == 2).all() and (y[:, -1] == 3).all()  # train rows: [CLS] ... [SEP], no pad
  assert not np.isin(y[sel], list(specials)).any()  # specials are never selected
  np.testing.assert_array_equal(x[~sel], y[~sel])  # inputs = targets elsewhere
  assert 0.1 < sel.mean() < 0.2
  assert abs((x[sel] == 4).mean() - 0.8) < 0.08
  replaced = sel & (x != 4) & (x != y)
  assert replaced.any() and not np.isin(x[replaced], list(specials)).any()
  assert (x[replaced] < len(fast)).all()
  # eval rows: the last one's real tokens end with [SEP], then [PAD] = 0 with weight 0
  pipe = make_pipeline(cfg.data, 'mlm', 'validation', batch_size=4, seed=0, train=False)
  rows = np.concatenate([b['targets'] for b in pipe.iterator()])
  real = rows[rows[:, 0] != 0]
  assert (real[:, 0] == 2).all()
  for r in real:
    n = int((r != 0).sum())
    assert r[n - 1] == 3 and (r[:n] != 0).all()
  assert (real == 0).any()  # the last window is padded
  # a pad id other than 0 (tx pads and masks with 0) is a one-line error
  from tx.data.pipeline import hf_mlm_specials  # pylint: disable=g-import-not-at-top
  tok = load_hf_tokenizer(run / 'tokenizer')
  assert hf_mlm_specials(tok)['prefix'] == (2,) and hf_mlm_specials(tok)['suffix'] == (3,)
  tok.set_special_ids({**tok.special_ids, 'pad': None})
  with pytest.raises(DataError, match="pads with id 0.*pad id is None") as info:
    hf_mlm_specials(tok)
  assert '\n' not in str(info.value)


def test_bert_eval_matches_transformers(bert_run, capsys):
  """tx eval's MLM loss on a converted BERT equals transformers' on the same masked batches."""
  from tx.data import make_pipeline  # pylint: disable=g-import-not-at-top
  from tx.train.run_dir import load_run_config  # pylint: disable=g-import-not-at-top
  model, _, run = bert_run
  assert cli.main(['eval', '--workdir', str(run), '--batches', '2']) == 0
  capsys.readouterr()
  result = json.loads((run / 'eval_validation_0.json').read_text())
  assert math.isfinite(result['loss'])
  cfg = load_run_config(run)
  pipe = make_pipeline(cfg.data, 'mlm', 'validation', batch_size=cfg.train.batch_size,
                       seed=cfg.train.seed, train=False)
  nll = weight = 0.0
  it = pipe.iterator()
  for _ in range(2):
    batch = next(it)
    inputs = torch.as_tensor(batch['inputs']).long()
    labels = torch.where(torch.as_tensor(batch['weights']) > 0,
                         torch.as_tensor(batch['targets']).long(), -100)
    with torch.no_grad():
      out = model(input_ids=inputs, attention_mask=(inputs != 0).long(), labels=labels)
    n = float((labels != -100).sum())
    nll += float(out.loss) * n if n else 0.0  # transformers' mean is nan without labels
    weight += n
  assert weight > 0
  assert math.isclose(result['loss'], nll / weight, rel_tol=1e-4)
