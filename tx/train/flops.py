"""Model FLOPs per training step (for tokens/s -> MFU) and a measured matmul ceiling.

FLOPs of one training step (forward + backward = 3 x forward), counting matmuls only:

    6 * N_matmul * tokens                    every weight used once per token per pass
  + 12 * layers * H * D_head * L_q * L_k     attention scores and weighted values

N_matmul counts the parameters that multiply activations: everything except position
tables and untied token tables (gathers), norms and biases; a tied embedding counts once,
as the output projection; MoE experts count x top_k / num_experts. Per stack, tokens and
attention lengths are that stack's own: an encoder-decoder adds encoder (S x S), decoder
self (L x L) and cross (L x S) attention.
This is the PaLM / nanoGPT convention: model FLOPs, not hardware FLOPs (remat recompute is
not counted), and masked attention positions are counted as computed.

What a parameter is comes from its logical axis names (which every tx parameter carries for
the sharding rules), looked up in ROLES, one row per kind of weight, after dropping the
'layers' axis of scanned stacks. A parameter whose axes have no row is left out with a
warning: a new kind of weight adds its row here, and tests/train/test_flops.py fails for
any parameter of any model family or variant that has none.
"""

from __future__ import annotations

import functools
import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tx.config.model import ModelConfig
from tx.models.build import build_model, dummy_inputs
from tx.timing import sample_seconds

log = logging.getLogger(__name__)

MATMUL = 'matmul'  # multiplies activations: counted once per token per pass
EXPERT = 'expert'  # an MoE expert weight: counted x top_k / num_experts
TOKEN_TABLE = 'token_table'  # a gather; flops_per_step counts it only as a tied output head
EXCLUDED = 'excluded'  # never multiplies activations (gathers, biases, norm scales)

ROLES: dict[tuple[str | None, ...], str] = {
    ('embed', 'heads', 'kv'): MATMUL,  # attention query
    ('embed', 'kv_heads', 'kv'): MATMUL,  # attention key, value
    ('heads', 'kv', 'embed'): MATMUL,  # attention output
    ('embed', 'mlp'): MATMUL,  # FFN input(s), MLM transform, pooler
    ('mlp', 'embed'): MATMUL,  # FFN output
    ('embed', 'vocab'): MATMUL,  # untied LM / MLM output projection
    ('mlp', None): MATMUL,  # classifier
    ('embed', 'expert'): MATMUL,  # MoE router
    ('expert', 'embed', 'mlp'): EXPERT,  # expert input(s)
    ('expert', 'mlp', 'embed'): EXPERT,  # expert output
    ('vocab', 'embed'): TOKEN_TABLE,
    ('length', 'embed'): EXCLUDED,  # learned position table
    (None, 'embed'): EXCLUDED,  # token-type table
    (None, 'heads'): EXCLUDED,  # T5 relative-position buckets
    ('embed',): EXCLUDED,  # norm scales and biases; output-projection biases
    ('mlp',): EXCLUDED,  # FFN / pooler / transform biases
    ('heads', 'kv'): EXCLUDED,  # query bias
    ('kv',): EXCLUDED,  # per-head query / key norm scales (model.qk_norm)
    ('kv_heads', 'kv'): EXCLUDED,  # key, value biases
    ('vocab',): EXCLUDED,  # MLM output bias
    (None,): EXCLUDED,  # classifier bias
    ('expert', 'mlp'): EXCLUDED,  # expert input biases
    ('expert', 'embed'): EXCLUDED,  # expert output bias
}
_SCAN_AXIS = 'layers'  # tx/models/stack.py stacks scanned layers on it


def param_roles(cfg: ModelConfig, params=None) -> dict[str, tuple[str | None, tuple | None]]:
  """{'decoder/stack/layer_0/ffn/wi/kernel': (role, logical axes), ...} for every parameter.

  role: MATMUL, EXPERT, TOKEN_TABLE, EXCLUDED, or None where ROLES has no row for the axes
  (axes None: the parameter has no logical names). params: boxed (names read from them)
  or plain arrays (names from `cfg`'s model, traced abstractly); None: `cfg`'s own.
  """
  if params is None:
    params = _boxed_abstract_params(cfg)
  traced = {} if _is_boxed(params) else _axes_by_path(cfg)
  roles = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params, is_leaf=_is_box):
    name = _path_name(path)
    axes = tuple(leaf.names) if _is_box(leaf) else traced.get(name)
    key = None if axes is None else tuple(a for a in axes if a != _SCAN_AXIS)
    roles[name] = (ROLES.get(key), axes)
  return roles


def _matmul_params(cfg: ModelConfig, params, moe_fraction: float = 1.0) -> dict[str, float]:
  """Parameter counts per top-level tower ('encoder', 'decoder', heads, embeddings) of the
  MATMUL weights, EXPERT weights (x moe_fraction: each token visits top_k experts) and
  token tables (flops_per_step counts those only as a tied output projection)."""
  roles = param_roles(cfg, params)
  unknown = sorted(f'{name} {axes}' for name, (role, axes) in roles.items() if role is None)
  if unknown:
    log.warning('FLOPs per step leave out %d parameter(s) whose logical axes tx/train/flops.py '
                'does not know (add them to ROLES): %s', len(unknown), ', '.join(unknown))
  weight = {MATMUL: 1.0, TOKEN_TABLE: 1.0, EXPERT: moe_fraction}
  counts: dict[str, float] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(nn.unbox(params)):
    name = _path_name(path)
    role = roles[name][0]
    if role in weight:
      top = name.split('/', 1)[0]
      counts[top] = counts.get(top, 0) + leaf.size * weight[role]
  return counts


def _path_name(path) -> str:
  return '/'.join(str(getattr(k, 'key', k)) for k in path)


def _is_box(x) -> bool:
  return isinstance(x, nn.Partitioned)


def _is_boxed(params) -> bool:
  return any(_is_box(x) for x in jax.tree_util.tree_leaves(params, is_leaf=_is_box))


def _boxed_abstract_params(cfg: ModelConfig):
  cfg = cfg.replace(attention_impl='xla')  # names and shapes only: no cuDNN, no backend query
  return jax.eval_shape(
      lambda: build_model(cfg).init(jax.random.key(0), *dummy_inputs(cfg))['params'])


@functools.lru_cache(maxsize=16)
def _axes_by_path(cfg: ModelConfig) -> dict[str, tuple]:
  flat = jax.tree_util.tree_leaves_with_path(_boxed_abstract_params(cfg), is_leaf=_is_box)
  return {_path_name(path): tuple(leaf.names) for path, leaf in flat if _is_box(leaf)}


def flops_per_step(cfg: ModelConfig, params, *, batch: int, length: int,
                   target_length: int | None = None, head_positions: int | None = None) -> float:
  """Training FLOPs of one step of `batch` rows (length = source / only sequence length).

  params: `cfg`'s parameters, boxed with their logical names or plain (arrays or
  ShapeDtypeStructs; the names are then traced from `cfg`, once per config).
  head_positions: a decoder's or encoder's output heads run at this many positions a row
  (an MLM task with `data.mlm_max_predictions`); None: at every position.
  """
  moe = cfg.moe
  counts = _matmul_params(cfg, params,
                          moe.top_k / moe.num_experts if moe.num_experts else 1.0)
  attn = cfg.num_heads * cfg.resolved_head_dim
  # A token table is a gather; it multiplies activations only as a tied output projection.
  embed = counts.get('embed', 0) if cfg.tie_embeddings else 0
  heads = sum(v for k, v in counts.items() if k not in ('embed', 'src_embed', 'encoder',
                                                        'decoder'))
  if cfg.family == 'encoder_decoder':
    tl = target_length or length
    enc = 6 * counts.get('encoder', 0) * batch * length
    dec = 6 * (counts.get('decoder', 0) + heads + embed) * batch * tl
    attn_flops = 12 * attn * batch * (cfg.encoder_layers * length * length
                                      + cfg.decoder_layers * (tl * tl + tl * length))
    return float(enc + dec + attn_flops)
  tower = counts.get('encoder', 0) + counts.get('decoder', 0)
  dense = 6 * (tower * length + (heads + embed) * (head_positions or length)) * batch
  return float(dense + 12 * attn * cfg.num_layers * batch * length * length)


def mlm_head_positions(exp_cfg) -> int | None:
  """The positions a row at which an ExperimentConfig's MLM head runs (`flops_per_step`'s
  head_positions): data.mlm_max_predictions for an MLM task that sets it, else None."""
  if exp_cfg.task_name == 'mlm' and exp_cfg.data.mlm_max_predictions:
    return exp_cfg.data.mlm_max_predictions
  return None


def measure_matmul_ceiling(dtype: str = 'float32', n: int = 2048, reps: int = 3) -> float:
  """Achieved FLOP/s of a jitted n x n x n matmul on the default device (best of reps).

  Measured once per process and device kind (a sweep of runs in one process, or a test
  session, does not pay for it again: ~1 s on a CPU, several with simulated devices).
  """
  device = jax.devices()[0]
  return _measure(str(dtype), n, reps, device.platform, device.device_kind)


@functools.lru_cache(maxsize=None)
def _measure(dtype: str, n: int, reps: int, platform: str, device_kind: str) -> float:
  del platform, device_kind  # cache keys only
  return max(matmul_rates(dtype, n, reps))


def matmul_rates(dtype: str = 'float32', n: int = 2048, reps: int = 3) -> list[float]:
  """FLOP/s of each of `reps` timed calls of a jitted n x n x n matmul (inputs in `dtype`,
  float32 accumulation), after one untimed call that compiles it."""
  return gemm_rates(dtype, n, n, n, reps=reps)


def gemm_rates(dtype: str, m: int, k: int, n: int, *, rhs_transposed: bool = False,
               reps: int = 3) -> list[float]:
  """FLOP/s of each of `reps` timed samples of a jitted [m, k] · [k, n] product (the right
  operand stored [n, k] and contracted on its last dimension when `rhs_transposed`), inputs
  in `dtype`, float32 accumulation, after one untimed call that compiles it. A sample runs
  `calls_per_sample` calls back to back: a small product's own time, not one dispatch's."""
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.standard_normal((m, k)), dtype)
  b = jnp.asarray(rng.standard_normal((n, k) if rhs_transposed else (k, n)), dtype)
  dims = (((1,), (1,) if rhs_transposed else (0,)), ((), ()))
  f = jax.jit(lambda x, y: jax.lax.dot_general(x, y, dims, preferred_element_type=jnp.float32))
  return [2 * m * k * n / s for s in sample_seconds(lambda: f(a, b), jax.block_until_ready, reps)]
