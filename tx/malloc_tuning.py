"""glibc malloc settings for the buffers XLA:CPU allocates at every step (Linux, glibc).

XLA:CPU allocates one temporary buffer per execution (tens of MB to GBs for a training
step) with `posix_memalign` from a worker thread. glibc serves a buffer that size with a
fresh `mmap` and returns it with `munmap`, so every step faults every page in again and
the kernel zeroes it. Four glibc tunables (benchmarks/NOTES.md has the measurements):

- `glibc.malloc.hugetlb=1`: malloc asks for transparent huge pages on its large mappings,
  2 MB pages instead of 4 KB (512 times fewer faults);
- `glibc.malloc.mmap_max=0` and `glibc.malloc.trim_threshold=4 GiB`: buffers up to
  64 MB come from malloc's heaps and are reused across steps instead of being mapped
  afresh. A larger buffer that glibc serves from the main heap (seen: a call of several
  steps; the encoder's step on torch's kernels) stays with the process when freed, up to
  4 GiB at the heap's top, so the next call reuses it instead of faulting it in again:
  between calls the process stays at its peak (which did not rise where measured). Other
  large buffers are still mapped per step (glibc falls back to `mmap` for them), with
  huge pages;
- `glibc.malloc.top_pad=128 MiB`: a thread's arena grows by extra heaps of up to 64 MiB,
  and glibc unmaps such a heap as soon as it is empty, whatever the trim threshold says,
  unless `top_pad` is at least a heap's size. The outputs of torch's kernels called from
  XLA's worker threads (`model.*_impl='torch'`) live in such heaps: without it every call
  maps and faults them in afresh. The freed heaps stay resident (~0.2 GB on the 6-layer
  decoder), the peak is the same.

glibc reads tunables once, at process start, so they have to be in the environment
before Python starts: the `tx` command re-executes itself once with them
(`reexec_tuned`), and `tx bench` starts every measurement, tx's and the peer's, with them
(`tuned_env`). In your own scripts: `export GLIBC_TUNABLES=` + `TUNABLES`.
`TX_MALLOC_TUNING=0` turns the re-execution off; a GLIBC_TUNABLES that already sets any of
these keys is left alone.
"""

from __future__ import annotations

import os
import platform
import sys

TUNABLES = ('glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:'
            f'glibc.malloc.trim_threshold={4 << 30}:glibc.malloc.top_pad={128 << 20}')
_KEYS = tuple(t.split('=')[0] for t in TUNABLES.split(':'))


def tuned_env(env: dict[str, str]) -> dict[str, str]:
  """`env` with `TUNABLES` appended to GLIBC_TUNABLES, unless it already sets one of them."""
  tunables = env.get('GLIBC_TUNABLES', '')
  if any(key in tunables for key in _KEYS):
    return dict(env)
  return dict(env, GLIBC_TUNABLES=':'.join(t for t in (tunables, TUNABLES) if t))


def would_help(env: dict[str, str]) -> bool:
  """True on Linux with glibc >= 2.35 (the first with `hugetlb`) when `env` lacks the
  tunables and `TX_MALLOC_TUNING` is not '0'."""
  if env.get('TX_MALLOC_TUNING') == '0' or tuned_env(env) == env:
    return False
  if sys.platform != 'linux':
    return False
  lib, version = platform.libc_ver()
  return lib == 'glibc' and tuple(int(p) for p in version.split('.')[:2]) >= (2, 35)


def reexec_tuned() -> None:
  """Replaces this process by itself with the tunables set, when `would_help`; else returns.

  Call it first thing in a command-line entry point, before any large allocation: the
  process keeps its pid, arguments, standard streams and working directory.
  """
  if (not would_help(dict(os.environ)) or not getattr(sys, 'orig_argv', None)
      or not sys.executable):  # embedded interpreters have nothing to re-execute
    return
  sys.stdout.flush()
  sys.stderr.flush()
  # The new process sees the tunables in GLIBC_TUNABLES, so `would_help` is False there.
  os.execve(sys.executable, sys.orig_argv, tuned_env(dict(os.environ)))
