"""`train(config, workdir)`: the training loop behind `tx train`.

    data pipeline -> global batch on the mesh -> jitted step -> metrics / eval / checkpoint

Resumes automatically from the latest complete checkpoint in `workdir/checkpoints`
(params, optimizer state, step, RNG and the data iterator position), so a killed and
restarted run sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable

import flax.linen as nn
import jax
import numpy as np
from jax.experimental import multihost_utils

from tx.config.base import ConfigError
from tx.config.experiment import ExperimentConfig
from tx.data import make_pipeline
from tx.models.build import build_model, count_params
from tx.tasks import make_task, summarize
from tx.train import averaging, bf16_hint, memory, processes, run_dir, run_lock
from tx.train.checkpoint import Checkpointer
from tx.train.errors import NonFiniteError
from tx.train.evaluate import evaluate
from tx.train.flops import flops_per_step, measure_matmul_ceiling, mlm_head_positions
from tx.train.mesh import (batch_divisor, batch_sharding, global_batch, global_batches,
                           logical_rules, make_mesh, stacked_sharding)
from tx.train.optimizer import run_optimizer
from tx.train.preemption import Preempted, PreemptionGuard
from tx.train.state import init_state, state_shardings
from tx.train.step import configured_train_step, make_eval_step

log = logging.getLogger('tx.train')


@dataclasses.dataclass
class RunResult:
  """What `train` returns: summary.json's content plus the live state for the caller."""
  summary: dict
  state: object
  config: ExperimentConfig
  tokenizer: object


def best_mode(metric: str) -> str:
  """'max' for metrics where higher is better (accuracy), else 'min'."""
  return 'max' if 'accuracy' in metric else 'min'


def is_better(metrics: dict, best: dict | None, key: str) -> bool:
  if best is None or key not in best:
    return key in metrics
  if best_mode(key) == 'max':
    return metrics.get(key, -math.inf) > best[key]
  return metrics.get(key, math.inf) < best[key]


def say(msg: str) -> None:
  """A line for the user (process 0 only), on stderr so stdout stays for results."""
  if jax.process_index() == 0:
    print(msg, file=sys.stderr, flush=True)


def make_pipelines(cfg: ExperimentConfig, task_name: str):
  """Train and validation pipelines (this process's shard) sharing one tokenizer."""
  pc, pi = jax.process_count(), jax.process_index()
  train = make_pipeline(cfg.data, task_name, 'train', batch_size=cfg.train.batch_size,
                        seed=cfg.train.seed, shard_index=pi, shard_count=pc)
  valid = make_pipeline(cfg.data, task_name, 'validation', batch_size=cfg.train.batch_size,
                        seed=cfg.train.seed, shard_index=pi, shard_count=pc, train=False,
                        tokenizer=train.tokenizer)
  return train, valid


def resolve(cfg: ExperimentConfig, vocab_size: int) -> ExperimentConfig:
  """The config with data-dependent values filled in (model.vocab_size from the tokenizer).

  A checkpoint's own tokenizer (data.tokenizer=hf) keeps the checkpoint's table when it has
  at least the tokenizer's ids (T5 pads 32,100 ids to 32,128 rows).
  """
  if cfg.data.tokenizer == 'hf' and cfg.model.vocab_size >= vocab_size:
    return cfg
  return cfg.replace(model=cfg.model.replace(vocab_size=vocab_size))


def _report_data(pipe, name: str) -> None:
  s = pipe.stats
  dropped, truncated = s.get('dropped', 0), s.get('truncated', 0)
  say(f'data {name}: {pipe.num_rows} rows, {s.get("tokens", 0)} tokens'
      + (f'; dropped {dropped} over-long examples' if dropped else '')
      + (f'; truncated {truncated} over-long examples' if truncated else ''))


FinalEval = Callable[[ExperimentConfig, Any, Any, Any], dict]
"""(cfg, params, mesh, tokenizer) -> metrics merged into summary.json's 'eval' at the end."""


def train(cfg: ExperimentConfig, workdir: str | Path, *, quiet: bool = False,
          final_eval: FinalEval | None = None) -> RunResult:
  """Trains `cfg` into `workdir` (resuming if it holds checkpoints).

  Holds `workdir`'s writer lock (`tx.train.run_lock`: RunLocked if another process writes
  there) from before its first write until it returns or raises, and refuses a step that
  cannot fit in memory (`tx.train.memory`, train.memory_check) before writing anything.

  final_eval: evaluations run once after the last step, on every process (they may be
  collective), merged into summary['eval'] before summary.json is written. `tx train` and
  `tx sweep` pass `tx.runs.end_of_run_eval` (the train.extrapolation table); see
  `tx.runs.train_run`.
  """
  start_wall = time.time()
  if cfg.train.extrapolation and cfg.task_name == 'causal_lm' and final_eval is None:
    say('train.extrapolation is evaluated by tx.runs.train_run (what tx train and tx sweep '
        'run); tx.train.loop.train without final_eval= skips it')
  workdir = run_dir.check_workdir(workdir, cfg.name)
  task = make_task(cfg)
  mesh = make_mesh(cfg.mesh)
  if cfg.train.batch_size % batch_divisor(mesh):
    raise ConfigError(f'train.batch_size: {cfg.train.batch_size} is not divisible by the '
                      f'{batch_divisor(mesh)} data-parallel devices (mesh.data x mesh.fsdp)')
  train_pipe, eval_pipe = make_pipelines(cfg, task.name)
  processes.wait_for_all(f'data ready: {workdir}')
  cfg = resolve(cfg, train_pipe.vocab_size)
  model = build_model(cfg.model)
  optimizer, schedule = run_optimizer(cfg)
  rules = logical_rules(cfg.mesh)
  # Shardings before anything is written: a parameter dimension the mesh does not divide is
  # a ConfigError that leaves no half-made run directory behind.
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract, shardings = state_shardings(model, optimizer, cfg.model, mesh, rules,
                                          cfg.train.seed)
  # One writer per run directory (process 0 holds the lock for the job), taken before
  # anything is written in it; the step is compiled and its memory checked before config.json,
  # so a step that cannot fit leaves nothing behind.
  made = run_dir.make_workdir(workdir)
  lock = run_lock.hold(workdir)
  # ckpt, writer and guard are set once the step is known to fit.
  run = _Run(cfg=cfg, workdir=workdir, task=task, model=model, optimizer=optimizer,
             schedule=schedule, mesh=mesh, abstract=abstract, shardings=shardings,
             ckpt=None, writer=None, train_pipe=train_pipe, eval_pipe=eval_pipe,
             guard=None, start_wall=start_wall)
  try:
    lock.acquire()
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      compiled, eval_step = _compile(run)
  except BaseException:
    lock.discard()
    run_dir.remove_made(workdir, made)
    raise
  try:
    if jax.process_index() == 0:
      run_dir.write_json(workdir / run_dir.CONFIG, run_dir.config_dict(cfg, workdir))
    _report_data(train_pipe, 'train')
    run.ckpt = Checkpointer(workdir / run_dir.CHECKPOINTS, keep=cfg.train.keep_checkpoints,
                            async_save=cfg.train.async_checkpoint,
                            best_metric=cfg.train.best_metric,
                            best_mode=best_mode(cfg.train.best_metric))
    run.writer = run_dir.MetricsWriter(workdir)
    try:
      with jax.set_mesh(mesh), nn.logical_axis_rules(rules), PreemptionGuard() as guard:
        run.guard = guard
        state, batches = _restore_or_init(run)
        done = _finished_summary(run)
        if done is not None:
          say(f'{workdir}: already finished at step {run.step} (summary.json kept); nothing to '
              'train. Raise train.steps (--set train.steps=N) to train further')
          return RunResult(summary=done, state=state, config=cfg,
                           tokenizer=train_pipe.tokenizer)
        progress = _progress(run.step, cfg.train.steps, quiet)
        try:
          state = _train_steps(run, state, batches, compiled, eval_step, progress)
        finally:
          progress.close()
        run.ckpt.wait()
        return _finish(run, state, final_eval, eval_step)
    finally:
      run.ckpt.close()
      run.writer.close()
  finally:
    lock.release()


@dataclasses.dataclass
class _Run:
  """One training run's context: what it was built from, and its counters so far."""
  cfg: ExperimentConfig
  workdir: Path
  task: Any
  model: nn.Module
  optimizer: Any
  schedule: Callable
  mesh: Any
  abstract: Any  # the state's ShapeDtypeStructs
  shardings: Any
  ckpt: Checkpointer
  writer: run_dir.MetricsWriter
  train_pipe: Any
  eval_pipe: Any
  guard: PreemptionGuard
  start_wall: float  # wall time not yet added to meta['wall_time_s']
  meta: dict = dataclasses.field(default_factory=lambda: {'best_eval': None, 'wall_time_s': 0.0})
  step: int = 0
  params_count: int = 0
  step_flops: float = 0.0
  peak_flops: float = 0.0
  compile_time: float = 0.0
  best: dict | None = None
  last_eval: dict | None = None
  tokens_seen: float = 0.0
  steps_run: int = 0
  train_time: float = 0.0


def _restore_or_init(run: _Run):
  """(state, batch iterator) from the latest checkpoint, or fresh ones at step 0."""
  if run.ckpt.latest_step() is not None:
    state, data_state, run.meta, step = run.ckpt.restore(run.abstract)
    batches = run.train_pipe.iterator(data_state)
    run.writer.drop_after(step)  # rows the killed run logged past its last checkpoint
    say(f'resuming from checkpoint at step {step} in {run.workdir / run_dir.CHECKPOINTS}')
  else:
    state = init_state(run.model, run.optimizer, run.cfg.model, run.shardings,
                       run.cfg.train.seed)
    batches = run.train_pipe.iterator()
    run.writer.drop_after(0)  # rows of a run killed before its first checkpoint
  run.step = int(jax.device_get(state.step))
  run.best, run.last_eval = run.meta.get('best_eval'), run.meta.get('last_eval')
  return state, batches


def _finished_summary(run: _Run) -> dict | None:
  """summary.json of a run that already reached train.steps and wrote it (status done), so
  running it again changes nothing; None otherwise (also when summary.json is missing or
  unreadable: then the final evaluation runs again and writes it). Process 0 decides for
  every process (it alone writes summary.json)."""
  summary = None
  if run.step >= run.cfg.train.steps and jax.process_index() == 0:
    path = run.workdir / run_dir.SUMMARY
    try:
      found = json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
      found = None
    if isinstance(found, dict) and found.get('status') == 'done' and found.get('steps') == run.step:
      summary = found
  if jax.process_count() > 1:
    finished = multihost_utils.broadcast_one_to_all(np.int32(summary is not None))
    if not int(finished):
      return None
    # Other processes print nothing (tx.cli); they need only the summary's shape.
    return summary if summary is not None else {'status': 'done', 'steps': run.step,
                                                'wall_time_s': 0.0, 'eval': {}}
  return summary


def _compile(run: _Run):
  """The train step compiled ahead of time for the global batch (from the abstract state:
  nothing is allocated), checked against the device's memory (train.memory_check), and the
  jitted eval step; sets the run's parameter count, FLOPs per step and matmul ceiling.
  The step comes as `_Steps`: train.steps_per_call steps per call where it can."""
  cfg, mesh = run.cfg, run.mesh
  spec = run.train_pipe.batch_spec()
  rows = cfg.train.batch_size

  def compile_steps(count: int):
    train_step = configured_train_step(cfg, run.model, run.task, run.optimizer, run.shardings,
                                       batch_sharding(mesh), steps_per_call=count)
    sharding = batch_sharding(mesh) if count == 1 else stacked_sharding(batch_sharding(mesh))
    lead = () if count == 1 else (count,)
    abstract_batch = {k: jax.ShapeDtypeStruct(lead + (rows,) + shape[1:], dtype,
                                              sharding=sharding)
                      for k, (shape, dtype) in spec.items()}
    return train_step.lower(run.abstract, abstract_batch).compile()

  t0 = time.time()
  compiled = compile_steps(cfg.train.per_call)
  run.compile_time = time.time() - t0
  if cfg.train.memory_check:
    memory.check_fits(compiled)
  run.params_count = count_params(run.abstract.params)
  length = spec['src'][0][1] if 'src' in spec else spec['inputs'][0][1]
  run.step_flops = flops_per_step(cfg.model, run.abstract.params, batch=rows, length=length,
                                  target_length=spec['targets'][0][1],
                                  head_positions=mlm_head_positions(cfg))
  ceiling = measure_matmul_ceiling(cfg.model.dtype)
  run.peak_flops = ceiling * jax.device_count()
  need = memory.compiled_bytes(compiled)
  say(f'{cfg.name}: {run.params_count:,} params, {run.step_flops / 1e9:.2f} GFLOP/step, '
      f'compiled in {run.compile_time:.1f}s'
      + (f' ({memory.format_bytes(need)} per device)' if need is not None else '')
      + f', {jax.device_count()} device(s) {dict(mesh.shape)}; training to step '
      f'{cfg.train.steps}')
  hint = bf16_hint.check(cfg.model.dtype, jax.devices()[0].platform, ceiling)
  if hint:
    say(hint)
  steps = _Steps(cfg.train.per_call, compiled, functools.partial(compile_steps, 1))
  t = cfg.train
  if any(n % t.per_call for n in (t.steps, t.log_every, t.eval_every, t.checkpoint_every)):
    steps.single()  # single steps will be needed: compiled now, not inside a timed window
  return steps, jax.jit(make_eval_step(run.model, run.task))


class _Steps:
  """The compiled training step: `per_call` (train.steps_per_call) steps per call, and one
  step per call where a log, evaluation, checkpoint or the end is nearer than that (that
  one compiled on first need)."""

  def __init__(self, per_call: int, compiled, compile_single):
    self.per_call, self._compiled, self._compile_single = per_call, compiled, compile_single
    self._single = compiled if per_call == 1 else None

  def single(self):
    """The one-step executable (compiled on the first call)."""
    if self._single is None:
      self._single = self._compile_single()
    return self._single

  def __call__(self, state, batches, mesh, count: int):
    """(state after `count` steps (1 or per_call) on the next batches, their metrics:
    scalars for one step, [count] each for several)."""
    if count == 1:
      return self.single()(state, global_batch(next(batches), mesh))
    return self._compiled(state, global_batches([next(batches) for _ in range(count)], mesh))


def _train_steps(run: _Run, state, batches, compiled, eval_step, progress):
  """Steps until train.steps: logs, evaluates and checkpoints on their schedules; raises
  Preempted after saving when a stop signal arrived, NonFiniteError per train.nan_policy."""
  cfg = run.cfg.train
  pending, window_start = [], time.time()
  while run.step < cfg.steps:
    ahead = min([cfg.steps - run.step] + [every - run.step % every for every in
                                          (cfg.log_every, cfg.eval_every, cfg.checkpoint_every)])
    count = compiled.per_call if ahead >= compiled.per_call else 1
    state, metrics = compiled(state, batches, run.mesh, count)
    run.step += count
    run.steps_run += count
    pending.append(metrics)
    last = run.step == cfg.steps
    at_log = run.step % cfg.log_every == 0 or last
    at_eval = run.step % cfg.eval_every == 0 or last
    at_ckpt = run.step % cfg.checkpoint_every == 0 or last
    if at_log or at_eval or at_ckpt:
      _log_window(run, state, pending, window_start, at_log, progress)
      pending, window_start = [], time.time()
    if at_eval:
      _evaluate(run, state, eval_step, progress)
      window_start = time.time()
    preempted = run.guard.requested(run.step) and not last
    if at_ckpt or preempted:
      _checkpoint(run, state, batches, evaluated=at_eval)
      window_start = time.time()
    if preempted:
      run.ckpt.wait()
      raise Preempted(run.guard.signal_name, run.step, run.workdir)
  return state


def _log_window(run: _Run, state, pending: list, window_start: float, write: bool,
                progress) -> None:
  """Averages the steps since the last window into one metrics row (written when `write`),
  checks them for non-finite values before anything is saved, and moves the progress bar."""
  host = _one_per_step(jax.device_get(pending))  # waits for the window's steps: time after
  elapsed = time.time() - window_start
  run.train_time += elapsed
  sums = {k: sum(float(m[k]) for m in host) for k in host[0] if k != 'diag'}
  row = summarize(sums, steps=len(host))
  row['grad_norm'] = float(host[-1]['grad_norm'])
  row.update({f'diag/{k}': float(v) for k, v in host[-1].get('diag', {}).items()})
  _track_divergence(run, host, first_step=run.step - len(host) + 1)
  row['learning_rate'] = float(run.schedule(run.step - 1))
  row['skipped'] = sums.get('skipped', 0.0)
  tokens = sums['weight_sum']
  run.tokens_seen += tokens
  row['tokens_per_s'] = tokens / max(elapsed, 1e-9)
  row['step_time_s'] = elapsed / len(host)
  row['mfu'] = run.step_flops / max(row['step_time_s'], 1e-9) / run.peak_flops
  if write:
    run.writer.write(run.step, row)
  try:
    _check_finite(host, run.step - len(host) + 1, run.cfg, total_skips=state.skips)
  except NonFiniteError:
    _write_summary(run, state, status='diverged')
    raise
  progress.update(run.step, row)


def _one_per_step(host: list) -> list:
  """Host metrics of the calls of a window -> one dict per step (a call of several steps
  returns each metric stacked [count])."""
  out = []
  for m in host:
    count = np.ndim(m['finite']) and len(m['finite'])
    out += [jax.tree.map(lambda x, i=i: x[i], m) for i in range(count)] if count else [m]
  return out


def _track_divergence(run: _Run, host: list, first_step: int) -> None:
  """Records the loss at initialisation (step 1's) and `diverged_at`: the last step of the
  first log window after warmup whose mean training loss exceeds it (Wortsman et al. 2023;
  the window mean, not one step, so a noisy early step is not a divergence), or the first
  step whose loss or gradient norm is not finite."""
  losses = [float(m['loss_sum']) / max(float(m['weight_sum']), 1.0) for m in host]
  if first_step == 1:
    run.meta['init_loss'] = losses[0]
  if run.meta.get('diverged_at') is not None:
    return
  bad = [first_step + i for i, m in enumerate(host) if not float(m['finite'])]
  if bad:
    run.meta['diverged_at'] = bad[0]
    return
  last = first_step + len(host) - 1
  init = run.meta.get('init_loss')
  mean = sum(losses) / len(losses)
  if init is not None and last > run.cfg.optim.warmup_steps and not mean <= init:
    run.meta['diverged_at'] = last


def _evaluate(run: _Run, state, eval_step, progress) -> None:
  """Validation metrics now: logged under eval/, kept as the last and (maybe) best eval."""
  metrics = evaluate(eval_step, state.params, run.eval_pipe, run.mesh,
                     max_batches=run.cfg.train.eval_batches)
  run.last_eval = metrics
  run.writer.write(run.step, metrics, prefix='eval/')
  if metrics and is_better(metrics, run.best, run.cfg.train.best_metric):
    run.best = dict(metrics, step=run.step)
  progress.note(f'step {run.step}: eval loss {metrics.get("loss", float("nan")):.4f}'
                + (f', bpb {metrics["bits_per_byte"]:.3f}' if 'bits_per_byte' in metrics else ''))


def _checkpoint(run: _Run, state, batches, *, evaluated: bool) -> None:
  """Saves params, optimizer state, data position and meta (best/last eval, wall time)."""
  now = time.time()
  run.meta = {**run.meta, 'best_eval': run.best, 'last_eval': run.last_eval,
              'wall_time_s': run.meta.get('wall_time_s', 0.0) + (now - run.start_wall)}
  run.start_wall = now
  run.ckpt.save(run.step, state, data_state=batches.get_state(), meta=run.meta,
                metrics=run.last_eval if evaluated else None)


def _finish(run: _Run, state, final_eval: FinalEval | None, eval_step) -> RunResult:
  """The checkpoint average (train.average_last), summary.json (after `final_eval`) and the
  RunResult."""
  extra = {}
  if final_eval is not None:
    extra = final_eval(run.cfg, state.params, run.mesh, run.train_pipe.tokenizer)
  average = _average(run, eval_step)
  summary = _write_summary(run, state, status='done', extra_eval=extra, average=average)
  return RunResult(summary=summary, state=state, config=run.cfg,
                   tokenizer=run.train_pipe.tokenizer)


def _average(run: _Run, eval_step) -> dict:
  """Averages the last train.average_last checkpoints into <workdir>/average and evaluates
  the average on the validation split: {'steps', 'dir', 'eval'} ({} when off)."""
  n = run.cfg.train.average_last
  if not n:
    return {}
  steps = averaging.cadence_steps(run.ckpt, run.cfg.train, n)
  if len(steps) < n:
    say(f'train.average_last={n}: only {len(steps)} checkpoints on the cadence were kept; '
        f'averaging steps {steps}')
  params, state = averaging.average_checkpoints(run.ckpt, run.abstract, steps)
  out = averaging.write_average(run.workdir / averaging.AVERAGE_DIR, run.cfg, state, steps,
                                source=run.workdir, meta=run.meta, replace=True)
  metrics = evaluate(eval_step, params, run.eval_pipe, run.mesh,
                     max_batches=run.cfg.train.eval_batches)
  run.writer.write(run.step, metrics, prefix='eval_average/')
  say(f'averaged steps {steps} into {out}: eval loss {metrics.get("loss", float("nan")):.4f}')
  return {'steps': steps, 'dir': str(out), 'eval': metrics}


def _write_summary(run: _Run, state, *, status: str, extra_eval: dict | None = None,
                   average: dict | None = None) -> dict:
  """summary.json (process 0 writes it): 'done', or 'diverged' for a run stopped by a
  non-finite loss, which a sweep counts as a finished data point."""
  summary = {
      'status': status, 'init_loss': run.meta.get('init_loss'),
      'diverged_at': run.meta.get('diverged_at'),
      'experiment': run.cfg.name, 'params': run.params_count, 'steps': run.step,
      'wall_time_s': run.meta.get('wall_time_s', 0.0) + (time.time() - run.start_wall),
      'compile_time_s': run.compile_time, 'train_time_s': run.train_time,
      'tokens_per_s': run.tokens_seen / max(run.train_time, 1e-9) if run.tokens_seen else None,
      'flops_per_step': run.step_flops, 'matmul_ceiling_flops': run.peak_flops,
      'eval': (run.last_eval or {}) if status == 'done' else {}, 'best_eval': run.best or {},
      'devices': jax.device_count(), 'processes': jax.process_count(),
      'skipped_updates': int(jax.device_get(state.skips)),
  }
  if run.steps_run and run.train_time:
    summary['mfu'] = run.steps_run / run.train_time * run.step_flops / run.peak_flops
  if extra_eval:
    summary['eval'] = dict(summary['eval'], **extra_eval)
  if average:
    summary['average'] = average
  if jax.process_index() == 0:
    run_dir.write_json(run.workdir / run_dir.SUMMARY, summary)
  return summary


def _check_finite(host_metrics, first_step, cfg, total_skips) -> None:
  """Stops (NonFiniteError) on a non-finite step under nan_policy=stop, or once more than
  train.max_skips updates have been skipped under nan_policy=skip."""
  for i, m in enumerate(host_metrics):
    if cfg.train.nan_policy == 'stop' and not m['finite']:
      loss = float(m['loss_sum']) / max(float(m['weight_sum']), 1.0)
      grad_norm = float(m['grad_norm'])
      what = (f'loss {loss}' if not math.isfinite(loss) else
              f'gradient norm {grad_norm} (loss {loss:.4f})')
      raise NonFiniteError(
          f'step {first_step + i}: non-finite {what}; the last good checkpoint is kept. Lower '
          'optim.learning_rate, enable optim.clip_norm, or set train.nan_policy=skip')
  skipped = sum(float(m['skipped']) for m in host_metrics)
  if cfg.train.nan_policy == 'skip' and skipped:
    last = first_step + len(host_metrics) - 1
    total = int(jax.device_get(total_skips))
    if total > cfg.train.max_skips:
      raise NonFiniteError(
          f'step {last}: {total} updates skipped for a non-finite loss or gradient norm, more '
          f'than train.max_skips={cfg.train.max_skips}; the last good checkpoint is kept. Lower '
          'optim.learning_rate, enable optim.clip_norm, or raise train.max_skips')
    say(f'skipped {int(skipped)} update(s) with non-finite loss/gradients up to step {last} '
        f'({total} in all, train.max_skips={cfg.train.max_skips})')


class _progress:
  """A tqdm bar with ETA and the live loss (process 0, unless quiet)."""

  def __init__(self, step: int, total: int, quiet: bool):
    self.bar = None
    if jax.process_index() == 0 and not quiet:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top  (kept off start-up)
      self.bar = tqdm(total=total, initial=step, dynamic_ncols=True, file=sys.stderr,
                      unit='step')
    self.step = step

  def update(self, step: int, row: dict) -> None:
    if self.bar is not None:
      self.bar.update(step - self.step)
      self.bar.set_postfix(loss=f'{row["loss"]:.4f}', tok_s=f'{row["tokens_per_s"]:.0f}')
    self.step = step

  def note(self, msg: str) -> None:
    if self.bar is not None:
      self.bar.write(msg, file=sys.stderr)
    elif jax.process_index() == 0:
      log.info(msg)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
