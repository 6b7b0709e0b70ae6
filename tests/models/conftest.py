"""Shared tiny configs and a session-wide cache of initialised models.

Everything is tiny (d_model 16, 4 heads, 2 layers, vocab 40, L <= 6) and runs op by op
(no jit) unless a test is about jit or gradients or the stack is scanned: on CPU, XLA
compiles each new (op, shape) once (~50 ms here), and tiny configs share most of them,
which costs far less than one jit compile per variant. Inputs keep two canonical shapes
([2, 6] tokens, [2, 5] source; padded and packed rows reuse them) for the same reason.
"""

import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tx

VOCAB = 40

# Row 0 is full, row 1 ends in padding (pad id 0).
TOKENS = jnp.array([[5, 9, 3, 17, 22, 8], [7, 11, 30, 2, 0, 0]], jnp.int32)
SOURCE = jnp.array([[4, 12, 33, 6, 19], [25, 3, 9, 0, 0]], jnp.int32)


def tiny(family='decoder', **kw) -> tx.ModelConfig:
  base = dict(family=family, vocab_size=VOCAB, d_model=16, num_heads=4, d_ff=32, num_layers=2,
              max_len=16)
  base.update(kw)
  return tx.ModelConfig(**base)


def inputs(cfg, tokens=TOKENS, source=SOURCE):
  """Positional apply arguments of the family: (tokens,) or (src, tgt_in)."""
  return (source, tokens) if cfg.family == 'encoder_decoder' else (tokens,)


def random_params(model, *args, seed=0):
  """{'params': ...} with the boxed structure `model.init` gives, filled with random values.

  `jax.eval_shape` traces init without compiling it (compiling the threefry initialisers,
  above all inside `nn.scan`, costs seconds per config on CPU). Random norm scales and
  biases (instead of ones and zeros) also keep those terms from hiding bugs.
  tests/models/test_families.py runs the real init for every family.
  """
  shapes = jax.eval_shape(model.init, jax.random.key(0), *args)
  rng = np.random.default_rng(seed)

  def fill(path, box):
    shape = box.value.shape
    core = shape[1:] if box.names[:1] == ('layers',) else shape
    noise = rng.standard_normal(shape)
    if len(core) <= 1:  # norm scales around 1, biases around 0
      value = 1 + 0.2 * noise if jax.tree_util.keystr(path).endswith("['scale']") else 0.1 * noise
    else:  # kernels and tables: unit-variance outputs
      value = noise / np.sqrt(np.prod(core[:-1]))
    return box.replace_boxed(jnp.asarray(value.astype(box.value.dtype)))  # cast on the host

  params = jax.tree_util.tree_map_with_path(
      fill, shapes['params'], is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  return {'params': params}


_CACHE = {}


def build(cfg, seed=0):
  """(model, {'params': random params}) for `cfg`, made once per session."""
  key = (cfg, seed)
  if key not in _CACHE:
    model = tx.build_model(cfg)
    _CACHE[key] = model, random_params(model, *inputs(cfg), seed=seed)
  return _CACHE[key]


def init_cache(model, *args):
  """The 'cache' collection of a decode=True model, from its real init.

  Under jit XLA drops the (unused) parameter initialisers, so this compiles in ~0.1 s.
  """
  return jax.jit(lambda: model.init(jax.random.key(0), *args)['cache'])()


_JITTED = {}
STATIC = ('method', 'mutable', 'head', 'return_hidden', 'deterministic', 'sow_weights')


def jitted(model):
  """`jax.jit(model.apply)`, one per model (pass `mutable` as a tuple).

  For scanned stacks: op by op, `nn.scan` retraces (and recompiles) its body on every
  call, and tracing it dispatches dozens of small ops; one compile is cheaper.
  """
  key = (model.cfg, getattr(model, 'decode', False))
  if key not in _JITTED:
    _JITTED[key] = jax.jit(model.apply, static_argnames=STATIC)
  return _JITTED[key]


def loss_and_grads(cfg, variables, **settings):
  """(loss, gradients) of sum(sin(outputs)) for `cfg` with `settings` (e.g. an
  implementation's), jitted: what two implementations of one model must agree on."""
  model = tx.build_model(cfg.replace(**settings))
  args = inputs(cfg)
  return jax.jit(jax.value_and_grad(lambda v: jnp.sum(jnp.sin(model.apply(v, *args)))))(variables)


@pytest.fixture(scope='session')
def tm():
  """The helpers above ("tiny models"): conftest modules are not importable by name."""
  return types.SimpleNamespace(tiny=tiny, inputs=inputs, build=build, jitted=jitted,
                               init_cache=init_cache, random_params=random_params,
                               loss_and_grads=loss_and_grads, TOKENS=TOKENS, SOURCE=SOURCE,
                               VOCAB=VOCAB)
