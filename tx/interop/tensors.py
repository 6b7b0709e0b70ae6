"""Taking a checkpoint's tensors one name at a time and placing them in a tx param tree.

Each architecture module reads with `Tensors.take(name, shape)`; a missing or mis-shaped
tensor is a one-line CheckpointError naming the tensor and the file, and `finish()` makes
any tensor nobody took an error too, so a mapping can never silently drop weights.

Layout conventions (PyTorch `nn.Linear` stores [out, in]; tx kernels are [in, ...out]):
    linear_in(w [H*Dh, D])  -> query/key/value kernel [D, H, Dh]
    linear_out(w [D, H*Dh]) -> out kernel [H, Dh, D]
"""

from __future__ import annotations

import fnmatch

import numpy as np

from tx.config.model import ModelConfig
from tx.train.errors import CheckpointError


class Tensors:
  """The named tensors of one checkpoint (a base-model prefix such as 'transformer.' removed)."""

  def __init__(self, tensors: dict[str, np.ndarray], source: str, *, prefix: str = '',
               ignore: tuple[str, ...] = ()):
    self.source = source
    self.prefix = prefix
    self._tensors = {(k[len(prefix):] if prefix and k.startswith(prefix) else k): v
                     for k, v in tensors.items()}
    self._ignore = ignore  # glob patterns of tensors tx has no use for (buffers, other heads)

  def has(self, name: str) -> bool:
    return name in self._tensors

  def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """float32 array `name` of exactly `shape` (removed from the pool)."""
    if name not in self._tensors:
      raise CheckpointError(f'{self.source}: tensor {self.prefix}{name} is missing; the file '
                            'does not match its config.json (re-save it with save_pretrained)')
    value = self._tensors.pop(name)
    if tuple(value.shape) != tuple(shape):
      raise CheckpointError(f'{self.source}: tensor {self.prefix}{name} has shape '
                            f'{tuple(value.shape)}, config.json implies {tuple(shape)}; the '
                            'weights and config.json come from different models')
    return np.asarray(value, np.float32)

  def take_optional(self, name: str, shape: tuple[int, ...]) -> np.ndarray | None:
    return self.take(name, shape) if name in self._tensors else None

  def finish(self) -> None:
    """Errors on tensors nobody took (except the ignored patterns)."""
    left = sorted(k for k in self._tensors
                  if not any(fnmatch.fnmatchcase(k, p) for p in self._ignore))
    if left:
      more = f' and {len(left) - 1} more' if len(left) > 1 else ''
      raise CheckpointError(f'{self.source}: unexpected tensor {self.prefix}{left[0]}{more}; '
                            'the checkpoint holds weights the config.json architecture does '
                            'not have (is model_type right?)')


def put(tree: dict, path: str, value) -> None:
  """tree['a']['b']['c'] = value for path 'a/b/c' (creating the dicts)."""
  *parents, leaf = path.split('/')
  for key in parents:
    tree = tree.setdefault(key, {})
  tree[leaf] = value


def get(tree: dict, path: str):
  for key in path.split('/'):
    tree = tree[key]
  return tree


def linear_in(w_OI, heads: int, head_dim: int) -> np.ndarray:
  """torch Linear weight [H*Dh, D] -> tx projection kernel [D, H, Dh]."""
  return np.ascontiguousarray(w_OI.T.reshape(w_OI.shape[1], heads, head_dim))


def linear_out(w_OI, heads: int, head_dim: int) -> np.ndarray:
  """torch Linear weight [D, H*Dh] -> tx output kernel [H, Dh, D]."""
  return np.ascontiguousarray(w_OI.T.reshape(heads, head_dim, w_OI.shape[0]))


def dense(w_OI) -> np.ndarray:
  """torch Linear weight [out, in] -> flax Dense kernel [in, out]."""
  return np.ascontiguousarray(w_OI.T)


def linear(t: Tensors, name: str, shape_OI: tuple[int, int]) -> dict:
  """A biased torch Linear `name` [out, in] -> flax Dense {'kernel' [in, out], 'bias' [out]}."""
  return {'kernel': dense(t.take(f'{name}.weight', shape_OI)),
          'bias': t.take(f'{name}.bias', shape_OI[:1])}


def linear_out_bias(t: Tensors, name: str, d: int, heads: int, head_dim: int) -> dict:
  """A biased torch Linear `name` [D, H*Dh] -> tx output projection {'kernel' [H, Dh, D],
  'bias' [D]}."""
  return {'kernel': linear_out(t.take(f'{name}.weight', (d, heads * head_dim)), heads, head_dim),
          'bias': t.take(f'{name}.bias', (d,))}


def norm(t: Tensors, name: str, d: int, *, bias: bool = True, weight: str = 'weight') -> dict:
  """A norm's params {'scale', 'bias'?} from `name.weight` (and `name.bias`)."""
  out = {'scale': t.take(f'{name}.{weight}', (d,))}
  if bias:
    out['bias'] = t.take(f'{name}.bias', (d,))
  return out


def tied_head(t: Tensors, name: str, embedding_VD: np.ndarray, tie: bool) -> np.ndarray | None:
  """The untied output kernel [D, V] from `name` [V, D], or None when the head is tied.

  A tied checkpoint may still store the head (older savers did): it must then equal the
  embedding, else the config.json's tie_word_embeddings is wrong for these weights.
  """
  w = t.take_optional(name, embedding_VD.shape)
  if not tie:
    if w is None:
      raise CheckpointError(f'{t.source}: tensor {name} is missing although config.json has '
                            'tie_word_embeddings=false; set it to true if the head is tied')
    return dense(w)
  if w is not None and not np.array_equal(w, embedding_VD):
    raise CheckpointError(f'{t.source}: {name} differs from the token embedding although '
                          'config.json ties them; set tie_word_embeddings=false in config.json')
  return None


def with_embedding(t: Tensors, name: str, cfg: ModelConfig) -> tuple[dict, np.ndarray]:
  """(a new param tree holding the token embedding, that embedding [V, D]) from `name`."""
  embedding_VD = t.take(name, (cfg.vocab_size, cfg.d_model))
  return {'embed': {'embedding': embedding_VD}}, embedding_VD


def put_head(p: dict, path: str, t: Tensors, name: str, embedding_VD: np.ndarray,
             tie: bool) -> dict:
  """`p`, with the untied output kernel [D, V] from `name` put at `path` (none when tied)."""
  head = tied_head(t, name, embedding_VD, tie)
  if head is not None:
    put(p, path, head)
  return p
