"""Parameter groups: embeddings, attention, ffn, norms, head, one label per parameter.

The groups are what stability diagnostics report on (gradient norm and update-to-parameter
RMS ratio per group) and what optimizer rules refer to (no decay on norms, per-group rates).
A parameter's group comes from the names on its path, by the first rule that matches:

    norms       a path component ending in 'norm' (final_norm, ffn_norm, embed_norm, ...)
    embeddings  'embed', 'embedder' or 'position_bias' (token, position, type, T5 buckets)
    head        a first component 'head', 'mlm_head' or 'classifier'
    attention   a component ending in 'attention' (self_attention, cross_attention)
    ffn         'ffn' or 'moe'

A new layer whose parameters match no rule raises ValueError in `group_of`, so it cannot
silently drop out of the diagnostics; add a rule here (tests/train/test_param_groups.py
checks every family).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

GROUPS = ('embeddings', 'attention', 'ffn', 'norms', 'head')


def path_names(path) -> tuple[str, ...]:
  """('decoder', 'stack', 'layer_0', ...): the dict keys of a jax tree path (a logical box's
  attribute step, '.value', is not a name)."""
  return tuple(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))


def group_of(names: tuple[str, ...]) -> str:
  """The group of the parameter at `names` (see the module docstring)."""
  if any(n.endswith('norm') for n in names):
    return 'norms'
  if any(n in ('embed', 'embedder', 'position_bias') for n in names):
    return 'embeddings'
  if names and names[0] in ('head', 'mlm_head', 'classifier'):
    return 'head'
  if any(n.endswith('attention') for n in names):
    return 'attention'
  if any(n in ('ffn', 'moe') for n in names):
    return 'ffn'
  raise ValueError(f'parameter {"/".join(names)} belongs to no group of tx.train.param_groups '
                   f'({", ".join(GROUPS)}); add a rule for it there')


def group_labels(params):
  """A tree like `params` holding each leaf's group name (for optax.multi_transform)."""
  return jax.tree_util.tree_map_with_path(lambda p, _: group_of(path_names(p)), params)


def grouped_leaves(tree) -> dict[str, list]:
  """{group: [leaves of `tree` in that group]} for the groups present."""
  out: dict[str, list] = {}
  for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
    out.setdefault(group_of(path_names(path)), []).append(x)
  return out


def sums_of_squares(tree) -> dict:
  """{group: float32 sum of squares of its leaves}."""
  return {g: sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in xs)
          for g, xs in grouped_leaves(tree).items()}


def sizes(tree) -> dict[str, int]:
  """{group: number of scalars} (static)."""
  return {g: sum(x.size for x in xs) for g, xs in grouped_leaves(tree).items()}
