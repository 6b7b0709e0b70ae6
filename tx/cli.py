"""The `tx` command line (also `python -m tx`).

    tx list
    tx train EXPERIMENT --workdir DIR [--set key=value ...]
    tx train --workdir DIR [--set ...]     continue DIR's run with its own config.json
    tx eval --workdir DIR [--split NAME] [--step N] [--extrapolation 1,2,4] [--bleu-batches N]
    tx generate --workdir DIR (--prompt TEXT | --input FILE) [--output FILE] [--set decode.*=...]
    tx average --workdir DIR (--last N | --steps S ...) [--out DIR]      -> DIR/average
    tx decode-search --workdir DIR [--beam-size K ...] [--length-penalty A ...] [--split NAME]
    tx sweep SWEEP --workdir DIR [--seeds N] [--only PATTERN] [--dry-run | --commands] [--set ...]
    tx sweep SWEEP --workdir DIR --slurm [--partition P] [--gpus-per-run N] [--time T] ...
    tx compare DIR... [--metric NAME] [--baseline VARIANT] [--out DIR] [--x KEY] [--curves KEY ...]
    tx convert --hf DIR --workdir OUT [--experiment NAME] [--set key=value ...]
    tx bench [--only PATTERN ...] [--quick] [--no-peers] [--threads N] [--json FILE]
             [--ablate-attention] [--rounds N] [--order alternate|tx-first]
             [--platform cpu|gpu] [--peer-compile] [--tune] [--profile]
    tx tune EXPERIMENT [--set ...] [--candidates NAME ...] [--rounds N] [--force]
    tx profile EXPERIMENT [--set ...] [--calls N] [--top N] [--no-tune] [--json FILE]
    tx plan EXPERIMENT --mesh data=D,fsdp=F,tensor=T [--set ...] [--device-memory 80GB] [--json FILE]
    tx mup-check EXPERIMENT [--widths 64,128,256,512] [--steps 10] [--set ...] [--out DIR]

Errors a user can cause (an unknown experiment or key, a bad value, a missing file, a
workdir holding another run) exit with status 2 and one line naming the cause and the
fix, before anything is compiled or written. A non-finite loss exits with status 1
(train.nan_policy=stop), and so does a full disk (one line; the latest complete checkpoint
is kept, and the same command resumes once there is space). SIGTERM / SIGINT during `tx train` or `tx sweep` save a checkpoint at
the end of the step in flight and exit with 128 + the signal number (143 / 130) and a line
saying how to resume; a second such signal stops at once.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tx import compat
from tx.errors import UserError  # noqa: F401  (also tx.cli.UserError, as before)
from tx.errors import DiskFullError, is_disk_full
from tx.runs import distributed

# Each command imports what it needs when it runs (the imports inside the cmd_* functions):
# `tx --help`, `tx list` and a usage error stay fast and never import JAX.


class _Parser(argparse.ArgumentParser):
  """argparse, but a usage error is one line (no usage block), like every other tx error."""

  def error(self, message):
    self.exit(2, f'{self.prog}: error: {message} (see `{self.prog} --help`)\n')


def _parser() -> argparse.ArgumentParser:
  p = _Parser(prog='tx', description='tx: Transformers for research in JAX.')
  sub = p.add_subparsers(dest='command', required=True, metavar='COMMAND')

  _add_experiments_flag(sub.add_parser('list', help='registered experiments and sweeps, one '
                                                    'line each'))

  t = sub.add_parser('train', help='train an experiment into --workdir (resumes if possible)')
  t.add_argument('experiment', nargs='?', default=None,
                 help="registered experiment, or a run's resolved config.json; omitted: "
                      "continue the run in --workdir with its own config.json (fine-tune a "
                      "`tx convert`ed checkpoint)")
  _add_experiments_flag(t)
  distributed.add_flags(t)
  t.add_argument('--workdir', required=True)
  t.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='dotted overrides, e.g. --set model.d_model=256 train.steps=100')
  t.add_argument('--quiet', action='store_true', help='no progress bar')
  _add_tune_flags(t)

  e = sub.add_parser('eval', help='evaluate a checkpoint of --workdir')
  e.add_argument('--workdir', required=True)
  e.add_argument('--split', default='validation', choices=('train', 'validation', 'test'))
  e.add_argument('--step', type=int, default=None, help='checkpoint step (default: latest)')
  e.add_argument('--batches', type=int, default=None, help='at most this many batches')
  e.add_argument('--extrapolation', default='1,2,4', metavar='K,K,...',
                 help='LMs: perplexity at these multiples of data.seq_len (none: skip)')
  e.add_argument('--bleu-batches', type=int, default=None, metavar='N',
                 help='seq2seq: BLEU/chrF on the first N decode batches (0: skip; default all)')
  e.add_argument('--decode-batch', type=int, default=None, metavar='N',
                 help='seq2seq: sentences per decoding call (default train.batch_size)')
  e.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='decode.* overrides for BLEU, e.g. --set decode.beam_size=5')
  distributed.add_flags(e)

  g = sub.add_parser('generate', help='continue prompts / translate inputs with a checkpoint')
  g.add_argument('--workdir', required=True)
  src = g.add_mutually_exclusive_group(required=True)
  src.add_argument('--prompt', help='one prompt (LM) or source sentence (seq2seq)')
  src.add_argument('--input', help='a file with one prompt / source sentence per line')
  g.add_argument('--output', help='also write the outputs here, one per line')
  g.add_argument('--step', type=int, default=None)
  g.add_argument('--batch-size', type=int, default=32, help='texts per decoding call')
  g.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='decode.* overrides, e.g. --set decode.strategy=sample decode.top_p=0.9')

  _sweep_parsers(sub)
  v = sub.add_parser('convert', help='import a Hugging Face checkpoint into a tx run directory')
  v.add_argument('--hf', required=True, metavar='DIR',
                 help='local checkpoint directory: config.json + model.safetensors (or .bin)')
  v.add_argument('--workdir', required=True, help='the run directory to create')
  v.add_argument('--experiment', default=None,
                 help='registered experiment giving data/optim/train/decode settings and the '
                      'run name (default: tx defaults, name hf_<DIR name>)')
  v.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='overrides (data.*, optim.*, train.*, decode.*, model.dropout, ...)')
  _add_experiments_flag(v)
  _average_parser(sub)
  _decode_search_parser(sub)
  _bench_parser(sub)
  _plan_parser(sub)
  _mup_check_parser(sub)
  return p


def _add_experiments_flag(parser) -> None:
  parser.add_argument('--experiments', action='append', default=[], metavar='PATH_OR_MODULE',
                      help='also register the experiments and sweeps of this .py file or '
                           'importable module (repeatable; $TX_EXPERIMENTS too)')


def _add_tune_flags(parser, where: str = '') -> None:
  tuning = parser.add_mutually_exclusive_group()
  tuning.add_argument('--tune', action='store_true',
                      help=f'run `tx tune` first when this host has no cached choice for the '
                           f'step{where}, or one measured before some of its candidates')
  tuning.add_argument('--no-tune', action='store_true',
                      help="XLA's default settings even when `tx tune` cached a choice "
                           '(also: TX_TUNE=0)')


def resolve_experiment(name: str, overrides: dict | None = None):
  """A registered experiment by name, or a resolved config.json (a run's, or a colleague's)
  by path, with `overrides` applied -> ExperimentConfig."""
  from tx import registry  # pylint: disable=g-import-not-at-top
  if not name.endswith('.json'):
    return registry.get(name, overrides)
  from tx.config.base import override  # pylint: disable=g-import-not-at-top
  from tx.train.run_dir import load_config_file  # pylint: disable=g-import-not-at-top
  cfg = load_config_file(name)
  return override(cfg, overrides) if overrides else cfg


def _mup_check_parser(sub) -> None:
  m = sub.add_parser('mup-check', help="μP coordinate check: activation RMS against width over "
                                       "a few training steps, mup vs standard")
  m.add_argument('experiment')
  _add_experiments_flag(m)
  m.add_argument('--widths', default='64,128,256,512', metavar='W,W,...',
                 help='d_model values (d_ff scales with them, heads fixed)')
  m.add_argument('--steps', type=int, default=10, help='training steps per width')
  m.add_argument('--parametrization', default='both', choices=('both', 'mup', 'standard'))
  m.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='overrides, e.g. --set optim.learning_rate=1e-2 model.mup_base_width=64')
  m.add_argument('--out', default=None, metavar='DIR',
                 help='where coord_check.png/.json go (default runs/mup_check/EXPERIMENT)')


def _average_parser(sub) -> None:
  a = sub.add_parser('average', help="average the parameters of a run's last checkpoints into "
                                     'a run directory of their own')
  a.add_argument('--workdir', required=True, help='the run whose checkpoints are averaged')
  which = a.add_mutually_exclusive_group(required=True)
  which.add_argument('--last', type=int, metavar='N',
                     help="the latest N checkpoints on the run's train.checkpoint_every cadence")
  which.add_argument('--steps', type=int, nargs='+', metavar='STEP', help='these steps')
  a.add_argument('--out', default=None,
                 help='the run directory to write (default: WORKDIR/average)')


def _decode_search_parser(sub) -> None:
  d = sub.add_parser('decode-search', help='seq2seq: BLEU over beam sizes x length penalties '
                                           'on the validation split, to choose decode.*')
  d.add_argument('--workdir', required=True)
  d.add_argument('--beam-size', type=int, nargs='+', default=[1, 4, 5], metavar='K',
                 help='beam sizes (1 = greedy; default 1 4 5)')
  d.add_argument('--length-penalty', type=float, nargs='+', default=[0.6, 1.0], metavar='A',
                 help='GNMT length penalties alpha (default 0.6 1.0)')
  d.add_argument('--split', default='validation', choices=('train', 'validation', 'test'))
  d.add_argument('--step', type=int, default=None, help='checkpoint step (default: latest)')
  d.add_argument('--sentences', type=int, default=None, metavar='N',
                 help='only the first N sentences of the split (default all)')
  d.add_argument('--decode-batch', type=int, default=None, metavar='N',
                 help='sentences per decoding call (default train.batch_size)')


def _step_parser(sub, name: str, about: str):
  """A subcommand that works on one experiment's training step: EXPERIMENT, --experiments,
  --set."""
  p = sub.add_parser(name, help=about)
  p.add_argument('experiment', help='registered experiment or a resolved config.json')
  _add_experiments_flag(p)
  p.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='dotted overrides, as for tx train')
  return p


def _bench_parser(sub) -> None:
  u = _step_parser(sub, 'tune', "time XLA:CPU settings on an experiment's training step, "
                                'cache the fastest for this host (tx train uses it)')
  u.add_argument('--candidates', nargs='+', metavar='NAME',
                 help='a subset of the candidate settings (default: all; see tx/runs/tune.py)')
  u.add_argument('--steps', type=int, default=5, help='timed steps per candidate and round')
  u.add_argument('--warmup', type=int, default=2,
                 help='untimed steps per candidate and round (at least one call)')
  u.add_argument('--rounds', type=int, default=2, help='rounds, in rotating order (median)')
  u.add_argument('--margin', type=float, default=0.03,
                 help='how much faster than the defaults a setting must be to be chosen')
  u.add_argument('--force', action='store_true',
                 help="measure again even if cached (with --candidates: those, keeping the "
                      "entry's record of the rest)")

  r = _step_parser(sub, 'profile', "where an experiment's training step spends its time on "
                                   'this host: ms per step by category, costliest ops')
  r.add_argument('--calls', type=int, default=5, help='profiled compiled calls (after as many '
                                                      'timed without the profiler)')
  r.add_argument('--top', type=int, default=4, help='costliest ops listed per category')
  r.add_argument('--threads', type=int, default=None,
                 help='CPU threads of the measurement (default: the CPUs this process may use)')
  r.add_argument('--no-tune', action='store_true',
                 help="ignore `tx tune`'s cached choice for this step (also: TX_TUNE=0)")
  r.add_argument('--json', default=None, metavar='FILE', help='also write the profile here')

  b = sub.add_parser('bench', help='throughput, MFU, compile time and memory vs PyTorch peers')
  b.add_argument('--only', nargs='+', action='extend', default=None, metavar='PATTERN',
                 help='only cases whose name contains a pattern (or matches a glob)')
  b.add_argument('--quick', action='store_true', help='toy sizes: checks the machinery in ~2 min')
  b.add_argument('--no-peers', action='store_true', help='tx only (no torch needed)')
  b.add_argument('--threads', type=int, default=None,
                 help='CPU threads of every measurement (default: 2, or the CPUs this '
                      'process may use where fewer)')
  b.add_argument('--platform', choices=('cpu', 'gpu'), default='cpu',
                 help="where tx and the peers run: 'gpu' measures the GPU suite on the first "
                      'CUDA device')
  b.add_argument('--peer-compile', action='store_true',
                 help="the training peers' forward and loss through torch.compile (the peer at "
                      'its fastest; compiled in its first warmup step)')
  b.add_argument('--json', default=None, metavar='FILE',
                 help='where the results go (default: a new runs/bench/bench-<time>.json)')
  b.add_argument('--quiet', action='store_true', help='no progress lines')
  b.add_argument('--ablate-attention', action='store_true',
                 help='also train each decoder / encoder case with its attention replaced by '
                      'out = v on both sides: what attention costs in each step')
  b.add_argument('--tune', action='store_true',
                 help="tx's side of each training case takes `tx tune`'s choice for its step "
                      'on this host (cached; measured first where none is, and new '
                      'candidates timed against an older choice)')
  b.add_argument('--rounds', type=int, default=1,
                 help='measure each training / decoding case N times, tx and the peer in '
                      'turn: medians, and the spread of the paired ratios')
  b.add_argument('--order', choices=('alternate', 'tx-first'), default='alternate',
                 help='which side runs first in each round: alternate (tx, peer, peer, tx, '
                      '...; the report splits the ratio by it) or tx-first in every round')
  b.add_argument('--profile', action='store_true',
                 help="instead of the measurements: each training case's step profiled, tx's "
                      "and the peer's, in ms per step by category (GEMMs, attention, norms, "
                      'optimizer, the rest) with the costliest ops')


def _plan_parser(sub) -> None:
  q = sub.add_parser('plan', help='per-device memory, FLOPs and compile time of a config on a '
                                  'simulated mesh, compiled ahead of time (nothing allocated)')
  q.add_argument('experiment')
  _add_experiments_flag(q)
  distributed.add_flags(q)
  q.add_argument('--mesh', required=True, metavar='data=D,fsdp=F,tensor=T',
                 help='mesh sizes (replace mesh.*; a missing axis is 1), e.g. fsdp=8,tensor=2')
  q.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='dotted overrides, e.g. --set train.batch_size=128 model.remat=full')
  q.add_argument('--device-memory', default=None, metavar='SIZE',
                 help='memory per device to check against, e.g. 80GB (powers of 1024)')
  q.add_argument('--json', default=None, metavar='FILE', help='also write the plan here')


def _sweep_parsers(sub) -> None:
  s = sub.add_parser('sweep', help='run every variant x seed of a registered sweep')
  s.add_argument('sweep')
  _add_experiments_flag(s)
  distributed.add_flags(s)
  s.add_argument('--workdir', required=True, help='runs go to DIR/<variant>/seed_<k>')
  s.add_argument('--seeds', type=int, default=None, help="replaces the sweep's seed count")
  s.add_argument('--only', nargs='+', action='extend', default=None, metavar='PATTERN',
                 help='only variants whose name matches a glob or contains the text')
  how = s.add_mutually_exclusive_group()
  how.add_argument('--dry-run', action='store_true', help='print the plan; write nothing')
  how.add_argument('--commands', action='store_true',
                   help='print one `tx train` line per run (for schedulers); write nothing')
  how.add_argument('--slurm', action='store_true',
                   help='write an sbatch array script (one run per task) instead of running')
  s.add_argument('--set', nargs='+', action='extend', default=[], metavar='KEY=VALUE',
                 help='overrides for every run, e.g. --set train.steps=50')
  _add_tune_flags(s, ' (the first run\'s step: XLA settings are fixed for the whole process)')
  slurm = s.add_argument_group('--slurm options (tx/sweep/slurm.py)')
  slurm.add_argument('--partition', default=None, help='#SBATCH --partition')
  slurm.add_argument('--gpus-per-run', type=int, default=None, metavar='N',
                     help='GPUs per array task (#SBATCH --gres=gpu:N)')
  slurm.add_argument('--cpus-per-run', type=int, default=None, metavar='N',
                     help='#SBATCH --cpus-per-task')
  slurm.add_argument('--time', default=None, metavar='T',
                     help='time limit per run: minutes, H:MM:SS or D-HH:MM:SS')
  slurm.add_argument('--max-parallel', type=int, default=None, metavar='K',
                     help='at most K runs at once (#SBATCH --array=0-N%%K)')
  slurm.add_argument('--script', default=None, metavar='PATH',
                     help='where the script goes (default DIR/sweep.sbatch)')

  c = sub.add_parser('compare', help='table, CSV and plots of runs / sweeps, with error bars')
  c.add_argument('dirs', nargs='+', metavar='DIR', help='sweep dirs, run dirs or their parents')
  c.add_argument('--metric', default='eval.loss',
                 help='summary metric, e.g. eval.bits_per_byte, eval.extrapolation.256')
  c.add_argument('--baseline', default=None, help='variant the others are compared with')
  c.add_argument('--out', default=None, help='where compare.md/.csv and plots go')
  c.add_argument('--x', default=None, metavar='KEY',
                 help='plot the metric against this swept numeric config key, e.g. '
                      'optim.learning_rate: one curve per value of the other keys, best x, '
                      'LR sensitivity and basin width per curve (lr_curves.md/.csv)')
  c.add_argument('--curves', nargs='+', action='extend', default=None, metavar='KEY',
                 help='also plot these metrics.jsonl columns against step, e.g. loss '
                      'grad_norm diag/attn_logit_max (curve_<KEY>.png each)')


def cmd_list(args) -> int:
  from tx import registry  # pylint: disable=g-import-not-at-top
  names = registry.names()
  sweeps = registry.sweep_names()
  width = max(map(len, names + sweeps), default=0)
  for name in names:
    print(f'{name:<{width}}  {registry.entry(name).description}')
  for name in sweeps:
    s = registry.get_sweep(name)
    print(f'{name:<{width}}  [sweep: {s.base}, {len(s.axes)} variants x {len(s.seeds)} seeds] '
          f'{s.description}')
  return 0


def cmd_sweep(args) -> int:
  from tx import registry  # pylint: disable=g-import-not-at-top
  from tx.sweep import slurm  # pylint: disable=g-import-not-at-top
  from tx.sweep.runner import cli  # pylint: disable=g-import-not-at-top
  if args.slurm:
    return slurm.cli(args, registry.get_sweep(args.sweep), registry.get)
  slurm.refuse_without_slurm(args)
  distributed.check_same_config(_command_line(args), args.coordinator_timeout)
  return cli(args, registry.get_sweep(args.sweep), registry.get)


def cmd_compare(args) -> int:
  from tx.compare.cli import cli  # pylint: disable=g-import-not-at-top
  return cli(args)


def cmd_train(args) -> int:
  from tx.config.base import parse_overrides  # pylint: disable=g-import-not-at-top
  from tx.train.run_dir import check_workdir  # pylint: disable=g-import-not-at-top
  if args.experiment is None:
    from tx.config.base import override  # pylint: disable=g-import-not-at-top
    from tx.train.run_dir import load_run_config  # pylint: disable=g-import-not-at-top
    overrides = parse_overrides(args.set)
    if not (Path(args.workdir) / 'config.json').is_file():
      raise UserError(f'no experiment named and {args.workdir} holds no run (config.json); '
                      'name one (see `tx list`) or point --workdir at a run directory')
    cfg = load_run_config(args.workdir)
    cfg = override(cfg, overrides) if overrides else cfg
  else:
    cfg = resolve_experiment(args.experiment, parse_overrides(args.set))
  from tx.runs import tune  # pylint: disable=g-import-not-at-top
  entry = None if args.no_tune else tune.apply(cfg, tune_if_missing=args.tune)
  from tx.config.base import to_dict  # pylint: disable=g-import-not-at-top
  distributed.check_same_config(to_dict(cfg), args.coordinator_timeout)
  # Hosts of one job may have cached different choices; every process compiles process 0's,
  # with XLA's kernels for torch's where any process lacks PyTorch.
  mine = {k: (entry or {}).get(k) or {} for k in ('choice', 'model_overrides', 'train_overrides')}
  every = distributed.every_process_value('tx/tune', dict(mine, torch=tune.has_torch()),
                                          args.coordinator_timeout)
  say = print if distributed.is_main_process() else (lambda _: None)
  cfg = tune.with_choice(cfg, every[0], say=say,
                         torch_everywhere=all(value['torch'] for value in every))
  check_workdir(args.workdir, cfg.name)
  from tx.runs.training import train_run  # pylint: disable=g-import-not-at-top
  result = train_run(cfg, args.workdir, quiet=args.quiet)
  s = result.summary
  ev = s.get('eval', {})
  print(f'{cfg.name}: step {s["steps"]}, eval loss {ev.get("loss", float("nan")):.4f}, '
        f'perplexity {ev.get("perplexity", float("nan")):.2f}'
        + (f', bits/byte {ev["bits_per_byte"]:.3f}' if 'bits_per_byte' in ev else '')
        + f', {s["wall_time_s"]:.0f}s wall, {s.get("tokens_per_s") or 0:.0f} tokens/s')
  if cfg.task_name == 'causal_lm' and cfg.train.sample_tokens:
    from tx.runs.commands import sample_after_training  # pylint: disable=g-import-not-at-top
    print('sample:\n' + sample_after_training(result))
  return 0


def cmd_eval(args) -> int:
  from tx.runs.commands import run_eval  # pylint: disable=g-import-not-at-top
  distributed.check_same_config(_command_line(args), args.coordinator_timeout)
  return run_eval(args)


def cmd_generate(args) -> int:
  from tx.runs.commands import run_generate  # pylint: disable=g-import-not-at-top
  return run_generate(args)


def cmd_average(args) -> int:
  from tx.runs.average import run_average  # pylint: disable=g-import-not-at-top
  return run_average(args)


def cmd_decode_search(args) -> int:
  from tx.runs.decode_search import run_decode_search  # pylint: disable=g-import-not-at-top
  return run_decode_search(args)


def cmd_tune(args) -> int:
  from tx.runs.tune import cli  # pylint: disable=g-import-not-at-top
  return cli(args, resolve_experiment)


def cmd_profile(args) -> int:
  from tx.runs.profile_cli import cli  # pylint: disable=g-import-not-at-top
  return cli(args, resolve_experiment)


def cmd_bench(args) -> int:
  from tx.bench.suite import cli  # pylint: disable=g-import-not-at-top
  return cli(args)


def cmd_plan(args) -> int:
  from tx.runs.plan_cli import cli  # pylint: disable=g-import-not-at-top
  return cli(args, resolve_experiment)


def cmd_mup_check(args) -> int:
  from tx.runs.mup_check import cli  # pylint: disable=g-import-not-at-top
  return cli(args, resolve_experiment)


def cmd_convert(args) -> int:
  from tx.interop.convert import cli  # pylint: disable=g-import-not-at-top
  return cli(args)


def _parse(argv):
  """Parsed arguments; an unknown flag is reported by its command's parser (`tx train --help`)."""
  parser = _parser()
  args, extra = parser.parse_known_args(argv)
  if extra:
    compat.subcommand_parser(parser, args.command).error(
        f'unrecognized arguments: {" ".join(extra)}')
  return args


def main(argv=None) -> int:
  if argv is None:  # a real command line, not a test calling main([...])
    from tx.malloc_tuning import reexec_tuned  # pylint: disable=g-import-not-at-top
    reexec_tuned()
  args = _parse(argv)
  from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
  errors: tuple[type[BaseException], ...] = (ConfigError, UserError, FileNotFoundError)
  from tx.data.errors import DataError  # pylint: disable=g-import-not-at-top
  from tx.train.errors import CheckpointError, NonFiniteError  # pylint: disable=g-import-not-at-top
  errors += (DataError, CheckpointError)
  commands = {'list': cmd_list, 'train': cmd_train, 'eval': cmd_eval, 'generate': cmd_generate,
              'sweep': cmd_sweep, 'compare': cmd_compare, 'convert': cmd_convert,
              'average': cmd_average, 'decode-search': cmd_decode_search, 'bench': cmd_bench,
              'tune': cmd_tune, 'profile': cmd_profile, 'plan': cmd_plan, 'mup-check': cmd_mup_check}
  from tx.train.preemption import Preempted  # pylint: disable=g-import-not-at-top
  try:
    if args.command == 'plan' and distributed.process_id_without_connecting(args) != 0:
      return 0  # a simulated mesh on one host: process 0 plans for the job
    if (args.command in MULTI_PROCESS_COMMANDS
        and distributed.initialize(args, args.command) > 1):
      _print_on_process_zero_only()
    if getattr(args, 'experiments', None):
      from tx import registry  # pylint: disable=g-import-not-at-top
      for source in args.experiments:
        registry.load_user(source)
    return commands[args.command](args)
  except errors as e:
    print(f'tx {args.command}: error: {e}', file=sys.stderr)
    return 2
  except NonFiniteError as e:
    print(f'tx {args.command}: error: {e}', file=sys.stderr)
    return 1
  except Preempted as e:
    print(f'tx {args.command}: stopped: {e}', file=sys.stderr)
    return e.exit_code
  except KeyboardInterrupt:
    print(f'tx {args.command}: interrupted', file=sys.stderr)
    return 130
  except Exception as e:  # pylint: disable=broad-except  (last: the clauses above go first)
    if not is_disk_full(e):
      raise
    message = e if isinstance(e, DiskFullError) else (
        f'no space left on the device ({_short(e)}); free some space and rerun the same command')
    print(f'tx {args.command}: error: {message}', file=sys.stderr)
    return 1


def _command_line(args) -> dict:
  """What must agree between the processes of one command: its arguments, except which
  process this is."""
  return {k: v for k, v in vars(args).items() if k not in ('process_id', 'coordinator')}


# Commands that run as one of several processes when asked to (tx.runs.distributed).
MULTI_PROCESS_COMMANDS = ('train', 'sweep', 'eval')


def _print_on_process_zero_only() -> None:
  """Silences stdout on processes other than 0, the C++ runtime's writes to fd 1 included
  (errors still reach stderr everywhere)."""
  import os  # pylint: disable=g-import-not-at-top
  if not distributed.is_main_process():
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _short(error: BaseException) -> str:
  lines = str(error).strip().splitlines()
  return (lines[0] if lines else type(error).__name__)[:200]


if __name__ == '__main__':
  sys.exit(main())
