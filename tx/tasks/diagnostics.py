"""Stability diagnostics from one forward pass (Wortsman et al. 2023's two instabilities).

Output-logit divergence shows in the log-softmax normaliser log Z drifting away from 0 and
in the logits' size; attention-logit growth in the largest pre-softmax score. These
functions turn what the training forward pass already produced into sums and maxima that
combine exactly across micro-batches (`combine`): *_sum keys add, *_max keys take the max.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LOGIT_MAX = 'attn_logit_max'  # the name attention layers sow their maximum score under


def output_logit_stats(logits_BLV, weights_BL) -> dict[str, jax.Array]:
  """Sums and maxima of the output logits over the real target tokens (weights > 0).

  Returns float32 scalars: 'logits_max' (max logit), 'log_z_sum' (sum of w·logsumexp),
  'logits_sq_sum' (sum of w·mean over V of logit²). Divide the sums by the weight sum for
  log_z_mean and logits_rms² (see `finish`).
  """
  logits = logits_BLV.astype(jnp.float32)
  w = weights_BL.astype(jnp.float32)
  real = w > 0
  lse_BL = jax.nn.logsumexp(logits, axis=-1)
  return {
      'logits_max': jnp.max(jnp.where(real, jnp.max(logits, axis=-1), -jnp.inf)),
      'log_z_sum': jnp.sum(lse_BL * w),
      'logits_sq_sum': jnp.sum(jnp.mean(jnp.square(logits), axis=-1) * w),
  }


def _layer_names(paths: list[tuple[str, ...]]) -> list[str]:
  stacks = {p[0] for p in paths}
  return ['' if len(stacks) == 1 else f'{p[0]}_' for p in paths]


def attention_logit_maxima(sown) -> dict[str, jax.Array]:
  """{'attn_logit_max/layer_<i>_max': max score of layer i} from the 'diagnostics'
  collection (self- and cross-attention of a layer together; encoder-decoder models name
  them encoder_layer_<i> / decoder_layer_<i>). Scanned stacks sow one [num_layers] array.
  """
  found = []
  for path, x in jax.tree_util.tree_flatten_with_path(sown)[0]:
    names = tuple(str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path)
    if LOGIT_MAX not in names:
      continue
    stack = names[0]
    layer = next((n for n in names if n.startswith('layer_')), None)
    if layer is not None:  # unrolled: one scalar per layer
      found.append(((stack,), int(layer[len('layer_'):]), jnp.max(x)))
    else:  # scanned: [num_layers, ...] (sow's tuple index comes after the layer axis)
      per_layer = jnp.max(x.reshape(x.shape[0], -1), axis=1)
      found.extend(((stack,), i, per_layer[i]) for i in range(x.shape[0]))
  prefixes = _layer_names([s for s, _, _ in found])
  out: dict[str, jax.Array] = {}
  for prefix, (_, i, v) in zip(prefixes, found):
    key = f'{LOGIT_MAX}/{prefix}layer_{i}_max'
    out[key] = jnp.maximum(out[key], v) if key in out else v.astype(jnp.float32)
  return out


def combine(a: dict, b: dict) -> dict:
  """Two micro-batches' diagnostics as one: *_max keys by maximum, the rest by sum."""
  return {k: jnp.maximum(a[k], b[k]) if k.endswith('_max') else a[k] + b[k] for k in a}


def finish(diag: dict, weight_total) -> dict[str, jax.Array]:
  """The logged values: logits_max, logits_rms, log_z_mean, attn_logit_max (over layers)
  and attn_logit_max/layer_<i>."""
  w = jnp.maximum(weight_total, 1.0)
  out = {'logits_max': diag['logits_max'],
         'logits_rms': jnp.sqrt(diag['logits_sq_sum'] / w),
         'log_z_mean': diag['log_z_sum'] / w}
  layers = {k[:-len('_max')]: v for k, v in diag.items() if k.startswith(LOGIT_MAX + '/')}
  out.update(layers)
  if layers:
    out[LOGIT_MAX] = jnp.max(jnp.stack(list(layers.values())))
  return out
