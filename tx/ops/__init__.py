"""Pure JAX ops for Transformers: attention, dense products, masks, positions, losses.

No Flax here: any JAX project can `from tx.ops import dot_product_attention`.
"""

from tx.ops.activations import gelu_exact
from tx.ops.attention import dot_product_attention
from tx.ops.attention_stats import max_attention_logit
from tx.ops.matmul import dense, dense_dot_general
from tx.ops.losses import softmax_cross_entropy, token_accuracy, weighted_mean
from tx.ops.masks import (
    causal_mask,
    causal_mask_from_positions,
    combine_masks,
    cross_attention_mask,
    key_padding_mask,
    mask_to_bias,
    padding_mask,
    segment_mask,
    segment_positions,
    sliding_window_mask,
)
from tx.ops.torch_attention_block import torch_attention_block
from tx.ops.sampling import sample_logits, top_k_filter, top_p_filter
from tx.ops.positions import (
    RopeScaling,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    rope_frequencies,
    sinusoidal_embedding,
    sinusoidal_table,
    t5_relative_bias,
    t5_relative_position_bucket,
)

__all__ = [
    'RopeScaling',
    'alibi_bias',
    'alibi_slopes',
    'apply_rope',
    'causal_mask',
    'causal_mask_from_positions',
    'combine_masks',
    'cross_attention_mask',
    'dense',
    'dense_dot_general',
    'dot_product_attention',
    'gelu_exact',
    'key_padding_mask',
    'mask_to_bias',
    'padding_mask',
    'rope_frequencies',
    'segment_mask',
    'sample_logits',
    'segment_positions',
    'sliding_window_mask',
    'sinusoidal_embedding',
    'sinusoidal_table',
    'softmax_cross_entropy',
    't5_relative_bias',
    't5_relative_position_bucket',
    'token_accuracy',
    'torch_attention_block',
    'top_k_filter',
    'top_p_filter',
    'weighted_mean',
]
