"""A stack of Blocks, unrolled or scanned (`model.scan_layers`), with optional remat."""

from __future__ import annotations

import flax.linen as nn
import jax

from tx.layers.block import Block, BlockConfig
from tx.layers.norm import Norm, NormConfig

REMAT_POLICIES = {
    'full': None,  # save nothing: recompute the whole block in the backward pass
    'dots': jax.checkpoint_policies.checkpoint_dots,
    'dots_no_batch': jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    'attention': jax.checkpoint_policies.save_only_these_names('attention_out'),
}
SCANNED_COLLECTIONS = ('params', 'cache', 'intermediates', 'losses', 'metrics', 'diagnostics')


class Stack(nn.Module):
  """x [B, L, D] -> [B, L, D] through `len(blocks)` Blocks and an optional final norm.

  Every block gets the same masks / biases (broadcast). With `scan=True` all blocks
  must share one config; their parameters are stacked on a leading 'layers' axis.
  """
  blocks: tuple[BlockConfig, ...]
  final_norm: NormConfig | None = None
  scan: bool = False
  remat: str = 'none'
  deterministic: bool = True
  decode: bool = False
  sow_weights: bool = False

  def _block_class(self):
    if self.remat == 'none':
      return Block
    return nn.remat(Block, policy=REMAT_POLICIES[self.remat], prevent_cse=not self.scan)

  @nn.compact
  def __call__(self, x_BLD, self_mask=None, self_bias=None, positions_BL=None, encoded_BSD=None,
               cross_mask=None, valid_BL=None, cache_index=None):
    block_cls = self._block_class()
    args = (self_mask, self_bias, positions_BL, encoded_BSD, cross_mask, valid_BL, cache_index)
    flags = dict(deterministic=self.deterministic, decode=self.decode,
                 sow_weights=self.sow_weights)
    if self.scan:
      if len(set(self.blocks)) != 1:
        raise ValueError('scan_layers needs identical blocks (e.g. model.moe.every=1)')
      scanned = nn.scan(
          block_cls, variable_axes={c: 0 for c in SCANNED_COLLECTIONS},
          split_rngs={'params': True, 'dropout': True}, in_axes=(nn.broadcast,) * len(args),
          length=len(self.blocks), metadata_params={nn.PARTITION_NAME: 'layers'})
      x_BLD, _ = scanned(self.blocks[0], scan_output=True, name='layers', **flags)(x_BLD, *args)
    else:
      for i, block in enumerate(self.blocks):
        x_BLD = block_cls(block, name=f'layer_{i}', **flags)(x_BLD, *args)
    if self.final_norm is not None:
      x_BLD = Norm(self.final_norm, name='final_norm')(x_BLD)
    return x_BLD
