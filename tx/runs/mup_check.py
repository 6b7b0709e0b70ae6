"""`tx mup-check EXPERIMENT --widths 64,128,256,512 [--steps 10] [--set k=v ...] [--out DIR]`:
μP's coordinate check (Yang et al. 2022, fig. 5; microsoft/mup's `get_coord_data`).

For each width the experiment is rebuilt with model.d_model = width (d_ff and an explicit
head_dim scaled with it, heads fixed), trained `--steps` steps on its own training data
(tx.train's pieces: pipeline, task, optimizer, train step; no run directory), and after
each step one fixed batch (the first training batch) goes through the model with
`capture_intermediates`: the RMS (sqrt of the mean square over batch, positions and
features; microsoft/mup records mean |x|) of the embedding output, each block's attention
output (self and cross), FFN output and block output, and the output logits. Each kind's
RMS is averaged over layers.

The optimizer runs at its peak rate from the first step (optim.schedule=constant,
warmup_steps=0 unless --set says otherwise): a warmup would hide the updates. Dropout is
off. Under μP the curves against width are flat; under the standard parametrization the
hidden activations and logits grow with width (fastest at large learning rates).

Writes coord_check.json and coord_check.png (one panel per step shown x parametrization)
into --out (default runs/mup_check/<EXPERIMENT>) and prints a table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from tx.config.base import ConfigError, parse_overrides
from tx.config.experiment import ExperimentConfig
from tx.data import make_pipeline
from tx.layers.attention import MultiHeadAttention
from tx.layers.block import Block
from tx.layers.ffn import FeedForward
from tx.layers.moe import MoEFeedForward
from tx.models.build import build_model, dummy_inputs
from tx.models.embedder import InputEmbedder
from tx.models.heads import LMHead, MLMHead
from tx.tasks import make_task
from tx.train.optimizer import make_optimizer
from tx.train.state import TrainState
from tx.train.step import make_train_step

KINDS = ('embedding', 'attention', 'ffn', 'block', 'logits')
_CAPTURED = {InputEmbedder: 'embedding', MultiHeadAttention: 'attention', FeedForward: 'ffn',
             MoEFeedForward: 'ffn', Block: 'block', LMHead: 'logits', MLMHead: 'logits'}
DEFAULTS = {'optim.schedule': 'constant', 'optim.warmup_steps': 0}


def at_width(cfg: ExperimentConfig, width: int) -> ExperimentConfig:
  """`cfg` with d_model = width; d_ff and an explicit head_dim scaled alike, heads fixed."""
  m = cfg.model
  ratio = width / m.d_model
  model = m.replace(d_model=width, d_ff=max(1, round(m.d_ff * ratio)),
                    head_dim=max(1, round(m.head_dim * ratio)) if m.head_dim else None,
                    scan_layers=False, remat='none', dropout=0.0, attention_dropout=0.0)
  return cfg.replace(model=model)


def _rms_by_module(intermediates) -> dict[str, float]:
  """{'decoder/stack/layer_0/ffn': RMS, ...} of the captured `__call__` outputs."""
  out = {}
  for path, x in jax.tree_util.tree_flatten_with_path(intermediates)[0]:
    names = [str(getattr(k, 'key', getattr(k, 'idx', k))) for k in path]
    if '__call__' not in names:
      continue
    where = '/'.join(names[:names.index('__call__')])
    if where not in out and getattr(x, 'ndim', 0) >= 2:  # MoE etc.: the main output
      out[where] = float(np.sqrt(np.mean(np.square(np.asarray(x, np.float64)))))
  return out


def measure(cfg: ExperimentConfig, steps: int, batches=None) -> list[dict[str, float]]:
  """Per step 1..steps: {module path: RMS} plus the per-kind means ('kind:ffn', ...).

  batches: an iterator of training batches (tests); None = the experiment's training data.
  """
  if batches is None:
    pipe = make_pipeline(cfg.data, make_task(cfg).name, 'train',
                         batch_size=cfg.train.batch_size, seed=cfg.train.seed)
    if cfg.data.tokenizer != 'hf' or cfg.model.vocab_size < pipe.vocab_size:
      cfg = cfg.replace(model=cfg.model.replace(vocab_size=pipe.vocab_size))
    batches = pipe.iterator()
  task = make_task(cfg)
  model = build_model(cfg.model)
  optimizer, _ = make_optimizer(cfg.optim, total_steps=max(steps, 1), d_model=cfg.model.d_model,
                                model=cfg.model)
  rng = jax.random.key(cfg.train.seed)
  params = nn.unbox(model.init(rng, *dummy_inputs(cfg.model))['params'])
  state = TrainState(step=np.zeros((), np.int32), params=params, opt_state=optimizer.init(params),
                     rng=jax.random.key_data(rng), skips=np.zeros((), np.int32))
  step = jax.jit(make_train_step(model, task, optimizer, dropout=False))
  kinds: dict[str, str] = {}

  def capture(mdl, method):
    kind = _CAPTURED.get(type(mdl))
    if kind and method == '__call__':
      kinds['/'.join(mdl.scope.path)] = kind
      return True
    return False

  def probe(params, batch):
    args, kwargs = task.model_args(batch)
    _, state = model.apply({'params': params}, *args, deterministic=True, **kwargs,
                           capture_intermediates=capture, mutable=['intermediates'])
    return state['intermediates']

  first = next(batches)
  rows, batch = [], first
  for _ in range(steps):
    state, _ = step(state, batch)
    row = _rms_by_module(probe(state.params, first))
    for kind in KINDS:
      vals = [v for k, v in row.items() if kinds.get(k) == kind]
      if vals:
        row[f'kind:{kind}'] = float(np.mean(vals))
    rows.append(row)
    batch = next(batches)
  return rows


def coord_check(cfg: ExperimentConfig, widths: list[int], steps: int,
                parametrizations=('mup', 'standard'), batches=None) -> dict:
  """{'widths', 'steps', 'rms': {parametrization: {width: [per-step dicts]}}}.

  batches: () -> an iterator of training batches (tests); None = the experiment's data.
  """
  rms = {}
  for p in parametrizations:
    rms[p] = {}
    for w in widths:
      c = at_width(cfg, w)
      rms[p][w] = measure(c.replace(model=c.model.replace(parametrization=p)), steps,
                          batches() if batches else None)
  return {'experiment': cfg.name, 'widths': widths, 'steps': steps,
          'mup_base_width': cfg.model.mup_base_width, 'metric': 'rms', 'rms': rms}


def shown_steps(steps: int) -> list[int]:
  return sorted({1, math.ceil(steps / 2), steps})


def growth(result: dict, parametrization: str, kind: str, step: int) -> float:
  """RMS at the largest width over RMS at the smallest, at `step` (1-based)."""
  by_w = result['rms'][parametrization]
  ws = sorted(by_w, key=int)
  return by_w[ws[-1]][step - 1][f'kind:{kind}'] / by_w[ws[0]][step - 1][f'kind:{kind}']


def plot(result: dict, path: Path) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top  (heavy: kept off start-up)
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top  (heavy: kept off start-up)
  params, shown = list(result['rms']), shown_steps(result['steps'])
  fig, axes = plt.subplots(len(params), len(shown), figsize=(4 * len(shown), 3.4 * len(params)),
                           squeeze=False, sharey='row')
  for r, p in enumerate(params):
    by_w = result['rms'][p]
    ws = sorted(by_w, key=int)
    for c, s in enumerate(shown):
      ax = axes[r][c]
      for kind in KINDS:
        key = f'kind:{kind}'
        if key in by_w[ws[0]][s - 1]:
          ax.plot(ws, [by_w[w][s - 1][key] for w in ws], marker='o', label=kind)
      ax.set_xscale('log', base=2)
      ax.set_yscale('log')
      ax.set_title(f'{p}, step {s}')
      ax.set_xlabel('width (d_model)')
      if c == 0:
        ax.set_ylabel('activation RMS')
  axes[0][0].legend(fontsize=8)
  fig.suptitle(f'coordinate check: {result["experiment"]} '
               f'(base width {result["mup_base_width"]})')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def table(result: dict) -> str:
  """One line per parametrization x kind: RMS at each width (last step), growth ratio."""
  s = result['steps']
  ws = result['widths']
  lines = [f'step {s}: activation RMS by width; growth = largest / smallest width',
           f'{"":<20}' + ''.join(f'{w:>10}' for w in ws) + f'{"growth":>9}']
  for p, by_w in result['rms'].items():
    for kind in KINDS:
      key = f'kind:{kind}'
      if key in by_w[ws[0]][s - 1]:
        lines.append(f'{p + " " + kind:<20}' + ''.join(f'{by_w[w][s - 1][key]:>10.4g}' for w in ws)
                     + f'{growth(result, p, kind, s):>9.2f}')
  return '\n'.join(lines)


def parse_widths(text: str) -> list[int]:
  try:
    widths = sorted({int(w) for w in text.split(',') if w.strip()})
  except ValueError:
    widths = []
  if len(widths) < 2 or widths[0] <= 0:
    raise ConfigError(f'--widths: {text!r} needs two or more positive integers, '
                      'e.g. --widths 64,128,256')
  return widths


def cli(args, resolve) -> int:
  """`tx mup-check`; resolve(name, overrides) -> ExperimentConfig (registry.get)."""
  widths = parse_widths(args.widths)
  if args.steps < 1:
    raise ConfigError(f'--steps: must be >= 1, got {args.steps}')
  cfg = resolve(args.experiment, {**DEFAULTS, **parse_overrides(args.set)})
  for w in widths:
    if w % cfg.model.num_heads:
      raise ConfigError(f'--widths: {w} is not divisible by model.num_heads='
                        f'{cfg.model.num_heads}; pick multiples of it')
  which = ('mup', 'standard') if args.parametrization == 'both' else (args.parametrization,)
  result = coord_check(cfg, widths, args.steps, which)
  out = Path(args.out or Path('runs') / 'mup_check' / args.experiment)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'coord_check.json').write_text(json.dumps(result, indent=1))
  plot(result, out / 'coord_check.png')
  print(table(result))
  print(f'wrote {out / "coord_check.png"} and {out / "coord_check.json"}')
  return 0
