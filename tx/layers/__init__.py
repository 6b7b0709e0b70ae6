"""tx.layers: Flax Linen modules, each configured by its own small config."""

from tx.layers.attention import AttentionConfig, MultiHeadAttention
from tx.layers.block import Block, BlockConfig
from tx.layers.embed import Embed, EmbedConfig, PositionConfig, PositionEmbedding
from tx.layers.ffn import FeedForward, FFNConfig
from tx.layers.moe import MoEFeedForward, MoELayerConfig
from tx.layers.norm import Norm, NormConfig
from tx.layers.relative_bias import RelativeBiasConfig, RelativePositionBias
