"""benchmarks/gemm_layouts.py: the products it times are the step's, in the peers' layouts."""

import importlib.util
import os

import pytest

from tx.bench import cases

torch = pytest.importorskip('torch', reason='torch comes with the interop extra')

_PATH = os.path.join(os.path.dirname(__file__), '..', '..', 'benchmarks', 'gemm_layouts.py')
_SPEC = importlib.util.spec_from_file_location('gemm_layouts', _PATH)
gemm_layouts = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(gemm_layouts)

_TINY = dict(family='encoder', layers=2, d_model=8, d_ff=32, batch=2, ctx=3)


def _flops(m, k, n, times):
  return 2 * m * k * n * times


def test_products_split_the_projection_and_keep_the_steps_flops():
  split = gemm_layouts.products(_TINY)
  whole = cases.step_gemms(_TINY)
  assert sum(_flops(*p[1:4], p[5]) for p in split) == sum(_flops(*p[1:4], p[5]) for p in whole)
  assert [p[0] for p in split if p[0].startswith('projection')] == [
      'projection, forward', 'projection, input gradient', 'projection, weight gradient']


@pytest.mark.parametrize('family', ['encoder', 'decoder'])
def test_each_layout_multiplies_the_same_product(family):
  for label, m, k, n, transposed, _ in gemm_layouts.products(_TINY):
    for layout in ('tx', 'peer'):
      a, b = gemm_layouts.operands(torch, label, m, k, n, transposed, layout, family)
      assert a.shape[1] == b.shape[0], (label, layout)
      assert _flops(a.shape[0], a.shape[1], b.shape[1], 1) == _flops(m, k, n, 1), (label, layout)
    assert gemm_layouts.rate(torch, a, b, 1) > 0


def test_peer_layouts_are_the_layers_own():
  """nn.Linear multiplies by its weight [out, in] transposed in the forward product and as it
  is in the input gradient; GPT-2's Conv1D by its [in, out] weight as it is (as tx does)."""
  from transformers.pytorch_utils import Conv1D  # pylint: disable=g-import-not-at-top
  d, f = _TINY['d_model'], _TINY['d_ff']
  m = _TINY['batch'] * _TINY['ctx']
  linear, conv = torch.nn.Linear(d, f), Conv1D(f, d)
  _, forward = gemm_layouts.operands(torch, 'ffn in, forward', m, d, f, False, 'peer',
                                     'encoder')
  assert forward.stride() == linear.weight.t().stride()
  _, back = gemm_layouts.operands(torch, 'ffn in, input gradient', m, f, d, True, 'peer',
                                  'encoder')
  assert back.stride() == linear.weight.stride()
  _, forward = gemm_layouts.operands(torch, 'ffn in, forward', m, d, f, False, 'peer',
                                     'decoder')
  assert forward.stride() == conv.weight.stride()
  x_t, _ = gemm_layouts.operands(torch, 'ffn, weight gradient', d, m, f, False, 'peer',
                                 'decoder')
  assert x_t.stride() == torch.randn(m, d).t().stride()  # xᵀ as a view, not tx's copy


def test_an_unknown_case_or_no_rounds_is_refused():
  with pytest.raises(SystemExit, match='not a decoder or encoder case'):
    gemm_layouts.main(['--case', 'nope'])
  with pytest.raises(SystemExit, match='at least 1'):
    gemm_layouts.main(['--rounds', '0'])
