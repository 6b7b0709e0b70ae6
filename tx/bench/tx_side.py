"""The tx measurements of `tx bench`: one function per kind, each `spec: dict -> dict`.

Each runs in its own process (tx/bench/worker.py), so its peak RSS is its own. The models
copy their PyTorch peers' architecture (tx/bench/torch_peers.py), so a ratio compares
implementations, not architectures:

  decoder          GPT-2: learned positions, pre-LayerNorm (eps 1e-5), gelu_tanh, biases,
                   tied head; causal LM loss; AdamW (lr 1e-3, b2 0.99, wd 0.1), clip 1.0.
  encoder          BERT MLM: learned positions, post-LayerNorm, embedding LayerNorm, exact
                   GELU, biases, tied decoder; 15% of positions carry the loss; AdamW.
  encoder_decoder  torch.nn.Transformer: post-LayerNorm, ReLU, sinusoidal positions,
                   embeddings x sqrt(d), separate source / target tables, output tied to the
                   target table; label smoothing 0.1; Adam (0.9, 0.98, 1e-9).

Spec keys: family, layers (enc_layers, dec_layers), heads, d_model, d_ff, vocab, ctx
(src_len, tgt_len), batch, steps, warmup, dtype ('float32' | 'bfloat16'), scan, remat,
ablate_attention (train: every attention replaced by `attention_stand_in`; the peer does
the same, so the two steps' times with and without it give what attention costs in each);
attention_impl (model.attention_impl: 'auto', the default, takes cuDNN on a GPU in bf16;
'xla' forces XLA's; 'torch' is torch's CPU flash kernel); matmul_impl (model.matmul_impl:
'torch' puts the dense products in torch's CPU GEMM); norm_impl (model.norm_impl: 'torch'
puts the norms in torch's CPU kernels); mlm_max_predictions (encoder:
data.mlm_max_predictions, the MLM head at that many positions a row; the synthetic batch
selects at most that many); xla_options (train: XLA debug options for this step's compile
alone, `compile(compiler_options=...)`, e.g. {'xla_cpu_use_onednn': True} or
{'xla_cpu_experimental_ynn_fusion_type': 'LIBRARY_FUSION_TYPE_DOT'} (enum names, not the
XLA_FLAGS spellings): settings compared in one process); decoding: prompt_len, new,
repeats. model (tx's side only: ModelConfig fields set otherwise, e.g. {'ffn': 'relu'}, for
in-process A/Bs of what a part costs in tx's step; the peer ignores it). steps_per_call
(train.steps_per_call); grad_accum_steps (optim.grad_accum_steps:
tx's step takes its batch in that many micro-batches, the same update; the peer's step
does not). platform ('cpu' | 'gpu', set by tx/bench/worker.py): a 'gpu' measurement refuses
to run on anything but a GPU, and adds device_peak_bytes (the allocator's high-water mark)
to a training result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tx import ops
from tx.bench import cases, torch_peers
from tx.config import DataConfig, ModelConfig
from tx.config.experiment import ExperimentConfig
from tx.config.optim import OptimConfig
from tx.config.train import TaskConfig, TrainConfig
from tx.data.mlm import lowest_per_row
from tx.decode.generate import generate_lm, generate_seq2seq
from tx.layers.attention import causal_block_count
from tx.models.build import build_model
from tx.ops.torch_host import torch_module
from tx.tasks.objectives import make_task
from tx.timing import (median_and_best, process_usage, sample_seconds, usage_per_step,
                       warm_until_steady)
from tx.train.flops import flops_per_step, gemm_rates, matmul_rates, mlm_head_positions
from tx.train.mesh import batch_sharding, logical_rules, make_mesh, stacked_sharding
from tx.train.optimizer import make_optimizer
from tx.train.state import init_state, state_shardings
from tx.train.step import consecutive_steps, jit_train_step, make_train_step

_ARCH = {
    'decoder': dict(position='learned', norm='layernorm', norm_position='pre', ffn='gelu_tanh',
                    norm_eps=1e-5, use_bias=True, tie_embeddings=True),
    'encoder': dict(position='learned', norm='layernorm', norm_position='post', ffn='gelu',
                    norm_eps=1e-12, use_bias=True, tie_embeddings=True, embed_norm=True),
    'encoder_decoder': dict(position='sinusoidal', norm='layernorm', norm_position='post',
                            ffn='relu', norm_eps=1e-5, use_bias=True, tie_embeddings=True,
                            share_embeddings=False, scale_embeddings=True),
}
_OPTIM = {
    'decoder': OptimConfig(name='adamw', learning_rate=1e-3, b2=0.99, weight_decay=0.1,
                           schedule='constant', clip_norm=1.0),
    'encoder': OptimConfig(name='adamw', learning_rate=1e-4, weight_decay=0.01,
                           schedule='constant', clip_norm=1.0),
    'encoder_decoder': OptimConfig(name='adam', learning_rate=1e-4, b1=0.9, b2=0.98, eps=1e-9,
                                   schedule='constant', clip_norm=None),
}


def model_config(spec: dict) -> ModelConfig:
  """The tx ModelConfig of a bench spec (the peer's architecture, see the module doc)."""
  family = spec['family']
  lengths = (spec['src_len'], spec['tgt_len']) if family == 'encoder_decoder' else (spec['ctx'],)
  layers = ({'num_encoder_layers': spec['enc_layers'], 'num_decoder_layers': spec['dec_layers']}
            if family == 'encoder_decoder' else {'num_layers': spec['layers']})
  cfg = ModelConfig(family=family, vocab_size=spec['vocab'], d_model=spec['d_model'],
                    num_heads=spec['heads'], d_ff=spec['d_ff'],
                    max_len=max(spec.get('max_len', 0), *lengths),
                    dtype=spec.get('dtype', 'float32'), scan_layers=spec.get('scan', False),
                    remat=spec.get('remat', 'none'),
                    attention_impl=spec.get('attention_impl', 'auto'),
                    matmul_impl=spec.get('matmul_impl', 'auto'),
                    norm_impl=spec.get('norm_impl', 'auto'), **layers,
                    **_ARCH[family])
  overrides = spec.get('model') or {}
  unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(ModelConfig)})
  if unknown:
    raise ValueError(f"bench spec 'model': {', '.join(unknown)} not ModelConfig fields; "
                     'name fields of tx.ModelConfig')
  return cfg.replace(**overrides) if overrides else cfg


def experiment(spec: dict) -> ExperimentConfig:
  family = spec['family']
  task = TaskConfig(label_smoothing=0.1) if family == 'encoder_decoder' else TaskConfig()
  # The tokenizer that resolves model.vocab_size to the case's vocabulary wherever the config
  # is resolved as `tx train` would (`tx tune`, `tx plan`): a subword vocabulary of that size
  # for seq2seq, one read off the model config (char) for the LMs; the default byte
  # tokenizer would make the tuned step's vocabulary 261, not the one measured here.
  data = ({'dataset': 'multi30k', 'seq_len': spec['src_len'], 'target_len': spec['tgt_len'],
           'tokenizer': 'bpe', 'vocab_size': spec['vocab']}
          if family == 'encoder_decoder' else {'seq_len': spec['ctx'], 'tokenizer': 'char'})
  if family == 'encoder':
    data['mlm_max_predictions'] = spec.get('mlm_max_predictions', 0)
  # No stability diagnostics: the peers compute none. `tx tune` of a case and the scripts in
  # benchmarks/ that compile a case as the tune does then time this same step.
  return ExperimentConfig(name='bench', model=model_config(spec), data=DataConfig(**data),
                          optim=_OPTIM[family].replace(
                              grad_accum_steps=spec.get('grad_accum_steps', 1)),
                          task=task,
                          train=TrainConfig(batch_size=spec['batch'],
                                            steps_per_call=spec.get('steps_per_call', 1),
                                            diagnostics=False))


def synthetic_batch(spec: dict, task_name: str, seed: int = 0) -> dict[str, np.ndarray]:
  """Random tokens in the task's batch layout (ids >= 3: no PAD/BOS/EOS), all weights 1
  except MLM, whose loss covers a random 15% of positions."""
  rng = np.random.default_rng(seed)
  tokens = lambda length: rng.integers(3, spec['vocab'], (spec['batch'], length), dtype=np.int32)
  if task_name == 'seq2seq':
    tgt = tokens(spec['tgt_len'] + 1)
    return {'src': tokens(spec['src_len']), 'tgt_inputs': tgt[:, :-1], 'targets': tgt[:, 1:],
            'weights': np.ones(tgt[:, 1:].shape, np.float32)}
  seq = tokens(spec['ctx'] + 1)
  if task_name == 'mlm':  # at most mlm_max_predictions a row, as tx's masking keeps
    draws = rng.random(seq[:, 1:].shape)
    selected = draws < 0.15
    if spec.get('mlm_max_predictions'):
      selected &= lowest_per_row(np.where(selected, draws, np.inf), spec['mlm_max_predictions'])
    return {'inputs': seq[:, 1:], 'targets': seq[:, 1:], 'weights': selected.astype(np.float32)}
  return {'inputs': seq[:, :-1], 'targets': seq[:, 1:],
          'weights': np.ones(seq[:, 1:].shape, np.float32)}


def _check_platform(spec: dict) -> None:
  """A measurement meant for the GPU must not quietly time the CPU."""
  if spec.get('platform') == 'gpu' and jax.default_backend() != 'gpu':
    raise RuntimeError(f'platform gpu: jax runs on {jax.default_backend()!r}; install a CUDA '
                       "build of jax (pip install 'jax[cuda13]')")


def _device_peak() -> dict[str, float]:
  """{'device_peak_bytes': the device allocator's high-water mark}, where it keeps one (GPU)."""
  stats = jax.devices()[0].memory_stats() or {}
  return {'device_peak_bytes': float(stats['peak_bytes_in_use'])} if (
      'peak_bytes_in_use' in stats) else {}


def _timed(fn, n: int) -> list[float]:
  times = []
  for _ in range(n):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return times


def _memory(compiled) -> dict[str, float]:
  """XLA's own estimate for the compiled step (bytes); empty where the backend has none."""
  try:
    m = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return {}
  if m is None:
    return {}
  return {'xla_argument_bytes': float(m.argument_size_in_bytes),
          'xla_temp_bytes': float(m.temp_size_in_bytes),
          'xla_output_bytes': float(m.output_size_in_bytes),
          'xla_alias_bytes': float(m.alias_size_in_bytes)}


def _train_step(cfg: ExperimentConfig):
  """(jitted step, abstract state, shardings, model, optimizer, task, mesh) as `tx train`
  builds them (one device here: the mesh is 1 x 1 x 1); cfg.train.steps_per_call steps
  per call (`tx.train.step.consecutive_steps`, batches [K, B, ...])."""
  task = make_task(cfg)
  mesh = make_mesh(cfg.mesh)
  rules = logical_rules(cfg.mesh)
  model = build_model(cfg.model)
  optimizer, _ = make_optimizer(cfg.optim, total_steps=1000, d_model=cfg.model.d_model,
                                model=cfg.model)
  step_fn = make_train_step(model, task, optimizer, accum_steps=cfg.optim.grad_accum_steps,
                            dropout=False, diagnostics=cfg.train.diagnostics)
  sharding = batch_sharding(mesh)
  if cfg.train.per_call > 1:
    step_fn, sharding = consecutive_steps(step_fn), stacked_sharding(sharding)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract, shardings = state_shardings(model, optimizer, cfg.model, mesh, rules)
    step = jit_train_step(step_fn, shardings, sharding)
  return step, abstract, shardings, model, optimizer, task, mesh


def lowered_train_step(cfg: ExperimentConfig, spec: dict):
  """The train step lowered for abstract inputs of the spec's batch (nothing allocated)."""
  step, abstract, _, _, _, task, mesh = _train_step(cfg)
  batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding(mesh))
           for k, v in synthetic_batch(spec, task.name).items()}
  with jax.set_mesh(mesh), nn.logical_axis_rules(logical_rules(cfg.mesh)):
    return step.lower(abstract, batch)


def compiled_train_step(spec: dict):
  """(compiled step, initial state, device batch, cfg, task, compile seconds); with
  spec['ablate_attention'], attention is `attention_stand_in` in the traced step."""
  cfg = experiment(spec)
  step, abstract, shardings, model, optimizer, task, mesh = _train_step(cfg)
  per_call = cfg.train.per_call
  with _attention(spec), jax.set_mesh(mesh), nn.logical_axis_rules(logical_rules(cfg.mesh)):
    batch = synthetic_batch(spec, task.name)
    if per_call > 1:  # the same batch for each step of a call
      batch = {k: np.stack([v] * per_call) for k, v in batch.items()}
    batch = jax.device_put(batch, stacked_sharding(batch_sharding(mesh)) if per_call > 1
                           else batch_sharding(mesh))
    start = time.perf_counter()
    compiled = step.lower(abstract, batch).compile(
        compiler_options=spec.get('xla_options') or None)
    compile_s = time.perf_counter() - start
    state = init_state(model, optimizer, cfg.model, shardings, seed=0)
  return compiled, state, batch, cfg, task, compile_s


def attention_stand_in(q_BLHD, k_BSKD, v_BSKD, **unused):
  """What `ablate_attention` trains in place of `ops.dot_product_attention`: each query
  returns the value at its own position (its kv head's), and q and k pass through a zero
  product so that their projections still run forward and backward.

  q [B, L, H, D], k and v [B, L, K, D] (self-attention, H % K == 0) -> [B, L, H, D]."""
  del unused
  group = q_BLHD.shape[2] // v_BSKD.shape[2]
  k, v = (jnp.repeat(x, group, axis=2) for x in (k_BSKD, v_BSKD))
  return (v + 0 * (q_BLHD + k)).astype(q_BLHD.dtype)


def _attention(spec: dict):
  """The context the step is traced in: tx's attention, or its stand-in (ablate_attention)."""
  if spec.get('ablate_attention'):
    return mock.patch.object(ops, 'dot_product_attention', attention_stand_in)
  return contextlib.nullcontext()


def train(spec: dict) -> dict:
  """Train-step throughput: compile time, then `warmup` untimed calls, more while the process
  still grows (`tx.timing.warm_until_steady`, as the peer warms up: warmup_calls says how
  many after the first), and `steps` timed calls.

  tokens/s counts the tokens the loss is taken on per step (decoder: batch x ctx; seq2seq:
  batch x tgt_len) except MLM, which counts every input token (batch x ctx) as the peer does.
  The process's CPU time and page faults per timed step come with it (tx.timing), and on
  the CPU `own_ceiling_flops`: a matmul in the step's dtype timed in this process right after
  the timed steps.
  """
  _check_platform(spec)
  compiled, state, batch, cfg, task, compile_s = compiled_train_step(spec)
  holder = {'state': state}

  def one():
    holder['state'], metrics = compiled(holder['state'], batch)
    return metrics

  per_call = cfg.train.per_call  # spec['steps'] calls of that many steps each
  first = _timed(one, 1)[0] / per_call
  warmup_calls = warm_until_steady(lambda: _timed(one, 1), least=max(spec['warmup'] - 1, 0))
  before = process_usage()
  times = [t / per_call for t in _timed(one, spec['steps'])]
  usage = usage_per_step(before, process_usage(), spec['steps'] * per_call)
  metrics = jax.tree.map(lambda x: x[-1] if per_call > 1 else x, jax.device_get(one()))
  # after the timed steps only: the matmul's buffers change the heap the steps reuse, and a
  # step whose scratch buffer is mapped per call then runs slower (benchmarks/NOTES.md, 79)
  own_ceiling = _own_ceiling(spec)
  median = statistics.median(times)
  tokens = spec['batch'] * (spec['tgt_len'] if task.name == 'seq2seq' else spec['ctx'])
  length = spec['src_len'] if task.name == 'seq2seq' else spec['ctx']
  params = nn.unbox(holder['state'].params)
  flops = flops_per_step(cfg.model, params, batch=spec['batch'], length=length,
                         target_length=spec.get('tgt_len'), head_positions=mlm_head_positions(cfg))
  return dict(compile_s=compile_s, first_step_s=first, warmup_calls=float(warmup_calls),
              step_time_s=median, step_time_min_s=min(times), tokens_per_s=tokens / median,
              flops_per_step=flops, model_flops_per_s=flops / median,
              params=float(sum(x.size for x in jax.tree_util.tree_leaves(params))),
              loss=float(metrics['loss_sum'] / max(float(metrics['weight_sum']), 1.0)),
              **own_ceiling, **_memory(compiled), **_device_peak(), **usage)


def _own_ceiling(spec: dict) -> dict:
  """On the CPU: {'own_ceiling_flops', 'own_ceiling_kernel', 'own_ceiling_product'}: the
  highest median FLOP/s of 5 timed products in the step's dtype, in this process, in the GEMM
  the step's dense products run on ('xla', or 'torch' under matmul_impl='torch', in float32
  under 'torch_float32': against XLA's a torch-GEMM step can read over 100 %), over the n^3
  product and, for a decoder or encoder, the step's own products (`cases.step_gemms`, named
  in 'own_ceiling_product'): under oneDNN's dots XLA's n^3 product ran slower than the
  step's own, and an MFU against it alone read 160 % (benchmarks/NOTES.md, attempt 101).
  In tx's process, so that an MFU against it does not depend on how the host's speed moved
  between the run's processes (by a third, minutes apart: NOTES attempt 52). Empty
  elsewhere."""
  if jax.default_backend() != 'cpu':
    return {}
  dtype, n = spec.get('dtype', 'float32'), spec.get('ceiling_n', 2048)
  products = [('n^3', n, n, n, False)]
  if spec.get('family') in ('decoder', 'encoder'):
    products += [product[:5] for product in cases.step_gemms(spec)]
  if spec.get('matmul_impl') in ('torch', 'torch_float32'):
    dtype = 'float32' if spec['matmul_impl'] == 'torch_float32' else dtype
    kernel, torch = 'torch', torch_module()
    rates = lambda m, k, n, t: torch_peers.gemm_mm_rates(torch, dtype, m, k, n, t, 5)
  else:
    kernel = 'xla'
    rates = lambda m, k, n, t: gemm_rates(dtype, m, k, n, rhs_transposed=t, reps=5)
  medians = {label: statistics.median(rates(*shape)) for label, *shape in products}
  best = max(medians, key=medians.get)
  return {'own_ceiling_flops': medians[best], 'own_ceiling_kernel': kernel,
          'own_ceiling_product': best}


def compile_time(spec: dict) -> dict:
  """Seconds to lower + compile the train step (no step is run; nothing is allocated)."""
  _check_platform(spec)
  cfg = experiment(spec)
  start = time.perf_counter()
  lowered = lowered_train_step(cfg, spec)
  lower_s = time.perf_counter() - start
  lowered.compile()
  total = time.perf_counter() - start
  return dict(compile_s=total, lower_s=lower_s, xla_compile_s=total - lower_s,
              hlo_chars=float(len(lowered.as_text())))


def decode(spec: dict) -> dict:
  """Greedy cached decoding of exactly `new` tokens after a `prompt_len` prompt (decoder) or
  from a `src_len` source (encoder-decoder); best and median of `repeats` timed calls."""
  _check_platform(spec)
  # scan / remat are training choices: decoding runs the plain stack.
  cfg = model_config(dict(spec, max_len=spec.get('prompt_len', 0) + spec['new'] + 1,
                          scan=False, remat='none'))
  model = build_model(cfg)
  rng = np.random.default_rng(spec['batch'])
  prompt_len = spec['src_len'] if cfg.family == 'encoder_decoder' else spec['prompt_len']
  prompt = jnp.asarray(rng.integers(3, spec['vocab'], (spec['batch'], prompt_len)), jnp.int32)
  inputs = (prompt, prompt[:, :1]) if cfg.family == 'encoder_decoder' else (prompt,)
  params = nn.unbox(jax.jit(model.init)(jax.random.key(0), *inputs)['params'])
  fn = generate_seq2seq if cfg.family == 'encoder_decoder' else generate_lm
  call = lambda: fn(cfg, params, prompt, jax.random.key(0), max_new=spec['new'], eos_id=-1)
  first = _timed(call, 1)[0]
  out = np.asarray(call())
  times = _timed(call, spec['repeats'])
  tokens = spec['batch'] * spec['new']
  return dict(first_call_s=first, time_s=min(times), new_tokens_per_s=tokens / min(times),
              new_tokens_per_s_median=tokens / statistics.median(times),
              generated_tokens=float(out.shape[1]))


def ceiling(spec: dict) -> dict:
  """Achieved FLOP/s of a jitted n^3 matmul per dtype (inputs in the dtype, float32
  accumulation): the median of `repeats` timed calls, and the best. With spec['gemms']
  (tx/bench/cases.py step_gemms), also each listed product's median FLOP/s per dtype under
  'gemms' and its fastest sample under 'gemms_best'; with spec['attention'] ([label,
  *step_attention]), each one's median seconds of a forward and backward (`attention_seconds`)
  per dtype under 'attention'. 'device' names the device measured (jax's device_kind)."""
  _check_platform(spec)
  out = {'device': str(jax.devices()[0].device_kind)}
  dtypes = spec.get('dtypes', ('float32', 'bfloat16'))
  for dtype in dtypes:
    rates = matmul_rates(dtype, spec.get('n', 2048), spec.get('repeats', 10))
    out[f'{dtype}_flops'] = statistics.median(rates)
    out[f'{dtype}_flops_best'] = max(rates)
  if spec.get('gemms'):
    samples = {label: {d: gemm_rates(d, m, k, n, rhs_transposed=t,
                                     reps=spec.get('gemm_repeats', 5)) for d in dtypes}
               for label, m, k, n, t, *_ in spec['gemms']}
    out['gemms'], out['gemms_best'] = median_and_best(samples)
  if spec.get('attention'):
    out['attention'] = {label: {d: statistics.median(attention_seconds(
        d, *shape[:5], reps=spec.get('gemm_repeats', 5))) for d in dtypes}
                        for label, *shape in spec['attention']}
  return out


def attention_seconds(dtype: str, batch: int, length: int, heads: int, head_dim: int,
                      causal: bool, reps: int = 5) -> list[float]:
  """Seconds of each of `reps` timed samples of one self-attention's forward and backward
  (gradients of q, k, v [batch, length, heads, head_dim] in `dtype`) as tx's layers run it:
  the XLA path, the causal mask and the query blocks a causal layer picks by length, or the
  padding mask an encoder builds (no padding here). A sample runs `calls_per_sample` calls."""
  rng = np.random.default_rng(0)
  q, k, v, cot = (jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), dtype)
                  for _ in range(4))
  valid = jnp.ones((batch, length), bool)  # an argument, as the model's tokens: not folded
  blocks = causal_block_count(0, length) if causal else 1

  def loss(q, k, v, valid):
    mask = ops.causal_mask(length) if causal else ops.key_padding_mask(valid)
    out = ops.dot_product_attention(q, k, v, mask=mask, implementation='xla',
                                    causal_blocks=blocks)
    return jnp.sum(out.astype(jnp.float32) * cot.astype(jnp.float32))

  f = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
  return sample_seconds(lambda: f(q, k, v, valid), jax.block_until_ready, reps)
