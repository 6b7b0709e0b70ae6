"""A stack of Blocks, unrolled or scanned (`model.scan_layers`), with optional remat."""

from __future__ import annotations

import flax.linen as nn
import jax

from tx.layers.block import Block, BlockConfig
from tx.layers.norm import Norm, NormConfig
from tx.ops.torch_attention import SAVE_NAME as TORCH_ATTENTION
from tx.ops.torch_matmul import SAVE_NAME as TORCH_MATMUL

_policies = jax.checkpoint_policies
# The policies that save products also save model.matmul_impl='torch''s and the output and
# log-sum-exp of model.attention_impl='torch''s kernel (host callbacks, not dots to jax):
# recomputing them would repeat the GEMM or the attention's forward kernel. Both are [.., d]
# activations, no larger than the products these policies save anyway.
_AND_TORCH_PRODUCTS = _policies.save_only_these_names(TORCH_MATMUL, TORCH_ATTENTION)
REMAT_POLICIES = {
    'full': None,  # save nothing: recompute the whole block in the backward pass
    'dots': _policies.save_from_both_policies(_policies.checkpoint_dots, _AND_TORCH_PRODUCTS),
    'dots_no_batch': _policies.save_from_both_policies(
        _policies.checkpoint_dots_with_no_batch_dims, _AND_TORCH_PRODUCTS),
    'attention': _policies.save_only_these_names('attention_out', TORCH_ATTENTION),
}
SCANNED_COLLECTIONS = ('params', 'cache', 'intermediates', 'losses', 'metrics', 'diagnostics')


def block_class(remat: str, scan: bool):
  """Block, or Block rematerialised under the named policy."""
  if remat == 'none':
    return Block
  return nn.remat(Block, policy=REMAT_POLICIES[remat], prevent_cse=not scan)


def period(blocks) -> int:
  """The length of the smallest group of blocks that repeats to make `blocks` (1 = all equal)."""
  n = len(blocks)
  return next(p for p in range(1, n + 1)
              if n % p == 0 and tuple(blocks) == tuple(blocks[:p]) * (n // p))


def block_args(block: BlockConfig, args):
  """A block's call arguments from the stack's: local layers (attention.window > 0) get the
  local mask and bias instead of the global ones."""
  self_mask, self_bias, *rest, local_mask, local_bias = args
  if block.attention.window:
    return (local_mask, local_bias, *rest)
  return (self_mask, self_bias, *rest)


class BlockGroup(nn.Module):
  """One repeating group of blocks (e.g. local, global), the body of a patterned scan.

  x [B, L, D] -> (x [B, L, D], None); its blocks are named block_0 .. block_{P-1}.
  """
  blocks: tuple[BlockConfig, ...]
  remat: str = 'none'
  deterministic: bool = True
  decode: bool = False
  sow_weights: bool = False

  @nn.compact
  def __call__(self, x_BLD, *args):
    block_cls = block_class(self.remat, scan=True)
    for i, block in enumerate(self.blocks):
      x_BLD = block_cls(block, deterministic=self.deterministic, decode=self.decode,
                        sow_weights=self.sow_weights, name=f'block_{i}')(
                            x_BLD, *block_args(block, args))
    return x_BLD, None


class Stack(nn.Module):
  """x [B, L, D] -> [B, L, D] through `len(blocks)` Blocks and an optional final norm.

  Every global block gets the same mask / bias (broadcast), every local block (sliding
  window, `attention.window` > 0) the same local_mask / local_bias. With `scan=True` the
  smallest repeating group of P blocks is scanned len(blocks) / P times: P = 1 (all blocks
  equal) stacks each parameter on a leading 'layers' axis (stack/layers/...); P > 1
  (e.g. local, global) keeps one entry per block of the group, stack/layers/block_i/...,
  each stacked over the groups (layer g * P + i is entry g of block_i).
  """
  blocks: tuple[BlockConfig, ...]
  final_norm: NormConfig | None = None
  scan: bool = False
  remat: str = 'none'
  deterministic: bool = True
  decode: bool = False
  sow_weights: bool = False

  @nn.compact
  def __call__(self, x_BLD, self_mask=None, self_bias=None, positions_BL=None, encoded_BSD=None,
               cross_mask=None, valid_BL=None, cache_index=None, local_mask=None,
               local_bias=None):
    args = (self_mask, self_bias, positions_BL, encoded_BSD, cross_mask, valid_BL, cache_index,
            local_mask, local_bias)
    flags = dict(deterministic=self.deterministic, decode=self.decode,
                 sow_weights=self.sow_weights)
    if self.scan:
      p = period(self.blocks)
      scan = lambda cls, n_args: nn.scan(
          cls, variable_axes={c: 0 for c in SCANNED_COLLECTIONS},
          split_rngs={'params': True, 'dropout': True}, in_axes=(nn.broadcast,) * n_args,
          length=len(self.blocks) // p, metadata_params={nn.PARTITION_NAME: 'layers'})
      if p == 1:
        one = block_args(self.blocks[0], args)
        x_BLD, _ = scan(block_class(self.remat, scan=True), len(one))(
            self.blocks[0], scan_output=True, name='layers', **flags)(x_BLD, *one)
      else:
        x_BLD, _ = scan(BlockGroup, len(args))(
            tuple(self.blocks[:p]), remat=self.remat, name='layers', **flags)(x_BLD, *args)
    else:
      block_cls = block_class(self.remat, scan=False)
      for i, block in enumerate(self.blocks):
        x_BLD = block_cls(block, name=f'layer_{i}', **flags)(x_BLD, *block_args(block, args))
    if self.final_norm is not None:
      x_BLD = Norm(self.final_norm, name='final_norm')(x_BLD)
    return x_BLD
