"""Growing the KV cache in segments: one `lax.while_loop` per segment.

Each decoding step reads its whole cache (attention; beam search also reorders it), so a
cache allocated for the full generation makes the early steps read mostly empty slots.
A decode split into segments allocates, per segment, only the slots written so far and
zero-pads the cache between loops (`Stepper.resize`): the same tokens, fewer bytes read.
"""

from __future__ import annotations

import jax

__all__ = ['SEGMENT_STEPS', 'MAX_SEGMENTS', 'cache_schedule', 'segmented_while_loop']

# Each segment compiles the step once more, so by default only generations long enough for
# the bytes saved to outweigh that (>= 2 * SEGMENT_STEPS tokens) are split, into at most
# MAX_SEGMENTS (benchmarks/NOTES.md has the measurements).
SEGMENT_STEPS = 64
MAX_SEGMENTS = 4


def cache_schedule(prefilled: int, max_new: int,
                   segments: int | None = None) -> tuple[tuple[int, int], ...]:
  """((first step, cache slots), ...) per segment of a `max_new`-step decode.

  Step t writes slot `prefilled + t`, so the segment ending before step e needs
  `prefilled + e` slots; the last segment's cache is the full `prefilled + max_new`.
  segments: how many (at most max_new); None: max_new // SEGMENT_STEPS, between 1 and
  MAX_SEGMENTS.
  """
  if segments is not None and not 1 <= segments <= max(1, max_new):
    raise ValueError(f'cache_segments must be between 1 and max_new ({max_new}), got {segments}')
  n = segments or max(1, min(MAX_SEGMENTS, max_new // SEGMENT_STEPS))
  ends = [round(max_new * (j + 1) / n) for j in range(n)]
  return tuple((start, prefilled + end) for start, end in zip([0] + ends[:-1], ends))


def segmented_while_loop(cond, body, state, *, steps: int, schedule=(), resize=None):
  """`lax.while_loop(cond, body, state)` with the cache grown as it fills.

  state: (t int32 scalar, cache, ...); `body` advances t by one. The loop for a segment
  runs while `cond(state)` and t < the next segment's first step (the last: `steps`);
  between segments the cache becomes `resize(cache, slots)`.
  schedule: `cache_schedule(...)[1:]` (the cache passed in holds the first segment's
  slots); () runs one loop over an unchanged cache.
  """
  ends = [start for start, _ in schedule] + [steps]
  for i, end in enumerate(ends):
    if i:
      t, cache, *rest = state
      state = (t, resize(cache, schedule[i - 1][1]), *rest)
    state = jax.lax.while_loop(lambda s, end=end: cond(s) & (s[0] < end), body, state)
  return state
