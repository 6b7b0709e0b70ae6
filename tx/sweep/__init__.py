"""Sweeps: a base experiment x axes of overrides x seeds (see tx/sweep/spec.py).

    from tx.registry import sweep, axis, product, zip_
    sweep('ablate_norm', base='lm_tiny', seeds=3,
          axes=product(zip_(axis('model.norm_position', ['pre', 'post']),
                            axis('optim.warmup_steps', [0, 500])),
                       axis('model.norm', ['layernorm', 'rmsnorm'])))

`tx sweep NAME --workdir DIR` runs it (tx/sweep/runner.py); `tx compare DIR` compares it.
"""

from tx.sweep.axes import Axes, axis, cases, product, zip_
from tx.sweep.names import short_keys, variant_name
from tx.sweep.spec import Run, Sweep, Variant, make_sweep, plan, select
