"""The `tx` command line (also `python -m tx`).

    tx list
    tx train EXPERIMENT --workdir DIR [--set key=value ...]
    tx eval --workdir DIR [--split NAME] [--step N]
    tx generate --workdir DIR (--prompt TEXT | --input FILE) [--output FILE] [--set decode.*=...]

Errors a user can cause (an unknown experiment or key, a bad value, a missing file, a
workdir holding another run) exit with status 2 and one line naming the cause and the
fix, before anything is compiled or written.
"""

from __future__ import annotations

import argparse
import sys

LATER = {'sweep': 'issue: registry & sweeps', 'compare': 'issue: registry & sweeps',
         'bench': 'issue: performance', 'plan': 'issue: performance'}


class UserError(Exception):
  """Raised for command-line misuse; printed as one line."""


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog='tx', description='tx: Transformers for research in JAX.')
  sub = p.add_subparsers(dest='command', required=True, metavar='COMMAND')

  sub.add_parser('list', help='registered experiments, one line each')

  t = sub.add_parser('train', help='train an experiment into --workdir (resumes if possible)')
  t.add_argument('experiment')
  t.add_argument('--workdir', required=True)
  t.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='dotted overrides, e.g. --set model.d_model=256 train.steps=100')
  t.add_argument('--quiet', action='store_true', help='no progress bar')

  e = sub.add_parser('eval', help='evaluate a checkpoint of --workdir')
  e.add_argument('--workdir', required=True)
  e.add_argument('--split', default='validation', choices=('train', 'validation', 'test'))
  e.add_argument('--step', type=int, default=None, help='checkpoint step (default: latest)')
  e.add_argument('--batches', type=int, default=None, help='at most this many batches')

  g = sub.add_parser('generate', help='continue prompts / translate inputs with a checkpoint')
  g.add_argument('--workdir', required=True)
  src = g.add_mutually_exclusive_group(required=True)
  src.add_argument('--prompt', help='one prompt (LM) or source sentence (seq2seq)')
  src.add_argument('--input', help='a file with one prompt / source sentence per line')
  g.add_argument('--output', help='also write the outputs here, one per line')
  g.add_argument('--step', type=int, default=None)
  g.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='decode.* overrides, e.g. --set decode.strategy=sample decode.top_p=0.9')

  for name, where in LATER.items():
    sub.add_parser(name, help=f'(coming: {where})')
  return p


def cmd_list(args) -> int:
  from tx import registry  # pylint: disable=g-import-not-at-top
  names = registry.names()
  width = max(map(len, names), default=0)
  for name in names:
    print(f'{name:<{width}}  {registry.entry(name).description}')
  return 0


def cmd_train(args) -> int:
  from tx import registry  # pylint: disable=g-import-not-at-top
  from tx.config.base import parse_overrides  # pylint: disable=g-import-not-at-top
  from tx.train.run_dir import check_workdir  # pylint: disable=g-import-not-at-top
  cfg = registry.get(args.experiment, parse_overrides(args.set))
  check_workdir(args.workdir, cfg.name)
  from tx.train.loop import train  # pylint: disable=g-import-not-at-top
  result = train(cfg, args.workdir, quiet=args.quiet)
  s = result.summary
  ev = s.get('eval', {})
  print(f'{cfg.name}: step {s["steps"]}, eval loss {ev.get("loss", float("nan")):.4f}, '
        f'perplexity {ev.get("perplexity", float("nan")):.2f}'
        + (f', bits/byte {ev["bits_per_byte"]:.3f}' if 'bits_per_byte' in ev else '')
        + f', {s["wall_time_s"]:.0f}s wall, {s.get("tokens_per_s") or 0:.0f} tokens/s')
  if cfg.task_name == 'causal_lm' and cfg.train.sample_tokens:
    from tx.decode.cli import sample_after_training  # pylint: disable=g-import-not-at-top
    print('sample:\n' + sample_after_training(result))
  return 0


def cmd_eval(args) -> int:
  from tx.decode.cli import run_eval  # pylint: disable=g-import-not-at-top
  return run_eval(args)


def cmd_generate(args) -> int:
  from tx.decode.cli import run_generate  # pylint: disable=g-import-not-at-top
  return run_generate(args)


def main(argv=None) -> int:
  args = _parser().parse_args(argv)
  if args.command in LATER:
    print(f'tx {args.command}: not available yet ({LATER[args.command]})', file=sys.stderr)
    return 2
  from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
  errors: tuple[type[BaseException], ...] = (ConfigError, UserError, FileNotFoundError)
  try:
    from tx.data.errors import DataError  # pylint: disable=g-import-not-at-top
    from tx.train.errors import CheckpointError  # pylint: disable=g-import-not-at-top
    errors += (DataError, CheckpointError)
  except ImportError:
    pass
  commands = {'list': cmd_list, 'train': cmd_train, 'eval': cmd_eval, 'generate': cmd_generate}
  try:
    return commands[args.command](args)
  except errors as e:
    print(f'tx {args.command}: error: {e}', file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    print(f'tx {args.command}: interrupted', file=sys.stderr)
    return 130


if __name__ == '__main__':
  sys.exit(main())
