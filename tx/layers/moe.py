"""Mixture-of-Experts feed-forward layer (top-k softmax router, stacked experts).

    y_BLD = Σ_k gate_k · expert_{e_k}(x_BLD)      (only the top-k experts of a token)

Routing. A bias-free float32 router gives logits [B, L, E]; softmax probabilities;
each token picks its top-k experts (`jax.lax.top_k`, ties to the lower index).
Gates: with top_k > 1 the k probabilities are renormalised to sum to 1 (Mixtral,
GShard top-2); with top_k == 1 the gate is the raw probability (Switch), because a
renormalised single gate is constantly 1 and the router would then learn from the
auxiliary loss alone.

Two dispatch paths, both static-shaped (jit / nn.scan / nn.remat safe):

- capacity_factor > 0, "capacity" path. Groups are the batch rows (G = B, S = L),
  so routing never mixes sequences: results do not depend on the rest of the batch
  and shard along 'batch' without communication. Every expert takes at most
  C = min(S, ceil(capacity_factor · top_k · S / E)) assignments per group, in token
  order: the (token, choice) pairs of a row are ranked token-major (token t's k
  choices before token t+1's), so a token's fate depends only on earlier tokens of
  its own sequence (decoders stay causal). Assignments past C are dropped: they
  contribute zero, the residual connection outside carries the token. One-token
  decode steps (L = 1) never drop, so a full-sequence pass and step-by-step
  decoding differ where training dropped; capacity_factor 0 removes the gap. Dispatch is
  by indices, not one-hot tensors: slot ids [G, S, K] gather tokens into a buffer
  [G, E, C, D], experts run as einsums, a second gather brings outputs back.
  Memory: buffer + hidden ≈ capacity_factor · top_k · T · (D + F) plus int32
  bookkeeping [T, K, E]; no [T, E, C] dispatch/combine tensor (GShard's is
  quadratic in the group size).
- capacity_factor == 0, "dropless" path. All T·K assignments are sorted by expert
  and run through `jax.lax.ragged_dot` (MegaBlocks-style grouped matmul): FLOPs and
  memory ∝ T · top_k on GPU/TPU. On CPU, XLA lowers ragged_dot as a masked dense
  matmul costing E× the FLOPs: fine for tests, slow for big E.

Padding (valid_BL False) is not routed: it takes no capacity, is left out of the
auxiliary losses and metrics, and its output is exactly zero (so x + y keeps x).

Losses (float32 scalars, already weighted) in the 'losses' collection, summed
across calls: 'moe_aux_loss' = aux_loss_weight · E · Σ_e f_e · P_e (Switch form;
f_e = fraction of the top-k assignments that chose e, counted before capacity
drops, Σ_e f_e = 1; P_e = mean router probability of e; both over valid tokens) and,
when router_z_loss_weight > 0, 'moe_z_loss' = weight · mean(logsumexp(logits)²).
Metrics in 'metrics' (overwritten per call): 'moe_dropped_fraction' (dropped /
routed assignments) and 'moe_expert_load' [E] (fraction of routed assignments per
expert, before drops). Both collections are only recorded when mutable:

    y, state = model.apply({'params': params}, x, mutable=['losses', 'metrics'])
    loss = task_loss + total_aux_loss(state)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from tx.config.base import config, fail
from tx.config.choices import DTYPES, FFN_ACTIVATIONS
from tx.layers.common import activation, constrain, dense_layer, dtype, partitioned

ACTIVATIONS = FFN_ACTIVATIONS  # the old name here


@config
class MoELayerConfig:
  """Config of one `MoEFeedForward` (the layer-level view of `model.moe.*`)."""
  PREFIX = 'MoELayerConfig.'
  d_model: int
  d_ff: int  # hidden size of each expert
  activation: str  # one of FFN_ACTIVATIONS; the gated ones have two input projections
  num_experts: int
  top_k: int = 2
  capacity_factor: float = 1.25  # 0 = dropless (ragged_dot path)
  aux_loss_weight: float = 0.01
  router_z_loss_weight: float = 0.0
  use_bias: bool = False
  dropout: float = 0.0  # on the expert hidden activations
  dtype: str = 'float32'  # compute dtype
  param_dtype: str = 'float32'

  def validate(self):
    p = self.PREFIX
    for name in ('d_model', 'd_ff', 'num_experts'):
      if getattr(self, name) <= 0:
        fail(p + name, f'must be > 0, got {getattr(self, name)}')
    if self.activation not in FFN_ACTIVATIONS:
      fail(p + 'activation',
           f'{self.activation!r} is not one of {", ".join(FFN_ACTIVATIONS)}')
    if not 1 <= self.top_k <= self.num_experts:
      fail(p + 'top_k', f'must be between 1 and num_experts={self.num_experts}, got {self.top_k}')
    if self.capacity_factor < 0:
      fail(p + 'capacity_factor', f'must be >= 0 (0 = dropless), got {self.capacity_factor}')
    if not 0 <= self.dropout < 1:
      fail(p + 'dropout', f'must be in [0, 1), got {self.dropout}')
    for name in ('dtype', 'param_dtype'):
      if getattr(self, name) not in DTYPES:
        fail(p + name, f'{getattr(self, name)!r} is not one of {", ".join(DTYPES)}')

  @property
  def gated(self) -> bool:
    return FFN_ACTIVATIONS[self.activation].gated


def expert_capacity(cfg: MoELayerConfig, group_size: int) -> int:
  """C = min(S, ceil(capacity_factor · top_k · S / E)), at least 1; S if dropless."""
  if cfg.capacity_factor == 0:
    return group_size
  c = math.ceil(cfg.capacity_factor * cfg.top_k * group_size / cfg.num_experts)
  return max(1, min(group_size, c))


def top_k_gates(logits_GSE, top_k: int):
  """Router softmax and top-k choice.

  logits [G, S, E] -> (probs [G, S, E] f32, gates [G, S, K] f32, experts [G, S, K]
  int32), K = top_k, experts in decreasing probability. Gates renormalised to sum
  to 1 when K > 1; the raw probability when K == 1 (see module docstring).
  """
  probs_GSE = jax.nn.softmax(logits_GSE.astype(jnp.float32), axis=-1)
  gates_GSK, experts_GSK = jax.lax.top_k(probs_GSE, top_k)
  if top_k > 1:
    gates_GSK = gates_GSK / jnp.sum(gates_GSK, axis=-1, keepdims=True)
  return probs_GSE, gates_GSK, experts_GSK.astype(jnp.int32)


def assign_slots(experts_GSK, valid_GS, num_experts: int, capacity: int):
  """Position of every (token, choice) in its expert's buffer, token-major priority.

  experts [G, S, K] int; valid [G, S] bool. Returns (position [G, S, K] int32:
  how many earlier valid assignments of the same group chose the same expert;
  keep [G, S, K] bool: valid and position < capacity).
  """
  G, S, K = experts_GSK.shape
  routed_GA = jnp.broadcast_to(valid_GS[:, :, None], (G, S, K)).reshape(G, S * K)
  onehot_GAE = jax.nn.one_hot(experts_GSK.reshape(G, S * K), num_experts, dtype=jnp.int32)
  onehot_GAE = onehot_GAE * routed_GA[:, :, None]
  position_GA = jnp.sum((jnp.cumsum(onehot_GAE, axis=1) - 1) * onehot_GAE, axis=-1)
  keep_GA = routed_GA & (position_GA < capacity)
  return position_GA.reshape(G, S, K), keep_GA.reshape(G, S, K)


def total_aux_loss(state) -> jax.Array:
  """Sum (float32 scalar) of every leaf of a 'losses' collection.

  `state` is the collection itself or the mutable-state dict returned by
  `apply(..., mutable=[...])` (then its 'losses' entry is used). Leaves stacked by
  nn.scan ([num_layers]) are summed over all their elements. Empty -> 0.
  """
  if isinstance(state, Mapping) and 'losses' in state:
    state = state['losses']
  leaves = jax.tree_util.tree_leaves(state)
  return sum((jnp.sum(jnp.asarray(v, jnp.float32)) for v in leaves), jnp.zeros((), jnp.float32))


class MoEFeedForward(nn.Module):
  """Top-k routed mixture of `num_experts` FFNs (see module docstring).

  __call__(x [B, L, D], *, valid_BL [B, L] bool or None (all valid),
  deterministic=True) -> y [B, L, D] in cfg.dtype, exactly 0 where not valid.
  Dropout (cfg.dropout, on the expert hidden activations) needs a 'dropout' rng
  when not deterministic.

  Params: router/kernel [D, E] ('embed', 'expert'); wi [E, D, F], or wi_0 and wi_1
  when gated, ('expert', 'embed', 'mlp'); wo [E, F, D] ('expert', 'mlp', 'embed');
  with use_bias also bi [E, F] (bi_0, bi_1 when gated) and bo [E, D].
  """
  cfg: MoELayerConfig

  @nn.compact
  def __call__(self, x_BLD, *, valid_BL=None, deterministic=True):
    cfg = self.cfg
    B, L, D = x_BLD.shape
    if D != cfg.d_model:
      raise ValueError(f'x_BLD has d_model {D}, the config says {cfg.d_model}')
    x_BLD = constrain(x_BLD, ('batch', 'length', 'embed'))
    valid_BL = jnp.ones((B, L), bool) if valid_BL is None else jnp.asarray(valid_BL, bool)

    logits_BLE = dense_layer(
        cfg.num_experts, ('embed', 'expert'), use_bias=False, dtype='float32',
        param_dtype=cfg.param_dtype, kernel_init=nn.initializers.lecun_normal(),
        name='router')(x_BLD.astype(jnp.float32))
    probs_BLE, gates_BLK, experts_BLK = top_k_gates(logits_BLE, cfg.top_k)
    gates_BLK = jnp.where(valid_BL[:, :, None], gates_BLK, 0.0)
    self._sow_losses(logits_BLE, probs_BLE, experts_BLK, valid_BL)

    weights = self._expert_weights(D)
    x_BLD = x_BLD.astype(dtype(cfg.dtype))
    if cfg.capacity_factor > 0:
      y_BLD, keep_BLK = self._capacity_path(x_BLD, valid_BL, gates_BLK, experts_BLK, weights,
                                            deterministic)
    else:
      y_BLD = self._dropless_path(x_BLD, valid_BL, gates_BLK, experts_BLK, weights,
                                  deterministic)
      keep_BLK = jnp.broadcast_to(valid_BL[:, :, None], experts_BLK.shape)
    self._sow_metrics(experts_BLK, valid_BL, keep_BLK)
    return constrain(y_BLD, ('batch', 'length', 'embed'))

  def _expert_weights(self, D):
    """Stacked expert parameters, cast to the compute dtype."""
    cfg = self.cfg
    E, F = cfg.num_experts, cfg.d_ff
    kernel = nn.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))

    def param(name, shape, names, init=kernel):
      value = self.param(name, partitioned(init, names), shape, dtype(cfg.param_dtype))
      return value.astype(dtype(cfg.dtype))

    zeros = nn.initializers.zeros_init()
    w = {}
    for suffix in (('_0', '_1') if cfg.gated else ('',)):
      w['wi' + suffix] = param('wi' + suffix, (E, D, F), ('expert', 'embed', 'mlp'))
      if cfg.use_bias:
        w['bi' + suffix] = param('bi' + suffix, (E, F), ('expert', 'mlp'), zeros)
    w['wo'] = param('wo', (E, F, D), ('expert', 'mlp', 'embed'))
    if cfg.use_bias:
      w['bo'] = param('bo', (E, D), ('expert', 'embed'), zeros)
    return w

  def _hidden(self, up, deterministic):
    """act(x·wi): `up(name)` applies input projection `name` (+ its bias)."""
    cfg = self.cfg
    act, gated = activation(cfg.activation)
    h = act(up('0')) * up('1') if gated else act(up(''))
    return nn.Dropout(cfg.dropout)(h, deterministic=deterministic)

  def _capacity_path(self, x_GSD, valid_GS, gates_GSK, experts_GSK, w, deterministic):
    """Index dispatch into [G, E, C, D] buffers; returns (y [G, S, D], keep [G, S, K])."""
    cfg = self.cfg
    G, S, D = x_GSD.shape
    E, K = cfg.num_experts, cfg.top_k
    C = expert_capacity(cfg, S)
    position_GSK, keep_GSK = assign_slots(experts_GSK, valid_GS, E, C)
    # Slot e·C + p of the flat [E·C] buffer; the extra slot E·C collects dropped and
    # padding assignments and always holds zeros.
    slot_GA = jnp.where(keep_GSK, experts_GSK * C + position_GSK, E * C).reshape(G, S * K)
    token_GA = jnp.broadcast_to(jnp.arange(S)[:, None], (S, K)).reshape(1, S * K)
    # Inverse map: which token fills each slot (S = an appended zero row).
    source_GN = jnp.full((G, E * C + 1), S, jnp.int32)
    source_GN = source_GN.at[jnp.arange(G)[:, None], slot_GA].set(
        jnp.broadcast_to(token_GA, (G, S * K)))
    x_pad_GSD = jnp.concatenate([x_GSD, jnp.zeros((G, 1, D), x_GSD.dtype)], axis=1)
    x_GECD = jnp.take_along_axis(x_pad_GSD, source_GN[:, :E * C, None], axis=1)
    x_GECD = x_GECD.reshape(G, E, C, D)

    def up(i):
      h_GECF = jnp.einsum('gecd,edf->gecf', x_GECD, w['wi_' + i if i else 'wi'])
      if cfg.use_bias:
        h_GECF = h_GECF + w['bi_' + i if i else 'bi'][None, :, None, :]
      return h_GECF

    h_GECF = self._hidden(up, deterministic)
    out_GECD = jnp.einsum('gecf,efd->gecd', h_GECF, w['wo'])
    if cfg.use_bias:
      out_GECD = out_GECD + w['bo'][None, :, None, :]
    out_GND = jnp.concatenate(
        [out_GECD.reshape(G, E * C, D), jnp.zeros((G, 1, D), out_GECD.dtype)], axis=1)
    y_GSKD = jnp.take_along_axis(out_GND, slot_GA[:, :, None], axis=1).reshape(G, S, K, D)
    y_GSD = jnp.einsum('gskd,gsk->gsd', y_GSKD, gates_GSK.astype(y_GSKD.dtype))
    return y_GSD, keep_GSK

  def _dropless_path(self, x_BLD, valid_BL, gates_BLK, experts_BLK, w, deterministic):
    """Sort all assignments by expert and run `jax.lax.ragged_dot`; y [B, L, D]."""
    cfg = self.cfg
    B, L, D = x_BLD.shape
    E, K = cfg.num_experts, cfg.top_k
    A = B * L * K
    valid_A = jnp.broadcast_to(valid_BL[:, :, None], (B, L, K)).reshape(A)
    # Padding gets expert id E: sorted last, outside every group, so never computed.
    expert_A = jnp.where(valid_A, experts_BLK.reshape(A), E)
    order_A = jnp.argsort(expert_A, stable=True)
    expert_sorted_A = expert_A[order_A]
    group_sizes_E = jnp.sum(jax.nn.one_hot(expert_A, E, dtype=jnp.int32), axis=0)
    x_AD = x_BLD.reshape(B * L, D)[order_A // K]

    def up(i):
      h_AF = jax.lax.ragged_dot(x_AD, w['wi_' + i if i else 'wi'], group_sizes_E)
      if cfg.use_bias:
        h_AF = h_AF + jnp.take(w['bi_' + i if i else 'bi'], expert_sorted_A, axis=0,
                               mode='clip')
      return h_AF

    h_AF = self._hidden(up, deterministic)
    out_AD = jax.lax.ragged_dot(h_AF, w['wo'], group_sizes_E)
    if cfg.use_bias:
      out_AD = out_AD + jnp.take(w['bo'], expert_sorted_A, axis=0, mode='clip')
    out_AD = jnp.zeros_like(out_AD).at[order_A].set(out_AD)  # back to (token, choice) order
    y_BLKD = out_AD.reshape(B, L, K, D)
    # where(), not just gate 0, so padding stays exactly 0 even if its rows held inf/nan.
    y_BLKD = jnp.where(valid_BL[:, :, None, None], y_BLKD, 0)
    return jnp.einsum('blkd,blk->bld', y_BLKD, gates_BLK.astype(y_BLKD.dtype))

  def _sow_losses(self, logits_BLE, probs_BLE, experts_BLK, valid_BL):
    """Weighted load-balancing (and z-) loss into the 'losses' collection."""
    cfg = self.cfg
    E, K = cfg.num_experts, cfg.top_k
    valid_BL1 = valid_BL[:, :, None].astype(jnp.float32)
    num_valid = jnp.maximum(jnp.sum(valid_BL1), 1.0)
    chosen_BLE = jnp.sum(jax.nn.one_hot(experts_BLK, E, dtype=jnp.float32), axis=2)
    f_E = jnp.sum(chosen_BLE * valid_BL1, axis=(0, 1)) / (num_valid * K)
    p_E = jnp.sum(probs_BLE * valid_BL1, axis=(0, 1)) / num_valid
    aux = cfg.aux_loss_weight * E * jnp.sum(f_E * p_E)
    _sow_sum(self, 'moe_aux_loss', aux)
    if cfg.router_z_loss_weight > 0:
      z_BL = jax.nn.logsumexp(logits_BLE.astype(jnp.float32), axis=-1)
      z = jnp.sum(jnp.square(z_BL) * valid_BL) / num_valid
      _sow_sum(self, 'moe_z_loss', cfg.router_z_loss_weight * z)

  def _sow_metrics(self, experts_BLK, valid_BL, keep_BLK):
    """'moe_dropped_fraction' and 'moe_expert_load' [E] into 'metrics'."""
    E = self.cfg.num_experts
    routed_BLK = jnp.broadcast_to(valid_BL[:, :, None], experts_BLK.shape)
    num_routed = jnp.sum(routed_BLK.astype(jnp.float32))
    dropped = jnp.sum((routed_BLK & ~keep_BLK).astype(jnp.float32)) / jnp.maximum(num_routed, 1)
    load_E = jnp.sum(jax.nn.one_hot(experts_BLK, E, dtype=jnp.float32) * routed_BLK[..., None],
                     axis=(0, 1, 2)) / jnp.maximum(num_routed, 1)
    for name, value in (('moe_dropped_fraction', dropped), ('moe_expert_load', load_E)):
      self.sow('metrics', name, value, init_fn=lambda v=value: jnp.zeros_like(v),
               reduce_fn=lambda _, b: b)


def _sow_sum(module: nn.Module, name: str, value):
  """Adds a float32 scalar to `losses/name` (summed over repeated calls)."""
  module.sow('losses', name, jnp.asarray(value, jnp.float32),
             init_fn=lambda: jnp.zeros((), jnp.float32), reduce_fn=lambda a, b: a + b)
