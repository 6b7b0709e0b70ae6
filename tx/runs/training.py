"""`train_run`: training as `tx train` and `tx sweep` run it, with the end-of-run evaluations.

`tx.train.loop.train` trains and writes the run directory; the evaluations that need more
than the training loop (the train.extrapolation perplexity table) sit here, above it, and
are passed in as its `final_eval` hook.
"""

from __future__ import annotations

from pathlib import Path

from tx.config.experiment import ExperimentConfig
from tx.runs.evaluation import extrapolation
from tx.train import loop


def end_of_run_eval(cfg: ExperimentConfig, params, mesh, tokenizer) -> dict:
  """The causal-LM extrapolation table at train.extrapolation x data.seq_len ({} otherwise)."""
  if not cfg.train.extrapolation or cfg.task_name != 'causal_lm':
    return {}
  return extrapolation(cfg, params, 'validation', mesh, factors=cfg.train.extrapolation,
                       max_batches=cfg.train.eval_batches, tokenizer=tokenizer)


def train_run(cfg: ExperimentConfig, workdir: str | Path, *, quiet: bool = False,
              **kwargs) -> loop.RunResult:
  """`tx.train.loop.train(cfg, workdir)` with `end_of_run_eval` as its final evaluation."""
  return loop.train(cfg, workdir, quiet=quiet, final_eval=end_of_run_eval, **kwargs)
