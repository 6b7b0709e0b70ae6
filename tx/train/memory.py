"""Does a compiled training step fit? Its memory analysis against the device's memory.

    check_fits(compiled)   # ConfigError (one line) when the step cannot fit; train.memory_check

The step's need per device is the figure `tx plan` prints as `total`: arguments + outputs -
aliased (donated state) + temporaries + generated code, from XLA's buffer assignment of the
compiled executable, so nothing has to be allocated to know it. A device's memory is
`memory_stats()['bytes_limit']` on GPU/TPU; on CPU it is what the process can get: the
smallest of the host's physical memory and any cgroup limit (v2 memory.max, v1
memory.limit_in_bytes), shared by all the process's simulated CPU devices.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

from tx.config.base import ConfigError

_CGROUP_FILES = ('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes')


def step_bytes(mem) -> int:
  """Bytes per device of a compiled executable's `memory_analysis()`: argument + output -
  alias + temp + generated code."""
  code = getattr(mem, 'generated_code_size_in_bytes', 0) or 0
  return (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
          + mem.temp_size_in_bytes + code)


def compiled_bytes(compiled) -> int | None:
  """`step_bytes` of a compiled executable; None when the backend gives no memory analysis."""
  try:
    return step_bytes(compiled.memory_analysis())
  except Exception:  # pylint: disable=broad-except  (backends without memory analysis)
    return None


def host_bytes() -> int | None:
  """Memory this process can get: physical memory and cgroup limits, the smallest."""
  limits = []
  try:
    limits.append(os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE'))
  except (ValueError, OSError):
    pass
  for path in _cgroup_files():
    try:
      text = Path(path).read_text().strip()
    except OSError:
      continue
    if text.isdigit():  # 'max' (v2) means no limit
      limits.append(int(text))
  return min(limits) if limits else None


def _cgroup_files() -> list[str]:
  """The root cgroup files, and those of this process's own cgroup (v2: '0::/path')."""
  files = list(_CGROUP_FILES)
  try:
    for line in Path('/proc/self/cgroup').read_text().splitlines():
      parts = line.split(':', 2)
      if len(parts) == 3 and parts[2] not in ('', '/'):
        if parts[0] == '0':
          files.append(f'/sys/fs/cgroup{parts[2]}/memory.max')
        elif 'memory' in parts[1].split(','):
          files.append(f'/sys/fs/cgroup/memory{parts[2]}/memory.limit_in_bytes')
  except OSError:
    pass
  return files


def device_bytes(device) -> int | None:
  """A GPU/TPU's memory limit (memory_stats()['bytes_limit']); None when it does not say."""
  try:
    stats = device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except  (backends without memory stats)
    return None
  limit = stats.get('bytes_limit')
  return int(limit) if limit else None


def format_bytes(n: float) -> str:
  """1536 -> '1.5 KiB'; 9.7e12 -> '8.8 TiB'."""
  for unit in ('B', 'KiB', 'MiB', 'GiB', 'TiB'):
    if abs(n) < 1024 or unit == 'TiB':
      return f'{n:.0f} {unit}' if unit == 'B' else f'{n:.1f} {unit}'
    n /= 1024
  raise AssertionError('unreachable')


def check_fits(compiled, devices=None) -> None:
  """ConfigError (one line naming the sizes and the fix) when the compiled step needs more
  memory than a device of this process has; silent when the backend does not say."""
  need = compiled_bytes(compiled)
  if need is None:
    return
  devices = list(devices if devices is not None else jax.local_devices())
  fix = ('lower data.seq_len or train.batch_size, or use model.remat / mesh.fsdp (or '
         '--set train.memory_check=false to try anyway)')
  if devices[0].platform == 'cpu':
    have = host_bytes()
    total = need * len(devices)  # simulated CPU devices share the host's memory
    if have is not None and total > have:
      per = f' x {len(devices)} CPU devices' if len(devices) > 1 else ''
      raise ConfigError(f'the step needs {format_bytes(need)} per device{per}, this host has '
                        f'{format_bytes(have)}: {fix}')
    return
  have = device_bytes(devices[0])
  if have is not None and need > have:
    raise ConfigError(f'the step needs {format_bytes(need)} per device, a '
                      f'{devices[0].device_kind} has {format_bytes(have)}: {fix}')
