"""What a run leaves in `--workdir`: config.json, metrics.jsonl, TensorBoard events,
checkpoints/ and summary.json."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import jax

from tx.compat import without_torch
from tx.config.base import ConfigError, from_dict, to_dict
from tx.config.experiment import ExperimentConfig

log = logging.getLogger(__name__)

CONFIG = 'config.json'
METRICS = 'metrics.jsonl'
SUMMARY = 'summary.json'
CHECKPOINTS = 'checkpoints'
# What to do about a damaged config.json (a run's checkpoints cannot be read without it).
CONFIG_FIX = ('restore it from a copy, or delete it and rerun `tx train` with the experiment and '
              '--set values the run was started with (that rewrites it and resumes)')


def write_json(path: Path, data) -> None:
  """Atomic JSON write (temp file + rename): a reader never sees half a file."""
  tmp = path.with_name(f'.{path.name}.tmp')
  tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + '\n')
  os.replace(tmp, path)


def read_json(path: str | Path, *, fix: str = 'restore it from a copy, or delete it and rerun '
              'the command that wrote it', kind: type = dict, prefix: str = ''):
  """The JSON object in `path`; ConfigError naming the file and `fix` when it is unreadable,
  not JSON (truncated by a crash or an edit) or not a `kind` (`prefix` leads the line, e.g.
  '--workdir: '). A missing file raises FileNotFoundError, which callers check for first."""
  path = Path(path)
  try:
    data = json.loads(path.read_text(encoding='utf-8'))
  except FileNotFoundError:
    raise
  except (OSError, UnicodeDecodeError) as e:
    raise ConfigError(f'{prefix}{path} is unreadable ({e}); {fix}') from None
  except ValueError as e:
    raise ConfigError(f'{prefix}{path} is unreadable (truncated or not JSON: {e}); '
                      f'{fix}') from None
  if not isinstance(data, kind):
    raise ConfigError(f'{prefix}{path} is unreadable (a JSON {type(data).__name__}, not '
                      f'{kind.__name__}); {fix}')
  return data


def make_workdir(path: Path) -> Path | None:
  """Creates `path` and its missing parents; returns the topmost directory it created (None
  when `path` existed), for `remove_made`."""
  top, probe = None, path
  while not probe.exists():
    top, probe = probe, probe.parent
  path.mkdir(parents=True, exist_ok=True)
  return top


def remove_made(path: Path, top: Path | None) -> None:
  """Removes the directories `make_workdir` created, from `path` up to `top`, if still empty
  (a run refused before writing leaves nothing behind)."""
  if top is None:
    return
  while True:
    try:
      path.rmdir()
    except OSError:
      return
    if path == top:
      return
    path = path.parent


def check_workdir(workdir: str | Path, experiment: str) -> Path:
  """Refuses an unwritable workdir or one holding a different experiment's run.

  Writes nothing; the caller writes config.json once everything else has been validated.
  """
  path = Path(workdir).expanduser().resolve()
  probe = path
  while not probe.exists():
    probe = probe.parent
  if not os.access(probe, os.W_OK):
    raise ConfigError(f'--workdir: {path} is not writable; choose a directory you can write to')
  if path.exists() and not path.is_dir():
    raise ConfigError(f'--workdir: {path} exists and is not a directory')
  config_path = path / CONFIG
  if config_path.exists():
    previous = read_json(config_path, prefix='--workdir: ',
                         fix=f'{CONFIG_FIX}, or use another workdir').get('name')
    if previous != experiment:
      raise ConfigError(f'--workdir: {path} holds a run of experiment {previous!r}, not '
                        f'{experiment!r}; use another --workdir')
  return path


def load_run_config(workdir: str | Path):
  """The ExperimentConfig a run directory was trained with (a relative data.tokenizer_path
  is relative to the run directory: see `config_dict`)."""
  path = Path(workdir) / CONFIG
  if not path.exists():
    raise ConfigError(f'--workdir: {path} not found; point --workdir at a directory made by '
                      '`tx train`')
  return load_config_file(path)


def load_config_file(path: str | Path):
  """The ExperimentConfig of a resolved config.json anywhere (a run's, or a copy of it); a
  relative data.tokenizer_path is relative to the file's directory."""
  path = Path(path).expanduser()
  if not path.is_file():
    raise ConfigError(f'{path} not found; pass the config.json of a run (made by `tx train`) '
                      'or a registered experiment name')
  cfg = from_dict(ExperimentConfig, read_json(path, fix=CONFIG_FIX))
  tokenizer = cfg.data.tokenizer_path
  if tokenizer is not None and not Path(tokenizer).expanduser().is_absolute():
    cfg = cfg.replace(data=cfg.data.replace(
        tokenizer_path=str(path.parent.resolve() / tokenizer)))
  return cfg


class MetricsWriter:
  """One JSON object per log step in metrics.jsonl, mirrored to TensorBoard (process 0)."""

  def __init__(self, workdir: Path):
    self.enabled = jax.process_index() == 0
    self._file = None
    self._tb = None
    if self.enabled:
      self._file = open(workdir / METRICS, 'a', buffering=1)
      writer_class = _tensorboard_writer()
      self._tb = writer_class(str(workdir / 'tensorboard')) if writer_class else None

  def drop_after(self, step: int) -> None:
    """Forgets rows logged after `step` (a resumed run logs those steps again), and a torn last
    line left by a kill, so metrics.jsonl reads like the log of an uninterrupted run."""
    if not self.enabled:
      return
    path = Path(self._file.name)
    self._file.close()
    kept = []
    # errors='replace': a line torn inside damaged bytes fails to parse and is dropped.
    for line in path.read_text(encoding='utf-8', errors='replace').splitlines():
      try:
        row = json.loads(line)
      except ValueError:
        continue
      row_step = row.get('step', 0) if isinstance(row, dict) else None
      if isinstance(row_step, int) and row_step <= step:
        kept.append(line + '\n')
    tmp = path.with_name(f'.{path.name}.tmp')
    tmp.write_text(''.join(kept))
    os.replace(tmp, path)
    self._file = open(path, 'a', buffering=1)

  def write(self, step: int, metrics: dict, prefix: str = '') -> None:
    if not self.enabled:
      return
    row = {'step': int(step), 'time': time.time()}
    row.update({f'{prefix}{k}': _plain(v) for k, v in metrics.items()})
    self._file.write(json.dumps(row) + '\n')
    if self._tb is not None:
      for k, v in metrics.items():
        if isinstance(v, (int, float)):
          self._tb.add_scalar(f'{prefix}{k}', v, step)

  def close(self) -> None:
    if self._file:
      self._file.close()
    if self._tb is not None:
      self._tb.close()


def _tensorboard_writer():
  """tensorboardX's SummaryWriter, or None (a warning) when it cannot be imported.

  tensorboardX imports torch when torch is installed (the interop extra) only to accept torch
  tensors; tx logs floats, so torch is hidden from that import: seconds less per run, and a
  broken torch install cannot stop training.
  """
  try:
    with without_torch():
      # heavy: kept off start-up
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    return SummaryWriter
  except Exception as e:  # pylint: disable=broad-except
    log.warning('TensorBoard events are off: tensorboardX failed to import (%s)', e)
    return None


def _plain(v):
  return float(v) if hasattr(v, '__float__') and not isinstance(v, (int, bool)) else v


def config_dict(cfg, workdir: str | Path) -> dict:
  """config.json's contents. data.tokenizer_path is stored relative to the run directory
  when it lies inside it (`tx convert` copies a checkpoint's tokenizer there), so a run
  directory can be moved or copied whole; any other path is stored absolute."""
  d = to_dict(cfg)
  tokenizer = cfg.data.tokenizer_path
  if tokenizer is not None:
    path = Path(tokenizer).expanduser().resolve()
    root = Path(workdir).expanduser().resolve()
    d['data']['tokenizer_path'] = str(path.relative_to(root) if path.is_relative_to(root)
                                      else path)
  return d
