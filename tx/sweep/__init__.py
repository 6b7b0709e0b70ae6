"""Sweeps: a base experiment x axes of overrides x seeds (see tx/sweep/spec.py).

    from tx.registry import sweep, axis, lr_grid, product, zip_
    sweep('ablate_norm', base='lm_tiny', seeds=3,
          axes=product(zip_(axis('model.norm_position', ['pre', 'post']),
                            axis('optim.warmup_steps', [0, 500])),
                       axis('model.norm', ['layernorm', 'rmsnorm'])))
    sweep('lr_norm', base='lm_tiny', seeds=3,
          axes=product(axis('model.norm_position', ['pre', 'post']),
                       axis('optim.learning_rate', lr_grid(1e-4, 3e-1))))

`tx sweep NAME --workdir DIR` runs it (tx/sweep/runner.py); `tx compare DIR` compares it
(`--x optim.learning_rate` for LR-sensitivity curves).
"""

from tx.sweep.axes import Axes, axis, cases, lr_grid, product, zip_
from tx.sweep.names import short_keys, variant_name
from tx.sweep.spec import Run, Sweep, Variant, make_sweep, plan, select
