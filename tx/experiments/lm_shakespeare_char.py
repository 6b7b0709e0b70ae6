"""lm_shakespeare_char: nanoGPT's CPU "baby GPT" on tiny shakespeare, character level.

    TX_RAW_DATA=../shared/data tx train lm_shakespeare_char --workdir runs/shakespeare

4 layers, 4 heads, d 128, context 64, batch 12, 2000 steps, AdamW lr 1e-3 -> 1e-4 cosine,
warmup 100, beta2 0.99, weight decay 0.1, clip 1.0, no dropout, 90/10 split by position.
Reads tinyshakespeare/input.txt under data.raw_dir / $TX_RAW_DATA, else the TFDS catalog.
nanoGPT reports val loss 1.88 for this config. Measured 2026-11-25 on the AMD EPYC host
(2 cores, idle), `python benchmarks/lm_recipe_race.py`: the whole `tx train` run 105.4 s wall
(train 79.6 s, compile 2.8 s), final val loss 1.8587; a PyTorch peer run of the same config
(transformers' GPT-2 in nanoGPT's loop, the same evaluations) 130.7 s, val loss 1.9064.
`tx bench --only gpt_baby` just after: 21,898 vs 15,577 train tokens/s (1.41x).
"""

from tx.config import DataConfig, ModelConfig
from tx.config.experiment import ExperimentConfig
from tx.config.optim import OptimConfig
from tx.config.train import DecodeConfig, TrainConfig
from tx.registry import experiment


@experiment
def lm_shakespeare_char():
  """nanoGPT's baby GPT on tiny shakespeare (char level, 4L/4H/d128, ctx 64, 2000 steps)."""
  return ExperimentConfig(
      model=ModelConfig(family='decoder', d_model=128, num_heads=4, d_ff=512, num_layers=4,
                        max_len=64, position='learned', norm='layernorm', norm_position='pre',
                        ffn='gelu', dropout=0.0, use_bias=False, tie_embeddings=True),
      data=DataConfig(dataset='tinyshakespeare', tokenizer='char', seq_len=64,
                      validation_fraction=0.1),
      optim=OptimConfig(name='adamw', learning_rate=1e-3, b1=0.9, b2=0.99, weight_decay=0.1,
                        schedule='cosine', warmup_steps=100, min_learning_rate=1e-4,
                        clip_norm=1.0),
      train=TrainConfig(steps=2000, batch_size=12, eval_every=250, eval_batches=200,
                        log_every=50, checkpoint_every=500),
      decode=DecodeConfig(strategy='sample', temperature=0.8, top_k=200, max_len=300),
  )
