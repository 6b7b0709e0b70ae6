"""`train(config, workdir)`: the training loop behind `tx train`.

    data pipeline -> global batch on the mesh -> jitted step -> metrics / eval / checkpoint

Resumes automatically from the latest complete checkpoint in `workdir/checkpoints`
(params, optimizer state, step, RNG and the data iterator position), so a killed and
restarted run sees exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from tx.config.experiment import ExperimentConfig
from tx.models.build import build_model, count_params
from tx.tasks import make_task, summarize
from tx.train import processes, run_dir
from tx.train.checkpoint import Checkpointer
from tx.train.errors import NonFiniteError
from tx.train.evaluate import evaluate
from tx.train.flops import flops_per_step, measure_matmul_ceiling
from tx.train.mesh import batch_divisor, batch_sharding, global_batch, logical_rules, make_mesh
from tx.train.optimizer import make_optimizer
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
  from tx.data import make_pipeline  # pylint: disable=g-import-not-at-top
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


def train(cfg: ExperimentConfig, workdir: str | Path, *, quiet: bool = False) -> RunResult:
  """Trains `cfg` into `workdir` (resuming if it holds checkpoints)."""
  start_wall = time.time()
  workdir = run_dir.check_workdir(workdir, cfg.name)
  task = make_task(cfg)
  mesh = make_mesh(cfg.mesh)
  if cfg.train.batch_size % batch_divisor(mesh):
    from tx.config.base import ConfigError  # pylint: disable=g-import-not-at-top
    raise ConfigError(f'train.batch_size: {cfg.train.batch_size} is not divisible by the '
                      f'{batch_divisor(mesh)} data-parallel devices (mesh.data x mesh.fsdp)')
  train_pipe, eval_pipe = make_pipelines(cfg, task.name)
  processes.wait_for_all(f'data ready: {workdir}')
  cfg = resolve(cfg, train_pipe.vocab_size)
  model = build_model(cfg.model)
  optimizer, schedule = make_optimizer(cfg.optim, total_steps=cfg.train.steps,
                                       d_model=cfg.model.d_model)
  rules = logical_rules(cfg.mesh)
  # Shardings before anything is written: a parameter dimension the mesh does not divide is
  # a ConfigError that leaves no half-made run directory behind.
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    sharded = state_shardings(model, optimizer, cfg.model, mesh, rules, cfg.train.seed)
  workdir.mkdir(parents=True, exist_ok=True)
  if jax.process_index() == 0:
    run_dir.write_json(workdir / run_dir.CONFIG, run_dir.config_dict(cfg, workdir))
  _report_data(train_pipe, 'train')

  ckpt = Checkpointer(workdir / run_dir.CHECKPOINTS, keep=cfg.train.keep_checkpoints,
                      async_save=cfg.train.async_checkpoint, best_metric=cfg.train.best_metric,
                      best_mode=best_mode(cfg.train.best_metric))
  writer = run_dir.MetricsWriter(workdir)
  try:
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules), PreemptionGuard() as guard:
      return _run(cfg, workdir, task, model, optimizer, schedule, mesh, sharded, ckpt, writer,
                  train_pipe, eval_pipe, start_wall, quiet, guard)
  finally:
    ckpt.close()
    writer.close()


def _run(cfg, workdir, task, model, optimizer, schedule, mesh, sharded, ckpt, writer, train_pipe,
         eval_pipe, start_wall, quiet, guard):
  abstract, shardings = sharded
  meta = {'best_eval': None, 'wall_time_s': 0.0}
  latest = ckpt.latest_step()
  if latest is not None:
    state, data_state, meta, step = ckpt.restore(abstract)
    batches = train_pipe.iterator(data_state)
    writer.drop_after(step)  # rows the killed run logged past its last checkpoint
    say(f'resuming from checkpoint at step {step} in {workdir / run_dir.CHECKPOINTS}')
  else:
    state = init_state(model, optimizer, cfg.model, shardings, cfg.train.seed)
    batches = train_pipe.iterator()
    writer.drop_after(0)  # rows of a run killed before its first checkpoint
  step = int(jax.device_get(state.step))
  params_count = count_params(state.params)

  train_step = configured_train_step(cfg, model, task, optimizer, shardings,
                                     batch_sharding(mesh))
  eval_step = jax.jit(make_eval_step(model, task))

  spec = train_pipe.batch_spec()
  global_rows = cfg.train.batch_size
  abstract_batch = {k: jax.ShapeDtypeStruct((global_rows,) + shape[1:], dtype,
                                            sharding=batch_sharding(mesh))
                    for k, (shape, dtype) in spec.items()}
  t0 = time.time()
  compiled = train_step.lower(abstract, abstract_batch).compile()
  compile_time = time.time() - t0
  length = spec['src'][0][1] if 'src' in spec else spec['inputs'][0][1]
  target_length = spec['targets'][0][1]
  step_flops = flops_per_step(cfg.model, state.params, batch=global_rows, length=length,
                              target_length=target_length)
  peak = measure_matmul_ceiling(cfg.model.dtype) * jax.device_count()
  say(f'{cfg.name}: {params_count:,} params, {step_flops / 1e9:.2f} GFLOP/step, '
      f'compiled in {compile_time:.1f}s, {jax.device_count()} device(s) '
      f'{dict(mesh.shape)}; training to step {cfg.train.steps}')

  best = meta.get('best_eval')
  last_eval = meta.get('last_eval')
  pending, window_start, window_steps = [], time.time(), 0
  tokens_seen = 0.0
  steps_run = 0
  train_time = 0.0
  progress = _progress(step, cfg.train.steps, quiet)
  while step < cfg.train.steps:
    local = next(batches)
    state, metrics = compiled(state, global_batch(local, mesh))
    step += 1
    steps_run += 1
    window_steps += 1
    pending.append(metrics)
    at_log = step % cfg.train.log_every == 0 or step == cfg.train.steps
    at_eval = step % cfg.train.eval_every == 0 or step == cfg.train.steps
    at_ckpt = step % cfg.train.checkpoint_every == 0 or step == cfg.train.steps
    if at_log or at_eval or at_ckpt:
      host = jax.device_get(pending)
      elapsed = time.time() - window_start
      train_time += elapsed
      sums = {k: sum(float(m[k]) for m in host) for k in host[0]}
      row = summarize(sums, steps=len(host))
      row['grad_norm'] = float(host[-1]['grad_norm'])
      row['learning_rate'] = float(schedule(step - 1))
      row['skipped'] = sums.get('skipped', 0.0)
      tokens = sums['weight_sum']
      tokens_seen += tokens
      row['tokens_per_s'] = tokens / max(elapsed, 1e-9)
      row['step_time_s'] = elapsed / len(host)
      row['mfu'] = step_flops / max(row['step_time_s'], 1e-9) / peak
      if at_log:
        writer.write(step, row)
      _check_finite(host, step - len(host) + 1, cfg, total_skips=state.skips)  # before saving
      progress.update(step, row)
      pending, window_start = [], time.time()
    if at_eval:
      metrics_eval = evaluate(eval_step, state.params, eval_pipe, mesh,
                              max_batches=cfg.train.eval_batches)
      last_eval = metrics_eval
      writer.write(step, metrics_eval, prefix='eval/')
      if metrics_eval and is_better(metrics_eval, best, cfg.train.best_metric):
        best = dict(metrics_eval, step=step)
      progress.note(f'step {step}: eval loss {metrics_eval.get("loss", float("nan")):.4f}'
                    + (f', bpb {metrics_eval["bits_per_byte"]:.3f}' if 'bits_per_byte' in metrics_eval else ''))
      window_start = time.time()
    preempted = guard.requested(step) and step < cfg.train.steps
    if at_ckpt or preempted:
      meta = {'best_eval': best, 'last_eval': last_eval,
              'wall_time_s': meta.get('wall_time_s', 0.0) + (time.time() - start_wall)}
      start_wall = time.time()
      ckpt.save(step, state, data_state=batches.get_state(), meta=meta,
                metrics=last_eval if at_eval else None)
      window_start = time.time()
    if preempted:
      ckpt.wait()
      progress.close()
      raise Preempted(guard.signal_name, step, workdir)
  progress.close()
  ckpt.wait()

  summary = {
      'experiment': cfg.name, 'params': params_count, 'steps': step,
      'wall_time_s': meta.get('wall_time_s', 0.0) + (time.time() - start_wall),
      'compile_time_s': compile_time, 'train_time_s': train_time,
      'tokens_per_s': tokens_seen / max(train_time, 1e-9) if tokens_seen else None,
      'flops_per_step': step_flops, 'matmul_ceiling_flops': peak,
      'eval': last_eval or {}, 'best_eval': best or {},
      'devices': jax.device_count(), 'processes': jax.process_count(),
      'skipped_updates': int(jax.device_get(state.skips)),
  }
  if steps_run and train_time:
    summary['mfu'] = steps_run / train_time * step_flops / peak
  if cfg.train.extrapolation and task.name == 'causal_lm':
    from tx.decode.evaluation import extrapolation  # pylint: disable=g-import-not-at-top
    summary['eval'] = dict(summary['eval'], **extrapolation(
        cfg, state.params, 'validation', mesh, factors=cfg.train.extrapolation,
        max_batches=cfg.train.eval_batches, tokenizer=train_pipe.tokenizer))
  if jax.process_index() == 0:
    run_dir.write_json(workdir / run_dir.SUMMARY, summary)
  return RunResult(summary=summary, state=state, config=cfg, tokenizer=train_pipe.tokenizer)


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
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
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
