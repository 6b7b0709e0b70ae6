"""`plan(cfg, mesh_sizes)`: does a configuration fit? Per-device memory and FLOPs of its training
step, compiled ahead of time on abstract inputs (the engine behind `tx plan`).

    plan(registry.get('decoder_7b'), {'fsdp': 64}, device_memory=parse_bytes('80GB'))

The step is the one `tx train` compiles for that config: the same model (model.dtype,
model.param_dtype, scan_layers, remat), optimizer state (optim.*), gradient accumulation,
steps per call (train.steps_per_call: the call's K batches and temporaries), state shardings
(mesh.rules) and batch sharding; only the inputs are `jax.ShapeDtypeStruct`s,
so nothing is allocated and no data is read (batch shapes come from `tx.data.shapes`).
It needs `data x fsdp x tensor` devices; on a laptop they are simulated CPU devices
(`tx plan` sets that up; see `tx.runs.plan_cli`).

Per device, in bytes:
  params, optimizer   sum over leaves of shard_shape x itemsize (exact, from the shardings)
  batch               the step's input batch shard
  temp                compiled.memory_analysis().temp_size_in_bytes: activations kept for
                      the backward pass, gradients, optimizer-update and collective buffers
  total               argument + output - aliased (donated state) + temp + generated code

Caveat: memory analysis is of the executable compiled for *this* backend. On simulated CPU
devices the buffer assignment is XLA CPU's (no cuDNN attention, CPU fusion decisions), so
`temp` is an estimate of a GPU/TPU run's; params / optimizer / batch are exact.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AbstractMesh, AxisType

from tx.config.base import ConfigError
from tx.config.experiment import ExperimentConfig
from tx.data.shapes import batch_shapes
from tx.data.tokenizers.byte import ByteTokenizer
from tx.models.build import build_model, count_params
from tx.tasks import make_task
from tx.train.flops import flops_per_step, mlm_head_positions
from tx.train.memory import step_bytes
from tx.train.mesh import AXES, batch_sharding, logical_rules, make_mesh, stacked_sharding
from tx.train.optimizer import run_optimizer
from tx.train.state import state_shardings
from tx.train.step import configured_train_step

GiB = 1024 ** 3
_UNITS = {'': 1, 'k': 1024, 'm': 1024 ** 2, 'g': GiB, 't': 1024 ** 4}
MAX_DEVICES = 4096  # simulated devices beyond this take minutes just to create


@dataclasses.dataclass(frozen=True)
class Plan:
  """What one training step of a config needs, per device unless named otherwise.

  Byte fields are per device. flops_model is the analytic model FLOPs of one global step
  (all devices together, 6N per token + attention, no remat recompute; `tx.train.flops`).
  flops_compiled_per_device is XLA's cost analysis of one device's program (None where the
  backend gives none): it counts remat recompute, but the body of a loop only once, so with
  scan_layers (or grad_accum_steps > 1) it is a fraction of the real count; with
  steps_per_call K > 1 it is one step's, and the batch and temporaries are those of the
  call of K steps that `tx train` compiles.
  """
  experiment: str
  mesh: dict[str, int]
  devices: int
  platform: str
  batch_size: int  # global rows per step
  seq_len: int
  target_len: int | None  # seq2seq only
  grad_accum_steps: int
  scan_layers: bool  # XLA's cost analysis counts a scanned layer once
  num_params: int
  param_bytes: int
  optimizer_bytes: int
  batch_bytes: int
  argument_bytes: int
  output_bytes: int
  alias_bytes: int
  temp_bytes: int
  code_bytes: int
  total_bytes: int
  flops_model: float
  flops_compiled_per_device: float | None
  compile_s: float
  device_memory: int | None = None
  steps_per_call: int = 1  # train.steps_per_call: batch and temporaries are the call's

  @property
  def fits(self) -> bool | None:
    """total <= device_memory (None when no device memory was given)."""
    return None if self.device_memory is None else self.total_bytes <= self.device_memory

  @property
  def headroom_bytes(self) -> int | None:
    """device_memory - total (negative: short by that much)."""
    return None if self.device_memory is None else self.device_memory - self.total_bytes

  def to_json(self) -> dict:
    """A JSON-ready dict: every field plus fits and headroom_bytes."""
    return dict(dataclasses.asdict(self), fits=self.fits, headroom_bytes=self.headroom_bytes)


def parse_mesh(text: str) -> dict[str, int]:
  """'data=2,fsdp=4,tensor=1' -> {'data': 2, 'fsdp': 4, 'tensor': 1}; missing axes are 1."""
  sizes = dict.fromkeys(AXES, 1)
  seen = set()
  for part in (p.strip() for p in (text or '').split(',')):
    m = re.fullmatch(r'(\w+)\s*=\s*(\d+)', part)
    if not m or m.group(1) not in sizes or m.group(1) in seen or int(m.group(2)) < 1:
      raise ConfigError(f'--mesh: {part!r} in {text!r} is not AXIS=SIZE with AXIS one of '
                        f'{", ".join(AXES)} (each once) and SIZE >= 1, e.g. --mesh data=2,fsdp=4')
    seen.add(m.group(1))
    sizes[m.group(1)] = int(m.group(2))
  if math.prod(sizes.values()) > MAX_DEVICES:
    raise ConfigError(f'--mesh: {text!r} asks for {math.prod(sizes.values())} devices; '
                      f'tx plan simulates at most {MAX_DEVICES}')
  return sizes


def parse_bytes(text: str) -> int:
  """'80GB' / '80GiB' / '80G' / '512MB' / '1KB' / '1024' -> bytes.

  K, M, G, T (with B or iB or nothing) are powers of 1024, the way device memory is sold
  (an '80GB' accelerator has 80 GiB); a bare number is bytes.
  """
  m = re.fullmatch(r'\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*', text or '', re.IGNORECASE)
  if not m or (not m.group(2) and (m.group(3) or '').lower() == 'ib') or float(m.group(1)) <= 0:
    raise ConfigError(f'--device-memory: {text!r} is not a size such as 80GB, 16GiB, 512MB '
                      'or a number of bytes')
  return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def with_mesh(cfg: ExperimentConfig, mesh_sizes: dict[str, int] | None) -> ExperimentConfig:
  """`cfg` with mesh.data / mesh.fsdp / mesh.tensor set from `mesh_sizes` (an axis it leaves
  out is 1); None keeps cfg.mesh."""
  if mesh_sizes is None:
    return cfg
  return cfg.replace(mesh=cfg.mesh.replace(**{**dict.fromkeys(AXES, 1), **mesh_sizes}))


def planned_vocab_size(cfg: ExperimentConfig) -> int:
  """model.vocab_size as `tx train` would resolve it from the tokenizer, without the data.

  byte: 261; bpe / unigram: data.vocab_size; char: the config's model.vocab_size (the real
  count is the number of characters in the data, known only once it is read).
  """
  if cfg.data.tokenizer == 'byte':
    return ByteTokenizer().vocab_size
  if cfg.data.tokenizer in ('bpe', 'unigram'):
    return cfg.data.vocab_size
  return cfg.model.vocab_size


def num_devices(cfg: ExperimentConfig) -> int:
  """Devices the mesh needs (mesh.* must be set, no -1)."""
  sizes = [cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor]
  if -1 in sizes:
    raise ConfigError('mesh: tx plan needs every axis size; pass --mesh data=D,fsdp=F,tensor=T')
  return math.prod(sizes)


def check(cfg: ExperimentConfig) -> ExperimentConfig:
  """The config the step is compiled for (vocabulary resolved), after the checks `tx train`
  makes before compiling that need no devices: ConfigError naming the key otherwise."""
  divisor = cfg.mesh.data * cfg.mesh.fsdp
  if cfg.train.batch_size % divisor:
    raise ConfigError(f'train.batch_size: {cfg.train.batch_size} is not divisible by the '
                      f'{divisor} data-parallel devices (mesh.data x mesh.fsdp)')
  return cfg.replace(model=cfg.model.replace(vocab_size=planned_vocab_size(cfg)))


def shard_bytes(tree) -> int:
  """Bytes of one device's shards of a tree of sharded ShapeDtypeStructs / arrays."""
  total = 0
  for leaf in jax.tree_util.tree_leaves(tree):
    shape = leaf.sharding.shard_shape(tuple(leaf.shape))
    total += math.prod(shape) * np.dtype(leaf.dtype).itemsize
  return total


def _cost_flops(compiled) -> float | None:
  try:
    cost = compiled.cost_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else None
  flops = (cost or {}).get('flops')
  return float(flops) if flops is not None and flops >= 0 else None


def abstract_state(cfg: ExperimentConfig, mesh=None):
  """(abstract TrainState with shardings, sharding tree) of `cfg` on `mesh`, no devices needed.

  mesh: a Mesh, or None for an `AbstractMesh` of cfg.mesh's sizes (nothing touches a JAX
  backend then, so a parameter dimension the mesh does not divide is found in microseconds).
  Raises ConfigError for such a dimension, as `tx train` does.
  """
  model_cfg = cfg.model
  if mesh is None:
    sizes = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    mesh = AbstractMesh(sizes, AXES, axis_types=(AxisType.Auto,) * len(AXES))
    if model_cfg.attention_impl == 'auto':  # 'auto' asks the backend; shapes do not depend on it
      model_cfg = model_cfg.replace(attention_impl='xla')
  optimizer, _ = run_optimizer(cfg)
  rules = logical_rules(cfg.mesh)
  with nn.logical_axis_rules(rules):
    return state_shardings(build_model(model_cfg), optimizer, model_cfg, mesh, rules,
                           cfg.train.seed)


def plan(cfg: ExperimentConfig, mesh_sizes: dict[str, int] | None = None,
         device_memory: int | None = None) -> Plan:
  """Compiles `cfg`'s training step on abstract inputs and reads its memory and FLOPs.

  Args:
    cfg: a validated experiment config.
    mesh_sizes: {'data': D, 'fsdp': F, 'tensor': T} replacing mesh.* (a missing axis is 1;
      None: cfg.mesh as it is, without -1).
    device_memory: bytes per device to compare the total against (None: no verdict).
  Needs at least D x F x T devices of one platform (the first D x F x T are used). A config
  `tx train` would refuse (a batch or parameter dimension the mesh does not divide) raises
  ConfigError before anything is compiled.
  """
  cfg = check(with_mesh(cfg, mesh_sizes))
  n = num_devices(cfg)
  abstract_state(cfg)  # the shape errors, before devices are asked for
  if jax.device_count() < n:
    raise ConfigError(f'mesh: {n} devices needed, {jax.device_count()} present; run '
                      '`tx plan`, which simulates them, or set XLA_FLAGS='
                      f'--xla_force_host_platform_device_count={n} before JAX starts')
  mesh = make_mesh(cfg.mesh, jax.devices()[:n])
  task = make_task(cfg)
  model = build_model(cfg.model)
  optimizer, _ = run_optimizer(cfg)
  rules = logical_rules(cfg.mesh)
  spec = batch_shapes(cfg.data, task.name, cfg.train.batch_size)
  # As in tx.train.loop: shardings, step and lowering under the mesh and the logical rules.
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract, shardings = state_shardings(model, optimizer, cfg.model, mesh, rules,
                                          cfg.train.seed)
    per_call = cfg.train.per_call  # K steps in one call take K batches, [K, B, ...]
    train_step = configured_train_step(cfg, model, task, optimizer, shardings,
                                       batch_sharding(mesh), steps_per_call=per_call)
    sharding = stacked_sharding(batch_sharding(mesh)) if per_call > 1 else batch_sharding(mesh)
    stack = (per_call,) if per_call > 1 else ()
    batch = {k: jax.ShapeDtypeStruct(stack + tuple(shape), dtype, sharding=sharding)
             for k, (shape, dtype) in spec.items()}
    t0 = time.perf_counter()
    compiled = train_step.lower(abstract, batch).compile()
    compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  arg, out = mem.argument_size_in_bytes, mem.output_size_in_bytes
  alias, temp = mem.alias_size_in_bytes, mem.temp_size_in_bytes
  code = getattr(mem, 'generated_code_size_in_bytes', 0) or 0
  seq2seq = task.name == 'seq2seq'
  flops = flops_per_step(cfg.model, abstract.params, batch=cfg.train.batch_size,
                         length=cfg.data.seq_len,
                         target_length=cfg.data.target_len if seq2seq else None,
                         head_positions=mlm_head_positions(cfg))
  return Plan(
      experiment=cfg.name, mesh=dict(mesh.shape), devices=n, platform=jax.devices()[0].platform,
      batch_size=cfg.train.batch_size, seq_len=cfg.data.seq_len,
      target_len=cfg.data.target_len if seq2seq else None,
      grad_accum_steps=cfg.optim.grad_accum_steps, scan_layers=cfg.model.scan_layers,
      num_params=count_params(abstract.params), param_bytes=shard_bytes(abstract.params),
      optimizer_bytes=shard_bytes(abstract.opt_state), batch_bytes=shard_bytes(batch),
      argument_bytes=arg, output_bytes=out, alias_bytes=alias, temp_bytes=temp, code_bytes=code,
      total_bytes=step_bytes(mem), flops_model=flops,
      flops_compiled_per_device=_cost_flops(compiled), compile_s=compile_s,
      device_memory=device_memory, steps_per_call=per_call)
