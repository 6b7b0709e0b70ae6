"""The error a user can cause from the command line, printed as one line with exit status 2.

Errors of the other parts live beside them (they sit lower in the import graph):
`tx.config.ConfigError` (a bad key or value), `tx.data.errors.DataError` (bad or missing
data), `tx.train.errors.CheckpointError` / `NonFiniteError`. Every command layer (tx.cli,
tx.bench, tx.runs, tx.sweep) may raise `UserError`; this module imports nothing.
"""


class UserError(Exception):
  """Command-line misuse (a bad flag value, a missing directory); printed as one line."""
