"""`tx compare`: tables with error bars and plots over sweeps and run directories.

    tx compare runs/pos                       # a `tx sweep --workdir`
    tx compare runs/a runs/b --out runs/ab    # any run directories (grouped by config)

stats.py (pure statistics), runs.py (finding and grouping runs), table.py (the table,
Markdown and CSV), plots.py (PNG curves), cli.py (the command).
"""
