"""`tx average`: the element-wise mean of a run's last checkpoints, written as a run directory.

    tx average --workdir runs/mt --last 5            # -> runs/mt/average
    tx eval --workdir runs/mt/average --split validation

See tx.train.averaging (train.average_last does the same at the end of `tx train`).
"""

from __future__ import annotations

from pathlib import Path

from tx.config.base import ConfigError
from tx.runs.restore import open_checkpoints
from tx.train import averaging


def run_average(args) -> int:
  """Writes the average of the chosen steps to --out; prints which steps and where."""
  if args.last is not None and args.last < 1:
    raise ConfigError(f'--last: must be >= 1, got {args.last}')
  workdir = Path(args.workdir)
  out = Path(args.out) if args.out else workdir / averaging.AVERAGE_DIR
  with open_checkpoints(workdir) as (cfg, ckpt, abstract, _):
    steps = (averaging.cadence_steps(ckpt, cfg.train, args.last) if args.last is not None
             else sorted(set(args.steps)))
    if args.last is not None and len(steps) < args.last:
      raise ConfigError(f'--last {args.last}: {workdir} keeps only {len(steps)} checkpoints on '
                        f'its cadence ({steps}); average fewer, or keep more next time with '
                        'train.keep_checkpoints')
    _, state = averaging.average_checkpoints(ckpt, abstract, steps)
    _, data_state, meta, _ = ckpt.restore(abstract, step=max(steps))
    written = averaging.write_average(out, cfg, state, steps, source=workdir,
                                      data_state=data_state, meta=meta)
  print(f'averaged steps {steps} of {workdir} into {written}')
  return 0
