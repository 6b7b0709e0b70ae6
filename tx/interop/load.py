"""`load_hf(path) -> (ModelConfig, params)`: a local Hugging Face checkpoint as tx params."""

from __future__ import annotations

import types
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tx.config.base import ConfigError
from tx.config.model import ModelConfig
from tx.interop import bert, bloom, files, gpt2, llama, t5
from tx.interop import mistral, qwen3  # LLaMA-like (tx.interop.llama)
from tx.interop import gemma2, gemma3  # Gemma-2, Gemma-3 text
from tx.interop import gpt_neox  # GPT-NeoX / Pythia
from tx.interop.hf_config import HFConfig
from tx.interop.tensors import Tensors
from tx.models.build import build_model, dummy_inputs
from tx.train.errors import CheckpointError

# model_type of config.json -> the module holding config_from_hf / params_from_hf.
ARCHITECTURES: dict[str, types.ModuleType] = {
    'gpt2': gpt2, 'llama': llama, 'bloom': bloom, 'bert': bert, 't5': t5}
ARCHITECTURES.update({'mistral': mistral, 'qwen3': qwen3})
ARCHITECTURES.update({'gemma2': gemma2, 'gemma3_text': gemma3})
ARCHITECTURES['gpt_neox'] = gpt_neox


def architecture(hf: HFConfig) -> types.ModuleType:
  """The module mapping this config.json's model_type."""
  if hf.model_type not in ARCHITECTURES:
    raise ConfigError(f'{hf.source}: model_type={hf.model_type!r} is not supported; tx imports '
                      f'{", ".join(sorted(ARCHITECTURES))}')
  return ARCHITECTURES[hf.model_type]


def read_hf_config(path) -> ModelConfig:
  """The tx ModelConfig of the checkpoint directory `path` (reads config.json only)."""
  path = files.checkpoint_dir(path)
  hf = HFConfig(files.read_config(path), str(path / files.CONFIG))
  return architecture(hf).config_from_hf(hf)


def load_hf(path: str | Path) -> tuple[ModelConfig, dict]:
  """(ModelConfig, params) of the Hugging Face checkpoint directory `path`.

  `path` holds config.json and model.safetensors (or its shards, or pytorch_model.bin).
  params is the plain (unboxed) float32 tree that `tx.build_model(config).apply(
  {'params': params}, ...)` takes: decoder-only tokens [B, L] -> logits [B, L, V];
  encoder (BERT) tokens [B, L] -> MLM logits [B, L, V]; encoder-decoder (T5)
  src [B, S], tgt_in [B, L] -> logits [B, L, V]. Pad id 0 (see tx.interop's notes).
  """
  path = files.checkpoint_dir(path)
  hf = HFConfig(files.read_config(path), str(path / files.CONFIG))
  arch = architecture(hf)
  cfg = arch.config_from_hf(hf)
  raw, source = files.read_tensors(path)
  tensors = Tensors(raw, source, prefix=arch.PREFIX, ignore=arch.IGNORE)
  params = arch.params_from_hf(cfg, tensors)
  tensors.finish()
  _check_tree(cfg, params, source)
  return cfg, jax.tree_util.tree_map(jnp.asarray, params)


def _check_tree(cfg: ModelConfig, params: dict, source: str) -> None:
  """The imported tree must be exactly the tree tx would initialise (names and shapes)."""
  model = build_model(cfg)
  abstract = jax.eval_shape(lambda: model.init(jax.random.key(0), *dummy_inputs(cfg)))['params']
  want = {jax.tree_util.keystr(k): tuple(v.shape)
          for k, v in jax.tree_util.tree_leaves_with_path(nn.unbox(abstract))}
  got = {jax.tree_util.keystr(k): tuple(np.shape(v))
         for k, v in jax.tree_util.tree_leaves_with_path(params)}
  if want != got:
    diff = sorted(set(want.items()) ^ set(got.items()))
    raise CheckpointError(f'{source}: the imported params do not fit the tx model '
                          f'({len(diff)} differences, first {diff[0]}); this is a bug in '
                          'tx.interop, please report it')
