"""Token-level losses and metrics, always in float32.

Per-token values come back unreduced ([B, L]); reduce them with
`weighted_mean(values, weights)` where weights are 0 at padding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def softmax_cross_entropy(logits_BLV, labels_BL, *, label_smoothing=0.0, z_loss=0.0):
  """Cross-entropy of integer labels -> (loss_BL float32, z_loss_BL float32).

  logits [B, L, V] (any float dtype, computed in float32 via log_softmax);
  labels [B, L] int in [0, V) (give padding any valid id, e.g. 0, and weight 0).
  Label smoothing α uses the optax / PyTorch targets (1-α)·onehot + α/V.
  z_loss > 0 adds z_loss · logsumexp(logits)² to loss_BL (PaLM); z_loss_BL is
  that term alone (zeros when z_loss == 0), for logging.
  """
  logits_BLV = jnp.asarray(logits_BLV)
  labels_BL = jnp.asarray(labels_BL)
  if labels_BL.shape != logits_BLV.shape[:-1]:
    raise ValueError(f'labels_BL shape {labels_BL.shape} must equal logits shape without '
                     f'the vocab axis {logits_BLV.shape[:-1]}')
  if not 0.0 <= label_smoothing < 1.0:
    raise ValueError(f'label_smoothing must be in [0, 1), got {label_smoothing}')
  logits_BLV = logits_BLV.astype(jnp.float32)
  lse_BL = jax.nn.logsumexp(logits_BLV, axis=-1)
  log_probs_BLV = logits_BLV - lse_BL[..., None]
  nll_BL = -jnp.take_along_axis(log_probs_BLV, labels_BL[..., None].astype(jnp.int32),
                                axis=-1)[..., 0]
  loss_BL = nll_BL
  if label_smoothing > 0.0:
    uniform_BL = -jnp.mean(log_probs_BLV, axis=-1)
    loss_BL = (1.0 - label_smoothing) * nll_BL + label_smoothing * uniform_BL
  z_loss_BL = z_loss * jnp.square(lse_BL) if z_loss > 0.0 else jnp.zeros_like(lse_BL)
  return loss_BL + z_loss_BL, z_loss_BL


def weighted_mean(values, weights=None):
  """Scalar float32: sum(values · weights) / max(sum(weights), 1e-8).

  weights broadcast to values' shape; None gives the plain mean.
  """
  values = jnp.asarray(values, jnp.float32)
  if weights is None:
    return jnp.mean(values)
  weights = jnp.broadcast_to(jnp.asarray(weights, jnp.float32), values.shape)
  return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1e-8)


def token_accuracy(logits_BLV, labels_BL, weights_BL=None):
  """(correct_sum, weight_sum) float32 scalars: weighted count of argmax == label (a
  label tied for the maximum logit counts as correct).

  Return sums, not a ratio, so they add up across batches and devices.
  """
  logits_BLV = jnp.asarray(logits_BLV)
  labels_BL = jnp.asarray(labels_BL)
  if labels_BL.shape != logits_BLV.shape[:-1]:
    raise ValueError(f'labels_BL shape {labels_BL.shape} must equal logits shape without '
                     f'the vocab axis {logits_BLV.shape[:-1]}')
  # The label's logit against the row's maximum instead of argmax == label: the same count
  # except on exact ties, and a max reduction instead of argmax's (value, index) one,
  # which on CPU costs as much as the whole cross-entropy over a large vocabulary.
  label_logit_BL = jnp.take_along_axis(logits_BLV, labels_BL[..., None].astype(jnp.int32),
                                       axis=-1)[..., 0]
  correct_BL = (label_logit_BL >= jnp.max(logits_BLV, axis=-1)).astype(jnp.float32)
  if weights_BL is None:
    weights_BL = jnp.ones_like(correct_BL)
  weights_BL = jnp.broadcast_to(jnp.asarray(weights_BL, jnp.float32), correct_BL.shape)
  return jnp.sum(correct_BL * weights_BL), jnp.sum(weights_BL)
