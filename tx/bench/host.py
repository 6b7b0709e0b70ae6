"""The host a `tx bench` run measured on: CPU, ISA, caches, memory, XLA flags, versions.

The same code runs 3-6x faster on one of the project's hosts than on another (an AVX2 host
against an AVX-512 one; benchmarks/NOTES.md, "Hosts"), so every timing carries its host.

    from tx.bench import host
    info = host.probe()          # this machine (Linux: /proc/cpuinfo, /sys, /proc/meminfo)
    print(host.summary(info))    # the two lines `tx bench` prints above its table

`probe(env)` returns a JSON-ready dict:

    vendor            str    'AuthenticAMD', 'GenuineIntel', ... ('unknown' when not found)
    model_name        str    'AMD EPYC', 'Intel(R) Xeon(R) Processor', ...
    family, model, stepping   int | None   cpuinfo's 'cpu family', 'model', 'stepping'
    logical_cpus      int | None   processors listed in cpuinfo (hardware threads)
    physical_cores    int | None   distinct (physical id, core id) pairs
    threads_per_core  int | None   logical_cpus // physical_cores
    cpu_count         int | None   os.cpu_count()
    usable_cpus       int | None   CPUs this process may run on (sched_getaffinity)
    isa               dict[str, bool]   each of ISA_FLAGS: present in cpuinfo's flags
    isa_level         str    'amx' | 'avx512' | 'avx2' | 'baseline' | 'unknown'
    caches            dict[str, int]    bytes per cache of cpu0: 'L1d', 'L1i', 'L2', 'L3'
                                        (those found; {} when /sys has none)
    memory_bytes      int | None   MemTotal
    xla_flags         str    XLA_FLAGS of `env` (for `tx bench`: what every measurement gets)
    xla_flags_env     str    XLA_FLAGS of this process's environment, as found
    jax, jaxlib       str | None   installed versions (read without importing jax)
    platform, machine str    platform.platform(), platform.machine()
    source            str    '/proc/cpuinfo' or 'platform' (the fallback: platform.processor())

tx sets no XLA flag of its own: `tx bench` passes XLA_FLAGS through to its measurements,
dropping only `--xla_force_host_platform_device_count` (one device per process; see
tx/bench/worker.py `thread_env`, which also sets GLIBC_TUNABLES from tx/malloc_tuning.py).
`parse_cpuinfo` is pure (text in, dict out) so other hosts are testable from fixture text.
"""

from __future__ import annotations

from importlib import metadata
import os
import platform

# The ISA extensions that decide how fast XLA:CPU's and oneDNN's kernels can go.
ISA_FLAGS = ('fma', 'avx2', 'avx512f', 'avx512_bf16', 'avx512_vnni', 'amx_tile', 'amx_bf16',
             'amx_int8')
CPUINFO = '/proc/cpuinfo'
CACHE_DIR = '/sys/devices/system/cpu/cpu0/cache'
MEMINFO = '/proc/meminfo'


def _int(value):
  try:
    return int(value, 0) if value.startswith('0x') else int(value)
  except (AttributeError, ValueError):
    return None


def has_bf16_arithmetic(host: dict | None) -> bool | None:
  """Whether a `probe` record's CPU has bf16 arithmetic (avx512_bf16 or AMX-BF16); None
  where its ISA is unknown. Without it, bf16 products are emulated in float32 (torch's
  autocast and GEMM many times slower than float32)."""
  isa = (host or {}).get('isa')
  if not isa:
    return None
  return bool(isa.get('avx512_bf16') or isa.get('amx_bf16'))


def isa_level(isa: dict) -> str:
  """The widest matrix/vector unit named in `isa` (ISA_FLAGS -> bool)."""
  if not isa:
    return 'unknown'
  for level, flag in (('amx', 'amx_bf16'), ('avx512', 'avx512f'), ('avx2', 'avx2')):
    if isa.get(flag):
      return level
  return 'baseline'


def parse_cpuinfo(text: str) -> dict:
  """The CPU fields of `probe` (vendor ... isa_level) from the text of /proc/cpuinfo.

  x86 names ('vendor_id', 'model name', 'flags') and Arm ones ('CPU implementer',
  'Features') are read; a field that is absent is 'unknown' / None; `isa` is {} when the
  text lists no flags at all.
  """
  blocks = [b for b in text.split('\n\n') if b.strip()]
  procs = []
  for block in blocks:
    fields = {}
    for line in block.splitlines():
      key, sep, value = line.partition(':')
      if sep:
        fields.setdefault(key.strip().lower(), value.strip())
    if fields:
      procs.append(fields)
  first = procs[0] if procs else {}
  logical = sum('processor' in p for p in procs) or None
  cores = {(p.get('physical id'), p['core id']) for p in procs if 'core id' in p}
  physical = len(cores) or None
  flag_text = first.get('flags', first.get('features'))
  flags = set(flag_text.split()) if flag_text is not None else None
  isa = {} if flags is None else {f: f in flags for f in ISA_FLAGS}
  vendor = first.get('vendor_id') or first.get('cpu implementer') or 'unknown'
  model_name = first.get('model name') or first.get('hardware') or first.get('processor', '')
  return {
      'vendor': vendor,
      'model_name': model_name if model_name and not model_name.isdigit() else 'unknown',
      'family': _int(first.get('cpu family')),
      'model': _int(first.get('model')),
      'stepping': _int(first.get('stepping')),
      'logical_cpus': logical,
      'physical_cores': physical,
      'threads_per_core': logical // physical if logical and physical else None,
      'isa': isa,
      'isa_level': isa_level(isa),
  }


def parse_size(text: str) -> int | None:
  """Bytes of a cache size as /sys writes it ('32K', '1024K', '32768K', '2M')."""
  text = text.strip().upper().removesuffix('B').removesuffix('I')
  scale = {'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}.get(text[-1:], 1)
  number = _int(text.rstrip('KMG').strip())
  return None if number is None else number * scale


def read_caches(root: str = CACHE_DIR) -> dict[str, int]:
  """{'L1d': bytes, 'L1i': bytes, 'L2': bytes, 'L3': bytes} of cpu0 (those /sys lists)."""
  out = {}
  try:
    entries = sorted(e for e in os.listdir(root) if e.startswith('index'))
  except OSError:
    return out
  for entry in entries:
    def read(name, entry=entry):
      with open(os.path.join(root, entry, name), encoding='utf-8') as f:
        return f.read().strip()
    try:
      level, kind, size = read('level'), read('type'), parse_size(read('size'))
    except OSError:
      continue
    suffix = {'Data': 'd', 'Instruction': 'i'}.get(kind, '')
    if size is not None:
      out[f'L{level}{suffix}'] = size
  return out


def _memory_bytes() -> int | None:
  try:
    with open(MEMINFO, encoding='utf-8') as f:
      for line in f:
        if line.startswith('MemTotal:'):
          return int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
  except (AttributeError, ValueError, OSError):
    return None


def _version(name: str) -> str | None:
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return None


def probe(env=None) -> dict:
  """This machine's host record (the module docstring lists the keys).

  `env` is the environment the measurements run with (default: this process's); its
  XLA_FLAGS is recorded as `xla_flags`.
  """
  try:
    with open(CPUINFO, encoding='utf-8') as f:
      info, source = parse_cpuinfo(f.read()), CPUINFO
  except OSError:
    info, source = parse_cpuinfo(''), 'platform'
  if info['model_name'] == 'unknown':
    info['model_name'] = platform.processor() or 'unknown'
  try:
    usable = len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    usable = None
  env = os.environ if env is None else env
  info.update(cpu_count=os.cpu_count(), usable_cpus=usable, caches=read_caches(),
              memory_bytes=_memory_bytes(), xla_flags=env.get('XLA_FLAGS', ''),
              xla_flags_env=os.environ.get('XLA_FLAGS', ''), jax=_version('jax'),
              jaxlib=_version('jaxlib'), platform=platform.platform(),
              machine=platform.machine(), source=source)
  return info


def _bytes(n: int) -> str:
  for unit, scale in (('GiB', 1 << 30), ('MiB', 1 << 20), ('KiB', 1 << 10)):
    if n >= scale:
      value = n / scale
      return f'{value:.0f} {unit}' if value == int(value) else f'{value:.1f} {unit}'
  return f'{n} B'


def summary(info: dict) -> str:
  """Two lines: the CPU (vendor, model, ISA, caches, memory), then the flags and versions."""
  ident = ' '.join(f'{k} {info[k]}' for k in ('family', 'model', 'stepping')
                   if info.get(k) is not None)
  cpus = f'{info.get("usable_cpus") or info.get("cpu_count") or "?"} CPUs usable'
  if info.get('physical_cores'):
    cpus += f' ({info["physical_cores"]} cores, {info.get("threads_per_core") or "?"} thread/core)'
  flags = ' '.join(f for f, on in (info.get('isa') or {}).items() if on) or '-'
  caches = ' '.join(f'{k} {_bytes(v)}' for k, v in (info.get('caches') or {}).items()
                    if k != 'L1i') or 'caches unknown'
  memory = _bytes(info['memory_bytes']) if info.get('memory_bytes') else '? GiB'
  first = (f'host: {info.get("model_name", "unknown")} ({info.get("vendor", "unknown")}'
           f'{", " + ident if ident else ""}), {cpus}, {info.get("isa_level", "unknown")} '
           f'[{flags}], {caches}, {memory} RAM')
  second = (f'XLA_FLAGS for every measurement: {info.get("xla_flags") or "(unset)"}; '
            f'jax {info.get("jax") or "?"}, jaxlib {info.get("jaxlib") or "?"}')
  return first + '\n' + second
