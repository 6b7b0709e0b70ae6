"""`tx compare DIR... [--metric NAME] [--baseline VARIANT] [--out DIR] [--x KEY]
[--curves KEY ...]`.

Prints the table, writes compare.md and compare.csv and the PNG plots into --out (default:
the one DIR given, else the directory that contains all of them). `--x KEY` adds the metric
against a swept config key (lr_curves.md / .csv, `<metric>_vs_<KEY>.png`; see
lr_report.py); `--curves KEY ...` adds `curve_<KEY>.png` per metrics.jsonl column.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from tx.compare import lr_report, plots, table
from tx.compare.runs import collect, pick_baseline
from tx.config.base import ConfigError


@dataclasses.dataclass
class Result:
  """What `tx compare` computed and wrote."""
  table: table.Table
  text: str  # compare.md
  files: list[Path]
  lr: lr_report.Report | None = None  # with --x
  lr_text: str | None = None  # lr_curves.md


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


def _title(collection) -> str:
  if len(collection.sweeps) != 1:
    return 'Comparison'
  s = collection.sweeps[0]
  title = f'Sweep {s.get("name")} (base {s.get("base")})'
  return title + (f'\n\n{s["description"]}' if s.get('description') else '')


def run(dirs: list[str], *, metric: str = 'eval.loss', baseline: str | None = None,
        out: str | None = None, x: str | None = None,
        curves: list[str] | None = None) -> Result:
  """Builds the table (and with `x` the curves against it), writes the Markdown, CSV and
  PNG files, and returns them. Every user error is raised before anything is written."""
  collection = collect(dirs)
  key = table.resolve_metric(collection, metric)
  base = pick_baseline(collection, baseline)
  t = table.build(collection, key, base)
  report = lr_report.build(collection, x, key, base) if x else None
  out_dir = output_dir(dirs, out)
  step_pngs = plots.step_curves(collection, curves, base, out_dir) if curves else []
  pngs = plots.curves(collection, plots.curve_key(collection, key), base, out_dir)
  pngs += plots.extrapolation(collection, base, out_dir)
  files, lr_text = [], None
  if report:
    png = plots.metric_vs_x(report.curves, x, key, report.baseline, out_dir)
    lr_text = '\n\n'.join([f'# {key} vs {x}: {_title(collection)}',
                           lr_report.markdown_table(report), lr_report.legend(report),
                           f'![{png.stem}]({png.name})']) + '\n'
    md, csv_path = out_dir / 'lr_curves.md', out_dir / 'lr_curves.csv'
    md.write_text(lr_text)
    lr_report.write_csv(report, csv_path)
    files += [md, csv_path, png]
    pngs.append(png)
  pngs += step_pngs
  failures = [f'- `{r.variant}` seed {r.seed}: {r.error}' for r in collection.runs if r.error]
  text = '\n\n'.join(
      [f'# {_title(collection)}', table.markdown_table(t), table.legend(t)]
      + (['Failed runs:\n' + '\n'.join(failures)] if failures else [])
      + [f'![{p.stem}]({p.name})' for p in pngs]) + '\n'
  md, csv_path = out_dir / 'compare.md', out_dir / 'compare.csv'
  md.write_text(text)
  table.write_csv(t, csv_path)
  files = [md, csv_path, *[p for p in pngs if p not in files], *files]
  return Result(t, text, files, report, lr_text)


def compare(dirs: list[str], *, metric: str = 'eval.loss', baseline: str | None = None,
            out: str | None = None, x: str | None = None,
            curves: list[str] | None = None) -> tuple[table.Table, str, list[Path]]:
  """`run`, as (table, the compare.md text, the files written)."""
  r = run(dirs, metric=metric, baseline=baseline, out=out, x=x, curves=curves)
  return r.table, r.text, r.files


def cli(args) -> int:
  """The `tx compare` command: print the table(s) and where the files went."""
  r = run(args.dirs, metric=args.metric, baseline=args.baseline, out=args.out,
          x=getattr(args, 'x', None), curves=getattr(args, 'curves', None))
  print(table.markdown_table(r.table))
  print()
  print(table.legend(r.table))
  if r.lr:
    print()
    print(lr_report.markdown_table(r.lr))
    print()
    print(lr_report.legend(r.lr))
  print('wrote ' + ', '.join(str(f) for f in r.files))
  return 0
