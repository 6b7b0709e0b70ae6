"""`tx sweep SWEEP --workdir DIR --slurm`: the sweep as one Slurm job array, one run per task.

    tx sweep ablate_positions --workdir /scratch/pos --slurm --partition gpu --gpus-per-run 1 \\
        --time 4:00:00
    sbatch /scratch/pos/sweep.sbatch

The script (`DIR/sweep.sbatch`, or `--script PATH`) holds one `tx train` line per run, the
very line `tx sweep --commands` prints for it (with `--experiments` for user-registered
experiments), and task `$SLURM_ARRAY_TASK_ID` runs line number `$SLURM_ARRAY_TASK_ID`. As in
a local `tx sweep`, a task whose run directory holds summary.json (done, or diverged) exits 0
at once, and a partial run resumes from its last checkpoint (`tx train` does that by
itself), so resubmitting the same script after a preemption or a time limit finishes the
sweep. Logs go to `DIR/slurm/<job>_<task>.out/.err`.

Nothing trains and no run directory is made here: this writes the script, the empty
`DIR/slurm/` (Slurm does not create log directories) and `DIR/sweep.json` (the same record a
local sweep writes, so `tx compare DIR` names variants and the baseline the same way).
The workdir is made absolute, and each task starts in the directory this command ran in,
so relative paths in the configs mean what they mean here.

sbatch exports the submitting shell's environment by default, so submit from a shell where
`tx` is on PATH (say, after activating the virtual environment); TX_EXPERIMENTS,
TX_RAW_DATA and TFDS_DATA_DIR pass through the same way.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from pathlib import Path

from tx.config.base import parse_overrides
from tx.errors import UserError
from tx.sweep.runner import check_partials, experiment_sources, record, write_record
from tx.sweep.spec import Resolver, Run, Sweep, plan, select

SCRIPT = 'sweep.sbatch'
LOGS = 'slurm'
# Slurm's --time: minutes, MM:SS, H:MM:SS, D-H, D-H:MM, D-H:MM:SS.
_TIME = re.compile(r'\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}')


@dataclasses.dataclass(frozen=True)
class Resources:
  """What each array task asks Slurm for (None: the cluster's default)."""
  partition: str | None = None
  gpus_per_run: int | None = None
  cpus_per_run: int | None = None
  time: str | None = None
  max_parallel: int | None = None  # at most this many tasks at once (`--array=0-N%K`)

  def check(self) -> 'Resources':
    """Raises UserError (one line) on a value sbatch would refuse or misread."""
    if self.partition is not None and (not self.partition or re.search(r'\s', self.partition)):
      raise UserError(f'--partition: expected a partition name, got {self.partition!r}')
    for flag, value, least in (('--gpus-per-run', self.gpus_per_run, 0),
                               ('--cpus-per-run', self.cpus_per_run, 1),
                               ('--max-parallel', self.max_parallel, 1)):
      if value is not None and value < least:
        raise UserError(f'{flag}: must be >= {least}, got {value}')
    if self.time is not None and not _TIME.fullmatch(self.time):
      raise UserError(f'--time: expected minutes (90), H:MM:SS (4:00:00) or D-HH:MM:SS '
                      f'(1-12:00:00), got {self.time!r}')
    return self


def _job_name(name: str) -> str:
  return re.sub(r'[^A-Za-z0-9_.-]', '_', name) or 'tx_sweep'


def _comment(text: str) -> str:
  """`text` on one line, safe inside a `#` comment."""
  return re.sub(r'[\r\n]+', ' ', text)


def _sbatch_path(path: Path, what: str) -> str:
  text = str(path)
  if re.search(r'[\s%]', text):
    raise UserError(f'{what}: {text} holds a space or %, which #SBATCH log paths cannot '
                    'carry; choose another --workdir')
  return text


def script(sweep: Sweep, runs: list[Run], commands: list[str], workdir: Path, *,
           resources: Resources = Resources(), cwd: Path | None = None,
           invocation: str = '') -> str:
  """The sbatch array script: task i runs `commands[i]` unless `runs[i]` is done."""
  n = len(runs)
  logs = _sbatch_path(workdir / LOGS, '--workdir')
  array = f'0-{n - 1}' + (f'%{resources.max_parallel}' if resources.max_parallel else '')
  sbatch = [f'--job-name={_job_name(sweep.name)}', f'--array={array}',
            f'--output={logs}/%A_%a.out', f'--error={logs}/%A_%a.err',
            '--nodes=1', '--ntasks=1']
  if resources.partition:
    sbatch.append(f'--partition={resources.partition}')
  if resources.time:
    sbatch.append(f'--time={resources.time}')
  if resources.gpus_per_run:
    sbatch.append(f'--gres=gpu:{resources.gpus_per_run}')
  if resources.cpus_per_run:
    sbatch.append(f'--cpus-per-task={resources.cpus_per_run}')
  q = shlex.quote
  lines = [
      '#!/bin/bash',
      _comment(f'# tx sweep {sweep.name}: {n} run(s) of {sweep.base}, one per array task.'),
      *([_comment(f'# Written by: {invocation}')] if invocation else []),
      '# Submit from a shell where `tx` is on PATH (e.g. after activating the virtual',
      '# environment): sbatch exports that environment to every task, TX_EXPERIMENTS and',
      '# TX_RAW_DATA included. A run whose directory holds summary.json is done and its task',
      '# exits at once; a partial run resumes from its last checkpoint, so resubmitting this',
      '# script finishes the sweep. One task by hand: SLURM_ARRAY_TASK_ID=0 bash THIS_FILE',
      *(f'#SBATCH {s}' for s in sbatch),
      '',
      'set -euo pipefail',
      '',
      'RUN_DIRS=(',
      *(f'  {q(str(r.dir))}' for r in runs),
      ')',
      'COMMANDS=(',
      *(f'  {q(c)}' for c in commands),
      ')',
      '',
      'i="${SLURM_ARRAY_TASK_ID:?not set: submit with sbatch, or set it to a task number}"',
      f'if ! [[ "$i" =~ ^[0-9]+$ ]] || (( i >= {n} )); then',
      f'  echo "tx sweep {_job_name(sweep.name)}: no task $i (tasks are 0-{n - 1})" >&2',
      '  exit 2',
      'fi',
      *([f'cd {q(str(cwd))}'] if cwd else []),
      'if [[ -e "${RUN_DIRS[$i]}/summary.json" ]]; then',
      '  echo "task $i: ${RUN_DIRS[$i]} is done, skipped"',
      '  exit 0',
      'fi',
      'echo "task $i: ${COMMANDS[$i]}"',
      'eval "exec ${COMMANDS[$i]}"',
      '',
  ]
  return '\n'.join(lines)


def _resources(args) -> Resources:
  return Resources(partition=args.partition, gpus_per_run=args.gpus_per_run,
                   cpus_per_run=args.cpus_per_run, time=args.time,
                   max_parallel=args.max_parallel).check()


def refuse_without_slurm(args) -> None:
  """Raises UserError when a Slurm-only flag is given without --slurm."""
  for flag in ('partition', 'gpus_per_run', 'cpus_per_run', 'time', 'max_parallel', 'script'):
    if getattr(args, flag, None) is not None:
      raise UserError(f'--{flag.replace("_", "-")}: only with --slurm')


def _invocation(args, sweep: Sweep, workdir: Path, sources: list[str]) -> str:
  """The `tx sweep ... --slurm` line that wrote the script (for its header comment)."""
  argv = ['tx', 'sweep', sweep.name, *(a for s in sources for a in ('--experiments', s)),
          '--workdir', str(workdir), '--slurm']
  for flag in ('seeds', 'partition', 'gpus_per_run', 'cpus_per_run', 'time', 'max_parallel'):
    if getattr(args, flag, None) is not None:
      argv += [f'--{flag.replace("_", "-")}', str(getattr(args, flag))]
  if args.only:
    argv += ['--only', *args.only]
  if args.set:
    argv += ['--set', *args.set]
  return shlex.join(argv)


def cli(args, sweep: Sweep, resolve: Resolver) -> int:
  """`tx sweep SWEEP --workdir DIR --slurm [--partition P] [--gpus-per-run N] [--time T]
  [--cpus-per-run N] [--max-parallel K] [--script PATH]` (with --seeds, --only, --set)."""
  resources = _resources(args)
  if args.seeds is not None and args.seeds < 1:
    raise UserError(f'--seeds: must be >= 1, got {args.seeds}')
  extra = parse_overrides(args.set)
  workdir = Path(args.workdir).expanduser().resolve()
  all_runs = plan(sweep, workdir, resolve=resolve, seeds=args.seeds, extra=extra)
  runs = select(all_runs, args.only, sweep)
  check_partials(runs)
  sources = experiment_sources(args)
  commands = [r.command(sweep.base, sources) for r in runs]
  path = Path(args.script or workdir / SCRIPT).expanduser().resolve()
  if path.is_dir():
    raise UserError(f'--script: {path} is a directory; name the file to write')
  text = script(sweep, runs, commands, workdir, resources=resources, cwd=Path.cwd(),
                invocation=_invocation(args, sweep, workdir, sources))
  data = record(sweep, all_runs, workdir, extra)  # refuses a workdir holding another sweep
  (workdir / LOGS).mkdir(parents=True, exist_ok=True)
  write_record(workdir, data)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f'.{path.name}.tmp')
  tmp.write_text(text)
  os.replace(tmp, path)
  path.chmod(0o755)
  print(f'wrote {path}: {len(runs)} run(s) of sweep {sweep.name}, one per array task')
  print(f'submit with: sbatch {shlex.quote(str(path))}')
  return 0
