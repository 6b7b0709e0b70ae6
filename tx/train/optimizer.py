"""The optimizer of a run, built from `optim.*`: clipping, optimizer, schedule, decay mask.

    optimizer, schedule = make_optimizer(cfg.optim, total_steps=cfg.train.steps,
                                         d_model=cfg.model.d_model)
    opt_state = optimizer.init(nn.unbox(params))
    lr_of_update_n = schedule(n)  # n = 0 for the first update

Everything except the 2017 paper's inverse-square-root schedule is optax's own.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from tx.config.optim import OptimConfig

NORM_LEAVES = ('scale', 'bias')
EMBEDDING_LEAVES = ('embedding', 'token_type_embedding', 'rel_embedding')
MOE_BIAS_LEAVES = ('bi', 'bi_0', 'bi_1', 'bo')  # per-expert biases of tx.layers.moe


def learning_rate_schedule(cfg: OptimConfig, *, total_steps: int, d_model: int) -> optax.Schedule:
  """The learning rate as a function of the optimizer's update count (0 = first update).

  constant / cosine / linear: linear warmup from 0 to `learning_rate` over `warmup_steps`,
  then constant, or a cosine / linear decay reaching `min_learning_rate` at `decay_steps`
  (default `total_steps`) and held after. If the run is shorter than the warmup
  (`total_steps` <= `warmup_steps`, e.g. a smoke test), it simply ends while warming up.
  inverse_sqrt: `learning_rate * d_model^-0.5 * min(s^-0.5, s * warmup_steps^-1.5)` with the
  paper's step s = update count + 1; `decay_steps` and `min_learning_rate` are unused.
  """
  peak, warmup = cfg.learning_rate, cfg.warmup_steps
  if cfg.schedule == 'inverse_sqrt':
    return functools.partial(_inverse_sqrt, scale=peak * d_model ** -0.5, warmup=warmup)
  if cfg.schedule == 'constant':
    return _warmup_then(optax.constant_schedule(peak), peak, warmup)
  decay_steps = cfg.decay_steps or max(total_steps, warmup + 1)
  if cfg.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, decay_steps,
                                              end_value=cfg.min_learning_rate)
  decay = optax.linear_schedule(peak, cfg.min_learning_rate, decay_steps - warmup)
  return _warmup_then(decay, peak, warmup)


def _warmup_then(schedule: optax.Schedule, peak: float, warmup: int) -> optax.Schedule:
  """Linear 0 -> peak over `warmup` updates, then `schedule` (restarted at 0)."""
  if warmup <= 0:
    return schedule
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), schedule], [warmup])


def _inverse_sqrt(count, *, scale: float, warmup: int):
  """Vaswani et al. 2017, eq. 3; the optax count 0 is the paper's step 1 (no 0^-0.5)."""
  step = jnp.asarray(count, jnp.float32) + 1.0
  return scale * jnp.minimum(jax.lax.rsqrt(step), step * warmup ** -1.5)


def weight_decay_mask(params, cfg: OptimConfig):
  """A tree of bools like `params` (boxed or unboxed): True where weight decay applies.

  Decided by each leaf's path in tx's naming: norm modules are `norm` or `*_norm` (leaves
  `scale`, `bias`; `decay_norms`), biases are leaves named `bias` and the MoE expert biases
  `bi*` / `bo` (`decay_biases`), embedding tables are leaves named `embedding`,
  `token_type_embedding` or `rel_embedding` (`decay_embeddings`). Everything else decays.
  """
  def decays(path, _):
    # Boxed params (nn.LogicallyPartitioned) add a `.value` step; only dict keys name things.
    names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
    leaf = names[-1] if names else ''
    parent = names[-2] if len(names) > 1 else ''
    if leaf in NORM_LEAVES and (parent == 'norm' or parent.endswith('_norm')):
      return cfg.decay_norms
    if leaf == 'bias' or (parent == 'moe' and leaf in MOE_BIAS_LEAVES):
      return cfg.decay_biases
    if leaf in EMBEDDING_LEAVES:
      return cfg.decay_embeddings
    return True

  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(cfg: OptimConfig, *, total_steps: int,
                   d_model: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, schedule): global-norm clipping (if `clip_norm`), then the optimizer.

  total_steps: optimizer updates in the run (train.steps; one update per step whatever
  grad_accum_steps is). d_model: used by the inverse_sqrt schedule only. The weight-decay
  mask is computed from the params given to `optimizer.init` / `update`, so it always has
  their tree structure.
  """
  schedule = learning_rate_schedule(cfg, total_steps=total_steps, d_model=d_model)
  mask = functools.partial(weight_decay_mask, cfg=cfg)
  wd = cfg.weight_decay
  if cfg.name == 'adamw':
    opt = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=wd, mask=mask)
  elif cfg.name == 'adam':
    opt = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
  elif cfg.name == 'adafactor':
    # optax's adafactor adds weight_decay_rate * param unscaled; scaling it by the schedule
    # makes it decoupled decay as in adamw (lr(t) * weight_decay * param).
    decay = (lambda count: wd * schedule(count)) if wd else None
    opt = optax.adafactor(schedule, weight_decay_rate=decay, weight_decay_mask=mask)
  elif cfg.name == 'sgd':
    opt = optax.sgd(schedule, momentum=cfg.b1 or None)
    if wd:
      # After sgd the update is already -lr * g, so decoupled decay adds -lr(t) * wd * param.
      opt = optax.chain(opt, optax.add_decayed_weights(lambda count: -wd * schedule(count), mask))
  else:  # unreachable: OptimConfig validates the name
    raise ValueError(f'optim.name: unknown optimizer {cfg.name!r}')
  clip = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm else []
  return optax.chain(*clip, opt), schedule
