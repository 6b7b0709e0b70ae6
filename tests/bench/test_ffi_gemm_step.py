"""benchmarks/ffi_gemm_step.py: the FFI product handler (benchmarks/ffi_gemm.cc) and the
step timed with the products in it, without them, and in XLA."""

import importlib.util
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tx.bench import cases, tx_side
from tx.ops import matmul as tx_matmul

_PATH = os.path.join(os.path.dirname(__file__), '..', '..', 'benchmarks', 'ffi_gemm_step.py')
_SPEC = importlib.util.spec_from_file_location('ffi_gemm_step', _PATH)
ffi_gemm_step = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(ffi_gemm_step)

needs_compiler = pytest.mark.skipif(
    not (os.environ.get('CXX') or shutil.which('g++') or shutil.which('c++')),
    reason='no C++ compiler to build benchmarks/ffi_gemm.cc')


@pytest.fixture(scope='module')
def registered(tmp_path_factory):
  """The handler built into a fresh cache folder and registered once for the module."""
  cache = tmp_path_factory.mktemp('tx_cache')
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv('TX_CACHE_DIR', str(cache))
    ffi_gemm_step.register()
  return cache


@needs_compiler
def test_the_handler_is_built_once_into_the_cache(registered, monkeypatch):
  built = list((registered / 'ffi_gemm').glob('ffi_gemm-*.so'))
  assert len(built) == 1
  monkeypatch.setenv('TX_CACHE_DIR', str(registered))
  monkeypatch.setattr(ffi_gemm_step.subprocess, 'run', lambda *a, **k: pytest.fail('rebuilt'))
  assert ffi_gemm_step.build() == built[0]


@needs_compiler
@pytest.mark.parametrize('mode', ['openblas', 'mkl', 'mkl_split'])
@pytest.mark.parametrize('transpose_a,transpose_b', [(False, False), (True, False),
                                                     (False, True), (True, True)])
def test_products_equal_numpys_in_every_layout(registered, transpose_a, transpose_b, mode):
  """OpenBLAS, and MKL as PyTorch's wheel carries it (row-major through its column-major
  Fortran sgemm), in one call or split over XLA's threads."""
  if mode != 'openblas':
    pytest.importorskip('torch')
  # 300 rows x 200 columns x 128: ~15 MFLOP, split over XLA's threads where there are two
  rng = np.random.default_rng(0)
  a = rng.standard_normal((300, 128), dtype=np.float32)
  b = rng.standard_normal((128, 200), dtype=np.float32)
  a_in, b_in = (a.T.copy() if transpose_a else a), (b.T.copy() if transpose_b else b)
  got = jax.jit(lambda x, y: ffi_gemm_step.product(x, y, transpose_a, transpose_b, mode))(
      a_in, b_in)
  assert got.shape == (300, 200)
  np.testing.assert_allclose(np.asarray(got), a @ b, rtol=1e-4, atol=1e-3)


@needs_compiler
def test_gradients_equal_xlas_and_the_none_mode_computes_nothing_but_runs(registered):
  rng = np.random.default_rng(1)
  x, w, r = (jnp.asarray(rng.standard_normal(s, dtype=np.float32))
             for s in ((96, 40), (40, 56), (96, 56)))
  ours = jax.jit(jax.grad(lambda x, w: jnp.sum(ffi_gemm_step.matmul(x, w) * r), (0, 1)))(x, w)
  xlas = jax.grad(lambda x, w: jnp.sum((x @ w) * r), (0, 1))(x, w)
  for got, want in zip(ours, xlas):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
  nothing = jax.jit(lambda x, w: ffi_gemm_step.matmul(x, w, mode='none'))(x, w)
  assert nothing.shape == (96, 56)


def test_a_missing_compiler_is_named_in_one_line(tmp_path, monkeypatch):
  monkeypatch.setenv('TX_CACHE_DIR', str(tmp_path))
  monkeypatch.delenv('CXX', raising=False)
  monkeypatch.setattr(ffi_gemm_step.shutil, 'which', lambda name: None)
  with pytest.raises(SystemExit, match='no C[+][+] compiler found'):
    ffi_gemm_step.build()
  assert not list(tmp_path.rglob('*.so'))


def test_a_variants_unknown_custom_call_mode_is_refused_in_one_line():
  with pytest.raises(SystemExit, match="ffi_attention='fast': the modes are"):
    ffi_gemm_step.variant_spec({'ffi_attention': 'fast'})
  with pytest.raises(SystemExit, match="ffi_attention='mkl': the modes are"):
    ffi_gemm_step.variant_spec({'ffi_attention': 'mkl'})  # the dense products' alone
  with pytest.MonkeyPatch.context() as mp:  # no torch wheel, so no MKL: said before any build
    mp.setattr(ffi_gemm_step, 'mkl_symbols', lambda: None)
    with pytest.raises(SystemExit, match="ffi_products='mkl': no MKL found"):
      ffi_gemm_step.variant_spec({'ffi_products': 'mkl'})
  assert ffi_gemm_step.variant_spec({'ffi_products': 'none', 'norm_impl': 'torch'}) == {
      ffi_gemm_step._VARIANT_MODE: 'none', 'matmul_impl': 'torch', 'norm_impl': 'torch'}


@pytest.mark.parametrize('argv,says', [
    (['--on', '[4]'], "--on: '[4]' is not a JSON object"),
    (['--on', '{steps'], '--on: not JSON'),
    (['--variant', 'xla', '{}'], '--variant xla: that name is taken'),
    (['--variant', 'a', '{}', '--variant', 'a', '{}'], '--variant a: that name is taken'),
    (['--variant', 'a', '{"ffi_products": "fast"}'], "ffi_products='fast': the modes are")])
def test_bad_on_and_variant_arguments_are_refused_before_anything_is_built(
    argv, says, monkeypatch, capsys):
  monkeypatch.setattr(ffi_gemm_step, 'register', lambda: pytest.fail('built before the check'))
  with pytest.raises(SystemExit) as raised:
    ffi_gemm_step.main(['gpt_baby', *argv])
  assert says in capsys.readouterr().err + str(raised.value.code)


def test_cases_that_are_not_float32_decoders_or_encoders_are_refused(capsys):
  for case in ('nope', 'gpt_6l_bf16', 'seq2seq_small'):
    with pytest.raises(SystemExit):
      ffi_gemm_step.main([case])
    assert 'not a float32 decoder or encoder case' in capsys.readouterr().err


@needs_compiler
def test_the_step_runs_with_the_products_in_xla_openblas_and_none_and_attentions_too(
    registered, monkeypatch, capsys):
  monkeypatch.setattr(cases, 'SUITE', cases.QUICK)  # gpt_baby at a tiny size: quick compiles
  # the script swaps tx's functions for its variants: put them back afterwards
  monkeypatch.setattr(tx_matmul, 'torch_matmul', tx_matmul.torch_matmul)
  compile_step, specs = tx_side.compiled_train_step, []
  monkeypatch.setattr(tx_side, 'compiled_train_step',
                      lambda spec: specs.append(spec) or compile_step(spec))
  traced = []
  product = ffi_gemm_step.product
  monkeypatch.setattr(ffi_gemm_step, 'product',
                      lambda *a, mode='openblas', **k: traced.append(mode) or product(
                          *a, mode=mode, **k))
  assert ffi_gemm_step.main(['gpt_baby', '--rounds', '1', '--block', '1', '--warmup', '0',
                             '--attention', '--on', '{"steps_per_call": 2}',
                             '--variant', 'both', '{"ffi_products": "openblas", '
                             '"ffi_attention": "openblas"}']) == 0
  out = capsys.readouterr().out
  for variant in ('xla', 'openblas', 'no_products', 'openblas_attention',
                  'no_attention_products', 'both', 'xla_again'):
    assert f'\n{variant} ' in '\n' + out
  assert len(specs) == 7 and all(s['steps_per_call'] == 2 for s in specs)  # --on: every one
  assert out.index('\nboth ') < out.index('\nxla_again ')  # the A/A control stays last
  assert specs[5]['matmul_impl'] == 'torch'  # the custom call's products take tx's torch path
  assert "the dense products in the step: XLA's" in out
  assert "attention's batched products in the step: XLA's" in out
  assert set(traced) == {'openblas', 'none'}  # each custom variant traced its own products



@needs_compiler
def test_attentions_batched_products_in_the_custom_call_give_xlas_gradients(registered,
                                                                           monkeypatch):
  from tx.ops import attention  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(2)
  q = jnp.asarray(rng.standard_normal((2, 24, 4, 8), dtype=np.float32))  # 4 heads on 2 kv heads
  k, v = (jnp.asarray(rng.standard_normal((2, 24, 2, 8), dtype=np.float32)) for _ in range(2))
  mask = jnp.tril(jnp.ones((24, 24), bool))[None, None]
  loss = lambda q, k, v: jnp.sum(
      attention.dot_product_attention(q, k, v, mask=mask, implementation='xla') ** 2)
  want = jax.grad(loss, (0, 1, 2))(q, k, v)
  calls, batched_product = [], ffi_gemm_step.batched_product
  monkeypatch.setattr(ffi_gemm_step, 'batched_product',
                      lambda *a, **kw: calls.append(1) or batched_product(*a, **kw))
  monkeypatch.setattr(jnp, 'einsum', ffi_gemm_step.attention_einsum(jnp.einsum, 'openblas'))
  got = jax.jit(jax.grad(loss, (0, 1, 2)))(q, k, v)
  assert len(calls) == 7  # q·kᵀ and p·v; q·kᵀ again, then d_v, d_p, d_q and d_k
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)
