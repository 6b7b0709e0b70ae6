"""tx/hugepages.py: the glibc tunable, when tx re-executes with it, and that it takes effect."""

import os
import subprocess
import sys

import pytest

from tx import hugepages

_LINUX_MADVISE = hugepages.would_help({})
needs_madvise_host = pytest.mark.skipif(
    not _LINUX_MADVISE, reason='needs Linux, glibc >= 2.35 and transparent huge pages on madvise')


def test_tuned_env_adds_the_tunable_and_keeps_the_others():
  assert hugepages.tuned_env({})['GLIBC_TUNABLES'] == 'glibc.malloc.hugetlb=1'
  env = hugepages.tuned_env({'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2', 'A': 'b'})
  assert env == {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1', 'A': 'b'}


def test_a_hugetlb_value_already_set_wins():
  env = {'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=0'}
  assert hugepages.tuned_env(env) == env
  assert not hugepages.would_help(env)


def test_opt_out():
  assert not hugepages.would_help({'TX_HUGEPAGES': '0'})


def test_thp_mode_reads_the_bracketed_choice(tmp_path):
  f = tmp_path / 'enabled'
  f.write_text('always [madvise] never\n')
  assert hugepages.thp_mode(f) == 'madvise'
  f.write_text('[always] madvise never\n')
  assert hugepages.thp_mode(f) == 'always'
  assert hugepages.thp_mode(tmp_path / 'missing') is None


_SHOW = ('import os; from tx.hugepages import reexec_with_hugepages; '
         'print("before", os.getpid(), os.environ.get("GLIBC_TUNABLES"), flush=True); '
         'reexec_with_hugepages(); '
         'print("after", os.getpid(), os.environ.get("GLIBC_TUNABLES"))')


@needs_madvise_host
def test_reexec_keeps_the_pid_and_sets_the_tunable():
  env = {k: v for k, v in os.environ.items() if k not in ('GLIBC_TUNABLES', 'TX_HUGEPAGES')}
  out = subprocess.run([sys.executable, '-c', _SHOW], env=env, capture_output=True, text=True,
                       check=True).stdout.split('\n')
  pid = out[0].split()[1]
  assert out[0] == f'before {pid} None'
  assert out[1] == f'before {pid} glibc.malloc.hugetlb=1'  # the same process, run again
  assert out[2] == f'after {pid} glibc.malloc.hugetlb=1'


# Mallocs and fills 64 MB 20 times (glibc maps it afresh each time, as it does XLA:CPU's
# per-step buffer; numpy is not used because it asks for huge pages itself) and prints the
# minor page faults that took.
_FAULTS = ('import ctypes, resource\n'
           'libc = ctypes.CDLL(None)\n'
           'libc.malloc.restype = ctypes.c_void_p\n'
           'libc.malloc.argtypes = [ctypes.c_size_t]\n'
           'libc.free.argtypes = [ctypes.c_void_p]\n'
           'r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n'
           'for _ in range(20):\n'
           '  p = libc.malloc(1 << 26); ctypes.memset(p, 1, 1 << 26); libc.free(p)\n'
           'print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)')


@needs_madvise_host
def test_the_tunable_cuts_page_faults_of_large_allocations():
  base = {k: v for k, v in os.environ.items() if k not in ('GLIBC_TUNABLES', 'TX_HUGEPAGES')}

  def faults(env):
    return int(subprocess.run([sys.executable, '-c', _FAULTS], env=env, capture_output=True,
                              text=True, check=True).stdout)

  plain, tuned = faults(base), faults(hugepages.tuned_env(base))
  assert plain > 20 * (1 << 26) // 4096 // 2  # ~16,384 4 KB pages per fill
  assert tuned < plain / 10, (plain, tuned)
