"""Reading a Hugging Face checkpoint directory: config.json and its tensors, as numpy.

    DIR/config.json                                   required
    DIR/model.safetensors                             one file, or
    DIR/model.safetensors.index.json + the shards     a sharded checkpoint, or
    DIR/pytorch_model.bin (+ .index.json shards)      a PyTorch state dict (needs torch)

safetensors are read with the `safetensors` package's numpy API, so importing them needs no
torch; bfloat16 tensors (numpy has no bfloat16) are read from the file's documented layout
(an 8-byte header length, a JSON header, raw little-endian bytes) with `ml_dtypes`. A
PyTorch state dict is read with `torch.load(..., weights_only=True)`: tensors only, never
arbitrary pickled objects. Every problem a user can cause is a one-line `CheckpointError`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from tx.train.errors import CheckpointError

SAFETENSORS = 'model.safetensors'
TORCH_BIN = 'pytorch_model.bin'
CONFIG = 'config.json'


def checkpoint_dir(path) -> Path:
  """The directory `path`, or a CheckpointError saying what is missing."""
  path = Path(path).expanduser()
  if not path.exists():
    raise CheckpointError(f'{path}: no such directory; pass a local Hugging Face checkpoint '
                          'directory (config.json + model.safetensors)')
  if not path.is_dir():
    raise CheckpointError(f'{path}: not a directory; pass the directory holding config.json')
  if not (path / CONFIG).exists():
    raise CheckpointError(f'{path / CONFIG}: not found; a Hugging Face checkpoint directory '
                          'needs its config.json next to the weights')
  return path


def read_config(path: Path) -> dict:
  """config.json as a dict."""
  file = Path(path) / CONFIG
  try:
    data = json.loads(file.read_text())
  except (OSError, ValueError) as e:
    raise CheckpointError(f'{file}: unreadable JSON ({e}); restore the file from the '
                          'checkpoint') from None
  if not isinstance(data, dict):
    raise CheckpointError(f'{file}: expected a JSON object')
  return data


def read_tensors(path: Path) -> tuple[dict[str, np.ndarray], str]:
  """({name: array}, a description of the files read) of the checkpoint in `path`."""
  path = Path(path)
  for name, reader in ((SAFETENSORS, _read_safetensors), (TORCH_BIN, _read_torch)):
    if (path / name).exists():
      return reader(path / name), str(path / name)
    index = path / f'{name}.index.json'
    if index.exists():
      tensors = {}
      for shard in _shards(index):
        tensors.update(reader(path / shard))
      return tensors, str(index)
  raise CheckpointError(f'{path}: no {SAFETENSORS} or {TORCH_BIN} (nor their .index.json); '
                        'save the model with save_pretrained into this directory')


def _shards(index: Path) -> list[str]:
  try:
    weight_map = json.loads(index.read_text())['weight_map']
  except (OSError, ValueError, KeyError, TypeError):
    raise CheckpointError(f'{index}: not a valid shard index (needs a "weight_map")') from None
  shards = sorted(set(weight_map.values()))
  for shard in shards:
    if Path(shard).name != shard or not (index.parent / shard).exists():
      raise CheckpointError(f'{index}: shard {shard!r} not found next to the index')
  return shards


def _read_safetensors(file: Path) -> dict[str, np.ndarray]:
  try:
    # optional (the interop extra)
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  except ImportError:
    load_file = None
  if load_file is not None:
    try:
      return load_file(str(file))
    except TypeError:  # a dtype numpy does not know (bfloat16): read the raw layout below
      pass
    except Exception as e:  # safetensors raises its own error type for damaged files
      raise CheckpointError(f'{file}: unreadable safetensors file ({e})') from None
  return _read_safetensors_raw(file)


_RAW_DTYPES = {'F64': '<f8', 'F32': '<f4', 'F16': '<f2', 'I64': '<i8', 'I32': '<i4',
               'I16': '<i2', 'I8': 'i1', 'U8': 'u1', 'BOOL': '?'}


def _read_safetensors_raw(file: Path) -> dict[str, np.ndarray]:
  """The safetensors layout read directly (used for bfloat16, or without the package)."""
  import ml_dtypes  # pylint: disable=g-import-not-at-top  (a dependency of jax)
  data = file.read_bytes()
  try:
    (size,) = struct.unpack('<Q', data[:8])
    header = json.loads(data[8:8 + size])
  except (struct.error, ValueError):
    raise CheckpointError(f'{file}: not a safetensors file (bad header)') from None
  body = memoryview(data)[8 + size:]
  out = {}
  for name, spec in header.items():
    if name == '__metadata__':
      continue
    kind = spec.get('dtype')
    dtype = np.dtype(ml_dtypes.bfloat16) if kind == 'BF16' else _RAW_DTYPES.get(kind)
    if dtype is None:
      raise CheckpointError(f'{file}: tensor {name!r} has dtype {kind}, which tx cannot read')
    start, end = spec['data_offsets']
    out[name] = np.frombuffer(body[start:end], dtype=dtype).reshape(spec['shape']).copy()
  return out


def _read_torch(file: Path) -> dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top  (optional (the interop extra); heavy)
  except ImportError:
    raise CheckpointError(f'{file}: reading a PyTorch state dict needs torch; install the '
                          'extra (pip install -e ".[interop]") or convert the checkpoint to '
                          'safetensors') from None
  try:
    state = torch.load(str(file), map_location='cpu', weights_only=True)
  except Exception as e:  # torch raises many types for damaged or non-tensor files
    raise CheckpointError(f'{file}: not a loadable tensors-only state dict ({e})') from None
  if not isinstance(state, dict):
    raise CheckpointError(f'{file}: expected a state dict (name -> tensor)')
  return {k: v.detach().float().numpy() if v.dtype == torch.bfloat16 else v.detach().numpy()
          for k, v in state.items()}
