"""The measuring process's side of `tx tune` (tx/runs/tune.py runs these as its workers): an
experiment's training step compiled as `tx train` compiles it, fed synthetic batches of its
shapes, and timed, alone (`time_step`) or beside its steps-per-call twin on one shared state
(`time_twins`). Also the way in for scripts that time or profile a step as the tune does
(tx/bench/profile.py, benchmarks/step_faults.py)."""

from __future__ import annotations

import os
import statistics
import time

TWIN_BLOCKS = 2  # blocks of alternating order in which `time_twins` times each variant


def compiled_step(spec: dict, state=None):
  """(compiled training call, initial state, synthetic batch, cfg, compile seconds) of
  spec['config'] (an ExperimentConfig as a dict) with spec['model_overrides'] and
  spec['train_overrides'] applied, on this process's first device: the step `tx train`
  compiles (train.steps_per_call steps per call, batches [K, B, ...]), fed synthetic batches
  of its shapes. `state`: a training state of the same model to use instead of a new one."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from tx.config.base import from_dict  # pylint: disable=g-import-not-at-top
  from tx.config.experiment import ExperimentConfig  # pylint: disable=g-import-not-at-top
  from tx.data.shapes import batch_shapes  # pylint: disable=g-import-not-at-top
  from tx.models.build import build_model  # pylint: disable=g-import-not-at-top
  from tx.train.optimizer import run_optimizer  # pylint: disable=g-import-not-at-top
  from tx.tasks import make_task  # pylint: disable=g-import-not-at-top
  from tx.train.mesh import (  # pylint: disable=g-import-not-at-top
      batch_sharding, logical_rules, make_mesh, stacked_sharding)
  from tx.train.state import init_state, state_shardings  # pylint: disable=g-import-not-at-top
  from tx.train.step import configured_train_step  # pylint: disable=g-import-not-at-top
  cfg = from_dict(ExperimentConfig, spec['config'])
  cfg = cfg.replace(model=cfg.model.replace(**spec.get('model_overrides', {})),
                    train=cfg.train.replace(**spec.get('train_overrides', {})))
  task, model = make_task(cfg), build_model(cfg.model)
  optimizer, _ = run_optimizer(cfg)
  mesh, rules = make_mesh(cfg.mesh, jax.devices()[:1]), logical_rules(cfg.mesh)
  rng = np.random.default_rng(0)
  batch = {}
  for key, (shape, dtype) in batch_shapes(cfg.data, task.name, cfg.train.batch_size).items():
    if key.endswith('segment_ids'):
      batch[key] = np.ones(shape, dtype)
    elif key.endswith('positions'):
      batch[key] = np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
    elif np.issubdtype(dtype, np.floating):
      batch[key] = np.ones(shape, dtype)
    else:
      batch[key] = rng.integers(3, cfg.model.vocab_size, shape).astype(dtype)
  per_call = cfg.train.per_call  # timed per step: a call's time / per_call
  if per_call > 1:
    batch = {k: np.stack([v] * per_call) for k, v in batch.items()}
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract, shardings = state_shardings(model, optimizer, cfg.model, mesh, rules, 0)
    step = configured_train_step(cfg, model, task, optimizer, shardings, batch_sharding(mesh),
                                 steps_per_call=per_call)
    batch = jax.device_put(batch, stacked_sharding(batch_sharding(mesh)) if per_call > 1
                           else batch_sharding(mesh))
    start = time.perf_counter()
    compiled = step.lower(abstract, batch).compile()
    compile_s = time.perf_counter() - start
    if state is None:
      state = init_state(model, optimizer, cfg.model, shardings, seed=0)
  return compiled, state, batch, cfg, compile_s


def time_step(spec: dict) -> dict:
  """Worker (run in its own process by `tune`): compiles spec['config']'s training step
  (`compiled_step`) and times it on synthetic batches of its shapes. Returns step_time_s
  (median over the calls that make spec['steps'] timed steps, after those that make
  spec['warmup'], at least one, as `time_twins` has: a program's first call pays for its
  buffers; a call of K steps counts as K steps of a K-th of its time),
  step_time_min_s, step_times_s (every timed call's), compile_s, platform, attention_impl,
  matmul_impl, norm_impl (after spec['model_overrides']), steps_per_call (after
  spec['train_overrides']), xla_flags, pid (the measuring process)."""
  compiled, state, batch, cfg, compile_s = compiled_step(spec)
  per_call = cfg.train.per_call
  state, _ = _timed_calls(compiled, state, batch, per_call,
                          max(1, _calls(spec['warmup'], per_call)))
  _, times = _timed_calls(compiled, state, batch, per_call, _calls(spec['steps'], per_call))
  return _timing(times, compile_s, cfg)


def time_twins(spec: dict) -> dict:
  """Worker (run in its own process by `tune`): `time_step`'s measurement of one model
  setting's step under each of spec['train_variants'] (train overrides: steps per call),
  compiled in this one process on one shared training state and timed in turn, so that
  their comparison is free of the drift between processes. They are timed in TWIN_BLOCKS
  blocks of alternating order: per block, untimed calls (the switch from the other program,
  whose first call pays for its scratch buffer again; in the first block those that make
  spec['warmup'] steps, at least one) and then its share of spec['steps']. Only the twins
  share a process: with more programs in it, a step's scratch buffer is served otherwise
  than in a training process (benchmarks/NOTES.md, attempt 80). Returns {'variants':
  [`time_step`'s result per variant, in order]}."""
  steps, state = [], None
  for train in spec['train_variants']:
    compiled, state, batch, cfg, compile_s = compiled_step(dict(spec, train_overrides=train),
                                                           state)
    steps.append({'call': compiled, 'batch': batch, 'cfg': cfg, 'compile_s': compile_s,
                  'per_call': cfg.train.per_call, 'times': []})

  def run(step, calls):
    nonlocal state
    state, times = _timed_calls(step['call'], state, step['batch'], step['per_call'], calls)
    return times

  for block in range(TWIN_BLOCKS):
    for step in steps if block % 2 == 0 else steps[::-1]:
      # untimed: the switch from the other program, in the first block with the warmup
      run(step, max(1, _calls(spec['warmup'], step['per_call'])) if block == 0 else 1)
      step['times'] += run(step, -(-_calls(spec['steps'], step['per_call']) // TWIN_BLOCKS))
  return {'variants': [_timing(s['times'], s['compile_s'], s['cfg']) for s in steps]}


def _calls(steps: int, per_call: int) -> int:
  """Calls of `per_call` steps that make at least `steps` steps."""
  return -(-steps // per_call)


def _timed_calls(compiled, state, batch, per_call: int, calls: int):
  """(state after `calls` calls of `compiled`, each call's seconds per step)."""
  import jax  # pylint: disable=g-import-not-at-top
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready(metrics)
    times.append((time.perf_counter() - start) / per_call)
  return state, times


def _timing(times: list[float], compile_s: float, cfg) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  return {'step_time_s': statistics.median(times), 'step_time_min_s': min(times),
          'step_times_s': times, 'compile_s': compile_s, 'platform': jax.devices()[0].platform,
          'attention_impl': cfg.model.attention_impl, 'matmul_impl': cfg.model.matmul_impl,
          'norm_impl': cfg.model.norm_impl,
          'steps_per_call': cfg.train.per_call, 'xla_flags': os.environ.get('XLA_FLAGS', ''),
          'pid': os.getpid()}
