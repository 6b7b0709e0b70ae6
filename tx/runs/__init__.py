"""tx.runs: commands over a run directory, above training and the generation library.

training.py (`train_run`: training plus the end-of-run evaluations, what `tx train` and
`tx sweep` run), restore.py (a run's config, tokenizer and checkpointed state back),
evaluation.py (BLEU / chrF of decoded translations, perplexity at longer contexts,
masked-token scores), commands.py (`tx eval`, `tx generate`, the sample after `tx train`),
plan.py and plan_cli.py (`tx plan`: memory and FLOPs of a config on a simulated mesh).

What a run leaves in its directory (config.json, metrics.jsonl, summary.json) is written by
training, so those helpers stay in `tx.train.run_dir`.
"""
