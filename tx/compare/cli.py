"""`tx compare DIR... [--metric NAME] [--baseline VARIANT] [--out DIR]`.

Prints the table, writes compare.md and compare.csv and the PNG plots into --out (default:
the one DIR given, else the directory that contains all of them).
"""

from __future__ import annotations

import os
from pathlib import Path

from tx.compare import plots, table
from tx.compare.runs import collect, pick_baseline
from tx.config.base import ConfigError


def output_dir(dirs: list[str], out: str | None) -> Path:
  """--out, else the single DIR, else the deepest directory containing every DIR."""
  if out:
    path = Path(out)
  elif len(dirs) == 1:
    path = Path(dirs[0])
  else:
    path = Path(os.path.commonpath([os.path.abspath(d) for d in dirs]))
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ConfigError(f'--out: cannot create {path} ({e.strerror}); choose another --out') from None
  return path


def compare(dirs: list[str], *, metric: str = 'eval.loss', baseline: str | None = None,
            out: str | None = None) -> tuple[table.Table, str, list[Path]]:
  """Builds the table and writes compare.md, compare.csv and plots; returns (table, the
  Markdown text, the files written)."""
  collection = collect(dirs)
  key = table.resolve_metric(collection, metric)
  base = pick_baseline(collection, baseline)
  t = table.build(collection, key, base)
  out_dir = output_dir(dirs, out)
  pngs = plots.curves(collection, plots.curve_key(collection, key), base, out_dir)
  pngs += plots.extrapolation(collection, base, out_dir)
  title = 'Comparison'
  if len(collection.sweeps) == 1:
    s = collection.sweeps[0]
    title = f'Sweep {s.get("name")} (base {s.get("base")})'
    if s.get('description'):
      title += f'\n\n{s["description"]}'
  failures = [f'- `{r.variant}` seed {r.seed}: {r.error}' for r in collection.runs if r.error]
  text = '\n\n'.join(
      [f'# {title}', table.markdown_table(t), table.legend(t)]
      + (['Failed runs:\n' + '\n'.join(failures)] if failures else [])
      + [f'![{p.stem}]({p.name})' for p in pngs]) + '\n'
  md, csv_path = out_dir / 'compare.md', out_dir / 'compare.csv'
  md.write_text(text)
  table.write_csv(t, csv_path)
  return t, text, [md, csv_path, *pngs]


def cli(args) -> int:
  """The `tx compare` command: print the table and where the files went."""
  t, _, files = compare(args.dirs, metric=args.metric, baseline=args.baseline, out=args.out)
  print(table.markdown_table(t))
  print()
  print(table.legend(t))
  print('wrote ' + ', '.join(str(f) for f in files))
  return 0
