"""`OptimConfig`: the `optim.*` keys (optimizer, learning-rate schedule, clipping, decay).

Presets for the reference runs:

    nanoGPT shakespeare_char: name='adamw', learning_rate=1e-3, b2=0.99, weight_decay=0.1,
        schedule='cosine', warmup_steps=100, decay_steps=2000, min_learning_rate=1e-4
    Vaswani et al. 2017:      name='adam', learning_rate=1.0, b1=0.9, b2=0.98, eps=1e-9,
        schedule='inverse_sqrt', warmup_steps=4000, clip_norm=None

Unsupported combinations (each rejected with a message naming the field):
- `weight_decay` > 0 with `name='adam'` (use adamw for decoupled decay);
- `schedule='inverse_sqrt'` with `warmup_steps=0` (the formula peaks at step = warmup);
- `decay_steps` <= `warmup_steps` for the decaying schedules (cosine, linear);
- `min_learning_rate` above `learning_rate` for cosine / linear.

`tx.train.optimizer.make_optimizer` turns this config into an optax transformation.
"""

from __future__ import annotations

from tx.config.base import choice, config, fail

OPTIMIZERS = ('adamw', 'adam', 'adafactor', 'sgd', 'muon')
SCHEDULES = ('constant', 'cosine', 'inverse_sqrt', 'linear')


@config
class OptimConfig:
  """Optimizer and learning-rate schedule of a run (see the module docstring for presets)."""
  PREFIX = 'optim.'
  name: str = choice(*OPTIMIZERS)  # muon: Muon on hidden kernels, AdamW on the rest
  # Peak LR; for schedule='inverse_sqrt' a multiplier on d_model^-0.5 * min(...) (1.0 = the paper).
  learning_rate: float = 1e-3
  b1: float = 0.9  # adam/adamw first moment; sgd momentum (0 = none); unused by adafactor
  b2: float = 0.999  # adam/adamw second moment; unused by sgd and adafactor
  eps: float = 1e-8  # adam/adamw; unused by sgd and adafactor
  weight_decay: float = 0.0  # decoupled (AdamW style: lr(t) * weight_decay * param)
  schedule: str = choice(*SCHEDULES, default='cosine')
  warmup_steps: int = 0  # linear warmup from 0 (inverse_sqrt: the paper's warmup)
  decay_steps: int | None = None  # step where cosine/linear reach the floor; None = train.steps
  min_learning_rate: float = 0.0  # floor of the cosine / linear decay
  clip_norm: float | None = 1.0  # global-norm gradient clipping; None or 0 = off
  grad_accum_steps: int = 1  # micro-batches per update (the training step splits the batch)
  decay_norms: bool = False  # weight decay on norm scales and biases
  decay_biases: bool = False  # weight decay on bias vectors
  decay_embeddings: bool = False  # weight decay on embedding tables
  # True: each step decays by weight_decay * param * lr(t) / peak lr, not by lr(t) *
  # weight_decay * param, so the decay stays fixed while an LR sweep varies the rate
  # (Wortsman et al. 2023's independent decay).
  independent_weight_decay: bool = False

  def validate(self):
    if self.learning_rate <= 0:
      fail('optim.learning_rate', f'must be > 0, got {self.learning_rate}')
    for name in ('b1', 'b2'):
      if not 0 <= getattr(self, name) < 1:
        fail(f'optim.{name}', f'must be in [0, 1), got {getattr(self, name)}')
    if self.eps <= 0:
      fail('optim.eps', f'must be > 0, got {self.eps}')
    if self.weight_decay < 0:
      fail('optim.weight_decay', f'must be >= 0, got {self.weight_decay}')
    if self.name == 'adam' and self.weight_decay > 0:
      fail('optim.weight_decay', f'adam has no weight decay (got {self.weight_decay}); '
           'use optim.name=adamw for decoupled decay or set optim.weight_decay=0')
    if self.warmup_steps < 0:
      fail('optim.warmup_steps', f'must be >= 0, got {self.warmup_steps}')
    if self.schedule == 'inverse_sqrt' and self.warmup_steps <= 0:
      fail('optim.warmup_steps', 'schedule=inverse_sqrt needs warmup_steps > 0 '
           f'(the paper uses 4000), got {self.warmup_steps}')
    if self.decay_steps is not None:
      if self.decay_steps <= 0:
        fail('optim.decay_steps', f'must be > 0 or None (= train.steps), got {self.decay_steps}')
      if self.schedule in ('cosine', 'linear') and self.decay_steps <= self.warmup_steps:
        fail('optim.decay_steps', f'{self.decay_steps} must be > optim.warmup_steps='
             f'{self.warmup_steps} for schedule={self.schedule}')
    if self.min_learning_rate < 0:
      fail('optim.min_learning_rate', f'must be >= 0, got {self.min_learning_rate}')
    if self.schedule in ('cosine', 'linear') and self.min_learning_rate > self.learning_rate:
      fail('optim.min_learning_rate', f'{self.min_learning_rate} is above optim.learning_rate='
           f'{self.learning_rate}')
    if self.clip_norm is not None and self.clip_norm < 0:
      fail('optim.clip_norm', f'must be > 0, or 0 / None for no clipping, got {self.clip_norm}')
    if self.grad_accum_steps < 1:
      fail('optim.grad_accum_steps', f'must be >= 1, got {self.grad_accum_steps}')
