"""Loading a trained run back: its config, tokenizer and a checkpoint's state."""

from __future__ import annotations

import contextlib
from pathlib import Path

import flax.linen as nn
import jax

from tx.config.base import ConfigError
from tx.data.pipeline import dataset_tokenizer
from tx.models.build import build_model
from tx.train import run_dir
from tx.train.checkpoint import Checkpointer
from tx.train.errors import CheckpointError
from tx.train.mesh import logical_rules, make_mesh
from tx.train.optimizer import run_optimizer
from tx.train.state import state_shardings


def load_run(workdir: str | Path, *, step: int | None = None):
  """(config, state, mesh) of the run in `workdir` at `step` (default: latest complete)."""
  with open_checkpoints(workdir) as (cfg, ckpt, abstract, mesh):
    if step is None and ckpt.latest_step() is None:
      raise CheckpointError(f'{ckpt.directory}: no complete checkpoint; train first with '
                            '`tx train`')
    state, _, meta, step = ckpt.restore(abstract, step=step)
  return cfg, state, mesh, step


@contextlib.contextmanager
def open_checkpoints(workdir: str | Path):
  """Yields (config, Checkpointer, abstract TrainState, mesh) of the run in `workdir`, inside
  its mesh and logical-axis rules; the Checkpointer is closed on exit."""
  workdir = Path(workdir)
  cfg = run_dir.load_run_config(workdir)
  ckpt_dir = workdir / run_dir.CHECKPOINTS
  if not ckpt_dir.exists():
    raise CheckpointError(f'{ckpt_dir}: no checkpoints; train first with `tx train`')
  model = build_model(cfg.model)
  optimizer, _ = run_optimizer(cfg)
  mesh = make_mesh(cfg.mesh)
  ckpt = Checkpointer(ckpt_dir, keep=cfg.train.keep_checkpoints, async_save=False)
  try:
    with jax.set_mesh(mesh), \
        nn.logical_axis_rules(logical_rules(cfg.mesh)):
      abstract, _ = state_shardings(model, optimizer, cfg.model, mesh, logical_rules(cfg.mesh),
                                    cfg.train.seed)
      yield cfg, ckpt, abstract, mesh
  finally:
    ckpt.close()


def run_tokenizer(cfg):
  """The tokenizer the run was trained with (cached next to the prepared data), or, for
  data.tokenizer=hf, the Hugging Face tokenizer at data.tokenizer_path (`tx convert` copies
  a checkpoint's tokenizer.json into the run and points it there).

  A run whose model vocabulary differs from the tokenizer's (one made by `tx convert` from a
  checkpoint without a tokenizer.json) cannot turn texts into its token ids: ConfigError.
  An hf tokenizer may have fewer ids than the model (checkpoints pad their tables, e.g. T5).
  """
  tokenizer = dataset_tokenizer(cfg.data)
  size, model_size = tokenizer.vocab_size, cfg.model.vocab_size
  if cfg.data.tokenizer == 'hf':
    if size > model_size:
      raise ConfigError(f'model.vocab_size={model_size} but the tokenizer at data.tokenizer_path='
                        f'{cfg.data.tokenizer_path} has {size} ids: it is not this model\'s '
                        'tokenizer; point data.tokenizer_path at the checkpoint\'s tokenizer.json')
  elif size != model_size:
    raise ConfigError(f'model.vocab_size={model_size} but data.tokenizer='
                      f'{cfg.data.tokenizer!r} has {size} ids: the run cannot encode text (a '
                      'converted checkpoint needs its own tokenizer: put its tokenizer.json in '
                      'the checkpoint directory and run tx convert again, or use the Python API '
                      'with token ids, see tx.interop)')
  return tokenizer
