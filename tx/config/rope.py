"""`RopeScalingConfig`: the `model.rope_scaling.*` keys (RoPE context extension).

    model.rope_scaling.kind              none | linear | dynamic | yarn | llama3
    model.rope_scaling.factor            context extension factor s (>= 1)
    model.rope_scaling.original_max_len  pretraining context; None = model.max_len
    model.rope_scaling.low_freq_factor   llama3 (1 in Llama 3.1)
    model.rope_scaling.high_freq_factor  llama3 (4 in Llama 3.1)
    model.rope_scaling.beta_fast         yarn (32)
    model.rope_scaling.beta_slow         yarn (1)
    model.rope_scaling.attention_factor  yarn: q·k scale is its square; None = 0.1 ln(s) + 1
    model.rope_scaling.truncate          yarn: floor / ceil the correction range (HF default)

The kinds are those of Hugging Face's `rope_type`, with the same formulas
(`tx.ops.positions.rope_frequencies`). The field names match `tx.ops.RopeScaling`, so
this config can be handed to the op as is. Only fields of the chosen kind are read.
"""

from __future__ import annotations

from tx.config.base import choice, config, fail

ROPE_SCALING_KINDS = ('none', 'linear', 'dynamic', 'yarn', 'llama3')


@config
class RopeScalingConfig:
  """`model.rope_scaling.*`: how RoPE's frequencies are stretched past the training context."""
  PREFIX = 'model.rope_scaling.'
  kind: str = choice(*ROPE_SCALING_KINDS)
  factor: float = 1.0
  original_max_len: int | None = None  # None = model.max_len
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  beta_fast: float = 32.0
  beta_slow: float = 1.0
  attention_factor: float | None = None
  truncate: bool = True

  def validate(self):
    p = self.PREFIX
    if self.kind == 'none':
      return
    if self.factor < 1:
      fail(p + 'factor', f'must be >= 1 for kind={self.kind}, got {self.factor}')
    if self.original_max_len is not None and self.original_max_len <= 0:
      fail(p + 'original_max_len', f'must be > 0 or None, got {self.original_max_len}')
    if self.kind == 'llama3' and not 0 < self.low_freq_factor < self.high_freq_factor:
      fail(p + 'high_freq_factor',
           'llama3 needs 0 < model.rope_scaling.low_freq_factor < high_freq_factor, got '
           f'{self.low_freq_factor} and {self.high_freq_factor}')
    if self.kind == 'yarn':
      if not 0 < self.beta_slow < self.beta_fast:
        fail(p + 'beta_fast', 'yarn needs 0 < model.rope_scaling.beta_slow < beta_fast, got '
             f'{self.beta_slow} and {self.beta_fast}')
      if self.attention_factor is not None and self.attention_factor <= 0:
        fail(p + 'attention_factor', f'must be > 0 or None, got {self.attention_factor}')
