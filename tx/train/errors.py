"""User-facing training errors (as opposed to bugs, which stay ordinary exceptions)."""


class CheckpointError(ValueError):
  """A missing, corrupt or mismatched checkpoint; the message is one line naming the path/step and
  the fix."""


class NonFiniteError(RuntimeError):
  """The loss or gradient norm became NaN/Inf (train.nan_policy=stop)."""
