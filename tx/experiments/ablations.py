"""Ablation sweeps that reproduce published findings at CPU scale.

    TX_RAW_DATA=../shared/data tx sweep ablate_positions --workdir runs/ablate_positions
    tx compare runs/ablate_positions --metric eval.extrapolation.256

Small bases derived from the main experiments (never copied), then one sweep per
finding. Results, with the commands that regenerate them: experiments/RESULTS.md.
"""

from tx.registry import axis, cases, derive, experiment, product, sweep


@experiment
def lm_shakespeare_small():
  """2-layer char GPT on tiny shakespeare for ablations (ctx 64, 600 steps, 1-4x extrapolation)."""
  return derive('lm_shakespeare_char', {
      'model.num_layers': 2, 'model.d_model': 64, 'model.num_heads': 4, 'model.d_ff': 256,
      'train.steps': 600, 'train.batch_size': 16, 'train.eval_every': 300,
      'train.eval_batches': 40, 'train.checkpoint_every': 600, 'train.sample_tokens': 0,
      'train.extrapolation': (1, 2, 4), 'optim.warmup_steps': 50})


@experiment
def lm_shakespeare_deep():
  """A 6-layer narrow char GPT, constant LR 2e-3 (no decay), for the Pre-LN vs Post-LN ablation."""
  return derive('lm_shakespeare_small', {
      'model.num_layers': 6, 'train.steps': 400, 'train.eval_every': 200,
      'train.extrapolation': (), 'optim.schedule': 'constant', 'optim.learning_rate': 2e-3,
      'optim.warmup_steps': 0})


@experiment
def mlm_shakespeare_small():
  """A 2-layer BERT-style char masked LM for encoder-only ablations (400 steps)."""
  return derive('mlm_shakespeare', {
      'model.num_layers': 2, 'model.d_model': 64, 'model.d_ff': 256, 'train.steps': 400,
      'train.eval_every': 200, 'train.eval_batches': 20, 'train.checkpoint_every': 400})


@experiment
def mt_multi30k_small():
  """A 1+1-layer d128 Multi30k En->De Transformer for encoder-decoder ablations (300 steps)."""
  return derive('mt_multi30k_paper', {
      'model.num_layers': 1, 'model.d_model': 128, 'model.d_ff': 512, 'data.vocab_size': 2000,
      'train.steps': 300, 'train.eval_every': 150, 'train.eval_batches': 10,
      'train.checkpoint_every': 300, 'optim.warmup_steps': 100})


sweep('ablate_positions', base='lm_shakespeare_small', seeds=3,
      axes=axis('model.position', ['sinusoidal', 'learned', 'rope', 'alibi', 't5', 'none']),
      baseline={'model.position': 'sinusoidal'},
      description='Press et al. 2022: trained at 64, evaluated at 64/128/256; ALiBi extrapolates')

sweep('ablate_norm_position', base='lm_shakespeare_deep', seeds=3,
      axes=product(axis('model.norm_position', ['pre', 'post']),
                   axis('optim.warmup_steps', [0, 100])),
      baseline={'model.norm_position': 'pre', 'optim.warmup_steps': 0},
      description='Xiong et al. 2020: Post-LN needs learning-rate warmup, Pre-LN does not')

sweep('ablate_ffn', base='lm_shakespeare_small', seeds=3,
      axes=cases({'model.ffn': 'relu'}, {'model.ffn': 'gelu'},
                 # 3 matrices of 2/3 width: matched params
                 {'model.ffn': 'swiglu', 'model.d_ff': 170},
                 {'model.ffn': 'gelu', 'model.moe.num_experts': 4, 'model.moe.top_k': 2}),
      overrides={'train.extrapolation': ()},
      baseline={'model.ffn': 'relu'},
      description='ReLU vs GELU vs SwiGLU (matched parameters) vs a 4-expert top-2 MoE')

sweep('ablate_mlm_norm', base='mlm_shakespeare_small', seeds=2,
      axes=axis('model.norm_position', ['post', 'pre']), baseline={'model.norm_position': 'post'},
      description='Encoder-only: BERT post-LN vs pre-LN masked LM')

sweep('ablate_mt_label_smoothing', base='mt_multi30k_small', seeds=2,
      axes=axis('task.label_smoothing', [0.0, 0.1]), baseline={'task.label_smoothing': 0.0},
      description='Encoder-decoder: label smoothing 0 vs 0.1 (the paper) on Multi30k')
