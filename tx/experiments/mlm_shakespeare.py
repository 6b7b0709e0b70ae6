"""mlm_shakespeare: a small BERT-style masked LM on tiny shakespeare (character level).

    TX_RAW_DATA=../shared/data tx train mlm_shakespeare --workdir runs/mlm

Encoder-only, 4 layers, d 128, 4 heads, learned positions, post-LayerNorm with an
embedding LayerNorm (BERT), exact GELU, MLM head tied to the embeddings; 15% of
characters selected, 80/10/10 mask/random/keep. Reports masked-token accuracy.
"""

from tx.config import DataConfig, ModelConfig
from tx.config.experiment import ExperimentConfig
from tx.config.optim import OptimConfig
from tx.config.train import TrainConfig
from tx.registry import experiment


@experiment
def mlm_shakespeare():
  """BERT-style masked LM on tiny shakespeare characters (4L/d128, post-LN, 15% masking)."""
  return ExperimentConfig(
      model=ModelConfig(family='encoder', d_model=128, num_heads=4, d_ff=512, num_layers=4,
                        max_len=128, position='learned', norm='layernorm', norm_position='post',
                        norm_eps=1e-12, embed_norm=True, ffn='gelu', dropout=0.0),
      data=DataConfig(dataset='tinyshakespeare', tokenizer='char', seq_len=128),
      optim=OptimConfig(name='adamw', learning_rate=1e-3, b2=0.98, weight_decay=0.01,
                        schedule='linear', warmup_steps=100, min_learning_rate=0.0,
                        clip_norm=1.0),
      train=TrainConfig(steps=2000, batch_size=32, eval_every=250, eval_batches=50,
                        log_every=50, checkpoint_every=500),
  )
