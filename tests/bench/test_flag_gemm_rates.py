"""benchmarks/flag_gemm_rates.py: each flag set in its own process, the step's products summed."""

import importlib.util
import os

import pytest

_PATH = os.path.join(os.path.dirname(__file__), '..', '..', 'benchmarks', 'flag_gemm_rates.py')
_SPEC = importlib.util.spec_from_file_location('flag_gemm_rates', _PATH)
flag_gemm_rates = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(flag_gemm_rates)


def test_bad_flag_sets_or_cases_are_refused():
  with pytest.raises(SystemExit, match='NAME=XLA_FLAGS'):
    flag_gemm_rates.main(['--flags', 'defaults', '--flags', 'b='])
  with pytest.raises(SystemExit, match='at least two flag sets'):
    flag_gemm_rates.main(['--flags', 'defaults='])
  with pytest.raises(SystemExit, match='not a decoder or encoder case'):
    flag_gemm_rates.main(['--case', 'nope', '--flags', 'a=', '--flags', 'b='])


def test_sets_alternate_and_a_step_sums_its_products_at_each_sets_rates(monkeypatch, capsys):
  calls = []

  def fake_run(args, name, flags):
    calls.append((name, flags))
    scale = {'slow': 1.0, 'fast': 2.0}[name]  # GFLOP/s: every product twice as fast
    return {label: [scale * 1e11, scale * 1.2e11]
            for label, *_ in flag_gemm_rates.products(args.case)}

  monkeypatch.setattr(flag_gemm_rates, '_run_set', fake_run)
  flag_gemm_rates.main(['--case', 'gpt_baby', '--rounds', '2', '--flags', 'slow=',
                        '--flags', 'fast=--xla_cpu_use_onednn=true'])
  assert calls == [('slow', ''), ('fast', '--xla_cpu_use_onednn=true'),
                   ('fast', '--xla_cpu_use_onednn=true'), ('slow', '')]
  out = capsys.readouterr().out
  assert 'fast: ' in out and '0.50x' in out  # half the slow set's seconds
  shapes = flag_gemm_rates.products('gpt_baby')
  flops = sum(t * 2 * m * k * n for _, m, k, n, _, t in shapes)
  rates = {label: [1e11, 1e11] for label, *_ in shapes}
  assert flag_gemm_rates._step_seconds(shapes, rates) == pytest.approx(flops / 1e11)


def test_a_worker_times_every_product_of_the_step():
  got = flag_gemm_rates._measure('gpt_baby', reps=1, threads=1, use_torch=False)
  assert set(got) == {p[0] for p in flag_gemm_rates.products('gpt_baby')}
  assert all(best >= median > 0 for median, best in got.values())
