"""Fixtures shared by the tests of the ops that call PyTorch's CPU kernels (torch_attention,
torch_matmul): a missing torch, and a child process on 8 simulated CPU devices."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tx.ops import torch_host


@pytest.fixture
def missing_torch_is_a_one_line_error(monkeypatch):
  """check(call): `call()`, with `import torch` failing, raises the one-line ValueError
  naming the extra to install."""
  def check(call):
    monkeypatch.setitem(sys.modules, 'torch', None)  # `import torch` now raises ImportError
    torch_host.torch_module.cache_clear()
    try:
      with pytest.raises(ValueError, match=r"needs PyTorch: pip install -e '\.\[interop\]'"):
        call()
    finally:
      monkeypatch.delitem(sys.modules, 'torch')
      torch_host.torch_module.cache_clear()
  return check


@pytest.fixture
def run_on_8_devices(tmp_path):
  """run(source): runs `source` in a fresh Python with 8 CPU devices and tx importable; it
  must print 'ok' last."""
  def run(source: str) -> None:
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(root),
               XLA_FLAGS='--xla_force_host_platform_device_count=8')
    (tmp_path / 'child.py').write_text(source)
    proc = subprocess.run([sys.executable, str(tmp_path / 'child.py')], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip().endswith('ok'), proc.stderr[-3000:]
  return run
