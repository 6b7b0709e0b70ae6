"""tx's attention paths on a GPU: is cuDNN's right, and what is each worth?

    python benchmarks/gpu_attention.py            # needs a CUDA jax; prints two tables

1. Correctness. For three masks (causal; causal with some keys padded, as a tx decoder layer
   builds it; padding alone, as an encoder's), bf16 q, k, v: the output and the gradients of
   q, k, v from each variant below against tx's XLA path on the same values in float32
   (float32 products, not TF32), as ||x - ref|| / ||ref||. bf16 operands land between 1e-3
   and 1e-2; the script exits 1 above 3e-2 or on a NaN.
2. Speed. One self-attention's forward and backward (jit of the gradient of q, k, v),
   median of 10 samples, at the shapes of `tx bench --platform gpu` (gpt_6l, bert_6l,
   GPT-2 small; the decoders with the causal+padding mask), in bf16:
     xla            tx's XLA path, with the causal query blocks a tx layer picks by length;
     cudnn          tx's cuDNN path as a layer calls it: the mask passed as an array (cuDNN
                    reads it as a bias and returns its gradient) and, for a causal layer,
                    the causal promise (causal_blocks > 1), so cuDNN's causal mode skips the
                    hidden tiles;
     cudnn mask     (causal only) the same without the promise: the mask array alone;
     cudnn causal   jax.nn.dot_product_attention(implementation='cudnn', is_causal=True) with
                    no mask array: cuDNN's own causal mode and nothing else;
     cudnn lengths  (padding only) key_value_seq_lengths for the padding mask, no array.
   The last two say what tx would gain by handing cuDNN its masks in those forms.
"""

from __future__ import annotations

import statistics
import sys

import jax
import jax.numpy as jnp
import numpy as np

from tx import ops
from tx.layers.attention import causal_block_count
from tx.timing import sample_seconds

SHAPES = {  # name: (batch, length, heads, head_dim, causal)
    'gpt_6l': (64, 256, 6, 64, True),
    'bert_6l': (64, 256, 6, 64, False),
    'gpt2_small': (16, 1024, 12, 64, True),
}
TOLERANCE = 3e-2


def _inputs(batch, length, heads, head_dim, seed=0):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), jnp.float32)
          for _ in range(4)]


def _valid(batch, length, seed=0):
  """[B, S] bool: each row keeps a random prefix of at least half its keys."""
  rng = np.random.default_rng(seed)
  keep = rng.integers(length // 2, length + 1, batch)
  return jnp.asarray(np.arange(length)[None, :] < keep[:, None])


def _attention(kind: str, masking: str, length: int):
  """f(q, k, v, valid) -> [B, L, H, D] for one of the variants of the module doc; masking is
  'causal', 'causal+padding' (what a tx decoder layer builds) or 'padding' (an encoder's)."""
  causal = masking.startswith('causal')

  def mask_of(valid):
    padding = ops.key_padding_mask(valid)
    if masking == 'causal':
      return ops.causal_mask(length)
    return ops.combine_masks(padding, ops.causal_mask(length)) if causal else padding

  blocks = causal_block_count(0, length) if causal else 1  # as a tx layer picks them
  if kind in ('xla', 'cudnn', 'cudnn mask'):
    impl, promise = kind.split()[0], kind != 'cudnn mask'
    return lambda q, k, v, valid: ops.dot_product_attention(
        q, k, v, mask=mask_of(valid), implementation=impl,
        causal_blocks=blocks if promise else 1)
  if kind == 'cudnn causal':  # cuDNN's own causal mode; any padding ignored
    return lambda q, k, v, valid: jax.nn.dot_product_attention(
        q, k, v, is_causal=True, implementation='cudnn')
  return lambda q, k, v, valid: jax.nn.dot_product_attention(
      q, k, v, key_value_seq_lengths=jnp.sum(valid, axis=1, dtype=jnp.int32),
      implementation='cudnn')


def _kinds(masking: str) -> list[str]:
  """The variants that compute `masking` exactly (timed: 'cudnn causal' also beside the
  decoder's causal+padding, as what cuDNN's causal mode alone costs)."""
  extra = {'causal': ['cudnn mask', 'cudnn causal'], 'causal+padding': ['cudnn mask'],
           'padding': ['cudnn lengths']}[masking]
  return ['xla', 'cudnn'] + extra


def _grad_fn(attention, cot):
  def loss(q, k, v, valid):
    return jnp.sum(attention(q, k, v, valid).astype(jnp.float32) * cot)
  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _relative(x, ref):
  x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
  return float(np.linalg.norm(x - ref) / np.linalg.norm(ref))


def check(batch=4, length=256, heads=6, head_dim=64) -> bool:
  """Prints the relative errors of each path against XLA in float32; True if all pass."""
  ok = True
  q, k, v, cot = _inputs(batch, length, heads, head_dim, seed=1)
  valid = _valid(batch, length, seed=1)
  for masking in ('causal', 'causal+padding', 'padding'):
    ref_fn = _attention('xla', masking, length)
    with jax.default_matmul_precision('highest'):  # float32 products, not TF32
      ref_out = ref_fn(q, k, v, valid)
      _, ref_grads = _grad_fn(ref_fn, cot)(q, k, v, valid)
    bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    for kind in _kinds(masking):
      fn = _attention(kind, masking, length)
      try:
        out = fn(*bf, valid)
        _, grads = _grad_fn(fn, cot)(*bf, valid)
      except Exception as e:  # pylint: disable=broad-except
        # tx's paths must run; jax.nn's may refuse
        print(f'{masking:15} {kind:14} {type(e).__name__}: {str(e)[:200]}', flush=True)
        ok &= kind in ('cudnn causal', 'cudnn lengths')
        continue
      errors = [_relative(out, ref_out)] + [_relative(g, r) for g, r in zip(grads, ref_grads)]
      bad = any(not np.isfinite(e) or e > TOLERANCE for e in errors)
      ok &= not bad
      print(f'{masking:15} {kind:14} out {errors[0]:.1e}  dq {errors[1]:.1e}  '
            f'dk {errors[2]:.1e}  dv {errors[3]:.1e}' + ('  FAIL' if bad else ''), flush=True)
  return ok


def seconds(kind, batch, length, heads, head_dim, masking, reps=10) -> float:
  """Median seconds of one forward and backward in bf16 (tx.timing.sample_seconds)."""
  q, k, v, cot = _inputs(batch, length, heads, head_dim)
  q, k, v = (x.astype(jnp.bfloat16) for x in (q, k, v))
  valid = _valid(batch, length)
  f = _grad_fn(_attention(kind, masking, length), cot)
  return statistics.median(sample_seconds(lambda: f(q, k, v, valid), jax.block_until_ready, reps))


def main() -> int:
  if jax.default_backend() != 'gpu':
    print(f'needs a GPU; jax runs on {jax.default_backend()!r}', file=sys.stderr)
    return 2
  print(f'{jax.devices()[0].device_kind}, jax {jax.__version__}', flush=True)
  print('relative error against XLA in float32 (bf16 inputs):', flush=True)
  ok = check()
  print('\nforward + backward, bf16, ms (speed-up over tx\'s XLA path):', flush=True)
  for name, (batch, length, heads, head_dim, causal) in SHAPES.items():
    masking = 'causal+padding' if causal else 'padding'
    times = {}
    for kind in _kinds(masking) + (['cudnn causal'] if causal else []):
      try:
        times[kind] = seconds(kind, batch, length, heads, head_dim, masking)
      except Exception as e:  # pylint: disable=broad-except  (a refused shape is a result)
        print(f'  {name} {kind}: {type(e).__name__}: {str(e)[:200]}', flush=True)
    print(f'  {name:11} [{batch}, {length}, {heads}, {head_dim}] {masking}: ' + '  '.join(
        f'{kind} {t * 1e3:.3f} ({times["xla"] / t:.2f}x)' if 'xla' in times
        else f'{kind} {t * 1e3:.3f}' for kind, t in times.items()), flush=True)
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(main())
