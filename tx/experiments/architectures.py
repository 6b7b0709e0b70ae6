"""Studies of today's architecture knobs (docs/architectures.md).

    TX_RAW_DATA=../shared/data tx sweep window_local_global --workdir runs/arch/window
    tx compare runs/arch/window --metric eval.loss

window_local_global: sliding-window attention (Mistral, Gemma-2) at a fixed budget: window
size and local:global ratio against validation loss at the training length (128) and at 2x
and 4x of it, with the decoding cache each layout keeps (experiments/RESULTS.md). 7 variants
x 3 seeds of a 4-layer d64 RoPE char GPT, 300 steps each.
"""

from tx.registry import cases, derive, experiment, sweep


@experiment
def lm_window_probe():
  """lm_lr_probe with RoPE and a 128-character context (300 steps, lr 3e-3)."""
  return derive('lm_lr_probe', {
      'model.position': 'rope', 'model.max_len': 128, 'data.seq_len': 128,
      'optim.learning_rate': 3e-3, 'train.extrapolation': (1, 2, 4)})


sweep('window_local_global', base='lm_window_probe', seeds=3,
      axes=cases({'model.attention_window': 0},
                 {'model.attention_window': 16},
                 {'model.attention_window': 16,
                  'model.attention_pattern': 'local,local,local,global'},
                 {'model.attention_window': 16, 'model.attention_pattern': 'local,global'},
                 {'model.attention_window': 32},
                 {'model.attention_window': 32, 'model.attention_pattern': 'local,global'},
                 {'model.attention_window': 64}),
      baseline={'model.attention_window': 0},
      description='Sliding window: window 16/32/64 and local:global 1:0, 3:1, 1:1 vs global')
