"""Cost of train.diagnostics: the training step with and without it, side by side.

    .venv/bin/python benchmarks/diagnostics_cost.py [--rounds 3] [--only SHAPE ...]
    taskset -c 0,1 .venv/bin/python benchmarks/diagnostics_cost.py \\
        --only bert_6l_torch_kernels_4_per_call

Two shapes of its own: nanoGPT's CPU baby GPT (4 layers, d 128, context 64, batch 12) and
the 6-layer GPT of `tx bench` (d 384, context 256, batch 64, scanned, remat dots_no_batch).
Any other name is a `tx bench` training case, compiled as `tx tune` times it (the step `tx
train` runs, its steps per call included). Each round times both steps (alternating, median
of N calls each), so machine noise hits both; the ratio is what to read. Prints the host's
CPU model with the numbers.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

from tx.config import DataConfig
from tx.config.experiment import ExperimentConfig
from tx.config.model import ModelConfig
from tx.config.optim import OptimConfig
from tx.config.train import TrainConfig
from tx.models.build import build_model, init_params
from tx.tasks import make_task
from tx.train.optimizer import make_optimizer
from tx.train.state import TrainState
from tx.train.step import make_train_step

SHAPES = {
    'gpt_baby': (dict(num_layers=4, num_heads=4, d_model=128, d_ff=512), 64, 12, 20),
    'gpt_6l': (dict(num_layers=6, num_heads=6, d_model=384, d_ff=1536, scan_layers=True,
                    remat='dots_no_batch'), 256, 64, 3),
}


def cpu_model() -> str:
  try:
    out = subprocess.run(['lscpu'], capture_output=True, text=True, check=True).stdout
    return next(l.split(':', 1)[1].strip() for l in out.splitlines() if 'Model name' in l)
  except (OSError, subprocess.CalledProcessError, StopIteration):
    return platform.processor() or 'unknown'


def make_case(case: str, diagnostics: bool):
  """A `tx bench` training case's step with train.diagnostics set: (step, state, batch,
  calls to time)."""
  from tx.bench.cases import SUITE  # pylint: disable=g-import-not-at-top
  from tx.bench.tuned import step_config  # pylint: disable=g-import-not-at-top
  from tx.config.base import to_dict  # pylint: disable=g-import-not-at-top
  from tx.runs import tune, tune_step  # pylint: disable=g-import-not-at-top
  spec = next((c.spec for c in SUITE if c.name == case), None)
  if spec is None:
    raise SystemExit(f'unknown shape or case {case!r}: pick one of {", ".join(SHAPES)} or a '
                     '`tx bench` training case (python -m tx bench --help)')
  cfg = tune.one_device_config(step_config(spec))
  compiled, state, batch, _, _ = tune_step.compiled_step(
      {'config': to_dict(cfg), 'train_overrides': {'diagnostics': diagnostics}})
  state, m = compiled(state, batch)  # the first call: buffers, caches
  jax.block_until_ready(m)
  return compiled, state, batch, 3


def make(shape: str, diagnostics: bool):
  if shape not in SHAPES:
    return make_case(shape, diagnostics)
  kw, ctx, batch, steps = SHAPES[shape]
  model_cfg = ModelConfig(family='decoder', vocab_size=65, max_len=ctx, position='learned', **kw)
  cfg = ExperimentConfig(model=model_cfg, optim=OptimConfig(name='adamw', learning_rate=1e-3),
                         train=TrainConfig(diagnostics=diagnostics),
                         data=DataConfig(seq_len=ctx))
  model = build_model(model_cfg)
  optimizer, _ = make_optimizer(cfg.optim, total_steps=100, d_model=model_cfg.d_model)
  params = nn.unbox(init_params(model_cfg, jax.random.key(0), batch=1, length=ctx))
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                     opt_state=optimizer.init(params),
                     rng=jax.random.key_data(jax.random.key(1)), skips=jnp.zeros((), jnp.int32))
  step = jax.jit(make_train_step(model, make_task(cfg), optimizer, dropout=False,
                                 diagnostics=diagnostics), donate_argnums=(0,))
  tokens = jax.random.randint(jax.random.key(2), (batch, ctx), 1, 65, jnp.int32)
  data = {'inputs': tokens, 'targets': tokens, 'weights': jnp.ones((batch, ctx), jnp.float32)}
  state, m = step(state, data)  # compile
  jax.block_until_ready(m)
  return step, state, data, steps


def timed(step, state, data, steps):
  times = []
  for _ in range(steps):
    t0 = time.perf_counter()
    state, m = step(state, data)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t0)
  return state, statistics.median(times)


def main():
  p = argparse.ArgumentParser()
  p.add_argument('--rounds', type=int, default=3)
  p.add_argument('--only', nargs='*', default=list(SHAPES))
  args = p.parse_args()
  from tx import malloc_tuning  # pylint: disable=g-import-not-at-top
  malloc_tuning.reexec_tuned()  # tx's glibc tunables, as `tx bench` and `tx train` run with
  print(f'host: {cpu_model()}, {jax.device_count()} device(s), jax {jax.__version__}')
  for shape in args.only:
    off, on = make(shape, False), make(shape, True)
    s_off, s_on = off[1], on[1]
    ratios = []
    for r in range(args.rounds):
      s_off, t_off = timed(off[0], s_off, off[2], off[3])
      s_on, t_on = timed(on[0], s_on, on[2], on[3])
      ratios.append(t_on / t_off)
      print(f'{shape} round {r + 1}: off {t_off * 1e3:.1f} ms, on {t_on * 1e3:.1f} ms, '
            f'on/off {t_on / t_off:.3f}', flush=True)
    print(f'{shape}: median on/off {statistics.median(ratios):.3f} over {args.rounds} rounds')


if __name__ == '__main__':
  main()
