"""The closed vocabularies of `model.*`: one table per choice, by name.

Config validation, the layers, the model builders and the tests all read these tables,
so a name is spelled once. They hold names and plain data only: `tx.config` is the
bottom layer (no JAX, no Flax, imports neither tx.ops nor tx.layers nor tx.models),
and what each name does is attached one level up, keyed by the same names:

- `POSITION_KINDS` (position scheme -> kind) <- `POSITION_BUILDERS` in
  tx/models/layer_configs.py (scheme -> builder), read by tx/models/embedder.py,
  tx/models/attention_inputs.py and `layer_configs.attention_config`.
- `FFN_ACTIVATIONS` (FFN activation -> elementwise function name, gated) <-
  `ACTIVATIONS` in tx/layers/common.py (function name -> function), read by
  tx/layers/ffn.py and tx/layers/moe.py.
- `DTYPES`, the dtype names `model.dtype`, `model.param_dtype` and the MoE layer accept.
- `MATMUL_IMPLS`, the dense products' implementations the layers take (tx/ops/matmul.py).
- `ATTENTION_IMPLS`, attention's implementations (tx/ops/attention.py).

tests/config/test_choices.py and tests/models/test_choices.py check that the config
accepts exactly these names, that every name has its builder or function one level up,
and that every row builds a working model.

Adding a position scheme:
1. the op: a pure function in tx/ops/positions.py, plus a Flax layer in tx/layers/ if
   it has parameters (as `RelativePositionBias` for t5);
2. one row `'name': KIND` in `POSITION_KINDS` below, KIND being how the scheme acts:
   EMBEDDING (added to the token embeddings), ROTARY (rotates q and k), BIAS (added to
   the attention scores) or NONE;
3. its builder, `POSITION_BUILDERS['name']` in tx/models/layer_configs.py, with the
   signature of its kind (written there). The model builders do not dispatch on the
   name: the embedder, the attention-bias module and attention read the kind here.
   Checks that only make sense for a kind go in `ModelConfig.validate` under that
   kind (as the even rotary dimension for ROTARY). A ROTARY scheme other than RoPE
   also needs its op in `tx.layers.attention`, which today applies `ops.apply_rope`
   when `AttentionConfig.rope`. (Only 'learned' is named elsewhere, where its finite
   table of max_len rows matters: data windows and decoding past max_len.)

Adding an FFN activation: one row in `FFN_ACTIVATIONS` naming an elementwise function
of `tx.layers.common.ACTIVATIONS` (add the function there if it is new) and whether
the FFN is gated, act(x·W0) * (x·W1).
"""

from __future__ import annotations

from typing import NamedTuple

DTYPES = ('float32', 'bfloat16', 'float16')
# The dense layers' products (`model.matmul_impl` without 'auto'; tx/ops/matmul.py): XLA's,
# torch's CPU GEMM in the operands' dtype, or torch's float32 GEMM on widened bf16 / f16
# operands (exact products, float32 accumulation).
MATMUL_IMPLS = ('xla', 'torch', 'torch_float32')
# Attention's kernels (`model.attention_impl` without 'auto'; tx/ops/attention.py): XLA's
# fused path, the explicit einsums, cuDNN's, PyTorch's CPU flash kernel, that kernel in
# float32 on widened bf16 / f16 q, k, v, or self-attention's projections and kernel in one
# torch callback each way (tx/ops/torch_attention_block.py; 'torch' where a layer does more).
ATTENTION_IMPLS = ('xla', 'einsum', 'cudnn', 'torch', 'torch_float32', 'torch_block')

# Position kinds: where a scheme enters the model.
EMBEDDING = 'embedding'  # a [B, L, D] term added to the token embeddings
ROTARY = 'rotary'  # rotates queries and keys inside self-attention
BIAS = 'bias'  # a [B, H, L, S] term added to the self-attention scores
NONE = 'none'  # no position information (causal masking alone orders a decoder)

POSITION_KINDS = {
    'sinusoidal': EMBEDDING,  # Vaswani et al. 2017
    'learned': EMBEDDING,  # GPT-2, BERT
    'rope': ROTARY,  # Su et al. 2021; LLaMA, GPT-NeoX
    'alibi': BIAS,  # Press et al. 2022; BLOOM
    't5': BIAS,  # learned relative buckets, Raffel et al. 2020
    'none': NONE,
}


class Activation(NamedTuple):
  """An FFN activation: the elementwise function's name and whether the FFN is gated."""
  fn: str
  gated: bool


FFN_ACTIVATIONS = {
    'relu': Activation('relu', gated=False),
    'gelu': Activation('gelu', gated=False),  # exact (erf)
    'gelu_tanh': Activation('gelu_tanh', gated=False),  # tanh approximation
    'silu': Activation('silu', gated=False),
    # Gated variants (Shazeer 2020): act(x·W0) * (x·W1).
    'swiglu': Activation('silu', gated=True),
    'geglu': Activation('gelu', gated=True),
    'geglu_tanh': Activation('gelu_tanh', gated=True),
    'reglu': Activation('relu', gated=True),
}
