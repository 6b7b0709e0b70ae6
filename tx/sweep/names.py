"""Stable, readable variant names built from overrides: `position=rope`,
`norm_position=post,warmup_steps=0`.

A key is shortened to its last dotted component unless another key of the same sweep
shares it; then enough leading components are kept to tell them apart (`moe.top_k` vs
`decode.top_k`). Names are also directory names, so characters other than letters,
digits and `_ . = , + -` become `_`. `tx compare` names groups of runs the same way.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

BASE = 'base'  # the name of the variant with no overrides
_UNSAFE = re.compile(r'[^A-Za-z0-9_.=,+\-]')


def short_keys(keys: Iterable[str]) -> dict[str, str]:
  """Each dotted key -> its shortest dotted suffix that no other key ends with."""
  keys = list(dict.fromkeys(keys))
  out = {}
  for key in keys:
    parts = key.split('.')
    for n in range(1, len(parts) + 1):
      suffix = '.'.join(parts[-n:])
      if not any(other != key and (other == suffix or other.endswith('.' + suffix))
                 for other in keys):
        break
    out[key] = suffix
  return out


def format_value(value: Any) -> str:
  """A value as it appears in a name: `rope`, `0.001`, `True`, `None`, `0.9_0.98`."""
  if isinstance(value, (tuple, list)):
    return '_'.join(format_value(v) for v in value) or 'empty'
  if isinstance(value, float):
    return repr(value)
  return str(value)


def variant_name(overrides: Mapping[str, Any], short: Mapping[str, str] | None = None) -> str:
  """`short=value,...` in the order of `overrides`; 'base' when there are none."""
  if not overrides:
    return BASE
  short = short or short_keys(overrides)
  text = ','.join(f'{short.get(k, k)}={format_value(v)}' for k, v in overrides.items())
  return _UNSAFE.sub('_', text)
