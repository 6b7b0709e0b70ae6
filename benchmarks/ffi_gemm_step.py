"""What a case's dense products cost inside tx's step, and a custom-call GEMM in their place.

  python benchmarks/ffi_gemm_step.py gpt_baby [--rounds 10] [--block 6] [--products] [--attention]

Issue 24 asks for "a custom call into a better GEMM, if XLA offers a supported way". XLA's
FFI is that way: benchmarks/ffi_gemm.cc is a float32 product handler, compiled here with
the host's C++ compiler against jaxlib's headers (cached under $TX_CACHE_DIR/ffi_gemm or
~/.cache/tx/ffi_gemm), that calls numpy's bundled OpenBLAS with no Python in the call
(`tx.ops.torch_matmul`'s host callback costs ~0.1 ms a product: too much for small models),
each part of the product on a thread of XLA's own pool. Timed with benchmarks/step_ab.py's
protocol, in one process, tx's step four ways:

  xla          the case as `tx bench` runs it (under this process's XLA_FLAGS);
  openblas     every dense product (forward, both gradients) in OpenBLAS;
  no_products  every dense product a custom call that does nothing (its output is whatever
               its buffer held; only the time means anything): the step without them;
  xla_again    the A/A control.

Printed after step_ab's lines: what the products cost in the step (xla - no_products, and
openblas - no_products) and what the rest of the step takes, in milliseconds: an unprofiled
split (the profiler's can inflate a small step 2-4x). The two custom-call variants run
tx's `model.matmul_impl='torch'` path with its product swapped, so its custom VJP and remat
save name apply. `--attention` adds two variants for attention's batched products (XLA's
path: q·kᵀ, p·v and the backward's four, `tx.ops.xla_attention`): `openblas_attention`
(each product of the batch one-threaded in OpenBLAS, the batch split over XLA's pool) and
`no_attention_products` (nothing), and what those products cost in the step; a case whose
attention is torch's (attention_impl='torch') has none to swap. `--products` first times
each product of the step alone, XLA's dot against the custom call, medians of `--reps`
calls, and the step's products at each one's rates.

`--on JSON` sets spec keys in every variant (the tuned setting's, e.g. '{"steps_per_call": 4}'),
and `--variant NAME JSON` (repeatable) times more variants beside these, before the A/A
control: any spec keys, plus "ffi_products" and "ffi_attention" ('openblas' or 'none') for
the custom call's dense and batched products ("ffi_products" also 'mkl': MKL's sgemm from
PyTorch's wheel, one call on its own threads as torch.mm runs it; 'mkl_split': split over
XLA's pool like 'openblas'). So the custom call can be held against a
host's tuned kernels in one process, e.g. torch's attention and GEMM:

  --on '{"steps_per_call": 4}' --variant tuned '{"attention_impl": "torch", "matmul_impl":
  "torch"}' --variant openblas_all '{"ffi_products": "openblas", "ffi_attention": "openblas"}'
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / 'ffi_gemm.cc'
TARGET, BATCHED_TARGET = 'tx_ffi_gemm', 'tx_ffi_batched_gemm'
# benchmarks/ffi_gemm.cc's `mode` attribute; the MKL modes are the dense products' alone
MODES = {'openblas': 0, 'none': 1, 'mkl': 2, 'mkl_split': 3}
ATTENTION_MODES = ('openblas', 'none')
# private spec keys, taken out before tx_side sees them: the dense / attention products' mode
_VARIANT_MODE, _ATTENTION_MODE = '_ffi_gemm_mode', '_ffi_attention_mode'
_state = {'mode': None, 'registered': False}


def build() -> Path:
  """The handler's shared library: compiled once per source and jaxlib version, then reused.

  Raises SystemExit naming the cause if no C++ compiler is found or the compile fails."""
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top
  from tx.runs.tune import cache_dir  # pylint: disable=g-import-not-at-top
  source = SOURCE.read_bytes()
  key = hashlib.sha256(source + jaxlib.__version__.encode()).hexdigest()[:16]
  out = cache_dir().parent / 'ffi_gemm' / f'ffi_gemm-{key}.so'
  if out.exists():
    return out
  compiler = os.environ.get('CXX') or shutil.which('g++') or shutil.which('c++')
  if not compiler:
    raise SystemExit('ffi_gemm_step: no C++ compiler found (g++ / c++ on PATH, or $CXX); '
                     'install one to build benchmarks/ffi_gemm.cc')
  out.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
    partial = Path(tmp) / out.name
    result = subprocess.run(
        [compiler, '-O2', '-std=c++17', '-shared', '-fPIC', '-w',
         f'-I{jax.ffi.include_dir()}', str(SOURCE), '-o', str(partial)],
        capture_output=True, text=True, check=False)
    if result.returncode:
      last = (result.stderr.strip().splitlines() or ['(no output)'])[-1]
      raise SystemExit(f'ffi_gemm_step: compiling {SOURCE.name} failed: {last}')
    os.replace(partial, out)  # whole or not at all: another process may be loading it
  return out


def openblas_symbols() -> tuple[int, int]:
  """Addresses of cblas_sgemm (64-bit integers) and openblas_set_num_threads_local in the
  OpenBLAS numpy ships (numpy.libs/libscipy_openblas64_*.so)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  found = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, 'numpy.libs',
                                 'lib*openblas64*.so*'))
  for path in found:
    lib = ctypes.CDLL(path)
    for name in ('scipy_cblas_sgemm64_', 'cblas_sgemm64_'):
      if hasattr(lib, name):
        return (ctypes.cast(getattr(lib, name), ctypes.c_void_p).value,
                ctypes.cast(lib.openblas_set_num_threads_local, ctypes.c_void_p).value)
  raise SystemExit("ffi_gemm_step: no 64-bit-integer OpenBLAS in numpy's wheel (numpy.libs); "
                   'this check needs the numpy wheel from PyPI')


def mkl_symbols() -> tuple[int, int] | None:
  """Addresses of MKL's Fortran sgemm (LP64) and MKL_Set_Num_Threads_Local as PyTorch's CPU
  wheel exports them from libtorch_cpu, or None where torch or the symbols are missing."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), 'lib', 'libtorch_cpu.so'))
  # the wheel's lower-case mkl_set_num_threads_local is the Fortran one (an int*): the C
  # function is MKL_Set_Num_Threads_Local
  if not (hasattr(lib, 'sgemm') and hasattr(lib, 'MKL_Set_Num_Threads_Local')):
    return None
  return (ctypes.cast(lib.sgemm, ctypes.c_void_p).value,
          ctypes.cast(lib.MKL_Set_Num_Threads_Local, ctypes.c_void_p).value)


def register() -> None:
  """Builds and loads the handler, hands it OpenBLAS's functions (and MKL's, where torch's
  wheel carries them) and registers it with XLA."""
  if _state['registered']:
    return
  import jax  # pylint: disable=g-import-not-at-top
  lib = ctypes.CDLL(str(build()))
  lib.tx_ffi_gemm_set_sgemm(*(ctypes.c_void_p(a) for a in openblas_symbols()))
  mkl = mkl_symbols()
  if mkl is not None:
    lib.tx_ffi_gemm_set_mkl(*(ctypes.c_void_p(a) for a in mkl))
  jax.ffi.register_ffi_target(TARGET, jax.ffi.pycapsule(lib.TxFfiGemm), platform='cpu')
  jax.ffi.register_ffi_target(BATCHED_TARGET, jax.ffi.pycapsule(lib.TxFfiBatchedGemm),
                              platform='cpu')
  _state['registered'] = True


def product(a, b, transpose_a: bool = False, transpose_b: bool = False, mode: str = 'openblas'):
  """op(a) · op(b) in the custom call, float32: a [M, K] (or [K, M] transposed), b [K, N] (or
  [N, K] transposed) -> [M, N]. mode 'none' computes nothing (the step without its products)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  register()
  m = a.shape[1] if transpose_a else a.shape[0]
  n = b.shape[0] if transpose_b else b.shape[1]
  return jax.ffi.ffi_call(TARGET, jax.ShapeDtypeStruct((m, n), a.dtype))(
      a, b, transpose_a=transpose_a, transpose_b=transpose_b, mode=np.int32(MODES[mode]))


def batched_product(a, b, transpose_a: bool = False, transpose_b: bool = False,
                    mode: str = 'openblas'):
  """op(a[i]) · op(b[i]) for each i, float32: a [I, M, K] (or [I, K, M]), b [I, K, N] (or
  [I, N, K]) -> [I, M, N]. mode 'none' computes nothing."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  register()
  m = a.shape[2] if transpose_a else a.shape[1]
  n = b.shape[1] if transpose_b else b.shape[2]
  return jax.ffi.ffi_call(BATCHED_TARGET, jax.ShapeDtypeStruct((a.shape[0], m, n), a.dtype))(
      a, b, transpose_a=transpose_a, transpose_b=transpose_b, mode=np.int32(MODES[mode]))


def attention_einsum(einsum, mode: str):
  """`jnp.einsum` with the batched products of `tx.ops.xla_attention` (grouped heads
  [b, k, g, ...], float32) in the custom call; every other einsum is `einsum`'s."""
  def routed(spec, x, y, **kwargs):
    if x.dtype != 'float32' or y.dtype != 'float32' or spec not in _ATTENTION_PRODUCTS:
      return einsum(spec, x, y, **kwargs)
    b, k = x.shape[:2]
    (transpose_a, transpose_b), out = _ATTENTION_PRODUCTS[spec], spec.split('->')[1]
    z = batched_product(x.reshape(b * k, -1, x.shape[-1]), y.reshape(b * k, -1, y.shape[-1]),
                        transpose_a, transpose_b, mode)
    sizes = dict(zip(spec.split('->')[0].replace(',', ''), x.shape + y.shape))
    return z.reshape(tuple(sizes[c] for c in out))
  return routed


# einsum spec -> (transpose_a, transpose_b) of each item's 2-D product: scores / d_p, the
# weighted values / d_q, and d_v / d_k (tx/ops/xla_attention.py)
_ATTENTION_PRODUCTS = {'bkgld,bksd->bkgls': (False, True), 'bkgls,bksd->bkgld': (False, False),
                       'bkgls,bkgld->bksd': (True, False)}


def matmul(x_MK, w_KN, mode: str = 'openblas'):
  """x [M, K] · w [K, N] -> [M, N] float32 in the custom call, forward and both gradients
  (g · wᵀ, xᵀ · g) through a custom VJP."""
  import jax  # pylint: disable=g-import-not-at-top

  @jax.custom_vjp
  def mm(x, w):
    return product(x, w, mode=mode)

  def fwd(x, w):
    return mm(x, w), (x, w)

  def bwd(residuals, g):
    x, w = residuals
    return product(g, w, transpose_b=True, mode=mode), product(x, g, transpose_a=True, mode=mode)

  mm.defvjp(fwd, bwd)
  return mm(x_MK, w_KN)


def variant_spec(settings: dict) -> dict:
  """A `--variant`'s spec keys, its "ffi_products" / "ffi_attention" modes turned into the
  keys `_patch_tx`'s compile takes (dense products in the custom call: tx's torch path)."""
  spec = dict(settings)
  for key, private in (('ffi_products', _VARIANT_MODE), ('ffi_attention', _ATTENTION_MODE)):
    mode = spec.pop(key, None)
    if mode is None:
      continue
    modes = MODES if key == 'ffi_products' else ATTENTION_MODES
    if mode not in modes:
      raise SystemExit(f'--variant {key}={mode!r}: the modes are {sorted(modes)}')
    if mode.startswith('mkl') and mkl_symbols() is None:
      raise SystemExit(f"--variant {key}={mode!r}: no MKL found (it comes with PyTorch's CPU "
                       "wheel: pip install -e '.[interop]'); use 'openblas'")
    spec[private] = mode
    if key == 'ffi_products':
      spec['matmul_impl'] = 'torch'
  return spec


def _patch_tx() -> None:
  """Sends tx's `matmul_impl='torch'` float32 products to the custom call while a variant
  is compiled with `_VARIANT_MODE` set, and attention's batched products with
  `_ATTENTION_MODE` (`tx.bench.tx_side.compiled_train_step` traces)."""
  from unittest import mock  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from jax.ad_checkpoint import checkpoint_name  # pylint: disable=g-import-not-at-top
  from tx.bench import tx_side  # pylint: disable=g-import-not-at-top
  from tx.ops import matmul as tx_matmul  # pylint: disable=g-import-not-at-top
  from tx.ops.torch_matmul import SAVE_NAME  # pylint: disable=g-import-not-at-top
  torch_product, compile_step = tx_matmul.torch_matmul, tx_side.compiled_train_step

  def routed(x_MK, w_KN, upcast=False):
    if _state['mode'] is None or x_MK.dtype != jnp.float32:
      return torch_product(x_MK, w_KN, upcast)
    return checkpoint_name(matmul(x_MK, w_KN, _state['mode']), SAVE_NAME)

  def compiled_train_step(spec):
    spec = dict(spec)
    _state['mode'] = spec.pop(_VARIANT_MODE, None)
    attention = spec.pop(_ATTENTION_MODE, None)
    einsum = attention_einsum(jnp.einsum, attention) if attention else jnp.einsum
    try:
      with mock.patch.object(jnp, 'einsum', einsum):
        return compile_step(spec)
    finally:
      _state['mode'] = None

  tx_matmul.torch_matmul, tx_side.compiled_train_step = routed, compiled_train_step


def product_rates(case: str, reps: int) -> dict[str, dict[str, float]]:
  """{label: {'xla': GFLOP/s, 'openblas': GFLOP/s}} of each of the case's step products
  alone (benchmarks/flag_gemm_rates.py's list: tx's layouts), medians of `reps` calls."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(HERE))
  import flag_gemm_rates  # pylint: disable=g-import-not-at-top
  from tx.timing import sample_seconds  # pylint: disable=g-import-not-at-top
  rng, out = np.random.default_rng(0), {}
  for label, m, k, n, transposed, _ in flag_gemm_rates.products(case):
    weight_gradient = 'weight gradient' in label  # xᵀ · g: x [k, m] stored, as autodiff has it
    a_shape = (k, m) if weight_gradient else (m, k)
    b_shape = (n, k) if transposed else (k, n)
    a, b = (jax.device_put(rng.standard_normal(s, dtype=np.float32)) for s in (a_shape, b_shape))
    dims = (((0 if weight_gradient else 1,), (1 if transposed else 0,)), ((), ()))
    calls = {'xla': jax.jit(lambda a, b, d=dims: jax.lax.dot_general(a, b, d)),
             'openblas': jax.jit(lambda a, b, t=(weight_gradient, transposed): product(a, b, *t))}
    out[label] = {}
    for name, call in calls.items():
      seconds = sample_seconds(lambda c=call: c(a, b), lambda y: y.block_until_ready(), reps)
      out[label][name] = 2 * m * k * n / statistics.median(seconds) / 1e9
  return out


_OWN_VARIANTS = ('xla', 'openblas', 'no_products', 'openblas_attention', 'no_attention_products',
                 'xla_again')


def _parsed_extras(parser, args) -> tuple[dict, list[tuple[str, dict]]]:
  """(--on's spec keys, [(name, spec keys)] of each --variant), or a one-line parser error."""
  def obj(flag: str, text: str) -> dict:
    try:
      value = json.loads(text)
    except json.JSONDecodeError as e:
      parser.error(f'{flag}: not JSON ({e}); give an object such as \'{{"steps_per_call": 4}}\'')
    if not isinstance(value, dict):
      parser.error(f'{flag}: {text!r} is not a JSON object; give one such as '
                   '\'{"steps_per_call": 4}\'')
    return value
  names = [name for name, _ in args.variant]
  for name in names:
    if name in _OWN_VARIANTS or names.count(name) > 1:
      parser.error(f'--variant {name}: that name is taken (the script\'s own: '
                   f'{", ".join(_OWN_VARIANTS)}, or another --variant); pick another')
  extra = [(name, variant_spec(obj(f'--variant {name}', text))) for name, text in args.variant]
  return obj('--on', args.on), extra


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('case', help='a decoder or encoder case of `tx bench` (tx/bench/cases.py)')
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--warmup', type=int, default=2, help='untimed calls of each variant')
  parser.add_argument('--block', type=int, default=6, metavar='K',
                      help="per round, K timed calls of each variant in a row (step_ab's --block)")
  parser.add_argument('--products', action='store_true',
                      help='first time each product alone, XLA against the custom call')
  parser.add_argument('--reps', type=int, default=30, help='calls per product for --products')
  parser.add_argument('--attention', action='store_true',
                      help="add variants with attention's batched products in the custom call "
                           'and without them')
  parser.add_argument('--on', default='{}', metavar='JSON',
                      help='spec keys set in every variant (e.g. the tuned steps_per_call)')
  parser.add_argument('--variant', nargs=2, action='append', default=[],
                      metavar=('NAME', 'JSON'),
                      help='one more variant: spec keys, plus "ffi_products" (openblas, '
                           'mkl, mkl_split or none) / "ffi_attention" (openblas or none)')
  args = parser.parse_args(argv)
  on, extra = _parsed_extras(parser, args)  # a mistake is refused before the build and timings
  from tx.bench import cases  # pylint: disable=g-import-not-at-top  (after argparse)
  spec = next((c.spec for c in cases.SUITE if c.name == args.case), None)
  if (spec is None or spec.get('family') not in ('decoder', 'encoder')
      or spec.get('dtype', 'float32') != 'float32'):
    parser.error(f'{args.case!r} is not a float32 decoder or encoder case of tx.bench.cases.SUITE')
  register()
  sys.path.insert(0, str(HERE))
  import flag_gemm_rates  # pylint: disable=g-import-not-at-top
  import step_ab  # pylint: disable=g-import-not-at-top

  if args.products:
    rates = product_rates(args.case, args.reps)
    per_step = {name: 0.0 for name in ('xla', 'openblas')}
    for label, m, k, n, _, times in flag_gemm_rates.products(args.case):
      print(f'{label:<28} [{m}, {k}] · [{k}, {n}]: ' + ', '.join(
          f'{name} {rate:.0f}' for name, rate in rates[label].items()) + ' GFLOP/s')
      for name, rate in rates[label].items():
        per_step[name] += times * 2 * m * k * n / (rate * 1e9)
    print("a step's products at these rates: " + ', '.join(
        f'{name} {s * 1e3:.1f} ms' for name, s in per_step.items()))

  _patch_tx()
  custom = {'matmul_impl': 'torch'}
  variants = [('xla', {}), ('openblas', dict(custom, **{_VARIANT_MODE: 'openblas'})),
              ('no_products', dict(custom, **{_VARIANT_MODE: 'none'})), ('xla_again', {})]
  if args.attention:
    variants[3:3] = [('openblas_attention', {_ATTENTION_MODE: 'openblas'}),
                     ('no_attention_products', {_ATTENTION_MODE: 'none'})]
  variants[-1:-1] = extra
  variants = [(name, dict(on, **settings)) for name, settings in variants]
  times = step_ab.time_variants(args.case, variants, args.rounds, args.warmup, args.block)
  step_ab.print_variants(times)
  ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
  print(f"the dense products in the step: XLA's {ms['xla'] - ms['no_products']:.1f} ms, "
        f"OpenBLAS's {ms['openblas'] - ms['no_products']:.1f} ms; the rest "
        f"{ms['no_products']:.1f} ms; A/A {ms['xla_again'] / ms['xla']:.3f}x")
  if args.attention:
    print(f"attention's batched products in the step: XLA's "
          f"{ms['xla'] - ms['no_attention_products']:.1f} ms, OpenBLAS's "
          f"{ms['openblas_attention'] - ms['no_attention_products']:.1f} ms")
  return 0


if __name__ == '__main__':
  raise SystemExit(main())
