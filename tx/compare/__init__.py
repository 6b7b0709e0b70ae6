"""`tx compare`: tables with error bars and plots over sweeps and run directories.

    tx compare runs/pos                       # a `tx sweep --workdir`
    tx compare runs/a runs/b --out runs/ab    # any run directories (grouped by config)
    tx compare runs/lr --x optim.learning_rate --curves loss diag/attn_logit_max

stats.py (pure statistics), runs.py (finding and grouping runs), table.py (the table,
Markdown and CSV), plots.py (PNG curves), lr_curves.py (pure LR-sensitivity definitions),
lr_report.py (`--x`: curves from runs, their table and CSV), cli.py (the command).
"""
