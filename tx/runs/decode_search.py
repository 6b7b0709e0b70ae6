"""`tx decode-search`: BLEU of a translation model over beam sizes x length penalties.

    tx decode-search --workdir runs/mt/average --beam-size 1 4 5 --length-penalty 0.6 1.0
    # beam  penalty   BLEU BLEU lc   chrF     (BLEU lc: 13a-tokenized, lower-cased)
    #    1        -  ...                     (beam 1 = greedy: the penalty does not apply)
    #    4      0.6  ...
    # ...
    # best on validation: --set decode.beam_size=5 decode.length_penalty=1.0

Decoding settings are chosen on the validation split (the default), never on a test set;
the table goes to decode_search_<split>_<step>.json in the run directory.
"""

from __future__ import annotations

from pathlib import Path

import jax

from tx.config.base import ConfigError
from tx.runs import evaluation
from tx.runs.restore import load_run, run_tokenizer
from tx.train import run_dir


def run_decode_search(args) -> int:
  """Scores every (beam size, length penalty) on --split; prints the table and the best."""
  for name, values in (('--beam-size', args.beam_size), ('--length-penalty', args.length_penalty)):
    if not values:
      raise ConfigError(f'{name}: give at least one value')
  if min(args.beam_size) < 1:
    raise ConfigError(f'--beam-size: sizes must be >= 1, got {args.beam_size}')
  cfg, state, _, step = load_run(args.workdir, step=args.step)
  if cfg.task_name != 'seq2seq':
    raise ConfigError(f'tx decode-search scores translations; {args.workdir} holds a '
                      f'{cfg.task_name} model (use tx eval)')
  tokenizer = run_tokenizer(cfg)
  settings = sorted({(b, None if b == 1 else lp) for b in args.beam_size
                     for lp in args.length_penalty}, key=lambda s: (s[0], s[1] or 0))
  rows = []
  print(f'{"beam":>4} {"penalty":>8} {"BLEU":>6} {"BLEU lc":>7} {"chrF":>6}')
  for beam, penalty in settings:
    decode_cfg = cfg.decode.replace(beam_size=beam, length_penalty=penalty or 0.0)
    scores = evaluation.translation_scores(
        cfg, state.params, args.split, strategies=('greedy' if beam == 1 else 'beam',),
        decode_cfg=decode_cfg, batch_size=args.decode_batch, tokenizer=tokenizer,
        max_sentences=args.sentences)
    rows.append({'beam_size': beam, 'length_penalty': penalty, 'bleu': scores['bleu'],
                 'bleu_lc': scores['bleu_lc'], 'chrf': scores['chrf']})
    shown = '-' if penalty is None else f'{penalty:g}'
    print(f'{beam:>4} {shown:>8} {scores["bleu"]:6.2f} {scores["bleu_lc"]:7.2f} '
          f'{scores["chrf"]:6.2f}', flush=True)
  best = max(rows, key=lambda r: r['bleu'])
  flags = f'--set decode.beam_size={best["beam_size"]}' + (
      '' if best['length_penalty'] is None else f' decode.length_penalty={best["length_penalty"]}')
  print(f'best on {args.split}: {flags} (BLEU {best["bleu"]:.2f})')
  print(f'sacreBLEU {scores["bleu_signature"]}')
  if jax.process_index() == 0:
    run_dir.write_json(Path(args.workdir) / f'decode_search_{args.split}_{step}.json',
                       {'split': args.split, 'step': step, 'sentences': scores['sentences'],
                        'rows': rows, 'best': best, 'bleu_signature': scores['bleu_signature']})
  return 0
