"""Settings for the whole test session: one persistent XLA compilation cache per run.

Many tests, and the `tx` processes they start, compile the same tiny programs again (a new
closure or a new process compiles what an earlier test already compiled). JAX's persistent
cache, keyed by the program, the jax version, the XLA flags and the device kind, serves
those repeats from disk. Its key here includes the program's metadata (op names, source
lines): without it a cached program would bring another program's op names, which
`tx profile` sorts thunks by. The cache lives in a temporary folder made for the run and
removed after it, so every run starts empty; child processes inherit it through the
environment. Under pytest-xdist (`make test`) each worker makes its own: two workers never
write the same entry while the other reads it. `tx bench` leaves it out of its measurement
processes (tx/bench/worker.py), whose compile times must be real.

Most of the suite's time is XLA compiling tiny programs, and most of a compile is LLVM
optimising code that then runs for microseconds. The session therefore compiles with
`--xla_backend_optimization_level=0` (in XLA_FLAGS, so child processes inherit it): the
same HLO passes and fusions, unoptimised machine code; compiles take about a third of the
time. Set TX_TESTS_XLA_OPTIMIZE=1 to run the suite with XLA's default level.
"""

import os
import shutil
import tempfile

_SAVED = {}
FAST_COMPILE = '--xla_backend_optimization_level=0'


def pytest_configure(config):
  # Before collection: a test module that computes at import would otherwise make jax
  # decide, once per process, that there is no cache.
  del config
  path = tempfile.mkdtemp(prefix='tx-tests-xla-cache-')
  flags = os.environ.get('XLA_FLAGS', '')
  if (os.environ.get('TX_TESTS_XLA_OPTIMIZE') != '1'
      and '--xla_backend_optimization_level' not in flags):
    flags = f'{flags} {FAST_COMPILE}'.strip()
  env = {'XLA_FLAGS': flags,
         'JAX_COMPILATION_CACHE_DIR': path,
         # the default (1 s) would leave out most of the tests' tiny programs
         'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
         'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0',
         'JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY': 'true'}
  for name, value in env.items():
    _SAVED[name] = os.environ.get(name)
    os.environ[name] = value
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  jax.config.update('jax_compilation_cache_include_metadata_in_key', True)


def pytest_unconfigure(config):
  del config
  path = os.environ.get('JAX_COMPILATION_CACHE_DIR')
  for name, value in _SAVED.items():
    if value is None:
      os.environ.pop(name, None)
    else:
      os.environ[name] = value
  if path and os.path.basename(path).startswith('tx-tests-xla-cache-'):
    shutil.rmtree(path, ignore_errors=True)
