"""Model FLOPs per training step (for tokens/s -> MFU) and a measured matmul ceiling.

FLOPs of one training step (forward + backward = 3 x forward), counting matmuls only:

    6 * N_matmul * tokens                    every weight used once per token per pass
  + 12 * layers * H * D_head * L_q * L_k     attention scores and weighted values

N_matmul counts the parameters that multiply activations: everything except position
tables (a gather), norms and biases; a tied embedding counts once, as the output
projection. Per stack, tokens and attention lengths are that stack's own: an
encoder-decoder adds encoder (S x S), decoder self (L x L) and cross (L x S) attention.
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


def _matmul_params(params) -> dict[str, int]:
  """Matmul parameter counts per top-level tower ('encoder', 'decoder', heads, embeddings)."""
  counts: dict[str, int] = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    keys = [getattr(k, 'key', str(k)) for k in path]
    name = keys[-1]
    if leaf.ndim < 2 or 'position_embedding' in keys or name == 'token_type_embedding':
      continue
    if name in ('rel_embedding',):
      continue
    counts[keys[0]] = counts.get(keys[0], 0) + int(leaf.size)
  return counts


def flops_per_step(cfg: ModelConfig, params, *, batch: int, length: int,
                   target_length: int | None = None) -> float:
  """Training FLOPs of one step of `batch` rows (length = source / only sequence length)."""
  counts = _matmul_params(params)
  attn = cfg.num_heads * cfg.head_dim_
  embed = counts.get('embed', 0) + counts.get('src_embed', 0)
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
