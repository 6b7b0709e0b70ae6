"""How long to time a small operation for: shared by tx's and the PyTorch peer's GEMM
timings (tx.train.flops, tx.bench.torch_peers), so both sides time the same way. No JAX
here: the peer's measuring process imports this module without it."""


def calls_per_sample(one_call_s: float, sample_s: float = 0.02) -> int:
  """How many back-to-back calls make a timed sample of about `sample_s` seconds (at least 1,
  at most 1,000), given one call's time: one for an n^3 ceiling, hundreds for a small
  product whose single call would time mostly its dispatch and synchronisation."""
  return max(1, min(1000, int(sample_s / max(one_call_s, 1e-7))))
