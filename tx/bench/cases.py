"""The cases of `tx bench`: one model shape per case, measured by tx and by its PyTorch peer.

A case is a spec (tx/bench/tx_side.py lists the keys) and the kinds measured on it:
'train' (tx_side.train vs the peer's train step), 'decode' (greedy decoding per batch size),
'compile' (compile seconds of the train step). `SUITE` is the full run; `QUICK` the same
structure at toy sizes (seconds; what the tests run); `GPU` the run of `--platform gpu`.
A spec's `float32_case` names the float32 case a bf16 case is compared with (the report's
'bf16 / float32 tokens/s').
"""

from __future__ import annotations

import dataclasses

PEER_TRAIN = {'decoder': 'gpt2_train', 'encoder': 'bert_train',
              'encoder_decoder': 'seq2seq_train'}
PEER_DECODE = {'decoder': 'gpt2_generate', 'encoder_decoder': 'seq2seq_decode'}


@dataclasses.dataclass(frozen=True)
class Case:
  """One model shape and what to measure on it."""
  name: str
  spec: dict
  kinds: tuple[str, ...] = ('train',)
  decode_batches: tuple[int, ...] = ()
  peer: bool = True  # also measure the PyTorch peer
  note: str = ''


def _gpt(layers, heads, d, ctx, batch, **kw):
  return {**dict(family='decoder', layers=layers, heads=heads, d_model=d, d_ff=4 * d, vocab=65,
                 ctx=ctx, batch=batch), **kw}


def _bert(layers, heads, d, ctx, batch, **kw):
  return dict(family='encoder', layers=layers, heads=heads, d_model=d, d_ff=4 * d, vocab=512,
              ctx=ctx, batch=batch, **kw)


def _s2s(layers, heads, d, length, batch, vocab, **kw):
  return dict(family='encoder_decoder', enc_layers=layers, dec_layers=layers, heads=heads,
              d_model=d, d_ff=4 * d, vocab=vocab, src_len=length, tgt_len=length, batch=batch,
              **kw)


_DECODE = dict(prompt_len=16, new=256, repeats=3)
# Scanned layers + saving only the projections' outputs (attention and elementwise work is
# recomputed): on XLA:CPU the unscanned stack keeps every activation whatever the remat
# policy, so this is what halves the step's memory, at no cost in speed (benchmarks/NOTES.md).
_TUNED = dict(scan=True, remat='dots_no_batch')
_S2S_DECODE = dict(new=32, repeats=3)

SUITE = (
    Case('gpt_baby', _gpt(4, 4, 128, 64, 12, steps=20, warmup=3),
         note="nanoGPT's CPU baby GPT"),
    # 5 timed steps: with 3, one slow step (machine noise) can move the median
    # (benchmarks/NOTES.md).
    Case('gpt_6l', _gpt(6, 6, 384, 256, 64, steps=5, warmup=1, **_TUNED, **_DECODE),
         kinds=('train', 'decode'), decode_batches=(1, 8),
         note="nanoGPT's GPU shakespeare_char shape; scanned layers, remat dots_no_batch"),
    # the decoder's scratch buffer (2.2 GB) faulted in once per 2 steps (NOTES attempt 51)
    Case('gpt_6l_torch_attention_2_per_call',
         _gpt(6, 6, 384, 256, 64, steps=3, warmup=1, steps_per_call=2, attention_impl='torch',
              **_TUNED),
         note='gpt_6l with model.attention_impl=torch and train.steps_per_call=2'),
    Case('gpt_6l_plain', _gpt(6, 6, 384, 256, 64, steps=2, warmup=1), peer=False,
         note='the same model unscanned, no remat (tx defaults)'),
    # Unscanned, no remat: in bf16 the scanned dots_no_batch stack is ~20 % slower on
    # XLA:CPU (benchmarks/NOTES.md attempt 30), at 5.1 instead of 1.7 GB.
    Case('gpt_6l_bf16', _gpt(6, 6, 384, 256, 64, steps=5, warmup=1, dtype='bfloat16',
                             float32_case='gpt_6l'),
         note='bf16 compute, fp32 params, unscanned without remat (the peer: torch.autocast '
              'bf16); MFU against the bf16 ceiling'),
    Case('bert_mini', _bert(4, 4, 128, 128, 16, steps=10, warmup=2)),
    # tx's defaults (unscanned, no remat), like the peer, which keeps every activation: at
    # batch 16 the encoder's memory is small, and scan + dots_no_batch cost it ~9 % of its
    # speed (benchmarks/NOTES.md, attempt 37).
    Case('bert_6l', _bert(6, 6, 384, 256, 16, steps=5, warmup=1),
         note="tx's defaults: unscanned, no remat"),
    # XLA:CPU runs attention's batched products on one core (benchmarks/NOTES.md, 39-43);
    # torch's fused kernel, called from the step, is what model.attention_impl=torch buys.
    Case('bert_6l_torch_attention', _bert(6, 6, 384, 256, 16, steps=5, warmup=1,
                                          attention_impl='torch'),
         note="bert_6l with model.attention_impl=torch: PyTorch's CPU flash kernel inside "
              "tx's step (a host callback)"),
    # train.steps_per_call=4: the step's scratch buffer mapped (and page-faulted in) once
    # per 4 steps instead of every step (benchmarks/NOTES.md, attempt 51)
    Case('bert_6l_4_per_call', _bert(6, 6, 384, 256, 16, steps=5, warmup=1, steps_per_call=4),
         note='bert_6l with train.steps_per_call=4 (a timed step = a call / 4)'),
    Case('bert_6l_torch_attention_4_per_call',
         _bert(6, 6, 384, 256, 16, steps=5, warmup=1, steps_per_call=4, attention_impl='torch'),
         note='bert_6l_torch_attention with train.steps_per_call=4'),
    # Both of torch's kernels: the Intel host's float32 GEMMs and attention both trail
    # torch's (benchmarks/NOTES.md, attempts 48 and 52)
    Case('bert_6l_torch_kernels_4_per_call',
         _bert(6, 6, 384, 256, 16, steps=5, warmup=1, steps_per_call=4, attention_impl='torch',
               matmul_impl='torch'),
         note="bert_6l with both of torch's kernels (attention and GEMM) and "
              "train.steps_per_call=4"),
    # Where torch's GEMMs lead XLA's (the Intel AMX host, most in bf16: NOTES attempts 48-49)
    Case('bert_6l_torch_matmul', _bert(6, 6, 384, 256, 16, steps=5, warmup=1,
                                       matmul_impl='torch'),
         note="bert_6l with model.matmul_impl=torch: the dense products in PyTorch's CPU GEMM"),
    Case('gpt_6l_bf16_torch_matmul', _gpt(6, 6, 384, 256, 64, steps=5, warmup=1,
                                          dtype='bfloat16', float32_case='gpt_6l',
                                          matmul_impl='torch'),
         note="gpt_6l_bf16 with model.matmul_impl=torch: the dense products in PyTorch's "
              "CPU GEMM"),
    # Where float32 kernels outrun bf16 ones (avx512_bf16 without AMX: NOTES attempt 99)
    Case('gpt_6l_bf16_torch_float32',
         _gpt(6, 6, 384, 256, 64, steps=5, warmup=1, dtype='bfloat16', float32_case='gpt_6l',
              steps_per_call=4, attention_impl='torch_float32', matmul_impl='torch_float32'),
         note="gpt_6l_bf16 with torch's attention and GEMM in float32 on widened operands "
              "(model.*_impl=torch_float32) and train.steps_per_call=4"),
    # The larger seq2seq case runs scanned + dots_no_batch like gpt_6l, for the same reason
    # (less memory, no slower; benchmarks/NOTES.md); the small ones are overhead-bound.
    Case('seq2seq_small', _s2s(2, 4, 128, 32, 32, 1000, steps=10, warmup=2, **_S2S_DECODE),
         kinds=('train', 'decode'), decode_batches=(8,)),
    Case('seq2seq_base', _s2s(3, 8, 256, 32, 64, 8000, steps=5, warmup=1, **_S2S_DECODE,
                              **_TUNED),
         kinds=('train', 'decode'), decode_batches=(1, 32),
         note='the Multi30k model shape (3+3, d 256, joint 8k vocabulary); scanned, remat '
              'dots_no_batch'),
    Case('compile_2l', _gpt(2, 6, 384, 256, 8, scan=True), kinds=('compile',), peer=False),
    Case('compile_24l', _gpt(24, 6, 384, 256, 8, scan=True), kinds=('compile',), peer=False),
    Case('compile_24l_unscanned', _gpt(24, 6, 384, 256, 8), kinds=('compile',), peer=False,
         note='for contrast: 24 layers unrolled'),
)

# `tx bench --platform gpu`. A step takes milliseconds, so more of them are timed. Each
# shape runs in bf16 twice: tx's default attention ('auto': cuDNN's fused kernel on a GPU)
# and XLA's (attention_impl='xla'), so the report shows what cuDNN is worth inside the step.
# The 6-layer shapes are the CPU suite's (tx's defaults: unscanned, no remat); GPT-2 small
# (124M, ctx 1024) is a size that keeps the GPU busy. float32 products run in TF32 on both
# sides (XLA's default on a GPU; the peer sets torch's matmul precision to match). An XLA
# attention case's `attention_case` names its cuDNN twin (the report's 'tokens/s / cuDNN case').
_GPU_STEPS = dict(steps=30, warmup=5)
_GPT2_SMALL = (12, 12, 768, 1024, 16)
GPU = (
    Case('gpt_6l', _gpt(6, 6, 384, 256, 64, **_GPU_STEPS, **_DECODE),
         kinds=('train', 'decode'), decode_batches=(1, 8), note='float32 (TF32 products)'),
    Case('gpt_6l_bf16', _gpt(6, 6, 384, 256, 64, dtype='bfloat16', float32_case='gpt_6l',
                             **_GPU_STEPS), note='attention: cuDNN'),
    Case('gpt_6l_bf16_xla', _gpt(6, 6, 384, 256, 64, dtype='bfloat16', float32_case='gpt_6l',
                                 attention_impl='xla', attention_case='gpt_6l_bf16',
                                 **_GPU_STEPS), peer=False,
         note="attention: XLA's"),
    Case('bert_6l_bf16', _bert(6, 6, 384, 256, 64, dtype='bfloat16', **_GPU_STEPS),
         note='attention: cuDNN'),
    Case('gpt2_small_bf16', _gpt(*_GPT2_SMALL, vocab=50304, dtype='bfloat16', steps=20,
                                 warmup=3), note='GPT-2 small; attention: cuDNN'),
    Case('gpt2_small_bf16_xla', _gpt(*_GPT2_SMALL, vocab=50304, dtype='bfloat16',
                                     attention_impl='xla', attention_case='gpt2_small_bf16',
                                     steps=20, warmup=3), peer=False,
         note="GPT-2 small; attention: XLA's"),
)


def step_gemms(spec: dict) -> tuple:
  """The dense products of a decoder or encoder case's training step, to time alone in both
  frameworks next to the n^3 ceiling: (label, m, k, n, right operand transposed, times per
  step).

  M = batch x context rows. The forward products, the input gradients (g · wᵀ: the right
  operand contracted on its last dimension) and the weight gradients (xᵀ · g, as tx
  computes them: on a transposed copy); the ffn weight-gradient rate stands for both ffn
  layers', the attention projection's forward rate for q, k, v and out's forward, input-
  and weight-gradient products (4 x 3). The tied head (and BERT's d x d head transform) is
  left out (0.3-3 % of the FLOPs), and so are attention's own products: the report bounds
  them by the ceiling."""
  m, d, f, layers = spec['batch'] * spec['ctx'], spec['d_model'], spec['d_ff'], spec['layers']
  return (('ffn in, forward', m, d, f, False, layers),
          ('ffn out, forward', m, f, d, False, layers),
          ('ffn in, input gradient', m, f, d, True, layers),
          ('ffn out, input gradient', m, d, f, True, layers),
          ('ffn, weight gradient', d, m, f, False, 2 * layers),
          ('attention projection', m, d, d, False, 12 * layers))


def step_attention(spec: dict) -> tuple:
  """A decoder or encoder case's self-attention, to time alone (forward and backward) in both
  frameworks: (batch, length, heads, head_dim, causal, layers)."""
  return (spec['batch'], spec['ctx'], spec['heads'], spec['d_model'] // spec['heads'],
          spec['family'] == 'decoder', spec['layers'])


def _timed_alone(cases, shapes) -> dict:
  """{float32 case name: shapes(spec)} for the decoder and encoder cases trained against a
  peer (a bf16 case under the name of its float32 case: the same shapes). A case with
  torch's kernels or several steps per call has the shapes of its plain case, timed there."""
  return {c.spec.get('float32_case') or c.name: shapes(c.spec) for c in cases
          if c.spec.get('family') in ('decoder', 'encoder') and 'train' in c.kinds and c.peer
          and not any(str(c.spec.get(k)).startswith('torch')
                      for k in ('attention_impl', 'matmul_impl'))
          and c.spec.get('steps_per_call', 1) == 1}


def gemm_cases(cases) -> dict:
  """{case: step_gemms} of the cases whose step is timed part by part (`_timed_alone`)."""
  return _timed_alone(cases, step_gemms)


def attention_cases(cases) -> dict:
  """{case: step_attention} of the same cases."""
  return _timed_alone(cases, step_attention)


_TINY = dict(steps=2, warmup=1, ceiling_n=256)
QUICK = (
    Case('gpt_baby', _gpt(2, 2, 32, 16, 4, **_TINY)),
    Case('gpt_6l', _gpt(2, 2, 32, 16, 4, prompt_len=4, new=8, repeats=2, **_TINY),
         kinds=('train', 'decode'), decode_batches=(1, 2)),
    Case('gpt_6l_bf16', _gpt(2, 2, 32, 16, 4, dtype='bfloat16', float32_case='gpt_6l', **_TINY)),
    Case('bert_mini', _bert(2, 2, 32, 16, 4, **_TINY)),
    Case('seq2seq_small', _s2s(1, 2, 32, 8, 4, 64, new=4, repeats=2, **_TINY),
         kinds=('train', 'decode'), decode_batches=(2,)),
    Case('compile_2l', _gpt(2, 2, 32, 16, 2, scan=True), kinds=('compile',), peer=False),
    Case('compile_24l', _gpt(24, 2, 32, 16, 2, scan=True), kinds=('compile',), peer=False),
)
