"""`train.*`, `task.*`, `mesh.*` and `decode.*` keys."""

from __future__ import annotations

from tx.config.base import choice, config, fail


@config
class TrainConfig:
  """The run: steps, global batch, seed, evaluation, logging and checkpoint cadence."""
  PREFIX = 'train.'
  steps: int = 1000
  batch_size: int = 32  # global batch (all processes together)
  seed: int = 0
  eval_every: int = 200
  eval_batches: int | None = 20  # None = the whole validation split
  log_every: int = 50
  checkpoint_every: int = 500
  keep_checkpoints: int = 2  # the latest N (the best is kept as well)
  # At the end, average the parameters of the last N checkpoints (multiples of
  # checkpoint_every, and the last step) into <workdir>/average and evaluate it; 0 = off.
  average_last: int = 0
  async_checkpoint: bool = True
  best_metric: str = 'loss'  # eval metric tracked as best-so-far (lower is better)
  # causal LM: at the end, eval perplexity at k x data.seq_len
  extrapolation: tuple[float, ...] = ()
  sample_every: int = 0  # print a sample every N steps (0 = only at the end, LMs only)
  sample_tokens: int = 128
  nan_policy: str = choice('stop', 'skip')  # skip = drop the update, up to max_skips times
  max_skips: int = 10
  # Stability diagnostics (diag/* in metrics.jsonl): attention-logit and output-logit
  # maxima, log Z, per-group gradient norms and update/parameter RMS ratios.
  diagnostics: bool = True
  # Before the first step, refuse a step whose compiled memory exceeds the device's (or, on
  # CPU, the host's); tx.train.memory.
  memory_check: bool = True
  # Training steps per compiled call (a scan over that many batches, each its own update):
  # the call's scratch buffer is allocated once for all of them. On the CPU, where glibc maps
  # a large buffer afresh on every call, 4 saved the encoder ~0.3 s of page faults a step
  # (benchmarks/NOTES.md, attempt 51). Logging, evaluation and checkpoints still happen at
  # their steps (single steps run up to each). None: 1, unless `tx tune` chose more for this
  # host and step.
  steps_per_call: int | None = None

  @property
  def per_call(self) -> int:
    """The training steps of one compiled call: steps_per_call, None counting as 1."""
    return 1 if self.steps_per_call is None else self.steps_per_call

  def validate(self):
    for name in ('steps', 'batch_size', 'log_every', 'checkpoint_every', 'keep_checkpoints',
                 'eval_every'):
      if getattr(self, name) <= 0:
        fail(f'train.{name}', f'must be > 0, got {getattr(self, name)}')
    if self.per_call <= 0:
      fail('train.steps_per_call', f'must be > 0 (or None: 1 unless `tx tune` chose more), got '
           f'{self.steps_per_call}')
    if self.average_last < 0:
      fail('train.average_last', f'must be >= 0 (0 = off), got {self.average_last}')
    if self.average_last > self.keep_checkpoints:
      fail('train.average_last', f'averages {self.average_last} checkpoints but only '
           f'train.keep_checkpoints={self.keep_checkpoints} are kept; set keep_checkpoints >= '
           f'{self.average_last}')
    if self.eval_batches is not None and self.eval_batches <= 0:
      fail('train.eval_batches', f'must be > 0 or None (whole split), got {self.eval_batches}')
    if any(k <= 0 for k in self.extrapolation):
      fail('train.extrapolation', f'factors must be > 0, e.g. (1, 2, 4); got {self.extrapolation}')
    if self.sample_every < 0 or self.sample_tokens < 0 or self.max_skips < 0:
      fail('train.sample_every', 'sample_every, sample_tokens and max_skips must be >= 0')


@config
class TaskConfig:
  """The objective; 'auto' picks it from the model family."""
  PREFIX = 'task.'
  name: str = choice('auto', 'causal_lm', 'mlm', 'seq2seq')
  label_smoothing: float = 0.0
  z_loss: float = 0.0  # weight of log(Z)^2 (PaLM's z-loss)

  def validate(self):
    if not 0 <= self.label_smoothing < 1:
      fail('task.label_smoothing', f'must be in [0, 1), got {self.label_smoothing}')
    if self.z_loss < 0:
      fail('task.z_loss', f'must be >= 0, got {self.z_loss}')


DEFAULT_RULES = (
    ('batch', ('data', 'fsdp')),
    ('embed', 'fsdp'),
    ('heads', 'tensor'),
    ('kv_heads', 'tensor'),
    ('mlp', 'tensor'),
    ('vocab', 'tensor'),
    ('expert', None),
    ('layers', None),
    ('length', None),
    ('kv', None),
)


@config
class MeshConfig:
  """Device mesh axes (-1 = the rest of the devices) and logical-axis -> mesh-axis rules."""
  PREFIX = 'mesh.'
  data: int = -1
  fsdp: int = 1
  tensor: int = 1
  rules: tuple[tuple[str, str | tuple[str, ...] | None], ...] = DEFAULT_RULES

  def validate(self):
    sizes = {'data': self.data, 'fsdp': self.fsdp, 'tensor': self.tensor}
    if sum(v == -1 for v in sizes.values()) > 1:
      fail('mesh.data', 'at most one of mesh.data, mesh.fsdp, mesh.tensor may be -1')
    for name, v in sizes.items():
      if v == 0 or v < -1:
        fail(f'mesh.{name}', f'must be a positive size or -1 (the rest), got {v}')
    axes = {'data', 'fsdp', 'tensor'}
    for logical, mesh_axes in self.rules:
      named = (mesh_axes,) if isinstance(mesh_axes, str) else (mesh_axes or ())
      for a in named:
        if a not in axes:
          fail('mesh.rules',
               f'rule for {logical!r} names mesh axis {a!r}; use data, fsdp or tensor')


@config
class DecodeConfig:
  """Generation settings shared by decoder-only and encoder-decoder models."""
  PREFIX = 'decode.'
  strategy: str = choice('greedy', 'sample', 'beam')
  temperature: float = 1.0
  top_k: int = 0  # 0 = off
  top_p: float = 1.0  # 1.0 = off
  beam_size: int = 4
  length_penalty: float = 0.6  # alpha of ((5 + len) / 6) ** alpha
  max_len: int = 128  # new tokens at most
  seed: int = 0

  def validate(self):
    if self.temperature <= 0:
      fail('decode.temperature',
           f'must be > 0 (use strategy=greedy for argmax), got {self.temperature}')
    if self.top_k < 0:
      fail('decode.top_k', f'must be >= 0 (0 = off), got {self.top_k}')
    if not 0 < self.top_p <= 1:
      fail('decode.top_p', f'must be in (0, 1], got {self.top_p}')
    if self.beam_size < 1:
      fail('decode.beam_size', f'must be >= 1, got {self.beam_size}')
    if self.max_len < 1:
      fail('decode.max_len', f'must be >= 1, got {self.max_len}')
