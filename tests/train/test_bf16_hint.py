"""The one-line hint where model.dtype=bfloat16 meets a CPU whose bf16 GEMMs are no faster
than its float32 ones (tx/train/bf16_hint.py): said by tx train and tx tune, from the two
measured GEMM ceilings (faked here: no timing in tests)."""

import math

import jax
import pytest

from tx.train import bf16_hint, flops

AVX512_BF16_NO_AMX = {'bfloat16': 190e9, 'float32': 260e9}  # GFLOP/s as on Intel 207


def _fake_ceilings(rates, calls=None):
  def measure(dtype='float32', *args, **kwargs):
    del args, kwargs
    if calls is not None:
      calls.append(str(dtype))
    return rates[str(dtype)]
  return measure


def test_the_hint_comes_only_where_bf16_gemms_are_no_faster():
  hint = bf16_hint.advice(190e9, 260e9)
  assert '0.73x' in hint and '190 against 260 GFLOP/s' in hint
  assert 'model.dtype=float32' in hint
  assert bf16_hint.advice(1528e9, 301e9) is None  # AMX: bf16 ~5x float32
  assert bf16_hint.advice(261e9, 260e9) is None


def test_float32_ceiling_is_measured_only_for_a_bf16_run_on_a_cpu(monkeypatch):
  calls = []
  monkeypatch.setattr(flops, 'measure_matmul_ceiling',
                      _fake_ceilings(AVX512_BF16_NO_AMX, calls))
  assert bf16_hint.check('float32', 'cpu', 260e9) is None
  assert bf16_hint.check('bfloat16', 'gpu', 190e9) is None
  assert calls == []
  assert '0.73x' in bf16_hint.check('bfloat16', 'cpu', 190e9)
  assert calls == ['float32']


def test_a_bf16_run_on_such_a_cpu_says_so_and_trains(tt, tmp_path, monkeypatch, capsys):
  from tx.train import loop  # pylint: disable=import-outside-toplevel
  fake = _fake_ceilings(AVX512_BF16_NO_AMX)
  monkeypatch.setattr(flops, 'measure_matmul_ceiling', fake)
  monkeypatch.setattr(loop, 'measure_matmul_ceiling', fake)
  cfg = tt.config('decoder', name='tiny_bf16', model=dict(dtype='bfloat16'),
                  train=dict(steps=4, eval_every=4, log_every=2, checkpoint_every=4))
  result = loop.train(cfg, tmp_path, quiet=True)
  err = capsys.readouterr().err
  hints = [line for line in err.splitlines() if line.startswith('model.dtype=bfloat16')]
  assert len(hints) == 1 and 'set model.dtype=float32' in hints[0]
  assert math.isfinite(result.summary['eval']['loss'])
  assert result.summary['matmul_ceiling_flops'] == pytest.approx(190e9 * jax.device_count())


@pytest.mark.parametrize('dtype, said', [('bfloat16', 1), ('float32', 0)])
def test_tx_tune_says_it_before_timing_a_bf16_step(tt, monkeypatch, dtype, said):
  from tx.runs import tune  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(flops, 'measure_matmul_ceiling', _fake_ceilings(AVX512_BF16_NO_AMX))
  lines = []
  cfg = tt.config('decoder', model=dict(dtype=dtype))
  tune._say_bf16_hint(cfg, lines.append)  # pylint: disable=protected-access
  assert len(lines) == said
  assert all(line.startswith('tx tune: model.dtype=bfloat16') for line in lines)
