"""One line where model.dtype=bfloat16 meets a CPU whose bf16 GEMMs are no faster than its
float32 ones: there bf16 training saves memory but costs time.

On a CPU with avx512_bf16 but no AMX, bf16 dot products run at ~0.7x float32's on XLA's
side and on torch's alike, and the 6-layer GPT trains in bf16 at 0.73-0.83x its float32
tokens/s (benchmarks/NOTES.md, attempts 94-95); on a CPU without bf16 arithmetic bf16 is
converted to float32 around every product. Only AMX (or a GPU) makes bf16 the fast choice.
So `tx train` compares the two GEMM ceilings it can measure in about a second (the bf16 one
it measures anyway, for MFU) instead of keeping a list of CPU models.
"""

from __future__ import annotations

from tx.train import flops

BF16 = 'bfloat16'


def advice(bf16_flops: float, float32_flops: float) -> str | None:
  """The hint for a host whose jitted bf16 GEMM ran at `bf16_flops` FLOP/s and float32 one at
  `float32_flops` (each a 2048³ product, float32 accumulation), or None where bf16 is faster.
  """
  if bf16_flops <= 0 or float32_flops <= 0 or bf16_flops > float32_flops:
    return None
  return (f'model.dtype=bfloat16: bf16 GEMMs on this CPU run at {bf16_flops / float32_flops:.2f}x '
          f'float32\'s ({bf16_flops / 1e9:.0f} against {float32_flops / 1e9:.0f} GFLOP/s), so '
          'bf16 here saves memory, not time; set model.dtype=float32 to train faster '
          '(bf16 pays off with AMX or a GPU: docs/performance.md)')


def check(dtype: str, platform: str, dtype_flops: float) -> str | None:
  """`advice` for a run of `dtype` on `platform` whose GEMM ceiling in that dtype measured
  `dtype_flops` FLOP/s a device; measures the float32 ceiling (once a process) only for a
  bf16 run on a CPU, and is None for every other run."""
  if str(dtype) != BF16 or platform != 'cpu':
    return None
  return advice(dtype_flops, flops.measure_matmul_ceiling('float32'))
