"""`tx plan EXPERIMENT --mesh data=D,fsdp=F,tensor=T [--set ...] [--device-memory 80GB] [--json F]`.

Prints per-device memory (parameters, optimizer state, batch, temporaries, total), FLOPs per
step and compile time of the config's training step, compiled ahead of time for D x F x T
simulated CPU devices (`tx.runs.plan`), and whether it fits --device-memory.

Simulated devices: XLA reads the CPU device count once, when JAX starts its backend.
`tx plan` from a shell sets it before anything touches the backend (importing tx does not).
Where this process's backend is already up with too few CPU devices (tx.cli.main called from
a notebook or a test), the plan runs in a child `python -m tx plan ...` with the count set,
and its output is passed on. Every user error (--mesh, --device-memory, --set, a dimension the
mesh does not divide, a batch the data axes do not divide) is found before that, with no
devices and no compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tx import compat
from tx.config.base import ConfigError, parse_overrides
from tx.runs import plan as planning

CHILD_ENV = 'TX_PLAN_CHILD'  # set in the re-executed child: it must not re-execute again
_FORCE = '--xla_force_host_platform_device_count'


def backend_started() -> bool:
  """True once JAX has created its backends (from then on the device count is fixed)."""
  return compat.backends_started()


def xla_flags(n: int, flags: str = '') -> str:
  """XLA_FLAGS with the simulated CPU device count set to `n` (any earlier count dropped)."""
  kept = [f for f in flags.split() if not f.startswith(_FORCE)]
  return ' '.join(kept + [f'{_FORCE}={n}'])


def ensure_devices(n: int) -> bool:
  """Asks for `n` simulated CPU devices if JAX's backend has not started yet.

  Returns True when this process can compile for `n` devices (CPU platform, at least `n`
  devices: set up now or already there), False when its backend runs with something else.
  """
  # start-up: `tx plan` sets XLA_FLAGS before JAX loads
  import jax  # pylint: disable=g-import-not-at-top
  if not backend_started():
    os.environ['XLA_FLAGS'] = xla_flags(n, os.environ.get('XLA_FLAGS', ''))
    jax.config.update('jax_platforms', 'cpu')
    jax.config.update('jax_num_cpu_devices', n)
  return jax.default_backend() == 'cpu' and jax.device_count() >= n


def child_argv(args) -> list[str]:
  """`tx plan` arguments reproducing `args` (for the child process)."""
  argv = ['plan', args.experiment, '--mesh', args.mesh]
  for source in getattr(args, 'experiments', None) or ():
    argv += ['--experiments', str(Path(source).resolve()) if source.endswith('.py') else source]
  if args.set:
    argv += ['--set', *args.set]
  if args.device_memory:
    argv += ['--device-memory', args.device_memory]
  if args.json:
    argv += ['--json', args.json]
  return argv


def run_child(args, n: int) -> int:
  """Runs the plan in `python -m tx plan ...` with `n` simulated devices; passes its output on."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', **{CHILD_ENV: '1'})
  env['XLA_FLAGS'] = xla_flags(n, env.get('XLA_FLAGS', ''))
  root = str(Path(__file__).resolve().parents[2])  # the directory holding tx/
  env['PYTHONPATH'] = os.pathsep.join([root, env.get('PYTHONPATH', '')]).rstrip(os.pathsep)
  done = subprocess.run([sys.executable, '-m', 'tx', *child_argv(args)], env=env,
                        capture_output=True, text=True, check=False)
  sys.stdout.write(done.stdout)
  sys.stderr.write(done.stderr)
  return done.returncode


def _size(b: int | float) -> str:
  text = f'{b / planning.GiB:8.2f} GiB'
  return text + (f'  ({b / 2 ** 20:,.1f} MiB)' if abs(b) < 0.1 * planning.GiB else '')


def _count(n: int) -> str:
  return f'{n / 1e9:.2f} B' if n >= 1e9 else f'{n / 1e6:.2f} M'


def format_plan(p: planning.Plan) -> str:
  """The human-readable table `tx plan` prints (GiB per device, one quantity a line)."""
  mesh = ' '.join(f'{k}={v}' for k, v in p.mesh.items())
  shards = p.mesh['data'] * p.mesh['fsdp']
  length = f'{p.seq_len}' + (f' (source) / {p.target_len} (target)' if p.target_len else '')
  compiled = ('n/a' if p.flops_compiled_per_device is None
              else f'{p.flops_compiled_per_device:.3g} compiled per device (XLA cost analysis'
              + ('; counts a scanned layer once)' if p.scan_layers or p.grad_accum_steps > 1
                 else ')'))
  lines = [
      f'{p.experiment}: {p.devices} simulated {p.platform} device(s), mesh {mesh}',
      f'  parameters          {p.num_params:,} ({_count(p.num_params)})',
      f'  batch               {p.batch_size} x {length} tokens per step, '
      f'{p.batch_size // shards} rows per data shard, grad accum {p.grad_accum_steps}'
      + (f", {p.steps_per_call} steps per call (batch and temporaries: the call's)"
         if p.steps_per_call > 1 else ''),
      '  per device:',
      f'    parameters        {_size(p.param_bytes)}',
      f'    optimizer state   {_size(p.optimizer_bytes)}',
      f'    batch             {_size(p.batch_bytes)}',
      f'    temporaries       {_size(p.temp_bytes)}   activations, gradients, update buffers',
      f'    total             {_size(p.total_bytes)}   '
      f'arguments {p.argument_bytes / planning.GiB:.2f}'
      f' + outputs {p.output_bytes / planning.GiB:.2f} - donated {p.alias_bytes / planning.GiB:.2f}'
      f' + temporaries {p.temp_bytes / planning.GiB:.2f} + code {p.code_bytes / planning.GiB:.2f}',
      f'  FLOPs per step      {p.flops_model:.3g} model (all devices, analytic); {compiled}',
      f'  compile             {p.compile_s:.1f} s',
  ]
  if p.device_memory is not None:
    room = p.headroom_bytes / planning.GiB
    verdict = (f'yes, {room:.2f} GiB headroom' if p.fits
               else f'NO, {-room:.2f} GiB short')
    lines.append(f'  fits {p.device_memory / planning.GiB:.2f} GiB?'.ljust(22) + verdict)
  return '\n'.join(lines)


def cli(args, resolve) -> int:
  """`tx plan`: user errors (ConfigError) before any device or compile; 0 when planned.

  resolve: (experiment name, overrides) -> ExperimentConfig (`tx.registry.get`).
  """
  sizes = planning.parse_mesh(args.mesh)
  memory = planning.parse_bytes(args.device_memory) if args.device_memory else None
  if args.json and not Path(args.json).resolve().parent.is_dir():
    raise ConfigError(f'--json: the folder of {args.json} does not exist')
  cfg = planning.with_mesh(resolve(args.experiment, parse_overrides(args.set)), sizes)
  n = planning.num_devices(cfg)
  planning.abstract_state(planning.check(cfg))  # shape errors, with no backend
  if not ensure_devices(n):
    if os.environ.get(CHILD_ENV):
      raise ConfigError(f'mesh: could not get {n} simulated CPU devices in this process')
    return run_child(args, n)
  result = planning.plan(cfg, None, memory)
  print(format_plan(result))
  if args.json:
    Path(args.json).write_text(json.dumps(result.to_json(), indent=2) + '\n')
  return 0
