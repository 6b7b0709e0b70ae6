"""Wall time of the whole `lm_shakespeare_char` run: `tx train` against a PyTorch peer run.

    TX_RAW_DATA=../shared/data python benchmarks/lm_recipe_race.py [--steps 2000] [--rounds 1]

Both sides run the recipe end to end in a fresh process, one after the other (alternating
when --rounds > 1), 2 threads each, and the wall time counts everything from the process
start: imports, reading the text, building the model, compiling (tx), 2,000 AdamW steps of
batch 12 x 64 characters with warmup + cosine, an evaluation of 200 validation batches every
250 steps and at the end. tx also writes its checkpoints, metrics and TensorBoard events and
samples 300 characters at the end; the peer does none of that, so the comparison favours
the peer.

The peer is the model `tx bench` measures as gpt_baby's peer (transformers' GPT-2: 4 layers,
4 heads, d 128, d_ff 512, vocabulary 65, ctx 64, dropout 0; sdpa attention), trained as
nanoGPT trains it: random windows of the first 90 % of the text, AdamW (0.9, 0.99), weight
decay 0.1, clip 1.0, lr 1e-3 with 100 warmup steps and cosine to 1e-4 at step 2000; the
validation loss is the mean over 200 random windows of the last 10 %.
Prints one line per run and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tx.bench.worker import thread_env  # pylint: disable=wrong-import-position


def peer_run(steps: int, text_path: str) -> dict:
  """The PyTorch run (in this process): {'val_loss', 'train_s'}."""
  import math  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from tx.bench.torch_peers import _gpt2  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(2)
  torch.manual_seed(0)
  text = Path(text_path).read_text(encoding='utf-8')
  chars = sorted(set(text))
  index = {c: i for i, c in enumerate(chars)}
  ids = torch.tensor([index[c] for c in text], dtype=torch.long)
  split = int(0.9 * len(ids))
  train, val = ids[:split], ids[split:]
  ctx, batch = 64, 12
  model = _gpt2({'layers': 4, 'heads': 4, 'd_model': 128, 'd_ff': 512, 'vocab': len(chars)},
                ctx).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)

  def windows(data):
    starts = torch.randint(len(data) - ctx - 1, (batch,))
    x = torch.stack([data[s:s + ctx] for s in starts])
    y = torch.stack([data[s + 1:s + ctx + 1] for s in starts])
    return x, y

  def loss_of(x, y):
    logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

  def lr_at(step):
    if step < 100:
      return 1e-3 * (step + 1) / 100
    progress = (step - 100) / max(1, steps - 100)
    return 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + math.cos(math.pi * min(1.0, progress)))

  @torch.no_grad()
  def evaluate():
    model.eval()
    losses = [loss_of(*windows(val)).item() for _ in range(200)]
    model.train()
    return sum(losses) / len(losses)

  start, val_loss = time.perf_counter(), float('nan')
  for step in range(steps):
    for group in opt.param_groups:
      group['lr'] = lr_at(step)
    x, y = windows(train)
    loss = loss_of(x, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    if (step + 1) % 250 == 0 or step + 1 == steps:
      val_loss = evaluate()
  return {'val_loss': val_loss, 'train_s': time.perf_counter() - start}


def _timed(cmd: list[str], env: dict) -> tuple[float, str]:
  start = time.perf_counter()
  done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - start
  if done.returncode:
    raise SystemExit(f'{cmd[:4]} failed ({done.returncode}):\n{done.stderr[-3000:]}')
  return wall, done.stdout


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--steps', type=int, default=2000)
  p.add_argument('--rounds', type=int, default=1)
  p.add_argument('--peer-child', action='store_true', help=argparse.SUPPRESS)
  args = p.parse_args()
  raw = os.environ.get('TX_RAW_DATA')
  if not raw:
    raise SystemExit('set TX_RAW_DATA to the folder holding tinyshakespeare/input.txt')
  text = str(Path(raw) / 'tinyshakespeare' / 'input.txt')
  if args.peer_child:
    print(json.dumps(peer_run(args.steps, text)))
    return 0
  env = dict(os.environ, **thread_env(2), PYTHONPATH=str(ROOT))
  tx_walls, peer_walls = [], []
  for r in range(args.rounds):
    with tempfile.TemporaryDirectory() as tmp:
      wall, _ = _timed([sys.executable, '-m', 'tx', 'train', 'lm_shakespeare_char', '--workdir',
                        tmp, '--quiet', '--set', f'train.steps={args.steps}'], env)
      summary = json.loads((Path(tmp) / 'summary.json').read_text())
    tx_walls.append(wall)
    print(f'round {r + 1} tx:   {wall:7.1f} s wall (train {summary["train_time_s"]:.1f} s, '
          f'compile {summary["compile_time_s"]:.1f} s), val loss {summary["eval"]["loss"]:.4f}',
          flush=True)
    wall, out = _timed([sys.executable, __file__, '--peer-child', '--steps', str(args.steps)],
                       env)
    peer = json.loads(out.strip().splitlines()[-1])
    peer_walls.append(wall)
    print(f'round {r + 1} peer: {wall:7.1f} s wall (train + eval {peer["train_s"]:.1f} s), '
          f'val loss {peer["val_loss"]:.4f}', flush=True)
  t, q = statistics.median(tx_walls), statistics.median(peer_walls)
  print(f'median wall: tx {t:.1f} s, peer {q:.1f} s: tx takes {t / q:.2f}x the peer\'s time')
  return 0


if __name__ == '__main__':
  sys.exit(main())
