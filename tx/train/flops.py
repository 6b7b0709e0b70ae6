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
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from tx.config.model import ModelConfig


_MOE_WEIGHTS = ('wi', 'wi_0', 'wi_1', 'wo')


def _matmul_params(params, moe_fraction: float = 1.0) -> dict[str, float]:
  """Matmul parameter counts per top-level tower ('encoder', 'decoder', heads, embeddings).

  Only weights that multiply activations count: `kernel`s, token `embedding` tables and
  MoE expert weights (x top_k / num_experts: each token visits top_k experts). Biases and
  norm scales never count, also when scanned layers stack them into 2-D arrays.
  """
  counts: dict[str, float] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    keys = [getattr(k, 'key', str(k)) for k in path]
    name = keys[-1]
    if name == 'kernel' or (name == 'embedding' and 'position_embedding' not in keys):
      size = float(leaf.size)
    elif name in _MOE_WEIGHTS and len(keys) > 1 and keys[-2] == 'moe':
      size = leaf.size * moe_fraction
    else:
      continue
    counts[keys[0]] = counts.get(keys[0], 0) + size
  return counts


def flops_per_step(cfg: ModelConfig, params, *, batch: int, length: int,
                   target_length: int | None = None) -> float:
  """Training FLOPs of one step of `batch` rows (length = source / only sequence length)."""
  moe = cfg.moe
  counts = _matmul_params(params, moe.top_k / moe.num_experts if moe.num_experts else 1.0)
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
  dense = 6 * (tower + heads + embed) * batch * length
  return float(dense + 12 * attn * cfg.num_layers * batch * length * length)


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
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
  f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  f(a, a).block_until_ready()
  rates = []
  for _ in range(reps):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    rates.append(2 * n ** 3 / (time.perf_counter() - t))
  return rates
