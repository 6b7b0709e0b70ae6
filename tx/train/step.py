"""The jitted training and evaluation steps.

One code path for 1 CPU, 8 simulated devices, a GPU/TPU host and many hosts: `jax.jit`
with explicit in/out shardings over the mesh (no pmap). The state is donated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from tx.tasks import diagnostics as diag_lib
from tx.tasks.base import Task
from tx.train import param_groups
from tx.train.mesh import stacked_sharding
from tx.train.state import TrainState


def _split_micro(batch, n: int):
  """[B, ...] -> [n, B/n, ...] for every array of the batch."""
  return jax.tree_util.tree_map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)


def make_train_step(model, task: Task, optimizer: optax.GradientTransformation, *,
                    accum_steps: int = 1, skip_nonfinite: bool = False, dropout: bool = True,
                    diagnostics: bool = False):
  """Returns step(state, batch) -> (state, metrics) (not jitted; see `jit_train_step`).

  Gradient accumulation scans over `accum_steps` micro-batches; the loss is normalised by
  the real target tokens of the whole batch, so it equals the one-shot gradient.
  metrics: the task's sums plus grad_norm, finite (1/0) and skipped; with `diagnostics`,
  metrics['diag'] holds this step's stability diagnostics (`step_diagnostics`).
  """
  def loss_fn(params, batch, rng, weight_total):
    rngs = {'dropout': rng} if dropout else None
    return task.loss(model, params, batch, deterministic=not dropout, rngs=rngs,
                     weight_total=weight_total, aux_scale=1.0 / accum_steps,
                     diagnostics=diagnostics)

  def add(a, b):
    out = jax.tree_util.tree_map(jnp.add, {k: v for k, v in a.items() if k != 'diag'},
                                 {k: v for k, v in b.items() if k != 'diag'})
    if 'diag' in a:
      out['diag'] = diag_lib.combine(a['diag'], b['diag'])
    return out

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(state: TrainState, batch):
    rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
    _, weights = task.targets(batch)
    weight_total = jnp.maximum(jnp.sum(weights.astype(jnp.float32)), 1.0)
    if accum_steps == 1:
      (_, sums), grads = grad_fn(state.params, batch, rng, weight_total)
    else:
      def micro(carry, xs):
        grads_acc, sums_acc = carry
        mb, i = xs
        (_, sums), grads = grad_fn(state.params, mb, jax.random.fold_in(rng, i), weight_total)
        return (jax.tree_util.tree_map(jnp.add, grads_acc, grads), add(sums_acc, sums)), None
      micro_batches = _split_micro(batch, accum_steps)
      first = jax.tree_util.tree_map(lambda x: x[0], micro_batches)
      sums_shape = jax.eval_shape(lambda: grad_fn(state.params, first, rng, weight_total)[0][1])
      zeros_g = jax.tree_util.tree_map(jnp.zeros_like, state.params)
      zeros_s = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), sums_shape)
      if diagnostics:  # maxima start below any value
        zeros_s['diag'] = {k: jnp.full((), -jnp.inf, jnp.float32) if k.endswith('_max') else v
                           for k, v in zeros_s['diag'].items()}
      (grads, sums), _ = jax.lax.scan(
          micro, (zeros_g, zeros_s), (micro_batches, jnp.arange(accum_steps)))
    grad_norm = optax.tree.norm(grads)
    loss = sums['loss_sum'] / weight_total + sums['aux_loss_sum'] / accum_steps
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
    skipped = jnp.zeros((), jnp.int32)
    if skip_nonfinite:
      keep_old = lambda old, upd: jnp.where(finite, upd, old)
      new = new.replace(params=jax.tree_util.tree_map(keep_old, state.params, params),
                        opt_state=jax.tree_util.tree_map(keep_old, state.opt_state, opt_state))
      skipped = (~finite).astype(jnp.int32)
      new = new.replace(skips=state.skips + skipped)
    diag = sums.pop('diag', None)
    metrics = dict(sums, grad_norm=grad_norm, finite=finite.astype(jnp.float32),
                   skipped=skipped.astype(jnp.float32))
    if diagnostics:
      metrics['diag'] = step_diagnostics(diag, weight_total, grads, updates, state.params)
    return new, metrics

  return step


def step_diagnostics(diag_sums: dict, weight_total, grads, updates, params) -> dict:
  """The logged diagnostics of one step (float32 scalars, keys without the 'diag/' prefix):
  logits_max, logits_rms, log_z_mean, attn_logit_max[/layer_<i>] (tx.tasks.diagnostics),
  and per parameter group (tx.train.param_groups) grad_norm/<group> and
  update_rms_ratio/<group> = RMS(update) / RMS(parameter before the update)."""
  out = diag_lib.finish(diag_sums, weight_total)
  g2, u2, p2 = (param_groups.sums_of_squares(t) for t in (grads, updates, params))
  for group in g2:
    out[f'grad_norm/{group}'] = jnp.sqrt(g2[group])
    out[f'update_rms_ratio/{group}'] = jnp.sqrt(u2[group] / jnp.maximum(p2[group], 1e-30))
  return out


def jit_train_step(step_fn, state_shardings, batch_sharding):
  """jit with explicit shardings; the old state's buffers are donated."""
  return jax.jit(step_fn, in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, None), donate_argnums=(0,))


def configured_train_step(cfg, model, task: Task, optimizer: optax.GradientTransformation,
                          state_shardings, batch_sharding, steps_per_call: int = 1):
  """`jit_train_step` of the step `cfg` (an ExperimentConfig) describes: its gradient
  accumulation, its non-finite policy, dropout when the model has any. `tx train` and
  `tx plan` build their step here, so the plan compiles what training runs.
  steps_per_call K > 1: `consecutive_steps` of it, batches [K, B, ...] (batch_sharding's
  spec behind a leading unsplit axis), metrics [K] each."""
  dropout = cfg.model.dropout > 0 or cfg.model.attention_dropout > 0
  step_fn = make_train_step(model, task, optimizer, accum_steps=cfg.optim.grad_accum_steps,
                            skip_nonfinite=cfg.train.nan_policy == 'skip', dropout=dropout,
                            diagnostics=cfg.train.diagnostics)
  if steps_per_call > 1:
    step_fn, batch_sharding = consecutive_steps(step_fn), stacked_sharding(batch_sharding)
  return jit_train_step(step_fn, state_shardings, batch_sharding)


def consecutive_steps(step_fn):
  """steps(state, batches [K, B, ...]) -> (state after K updates, metrics [K, ...]): `step_fn`
  on each batch in turn, in one compiled loop (its scratch memory allocated once)."""
  return lambda state, batches: jax.lax.scan(step_fn, state, batches)


def make_eval_step(model, task: Task):
  """eval(params, batch) -> metric sums (deterministic: no dropout)."""
  def eval_step(params, batch):
    logits, aux = task.logits(model, params, batch, deterministic=True)
    return task.metric_sums(logits, batch, aux)
  return eval_step
