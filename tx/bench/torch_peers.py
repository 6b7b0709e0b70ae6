"""PyTorch peers for `tx bench`: the same models, step and decoding measured in torch.

Each public function takes one `spec` dict (keys: layers, heads, d_model, d_ff, vocab, ctx,
batch, steps, warmup, threads, repeats, prompt_len, new, enc_layers, dec_layers, src_len,
tgt_len, attn_implementation; unused ones are ignored, a missing one is a KeyError) and
returns a flat dict of numbers. The caller runs each in a fresh process and records its
peak RSS. torch / transformers are imported inside the functions: tx imports without them.
All models have float32 weights, random, `torch.set_num_threads(spec['threads'])`; with
spec['dtype'] == 'bfloat16' the training peers run forward and loss under
`torch.autocast(device, dtype=torch.bfloat16)` (PyTorch's mixed precision: matmuls in
bf16, float32 weights and optimizer), the counterpart of tx's `model.dtype=bfloat16`.
spec['platform'] == 'gpu' runs everything on the first CUDA device, with float32 products
in TF32 (`torch.set_float32_matmul_precision('high')`, what XLA does by default on a GPU),
and adds device_peak_bytes (torch.cuda.max_memory_allocated) to a training result.

spec['torch_compile'] (the training peers): forward and loss run through `torch.compile`
(compiled in the first warmup step, which `first_step_s` then includes): the peer at its
fastest rather than as most code runs it; decoding stays eager.

Training peers time one optimizer step = zero_grad, forward + loss, backward,
clip_grad_norm_(1.0) (GPT-2 and BERT) and optimizer.step(), on one fixed random batch:
`warmup` untimed steps (`first_step_s` is the first of them, lazy init included), more
while the process's resident memory still grows (`tx.timing.warm_until_steady`, as tx's
side), then `steps` steps timed one by one (perf_counter). They return step_time_s
(median), step_time_min_s, tokens_per_s (tokens per step / median step), first_step_s,
warmup_calls (the untimed steps after the first), params (unique tensors, so a tied
embedding is counted once), loss (last step, checked finite), and user_s / system_s /
minor_faults _per_step over the timed steps (tx.timing).

  gpt2_train     transformers GPT2LMHeadModel (gelu_new, tied embeddings, dropout 0), AdamW
                 (lr 1e-3, wd 0.1, betas 0.9/0.99; each family's: OPTIMIZERS), labels =
                 input_ids (shifted inside the model). tokens_per_s counts batch*ctx.
                 Attention: spec['attn_implementation'] ('eager' | 'sdpa'), default 'sdpa'
                 (transformers 5's CPU default; see below); `sdpa` = 1.0 / 0.0 reports the
                 one used (also for bert_train).
                 spec['ablate_attention'] (gpt2_train, bert_train): sdpa replaced by out = v,
                 the stand-in tx_side.train uses: the step time attention costs in torch.
  bert_train     transformers BertForMaskedLM (dropout 0), AdamW (lr 1e-4, wd 0.01); exactly
                 round(15%) of positions carry labels, the rest -100. tokens_per_s counts ALL
                 input tokens (batch*ctx), not only the masked ones.
  seq2seq_train  torch.nn.Transformer (post-LN, relu, dropout 0, batch_first) + separate
                 source / target embeddings (init std d^-1/2) scaled by sqrt(d_model),
                 sinusoidal positions, output projection tied to the target embedding; causal
                 target mask, no padding masks; cross-entropy with label smoothing 0.1; Adam
                 (lr 1e-4, betas 0.9/0.98, eps 1e-9), no clipping. tokens_per_s counts
                 target tokens (batch*tgt_len).
Decoding peers (torch.inference_mode, eval) make one untimed warmup call, then `repeats`
timed calls: new_tokens_per_s = batch*new / best time, new_tokens_per_s_median, time_s (best).
  gpt2_generate  model.generate, greedy, KV cache, prompt [batch, prompt_len], min = max =
                 `new` new tokens and no EOS, so every row gets exactly `new`; the output is
                 checked and generated_tokens (per row) returned. n_positions =
                 max(ctx, prompt_len + new).
  seq2seq_decode greedy decoding with nn.Transformer: encoder once, then the decoder re-run
                 over the whole growing prefix for each new token. nn.Transformer has no
                 KV cache, so this O(new^2) loop IS the honest nn.Transformer peer.

Reference numbers measured here (torch 2.13 CPU, transformers 5.23, 2 threads, a SHARED
2-core AMD EPYC (AVX2) box, so noisy: under load the same runs were 3-10x slower; numbers
from a quiet machine in brackets):
  gpt2_train 6L/6H/d384/ff1536/vocab65/ctx256/batch64 (10.8M params): 21.2 s/step, 771 tok/s,
    peak RSS 6.1 GB [17.2 s, 955 tok/s, 9.6 GB]; eager attention: 21.1 s, 775 tok/s, 6.6 GB
  gpt2_train 4L/4H/d128/ff512/ctx64/batch12: 0.097 s/step, 7,890 tok/s [12,400]
  gpt2_generate 6L model, n_positions 512, prompt 16, new 256: batch 1 109 tok/s [112],
    batch 8 358 tok/s [568] (eager: 107 and 343, interleaved / quiet windows)
sdpa vs eager on CPU: equal speed within the noise at these sizes (attention is ~10% of the
FLOPs at ctx 256), sdpa ~0.5 GB less peak RSS at batch 64, so sdpa (the default) is the peer.

Manual run: python -m tx.bench.torch_peers gpt2_train '{"layers": 2, ...}' prints one JSON
line, with this process's peak_rss_bytes added.
"""

import contextlib
import json
import math
import resource
import statistics
import sys
import time


def _torch(spec):
  import torch  # pylint: disable=g-import-not-at-top  (optional (the interop extra); heavy)
  torch.set_num_threads(spec['threads'])
  torch.manual_seed(0)
  if _device(spec) == 'cuda':
    if not torch.cuda.is_available():
      raise RuntimeError('platform gpu: torch sees no CUDA device; install a CUDA build of torch')
    torch.set_float32_matmul_precision('high')  # TF32 products, as XLA's default on a GPU
  if spec.get('ablate_attention'):
    torch.nn.functional.scaled_dot_product_attention = _attention_stand_in
  return torch


def _device(spec) -> str:
  """torch's device of a spec: 'cuda' for platform 'gpu', else 'cpu'."""
  return 'cuda' if spec.get('platform') == 'gpu' else 'cpu'


def _attention_stand_in(q, k, v, *args, **kwargs):
  """`ablate_attention`'s scaled_dot_product_attention, tx_side's stand-in: out = v
  [B, H, L, D], with q and k through a zero product so their projections still train."""
  del args, kwargs
  return v + 0 * (q + k)


def _train(spec, model, step, tokens_per_step):
  """The shared training protocol: warmup steps (more while the process still grows, as tx's
  side warms up), then `steps` individually timed ones."""
  # pylint: disable-next=g-import-not-at-top
  from tx.timing import process_usage, usage_per_step, warm_until_steady
  times, losses = [], [float('nan')]

  def timed_step():
    t0 = time.perf_counter()
    losses.append(step())
    times.append(time.perf_counter() - t0)

  timed_step()  # the first step: lazy initialisation (first_step_s)
  warmup_calls = warm_until_steady(timed_step, least=max(spec['warmup'] - 1, 0))
  before = process_usage()
  for _ in range(spec['steps']):
    timed_step()
  usage = usage_per_step(before, process_usage(), spec['steps'])
  loss = losses[-1]
  if not math.isfinite(loss):
    raise FloatingPointError(f'non-finite loss {loss}')
  timed = times[-spec['steps']:]
  median = statistics.median(timed)
  out = {'step_time_s': median, 'step_time_min_s': min(timed),
         'tokens_per_s': tokens_per_step / median, 'first_step_s': times[0],
         'warmup_calls': float(warmup_calls),
         'params': float(sum(p.numel() for p in model.parameters())), 'loss': loss, **usage}
  if _device(spec) == 'cuda':
    import torch  # pylint: disable=g-import-not-at-top  (optional; imported by _torch already)
    out['device_peak_bytes'] = float(torch.cuda.max_memory_allocated())
  return out


def _precision(torch, spec):
  """The context the forward pass runs in: bf16 autocast for spec['dtype'] == 'bfloat16'."""
  dtype = spec.get('dtype', 'float32')
  if dtype == 'bfloat16':
    return torch.autocast(_device(spec), dtype=torch.bfloat16)
  if dtype != 'float32':
    raise ValueError(f"the peers run float32 or bfloat16, not {dtype!r}")
  return contextlib.nullcontext()


# Each family's optimizer and gradient clipping, the same as tx_side._OPTIM gives tx's side
# (tests/bench keep the two equal): torch.optim class, its arguments, clip_grad_norm_ max norm.
OPTIMIZERS = {
    'decoder': ('AdamW', dict(lr=1e-3, weight_decay=0.1, betas=(0.9, 0.99), eps=1e-8), 1.0),
    'encoder': ('AdamW', dict(lr=1e-4, weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8), 1.0),
    'encoder_decoder': ('Adam', dict(lr=1e-4, betas=(0.9, 0.98), eps=1e-9), None),
}


def _optimizer_step(torch, spec, model, loss_fn, family):
  """One training step of `model` on loss_fn() with the family's optimizer (OPTIMIZERS)."""
  name, kwargs, clip = OPTIMIZERS[family]
  opt = getattr(torch.optim, name)(model.parameters(), **kwargs)
  if spec.get('torch_compile'):
    loss_fn = torch.compile(loss_fn)  # forward + loss; backward through AOTAutograd's graph

  def step():
    opt.zero_grad(set_to_none=True)
    with _precision(torch, spec):
      loss = loss_fn()
    loss.backward()
    if clip is not None:
      torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    return loss.item()  # waits for the device: the step's time is its own
  return step


def _decode(spec, run):
  """One untimed call, then `repeats` timed ones, each until the device is done; run()
  returns the new tokens per row."""
  wait = lambda: None
  if _device(spec) == 'cuda':
    import torch  # pylint: disable=g-import-not-at-top  (optional; imported by _torch already)
    wait = torch.cuda.synchronize
  generated = run()
  times = []
  for _ in range(spec['repeats']):
    t0 = time.perf_counter()
    run()
    wait()
    times.append(time.perf_counter() - t0)
  n = spec['batch'] * spec['new']
  return {'new_tokens_per_s': n / min(times),
          'new_tokens_per_s_median': n / statistics.median(times),
          'time_s': min(times), 'time_median_s': statistics.median(times),
          'generated_tokens': float(generated)}


def _gpt2(spec, ctx):
  import transformers  # pylint: disable=g-import-not-at-top  (optional (the interop extra); heavy)
  config = transformers.GPT2Config(
      n_layer=spec['layers'], n_head=spec['heads'], n_embd=spec['d_model'],
      n_inner=spec['d_ff'], vocab_size=spec['vocab'], n_positions=ctx,
      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function='gelu_new',
      tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
      attn_implementation=spec.get('attn_implementation', 'sdpa'))
  model = transformers.GPT2LMHeadModel(config)
  model.loss_type = 'ForCausalLM'  # the class name does not say so; silences a warning
  return model


def _attn(model, spec):
  used = model.config._attn_implementation  # pylint: disable=protected-access
  if spec.get('ablate_attention') and used != 'sdpa':
    raise ValueError(f'ablate_attention replaces the sdpa attention; this model runs {used!r}')
  return {'sdpa': float(used == 'sdpa')}


def gpt2_train(spec):
  torch = _torch(spec)
  model = _gpt2(spec, spec['ctx']).train().to(_device(spec))
  x = torch.randint(0, spec['vocab'], (spec['batch'], spec['ctx']), device=_device(spec))
  step = _optimizer_step(torch, spec, model, lambda: model(input_ids=x, labels=x).loss,
                         'decoder')
  attn = _attn(model, spec)  # before the steps: an ablation the model would ignore fails here
  return {**_train(spec, model, step, x.numel()), **attn}


def gpt2_generate(spec):
  torch = _torch(spec)
  # n_positions must hold prompt + new (suite specs share a training ctx that may be shorter)
  model = _gpt2(spec, max(spec.get('ctx', 0), spec['prompt_len'] + spec['new'])).eval()
  model = model.to(_device(spec))
  prompt = torch.randint(0, spec['vocab'], (spec['batch'], spec['prompt_len']),
                         device=_device(spec))
  new = spec['new']

  def run():
    with torch.inference_mode():
      out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, use_cache=True,
                           pad_token_id=0, eos_token_id=None)
    if out.shape != (spec['batch'], spec['prompt_len'] + new) or not torch.equal(
        out[:, :spec['prompt_len']], prompt):
      raise AssertionError(f'generate returned {tuple(out.shape)}, wanted {new} new tokens/row')
    return out.shape[1] - spec['prompt_len']
  return {**_decode(spec, run), **_attn(model, spec)}


def bert_train(spec):
  torch = _torch(spec)
  import transformers  # pylint: disable=g-import-not-at-top  (optional (the interop extra); heavy)
  config = transformers.BertConfig(
      num_hidden_layers=spec['layers'], num_attention_heads=spec['heads'],
      hidden_size=spec['d_model'], intermediate_size=spec['d_ff'], vocab_size=spec['vocab'],
      max_position_embeddings=spec['ctx'], hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0, pad_token_id=0,
      attn_implementation=spec.get('attn_implementation', 'sdpa'))
  model = transformers.BertForMaskedLM(config).train().to(_device(spec))
  x = torch.randint(0, spec['vocab'], (spec['batch'], spec['ctx']))
  labels = torch.full_like(x, -100).view(-1)
  picked = torch.randperm(x.numel())[:max(1, round(0.15 * x.numel()))]
  labels[picked] = x.view(-1)[picked]
  x, labels = x.to(_device(spec)), labels.view_as(x).to(_device(spec))
  step = _optimizer_step(torch, spec, model, lambda: model(input_ids=x, labels=labels).loss,
                         'encoder')
  attn = _attn(model, spec)
  return {**_train(spec, model, step, x.numel()), **attn}


def _seq2seq(torch, spec, max_len):
  nn = torch.nn

  class Seq2Seq(nn.Module):
    """nn.Transformer + embeddings, sinusoidal positions, head tied to the target embedding."""

    def __init__(self):
      super().__init__()
      d = spec['d_model']
      self.scale = math.sqrt(d)
      self.src_emb = nn.Embedding(spec['vocab'], d)
      self.tgt_emb = nn.Embedding(spec['vocab'], d)
      for emb in (self.src_emb, self.tgt_emb):  # std d^-1/2: O(1) after the sqrt(d) scale
        nn.init.normal_(emb.weight, std=d ** -0.5)
      self.core = nn.Transformer(
          d, spec['heads'], spec['enc_layers'], spec['dec_layers'],
          dim_feedforward=spec['d_ff'], dropout=0.0, activation='relu', batch_first=True,
          norm_first=False)
      pos = torch.arange(max_len, dtype=torch.float32)[:, None]
      inv = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
      pe = torch.zeros(max_len, d)
      pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * inv), torch.cos(pos * inv)
      self.register_buffer('pe', pe)

    def encode(self, src):
      return self.core.encoder(self.src_emb(src) * self.scale + self.pe[:src.shape[1]])

    def decode(self, tgt, memory):
      n = tgt.shape[1]
      mask = nn.Transformer.generate_square_subsequent_mask(n, device=tgt.device)
      h = self.core.decoder(self.tgt_emb(tgt) * self.scale + self.pe[:n], memory,
                            tgt_mask=mask, tgt_is_causal=True)
      return h @ self.tgt_emb.weight.T

  return Seq2Seq()


def seq2seq_train(spec):
  torch = _torch(spec)
  model = _seq2seq(torch, spec, max(spec['src_len'], spec['tgt_len'])).train()
  model = model.to(_device(spec))
  b, v, device = spec['batch'], spec['vocab'], _device(spec)
  src = torch.randint(0, v, (b, spec['src_len']), device=device)
  # decoder input tgt[:, :-1], labels tgt[:, 1:]
  tgt = torch.randint(0, v, (b, spec['tgt_len'] + 1), device=device)

  def loss_fn():
    logits = model.decode(tgt[:, :-1], model.encode(src))
    return torch.nn.functional.cross_entropy(logits.reshape(-1, v), tgt[:, 1:].reshape(-1),
                                             label_smoothing=0.1)
  step = _optimizer_step(torch, spec, model, loss_fn, 'encoder_decoder')
  return _train(spec, model, step, b * spec['tgt_len'])


def seq2seq_decode(spec):
  """Greedy decoding WITHOUT a KV cache (nn.Transformer has none): the honest peer."""
  torch = _torch(spec)
  new = spec['new']
  device = _device(spec)
  model = _seq2seq(torch, spec, max(spec['src_len'], new + 1)).eval().to(device)
  src = torch.randint(0, spec['vocab'], (spec['batch'], spec['src_len']), device=device)

  def run():
    with torch.inference_mode():
      memory = model.encode(src)
      out = torch.zeros(spec['batch'], 1, dtype=torch.long, device=device)  # start token 0
      for _ in range(new):
        nxt = model.decode(out, memory)[:, -1].argmax(-1, keepdim=True)
        out = torch.cat([out, nxt], dim=1)
    return out.shape[1] - 1
  return _decode(spec, run)


def ceiling(spec):
  """torch's n^3 matmul FLOP/s per dtype (float32, bfloat16): the median of `repeats` timed
  calls after one untimed one, and the best; the peer side of the GEMM-ceiling arithmetic. With
  spec['gemms'], each listed product's median too (and its best, 'gemms_best'), and with
  spec['attention'] each listed self-attention's forward and backward seconds (as
  tx_side.ceiling). spec['dtypes'] limits the dtypes (on a CPU without bf16 arithmetic torch
  emulates bf16: minutes a product)."""
  from tx.timing import median_and_best  # pylint: disable=g-import-not-at-top
  torch = _torch(spec)
  n, out = spec.get('n', 2048), {}
  dtypes = tuple((name, getattr(torch, name)) for name in
                 spec.get('dtypes', ('float32', 'bfloat16')))
  for name, _ in dtypes:
    rates = square_mm_rates(torch, name, n, spec.get('repeats', 10), _device(spec))
    out[f'{name}_flops'] = statistics.median(rates)
    out[f'{name}_flops_best'] = max(rates)
  if spec.get('gemms'):
    samples = {label: {name: gemm_mm_rates(torch, name, m, k, n_, transposed,
                                           spec.get('gemm_repeats', 5)) for name, _ in dtypes}
               for label, m, k, n_, transposed, *_ in spec['gemms']}
    out['gemms'], out['gemms_best'] = median_and_best(samples)
  if spec.get('attention'):
    out['attention'] = {label: {name: statistics.median(_sdpa_seconds(
        torch, dtype, *shape[:5], spec.get('gemm_repeats', 5))) for name, dtype in dtypes}
                        for label, *shape in spec['attention']}
  return out


def _sdpa_seconds(torch, dtype, batch, length, heads, head_dim, causal, reps):
  """Seconds of `reps` timed samples of scaled_dot_product_attention's forward and backward
  (q, k, v [batch, heads, length, head_dim] in `dtype`; is_causal for a decoder, no mask for
  an encoder, as the peers call it), each sample as many calls as tx's side runs."""
  from tx.timing import sample_seconds  # pylint: disable=g-import-not-at-top
  q, k, v = (torch.randn(batch, heads, length, head_dim).to(dtype).requires_grad_()
             for _ in range(3))
  cot = torch.randn(batch, heads, length, head_dim).to(dtype)

  def one():
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out.backward(cot)

  return sample_seconds(one, lambda _: None, reps)


def square_mm_rates(torch, dtype: str, n: int, reps: int, device: str = 'cpu') -> list[float]:
  """FLOP/s of `reps` timed samples of torch.mm of two random [n, n] matrices in `dtype`
  ('float32', 'bfloat16') on `device`, after one untimed call."""
  a = torch.randn(n, n, device=device).to(getattr(torch, dtype))
  return _mm_rates(torch, a, a, reps)


def gemm_mm_rates(torch, dtype: str, m: int, k: int, n: int, transposed: bool,
                  reps: int) -> list[float]:
  """FLOP/s of `reps` timed samples of torch.mm of a random [m, k] and [k, n] in `dtype`
  ('float32', 'bfloat16'; the right operand a transposed [n, k] when `transposed`)."""
  dtype = getattr(torch, dtype)
  b = torch.randn(n, k).to(dtype).t() if transposed else torch.randn(k, n).to(dtype)
  return _mm_rates(torch, torch.randn(m, k).to(dtype), b, reps)


def _mm_rates(torch, a, b, reps):
  """FLOP/s of `reps` timed samples of torch.mm(a, b) after one untimed call, each sample
  as many calls back to back as tx's side runs (tx.timing)."""
  from tx.timing import sample_seconds  # pylint: disable=g-import-not-at-top
  wait = (lambda _: torch.cuda.synchronize()) if a.is_cuda else (lambda _: None)
  flops = 2 * a.shape[0] * a.shape[1] * b.shape[1]
  return [flops / s for s in sample_seconds(lambda: torch.mm(a, b), wait, reps)]


PEERS = {f.__name__: f for f in (gpt2_train, gpt2_generate, bert_train, seq2seq_train,
                                 seq2seq_decode, ceiling)}


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) != 2 or argv[0] not in PEERS:
    raise SystemExit(f'usage: python -m tx.bench.torch_peers {{{"|".join(PEERS)}}} SPEC_JSON')
  result = PEERS[argv[0]](json.loads(argv[1]))
  result['peak_rss_bytes'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  print(json.dumps(result), flush=True)


if __name__ == '__main__':
  main()
