"""BLEU / chrF wiring, translation over static batches, and the length-extrapolation table."""

import math

import jax
import pytest

from tx.config import DataConfig
from tx.config.base import ConfigError
from tx.config.experiment import ExperimentConfig
from tx.config.train import DecodeConfig, MeshConfig, TrainConfig
from tx.data.tokenizers import CharTokenizer
from tx.runs import evaluation
from tx.runs.commands import parse_factors
from tx.train.mesh import make_mesh

CHARS = 'abcdefghijklmnopqrstuvwxyz '  # + 5 specials = the tiny models' vocabulary of 32
REFS = ['a dog runs in the park .', 'two men are playing chess outside .',
        'the little girl is eating an apple .']


def test_bleu_of_perfect_output_is_100_and_of_garbage_about_0():
  perfect = evaluation.corpus_scores(REFS, REFS)
  assert perfect['bleu'] == pytest.approx(100.0)
  assert perfect['chrf'] == pytest.approx(100.0)
  assert 'tok:13a' in perfect['bleu_signature'] and 'nrefs:1' in perfect['bleu_signature']
  garbage = evaluation.corpus_scores(['zq xv', 'wk jj pp', 'ffff'], REFS)
  assert garbage['bleu'] < 1.0 and garbage['chrf'] < 10.0
  with pytest.raises(ValueError, match='hypotheses'):
    evaluation.corpus_scores(REFS[:2], REFS)


def test_lower_cased_bleu_ignores_case_only():
  shouted = [r.upper() for r in REFS]
  scores = evaluation.corpus_scores(shouted, REFS)
  assert scores['bleu_lc'] == pytest.approx(100.0) and scores['bleu'] < 20.0
  assert 'case:lc' in scores['bleu_lc_signature'] and 'tok:13a' in scores['bleu_lc_signature']
  assert 'case:mixed' in scores['bleu_signature']


def test_translation_scores_over_padded_batches(dm):
  """3 sentences in batches of 2 (the last one filled); beam size 1 without a length
  penalty must give exactly the greedy translations."""
  pairs = [{'source': s[::-1], 'target': s} for s in REFS]
  cfg = ExperimentConfig(
      model=dm.tiny('encoder_decoder'),
      data=DataConfig(dataset='parallel', seq_len=8, target_len=8),
      train=TrainConfig(batch_size=2),
      decode=DecodeConfig(beam_size=1, length_penalty=0.0, max_len=5))
  out = evaluation.translation_scores(cfg, dm.params(cfg.model), 'test', source=lambda s: pairs,
                                      tokenizer=CharTokenizer(CHARS))
  assert out['sentences'] == 3
  assert [e['reference'] for e in out['examples_beam']] == REFS
  assert ([e['output'] for e in out['examples_beam']] ==
          [e['output'] for e in out['examples_greedy']])
  assert out['bleu_beam'] == out['bleu_greedy'] == out['bleu']
  assert 0.0 <= out['chrf'] <= 100.0


def test_extrapolation_reports_each_length_with_finite_perplexity(dm):
  text = ' '.join(REFS * 8)
  cfg = ExperimentConfig(
      model=dm.tiny('decoder', position='learned', max_len=8),
      data=DataConfig(dataset='text', tokenizer='char', seq_len=8),
      train=TrainConfig(batch_size=4))
  out = evaluation.extrapolation(cfg, dm.params(cfg.model), 'validation',
                                 make_mesh(MeshConfig(data=1), devices=jax.devices()[:1]),
                                 source=lambda split: [{'text': text}],
                                 tokenizer=CharTokenizer(CHARS), max_batches=2)
  assert list(out['extrapolation']) == [8, 16, 32]
  assert all(math.isfinite(p) and p > 1.0 for p in out['extrapolation'].values())
  assert 'clips' in out['extrapolation_note']  # learned positions past model.max_len


def test_parse_factors():
  assert parse_factors('1,2,4') == (1, 2, 4)
  assert parse_factors('none') == ()
  with pytest.raises(ConfigError, match='--extrapolation'):
    parse_factors('1,x')


def test_clipping_note_only_for_learned_positions_past_max_len(dm):
  cfg = ExperimentConfig(model=dm.tiny('decoder', position='learned', max_len=16),
                         data=DataConfig(seq_len=8))
  assert evaluation.clipping_note(cfg, [8, 16]) is None
  assert '16' in evaluation.clipping_note(cfg, [8, 16, 32])
  rope = ExperimentConfig(model=dm.tiny('decoder', position='rope'), data=DataConfig(seq_len=8))
  assert evaluation.clipping_note(rope, [8, 32]) is None
