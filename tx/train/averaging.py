"""Checkpoint averaging: the element-wise mean of the parameters of several saved steps.

    steps = cadence_steps(ckpt, cfg.train, last=5)           # the run's last 5 regular saves
    params, state = average_checkpoints(ckpt, abstract, steps)
    write_average(workdir / 'average', cfg, state, steps, source=workdir)

Averaging the last checkpoints of a run (Vaswani et al. 2017 average the last 5 or 20) gives a
model that sits nearer the middle of the region the final steps wander in, usually a little
better than any one of them. Parameters are summed in float32 and cast back to their dtype.

The average is written as a run directory of its own (default `<workdir>/average`): its
config.json, one checkpoint at the latest averaged step (the optimizer state, data position
and RNG of that step, the averaged parameters) and average.json naming the averaged steps and
the run they came from. `tx eval`, `tx generate`, `export_hf` and `tx train` (fine-tuning from
the average) read it like any run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp

from tx.train import processes, run_dir
from tx.train.checkpoint import Checkpointer
from tx.train.errors import CheckpointError

AVERAGE_DIR = 'average'
AVERAGE_JSON = 'average.json'


def cadence_steps(ckpt: Checkpointer, train_cfg, last: int) -> list[int]:
  """The latest `last` committed steps on the run's checkpoint cadence, ascending.

  On cadence: multiples of train.checkpoint_every, and train.steps itself. A step saved off
  the cadence (a preemption's save) is left out, so a resumed run averages the same steps as
  an uninterrupted one. Fewer than `last` if fewer were kept.
  """
  every, final = train_cfg.checkpoint_every, train_cfg.steps
  steps = [s for s in ckpt.all_steps() if s % every == 0 or s == final]
  return steps[-last:]


def average_checkpoints(ckpt: Checkpointer, abstract_state, steps: list[int]):
  """(mean params, state of the latest step with the mean params) over checkpoint `steps`.

  abstract_state: the TrainState's ShapeDtypeStructs with shardings (as for restore);
  each step is read in turn, so memory holds two states and the running sum.
  Returns params with the same tree, shapes, dtypes and shardings as state.params.
  """
  if not steps:
    raise CheckpointError(f'no checkpoint steps to average in {ckpt.directory}')
  steps = sorted(set(int(s) for s in steps))
  available = ckpt.all_steps()
  missing = [s for s in steps if s not in available]
  if missing:
    raise CheckpointError(f'cannot average steps {missing}: not in {ckpt.directory} '
                          f'(available: {available}); pick from those')
  total, state = None, None
  for step in steps:
    state, _, _, got = ckpt.restore(abstract_state, step=step)
    if got != step:  # restore fell back past a damaged step: averaging it would be wrong
      raise CheckpointError(f'checkpoint step {step} in {ckpt.directory} is unreadable; '
                            f'average other steps (available: {ckpt.all_steps()})')
    as_f32 = jax.tree.map(lambda p: p.astype(jnp.float32), state.params)
    total = as_f32 if total is None else jax.tree.map(jnp.add, total, as_f32)
  params = jax.tree.map(lambda s, p: (s / len(steps)).astype(p.dtype), total, state.params)
  return params, state.replace(params=params)


def write_average(out: str | Path, cfg, state, steps: list[int], *, source: str | Path,
                  data_state: dict | None = None, meta: dict | None = None,
                  replace: bool = False) -> Path:
  """Writes the averaged `state` as a run directory at `out` (see the module docstring).

  Every process calls it (the save is collective); process 0 writes the JSON files. It is
  written into `<out>.partial` and renamed, so `out` is either complete or absent. Refuses
  (CheckpointError) an existing `out`: remove it first to average again.
  """
  out = Path(out).expanduser().resolve()
  if out.exists() and not replace:
    raise CheckpointError(f'{out} already exists; remove it or pass another --out (an average '
                          'is never written over another)')
  record = {'steps': sorted(int(s) for s in steps), 'source': str(Path(source).resolve())}
  staging = out.with_name(out.name + '.partial')  # renamed to `out` once complete
  if jax.process_index() == 0 and staging.exists():
    shutil.rmtree(staging)  # left by an average that was interrupted
  processes.wait_for_all(f'average staging: {staging}')
  with Checkpointer(staging / run_dir.CHECKPOINTS, keep=1, async_save=False,
                    best_metric=None) as ckpt:
    ckpt.save(max(record['steps']), state, data_state=data_state,
              meta=dict(meta or {}, averaged_steps=record['steps']))
  if jax.process_index() == 0:
    run_dir.write_json(staging / run_dir.CONFIG, run_dir.config_dict(cfg, out))
    run_dir.write_json(staging / AVERAGE_JSON, record)
    if out.exists():
      shutil.rmtree(out)
    staging.rename(out)
  processes.wait_for_all(f'average written: {out}')
  return out
