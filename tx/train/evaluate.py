"""Evaluation over a split: metric sums accumulated on the host, then summarized."""

from __future__ import annotations

import itertools

import jax
from jax.experimental import multihost_utils

from tx.tasks.base import summarize
from tx.train.mesh import global_batch


def evaluate(eval_step, params, pipeline, mesh, *, max_batches: int | None = None) -> dict:
  """Runs `eval_step(params, batch) -> sums` over (at most max_batches of) `pipeline`.

  Returns loss (unsmoothed nll for perplexity), perplexity, accuracy and, where the
  tokenizer maps tokens to bytes, bits_per_byte.
  """
  totals: dict[str, float] = {}
  nbytes = 0.0
  batches = pipeline.iterator()
  if max_batches is not None:
    batches = itertools.islice(batches, max_batches)
  for local in batches:
    sums = jax.device_get(eval_step(params, global_batch(local, mesh)))
    for k, v in sums.items():
      totals[k] = totals.get(k, 0.0) + float(v)
    nbytes += pipeline.batch_bytes(local)
  if not totals:
    return {}
  if jax.process_count() > 1:
    nbytes = float(_sum_over_processes(nbytes))
  totals['bytes'] = nbytes
  out = summarize(totals)
  out['loss'] = out['nll']  # evaluation reports the unsmoothed loss
  return out


def _sum_over_processes(x: float) -> float:
  return float(multihost_utils.process_allgather(x).sum())
