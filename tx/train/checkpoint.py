"""Orbax checkpoints: one step holds everything needed to resume a run bitwise.

    ckpt = Checkpointer(workdir / 'checkpoints', keep=2, best_metric='loss')
    ckpt.save(step, state, data_state=it.get_state(), meta={'wall_time_s': t}, metrics=evals)
    state, data_state, meta, step = ckpt.restore(abstract_state)   # latest good step
    ckpt.close()                                                    # finishes async saves

Layout of one step (Orbax 0.12.8 on a local or NFS filesystem):

    <directory>/<step>.orbax-checkpoint-tmp/   while writing; never listed, never restored
    <directory>/<step>/                        after the commit (an atomic rename of the tmp dir)
        state/    the TrainState pytree (OCDBT + zarr; restored into the caller's shardings)
        data/     Grain iterator state (JSON)        meta/  small JSON dict
        metrics/  eval metrics used to keep the best step (JSON)
        commit_success.txt, _CHECKPOINT_METADATA

Orbax writes every file of a step into the tmp directory, then writes commit_success.txt and renames
the directory to `<step>` (on GCS, where rename is not atomic, commit_success.txt alone marks the
commit). A process killed before the rename leaves only the tmp directory, which Orbax's step
listing ignores and the next save of that step overwrites. A committed step can still be damaged
later (a truncated or deleted file, a half-finished deletion of an old step): `restore` then warns
and falls back to the previous readable step. A save that fills the disk raises
`tx.errors.DiskFullError` (one line) and removes its tmp directory, so the space it took is free
again and the previous step stays the latest; nothing is deleted before a step commits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import shutil
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as policies
from jax.experimental import multihost_utils

from tx import compat
from tx.errors import DiskFullError, is_disk_full
from tx.train import orphaned_reads
from tx.train.errors import CheckpointError

log = logging.getLogger(__name__)


class Checkpointer:
  """Saves and restores (TrainState, data-iterator state, meta) as one Orbax step.

  Keeps the latest `keep` steps plus the best step by `metrics[best_metric]` (lower is better for
  best_mode='min'; best_metric=None keeps only the latest). Every process of a multi-process run
  must make the same calls in the same order (saves and restores are collective).
  """

  def __init__(self, directory, *, keep: int = 2, async_save: bool = True,
               best_metric: str | None = 'loss', best_mode: str = 'min'):
    if keep < 1:
      raise ValueError(f'Checkpointer keep={keep}: keep at least 1 checkpoint')
    if best_mode not in ('min', 'max'):
      raise ValueError(f"Checkpointer best_mode={best_mode!r}: use 'min' or 'max'")
    self.directory = _absolute(directory)
    self._best_metric = best_metric
    self._corrupt: set[int] = set()
    self._pending: int | None = None
    self._disk_full = False  # a save failed for space: reported once, then close() is quiet
    orphaned_reads.silence()  # a save that fills the disk reports itself once, as one line
    keep_policies = [policies.LatestN(n=keep)]
    best_fn = None
    if best_metric is not None:
      best_fn = _MetricValue(best_metric, best_mode)
      keep_policies.append(policies.BestN(get_metric_fn=best_fn, reverse=best_mode == 'min', n=1,
                                          keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        enable_async_checkpointing=async_save,
        preservation_policy=policies.AnyPreservationPolicy(keep_policies),
        # best_fn only makes Orbax write the metrics item and read it back on restart (BestN above
        # needs it); the preservation policy alone decides what is deleted.
        best_fn=best_fn, best_mode=best_mode)
    handlers = {'state': ocp.StandardCheckpointHandler(), 'data': ocp.JsonCheckpointHandler(),
                'meta': ocp.JsonCheckpointHandler()}
    # A damaged metrics file leaves its step unranked instead of failing start-up (Orbax reads
    # every step's metrics when it opens a directory).
    self._manager = compat.checkpoint_manager(
        self.directory, unreadable_metrics=self._unreadable_metrics, item_handlers=handlers,
        options=options)

  # ----------------------------------------------------------------------------------------- save

  def save(self, step: int, state, *, data_state: dict | None = None, meta: dict | None = None,
           metrics: dict | None = None, force: bool = False) -> bool:
    """Starts saving `state` (+ data_state, meta) as checkpoint `step`; True if a save started.

    With async_save the device arrays are copied to host memory and the write continues in the
    background; the next `save`, `wait`, `restore` or `close` waits for it. A step that already
    exists, or one older than the latest step, is skipped (False) unless `force`, which replaces
    an existing checkpoint at `step`. data_state and meta must be JSON-serialisable; they are
    copied, so the caller may mutate them afterwards.
    """
    step = int(step)
    data_state = _json_copy(data_state, 'data_state', step)
    meta = _json_copy(meta, 'meta', step)
    self.wait()  # so all_steps below is final (Orbax would wait inside save anyway)
    self._drop_corrupt_at_or_after(step)
    steps = self.all_steps()
    if step in steps:
      if not force:
        log.info('checkpoint step %d already exists in %s; not saved again', step, self.directory)
        return False
      self._manager.delete(step)
    elif steps and step < steps[-1] and not force:
      log.warning('checkpoint step %d not saved: %s already holds the later step %d; use a fresh '
                  'directory to branch from an older step (or save(..., force=True))', step,
                  self.directory, steps[-1])
      return False
    items = {'state': ocp.args.StandardSave(jax.tree_util.tree_map(_key_data, state))}
    if data_state is not None:
      items['data'] = ocp.args.JsonSave(data_state)
    if meta is not None:
      items['meta'] = ocp.args.JsonSave(meta)
    with self._space_checked(step):
      started = self._manager.save(step, args=ocp.args.Composite(**items),
                                   metrics=self._ranking_metrics(metrics, step), force=True)
    self._pending = step if started else None
    return bool(started)

  def wait(self):
    """Blocks until the in-flight async save (if any) is committed; re-raises its error
    (DiskFullError, one line, if the disk filled up)."""
    with self._space_checked(self._pending):
      self._manager.wait_until_finished()
    self._pending = None

  def close(self):
    """Finishes in-flight saves and releases Orbax's threads."""
    try:
      with self._space_checked(self._pending):
        self._manager.close()
    except DiskFullError:
      if not self._disk_full:  # not reported yet: this is the first word of it
        raise
    finally:
      self._pending = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  # -------------------------------------------------------------------------------------- listing

  def all_steps(self) -> list[int]:
    """Committed steps, ascending; a step still being written asynchronously is not listed."""
    steps = sorted(self._manager.all_steps())
    if self._pending is not None and self._manager.is_saving_in_progress():
      steps = [s for s in steps if s != self._pending]
    return steps

  def latest_step(self) -> int | None:
    """The latest committed step, or None. Interrupted saves are never returned."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  # -------------------------------------------------------------------------------------- restore

  def restore(self, abstract_state, step: int | None = None):
    """Restores `(state, data_state, meta, step)` from `step` (default: the latest).

    abstract_state: the expected pytree of jax.ShapeDtypeStruct with `.sharding` (each process
    reads only its own shards, straight into those shardings), or of concrete arrays to take
    shapes and shardings from. The checkpoint must have exactly this structure, these shapes and
    dtypes, else CheckpointError (no silent cast or partial restore). data_state/meta are None
    when the step was saved without them. If the step is unreadable (truncated or deleted
    files), logs a warning and falls back to the previous step; CheckpointError if none is good.
    """
    self.wait()
    steps = self.all_steps()
    if not steps:
      raise CheckpointError(f'no checkpoint in {self.directory}; train first, or point at the '
                            'directory that holds the checkpoints')
    if step is None:
      step = steps[-1]
    elif step not in steps:
      raise CheckpointError(f'no checkpoint for step {step} in {self.directory} (available: '
                            f'{steps}); pass one of those steps or step=None for the latest')
    target = jax.tree_util.tree_map(_as_abstract, abstract_state)
    candidates = [s for s in reversed(steps) if s <= step]
    errors = []
    for i, s in enumerate(candidates):
      result, error = self._try_restore(s, target)
      if error is None:
        return result
      self._corrupt.add(s)
      errors.append(f'step {s}: {error}')
      if i + 1 < len(candidates):
        log.warning('checkpoint step %d in %s is unreadable (%s); falling back to step %d', s,
                    self.directory, error, candidates[i + 1])
    raise CheckpointError(f'no readable checkpoint at or before step {step} in {self.directory} '
                          f'({"; ".join(errors)}); delete the damaged step directories or start '
                          'from a fresh directory')

  def verify(self, step: int, abstract_state=None) -> bool:
    """True if checkpoint `step` reads back completely (all files present and full length).

    Reads the whole step: into abstract_state if given, else into host memory on one device.
    A structure mismatch with abstract_state raises CheckpointError rather than returning False.
    """
    self.wait()
    if step not in self.all_steps():
      return False
    if abstract_state is None:
      try:
        abstract_state = self._abstract_from_metadata(step)
      except Exception:  # unreadable metadata is a damaged step
        return False
    _, error = self._try_restore(step, jax.tree_util.tree_map(_as_abstract, abstract_state))
    return error is None

  # ------------------------------------------------------------------------------------- internal

  @contextlib.contextmanager
  def _space_checked(self, step: int | None):
    """Turns a disk-full error of Orbax (OSError or TensorStore's ValueError) into one
    DiskFullError line, after removing the failed step's tmp directory."""
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      if not is_disk_full(e) or isinstance(e, DiskFullError):
        raise
      self._remove_unfinished()
      self._pending = None
      reported, self._disk_full = self._disk_full, True
      if reported:
        raise DiskFullError('checkpoint: the disk is still full') from None
      latest = sorted(self._manager.all_steps())
      kept = (f'the latest complete checkpoint, step {latest[-1]}, is kept' if latest
              else 'no checkpoint was complete yet')
      what = 'a checkpoint' if step is None else f'checkpoint step {step}'
      raise DiskFullError(
          f'{what} was not written: no space left on the device holding {self.directory} '
          f'({_free_space(self.directory)} free); {kept}. Free some space and rerun the same '
          'command to resume') from None

  def _remove_unfinished(self):
    """Deletes `<step>.orbax-checkpoint-tmp` directories (never listed or restored). A failed
    async save's other writer threads may still be finishing files into one when its error
    arrives (then one rmtree leaves it behind), so this repeats until a look finds none, for
    up to ~5 s."""
    if jax.process_index() != 0 or '://' in os.fspath(self.directory):
      return
    for _ in range(50):
      leftovers = list(self.directory.glob('*.orbax-checkpoint-tmp*'))
      if not leftovers:
        return
      for tmp in leftovers:
        shutil.rmtree(os.fspath(tmp), ignore_errors=True)
      time.sleep(0.1)

  def _unreadable_metrics(self, step, error):
    log.warning('checkpoint step %d in %s: unreadable metrics (%s); the step is not ranked',
                step, self.directory, _one_line(error))

  def _try_restore(self, step, target):
    """((state, data, meta, step), None) or (None, one-line reason); agreed by all processes."""
    stored = jax.tree_util.tree_map(_key_data_abstract, target)
    error = None
    try:
      specs = _leaf_specs(self._state_metadata(step))
    except Exception as e:  # pylint: disable=broad-except
      error = _one_line(e)
    else:
      _check_structure(specs, _leaf_specs(stored), step, self.directory)
      try:
        result = self._read(step, stored, target)
      except Exception as e:  # pylint: disable=broad-except
        error = _one_line(e)
    if not _everywhere(error is None):
      return None, error or 'unreadable on another process'
    return result, None

  def _read(self, step, stored, target):
    items = {'state': ocp.args.StandardRestore(stored)}
    for name in ('data', 'meta'):
      if (self.directory / str(step) / name).exists():
        _check_json_item(self.directory / str(step) / name)
        items[name] = ocp.args.JsonRestore()
    out = self._manager.restore(step, args=ocp.args.Composite(**items))
    state = jax.block_until_ready(out['state'])
    state = jax.tree_util.tree_map(_wrap_key_data, target, state)
    return (state, out['data'] if 'data' in items else None,
            out['meta'] if 'meta' in items else None, step)

  def _state_metadata(self, step):
    # The state handler alone: Orbax's step metadata would also parse the metrics file.
    folder = self.directory / str(step) / 'state'
    try:
      tree = ocp.StandardCheckpointHandler().metadata(folder)
    except ValueError as e:  # a truncated _METADATA: name the file, not just the step
      raise ValueError(f'{folder / "_METADATA"} is damaged ({e})') from None
    tree = getattr(tree, 'tree', tree)
    if tree is None:
      raise FileNotFoundError('the state metadata is missing')
    return tree

  def _abstract_from_metadata(self, step):
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    return jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=device),
        self._state_metadata(step), is_leaf=lambda x: hasattr(x, 'shape'))

  def _drop_corrupt_at_or_after(self, step):
    # A resumed run falls back past damaged steps; they would block saving those step numbers
    # again (Orbax saves only steps after the latest), so they go once the run re-reaches them.
    for s in sorted(self._corrupt):
      if s >= step and s in self._manager.all_steps():
        log.warning('deleting unreadable checkpoint step %d in %s before saving step %d', s,
                    self.directory, step)
        self._manager.delete(s)
        self._corrupt.discard(s)

  def _ranking_metrics(self, metrics, step):
    if self._best_metric is None:
      return None
    if not metrics:
      return {}  # ranks worst; {} rather than None keeps Orbax from warning on every such save
    numbers = {k: _to_float(v) for k, v in metrics.items()}
    numbers = {k: v for k, v in numbers.items() if v is not None}
    if self._best_metric not in numbers:
      log.warning('checkpoint step %d: metrics have no numeric %r (got %s); this step is kept '
                  'only while among the latest', step, self._best_metric, sorted(metrics))
    return numbers


class _MetricValue:
  """Orbax ranking key: metrics[name] as float; NaN or missing ranks worst."""

  def __init__(self, name, mode):
    self.name, self.mode = name, mode

  def __call__(self, metrics):
    value = float(metrics.get(self.name, math.nan))
    if math.isnan(value):
      return math.inf if self.mode == 'min' else -math.inf
    return value


def _free_space(directory) -> str:
  try:
    free = shutil.disk_usage(os.fspath(directory)).free
  except OSError:
    return 'unknown'
  for unit in ('B', 'KiB', 'MiB', 'GiB'):
    if free < 1024 or unit == 'GiB':
      return f'{free:.0f} {unit}' if unit == 'B' else f'{free:.1f} {unit}'
    free /= 1024
  return ''


def _absolute(directory):
  text = os.fspath(directory)
  return epath.Path(text if '://' in text else os.path.abspath(text))


def _json_copy(value, name, step):
  if value is None:
    return None
  try:
    return json.loads(json.dumps(value))
  except (TypeError, ValueError) as e:
    raise TypeError(f'checkpoint step {step}: {name} must be a JSON-serialisable dict ({e})') from e


def _check_json_item(folder):
  """ValueError naming the file when a JSON item's `metadata` file (where Orbax's JSON handler
  keeps it) does not parse: Orbax's own error names no file."""
  file = folder / 'metadata'
  if file.is_file():
    try:
      json.loads(file.read_text())
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError alike
      raise ValueError(f'{file} is damaged ({e})') from None


def _to_float(value):
  try:
    return float(np.asarray(value))
  except (TypeError, ValueError):
    return None


def _as_abstract(leaf):
  """ShapeDtypeStruct (with sharding) of a restore-target leaf."""
  if isinstance(leaf, jax.ShapeDtypeStruct):
    return leaf
  if isinstance(leaf, jax.Array):
    return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
  return leaf  # numpy / python leaves: Orbax restores these as saved


def _is_key(leaf):
  return hasattr(leaf, 'dtype') and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)


# Typed PRNG keys are stored as their raw key data (uint32), so a checkpoint never depends on
# Orbax remembering the key type; the restore target's dtype turns the data back into keys.
def _key_data(leaf):
  return jax.random.key_data(leaf) if _is_key(leaf) else leaf


def _key_data_abstract(leaf):
  if not _is_key(leaf):
    return leaf
  data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
  return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=leaf.sharding)


def _wrap_key_data(target, leaf):
  return jax.random.wrap_key_data(leaf, dtype=target.dtype) if _is_key(target) else leaf


def _leaf_specs(tree):
  """{'a/b/0': (shape, dtype)} of the array leaves of a restore target or of Orbax metadata."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, 'shape'))
  specs = {}
  for path, leaf in flat:
    dtype = getattr(leaf, 'dtype', None)
    specs['/'.join(_key_name(k) for k in path)] = (
        tuple(leaf.shape), None if dtype is None else np.dtype(dtype))
  return specs


def _key_name(key):
  for attr in ('key', 'name', 'idx'):
    if hasattr(key, attr):
      return str(getattr(key, attr))
  return str(key)


def _check_structure(saved, expected, step, directory):
  """CheckpointError (one line) unless both specs have the same paths, shapes and dtypes."""
  problems = [f'{p} missing from the checkpoint' for p in expected if p not in saved]
  problems += [f'{p} in the checkpoint but not in the model' for p in saved if p not in expected]
  for p in expected:
    if p in saved and saved[p] != expected[p]:
      (s_shape, s_dtype), (e_shape, e_dtype) = saved[p], expected[p]
      problems.append(f'{p} is {s_dtype}{list(s_shape)} in the checkpoint but {e_dtype}'
                      f'{list(e_shape)} in the model')
  if problems:
    more = f' (+{len(problems) - 1} more)' if len(problems) > 1 else ''
    raise CheckpointError(
        f'checkpoint step {step} in {directory} belongs to a different model/config: '
        f'{problems[0]}{more}; resume with the config it was written with, or use a fresh '
        'directory')


def _one_line(error):
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  text = (lines[0] if lines else '').split(' [tensorstore_spec=')[0]
  return f'{type(error).__name__}: {text[:240]}'


def _everywhere(ok: bool) -> bool:
  """True iff `ok` on every process (so all processes fall back to the same step)."""
  if jax.process_count() == 1:
    return ok
  return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))
