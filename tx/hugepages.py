"""Transparent huge pages for the buffers XLA:CPU allocates at every step (Linux, glibc).

XLA:CPU allocates one temporary buffer per execution (2.2 GB for the benchmark's 6-layer
GPT step) with `posix_memalign` from a worker thread; glibc serves it with a fresh `mmap`
and returns it with `munmap`, so every step faults every page in again (~540,000 minor
faults, ~0.8 s of kernel time per 5 s step on a 2-core host). With glibc's
`glibc.malloc.hugetlb=1` tunable, malloc asks for transparent huge pages (`MADV_HUGEPAGE`)
on its large mappings: 2 MB pages, ~1,500 faults, and that step 9-11 % faster
(benchmarks/NOTES.md, attempt 24). PyTorch's CPU training gains from it too.

glibc reads tunables once, at process start, so the setting has to be in the environment
before Python starts: the `tx` command re-executes itself once with it
(`reexec_with_hugepages`), and `tx bench` starts every measurement, tx's and the peer's,
with it (`tuned_env`). In your own scripts: `export GLIBC_TUNABLES=glibc.malloc.hugetlb=1`.
`TX_HUGEPAGES=0` turns the re-execution off.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

TUNABLE = 'glibc.malloc.hugetlb'
_THP_MODE = Path('/sys/kernel/mm/transparent_hugepage/enabled')


def tuned_env(env: dict[str, str]) -> dict[str, str]:
  """`env` with `glibc.malloc.hugetlb=1` added to GLIBC_TUNABLES (a value already there wins)."""
  tunables = env.get('GLIBC_TUNABLES', '')
  if TUNABLE in tunables:
    return dict(env)
  joined = ':'.join(t for t in (tunables, f'{TUNABLE}=1') if t)
  return dict(env, GLIBC_TUNABLES=joined)


def thp_mode(path: Path = _THP_MODE) -> str | None:
  """The kernel's transparent-huge-page mode ('always', 'madvise', 'never'), None if unknown."""
  try:
    text = path.read_text()
  except OSError:
    return None
  start, end = text.find('['), text.find(']')
  return text[start + 1:end] if 0 <= start < end else None


def would_help(env: dict[str, str]) -> bool:
  """True when the tunable is missing and would change allocation on this machine.

  That is: Linux with glibc >= 2.35 (the first with the tunable), the kernel handing out
  huge pages only on request (mode 'madvise'; 'always' already does, 'never' never will),
  the tunable not set and `TX_HUGEPAGES` not '0'.
  """
  if env.get('TX_HUGEPAGES') == '0' or TUNABLE in env.get('GLIBC_TUNABLES', ''):
    return False
  if sys.platform != 'linux':
    return False
  lib, version = platform.libc_ver()
  if lib != 'glibc' or tuple(int(p) for p in version.split('.')[:2]) < (2, 35):
    return False
  return thp_mode() == 'madvise'


def reexec_with_hugepages() -> None:
  """Replaces this process by itself with the tunable set, when `would_help`; else returns.

  Call it first thing in a command-line entry point, before any large allocation: the
  process keeps its pid, arguments, standard streams and working directory.
  """
  if not would_help(dict(os.environ)) or not getattr(sys, 'orig_argv', None):
    return
  sys.stdout.flush()
  sys.stderr.flush()
  # The new process sees the tunable in GLIBC_TUNABLES, so `would_help` is False there.
  os.execve(sys.executable, sys.orig_argv, tuned_env(dict(os.environ)))
