"""The optimizer of a run, built from `optim.*`: clipping, optimizer, schedule, decay mask.

    optimizer, schedule = make_optimizer(cfg.optim, total_steps=cfg.train.steps,
                                         d_model=cfg.model.d_model, model=cfg.model)
    opt_state = optimizer.init(nn.unbox(params))
    lr_of_update_n = schedule(n)  # n = 0 for the first update

    clip -> optimizer (coupled decay inside) -> μP multipliers -> independent decay

`model` is needed for μP's per-parameter rates (tx/train/mup.py: the table); the μP stage
keeps the optimizer state's structure, so a plan or restore built without it still matches.
optim.name=muon: optax's Muon on the hidden kernels (attention q/k/v/out, FFN and MoE expert
weights), Adam on everything else, one schedule, one decay mask.
Everything except the 2017 paper's inverse-square-root schedule is optax's own.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, scale_by_muon

from tx.config.model import ModelConfig
from tx.config.optim import OptimConfig
from tx.train import mup
from tx.train.param_groups import group_of, path_names

NORM_LEAVES = ('scale', 'bias')
EMBEDDING_LEAVES = ('embedding', 'token_type_embedding', 'rel_embedding')
MOE_BIAS_LEAVES = ('bi', 'bi_0', 'bi_1', 'bo')  # per-expert biases of tx.layers.moe
MOE_KERNEL_LEAVES = ('wi', 'wi_0', 'wi_1', 'wo')  # per-expert [E, in, out] kernels
MUON_RMS = 0.2  # muon's update x 0.2 sqrt(max(fan_in, fan_out)): Adam-like RMS (Liu et al. 2025)


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


def peak_learning_rate(cfg: OptimConfig, d_model: int) -> float:
  """The schedule's maximum (inverse_sqrt: at step = warmup_steps)."""
  if cfg.schedule == 'inverse_sqrt':
    return cfg.learning_rate * d_model ** -0.5 * cfg.warmup_steps ** -0.5
  return cfg.learning_rate


def muon_dimension_numbers(names: tuple[str, ...], ndim: int) -> MuonDimensionNumbers | None:
  """How muon sees the parameter at `names` as a matrix [fan_in, fan_out], or None (Adam).

  Muon takes the hidden kernels of groups attention and ffn: q/k/v [D, H, Dh] as
  [D, H·Dh], out [H, Dh, D] as [H·Dh, D], FFN [D, F] / [F, D], MoE experts [E, D, F] as
  E matrices; a scanned stack's leading layer axis is a batch axis too. Biases, norms,
  embeddings, the MoE router and the heads stay with Adam.
  """
  leaf = names[-1] if names else ''
  parent = names[-2] if len(names) > 1 else ''
  if ndim < 2 or group_of(names) not in ('attention', 'ffn'):
    return None
  o = 1 if 'layers' in names else 0  # nn.scan's stacked layer axis
  if parent == 'moe' and leaf in MOE_KERNEL_LEAVES:
    o += 1
  elif leaf != 'kernel' or parent == 'router':
    return None
  in_dims = 2 if parent == 'out' else 1
  return MuonDimensionNumbers(reduction_axis=tuple(range(o, o + in_dims)),
                              output_axis=tuple(range(o + in_dims, ndim)))


def _dims_tree(tree):
  return jax.tree_util.tree_map_with_path(
      lambda p, x: muon_dimension_numbers(path_names(p), x.ndim), tree)


def muon_mask(params):
  """A tree of bools like `params`: True where muon (not Adam) updates the leaf."""
  return jax.tree_util.tree_map_with_path(
      lambda p, x: muon_dimension_numbers(path_names(p), x.ndim) is not None, params)


def _scale_muon_rms():
  """Muon's orthogonalised update x MUON_RMS sqrt(max(fan_in, fan_out)), so its RMS is
  about MUON_RMS whatever the shape, as Adam's: one learning rate serves both."""
  def update(updates, state, params=None):
    del params
    def scale(path, u):
      d = muon_dimension_numbers(path_names(path), u.ndim)
      fan_in = math.prod(u.shape[a] for a in d.reduction_axis)
      fan_out = math.prod(u.shape[a] for a in d.output_axis)
      return u * (MUON_RMS * max(fan_in, fan_out) ** 0.5)
    return jax.tree_util.tree_map_with_path(scale, updates), state
  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def _muon_direction(cfg: OptimConfig) -> optax.GradientTransformation:
  """The unscaled step direction: muon (Nesterov momentum 0.95, 5 Newton-Schulz steps) on
  the hidden kernels, Adam (b1, b2, eps) on the rest."""
  labels = lambda params: jax.tree_util.tree_map(lambda m: 'muon' if m else 'adam',
                                                 muon_mask(params))
  return optax.partition({
      'muon': optax.chain(scale_by_muon(eps=cfg.eps, weight_dimension_numbers=_dims_tree),
                          _scale_muon_rms()),
      'adam': optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps),
  }, labels)


def scale_by_multipliers(inner: optax.GradientTransformation,
                         multipliers) -> optax.GradientTransformation:
  """`inner`, its updates then multiplied leaf-wise by `multipliers(updates)` (a tree of
  Python floats). The state is `inner`'s own, so the structure does not change."""
  def update(updates, state, params=None, **extra):
    updates, state = inner.update(updates, state, params, **extra)
    return jax.tree_util.tree_map(lambda u, k: u if k == 1.0 else u * k, updates,
                                  multipliers(updates)), state
  return optax.GradientTransformationExtraArgs(inner.init, update)


def make_optimizer(cfg: OptimConfig, *, total_steps: int, d_model: int,
                   model: ModelConfig | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """(optimizer, schedule): global-norm clipping (if `clip_norm`), then the optimizer.

  total_steps: optimizer updates in the run (train.steps; one update per step whatever
  grad_accum_steps is). d_model: used by the inverse_sqrt schedule and independent decay's
  peak. model: the model config; under model.parametrization=mup its per-parameter μP
  learning-rate multipliers (tx/train/mup.py) scale each update; None = no multipliers.
  The weight-decay mask is computed from the params given to `optimizer.init` / `update`,
  so it always has their tree structure.
  """
  schedule = learning_rate_schedule(cfg, total_steps=total_steps, d_model=d_model)
  mask = functools.partial(weight_decay_mask, cfg=cfg)
  independent = cfg.independent_weight_decay and cfg.weight_decay > 0
  coupled = 0.0 if cfg.independent_weight_decay else cfg.weight_decay
  scaled = lambda opt: opt
  if model is not None and model.width_mult != 1.0:
    def multipliers(updates):
      is_muon = muon_mask(updates) if cfg.name == 'muon' else None
      return mup.lr_multipliers(updates, model, cfg.name, is_muon)
    scaled = lambda opt: scale_by_multipliers(opt, multipliers)
  opt = _optimizer(cfg, schedule, mask, coupled, scaled)
  if independent:
    # After the optimizer the update already points downhill: add -wd * lr(t)/peak * param.
    peak, wd = peak_learning_rate(cfg, d_model), cfg.weight_decay
    opt = optax.chain(opt, optax.add_decayed_weights(
        lambda count: -wd * schedule(count) / peak, mask))
  clip = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm else []
  return optax.chain(*clip, opt), schedule


def _optimizer(cfg: OptimConfig, schedule, mask, wd: float, scaled) -> optax.GradientTransformation:
  """The optimizer with coupled decay `wd` (lr(t) * wd * param); `scaled` wraps the part
  the μP multipliers apply to."""
  if cfg.name == 'adamw':
    return scaled(optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=wd,
                              mask=mask))
  if cfg.name == 'adam':
    return scaled(optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps))
  if cfg.name == 'adafactor':
    # optax's adafactor adds weight_decay_rate * param unscaled; scaling it by the schedule
    # makes it decoupled decay as in adamw (lr(t) * weight_decay * param).
    decay = (lambda count: wd * schedule(count)) if wd else None
    return scaled(optax.adafactor(schedule, weight_decay_rate=decay, weight_decay_mask=mask))
  if cfg.name == 'sgd':
    opt = scaled(optax.sgd(schedule, momentum=cfg.b1 or None))
    if wd:
      # After sgd the update is already -lr * g, so decoupled decay adds -lr(t) * wd * param
      # (outside the μP multipliers: MuSGD keeps lr * weight_decay fixed).
      opt = optax.chain(opt, optax.add_decayed_weights(lambda count: -wd * schedule(count), mask))
    return opt
  if cfg.name == 'muon':
    decay = [optax.add_decayed_weights(wd, mask)] if wd else []
    return scaled(optax.chain(_muon_direction(cfg), *decay,
                              optax.scale_by_learning_rate(schedule)))
  raise ValueError(f'optim.name: unknown optimizer {cfg.name!r}')  # OptimConfig validates it


def run_optimizer(cfg) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """`make_optimizer` as a run of ExperimentConfig `cfg` uses it (train.steps updates; the
  model config for muP's per-group rates): one place for training, restoring and planning."""
  return make_optimizer(cfg.optim, total_steps=cfg.train.steps, d_model=cfg.model.d_model,
                        model=cfg.model)
