"""`tx decode-search`: BLEU per (beam size, length penalty) on a split, and the best."""

import json

import pytest

from tx import cli
from tx.runs import evaluation
from tx.runs.restore import load_run, run_tokenizer


def test_table_best_and_record(family_runs, capsys):
  workdir, _ = family_runs['encoder_decoder']
  args = ['decode-search', '--workdir', str(workdir), '--beam-size', '2', '1',
          '--length-penalty', '1.0', '0.6', '--sentences', '8']
  assert cli.main(args) == 0
  out = capsys.readouterr().out
  record = json.loads((workdir / 'decode_search_validation_30.json').read_text())
  settings = [(r['beam_size'], r['length_penalty']) for r in record['rows']]
  assert settings == [(1, None), (2, 0.6), (2, 1.0)]  # greedy once: no penalty applies
  assert record['sentences'] == 8
  assert record['best'] == max(record['rows'], key=lambda r: r['bleu'])
  assert f'best on validation: --set decode.beam_size={record["best"]["beam_size"]}' in out
  cfg, state, _, _ = load_run(workdir)
  greedy = evaluation.translation_scores(cfg, state.params, 'validation', strategies=('greedy',),
                                         max_sentences=8, tokenizer=run_tokenizer(cfg))
  assert record['rows'][0]['bleu'] == pytest.approx(greedy['bleu'])


@pytest.mark.parametrize('family, args, expected', [
    ('decoder', [], 'scores translations'),
    ('encoder_decoder', ['--beam-size', '0'], '--beam-size: sizes must be >= 1'),
])
def test_bad_requests_are_one_line(family_runs, capsys, family, args, expected):
  workdir, _ = family_runs[family]
  assert cli.main(['decode-search', '--workdir', str(workdir), *args]) == 2
  err = capsys.readouterr().err
  assert expected in err and len(err.strip().splitlines()) == 1, err
