"""A converted T5 with its own tokenizer: seq2seq batches, tx eval, tx generate, fine-tuning.

A T5-shaped WordLevel tokenizer (<pad> </s> <unk> = 0 1 2, a post-processor appending </s>,
config.json's decoder_start_token_id 0) is saved beside a 2-layer T5 v1.0 (random, then a few
Adam steps on the corpus so its translations depend on the source); `tx convert`
makes a run on a small parallel corpus. Its rows must be what transformers builds for T5
(source + </s>; decoder inputs = labels shifted right from 0; labels + </s>), `tx eval`'s loss
must equal transformers' on those rows, `tx generate` must print transformers' greedy
translation, and `tx train --workdir` must fine-tune the run.
"""

import json
import math
import shutil

import jax
import numpy as np
import pytest

torch = pytest.importorskip('torch')
hf = pytest.importorskip('transformers')
tokenizers = pytest.importorskip('tokenizers')

from tx import cli  # pylint: disable=g-import-not-at-top

SPECIALS = ('<pad>', '</s>', '<unk>')
WORDS = ('a the dog cat runs sleeps big small red house man woman sees eats fish bird . , '
         'ein der hund katze läuft schläft gross klein rot haus mann frau sieht isst '
         'vogel').split()
PAIRS = [('a dog runs .', 'ein hund läuft .'), ('the cat sleeps .', 'der katze schläft .'),
         ('a big red house .', 'ein gross rot haus .'), ('the man sees a bird .',
                                                         'der mann sieht ein vogel .'),
         ('a woman eats fish .', 'ein frau isst fish .'), ('the small cat , the big dog .',
                                                           'der klein katze , der gross hund .')]
NEW = 10


def t5_tokenizer():
  """T5's special layout over a word vocabulary; `$A </s>` as its post-processor."""
  from tokenizers import models, pre_tokenizers, processors  # pylint: disable=g-import-not-at-top
  vocab = {w: i for i, w in enumerate((*SPECIALS, *WORDS))}
  tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens(list(SPECIALS))
  tok.post_processor = processors.TemplateProcessing(single='$A </s>',
                                                     special_tokens=[('</s>', 1)])
  return tok


def fit(model, fast, steps=40):
  """A few Adam steps on PAIRS, so greedy outputs depend on the source and end with </s>."""
  enc = fast([p[0] for p in PAIRS], padding=True, return_tensors='pt')
  labels = fast([p[1] for p in PAIRS], padding=True, return_tensors='pt')['input_ids']
  labels[labels == 0] = -100
  opt = torch.optim.Adam(model.parameters(), lr=1e-2)
  model.train()
  for _ in range(steps):
    opt.zero_grad()
    model(**enc, labels=labels).loss.backward()
    opt.step()
  model.eval()


@pytest.fixture(scope='module')
def t5_run(tmp_path_factory, build_reference):
  """(transformers T5, its tokenizer, a `tx convert` run on a parallel corpus)."""
  torch.set_num_threads(1)
  tok = t5_tokenizer()
  fast = hf.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token='<pad>', eos_token='</s>',
                                    unk_token='<unk>')
  model = build_reference('t5_relu', tok.get_vocab_size(), pad_token_id=0, eos_token_id=1,
                          decoder_start_token_id=0)  # as real T5 configs say
  fit(model, fast)
  tmp = tmp_path_factory.mktemp('t5')
  model.save_pretrained(tmp / 'ckpt')
  fast.save_pretrained(tmp / 'ckpt')
  files = {}
  for split, pairs in (('train', PAIRS * 4), ('valid', PAIRS[3:] + PAIRS[:2])):
    for side, k in (('src', 0), ('tgt', 1)):
      files[split, side] = tmp / f'{split}.{side}'
      files[split, side].write_text(''.join(p[k] + '\n' for p in pairs))
  sets = [f'data.data_dir={tmp / "tfds"}', 'data.dataset=parallel',
          f'data.source_files=({str(files["train", "src"])!r}, {str(files["valid", "src"])!r})',
          f'data.target_files=({str(files["train", "tgt"])!r}, {str(files["valid", "tgt"])!r})',
          'data.seq_len=12', 'data.target_len=10', 'train.batch_size=4']
  assert cli.main(['convert', '--hf', str(tmp / 'ckpt'), '--workdir', str(tmp / 'run'),
                   '--set', *sets]) == 0
  return model, fast, tmp / 'run'


def validation_batches(run, n):
  from tx.data import make_pipeline  # pylint: disable=g-import-not-at-top
  from tx.train.run_dir import load_run_config  # pylint: disable=g-import-not-at-top
  cfg = load_run_config(run)
  pipe = make_pipeline(cfg.data, 'seq2seq', 'validation', batch_size=cfg.train.batch_size,
                       seed=cfg.train.seed, train=False)
  it = pipe.iterator()
  return [next(it) for _ in range(n)]


def test_rows_are_built_as_transformers_builds_them(t5_run):
  """src = ids + </s>; tgt_inputs = labels shifted right from the decoder start 0."""
  model, fast, run = t5_run
  batch = validation_batches(run, 1)[0]
  for i, (source, target) in enumerate((PAIRS[3:] + PAIRS[:2])[:4]):
    src, labels = fast(source)['input_ids'], fast(target)['input_ids']
    assert src[-1] == 1 and labels[-1] == 1
    np.testing.assert_array_equal(batch['src'][i, :len(src)], src)
    assert (batch['src'][i, len(src):] == 0).all()
    np.testing.assert_array_equal(batch['targets'][i, :len(labels)], labels)
    assert batch['weights'][i].sum() == len(labels)
    shifted = model._shift_right(  # pylint: disable=protected-access
        torch.tensor([labels]))[0].tolist()
    np.testing.assert_array_equal(batch['tgt_inputs'][i, :len(labels)], shifted)
    # the start token is id 0, tx's padding id: segment ids say it is real
    assert batch['tgt_inputs'][i, 0] == 0 and batch['tgt_segment_ids'][i, 0] == 1
    assert (batch['tgt_segment_ids'][i, :len(labels)] == 1).all()
    assert (batch['src_segment_ids'][i] == (np.arange(12) < len(src))).all()


def test_eval_matches_transformers_and_scores_translations(t5_run, capsys):
  model, _, run = t5_run
  assert cli.main(['eval', '--workdir', str(run), '--batches', '1', '--bleu-batches', '1']) == 0
  out = capsys.readouterr().out
  result = json.loads((run / 'eval_validation_0.json').read_text())
  assert 'BLEU' in out
  assert result['bleu_greedy'] > 20, result  # the model was fit to these pairs
  batch = validation_batches(run, 1)[0]
  labels = torch.where(torch.as_tensor(batch['weights']) > 0,
                       torch.as_tensor(batch['targets']).long(), -100)
  with torch.no_grad():
    ref = model(input_ids=torch.as_tensor(batch['src']).long(),
                attention_mask=torch.as_tensor(batch['src_segment_ids'] > 0).long(),
                labels=labels)
  assert math.isclose(result['loss'], float(ref.loss), rel_tol=1e-4)


def test_generate_matches_transformers(t5_run, capsys):
  model, fast, run = t5_run
  sources = ['a dog runs .', 'the big red cat sleeps .', 'a bird']
  expected = []
  for s in sources:
    ids = fast(s)['input_ids']
    with torch.no_grad():  # tx never generates its padding id 0
      out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=NEW, do_sample=False,
                           suppress_tokens=[0])
    expected.append(fast.decode(out[0], skip_special_tokens=True))
  capsys.readouterr()
  for s, want in zip(sources, expected):
    assert cli.main(['generate', '--workdir', str(run), '--prompt', s, '--set',
                     f'decode.max_len={NEW}']) == 0
    assert capsys.readouterr().out == want + '\n'


def test_train_fine_tunes_the_converted_t5(t5_run, tmp_path, capsys):
  from tx.runs.restore import load_run  # pylint: disable=g-import-not-at-top
  run = tmp_path / 'run'
  shutil.copytree(t5_run[2], run)
  _, before, _, _ = load_run(run)
  assert cli.main(['train', '--workdir', str(run), '--quiet', '--set', 'train.steps=2',
                   'train.eval_every=2', 'train.checkpoint_every=2', 'train.eval_batches=1',
                   'train.sample_tokens=4', 'optim.warmup_steps=0']) == 0
  capsys.readouterr()
  cfg, after, _, step = load_run(run)
  assert step == 2 and cfg.data.tokenizer == 'hf'
  moved = jax.tree_util.tree_map(lambda a, b: not np.array_equal(a, b), before.params,
                                 after.params)
  assert all(jax.tree_util.tree_leaves(moved))
