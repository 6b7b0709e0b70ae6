"""decoder_1b, decoder_7b: LLaMA-style decoders at 1B and 7B parameters, for `tx plan`.

    tx plan decoder_7b --mesh fsdp=64 --device-memory 80GB
    tx plan decoder_7b --mesh fsdp=16,tensor=4 --device-memory 80GB
    tx plan decoder_1b --mesh fsdp=8 --device-memory 80GB

Measured (simulated CPU devices, GiB per device; compile ~15-25 s each on 2 shared cores):
decoder_7b (6,738,415,616 params) on 64 devices: fsdp=64 14.83 total (params 0.39, AdamW
0.78, temporaries 13.66: fits 80 GiB); fsdp=16 x tensor=4 29.75 (fits); data=64 125.27 (no:
75 GiB of replicated fp32 state). On 8: fsdp=8 112.82 (no), with optim.grad_accum_steps=8
30.08 (fits). decoder_1b (953,223,168 params) on 8: fsdp=8 49.72, data=8 62.23 (both fit).
The full table, and why CPU temporaries only estimate a GPU's, is in docs/plan.md.

Both: pre-RMSNorm, RoPE, SwiGLU, no biases, untied output layer, vocabulary 32,000 (BPE),
context 2048, scanned layers (`model.scan_layers`: one layer is compiled, whatever the depth)
with full rematerialization (only each layer's input is kept for the backward pass), bf16
compute with fp32 parameters and fp32 AdamW moments. Global batch 256 sequences x 2048 tokens
= 524,288 tokens per step (LLaMA used ~4M; 256 divides every data x fsdp size up to 256).
Training them needs real accelerators (and data.dataset pointing at a corpus worth it: the
`stdlib` default only keeps the config valid); these entries exist to plan memory and sharding.
"""

from tx.config import DataConfig, ModelConfig
from tx.config.experiment import ExperimentConfig
from tx.config.optim import OptimConfig
from tx.config.train import TrainConfig
from tx.registry import experiment


def _llama(d_model: int, num_heads: int, d_ff: int, num_layers: int) -> ExperimentConfig:
  return ExperimentConfig(
      model=ModelConfig(family='decoder', vocab_size=32000, d_model=d_model,
                        num_heads=num_heads, d_ff=d_ff, num_layers=num_layers, max_len=2048,
                        position='rope', norm='rmsnorm', norm_eps=1e-6, ffn='swiglu',
                        use_bias=False, tie_embeddings=False, scan_layers=True, remat='full',
                        dtype='bfloat16', param_dtype='float32'),
      data=DataConfig(dataset='stdlib', tokenizer='bpe', vocab_size=32000, seq_len=2048),
      optim=OptimConfig(name='adamw', learning_rate=3e-4, b1=0.9, b2=0.95, eps=1e-8,
                        weight_decay=0.1, schedule='cosine', warmup_steps=2000,
                        min_learning_rate=3e-5, clip_norm=1.0),
      train=TrainConfig(steps=100_000, batch_size=256, eval_every=1000, eval_batches=20,
                        log_every=10, checkpoint_every=1000, sample_tokens=0),
  )


@experiment
def decoder_7b():
  """LLaMA-7B shape (32L, d 4096, 32 heads, SwiGLU 11008, 32k vocab, ctx 2048): for tx plan."""
  return _llama(d_model=4096, num_heads=32, d_ff=11008, num_layers=32)


@experiment
def decoder_1b():
  """A ~1B LLaMA-style decoder (16L, d 2048, 16 heads, SwiGLU 5632, 32k vocab): for tx plan."""
  return _llama(d_model=2048, num_heads=16, d_ff=5632, num_layers=16)

