"""The jitted training and evaluation steps.

One code path for 1 CPU, 8 simulated devices, a GPU/TPU host and many hosts: `jax.jit`
with explicit in/out shardings over the mesh (no pmap). The state is donated.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from tx.tasks.base import Task
from tx.train.state import TrainState

STEP_METRICS = ('loss_sum', 'nll_sum', 'z_loss_sum', 'weight_sum', 'correct_sum',
                'aux_loss_sum', 'examples')


def _split_micro(batch, n: int):
  """[B, ...] -> [n, B/n, ...] for every array of the batch."""
  return jax.tree_util.tree_map(lambda x: x.reshape((n, x.shape[0] // n) + x.shape[1:]), batch)


def make_train_step(model, task: Task, optimizer: optax.GradientTransformation, *,
                    accum_steps: int = 1, skip_nonfinite: bool = False, dropout: bool = True):
  """Returns step(state, batch) -> (state, metrics) (not jitted; see `jit_train_step`).

  Gradient accumulation scans over `accum_steps` micro-batches; the loss is normalised by
  the real target tokens of the whole batch, so it equals the one-shot gradient.
  metrics: the task's sums plus grad_norm, finite (1/0) and skipped.
  """
  def loss_fn(params, batch, rng, weight_total):
    rngs = {'dropout': rng} if dropout else None
    return task.loss(model, params, batch, deterministic=not dropout, rngs=rngs,
                     weight_total=weight_total, aux_scale=1.0 / accum_steps)

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
        return (jax.tree_util.tree_map(jnp.add, grads_acc, grads),
                jax.tree_util.tree_map(jnp.add, sums_acc, sums)), None
      zeros_g = jax.tree_util.tree_map(jnp.zeros_like, state.params)
      zeros_s = {k: jnp.zeros((), jnp.float32) for k in STEP_METRICS}
      (grads, sums), _ = jax.lax.scan(
          micro, (zeros_g, zeros_s), (_split_micro(batch, accum_steps), jnp.arange(accum_steps)))
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
    metrics = dict(sums, grad_norm=grad_norm, finite=finite.astype(jnp.float32),
                   skipped=skipped.astype(jnp.float32))
    return new, metrics

  return step


def jit_train_step(step_fn, state_shardings, batch_sharding):
  """jit with explicit shardings; the old state's buffers are donated."""
  return jax.jit(step_fn, in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, None), donate_argnums=(0,))


def configured_train_step(cfg, model, task: Task, optimizer: optax.GradientTransformation,
                          state_shardings, batch_sharding):
  """`jit_train_step` of the step `cfg` (an ExperimentConfig) describes: its gradient
  accumulation, its non-finite policy, dropout when the model has any. `tx train` and
  `tx plan` build their step here, so the plan compiles what training runs."""
  dropout = cfg.model.dropout > 0 or cfg.model.attention_dropout > 0
  step_fn = make_train_step(model, task, optimizer, accum_steps=cfg.optim.grad_accum_steps,
                            skip_nonfinite=cfg.train.nan_policy == 'skip', dropout=dropout)
  return jit_train_step(step_fn, state_shardings, batch_sharding)


def make_eval_step(model, task: Task):
  """eval(params, batch) -> metric sums (deterministic: no dropout)."""
  def eval_step(params, batch):
    logits, aux = task.logits(model, params, batch, deterministic=True)
    return task.metric_sums(logits, batch, aux)
  return eval_step
