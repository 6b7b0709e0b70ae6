"""μP's learning-rate side (Yang et al. 2022, "Tensor Programs V"), and the whole table.

Under `model.parametrization=mup`, with width_mult m = d_model / mup_base_width, every
parameter is classified the way microsoft/mup does it: by how many of its dimensions grow
with width ("infinite" dimensions, found by comparing its shape with a model twice as
wide, d_model, d_ff and an explicit head_dim doubled, heads fixed):

    kind           tx parameters                            init (model side)      Adam LR
    matrix-like    attention q/k/v/out kernels, FFN wi/wo,  xavier, var ∝ 1/fan_in  x 1/m
      (2 inf.)     MoE experts, BERT's MLM transform        (unchanged)
    vector-like    token embeddings                         std mup_base_width^-0.5 x 1
      (1 inf.)                                              (constant in width)
                   position / type embeddings, norms,       unchanged (constant)    x 1
                   biases, MoE router
                   output head (untied lm_head / tied        unchanged, output       x 1
                   table), MLM decoder                       multiplier 1/m
    scalar-like    T5 relative-position buckets              unchanged               x 1
      (0 inf.)

Model side (tx/models): the token embedding's init std is mup_base_width^-0.5 instead of
d_model^-0.5 (layer_configs.embed_config), attention scores use 1/head_dim matched at the
base width (AttentionConfig.scale_multiplier = sqrt(base head_dim / head_dim)), and the
output logits are multiplied by 1/m (heads.py). tx's hidden kernels are xavier-uniform
(variance 2 / (fan_in + fan_out)); when d_model and d_ff grow together both fans grow with
m, so that is already μP's Θ(1/fan_in) and nothing changes, which keeps μP at the base
width identical to the standard parametrization (m = 1: every multiplier is 1).

Other optimizers (the multipliers below, 1 where not listed):
    sgd        vector-like x m, matrix-like x fan_in mult / fan_out mult (= 1 here)
               (microsoft/mup's MuSGD)
    adafactor  as Adam (its update is RMS-normalised like Adam's)
    muon       the kernels muon orthogonalises x m^-1/2: tx scales muon's update by
               0.2 sqrt(max(fan_in, fan_out)) (optim.py), which grows as sqrt(m), so this
               keeps its spectral norm at the base width's (spectral μP); the Adam-updated
               rest as Adam.

Weight decay: coupled decay (lr(t) * weight_decay * param) is scaled with the rate, as in
microsoft/mup's MuAdamW; independent decay (`optim.independent_weight_decay`) is not.
"""

from __future__ import annotations

import functools

import jax

from tx.config.model import ModelConfig
from tx.models.build import build_model, dummy_inputs
from tx.train.param_groups import path_names

MATRIX, VECTOR, SCALAR = 'matrix', 'vector', 'scalar'
ADAM_LIKE = ('adamw', 'adam', 'adafactor')


def doubled(cfg: ModelConfig) -> ModelConfig:
  """The same model twice as wide (d_model, d_ff, an explicit head_dim; heads fixed)."""
  return cfg.replace(d_model=2 * cfg.d_model, d_ff=2 * cfg.d_ff,
                     head_dim=2 * cfg.head_dim if cfg.head_dim else None)


@functools.lru_cache(maxsize=16)
def _shapes(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
  """{parameter path names: shape} of the model `cfg` describes (no memory used)."""
  model = build_model(cfg.replace(scan_layers=False))
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), *dummy_inputs(cfg)))['params']
  flat = jax.tree_util.tree_flatten_with_path(params)[0]
  return {path_names(p): tuple(x.shape) for p, x in flat}


def infinite_dims(cfg: ModelConfig) -> dict[tuple[str, ...], int]:
  """{parameter path names: how many of its dimensions grow with width}.

  Unscanned paths (a scanned stack's 'layers' axis neither grows nor changes the count).
  """
  base = cfg.replace(parametrization='standard')
  small, big = _shapes(base), _shapes(doubled(base))
  return {k: sum(a != b for a, b in zip(s, big[k])) for k, s in small.items()}


def kind_of(n_inf: int) -> str:
  return MATRIX if n_inf >= 2 else VECTOR if n_inf == 1 else SCALAR


def lr_multiplier(kind: str, optimizer: str, width_mult: float, *, muon: bool = False) -> float:
  """The per-parameter learning-rate multiplier of the table above."""
  if muon:
    return width_mult ** -0.5
  if optimizer == 'sgd':
    return width_mult if kind == VECTOR else 1.0
  return 1.0 / width_mult if kind == MATRIX else 1.0


def _scanned_key(names: tuple[str, ...]) -> tuple[str, ...]:
  """'.../stack/layers/...' (scan_layers) -> '.../stack/layer_0/...' (the same shapes minus
  the leading layer axis, which never grows); a scanned group's '.../layers/block_i/...'
  (model.attention_pattern) -> '.../layer_i/...'."""
  out = []
  for n in names:
    if out and out[-1] == 'layer_0' and n.startswith('block_'):
      out[-1] = 'layer_' + n[len('block_'):]
    else:
      out.append('layer_0' if n == 'layers' else n)
  return tuple(out)


def lr_multipliers(params, cfg: ModelConfig, optimizer: str, muon_mask=None):
  """A tree like `params` (unboxed arrays or shapes) of float LR multipliers.

  muon_mask: a tree like params, True where muon updates the leaf (optim.name=muon).
  All ones unless `cfg.parametrization == 'mup'` and d_model != mup_base_width.
  """
  m = cfg.width_mult
  if m == 1.0:
    return jax.tree_util.tree_map(lambda _: 1.0, params)
  n_inf = infinite_dims(cfg)
  if muon_mask is None:
    muon_mask = jax.tree_util.tree_map(lambda _: False, params)

  def one(path, _, is_muon):
    names = path_names(path)
    key = names if names in n_inf else _scanned_key(names)
    if key not in n_inf:
      raise ValueError(f'μP: parameter {"/".join(names)} is not a parameter of the model '
                       'model.* describes, so it has no learning-rate multiplier')
    return lr_multiplier(kind_of(n_inf[key]), optimizer, m, muon=bool(is_muon))

  return jax.tree_util.tree_map_with_path(one, params, muon_mask)


def table(cfg: ModelConfig, optimizer: str = 'adamw') -> dict[str, tuple[str, float]]:
  """{'path/of/param': (kind, Adam-family or sgd LR multiplier)} of a model config."""
  m = cfg.width_mult
  return {'/'.join(names): (kind_of(n), lr_multiplier(kind_of(n), optimizer, m) if m != 1 else 1.0)
          for names, n in infinite_dims(cfg).items()}
