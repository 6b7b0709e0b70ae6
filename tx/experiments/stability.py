"""Learning-rate sensitivity studies (Wortsman et al. 2023; Xiong et al. 2020): each design
choice compared by its curve of final loss against learning rate, not at one rate.

    TX_RAW_DATA=../shared/data tx sweep lr_norm_position --workdir runs/lr/norm_position
    tx compare runs/lr/norm_position --x optim.learning_rate --metric eval.loss \\
        --curves loss diag/attn_logit_max diag/log_z_mean

Each sweep: variants x 7 learning rates over 3 decades (lr_grid, 2 per decade) x 3 seeds;
a run that diverges is a data point (summary status 'diverged', drawn capped at its loss
at initialisation). Results and verdicts: experiments/RESULTS.md, "Learning-rate
sensitivity". Costs measured on an AMD EPYC (Zen 4) host, 2 cores, one run at a time
(2026-11-25): lr_norm_position 84 runs, about 35 min (shared CPU); lr_qk_norm and lr_z_loss
42 runs of 14-15 s, about 11 min each; lr_mlm_norm_position 42 runs, about 11 min.
lr_mt_label_smoothing (mt_lr_probe) 42 runs of 45-130 s, about 65 min, and lr_mup_width
(mup_lr_probe) 168 runs, about 2.5 h (its d 512 runs 1-3 min), both measured while sharing
the cores with each other and with tests.
"""

from tx.registry import axis, derive, experiment, lr_grid, product, sweep, zip_

LRS = lr_grid(1e-4, 1e-1, per_decade=2)  # 1e-4, 3.16e-4, ..., 1e-1: 7 rates, 3 decades


@experiment
def lm_lr_probe():
  """A 4-layer d64 char GPT for LR sweeps (ctx 64, batch 16, 300 steps, warmup 30 + cosine)."""
  return derive('lm_shakespeare_char', {
      'model.num_layers': 4, 'model.d_model': 64, 'model.num_heads': 4, 'model.d_ff': 256,
      'train.steps': 300, 'train.batch_size': 16, 'train.eval_every': 300,
      'train.eval_batches': 20, 'train.log_every': 10, 'train.checkpoint_every': 300,
      'train.sample_tokens': 0, 'optim.warmup_steps': 30, 'optim.min_learning_rate': 0.0,
      'optim.weight_decay': 0.0})


sweep('lr_norm_position', base='lm_lr_probe', seeds=3,
      axes=product(axis('model.norm_position', ['pre', 'post']),
                   axis('optim.warmup_steps', [0, 30]),
                   axis('optim.learning_rate', LRS)),
      baseline={'model.norm_position': 'pre', 'optim.warmup_steps': 0,
                'optim.learning_rate': LRS[3]},
      description='Xiong et al. 2020 as an LR sweep: Pre-LN vs Post-LN, warmup 0 vs 30')

sweep('lr_qk_norm', base='lm_lr_probe', seeds=3,
      axes=product(axis('model.qk_norm', ['none', 'layernorm']),
                   axis('optim.learning_rate', lr_grid(3e-4, 3e-1, per_decade=2))),
      baseline={'model.qk_norm': 'none', 'optim.learning_rate': 3e-3},
      description='Wortsman et al. 2023: QK-layernorm against attention-logit growth')

sweep('lr_z_loss', base='lm_lr_probe', seeds=3,
      axes=product(axis('task.z_loss', [0.0, 1e-4]),
                   axis('optim.learning_rate', lr_grid(3e-4, 3e-1, per_decade=2))),
      baseline={'task.z_loss': 0.0, 'optim.learning_rate': 3e-3},
      description='Wortsman et al. 2023: z-loss 1e-4 against output-logit divergence (no decay)')

@experiment
def mup_lr_probe():
  """lm_lr_probe at 2 layers and 200 steps (warmup 20): the width sweep's d 512 runs stay ~1 min."""
  return derive('lm_lr_probe', {
      'model.num_layers': 2, 'train.steps': 200, 'train.eval_every': 200,
      'train.checkpoint_every': 200, 'optim.warmup_steps': 20, 'model.mup_base_width': 64})


sweep('lr_mup_width', base='mup_lr_probe', seeds=3,
      axes=product(axis('model.parametrization', ['standard', 'mup']),
                   zip_(axis('model.d_model', [64, 128, 256, 512]),
                        axis('model.d_ff', [256, 512, 1024, 2048])),
                   axis('optim.learning_rate', LRS)),
      baseline={'model.parametrization': 'standard', 'model.d_model': 64, 'model.d_ff': 256,
                'optim.learning_rate': 1e-3},
      description='Yang et al. 2022: the best LR moves with width under SP, not under muP')

@experiment
def mlm_lr_probe():
  """lm_lr_probe's shape as a BERT-style masked LM (4L d64, ctx 64, batch 16, 300 steps)."""
  return derive('mlm_shakespeare', {
      'model.num_layers': 4, 'model.d_model': 64, 'model.num_heads': 4, 'model.d_ff': 256,
      'model.max_len': 64, 'data.seq_len': 64, 'train.steps': 300, 'train.batch_size': 16,
      'train.eval_every': 300, 'train.eval_batches': 20, 'train.log_every': 10,
      'train.checkpoint_every': 300, 'optim.warmup_steps': 30, 'optim.weight_decay': 0.0})


sweep('lr_mlm_norm_position', base='mlm_lr_probe', seeds=3,
      axes=product(axis('model.norm_position', ['post', 'pre']),
                   axis('optim.learning_rate', LRS)),
      baseline={'model.norm_position': 'post', 'optim.learning_rate': LRS[3]},
      description='Encoder-only: BERT Post-LN vs Pre-LN masked LM across learning rates')


@experiment
def mt_lr_probe():
  """mt_multi30k_small for LR sweeps: cosine (warmup 30) so the rate is the peak, batch 16.

  inverse_sqrt's learning_rate is a multiplier on d_model^-0.5 * warmup^-0.5, not a rate.
  """
  return derive('mt_multi30k_small', {
      'optim.schedule': 'cosine', 'optim.warmup_steps': 30, 'optim.min_learning_rate': 0.0,
      'train.batch_size': 16, 'train.eval_every': 300, 'train.log_every': 10})


sweep('lr_mt_label_smoothing', base='mt_lr_probe', seeds=3,
      axes=product(axis('task.label_smoothing', [0.0, 0.1]),
                   axis('optim.learning_rate', LRS)),
      baseline={'task.label_smoothing': 0.0, 'optim.learning_rate': LRS[3]},
      description='Encoder-decoder: label smoothing 0 vs 0.1 on Multi30k across learning rates')
