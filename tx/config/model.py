"""`ModelConfig`: the `model.*` keys of the config vocabulary.

One config describes all three families. Every architectural difference between
the 2017 Transformer, BERT, GPT-2, T5, LLaMA and BLOOM is a field here, read by
`tx.models` to build the small per-layer configs of `tx.layers`.

Unsupported combinations (each rejected with a message naming the field):
- a rotary position (`position='rope'`) with an odd rotary dimension;
- `num_heads` not divisible by `num_kv_heads`; `d_model` not divisible by
  `num_heads` unless `head_dim` is set;
- `moe.top_k` > `moe.num_experts`;
- `rope_scaling.kind` other than 'none' or `rope_interleaved` without a rotary position;
  `rope_local_theta` without a rotary position and an `attention_window`;
  `rope_scaling.kind='dynamic'` with a rotary dimension of 2;
- `sandwich_norm` or `parallel_block` with post-norm; `parallel_block` on an
  encoder-decoder (its decoder blocks have cross-attention);
- `query_pre_attn_scalar` with `scale_attention=False` or under muP;
- `share_embeddings=True` on an encoder-decoder needs `src_vocab_size` unset or equal
  to `vocab_size`;
- `type_vocab_size` > 0 only for the encoder family;
- `num_classes` > 0 only for the encoder family;
- `attention_pattern` other than 'local' without an `attention_window`, a pattern
  without a local layer, and under `scan_layers` a stack whose layer count is not a
  multiple of the pattern's period.
"""

from __future__ import annotations

from tx.config.base import choice, config, fail, nested
from tx.config.choices import (ATTENTION_IMPLS, DTYPES, FFN_ACTIVATIONS, MATMUL_IMPLS,
                               POSITION_KINDS, ROTARY)
from tx.config.rope import RopeScalingConfig

FAMILIES = ('decoder', 'encoder', 'encoder_decoder')
POSITIONS = tuple(POSITION_KINDS)  # the tables live in tx/config/choices.py
FFNS = tuple(FFN_ACTIVATIONS)
REMAT_POLICIES = ('none', 'full', 'dots', 'dots_no_batch', 'attention')
ATTENTION_KINDS = ('local', 'global')  # the words of model.attention_pattern


@config
class MoEConfig:
  """`model.moe.*`: mixture-of-experts FFN (num_experts 0 = dense FFN)."""
  PREFIX = 'model.moe.'
  num_experts: int = 0
  top_k: int = 2
  capacity_factor: float = 1.25  # 0 = dropless (every routed token is processed)
  aux_loss_weight: float = 0.01  # load-balancing loss (Switch / GShard form)
  router_z_loss_weight: float = 0.0
  every: int = 1  # MoE in every `every`-th block (1 = all blocks)

  def validate(self):
    if self.num_experts < 0:
      fail('model.moe.num_experts', f'must be >= 0 (0 = dense), got {self.num_experts}')
    if self.num_experts and not 1 <= self.top_k <= self.num_experts:
      fail('model.moe.top_k',
           f'must be between 1 and model.moe.num_experts={self.num_experts}, got {self.top_k}')
    if self.capacity_factor < 0:
      fail('model.moe.capacity_factor', f'must be >= 0 (0 = dropless), got {self.capacity_factor}')
    if self.every < 1:
      fail('model.moe.every', f'must be >= 1, got {self.every}')


@config
class ModelConfig:
  """Architecture of an encoder, decoder or encoder-decoder Transformer."""
  PREFIX = 'model.'
  family: str = choice(*FAMILIES)
  vocab_size: int = 256
  src_vocab_size: int | None = None  # encoder_decoder with separate source vocabulary
  d_model: int = 256
  num_heads: int = 4
  num_kv_heads: int | None = None  # None = num_heads (MHA); 1 = MQA; else GQA
  head_dim: int | None = None  # None = d_model // num_heads
  d_ff: int = 1024
  max_len: int = 512  # table size for learned / sinusoidal positions
  num_layers: int = 4
  num_encoder_layers: int | None = None  # encoder_decoder; None = num_layers
  num_decoder_layers: int | None = None  # encoder_decoder; None = num_layers

  position: str = choice(*POSITIONS)
  rope_theta: float = 10000.0
  # RoPE base of the local (windowed) layers, which then rotate unscaled (rope_scaling acts
  # on the global layers only), as Gemma-3's rope_local_base_freq; None = one RoPE for all.
  rope_local_theta: float | None = None
  rope_fraction: float = 1.0  # fraction of head_dim rotated (GPT-NeoX rotary_pct)
  rope_interleaved: bool = False  # rotate pairs (x0, x1), (x2, x3) .. (GPT-J), not halves
  rope_scaling: RopeScalingConfig = nested(RopeScalingConfig)  # context extension (HF rope_type)
  t5_num_buckets: int = 32
  t5_max_distance: int = 128
  scale_attention: bool = True  # False: no 1/sqrt(d_k) (T5)
  query_pre_attn_scalar: float | None = None  # score scale its ** -0.5; None = head_dim (Gemma 2)
  # Stability knobs (Dehghani et al. 2023; Wortsman et al. 2023; Gemma-2):
  qk_norm: str = choice('none', 'layernorm', 'rmsnorm')  # per-head q, k norm before RoPE
  attention_softcap: float = 0.0  # c * tanh(score / c) before the softmax; 0 = off
  logits_softcap: float = 0.0  # c * tanh(logit / c) on the output logits; 0 = off
  # muP (Yang et al. 2022, Adam): 'mup' scales init, per-group rates, attention (1/d) and
  # the output by width / mup_base_width; 'standard' is the usual parametrization.
  parametrization: str = choice('standard', 'mup')
  mup_base_width: int = 256  # the d_model where muP and standard coincide

  norm: str = choice('layernorm', 'rmsnorm')
  norm_position: str = choice('pre', 'post')
  norm_eps: float = 1e-6
  norm_bias: bool = True  # LayerNorm bias (RMSNorm never has one)
  final_norm: bool | None = None  # None = True for pre-norm stacks, False for post
  embed_norm: bool = False  # norm after the embeddings (BERT, BLOOM)
  norm_scale_offset: bool = False  # every norm: x̂ * (1 + scale), scale initialised at 0 (Gemma)
  sandwich_norm: bool = False  # pre-norm sublayers also normed on output: x + norm(f(norm(x)))
  # x + attn(norm(x)) + ffn(norm(x)): 'two_norms' (GPT-NeoX), 'shared_norm' (GPT-J, PaLM)
  parallel_block: str = choice('none', 'two_norms', 'shared_norm')

  ffn: str = choice(*FFNS, default='gelu')
  moe: MoEConfig = nested(MoEConfig)
  use_bias: bool = True  # biases in attention and FFN projections

  dropout: float = 0.0
  attention_dropout: float = 0.0

  scale_embeddings: bool = False  # token embeddings x sqrt(d_model) (the 2017 paper)
  tie_embeddings: bool = True  # output projection = token embedding transposed
  share_embeddings: bool = True  # encoder_decoder: one table for source and target
  logits_scale: float = 1.0  # multiplies the final hidden state before a tied head
  type_vocab_size: int = 0  # encoder: BERT token-type embeddings
  num_classes: int = 0  # encoder: pooled classification head (0 = none)
  mlm_activation: str = choice('gelu', 'gelu_tanh', 'relu')  # BERT MLM transform

  scan_layers: bool = False
  remat: str = choice(*REMAT_POLICIES)
  dtype: str = choice(*DTYPES)  # compute dtype
  param_dtype: str = choice(*DTYPES)
  # 'torch': PyTorch's CPU flash kernel (tx/ops/torch_attention.py); 'torch_float32': the same
  # on widened bf16 / f16 q, k, v; 'torch_block': self-attention's q/k/v and output
  # projections with the kernel, one torch callback each way (tx/ops/torch_attention_block.py;
  # 'torch' in layers that do more: RoPE, q/k norms, grouped kv heads, a cache, cross-attention).
  # 'auto' is XLA's unless `tx tune` timed torch's faster.
  attention_impl: str = choice('auto', *ATTENTION_IMPLS)
  # The dense layers' products (projections, FFN, heads; not MoE experts): XLA's, or
  # PyTorch's CPU GEMM through a callback ('torch', float32 / bfloat16; tx/ops/torch_matmul.py),
  # or its float32 GEMM on widened bf16 / f16 operands ('torch_float32': exact products,
  # float32 accumulation, for hosts whose float32 GEMM outruns their bf16 one).
  # 'auto' is XLA's unless `tx tune` timed torch's faster on this host for this step.
  matmul_impl: str = choice('auto', *MATMUL_IMPLS)
  # The model's LayerNorms (blocks, embeddings, heads; not per-head q/k norms): XLA's, or
  # PyTorch's CPU kernel through callbacks ('torch', model.norm=layernorm; tx/ops/torch_norm.py).
  # 'auto' is XLA's unless `tx tune` timed torch's faster on this host for this step.
  norm_impl: str = choice('auto', 'xla', 'torch')
  # Causal self-attention without a cache (training, eval) in query blocks that skip the
  # masked keys (ops.dot_product_attention): 0 = one block per 64 queries, at most 4;
  # 1 = one block (the full L x L scores); n = n blocks. Same result either way.
  attention_causal_blocks: int = 0
  # Sliding-window (local) self-attention, as in Mistral (every layer) and Gemma-2 (local
  # and global layers alternating). A local layer's query at position i sees the keys at
  # positions i - W + 1 .. i in a decoder (W keys, itself included) and |i - j| < W in an
  # encoder; cross-attention is never local. 0 = every layer global.
  attention_window: int = 0
  # Which self-attention layers are local: a comma list of local / global repeated over
  # each stack from its first layer ('local' = all; 'local,global' = Gemma-2: even layers
  # local). Only with attention_window > 0.
  attention_pattern: str = 'local'

  @property
  def matmul(self) -> str:
    """The dense products' implementation the layers get (one of MATMUL_IMPLS)."""
    return 'xla' if self.matmul_impl == 'auto' else self.matmul_impl

  @property
  def norm_kernels(self) -> str:
    """The norms' implementation the layers get: 'torch' or 'xla'."""
    return 'torch' if self.norm_impl == 'torch' else 'xla'

  @property
  def torch_attention_conflict(self) -> str:
    """What attention_impl='torch' cannot do that this model needs ('' if nothing)."""
    if self.position in ('t5', 'alibi'):
      return f'attention bias (model.position={self.position})'
    if self.attention_softcap:
      return 'soft-cap (model.attention_softcap)'
    if self.attention_dropout:
      return 'attention dropout (model.attention_dropout)'
    return ''

  @property
  def torch_block_fuses(self) -> bool:
    """Whether attention_impl='torch_block' takes self-attention's projections into its
    callbacks here: nothing between them and the kernel (no RoPE, q/k norms or grouped kv
    heads). Where it does not, it is 'torch'."""
    return (self.position_kind != ROTARY and self.qk_norm == 'none'
            and self.kv_heads == self.num_heads)

  def validate(self):
    positive = ('vocab_size', 'd_model', 'num_heads', 'd_ff', 'max_len', 'num_layers')
    if self.attention_causal_blocks < 0:
      fail('model.attention_causal_blocks',
           f'must be >= 0 (0 = by length, 1 = off), got {self.attention_causal_blocks}')
    for name in positive:
      if getattr(self, name) <= 0:
        fail(f'model.{name}', f'must be > 0, got {getattr(self, name)}')
    for name in ('num_encoder_layers', 'num_decoder_layers', 'num_kv_heads', 'head_dim',
                 'src_vocab_size'):
      value = getattr(self, name)
      if value is not None and value <= 0:
        fail(f'model.{name}', f'must be > 0 or None, got {value}')
    if self.head_dim is None and self.d_model % self.num_heads:
      fail('model.d_model',
           f'{self.d_model} is not divisible by model.num_heads={self.num_heads}; '
           'change one of them or set model.head_dim')
    if self.num_heads % self.kv_heads:
      fail('model.num_kv_heads',
           f'{self.kv_heads} does not divide model.num_heads={self.num_heads}')
    if self.position_kind == ROTARY:
      if not 0 < self.rope_fraction <= 1:
        fail('model.rope_fraction', f'must be in (0, 1], got {self.rope_fraction}')
      if self.rotary_dim % 2:
        fail('model.position',
             f'rope needs an even rotary dimension, got {self.rotary_dim} '
             f'(head_dim={self.resolved_head_dim} x rope_fraction={self.rope_fraction})')
    self._validate_architecture_knobs()
    for name in ('attention_softcap', 'logits_softcap'):
      if getattr(self, name) < 0:
        fail(f'model.{name}', f'must be >= 0 (0 = off), got {getattr(self, name)}')
    if self.mup_base_width <= 0:
      fail('model.mup_base_width', f'must be > 0, got {self.mup_base_width}')
    if self.parametrization == 'mup' and self.scale_embeddings:
      fail('model.scale_embeddings', 'the sqrt(d_model) embedding scale grows with width, '
           'which muP does not allow; set it False with model.parametrization=mup')
    for name in ('dropout', 'attention_dropout'):
      if not 0 <= getattr(self, name) < 1:
        fail(f'model.{name}', f'must be in [0, 1), got {getattr(self, name)}')
    if self.norm_eps <= 0:
      fail('model.norm_eps', f'must be > 0, got {self.norm_eps}')
    if self.t5_num_buckets < 2 or self.t5_max_distance <= self.t5_num_buckets // 4:
      fail('model.t5_num_buckets',
           'needs >= 2 buckets and model.t5_max_distance > num_buckets/4 '
           f'(got {self.t5_num_buckets}, {self.t5_max_distance})')
    self._validate_window()
    if self.matmul_impl == 'torch' and self.dtype not in ('float32', 'bfloat16'):
      fail('model.matmul_impl', f"'torch' (PyTorch's CPU GEMM) takes float32 or bfloat16, "
           f'not model.dtype={self.dtype}; use xla or auto')
    if self.norm_impl == 'torch' and self.norm != 'layernorm':
      fail('model.norm_impl', "'torch' (PyTorch's CPU LayerNorm) takes model.norm=layernorm, "
           f'not {self.norm}; use xla or auto')
    if self.attention_impl.startswith('torch') and self.torch_attention_conflict:
      fail('model.attention_impl', f"{self.attention_impl!r} (PyTorch's CPU flash kernel) "
           f'takes no {self.torch_attention_conflict}; use xla or auto')
    if self.scan_layers and self.is_moe and self.moe.every > 1:
      fail('model.scan_layers', 'scanned layers must be identical; use model.moe.every=1 '
           'or model.scan_layers=False')
    if self.family != 'encoder' and self.type_vocab_size:
      fail('model.type_vocab_size', 'token types are only supported for family=encoder')
    if self.family != 'encoder' and self.num_classes:
      fail('model.num_classes', 'a classification head is only supported for family=encoder')
    if self.family != 'encoder_decoder':
      for name in ('num_encoder_layers', 'num_decoder_layers', 'src_vocab_size'):
        if getattr(self, name) is not None:
          fail(f'model.{name}', f'only applies to family=encoder_decoder, not {self.family}')
    if (self.family == 'encoder_decoder' and self.share_embeddings
        and self.src_vocab_size not in (None, self.vocab_size)):
      fail('model.share_embeddings',
           'a shared embedding needs model.src_vocab_size unset or equal to model.vocab_size')

  def _validate_window(self):
    if self.attention_window < 0:
      fail('model.attention_window',
           f'must be >= 0 (0 = global attention), got {self.attention_window}')
    kinds = tuple(k.strip() for k in self.attention_pattern.split(','))
    if any(k not in ATTENTION_KINDS for k in kinds):
      fail('model.attention_pattern', f'must be a comma list of {" / ".join(ATTENTION_KINDS)} '
           f"(e.g. 'local' or 'local,global'), got {self.attention_pattern!r}")
    if 'local' not in kinds:
      fail('model.attention_pattern', f'{self.attention_pattern!r} has no local layer; set '
           'model.attention_window=0 for global attention everywhere')
    if not self.attention_window:
      if kinds != ('local',):
        fail('model.attention_pattern', f'{self.attention_pattern!r} needs '
             'model.attention_window > 0 (0 = every layer global)')
      return
    period = self.attention_period
    stacks = ((('num_encoder_layers', self.encoder_layers),
               ('num_decoder_layers', self.decoder_layers))
              if self.family == 'encoder_decoder' else (('num_layers', self.num_layers),))
    for name, n in stacks if self.scan_layers else ():
      if n % period:
        fail(f'model.{name}', f'{n} layers do not split into scanned groups of the '
             f'{period}-layer model.attention_pattern {self.attention_pattern!r}; use a '
             'multiple of it or model.scan_layers=False')

  @property
  def attention_period(self) -> int:
    """The length of the smallest repeating unit of `attention_pattern` (1 if uniform)."""
    kinds = tuple(k.strip() for k in self.attention_pattern.split(','))
    return next(p for p in range(1, len(kinds) + 1)
                if len(kinds) % p == 0 and kinds == kinds[:p] * (len(kinds) // p))

  def layer_windows(self, num_layers: int) -> tuple[int, ...]:
    """The self-attention window of each of a stack's `num_layers` layers (0 = global)."""
    if not self.attention_window:
      return (0,) * num_layers
    kinds = [k.strip() for k in self.attention_pattern.split(',')]
    return tuple(self.attention_window if kinds[i % len(kinds)] == 'local' else 0
                 for i in range(num_layers))

  def _validate_architecture_knobs(self):
    """RoPE layout / scaling, block structure and score scale."""
    rotary = self.position_kind == ROTARY
    if self.rope_scaling.kind != 'none' and not rotary:
      fail('model.rope_scaling.kind', f'{self.rope_scaling.kind!r} scales RoPE; it needs '
           f'model.position=rope (got {self.position!r}) or kind none')
    if self.rope_interleaved and not rotary:
      fail('model.rope_interleaved', f'is a RoPE layout; it needs model.position=rope '
           f'(got {self.position!r})')
    if self.rope_local_theta is not None:
      if self.rope_local_theta <= 0:
        fail('model.rope_local_theta', f'must be > 0 or None, got {self.rope_local_theta}')
      if not rotary or not self.attention_window:
        fail('model.rope_local_theta', 'is the RoPE base of local layers; it needs '
             'model.position=rope and model.attention_window > 0 (or None)')
    if rotary and self.rope_scaling.kind == 'dynamic' and self.rotary_dim <= 2:
      fail('model.rope_scaling.kind', f"'dynamic' needs a rotary dimension > 2, got "
           f'{self.rotary_dim}')
    for name in ('sandwich_norm', 'parallel_block'):
      if getattr(self, name) not in (False, 'none') and self.norm_position != 'pre':
        fail(f'model.{name}', 'needs model.norm_position=pre (post-norm blocks already '
             'norm each residual sum)')
    if self.parallel_block != 'none' and self.family == 'encoder_decoder':
      fail('model.parallel_block', 'is not defined for blocks with cross-attention; use '
           'none with family=encoder_decoder')
    if self.query_pre_attn_scalar is not None:
      if self.query_pre_attn_scalar <= 0:
        fail('model.query_pre_attn_scalar',
             f'must be > 0 or None, got {self.query_pre_attn_scalar}')
      if not self.scale_attention:
        fail('model.query_pre_attn_scalar', 'sets the score scale, which '
             'model.scale_attention=False turns off; set one of them')
      if self.parametrization == 'mup':
        fail('model.query_pre_attn_scalar', "a fixed score scale conflicts with muP's "
             '1/head_dim; use None with model.parametrization=mup')

  @property
  def position_kind(self) -> str:
    """How `position` enters the model: a kind of tx.config.choices (EMBEDDING, ...)."""
    return POSITION_KINDS[self.position]

  @property
  def kv_heads(self) -> int:
    return self.num_kv_heads or self.num_heads

  @property
  def width_mult(self) -> float:
    """d_model / mup_base_width under muP; 1.0 under the standard parametrization."""
    return self.d_model / self.mup_base_width if self.parametrization == 'mup' else 1.0

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim or self.d_model // self.num_heads

  @property
  def rotary_dim(self) -> int:
    return int(self.resolved_head_dim * self.rope_fraction)

  @property
  def encoder_layers(self) -> int:
    return self.num_encoder_layers or self.num_layers

  @property
  def decoder_layers(self) -> int:
    return self.num_decoder_layers or self.num_layers

  @property
  def source_vocab_size(self) -> int:
    return self.src_vocab_size or self.vocab_size

  @property
  def use_final_norm(self) -> bool:
    return self.norm_position == 'pre' if self.final_norm is None else self.final_norm

  @property
  def is_moe(self) -> bool:
    return self.moe.num_experts > 0
