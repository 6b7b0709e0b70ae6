"""tx/malloc_tuning.py: the glibc tunables, when tx re-executes with them, and that they
take effect on large allocations."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tx import malloc_tuning
from tx.malloc_tuning import TUNABLES

needs_glibc = pytest.mark.skipif(
    not malloc_tuning.would_help({}),
    reason='the tunables are glibc\'s (>= 2.35, Linux); this platform has no such malloc')


def _clean_env():
  return {k: v for k, v in os.environ.items()
          if k not in ('GLIBC_TUNABLES', 'TX_MALLOC_TUNING')}


def test_tuned_env_adds_the_tunables_and_keeps_the_others():
  assert malloc_tuning.tuned_env({})['GLIBC_TUNABLES'] == TUNABLES
  env = malloc_tuning.tuned_env({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2', 'A': 'b'})
  assert env == {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2:' + TUNABLES, 'A': 'b'}


@pytest.mark.parametrize('mine', ['glibc.malloc.hugetlb=0', 'glibc.malloc.mmap_max=65536'])
def test_a_value_already_set_wins(mine):
  env = {'GLIBC_TUNABLES': mine}
  assert malloc_tuning.tuned_env(env) == env
  assert not malloc_tuning.would_help(env)


def test_opt_out():
  assert not malloc_tuning.would_help({'TX_MALLOC_TUNING': '0'})


_SHOW = ('import os; from tx.malloc_tuning import reexec_tuned; '
         'print("before", os.getpid(), os.environ.get("GLIBC_TUNABLES"), flush=True); '
         'reexec_tuned(); '
         'print("after", os.getpid(), os.environ.get("GLIBC_TUNABLES"))')


@needs_glibc
def test_reexec_keeps_the_pid_and_sets_the_tunables():
  out = subprocess.run([sys.executable, '-c', _SHOW], env=_clean_env(), capture_output=True,
                       text=True, check=True).stdout.split('\n')
  pid = out[0].split()[1]
  assert out[0] == f'before {pid} None'
  assert out[1] == f'before {pid} {TUNABLES}'  # the same process, run again
  assert out[2] == f'after {pid} {TUNABLES}'


# Mallocs and fills SIZE bytes 20 times from a worker thread (as XLA:CPU allocates its
# per-step buffer; numpy is not used because it asks for huge pages itself), or from the
# main thread (a call of several steps), and prints the minor page faults that took. KEEP
# bytes allocated first stay in use throughout.
_FAULTS = ('import ctypes, resource, sys, threading\n'
           'size, keep, where = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n'
           'libc = ctypes.CDLL(None)\n'
           'libc.malloc.restype = ctypes.c_void_p\n'
           'libc.malloc.argtypes = [ctypes.c_size_t]\n'
           'libc.free.argtypes = [ctypes.c_void_p]\n'
           'def work():\n'
           '  if keep: ctypes.memset(libc.malloc(keep), 1, keep)\n'
           '  r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n'
           '  for _ in range(20):\n'
           '    p = libc.malloc(size); ctypes.memset(p, 1, size); libc.free(p)\n'
           '  print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)\n'
           'if where == "main": work()\n'
           'else: t = threading.Thread(target=work); t.start(); t.join()')


def _faults(env, size, keep=0, where='thread'):
  return int(subprocess.run([sys.executable, '-c', _FAULTS, str(size), str(keep), where],
                            env=env, capture_output=True, text=True, check=True).stdout)


def _tunables_with(key, value):
  """TUNABLES with `key` set to `value` (None: left out)."""
  kept = [t for t in TUNABLES.split(':') if not t.startswith(key + '=')]
  return ':'.join(kept + ([f'{key}={value}'] if value is not None else []))


@needs_glibc
def test_the_tunables_cut_page_faults_of_per_step_buffers():
  """A 45 MB buffer (the baby GPT's) is reused instead of faulted in 20 times; a 128 MB one
  (above what a thread's heap holds) still is mapped each time, in far fewer faults where
  the kernel gives huge pages on request."""
  base = _clean_env()
  pages = (45 << 20) // 4096
  plain, tuned = _faults(base, 45 << 20), _faults(malloc_tuning.tuned_env(base), 45 << 20)
  assert plain > 10 * pages, plain  # faulted in afresh (nearly) every time
  assert tuned < 2 * pages, tuned  # faulted in about once
  thp = Path('/sys/kernel/mm/transparent_hugepage/enabled')
  if thp.exists() and '[madvise]' in thp.read_text():  # huge pages on request only
    plain, tuned = _faults(base, 128 << 20), _faults(malloc_tuning.tuned_env(base), 128 << 20)
    assert tuned < plain / 10, (plain, tuned)


@needs_glibc
def test_a_threads_extra_heap_is_kept_between_calls():
  """With 30 MB of a worker thread's first 64 MiB heap in use, a 40 MB buffer (torch's
  outputs in a callback) takes an extra heap: glibc unmaps it at every free unless top_pad
  is at least a heap's size, and the next call faults it in again."""
  base = _clean_env()
  without = dict(base, GLIBC_TUNABLES=_tunables_with('glibc.malloc.top_pad', None))
  plain, tuned = (_faults(env, 40 << 20, keep=30 << 20)
                  for env in (without, malloc_tuning.tuned_env(base)))
  assert tuned < plain / 5, (plain, tuned)


@needs_glibc
def test_a_main_heap_buffer_above_256_mib_is_kept_between_calls():
  """A 320 MB buffer from the main heap (the scratch of a call of several steps) stays with
  the process when freed, instead of being trimmed at each call's end and faulted in again
  at the next, as under a 256 MiB trim threshold."""
  base = _clean_env()
  without = dict(base, GLIBC_TUNABLES=_tunables_with('glibc.malloc.trim_threshold', 256 << 20))
  plain, tuned = (_faults(env, 320 << 20, where='main')
                  for env in (without, malloc_tuning.tuned_env(base)))
  assert tuned < plain / 5, (plain, tuned)
